//! A decorator of the store's instance role that remembers what it told the host: every
//! grant and every commit that returned, so that a power-loss test knows what was
//! acknowledged before the cut. It wraps the real store and changes nothing; the other
//! roles are the real store's, through an [`Overlay`].

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use idem::store::{
    Checkpoint, ClaimOutcome, ClaimRef, ClaimRequest, Commit, Counts, InstanceStore, JoinRequest,
    Overlay, RunFence, SpawnAnswers, SpawnBatch, Store, StoreError, WaitRequest, WaitState,
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
    inner: Arc<dyn InstanceStore>,
    record: Mutex<Record>,
}

impl Recorder {
    /// A recorder of `inner`'s instance role, and the whole store the host is given:
    /// `inner` with its instance role recorded.
    pub fn over(inner: Arc<dyn Store>) -> (Arc<Recorder>, Arc<dyn Store>) {
        let recorder = Arc::new(Recorder {
            inner: Arc::clone(&inner) as Arc<dyn InstanceStore>,
            record: Mutex::default(),
        });
        let store = Overlay::new(inner).with_instance(Arc::clone(&recorder) as _);
        (recorder, Arc::new(store))
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
impl InstanceStore for Recorder {
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

    async fn committed(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.committed(key).await
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
        self.inner.append_log(fence, bytes, keep).await
    }

    async fn wait(&self, req: &WaitRequest<'_>) -> Result<WaitState, StoreError> {
        self.inner.wait(req).await
    }

    async fn spawn_many(&self, batch: &SpawnBatch<'_>) -> Result<SpawnAnswers, StoreError> {
        self.inner.spawn_many(batch).await
    }

    async fn join(&self, req: &JoinRequest<'_>) -> Result<WaitState, StoreError> {
        self.inner.join(req).await
    }
    // Usage is accounting, not a step's state: nothing a power loss test checks.
    async fn record_usage(
        &self,
        record: &idem::store::UsageRecord<'_>,
    ) -> Result<idem::store::Recorded, StoreError> {
        self.inner.record_usage(record).await
    }
    // The live stream is not durable by design: nothing a power loss test checks.
    async fn append_live(
        &self,
        fence: &RunFence,
        chunks: &[idem::store::LiveText],
        keep: usize,
    ) -> Result<(), StoreError> {
        self.inner.append_live(fence, chunks, keep).await
    }
}
