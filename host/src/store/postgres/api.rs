//! The [`Store`](crate::store::Store) of [`PostgresStore`], role by role: which
//! transaction each method opens (how durable, with which fence and lock) and which
//! statements run in it. Values a store cannot keep are refused here, before anything
//! is sent.

use std::sync::Arc;
use std::time::Duration;

use super::batch::{Fenced as BatchFenced, FinishJob};
use super::conn::{Fenced, Lock, write_tx};
use super::one_trip::OneTrip;
use super::{
    PostgresStore, TxError, blobs, children, claims, components, events, flow, gc, history, leases,
    live, logs, pause, rates, runs, schedules, sealing, usage, versions, waits,
};
use crate::store::rules::lease_expiry;
use crate::store::rules::{check_checkpoint, check_counts};
use crate::store::{
    Acquired, BlobDigest, Cancelled, CatalogStore, Checkpoint, ClaimOutcome, ClaimRef,
    ClaimRequest, Commit, Counts, DataKeyRecord, Deployed, Deployment, DeploymentPaused,
    DeploymentRecord, FlowLimits, FlowSetting, GcReport, GcRequest, InstanceStore, JoinRequest,
    LeaseState, LeasedRun, Millis, MoveRuns, OpenClaim, OperatorStore, Paused, PausedDeployment,
    Presence, RateLimit, RateSetting, Resolution, Resumed, Rollout, RunEnd, RunFence, RunFilter,
    RunMove, RunRecord, RunStatus, ScheduleDef, ScheduleRecord, ScheduledBy, Sealer, SignalSent,
    SpawnAnswers, SpawnBatch, StepRecord, StoreError, Submission, Submitted, Suspension, SyncMode,
    Tick, Timeline, VersionRecord, WaitRecord, WaitRequest, WaitState, WorkerStore,
};
use crate::store::{
    ForkRequest, Forked, LiveChunk, LiveText, Position, Recorded, RunHistory, SavedCheckpoint,
    UsageFilter, UsageRecord, UsageTotal, check_usage,
};

/// Refuses a write whose fence did not hold.
fn held(fenced: &Fenced, fence: &RunFence) -> Result<(), TxError> {
    match fenced {
        Fenced::Lost => Err(TxError::Store(StoreError::LeaseLost {
            run_id: fence.run_id.clone(),
            token: fence.token,
        })),
        Fenced::Holds | Fenced::None => Ok(()),
    }
}

impl PostgresStore {
    /// After a checkpoint's save, keeps the run's history to its bounds: now and then
    /// ([`trim_due`](crate::store::history)) its checkpoints past [`HISTORY_KEEP`],
    /// and after a large one (`state` is a blob's reference) the states of its large
    /// ones but the last few. In a transaction of its own: housekeeping whose failure
    /// the save that called it does not share (the next one tries again).
    ///
    /// [`HISTORY_KEEP`]: crate::store::HISTORY_KEEP
    async fn bound_history(&self, fence: &RunFence, state: &[u8]) {
        let trim = crate::store::history::trim_due();
        let large = crate::store::values::blobs::referred(state).is_some();
        if !trim && !large {
            return;
        }
        let trimmed: Result<(), StoreError> = async {
            write_tx!(
                self,
                "collect a run's old checkpoints",
                SyncMode::Normal,
                None,
                |conn, _fenced| {
                    if trim {
                        runs::trim_history(conn, &fence.run_id).await?;
                    }
                    if large {
                        runs::drop_large_states(conn, &fence.run_id).await?;
                    }
                    Ok(())
                }
            )
        }
        .await;
        if let Err(e) = trimmed {
            tracing::debug!(run_id = %fence.run_id, error = %e, "old checkpoints not collected");
        }
    }

    /// Runs `f` on a pooled connection outside any transaction.
    async fn read<T>(
        &self,
        op: &'static str,
        f: impl AsyncFnOnce(&super::conn::Conn) -> Result<T, TxError>,
    ) -> Result<T, StoreError> {
        let conn = self.reader(op).await?;
        f(&conn).await.map_err(|e| self.tx_error(op, e))
    }
}

#[async_trait::async_trait]
impl InstanceStore for PostgresStore {
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        if let OneTrip::Done(outcome) = self.claim_in_one_trip(req).await? {
            return Ok(outcome);
        }
        let fence = Some((req.fence, Lock::Share));
        write_tx!(self, "claim a key", req.sync(), fence, |conn, fenced| {
            held(fenced, req.fence)?;
            claims::claim(conn, req, None).await
        })
    }

    async fn take_over(
        &self,
        req: &ClaimRequest<'_>,
        stale_token: u64,
    ) -> Result<ClaimOutcome, StoreError> {
        let fence = Some((req.fence, Lock::Share));
        write_tx!(
            self,
            "take over a claim",
            req.sync(),
            fence,
            |conn, fenced| {
                held(fenced, req.fence)?;
                claims::claim(conn, req, Some(stale_token)).await
            }
        )
    }

    async fn commit(&self, commit: &Commit<'_>) -> Result<(), StoreError> {
        if let Some(checkpoint) = commit.checkpoint {
            check_checkpoint(checkpoint)?;
        }
        if let Some(counts) = commit.counts {
            check_counts(counts)?;
        }
        self.commit_in_one_trip(commit).await?;
        if let Some(checkpoint) = commit.checkpoint {
            self.bound_history(commit.claim.fence, &checkpoint.state)
                .await;
        }
        Ok(())
    }

    async fn release(&self, claim: &ClaimRef<'_>) -> Result<bool, StoreError> {
        let fence = Some((claim.fence, Lock::Share));
        write_tx!(
            self,
            "release a claim",
            claim.fence.sync,
            fence,
            |conn, fenced| {
                match fenced {
                    Fenced::Lost => Ok(false),
                    _ => claims::release(conn, claim).await,
                }
            }
        )
    }

    async fn renew(
        &self,
        claims: &[ClaimRef<'_>],
        lease: Duration,
    ) -> Result<Vec<bool>, StoreError> {
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        let sync = strongest(claims.iter().map(|c| c.fence.sync));
        write_tx!(self, "renew claims", sync, None, |conn, _fenced| {
            let expires = lease_expiry(conn.now, lease);
            // Claims come in runs: each run's fence is read (and locked) once.
            let mut fences: Vec<(&RunFence, bool)> = Vec::new();
            let mut renewed = Vec::with_capacity(claims.len());
            for claim in claims {
                let holds = match fences.iter().find(|(f, _)| *f == claim.fence) {
                    Some((_, holds)) => *holds,
                    None => {
                        let holds = conn.fence_holds(claim.fence, Lock::Share).await?;
                        fences.push((claim.fence, holds));
                        holds
                    }
                };
                renewed.push(holds && claims::renew_one(conn, claim, expires).await?);
            }
            Ok(renewed)
        })
    }

    async fn park(&self, claim: &ClaimRef<'_>, reason: &str) -> Result<(), StoreError> {
        let fence = Some((claim.fence, Lock::Update));
        write_tx!(
            self,
            "park a claim in doubt",
            claim.fence.sync,
            fence,
            |conn, fenced| {
                held(fenced, claim.fence)?;
                claims::park(conn, claim, reason).await
            }
        )
    }

    async fn committed(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.read("read a result", async |conn| {
            claims::committed(conn, key).await
        })
        .await
    }

    async fn load_progress(&self, run_id: &str) -> Result<Option<Checkpoint>, StoreError> {
        self.read("load progress", async |conn| {
            runs::load_progress(conn, run_id).await
        })
        .await
    }

    async fn save_progress(
        &self,
        fence: &RunFence,
        checkpoint: &Checkpoint,
        counts: Option<&Counts>,
    ) -> Result<(), StoreError> {
        check_checkpoint(checkpoint)?;
        if let Some(counts) = counts {
            check_counts(counts)?;
        }
        let lock = if counts.is_some() {
            Lock::Update
        } else {
            Lock::Share
        };
        write_tx!(
            self,
            "save progress",
            fence.sync,
            Some((fence, lock)),
            |conn, fenced| {
                held(fenced, fence)?;
                if let Some(counts) = counts {
                    runs::save_counts(conn, &fence.run_id, counts).await?;
                }
                let position = Position {
                    lease: fence.token,
                    tick: crate::store::tick(),
                };
                runs::save_checkpoint(conn, &fence.run_id, checkpoint, position).await
            }
        )?;
        self.bound_history(fence, &checkpoint.state).await;
        Ok(())
    }

    async fn save_counts(&self, fence: &RunFence, counts: &Counts) -> Result<(), StoreError> {
        check_counts(counts)?;
        let with = Some((fence, Lock::Update));
        write_tx!(self, "save counts", fence.sync, with, |conn, fenced| {
            held(fenced, fence)?;
            runs::save_counts(conn, &fence.run_id, counts).await
        })
    }

    async fn start_instance(
        &self,
        fence: &RunFence,
        counts: &Counts,
        recycled: Option<&str>,
    ) -> Result<(), StoreError> {
        check_counts(counts)?;
        let with = Some((fence, Lock::Update));
        write_tx!(
            self,
            "start an instance",
            fence.sync,
            with,
            |conn, fenced| {
                held(fenced, fence)?;
                leases::start_instance(conn, fence, counts, recycled).await
            }
        )
    }

    async fn record_usage(&self, record: &UsageRecord<'_>) -> Result<Recorded, StoreError> {
        check_usage(record)?;
        let fence = record.fence;
        let with = Some((fence, Lock::Share));
        write_tx!(
            self,
            "record a model call's usage",
            fence.sync,
            with,
            |conn, fenced| {
                held(fenced, fence)?;
                usage::record(conn, record).await
            }
        )
    }

    async fn append_live(
        &self,
        fence: &RunFence,
        chunks: &[LiveText],
        keep: usize,
    ) -> Result<(), StoreError> {
        // Appends of one run take turns: each numbers its chunks after the newest. Not
        // durable by design (store/live.rs): never a sync of its own.
        let with = Some((fence, Lock::Update));
        write_tx!(
            self,
            "append to a run's live stream",
            SyncMode::Normal,
            with,
            |conn, fenced| {
                held(fenced, fence)?;
                live::append(conn, &fence.run_id, chunks, keep).await
            }
        )
    }

    async fn append_log(
        &self,
        fence: &RunFence,
        bytes: &[u8],
        keep: usize,
    ) -> Result<(), StoreError> {
        // Appends of one run take turns: each reads the newest chunk it extends.
        let with = Some((fence, Lock::Update));
        write_tx!(
            self,
            "append to a run's log",
            fence.sync,
            with,
            |conn, fenced| {
                held(fenced, fence)?;
                logs::append(conn, &fence.run_id, bytes, keep).await
            }
        )
    }

    async fn wait(&self, req: &WaitRequest<'_>) -> Result<WaitState, StoreError> {
        let fence = req.fence;
        let with = Some((fence, Lock::Update));
        let sync = crate::store::rules::wait_sync(&req.kind, fence.sync);
        write_tx!(self, "record a wait", sync, with, |conn, fenced| {
            held(fenced, fence)?;
            waits::wait(conn, fence, req.key, &req.kind).await
        })
    }

    async fn spawn_many(&self, batch: &SpawnBatch<'_>) -> Result<SpawnAnswers, StoreError> {
        let fence = batch.fence;
        let with = Some((fence, Lock::Share));
        write_tx!(
            self,
            "spawn child runs",
            fence.sync,
            with,
            |conn, fenced| {
                held(fenced, fence)?;
                children::spawn_many(conn, batch).await
            }
        )
    }

    async fn join(&self, req: &JoinRequest<'_>) -> Result<WaitState, StoreError> {
        let fence = req.fence;
        let with = Some((fence, Lock::Update));
        write_tx!(self, "join children", fence.sync, with, |conn, fenced| {
            held(fenced, fence)?;
            children::join(conn, req).await
        })
    }
}

#[async_trait::async_trait]
impl WorkerStore for PostgresStore {
    async fn now(&self) -> Result<Millis, StoreError> {
        if self.clock.is_manual() {
            return Ok(self.clock.now());
        }
        self.read("read the time", async |conn| self.server_now(conn).await)
            .await
    }

    async fn next_due(&self, after: Millis) -> Result<Option<Millis>, StoreError> {
        self.read("find the next due run", async |conn| {
            let run = leases::next_due(conn, after).await?;
            let tick = schedules::next_tick(conn, after).await?;
            Ok(run.into_iter().chain(tick).min())
        })
        .await
    }

    async fn acquire_runs(
        &self,
        worker: &str,
        max: usize,
        lease: Duration,
        skip: &[String],
    ) -> Result<Vec<LeasedRun>, StoreError> {
        write_tx!(self, "acquire runs", self.sync, None, |conn, _f| {
            leases::acquire_runs(conn, worker, max, lease, skip).await
        })
    }

    async fn acquire_run(
        &self,
        run_id: &str,
        worker: &str,
        lease: Duration,
    ) -> Result<Acquired, StoreError> {
        write_tx!(self, "acquire a run", self.sync, None, |conn, _f| {
            leases::acquire_run(conn, run_id, worker, lease).await
        })
    }

    async fn renew_runs(
        &self,
        fences: &[RunFence],
        lease: Duration,
    ) -> Result<Vec<LeaseState>, StoreError> {
        if fences.is_empty() {
            return Ok(Vec::new());
        }
        let sync = strongest(fences.iter().map(|f| f.sync));
        write_tx!(self, "renew run leases", sync, None, |conn, _f| {
            leases::renew_runs(conn, fences, lease_expiry(conn.now, lease)).await
        })
    }

    async fn release_run(
        &self,
        fence: &RunFence,
        counts: &Counts,
        note: Option<&str>,
    ) -> Result<(), StoreError> {
        check_counts(counts)?;
        let with = Some((fence, Lock::Update));
        write_tx!(self, "release a run", fence.sync, with, |conn, fenced| {
            held(fenced, fence)?;
            leases::release_run(conn, fence, counts, note).await
        })
    }

    async fn suspend_run(
        &self,
        fence: &RunFence,
        counts: &Counts,
        suspension: &Suspension<'_>,
    ) -> Result<(), StoreError> {
        check_counts(counts)?;
        let with = Some((fence, Lock::Update));
        write_tx!(self, "suspend a run", fence.sync, with, |conn, fenced| {
            held(fenced, fence)?;
            waits::suspend_run(conn, fence, counts, suspension).await
        })
    }

    async fn finish_run(
        &self,
        fence: &RunFence,
        end: RunEnd<'_>,
        counts: &Counts,
    ) -> Result<(), StoreError> {
        check_counts(counts)?;
        let (status, outcome) = match end {
            RunEnd::Completed(output) => (RunStatus::Completed, Some(output)),
            RunEnd::Failed(error) => (RunStatus::Failed, Some(error)),
            RunEnd::InDoubt => (RunStatus::InDoubt, None),
            RunEnd::Cancelled => {
                let with = Some((fence, Lock::Update));
                return write_tx!(self, "finish a run", fence.sync, with, |conn, fenced| {
                    held(fenced, fence)?;
                    leases::finish_cancelled(conn, fence, counts).await
                });
            }
        };
        let lost = || StoreError::LeaseLost {
            run_id: fence.run_id.clone(),
            token: fence.token,
        };
        // A token beyond the server's range was never handed out: it holds nothing.
        let Ok(lease_token) = i64::try_from(fence.token) else {
            return Err(lost());
        };
        // Checked above (`check_counts`): each fits.
        let sql_counts = [
            counts.executed,
            counts.skipped,
            counts.awaited,
            counts.reclaimed,
            counts.instances,
            counts.recycled,
        ]
        .map(|c| i64::try_from(c).unwrap_or(i64::MAX));
        let ended = Ended {
            fence,
            lease_token,
            counts: sql_counts,
            status,
            outcome,
        };
        let job = || FinishJob {
            fenced: BatchFenced {
                run_id: fence.run_id.clone(),
                lease_token,
                key: fence.run_id.clone(),
                sync: fence.sync,
            },
            counts: sql_counts,
            status: status.as_str(),
            outcome: outcome.map(<[u8]>::to_vec),
            counted_down: ended.counted_down(),
        };
        self.batches
            .finish(job, || self.finish_in_one_trip(&ended), lost)
            .await
    }

    // Workers on PostgreSQL may run on other machines, where no lock of this one can
    // see them die: leases alone say when a holder is gone (docs/postgres.md).
    async fn be_present(&self, _holder: &str) -> Result<Presence, StoreError> {
        Ok(Presence::untold())
    }

    async fn is_gone(&self, _holder: &str) -> Result<bool, StoreError> {
        Ok(false)
    }

    async fn gone_holders(&self) -> Result<Vec<String>, StoreError> {
        Ok(Vec::new())
    }

    async fn end_leases_of_gone(&self, _holder: &str) -> Result<u64, StoreError> {
        Ok(0)
    }

    async fn fire_schedules(&self, max: usize) -> Result<Vec<Tick>, StoreError> {
        let manual = self.manual_now();
        let due = self
            .read("look for due schedules", async |conn| {
                schedules::any_due(conn, manual).await
            })
            .await?;
        if !due || max == 0 {
            return Ok(Vec::new());
        }
        write_tx!(self, "fire schedules", self.sync, None, |conn, _f| {
            schedules::fire(conn, max).await
        })
    }
}

#[async_trait::async_trait]
impl CatalogStore for PostgresStore {
    async fn put_component(&self, digest: &str, bytes: &[u8]) -> Result<bool, StoreError> {
        write_tx!(self, "store a component", self.sync, None, |conn, _f| {
            components::put_component(conn, digest, bytes).await
        })
    }

    async fn has_component(&self, digest: &str) -> Result<bool, StoreError> {
        self.read("look up a component", async |conn| {
            components::known(conn, digest).await
        })
        .await
    }

    async fn component(&self, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.read("read a component", async |conn| {
            components::component(conn, digest).await
        })
        .await
    }

    async fn put_blob(&self, digest: &BlobDigest, bytes: &[u8]) -> Result<(), StoreError> {
        write_tx!(self, "store a large value", self.sync, None, |conn, _f| {
            blobs::put(conn, digest, bytes).await
        })
    }

    async fn blob(&self, digest: &BlobDigest) -> Result<Option<Vec<u8>>, StoreError> {
        self.read("read a large value", async |conn| {
            blobs::get(conn, digest).await
        })
        .await
    }

    async fn deploy_version(
        &self,
        deployment: &Deployment<'_>,
        rollout: &Rollout<'_>,
    ) -> Result<Deployed, StoreError> {
        write_tx!(self, "deploy a component", self.sync, None, |conn, _f| {
            components::deploy(conn, deployment, rollout).await
        })
    }

    async fn versions(&self, name: &str) -> Result<Vec<VersionRecord>, StoreError> {
        self.read("list a deployment's versions", async |conn| {
            versions::versions(conn, name).await
        })
        .await
    }

    async fn move_runs(&self, request: &MoveRuns<'_>) -> Result<Vec<RunMove>, StoreError> {
        write_tx!(
            self,
            "move runs to another version",
            self.sync,
            None,
            |conn, _f| { versions::move_runs(conn, request).await }
        )
    }

    async fn run_moves(&self, run_id: &str) -> Result<Vec<RunMove>, StoreError> {
        self.read("read a run's moves", async |conn| {
            versions::run_moves(conn, run_id).await
        })
        .await
    }

    async fn deployment(&self, name: &str) -> Result<Option<DeploymentRecord>, StoreError> {
        self.read("read a deployment", async |conn| {
            components::deployment(conn, name).await
        })
        .await
    }

    async fn deployments(&self) -> Result<Vec<DeploymentRecord>, StoreError> {
        self.read("list deployments", async |conn| {
            components::deployments(conn).await
        })
        .await
    }

    async fn admitted(&self, namespace: &str, digest: &str) -> Result<Option<bool>, StoreError> {
        self.read("read a namespace's members", async |conn| {
            components::admitted(conn, namespace, digest).await
        })
        .await
    }

    async fn set_flow(&self, setting: &FlowSetting<'_>) -> Result<FlowLimits, StoreError> {
        write_tx!(
            self,
            "set a deployment's limits",
            self.sync,
            None,
            |conn, _f| { flow::set_flow(conn, setting).await }
        )
    }

    async fn clear_flow(&self, deployment: &str) -> Result<bool, StoreError> {
        write_tx!(
            self,
            "clear a deployment's limits",
            self.sync,
            None,
            |conn, _f| { flow::clear_flow(conn, deployment).await }
        )
    }

    async fn flows(&self) -> Result<Vec<FlowLimits>, StoreError> {
        self.read("list limits", async |conn| flow::flows(conn).await)
            .await
    }

    async fn set_rate(&self, setting: &RateSetting<'_>) -> Result<RateLimit, StoreError> {
        write_tx!(self, "set a rate limit", self.sync, None, |conn, _f| {
            rates::set_rate(conn, setting).await
        })
    }

    async fn clear_rate(&self, class: &str) -> Result<bool, StoreError> {
        write_tx!(self, "clear a rate limit", self.sync, None, |conn, _f| {
            rates::clear_rate(conn, class).await
        })
    }

    async fn rates(&self) -> Result<Vec<RateLimit>, StoreError> {
        self.read("list rate limits", async |conn| rates::rates(conn).await)
            .await
    }

    async fn upgrade_run(&self, run_id: &str, from: &str, to: &str) -> Result<(), StoreError> {
        write_tx!(self, "upgrade a run", self.sync, None, |conn, _f| {
            versions::upgrade_run(conn, run_id, from, to).await
        })
    }

    async fn data_keys(&self) -> Result<Vec<DataKeyRecord>, StoreError> {
        self.read("read the data keys", async |conn| {
            sealing::data_keys(conn).await
        })
        .await
    }

    async fn put_data_key(&self, record: &DataKeyRecord) -> Result<(), StoreError> {
        write_tx!(
            self,
            "record a data key",
            SyncMode::Full,
            None,
            |conn, _f| { sealing::put_first(conn, record).await }
        )
    }

    async fn rewrap_data_keys(
        &self,
        old_key_id: &str,
        records: &[DataKeyRecord],
    ) -> Result<(), StoreError> {
        write_tx!(
            self,
            "rewrap the data keys",
            SyncMode::Full,
            None,
            |conn, _f| { sealing::rewrap(conn, old_key_id, records).await }
        )
    }

    fn use_sealer(&self, sealer: Arc<Sealer>) {
        // Set once, by whoever seals the store; a second call brings the same keys.
        let _ = self.sealer.set(sealer);
    }
}

#[async_trait::async_trait]
impl OperatorStore for PostgresStore {
    async fn submit(&self, submission: &Submission<'_>) -> Result<Submitted, StoreError> {
        write_tx!(self, "submit a run", self.sync, None, |conn, _f| {
            runs::submit(conn, submission).await
        })
    }

    async fn submit_many(
        &self,
        submissions: &[Submission<'_>],
    ) -> Result<Vec<Result<Submitted, StoreError>>, StoreError> {
        write_tx!(self, "submit runs", self.sync, None, |conn, _f| {
            runs::submit_many(conn, submissions).await
        })
    }

    async fn run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        self.read("read a run", async |conn| runs::run(conn, run_id).await)
            .await
    }

    async fn run_authority(&self, run_id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.read("read a run's authority", async |conn| {
            runs::authority(conn, run_id).await
        })
        .await
    }

    async fn run_input(&self, run_id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.read("read a run's input", async |conn| {
            runs::input(conn, run_id).await
        })
        .await
    }

    async fn runs(&self, filter: &RunFilter<'_>) -> Result<Vec<RunRecord>, StoreError> {
        self.read("list runs", async |conn| runs::runs(conn, filter).await)
            .await
    }

    async fn cancel_run(&self, run_id: &str) -> Result<Cancelled, StoreError> {
        write_tx!(self, "cancel a run", self.sync, None, |conn, _f| {
            runs::cancel_run(conn, run_id).await
        })
    }

    async fn pause_run(&self, run_id: &str) -> Result<Paused, StoreError> {
        write_tx!(self, "pause a run", self.sync, None, |conn, _f| {
            pause::pause_run(conn, run_id).await
        })
    }

    async fn resume_run(&self, run_id: &str) -> Result<Resumed, StoreError> {
        write_tx!(self, "resume a run", self.sync, None, |conn, _f| {
            pause::resume_run(conn, run_id).await
        })
    }

    async fn pause_deployment(&self, name: &str) -> Result<DeploymentPaused, StoreError> {
        write_tx!(self, "pause a deployment", self.sync, None, |conn, _f| {
            pause::pause_deployment(conn, name).await
        })
    }

    async fn resume_deployment(&self, name: &str) -> Result<DeploymentPaused, StoreError> {
        write_tx!(self, "resume a deployment", self.sync, None, |conn, _f| {
            pause::resume_deployment(conn, name).await
        })
    }

    async fn paused_deployments(&self) -> Result<Vec<PausedDeployment>, StoreError> {
        self.read("list paused deployments", async |conn| {
            pause::paused_deployments(conn).await
        })
        .await
    }

    async fn resolve(
        &self,
        run_id: &str,
        key: &str,
        resolution: Resolution<'_>,
    ) -> Result<(), StoreError> {
        write_tx!(
            self,
            "resolve an in-doubt key",
            self.sync,
            None,
            |conn, _f| { claims::resolve(conn, run_id, key, resolution).await }
        )
    }

    async fn send_signal(
        &self,
        run_id: &str,
        name: &str,
        payload: &[u8],
        max_payload: usize,
    ) -> Result<SignalSent, StoreError> {
        write_tx!(self, "send a signal", self.sync, None, |conn, _f| {
            waits::send_signal(conn, run_id, name, payload, max_payload).await
        })
    }

    async fn open_claims(&self, run_id: Option<&str>) -> Result<Vec<OpenClaim>, StoreError> {
        self.read("list open claims", async |conn| {
            claims::open_claims(conn, run_id).await
        })
        .await
    }

    async fn steps(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        self.read("list a run's steps", async |conn| {
            claims::steps(conn, run_id).await
        })
        .await
    }

    async fn waits(&self, run_id: &str) -> Result<Vec<WaitRecord>, StoreError> {
        self.read("read a run's waits", async |conn| {
            waits::waits(conn, run_id).await
        })
        .await
    }

    async fn events(&self, run_id: &str) -> Result<Option<Timeline>, StoreError> {
        self.read("read a run's timeline", async |conn| {
            events::read(conn, run_id).await
        })
        .await
    }

    async fn history(&self, run_id: &str) -> Result<Option<RunHistory>, StoreError> {
        self.read("read a run's history", async |conn| {
            history::history(conn, run_id).await
        })
        .await
    }

    async fn checkpoint_before(
        &self,
        run_id: &str,
        before: Option<Position>,
    ) -> Result<Option<SavedCheckpoint>, StoreError> {
        self.read("read a run's checkpoint", async |conn| {
            history::checkpoint_before(conn, run_id, before).await
        })
        .await
    }

    async fn fork(&self, req: &ForkRequest<'_>) -> Result<Forked, StoreError> {
        write_tx!(self, "fork a run", self.sync, None, |conn, _f| {
            history::fork(conn, req).await
        })
    }

    async fn logs(&self, run_id: &str) -> Result<Vec<u8>, StoreError> {
        self.read("read a run's log", async |conn| {
            logs::read(conn, run_id).await
        })
        .await
    }

    async fn live(
        &self,
        run_id: &str,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<LiveChunk>, StoreError> {
        self.read("read a run's live stream", async |conn| {
            live::read(conn, run_id, after, limit).await
        })
        .await
    }

    async fn create_schedule(&self, def: &ScheduleDef<'_>) -> Result<ScheduleRecord, StoreError> {
        write_tx!(self, "create a schedule", self.sync, None, |conn, _f| {
            schedules::create(conn, def).await
        })
    }

    async fn schedules(&self) -> Result<Vec<ScheduleRecord>, StoreError> {
        self.read("list schedules", async |conn| schedules::list(conn).await)
            .await
    }

    async fn schedule(&self, name: &str) -> Result<Option<ScheduleRecord>, StoreError> {
        self.read("read a schedule", async |conn| {
            schedules::get(conn, name).await
        })
        .await
    }

    async fn pause_schedule(&self, name: &str, paused: bool) -> Result<ScheduleRecord, StoreError> {
        let op = if paused {
            "pause a schedule"
        } else {
            "resume a schedule"
        };
        write_tx!(self, op, self.sync, None, |conn, _f| {
            schedules::pause(conn, name, paused).await
        })
    }

    async fn delete_schedule(&self, name: &str) -> Result<(), StoreError> {
        write_tx!(self, "delete a schedule", self.sync, None, |conn, _f| {
            schedules::delete(conn, name).await
        })
    }

    async fn run_schedule(&self, run_id: &str) -> Result<Option<ScheduledBy>, StoreError> {
        self.read("read a run's schedule", async |conn| {
            schedules::run_schedule(conn, run_id).await
        })
        .await
    }

    async fn usage(&self, filter: &UsageFilter<'_>) -> Result<Vec<UsageTotal>, StoreError> {
        self.read("sum model calls' usage", async |conn| {
            usage::totals(conn, filter).await
        })
        .await
    }

    async fn gc(&self, req: &GcRequest) -> Result<GcReport, StoreError> {
        const OP: &str = "collect garbage";
        let now = self.now().await?;
        let cut = gc::Cut::new(now, req);
        let mut report = cut.report();
        // Keys first: a chunk is read, and locked and written only if something in it
        // goes.
        let mut after = String::new();
        loop {
            let chunk = self
                .read(OP, async |conn| gc::scan_steps(conn, &cut, &after).await)
                .await?;
            let Some(chunk) = chunk else { break };
            if req.dry_run {
                report.results += chunk.results;
                report.claims += chunk.claims;
            } else if chunk.results + chunk.claims > 0 {
                let (results, claims) = write_tx!(self, OP, self.sync, None, |conn, _f| {
                    gc::delete_steps(conn, &cut, &after, &chunk.last).await
                })?;
                report.results += results;
                report.claims += claims;
            }
            after = chunk.last;
        }
        // Then the runs, a batch at a time, with what hangs off them.
        let mut after = 0;
        loop {
            let batch = self
                .read(OP, async |conn| gc::collected_runs(conn, &cut, after).await)
                .await?;
            let Some(&(last, _)) = batch.last() else {
                break;
            };
            after = last;
            let ids: Vec<String> = batch.into_iter().map(|(_, id)| id).collect();
            let part = if req.dry_run {
                self.read(OP, async |conn| {
                    let mut part = GcReport::default();
                    gc::collect_runs(conn, &cut, &ids, true, &mut part).await?;
                    Ok(part)
                })
                .await?
            } else {
                write_tx!(self, OP, self.sync, None, |conn, _f| {
                    let mut part = GcReport::default();
                    gc::collect_runs(conn, &cut, &ids, false, &mut part).await?;
                    Ok(part)
                })?
            };
            report.add(&part);
        }
        // Then the step history of finished runs that stay, if asked.
        if let Some(before) = cut.history_before {
            let mut after = 0;
            loop {
                let batch = self
                    .read(OP, async |conn| {
                        gc::history_runs(conn, &cut, before, after).await
                    })
                    .await?;
                let Some(&(last, ..)) = batch.last() else {
                    break;
                };
                after = last;
                let ids = report.histories_to_collect(batch, req.dry_run);
                if req.dry_run || ids.is_empty() {
                    continue;
                }
                report.checkpoints += write_tx!(self, OP, self.sync, None, |conn, _f| {
                    gc::collect_history(conn, &cut, before, &ids).await
                })?;
            }
        }
        // Last the components no run or deployment uses any more.
        if req.dry_run {
            report.components = self
                .read(OP, async |conn| gc::count_components(conn, &cut).await)
                .await?;
        } else {
            loop {
                let deleted = write_tx!(self, OP, self.sync, None, |conn, _f| {
                    gc::delete_components(conn, &cut).await
                })?;
                if deleted == 0 {
                    break;
                }
                report.components += deleted;
            }
        }
        // And the blobs no row refers to any more.
        let before = blobs::cut(now, report.runs_before);
        if req.dry_run {
            report.blobs = self
                .read(OP, async |conn| blobs::count(conn, before).await)
                .await?;
        } else {
            loop {
                let deleted = write_tx!(self, OP, self.sync, None, |conn, _f| {
                    blobs::delete(conn, before).await
                })?;
                if deleted == 0 {
                    break;
                }
                report.blobs += deleted;
            }
        }
        Ok(report)
    }
}

/// [`SyncMode::Full`] if any of the writes asks for it.
fn strongest(modes: impl IntoIterator<Item = SyncMode>) -> SyncMode {
    if modes.into_iter().any(|mode| mode == SyncMode::Full) {
        SyncMode::Full
    } else {
        SyncMode::Normal
    }
}

/// A run's end (but a cancellation), as the server takes it.
#[derive(Clone, Copy)]
struct Ended<'a> {
    fence: &'a RunFence,
    lease_token: i64,
    counts: [i64; 6],
    status: RunStatus,
    /// `None`: the outcome is left as it is.
    outcome: Option<&'a [u8]>,
}

impl Ended<'_> {
    /// Whether a parent joining the run counts this end: a run left in doubt has not
    /// ended for its parent.
    fn counted_down(&self) -> bool {
        self.status != RunStatus::InDoubt
    }
}

impl PostgresStore {
    /// [`WorkerStore::finish_run`] of a run that did not end cancelled (as `status`,
    /// with `outcome` unless it is to be left as it is): one statement,
    /// [`leases::FINISH_ALONE`] (the clock, the fence, the run's row, its outcome and
    /// its count-down in its parent's join), as its own transaction, where the general
    /// path took nine statements in four round trips. In the rare case it cannot count
    /// the end down (the parent's suspension committed while it ran), it writes
    /// nothing, and the end goes again in a transaction: [`leases::FINISH_IN_TX`],
    /// then the count-down with the `COMMIT`.
    async fn finish_in_one_trip(&self, ended: &Ended<'_>) -> Result<(), StoreError> {
        const OP: &str = "finish a run";
        let Ended {
            fence,
            lease_token: token,
            counts: sql_counts,
            status,
            outcome,
        } = *ended;
        let lost = || StoreError::LeaseLost {
            run_id: fence.run_id.clone(),
            token: fence.token,
        };
        let counted_down = ended.counted_down();
        let manual = self.manual_now();
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 12] = [
            &manual,
            &fence.run_id,
            &token,
            &sql_counts[0],
            &sql_counts[1],
            &sql_counts[2],
            &sql_counts[3],
            &sql_counts[4],
            &sql_counts[5],
            &status.as_str(),
            &outcome,
            &counted_down,
        ];
        match self
            .try_one_statement(OP, fence.sync, leases::FINISH_ALONE, &params)
            .await?
        {
            Ok(row) => {
                return match leases::finished(std::slice::from_ref(&row)) {
                    Ok(Some(_)) => Ok(()),
                    Ok(None) => Err(lost()),
                    Err(e) => Err(self.tx_error(OP, e)),
                };
            }
            Err(e) if leases::is_owed(&e) => {}
            Err(e) => return Err(self.failed(OP, e)),
        }
        let mut tries = 0u32;
        loop {
            let (conn, rows) = self
                .begin_with(OP, fence.sync, leases::FINISH_IN_TX, &params)
                .await?;
            let found = rows.and_then(|rows| leases::finished(&rows));
            let ended = match found {
                Err(e) => self.end(conn, OP, Err::<(), _>(e)).await,
                Ok(None) => {
                    self.end(conn, OP, Err::<(), _>(TxError::Store(lost())))
                        .await
                }
                Ok(Some((None, _))) => self.end(conn, OP, Ok(())).await,
                Ok(Some((Some(parent), now))) => {
                    self.end_with(
                        conn,
                        OP,
                        leases::COUNT_DOWN,
                        &[&parent, &fence.run_id, &now],
                    )
                    .await
                }
            };
            match ended {
                Ok(()) => return Ok(()),
                Err(Some(e)) => return Err(e),
                Err(None) if tries < 5 => tries += 1,
                Err(None) => {
                    return Err(StoreError::Backend {
                        op: OP,
                        source: "the server kept aborting the transaction as deadlocked".into(),
                    });
                }
            }
        }
    }
}
