//! Tests of what only the SQLite backend has: paths, files, pragmas, how many pages a
//! step writes, and durability per batch. The store's behaviour is tested for every
//! backend in `store/tests/`; migrations in `migration_tests.rs`.

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;

use super::schema::SCHEMA_VERSION;
use super::{OpenOptions, SqliteStore};
use crate::store::tests::block_on;
use crate::store::{
    Acquired, CatalogStore, Checkpoint, ClaimOutcome, ClaimRef, ClaimRequest, Commit, Counts,
    InstanceStore, OperatorStore, RunFence, StoreError, Submission, SyncMode, WorkerStore,
};

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

/// Runs `f` on the store's own connection, between transactions.
fn on_conn<T: Send + 'static>(
    store: &SqliteStore,
    f: impl FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
) -> T {
    block_on(store.db.read(move |conn, _| f(conn))).unwrap()
}

fn pragma(store: &SqliteStore, name: &'static str) -> i64 {
    on_conn(store, move |conn| {
        conn.pragma_query_value(None, name, |r| r.get(0))
    })
}

/// Submits run `run_id` (of component `00`, which must be in the store).
pub(super) fn submit(store: &SqliteStore, run_id: &str) {
    let submission = Submission {
        run_id,
        agent: "a",
        digest: "00",
        namespace: "ns",
        input: b"",
        authority: b"",
        replace_authority: false,
        priority: 0,
    };
    block_on(store.submit(&submission)).unwrap();
}

/// A store with run `run-1` submitted and leased: its fence, asking for `sync`.
fn leased(store: &SqliteStore, sync: SyncMode) -> RunFence {
    block_on(store.put_component("00", b"")).unwrap();
    submit(store, "run-1");
    lease(store, sync)
}

/// A lease of `run-1`, submitted and not leased now.
fn lease(store: &SqliteStore, sync: SyncMode) -> RunFence {
    let lease = Duration::from_secs(3600);
    match block_on(store.acquire_run("run-1", "w", lease)).unwrap() {
        Acquired::Leased(run) => RunFence {
            run_id: "run-1".to_owned(),
            token: run.token,
            sync,
        },
        other => panic!("{other:?}"),
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
        assert_eq!(pragma(&store, "synchronous"), synchronous);
        assert_eq!(pragma(&store, "foreign_keys"), 1);
        assert_eq!(
            pragma(&store, "wal_autocheckpoint"),
            match mode {
                SyncMode::Normal => 10_000,
                SyncMode::Full => 1_000,
            }
        );
        assert_eq!(pragma(&store, "user_version"), SCHEMA_VERSION);
        assert_eq!(pragma(&store, "application_id"), 0x6964_656d);
        let journal: String = on_conn(&store, |conn| {
            conn.pragma_query_value(None, "journal_mode", |r| r.get(0))
        });
        assert_eq!(journal, "wal");
    }
}

/// A large component does not stay in the WAL, where every process that opens the
/// store alone would read it again to rebuild the WAL's index; a small one may.
#[test]
fn a_large_component_is_checkpointed_out_of_the_wal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let wal = dir.path().join("idem.db-wal");
    let store = SqliteStore::open(&path, SyncMode::Normal).unwrap();
    assert!(block_on(store.put_component("small", &[1; 1000])).unwrap());
    assert!(std::fs::metadata(&wal).unwrap().len() > 0);
    assert!(block_on(store.put_component("large", &vec![2; 2 << 20])).unwrap());
    assert_eq!(
        std::fs::metadata(&wal).unwrap().len(),
        0,
        "the WAL was emptied"
    );
    assert!(std::fs::metadata(&path).unwrap().len() > 2 << 20);
    // Known: not stored again.
    assert!(!block_on(store.put_component("small", &[3; 10])).unwrap());
    assert_eq!(
        block_on(store.component("small")).unwrap(),
        Some(vec![1; 1000])
    );
}

/// A batch runs as durably as its most demanding write asks: a fence's own mode, or
/// the store's default for writes without one.
#[test]
fn each_batch_syncs_as_its_writes_ask() {
    for default in [SyncMode::Normal, SyncMode::Full] {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("idem.db"), default).unwrap();
        let other = match default {
            SyncMode::Normal => SyncMode::Full,
            SyncMode::Full => SyncMode::Normal,
        };
        let level = |mode| if mode == SyncMode::Full { 2 } else { 1 };
        let fence = leased(&store, other);
        // A fenced write asks for its run's mode, whatever the store's default.
        block_on(store.save_counts(&fence, &Counts::default())).unwrap();
        assert_eq!(pragma(&store, "synchronous"), level(other), "{default}");
        // A write without a fence asks for the store's default.
        block_on(store.put_component("01", b"")).unwrap();
        assert_eq!(pragma(&store, "synchronous"), level(default), "{default}");
        let fence = RunFence {
            sync: other,
            ..fence
        };
        block_on(store.renew_runs(&[fence], Duration::from_secs(60))).unwrap();
        assert_eq!(pragma(&store, "synchronous"), level(other), "{default}");
    }
}

/// The connection's busy time counts the time it is held for work (a synced batch of
/// writes here, on the thread or on the caller's) and not the time it lies idle.
#[test]
fn the_connection_counts_the_time_it_is_held_not_idle() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("idem.db"), SyncMode::Full).unwrap();
    let before = store.connection_busy();
    let fence = leased(&store, SyncMode::Full);
    for _ in 0..20 {
        block_on(store.save_counts(&fence, &Counts::default())).unwrap();
    }
    let worked = store.connection_busy();
    assert!(
        worked > before,
        "{worked:?} after 20 synced writes, {before:?} before"
    );
    std::thread::sleep(Duration::from_millis(200));
    let idle = store.connection_busy() - worked;
    assert!(
        idle < Duration::from_millis(100),
        "{idle:?} counted while idle"
    );
}

/// The pages a durable step writes: its claim and its commit each dirty the one leaf of
/// `steps` (the run's fence is read, not written); a commit carrying a checkpoint and
/// counts adds the run's progress and counts pages, and nothing else.
#[test]
fn a_step_writes_only_its_own_pages() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let store = SqliteStore::open(&path, SyncMode::Normal).unwrap();
    let fence = leased(&store, SyncMode::Normal);
    let wal = dir.path().join("idem.db-wal");
    let page = pragma(&store, "page_size") as u64;
    let frames = || (std::fs::metadata(&wal).unwrap().len().saturating_sub(32)) / (24 + page);
    // A checkpoint exists before the first step, so that it writes its own page only.
    let checkpoint = Checkpoint {
        step: 0,
        state: b"s".to_vec(),
    };
    block_on(store.save_progress(&fence, &checkpoint, Some(&Counts::default()))).unwrap();
    let step = |i: u64, with_progress: bool| -> (u64, u64) {
        let key = format!("k-{i}");
        let before = frames();
        let req = ClaimRequest {
            key: &key,
            fence: &fence,
            holder: "h",
            fingerprint: None,
            lease: Duration::from_secs(60),
            durable: true,
        };
        let ClaimOutcome::Granted(grant) = block_on(store.claim(&req)).unwrap() else {
            panic!("{key} not granted");
        };
        let claimed = frames();
        let checkpoint = Checkpoint {
            step: i,
            state: b"s".to_vec(),
        };
        let counts = Counts {
            executed: i,
            ..Counts::default()
        };
        let commit = Commit {
            claim: ClaimRef {
                key: &key,
                token: grant.token,
                fence: &fence,
            },
            result: b"r",
            checkpoint: with_progress.then_some(&checkpoint),
            counts: with_progress.then_some(&counts),
        };
        block_on(store.commit(&commit)).unwrap();
        (claimed - before, frames() - claimed)
    };
    for i in 1..5 {
        assert_eq!(step(i, false), (1, 1), "step {i}");
    }
    for i in 5..9 {
        assert_eq!(step(i, true), (1, 3), "step {i} with progress");
    }
}

/// Workers poll for runs through the partial index of unfinished runs, not by reading
/// every run ever made.
#[test]
fn acquiring_runs_reads_only_unfinished_ones() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("idem.db"), SyncMode::Normal).unwrap();
    let plan: Vec<String> = on_conn(&store, |conn| {
        conn.prepare(
            "EXPLAIN QUERY PLAN SELECT run_id, lease_token FROM runs
             WHERE status IN ('queued', 'running')
               AND (lease_holder IS NULL OR lease_expires <= ?1)
               AND lease_token < 9223372036854775807
             ORDER BY created, rowid",
        )?
        .query_map([0], |r| r.get(3))?
        .collect()
    });
    assert!(
        plan.iter().any(|step| step.contains("runs_unfinished")),
        "{plan:?}"
    );
    assert!(
        !plan.iter().any(|step| step.contains("TEMP B-TREE")),
        "{plan:?}"
    );
}

#[test]
fn empty_file_becomes_a_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("touched.db");
    std::fs::write(&path, b"").unwrap();
    drop(SqliteStore::open(&path, SyncMode::Normal).unwrap());
    drop(SqliteStore::open(&path, SyncMode::Normal).unwrap());
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
    let err = SqliteStore::open_read_only(dir.path()).unwrap_err();
    assert!(err.to_string().contains("is a directory"), "{err}");
}

/// Opens `path` on another thread, so that a store that hangs on it fails the test
/// instead of hanging it. (Not a measurement: the bound only turns a hang into an
/// answer.)
#[cfg(unix)]
fn open_error_without_hanging(path: &Path, read_only: bool) -> String {
    let (done, result) = std::sync::mpsc::channel();
    let owned = path.to_owned();
    std::thread::spawn(move || {
        let opened = if read_only {
            SqliteStore::open_read_only(&owned)
        } else {
            SqliteStore::open(&owned, SyncMode::Normal)
        };
        let _ = done.send(opened.map(drop).map_err(|e| e.to_string()));
    });
    match result.recv_timeout(Duration::from_secs(60)) {
        Ok(Err(message)) => {
            assert!(message.contains(&path.display().to_string()), "{message}");
            message
        }
        Ok(Ok(())) => panic!("{} opened", path.display()),
        Err(_) => panic!("opening {} hangs", path.display()),
    }
}

/// A FIFO, a socket or a device is refused at once, by what it is, and nothing opens
/// it: opening a FIFO for reading would wait for a writer forever.
#[cfg(unix)]
#[test]
fn special_files_are_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo.db");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if made.is_ok_and(|status| status.success()) {
        for read_only in [false, true] {
            let message = open_error_without_hanging(&fifo, read_only);
            assert!(message.contains("named pipe (FIFO)"), "{message}");
        }
    } else {
        eprintln!("skipped the FIFO: mkfifo is not available");
    }
    let socket = dir.path().join("socket.db");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let message = open_error_without_hanging(&socket, false);
    assert!(message.contains("a socket"), "{message}");
    let message = open_error_without_hanging(Path::new("/dev/null"), false);
    assert!(message.contains("a device"), "{message}");
    assert!(!dir.path().join("socket.db-wal").exists());
}

/// Set in the child process of `uri_like_names_are_plain_file_names`.
const URI_CHILD: &str = "IDEM_TEST_URI_CHILD";

/// A path that reads like a SQLite URI names a file, nothing more: the bundled SQLite
/// parses `file:` names as URIs whatever the flags say, so the store must never hand it
/// one. Only a relative path can start with `file:`, so the open runs in a child test
/// process whose working directory is a fresh temporary one.
#[test]
fn uri_like_names_are_plain_file_names() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "store::sqlite::tests::open_a_uri_like_name",
            "--ignored",
            "--nocapture",
        ])
        .current_dir(dir.path())
        .env(URI_CHILD, "1")
        .output()
        .unwrap();
    let log =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(
        log.contains("1 passed"),
        "the child test did not run: {log}"
    );
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().any(|n| n == "file:x.db?vfs=memdb"),
        "no such file in {names:?}"
    );
    // A real file, holding a real store.
    let store =
        SqliteStore::open(&dir.path().join("file:x.db?vfs=memdb"), SyncMode::Normal).unwrap();
    assert!(block_on(store.component("00")).unwrap().is_some());
}

/// The child of `uri_like_names_are_plain_file_names`: opens the relative path and
/// writes to it.
#[test]
#[ignore = "run by uri_like_names_are_plain_file_names in a directory of its own"]
fn open_a_uri_like_name() {
    if std::env::var_os(URI_CHILD).is_none() {
        return;
    }
    let store = SqliteStore::open(Path::new("file:x.db?vfs=memdb"), SyncMode::Normal).unwrap();
    assert_eq!(store.path(), Path::new("file:x.db?vfs=memdb"));
    assert!(block_on(store.put_component("00", b"\0asm")).unwrap());
}

/// `:memory:` is SQLite's in-memory database to anyone who knows SQLite, and a file of
/// that name to a store that opens every path as a file: refused for writing and for
/// reading, before anything is created. A file of that name is `./:memory:`.
#[test]
fn memory_name_is_refused_not_made_a_file() {
    let name = Path::new(":memory:");
    let opened = SqliteStore::open_with(name, &OpenOptions::default());
    if opened.is_ok() {
        // The working directory is the crate's: leave nothing behind, then fail.
        drop(opened);
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!(":memory:{suffix}"));
        }
        panic!("`:memory:` was opened as a file in the working directory");
    }
    let message = open_error(name);
    assert!(
        message.contains("in-memory") && message.contains("./:memory:"),
        "{message}"
    );
    let read_only = SqliteStore::open_read_only(name).map(drop).unwrap_err();
    assert!(
        matches!(read_only, StoreError::Open { .. }),
        "{read_only:?}"
    );
    assert!(!name.exists(), "nothing is created");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(":memory:");
    SqliteStore::open(&file, SyncMode::Normal).unwrap();
    assert!(file.is_file(), "a path ending in the name is a file");
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
    for opened in [
        SqliteStore::open(&path, SyncMode::Normal),
        SqliteStore::open_read_only(&path),
    ] {
        match opened {
            Err(err @ StoreError::SchemaTooNew { .. }) => {
                let StoreError::SchemaTooNew {
                    found, supported, ..
                } = &err
                else {
                    unreachable!()
                };
                assert_eq!((*found, *supported), (SCHEMA_VERSION + 1, SCHEMA_VERSION));
                assert!(err.to_string().contains("newer than this idem supports"));
            }
            other => panic!("expected SchemaTooNew, got {other:?}"),
        }
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
    // Every handle sees the schema applied once, at the current version.
    for store in &stores {
        let (tables, version): (i64, i64) = on_conn(store, |conn| {
            conn.query_row(
                "SELECT (SELECT count(*) FROM sqlite_schema WHERE name = 'runs'),
                        (SELECT user_version FROM pragma_user_version())",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
        });
        assert_eq!((tables, version), (1, SCHEMA_VERSION));
    }
}

/// Writers of one handle on many threads: a commit refused in a shared transaction
/// rolls back only itself, and every writer's answer matches what is on disk.
#[test]
fn concurrent_writers_share_transactions_without_sharing_failures() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("idem.db"), SyncMode::Full).unwrap();
    let fence = leased(&store, SyncMode::Full);
    let threads = 16;
    let per_thread = 40;
    std::thread::scope(|s| {
        for t in 0..threads {
            let (store, fence) = (&store, &fence);
            s.spawn(move || {
                block_on(async move {
                    for i in 0..per_thread {
                        let key = format!("k-{t}-{i}");
                        let req = ClaimRequest {
                            key: &key,
                            fence,
                            holder: "h",
                            fingerprint: None,
                            lease: Duration::from_secs(60),
                            durable: true,
                        };
                        let ClaimOutcome::Granted(grant) = store.claim(&req).await.unwrap() else {
                            panic!("fresh key {key} not granted");
                        };
                        let token = if i % 5 == 0 {
                            grant.token + 1_000_000
                        } else {
                            grant.token
                        };
                        let commit = Commit {
                            claim: ClaimRef {
                                key: &key,
                                token,
                                fence,
                            },
                            result: key.as_bytes(),
                            checkpoint: None,
                            counts: None,
                        };
                        let committed = store.commit(&commit).await;
                        assert_eq!(committed.is_ok(), i % 5 != 0, "{key}: {committed:?}");
                    }
                });
            });
        }
    });
    block_on(async {
        for t in 0..threads {
            for i in 0..per_thread {
                let key = format!("k-{t}-{i}");
                let committed = store.committed(&key).await.unwrap();
                if i % 5 == 0 {
                    assert_eq!(committed, None, "{key}");
                } else {
                    assert_eq!(committed.as_deref(), Some(key.as_bytes()), "{key}");
                }
            }
        }
        assert_eq!(
            store.open_claims(None).await.unwrap().len(),
            threads * per_thread / 5
        );
    });
}

/// The store's clock is the only time it reads: leases and timestamps follow a manual
/// clock, even one set far from the machine's.
#[test]
fn leases_and_timestamps_come_from_the_stores_clock() {
    let dir = tempfile::tempdir().unwrap();
    let clock = crate::store::Clock::manual(42);
    let options = OpenOptions {
        clock: clock.clone(),
        ..OpenOptions::default()
    };
    let store = SqliteStore::open_with(&dir.path().join("idem.db"), &options).unwrap();
    assert_eq!(block_on(store.now()).unwrap(), 42);
    let fence = leased(&store, SyncMode::Normal);
    let run = block_on(store.run("run-1")).unwrap().unwrap();
    assert_eq!(
        (run.created, run.lease.unwrap().expires),
        (42, 42 + 3_600_000)
    );
    clock.advance(Duration::from_millis(8));
    let req = ClaimRequest {
        key: "k",
        fence: &fence,
        holder: "h",
        fingerprint: None,
        lease: Duration::from_millis(100),
        durable: true,
    };
    block_on(store.claim(&req)).unwrap();
    let claim = &block_on(store.open_claims(None)).unwrap()[0];
    assert_eq!(claim.lease_expires, 150);
    assert_eq!(block_on(store.steps("run-1")).unwrap()[0].claimed_at, 50);
}

/// After a reboot (a boot id other than the one the store recorded), every token
/// granted starts above every token of the epoch before, so a claim lost with the power
/// (one made durable only with its commit) can never see its token handed out again;
/// run leases' tokens too, by either way of acquiring one. Reopening in the same boot
/// keeps the epoch.
#[test]
fn tokens_after_a_reboot_start_above_every_token_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let claim = |store: &SqliteStore, fence: &RunFence, key: &str| -> u64 {
        let req = ClaimRequest {
            key,
            fence,
            holder: "h",
            fingerprint: None,
            lease: Duration::from_secs(60),
            durable: false,
        };
        match block_on(store.claim(&req)).unwrap() {
            ClaimOutcome::Granted(grant) => grant.token,
            other => panic!("{key}: {other:?}"),
        }
    };
    let release = |store: &SqliteStore, fence: &RunFence, key: &str, token| {
        let claim = ClaimRef { key, token, fence };
        assert!(block_on(store.release(&claim)).unwrap());
    };
    let store = SqliteStore::open(&path, SyncMode::Full).unwrap();
    let fence = leased(&store, SyncMode::Full);
    assert_eq!(fence.token, 1);
    assert_eq!(claim(&store, &fence, "a"), 1);
    release(&store, &fence, "a", 1);
    submit(&store, "run-2");
    drop(store);

    // The same boot: the epoch stays.
    let store = SqliteStore::open(&path, SyncMode::Full).unwrap();
    assert_eq!(store.token_floor, 0);
    drop(store);

    // Another boot: the epoch moves on, and stays moved in that boot.
    let conn = Connection::open(&path).unwrap();
    conn.execute("UPDATE epoch SET boot_id = 'a boot before this one'", [])
        .unwrap();
    drop(conn);
    let store = SqliteStore::open(&path, SyncMode::Full).unwrap();
    assert_eq!(store.token_floor, 1 << 32);
    let fence = RunFence {
        token: match block_on(store.acquire_run("run-1", "w", Duration::from_secs(60))).unwrap() {
            Acquired::Leased(run) => run.token,
            other => panic!("{other:?}"),
        },
        ..fence
    };
    assert_eq!(fence.token, 1 << 32, "a run lease taken again");
    assert_eq!(claim(&store, &fence, "b"), 1 << 32, "a fresh key");
    assert_eq!(claim(&store, &fence, "a"), 1 << 32, "a released key");
    let polled = block_on(store.acquire_runs("w", 8, Duration::from_secs(60), &[])).unwrap();
    let polled: Vec<_> = polled
        .iter()
        .map(|run| (run.record.run_id.as_str(), run.token))
        .collect();
    assert_eq!(polled, [("run-2", 1 << 32)], "a run leased by a poll");
    drop(store);
    let store = SqliteStore::open(&path, SyncMode::Full).unwrap();
    assert_eq!(store.token_floor, 1 << 32);
}

/// A run's history is gathered by the process that saves it and written a batch at a
/// time: the saving handle sees every checkpoint at once, another process the batches
/// written and the last checkpoint, and everything once the first handle closes. A save
/// rolled back gathers nothing.
#[test]
fn a_runs_history_is_written_a_batch_at_a_time_and_its_last_checkpoint_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let store = SqliteStore::open(&path, SyncMode::Normal).unwrap();
    let fence = leased(&store, SyncMode::Normal);
    let save = |step: u64| {
        let checkpoint = Checkpoint {
            step,
            state: format!("state {step}").into_bytes(),
        };
        block_on(store.save_progress(&fence, &checkpoint, None)).unwrap();
    };
    let steps = |store: &SqliteStore| -> Vec<u64> {
        block_on(store.history("run-1"))
            .unwrap()
            .unwrap()
            .checkpoints
            .iter()
            .map(|c| c.step)
            .collect()
    };
    for step in 1..=40 {
        save(step);
    }
    let all: Vec<u64> = (1..=40).collect();
    assert_eq!(steps(&store), all);

    let other = SqliteStore::open(&path, SyncMode::Normal).unwrap();
    let batch_and_last: Vec<u64> = (1..=32).chain([40]).collect();
    assert_eq!(steps(&other), batch_and_last);
    let last = block_on(other.load_progress("run-1")).unwrap().unwrap();
    assert_eq!(last.step, 40);
    let before = block_on(other.checkpoint_before("run-1", None))
        .unwrap()
        .unwrap();
    assert_eq!(before.checkpoint, last);

    // A save whose work fails (its transaction rolled back) leaves neither its last
    // checkpoint nor a gathered checkpoint.
    let position = crate::store::Position {
        lease: fence.token,
        tick: crate::store::tick(),
    };
    let refused = block_on(store.db.write(SyncMode::Normal, move |conn, now| {
        let checkpoint = Checkpoint {
            step: 99,
            state: b"rolled back".to_vec(),
        };
        super::runs::save_checkpoint(conn, "run-1", &checkpoint, position, now)?;
        Err::<(), _>(super::TxError::Store(StoreError::UnknownRun {
            run_id: "run-1".to_owned(),
        }))
    }));
    assert!(refused.is_err());
    assert_eq!(steps(&store), all);
    assert_eq!(
        block_on(store.load_progress("run-1"))
            .unwrap()
            .unwrap()
            .step,
        40
    );

    drop(store);
    assert_eq!(steps(&other), all);
}

/// A run's lease ending writes what its process gathered of its history.
#[test]
fn a_runs_history_is_written_when_its_lease_ends() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let store = SqliteStore::open(&path, SyncMode::Normal).unwrap();
    let fence = leased(&store, SyncMode::Normal);
    for step in 1..=3 {
        let checkpoint = Checkpoint {
            step,
            state: b"s".to_vec(),
        };
        block_on(store.save_progress(&fence, &checkpoint, None)).unwrap();
    }
    let other = SqliteStore::open(&path, SyncMode::Normal).unwrap();
    let count = |s: &SqliteStore| {
        block_on(s.history("run-1"))
            .unwrap()
            .unwrap()
            .checkpoints
            .len()
    };
    assert_eq!(count(&other), 1, "only the last checkpoint is out");
    block_on(store.release_run(&fence, &Counts::default(), None)).unwrap();
    assert_eq!(count(&other), 3);
    drop(store);
}

/// A running run's history passes its bound by a few batches at most, and comes back
/// to it when its lease ends.
#[test]
fn a_runs_history_keeps_near_its_bound_and_at_it_once_its_lease_ends() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("idem.db"), SyncMode::Normal).unwrap();
    let fence = leased(&store, SyncMode::Normal);
    let keep = crate::store::HISTORY_KEEP as usize;
    for step in 1..=1_300 {
        let checkpoint = Checkpoint {
            step,
            state: b"s".to_vec(),
        };
        block_on(store.save_progress(&fence, &checkpoint, None)).unwrap();
    }
    let history = block_on(store.history("run-1")).unwrap().unwrap();
    let kept = history.checkpoints.len();
    assert!(history.collected);
    assert!((keep..=keep + 256).contains(&kept), "{kept} kept");
    assert_eq!(history.checkpoints.last().unwrap().step, 1_300);
    block_on(store.release_run(&fence, &Counts::default(), None)).unwrap();
    let history = block_on(store.history("run-1")).unwrap().unwrap();
    assert_eq!(history.checkpoints.len(), keep);
    assert_eq!(history.checkpoints[0].step, 301);
}

#[test]
fn a_runs_history_is_cut_across_its_leases_at_its_bound() {
    // Three leases; the oldest kept checkpoint is in the second: the first is collected
    // whole, the second in part, the third kept whole.
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("idem.db"), SyncMode::Normal).unwrap();
    let mut fence = leased(&store, SyncMode::Normal);
    let keep = crate::store::HISTORY_KEEP;
    let leases = [keep * 3 / 10, keep * 8 / 10, keep / 2];
    let mut step = 0;
    for (n, saves) in leases.into_iter().enumerate() {
        if n > 0 {
            block_on(store.release_run(&fence, &Counts::default(), None)).unwrap();
            fence = lease(&store, SyncMode::Normal);
        }
        for _ in 0..saves {
            step += 1;
            let checkpoint = Checkpoint {
                step,
                state: b"s".to_vec(),
            };
            block_on(store.save_progress(&fence, &checkpoint, None)).unwrap();
        }
    }
    block_on(store.release_run(&fence, &Counts::default(), None)).unwrap();
    let history = block_on(store.history("run-1")).unwrap().unwrap();
    assert!(history.collected);
    let steps: Vec<u64> = history.checkpoints.iter().map(|c| c.step).collect();
    let expected: Vec<u64> = (step - keep + 1..=step).collect();
    assert_eq!(steps, expected);
    let kept_leases: std::collections::BTreeSet<u64> = history
        .checkpoints
        .iter()
        .map(|c| c.position.lease)
        .collect();
    assert_eq!(kept_leases.len(), 2, "{kept_leases:?}");
}
