//! The host side of the `idem:agent` world: the one `bindgen!` call of the crate.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "agent",
    // Every import may end the instance: a store outage, a fault injected by the host,
    // or a recycle point is a trap, never a value the guest could misread.
    imports: { default: trappable },
    with: {
        "idem:agent/once.claim": crate::runtime::claim::ClaimHandle,
    },
});

pub use self::idem::agent::once::{Committed, Obtained, Outcome};
pub use self::idem::agent::progress::Checkpoint as WitCheckpoint;
pub use self::idem::agent::types::StepError;
