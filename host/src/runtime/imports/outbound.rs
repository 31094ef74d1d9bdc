//! `idem:agent/outbound`: the agent's say in how its HTTP requests are stamped, and why
//! the gate refused its latest refused one.

use crate::runtime::bindings::idem::agent::outbound::Host;
use crate::runtime::view::IdemCtxView;

impl Host for IdemCtxView<'_> {
    async fn set_header_names(
        &mut self,
        key: String,
        token: String,
    ) -> wasmtime::Result<Result<(), String>> {
        self.ctx.enter()?;
        // A refused choice is the agent's mistake to handle, not a reason to trap.
        Ok(self
            .ctx
            .gate
            .set_header_names(&key, &token)
            .map_err(|e| e.to_string()))
    }

    async fn last_denial(&mut self) -> wasmtime::Result<Option<String>> {
        // Entering ends an instance whose claim a request found taken over: the agent
        // never acts on that refusal.
        self.ctx.enter()?;
        Ok(self.ctx.gate.last_denial().map(str::to_string))
    }

    async fn stamp_next_request(&mut self, key: String, token: u64) -> wasmtime::Result<()> {
        self.ctx.enter()?;
        // Checked when the request is sent, not now: the claim may end in between. A
        // key longer than any key is held by no claim: not kept, the request refused.
        let key = if key.len() > self.ctx.run.limits.max_key_bytes {
            String::new()
        } else {
            key
        };
        self.ctx.gate.stamp_next(key, token);
        Ok(())
    }
}
