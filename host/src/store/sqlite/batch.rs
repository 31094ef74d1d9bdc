//! Group commit: concurrent writers of one handle share a transaction, so that one
//! commit (and, with `--sync full`, one fsync) makes many of them durable.
//!
//! The first writer to find no transaction open becomes the batch's leader: it runs
//! `BEGIN IMMEDIATE` and its own work, then, while other writers are queued on the
//! connection, lets them run theirs in the same transaction before it commits for all.
//! Each joining writer's work runs inside its own savepoint, so one writer's refusal (a
//! lost claim) rolls back only that writer's statements; the leader's runs first, alone,
//! and a failure there rolls back the whole (single-member) transaction. A writer returns only after the
//! commit that made its work durable, with that commit's error if it failed. With a
//! single writer nothing waits: the leader commits at once.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rusqlite::Connection;

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
    /// Recent batches whose commit failed, with the error text.
    failures: VecDeque<(u64, String)>,
}

/// Why a write did not happen.
pub(super) enum WriteError<E> {
    /// The work itself failed; its savepoint was rolled back.
    Work(E),
    /// Opening or committing the shared transaction failed.
    Sql(rusqlite::Error),
    /// The batch's commit failed (reported by its leader).
    Commit(String),
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
    pub(super) fn write<T, E>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, E>,
    ) -> Result<T, WriteError<E>> {
        self.queued.fetch_add(1, Ordering::SeqCst);
        let mut inner = self.lock();
        self.queued.fetch_sub(1, Ordering::SeqCst);
        // A full batch is committed by its leader; wait for the next one.
        while inner.open.is_some() && inner.members >= MAX_BATCH {
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
            return Err(WriteError::Commit("no transaction open".into()));
        };
        inner.members += 1;
        let result = if leader {
            // The leader runs first, alone in the transaction: no savepoint needed; if
            // its work fails, the whole transaction goes and nobody else is in it.
            match f(&inner.conn) {
                Ok(value) => Ok(value),
                Err(e) => {
                    let rollback = exec(&inner.conn, "ROLLBACK");
                    inner.open = None;
                    inner.settled = batch;
                    drop(inner);
                    self.committed.notify_all();
                    return Err(match rollback {
                        Ok(()) => WriteError::Work(e),
                        Err(sql) => WriteError::Sql(sql),
                    });
                }
            }
        } else {
            savepoint(&inner.conn, f)
        };

        if !leader {
            while inner.settled < batch {
                inner = self
                    .committed
                    .wait(inner)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            if let Some((_, e)) = inner.failures.iter().find(|(b, _)| *b == batch) {
                return Err(WriteError::Commit(e.clone()));
            }
            return result;
        }

        // Let the writers already queued join before committing.
        let deadline = Instant::now() + MAX_GATHER;
        while self.queued.load(Ordering::SeqCst) > 0
            && inner.members < MAX_BATCH
            && Instant::now() < deadline
        {
            drop(inner);
            std::thread::yield_now();
            inner = self.lock();
        }
        let commit = exec(&inner.conn, "COMMIT");
        if let Err(e) = &commit {
            // Leave no transaction half-open on the connection.
            let _ = exec(&inner.conn, "ROLLBACK");
            inner.failures.push_back((batch, e.to_string()));
            if inner.failures.len() > REMEMBERED_FAILURES {
                inner.failures.pop_front();
            }
        }
        inner.open = None;
        inner.settled = batch;
        drop(inner);
        self.committed.notify_all();
        match commit {
            Ok(()) => result,
            Err(e) => Err(WriteError::Sql(e)),
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
