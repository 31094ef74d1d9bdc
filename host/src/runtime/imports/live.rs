//! `idem:agent/live`: text a step publishes to the run's live stream while it runs.

use crate::runtime::bindings::idem::agent::live::{Host, LiveError};
use crate::runtime::view::IdemCtxView;
use crate::store::MAX_LIVE_CHUNK_BYTES;

impl Host for IdemCtxView<'_> {
    async fn publish(
        &mut self,
        key: String,
        text: String,
    ) -> wasmtime::Result<Result<(), LiveError>> {
        self.ctx.enter()?;
        let run = &self.ctx.run;
        if let Err(reason) = run.limits.check_key(&key) {
            return Ok(Err(LiveError::InvalidKey(reason)));
        }
        if text.len() > MAX_LIVE_CHUNK_BYTES {
            return Ok(Err(LiveError::TooLarge(MAX_LIVE_CHUNK_BYTES as u64)));
        }
        if !text.is_empty() {
            // Gathered here and written by the instance's watchdog: publishing never
            // waits on the store.
            run.live_text.publish(&key, &text);
        }
        Ok(Ok(()))
    }
}
