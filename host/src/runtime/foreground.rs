//! Driving a run in the foreground ([`Host::run`]): the agent deployed and the run
//! submitted (`deploy.rs`), its lease taken here (waiting while another live holder
//! has it), and its waits waited out here, holding no instance and no lease, until the
//! run is due again or the caller stops it.

use std::sync::Arc;
use std::time::Duration;

use super::engine::LoadedAgent;
use super::error::HostError;
use super::host::Host;
use super::options::RunOptions;
use super::output::LogSink;
use super::report::{RunReport, Waiting};
use super::stop::{RunSignals, Stop};
use crate::store::{Acquired, Counts, LeasedRun, Millis, RunRecord, RunStatus, StoreError};
use crate::text;

/// What waiting for a suspended run found.
enum Due {
    /// It is due: drive it.
    Now,
    /// The foreground was told to stop.
    Stopped,
    /// It finished meanwhile.
    Finished(Box<RunRecord>),
}

impl Host {
    /// Drives run `opts.run_id` of `agent` to its end in this process, resuming it if it
    /// was started before: deploys the agent under its name (a name another component
    /// uses needs `opts.upgrade`), submits the run, waits for any other holder's lease
    /// on it to end, and drives it. A run that already ended is reported as it ended.
    ///
    /// Once [`opts.stop`](RunOptions::stop) is raised the run stops the way a worker
    /// drains: at its next host call outside a side effect, with its lease given back so
    /// that whoever resumes it need not wait for the lease (the report's status is then
    /// [`RunStatus::Running`]). What the agent writes goes to the run's log and is shown
    /// where [`opts.echo`](RunOptions::echo) says.
    pub async fn run(
        &self,
        agent: &LoadedAgent,
        opts: &RunOptions,
    ) -> Result<RunReport, HostError> {
        opts.check()?;
        let _driving = self.start_driving(&opts.run_id)?;
        let (submitted, rebuilt) = self.submit_foreground(agent, opts).await?;
        let rebuilt = rebuilt.map(Box::new);
        let with_rebuild = |mut report: RunReport| {
            report.rebuilt = rebuilt.clone();
            report
        };
        if let Some(report) = self.finished_report(&submitted).await? {
            return Ok(with_rebuild(report));
        }
        let signals = Arc::new(RunSignals::default());
        // Watched beside the drive in this task, not in a spawned one: a spawn and an
        // abort per run each wake another worker thread for nothing.
        let drive = self.drive_foreground(agent, opts, &submitted, &signals);
        let stop = async {
            match &opts.stop {
                Some(stop) => stop.stopped().await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(drive, stop);
        let mut stopping = false;
        loop {
            tokio::select! {
                report = &mut drive => return report.map(with_rebuild),
                () = &mut stop, if !stopping => {
                    stopping = true;
                    signals.raise(Stop::Drain);
                }
            }
        }
    }

    /// Drives the run in the foreground until it ends or is stopped: a run suspended in
    /// a wait is waited for here, holding no instance and no lease, and driven again
    /// when it is due (by whoever takes it: another worker may).
    async fn drive_foreground(
        &self,
        agent: &LoadedAgent,
        opts: &RunOptions,
        submitted: &RunRecord,
        signals: &Arc<RunSignals>,
    ) -> Result<RunReport, HostError> {
        let mut suspended = waiting_report(submitted);
        // What this call's drives did so far: between them, another process may drive
        // the run on, and its work is not this call's to report.
        let mut done = Counts::default();
        // One plan for every drive of this call: a crash point fires once, not once per
        // drive after each wait.
        let mut faults = super::faults::Faults::new(&opts.faults);
        loop {
            if let Some(report) = suspended.take() {
                let joining = report.waiting.as_ref().is_some_and(|w| w.join.is_some());
                let due = if joining {
                    self.until_due_driving_children(&opts.run_id, signals)
                        .await?
                } else {
                    self.until_due(&opts.run_id, signals).await?
                };
                match due {
                    Due::Now => {}
                    Due::Stopped => return Ok(report),
                    Due::Finished(record) => return self.ended_report(&record, &done).await,
                }
            }
            let leased = match self
                .acquire_foreground(&opts.run_id, opts.authority.limits.lease)
                .await?
            {
                Ok(leased) => leased,
                Err(record) => return self.ended_report(&record, &done).await,
            };
            // Signals of this drive only: the heartbeat may still report the lease the
            // last drive gave back as lost, which must not stop the next one. The
            // foreground's stop is relayed to it, from this task.
            let drive_signals = Arc::new(RunSignals::default());
            let relay = relay_stop(signals, &drive_signals);
            // An operator may have moved the run to another version since this process
            // started it (`idem upgrade`, `idem rollback`, a rollout): its next instance
            // runs the component the store names, as a worker's would.
            let moved = if leased.record.digest == agent.digest {
                None
            } else {
                match self
                    .load_stored(&leased.record.digest, &leased.record.agent)
                    .await
                {
                    Ok(moved) => Some(moved),
                    Err(e) => {
                        // Given back at once with why, so that a worker (or another
                        // `idem run`) takes the run up once the component is mended.
                        let fence = crate::store::RunFence {
                            run_id: leased.record.run_id.clone(),
                            token: leased.token,
                            sync: opts.authority.sync,
                        };
                        let note = format!("cannot load the version it was moved to: {e}");
                        self.store
                            .release_run(&fence, &leased.record.counts, Some(&note))
                            .await?;
                        return Err(e);
                    }
                }
            };
            let drive = self.drive_leased(
                moved.as_ref().unwrap_or(agent),
                leased,
                &opts.authority,
                &mut faults,
                LogSink::echoing(opts.echo.clone()),
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
            let mut report = report?;
            report.add_earlier(&done);
            done = report.counts_now;
            if report.waiting.is_none() {
                return Ok(report);
            }
            suspended = Some(report);
        }
    }

    /// [`Host::until_due`] for a run that waits on its children: meanwhile this process
    /// drives them (and theirs) as a worker would, beside any worker of the store, so
    /// that `idem run` of a parent needs no worker of its own. The children's worker
    /// drains once the run is due (every child it joins has ended), stopped or finished.
    async fn until_due_driving_children(
        &self,
        run_id: &str,
        signals: &RunSignals,
    ) -> Result<Due, HostError> {
        let host = Arc::new(Host::new(
            Arc::clone(&self.runtime),
            Arc::clone(&self.store),
        )?);
        let worker = Arc::new(crate::worker::Worker::new(
            host,
            crate::worker::WorkerOptions {
                poll: Duration::from_millis(20),
                only_under: Some(run_id.to_string()),
                ..crate::worker::WorkerOptions::default()
            },
        ));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let working = worker.run(async move {
            let _ = stopped.await;
        });
        let waiting = async {
            let due = self.until_due(run_id, signals).await;
            let _ = stop.send(());
            due
        };
        let (due, worked) = tokio::join!(waiting, working);
        if let Err(e) = worked {
            tracing::warn!(error = %e, "driving the run's children stopped");
        }
        due
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
            // A run paused meanwhile is not this call's to wait for: it ends here, and
            // whoever resumes it later drives it.
            if record.status.is_finished() || record.status == RunStatus::Paused {
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
    /// has it; `Err(record)` if the run finished or was paused meanwhile.
    async fn acquire_foreground(
        &self,
        run_id: &str,
        lease: Duration,
    ) -> Result<Result<LeasedRun, RunRecord>, HostError> {
        let mut told = false;
        self.be_present().await;
        loop {
            match self
                .store
                .acquire_run(run_id, self.live.host_id(), lease)
                .await?
            {
                Acquired::Leased(leased) => return Ok(Ok(leased)),
                Acquired::Finished(record) | Acquired::Paused(record) => return Ok(Err(record)),
                Acquired::Held(holder) => {
                    if self.is_gone(&holder.worker).await?
                        && self.take_from_gone(&holder.worker).await?
                    {
                        continue;
                    }
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

    /// The report of a run that is finished (or paused: reported as it stands, not
    /// driven), or `None` if it can be driven.
    async fn finished_report(&self, record: &RunRecord) -> Result<Option<RunReport>, HostError> {
        match record.status {
            RunStatus::Paused => Ok(Some(RunReport {
                run_id: record.run_id.clone(),
                status: RunStatus::Paused,
                outcome: Vec::new(),
                counts: record.counts,
                counts_now: Counts::default(),
                counts_exact: true,
                instances_now: 0,
                already_finished: false,
                failure: None,
                waiting: None,
                rebuilt: None,
            })),
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
                counts_now: Counts::default(),
                counts_exact: true,
                instances_now: 0,
                already_finished: true,
                failure: None,
                waiting: None,
                rebuilt: None,
            })),
        }
    }

    /// The report of a run found finished while the foreground waited for it, after
    /// this call's drives did `done`.
    async fn ended_report(
        &self,
        record: &RunRecord,
        done: &Counts,
    ) -> Result<RunReport, HostError> {
        let mut report = self
            .finished_report(record)
            .await?
            .ok_or_else(|| HostError::Engine("a finished run has no report".into()))?;
        report.add_earlier(done);
        Ok(report)
    }
}

/// The report of a run submitted while it waits, given back suspended; `None` if it
/// does not wait.
fn waiting_report(record: &RunRecord) -> Option<RunReport> {
    record.wake_at.map(|due| RunReport {
        run_id: record.run_id.clone(),
        status: RunStatus::Running,
        outcome: Vec::new(),
        counts: record.counts,
        counts_now: Counts::default(),
        counts_exact: true,
        instances_now: 0,
        already_finished: false,
        failure: None,
        waiting: Some(Waiting {
            due: (due != Millis::MAX).then_some(due),
            signal: record.waiting_for.clone(),
            join: record.joining.clone(),
        }),
        rebuilt: None,
    })
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
