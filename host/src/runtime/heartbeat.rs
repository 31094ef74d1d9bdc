//! Lease renewal for the runs a host drives and the claims their side effects hold.
//! The host renews, not the guest: a guest busy in its side effect (or stuck) makes no
//! host calls, and a paused or dead process must stop renewing so that its leases
//! expire and its work can be taken over.
//!
//! One task renews everything a few times per lease period, in one batch per kind.
//! What it learns goes back to the run: a lost run lease or a cancel request raises the
//! run's stop signal, and a claim found taken over is marked dead, so nothing more is
//! sent downstream under it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::http::ClaimLive;
use super::run_ctx::{RunSignals, Stop};
use crate::store::{ClaimRef, LeaseState, RunFence, Store};

/// Renewals per lease period: two may be lost (a slow disk, a busy store) before the
/// lease runs out.
const BEATS_PER_LEASE: u32 = 3;

/// The pause between beats when nothing shorter is held.
const IDLE_BEAT: Duration = Duration::from_secs(1);

struct HeldClaim {
    token: u64,
    fence: RunFence,
    lease: Duration,
    holder: String,
    live: ClaimLive,
}

struct HeldRun {
    fence: RunFence,
    lease: Duration,
    signals: Arc<RunSignals>,
}

#[derive(Default)]
struct Registry {
    /// By qualified key.
    claims: HashMap<String, HeldClaim>,
    /// By run id.
    runs: HashMap<String, HeldRun>,
}

impl Registry {
    fn period(&self) -> Duration {
        let shortest = self
            .claims
            .values()
            .map(|c| c.lease)
            .chain(self.runs.values().map(|r| r.lease))
            .min();
        match shortest {
            // At least once a second while runs are held: renewing a run's lease is how
            // its worker hears that an operator cancelled it.
            Some(lease) => (lease / BEATS_PER_LEASE).clamp(Duration::from_millis(10), IDLE_BEAT),
            None => IDLE_BEAT,
        }
    }
}

/// The renewal task of one host. Dropping it stops the task.
pub(crate) struct Heartbeat {
    registry: Arc<Mutex<Registry>>,
    wake: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Heartbeat {
    /// Starts the task on the current tokio runtime.
    pub(crate) fn start(store: Arc<dyn Store>, handle: &tokio::runtime::Handle) -> Heartbeat {
        let registry = Arc::new(Mutex::new(Registry::default()));
        let wake = Arc::new(tokio::sync::Notify::new());
        let task = handle.spawn(beat(Arc::clone(&registry), Arc::clone(&wake), store));
        Heartbeat {
            registry,
            wake,
            task,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts renewing the lease of a run this host drives.
    pub(crate) fn hold_run(&self, fence: &RunFence, lease: Duration, signals: Arc<RunSignals>) {
        let mut registry = self.lock();
        let before = registry.period();
        registry.runs.insert(
            fence.run_id.clone(),
            HeldRun {
                fence: fence.clone(),
                lease,
                signals,
            },
        );
        self.wake_if_sooner(before, registry.period());
    }

    /// Wakes the beat only when its period got shorter: waking it costs a thread
    /// switch, and a run grants claims far more often than their leases change.
    fn wake_if_sooner(&self, before: Duration, after: Duration) {
        if after < before {
            self.wake.notify_one();
        }
    }

    /// Stops renewing a run's lease (it finished, or was given back).
    pub(crate) fn drop_run(&self, run_id: &str) {
        self.lock().runs.remove(run_id);
    }

    /// Starts renewing the claim on `key` held by `token`.
    pub(crate) fn hold_claim(
        &self,
        key: &str,
        token: u64,
        fence: &RunFence,
        lease: Duration,
        holder: &str,
        live: ClaimLive,
    ) {
        let mut registry = self.lock();
        let before = registry.period();
        registry.claims.insert(
            key.to_string(),
            HeldClaim {
                token,
                fence: fence.clone(),
                lease,
                holder: holder.to_string(),
                live,
            },
        );
        self.wake_if_sooner(before, registry.period());
    }

    /// Stops renewing the claim on `key` (committed, released or parked).
    pub(crate) fn settle_claim(&self, key: &str, token: u64) {
        let mut registry = self.lock();
        if registry.claims.get(key).is_some_and(|c| c.token == token) {
            registry.claims.remove(key);
        }
    }

    /// Stops renewing every claim of `holder` (its instance was dropped) and returns
    /// them as `(key, token, fence)`.
    pub(crate) fn forget(&self, holder: &str) -> Vec<(String, u64, RunFence)> {
        let mut forgotten = Vec::new();
        self.lock().claims.retain(|key, c| {
            let keep = c.holder != holder;
            if !keep {
                c.live.end();
                forgotten.push((key.clone(), c.token, c.fence.clone()));
            }
            keep
        });
        forgotten
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn beat(
    registry: Arc<Mutex<Registry>>,
    wake: Arc<tokio::sync::Notify>,
    store: Arc<dyn Store>,
) {
    let lock = || registry.lock().unwrap_or_else(PoisonError::into_inner);
    let mut failing = false;
    let mut last = tokio::time::Instant::now();
    loop {
        // A wake-up (something new to renew) may only bring the next beat closer: it
        // must never push it back, or a host granting claims faster than its beat
        // would never renew anything.
        let next = last + lock().period();
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = wake.notified() => continue,
        }
        last = tokio::time::Instant::now();
        // Renew from a snapshot, outside the lock, so that granting and settling never
        // wait on the store.
        let (runs, claims): (Vec<_>, Vec<_>) = {
            let registry = lock();
            (
                registry
                    .runs
                    .values()
                    .map(|r| (r.fence.clone(), r.lease, Arc::clone(&r.signals)))
                    .collect(),
                registry
                    .claims
                    .iter()
                    .map(|(k, c)| (k.clone(), c.token, c.fence.clone(), c.lease, c.live.clone()))
                    .collect(),
            )
        };
        let mut ok = true;
        // One batch per lease length: a worker's thousand runs renew in one transaction.
        let mut runs_by_lease: HashMap<Duration, Vec<(RunFence, Arc<RunSignals>)>> = HashMap::new();
        for (fence, lease, signals) in runs {
            runs_by_lease
                .entry(lease)
                .or_default()
                .push((fence, signals));
        }
        for (lease, runs) in runs_by_lease {
            let fences: Vec<RunFence> = runs.iter().map(|(f, _)| f.clone()).collect();
            match store.renew_runs(&fences, lease).await {
                Ok(states) => {
                    for ((fence, signals), state) in runs.iter().zip(states) {
                        match state {
                            LeaseState::Held {
                                cancel_requested: true,
                                ..
                            } => signals.raise(Stop::Cancel),
                            LeaseState::Held { .. } => {}
                            LeaseState::Lost => {
                                tracing::warn!(
                                    run_id = %crate::text::escape(&fence.run_id, false),
                                    "run lease taken over; the run stops here"
                                );
                                signals.raise(Stop::LeaseLost);
                            }
                        }
                    }
                }
                Err(e) => {
                    ok = false;
                    if !failing {
                        tracing::warn!(error = %e, "cannot renew run leases; retrying");
                    }
                }
            }
        }
        let mut claims_by_lease: HashMap<Duration, Vec<(String, u64, RunFence, ClaimLive)>> =
            HashMap::new();
        for (key, token, fence, lease, live) in claims {
            claims_by_lease
                .entry(lease)
                .or_default()
                .push((key, token, fence, live));
        }
        for (lease, claims) in claims_by_lease {
            let refs: Vec<ClaimRef<'_>> = claims
                .iter()
                .map(|(key, token, fence, _)| ClaimRef {
                    key,
                    token: *token,
                    fence,
                })
                .collect();
            let sent = std::time::Instant::now();
            match store.renew(&refs, lease).await {
                Ok(held) => {
                    for ((key, token, _, live), held) in claims.iter().zip(held) {
                        if held {
                            live.renewed(sent, lease);
                            continue;
                        }
                        // Settled since the snapshot is the common case; only a claim
                        // still held here was really lost.
                        let mut registry = lock();
                        if registry.claims.get(key).is_some_and(|c| c.token == *token) {
                            registry.claims.remove(key);
                            live.end();
                            tracing::warn!(
                                key = %crate::text::escape(key, false),
                                token,
                                "claim taken over before its lease was renewed"
                            );
                        }
                    }
                }
                Err(e) => {
                    ok = false;
                    if !failing {
                        tracing::warn!(error = %e, "cannot renew claim leases; retrying");
                    }
                }
            }
        }
        failing = !ok;
    }
}
