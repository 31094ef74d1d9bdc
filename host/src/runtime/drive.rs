//! Driving a leased run to its end, for the foreground and for workers alike: an
//! instance after another until one ends the run, each end turned into what the run
//! does next ([`Next`]) and applied to the store here, in one place — every write
//! fenced by the run's lease.

use std::sync::Arc;

use tracing::Instrument;

use super::authority::Authority;
use super::capture::HttpCapture;
use super::engine::LoadedAgent;
use super::error::HostError;
use super::faults::{FaultPlan, Faults};
use super::host::Host;
use super::live_text::LiveSink;
use super::next::Next;
use super::output::LogSink;
use super::report::{RunReport, Waiting, since};
use super::run_ctx::RunCtx;
use super::stop::RunSignals;
use crate::store::{Counts, LeasedRun, RunEnd, RunFence, RunStatus, Suspension};
use crate::text;

/// What every report of one drive shares: the counts it started from (the store's,
/// which another process may have written), and whether they were exact.
struct DriveStart {
    counts: Counts,
    counts_exact: bool,
}

impl DriveStart {
    fn report(&self, run: &RunCtx, status: RunStatus, outcome: Vec<u8>) -> RunReport {
        let counts_now = since(&run.counts, &self.counts);
        RunReport {
            run_id: run.run_id().to_string(),
            status,
            outcome,
            counts: run.counts,
            counts_now,
            counts_exact: self.counts_exact,
            instances_now: counts_now.instances,
            already_finished: false,
            failure: None,
            waiting: None,
            rebuilt: None,
        }
    }
}

impl Host {
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
        let mut faults = Faults::new(faults);
        self.drive_leased(agent, leased, authority, &mut faults, log, signals, None)
            .await
    }

    // The foreground and the worker differ in each of these; a struct for one private
    // call would only move the list.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn drive_leased(
        &self,
        agent: &LoadedAgent,
        leased: LeasedRun,
        authority: &Authority,
        faults: &mut Faults,
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
        // The counts as they were before this lease: a grant that counted the first
        // instance already (`LeasedRun::instance_counted`) wrote one more, which that
        // instance counts again below without writing it a second time.
        let mut counts = leased.record.counts;
        let instance_counted = leased.instance_counted && counts.instances > 0;
        if instance_counted {
            counts.instances -= 1;
        }
        let run = RunCtx {
            fence,
            namespace: leased.record.namespace.clone(),
            store: Arc::clone(&self.store),
            limits: authority.limits.clone(),
            live: Arc::clone(&self.live),
            heartbeat: Arc::clone(&self.heartbeat),
            signals,
            counts,
            instance_counted,
            recycled: None,
            preloaded: leased.checkpoint_read.then_some(leased.checkpoint),
            faults: std::mem::take(faults),
            last_committed: 0,
            fuel_left: authority.limits.max_fuel,
            counts_flushed: std::time::Instant::now(),
            live_text: LiveSink::echoing(log.echo()),
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
            .drive_instances(
                agent,
                authority,
                &leased.input,
                run,
                !leased.taken_over,
                faults,
            )
            .instrument(span.clone())
            .await;
        if let Ok(report) = &result {
            span.record("status", report.status.as_str());
            span.record("instances", report.instances_now);
        }
        self.heartbeat.drop_run(&leased.record.run_id);
        result
    }

    /// Creates instances for the run until one ends it: the loop of a drive.
    async fn drive_instances(
        &self,
        agent: &LoadedAgent,
        authority: &Authority,
        input: &[u8],
        mut run: RunCtx,
        counts_exact: bool,
        faults: &mut Faults,
    ) -> Result<RunReport, HostError> {
        let start = DriveStart {
            counts: run.counts,
            counts_exact,
        };
        loop {
            let instances = run.counts.instances - start.counts.instances;
            let next = if instances >= run.limits.max_instances {
                Next::GiveUp { instances }
            } else {
                let (end, back) = self.instance(agent, authority, input, run).await?;
                run = back;
                self.flush_log(&run).await;
                Next::after(end, run.run_id(), &run.limits)
            };
            let applied = self.apply(next, &mut run, &start).await;
            if !matches!(applied, Ok(None)) {
                // What is left of the fault plan goes back to the caller's next drive.
                *faults = std::mem::take(&mut run.faults);
            }
            if let Some(report) = applied? {
                return Ok(report);
            }
        }
    }

    /// Applies what the run does next: the one place an instance's end is written to
    /// the store. Returns the drive's report once the drive is over, `None` to go on
    /// with a fresh instance.
    async fn apply(
        &self,
        next: Next,
        run: &mut RunCtx,
        start: &DriveStart,
    ) -> Result<Option<RunReport>, HostError> {
        let store = &self.store;
        let report = match next {
            Next::Another { reason } => {
                tracing::debug!(run_id = %text::escape(run.run_id(), false), %reason, "instance dropped");
                run.counts.recycled += 1;
                run.recycled = Some(reason);
                // The next instance writes the counts as it starts, in the one
                // transaction a recycle needs for them.
                return Ok(None);
            }
            Next::Finish(ending) => {
                store
                    .finish_run(&run.fence, ending.run_end(), &run.counts)
                    .await?;
                let mut report = start.report(run, ending.status, ending.outcome);
                report.failure = ending.failure;
                report
            }
            Next::InDoubt { key } => {
                store
                    .finish_run(&run.fence, RunEnd::InDoubt, &run.counts)
                    .await?;
                let reason = store
                    .run(run.run_id())
                    .await?
                    .and_then(|r| r.outcome)
                    .unwrap_or_else(|| format!("in doubt at key {key}").into_bytes());
                start.report(run, RunStatus::InDoubt, reason)
            }
            Next::Suspend(suspend) => {
                let suspension = Suspension {
                    due: suspend.due,
                    signal: suspend.signal.as_deref(),
                    join: suspend.join.as_deref(),
                };
                store
                    .suspend_run(&run.fence, &run.counts, &suspension)
                    .await?;
                let mut report = start.report(run, RunStatus::Running, Vec::new());
                report.waiting = Some(Waiting {
                    due: suspend.due,
                    signal: suspend.signal,
                    join: suspend.join,
                });
                report
            }
            Next::Release => {
                store.release_run(&run.fence, &run.counts, None).await?;
                start.report(run, RunStatus::Running, Vec::new())
            }
            Next::Paused => {
                store.release_run(&run.fence, &run.counts, None).await?;
                // Resumed meanwhile, it is running again (and due): say what the store says.
                let status = match store.run(run.run_id()).await? {
                    Some(record) if record.status == RunStatus::Paused => RunStatus::Paused,
                    _ => RunStatus::Running,
                };
                start.report(run, status, Vec::new())
            }
            Next::GiveUp { instances } => {
                store
                    .release_run(&run.fence, &run.counts, Some("gave up: too many instances"))
                    .await?;
                return Err(HostError::TooManyInstances {
                    run_id: run.run_id().to_string(),
                    instances,
                });
            }
            Next::Fail(e) => return Err(e),
        };
        Ok(Some(report))
    }

    /// Moves what the agent wrote and published since the last flush to the run's log
    /// and live stream in the store.
    async fn flush_log(&self, run: &RunCtx) {
        self.flush_live(&run.fence, &run.live_text).await;
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
