//! Driving a run to its end. The foreground form ([`Host::run`]) deploys the agent,
//! submits the run and takes its lease itself; a worker leases runs from the queue.
//! Either way [`Host::drive`] creates instances, calls `run`, replaces each instance the
//! host drops, and records how the run ended — every write fenced by the run's lease.

use std::sync::{Arc, PoisonError};
use std::time::Duration;

use tracing::Instrument;

use super::Host;
use super::authority::Authority;
use super::capture::HttpCapture;
use super::end::InstanceEnd;
use super::engine::LoadedAgent;
use super::error::HostError;
use super::faults::{FaultPlan, Faults};
use super::limits::{LimitExceeded, Limits, cut};
use super::output::{Echo, LogSink};
use super::run_ctx::{RunCtx, RunSignals, Stop};
use crate::store::StoreError;
use crate::store::{
    Acquired, Admission, Counts, Deployment, LeasedRun, Millis, RunEnd, RunFence, RunRecord,
    RunStatus, Submission, Suspension,
};
use crate::text;

/// How to drive one run in the foreground.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// The run's id: the same id resumes the same run.
    pub run_id: String,
    /// The input handed to `run` on every instance.
    pub input: Vec<u8>,
    /// What the run may reach.
    pub authority: Authority,
    /// Planned instance drops.
    pub faults: FaultPlan,
    /// Resume a run started with another component, or run a component under a name
    /// other components use: an explicit act, recorded.
    pub upgrade: bool,
    /// The name the agent is deployed under, which is the namespace its keys live in;
    /// `None` keeps a resumed run's, and takes the agent's file name for a new run.
    /// Another component may use a name only once deployed there explicitly (or with
    /// `upgrade`): runs of one agent share keys, and other agents cannot reach them.
    pub namespace: Option<String>,
    /// Answers the run's outbound HTTP in place of the network, and hears of the
    /// requests the gate refused. `None` sends granted requests out.
    pub capture: Option<Arc<dyn HttpCapture>>,
}

/// How a run ended, and what it took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunReport {
    /// The run's id.
    pub run_id: String,
    /// How the run stands now. `Running` when it was given back unfinished (the worker
    /// shut down).
    pub status: RunStatus,
    /// The output bytes when completed; the error text when failed; the reason when in
    /// doubt or cancelled.
    pub outcome: Vec<u8>,
    /// What the run did over all its instances, including earlier drives.
    pub counts: Counts,
    /// Whether `counts` are exact. An earlier holder of the run that died (killed,
    /// power lost) without writing its last counts leaves them short by at most the
    /// work of its last quarter second; `reclaimed` is exact either way.
    pub counts_exact: bool,
    /// Instances created by this drive.
    pub instances_now: u64,
    /// The run had ended before this drive: nothing was executed now.
    pub already_finished: bool,
    /// Why the run failed, when it failed for a reason the host can name.
    pub failure: Option<RunFailure>,
    /// What the run waits for, when it was given back suspended in a wait (its status
    /// is then [`RunStatus::Running`]).
    pub waiting: Option<Waiting>,
}

/// What a suspended run waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// When it is due without a signal, on the store's clock (`None`: never).
    pub due: Option<Millis>,
    /// The signal that wakes it, if it waits for one.
    pub signal: Option<String>,
}

/// Why a run failed, beyond its error text.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RunFailure {
    /// The agent returned an error.
    AgentError,
    /// The guest trapped (a panic, a stack overflow, an uncaught exception).
    Trapped,
    /// A limit ended it.
    Limit(LimitExceeded),
    /// The agent returned while still holding claims: their side effects may have
    /// begun, so the keys are left to be retaken in doubt.
    ClaimsLeftOpen {
        /// The keys, as the agent wrote them.
        keys: Vec<String>,
    },
}

/// What waiting for a suspended run found.
enum Due {
    /// It is due: drive it.
    Now,
    /// The foreground was told to stop.
    Stopped,
    /// It finished meanwhile.
    Finished(Box<RunRecord>),
}

/// The default namespace of an agent: its name, with anything but letters, digits,
/// `.`, `_` and `-` replaced by `-`.
pub(crate) fn namespace_of(agent: &str) -> String {
    let namespace: String = agent
        .chars()
        .take(MAX_NAMESPACE_BYTES)
        .map(|c| if namespace_char(c) { c } else { '-' })
        .collect();
    if namespace.is_empty() {
        "agent".to_string()
    } else {
        namespace
    }
}

fn namespace_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// The longest namespace accepted.
const MAX_NAMESPACE_BYTES: usize = 64;

/// Checks a namespace (which is also a deployment name).
pub fn check_namespace(namespace: &str) -> Result<(), HostError> {
    const RULE: &str = "use 1 to 64 letters, digits, '.', '_' or '-'";
    if !namespace.is_empty()
        && namespace.len() <= MAX_NAMESPACE_BYTES
        && namespace.chars().all(namespace_char)
    {
        return Ok(());
    }
    let reason = match text::check_visible(namespace) {
        Err(hidden) => format!("it holds {hidden}; {RULE}"),
        Ok(()) => RULE.to_string(),
    };
    Err(HostError::InvalidNamespace {
        namespace: namespace.to_string(),
        reason,
    })
}

/// The longest run id accepted.
const MAX_RUN_ID_BYTES: usize = 256;

/// Checks a run id: 1 to 256 bytes, no `/`, nothing invisible.
pub fn check_run_id(run_id: &str) -> Result<(), HostError> {
    let reason = if run_id.is_empty() {
        Some("it is empty".to_string())
    } else if run_id.len() > MAX_RUN_ID_BYTES {
        Some(format!("it is over {MAX_RUN_ID_BYTES} bytes"))
    } else if let Err(hidden) = text::check_visible(run_id) {
        Some(format!("it holds {hidden}; run ids must be visible text"))
    } else if run_id.contains('/') {
        Some("it holds '/'".to_string())
    } else {
        None
    };
    match reason {
        Some(reason) => Err(HostError::InvalidRunId {
            run_id: run_id.to_string(),
            reason,
        }),
        None => Ok(()),
    }
}

impl RunOptions {
    /// Checks the options without touching any store: the run id, the namespace, the
    /// limits, and that every granted directory can be opened. [`Host::run`] does it
    /// too; calling it first lets a caller refuse bad options before it opens (and so
    /// writes to) a store.
    pub fn check(&self) -> Result<(), HostError> {
        check_run_id(&self.run_id)?;
        if let Some(namespace) = &self.namespace {
            check_namespace(namespace)?;
        }
        self.authority.check()?;
        super::instance::wasi_ctx(&self.authority, &LogSink::default()).map(drop)
    }
}

impl Host {
    /// Drives run `opts.run_id` of `agent` to its end in this process, resuming it if it
    /// was started before: deploys the agent under its name (a name another component
    /// uses needs `opts.upgrade`), submits the run, waits for any other holder's lease
    /// on it to end, and drives it. A run that already ended is reported as it ended.
    pub async fn run(
        &self,
        agent: &LoadedAgent,
        opts: &RunOptions,
    ) -> Result<RunReport, HostError> {
        self.run_inner(agent, opts, std::future::pending(), Echo::Stderr)
            .await
    }

    /// [`Host::run`], stopped when `stop` resolves the way a worker drains: at the
    /// run's next host call outside a side effect, with its lease given back so that
    /// whoever resumes it need not wait for the lease (the report's status is then
    /// [`RunStatus::Running`]).
    pub async fn run_until(
        &self,
        agent: &LoadedAgent,
        opts: &RunOptions,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> Result<RunReport, HostError> {
        self.run_inner(agent, opts, stop, Echo::Stderr).await
    }

    /// [`Host::run_until`], with the agent's output shown where `echo` says.
    pub async fn run_until_echoing(
        &self,
        agent: &LoadedAgent,
        opts: &RunOptions,
        stop: impl Future<Output = ()> + Send + 'static,
        echo: Echo,
    ) -> Result<RunReport, HostError> {
        self.run_inner(agent, opts, stop, echo).await
    }

    /// [`Host::run`], the agent's stderr and stdout shown on idem's own stderr only if
    /// `echo` (they go to the run's log either way).
    #[cfg(feature = "prove")]
    pub(crate) async fn run_logged(
        &self,
        agent: &LoadedAgent,
        opts: &RunOptions,
        echo: bool,
    ) -> Result<RunReport, HostError> {
        let echo = if echo { Echo::Stderr } else { Echo::Off };
        self.run_inner(agent, opts, std::future::pending(), echo)
            .await
    }

    async fn run_inner(
        &self,
        agent: &LoadedAgent,
        opts: &RunOptions,
        stop: impl Future<Output = ()> + Send + 'static,
        echo: Echo,
    ) -> Result<RunReport, HostError> {
        opts.check()?;
        let _driving = self.start_driving(&opts.run_id)?;
        let store = &self.store;
        let existing = store.run(&opts.run_id).await?;
        // A run keeps the namespace it started in; a new one takes the one asked for, or
        // the agent's name.
        let name = match (&opts.namespace, &existing) {
            (Some(namespace), Some(existing)) if *namespace != existing.namespace => {
                return Err(HostError::NamespaceMismatch {
                    run_id: opts.run_id.clone(),
                    pinned: existing.namespace.clone(),
                    given: namespace.clone(),
                });
            }
            (Some(namespace), _) => namespace.clone(),
            (None, Some(existing)) => existing.namespace.clone(),
            (None, None) => namespace_of(&agent.name),
        };
        // A run is pinned to the component it started with: another one could read its
        // checkpoint and results differently.
        let upgrade_from = match &existing {
            Some(existing) if existing.digest != agent.digest => {
                if !opts.upgrade {
                    return Err(HostError::Pinned {
                        run_id: opts.run_id.clone(),
                        pinned: existing.digest.clone(),
                        given: agent.digest.clone(),
                    });
                }
                Some(existing.digest.clone())
            }
            _ => None,
        };
        let authority = opts.authority.encode();
        let deployment = Deployment {
            name: &name,
            digest: &agent.digest,
            authority: &authority,
            admission: if opts.upgrade {
                Admission::Explicit
            } else {
                Admission::FirstUse
            },
        };
        self.store_component(agent).await?;
        match store.deploy(&deployment).await {
            // Removed from the store since this host put it there: put it back.
            Err(StoreError::UnknownComponent { .. }) => {
                self.forget_component(agent);
                self.store_component(agent).await?;
                store.deploy(&deployment).await?;
            }
            other => drop(other?),
        }
        if let Some(from) = upgrade_from {
            store
                .upgrade_run(&opts.run_id, &from, &agent.digest)
                .await?;
            tracing::info!(run_id = %text::escape(&opts.run_id, false), %from, to = %agent.digest, "run upgraded");
        }
        let submitted = store
            .submit(&Submission {
                run_id: &opts.run_id,
                agent: &name,
                digest: &agent.digest,
                namespace: &name,
                input: &opts.input,
                authority: &authority,
                replace_authority: true,
            })
            .await?;
        if let Some(report) = self.finished_report(&submitted.record).await? {
            return Ok(report);
        }
        let signals = Arc::new(RunSignals::default());
        // Watched beside the drive in this task, not in a spawned one: a spawn and an
        // abort per run each wake another worker thread for nothing.
        let drive = self.drive_foreground(agent, opts, echo, &submitted.record, &signals);
        tokio::pin!(drive, stop);
        let mut stopping = false;
        loop {
            tokio::select! {
                report = &mut drive => return report,
                () = &mut stop, if !stopping => {
                    stopping = true;
                    signals.raise(Stop::Drain);
                }
            }
        }
    }

    /// Puts the agent's component in the store unless this host already did or the
    /// store holds it; only then are the agent's bytes read (the cache may have loaded
    /// the agent without reading its file).
    async fn store_component(&self, agent: &LoadedAgent) -> Result<(), HostError> {
        let known = |stored: &std::collections::HashSet<String>| stored.contains(&agent.digest);
        if known(&self.stored.lock().unwrap_or_else(PoisonError::into_inner)) {
            return Ok(());
        }
        if !self.store.has_component(&agent.digest).await? {
            self.store
                .put_component(&agent.digest, agent.bytes.get()?)
                .await?;
        }
        self.stored
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(agent.digest.clone());
        Ok(())
    }

    fn forget_component(&self, agent: &LoadedAgent) {
        self.stored
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&agent.digest);
    }

    /// Drives the run in the foreground until it ends or is stopped: a run suspended in
    /// a wait is waited for here, holding no instance and no lease, and driven again
    /// when it is due (by whoever takes it: another worker may).
    async fn drive_foreground(
        &self,
        agent: &LoadedAgent,
        opts: &RunOptions,
        echo: Echo,
        submitted: &RunRecord,
        signals: &Arc<RunSignals>,
    ) -> Result<RunReport, HostError> {
        let mut suspended = submitted.wake_at.map(|due| RunReport {
            run_id: opts.run_id.clone(),
            status: RunStatus::Running,
            outcome: Vec::new(),
            counts: submitted.counts,
            counts_exact: true,
            instances_now: 0,
            already_finished: false,
            failure: None,
            waiting: Some(Waiting {
                due: (due != Millis::MAX).then_some(due),
                signal: submitted.waiting_for.clone(),
            }),
        });
        loop {
            if let Some(report) = suspended.take() {
                match self.until_due(&opts.run_id, signals).await? {
                    Due::Now => {}
                    Due::Stopped => return Ok(report),
                    Due::Finished(record) => {
                        return self.finished_report(&record).await?.ok_or_else(|| {
                            HostError::Engine("a finished run has no report".into())
                        });
                    }
                }
            }
            let leased = match self
                .acquire_foreground(&opts.run_id, opts.authority.limits.lease)
                .await?
            {
                Ok(leased) => leased,
                Err(record) => {
                    return self
                        .finished_report(&record)
                        .await?
                        .ok_or_else(|| HostError::Engine("a finished run has no report".into()));
                }
            };
            // Signals of this drive only: the heartbeat may still report the lease the
            // last drive gave back as lost, which must not stop the next one. The
            // foreground's stop is relayed to it, from this task.
            let drive_signals = Arc::new(RunSignals::default());
            let relay = relay_stop(signals, &drive_signals);
            let drive = self.drive_leased(
                agent,
                leased,
                &opts.authority,
                &opts.faults,
                LogSink::echoing(echo.clone()),
                Arc::clone(&drive_signals),
                opts.capture.clone(),
            );
            tokio::pin!(drive, relay);
            let mut relayed = false;
            let report = loop {
                tokio::select! {
                    report = &mut drive => break report,
                    () = &mut relay, if !relayed => relayed = true,
                }
            };
            let report = report?;
            if report.waiting.is_none() {
                return Ok(report);
            }
            suspended = Some(report);
        }
    }

    /// Waits, holding nothing, until the suspended run is due on the store's clock (its
    /// time came, its signal was sent, or another holder took it), it finished (an
    /// operator cancelled it), or the foreground is told to stop.
    async fn until_due(&self, run_id: &str, signals: &RunSignals) -> Result<Due, HostError> {
        loop {
            if signals.stop().is_some() {
                return Ok(Due::Stopped);
            }
            let record = self
                .store
                .run(run_id)
                .await?
                .ok_or_else(|| StoreError::UnknownRun {
                    run_id: run_id.to_string(),
                })?;
            if record.status.is_finished() {
                return Ok(Due::Finished(Box::new(record)));
            }
            let now = self.store.now().await?;
            let left = match record.wake_at {
                Some(due) if due > now => due - now,
                _ => return Ok(Due::Now),
            };
            // Looked at again at least every quarter second: a signal, a cancel or a
            // test's clock may make the run due sooner than its time.
            let pause = u64::try_from(left).unwrap_or(u64::MAX).clamp(5, 250);
            let changed = signals.changed();
            if signals.stop().is_some() {
                return Ok(Due::Stopped);
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(pause)) => {}
                () = changed => {}
            }
        }
    }

    /// Takes the lease of a run for the foreground, waiting while another live holder
    /// has it; `Err(record)` if the run finished meanwhile.
    async fn acquire_foreground(
        &self,
        run_id: &str,
        lease: Duration,
    ) -> Result<Result<LeasedRun, RunRecord>, HostError> {
        let mut told = false;
        loop {
            match self
                .store
                .acquire_run(run_id, self.live.host_id(), lease)
                .await?
            {
                Acquired::Leased(leased) => return Ok(Ok(leased)),
                Acquired::Finished(record) => return Ok(Err(record)),
                Acquired::Held(holder) => {
                    if !told {
                        tracing::warn!(
                            run_id = %text::escape(run_id, false),
                            worker = %text::escape(&holder.worker, false),
                            "another holder drives this run; waiting for it to finish or for its lease to end"
                        );
                        told = true;
                    }
                    let now = self.store.now().await?;
                    let wait = u64::try_from(holder.expires.saturating_sub(now)).unwrap_or(0);
                    tokio::time::sleep(Duration::from_millis(wait.clamp(10, 500))).await;
                }
            }
        }
    }

    /// The report of a run that is finished, or `None` if it can be driven.
    async fn finished_report(&self, record: &RunRecord) -> Result<Option<RunReport>, HostError> {
        match record.status {
            RunStatus::Queued | RunStatus::Running | RunStatus::Failed => Ok(None),
            RunStatus::InDoubt => {
                let keys = self
                    .store
                    .open_claims(Some(&record.run_id))
                    .await?
                    .into_iter()
                    .filter(|c| c.parked.is_some())
                    .map(|c| c.key)
                    .collect();
                Err(HostError::InDoubt {
                    run_id: record.run_id.clone(),
                    keys,
                })
            }
            RunStatus::Completed | RunStatus::Cancelled => Ok(Some(RunReport {
                run_id: record.run_id.clone(),
                status: record.status,
                outcome: record.outcome.clone().unwrap_or_default(),
                counts: record.counts,
                counts_exact: true,
                instances_now: 0,
                already_finished: true,
                failure: None,
                waiting: None,
            })),
        }
    }

    /// Drives a leased run to its end (or until it is told to stop), writing nothing
    /// once its lease is lost.
    pub(crate) async fn drive(
        &self,
        agent: &LoadedAgent,
        leased: LeasedRun,
        authority: &Authority,
        faults: &FaultPlan,
        log: LogSink,
        signals: Arc<RunSignals>,
    ) -> Result<RunReport, HostError> {
        let _driving = self.start_driving(&leased.record.run_id)?;
        self.drive_leased(agent, leased, authority, faults, log, signals, None)
            .await
    }

    // The foreground and the worker differ in each of these; a struct for one private
    // call would only move the list.
    #[allow(clippy::too_many_arguments)]
    async fn drive_leased(
        &self,
        agent: &LoadedAgent,
        leased: LeasedRun,
        authority: &Authority,
        faults: &FaultPlan,
        log: LogSink,
        signals: Arc<RunSignals>,
        capture: Option<Arc<dyn HttpCapture>>,
    ) -> Result<RunReport, HostError> {
        let fence = RunFence {
            run_id: leased.record.run_id.clone(),
            token: leased.token,
            sync: authority.sync,
        };
        self.heartbeat
            .hold_run(&fence, authority.limits.lease, Arc::clone(&signals));
        let run = RunCtx {
            fence,
            namespace: leased.record.namespace.clone(),
            store: Arc::clone(&self.store),
            limits: authority.limits.clone(),
            live: Arc::clone(&self.live),
            heartbeat: Arc::clone(&self.heartbeat),
            signals,
            counts: leased.record.counts,
            faults: Faults::new(faults),
            last_committed: 0,
            fuel_left: authority.limits.max_fuel,
            counts_flushed: std::time::Instant::now(),
            log,
            capture,
        };
        let worker = leased
            .record
            .lease
            .as_ref()
            .map_or("", |l| l.worker.as_str());
        let span = tracing::info_span!(
            "idem.run",
            run_id = %text::escape(&leased.record.run_id, false),
            agent = %text::escape(&leased.record.agent, false),
            worker = %text::escape(worker, false),
            status = tracing::field::Empty,
            instances = tracing::field::Empty,
        );
        let result = self
            .drive_instances(agent, authority, &leased.input, run, !leased.taken_over)
            .instrument(span.clone())
            .await;
        if let Ok(report) = &result {
            span.record("status", report.status.as_str());
            span.record("instances", report.instances_now);
        }
        self.heartbeat.drop_run(&leased.record.run_id);
        result
    }

    async fn drive_instances(
        &self,
        agent: &LoadedAgent,
        authority: &Authority,
        input: &[u8],
        mut run: RunCtx,
        counts_exact: bool,
    ) -> Result<RunReport, HostError> {
        let first_instance = run.counts.instances;
        let store = Arc::clone(&self.store);
        loop {
            let instances_now = run.counts.instances - first_instance;
            if instances_now >= run.limits.max_instances {
                store
                    .release_run(&run.fence, &run.counts, Some("gave up: too many instances"))
                    .await?;
                return Err(HostError::TooManyInstances {
                    run_id: run.run_id().to_string(),
                    instances: instances_now,
                });
            }
            let (end, back) = self.instance(agent, authority, input, run).await?;
            run = back;
            self.flush_log(&run).await;
            let report = |status, outcome: Vec<u8>, failure, run: &RunCtx| RunReport {
                run_id: run.run_id().to_string(),
                status,
                outcome,
                counts: run.counts,
                counts_exact,
                instances_now: run.counts.instances - first_instance,
                already_finished: false,
                failure,
                waiting: None,
            };
            let (status, outcome, failure) = match end {
                InstanceEnd::Dropped(reason) => {
                    tracing::debug!(run_id = %text::escape(run.run_id(), false), %reason, "instance dropped");
                    run.counts.recycled += 1;
                    // The next instance writes the counts as it starts, in the one
                    // transaction a recycle needs for them.
                    continue;
                }
                InstanceEnd::Returned(output) if output.len() > run.limits.max_output_bytes => {
                    let limit = LimitExceeded::Output {
                        size: output.len(),
                        limit: run.limits.max_output_bytes,
                    };
                    (
                        RunStatus::Failed,
                        limit.to_string().into_bytes(),
                        Some(RunFailure::Limit(limit)),
                    )
                }
                InstanceEnd::Returned(output) => (RunStatus::Completed, output, None),
                InstanceEnd::ClaimsLeftOpen(keys) => {
                    let message = format!(
                        "the agent returned while holding claims on {}: each claim must be \
                         committed or released before run returns; the keys will be retaken \
                         in doubt",
                        keys.iter()
                            .map(|k| text::quoted(k))
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                    (
                        RunStatus::Failed,
                        message.into_bytes(),
                        Some(RunFailure::ClaimsLeftOpen { keys }),
                    )
                }
                InstanceEnd::AgentError(message) => (
                    RunStatus::Failed,
                    cut(&message, Limits::MAX_ERROR_BYTES).into_bytes(),
                    Some(RunFailure::AgentError),
                ),
                InstanceEnd::Trapped(message) => (
                    RunStatus::Failed,
                    message.into_bytes(),
                    Some(RunFailure::Trapped),
                ),
                InstanceEnd::Limit(limit) => {
                    // The run stops, resumable: committed steps stay, and driving it
                    // again (with a larger limit, if the agent needs one) goes on.
                    (
                        RunStatus::Failed,
                        limit.to_string().into_bytes(),
                        Some(RunFailure::Limit(limit)),
                    )
                }
                InstanceEnd::InDoubt(key) => {
                    store
                        .finish_run(&run.fence, RunEnd::InDoubt, &run.counts)
                        .await?;
                    let reason = store
                        .run(run.run_id())
                        .await?
                        .and_then(|r| r.outcome)
                        .unwrap_or_else(|| format!("in doubt at key {key}").into_bytes());
                    return Ok(report(RunStatus::InDoubt, reason, None, &run));
                }
                InstanceEnd::Stopped(Stop::Drain | Stop::Abort) => {
                    store.release_run(&run.fence, &run.counts, None).await?;
                    return Ok(report(RunStatus::Running, Vec::new(), None, &run));
                }
                InstanceEnd::Stopped(Stop::Cancel) => {
                    store
                        .finish_run(&run.fence, RunEnd::Cancelled, &run.counts)
                        .await?;
                    return Ok(report(
                        RunStatus::Cancelled,
                        b"cancelled by an operator".to_vec(),
                        None,
                        &run,
                    ));
                }
                InstanceEnd::Suspended(suspend) => {
                    let suspension = Suspension {
                        due: suspend.due,
                        signal: suspend.signal.as_deref(),
                    };
                    store
                        .suspend_run(&run.fence, &run.counts, &suspension)
                        .await?;
                    let mut report = report(RunStatus::Running, Vec::new(), None, &run);
                    report.waiting = Some(Waiting {
                        due: suspend.due,
                        signal: suspend.signal,
                    });
                    return Ok(report);
                }
                InstanceEnd::Stopped(Stop::LeaseLost) => {
                    return Err(HostError::LeaseLost {
                        run_id: run.run_id().to_string(),
                    });
                }
                InstanceEnd::Store(e) => return Err(e.into()),
            };
            let end = match status {
                RunStatus::Completed => RunEnd::Completed(&outcome),
                _ => RunEnd::Failed(std::str::from_utf8(&outcome).unwrap_or("")),
            };
            store.finish_run(&run.fence, end, &run.counts).await?;
            return Ok(report(status, outcome, failure, &run));
        }
    }

    /// Moves what the agent wrote since the last flush to the run's log in the store.
    async fn flush_log(&self, run: &RunCtx) {
        let pending = run.log.take();
        if pending.is_empty() {
            return;
        }
        if let Err(e) = self
            .store
            .append_log(&run.fence, &pending, super::output::LOG_KEEP)
            .await
        {
            tracing::warn!(error = %e, "cannot write the run's log");
        }
    }
}

/// Raises on `inner` the stop raised on `outer`, once one is.
async fn relay_stop(outer: &RunSignals, inner: &RunSignals) {
    loop {
        let changed = outer.changed();
        if let Some(stop) = outer.stop() {
            inner.raise(stop);
            return;
        }
        changed.await;
    }
}
