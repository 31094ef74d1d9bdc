//! Errors of the runtime: what kept an agent from being loaded or a run from being
//! driven. An agent's own error is not one of these: it is the run's outcome. Messages
//! name idem's API (the run, the limit, the key); the CLI adds what to type.

use std::path::{Path, PathBuf};

use super::authority::AuthorityError;
use super::cache::CacheError;
use crate::store::StoreError;
use crate::text;

/// Why the host could not load an agent or drive a run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// The agent file could not be read.
    #[error("cannot read agent {}", path.display())]
    ReadAgent {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The agent file changed after it was loaded, before its bytes were stored.
    #[error(
        "agent {} changed after idem loaded it (it no longer hashes to {digest}); start again",
        path.display()
    )]
    AgentChanged {
        /// The file.
        path: PathBuf,
        /// The digest it was loaded as.
        digest: String,
    },
    /// The file does not start with the WebAssembly magic number.
    #[error("{} is not a WebAssembly file (it does not start with \\0asm)", path.display())]
    NotWasm {
        /// The file.
        path: PathBuf,
    },
    /// The file is a core module, which cannot import the idem interfaces.
    #[error(
        "{} is a core WebAssembly module, not a component; build the agent as a component \
         (Rust: `cargo build --target wasm32-wasip2`; Python: `componentize-py componentize \
         app`)",
        path.display()
    )]
    CoreModule {
        /// The file.
        path: PathBuf,
    },
    /// The file is not a valid component.
    #[error("{} is not a valid WebAssembly component: {reason}", path.display())]
    InvalidComponent {
        /// The file.
        path: PathBuf,
        /// Wasmtime's reason.
        reason: String,
    },
    /// The component is valid but not an agent of the `idem:agent` world.
    #[error("{} is not an idem agent (world idem:agent/agent@0.1.5): {reason}", path.display())]
    WrongWorld {
        /// The file.
        path: PathBuf,
        /// What does not match.
        reason: String,
    },
    /// A directory grant could not be opened.
    #[error("cannot grant directory {} to the agent as {guest}: {reason}", host.display())]
    Grant {
        /// The host path.
        host: PathBuf,
        /// The guest path.
        guest: String,
        /// Why.
        reason: String,
    },
    /// A directory grant would expose idem's own files (see [`check_grants`]).
    ///
    /// [`check_grants`]: super::check_grants
    #[error(transparent)]
    GrantRefused(#[from] GrantError),
    /// The component cache cannot be used safely.
    #[error(transparent)]
    Cache(#[from] CacheError),
    /// The store failed (a lost run lease is [`HostError::LeaseLost`] instead).
    #[error(transparent)]
    Store(StoreError),
    /// The run id is unusable.
    #[error("invalid run id {}: {reason}", text::quoted(run_id))]
    InvalidRunId {
        /// The id given.
        run_id: String,
        /// Why.
        reason: String,
    },
    /// The run is stopped in doubt: its parked keys must be resolved first.
    #[error(
        "run {} is stopped in doubt at {}; each parked key must be resolved (its effect \
         happened: commit its result; it did not: retry it) before the run can resume",
        text::quoted(run_id),
        keys.iter().map(|k| text::quoted(k)).collect::<Vec<_>>().join(", ")
    )]
    InDoubt {
        /// The run.
        run_id: String,
        /// Its parked keys.
        keys: Vec<String>,
    },
    /// The run was started with another component.
    #[error(
        "run {} was started with component {pinned}, not {given}; resuming it with another \
         component must be asked for as an upgrade (which is recorded)",
        text::quoted(run_id)
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
        "run {} keeps its keys in namespace {}, not {}",
        text::quoted(run_id),
        text::quoted(pinned),
        text::quoted(given)
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
    #[error("invalid namespace {}: {reason}", text::quoted(namespace))]
    InvalidNamespace {
        /// The namespace given.
        namespace: String,
        /// Why, naming the first character that is not allowed if it is invisible.
        reason: String,
    },
    /// No deployment has this name or digest.
    #[error("no agent is deployed as {}", text::quoted(name))]
    UnknownDeployment {
        /// The name or digest asked for.
        name: String,
    },
    /// The run's authority cannot be used.
    #[error(transparent)]
    Authority(#[from] AuthorityError),
    /// The run kept being dropped without finishing.
    #[error(
        "run {} used {instances} instances without finishing; giving up",
        text::quoted(run_id)
    )]
    TooManyInstances {
        /// The run.
        run_id: String,
        /// How many instances it used.
        instances: u64,
    },
    /// Another holder took the run's lease over while this host drove it (this host
    /// was paused, or cut off from the store, for longer than the lease). Nothing more
    /// was written for the run by this host.
    #[error(
        "run {} was taken over by another holder: its lease ran out while this host did not \
         renew it; this host wrote nothing more for it",
        text::quoted(run_id)
    )]
    LeaseLost {
        /// The run.
        run_id: String,
    },
    /// This host already drives the run (twice at once would break its lease).
    #[error("run {} is already being driven by this host", text::quoted(run_id))]
    AlreadyDriving {
        /// The run.
        run_id: String,
    },
    /// The host needs a tokio runtime and was not started inside one.
    #[error("idem's host must be created inside a tokio runtime")]
    NoRuntime,
    /// Wasmtime failed outside of any guest's doing.
    #[error("wasm engine: {0}")]
    Engine(String),
}

impl From<StoreError> for HostError {
    fn from(e: StoreError) -> Self {
        match e {
            // However the driver learns it (a write, a renewal, the run's end), a lease
            // another holder took over is one outcome, with one message: which store
            // call saw it first depends only on timing.
            StoreError::LeaseLost { run_id, .. } => HostError::LeaseLost { run_id },
            e => HostError::Store(e),
        }
    }
}

/// A grant refused because of what it would expose.
#[derive(Debug, thiserror::Error)]
#[error(
    "refusing to grant directory {host} to the agent as {guest}{}: {exposes}",
    resolved_note(host, resolved)
)]
pub struct GrantError {
    /// The host path, as given.
    pub host: PathBuf,
    /// The path the guest would see it under.
    pub guest: String,
    /// The host path with symbolic links resolved.
    pub resolved: PathBuf,
    /// What the agent would reach.
    pub exposes: Exposes,
}

fn resolved_note(host: &Path, resolved: &Path) -> String {
    if host == resolved {
        String::new()
    } else {
        format!(" (which is {})", resolved.display())
    }
}

/// What a refused grant would expose.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Exposes {
    /// The grant contains the store.
    #[error(
        "it contains the store {} (and its -wal and -shm files), whose records the \
         agent could rewrite",
        .0.display()
    )]
    Store(PathBuf),
    /// The grant contains the component cache.
    #[error(
        "it contains the component cache {}, where the agent could read the key that \
         seals compiled code and plant code for idem to run",
        .0.display()
    )]
    ContainsCache(PathBuf),
    /// The grant lies inside the component cache.
    #[error(
        "it lies inside the component cache {}, where the agent could plant code for \
         idem to run",
        .0.display()
    )]
    InsideCache(PathBuf),
    /// The grant contains the store's key file.
    #[error(
        "it contains the store's key file {}, with which the agent could read every \
         payload the store keeps sealed",
        .0.display()
    )]
    Key(PathBuf),
}
