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
use crate::store::{Presence, RunFence, Store};
use crate::text;

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
    /// This process made known to the store as alive, before its first lease.
    presence: tokio::sync::OnceCell<Presence>,
    /// Holders found gone whose run leases this host already ended.
    buried: Mutex<HashSet<String>>,
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
        // A claim's holder is this id, `/`, and more (`LiveHolders::holder`): the id
        // must not hold a `/` of its own.
        let host_id = format!("{}-{:016x}", name.replace('/', "-"), fastrand::u64(..));
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
            presence: tokio::sync::OnceCell::new(),
            buried: Mutex::default(),
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

    /// Makes this process known to the store as alive, once, before it takes a lease:
    /// if it dies, others take its runs and claims over at once instead of waiting
    /// out their leases. A store that cannot record it is no reason to stop: leases
    /// still free whatever a dead process held.
    pub(crate) async fn be_present(&self) {
        self.presence
            .get_or_init(|| async {
                self.store
                    .be_present(self.id())
                    .await
                    .unwrap_or_else(|err| {
                        tracing::warn!(
                            error = %err,
                            "cannot record this process as alive in the store; if it dies, its \
                             runs wait out their leases"
                        );
                        Presence::untold()
                    })
            })
            .await;
    }

    /// Whether `holder` (a run lease's or a claim's) belongs to a process the store
    /// knows is gone.
    pub(crate) async fn is_gone(&self, holder: &str) -> Result<bool, HostError> {
        Ok(self.live.is_gone(self.store.as_ref(), holder).await?)
    }

    /// Ends the run leases of `worker`, a holder found gone; true if any ended.
    pub(crate) async fn take_from_gone(&self, worker: &str) -> Result<bool, HostError> {
        let ended = self.store.end_leases_of_gone(worker).await?;
        if ended > 0 {
            tracing::warn!(
                holder = %text::escape(worker, false),
                runs = ended,
                "the process holding these runs is gone; taking them over without waiting \
                 out their leases"
            );
        }
        Ok(ended > 0)
    }

    /// Ends the run leases of every holder the store knows is gone, once per holder,
    /// so that this host's next lease of runs takes theirs.
    pub(crate) async fn end_leases_of_gone(&self) -> Result<(), HostError> {
        for holder in self.store.gone_holders().await? {
            let new = {
                let buried = self.buried.lock().unwrap_or_else(PoisonError::into_inner);
                !buried.contains(&holder)
            };
            if new && holder != self.id() {
                self.take_from_gone(&holder).await?;
                self.buried
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(holder);
            }
        }
        Ok(())
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
