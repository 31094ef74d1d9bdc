//! Durable state behind one backend-neutral, async trait: committed results, claims
//! (with leases and fencing tokens), runs and the leases workers hold on them,
//! checkpoints, logs, and the components and deployments runs are made from.
//!
//! The rules every backend keeps, whatever its storage:
//! - a key is committed at most once, and its result never changes afterwards;
//! - a commit succeeds only for the current holder of the key's claim (its token);
//!   the result and the end of the claim are one transaction;
//! - a claim whose lease expired may be taken by another holder, who gets a strictly
//!   greater token; the old holder's commit is then refused;
//! - fencing tokens increase per key: each grant of a key gets a greater token than
//!   every earlier grant of that key;
//! - a run is leased by at most one worker at a time; every write made for a run
//!   presents the run's lease token ([`RunFence`]) and is refused, changing nothing,
//!   once another lease was granted ([`StoreError::LeaseLost`]);
//! - every lease (of a claim or of a run) is compared with the store's own clock
//!   ([`Clock`]), never with the caller's: workers sharing a store share one time.
//!
//! # Layout
//! - `mod.rs`: the [`Store`] trait and the values it speaks in.
//! - `clock.rs`: the store's time, and a manual clock tests drive.
//! - `error.rs`: [`StoreError`] and [`DatabaseFault`], in no backend's words.
//! - `parked.rs`: the keys a run parked in doubt, as an operator names them.
//! - `rules.rs`: the decisions both backends make alike (claims, tokens, run leases).
//! - `waits.rs`: the values of durable sleeps and signals.
//! - `sqlite/`: the SQLite backend; `migrations/sqlite/`: its numbered schema.
//! - `postgres/`: the PostgreSQL backend; `migrations/postgres/`: its numbered schema.

mod clock;
mod error;
#[cfg(test)]
mod model_tests;
mod parked;
mod postgres;
mod rules;
mod sqlite;
#[cfg(test)]
mod tests;
mod waits;

pub use clock::Clock;
pub use error::{DatabaseFault, StoreError};
pub use parked::{ParkedKeys, ParkedMatch, qualified_key};
pub use postgres::{PostgresOptions, PostgresStore, is_postgres_url};
pub use sqlite::{OpenOptions, SqliteStore};
pub use waits::{
    MAX_SIGNAL_NAME_BYTES, MAX_WAIT, SignalSent, Suspension, WaitKind, WaitRecord, WaitRequest,
    WaitState, Wake, check_signal_name,
};

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// Milliseconds since the Unix epoch: the unit of every lease and timestamp in a store.
pub type Millis = i64;

/// How durable a run's writes must be before they return (`sync` in a run's authority).
///
/// Both modes survive the process that wrote crashing or being killed at any point. They
/// differ when the machine loses power or its OS crashes:
/// - [`SyncMode::Normal`]: the last transactions before the crash may be lost (the
///   store stays consistent: a lost commit turns back into the claim it came from,
///   which is taken over in doubt);
/// - [`SyncMode::Full`]: a write that returned survives power loss.
///
/// ```
/// use idem::store::SyncMode;
///
/// let mode: SyncMode = "full".parse()?;
/// assert_eq!(mode, SyncMode::Full);
/// assert_eq!(mode.to_string(), "full");
/// # Ok::<(), idem::store::ParseSyncModeError>(())
/// ```
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum SyncMode {
    /// Fast; on power loss the last commits may be lost.
    #[default]
    Normal,
    /// Every write is on disk before it returns.
    Full,
}

impl SyncMode {
    /// The mode's name.
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

/// A sync mode that is neither `normal` nor `full`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown sync mode {given:?}: expected \"normal\" or \"full\"")]
pub struct ParseSyncModeError {
    /// What was given.
    pub given: String,
}

/// What every write made for a run presents: the run, the token of the lease its
/// writer holds, and how durable the write must be. A write whose token is not the
/// run's current lease token is refused with [`StoreError::LeaseLost`] and changes
/// nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunFence {
    /// The run.
    pub run_id: String,
    /// The token of the run lease the writer holds ([`LeasedRun::token`]).
    pub token: u64,
    /// How durable the run's writes must be.
    pub sync: SyncMode,
}

/// Who asks for a claim, and for how long it wants it.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    /// The idempotency key (already validated and qualified by its namespace).
    pub key: &'a str,
    /// The run on whose behalf the claim is made, and its lease.
    pub fence: &'a RunFence,
    /// The holder's identity: unique per live instance.
    pub holder: &'a str,
    /// What the step was asked to do (a hash of its input), if the caller knows.
    pub fingerprint: Option<&'a str>,
    /// How long the claim stays the holder's without being renewed or committed.
    pub lease: Duration,
    /// The claim must be durable before the call returns, as the run's sync mode
    /// makes writes durable. `false`: it may become durable with the commit's sync
    /// instead (one sync per step); on power loss before that, the claim may vanish,
    /// and the key is granted again under a greater token (see `Store::claim`).
    pub durable: bool,
}

impl ClaimRequest<'_> {
    /// How durable the claim's own write must be: a claim that may become durable with
    /// its commit is written without a sync of its own (the log is synced in order, so
    /// the commit's sync covers it).
    pub fn sync(&self) -> SyncMode {
        if self.durable {
            self.fence.sync
        } else {
            SyncMode::Normal
        }
    }
}

/// A claim handed to a holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Fencing token: greater than any token handed out before for the same key.
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
    /// When the holder's lease runs out, on the store's clock.
    pub lease_expires: Millis,
}

/// A key's claim, as its holder names it to renew, release or park it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRef<'a> {
    /// The key (qualified).
    pub key: &'a str,
    /// The holder's token.
    pub token: u64,
    /// The run it was claimed for.
    pub fence: &'a RunFence,
}

/// A commit: the result of a claimed key, optionally with the run's next checkpoint and
/// its counts, written in one transaction.
#[derive(Debug, Clone)]
pub struct Commit<'a> {
    /// The claim being committed.
    pub claim: ClaimRef<'a>,
    /// The side effect's result.
    pub result: &'a [u8],
    /// The run's checkpoint after this step, replaced in the same transaction.
    pub checkpoint: Option<&'a Checkpoint>,
    /// The run's counts, stored in the same transaction if given.
    pub counts: Option<&'a Counts>,
}

/// A run's saved checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The step the run reached. At most `i64::MAX`: backends store it signed.
    pub step: u64,
    /// The agent's state at that step.
    pub state: Vec<u8>,
}

/// The largest checkpoint step a store keeps.
pub const MAX_STEP: u64 = i64::MAX as u64;

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
    /// Instances the host dropped on purpose (recycling, a crash point, chaos) and
    /// replaced with a fresh one for the same run.
    #[serde(default)]
    pub recycled: u64,
}

/// A run to create (or find, if it exists): [`Store::submit`].
#[derive(Debug, Clone)]
pub struct Submission<'a> {
    /// The run's id.
    pub run_id: &'a str,
    /// The deployment name the run was submitted under (the agent's name).
    pub agent: &'a str,
    /// Hex SHA-256 of the component the run is made from; the component must be in the
    /// store ([`Store::put_component`]).
    pub digest: &'a str,
    /// The namespace the run's keys live in.
    pub namespace: &'a str,
    /// The run's input bytes.
    pub input: &'a [u8],
    /// What the run may reach, as the runtime encodes it; opaque to the store.
    pub authority: &'a [u8],
    /// For an existing run: replace its authority with this one (an operator resuming
    /// it in the foreground decides again); otherwise the run keeps what it had.
    pub replace_authority: bool,
}

/// What [`Store::submit`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    /// The run as it now stands.
    pub record: RunRecord,
    /// Whether this call created it.
    pub created: bool,
}

/// Where a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunStatus {
    /// Submitted, never started by any worker.
    Queued,
    /// Started and not finished: a worker drives it, or will once its lease is free.
    Running,
    /// The agent returned its output.
    Completed,
    /// The agent returned an error (or trapped, or hit a limit); submitting or running
    /// it again resumes it.
    Failed,
    /// The agent stopped rather than repeat a side effect that may already have
    /// happened; [`Store::resolve`] settles the parked key, then the run can resume.
    InDoubt,
    /// An operator cancelled it ([`Store::cancel_run`]).
    Cancelled,
}

impl RunStatus {
    /// The status's name, as the store and the CLI spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Queued => "queued",
            RunStatus::Running => "running",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::InDoubt => "in-doubt",
            RunStatus::Cancelled => "cancelled",
        }
    }

    /// Whether no worker will drive the run again without an operator's act.
    pub fn is_finished(self) -> bool {
        !matches!(self, RunStatus::Queued | RunStatus::Running)
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RunStatus {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            RunStatus::Queued,
            RunStatus::Running,
            RunStatus::Completed,
            RunStatus::Failed,
            RunStatus::InDoubt,
            RunStatus::Cancelled,
        ]
        .into_iter()
        .find(|status| status.as_str() == s)
        .ok_or_else(|| {
            format!(
                "unknown run status {s:?}: expected queued, running, completed, failed, \
                 in-doubt or cancelled"
            )
        })
    }
}

/// The lease a worker holds on a run.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RunLeaseInfo {
    /// The worker's name.
    pub worker: String,
    /// The lease's token.
    pub token: u64,
    /// When it runs out unless renewed, on the store's clock.
    pub expires: Millis,
}

/// A run as the store knows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RunRecord {
    /// The run's id.
    pub run_id: String,
    /// The agent's name: the deployment the run was submitted under.
    pub agent: String,
    /// Digest of the component the run is pinned to.
    pub digest: String,
    /// The namespace the run's keys live in.
    pub namespace: String,
    /// Where the run stands.
    pub status: RunStatus,
    /// The output (when completed), the error text (when failed) or the reason (in
    /// doubt, cancelled).
    #[serde(skip)]
    pub outcome: Option<Vec<u8>>,
    /// The step of the last checkpoint, if any.
    pub step: Option<u64>,
    /// The counts as last written.
    pub counts: Counts,
    /// The worker lease on the run, if one was granted and not given back. It may have
    /// expired: compare `expires` with [`Store::now`].
    pub lease: Option<RunLeaseInfo>,
    /// An operator asked for the run to be cancelled; its worker stops it at its next
    /// host call.
    pub cancel_requested: bool,
    /// Why the last worker that held the run gave it back without finishing it (it
    /// could not provide what the run needs, say), if it said.
    pub note: Option<String>,
    /// The run is suspended in a wait ([`Store::suspend_run`]), holding no lease: no
    /// worker takes it before this time on the store's clock, unless its signal comes.
    /// `Some(Millis::MAX)` for a wait only a signal ends.
    pub wake_at: Option<Millis>,
    /// The signal the suspended run waits for, if it waits for one.
    pub waiting_for: Option<String>,
    /// When the run was submitted.
    pub created: Millis,
    /// When the run's record last changed.
    pub updated: Millis,
}

/// A run leased to a worker, with what the worker needs to drive it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeasedRun {
    /// The run, with its status already `running` and its lease the caller's.
    pub record: RunRecord,
    /// The lease's token: every write for the run presents it ([`RunFence`]).
    pub token: u64,
    /// The run's input.
    pub input: Vec<u8>,
    /// The run's authority, as submitted.
    pub authority: Vec<u8>,
    /// Whether the run's previous lease ran out instead of being given back or
    /// finished: its holder died, and counts it had not written yet are lost.
    pub taken_over: bool,
}

/// What [`Store::acquire_run`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// The lease is the caller's.
    Leased(LeasedRun),
    /// Another worker holds a live lease on the run.
    Held(RunLeaseInfo),
    /// The run is finished ([`RunStatus::is_finished`]); nothing was changed.
    Finished(RunRecord),
}

/// What a worker learned renewing one of its run leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// Still the worker's, until this time on the store's clock.
    Held {
        /// The new expiry.
        expires: Millis,
        /// An operator asked for the run to be cancelled.
        cancel_requested: bool,
    },
    /// Another lease was granted since (or the run ended): stop writing for the run.
    Lost,
}

/// How a run ended, as its worker records it ([`Store::finish_run`]).
#[derive(Debug, Clone, Copy)]
pub enum RunEnd<'a> {
    /// The agent returned these output bytes.
    Completed(&'a [u8]),
    /// The agent returned this error (or the host ended the run with it).
    Failed(&'a str),
    /// The run stopped in doubt; [`Store::park`] recorded the key and reason.
    InDoubt,
    /// The run was cancelled; its open claims are released in the same transaction.
    Cancelled,
}

/// What [`Store::cancel_run`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cancelled {
    /// No worker held the run: it is cancelled now and its open claims are released.
    Now,
    /// A worker holds the run: it stops it at its next host call.
    Requested {
        /// The worker's lease.
        lease: RunLeaseInfo,
    },
}

/// How an operator settles a parked, in-doubt key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution<'a> {
    /// The side effect did happen: commit these result bytes for the key.
    Commit(&'a [u8]),
    /// It did not (or should happen again): release the claim so the run retries it.
    Retry,
}

/// A claim not yet committed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct OpenClaim {
    /// The key.
    pub key: String,
    /// The run that claimed it.
    pub run_id: String,
    /// The holder, or `None` once released or parked.
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

/// A key a run claimed, as `idem show` lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StepRecord {
    /// The key (qualified).
    pub key: String,
    /// Its current (or committing) token.
    pub token: u64,
    /// Its current attempt.
    pub attempt: u32,
    /// When its latest claim was granted.
    pub claimed_at: Millis,
    /// When its result was committed, if it was.
    pub committed_at: Option<Millis>,
    /// The holder, while claimed.
    pub holder: Option<String>,
    /// Why it is parked in doubt, if it is.
    pub parked: Option<String>,
}

/// Which runs [`Store::runs`] lists.
#[derive(Debug, Clone, Default)]
pub struct RunFilter<'a> {
    /// Only runs with this status.
    pub status: Option<RunStatus>,
    /// Only runs of this agent (deployment name).
    pub agent: Option<&'a str>,
    /// At most this many, newest first; `None` for all.
    pub limit: Option<usize>,
}

/// A component deployed under a name: [`Store::deploy`].
#[derive(Debug, Clone)]
pub struct Deployment<'a> {
    /// The name (which is also the namespace its runs' keys live in by default).
    pub name: &'a str,
    /// The component's digest; the component must be in the store.
    pub digest: &'a str,
    /// The most the deployment's runs may reach, as the runtime encodes it.
    pub authority: &'a [u8],
    /// How the component joins the name's namespace.
    pub admission: Admission,
}

/// How a component joins a namespace that other components may already use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Admission {
    /// An operator's explicit act (`deploy`, or an upgrade): the component joins the
    /// namespace whoever else is in it.
    Explicit,
    /// Implied by running a component under a name: it joins only a namespace nobody
    /// uses yet, or one it is already in; otherwise [`StoreError::NamespaceTaken`].
    FirstUse,
}

/// A deployment as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeploymentRecord {
    /// The name.
    pub name: String,
    /// The component it points at.
    pub digest: String,
    /// The authority it grants, encoded.
    #[serde(skip)]
    pub authority: Vec<u8>,
    /// When it was deployed.
    pub deployed_at: Millis,
    /// How its component joined the namespace.
    pub admission: Admission,
}

/// What [`Store::gc`] deletes: finished runs, and the keys, claims, progress, logs,
/// waits and components only they used.
///
/// Times are ages measured back from the store's own clock ([`Store::now`]), so every
/// handle on a store collects the same rows whoever asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcRequest {
    /// Runs that finished at least this long ago go (their record, input, outcome,
    /// checkpoint, log, waits, signals and upgrades).
    pub finished_before: Duration,
    /// Keys committed (or, for a claim never committed, claimed) less than this long
    /// ago stay, even when the run that committed them goes: a run reusing such a key
    /// finds its result and does not run its step again. A key left behind by a
    /// deleted run goes at a later gc, once it is older than the window.
    pub dedupe_window: Duration,
    /// Failed runs count as finished too. They are resumable (submitting one again
    /// resumes it), so by default they stay.
    pub include_failed: bool,
    /// Count what would go, and delete nothing.
    pub dry_run: bool,
}

/// What [`Store::gc`] deleted (or, on a dry run, would delete): rows, per table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct GcReport {
    /// Runs, each with its input and outcome.
    pub runs: u64,
    /// Committed keys (results).
    pub results: u64,
    /// Claims never committed (released, or left by a run that stopped).
    pub claims: u64,
    /// Checkpoints.
    pub checkpoints: u64,
    /// Chunks of run logs.
    pub log_chunks: u64,
    /// Durable sleeps and signal waits.
    pub waits: u64,
    /// Signals sent to runs.
    pub signals: u64,
    /// Records of runs moved to another component.
    pub upgrades: u64,
    /// Components no run and no deployment uses.
    pub components: u64,
    /// Runs finished before this time (on the store's clock) were collected.
    pub runs_before: Millis,
    /// Keys committed before this time were collected.
    pub keys_before: Millis,
}

impl GcReport {
    /// Adds `other`'s counts to these.
    pub(crate) fn add(&mut self, other: &GcReport) {
        self.runs += other.runs;
        self.results += other.results;
        self.claims += other.claims;
        self.checkpoints += other.checkpoints;
        self.log_chunks += other.log_chunks;
        self.waits += other.waits;
        self.signals += other.signals;
        self.upgrades += other.upgrades;
        self.components += other.components;
    }

    /// Rows of every kind, summed.
    pub fn total(&self) -> u64 {
        self.runs
            + self.results
            + self.claims
            + self.checkpoints
            + self.log_chunks
            + self.waits
            + self.signals
            + self.upgrades
            + self.components
    }
}

/// A durable store of claims, results, runs, leases, progress, logs and components.
///
/// Methods are async and safe to call from many tasks at once; a backend serialises
/// what it must, and never blocks the caller's executor thread.
#[async_trait::async_trait]
pub trait Store: Send + Sync + fmt::Debug {
    /// The time on the store's clock: what every lease is compared with.
    async fn now(&self) -> Result<Millis, StoreError>;

    // ----- claims -----

    /// Claims `req.key`, or returns its committed result, or reports its live holder.
    /// If the key is bound to a fingerprint (by its claim or its result) and
    /// `req.fingerprint` is another, reports [`ClaimOutcome::Conflict`] instead.
    /// A claim that was released, or whose lease expired, is granted to the caller with
    /// the next attempt and a fresh token. A grant in doubt adds one to the run's
    /// `reclaimed` count in the same transaction. Fails with [`StoreError::LeaseLost`]
    /// if the fence is stale.
    ///
    /// A claim that is not `req.durable` may be written without a sync of its own; a
    /// backend that does so keeps every token it grants after losing such a claim (a
    /// power loss) above every token it granted before.
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError>;

    /// Takes the claim on `req.key` from the holder whose token is `stale_token`, even
    /// though its lease has not expired: the caller knows that holder is dead. If the
    /// claim has moved on since (another token), reports the new holder instead; if the
    /// key was committed, returns the result.
    async fn take_over(
        &self,
        req: &ClaimRequest<'_>,
        stale_token: u64,
    ) -> Result<ClaimOutcome, StoreError>;

    /// Writes the result as the key's committed result and ends the claim, with the
    /// checkpoint and counts if given, in one transaction; [`StoreError::ClaimLost`] if
    /// the token no longer holds the claim, [`StoreError::LeaseLost`] if the fence is
    /// stale. Nothing is written when it fails.
    async fn commit(&self, commit: &Commit<'_>) -> Result<(), StoreError>;

    /// Gives up a claim without a result (nobody began its side effect, or it failed
    /// and may be tried again). Returns whether the caller still held it.
    async fn release(&self, claim: &ClaimRef<'_>) -> Result<bool, StoreError>;

    /// Extends the leases of claims to `lease` from now, each if its token still holds
    /// it (and its fence is current); returns, per claim, whether it did. A zero lease
    /// ends the claims' leases at once: they stay claims (whoever takes one next is told
    /// it is in doubt) but nobody waits for them.
    async fn renew(
        &self,
        claims: &[ClaimRef<'_>],
        lease: Duration,
    ) -> Result<Vec<bool>, StoreError>;

    /// Parks a claim in doubt and sets its run to [`RunStatus::InDoubt`] with `reason`,
    /// in one transaction. Fails with [`StoreError::ClaimLost`] if the token no longer
    /// holds the claim.
    async fn park(&self, claim: &ClaimRef<'_>, reason: &str) -> Result<(), StoreError>;

    /// Settles a key parked by run `run_id`: commits a result under a fresh token, or
    /// releases the claim for a retry. The run goes back to [`RunStatus::Running`] (with
    /// no lease, so any worker may take it) once none of its keys is parked. Fails with
    /// [`StoreError::NotInDoubt`] if the key is not parked by that run.
    async fn resolve(
        &self,
        run_id: &str,
        key: &str,
        resolution: Resolution<'_>,
    ) -> Result<(), StoreError>;

    /// The committed result of `key`, without claiming it.
    async fn committed(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError>;

    /// Claims not committed yet, of one run or of all runs, ordered by key.
    async fn open_claims(&self, run_id: Option<&str>) -> Result<Vec<OpenClaim>, StoreError>;

    /// The keys run `run_id` claimed (and still holds or committed), in the order their
    /// latest claims were granted.
    async fn steps(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError>;

    // ----- components and deployments -----

    /// Stores a component's bytes under their digest (hex SHA-256, checked by the
    /// caller). Returns whether they were new; storing the same bytes again is a no-op.
    async fn put_component(&self, digest: &str, bytes: &[u8]) -> Result<bool, StoreError>;

    /// A component's bytes.
    async fn component(&self, digest: &str) -> Result<Option<Vec<u8>>, StoreError>;

    /// Whether the store holds the component `digest`: asked before
    /// [`Store::put_component`] so that a start with a component the store already has
    /// need not read the component's file at all.
    async fn has_component(&self, digest: &str) -> Result<bool, StoreError>;

    /// Points `deployment.name` at a component (which must be in the store, else
    /// [`StoreError::UnknownComponent`]) with an authority, and admits the component
    /// to the name's namespace as `deployment.admission` allows. Deploying what the
    /// name already points at, with the same authority, changes nothing.
    async fn deploy(&self, deployment: &Deployment<'_>) -> Result<DeploymentRecord, StoreError>;

    /// What a name points at now.
    async fn deployment(&self, name: &str) -> Result<Option<DeploymentRecord>, StoreError>;

    /// Every name and what it points at now, by name.
    async fn deployments(&self) -> Result<Vec<DeploymentRecord>, StoreError>;

    /// Whether a component was admitted to a namespace ([`Store::deploy`]): `None` if
    /// the namespace has no component yet, else whether this one is among them.
    async fn admitted(&self, namespace: &str, digest: &str) -> Result<Option<bool>, StoreError>;

    // ----- runs -----

    /// Creates the run as [`RunStatus::Queued`] if it is new; returns it either way. An
    /// existing run with other input is refused ([`StoreError::InputMismatch`]); a failed
    /// one is set back to running (submitting again resumes it); a finished one is
    /// returned as it is.
    async fn submit(&self, submission: &Submission<'_>) -> Result<Submitted, StoreError>;

    /// The run's record, if it exists.
    async fn run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError>;

    /// The authority the run was submitted with (encoded), if the run exists.
    async fn run_authority(&self, run_id: &str) -> Result<Option<Vec<u8>>, StoreError>;

    /// Runs, newest first.
    async fn runs(&self, filter: &RunFilter<'_>) -> Result<Vec<RunRecord>, StoreError>;

    /// Moves run `run_id` from the component `from` to the component `to` and records
    /// the upgrade; fails with [`StoreError::UnknownRun`] if the run does not exist with
    /// digest `from`.
    async fn upgrade_run(&self, run_id: &str, from: &str, to: &str) -> Result<(), StoreError>;

    /// The earliest time after `after` at which a run nobody holds becomes due (a sleep
    /// ends, a wait times out), if any: a worker with nothing due sleeps until then
    /// instead of a whole poll.
    async fn next_due(&self, after: Millis) -> Result<Option<Millis>, StoreError>;

    /// Leases up to `max` runs that are queued or running with no live lease (and not
    /// cancelled, not among `skip`) to `worker` for `lease`, oldest first, each with a
    /// new token. Workers calling at once get disjoint runs.
    async fn acquire_runs(
        &self,
        worker: &str,
        max: usize,
        lease: Duration,
        skip: &[String],
    ) -> Result<Vec<LeasedRun>, StoreError>;

    /// Leases run `run_id` to `worker` for `lease` if no other worker holds a live lease
    /// on it. A live lease `worker` itself holds is granted again, with a new token: a
    /// host that asks knows it is not driving the run any more.
    async fn acquire_run(
        &self,
        run_id: &str,
        worker: &str,
        lease: Duration,
    ) -> Result<Acquired, StoreError>;

    /// Renews run leases to `lease` from now; per fence, whether it is still held.
    async fn renew_runs(
        &self,
        fences: &[RunFence],
        lease: Duration,
    ) -> Result<Vec<LeaseState>, StoreError>;

    /// Gives a run lease back without finishing the run, storing its counts and, if
    /// given, a note saying why; the run is free for any worker at once.
    async fn release_run(
        &self,
        fence: &RunFence,
        counts: &Counts,
        note: Option<&str>,
    ) -> Result<(), StoreError>;

    /// Records how the run ended, with its final counts, and ends its lease.
    async fn finish_run(
        &self,
        fence: &RunFence,
        end: RunEnd<'_>,
        counts: &Counts,
    ) -> Result<(), StoreError>;

    /// Cancels a run: at once if no worker holds a live lease on it, else by asking its
    /// worker. Fails with [`StoreError::UnknownRun`], or [`StoreError::RunFinished`] for a
    /// run that completed or was cancelled already.
    async fn cancel_run(&self, run_id: &str) -> Result<Cancelled, StoreError>;

    // ----- progress, counts, logs -----

    /// The run's last checkpoint.
    async fn load_progress(&self, run_id: &str) -> Result<Option<Checkpoint>, StoreError>;

    /// Replaces the run's checkpoint and, if given, stores its counts, in one
    /// transaction.
    async fn save_progress(
        &self,
        fence: &RunFence,
        checkpoint: &Checkpoint,
        counts: Option<&Counts>,
    ) -> Result<(), StoreError>;

    /// Stores the run's counts (absolute values, not increments).
    async fn save_counts(&self, fence: &RunFence, counts: &Counts) -> Result<(), StoreError>;

    /// Appends to the run's log, keeping only its last `keep` bytes.
    async fn append_log(
        &self,
        fence: &RunFence,
        bytes: &[u8],
        keep: usize,
    ) -> Result<(), StoreError>;

    /// The run's log (the last bytes its agent wrote to stderr and stdout).
    async fn logs(&self, run_id: &str) -> Result<Vec<u8>, StoreError>;

    // ----- waits -----

    /// Records the wait `req.key` of the run if it is new (its due time from the
    /// store's clock now), and says where it stands. A signal wait that is not over
    /// takes the oldest signal of its name sent to the run and not yet received, in
    /// this transaction, and records its payload under the key: asked again, the same
    /// key answers the same payload, and no other wait receives that signal. Fails with
    /// [`StoreError::WaitRefused`] for an absurd time or a key used by another kind of
    /// wait, and [`StoreError::LeaseLost`] if the fence is stale; nothing is written.
    async fn wait(&self, req: &WaitRequest<'_>) -> Result<WaitState, StoreError>;

    /// Gives the run's lease back while it waits: with its counts, the run stays
    /// running but no worker takes it before `suspension.due`, unless the signal it
    /// waits for is sent (or already was: the run is then due at once).
    async fn suspend_run(
        &self,
        fence: &RunFence,
        counts: &Counts,
        suspension: &Suspension<'_>,
    ) -> Result<(), StoreError>;

    /// Sends signal `name` with `payload` to run `run_id`; if the run is suspended
    /// waiting for it, the run is due at once. Fails with [`StoreError::UnknownRun`],
    /// [`StoreError::RunFinished`] for a run that completed, failed or was cancelled,
    /// and [`StoreError::SignalRefused`] for an invalid name or a payload over
    /// `max_payload` bytes.
    async fn send_signal(
        &self,
        run_id: &str,
        name: &str,
        payload: &[u8],
        max_payload: usize,
    ) -> Result<SignalSent, StoreError>;

    /// The run's waits, in the order they were first reached.
    async fn waits(&self, run_id: &str) -> Result<Vec<WaitRecord>, StoreError>;

    // ----- retention -----

    /// Deletes what `req` names ([`GcRequest`]) and reports how many rows of each kind
    /// went; with `req.dry_run`, deletes nothing and reports the same counts. Never
    /// deletes a row a live run (queued, running, suspended, in doubt) holds, a parked
    /// key, a claim whose lease is live, or a key inside the dedupe window.
    ///
    /// Works in small transactions, so that the store's other writers keep going while
    /// it runs. Fencing tokens keep increasing per key across a deletion: a key granted
    /// again after gc deleted it gets a token greater than every token it had.
    async fn gc(&self, req: &GcRequest) -> Result<GcReport, StoreError>;
}
