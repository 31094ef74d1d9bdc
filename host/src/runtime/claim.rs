//! The host's record of a claim handed to a guest: what the `claim` resource stands
//! for, and whether it still stands ([`ClaimLive`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A claim the guest holds. Lives in the instance's resource table; when the instance
/// is dropped the table goes with it and the claim stays in the store, orphaned, exactly
/// as if the process had died.
#[derive(Debug, Clone)]
pub struct ClaimHandle {
    /// The key in the store: the agent's namespace and its key.
    pub(crate) key: String,
    /// The key as the agent wrote it.
    pub(crate) guest_key: String,
    pub(crate) token: u64,
    pub(crate) attempt: u32,
    pub(crate) in_doubt: bool,
    /// The key's place in the run's order of first use: what a crash point's step
    /// counts.
    pub(crate) ordinal: u32,
    /// Whether the claim still stands: cleared when it settles or is found taken over,
    /// which stops requests (and request bodies) made under it.
    pub(crate) live: ClaimLive,
    /// The step's span (`idem.step`), open until the claim is committed or released.
    pub(crate) span: tracing::Span,
    /// When the step first asked for its key: the span's duration counts from here.
    pub(crate) asked: std::time::Instant,
}

/// Whether a claim still stands, as far as this host knows: shared by its handle, the
/// heartbeat that renews it, and every request (and request body) sent under it. It
/// stops standing when it settles, when the heartbeat finds it taken over, and — without
/// anyone saying so — when its lease runs out on this host's clock before a renewal
/// came back (a process paused past its lease must not act on it when it wakes).
#[derive(Debug, Clone)]
pub(crate) struct ClaimLive(Arc<LiveState>);

#[derive(Debug)]
struct LiveState {
    ended: AtomicBool,
    /// Until when the lease is known to hold.
    valid_until: std::sync::Mutex<Instant>,
}

impl ClaimLive {
    /// A claim asked for at `asked` with a lease of `lease`.
    pub(crate) fn new(asked: Instant, lease: Duration) -> ClaimLive {
        ClaimLive(Arc::new(LiveState {
            ended: AtomicBool::new(false),
            valid_until: std::sync::Mutex::new(asked.checked_add(lease).unwrap_or(asked)),
        }))
    }

    fn until(&self) -> std::sync::MutexGuard<'_, Instant> {
        self.0
            .valid_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A renewal sent at `sent` came back: the lease holds until `sent + lease`.
    pub(crate) fn renewed(&self, sent: Instant, lease: Duration) {
        if let Some(until) = sent.checked_add(lease) {
            let mut current = self.until();
            *current = (*current).max(until);
        }
    }

    /// The claim settled or was lost: nothing more goes out under it.
    pub(crate) fn end(&self) {
        self.0.ended.store(true, Ordering::SeqCst);
    }

    pub(crate) fn is_live(&self) -> bool {
        !self.0.ended.load(Ordering::SeqCst) && Instant::now() < *self.until()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_whose_lease_ran_out_here_is_not_live() {
        let asked = Instant::now() - Duration::from_secs(2);
        let live = ClaimLive::new(asked, Duration::from_secs(1));
        assert!(
            !live.is_live(),
            "a paused holder must not act on an expired lease"
        );
        live.renewed(Instant::now(), Duration::from_secs(30));
        assert!(live.is_live());
        live.end();
        assert!(!live.is_live());
    }
}
