//! What a guest instance's wasmtime `Store` carries: WASI, wasi:http, idem's state,
//! one resource table, and the accounting that holds the instance to its memory limit.
//!
//! Memory the host holds for a guest counts against the same limit as the guest's
//! linear memories: every live handle in the resource table is charged what one handle
//! can hold at most ([`Limits::HANDLE_BYTES`]: a header set, or a request body's
//! buffered chunks), so linear memory (summed over every memory of the instance) plus
//! handles × that charge never passes the limit.

use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::limits::{LimitExceeded, Limits};
use super::view::{IdemCtx, IdemCtxView, IdemView};

/// The data of one instance's `Store`.
pub(crate) struct InstanceState {
    pub(crate) wasi: WasiCtx,
    pub(crate) http: WasiHttpCtx,
    pub(crate) table: ResourceTable,
    pub(crate) idem: IdemCtx,
    memory: MemoryAccount,
}

/// Linear memory and table elements granted so far, over every memory and table of
/// the instance.
#[derive(Debug, Default)]
struct MemoryAccount {
    linear: usize,
    elements: usize,
}

impl InstanceState {
    pub(crate) fn new(wasi: WasiCtx, idem: IdemCtx) -> InstanceState {
        let mut http = WasiHttpCtx::new();
        http.set_field_size_limit(Limits::FIELD_BYTES);
        let mut state = InstanceState {
            wasi,
            http,
            table: ResourceTable::new(),
            idem,
            memory: MemoryAccount::default(),
        };
        state.cap_handles();
        state
    }

    fn limits(&self) -> &Limits {
        &self.idem.run.limits
    }

    /// Handles the table may still hold, given the linear memory granted: what is left
    /// of the memory limit, in handle charges.
    fn cap_handles(&mut self) {
        let left = self
            .limits()
            .max_memory_bytes
            .saturating_sub(self.memory.linear);
        let cap = (left / Limits::HANDLE_BYTES).min(self.limits().max_handles);
        self.table.set_max_capacity(cap);
    }

    fn live_handles(&mut self) -> usize {
        self.table.iter_mut().count()
    }
}

impl ResourceLimiter for InstanceState {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let limit = self.limits().max_memory_bytes;
        let linear = self
            .memory
            .linear
            .saturating_sub(current)
            .saturating_add(desired);
        let handles = self.live_handles().saturating_mul(Limits::HANDLE_BYTES);
        if linear.saturating_add(handles) > limit {
            // A trap naming the limit, rather than a failed `memory.grow` that the
            // guest's allocator turns into an anonymous abort.
            return Err(wasmtime::Error::new(LimitExceeded::Memory {
                desired: linear.saturating_add(handles),
                limit,
            }));
        }
        self.memory.linear = linear;
        self.cap_handles();
        Ok(true)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let limit = self.limits().max_table_elements;
        let elements = self
            .memory
            .elements
            .saturating_sub(current)
            .saturating_add(desired);
        if elements > limit {
            return Err(wasmtime::Error::new(LimitExceeded::Table {
                desired: elements,
                limit,
            }));
        }
        self.memory.elements = elements;
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

impl WasiHttpView for InstanceState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.idem.gate,
        }
    }
}

impl IdemView for InstanceState {
    fn idem(&mut self) -> IdemCtxView<'_> {
        IdemCtxView {
            ctx: &mut self.idem,
            table: &mut self.table,
        }
    }
}
