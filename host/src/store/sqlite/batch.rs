//! Group commit: concurrent writers of one handle share a transaction, so that one
//! commit (and, with `--sync full`, one fsync) makes many of them durable.
//!
//! Writers hand their work to whichever thread leads (flat combining). A writer that
//! finds nobody leading becomes the leader: it opens a transaction, runs its own work,
//! then the work every other writer queued meanwhile, commits once for all, and wakes
//! each writer with its own result. A queued writer sleeps once, until its work is
//! settled; only the leader touches the connection, so the writers of a batch cost one
//! wake-up each rather than two hand-offs of a contended lock. Work that queues while a
//! batch commits (an fsync, with `--sync full`) makes the next batch, which the leader
//! hands to the writer at the head of the queue before it wakes its own batch's
//! members: the next transaction runs while the wake-ups happen, and no run serves the
//! others for long.
//!
//! Each queued work runs inside its own savepoint, so one writer's refusal (a lost claim)
//! rolls back only that writer's statements. The first work of a transaction runs
//! before anything else is in it, so it needs no savepoint: when it fails, the whole
//! transaction is rolled back. A writer returns only after the commit that made its
//! work durable, with that commit's error if it failed.
//!
//! SQLite may roll a whole transaction back by itself when a statement fails on a full
//! disk or an I/O error. Every work already run in it then fails, with that cause; work
//! not run yet goes to the next transaction.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use rusqlite::{Connection, ErrorCode};

/// Works one transaction takes at most: bounds how long the first of them waits.
const MAX_BATCH: usize = 256;

/// The connection and the writers waiting for it.
pub(super) struct Batcher {
    /// Held by the leader for as long as it leads, and by readers.
    conn: Mutex<Connection>,
    state: Mutex<State>,
}

struct State {
    /// Somebody leads: new work queues instead of leading.
    leading: bool,
    queue: VecDeque<Box<dyn Job>>,
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

impl Failure {
    fn because(message: &str) -> Failure {
        Failure {
            code: None,
            message: message.to_owned(),
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
    /// Opening a savepoint around the work failed.
    Sql(rusqlite::Error),
    /// The batch did not commit: opening or committing its transaction failed, or
    /// SQLite rolled it back while another member's work ran.
    Commit(Failure),
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher").finish_non_exhaustive()
    }
}

/// A writer's work, as the leader runs it.
trait Job: Send {
    /// Runs the work: inside its own savepoint unless it is the first of its
    /// transaction. Keeps the result for [`Job::settle`].
    fn run(&mut self, conn: &Connection, first: bool) -> Ran;
    /// Tells the writer how its work ended, given how its transaction ended, and wakes
    /// it.
    fn settle(&mut self, commit: Result<(), &Failure>);
    /// Wakes the writer to lead, with its work not run yet.
    fn hand_lead(self: Box<Self>);
}

/// How a work went.
enum Ran {
    Ok,
    /// It failed (and was rolled back), for SQLite's reason if it had one.
    Failed(Option<Failure>),
}

impl Batcher {
    pub(super) fn new(conn: Connection) -> Batcher {
        Batcher {
            conn: Mutex::new(conn),
            state: Mutex::new(State {
                leading: false,
                queue: VecDeque::new(),
            }),
        }
    }

    // A poisoned lock means a panic while it was held. The connection is still
    // consistent (SQLite rolls back what a dropped statement left), and the queue only
    // holds work that has not run: both can go on being used.

    fn lock_conn(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` outside any transaction, between batches: reads never see writes that
    /// are not committed yet.
    pub(super) fn read<T>(&self, f: impl FnOnce(&Connection) -> T) -> T {
        f(&self.lock_conn())
    }

    /// Runs `f` in a write transaction shared with concurrent writers, and returns once
    /// that transaction committed.
    pub(super) fn write<T, E, F>(&self, f: F) -> Result<T, WriteError<E>>
    where
        F: FnOnce(&Connection) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: WorkFailure + Send + 'static,
    {
        let slot = Arc::new(Slot::new());
        let mut work = Work {
            f: Some(f),
            result: None,
            slot: Arc::clone(&slot),
        };
        let mut state = self.lock_state();
        if state.leading {
            state.queue.push_back(Box::new(work));
            drop(state);
            if let Some(mut work) = slot.wait() {
                self.lead(&mut *work);
            }
        } else {
            state.leading = true;
            drop(state);
            self.lead(&mut work);
        }
        slot.take()
    }

    /// Runs batches, `own` work first, while work is queued. After each commit, if
    /// work is waiting, it hands the connection to the writer at the head of the queue
    /// before it wakes the members of its batch: the next batch runs on one core while
    /// the wake-ups happen on the other, and no run serves the others for long.
    fn lead(&self, own: &mut dyn Job) {
        let mut succession = Succession {
            batcher: self,
            settled: false,
        };
        let mut own = Some(own);
        loop {
            let conn = self.lock_conn();
            let done = self.batch(&conn, own.take());
            drop(conn);
            let heir = self.lock_state().queue.pop_front();
            if let Some(heir) = heir {
                succession.settled = true;
                heir.hand_lead();
                done.settle();
                return;
            }
            done.settle();
            let mut state = self.lock_state();
            if state.queue.is_empty() {
                state.leading = false;
                succession.settled = true;
                return;
            }
        }
    }

    /// One transaction: `own` work (if any) first, then queued work until the queue is
    /// empty or the batch is full; one commit. `own` is settled here; the queued members
    /// are returned, to be settled once the connection is free for the next batch.
    fn batch(&self, conn: &Connection, mut own: Option<&mut dyn Job>) -> Done {
        // A leader that unwound may have left its transaction open.
        rollback(conn);
        if let Err(e) = exec(conn, "BEGIN IMMEDIATE") {
            // The store is locked past its busy timeout, read-only, or worse: every
            // writer waiting now would meet the same, each after its own timeout.
            let failure = Failure::from(&e);
            if let Some(job) = own {
                job.settle(Err(&failure));
            }
            let waiting: Vec<_> = self.lock_state().queue.drain(..).collect();
            return Done {
                members: waiting,
                outcome: Err(failure),
            };
        }
        let mut members: Vec<Box<dyn Job>> = Vec::new();
        let mut own_ran = false;
        let mut aborted = None;
        if let Some(job) = own.as_deref_mut() {
            if let Ran::Failed(_) = job.run(conn, true) {
                rollback(conn);
                job.settle(Ok(()));
                return Done::nothing();
            }
            own_ran = true;
            if conn.is_autocommit() {
                aborted = Some(Failure::because("SQLite rolled the transaction back"));
            }
        }
        'gather: while aborted.is_none() {
            let room = MAX_BATCH - members.len() - usize::from(own_ran);
            let taken: Vec<_> = {
                let mut state = self.lock_state();
                let n = state.queue.len().min(room);
                state.queue.drain(..n).collect()
            };
            if taken.is_empty() {
                break;
            }
            let mut taken = taken.into_iter();
            while let Some(mut job) = taken.next() {
                let first = !own_ran && members.is_empty();
                let ran = job.run(conn, first);
                if first && let Ran::Failed(_) = ran {
                    // Nothing else was in the transaction: it goes, and the rest of
                    // the work waits for the next one.
                    rollback(conn);
                    job.settle(Ok(()));
                    self.requeue(taken);
                    return Done::nothing();
                }
                members.push(job);
                if conn.is_autocommit() {
                    // SQLite rolled the transaction back: everything in it is gone.
                    let cause = match ran {
                        Ran::Failed(Some(cause)) => cause,
                        _ => Failure::because("SQLite rolled the transaction back"),
                    };
                    aborted = Some(cause);
                    self.requeue(taken);
                    break 'gather;
                }
            }
        }
        let commit = match aborted {
            Some(cause) => Err(cause),
            None => exec(conn, "COMMIT").map_err(|e| Failure::from(&e)),
        };
        if commit.is_err() {
            rollback(conn);
        }
        if let Some(job) = own {
            job.settle(commit.as_ref().map(|_| ()));
        }
        Done {
            members,
            outcome: commit,
        }
    }

    /// Puts work taken for a batch but not run back at the head of the queue, in order.
    fn requeue(&self, rest: impl DoubleEndedIterator<Item = Box<dyn Job>>) {
        let mut state = self.lock_state();
        for job in rest.rev() {
            state.queue.push_front(job);
        }
    }
}

/// The members of a batch that ended, and how it ended.
struct Done {
    members: Vec<Box<dyn Job>>,
    outcome: Result<(), Failure>,
}

impl Done {
    fn nothing() -> Done {
        Done {
            members: Vec::new(),
            outcome: Ok(()),
        }
    }

    fn settle(self) {
        let outcome = self.outcome.as_ref().map(|_| ());
        for mut job in self.members {
            job.settle(outcome);
        }
    }
}

/// Leaves no writer waiting for a leader that is gone: if the leader unwinds (a panic
/// in the store's code), the next writer in the queue leads, or nobody does.
struct Succession<'a> {
    batcher: &'a Batcher,
    settled: bool,
}

impl Drop for Succession<'_> {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let mut state = self.batcher.lock_state();
        match state.queue.pop_front() {
            Some(heir) => {
                drop(state);
                heir.hand_lead();
            }
            None => state.leading = false,
        }
    }
}

/// One writer's work and where its result goes.
struct Work<F, T, E> {
    f: Option<F>,
    result: Option<Result<T, WriteError<E>>>,
    slot: Arc<Slot<T, E>>,
}

impl<F, T, E> Job for Work<F, T, E>
where
    F: FnOnce(&Connection) -> Result<T, E> + Send + 'static,
    T: Send + 'static,
    E: WorkFailure + Send + 'static,
{
    fn run(&mut self, conn: &Connection, first: bool) -> Ran {
        let Some(f) = self.f.take() else {
            return Ran::Failed(None);
        };
        let result = if first {
            f(conn).map_err(WriteError::Work)
        } else {
            savepoint(conn, f)
        };
        let ran = match &result {
            Ok(_) => Ran::Ok,
            Err(WriteError::Work(e)) => Ran::Failed(e.sqlite_failure()),
            Err(WriteError::Sql(e)) => Ran::Failed(Some(Failure::from(e))),
            Err(WriteError::Commit(failure)) => Ran::Failed(Some(failure.clone())),
        };
        self.result = Some(result);
        ran
    }

    fn settle(&mut self, commit: Result<(), &Failure>) {
        let outcome = match (self.result.take(), commit) {
            // The work's own failure says most about what happened to it.
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(value)), Ok(())) => Ok(value),
            (_, Err(failure)) => Err(WriteError::Commit(failure.clone())),
            (None, Ok(())) => Err(WriteError::Commit(Failure::because(
                "the write was not run",
            ))),
        };
        self.slot.fill(outcome);
    }

    fn hand_lead(self: Box<Self>) {
        let slot = Arc::clone(&self.slot);
        slot.hand(self);
    }
}

impl<F, T, E> Drop for Work<F, T, E> {
    fn drop(&mut self) {
        // Dropped unsettled: its leader unwound. The writer must not wait forever.
        self.slot.fill_if_waiting(|| {
            Err(WriteError::Commit(Failure::because(
                "the write was abandoned by a failing group-commit leader",
            )))
        });
    }
}

/// Where a queued writer waits for its result, or for its turn to lead.
struct Slot<T, E> {
    turn: Mutex<Turn<T, E>>,
    changed: Condvar,
    /// The writer sleeps on `changed`. A leader filling its own slot has nobody to
    /// wake, and a notify costs a system call.
    asleep: AtomicBool,
}

enum Turn<T, E> {
    Waiting,
    Lead(Box<dyn Job>),
    Done(Result<T, WriteError<E>>),
    Taken,
}

impl<T, E> Slot<T, E> {
    fn new() -> Slot<T, E> {
        Slot {
            turn: Mutex::new(Turn::Waiting),
            changed: Condvar::new(),
            asleep: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Turn<T, E>> {
        self.turn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn fill(&self, outcome: Result<T, WriteError<E>>) {
        *self.lock() = Turn::Done(outcome);
        self.wake();
    }

    fn wake(&self) {
        if self.asleep.load(Ordering::Acquire) {
            self.changed.notify_one();
        }
    }

    fn fill_if_waiting(&self, outcome: impl FnOnce() -> Result<T, WriteError<E>>) {
        let mut turn = self.lock();
        if matches!(*turn, Turn::Waiting) {
            *turn = Turn::Done(outcome());
            drop(turn);
            self.wake();
        }
    }

    fn hand(&self, job: Box<dyn Job>) {
        *self.lock() = Turn::Lead(job);
        self.wake();
    }

    /// Waits until the work is settled (`None`) or the writer is to lead it (`Some`).
    fn wait(&self) -> Option<Box<dyn Job>> {
        let mut turn = self.lock();
        loop {
            match std::mem::replace(&mut *turn, Turn::Waiting) {
                Turn::Waiting => {
                    // Set under the lock that `fill` and `hand` take before they look
                    // at it: a wake-up cannot slip between this and the wait.
                    self.asleep.store(true, Ordering::Release);
                    turn = self
                        .changed
                        .wait(turn)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                Turn::Lead(job) => return Some(job),
                settled => {
                    *turn = settled;
                    return None;
                }
            }
        }
    }

    fn take(&self) -> Result<T, WriteError<E>> {
        match std::mem::replace(&mut *self.lock(), Turn::Taken) {
            Turn::Done(outcome) => outcome,
            _ => Err(WriteError::Commit(Failure::because(
                "the write ended without a result",
            ))),
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

/// Leaves no transaction half-open on the connection.
fn rollback(conn: &Connection) {
    if !conn.is_autocommit() {
        let _ = exec(conn, "ROLLBACK");
    }
}

fn exec(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    impl WorkFailure for rusqlite::Error {
        fn sqlite_failure(&self) -> Option<Failure> {
            Some(Failure::from(self))
        }
    }

    fn batcher() -> (tempfile::TempDir, Batcher) {
        let dir = tempfile::tempdir().unwrap();
        let conn = Connection::open(dir.path().join("b.db")).unwrap();
        conn.execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE t (id INTEGER);")
            .unwrap();
        (dir, Batcher::new(conn))
    }

    fn rows(batcher: &Batcher) -> Vec<i64> {
        batcher.read(|conn| {
            conn.prepare("SELECT id FROM t ORDER BY id")
                .unwrap()
                .query_map([], |r| r.get(0))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap()
        })
    }

    fn insert(conn: &Connection, id: i64) -> rusqlite::Result<()> {
        conn.execute("INSERT INTO t VALUES (?1)", [id]).map(drop)
    }

    /// The first follower's work loses the transaction, as SQLite's own rollback on a
    /// full disk would; followers still queued must not run their work outside it (it
    /// would commit on its own while they are told it failed). Whatever each writer is
    /// told, its row must agree.
    #[test]
    fn writers_after_a_rolled_back_batch_are_told_the_truth() {
        for round in 0..10 {
            let (_dir, batcher) = batcher();
            let aborted = Arc::new(AtomicBool::new(false));
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
                        let (batcher, aborted) = (&batcher, Arc::clone(&aborted));
                        s.spawn(move || {
                            let ok = batcher
                                .write(move |conn| {
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
            let on_disk = rows(&batcher);
            for (id, ok) in results {
                assert_eq!(
                    ok,
                    on_disk.contains(&id),
                    "round {round}: writer {id} told ok={ok}, rows {on_disk:?}"
                );
            }
        }
    }

    /// Writers that queue behind a slow one share transactions (fewer commits than
    /// writers), each gets its own result, a refused work takes nothing else with it,
    /// and the queue is drained even though leaders hand it on.
    #[test]
    fn queued_writers_share_commits_and_keep_their_own_results() {
        let (dir, batcher) = batcher();
        // Every commit appends at least one frame (the table's page) to the WAL, which
        // is never checkpointed here: fewer new frames than writers means shared commits.
        batcher.read(|conn| conn.execute_batch("PRAGMA wal_autocheckpoint = 0").unwrap());
        let wal = dir.path().join("b.db-wal");
        let wal_frames = || -> i64 {
            let size = std::fs::metadata(&wal).map_or(0, |m| m.len());
            // A 32-byte header, then frames of a 24-byte header and a 4 KiB page.
            (size.saturating_sub(32) / (24 + 4096)) as i64
        };
        let frames_before = wal_frames();
        let writers = 48_i64;
        let results: Vec<(i64, Result<i64, String>)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..writers)
                .map(|id| {
                    let batcher = &batcher;
                    s.spawn(move || {
                        let result = batcher.write(move |conn| {
                            std::thread::sleep(Duration::from_micros(200));
                            if id % 7 == 3 {
                                insert(conn, -id)?;
                                return Err(rusqlite::Error::QueryReturnedNoRows);
                            }
                            insert(conn, id)?;
                            Ok(id * 10)
                        });
                        let told = result.map_err(|e| match e {
                            WriteError::Work(e) => e.to_string(),
                            WriteError::Sql(e) => format!("sql: {e}"),
                            WriteError::Commit(f) => format!("commit: {}", f.message),
                        });
                        (id, told)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let on_disk = rows(&batcher);
        for (id, told) in &results {
            if id % 7 == 3 {
                assert!(told.is_err(), "writer {id}: {told:?}");
                assert!(!on_disk.contains(&-id), "writer {id}'s refused row stayed");
            } else {
                assert_eq!(told, &Ok(id * 10), "writer {id}");
                assert!(on_disk.contains(id), "writer {id}'s row is missing");
            }
        }
        let frames = wal_frames() - frames_before;
        assert!(
            frames < writers,
            "{frames} WAL frames for {writers} writers: nobody shared a transaction"
        );
    }

    /// Many writers, each writing again as soon as it returns, with readers among them:
    /// leadership passes from batch to batch, and every write still ends with the truth
    /// about its row. A lost wake-up or a leader that never hands on would hang here.
    #[test]
    fn writers_that_keep_writing_pass_the_lead_and_lose_nothing() {
        let (_dir, batcher) = batcher();
        let (threads, writes) = (16_i64, 60_i64);
        let told: Vec<(i64, bool)> = std::thread::scope(|s| {
            // Rows only ever come (committed whole batches at a time): a reader between
            // batches never sees the count go down.
            let reader = s.spawn(|| {
                let mut last = 0;
                for _ in 0..200 {
                    let n: i64 = batcher
                        .read(|conn| conn.query_row("SELECT count(*) FROM t", [], |r| r.get(0)))
                        .unwrap();
                    assert!(n >= last, "{n} rows after {last}");
                    last = n;
                }
            });
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let batcher = &batcher;
                    s.spawn(move || {
                        (0..writes)
                            .map(|i| {
                                let id = t * writes + i;
                                let ok = batcher
                                    .write(move |conn| {
                                        insert(conn, id)?;
                                        if id % 5 == 0 {
                                            return Err(rusqlite::Error::QueryReturnedNoRows);
                                        }
                                        Ok(())
                                    })
                                    .is_ok();
                                (id, ok)
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            reader.join().unwrap();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect()
        });
        let on_disk = rows(&batcher);
        for &(id, ok) in &told {
            assert_eq!(ok, id % 5 != 0, "writer of {id}");
            assert_eq!(ok, on_disk.contains(&id), "row {id}");
        }
        assert_eq!(on_disk.len(), told.iter().filter(|(_, ok)| *ok).count());
    }
}
