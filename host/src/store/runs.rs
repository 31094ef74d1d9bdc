//! Runs: submitting one, where it stands, the leases workers hold on it, and how it
//! ends.

use std::fmt;
use std::str::FromStr;

#[cfg(doc)]
use super::{CatalogStore, InstanceStore, OperatorStore, RunFence, WorkerStore};
use super::{Checkpoint, Counts, Millis};

/// A run to create (or find, if it exists): [`OperatorStore::submit`].
#[derive(Debug, Clone)]
pub struct Submission<'a> {
    /// The run's id.
    pub run_id: &'a str,
    /// The deployment name the run was submitted under (the agent's name).
    pub agent: &'a str,
    /// Hex SHA-256 of the component the run is made from; the component must be in the
    /// store ([`CatalogStore::put_component`]).
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
    /// A new run's priority, 0 (the default, lowest) to
    /// [`MAX_PRIORITY`](super::MAX_PRIORITY): workers lease due runs of higher priority
    /// first, then the oldest. An existing run keeps its own.
    pub priority: u32,
}

/// What [`OperatorStore::submit`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    /// The run as it now stands.
    pub record: RunRecord,
    /// Whether this call created it.
    pub created: bool,
}

/// Where a run stands.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum RunStatus {
    /// Submitted, never started by any worker.
    Queued,
    /// Started and not finished: a worker drives it, or will once its lease is free.
    Running,
    /// Queued or running, and paused by an operator ([`OperatorStore::pause_run`], or
    /// with its deployment): no worker takes it until it is resumed. A worker that held
    /// it when it was paused stops it at its next host call (its lease shows until then).
    Paused,
    /// The agent returned its output.
    Completed,
    /// The agent returned an error (or trapped, or hit a limit); submitting or running
    /// it again resumes it.
    Failed,
    /// The agent stopped rather than repeat a side effect that may already have
    /// happened; [`OperatorStore::resolve`] settles the parked key, then the run can resume.
    InDoubt,
    /// An operator cancelled it ([`OperatorStore::cancel_run`]).
    Cancelled,
}

impl RunStatus {
    /// The status's name, as the store and the CLI spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Queued => "queued",
            RunStatus::Running => "running",
            RunStatus::Paused => "paused",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::InDoubt => "in-doubt",
            RunStatus::Cancelled => "cancelled",
        }
    }

    /// Whether no worker will drive the run again without an operator's act.
    pub fn is_finished(self) -> bool {
        !matches!(
            self,
            RunStatus::Queued | RunStatus::Running | RunStatus::Paused
        )
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
            RunStatus::Paused,
            RunStatus::Completed,
            RunStatus::Failed,
            RunStatus::InDoubt,
            RunStatus::Cancelled,
        ]
        .into_iter()
        .find(|status| status.as_str() == s)
        .ok_or_else(|| {
            format!(
                "unknown run status {s:?}: expected queued, running, paused, completed, \
                 failed, in-doubt or cancelled"
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
    /// expired: compare `expires` with [`WorkerStore::now`].
    pub lease: Option<RunLeaseInfo>,
    /// An operator asked for the run to be cancelled; its worker stops it at its next
    /// host call.
    pub cancel_requested: bool,
    /// Who paused the run, while it is paused ([`RunStatus::Paused`]).
    pub paused_by: Option<super::PausedBy>,
    /// Why the last worker that held the run gave it back without finishing it (it
    /// could not provide what the run needs, say), if it said.
    pub note: Option<String>,
    /// The run is suspended in a wait ([`WorkerStore::suspend_run`]), holding no lease: no
    /// worker takes it before this time on the store's clock, unless its signal comes.
    /// `Some(Millis::MAX)` for a wait only a signal ends.
    pub wake_at: Option<Millis>,
    /// The signal the suspended run waits for, if it waits for one.
    pub waiting_for: Option<String>,
    /// The run that spawned this one, if one did.
    pub parent: Option<String>,
    /// The key its parent spawned it under.
    pub spawn_key: Option<String>,
    /// It outlives a cancelled parent.
    pub detached: bool,
    /// The key of the join the suspended run waits on, if it waits on one.
    pub joining: Option<String>,
    /// Its priority: workers lease due runs of higher priority first.
    pub priority: u32,
    /// Its concurrency key, read from its input where its deployment says
    /// ([`FlowLimits::key`](super::FlowLimits::key)), if it has one.
    pub flow_key: Option<String>,
    /// The version of its deployment it is on (the latest with its component); `None`
    /// for a run of a component never deployed under its name.
    pub version: Option<u64>,
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
    /// The run's checkpoint as the lease was granted, read in the grant's transaction
    /// (no other holder writes one while the lease lasts): the first `load` of the
    /// drive needs no read of its own. `None` for no checkpoint, or when the store did
    /// not read it ([`LeasedRun::checkpoint_read`]).
    pub checkpoint: Option<Checkpoint>,
    /// Whether [`LeasedRun::checkpoint`] is what the store holds (read with the grant).
    pub checkpoint_read: bool,
    /// Whether the grant recorded the lease's first instance as started, in its own
    /// transaction: `record.counts.instances` already counts it, durably before any
    /// instance runs, and the host writes no counts of its own before that instance.
    /// A holder that starts no instance gives the lease back with the counts it was
    /// given, less that instance.
    pub instance_counted: bool,
}

/// What [`WorkerStore::acquire_run`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    /// The lease is the caller's.
    Leased(LeasedRun),
    /// Another worker holds a live lease on the run.
    Held(RunLeaseInfo),
    /// The run is finished ([`RunStatus::is_finished`]); nothing was changed.
    Finished(RunRecord),
    /// The run is paused ([`RunStatus::Paused`]); nothing was changed.
    Paused(RunRecord),
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
        /// An operator paused the run (or its deployment): stop at the next host call
        /// outside a side effect and give the lease back.
        pause_requested: bool,
    },
    /// Another lease was granted since (or the run ended): stop writing for the run.
    Lost,
}

/// How a run ended, as its worker records it ([`WorkerStore::finish_run`]).
#[derive(Debug, Clone, Copy)]
pub enum RunEnd<'a> {
    /// The agent returned these output bytes.
    Completed(&'a [u8]),
    /// The agent returned this error text (or the host ended the run with it), as
    /// bytes: a store encrypted at rest passes it on sealed.
    Failed(&'a [u8]),
    /// The run stopped in doubt; [`InstanceStore::park`] recorded the key and reason.
    InDoubt,
    /// The run was cancelled; its open claims are released in the same transaction.
    Cancelled,
}

/// What [`OperatorStore::cancel_run`] did.
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

/// Which runs [`OperatorStore::runs`] lists.
#[derive(Debug, Clone, Default)]
pub struct RunFilter<'a> {
    /// Only runs with this status.
    pub status: Option<RunStatus>,
    /// Only runs of this agent (deployment name).
    pub agent: Option<&'a str>,
    /// Only the children of this run.
    pub parent: Option<&'a str>,
    /// At most this many, newest first; `None` for all.
    pub limit: Option<usize>,
}
