//! A store that remembers what a run did to it: every `run-once` answer, commit,
//! release, checkpoint load and save, in order. It wraps the scenario's real store and
//! changes nothing; the invariants are read off its log afterwards.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::store::{
    Acquired, Cancelled, Checkpoint, ClaimOutcome, ClaimRef, ClaimRequest, Commit, Counts,
    Deployment, DeploymentRecord, GcReport, GcRequest, LeaseState, LeasedRun, Millis, OpenClaim,
    Resolution, RunEnd, RunFence, RunFilter, RunRecord, SignalSent, StepRecord, Store, StoreError,
    Submission, Submitted, Suspension, WaitRecord, WaitRequest, WaitState,
};

/// What one `run-once` call got from the store. A wait on a live holder is not an
/// answer: the call asks again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// A claim with this token; `in_doubt` when an earlier holder may have begun the
    /// side effect.
    Granted { token: u64, in_doubt: bool },
    /// The key was committed already.
    Committed,
    /// Refused (parked, reused for other input).
    Refused,
}

/// One thing the run did to the store, keys qualified by the namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    /// A `run-once` call by the instance named `holder`.
    Call {
        key: String,
        holder: String,
        answer: Answer,
    },
    /// A commit that succeeded, with the checkpoint step it carried.
    Commit {
        key: String,
        checkpoint: Option<u64>,
    },
    /// A checkpoint saved on its own.
    Save { step: u64 },
    /// A checkpoint read (an instance starting, usually).
    Load { step: Option<u64> },
}

/// The wrapper.
#[derive(Debug)]
pub(crate) struct ObservedStore {
    inner: Arc<dyn Store>,
    events: Mutex<Vec<Event>>,
}

impl ObservedStore {
    pub(crate) fn new(inner: Arc<dyn Store>) -> ObservedStore {
        ObservedStore {
            inner,
            events: Mutex::default(),
        }
    }

    /// Everything recorded so far.
    pub(crate) fn events(&self) -> Vec<Event> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Event>> {
        self.events.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, event: Event) {
        self.lock().push(event);
    }

    fn call(&self, req: &ClaimRequest<'_>, outcome: &ClaimOutcome) {
        let answer = match outcome {
            ClaimOutcome::Granted(grant) => Answer::Granted {
                token: grant.token,
                in_doubt: grant.in_doubt,
            },
            ClaimOutcome::Committed(_) => Answer::Committed,
            ClaimOutcome::Conflict { .. } | ClaimOutcome::Parked { .. } => Answer::Refused,
            ClaimOutcome::Held(_) => return,
        };
        self.push(Event::Call {
            key: req.key.to_string(),
            holder: req.holder.to_string(),
            answer,
        });
    }
}

#[async_trait::async_trait]
impl Store for ObservedStore {
    async fn now(&self) -> Result<Millis, StoreError> {
        self.inner.now().await
    }

    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        let outcome = self.inner.claim(req).await?;
        self.call(req, &outcome);
        Ok(outcome)
    }

    async fn take_over(
        &self,
        req: &ClaimRequest<'_>,
        stale_token: u64,
    ) -> Result<ClaimOutcome, StoreError> {
        let outcome = self.inner.take_over(req, stale_token).await?;
        self.call(req, &outcome);
        Ok(outcome)
    }

    async fn commit(&self, commit: &Commit<'_>) -> Result<(), StoreError> {
        self.inner.commit(commit).await?;
        self.push(Event::Commit {
            key: commit.claim.key.to_string(),
            checkpoint: commit.checkpoint.map(|c| c.step),
        });
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
        let checkpoint = self.inner.load_progress(run_id).await?;
        self.push(Event::Load {
            step: checkpoint.as_ref().map(|c| c.step),
        });
        Ok(checkpoint)
    }

    async fn save_progress(
        &self,
        fence: &RunFence,
        checkpoint: &Checkpoint,
        counts: Option<&Counts>,
    ) -> Result<(), StoreError> {
        self.inner.save_progress(fence, checkpoint, counts).await?;
        self.push(Event::Save {
            step: checkpoint.step,
        });
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
