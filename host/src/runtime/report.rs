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
    /// shut down).
    pub status: RunStatus,
    /// The output bytes when completed; the error text when failed; the reason when in
    /// doubt or cancelled.
    pub outcome: Vec<u8>,
    /// What the run did over all its instances, including earlier drives.
    pub counts: Counts,
    /// Whether `counts` are exact. An earlier holder of the run that died (killed,
    /// power lost) without writing its last counts leaves them short by at most the
    /// work of its last quarter second; `reclaimed` is exact either way.
    pub counts_exact: bool,
    /// Instances created by this drive.
    pub instances_now: u64,
    /// The run had ended before this drive: nothing was executed now.
    pub already_finished: bool,
    /// Why the run failed, when it failed for a reason the host can name.
    pub failure: Option<RunFailure>,
    /// What the run waits for, when it was given back suspended in a wait (its status
    /// is then [`RunStatus::Running`]).
    pub waiting: Option<Waiting>,
}

/// What a suspended run waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// When it is due without a signal, on the store's clock (`None`: never).
    pub due: Option<Millis>,
    /// The signal that wakes it, if it waits for one.
    pub signal: Option<String>,
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
