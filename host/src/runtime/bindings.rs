//! The host side of the `idem:agent` world: the one `bindgen!` call of the crate.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "agent",
    // Every import is async (a claim waits on the store, or on another holder, without
    // holding a thread) and may end the instance: a store outage, a fault injected by
    // the host or a recycle point is a trap, never a value the guest could misread.
    imports: { default: async | trappable },
    exports: { default: async },
    // `result<_, step-error>` becomes `Result<_, StepFailure>`: an import returns the
    // agent's error value or a trap through one `?`.
    trappable_error_type: {
        "idem:agent/types.step-error" => crate::runtime::imports::StepFailure,
        "idem:agent/waits.wait-error" => crate::runtime::imports::WaitFailure,
    },
    with: {
        "idem:agent/once.claim": crate::runtime::claim::ClaimHandle,
        // wasi:http and what it uses are wasmtime's: linked by `engine.rs` from their
        // own crates, behind the gate in `http.rs`.
        "wasi:http": wasmtime_wasi_http::p2::bindings::http,
        "wasi:io": wasmtime_wasi::p2::bindings::io,
        "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
    },
});

pub use self::idem::agent::once::{Committed, Obtained, Outcome};
pub use self::idem::agent::progress::Checkpoint as WitCheckpoint;
pub use self::idem::agent::types::StepError;
