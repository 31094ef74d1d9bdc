//! The values of the store's API owning what they borrow: work crosses to the database
//! thread (`thread.rs`), so what a method was lent is copied into one of these, and
//! lent again on the thread.

use std::time::Duration;

use crate::store::{ClaimRef, ClaimRequest, RunEnd, RunFence, WaitKind, Wake};

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
    Failed(String),
    InDoubt,
    Cancelled,
}

impl OwnedEnd {
    pub(super) fn new(end: RunEnd<'_>) -> OwnedEnd {
        match end {
            RunEnd::Completed(output) => OwnedEnd::Completed(output.to_vec()),
            RunEnd::Failed(error) => OwnedEnd::Failed(error.to_owned()),
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
}

impl OwnedWaitKind {
    pub(super) fn new(kind: &WaitKind<'_>) -> Self {
        match *kind {
            WaitKind::Sleep(wake) => OwnedWaitKind::Sleep(wake),
            WaitKind::Signal { name, timeout } => OwnedWaitKind::Signal {
                name: name.to_owned(),
                timeout,
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
        }
    }
}
