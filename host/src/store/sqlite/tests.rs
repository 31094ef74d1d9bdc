//! Tests of what only the SQLite backend has: files, pragmas and schema versions. The
//! store's behaviour is tested for every backend in `store/tests.rs`.

use std::path::Path;

use rusqlite::Connection;

use super::schema::SCHEMA_VERSION;
use super::{SqliteStore, SyncMode};
use crate::store::StoreError;

fn open_error(path: &Path) -> String {
    match SqliteStore::open(path, SyncMode::Normal) {
        Ok(_) => panic!("{} opened", path.display()),
        Err(err @ StoreError::Open { .. }) => {
            let message = err.to_string();
            assert!(
                message.contains(&path.display().to_string()),
                "{message:?} does not name {}",
                path.display()
            );
            message
        }
        Err(other) => panic!("expected an Open error, got {other:?}"),
    }
}

#[test]
fn sync_mode_parses_and_displays() {
    for mode in [SyncMode::Normal, SyncMode::Full] {
        assert_eq!(mode.to_string().parse::<SyncMode>(), Ok(mode));
    }
    assert_eq!("FULL".parse::<SyncMode>(), Ok(SyncMode::Full));
    let err = "off".parse::<SyncMode>().unwrap_err();
    assert_eq!(
        err.to_string(),
        "unknown sync mode \"off\": expected \"normal\" or \"full\""
    );
}

#[test]
fn new_database_is_wal_with_our_pragmas() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    for (mode, synchronous) in [(SyncMode::Normal, 1), (SyncMode::Full, 2)] {
        let store = SqliteStore::open(&path, mode).unwrap();
        assert_eq!(store.path(), path);
        store.conn.read(|conn| {
            let pragma =
                |name: &str| -> i64 { conn.pragma_query_value(None, name, |r| r.get(0)).unwrap() };
            assert_eq!(pragma("synchronous"), synchronous);
            assert_eq!(pragma("foreign_keys"), 1);
            assert_eq!(pragma("user_version"), SCHEMA_VERSION);
            assert_eq!(pragma("application_id"), 0x6964_656d);
            let journal: String = conn
                .pragma_query_value(None, "journal_mode", |r| r.get(0))
                .unwrap();
            assert_eq!(journal, "wal");
        });
    }
}

#[test]
fn empty_file_becomes_a_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("touched.db");
    std::fs::write(&path, b"").unwrap();
    SqliteStore::open(&path, SyncMode::Normal).unwrap();
    SqliteStore::open(&path, SyncMode::Normal).unwrap();
}

#[test]
fn non_database_file_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes) in [
        (
            "notes.txt",
            b"these are my notes, not a database\n".repeat(200),
        ),
        ("tiny.txt", b"hi".to_vec()),
        // SQLite itself takes a file this short for an empty database.
        ("one-byte.txt", b"x".to_vec()),
        ("binary.bin", (0..=255u8).cycle().take(8192).collect()),
    ] {
        let path = dir.path().join(name);
        std::fs::write(&path, &bytes).unwrap();
        let message = open_error(&path);
        assert!(message.contains("not a SQLite database"), "{message}");
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "{name} was modified");
    }
}

#[test]
fn foreign_sqlite_database_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other-app.db");
    {
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('hi');")
            .unwrap();
    }
    let before = std::fs::read(&path).unwrap();
    let message = open_error(&path);
    assert!(message.contains("not an idem store"), "{message}");
    assert_eq!(std::fs::read(&path).unwrap(), before);
    // Not even switched to WAL behind our back.
    assert!(!dir.path().join("other-app.db-wal").exists());
}

#[test]
fn missing_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-such-dir").join("idem.db");
    let message = open_error(&path);
    assert!(message.contains("does not exist"), "{message}");
    assert!(!path.exists());
}

#[test]
fn directory_as_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let message = open_error(dir.path());
    assert!(message.contains("is a directory"), "{message}");
}

/// `/proc` refuses new files even to root, which the tests may run as.
#[cfg(target_os = "linux")]
#[test]
fn unwritable_directory_is_refused_at_open() {
    let path = Path::new("/proc/idem-test.db");
    let message = open_error(path);
    assert!(message.contains("cannot create or open"), "{message}");
}

/// Permission bits, for when the tests run as a user they bind.
#[cfg(unix)]
#[test]
fn write_protected_directory_and_file_are_refused_at_open() {
    use std::os::unix::fs::PermissionsExt;

    let dir = tempfile::tempdir().unwrap();
    let locked = dir.path().join("locked");
    std::fs::create_dir(&locked).unwrap();
    // A store the directory was locked on after the fact: the file is writable, but
    // SQLite cannot create the -wal and -shm files next to it.
    let inside = locked.join("inside.db");
    drop(SqliteStore::open(&inside, SyncMode::Normal).unwrap());
    let existing = dir.path().join("existing.db");
    drop(SqliteStore::open(&existing, SyncMode::Normal).unwrap());
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o555)).unwrap();
    std::fs::set_permissions(&existing, std::fs::Permissions::from_mode(0o444)).unwrap();

    let probe = locked.join("probe");
    if std::fs::write(&probe, b"").is_ok() {
        // Running as root: permission bits bind nobody, so there is nothing to test.
        eprintln!("skipped: permission bits are not enforced for this user");
        return;
    }
    let message = open_error(&locked.join("idem.db"));
    assert!(message.contains("cannot create or open"), "{message}");
    let message = open_error(&inside);
    assert!(message.contains("not writable"), "{message}");
    let message = open_error(&existing);
    assert!(message.contains("write-protected"), "{message}");
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    drop(SqliteStore::open(&path, SyncMode::Normal).unwrap());
    {
        let conn = Connection::open(&path).unwrap();
        conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
            .unwrap();
    }
    match SqliteStore::open(&path, SyncMode::Normal) {
        Err(StoreError::SchemaTooNew {
            found, supported, ..
        }) => {
            assert_eq!(found, SCHEMA_VERSION + 1);
            assert_eq!(supported, SCHEMA_VERSION);
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
    // Refused, not downgraded.
    let conn = Connection::open(&path).unwrap();
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION + 1);
}

#[test]
fn concurrent_first_opens_initialise_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let stores: Vec<SqliteStore> = std::thread::scope(|scope| {
        let openers: Vec<_> = (0..6)
            .map(|_| scope.spawn(|| SqliteStore::open(&path, SyncMode::Normal).unwrap()))
            .collect();
        openers.into_iter().map(|o| o.join().unwrap()).collect()
    });
    // One fencing row, so all handles share one token sequence.
    for store in &stores {
        let rows: i64 = store
            .conn
            .read(|conn| conn.query_row("SELECT count(*) FROM fencing", [], |r| r.get(0)))
            .unwrap();
        assert_eq!(rows, 1);
    }
}

#[test]
fn concurrent_writers_share_transactions_without_sharing_failures() {
    use crate::store::{ClaimOutcome, ClaimRequest, Store};

    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("idem.db"), SyncMode::Full).unwrap();
    let threads = 16;
    let per_thread = 40;
    std::thread::scope(|s| {
        for t in 0..threads {
            let store = &store;
            s.spawn(move || {
                for i in 0..per_thread {
                    let key = format!("k-{t}-{i}");
                    let req = ClaimRequest {
                        key: &key,
                        run_id: "r",
                        holder: "h",
                        fingerprint: None,
                        lease: std::time::Duration::from_secs(60),
                        now: 0,
                    };
                    let ClaimOutcome::Granted(grant) = store.claim(&req).unwrap() else {
                        panic!("fresh key {key} not granted");
                    };
                    if i % 5 == 0 {
                        // A refused commit in a shared transaction rolls back only
                        // itself.
                        assert!(
                            store
                                .commit(&key, grant.token + 1_000_000, "r", b"bad")
                                .is_err()
                        );
                    } else {
                        store
                            .commit(&key, grant.token, "r", key.as_bytes())
                            .unwrap();
                    }
                }
            });
        }
    });
    for t in 0..threads {
        for i in 0..per_thread {
            let key = format!("k-{t}-{i}");
            let committed = store.committed(&key).unwrap();
            if i % 5 == 0 {
                assert_eq!(committed, None, "{key}");
            } else {
                assert_eq!(committed.as_deref(), Some(key.as_bytes()), "{key}");
            }
        }
    }
    assert_eq!(
        store.open_claims(None).unwrap().len(),
        threads * per_thread / 5
    );
}
