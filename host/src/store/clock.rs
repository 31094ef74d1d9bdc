//! The store's time. Leases are compared across processes, so a store keeps one clock
//! for every holder that shares it: wall-clock time for SQLite (one machine), the
//! server's for a database server. Tests replace it with a manual clock they move by
//! hand, so that a lease expiry or a long wait needs no real sleep.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use super::Millis;

/// A store's source of time.
///
/// ```
/// use std::time::Duration;
/// use idem::store::Clock;
///
/// let clock = Clock::manual(1_000);
/// assert_eq!(clock.now(), 1_000);
/// clock.advance(Duration::from_secs(2));
/// assert_eq!(clock.now(), 3_000);
/// assert!(Clock::system().now() > 1_600_000_000_000);
/// ```
#[derive(Debug, Clone, Default)]
pub struct Clock {
    manual: Option<Arc<AtomicI64>>,
}

impl Clock {
    /// Wall-clock time.
    pub fn system() -> Clock {
        Clock { manual: None }
    }

    /// A clock that stands at `start` until moved; clones share it.
    pub fn manual(start: Millis) -> Clock {
        Clock {
            manual: Some(Arc::new(AtomicI64::new(start))),
        }
    }

    /// The time now, in milliseconds since the Unix epoch.
    pub fn now(&self) -> Millis {
        match &self.manual {
            Some(at) => at.load(Ordering::SeqCst),
            None => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| Millis::try_from(d.as_millis()).unwrap_or(Millis::MAX))
                .unwrap_or(0),
        }
    }

    /// Moves a manual clock forward; a system clock cannot be moved and ignores it.
    pub fn advance(&self, by: Duration) {
        if let Some(at) = &self.manual {
            let by = Millis::try_from(by.as_millis()).unwrap_or(Millis::MAX);
            let _ = at.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_add(by))
            });
        }
    }

    /// Sets a manual clock; a system clock ignores it.
    pub fn set(&self, to: Millis) {
        if let Some(at) = &self.manual {
            at.store(to, Ordering::SeqCst);
        }
    }

    /// Whether tests move this clock by hand.
    pub fn is_manual(&self) -> bool {
        self.manual.is_some()
    }
}
