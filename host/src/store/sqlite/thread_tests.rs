//! Tests of the database thread alone, on a table of its own: group commit, savepoints,
//! SQLite's own rollbacks, per-batch durability, panics and a dying thread.
//!
//! A batch is made deterministic by a gate: a read that holds the thread until the
//! test has queued every write it wants in one batch. Nothing here waits on a timer.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use super::*;
use crate::store::tests::block_on;

impl WorkFailure for rusqlite::Error {
    fn sqlite_failure(&self) -> Option<Failure> {
        Some(Failure::from(self))
    }
}

type Told<T> = Result<T, DbError<rusqlite::Error>>;

fn db() -> (tempfile::TempDir, DbThread) {
    let dir = tempfile::tempdir().unwrap();
    let conn = Connection::open(dir.path().join("t.db")).unwrap();
    conn.execute_batch(
        "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; \
         PRAGMA wal_autocheckpoint = 0; CREATE TABLE t (id INTEGER);",
    )
    .unwrap();
    let db = DbThread::spawn(
        conn,
        Clock::manual(0),
        SyncMode::Normal,
        Duration::from_secs(5),
        |_| {},
    )
    .unwrap();
    (dir, db)
}

/// Holds the thread until the returned sender is dropped (or sent to): writes queued
/// meanwhile all wait for the same batch.
fn hold(db: &DbThread) -> mpsc::Sender<()> {
    let (started, is_started) = mpsc::channel();
    let (release, released) = mpsc::channel::<()>();
    let gate = db
        .queue_read(move |_: &Connection, _| -> Result<(), rusqlite::Error> {
            started.send(()).unwrap();
            let _ = released.recv();
            Ok(())
        })
        .unwrap();
    is_started.recv().unwrap();
    drop(gate);
    release
}

fn rows(db: &DbThread) -> Vec<i64> {
    block_on(db.read(|conn, _| {
        conn.prepare("SELECT id FROM t ORDER BY id")?
            .query_map([], |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<i64>>>()
    }))
    .unwrap()
}

fn insert(conn: &Connection, id: i64) -> rusqlite::Result<()> {
    conn.execute("INSERT INTO t VALUES (?1)", [id]).map(drop)
}

fn count(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
}

fn full_disk() -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(13),
        Some("database or disk is full".into()),
    )
}

/// Queued writes run in one transaction, in order (each sees the rows of the members
/// before it), each with its own result; a refused write takes nothing else with it.
#[test]
fn queued_writes_share_one_transaction_and_keep_their_own_results() {
    let (dir, db) = db();
    let wal = dir.path().join("t.db-wal");
    let frames = || {
        std::fs::metadata(&wal)
            .map_or(0, |m| m.len())
            .saturating_sub(32)
            / (24 + 4096)
    };
    let before = frames();
    let release = hold(&db);
    let answers: Vec<_> = (0..48_i64)
        .map(|id| {
            db.queue_write(SyncMode::Normal, move |conn, _| {
                if id % 7 == 3 {
                    insert(conn, -id)?;
                    return Err(rusqlite::Error::QueryReturnedNoRows);
                }
                insert(conn, id)?;
                count(conn)
            })
            .unwrap()
        })
        .collect();
    drop(release);
    let told: Vec<Told<i64>> = answers.into_iter().map(|a| block_on(a).unwrap()).collect();
    let on_disk = rows(&db);
    let mut kept = 0;
    for (id, told) in (0_i64..).zip(told) {
        if id % 7 == 3 {
            assert!(matches!(told, Err(DbError::Work(_))), "writer {id}");
            assert!(!on_disk.contains(&-id), "writer {id}'s refused row stayed");
        } else {
            kept += 1;
            // It saw every row kept before it, uncommitted: the same transaction.
            assert_eq!(told.unwrap(), kept, "writer {id}");
            assert!(on_disk.contains(&id), "writer {id}'s row is missing");
        }
    }
    assert_eq!(on_disk.len(), kept as usize);
    // One commit: the table's one page, not a frame per writer.
    assert!(frames() - before < 4, "{} WAL frames", frames() - before);
}

/// A member's work loses the transaction, as SQLite's own rollback on a full disk
/// would: every member already run is told the real cause (not success, not a vague
/// error), and the members not run yet commit in a fresh transaction.
#[test]
fn a_batch_sqlite_rolled_back_tells_its_members_why_and_retries_the_rest() {
    let (_dir, db) = db();
    let release = hold(&db);
    let aborted = Arc::new(AtomicBool::new(false));
    let answers: Vec<_> = (0..7_i64)
        .map(|id| {
            let aborted = Arc::clone(&aborted);
            db.queue_write(SyncMode::Normal, move |conn, _| {
                insert(conn, id)?;
                if id == 2 && !aborted.swap(true, Ordering::SeqCst) {
                    conn.execute_batch("ROLLBACK")?;
                    return Err(full_disk());
                }
                Ok(())
            })
            .unwrap()
        })
        .collect();
    drop(release);
    let told: Vec<Told<()>> = answers.into_iter().map(|a| block_on(a).unwrap()).collect();
    let on_disk = rows(&db);
    for (id, told) in (0_i64..).zip(&told) {
        if id <= 2 {
            let cause = match told {
                Err(DbError::Commit(failure)) => failure.message.clone(),
                Err(DbError::Work(e)) => e.to_string(),
                other => panic!("writer {id}: {other:?}"),
            };
            assert!(
                cause.contains("database or disk is full"),
                "writer {id}: {cause}"
            );
            assert!(
                !on_disk.contains(&id),
                "writer {id}'s row survived the rollback"
            );
        } else {
            assert!(told.is_ok(), "writer {id}: {told:?}");
            assert!(on_disk.contains(&id), "writer {id}'s row is missing");
        }
    }
}

/// The first work of a transaction has no savepoint: when it fails the transaction
/// goes, and the writes behind it still commit, in a fresh one.
#[test]
fn a_failing_first_work_leaves_the_rest_of_the_batch_to_commit() {
    let (_dir, db) = db();
    let release = hold(&db);
    let first = db
        .queue_write(SyncMode::Normal, |conn, _| {
            insert(conn, 100)?;
            Err::<(), _>(rusqlite::Error::QueryReturnedNoRows)
        })
        .unwrap();
    let rest: Vec<_> = (1..4_i64)
        .map(|id| {
            db.queue_write(SyncMode::Normal, move |conn, _| insert(conn, id))
                .unwrap()
        })
        .collect();
    drop(release);
    assert!(matches!(block_on(first).unwrap(), Err(DbError::Work(_))));
    for answer in rest {
        block_on(answer).unwrap().unwrap();
    }
    assert_eq!(rows(&db), [1, 2, 3]);
}

/// A batch runs at `synchronous = FULL` if any of its writes asks for it, and goes
/// back to NORMAL for a batch that does not.
#[test]
fn a_batch_is_as_durable_as_its_most_demanding_write() {
    let (_dir, db) = db();
    let synchronous = |conn: &Connection, _| -> rusqlite::Result<i64> {
        conn.pragma_query_value(None, "synchronous", |r| r.get(0))
    };
    let release = hold(&db);
    let answers: Vec<_> = [SyncMode::Normal, SyncMode::Full, SyncMode::Normal]
        .into_iter()
        .map(|sync| db.queue_write(sync, synchronous).unwrap())
        .collect();
    drop(release);
    for answer in answers {
        assert_eq!(block_on(answer).unwrap().unwrap(), 2);
    }
    assert_eq!(
        block_on(db.write(SyncMode::Normal, synchronous)).unwrap(),
        1
    );
    assert_eq!(block_on(db.write(SyncMode::Full, synchronous)).unwrap(), 2);
    // The checkpoint cadence follows the durability (schema::wal_autocheckpoint_pages).
    let cadence = |conn: &Connection, _| -> rusqlite::Result<i64> {
        conn.pragma_query_value(None, "wal_autocheckpoint", |r| r.get(0))
    };
    assert_eq!(block_on(db.write(SyncMode::Full, cadence)).unwrap(), 1_000);
    assert_eq!(
        block_on(db.write(SyncMode::Normal, cadence)).unwrap(),
        10_000
    );
}

/// A work that panics is rolled back alone and its writer told; the thread goes on.
#[test]
fn a_panicking_work_is_rolled_back_alone() {
    let (_dir, db) = db();
    let release = hold(&db);
    let panicking = |id: i64| {
        move |conn: &Connection, _| -> rusqlite::Result<()> {
            insert(conn, id)?;
            panic!("work {id} fails");
        }
    };
    let first = db.queue_write(SyncMode::Normal, panicking(10)).unwrap();
    let ok = db
        .queue_write(SyncMode::Normal, |conn, _| insert(conn, 1))
        .unwrap();
    let middle = db.queue_write(SyncMode::Normal, panicking(20)).unwrap();
    let last = db
        .queue_write(SyncMode::Normal, |conn, _| insert(conn, 2))
        .unwrap();
    drop(release);
    for (answer, id) in [(first, 10), (middle, 20)] {
        match block_on(answer).unwrap() {
            Err(DbError::Panicked(message)) => assert!(message.contains(&format!("work {id}"))),
            other => panic!("{other:?}"),
        }
    }
    block_on(ok).unwrap().unwrap();
    block_on(last).unwrap().unwrap();
    assert_eq!(rows(&db), [1, 2]);
}

/// A job that brings the thread down (no store work can: each is guarded).
struct Crash;

impl Job for Crash {
    fn sync(&self) -> SyncMode {
        SyncMode::Normal
    }

    fn run(&mut self, _: &Connection, _: Millis, _: bool) -> Ran {
        panic!("the database thread dies");
    }

    fn settle(self: Box<Self>, _: Result<(), &Failure>) {}
}

/// When the thread dies, nobody waits forever: writes queued with the fatal one, and
/// every later call, are told the thread is gone.
#[test]
fn callers_are_told_when_the_thread_dies() {
    let (_dir, db) = db();
    let release = hold(&db);
    assert!(db.send_job(Box::new(Crash)));
    let queued: Vec<_> = (0..3_i64)
        .map(|id| {
            db.queue_write(SyncMode::Normal, move |conn, _| insert(conn, id))
                .unwrap()
        })
        .collect();
    drop(release);
    for answer in queued {
        assert!(block_on(answer).is_err(), "the reply was not dropped");
    }
    let later: Told<()> = block_on(db.write(SyncMode::Normal, |conn, _| insert(conn, 9)));
    assert!(matches!(later, Err(DbError::Gone)), "{later:?}");
    let read: Result<i64, DbError<rusqlite::Error>> = block_on(db.read(|conn, _| count(conn)));
    assert!(matches!(read, Err(DbError::Gone)), "{read:?}");
}

/// Many writers, each writing again as soon as it is answered, with a reader among
/// them: every write ends with the truth about its row, and a reader between batches
/// never sees rows disappear. A lost reply would hang here.
#[test]
fn writers_that_keep_writing_lose_nothing() {
    let (_dir, db) = db();
    let (threads, writes) = (8_i64, 60_i64);
    let told: Vec<(i64, bool)> = std::thread::scope(|s| {
        let db = &db;
        let reader = s.spawn(move || {
            let mut last = 0;
            for _ in 0..200 {
                let n = block_on(db.read(|conn, _| count(conn))).unwrap();
                assert!(n >= last, "{n} rows after {last}");
                last = n;
            }
        });
        let writers: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    block_on(async {
                        let mut told = Vec::new();
                        for i in 0..writes {
                            let id = t * writes + i;
                            let result: Told<()> = db
                                .write(SyncMode::Normal, move |conn, _| {
                                    insert(conn, id)?;
                                    if id % 5 == 0 {
                                        return Err(rusqlite::Error::QueryReturnedNoRows);
                                    }
                                    Ok(())
                                })
                                .await;
                            told.push((id, result.is_ok()));
                        }
                        told
                    })
                })
            })
            .collect();
        reader.join().unwrap();
        writers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    let on_disk = rows(&db);
    for &(id, ok) in &told {
        assert_eq!(ok, id % 5 != 0, "writer of {id}");
        assert_eq!(ok, on_disk.contains(&id), "row {id}");
    }
    assert_eq!(on_disk.len(), told.iter().filter(|(_, ok)| *ok).count());
}

/// A write run on the caller's thread never waits for another process's lock: it
/// hands its work to the thread, which waits the busy timeout for it as before. (Had
/// it taken the lock's refusal as its answer, this write would fail at once.)
#[test]
fn a_write_that_meets_another_writer_waits_on_the_thread() {
    let (dir, db) = db();
    let other = Connection::open(dir.path().join("t.db")).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        other
            .execute_batch("INSERT INTO t VALUES (1); COMMIT")
            .unwrap();
    });
    let told: Told<()> = block_on(db.write(SyncMode::Normal, |conn, _| insert(conn, 2)));
    releaser.join().unwrap();
    assert!(told.is_ok(), "{told:?}");
    assert_eq!(rows(&db), vec![1, 2]);
    // And the connection is free for the caller again: nothing stays queued.
    let told: Told<()> = block_on(db.write(SyncMode::Normal, |conn, _| insert(conn, 3)));
    assert!(told.is_ok(), "{told:?}");
    // The thread counts its round's work done only after answering it all, so on a
    // busy machine the count may lag the answers for a moment.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while db.shared.queued.load(Ordering::Acquire) != 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(db.shared.queued.load(Ordering::Acquire), 0);
    assert_eq!(rows(&db), vec![1, 2, 3]);
}

/// Inserts `ids` with a write that borrows them, noting in `copied` whether the write
/// had to be turned into one that owns them.
fn insert_borrowed(db: &DbThread, ids: &[i64], copied: &AtomicBool) -> Told<usize> {
    fn insert_all(ids: &[i64], conn: &Connection) -> rusqlite::Result<usize> {
        for id in ids {
            insert(conn, *id)?;
        }
        Ok(ids.len())
    }
    block_on(db.write_or(
        SyncMode::Normal,
        |conn, _| insert_all(ids, conn),
        |_| {
            copied.store(true, Ordering::SeqCst);
            let ids = ids.to_vec();
            move |conn: &Connection, _| insert_all(&ids, conn)
        },
    ))
}

/// A write that borrows what it writes is copied only when it must go to the thread:
/// on the caller's thread, with the connection free, `owned` is never called; behind
/// a held thread it is, and the owned work commits there with the same answer.
#[test]
fn a_borrowing_write_is_copied_only_when_it_goes_to_the_thread() {
    let (_dir, db) = db();
    let copied = AtomicBool::new(false);
    assert_eq!(insert_borrowed(&db, &[1, 2], &copied).unwrap(), 2);
    assert!(
        !copied.load(Ordering::SeqCst),
        "a write run in place was copied"
    );

    let release = hold(&db);
    let told = std::thread::scope(|scope| {
        let writer = scope.spawn(|| insert_borrowed(&db, &[3, 4, 5], &copied));
        // The copy is made before the write is queued: once it is, the thread may go.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !copied.load(Ordering::SeqCst) {
            assert!(
                std::time::Instant::now() < deadline,
                "a write behind a held thread was not copied for it"
            );
            std::thread::yield_now();
        }
        drop(release);
        writer.join().unwrap()
    });
    assert_eq!(told.unwrap(), 3);
    assert_eq!(rows(&db), vec![1, 2, 3, 4, 5]);
}

/// What works keep beside the database through `on_rollback` follows their fate: the
/// rows of the writes that failed in a batch are undone, the rest stay, and a write run
/// alone on the caller's thread that fails is undone too.
#[test]
fn what_a_failed_write_kept_beside_the_database_is_undone() {
    let (_dir, db) = db();
    let kept = Arc::new(std::sync::Mutex::new(Vec::<i64>::new()));
    let keep = |kept: &Arc<std::sync::Mutex<Vec<i64>>>, id: i64| {
        kept.lock().unwrap().push(id);
        let kept = Arc::clone(kept);
        on_rollback(move || kept.lock().unwrap().retain(|k| *k != id));
    };
    let release = hold(&db);
    let answers: Vec<_> = (0..20_i64)
        .map(|id| {
            let kept = Arc::clone(&kept);
            db.queue_write(SyncMode::Normal, move |conn, _| {
                insert(conn, id)?;
                keep(&kept, id);
                if id % 3 == 0 {
                    return Err(rusqlite::Error::QueryReturnedNoRows);
                }
                Ok(())
            })
            .unwrap()
        })
        .collect();
    drop(release);
    for answer in answers {
        let _ = block_on(answer).unwrap();
    }
    let on_disk = rows(&db);
    assert_eq!(
        on_disk,
        (0..20).filter(|id| id % 3 != 0).collect::<Vec<_>>()
    );
    let mut in_memory = kept.lock().unwrap().clone();
    in_memory.sort_unstable();
    assert_eq!(in_memory, on_disk);

    let alone = {
        let kept = Arc::clone(&kept);
        block_on(db.write(SyncMode::Normal, move |conn, _| {
            insert(conn, 100)?;
            keep(&kept, 100);
            Err::<(), _>(rusqlite::Error::QueryReturnedNoRows)
        }))
    };
    assert!(matches!(alone, Err(DbError::Work(_))));
    assert!(!kept.lock().unwrap().contains(&100));
    let committed = {
        let kept = Arc::clone(&kept);
        block_on(db.write(SyncMode::Normal, move |conn, _| {
            insert(conn, 101)?;
            keep(&kept, 101);
            Ok::<(), rusqlite::Error>(())
        }))
    };
    assert!(committed.is_ok());
    assert!(kept.lock().unwrap().contains(&101));
}
