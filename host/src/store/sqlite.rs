//! The SQLite backend of [`Store`]: one database file in WAL mode, shared safely by
//! threads of one process and by several processes.
//!
//! Every write is one `BEGIN IMMEDIATE` transaction: the write lock is taken up front,
//! so concurrent writers queue on the busy timeout instead of failing halfway through a
//! read-then-write. All access goes through `SqliteStore::read` and
//! `SqliteStore::write`, the one place that knows about locking.

mod batch;
mod claims;
#[cfg(test)]
mod fault_tests;
mod runs;
mod schema;
#[cfg(test)]
mod tests;

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, Row};

use batch::{Batcher, Failure, WorkFailure, WriteError};

use super::{
    Checkpoint, ClaimOutcome, ClaimRequest, Counts, DatabaseFault, Millis, OpenClaim, Resolution,
    RunEnd, RunRecord, RunSpec, Store, StoreError, now_millis,
};

/// How hard SQLite works to make a commit survive a crash (`--sync normal|full`).
///
/// Both modes survive the idem process crashing or being killed at any point: a
/// transaction that returned is in the WAL file, which the operating system keeps.
/// They differ when the machine loses power or the OS crashes:
///
/// - [`SyncMode::Normal`] syncs the WAL only when it is checkpointed, so the last
///   transactions before the crash may be lost (the database stays consistent). A lost
///   commit rolls the key back to a claim held by a holder that no longer exists: it is
///   taken over when its lease expires and reported as in doubt, so its side effect may
///   run twice.
/// - [`SyncMode::Full`] syncs the WAL on every commit: a commit that returned survives
///   power loss, at the cost of one `fsync` per transaction.
///
/// ```
/// use idem::store::SyncMode;
///
/// let mode: SyncMode = "full".parse()?;
/// assert_eq!(mode, SyncMode::Full);
/// assert_eq!(mode.to_string(), "full");
/// # Ok::<(), idem::store::ParseSyncModeError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SyncMode {
    /// `PRAGMA synchronous = NORMAL`: fast; on power loss the last commits may be lost.
    Normal,
    /// `PRAGMA synchronous = FULL`: every commit is on disk before it returns.
    Full,
}

impl SyncMode {
    /// The mode's name, as `--sync` takes it.
    pub fn as_str(self) -> &'static str {
        match self {
            SyncMode::Normal => "normal",
            SyncMode::Full => "full",
        }
    }
}

impl fmt::Display for SyncMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SyncMode {
    type Err = ParseSyncModeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("normal") {
            Ok(SyncMode::Normal)
        } else if s.eq_ignore_ascii_case("full") {
            Ok(SyncMode::Full)
        } else {
            Err(ParseSyncModeError {
                given: s.to_owned(),
            })
        }
    }
}

/// A `--sync` value that is neither `normal` nor `full`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown sync mode {given:?}: expected \"normal\" or \"full\"")]
pub struct ParseSyncModeError {
    /// What was given.
    pub given: String,
}

/// How [`SqliteStore::open_with`] opens a store. [`SqliteStore::open`] takes the
/// defaults but for the sync mode.
///
/// ```
/// use std::time::Duration;
/// use idem::store::{OpenOptions, SqliteStore, SyncMode};
///
/// let dir = tempfile::tempdir()?;
/// let options = OpenOptions {
///     sync: SyncMode::Full,
///     busy_timeout: Duration::from_secs(1),
///     max_size: Some(64 << 20),
/// };
/// let store = SqliteStore::open_with(&dir.path().join("idem.db"), &options)?;
/// # drop(store);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenOptions {
    /// Durability of each commit.
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
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            sync: SyncMode::Normal,
            busy_timeout: Duration::from_secs(5),
            max_size: None,
        }
    }
}

/// A [`Store`] in one SQLite database file.
///
/// One connection serves all threads of the handle; open another handle (or run
/// another process) on the same file and SQLite's file locks keep them consistent.
///
/// ```
/// use std::time::Duration;
/// use idem::store::{ClaimOutcome, ClaimRequest, SqliteStore, Store, SyncMode};
///
/// let dir = tempfile::tempdir()?;
/// let store = SqliteStore::open(&dir.path().join("idem.db"), SyncMode::Normal)?;
/// let req = ClaimRequest {
///     key: "send-invoice-42",
///     run_id: "run-1",
///     holder: "instance-a",
///     fingerprint: None,
///     lease: Duration::from_secs(30),
///     now: idem::store::now_millis(),
/// };
/// let ClaimOutcome::Granted(grant) = store.claim(&req)? else {
///     panic!("a fresh key is granted");
/// };
/// // ... perform the side effect, then:
/// store.commit(req.key, grant.token, req.run_id, b"invoice sent")?;
/// assert_eq!(store.claim(&req)?, ClaimOutcome::Committed(b"invoice sent".to_vec()));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct SqliteStore {
    path: PathBuf,
    conn: Batcher,
    /// Named in the error when a write gives up waiting for the lock.
    busy_timeout: Duration,
}

impl SqliteStore {
    /// Opens the idem database at `path`, creating it if the file does not exist or is
    /// empty, and brings its schema up to date.
    ///
    /// Fails with [`StoreError::Open`] naming the path if its directory is missing,
    /// the database cannot be written, or the file is something other than an idem
    /// database (which is left untouched); with [`StoreError::SchemaTooNew`] if a newer
    /// idem wrote it; with [`StoreError::Database`] if the file is locked, corrupt or
    /// on a full disk.
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
        let conn = schema::open(path, options)?;
        Ok(SqliteStore {
            path: path.to_owned(),
            conn: Batcher::new(conn),
            busy_timeout: options.busy_timeout,
        })
    }

    /// Opens the existing idem database at `path` for reading only. Writes through the
    /// handle fail with [`DatabaseFault::ReadOnly`]; the file is never changed, not
    /// even its header.
    pub fn open_read_only(path: &Path) -> Result<SqliteStore, StoreError> {
        let busy_timeout = OpenOptions::default().busy_timeout;
        let conn = schema::open_read_only(path, busy_timeout)?;
        Ok(SqliteStore {
            path: path.to_owned(),
            conn: Batcher::new(conn),
            busy_timeout,
        })
    }

    /// The database file this store was opened on.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on the connection outside any explicit transaction: each statement
    /// reads one consistent snapshot of committed data.
    fn read<T>(
        &self,
        op: &'static str,
        f: impl FnOnce(&Connection) -> Result<T, TxError>,
    ) -> Result<T, StoreError> {
        self.conn.read(f).map_err(|e| match e {
            TxError::Sql(e) => self.failed(op, Failure::from(&e), Box::new(e)),
            TxError::Store(e) => e,
        })
    }

    /// Runs `f` in a `BEGIN IMMEDIATE` transaction (shared with concurrent writers of
    /// this handle: group commit), rolled back if `f` fails, and returns once the
    /// transaction is committed.
    ///
    /// `f` may run on another writer's thread (the batch's leader), so it owns what it
    /// needs.
    fn write<T: Send + 'static>(
        &self,
        op: &'static str,
        f: impl FnOnce(&Connection) -> Result<T, TxError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.conn.write(f).map_err(|e| match e {
            WriteError::Work(TxError::Sql(e)) | WriteError::Sql(e) => {
                self.failed(op, Failure::from(&e), Box::new(e))
            }
            WriteError::Work(TxError::Store(e)) => e,
            WriteError::Commit(failure) => {
                let source = failure.message.clone().into();
                self.failed(op, failure, source)
            }
        })
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
            Some(fault) => StoreError::Database {
                location: self.path.display().to_string(),
                op,
                fault,
                detail: failure.message,
            },
            None => StoreError::Backend { op, source },
        }
    }
}

/// The fault a SQLite error code stands for, if the user can do something about it.
pub(super) fn database_fault(
    code: Option<ErrorCode>,
    busy_timeout: Duration,
) -> Option<DatabaseFault> {
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

impl Store for SqliteStore {
    fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        let req = OwnedClaim::new(req);
        self.write("claim a key", move |conn| {
            claims::claim(conn, &req.borrow(), None)
        })
    }

    fn take_over(
        &self,
        req: &ClaimRequest<'_>,
        stale_token: u64,
    ) -> Result<ClaimOutcome, StoreError> {
        let req = OwnedClaim::new(req);
        self.write("take over a claim", move |conn| {
            claims::claim(conn, &req.borrow(), Some(stale_token))
        })
    }

    fn commit(&self, key: &str, token: u64, run_id: &str, result: &[u8]) -> Result<(), StoreError> {
        let now = now_millis();
        let (key, run_id, result) = (key.to_owned(), run_id.to_owned(), result.to_vec());
        self.write("commit a result", move |conn| {
            claims::commit(conn, &key, token, &run_id, &result, now)
        })
    }

    fn commit_and_save(
        &self,
        key: &str,
        token: u64,
        run_id: &str,
        result: &[u8],
        checkpoint: &Checkpoint,
        counts: Option<&Counts>,
        now: Millis,
    ) -> Result<(), StoreError> {
        let (key, run_id, result) = (key.to_owned(), run_id.to_owned(), result.to_vec());
        let (checkpoint, counts) = (checkpoint.clone(), counts.copied());
        self.write("commit a result and save progress", move |conn| {
            claims::commit(conn, &key, token, &run_id, &result, now)?;
            runs::save_progress(conn, &run_id, &checkpoint, counts.as_ref(), now)
        })
    }

    fn release(&self, key: &str, token: u64) -> Result<bool, StoreError> {
        let key = key.to_owned();
        self.write("release a claim", move |conn| {
            claims::release(conn, &key, token)
        })
    }

    fn renew(
        &self,
        key: &str,
        token: u64,
        lease: Duration,
        now: Millis,
    ) -> Result<bool, StoreError> {
        let expires = claims::lease_expiry(now, lease);
        let key = key.to_owned();
        self.write("renew a claim", move |conn| {
            claims::renew(conn, &key, token, expires)
        })
    }

    fn open_run(&self, spec: &RunSpec<'_>) -> Result<RunRecord, StoreError> {
        let (run_id, agent, digest) = (
            spec.run_id.to_owned(),
            spec.agent.to_owned(),
            spec.digest.to_owned(),
        );
        let (namespace, input, now) = (spec.namespace.to_owned(), spec.input.to_vec(), spec.now);
        self.write("open a run", move |conn| {
            let spec = RunSpec {
                run_id: &run_id,
                agent: &agent,
                digest: &digest,
                namespace: &namespace,
                input: &input,
                now,
            };
            runs::open_run(conn, &spec)
        })
    }

    fn run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        self.read("read a run", |conn| runs::run(conn, run_id))
    }

    fn runs(&self) -> Result<Vec<RunRecord>, StoreError> {
        self.read("list runs", runs::runs)
    }

    fn load_progress(&self, run_id: &str) -> Result<Option<Checkpoint>, StoreError> {
        self.read("load progress", |conn| runs::load_progress(conn, run_id))
    }

    fn save_progress(
        &self,
        run_id: &str,
        checkpoint: &Checkpoint,
        counts: Option<&Counts>,
        now: Millis,
    ) -> Result<(), StoreError> {
        let (run_id, checkpoint, counts) = (run_id.to_owned(), checkpoint.clone(), counts.copied());
        self.write("save progress", move |conn| {
            runs::save_progress(conn, &run_id, &checkpoint, counts.as_ref(), now)
        })
    }

    fn save_counts(&self, run_id: &str, counts: &Counts, now: Millis) -> Result<(), StoreError> {
        let (run_id, counts) = (run_id.to_owned(), *counts);
        self.write("save counts", move |conn| {
            runs::save_counts(conn, &run_id, &counts, now)
        })
    }

    fn finish_run(
        &self,
        run_id: &str,
        end: RunEnd<'_>,
        counts: &Counts,
        now: Millis,
    ) -> Result<(), StoreError> {
        let (run_id, counts) = (run_id.to_owned(), *counts);
        let end = match end {
            RunEnd::Completed(output) => Ok(output.to_vec()),
            RunEnd::Failed(error) => Err(error.to_owned()),
        };
        self.write("finish a run", move |conn| {
            let end = match &end {
                Ok(output) => RunEnd::Completed(output),
                Err(error) => RunEnd::Failed(error),
            };
            runs::finish_run(conn, &run_id, end, &counts, now)
        })
    }

    fn open_claims(&self, run_id: Option<&str>) -> Result<Vec<OpenClaim>, StoreError> {
        self.read("list open claims", |conn| claims::open_claims(conn, run_id))
    }

    fn committed(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.read("read a result", |conn| claims::committed(conn, key))
    }

    fn upgrade_run(
        &self,
        run_id: &str,
        from: &str,
        to: &str,
        now: Millis,
    ) -> Result<(), StoreError> {
        let (run_id, from, to) = (run_id.to_owned(), from.to_owned(), to.to_owned());
        self.write("upgrade a run", move |conn| {
            runs::upgrade_run(conn, &run_id, &from, &to, now)
        })
    }

    fn park(
        &self,
        key: &str,
        token: u64,
        run_id: &str,
        reason: &str,
        now: Millis,
    ) -> Result<(), StoreError> {
        let (key, run_id, reason) = (key.to_owned(), run_id.to_owned(), reason.to_owned());
        self.write("park a claim in doubt", move |conn| {
            claims::park(conn, &key, token, &run_id, &reason, now)
        })
    }

    fn resolve(
        &self,
        run_id: &str,
        key: &str,
        resolution: Resolution<'_>,
        now: Millis,
    ) -> Result<(), StoreError> {
        let (run_id, key) = (run_id.to_owned(), key.to_owned());
        let result = match resolution {
            Resolution::Commit(result) => Some(result.to_vec()),
            Resolution::Retry => None,
        };
        self.write("resolve an in-doubt key", move |conn| {
            let resolution = match &result {
                Some(result) => Resolution::Commit(result),
                None => Resolution::Retry,
            };
            claims::resolve(conn, &run_id, &key, resolution, now)
        })
    }
}

/// A [`ClaimRequest`] that owns its strings, for a write that may run on another
/// thread.
struct OwnedClaim {
    key: String,
    run_id: String,
    holder: String,
    fingerprint: Option<String>,
    lease: Duration,
    now: Millis,
}

impl OwnedClaim {
    fn new(req: &ClaimRequest<'_>) -> OwnedClaim {
        OwnedClaim {
            key: req.key.to_owned(),
            run_id: req.run_id.to_owned(),
            holder: req.holder.to_owned(),
            fingerprint: req.fingerprint.map(str::to_owned),
            lease: req.lease,
            now: req.now,
        }
    }

    fn borrow(&self) -> ClaimRequest<'_> {
        ClaimRequest {
            key: &self.key,
            run_id: &self.run_id,
            holder: &self.holder,
            fingerprint: self.fingerprint.as_deref(),
            lease: self.lease,
            now: self.now,
        }
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

// SQLite integers are i64; the API counts in u64/u32. Out-of-range values are refused
// rather than wrapped, so a corrupt row cannot turn into a plausible token.

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
