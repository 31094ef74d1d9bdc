//! The model the property test checks the store against: the rules of `store/mod.rs`
//! for a few keys and runs, in memory, and what each holder knows.

use super::{HOLDERS, KEYS, LEASE_MS, RUN_LEASE_MS, T0, TokenPick, key_name, run_name};
use crate::store::{
    Checkpoint, ClaimOutcome, Counts, Grant, HeldClaim, Millis, OpenClaim, RunLeaseInfo, RunStatus,
};

/// A key's claim, as the rules say it stands.
#[derive(Debug, Clone)]
pub(super) struct ClaimModel {
    pub(super) run: String,
    pub(super) holder: Option<String>,
    pub(super) token: u64,
    pub(super) attempt: u32,
    pub(super) lease_expires: Millis,
    pub(super) parked: Option<String>,
}

/// A run's record, as far as the operations here change it.
#[derive(Debug, Clone)]
pub(super) struct RunModel {
    pub(super) status: RunStatus,
    pub(super) counts: Counts,
    pub(super) checkpoint: Option<Checkpoint>,
    /// The last lease token granted (kept when the lease ends).
    pub(super) token: u64,
    /// The worker holding the lease and until when; `None` when nobody does.
    pub(super) lease: Option<(String, Millis)>,
    pub(super) note: Option<String>,
}

impl RunModel {
    pub(super) fn lease_info(&self) -> Option<RunLeaseInfo> {
        self.lease.as_ref().map(|(worker, expires)| RunLeaseInfo {
            worker: worker.clone(),
            token: self.token,
            expires: *expires,
        })
    }
}

/// The store as the rules in `store/mod.rs` describe it, plus what each holder knows.
pub(super) struct Model {
    pub(super) now: Millis,
    /// The last token handed out per key.
    pub(super) last_token: Vec<u64>,
    pub(super) committed: Vec<Option<Vec<u8>>>,
    pub(super) claims: Vec<Option<ClaimModel>>,
    pub(super) runs: Vec<RunModel>,
    /// The token each holder was last granted per key; forgotten in a crash.
    pub(super) held: Vec<Vec<Option<u64>>>,
    /// The run lease token each holder believes it holds (0: none); forgotten in a
    /// crash.
    pub(super) fence: Vec<u64>,
    /// Bumped by a crash: the holder comes back under a new identity.
    pub(super) incarnation: Vec<u32>,
}

/// What a lease request found, in the model.
pub(super) enum Lease {
    Granted(u64),
    Held(RunLeaseInfo),
    Finished,
}

impl Model {
    pub(super) fn new() -> Model {
        Model {
            now: T0,
            last_token: vec![0; KEYS],
            committed: vec![None; KEYS],
            claims: vec![None; KEYS],
            runs: vec![
                RunModel {
                    status: RunStatus::Queued,
                    counts: Counts::default(),
                    checkpoint: None,
                    token: 0,
                    lease: None,
                    note: None,
                };
                HOLDERS
            ],
            held: vec![vec![None; KEYS]; HOLDERS],
            fence: vec![0; HOLDERS],
            incarnation: vec![0; HOLDERS],
        }
    }

    pub(super) fn holder_name(&self, holder: usize) -> String {
        format!("h{holder}.{}", self.incarnation[holder])
    }

    pub(super) fn worker_name(&self, holder: usize) -> String {
        format!("w{holder}.{}", self.incarnation[holder])
    }

    pub(super) fn token(&self, holder: usize, key: usize, pick: TokenPick) -> u64 {
        match pick {
            TokenPick::Own => self.held[holder][key].unwrap_or(0),
            TokenPick::Current => self.claims[key].as_ref().map_or(0, |c| c.token),
            TokenPick::Guess(token) => token,
        }
    }

    /// Whether the holder's fence is its run's current lease.
    pub(super) fn fence_holds(&self, holder: usize) -> bool {
        let run = &self.runs[holder];
        run.lease.is_some() && run.token == self.fence[holder]
    }

    /// The live claim `token` holds on `key`, if it holds one: not released, not
    /// parked, not replaced by a later grant. Expiry alone does not end a holding.
    pub(super) fn holding(&mut self, key: usize, token: u64) -> Option<&mut ClaimModel> {
        self.claims[key]
            .as_mut()
            .filter(|c| c.token == token && c.holder.is_some())
    }

    /// `acquire_run` of the holder's run by `worker`.
    pub(super) fn acquire(&mut self, run: usize, worker: String) -> Lease {
        let now = self.now;
        let model = &mut self.runs[run];
        if model.status.is_finished() {
            return Lease::Finished;
        }
        // A live lease of another worker holds; the same worker is granted again (it
        // knows it is not driving the run).
        if let Some(held) = model
            .lease_info()
            .filter(|lease| lease.expires > now && lease.worker != worker)
        {
            return Lease::Held(held);
        }
        model.token += 1;
        model.lease = Some((worker, now + RUN_LEASE_MS));
        model.status = RunStatus::Running;
        Lease::Granted(model.token)
    }

    /// `claim`, or with `stale`, `take_over`; `None` if the fence is stale.
    pub(super) fn claim(
        &mut self,
        holder: usize,
        key: usize,
        stale: Option<u64>,
    ) -> Option<ClaimOutcome> {
        if !self.fence_holds(holder) {
            return None;
        }
        if let Some(value) = &self.committed[key] {
            return Some(ClaimOutcome::Committed(value.clone()));
        }
        let (attempt, in_doubt) = match &self.claims[key] {
            None => (1, false),
            Some(c) => match (&c.parked, &c.holder) {
                (Some(reason), _) => {
                    return Some(ClaimOutcome::Parked {
                        run_id: c.run.clone(),
                        reason: reason.clone(),
                    });
                }
                (None, None) => (c.attempt + 1, false),
                (None, Some(_)) if c.lease_expires <= self.now || stale == Some(c.token) => {
                    (c.attempt + 1, true)
                }
                (None, Some(other)) => {
                    return Some(ClaimOutcome::Held(HeldClaim {
                        holder: other.clone(),
                        token: c.token,
                        lease_expires: c.lease_expires,
                    }));
                }
            },
        };
        self.last_token[key] += 1;
        let token = self.last_token[key];
        self.claims[key] = Some(ClaimModel {
            run: run_name(holder),
            holder: Some(self.holder_name(holder)),
            token,
            attempt,
            lease_expires: self.now + LEASE_MS,
            parked: None,
        });
        self.held[holder][key] = Some(token);
        // The store counts only grants in doubt; `executed` is the host's to count.
        self.runs[holder].counts.reclaimed += u64::from(in_doubt);
        Some(ClaimOutcome::Granted(Grant {
            token,
            attempt,
            in_doubt,
        }))
    }

    pub(super) fn commit(&mut self, key: usize, token: u64, value: Vec<u8>) -> bool {
        if self.holding(key, token).is_none() {
            return false;
        }
        self.claims[key] = None;
        self.committed[key] = Some(value);
        true
    }

    pub(super) fn release(&mut self, key: usize, token: u64) -> bool {
        match self.holding(key, token) {
            Some(claim) => {
                claim.holder = None;
                true
            }
            None => false,
        }
    }

    pub(super) fn renew(&mut self, key: usize, token: u64) -> bool {
        let expires = self.now + LEASE_MS;
        match self.holding(key, token) {
            Some(claim) => {
                claim.lease_expires = expires;
                true
            }
            None => false,
        }
    }

    pub(super) fn park(&mut self, key: usize, token: u64, run: usize, reason: &str) -> bool {
        match self.holding(key, token) {
            Some(claim) => {
                claim.holder = None;
                claim.parked = Some(reason.to_owned());
                self.runs[run].status = RunStatus::InDoubt;
                true
            }
            None => false,
        }
    }

    pub(super) fn resolve(&mut self, run: usize, key: usize, value: Option<Vec<u8>>) -> bool {
        let run_id = run_name(run);
        let parked_by_run = |c: &ClaimModel| c.parked.is_some() && c.run == run_id;
        if !self.claims[key].as_ref().is_some_and(parked_by_run) {
            return false;
        }
        match value {
            Some(value) => {
                // A resolution is a commit of its own, under a fresh token.
                self.last_token[key] += 1;
                self.claims[key] = None;
                self.committed[key] = Some(value);
            }
            None => {
                if let Some(claim) = self.claims[key].as_mut() {
                    claim.parked = None;
                    claim.holder = None;
                }
            }
        }
        let still_parked = self.claims.iter().flatten().any(parked_by_run);
        if self.runs[run].status == RunStatus::InDoubt && !still_parked {
            self.runs[run].status = RunStatus::Running;
            self.runs[run].lease = None;
        }
        true
    }

    pub(super) fn open_claims(&self) -> Vec<OpenClaim> {
        self.claims
            .iter()
            .enumerate()
            .filter_map(|(key, claim)| {
                let c = claim.as_ref()?;
                Some(OpenClaim {
                    key: key_name(key),
                    run_id: c.run.clone(),
                    holder: c.holder.clone(),
                    token: c.token,
                    attempt: c.attempt,
                    lease_expires: c.lease_expires,
                    parked: c.parked.clone(),
                })
            })
            .collect()
    }
}
