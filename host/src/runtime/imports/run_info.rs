//! `idem:agent/run-info`: what the agent may know about its run.

use crate::runtime::bindings::idem::agent::run_info::Host;
use crate::runtime::view::IdemCtxView;

impl Host for IdemCtxView<'_> {
    async fn run_id(&mut self) -> wasmtime::Result<String> {
        self.ctx.enter()?;
        Ok(self.ctx.run.run_id().to_string())
    }

    async fn generation(&mut self) -> wasmtime::Result<u32> {
        self.ctx.enter()?;
        Ok(u32::try_from(self.ctx.generation).unwrap_or(u32::MAX))
    }
}
