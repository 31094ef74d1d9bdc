//! Component digests remembered by file identity, so that a start with an unchanged
//! agent file neither reads nor hashes it (19 MB for a Python agent: a quarter of its
//! cold start).
//!
//! A record names a file by device and inode and holds what `stat` said of it (size,
//! modification and change times to the nanosecond) and the SHA-256 its bytes had,
//! sealed with the cache's MAC key. It is used only while `stat` still says the same:
//! writing to the file or replacing it changes its change time, which only root can
//! set. A record is written only for a file whose times were at least
//! [`SETTLED`] old when its bytes were hashed, so that a write within the same clock
//! tick as the hash cannot leave the times unchanged (git's "racy clean" problem).

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::ComponentCache;

/// How old a file's times must be for its digest to be remembered (the cache's
/// default).
pub(super) const SETTLED: Duration = Duration::from_secs(2);
const MAGIC: [u8; 8] = *b"idem-dg\x01";
/// magic, size, mtime (s, ns), ctime (s, ns), digest.
const FIELDS_LEN: usize = 8 + 8 + 4 * 8 + 32;
const RECORD_LEN: usize = FIELDS_LEN + 32;

/// What identifies a file's contents without reading them.
fn fields(meta: &Metadata, digest: &[u8; 32]) -> [u8; FIELDS_LEN] {
    let mut fields = [0; FIELDS_LEN];
    let numbers = [
        meta.size(),
        meta.mtime() as u64,
        meta.mtime_nsec() as u64,
        meta.ctime() as u64,
        meta.ctime_nsec() as u64,
    ];
    fields[..8].copy_from_slice(&MAGIC);
    for (i, n) in numbers.iter().enumerate() {
        fields[8 + i * 8..16 + i * 8].copy_from_slice(&n.to_le_bytes());
    }
    fields[FIELDS_LEN - 32..].copy_from_slice(digest);
    fields
}

fn settled(meta: &Metadata, after: Duration) -> bool {
    let at = |s: i64, ns: i64| {
        let since = Duration::new(s.max(0) as u64, ns.clamp(0, 999_999_999) as u32);
        UNIX_EPOCH + since
    };
    let newest = at(meta.mtime(), meta.mtime_nsec()).max(at(meta.ctime(), meta.ctime_nsec()));
    SystemTime::now()
        .duration_since(newest)
        .is_ok_and(|age| age >= after)
}

impl ComponentCache {
    fn record_path(&self, meta: &Metadata) -> PathBuf {
        self.dir
            .join(format!("{:x}-{:x}.digest", meta.dev(), meta.ino()))
    }

    fn seal_record(&self, fields: &[u8; FIELDS_LEN]) -> [u8; 32] {
        let mut mac = blake3::Hasher::new_keyed(&self.mac_key);
        mac.update(b"idem component digest\0");
        mac.update(fields);
        *mac.finalize().as_bytes()
    }

    /// The digest of the file `meta` describes, if a sealed record says what it was and
    /// the file has not changed since.
    pub(crate) fn known_digest(&self, meta: &Metadata) -> Option<[u8; 32]> {
        let path = self.record_path(meta);
        let file = self.open_entry(&path).ok()??;
        let mut record = [0; RECORD_LEN];
        if file.metadata().ok()?.len() != RECORD_LEN as u64 {
            return None;
        }
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut record, 0).ok()?;
        let (recorded, mac) = record.split_at(FIELDS_LEN);
        let mut digest = [0; 32];
        digest.copy_from_slice(&recorded[FIELDS_LEN - 32..]);
        let expected = fields(meta, &digest);
        // Constant-time comparison through `Hash`'s `==`.
        let sealed = blake3::Hash::from_bytes(self.seal_record(&expected));
        (recorded == expected && sealed == blake3::Hash::from_bytes(mac.try_into().ok()?))
            .then_some(digest)
    }

    /// Remembers that the file `meta` describes (as it was before it was read) has the
    /// SHA-256 `digest`, if its times are settled. Best effort, like the cache.
    pub(crate) fn remember_digest(&self, meta: &Metadata, digest: &[u8; 32]) {
        if !settled(meta, self.settled_after) {
            return;
        }
        let fields = fields(meta, digest);
        let mac = self.seal_record(&fields);
        let path = self.record_path(meta);
        if let Err(e) = super::write_new_private(&path, &[&fields, &mac], true) {
            tracing::debug!(path = %path.display(), error = %e, "cannot remember a component's digest");
        }
    }
}

/// Whether `path` names a digest record (for eviction).
pub(super) fn is_record(path: &Path) -> bool {
    path.extension().is_some_and(|x| x == "digest")
}
