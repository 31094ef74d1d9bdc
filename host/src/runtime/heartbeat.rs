//! Lease renewal for claims whose side effects are running. The host renews, not the
//! guest: a guest busy in its side effect (or stuck) makes no host calls, and a paused
//! or dead process must stop renewing so that its claims expire and can be taken over.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::store::{Store, now_millis};

/// Claims held by live instances of this host, keyed by key, with their token and
/// holder.
type Held = HashMap<String, (u64, String)>;

struct Shared {
    held: Mutex<Held>,
    stop: Mutex<bool>,
    wake: Condvar,
}

/// A thread that renews every held claim's lease a few times per lease period.
pub(crate) struct Heartbeat {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Renewals per lease period: two may be lost (a slow disk, a busy store) before the
/// lease runs out.
const BEATS_PER_LEASE: u32 = 3;

impl Heartbeat {
    pub(crate) fn start(store: Arc<dyn Store>, lease: Duration) -> Heartbeat {
        let shared = Arc::new(Shared {
            held: Mutex::default(),
            stop: Mutex::new(false),
            wake: Condvar::new(),
        });
        let period = (lease / BEATS_PER_LEASE).max(Duration::from_millis(10));
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("idem-heartbeat".into())
                .spawn(move || beat(&shared, store.as_ref(), lease, period))
                .map_err(|e| tracing::error!(error = %e, "cannot start the lease heartbeat"))
                .ok()
        };
        Heartbeat { shared, thread }
    }

    /// Starts renewing the claim on `key` held by `token`.
    pub(crate) fn hold(&self, key: &str, token: u64, holder: &str) {
        self.held()
            .insert(key.to_string(), (token, holder.to_string()));
    }

    /// Stops renewing the claim on `key` (committed, released or parked).
    pub(crate) fn settle(&self, key: &str, token: u64) {
        let mut held = self.held();
        if held.get(key).is_some_and(|(t, _)| *t == token) {
            held.remove(key);
        }
    }

    /// Stops renewing every claim of `holder` (its instance was dropped) and returns
    /// them as `(key, token)`.
    pub(crate) fn forget(&self, holder: &str) -> Vec<(String, u64)> {
        let mut forgotten = Vec::new();
        self.held().retain(|key, (token, h)| {
            let keep = h != holder;
            if !keep {
                forgotten.push((key.clone(), *token));
            }
            keep
        });
        forgotten
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.shared
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

fn beat(shared: &Shared, store: &dyn Store, lease: Duration, period: Duration) {
    let mut stop = shared.stop.lock().unwrap_or_else(PoisonError::into_inner);
    loop {
        // Checked before waiting too: a host dropped before this thread first ran has
        // already sent its only wake-up.
        if *stop {
            return;
        }
        let (guard, _) = shared
            .wake
            .wait_timeout(stop, period)
            .unwrap_or_else(PoisonError::into_inner);
        stop = guard;
        if *stop {
            return;
        }
        // Renew outside the lock on `held`, so that granting and settling claims never
        // wait on the store's write lock.
        let claims: Vec<(String, u64)> = shared
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(k, (t, _))| (k.clone(), *t))
            .collect();
        for (key, token) in claims {
            match store.renew(&key, token, lease, now_millis()) {
                Ok(true) => {}
                Ok(false) => {
                    // Settled since the snapshot (committed, released) is the common
                    // case; only a claim still held here was really lost.
                    let mut held = shared.held.lock().unwrap_or_else(PoisonError::into_inner);
                    if held.get(&key).is_some_and(|(t, _)| *t == token) {
                        held.remove(&key);
                        tracing::warn!(%key, token, "claim taken over before its lease was renewed");
                    }
                }
                Err(e) => tracing::warn!(%key, error = %e, "cannot renew a claim's lease"),
            }
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        *self
            .shared
            .stop
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = true;
        self.shared.wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
