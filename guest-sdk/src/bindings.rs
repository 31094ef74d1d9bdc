//! The raw `idem:agent` bindings: the one `generate!` call of the SDK. Agents never use
//! this module; the typed API in the rest of the crate wraps it.

// The generated glue is FFI code: it cannot avoid `unsafe`, and its items mirror WIT
// names rather than carry Rust docs of their own.
#![allow(unsafe_code, missing_docs)]

wit_bindgen::generate!({
    // `wit` is a symlink to the top-level `wit/`, which the host reads too: inside the
    // package it is a path of the SDK's own, so `cargo package` ships the WIT with it.
    path: "wit",
    world: "agent",
    // The export macro is called from agent crates, through `idem_sdk::export_agent!`.
    pub_export_macro: true,
    export_macro_name: "__export_agent_world",
    default_bindings_module: "idem_sdk::bindings",
    // Agents depend on `idem-sdk` alone: the runtime support is reached through it.
    runtime_path: "idem_sdk::__rt",
    // The world imports wasi:http (for every language's bindings); Rust agents reach it
    // through the bytecodealliance `wasi` crate, which binds the same 0.2.12 interfaces,
    // so its types are the ones `http.rs` uses.
    with: {
        "wasi:http/types@0.2.12": wasi::http::types,
        "wasi:http/outgoing-handler@0.2.12": wasi::http::outgoing_handler,
        "wasi:io/error@0.2.12": wasi::io::error,
        "wasi:io/poll@0.2.12": wasi::io::poll,
        "wasi:io/streams@0.2.12": wasi::io::streams,
        "wasi:clocks/monotonic-clock@0.2.12": wasi::clocks::monotonic_clock,
    },
});
