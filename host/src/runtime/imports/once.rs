//! `idem:agent/once`: claim → execute → commit, done by the host in its store.

use std::time::{Duration, Instant};

use wasmtime::component::Resource;

use crate::runtime::bindings::idem::agent::once::{Host, HostClaim};
use crate::runtime::bindings::{Committed, Obtained, Outcome, StepError};
use crate::runtime::claim::ClaimHandle;
use crate::runtime::faults::Phase;
use crate::runtime::state::InstanceState;
use crate::store::{ClaimOutcome, ClaimRequest, Grant, StoreError, now_millis};

/// First and longest pause between polls while awaiting another holder's commit.
const AWAIT_POLL_MIN: Duration = Duration::from_millis(1);
const AWAIT_POLL_MAX: Duration = Duration::from_millis(50);

impl Host for InstanceState {
    fn run_once(&mut self, key: String) -> wasmtime::Result<Result<Outcome, StepError>> {
        if let Err(reason) = self.run.limits.check_key(&key) {
            return Ok(Err(StepError::InvalidKey(reason)));
        }
        let ordinal = self.run.ordinal(&key);
        self.fault(Phase::BeforeClaim, ordinal)?;

        let mut waited = false;
        let mut pause = AWAIT_POLL_MIN;
        let deadline = Instant::now() + self.run.limits.await_timeout;
        let mut outcome = self
            .try_claim(&key, None)
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
                    let claim = self.grant(key, ordinal, grant)?;
                    self.fault(Phase::AfterClaim, ordinal)?;
                    return Ok(Ok(Outcome::Claimed(claim)));
                }
                ClaimOutcome::Held(held) if self.run.live.is_orphan(&held.holder) => {
                    // One of our own dropped instances held it: nobody is executing it.
                    outcome = self
                        .try_claim(&key, Some(held.token))
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
                        .try_claim(&key, None)
                        .map_err(InstanceState::trap_store)?;
                }
            }
        }
    }
}

impl InstanceState {
    fn try_claim(&self, key: &str, stale: Option<u64>) -> Result<ClaimOutcome, StoreError> {
        let req = ClaimRequest {
            key,
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
        ordinal: u32,
        grant: Grant,
    ) -> wasmtime::Result<Resource<ClaimHandle>> {
        self.grants += 1;
        self.run.counts.executed += 1;
        if grant.in_doubt {
            self.run.counts.reclaimed += 1;
        }
        self.http.claim_granted(&key, grant.token);
        Ok(self.table.push(ClaimHandle {
            key,
            token: grant.token,
            attempt: grant.attempt,
            in_doubt: grant.in_doubt,
            ordinal,
        })?)
    }

    fn release_claim(&mut self, claim: &ClaimHandle) -> wasmtime::Result<()> {
        self.http.claim_settled(claim.token);
        self.run
            .store
            .release(&claim.key, claim.token)
            .map_err(InstanceState::trap_store)?;
        Ok(())
    }
}

impl HostClaim for InstanceState {
    fn key(&mut self, claim: Resource<ClaimHandle>) -> wasmtime::Result<String> {
        Ok(self.table.get(&claim)?.key.clone())
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
    ) -> wasmtime::Result<Result<(), StepError>> {
        let claim = self.table.delete(claim)?;
        self.http.claim_settled(claim.token);
        self.fault(Phase::InEffect, claim.ordinal)?;
        let limit = self.run.limits.max_result_bytes;
        if result.len() > limit {
            self.release_claim(&claim)?;
            return Ok(Err(StepError::TooLarge(format!(
                "result of key {:?} is {} bytes, over the limit of {limit} bytes",
                claim.key,
                result.len()
            ))));
        }
        match self
            .run
            .store
            .commit(&claim.key, claim.token, &self.run.run_id, &result)
        {
            Ok(()) => {}
            Err(StoreError::ClaimLost { key, .. }) => return Ok(Err(StepError::ClaimLost(key))),
            Err(e) => return Err(InstanceState::trap_store(e)),
        }
        self.run.last_committed = claim.ordinal;
        self.fault(Phase::AfterCommit, claim.ordinal)?;
        Ok(Ok(()))
    }

    fn release(&mut self, claim: Resource<ClaimHandle>) -> wasmtime::Result<()> {
        let claim = self.table.delete(claim)?;
        self.release_claim(&claim)
    }

    fn drop(&mut self, claim: Resource<ClaimHandle>) -> wasmtime::Result<()> {
        // A claim dropped without commit or release is released: the guest gave up on
        // the side effect, so the key may be tried again.
        let claim = self.table.delete(claim)?;
        self.release_claim(&claim)
    }
}
