//! A run's progress: the checkpoint it resumes from and the counts of what it did.

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
