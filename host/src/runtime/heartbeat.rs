//! Lease renewal for the runs a host drives and the claims their side effects hold.
//! The host renews, not the guest: a guest busy in its side effect (or stuck) makes no
//! host calls, and a paused or dead process must stop renewing so that its leases
//! expire and its work can be taken over.
//!
//! One task renews everything a few times per lease period, in one batch per kind.
//! What it learns goes back to the run: a lost run lease, a cancel or a pause raises the
//! run's stop signal, and a claim found taken over is marked dead, so nothing more is
//! sent downstream under it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::claim::ClaimLive;
use super::stop::{RunSignals, Stop};
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

/// What the beat renews. Changed only through its methods, which keep `leases` in step
/// with the two maps.
#[derive(Default)]
struct Registry {
    /// By qualified key.
    claims: HashMap<String, HeldClaim>,
    /// By run id.
    runs: HashMap<String, HeldRun>,
    /// How many of the claims and runs held have each lease length: the shortest sets
    /// the beat, found without looking at every one of them at every grant.
    leases: BTreeMap<Duration, usize>,
}

impl Registry {
    fn period(&self) -> Duration {
        match self.leases.keys().next().copied() {
            // At least once a second while runs are held: renewing a run's lease is how
            // its worker hears that an operator cancelled it.
            Some(lease) => (lease / BEATS_PER_LEASE).clamp(Duration::from_millis(10), IDLE_BEAT),
            None => IDLE_BEAT,
        }
    }

    fn count_lease(&mut self, lease: Duration) {
        *self.leases.entry(lease).or_default() += 1;
    }

    fn uncount_lease(&mut self, lease: Duration) {
        uncount(&mut self.leases, lease);
    }

    fn insert_run(&mut self, run_id: String, run: HeldRun) {
        self.count_lease(run.lease);
        if let Some(old) = self.runs.insert(run_id, run) {
            self.uncount_lease(old.lease);
        }
    }

    fn remove_run(&mut self, run_id: &str) {
        if let Some(old) = self.runs.remove(run_id) {
            self.uncount_lease(old.lease);
        }
    }

    fn insert_claim(&mut self, key: String, claim: HeldClaim) {
        self.count_lease(claim.lease);
        if let Some(old) = self.claims.insert(key, claim) {
            self.uncount_lease(old.lease);
        }
    }

    /// Removes every claim of `holder`, ending them: `(key, token, fence)` of each.
    fn forget(&mut self, holder: &str) -> Vec<(String, u64, RunFence)> {
        let mut forgotten = Vec::new();
        self.claims.retain(|key, c| {
            let keep = c.holder != holder;
            if !keep {
                c.live.end();
                uncount(&mut self.leases, c.lease);
                forgotten.push((key.clone(), c.token, c.fence.clone()));
            }
            keep
        });
        forgotten
    }

    /// Removes the claim on `key` if `token` still holds it; whether it did.
    fn remove_claim(&mut self, key: &str, token: u64) -> bool {
        match self.claims.get(key) {
            Some(held) if held.token == token => {}
            _ => return false,
        }
        if let Some(old) = self.claims.remove(key) {
            self.uncount_lease(old.lease);
        }
        true
    }
}

/// Takes one lease of length `lease` off `leases`' count.
fn uncount(leases: &mut BTreeMap<Duration, usize>, lease: Duration) {
    if let Some(n) = leases.get_mut(&lease) {
        *n -= 1;
        if *n == 0 {
            leases.remove(&lease);
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
        registry.insert_run(
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
        self.lock().remove_run(run_id);
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
        registry.insert_claim(
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
        self.lock().remove_claim(key, token);
    }

    /// Stops renewing every claim of `holder` (its instance was dropped) and returns
    /// them as `(key, token, fence)`.
    pub(crate) fn forget(&self, holder: &str) -> Vec<(String, u64, RunFence)> {
        self.lock().forget(holder)
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The renewal task: renews everything held a few times per lease period until the
/// host drops it.
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
        let (runs, claims) = lock().snapshot();
        let runs_ok = renew_runs(store.as_ref(), runs, failing).await;
        let claims_ok = renew_claims(store.as_ref(), &registry, claims, failing).await;
        failing = !(runs_ok && claims_ok);
    }
}

/// A run lease to renew, as the beat's snapshot holds it.
type RunToRenew = (RunFence, Duration, Arc<RunSignals>);
/// A claim lease to renew: its key, token, run, lease and liveness.
type ClaimToRenew = (String, u64, RunFence, Duration, ClaimLive);

impl Registry {
    /// What to renew now.
    fn snapshot(&self) -> (Vec<RunToRenew>, Vec<ClaimToRenew>) {
        (
            self.runs
                .values()
                .map(|r| (r.fence.clone(), r.lease, Arc::clone(&r.signals)))
                .collect(),
            self.claims
                .iter()
                .map(|(k, c)| (k.clone(), c.token, c.fence.clone(), c.lease, c.live.clone()))
                .collect(),
        )
    }
}

/// Renews the run leases, one batch per lease length (a worker's thousand runs renew in
/// one transaction), and tells each run what the store said: a cancel asked for, or
/// its lease lost. Whether the store answered; a failure is said once per outage.
async fn renew_runs(store: &dyn Store, runs: Vec<RunToRenew>, failing: bool) -> bool {
    let mut ok = true;
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
                        LeaseState::Held {
                            pause_requested: true,
                            ..
                        } => signals.raise(Stop::Pause),
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
    ok
}

/// Renews the claim leases, one batch per lease length; a claim the store no longer
/// grants is ended, so nothing more goes out under it. Whether the store answered; a
/// failure is said once per outage.
async fn renew_claims(
    store: &dyn Store,
    registry: &Mutex<Registry>,
    claims: Vec<ClaimToRenew>,
    failing: bool,
) -> bool {
    let mut ok = true;
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
                    // Settled since the snapshot is the common case; only a claim still
                    // held here was really lost.
                    let lost = registry
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove_claim(key, *token);
                    if lost {
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
    ok
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SyncMode;
    use std::time::Instant;

    fn fence(run_id: &str) -> RunFence {
        RunFence {
            run_id: run_id.into(),
            token: 1,
            sync: SyncMode::Normal,
        }
    }

    fn claim(holder: &str, token: u64, lease: Duration) -> HeldClaim {
        HeldClaim {
            token,
            fence: fence("r"),
            lease,
            holder: holder.into(),
            live: ClaimLive::new(Instant::now(), lease),
        }
    }

    fn run(lease: Duration) -> HeldRun {
        HeldRun {
            fence: fence("r"),
            lease,
            signals: Arc::default(),
        }
    }

    /// The beat follows the shortest lease held as claims and runs come, are replaced
    /// and go, whichever way they go.
    #[test]
    fn the_beat_follows_the_shortest_lease_held() {
        let ms = Duration::from_millis;
        let mut registry = Registry::default();
        assert_eq!(registry.period(), IDLE_BEAT);

        registry.insert_run("r".into(), run(ms(2700)));
        assert_eq!(registry.period(), ms(900));
        registry.insert_claim("a".into(), claim("h1", 1, ms(900)));
        registry.insert_claim("b".into(), claim("h1", 1, ms(900)));
        registry.insert_claim("c".into(), claim("h2", 1, ms(1800)));
        assert_eq!(registry.period(), ms(300));

        // A stale token removes nothing; the right one removes its claim alone.
        assert!(!registry.remove_claim("a", 2));
        assert!(registry.remove_claim("a", 1));
        assert_eq!(registry.period(), ms(300), "b still holds a 900 ms lease");
        // A claim taken again with a longer lease no longer counts its old one.
        registry.insert_claim("b".into(), claim("h2", 2, ms(2400)));
        assert_eq!(registry.period(), ms(600));

        // Forgetting an instance's claims forgets their leases.
        registry.insert_claim("d".into(), claim("h3", 1, ms(300)));
        assert_eq!(registry.period(), ms(100));
        let forgotten = registry.forget("h3");
        assert_eq!(forgotten.len(), 1);
        assert_eq!(forgotten[0].0, "d");
        assert_eq!(registry.period(), ms(600));

        registry.remove_claim("b", 2);
        registry.remove_claim("c", 1);
        assert_eq!(registry.period(), ms(900));
        registry.remove_run("r");
        assert_eq!(registry.period(), IDLE_BEAT);
        assert!(registry.leases.is_empty());
    }
}
