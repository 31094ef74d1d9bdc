//! [`Sealed`]: a whole store whose payloads are sealed on their way in and opened on
//! their way out, over a backend that keeps them as the bytes it is given.
//!
//! It implements every role, not one (an [`Overlay`](crate::store::Overlay) would not
//! do): payloads cross all four. Each method seals what it passes in, opens what it
//! hands back, and forwards the rest unchanged; the compiler holds it to every method
//! of every role, provided ones included, so that a new method cannot slip past it in
//! clear. Two things it cannot do from outside are the backends': reading a run's
//! concurrency key out of its input, and sealing logs chunk by chunk (their chunks are
//! cut and joined in place; live streams' chunks are sealed there too, measured by
//! their text when trimmed); a backend is handed the same [`Sealer`] for them
//! ([`CatalogStore::use_sealer`]).

use std::sync::Arc;
use std::time::Duration;

use super::{DataKeyRecord, Sealer};
use crate::store::{
    Acquired, Cancelled, CatalogStore, Checkpoint, ChildEnd, ChildSpec, ClaimOutcome, ClaimRef,
    ClaimRequest, Commit, Counts, Deployment, DeploymentPaused, DeploymentRecord, FlowLimits,
    FlowSetting, GcReport, GcRequest, InstanceStore, JoinRequest, LeaseState, LeasedRun, LiveChunk,
    LiveText, Millis, OpenClaim, OperatorStore, Paused, PausedDeployment, RateLimit, RateSetting,
    Rated, Recorded, Resolution, Resumed, RunEnd, RunFence, RunFilter, RunRecord, ScheduleDef,
    ScheduleRecord, ScheduledBy, SignalSent, SpawnAnswers, SpawnBatch, SpawnRequest, Spawned,
    StepRecord, Store, StoreError, Submission, Submitted, Suspension, Tick, UsageFilter,
    UsageRecord, UsageTotal, WaitRecord, WaitRequest, WaitState, WorkerStore, check_signal_payload,
};

/// A store whose payloads are kept sealed (`store/sealing/` says which and how).
#[derive(Debug, Clone)]
pub struct Sealed {
    inner: Arc<dyn Store>,
    sealer: Arc<Sealer>,
}

impl Sealed {
    /// `inner`, its payloads sealed and opened with `sealer`'s keys.
    pub fn new(inner: Arc<dyn Store>, sealer: Arc<Sealer>) -> Sealed {
        Sealed { inner, sealer }
    }

    fn seal(&self, value: &[u8]) -> Result<Vec<u8>, StoreError> {
        Ok(self.sealer.seal(value)?)
    }

    fn open(&self, value: Vec<u8>) -> Result<Vec<u8>, StoreError> {
        Ok(self.sealer.open_vec(value)?)
    }

    fn open_claim(&self, outcome: ClaimOutcome) -> Result<ClaimOutcome, StoreError> {
        Ok(match outcome {
            ClaimOutcome::Committed(result) => ClaimOutcome::Committed(self.open(result)?),
            other => other,
        })
    }

    fn open_wait(&self, state: WaitState) -> Result<WaitState, StoreError> {
        Ok(match state {
            WaitState::Received(payload) => WaitState::Received(self.open(payload)?),
            WaitState::Joined(ends) => WaitState::Joined(
                ends.into_iter()
                    .map(|end| {
                        Ok(ChildEnd {
                            outcome: self.open(end.outcome)?,
                            ..end
                        })
                    })
                    .collect::<Result<_, StoreError>>()?,
            ),
            other => other,
        })
    }

    fn open_record(&self, mut record: RunRecord) -> Result<RunRecord, StoreError> {
        record.outcome = record.outcome.map(|o| self.open(o)).transpose()?;
        Ok(record)
    }

    fn open_submitted(&self, submitted: Submitted) -> Result<Submitted, StoreError> {
        Ok(Submitted {
            record: self.open_record(submitted.record)?,
            ..submitted
        })
    }

    fn open_leased(&self, run: LeasedRun) -> Result<LeasedRun, StoreError> {
        // Every field named: a payload added to a leased run must be opened here.
        let LeasedRun {
            record,
            token,
            input,
            authority,
            checkpoint,
            checkpoint_read,
            instance_counted,
            taken_over,
        } = run;
        Ok(LeasedRun {
            record: self.open_record(record)?,
            token,
            input: self.open(input)?,
            authority: self.open(authority)?,
            checkpoint: checkpoint.map(|c| self.open_checkpoint(c)).transpose()?,
            checkpoint_read,
            instance_counted,
            taken_over,
        })
    }

    fn open_checkpoint(&self, checkpoint: Checkpoint) -> Result<Checkpoint, StoreError> {
        Ok(Checkpoint {
            step: checkpoint.step,
            state: self.open(checkpoint.state)?,
        })
    }

    fn open_deployment(&self, record: DeploymentRecord) -> Result<DeploymentRecord, StoreError> {
        Ok(DeploymentRecord {
            authority: self.open(record.authority)?,
            ..record
        })
    }

    fn open_schedule(&self, record: ScheduleRecord) -> Result<ScheduleRecord, StoreError> {
        Ok(ScheduleRecord {
            input: self.open(record.input)?,
            ..record
        })
    }

    fn sealed_checkpoint(&self, checkpoint: &Checkpoint) -> Result<Checkpoint, StoreError> {
        Ok(Checkpoint {
            step: checkpoint.step,
            state: self.seal(&checkpoint.state)?,
        })
    }
}

#[async_trait::async_trait]
impl InstanceStore for Sealed {
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        self.open_claim(self.inner.claim(req).await?)
    }

    async fn claim_rated(
        &self,
        req: &ClaimRequest<'_>,
        token: &WaitRequest<'_>,
    ) -> Result<Rated, StoreError> {
        Ok(match self.inner.claim_rated(req, token).await? {
            Rated::Claimed(outcome) => Rated::Claimed(self.open_claim(outcome)?),
            due => due,
        })
    }

    async fn take_over(
        &self,
        req: &ClaimRequest<'_>,
        stale_token: u64,
    ) -> Result<ClaimOutcome, StoreError> {
        self.open_claim(self.inner.take_over(req, stale_token).await?)
    }

    async fn commit(&self, commit: &Commit<'_>) -> Result<(), StoreError> {
        let result = self.seal(commit.result)?;
        let checkpoint = commit
            .checkpoint
            .map(|c| self.sealed_checkpoint(c))
            .transpose()?;
        self.inner
            .commit(&Commit {
                result: &result,
                checkpoint: checkpoint.as_ref(),
                ..commit.clone()
            })
            .await
    }

    async fn release(&self, claim: &ClaimRef<'_>) -> Result<bool, StoreError> {
        self.inner.release(claim).await
    }

    async fn renew(
        &self,
        claims: &[ClaimRef<'_>],
        lease: Duration,
    ) -> Result<Vec<bool>, StoreError> {
        self.inner.renew(claims, lease).await
    }

    async fn park(&self, claim: &ClaimRef<'_>, reason: &str) -> Result<(), StoreError> {
        self.inner.park(claim, reason).await
    }

    async fn committed(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner
            .committed(key)
            .await?
            .map(|r| self.open(r))
            .transpose()
    }

    async fn load_progress(&self, run_id: &str) -> Result<Option<Checkpoint>, StoreError> {
        self.inner
            .load_progress(run_id)
            .await?
            .map(|c| self.open_checkpoint(c))
            .transpose()
    }

    async fn save_progress(
        &self,
        fence: &RunFence,
        checkpoint: &Checkpoint,
        counts: Option<&Counts>,
    ) -> Result<(), StoreError> {
        let checkpoint = self.sealed_checkpoint(checkpoint)?;
        self.inner.save_progress(fence, &checkpoint, counts).await
    }

    async fn save_counts(&self, fence: &RunFence, counts: &Counts) -> Result<(), StoreError> {
        self.inner.save_counts(fence, counts).await
    }

    async fn append_log(
        &self,
        fence: &RunFence,
        bytes: &[u8],
        keep: usize,
    ) -> Result<(), StoreError> {
        // The backend seals each chunk it keeps (module docs).
        self.inner.append_log(fence, bytes, keep).await
    }

    async fn append_live(
        &self,
        fence: &RunFence,
        chunks: &[LiveText],
        keep: usize,
    ) -> Result<(), StoreError> {
        // The backend seals each chunk's text (module docs).
        self.inner.append_live(fence, chunks, keep).await
    }

    async fn wait(&self, req: &WaitRequest<'_>) -> Result<WaitState, StoreError> {
        self.open_wait(self.inner.wait(req).await?)
    }

    async fn spawn(&self, req: &SpawnRequest<'_>) -> Result<Spawned, StoreError> {
        let input = self.seal(req.input)?;
        self.inner
            .spawn(&SpawnRequest {
                input: &input,
                ..req.clone()
            })
            .await
    }

    async fn spawn_many(&self, batch: &SpawnBatch<'_>) -> Result<SpawnAnswers, StoreError> {
        let inputs = batch
            .children
            .iter()
            .map(|c| self.seal(c.input))
            .collect::<Result<Vec<_>, _>>()?;
        let children: Vec<ChildSpec<'_>> = batch
            .children
            .iter()
            .zip(&inputs)
            .map(|(child, input)| ChildSpec {
                input,
                ..child.clone()
            })
            .collect();
        self.inner
            .spawn_many(&SpawnBatch {
                children: &children,
                ..batch.clone()
            })
            .await
    }

    async fn join(&self, req: &JoinRequest<'_>) -> Result<WaitState, StoreError> {
        self.open_wait(self.inner.join(req).await?)
    }

    // Usage is counts and a model name, kept in clear (docs/security.md): nothing to seal.
    async fn record_usage(&self, record: &UsageRecord<'_>) -> Result<Recorded, StoreError> {
        self.inner.record_usage(record).await
    }
}

#[async_trait::async_trait]
impl WorkerStore for Sealed {
    async fn now(&self) -> Result<Millis, StoreError> {
        self.inner.now().await
    }

    async fn next_due(&self, after: Millis) -> Result<Option<Millis>, StoreError> {
        self.inner.next_due(after).await
    }

    async fn acquire_runs(
        &self,
        worker: &str,
        max: usize,
        lease: Duration,
        skip: &[String],
    ) -> Result<Vec<LeasedRun>, StoreError> {
        self.inner
            .acquire_runs(worker, max, lease, skip)
            .await?
            .into_iter()
            .map(|run| self.open_leased(run))
            .collect()
    }

    async fn acquire_run(
        &self,
        run_id: &str,
        worker: &str,
        lease: Duration,
    ) -> Result<Acquired, StoreError> {
        Ok(match self.inner.acquire_run(run_id, worker, lease).await? {
            Acquired::Leased(run) => Acquired::Leased(self.open_leased(run)?),
            Acquired::Finished(record) => Acquired::Finished(self.open_record(record)?),
            Acquired::Paused(record) => Acquired::Paused(self.open_record(record)?),
            held @ Acquired::Held(_) => held,
        })
    }

    async fn renew_runs(
        &self,
        fences: &[RunFence],
        lease: Duration,
    ) -> Result<Vec<LeaseState>, StoreError> {
        self.inner.renew_runs(fences, lease).await
    }

    async fn release_run(
        &self,
        fence: &RunFence,
        counts: &Counts,
        note: Option<&str>,
    ) -> Result<(), StoreError> {
        self.inner.release_run(fence, counts, note).await
    }

    async fn suspend_run(
        &self,
        fence: &RunFence,
        counts: &Counts,
        suspension: &Suspension<'_>,
    ) -> Result<(), StoreError> {
        self.inner.suspend_run(fence, counts, suspension).await
    }

    async fn finish_run(
        &self,
        fence: &RunFence,
        end: RunEnd<'_>,
        counts: &Counts,
    ) -> Result<(), StoreError> {
        let sealed;
        let end = match end {
            RunEnd::Completed(output) => {
                sealed = self.seal(output)?;
                RunEnd::Completed(&sealed)
            }
            RunEnd::Failed(error) => {
                sealed = self.seal(error)?;
                RunEnd::Failed(&sealed)
            }
            other => other,
        };
        self.inner.finish_run(fence, end, counts).await
    }

    async fn be_present(&self, holder: &str) -> Result<crate::store::Presence, StoreError> {
        self.inner.be_present(holder).await
    }

    async fn is_gone(&self, holder: &str) -> Result<bool, StoreError> {
        self.inner.is_gone(holder).await
    }

    async fn gone_holders(&self) -> Result<Vec<String>, StoreError> {
        self.inner.gone_holders().await
    }

    async fn end_leases_of_gone(&self, holder: &str) -> Result<u64, StoreError> {
        self.inner.end_leases_of_gone(holder).await
    }

    async fn fire_schedules(&self, max: usize) -> Result<Vec<Tick>, StoreError> {
        // A tick copies its schedule's sealed input into the run it starts.
        self.inner.fire_schedules(max).await
    }
}

#[async_trait::async_trait]
impl CatalogStore for Sealed {
    async fn put_component(&self, digest: &str, bytes: &[u8]) -> Result<bool, StoreError> {
        self.inner.put_component(digest, bytes).await
    }

    async fn has_component(&self, digest: &str) -> Result<bool, StoreError> {
        self.inner.has_component(digest).await
    }

    async fn component(&self, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.component(digest).await
    }

    async fn deploy(&self, deployment: &Deployment<'_>) -> Result<DeploymentRecord, StoreError> {
        let authority = self.seal(deployment.authority)?;
        let record = self
            .inner
            .deploy(&Deployment {
                authority: &authority,
                ..deployment.clone()
            })
            .await?;
        self.open_deployment(record)
    }

    async fn deployment(&self, name: &str) -> Result<Option<DeploymentRecord>, StoreError> {
        self.inner
            .deployment(name)
            .await?
            .map(|r| self.open_deployment(r))
            .transpose()
    }

    async fn deployments(&self) -> Result<Vec<DeploymentRecord>, StoreError> {
        self.inner
            .deployments()
            .await?
            .into_iter()
            .map(|r| self.open_deployment(r))
            .collect()
    }

    async fn admitted(&self, namespace: &str, digest: &str) -> Result<Option<bool>, StoreError> {
        self.inner.admitted(namespace, digest).await
    }

    async fn upgrade_run(&self, run_id: &str, from: &str, to: &str) -> Result<(), StoreError> {
        self.inner.upgrade_run(run_id, from, to).await
    }

    async fn set_flow(&self, setting: &FlowSetting<'_>) -> Result<FlowLimits, StoreError> {
        self.inner.set_flow(setting).await
    }

    async fn clear_flow(&self, deployment: &str) -> Result<bool, StoreError> {
        self.inner.clear_flow(deployment).await
    }

    async fn flows(&self) -> Result<Vec<FlowLimits>, StoreError> {
        self.inner.flows().await
    }

    async fn set_rate(&self, setting: &RateSetting<'_>) -> Result<RateLimit, StoreError> {
        self.inner.set_rate(setting).await
    }

    async fn clear_rate(&self, class: &str) -> Result<bool, StoreError> {
        self.inner.clear_rate(class).await
    }

    async fn rates(&self) -> Result<Vec<RateLimit>, StoreError> {
        self.inner.rates().await
    }

    async fn data_keys(&self) -> Result<Vec<DataKeyRecord>, StoreError> {
        self.inner.data_keys().await
    }

    async fn put_data_key(&self, record: &DataKeyRecord) -> Result<(), StoreError> {
        self.inner.put_data_key(record).await
    }

    async fn rewrap_data_keys(
        &self,
        old_key_id: &str,
        records: &[DataKeyRecord],
    ) -> Result<(), StoreError> {
        self.inner.rewrap_data_keys(old_key_id, records).await
    }

    fn use_sealer(&self, sealer: Arc<Sealer>) {
        self.inner.use_sealer(sealer);
    }
}

#[async_trait::async_trait]
impl OperatorStore for Sealed {
    async fn submit(&self, submission: &Submission<'_>) -> Result<Submitted, StoreError> {
        let (input, authority) = (
            self.seal(submission.input)?,
            self.seal(submission.authority)?,
        );
        let submitted = self
            .inner
            .submit(&Submission {
                input: &input,
                authority: &authority,
                ..submission.clone()
            })
            .await?;
        self.open_submitted(submitted)
    }

    async fn submit_many(
        &self,
        submissions: &[Submission<'_>],
    ) -> Result<Vec<Result<Submitted, StoreError>>, StoreError> {
        let mut sealed = Vec::with_capacity(submissions.len());
        for s in submissions {
            sealed.push((self.seal(s.input)?, self.seal(s.authority)?));
        }
        let sealed: Vec<Submission<'_>> = submissions
            .iter()
            .zip(&sealed)
            .map(|(s, (input, authority))| Submission {
                input,
                authority,
                ..s.clone()
            })
            .collect();
        self.inner
            .submit_many(&sealed)
            .await?
            .into_iter()
            .map(|answer| match answer {
                Ok(submitted) => self.open_submitted(submitted).map(Ok),
                Err(refusal) => Ok(Err(refusal)),
            })
            .collect::<Result<Vec<_>, StoreError>>()
    }

    async fn run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        self.inner
            .run(run_id)
            .await?
            .map(|r| self.open_record(r))
            .transpose()
    }

    async fn run_authority(&self, run_id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner
            .run_authority(run_id)
            .await?
            .map(|a| self.open(a))
            .transpose()
    }

    async fn runs(&self, filter: &RunFilter<'_>) -> Result<Vec<RunRecord>, StoreError> {
        self.inner
            .runs(filter)
            .await?
            .into_iter()
            .map(|r| self.open_record(r))
            .collect()
    }

    async fn cancel_run(&self, run_id: &str) -> Result<Cancelled, StoreError> {
        self.inner.cancel_run(run_id).await
    }

    async fn pause_run(&self, run_id: &str) -> Result<Paused, StoreError> {
        self.inner.pause_run(run_id).await
    }

    async fn resume_run(&self, run_id: &str) -> Result<Resumed, StoreError> {
        self.inner.resume_run(run_id).await
    }

    async fn pause_deployment(&self, name: &str) -> Result<DeploymentPaused, StoreError> {
        self.inner.pause_deployment(name).await
    }

    async fn resume_deployment(&self, name: &str) -> Result<DeploymentPaused, StoreError> {
        self.inner.resume_deployment(name).await
    }

    async fn paused_deployments(&self) -> Result<Vec<PausedDeployment>, StoreError> {
        self.inner.paused_deployments().await
    }

    async fn resolve(
        &self,
        run_id: &str,
        key: &str,
        resolution: Resolution<'_>,
    ) -> Result<(), StoreError> {
        let sealed;
        let resolution = match resolution {
            Resolution::Commit(result) => {
                sealed = self.seal(result)?;
                Resolution::Commit(&sealed)
            }
            Resolution::Retry => Resolution::Retry,
        };
        self.inner.resolve(run_id, key, resolution).await
    }

    async fn send_signal(
        &self,
        run_id: &str,
        name: &str,
        payload: &[u8],
        max_payload: usize,
    ) -> Result<SignalSent, StoreError> {
        // The limit is the clear payload's; the sealed one is longer by the overhead.
        check_signal_payload(payload.len(), max_payload).map_err(|reason| {
            StoreError::SignalRefused {
                run_id: run_id.to_owned(),
                reason,
            }
        })?;
        let sealed = self.seal(payload)?;
        self.inner
            .send_signal(run_id, name, &sealed, sealed.len())
            .await
    }

    async fn open_claims(&self, run_id: Option<&str>) -> Result<Vec<OpenClaim>, StoreError> {
        self.inner.open_claims(run_id).await
    }

    async fn steps(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        self.inner.steps(run_id).await
    }

    async fn waits(&self, run_id: &str) -> Result<Vec<WaitRecord>, StoreError> {
        self.inner.waits(run_id).await
    }

    async fn logs(&self, run_id: &str) -> Result<Vec<u8>, StoreError> {
        // The backend opens each chunk (module docs).
        self.inner.logs(run_id).await
    }

    async fn live(
        &self,
        run_id: &str,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<LiveChunk>, StoreError> {
        // The backend opens each chunk's text (module docs).
        self.inner.live(run_id, after, limit).await
    }

    async fn gc(&self, req: &GcRequest) -> Result<GcReport, StoreError> {
        self.inner.gc(req).await
    }

    async fn create_schedule(&self, def: &ScheduleDef<'_>) -> Result<ScheduleRecord, StoreError> {
        let input = self.seal(def.input)?;
        let record = self
            .inner
            .create_schedule(&ScheduleDef {
                input: &input,
                ..def.clone()
            })
            .await?;
        self.open_schedule(record)
    }

    async fn schedules(&self) -> Result<Vec<ScheduleRecord>, StoreError> {
        self.inner
            .schedules()
            .await?
            .into_iter()
            .map(|r| self.open_schedule(r))
            .collect()
    }

    async fn schedule(&self, name: &str) -> Result<Option<ScheduleRecord>, StoreError> {
        self.inner
            .schedule(name)
            .await?
            .map(|r| self.open_schedule(r))
            .transpose()
    }

    async fn pause_schedule(&self, name: &str, paused: bool) -> Result<ScheduleRecord, StoreError> {
        self.open_schedule(self.inner.pause_schedule(name, paused).await?)
    }

    async fn delete_schedule(&self, name: &str) -> Result<(), StoreError> {
        self.inner.delete_schedule(name).await
    }

    async fn run_schedule(&self, run_id: &str) -> Result<Option<ScheduledBy>, StoreError> {
        self.inner.run_schedule(run_id).await
    }

    async fn usage(&self, filter: &UsageFilter<'_>) -> Result<Vec<UsageTotal>, StoreError> {
        self.inner.usage(filter).await
    }
}
