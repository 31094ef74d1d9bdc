//! The [`Host`]: what every run of one process shares — the engine, the store, the
//! lease renewal, the instances alive now and the runs being driven — and the guards
//! that hold a run's lease renewal and its place among the driven runs.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use super::engine::Runtime;
use super::error::HostError;
use super::heartbeat::Heartbeat;
use super::run_ctx::LiveHolders;
use super::stop::RunSignals;
use crate::store::{RunFence, Store};

/// Runs agents against a store. Cheap to share between tasks: each run gets its own
/// instances. Created inside a tokio runtime, whose tasks renew its leases.
pub struct Host {
    pub(super) runtime: Arc<Runtime>,
    pub(super) store: Arc<dyn Store>,
    pub(super) live: Arc<LiveHolders>,
    pub(super) heartbeat: Arc<Heartbeat>,
    /// Runs this host drives now. The store re-grants a run's lease to the worker that
    /// holds it, so this set is what keeps one host from driving a run twice at once.
    driving: Arc<Mutex<HashSet<String>>>,
    /// Digests of the components this host has put in the store: a run of one of them
    /// does not send its bytes again (megabytes per run for a Python agent, over the
    /// network on PostgreSQL).
    pub(super) stored: Mutex<HashSet<String>>,
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
            stored: Mutex::default(),
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
        fence: &RunFence,
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
        let mut driving = self.driving.lock().unwrap_or_else(PoisonError::into_inner);
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
    set: Arc<Mutex<HashSet<String>>>,
    run_id: String,
}

impl Drop for Driving {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.run_id);
    }
}
