//! The holders of a SQLite store, alive or gone: a folder beside the database
//! (`<db>-holders/`) with one file per process that drives runs, locked (`flock`) by
//! that process for its lifetime. The kernel drops the lock when the process dies, so a
//! file whose lock is free belongs to a holder that is gone. Every process using a
//! SQLite store runs on its machine (the database's locks need it too), so every
//! holder can be seen here.
//!
//! - `<hash>.live`: a live holder's file, holding its name; made under a temporary name,
//!   locked, then renamed into place, so nobody ever finds it unlocked while its holder
//!   lives; removed when the holder withdraws ([`Presence`] dropped).
//! - `<hash>.gone`: a `.live` file found unlocked, renamed by whoever found it, so that
//!   later questions about that holder are answered without its lock; removed an hour
//!   after, when any lease it held has long ended.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use crate::store::{Presence, StoreError};

/// How long a gone holder's file is kept after it was found gone: longer than any lease
/// it could have held is still live.
const KEEP_GONE: Duration = Duration::from_secs(3600);

/// The holders' folder of the database at `db`.
pub(super) fn folder(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-holders");
    PathBuf::from(name)
}

/// A holder's file name without its suffix: any holder name becomes a safe file name.
fn stem(holder: &str) -> String {
    let digest = Sha256::digest(holder.as_bytes());
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

fn io_error(op: &'static str, path: &Path, err: std::io::Error) -> StoreError {
    StoreError::Backend {
        op,
        source: format!("{}: {err}", path.display()).into(),
    }
}

/// Keeps a holder's file locked and removes it when dropped.
struct Live {
    path: PathBuf,
    // Kept open: closing it would drop the lock.
    _file: File,
}

impl Drop for Live {
    fn drop(&mut self) {
        // Removed before the lock is dropped (with the file, after this), so nobody
        // takes a holder that withdrew for one that died.
        let _ = fs::remove_file(&self.path);
    }
}

/// Makes `holder` known as alive in `folder` until the presence is dropped.
pub(super) fn be_present(folder: &Path, holder: &str) -> Result<Presence, StoreError> {
    const OP: &str = "record that this process drives runs";
    fs::create_dir_all(folder).map_err(|e| io_error(OP, folder, e))?;
    let stem = stem(holder);
    let path = folder.join(format!("{stem}.live"));
    let temp = folder.join(format!("{stem}.{}.new", std::process::id()));
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&temp)
        .map_err(|e| io_error(OP, &temp, e))?;
    file.try_lock().map_err(|e| match e {
        TryLockError::Error(e) => io_error(OP, &temp, e),
        TryLockError::WouldBlock => io_error(OP, &temp, ErrorKind::WouldBlock.into()),
    })?;
    file.write_all(holder.as_bytes())
        .and_then(|()| file.flush())
        .map_err(|e| io_error(OP, &temp, e))?;
    fs::rename(&temp, &path).map_err(|e| io_error(OP, &path, e))?;
    Ok(Presence::kept_by(Box::new(Live { path, _file: file })))
}

/// Whether the `.live` file at `path` is unlocked: its holder died. `None` if there is
/// no such file.
fn unlocked(path: &Path) -> Result<Option<bool>, StoreError> {
    const OP: &str = "ask whether a holder lives";
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error(OP, path, e)),
    };
    match file.try_lock_shared() {
        Ok(()) => Ok(Some(true)),
        Err(TryLockError::WouldBlock) => Ok(Some(false)),
        Err(TryLockError::Error(e)) => Err(io_error(OP, path, e)),
    }
}

/// Whether `holder` is known to be gone: its file unlocked, or already found so.
pub(super) fn is_gone(folder: &Path, holder: &str) -> Result<bool, StoreError> {
    let stem = stem(holder);
    if unlocked(&folder.join(format!("{stem}.live")))? == Some(true) {
        return Ok(true);
    }
    Ok(folder.join(format!("{stem}.gone")).exists())
}

/// The holders found gone, each `.live` file found unlocked renamed `.gone` on the way;
/// `.gone` files kept past [`KEEP_GONE`] are removed instead.
pub(super) fn gone_holders(folder: &Path) -> Result<Vec<String>, StoreError> {
    const OP: &str = "list the holders that are gone";
    let entries = match fs::read_dir(folder) {
        Ok(entries) => entries,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_error(OP, folder, e)),
    };
    let mut gone = Vec::new();
    for entry in entries {
        let path = entry.map_err(|e| io_error(OP, folder, e))?.path();
        let name = match path.extension().and_then(|e| e.to_str()) {
            Some("live") if unlocked(&path)? == Some(true) => bury(&path)?,
            Some("gone") => read_gone(&path)?,
            _ => None,
        };
        gone.extend(name);
    }
    gone.sort();
    gone.dedup();
    Ok(gone)
}

/// Renames a dead holder's `.live` file `.gone`, stamped with the time it was found,
/// and returns the holder's name.
fn bury(path: &Path) -> Result<Option<String>, StoreError> {
    const OP: &str = "record a holder that is gone";
    let Some(name) = read_name(path)? else {
        return Ok(None);
    };
    let to = path.with_extension("gone");
    match fs::rename(path, &to) {
        Ok(()) => {}
        // Another process buried it first.
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Some(name)),
        Err(e) => return Err(io_error(OP, path, e)),
    }
    if let Ok(file) = File::options().write(true).open(&to) {
        let _ = file.set_modified(SystemTime::now());
    }
    Ok(Some(name))
}

/// A `.gone` file's holder, or `None` (and the file removed) once it was kept long
/// enough.
fn read_gone(path: &Path) -> Result<Option<String>, StoreError> {
    let found = fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok());
    if found.is_some_and(|age| age > KEEP_GONE) {
        let _ = fs::remove_file(path);
        return Ok(None);
    }
    read_name(path)
}

fn read_name(path: &Path) -> Result<Option<String>, StoreError> {
    let mut name = String::new();
    match File::open(path).and_then(|mut f| f.read_to_string(&mut name)) {
        Ok(_) => Ok(Some(name)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        // Not a holder's file (not UTF-8, unreadable): nobody to take over from.
        Err(e) if e.kind() == ErrorKind::InvalidData => Ok(None),
        Err(e) => Err(io_error("read a holder's name", path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::SqliteStore;
    use crate::store::sqlite::tests::submit;
    use crate::store::tests::block_on;
    use crate::store::{Acquired, CatalogStore, SyncMode, WorkerStore};

    fn leased_to(store: &SqliteStore, run_id: &str, worker: &str) {
        submit(store, run_id);
        let lease = Duration::from_secs(3600);
        let acquired = block_on(store.acquire_run(run_id, worker, lease)).unwrap();
        assert!(matches!(acquired, Acquired::Leased(_)), "{acquired:?}");
    }

    #[test]
    fn the_run_leases_of_a_gone_holder_end_at_once_and_a_live_ones_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("idem.db");
        let store = SqliteStore::open(&path, SyncMode::Normal).unwrap();
        block_on(store.put_component("00", b"")).unwrap();
        let _live = block_on(store.be_present("live-w")).unwrap();
        leased_to(&store, "r-live", "live-w");
        // What a process killed while present leaves behind: its file, unlocked.
        let folder = folder(&path);
        let dead = folder.join(format!("{}.live", stem("dead-w")));
        fs::write(&dead, "dead-w").unwrap();
        leased_to(&store, "r-dead", "dead-w");

        let hour = Duration::from_secs(3600);
        assert_eq!(block_on(store.end_leases_of_gone("live-w")).unwrap(), 0);
        let other = block_on(store.acquire_run("r-live", "other", hour)).unwrap();
        assert!(
            matches!(other, Acquired::Held(_)),
            "a live holder keeps its run: {other:?}"
        );
        assert_eq!(block_on(store.end_leases_of_gone("nobody")).unwrap(), 0);

        assert_eq!(block_on(store.gone_holders()).unwrap(), ["dead-w"]);
        assert_eq!(block_on(store.end_leases_of_gone("dead-w")).unwrap(), 1);
        let taken = block_on(store.acquire_run("r-dead", "other", hour)).unwrap();
        assert!(
            matches!(taken, Acquired::Leased(_)),
            "a gone holder's run is free: {taken:?}"
        );
        assert_eq!(
            block_on(store.end_leases_of_gone("dead-w")).unwrap(),
            0,
            "nothing left"
        );
    }

    #[test]
    fn a_present_holder_lives_and_a_withdrawn_one_is_not_gone() {
        let dir = tempfile::tempdir().unwrap();
        let folder = folder(&dir.path().join("idem.db"));
        let presence = be_present(&folder, "w-1").unwrap();
        assert!(presence.is_told());
        assert!(!is_gone(&folder, "w-1").unwrap(), "its lock is held");
        assert!(gone_holders(&folder).unwrap().is_empty());
        drop(presence);
        // Withdrawn, not dead: nobody is told to take its leases early.
        assert!(!is_gone(&folder, "w-1").unwrap());
        assert!(gone_holders(&folder).unwrap().is_empty());
        assert!(!is_gone(&folder, "never-seen").unwrap());
    }

    #[test]
    fn an_unlocked_holder_file_is_a_holder_gone_until_it_is_old() {
        let dir = tempfile::tempdir().unwrap();
        let folder = folder(&dir.path().join("idem.db"));
        fs::create_dir_all(&folder).unwrap();
        // What a process killed while present leaves: its file, with nobody locking it.
        let live = folder.join(format!("{}.live", stem("dead/one")));
        fs::write(&live, "dead/one").unwrap();
        assert!(is_gone(&folder, "dead/one").unwrap());
        assert_eq!(gone_holders(&folder).unwrap(), ["dead/one"]);
        let gone = live.with_extension("gone");
        assert!(gone.exists() && !live.exists(), "buried on the way");
        assert!(
            is_gone(&folder, "dead/one").unwrap(),
            "still known once buried"
        );
        assert_eq!(gone_holders(&folder).unwrap(), ["dead/one"]);
        let old = SystemTime::now() - KEEP_GONE - Duration::from_secs(60);
        File::options()
            .write(true)
            .open(&gone)
            .unwrap()
            .set_modified(old)
            .unwrap();
        assert!(gone_holders(&folder).unwrap().is_empty());
        assert!(!gone.exists(), "removed once kept long enough");
    }
}
