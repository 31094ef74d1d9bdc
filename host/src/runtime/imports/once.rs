//! `idem:agent/once`: claim → execute → commit, done by the host in its store.

use std::time::{Duration, Instant};

use wasmtime::component::Resource;

use super::StepFailure;
use crate::runtime::bindings::idem::agent::once::{Durability, Host, HostClaim, StepRequest};
use crate::runtime::bindings::{Committed, Obtained, Outcome, StepError, WitCheckpoint};
use crate::runtime::claim::ClaimHandle;
use crate::runtime::claim::ClaimLive;
use crate::runtime::end::Suspend;
use crate::runtime::end::{HostTrap, trap_store};
use crate::runtime::faults::{Phase, Recycle};
use crate::runtime::limits::{Limits, cut};
use crate::runtime::view::IdemCtxView;
use crate::store::{
    Checkpoint, ClaimOutcome, ClaimRef, ClaimRequest, Commit, Grant, MAX_STEP, Rated, StoreError,
    WaitKind, WaitRequest, check_class_name, rate_wait_key,
};
use crate::text;

/// First and longest pause between polls while awaiting another holder's commit. The
/// store has no way to tell a waiter when a holder in another process commits, so the
/// wait polls; it sleeps on the runtime's timer, holding no thread.
const AWAIT_POLL_MIN: Duration = Duration::from_millis(1);
const AWAIT_POLL_MAX: Duration = Duration::from_millis(50);

/// A granted step's span and when the step first asked for its key.
pub(super) struct StepSpan {
    span: tracing::Span,
    asked: Instant,
}

/// Milliseconds since `since`, for a span's duration.
fn millis(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// What a key bound to another input fails with.
fn key_reused(key: &str, bound: &str, fingerprint: Option<&str>) -> StepError {
    StepError::KeyReused(format!(
        "key {} is bound to input {}, not {}; derive the key from the input, or use \
         another key",
        text::quoted(key),
        text::quoted(bound),
        fingerprint.map_or_else(|| "(none)".to_string(), text::quoted)
    ))
}

impl Host for IdemCtxView<'_> {
    async fn run_once(
        &mut self,
        key: String,
        fingerprint: Option<String>,
    ) -> Result<Outcome, StepFailure> {
        self.run_once_with(key, fingerprint, Durability::BeforeEffect)
            .await
    }

    async fn run_once_with(
        &mut self,
        key: String,
        fingerprint: Option<String>,
        durability: Durability,
    ) -> Result<Outcome, StepFailure> {
        self.ctx.enter()?;
        let durable = matches!(durability, Durability::BeforeEffect);
        let outcome = self
            .claim_or_await(key, fingerprint.as_deref(), durable, None)
            .await;
        // Awaiting another holder may take long; that was idem's time, not the guest's.
        self.ctx.watch.touch();
        outcome
    }

    async fn run_once_rated(
        &mut self,
        key: String,
        fingerprint: Option<String>,
        durability: Durability,
        class: String,
    ) -> Result<Outcome, StepFailure> {
        self.ctx.enter()?;
        if let Err(reason) = check_class_name(&class) {
            return Err(StepError::InvalidKey(reason).into());
        }
        if !self.ctx.held.is_empty() {
            return Err(StepError::InvalidKey(format!(
                "a step of rate class {} may have to wait for its token, and this instance \
                 holds claims: commit or release them first",
                text::quoted(&class)
            ))
            .into());
        }
        let durable = matches!(durability, Durability::BeforeEffect);
        let outcome = self
            .claim_or_await(key, fingerprint.as_deref(), durable, Some(&class))
            .await;
        self.ctx.watch.touch();
        outcome
    }

    async fn run_once_many(
        &mut self,
        steps: Vec<StepRequest>,
    ) -> Result<Vec<Outcome>, StepFailure> {
        self.ctx.enter()?;
        let outcomes = self.claim_many(steps).await;
        self.ctx.watch.touch();
        outcomes
    }
}

/// What asking the store for a key came to, before the guest hears of it.
pub(super) enum Acquired {
    /// The key's committed result, as the guest gets it.
    Committed(Outcome),
    /// A claim, granted by the store at `asked`, not yet handed to the guest.
    Granted { grant: Grant, asked: Instant },
}

/// A step's span, opened when the step asks for its key; a granted step's span lives
/// on in its claim until the commit.
pub(super) fn step_span(stored: &str) -> StepSpan {
    StepSpan {
        span: tracing::info_span!(
            "idem.step",
            key = %text::escape(stored, false),
            outcome = tracing::field::Empty,
            token = tracing::field::Empty,
            duration_ms = tracing::field::Empty,
        ),
        asked: Instant::now(),
    }
}

impl IdemCtxView<'_> {
    async fn claim_or_await(
        &mut self,
        key: String,
        fingerprint: Option<&str>,
        durable: bool,
        rate: Option<&str>,
    ) -> Result<Outcome, StepFailure> {
        let stored = self.claimable(&key, fingerprint)?;
        self.within_claim_limit(1)?;
        let ordinal = self.ctx.run.ordinal(&key);
        self.ctx.fault(Phase::BeforeClaim, ordinal)?;
        let step = step_span(&stored);
        match self
            .acquire(&stored, &key, fingerprint, durable, rate, &step)
            .await?
        {
            Acquired::Committed(outcome) => Ok(outcome),
            Acquired::Granted { grant, asked } => {
                self.granted(stored, key, ordinal, grant, asked, step).await
            }
        }
    }

    /// Asks the store for `stored` (the agent's `key`, qualified) until it is
    /// committed or granted: awaits another live holder, retakes at once a claim of one
    /// of this run's dropped instances. With `rate`, the first ask takes a token of that
    /// class with it, and a token free only later suspends the run until then.
    pub(super) async fn acquire(
        &mut self,
        stored: &str,
        key: &str,
        fingerprint: Option<&str>,
        durable: bool,
        rate: Option<&str>,
        step: &StepSpan,
    ) -> Result<Acquired, StepFailure> {
        let mut waited = false;
        let mut pause = AWAIT_POLL_MIN;
        // An await timeout too long for the clock's arithmetic simply never ends.
        let deadline = Instant::now().checked_add(self.ctx.run.limits.await_timeout);
        let mut asked = Instant::now();
        let mut outcome = match rate {
            None => self.try_claim(stored, fingerprint, None, durable).await?,
            Some(class) => {
                self.try_claim_rated(stored, key, fingerprint, durable, class)
                    .await?
            }
        };
        loop {
            match outcome {
                ClaimOutcome::Committed(value) => {
                    return Ok(Acquired::Committed(
                        self.found_committed(value, waited, step),
                    ));
                }
                ClaimOutcome::Granted(grant) => return Ok(Acquired::Granted { grant, asked }),
                ClaimOutcome::Parked { .. } => {
                    step.span.record("outcome", "parked");
                    return Err(StepError::InDoubt(key.to_string()).into());
                }
                ClaimOutcome::Conflict { fingerprint: bound } => {
                    step.span.record("outcome", "key-reused");
                    return Err(key_reused(key, &bound, fingerprint).into());
                }
                ClaimOutcome::Held(held) if self.ctx.run.live.is_orphan(&held.holder) => {
                    // One of our own dropped instances held it: nobody is executing it.
                    asked = Instant::now();
                    outcome = self
                        .try_claim(stored, fingerprint, Some(held.token), durable)
                        .await?;
                }
                ClaimOutcome::Held(held) => {
                    if self.ctx.run.host_gone(&held.holder).await? {
                        // Its holder's process died: nobody is executing it.
                        asked = Instant::now();
                        outcome = self
                            .try_claim(stored, fingerprint, Some(held.token), durable)
                            .await?;
                        continue;
                    }
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        step.span.record("outcome", "await-timeout");
                        return Err(StepError::AwaitTimeout(key.to_string()).into());
                    }
                    waited = true;
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(AWAIT_POLL_MAX);
                    self.ctx.enter()?;
                    asked = Instant::now();
                    outcome = self.try_claim(stored, fingerprint, None, durable).await?;
                }
            }
        }
    }

    /// Refuses, changing nothing, `asked` more claims that would take the instance
    /// past its limit of claims held at once.
    pub(super) fn within_claim_limit(&self, asked: usize) -> Result<(), StepFailure> {
        let limit = self.ctx.run.limits.max_claims;
        let held = self.ctx.held.len();
        if held.saturating_add(asked) <= limit {
            return Ok(());
        }
        Err(StepError::TooLarge(format!(
            "{asked} more claim(s) with the {held} this instance holds would be {} claims held \
             at once, over the limit of {limit}; commit or release some first",
            held.saturating_add(asked)
        ))
        .into())
    }

    /// Checks that the agent may ask for `key` now: a valid key and fingerprint, not
    /// already held by this instance. Returns the key as the store names it.
    pub(super) fn claimable(
        &self,
        key: &str,
        fingerprint: Option<&str>,
    ) -> Result<String, StepFailure> {
        let limits = &self.ctx.run.limits;
        if let Err(reason) = limits.check_key(key) {
            return Err(StepError::InvalidKey(reason).into());
        }
        if let Some(reason) = fingerprint.and_then(|f| limits.check_fingerprint(f).err()) {
            return Err(StepError::InvalidKey(reason).into());
        }
        let stored = self.ctx.run.qualify(key);
        if self.ctx.held.iter().any(|(k, _)| *k == stored) {
            // Waiting would wait for this very instance: fail at once instead.
            return Err(StepError::InvalidKey(format!(
                "key {} is already claimed by this instance: commit or release that claim \
                 before running the key again",
                text::quoted(key)
            ))
            .into());
        }
        Ok(stored)
    }

    /// The key was found committed: by another holder the step waited for, or before.
    fn found_committed(&mut self, value: Vec<u8>, waited: bool, step: &StepSpan) -> Outcome {
        let obtained = if waited {
            self.ctx.run.counts.awaited += 1;
            Obtained::Awaited
        } else {
            self.ctx.run.counts.skipped += 1;
            Obtained::Skipped
        };
        let outcome = if waited { "awaited" } else { "skipped" };
        step.span.record("outcome", outcome);
        step.span.record("duration_ms", millis(step.asked));
        Outcome::Committed(Committed { value, obtained })
    }

    /// The claim was granted: handed to the guest, unless the fault plan drops the
    /// instance first.
    async fn granted(
        &mut self,
        stored: String,
        key: String,
        ordinal: u32,
        grant: Grant,
        asked: Instant,
        step: StepSpan,
    ) -> Result<Outcome, StepFailure> {
        if let Err(drop) = self.ctx.fault(Phase::AfterClaim, ordinal) {
            // The guest never sees this claim, so no side effect began under it: give
            // the key back rather than leave it to be retaken in doubt — unless it was
            // in doubt already (an earlier holder's effect may have run), which the
            // next holder must still hear.
            self.drop_ungranted(&stored, &grant).await?;
            return Err(drop.into());
        }
        let claim = self.grant(stored, key, ordinal, grant, asked, step)?;
        Ok(Outcome::Claimed(claim))
    }

    // `&mut self`, not `&self`: the view holds the resource table, which is not `Sync`,
    // and the future must be `Send`.
    async fn try_claim(
        &mut self,
        key: &str,
        fingerprint: Option<&str>,
        stale: Option<u64>,
        durable: bool,
    ) -> Result<ClaimOutcome, StoreError> {
        let run = &self.ctx.run;
        let req = ClaimRequest {
            key,
            fence: &run.fence,
            holder: &self.ctx.holder,
            fingerprint,
            lease: run.limits.lease,
            durable,
        };
        match stale {
            None => run.store.claim(&req).await,
            Some(token) => run.store.take_over(&req, token).await,
        }
    }

    /// [`Self::try_claim`] with a token of rate class `class` taken first, in the same
    /// transaction where the store can. The token is recorded among the run's waits
    /// under `rate:` and the agent's key, as `waits.take-token` records it; one free
    /// only later ends the instance, and the run is due at its time.
    async fn try_claim_rated(
        &mut self,
        stored: &str,
        key: &str,
        fingerprint: Option<&str>,
        durable: bool,
        class: &str,
    ) -> Result<ClaimOutcome, StepFailure> {
        let run = &self.ctx.run;
        let req = ClaimRequest {
            key: stored,
            fence: &run.fence,
            holder: &self.ctx.holder,
            fingerprint,
            lease: run.limits.lease,
            durable,
        };
        let wait_key = rate_wait_key(key);
        let token = WaitRequest {
            fence: &run.fence,
            key: &wait_key,
            kind: WaitKind::Rate { class },
        };
        match run.store.claim_rated(&req, &token).await {
            Ok(Rated::Claimed(outcome)) => Ok(outcome),
            Ok(Rated::Due(due)) => Err(StepFailure::Trap(wasmtime::Error::new(Suspend {
                due,
                signal: None,
                join: None,
            }))),
            // The token's wait was refused: its key was used for another wait.
            Err(StoreError::WaitRefused { reason, .. }) => Err(StepError::KeyReused(reason).into()),
            Err(e) => Err(e.into()),
        }
    }

    /// Gives back a claim the guest was never handed: released if nothing is in doubt
    /// about its key, else left a claim with its lease ended, so that the next holder
    /// takes it at once and is told it is in doubt.
    pub(super) async fn drop_ungranted(
        &mut self,
        key: &str,
        grant: &Grant,
    ) -> Result<(), StoreError> {
        let run = &self.ctx.run;
        let claim = ClaimRef {
            key,
            token: grant.token,
            fence: &run.fence,
        };
        if grant.in_doubt {
            run.store
                .renew(std::slice::from_ref(&claim), Duration::ZERO)
                .await
                .map(drop)
        } else {
            run.store.release(&claim).await.map(drop)
        }
    }

    /// Hands the claim to the guest: held, renewed, timed and stamped on requests
    /// from here until it is settled.
    pub(super) fn grant(
        &mut self,
        key: String,
        guest_key: String,
        ordinal: u32,
        grant: Grant,
        asked: Instant,
        step: StepSpan,
    ) -> wasmtime::Result<Resource<ClaimHandle>> {
        let outcome = if grant.in_doubt {
            "retaken"
        } else {
            "executed"
        };
        step.span.record("outcome", outcome);
        step.span.record("token", grant.token);
        let ctx = &mut *self.ctx;
        ctx.grants += 1;
        ctx.run.counts.executed += 1;
        if grant.in_doubt {
            ctx.run.counts.reclaimed += 1;
        }
        let live = ClaimLive::new(asked, ctx.run.limits.lease);
        ctx.run.heartbeat.hold_claim(
            &key,
            grant.token,
            &ctx.run.fence,
            ctx.run.limits.lease,
            &ctx.holder,
            live.clone(),
        );
        ctx.watch.effect_started(grant.token, &guest_key);
        ctx.gate
            .claim_granted(&guest_key, grant.token, live.clone());
        ctx.held.push((key.clone(), grant.token));
        Ok(self.table.push(ClaimHandle {
            key,
            guest_key,
            token: grant.token,
            attempt: grant.attempt,
            in_doubt: grant.in_doubt,
            ordinal,
            live,
            span: step.span,
            asked: step.asked,
        })?)
    }

    /// The claim is settled (or about to be): stop renewing its lease, timing it, and
    /// letting requests (or their bodies) go out under it.
    fn end_effect(&mut self, claim: &ClaimHandle) {
        claim.live.end();
        let ctx = &mut *self.ctx;
        ctx.run.heartbeat.settle_claim(&claim.key, claim.token);
        ctx.gate.claim_settled(&claim.guest_key, claim.token);
        ctx.watch.effect_ended(claim.token, &claim.guest_key);
        ctx.held
            .retain(|(k, t)| !(*t == claim.token && *k == claim.key));
    }

    async fn release_claim(&mut self, claim: &ClaimHandle) -> wasmtime::Result<()> {
        self.end_effect(claim);
        claim.span.record("outcome", "released");
        claim.span.record("duration_ms", millis(claim.asked));
        let run = &self.ctx.run;
        self.ctx.watch.settle_started();
        let released = run
            .store
            .release(&ClaimRef {
                key: &claim.key,
                token: claim.token,
                fence: &run.fence,
            })
            .await;
        self.ctx.watch.settle_ended();
        released.map_err(trap_store)?;
        Ok(())
    }
}

impl HostClaim for IdemCtxView<'_> {
    async fn key(&mut self, claim: Resource<ClaimHandle>) -> wasmtime::Result<String> {
        Ok(self.table.get(&claim)?.guest_key.clone())
    }

    async fn attempt(&mut self, claim: Resource<ClaimHandle>) -> wasmtime::Result<u32> {
        Ok(self.table.get(&claim)?.attempt)
    }

    async fn in_doubt(&mut self, claim: Resource<ClaimHandle>) -> wasmtime::Result<bool> {
        Ok(self.table.get(&claim)?.in_doubt)
    }

    async fn token(&mut self, claim: Resource<ClaimHandle>) -> wasmtime::Result<u64> {
        Ok(self.table.get(&claim)?.token)
    }

    async fn commit(
        &mut self,
        claim: Resource<ClaimHandle>,
        result: Vec<u8>,
        then_save: Option<WitCheckpoint>,
    ) -> Result<(), StepFailure> {
        self.ctx.enter()?;
        let claim = self.table.delete(claim).map_err(wasmtime::Error::from)?;
        // A side effect past its time limit is not committed: the instance ends and the
        // claim is retaken in doubt when the run resumes.
        self.ctx.check_time().map_err(wasmtime::Error::new)?;
        self.ctx.fault(Phase::InEffect, claim.ordinal)?;
        if let Some(detail) = too_large(&self.ctx.run.limits, &claim, &result, &then_save) {
            self.release_claim(&claim).await?;
            return Err(StepError::TooLarge(detail).into());
        }
        self.end_effect(&claim);
        let checkpoint = then_save.map(|c| Checkpoint {
            step: c.step,
            state: c.state,
        });
        let counts = match checkpoint {
            Some(_) => {
                // Whatever this write's outcome, the checkpoint read with the lease is
                // stale.
                self.ctx.run.preloaded = None;
                self.ctx.run.counts_due()
            }
            None => None,
        };
        let run = &self.ctx.run;
        self.ctx.watch.settle_started();
        let written = run
            .store
            .commit(&Commit {
                claim: ClaimRef {
                    key: &claim.key,
                    token: claim.token,
                    fence: &run.fence,
                },
                result: &result,
                checkpoint: checkpoint.as_ref(),
                counts: counts.as_ref(),
            })
            .await;
        self.ctx.watch.settle_ended();
        match written {
            Ok(()) => {}
            Err(StoreError::ClaimLost { .. }) => {
                return Err(StepError::ClaimLost(claim.guest_key).into());
            }
            Err(e) => return Err(e.into()),
        }
        claim.span.record("duration_ms", millis(claim.asked));
        self.ctx.run.last_committed = claim.ordinal;
        self.ctx.fault(Phase::AfterCommit, claim.ordinal)?;
        if checkpoint.is_some() {
            // The checkpoint that follows the commit is durable at this same boundary.
            self.ctx.fault(Phase::AfterSave, claim.ordinal)?;
        }
        Ok(())
    }

    async fn release(&mut self, claim: Resource<ClaimHandle>) -> wasmtime::Result<()> {
        self.ctx.enter()?;
        let claim = self.table.delete(claim)?;
        self.release_claim(&claim).await
    }

    async fn stop(&mut self, claim: Resource<ClaimHandle>, reason: String) -> wasmtime::Result<()> {
        self.ctx.enter()?;
        let claim = self.table.delete(claim)?;
        self.end_effect(&claim);
        let reason = cut(&reason, Limits::MAX_REASON_BYTES);
        let run = &self.ctx.run;
        self.ctx.watch.settle_started();
        let parked = run
            .store
            .park(
                &ClaimRef {
                    key: &claim.key,
                    token: claim.token,
                    fence: &run.fence,
                },
                &reason,
            )
            .await;
        self.ctx.watch.settle_ended();
        match parked {
            Ok(()) => Err(wasmtime::Error::new(HostTrap::InDoubt { key: claim.key })),
            // Another holder took the key over meanwhile and will settle it: this
            // instance ends and the next one finds the key committed or held.
            Err(StoreError::ClaimLost { .. }) => Err(wasmtime::Error::new(Recycle {
                reason: format!("claim on {} taken over while stopping in doubt", claim.key),
            })),
            Err(e) => Err(trap_store(e)),
        }
    }

    async fn drop(&mut self, claim: Resource<ClaimHandle>) -> wasmtime::Result<()> {
        // A claim dropped without commit or release is released: the guest gave up on
        // the side effect, so the key may be tried again.
        self.ctx.watch.touch();
        let claim = self.table.delete(claim)?;
        self.release_claim(&claim).await
    }
}

/// Why a commit's payload cannot be stored, if it cannot.
fn too_large(
    limits: &Limits,
    claim: &ClaimHandle,
    result: &[u8],
    then_save: &Option<WitCheckpoint>,
) -> Option<String> {
    if result.len() > limits.max_result_bytes {
        return Some(format!(
            "result of key {} is {} bytes, over the limit of {} bytes",
            text::quoted(&claim.guest_key),
            result.len(),
            limits.max_result_bytes
        ));
    }
    let checkpoint = then_save.as_ref()?;
    if checkpoint.state.len() > limits.max_state_bytes {
        return Some(format!(
            "progress state is {} bytes, over the limit of {} bytes",
            checkpoint.state.len(),
            limits.max_state_bytes
        ));
    }
    if checkpoint.step > MAX_STEP {
        return Some(format!(
            "progress step {} is over the largest step a store keeps ({MAX_STEP})",
            checkpoint.step
        ));
    }
    None
}
