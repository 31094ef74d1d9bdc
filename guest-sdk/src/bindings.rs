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
});
