//! Group commit: concurrent writers of one handle share a transaction, so that one
//! commit (and, with `--sync full`, one fsync) makes many of them durable.
//!
//! The first writer to find no transaction open becomes the batch's leader: it runs
//! `BEGIN IMMEDIATE` and its own work, then, while other writers are queued on the
//! connection, lets them run theirs in the same transaction before it commits for all.
//! Each writer's work runs inside its own savepoint, so one writer's refusal (a lost
//! claim) rolls back only that writer's statements. A writer returns only after the
//! commit that made its work durable, with that commit's error if it failed. With a
//! single writer nothing waits: the leader commits at once.
//!
//! SQLite may roll a whole transaction back by itself when a statement fails on a full
//! disk or an I/O error. The batch is then aborted: no later writer joins it (outside a
//! transaction its work would commit on its own, outside the batch), and every member
//! learns the cause that aborted it rather than a misleading "no transaction is active".

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rusqlite::{Connection, ErrorCode};

/// Writers one transaction takes at most: bounds how long the first of them waits.
const MAX_BATCH: usize = 256;
/// How long a leader keeps its transaction open for writers still queued.
const MAX_GATHER: Duration = Duration::from_millis(2);
/// Failed commits remembered for followers that wake up late.
const REMEMBERED_FAILURES: usize = 64;

/// The connection and the state of the batch open on it.
pub(super) struct Batcher {
    inner: Mutex<Inner>,
    committed: Condvar,
    /// Writers waiting for the connection: the leader gathers while this is non-zero.
    queued: AtomicUsize,
}

struct Inner {
    conn: Connection,
    /// The batch whose transaction is open, if any.
    open: Option<u64>,
    members: usize,
    next_batch: u64,
    /// Every batch up to this one has committed or failed.
    settled: u64,
    /// Why the open batch's transaction is gone, if SQLite rolled it back.
    aborted: Option<Failure>,
    /// Recent batches whose commit failed, with why.
    failures: VecDeque<(u64, Failure)>,
}

/// Why a batch did not commit, kept for every member to report.
#[derive(Debug, Clone)]
pub(super) struct Failure {
    /// SQLite's primary error code, if SQLite gave one.
    pub(super) code: Option<ErrorCode>,
    /// SQLite's words.
    pub(super) message: String,
}

impl From<&rusqlite::Error> for Failure {
    fn from(e: &rusqlite::Error) -> Self {
        Failure {
            code: e.sqlite_error_code(),
            message: e.to_string(),
        }
    }
}

/// What a writer's failed work says about SQLite's part in the failure.
pub(super) trait WorkFailure {
    /// The SQLite failure behind it, if any (a refusal of the store's own, such as a
    /// lost claim, has none).
    fn sqlite_failure(&self) -> Option<Failure>;
}

/// Why a write did not happen.
pub(super) enum WriteError<E> {
    /// The work itself failed; its savepoint (or SQLite, the whole batch) was rolled
    /// back.
    Work(E),
    /// Opening the shared transaction or a savepoint failed.
    Sql(rusqlite::Error),
    /// The batch did not commit: its commit failed, or SQLite rolled it back while
    /// another member's work ran.
    Commit(Failure),
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher").finish_non_exhaustive()
    }
}

impl Batcher {
    pub(super) fn new(conn: Connection) -> Batcher {
        Batcher {
            inner: Mutex::new(Inner {
                conn,
                open: None,
                members: 0,
                next_batch: 1,
                settled: 0,
                aborted: None,
                failures: VecDeque::new(),
            }),
            committed: Condvar::new(),
            queued: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A poisoned lock means a panic while it was held; SQLite's state is still
        // consistent (an open transaction is committed or rolled back by its leader).
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` outside any transaction, once no batch is open: reads never see
    /// writes that are not committed yet.
    pub(super) fn read<T>(&self, f: impl FnOnce(&Connection) -> T) -> T {
        let mut inner = self.lock();
        while inner.open.is_some() {
            inner = self
                .committed
                .wait(inner)
                .unwrap_or_else(PoisonError::into_inner);
        }
        f(&inner.conn)
    }

    /// Runs `f` in a write transaction shared with concurrent writers, and returns once
    /// that transaction committed.
    pub(super) fn write<T, E: WorkFailure>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, E>,
    ) -> Result<T, WriteError<E>> {
        self.queued.fetch_add(1, Ordering::SeqCst);
        let mut inner = self.lock();
        self.queued.fetch_sub(1, Ordering::SeqCst);
        // A full or aborted batch is settled by its leader; wait for the next one.
        while inner.open.is_some() && (inner.members >= MAX_BATCH || inner.aborted.is_some()) {
            inner = self
                .committed
                .wait(inner)
                .unwrap_or_else(PoisonError::into_inner);
        }
        let leader = inner.open.is_none();
        if leader {
            if let Err(e) = exec(&inner.conn, "BEGIN IMMEDIATE") {
                return Err(WriteError::Sql(e));
            }
            let batch = inner.next_batch;
            inner.next_batch += 1;
            inner.open = Some(batch);
            inner.members = 0;
        }
        let Some(batch) = inner.open else {
            unreachable_batch();
            return Err(WriteError::Commit(Failure {
                code: None,
                message: "no transaction open".into(),
            }));
        };
        inner.members += 1;
        let result = savepoint(&inner.conn, f);
        if inner.aborted.is_none() && inner.conn.is_autocommit() {
            // SQLite rolled the batch's transaction back: everything the batch did so
            // far is gone, so it can only fail, for the cause this work met.
            let cause = match &result {
                Err(WriteError::Work(e)) => e.sqlite_failure(),
                Err(WriteError::Sql(e)) => Some(Failure::from(e)),
                Err(WriteError::Commit(f)) => Some(f.clone()),
                Ok(_) => None,
            };
            inner.aborted = Some(cause.unwrap_or_else(|| Failure {
                code: None,
                message: "SQLite rolled the transaction back".into(),
            }));
        }

        if !leader {
            while inner.settled < batch {
                inner = self
                    .committed
                    .wait(inner)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            let failed = inner.failures.iter().find(|(b, _)| *b == batch);
            return match (result, failed) {
                // The work's own failure says most about what happened to it.
                (Err(e), _) => Err(e),
                (Ok(_), Some((_, failure))) => Err(WriteError::Commit(failure.clone())),
                (Ok(value), None) => Ok(value),
            };
        }

        // Let the writers already queued join before committing.
        let deadline = Instant::now() + MAX_GATHER;
        while self.queued.load(Ordering::SeqCst) > 0
            && inner.members < MAX_BATCH
            && inner.aborted.is_none()
            && Instant::now() < deadline
        {
            drop(inner);
            std::thread::yield_now();
            inner = self.lock();
        }
        let commit = match inner.aborted.take() {
            Some(cause) => Err(cause),
            None => exec(&inner.conn, "COMMIT").map_err(|e| Failure::from(&e)),
        };
        if let Err(failure) = &commit {
            // Leave no transaction half-open on the connection.
            if !inner.conn.is_autocommit() {
                let _ = exec(&inner.conn, "ROLLBACK");
            }
            inner.failures.push_back((batch, failure.clone()));
            if inner.failures.len() > REMEMBERED_FAILURES {
                inner.failures.pop_front();
            }
        }
        inner.open = None;
        inner.settled = batch;
        drop(inner);
        self.committed.notify_all();
        match (result, commit) {
            (Err(e), _) => Err(e),
            (Ok(_), Err(failure)) => Err(WriteError::Commit(failure)),
            (Ok(value), Ok(())) => Ok(value),
        }
    }
}

/// Runs `f` inside a savepoint: released if it succeeds, rolled back if it fails.
fn savepoint<T, E>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> Result<T, E>,
) -> Result<T, WriteError<E>> {
    exec(conn, "SAVEPOINT write").map_err(WriteError::Sql)?;
    match f(conn) {
        Ok(value) => {
            exec(conn, "RELEASE write").map_err(WriteError::Sql)?;
            Ok(value)
        }
        // SQLite already rolled back the whole transaction, savepoint and all.
        Err(e) if conn.is_autocommit() => Err(WriteError::Work(e)),
        Err(e) => {
            exec(conn, "ROLLBACK TO write").map_err(WriteError::Sql)?;
            exec(conn, "RELEASE write").map_err(WriteError::Sql)?;
            Err(WriteError::Work(e))
        }
    }
}

fn exec(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([])?;
    Ok(())
}

#[cold]
fn unreachable_batch() {
    tracing::error!("group commit: a writer found no open transaction after opening one");
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;

    impl WorkFailure for rusqlite::Error {
        fn sqlite_failure(&self) -> Option<Failure> {
            Some(Failure::from(self))
        }
    }

    /// The first follower's work loses the transaction, as SQLite's own rollback on a
    /// full disk would; followers still queued must not run their work outside it (it
    /// would commit on its own while they are told it failed). Whatever each writer is
    /// told, its row must agree.
    #[test]
    fn writers_after_a_rolled_back_batch_are_told_the_truth() {
        for round in 0..10 {
            let dir = tempfile::tempdir().unwrap();
            let conn = Connection::open(dir.path().join("b.db")).unwrap();
            conn.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (id INTEGER);")
                .unwrap();
            let batcher = Batcher::new(conn);
            let aborted = AtomicBool::new(false);
            let insert = |conn: &Connection, id: i64| {
                conn.execute("INSERT INTO t VALUES (?1)", [id]).map(drop)
            };
            let results: Vec<(i64, bool)> = std::thread::scope(|s| {
                let leader = s.spawn(|| {
                    let ok = batcher
                        .write(|conn| {
                            // Long enough for the followers to queue behind it.
                            std::thread::sleep(Duration::from_millis(30));
                            insert(conn, 0)
                        })
                        .is_ok();
                    (0, ok)
                });
                std::thread::sleep(Duration::from_millis(5));
                let followers: Vec<_> = (1..=6)
                    .map(|id| {
                        let (batcher, aborted) = (&batcher, &aborted);
                        s.spawn(move || {
                            let ok = batcher
                                .write(|conn| {
                                    insert(conn, id)?;
                                    if !aborted.swap(true, Ordering::SeqCst) {
                                        conn.execute_batch("ROLLBACK")?;
                                        return Err(rusqlite::Error::SqliteFailure(
                                            rusqlite::ffi::Error::new(13),
                                            Some("database or disk is full".into()),
                                        ));
                                    }
                                    Ok(())
                                })
                                .is_ok();
                            (id, ok)
                        })
                    })
                    .collect();
                std::iter::once(leader)
                    .chain(followers)
                    .map(|h| h.join().unwrap())
                    .collect()
            });
            let on_disk: Vec<i64> = batcher.read(|conn| {
                conn.prepare("SELECT id FROM t ORDER BY id")
                    .unwrap()
                    .query_map([], |r| r.get(0))
                    .unwrap()
                    .collect::<rusqlite::Result<_>>()
                    .unwrap()
            });
            for (id, ok) in results {
                assert_eq!(
                    ok,
                    on_disk.contains(&id),
                    "round {round}: writer {id} told ok={ok}, rows {on_disk:?}"
                );
            }
        }
    }
}
