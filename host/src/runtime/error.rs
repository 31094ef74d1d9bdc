//! Errors of the runtime: what kept an agent from being loaded or a run from being
//! driven. An agent's own error is not one of these: it is the run's outcome.

use std::path::PathBuf;

use crate::store::StoreError;

/// Why the host could not load an agent or drive a run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// The agent file could not be read.
    #[error("cannot read agent {path}")]
    ReadAgent {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file does not start with the WebAssembly magic number.
    #[error("{path} is not a WebAssembly file (it does not start with \\0asm)")]
    NotWasm {
        /// The file.
        path: PathBuf,
    },
    /// The file is a core module, which cannot import the idem interfaces.
    #[error(
        "{path} is a core WebAssembly module, not a component; build the agent with \
         `cargo build --target wasm32-wasip2`"
    )]
    CoreModule {
        /// The file.
        path: PathBuf,
    },
    /// The file is not a valid component.
    #[error("{path} is not a valid WebAssembly component: {reason}")]
    InvalidComponent {
        /// The file.
        path: PathBuf,
        /// Wasmtime's reason.
        reason: String,
    },
    /// The component is valid but not an agent of the `idem:agent` world.
    #[error("{path} is not an idem agent (world idem:agent/agent@0.1.0): {reason}")]
    WrongWorld {
        /// The file.
        path: PathBuf,
        /// What does not match.
        reason: String,
    },
    /// A `--dir` grant could not be opened.
    #[error("cannot grant directory {host} to the agent as {guest}: {reason}")]
    Grant {
        /// The host path.
        host: PathBuf,
        /// The guest path.
        guest: String,
        /// Why.
        reason: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The run id is unusable.
    #[error("invalid run id {run_id:?}: {reason}")]
    InvalidRunId {
        /// The id given.
        run_id: String,
        /// Why.
        reason: String,
    },
    /// The run is stopped in doubt: its parked keys must be resolved first.
    #[error(
        "run {run_id} is stopped in doubt at {}; settle each with `idem resolve {run_id} KEY --result JSON` (the effect happened) or `--retry`",
        keys.join(", ")
    )]
    InDoubt {
        /// The run.
        run_id: String,
        /// Its parked keys.
        keys: Vec<String>,
    },
    /// The run was started with another component.
    #[error(
        "run {run_id} was started with component {pinned}, not {given}; pass --upgrade to \
         resume it with this one (the upgrade is recorded)"
    )]
    Pinned {
        /// The run.
        run_id: String,
        /// The digest it was started with.
        pinned: String,
        /// The digest given now.
        given: String,
    },
    /// The run was started in another namespace.
    #[error(
        "run {run_id} keeps its keys in namespace {pinned:?}, not {given:?}; resume it \
         with --namespace {pinned}"
    )]
    NamespaceMismatch {
        /// The run.
        run_id: String,
        /// Its namespace.
        pinned: String,
        /// The namespace given now.
        given: String,
    },
    /// A namespace that cannot be used.
    #[error("invalid namespace {namespace:?}: use 1 to 64 letters, digits, '.', '_' or '-'")]
    InvalidNamespace {
        /// The namespace given.
        namespace: String,
    },
    /// The run kept being dropped without finishing.
    #[error("run {run_id} used {instances} instances without finishing; giving up")]
    TooManyInstances {
        /// The run.
        run_id: String,
        /// How many instances it used.
        instances: u64,
    },
    /// Wasmtime failed outside of any guest's doing.
    #[error("wasm engine: {0}")]
    Engine(String),
}
