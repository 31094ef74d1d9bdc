//! Whether a holder's process is alive: [`Presence`], which a process keeps for as
//! long as it lives, and the answers a store gives about other holders.
//!
//! A lease says a holder was alive when it last renewed; it takes the lease's length to
//! learn that it died. Where a store can see the processes that use it (on SQLite they
//! all run on the database's machine), each one holds an operating-system lock for its
//! lifetime, which the kernel drops the instant the process dies, however it dies. A
//! holder whose lock is free is gone, and its runs and claims are taken over at once,
//! in doubt as after an expired lease. A frozen process (SIGSTOP, a debugger) still
//! holds its lock: it is waited for as before, until its lease ends. Where a store
//! cannot tell, it says so and leases decide alone.

use std::fmt;

/// Held by a process for as long as it drives runs: while it is kept, the store tells
/// others the holder is alive; dropped (or the process dead), it is not.
pub struct Presence {
    // Only kept, never read: what keeps the holder's lock (a file, a connection).
    _guard: Option<Box<dyn Send + Sync>>,
}

impl Presence {
    /// A presence that tells nothing: for stores that cannot see their holders'
    /// processes.
    pub fn untold() -> Presence {
        Presence { _guard: None }
    }

    /// A presence kept alive by `guard`, which withdraws it when dropped.
    pub fn kept_by(guard: Box<dyn Send + Sync>) -> Presence {
        Presence {
            _guard: Some(guard),
        }
    }

    /// Whether the store can tell others that this holder lives.
    pub fn is_told(&self) -> bool {
        self._guard.is_some()
    }
}

impl fmt::Debug for Presence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Presence")
            .field("told", &self.is_told())
            .finish()
    }
}
