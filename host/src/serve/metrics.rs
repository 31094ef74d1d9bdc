//! `/metrics`: what the store says right now, in the Prometheus text format. Every
//! number is read from the store at scrape time, so any number of servers and workers
//! sharing a store report the same thing and a restart loses nothing.
//!
//! Counters are sums over the runs in the store (they only grow while no run is
//! deleted: `Store::gc` lowers them, which Prometheus reads as a counter reset); gauges
//! are counts now. The durable-step latency is the time from a step's claim to its
//! commit, per committed step; the steps of a completed or cancelled run never change,
//! so theirs are read once and kept.
//!
//! Child runs: `spawns` counts the child runs in the store (each spawned exactly once),
//! `child_runs` gauges them by status, `joins_waiting` gauges the parents suspended in
//! a join, and `joins_ended` counts the joins that got their children or timed out.
//!
//! Model calls: `model_calls` and `model_replays` count, per deployment and model, the
//! calls that recorded their usage (each spent once) and their replays (which made no
//! request); `model_tokens_spent` and `model_tokens_saved` count their tokens by kind
//! (`input`, `output`, `cached`); with a price table, `model_cost_spent` and
//! `model_cost_saved` what those tokens cost.
//!
//! Schedules: `schedule_ticks` counts each schedule's ticks by outcome (`started`,
//! `skipped` for overlap, `missed`, `failed`), kept in the schedule's row since it was
//! created; `schedules` gauges them by state; `schedule_lag_seconds` is how late each
//! active schedule's next tick is (0 while it is not due yet): above a poll, no worker
//! is firing it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::ServeState;
use super::error::ApiError;
use crate::ops::{PricedUsage, Prices};
use crate::store::{
    FlowCounts, Limit, Millis, RateLimit, RunFilter, RunRecord, RunStatus, ScheduleRecord, Store,
    StoreError, UsageFilter,
};

/// Step latencies of runs whose steps cannot change any more, by run.
#[derive(Debug, Default)]
pub(crate) struct SettledSteps {
    by_run: Mutex<HashMap<String, Vec<f64>>>,
}

const STATUSES: [RunStatus; 7] = [
    RunStatus::Queued,
    RunStatus::Running,
    RunStatus::Paused,
    RunStatus::Completed,
    RunStatus::Failed,
    RunStatus::InDoubt,
    RunStatus::Cancelled,
];

/// Whether a worker would take this run now: queued or running, not paused, no live
/// lease, not waiting for a later time or a signal, not being cancelled.
fn ready(run: &RunRecord, now: Millis) -> bool {
    !run.status.is_finished()
        && run.status != RunStatus::Paused
        && !run.cancel_requested
        && run.lease.as_ref().is_none_or(|l| l.expires <= now)
        && run.wake_at.is_none_or(|at| at <= now)
}

/// The metrics, encoded.
pub(crate) async fn render(
    store: &dyn Store,
    settled: &SettledSteps,
    prices: Option<&Prices>,
) -> Result<String, StoreError> {
    let runs = store.runs(&RunFilter::default()).await?;
    let now = store.now().await?;
    let parked = store
        .open_claims(None)
        .await?
        .into_iter()
        .filter(|c| c.parked.is_some())
        .count();

    let mut registry = Registry::with_prefix("idem");
    register_runs(&mut registry, &runs);
    register_counters(&mut registry, &runs);
    register_gauges(&mut registry, &runs, now, parked);
    register_children(&mut registry, store, &runs).await?;
    register_schedules(&mut registry, &store.schedules().await?, now);
    register_flow(&mut registry, store, &runs, now).await?;
    register_rates(&mut registry, &store.rates().await?, now);
    register_step_latency(&mut registry, store, &runs, settled).await?;
    let usage = store.usage(&UsageFilter::default()).await?;
    register_usage(&mut registry, &PricedUsage::of(usage, prices));

    let mut text = String::new();
    // Writing to a String cannot fail.
    let _ = encode(&mut text, &registry);
    Ok(text)
}

/// `runs`: the runs in the store, by status.
fn register_runs(registry: &mut Registry, runs: &[RunRecord]) {
    let by_status = Family::<Vec<(String, String)>, Gauge>::default();
    registry.register("runs", "Runs in the store, by status", by_status.clone());
    for status in STATUSES {
        let n = runs.iter().filter(|r| r.status == status).count();
        by_status
            .get_or_create(&vec![("status".into(), status.as_str().into())])
            .set(n as i64);
    }
}

/// The counters: what the runs in the store did, summed.
fn register_counters(registry: &mut Registry, runs: &[RunRecord]) {
    let sum = |f: fn(&RunRecord) -> u64| runs.iter().map(f).sum::<u64>();
    let counters: [(&str, &str, u64); 6] = [
        (
            "steps_executed",
            "Claims granted: side effects started (reclaimed ones included)",
            sum(|r| r.counts.executed),
        ),
        (
            "steps_skipped",
            "Keys found committed: side effects not run again",
            sum(|r| r.counts.skipped),
        ),
        (
            "steps_awaited",
            "Keys another live holder was executing, whose commit was awaited",
            sum(|r| r.counts.awaited),
        ),
        (
            "steps_reclaimed",
            "Claims retaken from a holder that died before committing",
            sum(|r| r.counts.reclaimed),
        ),
        (
            "instances_created",
            "Instances created for runs",
            sum(|r| r.counts.instances),
        ),
        (
            "instances_recycled",
            "Instances the host dropped on purpose and replaced with a fresh one for the \
             same run",
            sum(|r| r.counts.recycled),
        ),
    ];
    for (name, help, value) in counters {
        let counter = Counter::<u64>::default();
        counter.inc_by(value);
        registry.register(name, help, counter);
    }
}

/// The gauges: parked keys, live leases, and the runs a worker would take now.
fn register_gauges(registry: &mut Registry, runs: &[RunRecord], now: Millis, parked: usize) {
    let gauges: [(&str, &str, usize); 3] = [
        (
            "in_doubt_keys",
            "Keys parked in doubt, waiting for an operator",
            parked,
        ),
        (
            "leases_held",
            "Runs a worker holds a live lease on",
            runs.iter()
                .filter(|r| r.lease.as_ref().is_some_and(|l| l.expires > now))
                .count(),
        ),
        (
            "worker_queue_depth",
            "Runs a worker would take now (queued or running, unleased, due)",
            runs.iter().filter(|r| ready(r, now)).count(),
        ),
    ];
    for (name, help, value) in gauges {
        let gauge = Gauge::<i64>::default();
        gauge.set(value as i64);
        registry.register(name, help, gauge);
    }
}

/// Flow control, per deployment with limits: its limit, its runs holding a live lease,
/// and its due runs the limits hold back now (those a worker would pass over: the
/// lease query's own rule, applied to the runs in the order it leases them).
async fn register_flow(
    registry: &mut Registry,
    store: &dyn Store,
    runs: &[RunRecord],
    now: Millis,
) -> Result<(), StoreError> {
    let limits = store.flows().await?;
    let limit = Family::<Vec<(String, String)>, Gauge>::default();
    let running = Family::<Vec<(String, String)>, Gauge>::default();
    let held = Family::<Vec<(String, String)>, Gauge>::default();
    registry.register(
        "flow_max_running",
        "A deployment's limit on its running runs",
        limit.clone(),
    );
    registry.register(
        "flow_running",
        "Runs of a deployment with limits that hold a live lease",
        running.clone(),
    );
    registry.register(
        "flow_held_back",
        "Due runs of a deployment that its limits (in all or per key) hold back now",
        held.clone(),
    );
    let mut counts = FlowCounts::default();
    for l in &limits {
        counts.limits.insert(
            l.deployment.clone(),
            Limit {
                max_running: l.max_running.map(u64::from),
                per_key: l.per_key.map(u64::from),
            },
        );
    }
    let live = |r: &RunRecord| r.lease.as_ref().is_some_and(|l| l.expires > now);
    for run in runs.iter().filter(|r| live(r)) {
        counts.count(&run.agent, run.flow_key.as_deref());
    }
    let mut ready_runs: Vec<&RunRecord> = runs
        .iter()
        .filter(|r| counts.limits.contains_key(&r.agent) && ready(r, now))
        .collect();
    ready_runs.sort_by_key(|r| {
        (
            std::cmp::Reverse(r.priority),
            r.wake_at.unwrap_or(r.created),
        )
    });
    let mut held_by: HashMap<&str, i64> = HashMap::new();
    for run in ready_runs {
        if counts.saturated(&run.agent, run.flow_key.as_deref()) {
            *held_by.entry(run.agent.as_str()).or_default() += 1;
        } else {
            counts.admit(&run.agent, run.flow_key.as_deref());
        }
    }
    for l in &limits {
        let label = vec![("deployment".to_string(), l.deployment.clone())];
        if let Some(max) = l.max_running {
            limit.get_or_create(&label).set(i64::from(max));
        }
        let live_runs = runs
            .iter()
            .filter(|r| r.agent == l.deployment && live(r))
            .count();
        running.get_or_create(&label).set(live_runs as i64);
        held.get_or_create(&label)
            .set(held_by.get(l.deployment.as_str()).copied().unwrap_or(0));
    }
    Ok(())
}

/// Rate limits, per class: its limit, and how far ahead of now its tokens are
/// reserved (0 when one is free now): steps that wait for a token wait that long.
fn register_rates(registry: &mut Registry, limits: &[RateLimit], now: Millis) {
    let per_second = Family::<Vec<(String, String)>, Gauge<f64, AtomicU64>>::default();
    let backlog = Family::<Vec<(String, String)>, Gauge<f64, AtomicU64>>::default();
    registry.register(
        "rate_limit_per_second",
        "A class of steps' rate limit, in tokens per second",
        per_second.clone(),
    );
    registry.register(
        "rate_reserved_ahead_seconds",
        "How far ahead of now a class's tokens are reserved by waiting steps",
        backlog.clone(),
    );
    for l in limits {
        let label = vec![("class".to_string(), l.class.clone())];
        per_second
            .get_or_create(&label)
            .set(f64::from(l.limit) * 1000.0 / l.period_ms.max(1) as f64);
        let ahead = l.next_free.map_or(0, |at| at.saturating_sub(now).max(0));
        backlog.get_or_create(&label).set(ahead as f64 / 1000.0);
    }
}

/// Spawns and joins: the child runs by status, the parents waiting in a join, and the
/// joins that ended, read from the waits of each run that has children.
async fn register_children(
    registry: &mut Registry,
    store: &dyn Store,
    runs: &[RunRecord],
) -> Result<(), StoreError> {
    let spawns = Counter::<u64>::default();
    spawns.inc_by(runs.iter().filter(|r| r.parent.is_some()).count() as u64);
    registry.register(
        "spawns",
        "Child runs spawned (each once, however often its parent replayed the spawn)",
        spawns,
    );
    let by_status = Family::<Vec<(String, String)>, Gauge>::default();
    registry.register(
        "child_runs",
        "Child runs in the store, by status",
        by_status.clone(),
    );
    for status in STATUSES {
        let n = runs
            .iter()
            .filter(|r| r.parent.is_some() && r.status == status)
            .count();
        by_status
            .get_or_create(&vec![("status".into(), status.as_str().into())])
            .set(n as i64);
    }
    let waiting = Gauge::<i64>::default();
    waiting.set(
        runs.iter()
            .filter(|r| r.joining.is_some() && !r.status.is_finished())
            .count() as i64,
    );
    registry.register(
        "joins_waiting",
        "Runs suspended in a join, waiting for their children",
        waiting,
    );
    let parents: std::collections::BTreeSet<&str> =
        runs.iter().filter_map(|r| r.parent.as_deref()).collect();
    let (mut joined, mut timed_out) = (0u64, 0u64);
    for parent in parents {
        for wait in store.waits(parent).await? {
            match (wait.join.is_some(), wait.outcome.as_deref()) {
                // A join that got its children is stored as received.
                (true, Some("received")) => joined += 1,
                (true, Some("timed-out")) => timed_out += 1,
                _ => {}
            }
        }
    }
    let ended = Family::<Vec<(String, String)>, Counter>::default();
    registry.register(
        "joins_ended",
        "Joins that ended: got their children (joined) or timed out",
        ended.clone(),
    );
    for (outcome, n) in [("joined", joined), ("timed-out", timed_out)] {
        ended
            .get_or_create(&vec![("outcome".into(), outcome.into())])
            .inc_by(n);
    }
    Ok(())
}

/// `durable_step_seconds`: the time from each committed step's claim to its commit. The
/// steps of a settled run are read once and kept in `settled`.
async fn register_step_latency(
    registry: &mut Registry,
    store: &dyn Store,
    runs: &[RunRecord],
    settled: &SettledSteps,
) -> Result<(), StoreError> {
    let latency = Histogram::new(exponential_buckets(0.001, 2.0, 16));
    registry.register(
        "durable_step_seconds",
        "Time from a step's claim to its commit",
        latency.clone(),
    );
    for run in runs {
        let settled_run = matches!(run.status, RunStatus::Completed | RunStatus::Cancelled);
        if settled_run {
            let cached = settled
                .by_run
                .lock()
                .ok()
                .and_then(|m| m.get(&run.run_id).cloned());
            if let Some(seconds) = cached {
                seconds.iter().for_each(|s| latency.observe(*s));
                continue;
            }
        }
        let seconds: Vec<f64> = store
            .steps(&run.run_id)
            .await?
            .iter()
            .filter_map(|s| {
                s.committed_at
                    .map(|at| at.saturating_sub(s.claimed_at).max(0))
            })
            .map(|ms| ms as f64 / 1000.0)
            .collect();
        seconds.iter().for_each(|s| latency.observe(*s));
        if settled_run && let Ok(mut m) = settled.by_run.lock() {
            m.insert(run.run_id.clone(), seconds);
        }
    }
    Ok(())
}

pub(super) async fn serve(State(state): State<ServeState>) -> Response {
    match render(
        state.store.as_ref(),
        &state.settled,
        state.prices.as_deref(),
    )
    .await
    {
        Ok(text) => (
            [(
                CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}

/// Model calls per deployment and model: calls and replays, tokens spent and saved by
/// kind, and their cost where priced.
fn register_usage(registry: &mut Registry, usage: &[PricedUsage]) {
    type Labels = Vec<(String, String)>;
    let calls = Family::<Labels, Counter>::default();
    let replays = Family::<Labels, Counter>::default();
    let spent = Family::<Labels, Counter>::default();
    let saved = Family::<Labels, Counter>::default();
    let spent_cost = Family::<Labels, Counter<f64, AtomicU64>>::default();
    let saved_cost = Family::<Labels, Counter<f64, AtomicU64>>::default();
    for u in usage {
        let t = &u.total;
        let who = vec![
            ("deployment".to_string(), t.deployment.clone()),
            ("model".to_string(), t.model.clone()),
        ];
        calls.get_or_create(&who).inc_by(t.calls);
        replays.get_or_create(&who).inc_by(t.replays);
        for (family, tokens) in [(&spent, t.spent), (&saved, t.saved)] {
            for (kind, n) in tokens.kinds() {
                let mut labels = who.clone();
                labels.push(("kind".to_string(), kind.to_string()));
                family.get_or_create(&labels).inc_by(n);
            }
        }
        for (family, cost) in [(&spent_cost, u.spent_cost), (&saved_cost, u.saved_cost)] {
            if let Some(cost) = cost {
                family.get_or_create(&who).inc_by(cost);
            }
        }
    }
    registry.register(
        "model_calls",
        "Model calls that recorded their token usage, each spent once",
        calls,
    );
    registry.register(
        "model_replays",
        "Replays of recorded model calls: answered from the store, no request made",
        replays,
    );
    registry.register(
        "model_tokens_spent",
        "Tokens of model calls, by kind (input, output, cached), counted once per call",
        spent,
    );
    registry.register(
        "model_tokens_saved",
        "Tokens replays did not spend again, by kind (input, output, cached)",
        saved,
    );
    if usage.iter().any(|u| u.spent_cost.is_some()) {
        registry.register(
            "model_cost_spent",
            "What the spent tokens cost, by the server's price table",
            spent_cost,
        );
        registry.register(
            "model_cost_saved",
            "What replays saved, by the server's price table",
            saved_cost,
        );
    }
}

/// Schedules: ticks by outcome, schedules by state, and how late each one's next tick
/// is.
fn register_schedules(registry: &mut Registry, schedules: &[ScheduleRecord], now: Millis) {
    let ticks = Family::<Vec<(String, String)>, Counter>::default();
    registry.register(
        "schedule_ticks",
        "A schedule's ticks, by outcome: started a run, skipped (the previous run still \
         going), missed (no worker fired it and it was not caught up), failed",
        ticks.clone(),
    );
    let lag = Family::<Vec<(String, String)>, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
    registry.register(
        "schedule_lag_seconds",
        "How late an active schedule's next tick is (0 until it is due)",
        lag.clone(),
    );
    let by_state = Family::<Vec<(String, String)>, Gauge>::default();
    registry.register("schedules", "Schedules, by state", by_state.clone());
    let (mut active, mut paused) = (0, 0);
    for s in schedules {
        let t = &s.ticks;
        for (outcome, n) in [
            ("started", t.started),
            ("skipped", t.skipped),
            ("missed", t.missed),
            ("failed", t.failed),
        ] {
            ticks
                .get_or_create(&vec![
                    ("schedule".into(), s.name.clone()),
                    ("outcome".into(), outcome.into()),
                ])
                .inc_by(n);
        }
        if s.paused {
            paused += 1;
        } else {
            active += 1;
            let late = s.next_tick.map_or(0, |t| now.saturating_sub(t).max(0));
            lag.get_or_create(&vec![("schedule".into(), s.name.clone())])
                .set(late as f64 / 1000.0);
        }
    }
    for (state, n) in [("active", active), ("paused", paused)] {
        by_state
            .get_or_create(&vec![("state".into(), state.into())])
            .set(n);
    }
}
