//! A decorator of the store's instance role that remembers what a run did to it: every
//! `run-once` answer, commit, checkpoint load and save, spawn and join, in order. It
//! wraps the scenario's real store and changes nothing the run could tell; the
//! invariants are read off its log afterwards. The other roles are the real store's,
//! through an [`Overlay`](crate::store::Overlay).
//!
//! Children are not run by a proof: a spawn records the child in the scratch store
//! (whose deployments a stand-in fills, [`StandIn`]) and nothing drives it, so a join
//! that is not over stops the scenario there ([`StopSignal`]) instead of waiting for
//! ever.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::runtime::{Authority, StopSignal};
use crate::store::{
    Admission, Checkpoint, ClaimOutcome, ClaimRef, ClaimRequest, Commit, Counts, Deployment,
    InstanceStore, JoinRequest, Recorded, RunFence, SpawnAnswers, SpawnBatch, SpawnRefusal, Store,
    StoreError, UsageRecord, WaitRequest, WaitState,
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
    /// A spawn the store granted: the child, and whether this call created it.
    Spawn {
        key: String,
        child: String,
        deployment: String,
        created: bool,
    },
    /// A join reached; `pending` when its children have not ended (in a proof, they
    /// never do).
    Join { key: String, pending: bool },
}

/// What a scratch store deploys under a name the agent spawns and the scratch store
/// does not know: a component whose runs nobody drives (the agent's own bytes), with
/// no authority. The child is recorded as a real spawn records it; it never runs.
#[derive(Debug, Clone)]
pub(crate) struct StandIn {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) digest: String,
    pub(crate) bytes: Arc<Vec<u8>>,
}

impl StandIn {
    /// Deploys the stand-in under `name`.
    pub(crate) async fn deploy(&self, name: &str) -> Result<(), StoreError> {
        self.store.put_component(&self.digest, &self.bytes).await?;
        self.store
            .deploy(&Deployment {
                name,
                digest: &self.digest,
                authority: &Authority::default().encode(),
                admission: Admission::Explicit,
                source: None,
            })
            .await?;
        Ok(())
    }
}

/// The wrapper.
#[derive(Debug)]
pub(crate) struct ObservedInstance {
    inner: Arc<dyn InstanceStore>,
    events: Mutex<Vec<Event>>,
    stand_in: StandIn,
    /// Raised when a join is not over: the children it waits for are never run here.
    stop: StopSignal,
}

impl ObservedInstance {
    pub(crate) fn new(
        inner: Arc<dyn InstanceStore>,
        stand_in: StandIn,
        stop: StopSignal,
    ) -> ObservedInstance {
        ObservedInstance {
            inner,
            events: Mutex::default(),
            stand_in,
            stop,
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
impl InstanceStore for ObservedInstance {
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

    async fn committed(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.committed(key).await
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
        let mut answers = self.inner.spawn_many(batch).await?;
        // The agent spawns deployments the proof's scratch store lacks: each is stood in
        // for, and the children refused for it alone are spawned again.
        let mut missing: Vec<String> = answers
            .iter()
            .filter_map(|a| match a {
                Err(SpawnRefusal::UnknownDeployment(name)) => Some(name.clone()),
                _ => None,
            })
            .collect();
        missing.sort_unstable();
        missing.dedup();
        if !missing.is_empty() {
            for name in &missing {
                self.stand_in.deploy(name).await?;
            }
            let again = self.inner.spawn_many(batch).await?;
            for (first, second) in answers.iter_mut().zip(again) {
                if matches!(first, Err(SpawnRefusal::UnknownDeployment(_))) {
                    *first = second;
                }
            }
        }
        for (child, answer) in batch.children.iter().zip(&answers) {
            if let Ok(spawned) = answer {
                self.push(Event::Spawn {
                    key: child.key.to_string(),
                    child: spawned.run_id.clone(),
                    deployment: child.deployment.to_string(),
                    created: spawned.created,
                });
            }
        }
        Ok(answers)
    }

    async fn join(&self, req: &JoinRequest<'_>) -> Result<WaitState, StoreError> {
        let state = self.inner.join(req).await?;
        let pending = matches!(state, WaitState::Pending { .. });
        self.push(Event::Join {
            key: req.key.to_string(),
            pending,
        });
        if pending {
            self.stop.stop();
        }
        Ok(state)
    }
    async fn record_usage(&self, record: &UsageRecord<'_>) -> Result<Recorded, StoreError> {
        self.inner.record_usage(record).await
    }
    async fn append_live(
        &self,
        fence: &RunFence,
        chunks: &[crate::store::LiveText],
        keep: usize,
    ) -> Result<(), StoreError> {
        self.inner.append_live(fence, chunks, keep).await
    }
}
