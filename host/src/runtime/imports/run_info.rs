//! `idem:agent/run-info`: what the agent may know about its run.

use crate::runtime::bindings::idem::agent::run_info::Host;
use crate::runtime::state::InstanceState;

impl Host for InstanceState {
    fn run_id(&mut self) -> wasmtime::Result<String> {
        self.touch();
        Ok(self.run.run_id.clone())
    }

    fn generation(&mut self) -> wasmtime::Result<u32> {
        self.touch();
        Ok(u32::try_from(self.generation).unwrap_or(u32::MAX))
    }
}
