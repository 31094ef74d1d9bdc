//! `idem show`: one run — its status and outcome, the worker lease on it, its parent
//! and children, the schedule that started it, the token usage of its model calls, its
//! steps (committed ones in the order committed, then open claims), its waits and
//! joins, and its open claims; with `--events`, its timeline; with `--steps`, its step history (each committed step,
//! numbered as `idem fork --at` takes them, and the checkpoint saved with it); with
//! `--step KEY`, one step opened.

use clap::Parser;
use idem::ops::{ChildCounts, PricedUsage, RunView, StepView};
use idem::store::{
    ChildRecord, Millis, OpenClaim, RunHistory, RunRecord, ScheduledBy, StepRecord, Timeline,
    WaitRecord,
};

use super::args::{DbArgs, PricesArgs};
use super::display;
use crate::exit::Exit;

#[derive(Debug, Parser)]
pub struct ShowCommand {
    /// The run.
    run_id: String,
    #[command(flatten)]
    db: DbArgs,
    #[command(flatten)]
    prices: PricesArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
    /// Also print the run's timeline: each instance started and how it ended, with its
    /// worker and lease token, takeovers of leases that expired, waits, signals,
    /// pauses and upgrades (in JSON, as `timeline`).
    #[arg(long)]
    events: bool,
    /// Also print the run's step history: its committed steps in order, numbered as
    /// `idem fork --at` takes them, each with the checkpoint saved with it (in JSON, as
    /// `history`).
    #[arg(long)]
    steps: bool,
    /// Open one step instead (its key as listed under `steps`, as the agent named it,
    /// or its number in `--steps`): its committed result, its attempts, the instance
    /// that claimed it, and the checkpoint saved with it.
    #[arg(long, value_name = "KEY", conflicts_with_all = ["events", "steps"])]
    step: Option<String>,
}

impl ShowCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        let prices = self.prices.load()?;
        let store = self.db.open_read_only().await?;
        if let Some(key) = &self.step {
            let step = idem::ops::step_view(store.as_ref(), &self.run_id, key).await?;
            if self.json {
                println!("{}", display::json(&serde_json::to_value(&step)?));
            } else {
                print_step(&step);
            }
            return Ok(Exit::Done);
        }
        let mut view = RunView::of(store.as_ref(), &self.run_id).await?;
        let timeline = if self.events {
            Some(idem::ops::timeline(store.as_ref(), &self.run_id).await?)
        } else {
            None
        };
        let history = if self.steps {
            Some(idem::ops::history(store.as_ref(), &self.run_id).await?)
        } else {
            None
        };
        if let Some(prices) = &prices {
            view = view.priced(prices);
        }
        if self.json {
            let mut value = serde_json::to_value(&view)?;
            if let (Some(timeline), Some(object)) = (&timeline, value.as_object_mut()) {
                object.insert("timeline".into(), serde_json::to_value(timeline)?);
            }
            if let (Some(history), Some(object)) = (&history, value.as_object_mut()) {
                object.insert("history".into(), serde_json::to_value(history)?);
            }
            println!("{}", display::json(&value));
            return Ok(Exit::Done);
        }
        print_run(&view.run, view.schedule.as_ref(), view.now);
        print_moves(&view.moves, view.now);
        print_children(&view.run.run_id, &view.children, &view.children_count);
        print_usage(&view.usage);
        print_steps(&view.steps);
        print_waits(&view.waits, view.now);
        print_claims(&view.open_claims, view.now);
        if let Some(history) = &history {
            print_history(history);
        }
        if let Some(timeline) = &timeline {
            print_timeline(timeline, view.run.created);
        }
        Ok(Exit::Done)
    }
}

/// The run's committed steps in order, each with the checkpoints saved after it and
/// before the next (a fork at the next step starts from the last of them).
fn print_history(history: &RunHistory) {
    let collected = if history.collected {
        ", older checkpoints collected"
    } else {
        ""
    };
    println!(
        "step history ({} steps, {} checkpoints kept{collected}):",
        history.steps.len(),
        history.checkpoints.len()
    );
    if let Some((from, at)) = &history.forked_from {
        println!("  forked from {} at step {at}", display::name(from));
    }
    let checkpoints_after = |n: u64| history.checkpoints.iter().filter(move |c| c.after == n);
    for c in checkpoints_after(0) {
        println!(
            "  {:>5}  checkpoint at step {} ({} bytes)",
            "", c.step, c.bytes
        );
    }
    for step in &history.steps {
        println!(
            "  {:>5}  {}  attempt {}  token {}  committed {}",
            step.n,
            display::name(&step.key),
            step.attempt,
            step.token,
            display::utc(step.committed_at)
        );
        for c in checkpoints_after(step.n) {
            println!(
                "  {:>5}  checkpoint at step {} ({} bytes)",
                "", c.step, c.bytes
            );
        }
    }
}

/// Its moves between versions, oldest first.
fn print_moves(moves: &[idem::store::RunMove], now: Millis) {
    for m in moves {
        println!(
            "moved     {} ago: {}",
            display::age(now, m.at),
            super::versions::move_line(m)
        );
    }
}

/// The run's timeline, one event a line, each at its time since the run was created.
fn print_timeline(timeline: &Timeline, created: Millis) {
    let dropped = match timeline.dropped {
        0 => String::new(),
        n => format!(", {n} dropped between the first and the last kept"),
    };
    println!("timeline ({} events{dropped}):", timeline.events.len());
    for event in &timeline.events {
        let since = event.at.saturating_sub(created).max(0);
        println!(
            "  {:>5}  +{}.{:03}s  {}",
            event.seq,
            since / 1000,
            since % 1000,
            display::name(&event.summary())
        );
    }
}

/// One step, opened.
fn print_step(view: &StepView) {
    let step = &view.step;
    println!("run        {}", display::name(&view.run_id));
    println!("step       {}", display::name(&step.key));
    let retaken = if view.retaken {
        " (retaken from a holder that never committed it: its side effect may have run before)"
    } else {
        ""
    };
    println!("attempt    {}{retaken}", step.attempt);
    println!("token      {}", step.token);
    println!("claimed    {}", display::utc(step.claimed_at));
    if let Some(event) = &view.claimed_in {
        println!("  in       {}", display::name(&event.summary()));
    }
    match (&step.committed_at, &step.parked, &step.holder) {
        (Some(at), _, _) => println!(
            "committed  {} ({}ms after its claim)",
            display::utc(*at),
            at.saturating_sub(step.claimed_at).max(0)
        ),
        (None, Some(reason), _) => println!("parked     in doubt: {}", display::name(reason)),
        (None, None, Some(holder)) => println!("claimed by {}", display::name(holder)),
        (None, None, None) => println!("released   (not committed)"),
    }
    match (&view.result, view.result_bytes) {
        (Some(result), Some(bytes)) => {
            println!("result     ({bytes} bytes) {}", display::json(result));
        }
        _ => println!("result     none"),
    }
    if let Some(n) = view.n {
        println!("number     {n} (of the run's committed steps: `idem fork --at {n}`)");
    }
    match &view.checkpoint {
        Some(checkpoint) => println!(
            "checkpoint saved with it at step {} ({} bytes) {}",
            checkpoint.step,
            checkpoint.bytes,
            display::json(&checkpoint.state)
        ),
        None => println!("checkpoint none saved with it"),
    }
}

/// The run itself: its status, agent, lease, outcome and counts.
fn print_run(run: &RunRecord, schedule: Option<&ScheduledBy>, now: Millis) {
    println!("run       {}", display::name(&run.run_id));
    match display::waiting(run, now) {
        Some(waiting) => println!("status    {} ({waiting})", run.status),
        None => println!("status    {}", run.status),
    }
    match run.version {
        Some(version) => println!(
            "agent     {} version {version} ({})",
            display::name(&run.agent),
            run.digest
        ),
        None => println!("agent     {} ({})", display::name(&run.agent), run.digest),
    }
    println!("namespace {}", display::name(&run.namespace));
    if run.priority > 0 {
        println!("priority  {}", run.priority);
    }
    if let Some(key) = &run.flow_key {
        println!("flow key  {}", display::name(key));
    }
    if let Some(parent) = &run.parent {
        let key = run.spawn_key.as_deref().unwrap_or_default();
        let detached = if run.detached { ", detached" } else { "" };
        println!(
            "parent    {} (spawned under key {}{detached})",
            display::name(parent),
            display::name(key)
        );
    }
    if let Some(by) = schedule {
        println!(
            "schedule  {} (tick {})",
            display::name(&by.schedule),
            display::utc(by.tick)
        );
    }
    println!("created   {} ago", display::age(now, run.created));
    match &run.lease {
        Some(lease) if lease.expires > now => println!(
            "lease     worker {} token {} expires {}",
            display::name(&lease.worker),
            lease.token,
            display::until(now, lease.expires)
        ),
        Some(lease) => println!(
            "lease     none live (worker {} token {} expired {})",
            display::name(&lease.worker),
            lease.token,
            display::until(now, lease.expires)
        ),
        None => println!("lease     none"),
    }
    if run.cancel_requested {
        println!("cancel    requested");
    }
    if let Some(by) = run.paused_by {
        let how = match by {
            idem::store::PausedBy::Run => "by an operator (idem resume RUN continues it)",
            idem::store::PausedBy::Deployment => {
                "with its deployment (idem resume --deployment NAME, or idem resume RUN)"
            }
        };
        let stopping = match &run.lease {
            Some(lease) if lease.expires > now => {
                "; its worker stops it at its next host call and gives the lease back"
            }
            _ => "",
        };
        println!("paused    {how}{stopping}");
    }
    if let Some(note) = &run.note {
        println!("note      {}", display::name(note));
    }
    if let Some(outcome) = &run.outcome {
        let label = if run.status == idem::store::RunStatus::Completed {
            "output"
        } else {
            "error"
        };
        println!("{label:<9} {}", display::payload(outcome));
    }
    let c = &run.counts;
    println!(
        "counts    executed {}  skipped {}  awaited {}  reclaimed {}  instances {}",
        c.executed, c.skipped, c.awaited, c.reclaimed, c.instances
    );
}

/// Its children, if it spawned any: the count per status, then each child (up to
/// [`RunView::CHILDREN_SHOWN`], oldest first) with its key and status.
fn print_children(run_id: &str, children: &[ChildRecord], counts: &ChildCounts) {
    if counts.total == 0 {
        return;
    }
    let per_status: Vec<String> = counts
        .by_status
        .iter()
        .map(|(status, n)| format!("{n} {status}"))
        .collect();
    println!("children ({}): {}", counts.total, per_status.join(", "));
    for child in children {
        println!(
            "  {}  {}  {}  {}",
            display::name(&child.key),
            child.status,
            display::name(&child.run_id),
            display::name(&child.agent)
        );
    }
    let left = counts.total.saturating_sub(children.len() as u64);
    if left > 0 {
        println!(
            "  ... and {left} more: idem ls --parent {}",
            display::name(run_id)
        );
    }
}

/// The token usage of its model calls, per model, if it recorded any.
fn print_usage(usage: &[PricedUsage]) {
    if usage.is_empty() {
        return;
    }
    println!("model usage:");
    for line in display::usage_lines(usage, false) {
        println!("  {line}");
    }
}

/// Its steps: the committed ones in the order committed, then its open claims.
fn print_steps(steps: &[StepRecord]) {
    println!("steps ({}):", steps.len());
    for step in steps {
        let outcome = match (&step.committed_at, &step.parked, &step.holder) {
            (Some(at), _, _) => format!(
                "committed in {}ms",
                at.saturating_sub(step.claimed_at).max(0)
            ),
            (None, Some(reason), _) => format!("parked in doubt: {}", display::name(reason)),
            (None, None, Some(holder)) => format!("claimed by {}", display::name(holder)),
            (None, None, None) => "released".to_string(),
        };
        let retake = if step.attempt > 1 { " (retaken)" } else { "" };
        println!(
            "  {}  attempt {}{retake}  token {}  {}",
            display::name(&step.key),
            step.attempt,
            step.token,
            outcome
        );
    }
}

/// Its sleeps, signal waits, joins and rate tokens, if any.
fn print_waits(waits: &[WaitRecord], now: Millis) {
    if !waits.is_empty() {
        println!("waits ({}):", waits.len());
        for wait in waits {
            let what = match (&wait.signal, &wait.join) {
                (Some(signal), _) => format!("signal {}", display::name(signal)),
                (None, Some(mode)) => format!(
                    "join {} of {} children",
                    display::name(mode),
                    wait.join_children.unwrap_or_default()
                ),
                (None, None) => match &wait.rate {
                    Some(class) => format!("token of rate class {}", display::name(class)),
                    None => "sleep".to_string(),
                },
            };
            let due = wait.due.map_or_else(
                || "no timeout".to_string(),
                |due| format!("due {}", display::utc(due)),
            );
            let state = match (&wait.outcome, wait.settled) {
                // A join that got its children is stored as received.
                (Some(outcome), Some(at)) if wait.join.is_some() && outcome == "received" => {
                    format!("joined at {}", display::utc(at))
                }
                (Some(outcome), Some(at)) => format!("{outcome} at {}", display::utc(at)),
                _ if wait.signal.is_none()
                    && wait.join.is_none()
                    && wait.due.is_some_and(|d| d <= now) =>
                {
                    if wait.rate.is_some() {
                        "taken"
                    } else {
                        "elapsed"
                    }
                    .to_string()
                }
                _ => "pending".to_string(),
            };
            println!("  {}  {what}  {due}  {state}", display::name(&wait.key));
        }
    }
}

/// Its claims not committed yet, if any.
fn print_claims(claims: &[OpenClaim], now: Millis) {
    if !claims.is_empty() {
        println!("open claims ({}):", claims.len());
        for c in claims {
            println!(
                "  {}  attempt {}  token {}  lease expires {}",
                display::name(&c.key),
                c.attempt,
                c.token,
                display::until(now, c.lease_expires)
            );
        }
    }
}
