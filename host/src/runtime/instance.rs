//! One instance of a run: a fresh wasmtime `Store`, the call of `run`, and the
//! watchdog that ends it when a time limit passes or a stop signal comes while the
//! guest computes or waits in WASI (host calls check for themselves). The store is
//! dropped afterwards, never reused, traps included.

use std::sync::Arc;
use std::time::Duration;

use wasmtime::Store as WasmStore;
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

use super::Host;
use super::authority::Authority;
use super::end::{FuelState, InstanceEnd};
use super::engine::LoadedAgent;
use super::error::HostError;
use super::http::HttpGate;
use super::live_text::{LIVE_FLUSH, LiveSink};
use super::output::{GuestOutput, LOG_KEEP, LogSink};
use super::run_ctx::{RunCtx, Watch};
use super::state::InstanceState;
use super::stop::{RunSignals, Stop};
use super::view::IdemCtx;
use crate::store::{ClaimRef, LIVE_KEEP, RunFence, StoreError};
use crate::text;

/// How often a running instance's log is moved to the store.
const LOG_FLUSH: Duration = Duration::from_secs(1);

impl Host {
    /// Creates one instance for `run`, calls `run` on it, and drops it. Returns why it
    /// ended and the run context, taken back out of the dropped store.
    pub(crate) async fn instance(
        &self,
        agent: &LoadedAgent,
        authority: &Authority,
        input: &[u8],
        mut run: RunCtx,
    ) -> Result<(InstanceEnd, RunCtx), HostError> {
        let generation = run.counts.instances;
        run.counts.instances += 1;
        // Durable before the instance runs: its claims' counts are written with them,
        // a process killed now still shows the instance it had started, and the counts
        // of the instance dropped before it (if any) are written too. The first
        // instance of a lease whose grant counted it finds them written already.
        let recycled = run.recycled.take();
        if !std::mem::take(&mut run.instance_counted) {
            // With the start on the run's timeline, in the same transaction.
            match self
                .store
                .start_instance(&run.fence, &run.counts, recycled.as_deref())
                .await
            {
                Ok(()) => {}
                Err(StoreError::LeaseLost { .. }) => {
                    return Ok((InstanceEnd::Stopped(Stop::LeaseLost), run));
                }
                Err(e) => return Err(e.into()),
            }
        }
        let holder = self.live.holder(run.run_id(), generation);
        let chaos_fuel = run.faults.fuel_budget().unwrap_or(u64::MAX);
        let fuel = chaos_fuel.min(run.fuel_left.unwrap_or(u64::MAX));
        let watched = Watched {
            watch: Arc::new(Watch::new(&run.limits)),
            signals: Arc::clone(&run.signals),
            fence: run.fence.clone(),
            log: run.log.clone(),
            live_text: run.live_text.clone(),
        };
        let idem = IdemCtx {
            gate: HttpGate::new(run.run_id(), &authority.http, run.capture.clone()),
            run,
            generation,
            holder: holder.clone(),
            grants: 0,
            held: Vec::new(),
            watch: Arc::clone(&watched.watch),
        };
        // Taken before the store and given back after it is dropped (the end of this
        // function): the pool never has more instances than slots.
        let _slot = self.runtime.slot().await;
        let mut store = self.instance_store(authority, idem, fuel)?;
        self.live.enter(&holder);
        let result = self.watch_call(agent, &mut store, input, &watched).await;
        self.live.leave(&holder);
        self.end_orphaned_claims(&holder).await;
        let burnt = fuel.saturating_sub(store.get_fuel().unwrap_or(0));
        // The store (and with it the instance and every claim handle it held) is gone
        // here; only the run's own context goes on.
        Ok(ended(store.into_data().idem, result, burnt))
    }

    /// A fresh wasmtime store for one instance, held to the run's memory limit, its
    /// fuel and its wall-clock limits.
    fn instance_store(
        &self,
        authority: &Authority,
        idem: IdemCtx,
        fuel: u64,
    ) -> Result<WasmStore<InstanceState>, HostError> {
        let wasi = wasi_ctx(authority, &idem.run.log)?;
        let mut store = WasmStore::new(self.runtime.engine(), InstanceState::new(wasi, idem));
        store.limiter(|state| state as &mut dyn wasmtime::ResourceLimiter);
        store
            .set_fuel(fuel)
            .map_err(|e| HostError::Engine(format!("{e:#}")))?;
        // Every epoch tick while wasm runs: check the wall-clock limits, and let the
        // executor's other tasks (other runs, the watchdog) have the thread.
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|ctx| match ctx.data().idem.check_time() {
            Ok(()) => Ok(wasmtime::UpdateDeadline::Yield(1)),
            Err(limit) => Err(wasmtime::Error::new(limit)),
        });
        Ok(store)
    }

    /// Calls `run` on the instance under its watchdog: a passed deadline or a stop
    /// signal ends the call; the run's log and live text reach the store while it runs
    /// (the live text [`LIVE_FLUSH`] after some is published, and only then).
    async fn watch_call(
        &self,
        agent: &LoadedAgent,
        store: &mut WasmStore<InstanceState>,
        input: &[u8],
        watched: &Watched,
    ) -> wasmtime::Result<Result<Vec<u8>, String>> {
        let Watched {
            watch,
            signals,
            fence,
            log,
            live_text,
        } = watched;
        let call = call_run(agent, store, input);
        tokio::pin!(call);
        // First due a whole period from now: an interval's immediate first tick still
        // waits for the timer driver's next millisecond, once per instance.
        let mut flush =
            tokio::time::interval_at(tokio::time::Instant::now() + LOG_FLUSH, LOG_FLUSH);
        // Armed by the first text published since the last flush; an agent that never
        // publishes never wakes it.
        let live_due = tokio::time::sleep(LOG_FLUSH);
        tokio::pin!(live_due);
        let mut armed = false;
        loop {
            tokio::select! {
                result = &mut call => return result,
                limit = watch.expired() => return Err(wasmtime::Error::new(limit)),
                stop = stopped(signals, watch) => return Err(wasmtime::Error::new(stop)),
                () = live_text.published(), if !armed => {
                    armed = true;
                    live_due.as_mut().reset(tokio::time::Instant::now() + LIVE_FLUSH);
                }
                () = &mut live_due, if armed => {
                    armed = false;
                    self.flush_live(fence, live_text).await;
                }
                _ = flush.tick() => {
                    // A long instance's log reaches the store while it runs, not only
                    // when it ends.
                    let pending = log.take();
                    if !pending.is_empty()
                        && let Err(e) = self.store.append_log(fence, &pending, LOG_KEEP).await
                    {
                        tracing::warn!(error = %e, "cannot write the run's log");
                    }
                }
            }
        }
    }

    /// Moves the text published since the last flush to the run's live stream.
    pub(super) async fn flush_live(&self, fence: &RunFence, live_text: &LiveSink) {
        let pending = live_text.take();
        if pending.is_empty() {
            return;
        }
        if let Err(e) = self.store.append_live(fence, &pending, LIVE_KEEP).await {
            tracing::warn!(error = %e, "cannot write the run's live stream");
        }
    }

    /// The host knows the claims of a dropped instance's holder are no longer held: ends
    /// their leases now, so that whoever runs next (this process or another) retakes
    /// them without waiting. They stay claims: whether their effects ran is still in
    /// doubt.
    async fn end_orphaned_claims(&self, holder: &str) {
        let orphans = self.heartbeat.forget(holder);
        if orphans.is_empty() {
            return;
        }
        let refs: Vec<ClaimRef<'_>> = orphans
            .iter()
            .map(|(key, token, fence)| ClaimRef {
                key,
                token: *token,
                fence,
            })
            .collect();
        if let Err(e) = self.store.renew(&refs, Duration::ZERO).await {
            tracing::warn!(error = %e, "cannot end the leases of a dropped instance's claims");
        }
    }
}

/// What the watchdog of one instance watches, and where its log goes meanwhile.
struct Watched {
    watch: Arc<Watch>,
    signals: Arc<RunSignals>,
    fence: RunFence,
    log: LogSink,
    live_text: LiveSink,
}

/// Why the instance ended, and the run's context taken back out of it, the fuel it
/// burnt (`burnt`) taken off the run's.
fn ended(
    idem: IdemCtx,
    result: wasmtime::Result<Result<Vec<u8>, String>>,
    burnt: u64,
) -> (InstanceEnd, RunCtx) {
    let IdemCtx { mut run, held, .. } = idem;
    if let Some(left) = &mut run.fuel_left {
        *left = left.saturating_sub(burnt);
    }
    let end = InstanceEnd::classify(
        result,
        FuelState {
            run_budget_spent: run.fuel_left == Some(0),
            limit: run.limits.max_fuel,
            chaos: run.faults.chaos(),
        },
    );
    let end = match end {
        InstanceEnd::Returned(_) if !held.is_empty() => {
            let prefix = format!("{}:", run.namespace);
            InstanceEnd::ClaimsLeftOpen(
                held.into_iter()
                    .map(|(key, _)| key.strip_prefix(&prefix).unwrap_or(&key).to_string())
                    .collect(),
            )
        }
        end => end,
    };
    (end, run)
}

/// Instantiates the agent and calls its `run`.
async fn call_run(
    agent: &LoadedAgent,
    store: &mut WasmStore<InstanceState>,
    input: &[u8],
) -> wasmtime::Result<Result<Vec<u8>, String>> {
    let instance = agent.pre.instantiate_async(&mut *store).await?;
    instance.call_run(&mut *store, input).await
}

/// Resolves with the stop signal that must end the instance from outside: any but a
/// drain or a pause at once, those once the instance holds no claim (a side effect in flight
/// ends at its own commit or release).
async fn stopped(signals: &RunSignals, watch: &Watch) -> Stop {
    loop {
        let changed = signals.changed();
        let moved = watch.moved();
        match signals.stop() {
            Some(Stop::Drain | Stop::Pause) if watch.holds_claims() => {}
            Some(stop) => return stop,
            None => {}
        }
        tokio::select! {
            () = changed => {}
            () = moved => {}
        }
    }
}

/// WASI for one instance: no ambient authority — only the granted directories and
/// environment, no network sockets, no stdin; stderr and stdout go to the run's log.
pub(crate) fn wasi_ctx(
    authority: &Authority,
    log: &LogSink,
) -> Result<wasmtime_wasi::WasiCtx, HostError> {
    let mut builder = WasiCtxBuilder::new();
    builder.stderr(GuestOutput(log.clone()));
    builder.stdout(GuestOutput(log.clone()));
    for (k, v) in &authority.env {
        builder.env(k, v);
    }
    for dir in &authority.dirs {
        builder
            .preopened_dir(&dir.host, &dir.guest, FsPerms::ReadWrite)
            .map_err(|e| HostError::Grant {
                host: dir.host.clone(),
                guest: text::escape(&dir.guest, false).into_owned(),
                reason: format!("{e:#}"),
            })?;
    }
    Ok(builder.build())
}
