//! Durable state: committed results, claims (with leases and fencing tokens), run
//! progress and run records, behind one small trait so that backends are swappable.
//!
//! The rules every backend keeps, whatever its storage:
//! - a key is committed at most once, and its result never changes afterwards;
//! - a commit succeeds only for the current holder of the key's claim (its token);
//!   the result row and the removal of the claim are one transaction;
//! - a claim whose lease expired may be taken by another holder, who gets a strictly
//!   greater token; the old holder's commit is then refused;
//! - fencing tokens are unique and increase for the whole store.

#[cfg(test)]
mod model_tests;
mod sqlite;
#[cfg(test)]
mod tests;

pub use sqlite::{OpenOptions, ParseSyncModeError, SqliteStore, SyncMode};

use std::time::Duration;

/// Milliseconds since the Unix epoch: the unit of every lease and timestamp in a store.
pub type Millis = i64;

/// The current wall-clock time in [`Millis`]. Leases are compared across processes,
/// so they use wall-clock time, not a monotonic clock.
pub fn now_millis() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as Millis)
        .unwrap_or(0)
}

/// Who asks for a claim, and for how long it wants it.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    /// The idempotency key (already validated by the caller).
    pub key: &'a str,
    /// The run on whose behalf the claim is made.
    pub run_id: &'a str,
    /// The holder's identity: unique per live instance.
    pub holder: &'a str,
    /// What the step was asked to do (a hash of its input), if the caller knows.
    pub fingerprint: Option<&'a str>,
    /// How long the claim stays the holder's without being renewed or committed.
    pub lease: Duration,
    /// The time of the request.
    pub now: Millis,
}

/// A claim handed to a holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Fencing token: greater than any token the store handed out before.
    pub token: u64,
    /// 1 on the key's first claim; +1 on each later claim of the same key.
    pub attempt: u32,
    /// The previous holder neither committed nor released: it may have begun the side
    /// effect.
    pub in_doubt: bool,
}

/// What a claim request found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The key is committed: here is its result.
    Committed(Vec<u8>),
    /// The claim is the caller's.
    Granted(Grant),
    /// Another holder has the claim and its lease has not expired.
    Held(HeldClaim),
    /// The key was committed, or is claimed, with another fingerprint: it is being
    /// reused for different input.
    Conflict {
        /// The fingerprint the key is bound to.
        fingerprint: String,
    },
    /// The claim is parked in doubt ([`Store::park`]): nobody may take it until an
    /// operator resolves it ([`Store::resolve`]).
    Parked {
        /// The run that parked it.
        run_id: String,
        /// Why it was parked.
        reason: String,
    },
}

/// A claim held by someone else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldClaim {
    /// The holder's identity.
    pub holder: String,
    /// The holder's fencing token.
    pub token: u64,
    /// When the holder's lease runs out.
    pub lease_expires: Millis,
}

/// A run's saved checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The step the run reached.
    pub step: u64,
    /// The agent's state at that step.
    pub state: Vec<u8>,
}

/// What a run did, summed over all its instances.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Counts {
    /// Claims granted: side effects this run started (including reclaimed ones).
    pub executed: u64,
    /// Keys found committed: side effects not run again.
    pub skipped: u64,
    /// Keys another live holder was executing, whose commit this run waited for.
    pub awaited: u64,
    /// Claims retaken from a holder that died before committing (part of `executed`).
    pub reclaimed: u64,
    /// Instances created for the run.
    pub instances: u64,
}

/// Identifies a run and what it was started with.
#[derive(Debug, Clone)]
pub struct RunSpec<'a> {
    /// The run's id.
    pub run_id: &'a str,
    /// A human name for the agent (its file stem).
    pub agent: &'a str,
    /// Hex SHA-256 of the component's bytes.
    pub digest: &'a str,
    /// The namespace the run's keys live in.
    pub namespace: &'a str,
    /// The run's input bytes.
    pub input: &'a [u8],
    /// The time the run is opened.
    pub now: Millis,
}

/// Where a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunStatus {
    /// Started and not finished: `idem run` resumes it.
    Running,
    /// The agent returned its output.
    Completed,
    /// The agent returned an error; running it again resumes it.
    Failed,
    /// The agent stopped rather than repeat a side effect that may already have
    /// happened; `idem resolve` settles the parked key, then the run can resume.
    InDoubt,
}

/// How an operator settles a parked, in-doubt key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution<'a> {
    /// The side effect did happen: commit these result bytes for the key.
    Commit(&'a [u8]),
    /// It did not (or should happen again): release the claim so the run retries it.
    Retry,
}

/// A run as the store knows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RunRecord {
    /// The run's id.
    pub run_id: String,
    /// The agent's name.
    pub agent: String,
    /// Digest of the component the run was started with.
    pub digest: String,
    /// The namespace the run's keys live in.
    pub namespace: String,
    /// Where the run stands.
    pub status: RunStatus,
    /// The output (when completed) or the error text (when failed).
    #[serde(skip)]
    pub outcome: Option<Vec<u8>>,
    /// The step of the last checkpoint, if any.
    pub step: Option<u64>,
    /// The counts as last flushed.
    pub counts: Counts,
    /// When the run was opened first.
    pub created: Millis,
    /// When the run's record last changed.
    pub updated: Millis,
}

/// A claim not yet committed, for `idem status`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct OpenClaim {
    /// The key.
    pub key: String,
    /// The run that claimed it.
    pub run_id: String,
    /// The holder, or `None` once released.
    pub holder: Option<String>,
    /// The current token.
    pub token: u64,
    /// The current attempt.
    pub attempt: u32,
    /// When the lease runs out.
    pub lease_expires: Millis,
    /// Why the claim is parked in doubt, if it is.
    pub parked: Option<String>,
}

/// How a run ended.
#[derive(Debug, Clone, Copy)]
pub enum RunEnd<'a> {
    /// The agent returned these output bytes.
    Completed(&'a [u8]),
    /// The agent returned this error.
    Failed(&'a str),
}

/// Errors from a store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The claim the caller presented is no longer the key's claim.
    #[error("claim on key {key:?} was lost: token {token} no longer holds it")]
    ClaimLost {
        /// The key.
        key: String,
        /// The stale token.
        token: u64,
    },
    /// The run exists with other input bytes.
    #[error("run {run_id:?} was started with a different input; use another --run-id")]
    InputMismatch {
        /// The run.
        run_id: String,
    },
    /// `resolve` named a key that is not parked for that run.
    #[error("key {key:?} is not parked in doubt by run {run_id:?}; nothing to resolve")]
    NotInDoubt {
        /// The run.
        run_id: String,
        /// The key.
        key: String,
    },
    /// The run does not exist: it must be opened with [`Store::open_run`] first.
    #[error("run {run_id:?} does not exist")]
    UnknownRun {
        /// The run.
        run_id: String,
    },
    /// The store could not be opened or prepared.
    #[error("cannot open store {location}: {reason}")]
    Open {
        /// The database path or URL.
        location: String,
        /// What went wrong, in words.
        reason: String,
    },
    /// The store was written by a newer idem.
    #[error(
        "store {location} has schema version {found}, newer than this idem supports \
         ({supported}); upgrade idem"
    )]
    SchemaTooNew {
        /// The database path or URL.
        location: String,
        /// The version found in the store.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// The database refused an operation for a cause outside idem, named by `fault`.
    /// The refused operation left nothing behind: results committed before it are
    /// unchanged, and the run can resume once the cause is gone.
    #[error("store {location} cannot {op}: {fault} (SQLite: {detail})")]
    Database {
        /// The database path or URL.
        location: String,
        /// What the store was doing.
        op: &'static str,
        /// The cause.
        fault: DatabaseFault,
        /// The backend's own words for it.
        detail: String,
    },
    /// A backend operation failed.
    #[error("store failed to {op}")]
    Backend {
        /// What the store was doing.
        op: &'static str,
        /// The backend's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Why a database refused an operation, when the cause lies outside idem: each is fixed
/// by whoever runs idem, after which the same run resumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DatabaseFault {
    /// Another connection (another process, most likely) kept the write lock for
    /// longer than this handle's busy timeout.
    Locked {
        /// How long the write waited.
        busy_timeout: Duration,
    },
    /// The database, its directory or its file system cannot be written.
    ReadOnly,
    /// The disk is full, or the database reached the size it was capped at.
    Full,
    /// The database file is damaged.
    Corrupt,
    /// The operating system failed to read or write the file.
    Io,
}

impl std::fmt::Display for DatabaseFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DatabaseFault::Locked { busy_timeout } => write!(
                f,
                "the database is locked: another connection kept its write lock for longer \
                 than the busy timeout ({}); try again once it lets go",
                human_duration(*busy_timeout)
            ),
            DatabaseFault::ReadOnly => f.write_str(
                "the database is read-only: idem needs write access to the file and to its \
                 directory, where SQLite keeps its -wal and -shm files",
            ),
            DatabaseFault::Full => f.write_str(
                "the disk is full or the database reached its size limit; free space (or raise \
                 the limit) and try again",
            ),
            DatabaseFault::Corrupt => f.write_str(
                "the database file is corrupt; restore it from a backup or salvage it with \
                 `sqlite3 FILE .recover` (idem does not repair it)",
            ),
            DatabaseFault::Io => f.write_str(
                "the operating system failed to read or write the database (a disk or file \
                 system error)",
            ),
        }
    }
}

/// `5s`, `200ms`: how a user would write the duration.
fn human_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// A durable store of claims, results, progress and runs.
///
/// Methods are synchronous and safe to call from many threads at once; a backend
/// serialises what it must.
pub trait Store: Send + Sync {
    /// Claims `req.key`, or returns its committed result, or reports its live holder.
    /// If the key is bound to a fingerprint (by its claim or its result) and
    /// `req.fingerprint` is another, reports [`ClaimOutcome::Conflict`] instead.
    /// A claim that was released, or whose lease expired, is granted to the caller with
    /// the next attempt and a fresh token. A grant adds one to the run's `executed`
    /// count (and `reclaimed`, when in doubt) in the same transaction.
    fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError>;

    /// Takes the claim on `req.key` from the holder whose token is `stale_token`, even
    /// though its lease has not expired: the caller knows that holder is dead. If the
    /// claim has moved on since (another token), reports the new holder instead; if the
    /// key was committed, returns the result.
    fn take_over(
        &self,
        req: &ClaimRequest<'_>,
        stale_token: u64,
    ) -> Result<ClaimOutcome, StoreError>;

    /// Writes `result` as the key's committed result and removes the claim, in one
    /// transaction, if `token` still holds the claim; otherwise [`StoreError::ClaimLost`].
    fn commit(&self, key: &str, token: u64, run_id: &str, result: &[u8]) -> Result<(), StoreError>;

    /// [`Store::commit`] and [`Store::save_progress`] of run `run_id` in ONE
    /// transaction: the step that committed also advanced the checkpoint, so a durable
    /// step costs one write transaction after its claim instead of two. Nothing is
    /// written if the claim was lost.
    #[allow(clippy::too_many_arguments)]
    fn commit_and_save(
        &self,
        key: &str,
        token: u64,
        run_id: &str,
        result: &[u8],
        checkpoint: &Checkpoint,
        counts: &Counts,
        now: Millis,
    ) -> Result<(), StoreError>;

    /// Gives up the claim held by `token` without a result. Returns whether the caller
    /// still held it.
    fn release(&self, key: &str, token: u64) -> Result<bool, StoreError>;

    /// Extends the lease of the claim held by `token` until `now + lease`. Returns
    /// whether the caller still held it.
    fn renew(
        &self,
        key: &str,
        token: u64,
        lease: Duration,
        now: Millis,
    ) -> Result<bool, StoreError>;

    /// Creates the run if it is new; returns its record either way. A failed run is set
    /// back to running: opening a run means resuming it. Fails with
    /// [`StoreError::InputMismatch`] if it exists with other input.
    fn open_run(&self, spec: &RunSpec<'_>) -> Result<RunRecord, StoreError>;

    /// The run's record, if it exists.
    fn run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError>;

    /// Every run, newest first.
    fn runs(&self) -> Result<Vec<RunRecord>, StoreError>;

    /// The run's last checkpoint.
    fn load_progress(&self, run_id: &str) -> Result<Option<Checkpoint>, StoreError>;

    /// Replaces the run's checkpoint and stores its counts, in one transaction.
    /// Fails with [`StoreError::UnknownRun`] if the run was never opened.
    fn save_progress(
        &self,
        run_id: &str,
        checkpoint: &Checkpoint,
        counts: &Counts,
        now: Millis,
    ) -> Result<(), StoreError>;

    /// Stores the run's counts (absolute values, not increments). Fails with
    /// [`StoreError::UnknownRun`] if the run was never opened.
    fn save_counts(&self, run_id: &str, counts: &Counts, now: Millis) -> Result<(), StoreError>;

    /// Records how the run ended, with its final counts. Fails with
    /// [`StoreError::UnknownRun`] if the run was never opened.
    fn finish_run(
        &self,
        run_id: &str,
        end: RunEnd<'_>,
        counts: &Counts,
        now: Millis,
    ) -> Result<(), StoreError>;

    /// Claims not committed yet, of one run or of all runs.
    fn open_claims(&self, run_id: Option<&str>) -> Result<Vec<OpenClaim>, StoreError>;

    /// The committed result of `key`, without claiming it.
    fn committed(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError>;

    /// Moves run `run_id` from the component `from` to the component `to` and records
    /// the upgrade; fails with [`StoreError::UnknownRun`] if the run does not exist with
    /// digest `from`.
    fn upgrade_run(
        &self,
        run_id: &str,
        from: &str,
        to: &str,
        now: Millis,
    ) -> Result<(), StoreError>;

    /// Parks the claim held by `token` in doubt and sets run `run_id` to
    /// [`RunStatus::InDoubt`], in one transaction. Fails with [`StoreError::ClaimLost`]
    /// if `token` no longer holds the claim.
    fn park(
        &self,
        key: &str,
        token: u64,
        run_id: &str,
        reason: &str,
        now: Millis,
    ) -> Result<(), StoreError>;

    /// Settles a key parked by run `run_id`: commits a result under a fresh token, or
    /// releases the claim for a retry. The run goes back to [`RunStatus::Running`] once
    /// none of its keys is parked. Fails with [`StoreError::NotInDoubt`] if the key is
    /// not parked by that run.
    fn resolve(
        &self,
        run_id: &str,
        key: &str,
        resolution: Resolution<'_>,
        now: Millis,
    ) -> Result<(), StoreError>;
}
