//! Faults of the database under a SQLite store: read-only, locked past the busy
//! timeout, full, corrupt. Each must fail with a [`StoreError::Database`] naming the
//! file and the cause, leave committed results as they were, and let the store carry on
//! once the cause is gone.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OpenFlags};

use super::{OpenOptions, SqliteStore};
use crate::store::tests::block_on;
use crate::store::{
    Acquired, CatalogStore, ClaimOutcome, ClaimRef, ClaimRequest, Commit, Counts, DatabaseFault,
    Grant, InstanceStore, OperatorStore, RunFence, RunFilter, StoreError, Submission, SyncMode,
    WorkerStore,
};

const LEASE: Duration = Duration::from_secs(60);

/// The fence of run `run-1`, as `store_with_commits` leased it.
fn fence() -> RunFence {
    RunFence {
        run_id: "run-1".to_owned(),
        token: 1,
        sync: SyncMode::Normal,
    }
}

fn req<'a>(key: &'a str, fence: &'a RunFence) -> ClaimRequest<'a> {
    ClaimRequest {
        key,
        fence,
        holder: "h",
        fingerprint: None,
        lease: LEASE,
        durable: true,
    }
}

fn claim(store: &SqliteStore, key: &str) -> Result<Grant, StoreError> {
    let fence = fence();
    block_on(store.claim(&req(key, &fence))).map(|outcome| match outcome {
        ClaimOutcome::Granted(grant) => grant,
        other => panic!("{key}: expected a grant, got {other:?}"),
    })
}

fn grant(store: &SqliteStore, key: &str) -> Grant {
    claim(store, key).unwrap()
}

fn commit(store: &SqliteStore, key: &str, token: u64, result: &[u8]) -> Result<(), StoreError> {
    let fence = fence();
    block_on(store.commit(&Commit {
        claim: ClaimRef {
            key,
            token,
            fence: &fence,
        },
        result,
        checkpoint: None,
        counts: None,
    }))
}

/// A store at `dir/idem.db` with run `run-1` leased and `n` committed keys `done-0..n`.
fn store_with_commits(dir: &Path, n: usize) -> (PathBuf, SqliteStore) {
    let path = dir.join("idem.db");
    let store = SqliteStore::open(&path, SyncMode::Normal).unwrap();
    block_on(async {
        store.put_component("00", b"").await.unwrap();
        store
            .submit(&Submission {
                run_id: "run-1",
                agent: "test",
                digest: "00",
                namespace: "model",
                input: b"{}",
                authority: b"",
                replace_authority: false,
                priority: 0,
            })
            .await
            .unwrap();
        let leased = store
            .acquire_run("run-1", "w", Duration::from_secs(3600))
            .await;
        assert!(matches!(leased.unwrap(), Acquired::Leased(run) if run.token == 1));
    });
    for i in 0..n {
        let key = format!("done-{i}");
        let g = grant(&store, &key);
        commit(&store, &key, g.token, format!("result {i}").as_bytes()).unwrap();
    }
    (path, store)
}

/// Every committed row, read from outside the store, as it is on disk.
fn results(path: &Path) -> Vec<(String, Vec<u8>, i64, i64)> {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let mut stmt = conn
        .prepare("SELECT key, result, token, committed_at FROM steps WHERE result IS NOT NULL ORDER BY key")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
}

fn integrity(path: &Path) -> Vec<String> {
    // On a badly damaged file SQLite may fail the check itself rather than list
    // problems: that failure is the damage report then.
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    let report = conn.prepare("PRAGMA integrity_check").and_then(|mut stmt| {
        stmt.query_map([], |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<String>>>()
    });
    report.unwrap_or_else(|e| vec![format!("check failed: {e}")])
}

fn assert_intact(path: &Path) {
    assert_eq!(integrity(path), ["ok"], "{}", path.display());
}

/// Asserts that `err` is the fault `expected` during `op`, that its text names the
/// file, and returns the text.
fn fault_text(err: StoreError, expected: DatabaseFault, op: &str, path: &Path) -> String {
    let text = err.to_string();
    match err {
        StoreError::Database {
            location,
            op: got_op,
            fault,
            ..
        } => {
            assert_eq!(fault, expected, "{text}");
            assert_eq!(got_op, op, "{text}");
            assert_eq!(location, path.display().to_string(), "{text}");
        }
        other => panic!("expected a {expected:?} database fault, got {other:?}"),
    }
    assert!(text.contains(&path.display().to_string()), "{text}");
    text
}

/// Folds the WAL into the database file, so that the file's bytes are the whole store.
fn checkpoint(path: &Path) {
    let conn = Connection::open(path).unwrap();
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
}

#[test]
fn read_only_handle_refuses_every_write_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let (path, store) = store_with_commits(dir.path(), 3);
    let held = grant(&store, "open-key");
    drop(store);
    checkpoint(&path);
    let before = results(&path);
    let bytes = std::fs::read(&path).unwrap();

    let ro = SqliteStore::open_read_only(&path).unwrap();
    let fence = fence();
    let open = ClaimRef {
        key: "open-key",
        token: held.token,
        fence: &fence,
    };
    let writes: [(&str, Result<(), StoreError>); 5] = [
        ("claim a key", claim(&ro, "new-key").map(drop)),
        (
            "commit a result",
            commit(&ro, "open-key", held.token, b"late"),
        ),
        ("release a claim", block_on(ro.release(&open)).map(drop)),
        (
            "save counts",
            block_on(ro.save_counts(&fence, &Counts::default())),
        ),
        (
            "store a component",
            block_on(ro.put_component("01", b"")).map(drop),
        ),
    ];
    for (op, result) in writes {
        let text = fault_text(result.unwrap_err(), DatabaseFault::ReadOnly, op, &path);
        assert!(text.contains("the database is read-only"), "{text}");
        assert!(
            text.contains("SQLite: attempt to write a readonly database"),
            "{text}"
        );
        assert!(
            text.contains("idem needs write access to the file and to its directory"),
            "{text}"
        );
    }
    // Reading still works, and sees what was committed.
    assert_eq!(
        block_on(ro.committed("done-1")).unwrap(),
        Some(b"result 1".to_vec())
    );
    drop(ro);

    assert_eq!(std::fs::read(&path).unwrap(), bytes, "the file changed");
    assert_intact(&path);
    // Writable again: the holder commits the claim it kept all along.
    let store = SqliteStore::open(&path, SyncMode::Normal).unwrap();
    commit(&store, "open-key", held.token, b"done").unwrap();
    let after = results(&path);
    assert_eq!(after.len(), before.len() + 1);
    assert!(before.iter().all(|row| after.contains(row)));
}

#[test]
fn locked_database_fails_after_the_busy_timeout_then_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let (path, store) = store_with_commits(dir.path(), 3);
    drop(store);
    let timeout = Duration::from_millis(200);
    let options = OpenOptions {
        busy_timeout: timeout,
        ..OpenOptions::default()
    };
    let store = SqliteStore::open_with(&path, &options).unwrap();
    let held = grant(&store, "open-key");
    let before = results(&path);

    // Another process's connection takes the write lock and keeps it.
    let other = Connection::open(&path).unwrap();
    other.execute_batch("BEGIN EXCLUSIVE").unwrap();

    let started = Instant::now();
    let err = claim(&store, "new-key").unwrap_err();
    let waited = started.elapsed();
    assert!(waited >= timeout, "gave up after {waited:?}");
    assert!(waited < Duration::from_secs(3), "waited {waited:?}");
    let text = fault_text(
        err,
        DatabaseFault::Locked {
            busy_timeout: timeout,
        },
        "claim a key",
        &path,
    );
    assert!(text.contains("the database is locked"), "{text}");
    assert!(text.contains("(200ms)"), "{text}");
    assert!(text.contains("(SQLite: database is locked)"), "{text}");
    let err = commit(&store, "open-key", held.token, b"v").unwrap_err();
    fault_text(
        err,
        DatabaseFault::Locked {
            busy_timeout: timeout,
        },
        "commit a result",
        &path,
    );
    // A new handle cannot even open the store while the lock is held.
    let err = SqliteStore::open_with(&path, &options).unwrap_err();
    fault_text(
        err,
        DatabaseFault::Locked {
            busy_timeout: timeout,
        },
        "open the store",
        &path,
    );
    // Readers are not blocked in WAL mode.
    assert_eq!(
        block_on(store.committed("done-0")).unwrap(),
        Some(b"result 0".to_vec())
    );

    other.execute_batch("ROLLBACK").unwrap();
    drop(other);
    // Nothing the refused writes attempted was written; the claim is still held and
    // its holder commits it now.
    assert_eq!(results(&path), before);
    commit(&store, "open-key", held.token, b"v").unwrap();
    grant(&store, "new-key");
    assert_intact(&path);
    assert!(before.iter().all(|row| results(&path).contains(row)));
}

#[test]
fn full_database_refuses_writes_and_keeps_every_commit() {
    let dir = tempfile::tempdir().unwrap();
    let (path, store) = store_with_commits(dir.path(), 3);
    drop(store);
    let size = std::fs::metadata(&path).unwrap().len();
    // A cap at (about) today's size: the first write that needs a new page fails.
    let options = OpenOptions {
        max_size: Some(size),
        ..OpenOptions::default()
    };
    let store = SqliteStore::open_with(&path, &options).unwrap();
    let big = vec![0x5a; 3000];
    let mut committed = Vec::new();
    // Claims are small rows that come and go; results are what need new pages.
    let (key, held, err) = loop {
        let key = format!("big-{}", committed.len());
        let g = grant(&store, &key);
        match commit(&store, &key, g.token, &big) {
            Ok(()) => committed.push(key),
            Err(e) => break (key, g, e),
        }
        assert!(committed.len() < 1_000, "the cap never bit");
    };
    let text = fault_text(err, DatabaseFault::Full, "commit a result", &path);
    assert!(text.contains("the disk is full"), "{text}");
    assert!(
        text.contains("(SQLite: database or disk is full)"),
        "{text}"
    );
    let before = results(&path);
    // The claim is still held, and its commit keeps failing for the same reason.
    let err = commit(&store, &key, held.token, &big).unwrap_err();
    fault_text(err, DatabaseFault::Full, "commit a result", &path);
    assert_eq!(block_on(store.open_claims(None)).unwrap().len(), 1);
    drop(store);
    assert_eq!(results(&path), before, "a refused commit left something");
    assert_intact(&path);

    // Room again: the claim that could not commit commits now.
    let store = SqliteStore::open(&path, SyncMode::Normal).unwrap();
    commit(&store, &key, held.token, &big).unwrap();
    for key in &committed {
        assert_eq!(block_on(store.committed(key)).unwrap(), Some(big.clone()));
    }
    let after = results(&path);
    assert!(before.iter().all(|row| after.contains(row)));
    assert_intact(&path);
}

/// Writers that share one group-commit transaction all learn why it failed when SQLite
/// rolls it back on a full disk (it rolls back the whole transaction, not just the
/// statement), and what each was told matches what is on disk.
#[test]
fn full_database_fails_every_writer_of_a_batch_for_the_same_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (path, store) = store_with_commits(dir.path(), 0);
    drop(store);
    let size = std::fs::metadata(&path).unwrap().len();
    let store = SqliteStore::open_with(
        &path,
        &OpenOptions {
            max_size: Some(size + 4 * 4096),
            ..OpenOptions::default()
        },
    )
    .unwrap();
    let big = vec![7u8; 6000];
    // Long keys, so that claims too run out of room, not only the results.
    let key_of = |t: usize, i: usize| format!("{t}-{i}-{}", "k".repeat(400));
    type Outcome = (
        String,
        Result<Grant, StoreError>,
        Option<Result<(), StoreError>>,
    );
    let outcomes: Vec<Outcome> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..8)
            .map(|t| {
                let store = &store;
                let big = &big;
                s.spawn(move || {
                    (0..8)
                        .map(|i| {
                            let key = key_of(t, i);
                            let claimed = claim(store, &key);
                            let committed = match &claimed {
                                // Every other claim is committed; the rest stay open.
                                Ok(g) if i % 2 == 0 => Some(commit(store, &key, g.token, big)),
                                _ => None,
                            };
                            (key, claimed, committed)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    let open: Vec<(String, u64)> = block_on(store.open_claims(None))
        .unwrap()
        .into_iter()
        .map(|c| (c.key, c.token))
        .collect();
    let is_full = |e: &StoreError| {
        matches!(
            e,
            StoreError::Database {
                fault: DatabaseFault::Full,
                ..
            }
        )
    };
    let (mut refused_claims, mut refused_commits) = (0, 0);
    for (key, claimed, committed) in &outcomes {
        let on_disk = block_on(store.committed(key)).unwrap();
        match (claimed, committed) {
            (Err(e), _) => {
                assert!(is_full(e), "{e}");
                refused_claims += 1;
                assert!(open.iter().all(|(k, _)| k != key), "refused claim written");
                assert_eq!(on_disk, None);
            }
            (Ok(g), None) => assert!(open.contains(&(key.clone(), g.token))),
            (Ok(_), Some(Ok(()))) => assert_eq!(on_disk.as_ref(), Some(&big)),
            (Ok(g), Some(Err(e))) => {
                assert!(is_full(e), "{e}");
                refused_commits += 1;
                assert_eq!(on_disk, None, "refused commit written");
                assert!(open.contains(&(key.clone(), g.token)), "claim lost");
            }
        }
    }
    assert!(
        refused_claims > 0 && refused_commits > 0,
        "the cap never bit"
    );
    drop(store);
    assert_intact(&path);
}

/// The page numbers of the root pages of `tables`, from the schema.
fn root_pages(path: &Path, tables: &[&str]) -> Vec<u64> {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    tables
        .iter()
        .map(|t| {
            conn.query_row(
                "SELECT rootpage FROM sqlite_schema WHERE type = 'table' AND name = ?1",
                [t],
                |r| r.get::<_, i64>(0),
            )
            .unwrap() as u64
        })
        .collect()
}

fn page_size(path: &Path) -> u64 {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    conn.pragma_query_value(None, "page_size", |r| r.get::<_, i64>(0))
        .unwrap() as u64
}

/// Overwrites whole pages of the file with a pattern that is no valid b-tree page.
fn clobber_pages(path: &Path, pages: &[u64]) {
    use std::io::{Seek, SeekFrom, Write};
    let size = page_size(path);
    let mut file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    for &page in pages {
        file.seek(SeekFrom::Start((page - 1) * size)).unwrap();
        let garbage: Vec<u8> = (0..size).map(|i| (i * 7 + 0x31) as u8).collect();
        file.write_all(&garbage).unwrap();
    }
    file.sync_all().unwrap();
}

#[test]
fn corrupt_database_is_reported_by_name_and_not_made_worse() {
    let dir = tempfile::tempdir().unwrap();
    let (path, store) = store_with_commits(dir.path(), 20);
    drop(store);
    checkpoint(&path);
    clobber_pages(&path, &root_pages(&path, &["runs", "steps"]));
    let damage = integrity(&path);
    assert_ne!(damage, ["ok"]);
    let bytes = std::fs::read(&path).unwrap();
    let page = page_size(&path) as usize;

    match SqliteStore::open(&path, SyncMode::Normal) {
        Ok(store) => {
            let err = block_on(store.committed("done-3")).unwrap_err();
            let text = fault_text(err, DatabaseFault::Corrupt, "read a result", &path);
            assert!(text.contains("the database file is corrupt"), "{text}");
            assert!(text.contains("sqlite3 FILE .recover"), "{text}");
            let err = claim(&store, "done-3").unwrap_err();
            fault_text(err, DatabaseFault::Corrupt, "claim a key", &path);
            let err = block_on(store.runs(&RunFilter::default())).unwrap_err();
            fault_text(err, DatabaseFault::Corrupt, "list runs", &path);
        }
        Err(err) => {
            fault_text(err, DatabaseFault::Corrupt, "open the store", &path);
        }
    }
    let err = SqliteStore::open_read_only(&path)
        .and_then(|s| block_on(s.runs(&RunFilter::default())))
        .unwrap_err();
    fault_text(err, DatabaseFault::Corrupt, "list runs", &path);

    // Not made worse: past the header page, not a byte changed, and SQLite finds the
    // same damage as before.
    checkpoint(&path);
    let after = std::fs::read(&path).unwrap();
    assert_eq!(after.len(), bytes.len());
    assert!(
        after[page..] == bytes[page..],
        "idem wrote to a corrupt file"
    );
    assert_eq!(integrity(&path), damage);
}

#[test]
fn corrupt_schema_page_is_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let (path, store) = store_with_commits(dir.path(), 2);
    drop(store);
    checkpoint(&path);
    // Keep the 100-byte file header; wreck the schema table's page after it.
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.seek(SeekFrom::Start(100)).unwrap();
        file.write_all(&[0xee; 400]).unwrap();
    }
    let bytes = std::fs::read(&path).unwrap();
    let err = SqliteStore::open(&path, SyncMode::Normal).unwrap_err();
    let text = fault_text(err, DatabaseFault::Corrupt, "open the store", &path);
    assert!(text.contains("corrupt"), "{text}");
    let err = SqliteStore::open_read_only(&path).unwrap_err();
    fault_text(err, DatabaseFault::Corrupt, "open the store", &path);
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "the file changed");
}
