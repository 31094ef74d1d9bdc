//! A store that remembers what it told the host: every grant and every commit that
//! returned, so that a power-loss test knows what was acknowledged before the cut. It
//! wraps the real store and changes nothing.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use idem::store::{
    Acquired, Cancelled, Checkpoint, ClaimOutcome, ClaimRef, ClaimRequest, Commit, Counts,
    Deployment, DeploymentRecord, GcReport, GcRequest, LeaseState, LeasedRun, Millis, OpenClaim,
    Resolution, RunEnd, RunFence, RunFilter, RunRecord, SignalSent, StepRecord, Store, StoreError,
    Submission, Submitted, Suspension, WaitRecord, WaitRequest, WaitState,
};

/// A grant the store answered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Granted {
    pub key: String,
    pub token: u64,
    pub in_doubt: bool,
}

/// A commit that returned to the host: acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acked {
    pub key: String,
    pub token: u64,
    pub result: Vec<u8>,
}

#[derive(Debug, Default, Clone)]
pub struct Record {
    pub grants: Vec<Granted>,
    pub acked: Vec<Acked>,
    /// The steps of the checkpoints whose saves returned (alone or with a commit).
    pub saved: Vec<u64>,
}

#[derive(Debug)]
pub struct Recorder {
    inner: Arc<dyn Store>,
    record: Mutex<Record>,
}

impl Recorder {
    pub fn new(inner: Arc<dyn Store>) -> Recorder {
        Recorder {
            inner,
            record: Mutex::default(),
        }
    }

    pub fn record(&self) -> Record {
        self.lock().clone()
    }

    fn lock(&self) -> MutexGuard<'_, Record> {
        self.record.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn granted(&self, req: &ClaimRequest<'_>, outcome: &ClaimOutcome) {
        if let ClaimOutcome::Granted(grant) = outcome {
            self.lock().grants.push(Granted {
                key: req.key.to_string(),
                token: grant.token,
                in_doubt: grant.in_doubt,
            });
        }
    }
}

#[async_trait::async_trait]
impl Store for Recorder {
    async fn now(&self) -> Result<Millis, StoreError> {
        self.inner.now().await
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        let outcome = self.inner.claim(req).await?;
        self.granted(req, &outcome);
        Ok(outcome)
    }

    async fn take_over(
        &self,
        req: &ClaimRequest<'_>,
        stale_token: u64,
    ) -> Result<ClaimOutcome, StoreError> {
        let outcome = self.inner.take_over(req, stale_token).await?;
        self.granted(req, &outcome);
        Ok(outcome)
    }

    async fn commit(&self, commit: &Commit<'_>) -> Result<(), StoreError> {
        self.inner.commit(commit).await?;
        self.lock().acked.push(Acked {
            key: commit.claim.key.to_string(),
            token: commit.claim.token,
            result: commit.result.to_vec(),
        });
        if let Some(checkpoint) = commit.checkpoint {
            self.lock().saved.push(checkpoint.step);
        }
        Ok(())
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

    async fn resolve(
        &self,
        run_id: &str,
        key: &str,
        resolution: Resolution<'_>,
    ) -> Result<(), StoreError> {
        self.inner.resolve(run_id, key, resolution).await
    }

    async fn committed(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.committed(key).await
    }

    async fn open_claims(&self, run_id: Option<&str>) -> Result<Vec<OpenClaim>, StoreError> {
        self.inner.open_claims(run_id).await
    }

    async fn steps(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        self.inner.steps(run_id).await
    }

    async fn put_component(&self, digest: &str, bytes: &[u8]) -> Result<bool, StoreError> {
        self.inner.put_component(digest, bytes).await
    }

    async fn component(&self, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.component(digest).await
    }

    async fn has_component(&self, digest: &str) -> Result<bool, StoreError> {
        self.inner.has_component(digest).await
    }

    async fn deploy(&self, deployment: &Deployment<'_>) -> Result<DeploymentRecord, StoreError> {
        self.inner.deploy(deployment).await
    }

    async fn deployment(&self, name: &str) -> Result<Option<DeploymentRecord>, StoreError> {
        self.inner.deployment(name).await
    }

    async fn deployments(&self) -> Result<Vec<DeploymentRecord>, StoreError> {
        self.inner.deployments().await
    }

    async fn admitted(&self, namespace: &str, digest: &str) -> Result<Option<bool>, StoreError> {
        self.inner.admitted(namespace, digest).await
    }

    async fn submit(&self, submission: &Submission<'_>) -> Result<Submitted, StoreError> {
        self.inner.submit(submission).await
    }

    async fn run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        self.inner.run(run_id).await
    }

    async fn run_authority(&self, run_id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.run_authority(run_id).await
    }

    async fn runs(&self, filter: &RunFilter<'_>) -> Result<Vec<RunRecord>, StoreError> {
        self.inner.runs(filter).await
    }

    async fn upgrade_run(&self, run_id: &str, from: &str, to: &str) -> Result<(), StoreError> {
        self.inner.upgrade_run(run_id, from, to).await
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
        self.inner.acquire_runs(worker, max, lease, skip).await
    }

    async fn acquire_run(
        &self,
        run_id: &str,
        worker: &str,
        lease: Duration,
    ) -> Result<Acquired, StoreError> {
        self.inner.acquire_run(run_id, worker, lease).await
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

    async fn finish_run(
        &self,
        fence: &RunFence,
        end: RunEnd<'_>,
        counts: &Counts,
    ) -> Result<(), StoreError> {
        self.inner.finish_run(fence, end, counts).await
    }

    async fn cancel_run(&self, run_id: &str) -> Result<Cancelled, StoreError> {
        self.inner.cancel_run(run_id).await
    }

    async fn load_progress(&self, run_id: &str) -> Result<Option<Checkpoint>, StoreError> {
        self.inner.load_progress(run_id).await
    }

    async fn save_progress(
        &self,
        fence: &RunFence,
        checkpoint: &Checkpoint,
        counts: Option<&Counts>,
    ) -> Result<(), StoreError> {
        self.inner.save_progress(fence, checkpoint, counts).await?;
        self.lock().saved.push(checkpoint.step);
        Ok(())
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
        self.inner.append_log(fence, bytes, keep).await
    }

    async fn logs(&self, run_id: &str) -> Result<Vec<u8>, StoreError> {
        self.inner.logs(run_id).await
    }

    async fn wait(&self, req: &WaitRequest<'_>) -> Result<WaitState, StoreError> {
        self.inner.wait(req).await
    }

    async fn suspend_run(
        &self,
        fence: &RunFence,
        counts: &Counts,
        suspension: &Suspension<'_>,
    ) -> Result<(), StoreError> {
        self.inner.suspend_run(fence, counts, suspension).await
    }

    async fn send_signal(
        &self,
        run_id: &str,
        name: &str,
        payload: &[u8],
        max_payload: usize,
    ) -> Result<SignalSent, StoreError> {
        self.inner
            .send_signal(run_id, name, payload, max_payload)
            .await
    }

    async fn waits(&self, run_id: &str) -> Result<Vec<WaitRecord>, StoreError> {
        self.inner.waits(run_id).await
    }

    async fn gc(&self, req: &GcRequest) -> Result<GcReport, StoreError> {
        self.inner.gc(req).await
    }
}
