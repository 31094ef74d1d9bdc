//! What a run carries from instance to instance (`RunCtx`), the deadlines its instances
//! are held to (`Watch`), and the live holders of this host (orphan detection).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::capture::HttpCapture;
use super::faults::Faults;
use super::heartbeat::Heartbeat;
use super::limits::{LimitExceeded, Limits};
use super::live_text::LiveSink;
use super::output::LogSink;
use super::stop::RunSignals;
use crate::store::{Checkpoint, Counts, RunFence, Store, StoreError};

/// The holders of claims made by live instances of this process. A claim whose holder
/// names this process but is not in the set belongs to an instance the host dropped: it
/// is orphaned and may be retaken at once, without waiting for its lease.
#[derive(Debug, Default)]
pub(crate) struct LiveHolders {
    host_id: String,
    live: Mutex<HashSet<String>>,
}

impl LiveHolders {
    pub(crate) fn new(host_id: String) -> Self {
        LiveHolders {
            host_id,
            live: Mutex::default(),
        }
    }

    /// This process's id: unique per process and start.
    pub(crate) fn host_id(&self) -> &str {
        &self.host_id
    }

    /// A holder name for generation `generation` of `run_id` in this process.
    pub(crate) fn holder(&self, run_id: &str, generation: u64) -> String {
        format!("{}/{run_id}/{generation}", self.host_id)
    }

    pub(crate) fn enter(&self, holder: &str) {
        self.lock().insert(holder.to_string());
    }

    pub(crate) fn leave(&self, holder: &str) {
        self.lock().remove(holder);
    }

    /// How many instances of this process are alive.
    pub(crate) fn count(&self) -> usize {
        self.lock().len()
    }

    /// Whether `holder` was an instance of this process that no longer lives.
    pub(crate) fn is_orphan(&self, holder: &str) -> bool {
        holder
            .strip_prefix(self.host_id.as_str())
            .is_some_and(|rest| rest.starts_with('/'))
            && !self.lock().contains(holder)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `holder` (a run lease's or a claim's) belongs to another process that
    /// `store` knows is gone.
    pub(crate) async fn is_gone(
        &self,
        store: &dyn Store,
        holder: &str,
    ) -> Result<bool, StoreError> {
        // A claim's holder is its process's id, `/`, and more (`holder` above).
        let process = holder.split('/').next().unwrap_or(holder);
        Ok(process != self.host_id && store.is_gone(process).await?)
    }
}

/// The run an instance serves; carried from instance to instance.
pub(crate) struct RunCtx {
    /// The run's id and lease: every write for the run presents it.
    pub(crate) fence: RunFence,
    /// The namespace the run's keys live in.
    pub(crate) namespace: String,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) limits: Limits,
    pub(crate) live: Arc<LiveHolders>,
    pub(crate) heartbeat: Arc<Heartbeat>,
    pub(crate) signals: Arc<RunSignals>,
    pub(crate) counts: Counts,
    /// The store already counted the next instance as started (the lease's grant did,
    /// `LeasedRun::instance_counted`): it writes no counts before it runs.
    pub(crate) instance_counted: bool,
    /// Why the host dropped the previous instance under this lease, when it did on
    /// purpose: the next instance's start records it on the run's timeline.
    pub(crate) recycled: Option<String>,
    /// The run's checkpoint as the lease was granted, for the drive's first `load`,
    /// while nothing of this drive has written one since (`None`: read the store).
    pub(crate) preloaded: Option<Option<Checkpoint>>,
    pub(crate) faults: Faults,
    /// The ordinal of the step last committed, which the next progress save follows.
    pub(crate) last_committed: u32,
    /// Fuel this invocation may still burn, over all instances.
    pub(crate) fuel_left: Option<u64>,
    /// When the counts were last written to the store.
    pub(crate) counts_flushed: Instant,
    /// Where the agent's stderr and stdout go.
    pub(crate) log: LogSink,
    /// Where the text the agent publishes to the run's live stream waits for the store.
    pub(crate) live_text: LiveSink,
    /// What answers the run's outbound HTTP in place of the network, if anything.
    pub(crate) capture: Option<Arc<dyn HttpCapture>>,
}

/// How stale a run's stored counts may get while it runs: a checkpoint carries them
/// along at most this often. Writing them with every checkpoint would add a page to
/// every step's transaction for statistics; instance ends and the run's end write them
/// anyway, and `reclaimed` is counted exactly by the claim itself.
const COUNTS_EVERY: Duration = Duration::from_millis(250);

impl RunCtx {
    /// The run's id.
    /// Whether `holder`, a claim's, belongs to another process known to be gone.
    pub(crate) async fn host_gone(&self, holder: &str) -> Result<bool, StoreError> {
        self.live.is_gone(self.store.as_ref(), holder).await
    }

    pub(crate) fn run_id(&self) -> &str {
        &self.fence.run_id
    }

    /// The store's name for the agent's `key`: its namespace, a colon, the key.
    /// Namespaces hold no colon, so the first one splits the two unambiguously.
    pub(crate) fn qualify(&self, key: &str) -> String {
        crate::store::qualified_key(&self.namespace, key)
    }

    /// The counts, if they are due to ride along with the next write to the store.
    pub(crate) fn counts_due(&mut self) -> Option<Counts> {
        let now = Instant::now();
        if now.duration_since(self.counts_flushed) < COUNTS_EVERY {
            return None;
        }
        self.counts_flushed = now;
        Some(self.counts)
    }

    /// The step number crash points and chaos know `key` by (0 when none are set).
    pub(crate) fn ordinal(&mut self, key: &str) -> u32 {
        self.faults.step_of(key)
    }
}

/// The wall-clock deadlines of one instance, shared by its imports (which move them)
/// and its watchdog (which enforces them while the guest computes or waits in WASI).
///
/// - While the instance holds no claim, it may go at most `max_compute` without
///   calling idem, computing or blocked alike.
/// - Each claim it holds must be committed or released within `effect_timeout` of its
///   grant, whatever the guest does meanwhile; the oldest claim sets the deadline.
#[derive(Debug)]
pub(crate) struct Watch {
    max_compute: Duration,
    effect_timeout: Duration,
    state: Mutex<WatchState>,
    /// Wakes the watchdog when a deadline moves.
    moved: tokio::sync::Notify,
}

#[derive(Debug)]
struct WatchState {
    last_call: Instant,
    /// Claims held, with the key (as the agent wrote it) and when each was granted.
    effects: Vec<(u64, String, Instant)>,
    /// The deadline the watchdog sleeps towards, if it sleeps.
    armed: Option<Instant>,
    /// Claims whose commit, release or park is being written: no longer timed, but a
    /// drain or a pause must not cut the write off (its caller would stop waiting for
    /// it, and the claim be retaken in doubt).
    settling: usize,
}

impl Watch {
    pub(crate) fn new(limits: &Limits) -> Watch {
        Watch {
            max_compute: limits.max_compute,
            effect_timeout: limits.effect_timeout,
            state: Mutex::new(WatchState {
                last_call: Instant::now(),
                effects: Vec::new(),
                armed: None,
                settling: 0,
            }),
            moved: tokio::sync::Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, WatchState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The guest called idem: the compute limit runs from now.
    pub(crate) fn touch(&self) {
        let mut state = self.lock();
        state.last_call = Instant::now();
        self.wake_if_sooner(state, false);
    }

    /// A claim was granted: its side effect is timed from now.
    pub(crate) fn effect_started(&self, token: u64, key: &str) {
        let mut state = self.lock();
        state.effects.push((token, key.to_string(), Instant::now()));
        self.wake_if_sooner(state, false);
    }

    /// A claim was settled: it is no longer timed. Tokens count per key, so the key
    /// and the token together name the claim.
    pub(crate) fn effect_ended(&self, token: u64, key: &str) {
        let mut state = self.lock();
        state.effects.retain(|(t, k, _)| !(*t == token && k == key));
        // The last claim settled: a drain waiting for it may go on.
        let drained = state.effects.is_empty();
        self.wake_if_sooner(state, drained);
    }

    /// Wakes the watchdog when its deadline came closer (or `anyway`). A deadline that
    /// moved further needs no wake-up: the watchdog wakes at the old one, looks again
    /// and sleeps on. Waking it at every host call would cost a poll of the instance's
    /// task each time.
    fn wake_if_sooner(&self, state: std::sync::MutexGuard<'_, WatchState>, anyway: bool) {
        let sooner = match state.armed {
            Some(armed) => Self::deadline(&state, self.max_compute, self.effect_timeout).0 < armed,
            None => false,
        };
        drop(state);
        if sooner || anyway {
            self.moved.notify_waiters();
        }
    }

    /// Whether the instance holds a claim: a side effect may be under way, or its
    /// settling be written.
    pub(crate) fn holds_claims(&self) -> bool {
        let state = self.lock();
        !state.effects.is_empty() || state.settling > 0
    }

    /// A claim's settling (commit, release, park) is being written to the store.
    pub(crate) fn settle_started(&self) {
        self.lock().settling += 1;
    }

    /// The settling written (or refused): a drain or pause waiting for it may go on.
    pub(crate) fn settle_ended(&self) {
        let mut state = self.lock();
        state.settling = state.settling.saturating_sub(1);
        let drained = state.effects.is_empty() && state.settling == 0;
        self.wake_if_sooner(state, drained);
    }

    /// Resolves the next time a deadline moves (a host call, a claim granted or
    /// settled) after this call.
    pub(crate) fn moved(&self) -> tokio::sync::futures::Notified<'_> {
        self.moved.notified()
    }

    /// The next deadline and the limit it stands for.
    fn next(&self) -> (Instant, LimitExceeded) {
        Self::deadline(&self.lock(), self.max_compute, self.effect_timeout)
    }

    fn deadline(
        state: &WatchState,
        max_compute: Duration,
        effect_timeout: Duration,
    ) -> (Instant, LimitExceeded) {
        match state.effects.iter().min_by_key(|(_, _, since)| *since) {
            Some((_, key, since)) => (
                since.checked_add(effect_timeout).unwrap_or_else(far_future),
                LimitExceeded::Effect {
                    key: key.clone(),
                    limit: effect_timeout,
                },
            ),
            None => (
                state
                    .last_call
                    .checked_add(max_compute)
                    .unwrap_or_else(far_future),
                LimitExceeded::Compute { limit: max_compute },
            ),
        }
    }

    /// The limit passed at `now`, if any.
    pub(crate) fn check(&self, now: Instant) -> Result<(), LimitExceeded> {
        let (deadline, limit) = self.next();
        if now > deadline { Err(limit) } else { Ok(()) }
    }

    /// Resolves with the limit once one is passed: what ends an instance that waits
    /// in WASI for longer than it may.
    pub(crate) async fn expired(&self) -> LimitExceeded {
        loop {
            let moved = self.moved.notified();
            // Computed and armed under one lock: a change after it sees the armed
            // deadline and wakes the watchdog if it brings it closer.
            let (deadline, limit) = {
                let mut state = self.lock();
                let next = Self::deadline(&state, self.max_compute, self.effect_timeout);
                state.armed = Some(next.0);
                next
            };
            if Instant::now() > deadline {
                return limit;
            }
            tokio::select! {
                () = tokio::time::sleep_until(deadline.into()) => {}
                () = moved => {}
            }
        }
    }
}

/// An instant no deadline reaches: for limits so large they never pass.
fn far_future() -> Instant {
    // About 30 years: large enough to never pass, small enough for every platform's
    // `Instant` arithmetic.
    Instant::now() + Duration::from_secs(30 * 365 * 24 * 3600)
}
