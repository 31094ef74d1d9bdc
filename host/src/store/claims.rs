//! The values claims are made of: asking for a key, what the ask finds, committing its
//! result, and how an operator sees and settles claims.

use std::time::Duration;

use super::{Checkpoint, Counts, Millis, RunFence, SyncMode};
#[cfg(doc)]
use super::{InstanceStore, OperatorStore};

/// Who asks for a claim, and for how long it wants it.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    /// The idempotency key (already validated and qualified by its namespace).
    pub key: &'a str,
    /// The run on whose behalf the claim is made, and its lease.
    pub fence: &'a RunFence,
    /// The holder's identity: unique per live instance.
    pub holder: &'a str,
    /// What the step was asked to do (a hash of its input), if the caller knows.
    pub fingerprint: Option<&'a str>,
    /// How long the claim stays the holder's without being renewed or committed.
    pub lease: Duration,
    /// The claim must be durable before the call returns, as the run's sync mode
    /// makes writes durable. `false`: it may become durable with the commit's sync
    /// instead (one sync per step); on power loss before that, the claim may vanish,
    /// and the key is granted again under a greater token (see `InstanceStore::claim`).
    pub durable: bool,
}

impl ClaimRequest<'_> {
    /// How durable the claim's own write must be: a claim that may become durable with
    /// its commit is written without a sync of its own (the log is synced in order, so
    /// the commit's sync covers it).
    pub fn sync(&self) -> SyncMode {
        if self.durable {
            self.fence.sync
        } else {
            SyncMode::Normal
        }
    }
}

/// A claim handed to a holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Fencing token: greater than any token handed out before for the same key.
    pub token: u64,
    /// 1 on the key's first claim; +1 on each later claim of the same key.
    pub attempt: u32,
    /// The previous holder neither committed nor released: it may have begun the side
    /// effect.
    pub in_doubt: bool,
}

/// What a claim request found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The key is committed: here is its result.
    Committed(Vec<u8>),
    /// The claim is the caller's.
    Granted(Grant),
    /// Another holder has the claim and its lease has not expired.
    Held(HeldClaim),
    /// The key was committed, or is claimed, with another fingerprint: it is being
    /// reused for different input.
    Conflict {
        /// The fingerprint the key is bound to.
        fingerprint: String,
    },
    /// The claim is parked in doubt ([`InstanceStore::park`]): nobody may take it until an
    /// operator resolves it ([`OperatorStore::resolve`]).
    Parked {
        /// The run that parked it.
        run_id: String,
        /// Why it was parked.
        reason: String,
    },
}

/// A claim held by someone else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldClaim {
    /// The holder's identity.
    pub holder: String,
    /// The holder's fencing token.
    pub token: u64,
    /// When the holder's lease runs out, on the store's clock.
    pub lease_expires: Millis,
}

/// A key's claim, as its holder names it to renew, release or park it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRef<'a> {
    /// The key (qualified).
    pub key: &'a str,
    /// The holder's token.
    pub token: u64,
    /// The run it was claimed for.
    pub fence: &'a RunFence,
}

/// A commit: the result of a claimed key, optionally with the run's next checkpoint and
/// its counts, written in one transaction.
#[derive(Debug, Clone)]
pub struct Commit<'a> {
    /// The claim being committed.
    pub claim: ClaimRef<'a>,
    /// The side effect's result.
    pub result: &'a [u8],
    /// The run's checkpoint after this step, replaced in the same transaction.
    pub checkpoint: Option<&'a Checkpoint>,
    /// The run's counts, stored in the same transaction if given.
    pub counts: Option<&'a Counts>,
}

/// What [`InstanceStore::claim_rated`](super::InstanceStore::claim_rated) came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rated {
    /// The token reserved for the step is free at this time, not now: the claim was not
    /// asked for. The run waits for it, as for a sleep.
    Due(Option<super::Millis>),
    /// The token was the step's (now, or reserved before and come): what the claim
    /// came to.
    Claimed(ClaimOutcome),
}

/// How an operator settles a parked, in-doubt key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution<'a> {
    /// The side effect did happen: commit these result bytes for the key.
    Commit(&'a [u8]),
    /// It did not (or should happen again): release the claim so the run retries it.
    Retry,
}

/// A claim not yet committed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct OpenClaim {
    /// The key.
    pub key: String,
    /// The run that claimed it.
    pub run_id: String,
    /// The holder, or `None` once released or parked.
    pub holder: Option<String>,
    /// The current token.
    pub token: u64,
    /// The current attempt.
    pub attempt: u32,
    /// When the lease runs out.
    pub lease_expires: Millis,
    /// Why the claim is parked in doubt, if it is.
    pub parked: Option<String>,
}

/// A key a run claimed, as `idem show` lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StepRecord {
    /// The key (qualified).
    pub key: String,
    /// Its current (or committing) token.
    pub token: u64,
    /// Its current attempt.
    pub attempt: u32,
    /// When its latest claim was granted.
    pub claimed_at: Millis,
    /// When its result was committed, if it was.
    pub committed_at: Option<Millis>,
    /// The holder, while claimed.
    pub holder: Option<String>,
    /// Why it is parked in doubt, if it is.
    pub parked: Option<String>,
}
