//! Stopping a run from outside its instance: why ([`Stop`]), and the signals one run's
//! driver, watchdogs and lease renewal share ([`RunSignals`]).

use std::sync::atomic::{AtomicU8, Ordering};

/// Why a run is told to stop from outside its instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Stop {
    /// The worker is shutting down: the run ends at its next host call that holds no
    /// claim, and its lease is given back.
    #[error("the worker is shutting down")]
    Drain,
    /// The drain took too long: the instance ends at once, in the middle of whatever
    /// side effect it runs (retaken in doubt).
    #[error("the worker is shutting down and the drain timed out")]
    Abort,
    /// An operator cancelled the run.
    #[error("the run was cancelled")]
    Cancel,
    /// Another holder has the run's lease: nothing more may be written for it.
    #[error("the run's lease was taken over by another holder")]
    LeaseLost,
}

/// Stop signals for one run, shared by its driver, its instances' watchdogs and the
/// heartbeat. The strongest signal wins: a lost lease over a cancel over an abort over
/// a drain.
#[derive(Debug, Default)]
pub(crate) struct RunSignals {
    stop: AtomicU8,
    changed: tokio::sync::Notify,
}

impl RunSignals {
    fn rank(stop: Stop) -> u8 {
        match stop {
            Stop::Drain => 1,
            Stop::Abort => 2,
            Stop::Cancel => 3,
            Stop::LeaseLost => 4,
        }
    }

    /// Raises `stop` unless a stronger signal is already up.
    pub(crate) fn raise(&self, stop: Stop) {
        let rank = Self::rank(stop);
        if self.stop.fetch_max(rank, Ordering::SeqCst) < rank {
            self.changed.notify_waiters();
        }
    }

    /// The signal raised, if any.
    pub(crate) fn stop(&self) -> Option<Stop> {
        match self.stop.load(Ordering::SeqCst) {
            0 => None,
            1 => Some(Stop::Drain),
            2 => Some(Stop::Abort),
            3 => Some(Stop::Cancel),
            _ => Some(Stop::LeaseLost),
        }
    }

    /// Resolves when a signal is raised after this call (not after its first poll:
    /// check the signal after calling this, then wait, and nothing is missed).
    pub(crate) fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }
}
