//! `idem:agent/once`: claim → execute → commit, done by the host in its store.

use std::time::{Duration, Instant};

use wasmtime::component::Resource;

use crate::runtime::bindings::idem::agent::once::{Host, HostClaim};
use crate::runtime::bindings::{Committed, Obtained, Outcome, StepError, WitCheckpoint};
use crate::runtime::claim::ClaimHandle;
use crate::runtime::faults::{Phase, Recycle};
use crate::runtime::state::{InstanceState, StoppedInDoubt};
use crate::store::{Checkpoint, ClaimOutcome, ClaimRequest, Grant, StoreError, now_millis};

/// First and longest pause between polls while awaiting another holder's commit.
const AWAIT_POLL_MIN: Duration = Duration::from_millis(1);
const AWAIT_POLL_MAX: Duration = Duration::from_millis(50);

impl Host for InstanceState {
    fn run_once(
        &mut self,
        key: String,
        fingerprint: Option<String>,
    ) -> wasmtime::Result<Result<Outcome, StepError>> {
        self.touch();
        let outcome = self.claim_or_await(key, fingerprint.as_deref());
        // Awaiting another holder may take long; that was idem's time, not the guest's.
        self.touch();
        outcome
    }
}

impl InstanceState {
    fn claim_or_await(
        &mut self,
        key: String,
        fingerprint: Option<&str>,
    ) -> wasmtime::Result<Result<Outcome, StepError>> {
        if let Err(reason) = self.run.limits.check_key(&key) {
            return Ok(Err(StepError::InvalidKey(reason)));
        }
        if let Some(reason) = fingerprint.and_then(|f| self.run.limits.check_fingerprint(f).err()) {
            return Ok(Err(StepError::InvalidKey(reason)));
        }
        let ordinal = self.run.ordinal(&key);
        let stored = self.run.qualify(&key);
        self.fault(Phase::BeforeClaim, ordinal)?;

        let mut waited = false;
        let mut pause = AWAIT_POLL_MIN;
        let deadline = Instant::now() + self.run.limits.await_timeout;
        let mut outcome = self
            .try_claim(&stored, fingerprint, None)
            .map_err(InstanceState::trap_store)?;
        loop {
            match outcome {
                ClaimOutcome::Committed(value) => {
                    let obtained = if waited {
                        self.run.counts.awaited += 1;
                        Obtained::Awaited
                    } else {
                        self.run.counts.skipped += 1;
                        Obtained::Skipped
                    };
                    return Ok(Ok(Outcome::Committed(Committed { value, obtained })));
                }
                ClaimOutcome::Granted(grant) => {
                    let claim = self.grant(stored, key, ordinal, grant)?;
                    self.fault(Phase::AfterClaim, ordinal)?;
                    return Ok(Ok(Outcome::Claimed(claim)));
                }
                ClaimOutcome::Parked { .. } => return Ok(Err(StepError::InDoubt(key))),
                ClaimOutcome::Conflict { fingerprint: bound } => {
                    return Ok(Err(StepError::KeyReused(format!(
                        "key {key:?} is bound to input {bound}, not {}; derive the key \
                         from the input, or use another key",
                        fingerprint.unwrap_or("(none)")
                    ))));
                }
                ClaimOutcome::Held(held) if self.run.live.is_orphan(&held.holder) => {
                    // One of our own dropped instances held it: nobody is executing it.
                    outcome = self
                        .try_claim(&stored, fingerprint, Some(held.token))
                        .map_err(InstanceState::trap_store)?;
                }
                ClaimOutcome::Held(_) => {
                    if Instant::now() >= deadline {
                        return Ok(Err(StepError::AwaitTimeout(key)));
                    }
                    waited = true;
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(AWAIT_POLL_MAX);
                    outcome = self
                        .try_claim(&stored, fingerprint, None)
                        .map_err(InstanceState::trap_store)?;
                }
            }
        }
    }
}

impl InstanceState {
    fn try_claim(
        &self,
        key: &str,
        fingerprint: Option<&str>,
        stale: Option<u64>,
    ) -> Result<ClaimOutcome, StoreError> {
        let req = ClaimRequest {
            key,
            fingerprint,
            run_id: &self.run.run_id,
            holder: &self.holder,
            lease: self.run.limits.lease,
            now: now_millis(),
        };
        match stale {
            None => self.run.store.claim(&req),
            Some(token) => self.run.store.take_over(&req, token),
        }
    }

    fn grant(
        &mut self,
        key: String,
        guest_key: String,
        ordinal: u32,
        grant: Grant,
    ) -> wasmtime::Result<Resource<ClaimHandle>> {
        self.grants += 1;
        self.run.counts.executed += 1;
        if grant.in_doubt {
            self.run.counts.reclaimed += 1;
        }
        self.run.heartbeat.hold(&key, grant.token, &self.holder);
        if self.effect.is_none() {
            self.effect = Some((key.clone(), std::time::Instant::now()));
        }
        self.http.claim_granted(&guest_key, grant.token);
        Ok(self.table.push(ClaimHandle {
            key,
            guest_key,
            token: grant.token,
            attempt: grant.attempt,
            in_doubt: grant.in_doubt,
            ordinal,
        })?)
    }

    fn release_claim(&mut self, claim: &ClaimHandle) -> wasmtime::Result<()> {
        self.end_effect(claim);
        self.run
            .store
            .release(&claim.key, claim.token)
            .map_err(InstanceState::trap_store)?;
        Ok(())
    }
}

impl InstanceState {
    /// The claim is settled (or about to be): stop renewing its lease and timing it.
    fn end_effect(&mut self, claim: &ClaimHandle) {
        self.run.heartbeat.settle(&claim.key, claim.token);
        self.http.claim_settled(claim.token);
        if self
            .effect
            .as_ref()
            .is_some_and(|(key, _)| *key == claim.key)
        {
            self.effect = None;
        }
    }
}

impl HostClaim for InstanceState {
    fn key(&mut self, claim: Resource<ClaimHandle>) -> wasmtime::Result<String> {
        Ok(self.table.get(&claim)?.guest_key.clone())
    }

    fn attempt(&mut self, claim: Resource<ClaimHandle>) -> wasmtime::Result<u32> {
        Ok(self.table.get(&claim)?.attempt)
    }

    fn in_doubt(&mut self, claim: Resource<ClaimHandle>) -> wasmtime::Result<bool> {
        Ok(self.table.get(&claim)?.in_doubt)
    }

    fn token(&mut self, claim: Resource<ClaimHandle>) -> wasmtime::Result<u64> {
        Ok(self.table.get(&claim)?.token)
    }

    fn commit(
        &mut self,
        claim: Resource<ClaimHandle>,
        result: Vec<u8>,
        then_save: Option<WitCheckpoint>,
    ) -> wasmtime::Result<Result<(), StepError>> {
        self.touch();
        let claim = self.table.delete(claim)?;
        // A side effect past its time limit is not committed: the instance ends and the
        // claim is retaken in doubt when the run resumes.
        self.check_time().map_err(wasmtime::Error::new)?;
        self.fault(Phase::InEffect, claim.ordinal)?;
        let limits = &self.run.limits;
        let too_large = if result.len() > limits.max_result_bytes {
            Some(format!(
                "result of key {:?} is {} bytes, over the limit of {} bytes",
                claim.guest_key,
                result.len(),
                limits.max_result_bytes
            ))
        } else {
            then_save
                .as_ref()
                .filter(|c| c.state.len() > limits.max_state_bytes)
                .map(|c| {
                    format!(
                        "progress state is {} bytes, over the limit of {} bytes",
                        c.state.len(),
                        limits.max_state_bytes
                    )
                })
        };
        if let Some(detail) = too_large {
            self.release_claim(&claim)?;
            return Ok(Err(StepError::TooLarge(detail)));
        }
        self.end_effect(&claim);
        let checkpoint = then_save.map(|c| Checkpoint {
            step: c.step,
            state: c.state,
        });
        let saves = checkpoint.is_some();
        let counts = if saves { self.run.counts_due() } else { None };
        let store = &self.run.store;
        let run_id = &self.run.run_id;
        let written = match &checkpoint {
            None => store.commit(&claim.key, claim.token, run_id, &result),
            Some(checkpoint) => store.commit_and_save(
                &claim.key,
                claim.token,
                run_id,
                &result,
                checkpoint,
                counts.as_ref(),
                now_millis(),
            ),
        };
        match written {
            Ok(()) => {}
            Err(StoreError::ClaimLost { .. }) => {
                return Ok(Err(StepError::ClaimLost(claim.guest_key)));
            }
            Err(e) => return Err(InstanceState::trap_store(e)),
        }
        self.run.last_committed = claim.ordinal;
        self.fault(Phase::AfterCommit, claim.ordinal)?;
        if saves {
            // The checkpoint that follows the commit is durable at this same boundary.
            self.fault(Phase::AfterSave, claim.ordinal)?;
        }
        Ok(Ok(()))
    }

    fn release(&mut self, claim: Resource<ClaimHandle>) -> wasmtime::Result<()> {
        self.touch();
        let claim = self.table.delete(claim)?;
        self.release_claim(&claim)
    }

    fn stop(&mut self, claim: Resource<ClaimHandle>, reason: String) -> wasmtime::Result<()> {
        self.touch();
        let claim = self.table.delete(claim)?;
        self.end_effect(&claim);
        match self.run.store.park(
            &claim.key,
            claim.token,
            &self.run.run_id,
            &reason,
            now_millis(),
        ) {
            Ok(()) => Err(wasmtime::Error::new(StoppedInDoubt { key: claim.key })),
            // Another holder took the key over meanwhile and will settle it: this
            // instance ends and the next one finds the key committed or held.
            Err(StoreError::ClaimLost { .. }) => Err(wasmtime::Error::new(Recycle {
                reason: format!("claim on {} taken over while stopping in doubt", claim.key),
            })),
            Err(e) => Err(InstanceState::trap_store(e)),
        }
    }

    fn drop(&mut self, claim: Resource<ClaimHandle>) -> wasmtime::Result<()> {
        // A claim dropped without commit or release is released: the guest gave up on
        // the side effect, so the key may be tried again.
        self.touch();
        let claim = self.table.delete(claim)?;
        self.release_claim(&claim)
    }
}
