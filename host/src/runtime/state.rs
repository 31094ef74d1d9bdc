//! What a guest instance's `Store` carries: its WASI context and resource table, and the
//! run it serves. The run's part outlives instances: it is moved out of a dropped
//! instance's store and into the next one.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::faults::{Faults, Phase};
use super::heartbeat::Heartbeat;
use super::http::HttpState;
use super::limits::{LimitExceeded, Limits};
use crate::store::{Counts, Store, StoreError};

/// The holders of claims made by live instances of this process. A claim whose holder
/// names this process but is not in the set belongs to an instance the host dropped: it
/// is orphaned and may be retaken at once, without waiting for its lease.
#[derive(Debug, Default)]
pub(crate) struct LiveHolders {
    host_id: String,
    live: Mutex<HashSet<String>>,
}

impl LiveHolders {
    pub(crate) fn new(host_id: String) -> Self {
        LiveHolders {
            host_id,
            live: Mutex::default(),
        }
    }

    /// A holder name for generation `generation` of `run_id` in this process.
    pub(crate) fn holder(&self, run_id: &str, generation: u64) -> String {
        format!("{}/{run_id}/{generation}", self.host_id)
    }

    pub(crate) fn enter(&self, holder: &str) {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(holder.to_string());
    }

    pub(crate) fn leave(&self, holder: &str) {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(holder);
    }

    /// Whether `holder` was an instance of this process that no longer lives.
    pub(crate) fn is_orphan(&self, holder: &str) -> bool {
        holder
            .strip_prefix(self.host_id.as_str())
            .is_some_and(|rest| rest.starts_with('/'))
            && !self
                .live
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains(holder)
    }
}

/// A failure inside a host call that must end the instance (a trap), as opposed to a
/// `step-error` value the guest handles.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HostCallFailure {
    /// The store failed; the run stops with this error.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The agent parked an in-doubt claim: the instance ends and the run stops in doubt.
#[derive(Debug, thiserror::Error)]
#[error("run stopped in doubt at key {key}")]
pub(crate) struct StoppedInDoubt {
    pub(crate) key: String,
}

/// The run an instance serves; carried from instance to instance.
pub(crate) struct RunCtx {
    pub(crate) run_id: String,
    /// The namespace the run's keys live in.
    pub(crate) namespace: String,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) limits: Limits,
    pub(crate) live: Arc<LiveHolders>,
    pub(crate) heartbeat: Arc<Heartbeat>,
    pub(crate) counts: Counts,
    pub(crate) faults: Faults,
    /// Each key's place in the order the run first used it (1-based).
    pub(crate) ordinals: HashMap<String, u32>,
    /// The ordinal of the step last committed, which the next progress save follows.
    pub(crate) last_committed: u32,
    /// Fuel this invocation may still burn, over all instances (`--max-fuel`).
    pub(crate) fuel_left: Option<u64>,
}

impl RunCtx {
    /// The store's name for the agent's `key`: its namespace, a colon, the key.
    /// Namespaces hold no colon, so the first one splits the two unambiguously.
    pub(crate) fn qualify(&self, key: &str) -> String {
        format!("{}:{key}", self.namespace)
    }

    pub(crate) fn ordinal(&mut self, key: &str) -> u32 {
        let next = self.ordinals.len() as u32 + 1;
        *self.ordinals.entry(key.to_string()).or_insert(next)
    }
}

/// The data of one instance's `Store`.
pub(crate) struct InstanceState {
    pub(crate) wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) run: RunCtx,
    /// Instances the run had before this one.
    pub(crate) generation: u64,
    /// This instance's name on the claims it takes.
    pub(crate) holder: String,
    /// Claims granted to this instance.
    pub(crate) grants: u32,
    /// When the guest last called one of idem's imports: the compute limit runs from
    /// here.
    pub(crate) last_call: Instant,
    /// The side effect in flight (its key and when its claim was granted): the
    /// side-effect time limit runs from there.
    pub(crate) effect: Option<(String, Instant)>,
    /// Outbound HTTP: the run's policy and the claims requests are stamped with.
    pub(crate) http: HttpState,
}

impl InstanceState {
    /// Marks a call into idem: the guest is not stuck.
    pub(crate) fn touch(&mut self) {
        self.last_call = Instant::now();
    }

    /// Checks the wall-clock limits; called on every epoch tick while wasm runs.
    pub(crate) fn check_time(&self) -> Result<(), LimitExceeded> {
        let limits = &self.run.limits;
        if self.last_call.elapsed() > limits.max_compute {
            return Err(LimitExceeded::Compute {
                limit: limits.max_compute,
            });
        }
        match &self.effect {
            Some((key, since)) if since.elapsed() > limits.effect_timeout => {
                Err(LimitExceeded::Effect {
                    key: key.clone(),
                    limit: limits.effect_timeout,
                })
            }
            _ => Ok(()),
        }
    }

    /// Drops the instance here if the fault plan says so.
    pub(crate) fn fault(&mut self, phase: Phase, step: u32) -> wasmtime::Result<()> {
        self.run
            .faults
            .check(phase, step, self.grants)
            .map_err(wasmtime::Error::new)
    }

    pub(crate) fn trap_store(e: StoreError) -> wasmtime::Error {
        wasmtime::Error::new(HostCallFailure::Store(e))
    }
}

impl ResourceLimiter for InstanceState {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let limit = self.run.limits.max_memory_bytes;
        if desired > limit {
            // A trap naming the limit, rather than a failed `memory.grow` that the
            // guest's allocator turns into an anonymous abort.
            return Err(wasmtime::Error::new(LimitExceeded::Memory {
                desired,
                limit,
            }));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let limit = self.run.limits.max_table_elements;
        if desired > limit {
            return Err(wasmtime::Error::new(LimitExceeded::Table {
                desired,
                limit,
            }));
        }
        Ok(true)
    }
}

impl WasiView for InstanceState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}
