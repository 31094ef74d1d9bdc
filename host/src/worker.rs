//! A worker: leases runs from the store's queue and drives them, many at once on one
//! tokio runtime, until it is told to shut down; then it drains — takes no new runs,
//! lets side effects in flight end, gives every lease back — and returns.
//!
//! Runs whose worker died are taken over by any worker once their lease expires, and
//! resumed exactly as a recycled run is. A worker that cannot provide what a run needs
//! (a granted directory it does not have) gives the run back with a note saying why,
//! and leaves it to others for a while.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use crate::runtime::{
    Authority, FaultPlan, Host, HostError, LoadedAgent, LogSink, Protected, RunReport, RunSignals,
    Stop, check_grants,
};
use crate::store::{Acquired, Counts, LeasedRun, RunFence, StoreError, TickOutcome};
use crate::text;

/// How often a busy worker looks for holders that are gone (an idle one looks at each
/// poll).
const LOOK_FOR_GONE: Duration = Duration::from_millis(50);

/// A worker leases again once this fraction of its runs (1/8) has ended, or at its
/// next poll.
const LEASE_BATCH_OF: usize = 8;

/// Most schedules one worker fires in one transaction; more due wait for its next
/// look (at once, since firing found work).
const FIRE_AT_ONCE: usize = 64;

/// How a worker works.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Most runs driven at once.
    pub concurrency: usize,
    /// The lease a run is taken with (its own limits set the lease it is renewed with).
    pub lease: Duration,
    /// How often an idle worker looks for runs.
    pub poll: Duration,
    /// How long a drain waits for side effects in flight before it ends their instances
    /// (their claims are then retaken in doubt).
    pub drain_timeout: Duration,
    /// How long a run this worker could not serve is left to other workers.
    pub skip_for: Duration,
    /// What no run's directory grant may expose on this worker: its store, its cache.
    pub protected: Vec<Protected>,
    /// Drive only the descendants of this run (its children, theirs, ...), as `idem
    /// run` does for the children of the run it drives while that run waits on them.
    /// `None`: any run that is due.
    pub only_under: Option<String>,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        WorkerOptions {
            concurrency: 64,
            lease: Duration::from_secs(30),
            poll: Duration::from_millis(200),
            drain_timeout: Duration::from_secs(30),
            skip_for: Duration::from_secs(60),
            protected: Vec::new(),
            only_under: None,
        }
    }
}

/// What a worker did, when it returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerReport {
    /// Runs it drove to an end (completed, failed, in doubt, cancelled).
    pub finished: u64,
    /// Runs it gave back unfinished (drained, paused, or not servable here).
    pub released: u64,
    /// Times a run it drove suspended in a wait (a sleep, a wait for a signal) and was
    /// given back until due; the same run counts once per wait.
    pub suspended: u64,
    /// Runs it lost to another holder, or could not drive because the store failed.
    pub lost: u64,
}

/// A pool of runs driven by one host.
pub struct Worker {
    host: Arc<Host>,
    options: WorkerOptions,
    /// Agents by digest, each compiled once however many runs want it at once.
    agents: Mutex<HashMap<String, Arc<tokio::sync::OnceCell<LoadedAgent>>>>,
}

impl Worker {
    /// A worker driving runs with `host`.
    pub fn new(host: Arc<Host>, options: WorkerOptions) -> Worker {
        Worker {
            host,
            options,
            agents: Mutex::default(),
        }
    }

    /// How long an idle worker waits before it looks again: a poll, or until the next
    /// sleeping run is due if that is sooner. A poll still bounds the wait, because
    /// runs submitted and signals sent from elsewhere make runs due without telling
    /// this worker. A store that cannot say is asked again at the next poll.
    async fn until_next_due(&self) -> Duration {
        let poll = self.options.poll;
        let store = self.host.store();
        let Ok(now) = store.now().await else {
            return poll;
        };
        match store.next_due(now).await {
            Ok(Some(due)) => {
                let left = u64::try_from(due.saturating_sub(now)).unwrap_or(0);
                Duration::from_millis(left).clamp(Duration::from_millis(1), poll)
            }
            Ok(None) | Err(_) => poll,
        }
    }

    /// Works until `shutdown` resolves, then drains and returns.
    pub async fn run(
        self: Arc<Self>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<WorkerReport, HostError> {
        tokio::pin!(shutdown);
        let mut pool = Pool::default();
        let mut failing: Option<String> = None;
        let mut backoff = self.options.poll;
        self.host.be_present().await;
        let mut looked_for_gone: Option<Instant> = None;
        // Runs that end one by one are replaced a batch at a time: one lease (a query
        // of the queue, a transaction) for several runs rather than one for each.
        let batch = (self.options.concurrency / LEASE_BATCH_OF).max(1);
        loop {
            let free = self.options.concurrency.saturating_sub(pool.tasks.len());
            // With room for a batch (always, when nothing runs), the worker looks after
            // its backoff (at once when the last look found work); with less room it
            // looks when enough runs have ended, or at the next poll. A full worker
            // still wakes at each poll, to fire the schedules that came due: a tick is
            // started on time however busy the workers are.
            let pause = if free >= batch {
                backoff
            } else {
                self.options.poll
            };
            tokio::select! {
                () = &mut shutdown => break,
                Some(done) = pool.tasks.join_next() => {
                    self.settle(done, &mut pool);
                    while let Some(done) = pool.tasks.try_join_next() {
                        self.settle(done, &mut pool);
                    }
                    continue;
                }
                () = tokio::time::sleep(pause) => {}
            }
            let fired = self.fire_schedules().await;
            let free = self.options.concurrency.saturating_sub(pool.tasks.len());
            if free == 0 {
                continue;
            }
            pool.skipped.retain(|_, until| *until > Instant::now());
            // Runs set aside, and the runs this worker drives: the store would grant
            // those to it again, and the new lease would fence its own drive out.
            let skip: Vec<String> = pool
                .skipped
                .keys()
                .chain(pool.signals.keys())
                .cloned()
                .collect();
            // Runs held by a process that died are taken now, not after their leases;
            // looked for at most every LOOK_FOR_GONE while runs keep ending.
            if looked_for_gone.is_none_or(|at| at.elapsed() >= LOOK_FOR_GONE) {
                looked_for_gone = Some(Instant::now());
                if let Err(err) = self.host.end_leases_of_gone().await {
                    tracing::warn!(error = %err, "cannot look for holders that are gone");
                }
            }
            let leased = match &self.options.only_under {
                None => {
                    self.host
                        .store()
                        .acquire_runs(self.host.id(), free, self.options.lease, &skip)
                        .await
                }
                Some(root) => self.acquire_under(root, free, &skip).await,
            };
            match leased {
                Ok(leased) => {
                    if let Some(cause) = failing.take() {
                        tracing::warn!(%cause, "the store is back; leasing runs again");
                    }
                    // Work found (or a tick just started a run): look again at once;
                    // none: wait a poll, or less if a sleeping run or a tick is due
                    // sooner.
                    backoff = if leased.is_empty() && !fired {
                        self.until_next_due().await
                    } else {
                        Duration::ZERO
                    };
                    for run in leased {
                        self.start(run, &mut pool);
                    }
                }
                Err(e) => {
                    // Said once per outage, then retried with a growing pause.
                    let cause = e.to_string();
                    if failing.is_none() {
                        tracing::error!(error = %cause, "cannot lease runs from the store; retrying with backoff");
                    }
                    failing = Some(cause);
                    backoff = (backoff * 2).clamp(self.options.poll, Duration::from_secs(5));
                }
            }
        }
        self.drain(pool).await
    }

    /// Fires the ticks of schedules that are due (any worker does; the store fires
    /// each tick once); whether one started a run. A worker limited to one run's
    /// descendants fires nothing. A store that fails is asked again at the next poll.
    async fn fire_schedules(&self) -> bool {
        if self.options.only_under.is_some() {
            return false;
        }
        match self.host.store().fire_schedules(FIRE_AT_ONCE).await {
            Ok(ticks) => {
                let mut started = false;
                for tick in &ticks {
                    let schedule = text::escape(&tick.schedule, false);
                    let at = crate::store::tick_text(tick.tick);
                    match &tick.outcome {
                        TickOutcome::Started { run_id, .. } => {
                            started = true;
                            let run_id = text::escape(run_id, false);
                            tracing::info!(%schedule, tick = %at, %run_id, "schedule started a run");
                        }
                        TickOutcome::Skipped => {
                            tracing::info!(%schedule, tick = %at, "tick skipped: the previous run is still going");
                        }
                        TickOutcome::Failed(why) => {
                            let why = text::escape(why, false);
                            tracing::warn!(%schedule, tick = %at, %why, "tick could not start its run");
                        }
                    }
                }
                started
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot fire schedules");
                false
            }
        }
    }

    /// Leases up to `max` due descendants of `root` that nobody holds (and not among
    /// `skip`). The tree is walked from the store at each poll: a worker limited to one
    /// run's children serves one person's `idem run`, not a fleet.
    async fn acquire_under(
        &self,
        root: &str,
        max: usize,
        skip: &[String],
    ) -> Result<Vec<LeasedRun>, StoreError> {
        let store = self.host.store();
        let now = store.now().await?;
        let mut leased = Vec::new();
        let mut parents = vec![root.to_string()];
        while let Some(parent) = parents.pop() {
            let children = store
                .runs(&crate::store::RunFilter {
                    parent: Some(&parent),
                    ..Default::default()
                })
                .await?;
            for child in children {
                if child.status.is_finished() {
                    continue;
                }
                parents.push(child.run_id.clone());
                let free = child.lease.as_ref().is_none_or(|l| l.expires <= now);
                let due = child.wake_at.is_none_or(|at| at <= now);
                if leased.len() < max && free && due && !skip.contains(&child.run_id) {
                    match store
                        .acquire_run(&child.run_id, self.host.id(), self.options.lease)
                        .await?
                    {
                        Acquired::Leased(run) => leased.push(run),
                        Acquired::Held(_) | Acquired::Finished(_) | Acquired::Paused(_) => {}
                    }
                }
            }
        }
        Ok(leased)
    }

    /// Starts driving a run leased from the queue, on a task of its own.
    fn start(self: &Arc<Self>, run: LeasedRun, pool: &mut Pool) {
        let run_signals = Arc::new(RunSignals::default());
        pool.signals
            .insert(run.record.run_id.clone(), Arc::clone(&run_signals));
        let worker = Arc::clone(self);
        pool.tasks.spawn(async move {
            let run_id = run.record.run_id.clone();
            (run_id, worker.serve(run, run_signals).await)
        });
    }

    /// Takes no new runs; each run ends at its next host call outside a side effect and
    /// gives its lease back. Past the drain timeout, side effects still in flight have
    /// their instances ended.
    async fn drain(&self, mut pool: Pool) -> Result<WorkerReport, HostError> {
        tracing::info!(runs = pool.tasks.len(), "draining");
        for run_signals in pool.signals.values() {
            run_signals.raise(Stop::Drain);
        }
        let deadline = tokio::time::Instant::now() + self.options.drain_timeout;
        let mut aborted = false;
        while !pool.tasks.is_empty() {
            tokio::select! {
                Some(done) = pool.tasks.join_next() => self.settle(done, &mut pool),
                () = tokio::time::sleep_until(deadline), if !aborted => {
                    tracing::warn!(runs = pool.tasks.len(), "drain timed out; ending the instances of side effects still in flight");
                    for run_signals in pool.signals.values() {
                        run_signals.raise(Stop::Abort);
                    }
                    aborted = true;
                }
            }
        }
        Ok(pool.report)
    }

    /// Counts a run's task that ended, and forgets its signals.
    fn settle(&self, done: Result<(String, Outcome), tokio::task::JoinError>, pool: &mut Pool) {
        let Pool {
            signals,
            skipped,
            report,
            ..
        } = pool;
        let Ok((run_id, outcome)) = done else {
            // A task only ends this way if it panicked: the run's lease will expire
            // and another worker takes it over.
            tracing::error!("a run's task panicked; its lease will expire");
            report.lost += 1;
            return;
        };
        signals.remove(&run_id);
        let run_id_shown = text::escape(&run_id, false).into_owned();
        match outcome {
            Outcome::Driven(run) if run.status.is_finished() => {
                tracing::info!(run_id = %run_id_shown, status = %run.status, "run ended");
                report.finished += 1;
            }
            Outcome::Driven(run) if run.waiting.is_some() => report.suspended += 1,
            Outcome::Driven(run) if run.status == crate::store::RunStatus::Paused => {
                tracing::info!(run_id = %run_id_shown, "run paused; its lease given back");
                report.released += 1;
            }
            Outcome::Driven(_) => report.released += 1,
            Outcome::NotServable(why) => {
                tracing::warn!(run_id = %run_id_shown, %why, "run given back: this worker cannot serve it");
                skipped.insert(run_id, Instant::now() + self.options.skip_for);
                report.released += 1;
            }
            Outcome::Failed(e) => {
                tracing::error!(run_id = %run_id_shown, error = %e, "run stopped");
                report.lost += 1;
            }
        }
    }

    /// Drives one leased run; gives it back with a note if this worker cannot.
    async fn serve(&self, run: LeasedRun, signals: Arc<RunSignals>) -> Outcome {
        let authority = Authority::decode(&run.authority);
        let (sync, lease) = match &authority {
            Ok(a) => (a.sync, a.limits.lease),
            Err(_) => (Default::default(), self.options.lease),
        };
        let fence = RunFence {
            run_id: run.record.run_id.clone(),
            token: run.token,
            sync,
        };
        // Renewed from the moment it is leased: fetching and compiling the agent may
        // take longer than the lease.
        let _renewed = self.host.renew_while(&fence, lease, Arc::clone(&signals));
        let prepared = match authority {
            Ok(authority) => match self.can_serve(&authority) {
                Ok(()) => match self.agent(&run.record.digest, &run.record.agent).await {
                    Ok(agent) => Ok((authority, agent)),
                    Err(e) => Err(e.to_string()),
                },
                Err(e) => Err(e.to_string()),
            },
            Err(e) => Err(e.to_string()),
        };
        let (authority, agent) = match prepared {
            Ok(prepared) => prepared,
            Err(why) => {
                let note = format!("worker {} cannot serve this run: {why}", self.host.id());
                // No instance started: one the grant counted is taken back off.
                let mut counts: Counts = run.record.counts;
                if run.instance_counted {
                    counts.instances = counts.instances.saturating_sub(1);
                }
                return match self
                    .host
                    .store()
                    .release_run(&fence, &counts, Some(&note))
                    .await
                {
                    Ok(()) => Outcome::NotServable(why),
                    Err(e) => Outcome::Failed(e.into()),
                };
            }
        };
        match self
            .host
            .drive(
                &agent,
                run,
                &authority,
                &FaultPlan::default(),
                LogSink::new(false),
                signals,
            )
            .await
        {
            Ok(report) => Outcome::Driven(report),
            Err(e) => Outcome::Failed(e),
        }
    }

    /// Whether this worker can give a run what its authority grants.
    fn can_serve(&self, authority: &Authority) -> Result<(), HostError> {
        authority.check()?;
        check_grants(&authority.dirs, &self.options.protected)?;
        for dir in &authority.dirs {
            if !dir.host.is_dir() {
                return Err(HostError::Grant {
                    host: dir.host.clone(),
                    guest: text::escape(&dir.guest, false).into_owned(),
                    reason: "no such directory on this worker".into(),
                });
            }
        }
        Ok(())
    }

    /// The agent with this digest, compiled (or loaded from the cache) once per worker:
    /// runs leased together wait for one compile rather than each start its own.
    async fn agent(&self, digest: &str, name: &str) -> Result<LoadedAgent, HostError> {
        let cell = Arc::clone(
            self.agents
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(digest.to_string())
                .or_default(),
        );
        cell.get_or_try_init(|| self.host.load_stored(digest, name))
            .await
            .cloned()
    }
}

/// The runs a worker drives now, and what it has done.
#[derive(Default)]
struct Pool {
    /// One task per run driven.
    tasks: JoinSet<(String, Outcome)>,
    /// The stop signals of the runs driven, by run id.
    signals: HashMap<String, Arc<RunSignals>>,
    /// Runs this worker could not serve, left to others until then.
    skipped: HashMap<String, Instant>,
    report: WorkerReport,
}

/// How serving one run went.
enum Outcome {
    /// Driven to an end, or given back drained.
    Driven(RunReport),
    /// Given back: this worker cannot serve it.
    NotServable(String),
    /// Lost, or stopped by a failure.
    Failed(HostError),
}
