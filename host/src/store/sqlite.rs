//! The SQLite backend of [`Store`]: one database file in WAL mode, shared safely by the
//! tasks of one process and by several processes.
//!
//! Each handle keeps its connection on a thread of its own (`thread.rs`): callers send
//! it owned work and await the answer, so no caller ever blocks an executor thread.
//! Reads run on that thread between transactions; writes queued together share one
//! `BEGIN IMMEDIATE` transaction (group commit), each in its own savepoint. The write
//! lock is taken up front, so writers of several processes queue on the busy timeout
//! instead of failing halfway through a read-then-write, and two handles never lease
//! the same run or grant the same claim.
//!
//! # Layout
//! - `sqlite.rs`: [`SqliteStore`], [`OpenOptions`], and how SQLite's errors become
//!   [`StoreError`]s.
//! - `api.rs`: the [`Store`] methods: what each hands the thread, and how durable.
//! - `owned.rs`: the API's borrowed values, owned to cross to the thread.
//! - `thread.rs`: the database thread and group commit.
//! - `schema.rs`: opening a file, refusing what is not ours, migrations.
//! - `claims.rs`, `runs.rs`, `leases.rs`, `components.rs`, `logs.rs`, `waits.rs`: the
//!   statements, each run inside the transaction the thread opened.
//! - `history.rs`: a run's step history (its checkpoints gathered in memory and written
//!   in batches) and forks.
//! - `vfs.rs`: the VFS every connection writes through: one write per WAL frame.

mod api;
mod blobs;
mod children;
mod claims;
mod components;
mod epoch;
mod events;
#[cfg(test)]
mod fault_tests;
mod flow;
mod gc;
mod history;
mod leases;
mod live;
mod logs;
#[cfg(test)]
mod migration_tests;
mod owned;
mod pause;
mod presence;
mod rates;
mod runs;
mod schedules;
mod schema;
mod sealing;
#[cfg(test)]
mod tests;
mod thread;
mod usage;
mod versions;
mod vfs;
mod waits;

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, Row};

use thread::{DbError, DbThread, Failure, WorkFailure};

use super::{Clock, DatabaseFault, Millis, StoreError, SyncMode};

/// How [`SqliteStore::open_with`] opens a store. [`SqliteStore::open`] takes the
/// defaults but for the sync mode.
///
/// ```
/// use std::time::Duration;
/// use idem::store::{Clock, OpenOptions, SqliteStore, SyncMode};
///
/// let dir = tempfile::tempdir()?;
/// let options = OpenOptions {
///     sync: SyncMode::Full,
///     busy_timeout: Duration::from_secs(1),
///     max_size: Some(64 << 20),
///     clock: Clock::system(),
///     ..OpenOptions::default()
/// };
/// let store = SqliteStore::open_with(&dir.path().join("idem.db"), &options)?;
/// # drop(store);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Durability of the writes that carry no [`RunFence`](super::RunFence) (resolve,
    /// cancel, deploy, submit, components, run leases); a fenced write asks for its
    /// run's own.
    pub sync: SyncMode,
    /// How long a write waits for another connection's write lock before it fails
    /// with [`DatabaseFault::Locked`]. Transactions are short, so only a stuck writer
    /// should ever make one wait this long.
    pub busy_timeout: Duration,
    /// A cap on the database's size in bytes, rounded down to whole pages (and never
    /// below the size it has): a write that would grow it further fails with
    /// [`DatabaseFault::Full`], exactly as on a full disk. `None`: only the disk
    /// limits it.
    pub max_size: Option<u64>,
    /// The store's time: every lease, expiry and timestamp is taken from it, inside
    /// the transaction that writes it.
    pub clock: Clock,
    /// Tests only: the name of a registered SQLite VFS to put under the store's own
    /// (the power-loss tests' simulated disk); `None`, SQLite's default.
    #[doc(hidden)]
    pub vfs: Option<String>,
    /// Tests only: the boot id the store takes for the running machine's, so that a
    /// test can simulate the reboot after a power loss (`epoch.rs`); `None`, Linux's.
    #[doc(hidden)]
    pub boot_id: Option<String>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            sync: SyncMode::Normal,
            busy_timeout: Duration::from_secs(5),
            max_size: None,
            clock: Clock::system(),
            vfs: None,
            boot_id: None,
        }
    }
}

/// A [`Store`](super::Store) in one SQLite database file.
///
/// One connection, on a thread of its own, serves all tasks of the handle; open another
/// handle (or run another process) on the same file and SQLite's file locks keep them
/// consistent. Opening reads and may write the file, so it blocks: open before the
/// async runtime starts, or in `spawn_blocking`. Dropping the handle finishes the work
/// already sent and closes the file, and waits for that (briefly blocking the thread
/// that drops it), so that the file is closed once the handle is gone.
///
/// A write whose caller stops waiting (its future dropped) still happens or fails as a
/// whole, with its batch; only the answer is lost. A caller that must know re-reads.
///
/// ```
/// use std::time::Duration;
/// use idem::store::{
///     Acquired, CatalogStore, ClaimOutcome, ClaimRef, ClaimRequest, Commit, InstanceStore,
///     OperatorStore, RunFence, SqliteStore, SyncMode, WorkerStore,
/// };
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # tokio::runtime::Builder::new_current_thread().build()?.block_on(async {
/// let dir = tempfile::tempdir()?;
/// let store = SqliteStore::open(&dir.path().join("idem.db"), SyncMode::Normal)?;
/// # let digest = "00";
/// # store.put_component(digest, b"\0asm").await?;
/// # store.submit(&idem::store::Submission { run_id: "run-1", agent: "billing", digest,
/// #     namespace: "billing", input: b"{}", authority: b"", replace_authority: false,
/// #     priority: 0 }).await?;
/// let lease = Duration::from_secs(30);
/// let Acquired::Leased(run) = store.acquire_run("run-1", "worker-a", lease).await? else {
///     panic!("nobody else holds the run");
/// };
/// let fence = RunFence {
///     run_id: run.record.run_id.clone(),
///     token: run.token,
///     sync: SyncMode::Normal,
/// };
/// let req = ClaimRequest {
///     key: "billing:send-invoice-42",
///     fence: &fence,
///     holder: "instance-a",
///     fingerprint: None,
///     lease: Duration::from_secs(30),
///     durable: true,
/// };
/// let ClaimOutcome::Granted(grant) = store.claim(&req).await? else {
///     panic!("a fresh key is granted");
/// };
/// // ... perform the side effect, then:
/// let claim = ClaimRef { key: req.key, token: grant.token, fence: &fence };
/// store.commit(&Commit { claim, result: b"sent", checkpoint: None, counts: None }).await?;
/// assert_eq!(store.claim(&req).await?, ClaimOutcome::Committed(b"sent".to_vec()));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })
/// # }
/// ```
#[derive(Debug)]
pub struct SqliteStore {
    path: PathBuf,
    db: DbThread,
    /// Named in the error when a write gives up waiting for the lock.
    busy_timeout: Duration,
    /// Durability of writes without a fence.
    sync: SyncMode,
    clock: Clock,
    /// The least fencing token a grant through this handle takes (`epoch.rs`).
    token_floor: u64,
    /// The store's data keys, once it is known to be encrypted at rest: logs' chunks
    /// are sealed with them, and inputs opened to read their concurrency keys.
    sealer: std::sync::OnceLock<std::sync::Arc<super::Sealer>>,
}

impl SqliteStore {
    /// Opens the idem database at `path`, creating it if the file does not exist or is
    /// empty, and brings its schema up to date. Blocks while it does.
    ///
    /// Fails with [`StoreError::Open`] naming the path if its directory is missing,
    /// the database cannot be written, or the path is something other than an idem
    /// database (a directory, a FIFO, a device, another file; all left untouched) or is
    /// `:memory:` (SQLite's in-memory database: a store must outlive its process); with
    /// [`StoreError::SchemaTooNew`] if a newer idem wrote it; with
    /// [`StoreError::Database`] if the file is locked, corrupt or on a full disk.
    pub fn open(path: &Path, sync: SyncMode) -> Result<SqliteStore, StoreError> {
        Self::open_with(
            path,
            &OpenOptions {
                sync,
                ..OpenOptions::default()
            },
        )
    }

    /// [`SqliteStore::open`] with every option spelled out.
    pub fn open_with(path: &Path, options: &OpenOptions) -> Result<SqliteStore, StoreError> {
        let (conn, token_floor) = schema::open(path, options)?;
        Self::serve(path, conn, options, token_floor)
    }

    /// Opens the existing idem database at `path` for reading only. Writes through the
    /// handle fail with [`DatabaseFault::ReadOnly`]; the file is never changed, not
    /// even its header.
    pub fn open_read_only(path: &Path) -> Result<SqliteStore, StoreError> {
        let options = OpenOptions::default();
        let conn = schema::open_read_only(path, options.busy_timeout)?;
        // A read-only handle grants nothing.
        Self::serve(path, conn, &options, 0)
    }

    /// How long this handle's one connection has been held since it opened: by its
    /// thread for the batched transactions it runs (their syncs included), or by a
    /// caller running its transaction alone. Every write of the process goes through
    /// it one after another, so its share of the wall time is how saturated the store
    /// is: near all of it, more concurrent runs add waiting, not steps.
    pub fn connection_busy(&self) -> Duration {
        self.db.busy()
    }

    fn serve(
        path: &Path,
        conn: Connection,
        options: &OpenOptions,
        token_floor: u64,
    ) -> Result<SqliteStore, StoreError> {
        let db = DbThread::spawn(
            conn,
            options.clock.clone(),
            options.sync,
            options.busy_timeout,
            history::write_on_close,
        )
        .map_err(|e| StoreError::Open {
            location: path.display().to_string(),
            reason: format!("cannot start the store's database thread: {e}"),
        })?;
        Ok(SqliteStore {
            path: path.to_owned(),
            db,
            busy_timeout: options.busy_timeout,
            sync: options.sync,
            clock: options.clock.clone(),
            token_floor,
            sealer: std::sync::OnceLock::new(),
        })
    }

    /// The database file this store was opened on.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The sealer of a store encrypted at rest, for a closure on the database's thread.
    fn sealer(&self) -> Option<std::sync::Arc<super::Sealer>> {
        self.sealer.get().cloned()
    }

    /// Runs `f` on the database thread outside any transaction: each statement reads
    /// one consistent snapshot of committed data.
    async fn read<T, F>(&self, op: &'static str, f: F) -> Result<T, StoreError>
    where
        F: FnOnce(&Connection) -> Result<T, TxError> + Send + 'static,
        T: Send + 'static,
    {
        let result = self.db.read(move |conn, _now| f(conn)).await;
        result.map_err(|e| self.error(op, e))
    }

    /// Runs `f` at the store's time in a `BEGIN IMMEDIATE` transaction shared with the
    /// writes queued with it, rolled back (alone) if `f` fails, and returns once the
    /// transaction committed, at least as durably as `sync` asks.
    async fn write<T, F>(&self, op: &'static str, sync: SyncMode, f: F) -> Result<T, StoreError>
    where
        F: FnOnce(&Connection, Millis) -> Result<T, TxError> + Send + 'static,
        T: Send + 'static,
    {
        let result = self.db.write(sync, f).await;
        result.map_err(|e| self.error(op, e))
    }

    /// [`SqliteStore::write`] for a work `f` that borrows what it writes; `owned` makes
    /// the work that owns it, for when it must go to the database thread (see
    /// [`DbThread::write_or`]).
    async fn write_or<T, F, G>(
        &self,
        op: &'static str,
        sync: SyncMode,
        f: F,
        owned: impl FnOnce(F) -> G,
    ) -> Result<T, StoreError>
    where
        F: FnOnce(&Connection, Millis) -> Result<T, TxError>,
        G: FnOnce(&Connection, Millis) -> Result<T, TxError> + Send + 'static,
        T: Send + 'static,
    {
        let result = self.db.write_or(sync, f, owned).await;
        result.map_err(|e| self.error(op, e))
    }

    /// The store's error for a work that failed during `op`.
    fn error(&self, op: &'static str, e: DbError<TxError>) -> StoreError {
        match e {
            DbError::Work(TxError::Store(e)) => e,
            DbError::Work(TxError::Sql(e)) | DbError::Sql(e) => {
                self.failed(op, Failure::from(&e), Box::new(e))
            }
            DbError::Commit(failure) => {
                let source = failure.message.clone().into();
                self.failed(op, failure, source)
            }
            DbError::Panicked(message) => StoreError::Backend {
                op,
                source: format!("the store's code panicked and was rolled back: {message}").into(),
            },
            DbError::Gone => StoreError::Backend {
                op,
                source: "the store's database thread has stopped; open the store again".into(),
            },
        }
    }

    /// The error for a SQLite failure during `op`: a [`StoreError::Database`] naming
    /// this store's file when the cause is one the user can fix, otherwise a
    /// [`StoreError::Backend`].
    fn failed(
        &self,
        op: &'static str,
        failure: Failure,
        source: Box<dyn std::error::Error + Send + Sync>,
    ) -> StoreError {
        match database_fault(failure.code, self.busy_timeout) {
            Some(DatabaseFault::Io) if on_read_only_file_system(&self.path) => {
                StoreError::Database {
                    location: self.path.display().to_string(),
                    op,
                    fault: DatabaseFault::ReadOnly,
                    detail: format!(
                        "SQLite: {}; the file system holding the file is read-only (mounted \
                         or remounted so, as the kernel does after a disk error under \
                         errors=remount-ro): check it, mount it read-write and try again",
                        failure.message
                    ),
                }
            }
            Some(fault) => StoreError::Database {
                location: self.path.display().to_string(),
                op,
                fault,
                detail: sqlite_detail(fault, &failure.message),
            },
            None => StoreError::Backend { op, source },
        }
    }
}

/// Whether `path` lies on a file system that refuses writes (`EROFS`). SQLite reports
/// such a write as a plain I/O error, which names neither the cause nor the cure; a
/// file system turned read-only under a running store (the kernel's `errors=remount-ro`
/// after a disk error) is the common case. Asked only after an I/O error, a few times
/// over 100 ms: the kernel fails the write (the journal aborted) a moment before it
/// marks the file system read-only.
fn on_read_only_file_system(path: &Path) -> bool {
    /// `EROFS` on Linux and the BSDs.
    const EROFS: i32 = 30;
    for probe in 0..5 {
        if probe > 0 {
            std::thread::sleep(Duration::from_millis(25));
        }
        if let Err(e) = std::fs::OpenOptions::new().append(true).open(path)
            && e.raw_os_error() == Some(EROFS)
        {
            return true;
        }
    }
    false
}

/// The fault a SQLite error code stands for, if the user can do something about it.
fn database_fault(code: Option<ErrorCode>, busy_timeout: Duration) -> Option<DatabaseFault> {
    match code? {
        ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked => {
            Some(DatabaseFault::Locked { busy_timeout })
        }
        ErrorCode::ReadOnly => Some(DatabaseFault::ReadOnly),
        ErrorCode::DiskFull => Some(DatabaseFault::Full),
        ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase => Some(DatabaseFault::Corrupt),
        ErrorCode::SystemIoFailure => Some(DatabaseFault::Io),
        _ => None,
    }
}

/// SQLite's words for a fault, and what to do about it in SQLite's terms: the part of
/// the message [`DatabaseFault`] leaves to the backend.
fn sqlite_detail(fault: DatabaseFault, message: &str) -> String {
    match fault {
        DatabaseFault::ReadOnly => format!(
            "SQLite: {message}; idem needs write access to the file and to its directory, \
             where SQLite keeps its -wal and -shm files"
        ),
        DatabaseFault::Corrupt => format!(
            "SQLite: {message}; the database file is corrupt: restore it from a backup or \
             salvage it with `sqlite3 FILE .recover`"
        ),
        _ => format!("SQLite: {message}"),
    }
}

/// A failure inside an operation: SQLite's, to be named with the operation by
/// `SqliteStore::failed`, or already one of the store's own.
#[derive(Debug)]
enum TxError {
    Sql(rusqlite::Error),
    Store(StoreError),
}

impl WorkFailure for TxError {
    fn sqlite_failure(&self) -> Option<Failure> {
        match self {
            TxError::Sql(e) => Some(Failure::from(e)),
            TxError::Store(_) => None,
        }
    }
}

impl From<rusqlite::Error> for TxError {
    fn from(e: rusqlite::Error) -> Self {
        TxError::Sql(e)
    }
}

impl From<StoreError> for TxError {
    fn from(e: StoreError) -> Self {
        TxError::Store(e)
    }
}

// SQLite integers are i64; the API counts in u64/u32. Values a caller passes are
// checked before anything is sent to the thread (`rules::check_*`); values read back that are
// out of range are refused rather than wrapped, so a corrupt row cannot turn into a
// plausible token.

fn to_sql_int(value: u64) -> rusqlite::Result<i64> {
    i64::try_from(value).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
}

fn u64_column(row: &Row<'_>, idx: usize) -> rusqlite::Result<u64> {
    let value: i64 = row.get(idx)?;
    u64::try_from(value).map_err(|_| rusqlite::Error::IntegralValueOutOfRange(idx, value))
}

fn u32_column(row: &Row<'_>, idx: usize) -> rusqlite::Result<u32> {
    let value: i64 = row.get(idx)?;
    u32::try_from(value).map_err(|_| rusqlite::Error::IntegralValueOutOfRange(idx, value))
}
