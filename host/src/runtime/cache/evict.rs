//! Keeping the cache within its bound: every rebuild of an agent is a new component and
//! so a new entry (about 40 MB for a Python agent), and nothing else ever deletes one.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use super::digests;

/// Digest records (a hundred bytes each) older than this are deleted when the cache
/// evicts: one whose file is still used is written again at its next start.
const RECORD_MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);

/// Deletes entries of `dir`, least recently used (oldest modification time) first,
/// until those left take at most `max_bytes`; `keep`, the entry just written, stays
/// whatever its size. Only the user's own regular `.cwasm` files are counted or
/// deleted. Best effort: what cannot be listed or deleted is logged and left.
pub(super) fn evict(dir: &Path, user: u32, max_bytes: u64, keep: &Path) {
    let listing = match std::fs::read_dir(dir) {
        Ok(listing) => listing,
        Err(e) => {
            tracing::debug!(dir = %dir.display(), error = %e, "cannot list the cache to evict");
            return;
        }
    };
    let mut entries: Vec<(SystemTime, u64, std::path::PathBuf)> = Vec::new();
    for path in listing.filter_map(Result::ok).map(|e| e.path()) {
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let Ok(modified) = meta.modified() else {
            continue;
        };
        if !meta.file_type().is_file() || meta.uid() != user {
            continue;
        }
        if path.extension().is_some_and(|x| x == "cwasm") {
            entries.push((modified, meta.len(), path));
        } else if digests::is_record(&path)
            && modified.elapsed().is_ok_and(|age| age > RECORD_MAX_AGE)
        {
            let _ = std::fs::remove_file(&path);
        }
    }
    let mut total: u64 = entries.iter().map(|(_, len, _)| len).sum();
    if total <= max_bytes {
        return;
    }
    entries.sort();
    for (_, len, path) in entries {
        if total <= max_bytes {
            break;
        }
        if path == keep {
            continue;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {
                total -= len;
                tracing::debug!(path = %path.display(), bytes = len, "evicted a cached component");
            }
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "cannot evict a cached component");
            }
        }
    }
}
