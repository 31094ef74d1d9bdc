//! Stopping a run from outside its instance: why ([`Stop`]), the signals one run's
//! driver, watchdogs and lease renewal share ([`RunSignals`]), and the handle a caller
//! stops a foreground run with ([`StopSignal`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// Why a run is told to stop from outside its instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Stop {
    /// The worker is shutting down: the run ends at its next host call that holds no
    /// claim, and its lease is given back.
    #[error("the worker is shutting down")]
    Drain,
    /// An operator paused the run (or its deployment): it stops as a drain does, at
    /// its next host call that holds no claim, and its lease is given back; no worker
    /// takes it until it is resumed.
    #[error("the run was paused")]
    Pause,
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
/// a pause over a drain.
#[derive(Debug, Default)]
pub(crate) struct RunSignals {
    stop: AtomicU8,
    changed: tokio::sync::Notify,
}

impl RunSignals {
    fn rank(stop: Stop) -> u8 {
        match stop {
            Stop::Drain => 1,
            Stop::Pause => 2,
            Stop::Abort => 3,
            Stop::Cancel => 4,
            Stop::LeaseLost => 5,
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
            2 => Some(Stop::Pause),
            3 => Some(Stop::Abort),
            4 => Some(Stop::Cancel),
            _ => Some(Stop::LeaseLost),
        }
    }

    /// Resolves when a signal is raised after this call (not after its first poll:
    /// check the signal after calling this, then wait, and nothing is missed).
    pub(crate) fn changed(&self) -> tokio::sync::futures::Notified<'_> {
        self.changed.notified()
    }
}

/// Stops a foreground run ([`RunOptions::stop`](super::RunOptions::stop)) the way a
/// worker drains: at the run's next host call outside a side effect, with its lease
/// given back so that whoever resumes it need not wait for the lease (the report's
/// status is then [`RunStatus::Running`](crate::store::RunStatus::Running)).
///
/// Cheap to clone; every clone raises and hears the same stop, which stays raised.
#[derive(Debug, Clone, Default)]
pub struct StopSignal(Arc<StopState>);

#[derive(Debug, Default)]
struct StopState {
    raised: AtomicBool,
    changed: tokio::sync::Notify,
}

impl StopSignal {
    /// A signal not raised yet.
    pub fn new() -> StopSignal {
        StopSignal::default()
    }

    /// Raises the stop: every run given this signal stops.
    pub fn stop(&self) {
        if !self.0.raised.swap(true, Ordering::SeqCst) {
            self.0.changed.notify_waiters();
        }
    }

    /// Whether the stop was raised.
    pub fn is_stopped(&self) -> bool {
        self.0.raised.load(Ordering::SeqCst)
    }

    /// Resolves once the stop is raised (at once if it already was).
    pub async fn stopped(&self) {
        loop {
            let changed = self.0.changed.notified();
            if self.is_stopped() {
                return;
            }
            changed.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_strongest_run_signal_wins() {
        let signals = RunSignals::default();
        assert_eq!(signals.stop(), None);
        signals.raise(Stop::Drain);
        signals.raise(Stop::Pause);
        signals.raise(Stop::Drain);
        assert_eq!(signals.stop(), Some(Stop::Pause));
        signals.raise(Stop::Abort);
        assert_eq!(signals.stop(), Some(Stop::Abort));
        signals.raise(Stop::Pause);
        signals.raise(Stop::Cancel);
        assert_eq!(signals.stop(), Some(Stop::Cancel));
        signals.raise(Stop::LeaseLost);
        assert_eq!(signals.stop(), Some(Stop::LeaseLost));
    }

    #[tokio::test]
    async fn a_stop_reaches_every_clone_raised_before_or_after_the_wait() {
        let signal = StopSignal::new();
        let clone = signal.clone();
        assert!(!clone.is_stopped());
        let waiter = tokio::spawn(async move { clone.stopped().await });
        tokio::task::yield_now().await;
        signal.stop();
        waiter.await.unwrap();
        // Raised already: resolves at once.
        signal.stopped().await;
        assert!(signal.is_stopped());
    }
}
