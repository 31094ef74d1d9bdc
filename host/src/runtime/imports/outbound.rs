//! `idem:agent/outbound`: the agent's say in how its HTTP requests are stamped.

use crate::runtime::bindings::idem::agent::outbound::Host;
use crate::runtime::state::InstanceState;

impl Host for InstanceState {
    fn set_header_names(
        &mut self,
        key: String,
        token: String,
    ) -> wasmtime::Result<Result<(), String>> {
        // A refused choice is the agent's mistake to handle, not a reason to trap.
        Ok(self
            .http
            .set_header_names(&key, &token)
            .map_err(|e| e.to_string()))
    }
}
