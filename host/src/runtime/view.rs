//! What idem's imports need from a store, reached through a view trait like wasmtime's
//! `WasiView`: the store's data carries an [`IdemCtx`] and a `ResourceTable`, and the
//! imports (`imports/`) are implemented on the borrowed [`IdemCtxView`].
//!
//! The view is crate-private, and so is linking it. A `WasiCtx` is whole once built; an
//! `IdemCtx` is one instance's share of a run that the host drives: every write it
//! makes presents the fence of a run lease the host holds and renews; its claims'
//! leases are renewed by the host's heartbeat, and its holder name is what the host
//! tells live instances from orphaned ones by; its deadlines are kept by the watchdog
//! around the call of `run` and the epoch callback; its outbound HTTP passes the gate
//! that stamps claims; and its imports end the instance with traps (a planned drop, a
//! wait that suspends the run, a stop, a claim parked in doubt) that only the drive
//! loop turns into the run's next record. A public constructor would hand an embedder
//! all of that to redo, and a slip (a run left leased, a store reused after a trap, a
//! suspension never recorded) breaks exactly-once. Embedders drive runs with
//! [`Host::run`](super::Host::run) or a [`Worker`](crate::worker::Worker), and answer a
//! run's outbound HTTP themselves with an [`HttpCapture`](super::HttpCapture).

use std::sync::Arc;
use std::time::Instant;

use wasmtime::component::{HasData, ResourceTable};

use super::faults::{Phase, Recycle};
use super::http::HttpGate;
use super::limits::LimitExceeded;
use super::run_ctx::{RunCtx, Watch};
use super::stop::Stop;

/// The `idem:agent` state of one instance: the run it serves (carried from instance to
/// instance) and what this instance holds.
pub(crate) struct IdemCtx {
    pub(crate) run: RunCtx,
    /// Instances the run had before this one.
    pub(crate) generation: u64,
    /// This instance's name on the claims it takes.
    pub(crate) holder: String,
    /// Claims granted to this instance.
    pub(crate) grants: u32,
    /// Claims this instance holds now, as `(qualified key, token)`: a second
    /// `run-once` of a held key fails at once, and a run that returns with any of them
    /// still open has them released and reported.
    pub(crate) held: Vec<(String, u64)>,
    /// Deadlines the instance's watchdog enforces while the guest computes or waits.
    pub(crate) watch: Arc<Watch>,
    /// The outbound HTTP gate: the run's policy and the claims requests carry.
    pub(crate) gate: HttpGate,
}

impl std::fmt::Debug for IdemCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdemCtx")
            .field("run_id", &self.run.fence.run_id)
            .field("generation", &self.generation)
            .field("holder", &self.holder)
            .finish_non_exhaustive()
    }
}

/// A store whose data carries idem's state.
pub(crate) trait IdemView: Send {
    /// The idem state and the resource table claims live in.
    fn idem(&mut self) -> IdemCtxView<'_>;
}

/// Borrowed idem state: what the `idem:agent` imports are implemented on.
pub(crate) struct IdemCtxView<'a> {
    /// The instance's idem state.
    pub(crate) ctx: &'a mut IdemCtx,
    /// The store's resource table.
    pub(crate) table: &'a mut ResourceTable,
}

/// The [`HasData`] that links idem's imports to any [`IdemView`].
pub(crate) struct HasIdem;

impl HasData for HasIdem {
    type Data<'a> = IdemCtxView<'a>;
}

impl IdemCtx {
    /// Marks a call into idem and stops the instance if the run was told to stop, or
    /// ends it if a request found one of its claims taken over. A drain (or a pause)
    /// waits for the claims the instance holds: their side effects may be under way, and each ends at
    /// its own commit or release.
    pub(crate) fn enter(&mut self) -> wasmtime::Result<()> {
        self.watch.touch();
        if let Some(key) = self.gate.take_lost() {
            return Err(wasmtime::Error::new(Recycle {
                reason: format!(
                    "the claim on {} was taken over by another holder (a request under it \
                     was refused); the next instance finds the taker's result",
                    crate::text::quoted(&key)
                ),
            }));
        }
        match self.run.signals.stop() {
            Some(Stop::Drain | Stop::Pause) if !self.held.is_empty() => Ok(()),
            Some(stop) => Err(wasmtime::Error::new(stop)),
            None => Ok(()),
        }
    }

    /// Checks the wall-clock limits; called on every epoch tick while wasm runs.
    pub(crate) fn check_time(&self) -> Result<(), LimitExceeded> {
        self.watch.check(Instant::now())
    }

    /// Drops the instance here if the fault plan says so.
    pub(crate) fn fault(&mut self, phase: Phase, step: u32) -> wasmtime::Result<()> {
        self.run
            .faults
            .check(phase, step, self.grants)
            .map_err(wasmtime::Error::new)
    }
}
