//! The database thread: the one thread that touches a handle's SQLite connection, and
//! group commit on it.
//!
//! A caller that does not run its work itself (see below) never blocks: it sends the
//! work (an owned closure and a `tokio::sync::oneshot` reply) over a channel and awaits
//! the reply. The thread runs reads at once, between transactions, so that they see only
//! committed data. Writes it gathers: every write queued at the moment (up to
//! [`MAX_BATCH`]) goes into ONE `BEGIN IMMEDIATE` transaction with one commit, so that
//! one commit (and, when the batch must survive power loss, one fsync) makes many
//! writers durable.
//!
//! The first work of a transaction runs before anything else is in it, so it needs no
//! savepoint: when it fails, the whole transaction is rolled back and the rest of the
//! batch goes to a fresh one. Each later work runs inside its own savepoint, so one
//! writer's refusal (a lost claim, a stale fence) rolls back only its own statements. A
//! writer is answered only after the commit that made its work durable, with that
//! commit's error if it failed.
//!
//! SQLite may roll a whole transaction back by itself when a statement fails on a full
//! disk or an I/O error. Every work already run in it then fails with that cause; work
//! not run yet goes to a fresh transaction. If the thread dies, every reply channel it
//! held is dropped, and its callers are told so instead of waiting forever.
//!
//! When nothing is queued and the connection is free, a read or write runs on the
//! caller's own thread instead ([`DbThread::read`], [`DbThread::write`]): the hand-over
//! to this thread and the wake-up of the caller's task back cost more than a `Normal`
//! transaction, and on a busy machine a wake-up waits for a core (the bench's durable
//! step measured one run's step at about twice the synchronous host's with every call
//! handed over). Writes that arrive meanwhile queue for this thread, which takes them
//! all into its next batch: the caller leads one transaction, the thread the group
//! behind it. The caller never waits for another process's lock: if the write lock is
//! taken, its work goes to the thread, which may wait the busy timeout. A `Full` write's
//! fsync runs in `block_in_place` on a multi-threaded runtime, so that the runtime's
//! other tasks move to another worker meanwhile.
//!
//! A work that keeps something beside the database (in memory) registers how to undo
//! it ([`on_rollback`]); whoever runs the work runs the undo if the work's savepoint or
//! its transaction does not commit, so that what it kept is exactly as committed as its
//! statements.
//!
//! Durability is chosen per batch: `PRAGMA synchronous = FULL` (set between
//! transactions, where SQLite takes it) if any of its writes asks for
//! [`SyncMode::Full`], `NORMAL` otherwise.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rusqlite::{Connection, ErrorCode};
use tokio::sync::oneshot;

use crate::store::{Clock, Millis, SyncMode};

thread_local! {
    /// What to undo, newest last, if the writes running on this thread do not commit:
    /// registered by works through [`on_rollback`] for what they keep beside the
    /// database, run by whoever runs the works once it knows their fate.
    static UNDO: RefCell<Vec<Box<dyn FnOnce()>>> = const { RefCell::new(Vec::new()) };
}

/// Registers `undo`, to run if the write running now on this thread does not commit:
/// its work fails (its savepoint rolled back) or its transaction does not commit. A work
/// that keeps state beside the database (in memory) so stays exactly as committed as
/// its statements.
pub(super) fn on_rollback(undo: impl FnOnce() + 'static) {
    UNDO.with(|u| u.borrow_mut().push(Box::new(undo)));
}

fn undo_mark() -> usize {
    UNDO.with(|u| u.borrow().len())
}

/// Undoes, newest first, what was registered since `mark`.
fn undo_since(mark: usize) {
    loop {
        // Popped one at a time, the list not borrowed while an undo runs.
        let undo = UNDO.with(|u| {
            let mut u = u.borrow_mut();
            if u.len() > mark { u.pop() } else { None }
        });
        match undo {
            Some(undo) => undo(),
            None => return,
        }
    }
}

/// Forgets what was registered since `mark`: it committed.
fn forget_undo_since(mark: usize) {
    UNDO.with(|u| u.borrow_mut().truncate(mark));
}

/// Works one transaction takes at most: bounds how long the first of them waits.
pub(super) const MAX_BATCH: usize = 256;

/// The handle's side of the database thread. Dropping it lets the thread finish the
/// work already sent, close the connection and end; the drop waits for that, so that
/// the file is closed once the store is gone.
pub(super) struct DbThread {
    sender: Option<mpsc::Sender<Message>>,
    thread: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
}

/// What the thread and the callers that run their work themselves share.
struct Shared {
    /// The connection; held by the thread for a whole round of batches, by a caller for
    /// its one transaction.
    worker: Mutex<Worker>,
    /// Messages sent to the thread and not yet finished: while any are, callers queue
    /// behind them rather than overtake them, and their writes join the next batch.
    queued: AtomicUsize,
    /// Nanoseconds the connection has been held, by the thread or by callers.
    busy: AtomicU64,
}

impl Shared {
    fn lock(&self) -> Held<'_> {
        // Works run under `catch_unwind`; a panic elsewhere leaves the connection
        // outside any transaction (every path rolls back first), so it stays usable.
        Held::new(
            self.worker.lock().unwrap_or_else(PoisonError::into_inner),
            &self.busy,
        )
    }

    /// The connection, if nothing is queued for the thread and nobody holds it.
    fn try_lock(&self) -> Option<Held<'_>> {
        if self.queued.load(Ordering::Acquire) != 0 {
            return None;
        }
        let guard = self.worker.try_lock().ok()?;
        Some(Held::new(guard, &self.busy))
    }
}

/// The connection held, and since when: letting it go adds the time to
/// [`Shared::busy`].
struct Held<'a> {
    guard: MutexGuard<'a, Worker>,
    since: Instant,
    busy: &'a AtomicU64,
}

impl<'a> Held<'a> {
    fn new(guard: MutexGuard<'a, Worker>, busy: &'a AtomicU64) -> Held<'a> {
        Held {
            guard,
            since: Instant::now(),
            busy,
        }
    }
}

impl std::ops::Deref for Held<'_> {
    type Target = Worker;

    fn deref(&self) -> &Worker {
        &self.guard
    }
}

impl std::ops::DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut Worker {
        &mut self.guard
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let held = u64::try_from(self.since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.busy.fetch_add(held, Ordering::Relaxed);
    }
}

impl std::fmt::Debug for DbThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DbThread").finish_non_exhaustive()
    }
}

/// Where a caller's answer arrives; dropped unanswered if the thread dies.
type Answer<T, E> = oneshot::Receiver<Result<T, DbError<E>>>;

enum Message {
    Read(Box<dyn ReadJob>),
    Write(Box<dyn Job>),
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

/// What a failed work says about SQLite's part in the failure.
pub(super) trait WorkFailure {
    /// The SQLite failure behind it, if any (a refusal of the store's own, such as a
    /// lost claim, has none).
    fn sqlite_failure(&self) -> Option<Failure>;
}

/// Why a work did not happen.
#[derive(Debug)]
pub(super) enum DbError<E> {
    /// The work itself failed; its savepoint (or SQLite, the whole batch) was rolled
    /// back.
    Work(E),
    /// Opening or closing a savepoint around the work failed.
    Sql(rusqlite::Error),
    /// The batch did not commit: opening or committing its transaction failed, or
    /// SQLite rolled it back while another member's work ran.
    Commit(Failure),
    /// The work panicked; what it wrote was rolled back.
    Panicked(String),
    /// The thread stopped before it answered.
    Gone,
}

/// A write as the thread runs it.
pub(super) trait Job: Send {
    /// How durable the write must be.
    fn sync(&self) -> SyncMode;
    /// Runs the work at `now`: inside its own savepoint unless it is the first of its
    /// transaction. Keeps the result for [`Job::settle`].
    fn run(&mut self, conn: &Connection, now: Millis, first: bool) -> Ran;
    /// Tells the writer how its work ended, given how its transaction ended.
    fn settle(self: Box<Self>, commit: Result<(), &Failure>);
}

/// A read as the thread runs it.
trait ReadJob: Send {
    fn run(self: Box<Self>, conn: &Connection, now: Millis);
}

/// How a work went.
pub(super) enum Ran {
    Ok,
    /// It failed (and was rolled back), for SQLite's reason if it had one.
    Failed(Option<Failure>),
}

impl DbThread {
    /// Starts the thread that owns `conn`, whose `synchronous` pragma is `sync` now.
    /// Once the last handle is gone and its work done, the thread runs `close` on the
    /// connection (outside any transaction) before it closes it.
    pub(super) fn spawn(
        conn: Connection,
        clock: Clock,
        sync: SyncMode,
        busy_timeout: Duration,
        close: fn(&Connection),
    ) -> std::io::Result<DbThread> {
        let (sender, receiver) = mpsc::channel();
        let shared = Arc::new(Shared {
            worker: Mutex::new(Worker {
                conn,
                clock,
                sync,
                busy_timeout,
            }),
            queued: AtomicUsize::new(0),
            busy: AtomicU64::new(0),
        });
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("idem-sqlite".to_owned())
            .spawn(move || {
                serve(&thread_shared, &receiver);
                let worker = thread_shared.lock();
                rollback(&worker.conn);
                close(&worker.conn);
            })?;
        Ok(DbThread {
            sender: Some(sender),
            thread: Some(thread),
            shared,
        })
    }

    /// How long the connection has been held since it opened, by the thread or by a
    /// caller running its own transaction.
    pub(super) fn busy(&self) -> Duration {
        Duration::from_nanos(self.shared.busy.load(Ordering::Relaxed))
    }

    /// Runs `f` outside any transaction: it reads only committed data. On the caller's
    /// thread when the connection is free, else on the database thread.
    pub(super) async fn read<T, E, F>(&self, f: F) -> Result<T, DbError<E>>
    where
        F: FnOnce(&Connection, Millis) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: Send + 'static,
    {
        if let Some(worker) = self.shared.try_lock() {
            let now = worker.clock.now();
            return guarded(|| f(&worker.conn, now));
        }
        let answer = self.queue_read(f)?;
        answer.await.unwrap_or(Err(DbError::Gone))
    }

    /// Runs `f` in a write transaction shared with the other writes queued with it,
    /// and answers once that transaction committed. A write that finds nothing queued
    /// and the connection free runs alone, on the caller's thread.
    pub(super) async fn write<T, E, F>(&self, sync: SyncMode, f: F) -> Result<T, DbError<E>>
    where
        F: FnOnce(&Connection, Millis) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: WorkFailure + Send + 'static,
    {
        self.write_or(sync, f, |f| f).await
    }

    /// [`DbThread::write`] for a work `f` that borrows what it writes: when it runs on
    /// the caller's thread (the common case) nothing is copied or boxed for it, and only
    /// when it must go to the database thread does `owned` turn it into a work that owns
    /// what it needs. Copying a step's request, result and checkpoint and boxing a job
    /// and its reply channel cost 2.5k instructions per step (callgrind, 1.6% of an
    /// `idem run` step under sync normal).
    pub(super) async fn write_or<T, E, F, G>(
        &self,
        sync: SyncMode,
        f: F,
        owned: impl FnOnce(F) -> G,
    ) -> Result<T, DbError<E>>
    where
        F: FnOnce(&Connection, Millis) -> Result<T, E>,
        G: FnOnce(&Connection, Millis) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: WorkFailure + Send + 'static,
    {
        let f = match self.shared.try_lock() {
            Some(mut worker) => {
                let ran = match sync {
                    SyncMode::Normal => worker.alone(sync, f),
                    SyncMode::Full => blocking(|| worker.alone(sync, f)),
                };
                match ran {
                    Ok(outcome) => return outcome,
                    Err(f) => f,
                }
            }
            None => f,
        };
        let (job, answer) = write_job(sync, owned(f));
        self.send(Message::Write(job))?;
        answer.await.unwrap_or(Err(DbError::Gone))
    }

    /// Sends a read; the receiver gets its answer.
    fn queue_read<T, E, F>(&self, f: F) -> Result<Answer<T, E>, DbError<E>>
    where
        F: FnOnce(&Connection, Millis) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        self.send(Message::Read(Box::new(Read { f, reply })))?;
        Ok(answer)
    }

    /// Sends a write to the thread, never running it here: the tests of batching queue
    /// theirs behind a held thread. The receiver gets its answer once its batch ended.
    #[cfg(test)]
    fn queue_write<T, E, F>(&self, sync: SyncMode, f: F) -> Result<Answer<T, E>, DbError<E>>
    where
        F: FnOnce(&Connection, Millis) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: WorkFailure + Send + 'static,
    {
        let (job, answer) = write_job(sync, f);
        self.send(Message::Write(job))?;
        Ok(answer)
    }

    fn send<E>(&self, message: Message) -> Result<(), DbError<E>> {
        let sender = self.sender.as_ref().ok_or(DbError::Gone)?;
        self.shared.queued.fetch_add(1, Ordering::AcqRel);
        sender.send(message).map_err(|_| {
            self.shared.queued.fetch_sub(1, Ordering::AcqRel);
            DbError::Gone
        })
    }

    /// Sends a job as it is, for tests of the thread itself.
    #[cfg(test)]
    fn send_job(&self, job: Box<dyn Job>) -> bool {
        self.send::<()>(Message::Write(job)).is_ok()
    }
}

impl Drop for DbThread {
    fn drop(&mut self) {
        drop(self.sender.take());
        if let Some(thread) = self.thread.take() {
            // A thread that panicked has nothing left to close; its callers were told.
            let _ = thread.join();
        }
    }
}

/// How long the thread looks for more work before it sleeps. A run's next store call
/// usually comes within microseconds of the last answer (the guest's step between them
/// is short); a thread that slept at once would need waking for it, and on a VM a wake-up
/// costs about what a whole transaction does. The bench's durable step measured the
/// difference; the price is this much CPU after each batch when work stops.
const LINGER: std::time::Duration = std::time::Duration::from_micros(50);

/// The next message: looked for without sleeping for [`LINGER`], then waited for.
fn wait(receiver: &mpsc::Receiver<Message>) -> Result<Message, mpsc::RecvError> {
    let until = std::time::Instant::now() + LINGER;
    loop {
        match receiver.try_recv() {
            Ok(message) => return Ok(message),
            Err(mpsc::TryRecvError::Disconnected) => return Err(mpsc::RecvError),
            Err(mpsc::TryRecvError::Empty) if std::time::Instant::now() < until => {
                std::hint::spin_loop();
            }
            Err(mpsc::TryRecvError::Empty) => return receiver.recv(),
        }
    }
}

/// Runs `f`, which may block for an fsync, where the async runtime allows it: in
/// `block_in_place` on a multi-threaded tokio runtime (its other tasks move to another
/// worker meanwhile); as it is elsewhere (a current-thread runtime has no other worker
/// to give them to, and `block_in_place` would panic there).
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// A write's job and where its answer arrives.
fn write_job<T, E, F>(sync: SyncMode, f: F) -> (Box<dyn Job>, Answer<T, E>)
where
    F: FnOnce(&Connection, Millis) -> Result<T, E> + Send + 'static,
    T: Send + 'static,
    E: WorkFailure + Send + 'static,
{
    let (reply, answer) = oneshot::channel();
    let job = Box::new(Work {
        f: Some(f),
        sync,
        result: None,
        reply,
    });
    (job, answer)
}

/// Serves until every handle is gone and the work sent before is done: each round
/// takes the connection, runs what arrived (and what arrives meanwhile) in batches, and
/// only then tells callers the queue is empty.
fn serve(shared: &Shared, receiver: &mpsc::Receiver<Message>) {
    let mut pending: VecDeque<Box<dyn Job>> = VecDeque::new();
    loop {
        let first = match wait(receiver) {
            Ok(message) => message,
            Err(mpsc::RecvError) => return,
        };
        let mut worker = shared.lock();
        worker.take(first, &mut pending);
        let mut taken = 1;
        loop {
            while pending.len() < MAX_BATCH {
                match receiver.try_recv() {
                    Ok(message) => {
                        taken += 1;
                        worker.take(message, &mut pending);
                    }
                    Err(_) => break,
                }
            }
            if pending.is_empty() {
                break;
            }
            worker.batch(&mut pending);
        }
        drop(worker);
        shared.queued.fetch_sub(taken, Ordering::AcqRel);
    }
}

/// The connection's state: the connection, the store's clock, the `synchronous`
/// pragma the connection is at, and how long the thread waits for another process's
/// write lock.
struct Worker {
    conn: Connection,
    clock: Clock,
    sync: SyncMode,
    busy_timeout: Duration,
}

impl Worker {
    /// Runs one write as a transaction of its own, on the caller's thread, unless
    /// another process holds the write lock: then `f` comes back, not run, for the
    /// thread (which may wait for the lock; an async caller must not).
    fn alone<T, E, F>(&mut self, sync: SyncMode, f: F) -> Result<Result<T, DbError<E>>, F>
    where
        F: FnOnce(&Connection, Millis) -> Result<T, E>,
        E: WorkFailure,
    {
        if self.set_sync(sync).is_err() {
            return Err(f);
        }
        let conn = &self.conn;
        rollback(conn);
        let _ = conn.busy_timeout(Duration::ZERO);
        let began = exec(conn, "BEGIN IMMEDIATE");
        let _ = conn.busy_timeout(self.busy_timeout);
        if began.is_err() {
            return Err(f);
        }
        let now = self.clock.now();
        let began = undo_mark();
        let result = guarded(|| f(conn, now));
        let commit = match ran(&result) {
            Ran::Failed(_) => {
                rollback(conn);
                undo_since(began);
                return Ok(result);
            }
            Ran::Ok if conn.is_autocommit() => {
                Err(Failure::because("SQLite rolled the transaction back"))
            }
            Ran::Ok => exec(conn, "COMMIT").map_err(|e| Failure::from(&e)),
        };
        if commit.is_err() {
            rollback(conn);
            undo_since(began);
        } else {
            forget_undo_since(began);
        }
        Ok(outcome(Some(result), commit.as_ref().map(|_| ())))
    }

    /// Runs a read at once (no transaction is open between batches); queues a write.
    fn take(&mut self, message: Message, pending: &mut VecDeque<Box<dyn Job>>) {
        match message {
            Message::Read(read) => read.run(&self.conn, self.clock.now()),
            Message::Write(job) => pending.push_back(job),
        }
    }

    /// Runs up to [`MAX_BATCH`] pending writes in as few transactions as it can: one,
    /// unless a first work fails or SQLite rolls a transaction back by itself.
    fn batch(&mut self, pending: &mut VecDeque<Box<dyn Job>>) {
        let take = pending.len().min(MAX_BATCH);
        let mut queue: VecDeque<Box<dyn Job>> = pending.drain(..take).collect();
        let sync = if queue.iter().any(|job| job.sync() == SyncMode::Full) {
            SyncMode::Full
        } else {
            SyncMode::Normal
        };
        if let Err(e) = self.set_sync(sync) {
            fail_all(queue, pending, &Failure::from(&e));
            return;
        }
        while !queue.is_empty() {
            let conn = &self.conn;
            // Nothing is open between transactions; this only makes sure of it.
            rollback(conn);
            if let Err(e) = exec(conn, "BEGIN IMMEDIATE") {
                // Locked past the busy timeout, read-only, or worse: every write waiting
                // now would meet the same, each after its own timeout.
                fail_all(queue, pending, &Failure::from(&e));
                return;
            }
            let mut members: Vec<Box<dyn Job>> = Vec::new();
            let mut aborted = None;
            let began = undo_mark();
            while let Some(mut job) = queue.pop_front() {
                let first = members.is_empty();
                let mark = undo_mark();
                let ran = job.run(conn, self.clock.now(), first);
                if let Ran::Failed(_) = ran {
                    undo_since(mark);
                }
                if first && let Ran::Failed(_) = ran {
                    // Nothing else was in the transaction: it goes, and the rest of the
                    // batch waits for a fresh one.
                    rollback(conn);
                    job.settle(Ok(()));
                    break;
                }
                members.push(job);
                if conn.is_autocommit() {
                    // SQLite rolled the transaction back: everything in it is gone.
                    aborted = Some(match ran {
                        Ran::Failed(Some(cause)) => cause,
                        _ => Failure::because("SQLite rolled the transaction back"),
                    });
                    break;
                }
            }
            if members.is_empty() {
                continue;
            }
            let commit = match aborted {
                Some(cause) => Err(cause),
                None => exec(conn, "COMMIT").map_err(|e| Failure::from(&e)),
            };
            if commit.is_err() {
                rollback(conn);
                undo_since(began);
            } else {
                forget_undo_since(began);
            }
            for job in members {
                job.settle(commit.as_ref().map(|_| ()));
            }
        }
    }

    fn set_sync(&mut self, sync: SyncMode) -> rusqlite::Result<()> {
        if self.sync != sync {
            super::schema::set_durability(&self.conn, sync)?;
            self.sync = sync;
        }
        Ok(())
    }
}

/// Fails a batch that could not begin, and the writes queued behind it.
fn fail_all(queue: VecDeque<Box<dyn Job>>, pending: &mut VecDeque<Box<dyn Job>>, why: &Failure) {
    for job in queue.into_iter().chain(pending.drain(..)) {
        job.settle(Err(why));
    }
}

/// One read and where its result goes.
struct Read<F, T, E> {
    f: F,
    reply: oneshot::Sender<Result<T, DbError<E>>>,
}

impl<F, T, E> ReadJob for Read<F, T, E>
where
    F: FnOnce(&Connection, Millis) -> Result<T, E> + Send,
    T: Send,
    E: Send,
{
    fn run(self: Box<Self>, conn: &Connection, now: Millis) {
        let Read { f, reply } = *self;
        let result = guarded(|| f(conn, now));
        // A caller that stopped waiting needs no answer.
        let _ = reply.send(result);
    }
}

/// One write and where its result goes.
struct Work<F, T, E> {
    f: Option<F>,
    sync: SyncMode,
    result: Option<Result<T, DbError<E>>>,
    reply: oneshot::Sender<Result<T, DbError<E>>>,
}

impl<F, T, E> Job for Work<F, T, E>
where
    F: FnOnce(&Connection, Millis) -> Result<T, E> + Send,
    T: Send,
    E: WorkFailure + Send,
{
    fn sync(&self) -> SyncMode {
        self.sync
    }

    fn run(&mut self, conn: &Connection, now: Millis, first: bool) -> Ran {
        let Some(f) = self.f.take() else {
            return Ran::Failed(None);
        };
        let result = if first {
            guarded(|| f(conn, now))
        } else {
            savepoint(conn, || guarded(|| f(conn, now)))
        };
        let ran = ran(&result);
        self.result = Some(result);
        ran
    }

    fn settle(self: Box<Self>, commit: Result<(), &Failure>) {
        // A caller that stopped waiting needs no answer; its write stands or falls
        // with its batch all the same.
        let _ = self.reply.send(outcome(self.result, commit));
    }
}

/// How a work's result went, for its transaction.
fn ran<T, E: WorkFailure>(result: &Result<T, DbError<E>>) -> Ran {
    match result {
        Ok(_) => Ran::Ok,
        Err(DbError::Work(e)) => Ran::Failed(e.sqlite_failure()),
        Err(DbError::Sql(e)) => Ran::Failed(Some(Failure::from(e))),
        Err(DbError::Commit(failure)) => Ran::Failed(Some(failure.clone())),
        Err(DbError::Panicked(_) | DbError::Gone) => Ran::Failed(None),
    }
}

/// A writer's answer: its work's result (`None` if it never ran), given how its
/// transaction ended.
fn outcome<T, E>(
    result: Option<Result<T, DbError<E>>>,
    commit: Result<(), &Failure>,
) -> Result<T, DbError<E>> {
    match (result, commit) {
        // The work's own failure says most about what happened to it.
        (Some(Err(e)), _) => Err(e),
        (Some(Ok(value)), Ok(())) => Ok(value),
        (_, Err(failure)) => Err(DbError::Commit(failure.clone())),
        (None, Ok(())) => Err(DbError::Commit(Failure::because("the write was not run"))),
    }
}

/// Runs `f`, turning a panic into an error: one bad work must not take the thread,
/// and every other caller's answer, with it.
fn guarded<T, E>(f: impl FnOnce() -> Result<T, E>) -> Result<T, DbError<E>> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result.map_err(DbError::Work),
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_owned());
            Err(DbError::Panicked(message))
        }
    }
}

/// Runs `f` inside a savepoint: released if it succeeds, rolled back if it fails.
fn savepoint<T, E>(
    conn: &Connection,
    f: impl FnOnce() -> Result<T, DbError<E>>,
) -> Result<T, DbError<E>> {
    exec(conn, "SAVEPOINT work").map_err(DbError::Sql)?;
    let result = f();
    if conn.is_autocommit() {
        // SQLite already rolled back the whole transaction, savepoint and all.
        return result;
    }
    let result = match result {
        Ok(value) => match exec(conn, "RELEASE work") {
            Ok(()) => return Ok(value),
            // Not released, so still open: undone below with the rest of the work.
            Err(e) => Err(DbError::Sql(e)),
        },
        Err(e) => Err(e),
    };
    if let Err(e) = exec(conn, "ROLLBACK TO work").and_then(|()| exec(conn, "RELEASE work")) {
        // The work's statements could not be undone alone: undo the whole transaction
        // rather than commit them, and let every member learn why.
        rollback(conn);
        return Err(DbError::Sql(e));
    }
    result
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
#[path = "thread_tests.rs"]
mod tests;
