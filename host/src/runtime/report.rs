//! What driving a run reports: how it ended ([`RunReport`]), why it failed
//! ([`RunFailure`]), and what it waits for when it was given back suspended
//! ([`Waiting`]).

use super::limits::LimitExceeded;
use crate::store::{Counts, Millis, RunStatus};

/// How a run ended, and what it took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunReport {
    /// The run's id.
    pub run_id: String,
    /// How the run stands now. `Running` when it was given back unfinished (the worker
    /// shut down); `Paused` when an operator paused it (it was given back, or found
    /// paused and not driven).
    pub status: RunStatus,
    /// The output bytes when completed; the error text when failed; the reason when in
    /// doubt or cancelled.
    pub outcome: Vec<u8>,
    /// What the run did over all its instances, including earlier drives and other
    /// processes' drives: the run's totals.
    pub counts: Counts,
    /// What this call did: the part of `counts` that its own drives added. Less than
    /// `counts` when the run was driven before, or by another process while this call
    /// waited (two `idem run` of one run each report their own part).
    pub counts_now: Counts,
    /// Whether `counts` are exact. An earlier holder of the run that died (killed,
    /// power lost) without writing its last counts leaves them short by at most the
    /// work of its last quarter second; `reclaimed` is exact either way.
    pub counts_exact: bool,
    /// Instances created by this call (`counts_now.instances`).
    pub instances_now: u64,
    /// The run was ended by another holder, before this call or while it waited: this
    /// call did not finish it (`counts_now` says what it did, if anything).
    pub already_finished: bool,
    /// Why the run failed, when it failed for a reason the host can name.
    pub failure: Option<RunFailure>,
    /// What the run waits for, when it was given back suspended in a wait (its status
    /// is then [`RunStatus::Running`]).
    pub waiting: Option<Waiting>,
    /// What this call took a new build of the same local file for, when it did (the dev
    /// loop: [`RunOptions::source`](super::RunOptions::source)). Boxed: rare, and a
    /// report is moved often.
    pub rebuilt: Option<Box<Rebuilt>>,
}

/// A new build of the local file a name's current deployment came from, taken without
/// `upgrade` (the dev loop), and what it changed; both are recorded in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rebuilt {
    /// The namespace, which now runs the new build.
    pub namespace: String,
    /// The component the name pointed at before, if another.
    pub previous: Option<String>,
    /// The component the run was started with, when it was upgraded to the new build.
    pub run_upgraded_from: Option<String>,
}

impl RunReport {
    /// Adds `earlier`, what this call's earlier drives did, to what this report's
    /// drive did.
    pub(crate) fn add_earlier(&mut self, earlier: &Counts) {
        self.counts_now = sum(&self.counts_now, earlier);
        self.instances_now = self.counts_now.instances;
    }
}

/// Each count of `a` plus the same of `b`.
fn sum(a: &Counts, b: &Counts) -> Counts {
    Counts {
        executed: a.executed.saturating_add(b.executed),
        skipped: a.skipped.saturating_add(b.skipped),
        awaited: a.awaited.saturating_add(b.awaited),
        reclaimed: a.reclaimed.saturating_add(b.reclaimed),
        instances: a.instances.saturating_add(b.instances),
        recycled: a.recycled.saturating_add(b.recycled),
    }
}

/// What was counted between `start` and `now`, count by count.
pub(crate) fn since(now: &Counts, start: &Counts) -> Counts {
    Counts {
        executed: now.executed.saturating_sub(start.executed),
        skipped: now.skipped.saturating_sub(start.skipped),
        awaited: now.awaited.saturating_sub(start.awaited),
        reclaimed: now.reclaimed.saturating_sub(start.reclaimed),
        instances: now.instances.saturating_sub(start.instances),
        recycled: now.recycled.saturating_sub(start.recycled),
    }
}

/// What a suspended run waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// When it is due without a signal, on the store's clock (`None`: never).
    pub due: Option<Millis>,
    /// The signal that wakes it, if it waits for one.
    pub signal: Option<String>,
    /// The key of the join it waits on, if it does: the end of its children wakes it.
    pub join: Option<String>,
}

/// Why a run failed, beyond its error text.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RunFailure {
    /// The agent returned an error.
    AgentError,
    /// The guest trapped (a panic, a stack overflow, an uncaught exception).
    Trapped,
    /// A limit ended it.
    Limit(LimitExceeded),
    /// The agent returned while still holding claims: their side effects may have
    /// begun, so the keys are left to be retaken in doubt.
    ClaimsLeftOpen {
        /// The keys, as the agent wrote them.
        keys: Vec<String>,
    },
}
