//! The host's implementations of the `idem:agent` imports, one file per interface, on
//! [`IdemCtxView`](super::view::IdemCtxView): linked (`engine.rs`) for any store data
//! with an [`IdemView`](super::view::IdemView), which is the instance state of
//! `state.rs` (see `view.rs` for why embedders do not link them).

mod children;
mod live;
mod once;
mod once_many;
mod outbound;
mod progress;
mod run_info;
mod usage;
mod waits;

pub(crate) use waits::WaitFailure;

use super::bindings::StepError;
use super::bindings::idem::agent::types::Host as TypesHost;
use super::view::IdemCtxView;
use crate::store::StoreError;

/// What an import that returns `result<_, step-error>` fails with: the agent's error
/// value, or a trap that ends the instance (a store outage, a planned drop, a stop).
#[derive(Debug)]
pub(crate) enum StepFailure {
    /// A value the agent handles.
    Step(StepError),
    /// The instance ends.
    Trap(wasmtime::Error),
}

impl From<StepError> for StepFailure {
    fn from(e: StepError) -> Self {
        StepFailure::Step(e)
    }
}

impl From<wasmtime::Error> for StepFailure {
    fn from(e: wasmtime::Error) -> Self {
        StepFailure::Trap(e)
    }
}

impl From<StoreError> for StepFailure {
    fn from(e: StoreError) -> Self {
        StepFailure::Trap(super::end::trap_store(e))
    }
}

impl TypesHost for IdemCtxView<'_> {
    fn convert_step_error(&mut self, err: StepFailure) -> wasmtime::Result<StepError> {
        match err {
            StepFailure::Step(e) => Ok(e),
            StepFailure::Trap(trap) => Err(trap),
        }
    }
}
