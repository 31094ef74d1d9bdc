//! [`InstanceStore`]: what a running instance needs of the store.

use std::fmt;
use std::time::Duration;

use crate::store::{
    Checkpoint, ChildSpec, ClaimOutcome, ClaimRef, ClaimRequest, Commit, Counts, JoinRequest,
    LiveText, Rated, Recorded, RunFence, SpawnAnswers, SpawnBatch, SpawnRequest, Spawned,
    StoreError, UsageRecord, WaitRequest, WaitState,
};
#[cfg(doc)]
use crate::store::{OperatorStore, RunStatus};

/// What a running instance needs: the claims and commits of its steps' keys, its
/// checkpoint and counts, its log, and its durable waits. Every write presents the
/// run's fence ([`RunFence`]) and is refused once another lease of the run was granted.
///
/// Called by the host imports (`runtime/imports/`), the instance's heartbeat (which
/// renews its claims) and its log flush; `prove` and the power-loss tests decorate
/// this role to see what a run did ([`Overlay`](super::Overlay)).
#[async_trait::async_trait]
pub trait InstanceStore: Send + Sync + fmt::Debug {
    /// Claims `req.key`, or returns its committed result, or reports its live holder.
    /// If the key is bound to a fingerprint (by its claim or its result) and
    /// `req.fingerprint` is another, reports [`ClaimOutcome::Conflict`] instead.
    /// A claim that was released, or whose lease expired, is granted to the caller with
    /// the next attempt and a fresh token. A grant in doubt adds one to the run's
    /// `reclaimed` count in the same transaction. Fails with [`StoreError::LeaseLost`]
    /// if the fence is stale.
    ///
    /// A claim that is not `req.durable` may be written without a sync of its own; a
    /// backend that does so keeps every token it grants after losing such a claim (a
    /// power loss) above every token it granted before.
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError>;

    /// Takes the token `token` asks for (a [`WaitKind::Rate`](crate::store::WaitKind::Rate)
    /// wait, recorded as [`InstanceStore::wait`] records one), then claims as
    /// [`InstanceStore::claim`] does, in one transaction where the backend can: a step of
    /// a rate-limited class pays for its token with no write of its own. When the token
    /// is free only later, nothing is claimed and its time is answered
    /// ([`Rated::Due`]); the reservation is kept.
    async fn claim_rated(
        &self,
        req: &ClaimRequest<'_>,
        token: &WaitRequest<'_>,
    ) -> Result<Rated, StoreError> {
        match self.wait(token).await? {
            WaitState::Pending { due } => Ok(Rated::Due(due)),
            _ => Ok(Rated::Claimed(self.claim(req).await?)),
        }
    }

    /// Takes the claim on `req.key` from the holder whose token is `stale_token`, even
    /// though its lease has not expired: the caller knows that holder is dead. If the
    /// claim has moved on since (another token), reports the new holder instead; if the
    /// key was committed, returns the result.
    async fn take_over(
        &self,
        req: &ClaimRequest<'_>,
        stale_token: u64,
    ) -> Result<ClaimOutcome, StoreError>;

    /// Writes the result as the key's committed result and ends the claim, with the
    /// checkpoint and counts if given, in one transaction; [`StoreError::ClaimLost`] if
    /// the token no longer holds the claim, [`StoreError::LeaseLost`] if the fence is
    /// stale. Nothing is written when it fails.
    async fn commit(&self, commit: &Commit<'_>) -> Result<(), StoreError>;

    /// Gives up a claim without a result (nobody began its side effect, or it failed
    /// and may be tried again). Returns whether the caller still held it.
    async fn release(&self, claim: &ClaimRef<'_>) -> Result<bool, StoreError>;

    /// Extends the leases of claims to `lease` from now, each if its token still holds
    /// it (and its fence is current); returns, per claim, whether it did. A zero lease
    /// ends the claims' leases at once: they stay claims (whoever takes one next is told
    /// it is in doubt) but nobody waits for them.
    async fn renew(
        &self,
        claims: &[ClaimRef<'_>],
        lease: Duration,
    ) -> Result<Vec<bool>, StoreError>;

    /// Parks a claim in doubt and sets its run to [`RunStatus::InDoubt`] with `reason`,
    /// in one transaction. Fails with [`StoreError::ClaimLost`] if the token no longer
    /// holds the claim.
    async fn park(&self, claim: &ClaimRef<'_>, reason: &str) -> Result<(), StoreError>;

    /// The committed result of `key`, without claiming it.
    async fn committed(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError>;

    /// The run's last checkpoint.
    async fn load_progress(&self, run_id: &str) -> Result<Option<Checkpoint>, StoreError>;

    /// Replaces the run's checkpoint and, if given, stores its counts, in one
    /// transaction.
    async fn save_progress(
        &self,
        fence: &RunFence,
        checkpoint: &Checkpoint,
        counts: Option<&Counts>,
    ) -> Result<(), StoreError>;

    /// Stores the run's counts (absolute values, not increments).
    async fn save_counts(&self, fence: &RunFence, counts: &Counts) -> Result<(), StoreError>;

    /// Records that a new instance of the run starts under `fence`, with the run's
    /// counts (`counts.instances` counting it): the write a host makes as each instance
    /// starts, but the first of a lease whose grant counted it. With `recycled`, the
    /// instance before it under this lease was dropped on purpose, for that reason. Both
    /// go on the run's timeline ([`OperatorStore::events`]) in the same transaction, so
    /// the timeline's starts match `instances`. Fails as
    /// [`save_counts`](Self::save_counts) does.
    async fn start_instance(
        &self,
        fence: &RunFence,
        counts: &Counts,
        recycled: Option<&str>,
    ) -> Result<(), StoreError>;

    /// Appends to the run's log, keeping only its last `keep` bytes.
    async fn append_log(
        &self,
        fence: &RunFence,
        bytes: &[u8],
        keep: usize,
    ) -> Result<(), StoreError>;

    /// Appends `chunks` to the run's live stream, in order, each under the next
    /// sequence number of the run, then drops its oldest chunks while it holds more than
    /// `keep` bytes of text (the newest chunk always stays). In a store encrypted at
    /// rest each chunk's text is sealed. Fails with [`StoreError::LeaseLost`] if the
    /// fence is stale; nothing is written then.
    async fn append_live(
        &self,
        fence: &RunFence,
        chunks: &[LiveText],
        keep: usize,
    ) -> Result<(), StoreError>;

    /// Records the wait `req.key` of the run if it is new (its due time from the
    /// store's clock now), and says where it stands. A signal wait that is not over
    /// takes the oldest signal of its name sent to the run and not yet received, in
    /// this transaction, and records its payload under the key: asked again, the same
    /// key answers the same payload, and no other wait receives that signal. Fails with
    /// [`StoreError::WaitRefused`] for an absurd time or a key used by another kind of
    /// wait, and [`StoreError::LeaseLost`] if the fence is stale; nothing is written.
    async fn wait(&self, req: &WaitRequest<'_>) -> Result<WaitState, StoreError>;

    /// Starts the child run `req.child_id` of deployment `req.deployment` with
    /// `req.input`, as a child of the fenced run, unless that run spawned it before
    /// under `req.key` (then returns it as it is). The child is queued with the
    /// deployment's component, authority and namespace, one deeper than its parent.
    /// Fails with [`StoreError::SpawnRefused`] for an unknown deployment, a key spawned
    /// before with another deployment or input, a child past the depth or children
    /// limit, or a cycle (an ancestor spawned with the same deployment and key);
    /// [`StoreError::LeaseLost`] if the fence is stale. Nothing is written when it fails.
    async fn spawn(&self, req: &SpawnRequest<'_>) -> Result<Spawned, StoreError> {
        let child = ChildSpec::of(req);
        let batch = SpawnBatch {
            fence: req.fence,
            children: std::slice::from_ref(&child),
            limits: req.limits,
        };
        match self.spawn_many(&batch).await?.pop() {
            Some(Ok(spawned)) => Ok(spawned),
            Some(Err(refusal)) => Err(StoreError::SpawnRefused {
                run_id: req.fence.run_id.clone(),
                key: req.key.to_owned(),
                refusal,
            }),
            None => Err(StoreError::Backend {
                op: "spawn a child run",
                source: "the store answered a spawn of one child with none".into(),
            }),
        }
    }

    /// Spawns each child of `batch` in one write, in order, answering each as
    /// [`spawn`](Self::spawn) would have on its own: a refused child records nothing,
    /// and the others still start. Fails as a whole only with
    /// [`StoreError::LeaseLost`] (nothing written) or a failure of the store.
    async fn spawn_many(&self, batch: &SpawnBatch<'_>) -> Result<SpawnAnswers, StoreError>;

    /// Records the join `req.key` of the run if it is new (with its children and its
    /// due time from the store's clock now), and says where it stands:
    /// [`WaitState::Joined`] once the children it waits for have ended (the ends are
    /// kept with the join, so asking again answers the same), [`WaitState::TimedOut`]
    /// past its timeout, else [`WaitState::Pending`]. Fails with
    /// [`StoreError::JoinRefused`] for a list that is empty, too long, repeats a child
    /// or names a run that is not this run's child, or a key used by another wait;
    /// [`StoreError::LeaseLost`] if the fence is stale. Nothing is written when it fails.
    async fn join(&self, req: &JoinRequest<'_>) -> Result<WaitState, StoreError>;

    /// Records the usage of the model call committed under `record.key`, a step of the
    /// fenced run: inserts it if the key has none yet ([`Recorded::Spent`]), else adds
    /// one to its replays ([`Recorded::Saved`]; the tokens stay the first recording's).
    /// Fails with [`StoreError::UsageRefused`] for a key that is not a step this run
    /// committed, a bad model name or an absurd count, and [`StoreError::LeaseLost`] if
    /// the fence is stale. Nothing is written when it fails.
    async fn record_usage(&self, record: &UsageRecord<'_>) -> Result<Recorded, StoreError>;
}
