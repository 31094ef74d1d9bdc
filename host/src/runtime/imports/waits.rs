//! `idem:agent/waits`: durable sleeps and signal waits. A wait that is not over ends
//! the instance with a [`Suspend`] trap; the run driver then gives the run's lease back
//! until the wait is due, and the run holds no instance meanwhile.

use std::time::Duration;

use crate::runtime::bindings::idem::agent::waits::{Host, Received, WaitError, Wake as WitWake};
use crate::runtime::end::{Suspend, trap_store};
use crate::runtime::view::IdemCtxView;
use crate::store::{StoreError, WaitKind, WaitRequest, WaitState, Wake, rate_wait_key};
use crate::text;

/// What a wait import fails with: the agent's error value, or a trap that ends the
/// instance (the run suspends, a store outage, a stop).
#[derive(Debug)]
pub(crate) enum WaitFailure {
    /// A value the agent handles.
    Wait(WaitError),
    /// The instance ends.
    Trap(wasmtime::Error),
}

impl From<wasmtime::Error> for WaitFailure {
    fn from(e: wasmtime::Error) -> Self {
        WaitFailure::Trap(e)
    }
}

impl Host for IdemCtxView<'_> {
    async fn sleep(&mut self, key: String, wake: WitWake) -> Result<(), WaitFailure> {
        let wake = match wake {
            WitWake::After(ms) => Wake::After(Duration::from_millis(ms)),
            WitWake::At(at) => Wake::At(at),
        };
        match self.wait(&key, WaitKind::Sleep(wake)).await? {
            WaitState::Elapsed => Ok(()),
            // A sleep is never received, timed out nor joined; over is over.
            WaitState::Received(_) | WaitState::TimedOut | WaitState::Joined(_) => Ok(()),
            WaitState::Pending { due } => Err(suspend(due, None)),
        }
    }

    async fn wait_for_signal(
        &mut self,
        key: String,
        name: String,
        timeout_ms: Option<u64>,
    ) -> Result<Received, WaitFailure> {
        let kind = WaitKind::Signal {
            name: &name,
            timeout: timeout_ms.map(Duration::from_millis),
        };
        match self.wait(&key, kind).await? {
            WaitState::Received(payload) => Ok(Received::Payload(payload)),
            WaitState::TimedOut => Ok(Received::TimedOut),
            // A signal wait with no due time is not a sleep: it stays pending; and
            // the store never answers one with a join's children.
            WaitState::Elapsed | WaitState::Joined(_) => Ok(Received::TimedOut),
            WaitState::Pending { due } => Err(suspend(due, Some(name))),
        }
    }

    async fn take_token(&mut self, step_key: String, class: String) -> Result<(), WaitFailure> {
        self.check_key(&step_key)?;
        let key = rate_wait_key(&step_key);
        match self.record(&key, WaitKind::Rate { class: &class }).await? {
            WaitState::Pending { due } => Err(suspend(due, None)),
            // A token's wait is over when its slot has come; it is never received,
            // timed out nor joined.
            WaitState::Elapsed
            | WaitState::Received(_)
            | WaitState::TimedOut
            | WaitState::Joined(_) => Ok(()),
        }
    }

    fn convert_wait_error(&mut self, err: WaitFailure) -> wasmtime::Result<WaitError> {
        match err {
            WaitFailure::Wait(e) => Ok(e),
            WaitFailure::Trap(trap) => Err(trap),
        }
    }
}

fn suspend(due: Option<crate::store::Millis>, signal: Option<String>) -> WaitFailure {
    WaitFailure::Trap(wasmtime::Error::new(Suspend {
        due,
        signal,
        join: None,
    }))
}

impl IdemCtxView<'_> {
    async fn wait(&mut self, key: &str, kind: WaitKind<'_>) -> Result<WaitState, WaitFailure> {
        self.check_key(key)?;
        self.record(key, kind).await
    }

    fn check_key(&self, key: &str) -> Result<(), WaitFailure> {
        self.ctx
            .run
            .limits
            .check_key(key)
            .map_err(|reason| WaitFailure::Wait(WaitError::InvalidKey(reason)))
    }

    /// Records the wait under `key` (checked by the caller) and says where it stands.
    async fn record(&mut self, key: &str, kind: WaitKind<'_>) -> Result<WaitState, WaitFailure> {
        self.ctx.enter()?;
        if !self.ctx.held.is_empty() {
            let keys: Vec<String> = self.ctx.held.iter().map(|(k, _)| text::quoted(k)).collect();
            return Err(WaitFailure::Wait(WaitError::ClaimsHeld(format!(
                "this instance holds claims on {}: commit or release them before waiting",
                keys.join(", ")
            ))));
        }
        let run = &self.ctx.run;
        let req = WaitRequest {
            fence: &run.fence,
            key,
            kind,
        };
        match run.store.wait(&req).await {
            Ok(state) => Ok(state),
            Err(StoreError::WaitRefused { reason, .. }) => {
                Err(WaitFailure::Wait(if reason.contains("was used for") {
                    WaitError::KeyReused(reason)
                } else if reason.contains("signal name") || reason.contains("rate class name") {
                    WaitError::InvalidKey(reason)
                } else {
                    WaitError::InvalidTime(reason)
                }))
            }
            Err(e) => Err(WaitFailure::Trap(trap_store(e))),
        }
    }
}
