//! The engine, the instance lifecycle and the host imports.
//!
//! - [`Runtime`] (`engine.rs`, `cache.rs`): one engine per process, components compiled
//!   once and cached on disk (sealed with a per-user key, in a directory only the user
//!   can change), an `InstancePre` per agent.
//! - [`check_grants`] (`grants.rs`): refuses directory grants that would expose the
//!   store or the component cache to an agent.
//! - [`Host`] (`run.rs`, `instance.rs`): drives runs on tokio; a fresh wasmtime `Store`
//!   per instance, dropped (never reused) when the instance ends; why it ended is one
//!   type (`end.rs`).
//! - `imports/`: the `idem:agent` interfaces, one file each, on the view of `view.rs`;
//!   `state.rs`: what a store carries and how its memory is counted; `run_ctx.rs`: what
//!   a run carries between instances, its stop signals and deadlines; `heartbeat.rs`:
//!   lease renewal; `faults.rs`: planned drops; `limits.rs`: what a guest may hand the
//!   host; `authority.rs`: what a run may reach; `http.rs`: the outbound HTTP policy; `capture.rs`: the hook that lets an embedder
//!   answer outbound requests itself and hear of refused ones;
//!   `output.rs`: the guest's stderr and stdout, escaped, as the run's log.

mod agent_bytes;
mod authority;
mod bindings;
mod cache;
mod capture;
mod claim;
mod end;
mod engine;
mod error;
mod faults;
mod grants;
mod heartbeat;
mod http;
mod imports;
mod instance;
mod limits;
mod output;
mod run;
mod run_ctx;
mod signal;
mod state;
mod view;

use std::sync::Arc;

pub use authority::{Authority, AuthorityError, DirGrant};
pub use cache::{CacheError, UnsafeDir, default_cache_dir};
pub use capture::{
    CaptureError, CaptureFuture, CapturedRequest, CapturedResponse, DenialKind, DeniedRequest,
    HttpCapture, MAX_CAPTURED_BODY,
};
pub use engine::{LoadedAgent, Runtime};
pub use error::HostError;
pub use faults::{CrashPoint, CrashPointError, FaultPlan, Phase, Recycle};
pub use grants::{Exposes, GrantError, Protected, check_grants};
pub use http::{
    DEFAULT_KEY_HEADER, DEFAULT_TOKEN_HEADER, HttpDestination, HttpDestinationError, HttpPolicy,
};
pub use limits::{InvalidLimit, LimitExceeded, Limits};
pub use output::{Echo, LOG_KEEP};
pub use run::{RunFailure, RunOptions, RunReport, Waiting, check_namespace, check_run_id};
pub use run_ctx::Stop;
pub use signal::send_signal;
pub use view::{IdemCtx, IdemCtxView, IdemView};

#[cfg(feature = "prove")]
pub(crate) use limits::cut;
pub(crate) use output::LogSink;
pub(crate) use run_ctx::RunSignals;

use crate::store::Store;
use heartbeat::Heartbeat;
use run_ctx::LiveHolders;

/// Runs agents against a store. Cheap to share between tasks: each run gets its own
/// instances. Created inside a tokio runtime, whose tasks renew its leases.
pub struct Host {
    runtime: Arc<Runtime>,
    store: Arc<dyn Store>,
    live: Arc<LiveHolders>,
    heartbeat: Arc<Heartbeat>,
    /// Runs this host drives now. The store re-grants a run's lease to the worker that
    /// holds it, so this set is what keeps one host from driving a run twice at once.
    driving: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    /// Digests of the components this host has put in the store: a run of one of them
    /// does not send its bytes again (megabytes per run for a Python agent, over the
    /// network on PostgreSQL).
    stored: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl Host {
    /// A host over `store` with `runtime`'s engine. Fails outside a tokio runtime.
    pub fn new(runtime: Arc<Runtime>, store: Arc<dyn Store>) -> Result<Host, HostError> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| HostError::NoRuntime)?;
        // Unique per process and start: a claim naming another process (or an earlier
        // start of this one) is never treated as orphaned; only its lease frees it.
        let host_id = format!("{:016x}", fastrand::u64(..));
        Ok(Host::with_id(runtime, store, host_id, &handle))
    }

    /// A host whose claims and run leases carry `name` (a worker's name) before its
    /// unique id.
    pub fn named(
        runtime: Arc<Runtime>,
        store: Arc<dyn Store>,
        name: &str,
    ) -> Result<Host, HostError> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| HostError::NoRuntime)?;
        let host_id = format!("{name}-{:016x}", fastrand::u64(..));
        Ok(Host::with_id(runtime, store, host_id, &handle))
    }

    fn with_id(
        runtime: Arc<Runtime>,
        store: Arc<dyn Store>,
        host_id: String,
        handle: &tokio::runtime::Handle,
    ) -> Host {
        let heartbeat = Arc::new(Heartbeat::start(Arc::clone(&store), handle));
        Host {
            runtime,
            store,
            live: Arc::new(LiveHolders::new(host_id)),
            heartbeat,
            driving: Arc::default(),
            stored: std::sync::Mutex::default(),
        }
    }

    /// The engine side.
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The name this host's run leases and claims carry.
    pub fn id(&self) -> &str {
        self.live.host_id()
    }

    /// Instances of this host alive now, over all the runs it drives. A run suspended
    /// in a wait has none.
    pub fn live_instances(&self) -> usize {
        self.live.count()
    }

    /// Renews the lease of a run this host holds until the guard is dropped (a run it
    /// leased but has not started driving yet).
    pub(crate) fn renew_while(
        &self,
        fence: &crate::store::RunFence,
        lease: std::time::Duration,
        signals: Arc<RunSignals>,
    ) -> Renewing {
        self.heartbeat.hold_run(fence, lease, signals);
        Renewing {
            heartbeat: Arc::clone(&self.heartbeat),
            run_id: fence.run_id.clone(),
        }
    }

    /// Marks `run_id` as driven by this host until the guard is dropped; fails if it
    /// already is.
    pub(crate) fn start_driving(&self, run_id: &str) -> Result<Driving, HostError> {
        let mut driving = self
            .driving
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !driving.insert(run_id.to_string()) {
            return Err(HostError::AlreadyDriving {
                run_id: run_id.to_string(),
            });
        }
        Ok(Driving {
            set: Arc::clone(&self.driving),
            run_id: run_id.to_string(),
        })
    }
}

/// A run lease this host renews; dropping it stops the renewal.
pub(crate) struct Renewing {
    heartbeat: Arc<Heartbeat>,
    run_id: String,
}

impl Drop for Renewing {
    fn drop(&mut self) {
        self.heartbeat.drop_run(&self.run_id);
    }
}

/// A run this host drives; dropping it says the host no longer does.
pub(crate) struct Driving {
    set: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    run_id: String,
}

impl Drop for Driving {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&self.run_id);
    }
}
