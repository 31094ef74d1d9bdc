//! The values of the store's API owning what they borrow: work crosses to the database
//! thread (`thread.rs`), so what a method was lent is copied into one of these, and
//! lent again on the thread.

use std::time::Duration;

use crate::store::{
    ChildSpec, ClaimRef, ClaimRequest, JoinMode, JoinRequest, RunEnd, RunFence, SpawnBatch,
    SpawnLimits, Submission, WaitKind, Wake,
};

/// A [`ClaimRequest`] that owns its strings.
pub(super) struct OwnedRequest {
    key: String,
    fence: RunFence,
    holder: String,
    fingerprint: Option<String>,
    lease: Duration,
    durable: bool,
}

impl OwnedRequest {
    pub(super) fn new(req: &ClaimRequest<'_>) -> OwnedRequest {
        OwnedRequest {
            key: req.key.to_owned(),
            fence: req.fence.clone(),
            holder: req.holder.to_owned(),
            fingerprint: req.fingerprint.map(str::to_owned),
            lease: req.lease,
            durable: req.durable,
        }
    }

    pub(super) fn borrow(&self) -> ClaimRequest<'_> {
        ClaimRequest {
            key: &self.key,
            fence: &self.fence,
            holder: &self.holder,
            fingerprint: self.fingerprint.as_deref(),
            lease: self.lease,
            durable: self.durable,
        }
    }
}

/// A [`ClaimRef`] that owns its strings.
pub(super) struct OwnedRef {
    key: String,
    token: u64,
    pub(super) fence: RunFence,
}

impl OwnedRef {
    pub(super) fn new(claim: &ClaimRef<'_>) -> OwnedRef {
        OwnedRef {
            key: claim.key.to_owned(),
            token: claim.token,
            fence: claim.fence.clone(),
        }
    }

    pub(super) fn borrow(&self) -> ClaimRef<'_> {
        ClaimRef {
            key: &self.key,
            token: self.token,
            fence: &self.fence,
        }
    }
}

/// A [`RunEnd`] that owns its bytes.
pub(super) enum OwnedEnd {
    Completed(Vec<u8>),
    Failed(Vec<u8>),
    InDoubt,
    Cancelled,
}

impl OwnedEnd {
    pub(super) fn new(end: RunEnd<'_>) -> OwnedEnd {
        match end {
            RunEnd::Completed(output) => OwnedEnd::Completed(output.to_vec()),
            RunEnd::Failed(error) => OwnedEnd::Failed(error.to_vec()),
            RunEnd::InDoubt => OwnedEnd::InDoubt,
            RunEnd::Cancelled => OwnedEnd::Cancelled,
        }
    }

    pub(super) fn borrow(&self) -> RunEnd<'_> {
        match self {
            OwnedEnd::Completed(output) => RunEnd::Completed(output),
            OwnedEnd::Failed(error) => RunEnd::Failed(error),
            OwnedEnd::InDoubt => RunEnd::InDoubt,
            OwnedEnd::Cancelled => RunEnd::Cancelled,
        }
    }
}

/// A [`WaitKind`] that owns its name, to be sent to another thread.
#[derive(Debug, Clone)]
pub(super) enum OwnedWaitKind {
    Sleep(Wake),
    Signal {
        name: String,
        timeout: Option<Duration>,
    },
    Rate {
        class: String,
    },
}

impl OwnedWaitKind {
    pub(super) fn new(kind: &WaitKind<'_>) -> Self {
        match *kind {
            WaitKind::Sleep(wake) => OwnedWaitKind::Sleep(wake),
            WaitKind::Signal { name, timeout } => OwnedWaitKind::Signal {
                name: name.to_owned(),
                timeout,
            },
            WaitKind::Rate { class } => OwnedWaitKind::Rate {
                class: class.to_owned(),
            },
        }
    }

    pub(super) fn borrow(&self) -> WaitKind<'_> {
        match self {
            OwnedWaitKind::Sleep(wake) => WaitKind::Sleep(*wake),
            OwnedWaitKind::Signal { name, timeout } => WaitKind::Signal {
                name,
                timeout: *timeout,
            },
            OwnedWaitKind::Rate { class } => WaitKind::Rate { class },
        }
    }
}

/// A [`SpawnBatch`] that owns its strings and inputs.
pub(super) struct OwnedSpawnBatch {
    fence: RunFence,
    children: Vec<OwnedChild>,
    limits: SpawnLimits,
}

struct OwnedChild {
    key: String,
    child_id: String,
    deployment: String,
    input: Vec<u8>,
    detached: bool,
}

impl OwnedSpawnBatch {
    pub(super) fn new(batch: &SpawnBatch<'_>) -> OwnedSpawnBatch {
        OwnedSpawnBatch {
            fence: batch.fence.clone(),
            children: batch
                .children
                .iter()
                .map(|c| OwnedChild {
                    key: c.key.to_owned(),
                    child_id: c.child_id.to_owned(),
                    deployment: c.deployment.to_owned(),
                    input: c.input.to_vec(),
                    detached: c.detached,
                })
                .collect(),
            limits: batch.limits,
        }
    }

    pub(super) fn sync(&self) -> crate::store::SyncMode {
        self.fence.sync
    }

    /// Its children, borrowed: what [`Self::borrow`] points into.
    pub(super) fn children(&self) -> Vec<ChildSpec<'_>> {
        self.children
            .iter()
            .map(|c| ChildSpec {
                key: &c.key,
                child_id: &c.child_id,
                deployment: &c.deployment,
                input: &c.input,
                detached: c.detached,
            })
            .collect()
    }

    pub(super) fn borrow<'a>(&'a self, children: &'a [ChildSpec<'a>]) -> SpawnBatch<'a> {
        SpawnBatch {
            fence: &self.fence,
            children,
            limits: self.limits,
        }
    }
}

/// A [`JoinRequest`] that owns its strings.
pub(super) struct OwnedJoin {
    fence: RunFence,
    key: String,
    children: Vec<String>,
    mode: JoinMode,
    timeout: Option<Duration>,
    max_children: u32,
}

impl OwnedJoin {
    pub(super) fn new(req: &JoinRequest<'_>) -> OwnedJoin {
        OwnedJoin {
            fence: req.fence.clone(),
            key: req.key.to_owned(),
            children: req.children.to_vec(),
            mode: req.mode,
            timeout: req.timeout,
            max_children: req.max_children,
        }
    }

    pub(super) fn sync(&self) -> crate::store::SyncMode {
        self.fence.sync
    }

    pub(super) fn borrow(&self) -> JoinRequest<'_> {
        JoinRequest {
            fence: &self.fence,
            key: &self.key,
            children: &self.children,
            mode: self.mode,
            timeout: self.timeout,
            max_children: self.max_children,
        }
    }
}

/// A [`Submission`] that owns its strings and bytes.
pub(super) struct OwnedSubmission {
    run_id: String,
    agent: String,
    digest: String,
    namespace: String,
    input: Vec<u8>,
    authority: Vec<u8>,
    replace_authority: bool,
    priority: u32,
}

impl OwnedSubmission {
    pub(super) fn new(s: &Submission<'_>) -> Self {
        OwnedSubmission {
            run_id: s.run_id.to_owned(),
            agent: s.agent.to_owned(),
            digest: s.digest.to_owned(),
            namespace: s.namespace.to_owned(),
            input: s.input.to_vec(),
            authority: s.authority.to_vec(),
            replace_authority: s.replace_authority,
            priority: s.priority,
        }
    }

    pub(super) fn borrow(&self) -> Submission<'_> {
        Submission {
            run_id: &self.run_id,
            agent: &self.agent,
            digest: &self.digest,
            namespace: &self.namespace,
            input: &self.input,
            authority: &self.authority,
            replace_authority: self.replace_authority,
            priority: self.priority,
        }
    }
}

/// A [`ForkRequest`](crate::store::ForkRequest), owned.
pub(super) struct OwnedFork {
    run_id: String,
    at: u64,
    new_run_id: String,
    input: Option<Vec<u8>>,
    version: Option<u64>,
}

impl OwnedFork {
    pub(super) fn new(r: &crate::store::ForkRequest<'_>) -> Self {
        OwnedFork {
            run_id: r.run_id.to_owned(),
            at: r.at,
            new_run_id: r.new_run_id.to_owned(),
            input: r.input.map(<[u8]>::to_vec),
            version: r.version,
        }
    }

    pub(super) fn borrow(&self) -> crate::store::ForkRequest<'_> {
        crate::store::ForkRequest {
            run_id: &self.run_id,
            at: self.at,
            new_run_id: &self.new_run_id,
            input: self.input.as_deref(),
            version: self.version,
        }
    }
}
