//! [`ValueStore`]: the layer every value a store keeps crosses on its way in and out,
//! over a backend that keeps them as the bytes it is given. On the way in a value is
//! sealed, in a store encrypted at rest (`store/sealing/`), then, when large, kept
//! once by digest in the blob tables with a reference in its row (`blobs`); on the way
//! out a reference is read back (and its digest checked) and the value opened.
//!
//! It implements every role, not one (an [`Overlay`](crate::store::Overlay) would not
//! do): values cross all four. Each method keeps what it passes in, opens what it
//! hands back, and forwards the rest unchanged; the compiler holds it to every method
//! of every role, provided ones included, so that a new method cannot slip past it in
//! clear. Authorities are sealed but never kept as blobs (they are small, and the
//! store compares them in place). What it cannot do from outside is the backends':
//! reading a run's concurrency key out of its input (a reference is read from the blob
//! tables, then opened), and sealing logs chunk by chunk (their chunks are cut and
//! joined in place; live streams' chunks are sealed there too, measured by their text
//! when trimmed); a backend is handed the same [`Sealer`] for them
//! ([`CatalogStore::use_sealer`]).
//!
//! A blob is written (or, when it is there already, marked used) in a write of its
//! own, just before the write that refers to it: gc collects only blobs nothing refers
//! to and unused for [`BLOB_GRACE`], so it never takes one between the two.

pub mod blobs;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use self::blobs::BlobDigest;
use super::{DataKeyRecord, Sealer};
use crate::store::{
    Acquired, Cancelled, CatalogStore, Checkpoint, ChildEnd, ChildSpec, ClaimOutcome, ClaimRef,
    ClaimRequest, Commit, Counts, Deployed, Deployment, DeploymentPaused, DeploymentRecord,
    FlowLimits, FlowSetting, ForkRequest, Forked, GcReport, GcRequest, InstanceStore, JoinRequest,
    LeaseState, LeasedRun, LiveChunk, LiveText, Millis, MoveRuns, OpenClaim, OperatorStore, Paused,
    PausedDeployment, Position, RateLimit, RateSetting, Rated, Recorded, Resolution, Resumed,
    Rollout, RunEnd, RunFence, RunFilter, RunHistory, RunMove, RunRecord, SavedCheckpoint,
    ScheduleDef, ScheduleRecord, ScheduledBy, SignalSent, SpawnAnswers, SpawnBatch, SpawnRequest,
    Spawned, StepRecord, Store, StoreError, Submission, Submitted, Suspension, Tick, Timeline,
    UsageFilter, UsageRecord, UsageTotal, VersionRecord, WaitRecord, WaitRequest, WaitState,
    WorkerStore, check_signal_payload,
};

/// How long a blob stays after its last use, referred to or not: longer than any one
/// write that refers to it can take, so that gc never collects a blob between its
/// write and the write that refers to it.
pub const BLOB_GRACE: Duration = Duration::from_secs(10 * 60);

/// A store whose values are kept sealed when it is encrypted at rest, and large ones
/// by digest (module docs).
#[derive(Debug, Clone)]
pub struct ValueStore {
    inner: Arc<dyn Store>,
    sealer: Option<Arc<Sealer>>,
}

impl ValueStore {
    /// `inner`, its values sealed and opened with `sealer`'s keys when there is one.
    pub fn new(inner: Arc<dyn Store>, sealer: Option<Arc<Sealer>>) -> ValueStore {
        ValueStore { inner, sealer }
    }

    /// A value as the store keeps it in place: sealed when the store is encrypted.
    /// Authorities go only this far.
    fn seal<'v>(&self, value: &'v [u8]) -> Result<Cow<'v, [u8]>, StoreError> {
        Ok(match &self.sealer {
            Some(sealer) => Cow::Owned(sealer.seal(value)?),
            None => Cow::Borrowed(value),
        })
    }

    /// A value as the store keeps it in its row: sealed, then a reference to its blob
    /// when it is large (the blob written first).
    async fn keep<'v>(&self, value: &'v [u8]) -> Result<Cow<'v, [u8]>, StoreError> {
        let sealed = self.seal(value)?;
        if !blobs::offloaded(&sealed) {
            return Ok(sealed);
        }
        let digest = blobs::digest(&sealed);
        self.inner.put_blob(&digest, &sealed).await?;
        Ok(Cow::Owned(blobs::reference(&digest).to_vec()))
    }

    /// A sealed value in the clear (an authority).
    fn unseal(&self, value: Vec<u8>) -> Result<Vec<u8>, StoreError> {
        match &self.sealer {
            Some(sealer) => Ok(sealer.open_vec(value)?),
            None => Ok(value),
        }
    }

    /// A kept value in the clear: its blob read when it is a reference, then opened.
    async fn open(&self, kept: Vec<u8>) -> Result<Vec<u8>, StoreError> {
        let value = match blobs::referred(&kept) {
            Some(digest) => self.read_blob(&digest).await?,
            None => kept,
        };
        self.unseal(value)
    }

    async fn read_blob(&self, digest: &BlobDigest) -> Result<Vec<u8>, StoreError> {
        let missing = |reason: &str| StoreError::BadBlob {
            digest: blobs::hex(digest),
            reason: reason.to_owned(),
        };
        let bytes = self
            .inner
            .blob(digest)
            .await?
            .ok_or_else(|| missing("no blob has this digest"))?;
        if blobs::digest(&bytes) != *digest {
            return Err(missing("its bytes do not have this digest"));
        }
        Ok(bytes)
    }

    async fn open_opt(&self, kept: Option<Vec<u8>>) -> Result<Option<Vec<u8>>, StoreError> {
        match kept {
            Some(kept) => Ok(Some(self.open(kept).await?)),
            None => Ok(None),
        }
    }

    async fn open_claim(&self, outcome: ClaimOutcome) -> Result<ClaimOutcome, StoreError> {
        Ok(match outcome {
            ClaimOutcome::Committed(result) => ClaimOutcome::Committed(self.open(result).await?),
            other => other,
        })
    }

    async fn open_wait(&self, state: WaitState) -> Result<WaitState, StoreError> {
        Ok(match state {
            WaitState::Received(payload) => WaitState::Received(self.open(payload).await?),
            WaitState::Joined(ends) => {
                let mut opened = Vec::with_capacity(ends.len());
                for end in ends {
                    opened.push(ChildEnd {
                        outcome: self.open(end.outcome).await?,
                        ..end
                    });
                }
                WaitState::Joined(opened)
            }
            other => other,
        })
    }

    async fn open_record(&self, mut record: RunRecord) -> Result<RunRecord, StoreError> {
        record.outcome = self.open_opt(record.outcome).await?;
        Ok(record)
    }

    async fn open_records(&self, records: Vec<RunRecord>) -> Result<Vec<RunRecord>, StoreError> {
        let mut opened = Vec::with_capacity(records.len());
        for record in records {
            opened.push(self.open_record(record).await?);
        }
        Ok(opened)
    }

    async fn open_submitted(&self, submitted: Submitted) -> Result<Submitted, StoreError> {
        Ok(Submitted {
            record: self.open_record(submitted.record).await?,
            ..submitted
        })
    }

    async fn open_leased(&self, run: LeasedRun) -> Result<LeasedRun, StoreError> {
        // Every field named: a value added to a leased run must be opened here.
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
        let checkpoint = match checkpoint {
            Some(c) => Some(self.open_checkpoint(c).await?),
            None => None,
        };
        Ok(LeasedRun {
            record: self.open_record(record).await?,
            token,
            input: self.open(input).await?,
            authority: self.unseal(authority)?,
            checkpoint,
            checkpoint_read,
            instance_counted,
            taken_over,
        })
    }

    async fn open_checkpoint(&self, checkpoint: Checkpoint) -> Result<Checkpoint, StoreError> {
        Ok(Checkpoint {
            step: checkpoint.step,
            state: self.open(checkpoint.state).await?,
        })
    }

    fn open_deployment(&self, record: DeploymentRecord) -> Result<DeploymentRecord, StoreError> {
        Ok(DeploymentRecord {
            authority: self.unseal(record.authority)?,
            ..record
        })
    }

    async fn open_schedule(&self, record: ScheduleRecord) -> Result<ScheduleRecord, StoreError> {
        Ok(ScheduleRecord {
            input: self.open(record.input).await?,
            ..record
        })
    }

    async fn open_schedules(
        &self,
        records: Vec<ScheduleRecord>,
    ) -> Result<Vec<ScheduleRecord>, StoreError> {
        let mut opened = Vec::with_capacity(records.len());
        for record in records {
            opened.push(self.open_schedule(record).await?);
        }
        Ok(opened)
    }

    async fn kept_checkpoint(&self, checkpoint: &Checkpoint) -> Result<Checkpoint, StoreError> {
        Ok(Checkpoint {
            step: checkpoint.step,
            state: self.keep(&checkpoint.state).await?.into_owned(),
        })
    }
}

#[async_trait::async_trait]
impl InstanceStore for ValueStore {
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        self.open_claim(self.inner.claim(req).await?).await
    }

    async fn claim_rated(
        &self,
        req: &ClaimRequest<'_>,
        token: &WaitRequest<'_>,
    ) -> Result<Rated, StoreError> {
        Ok(match self.inner.claim_rated(req, token).await? {
            Rated::Claimed(outcome) => Rated::Claimed(self.open_claim(outcome).await?),
            due => due,
        })
    }

    async fn take_over(
        &self,
        req: &ClaimRequest<'_>,
        stale_token: u64,
    ) -> Result<ClaimOutcome, StoreError> {
        self.open_claim(self.inner.take_over(req, stale_token).await?)
            .await
    }

    async fn commit(&self, commit: &Commit<'_>) -> Result<(), StoreError> {
        let result = self.keep(commit.result).await?;
        let checkpoint = match commit.checkpoint {
            Some(c) => Some(self.kept_checkpoint(c).await?),
            None => None,
        };
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
        let kept = self.inner.committed(key).await?;
        self.open_opt(kept).await
    }

    async fn load_progress(&self, run_id: &str) -> Result<Option<Checkpoint>, StoreError> {
        match self.inner.load_progress(run_id).await? {
            Some(c) => Ok(Some(self.open_checkpoint(c).await?)),
            None => Ok(None),
        }
    }

    async fn save_progress(
        &self,
        fence: &RunFence,
        checkpoint: &Checkpoint,
        counts: Option<&Counts>,
    ) -> Result<(), StoreError> {
        let checkpoint = self.kept_checkpoint(checkpoint).await?;
        self.inner.save_progress(fence, &checkpoint, counts).await
    }

    async fn save_counts(&self, fence: &RunFence, counts: &Counts) -> Result<(), StoreError> {
        self.inner.save_counts(fence, counts).await
    }

    async fn start_instance(
        &self,
        fence: &RunFence,
        counts: &Counts,
        recycled: Option<&str>,
    ) -> Result<(), StoreError> {
        self.inner.start_instance(fence, counts, recycled).await
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
        self.open_wait(self.inner.wait(req).await?).await
    }

    async fn spawn(&self, req: &SpawnRequest<'_>) -> Result<Spawned, StoreError> {
        let input = self.keep(req.input).await?;
        self.inner
            .spawn(&SpawnRequest {
                input: &input,
                ..req.clone()
            })
            .await
    }

    async fn spawn_many(&self, batch: &SpawnBatch<'_>) -> Result<SpawnAnswers, StoreError> {
        let mut inputs = Vec::with_capacity(batch.children.len());
        for child in batch.children {
            inputs.push(self.keep(child.input).await?);
        }
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
        self.open_wait(self.inner.join(req).await?).await
    }

    // Usage is counts and a model name, kept in clear (docs/security.md): nothing to seal.
    async fn record_usage(&self, record: &UsageRecord<'_>) -> Result<Recorded, StoreError> {
        self.inner.record_usage(record).await
    }
}

#[async_trait::async_trait]
impl WorkerStore for ValueStore {
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
        let runs = self.inner.acquire_runs(worker, max, lease, skip).await?;
        let mut opened = Vec::with_capacity(runs.len());
        for run in runs {
            opened.push(self.open_leased(run).await?);
        }
        Ok(opened)
    }

    async fn acquire_run(
        &self,
        run_id: &str,
        worker: &str,
        lease: Duration,
    ) -> Result<Acquired, StoreError> {
        Ok(match self.inner.acquire_run(run_id, worker, lease).await? {
            Acquired::Leased(run) => Acquired::Leased(self.open_leased(run).await?),
            Acquired::Finished(record) => Acquired::Finished(self.open_record(record).await?),
            Acquired::Paused(record) => Acquired::Paused(self.open_record(record).await?),
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
                sealed = self.keep(output).await?;
                RunEnd::Completed(&sealed)
            }
            RunEnd::Failed(error) => {
                sealed = self.keep(error).await?;
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
impl CatalogStore for ValueStore {
    async fn put_component(&self, digest: &str, bytes: &[u8]) -> Result<bool, StoreError> {
        self.inner.put_component(digest, bytes).await
    }

    async fn has_component(&self, digest: &str) -> Result<bool, StoreError> {
        self.inner.has_component(digest).await
    }

    async fn component(&self, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.component(digest).await
    }

    async fn put_blob(&self, digest: &BlobDigest, bytes: &[u8]) -> Result<(), StoreError> {
        self.inner.put_blob(digest, bytes).await
    }

    async fn blob(&self, digest: &BlobDigest) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.blob(digest).await
    }

    async fn deploy_version(
        &self,
        deployment: &Deployment<'_>,
        rollout: &Rollout<'_>,
    ) -> Result<Deployed, StoreError> {
        let authority = self.seal(deployment.authority)?;
        let deployed = self
            .inner
            .deploy_version(
                &Deployment {
                    authority: &authority,
                    ..deployment.clone()
                },
                rollout,
            )
            .await?;
        Ok(Deployed {
            record: self.open_deployment(deployed.record)?,
            ..deployed
        })
    }

    async fn versions(&self, name: &str) -> Result<Vec<VersionRecord>, StoreError> {
        self.inner
            .versions(name)
            .await?
            .into_iter()
            .map(|v| {
                Ok(VersionRecord {
                    deployment: self.open_deployment(v.deployment)?,
                    ..v
                })
            })
            .collect()
    }

    async fn move_runs(&self, request: &MoveRuns<'_>) -> Result<Vec<RunMove>, StoreError> {
        self.inner.move_runs(request).await
    }

    async fn run_moves(&self, run_id: &str) -> Result<Vec<RunMove>, StoreError> {
        self.inner.run_moves(run_id).await
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
impl OperatorStore for ValueStore {
    async fn submit(&self, submission: &Submission<'_>) -> Result<Submitted, StoreError> {
        let (input, authority) = (
            self.keep(submission.input).await?,
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
        self.open_submitted(submitted).await
    }

    async fn submit_many(
        &self,
        submissions: &[Submission<'_>],
    ) -> Result<Vec<Result<Submitted, StoreError>>, StoreError> {
        let mut sealed = Vec::with_capacity(submissions.len());
        for s in submissions {
            sealed.push((self.keep(s.input).await?, self.seal(s.authority)?));
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
        let answers = self.inner.submit_many(&sealed).await?;
        let mut opened = Vec::with_capacity(answers.len());
        for answer in answers {
            opened.push(match answer {
                Ok(submitted) => Ok(self.open_submitted(submitted).await?),
                Err(refusal) => Err(refusal),
            });
        }
        Ok(opened)
    }

    async fn run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        match self.inner.run(run_id).await? {
            Some(record) => Ok(Some(self.open_record(record).await?)),
            None => Ok(None),
        }
    }

    async fn run_authority(&self, run_id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner
            .run_authority(run_id)
            .await?
            .map(|a| self.unseal(a))
            .transpose()
    }

    async fn run_input(&self, run_id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        match self.inner.run_input(run_id).await? {
            Some(kept) => Ok(Some(self.open(kept).await?)),
            None => Ok(None),
        }
    }

    async fn runs(&self, filter: &RunFilter<'_>) -> Result<Vec<RunRecord>, StoreError> {
        let records = self.inner.runs(filter).await?;
        self.open_records(records).await
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
                sealed = self.keep(result).await?;
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
        let sealed = self.keep(payload).await?;
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

    async fn events(&self, run_id: &str) -> Result<Option<Timeline>, StoreError> {
        // Events hold metadata only, never a value (`store/events.rs`).
        self.inner.events(run_id).await
    }

    async fn history(&self, run_id: &str) -> Result<Option<RunHistory>, StoreError> {
        // Positions, keys and sizes: no value.
        self.inner.history(run_id).await
    }

    async fn checkpoint_before(
        &self,
        run_id: &str,
        before: Option<Position>,
    ) -> Result<Option<SavedCheckpoint>, StoreError> {
        let Some(saved) = self.inner.checkpoint_before(run_id, before).await? else {
            return Ok(None);
        };
        let state = self.open(saved.checkpoint.state).await?;
        Ok(Some(SavedCheckpoint {
            checkpoint: Checkpoint {
                state,
                ..saved.checkpoint
            },
            ..saved
        }))
    }

    async fn fork(&self, req: &ForkRequest<'_>) -> Result<Forked, StoreError> {
        // A new input is kept as a submission's is; the original's, and the results and
        // checkpoint copied, the backend copies as it keeps them.
        let input = match req.input {
            Some(input) => Some(self.keep(input).await?),
            None => None,
        };
        let forked = self
            .inner
            .fork(&ForkRequest {
                input: input.as_deref(),
                ..req.clone()
            })
            .await?;
        let record = self.open_record(forked.record).await?;
        Ok(Forked { record, ..forked })
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
        let input = self.keep(def.input).await?;
        let record = self
            .inner
            .create_schedule(&ScheduleDef {
                input: &input,
                ..def.clone()
            })
            .await?;
        self.open_schedule(record).await
    }

    async fn schedules(&self) -> Result<Vec<ScheduleRecord>, StoreError> {
        let records = self.inner.schedules().await?;
        self.open_schedules(records).await
    }

    async fn schedule(&self, name: &str) -> Result<Option<ScheduleRecord>, StoreError> {
        match self.inner.schedule(name).await? {
            Some(record) => Ok(Some(self.open_schedule(record).await?)),
            None => Ok(None),
        }
    }

    async fn pause_schedule(&self, name: &str, paused: bool) -> Result<ScheduleRecord, StoreError> {
        let record = self.inner.pause_schedule(name, paused).await?;
        self.open_schedule(record).await
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
