//! The engine, the instance lifecycle and the host imports.
//!
//! - [`Runtime`] (`engine.rs`, `cache.rs`): one engine per process, components compiled
//!   once and cached on disk, an `InstancePre` per agent.
//! - [`Host`] (`run.rs`): drives runs; a fresh wasmtime `Store` per instance, dropped
//!   (never reused) when the instance ends, traps included.
//! - `imports/`: the `idem:agent` interfaces, one file each; `state.rs`: what a store
//!   carries; `faults.rs`: planned drops; `limits.rs`: what a guest may hand the host;
//!   `http.rs`: the outbound HTTP policy and the idempotency headers (`wasi:http`).

mod bindings;
mod cache;
mod claim;
mod engine;
mod error;
mod faults;
mod heartbeat;
mod http;
mod imports;
mod limits;
mod run;
mod state;

use std::sync::Arc;

pub use cache::default_cache_dir;
pub use engine::{LoadedAgent, Runtime};
pub use error::HostError;
pub use faults::{CrashPoint, CrashPointError, FaultPlan, Phase, Recycle};
pub use http::{
    DEFAULT_KEY_HEADER, DEFAULT_TOKEN_HEADER, HttpDestination, HttpDestinationError, HttpPolicy,
};
pub use limits::{LimitExceeded, Limits};
pub use run::{DirGrant, RunOptions, RunReport};

use crate::store::Store;
use heartbeat::Heartbeat;
use state::LiveHolders;

/// Runs agents against a store. Cheap to share between threads: each run gets its own
/// instances.
pub struct Host {
    runtime: Arc<Runtime>,
    store: Arc<dyn Store>,
    limits: Limits,
    live: Arc<LiveHolders>,
    heartbeat: Arc<Heartbeat>,
}

impl Host {
    /// A host over `store` with `runtime`'s engine and the given limits.
    pub fn new(runtime: Arc<Runtime>, store: Arc<dyn Store>, limits: Limits) -> Host {
        // Unique per process and start: a claim naming another process (or an earlier
        // start of this one) is never treated as orphaned; only its lease frees it.
        let host_id = format!("{:016x}", fastrand::u64(..));
        let heartbeat = Arc::new(Heartbeat::start(Arc::clone(&store), limits.lease));
        Host {
            runtime,
            store,
            limits,
            live: Arc::new(LiveHolders::new(host_id)),
            heartbeat,
        }
    }

    /// The engine side.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }
}
