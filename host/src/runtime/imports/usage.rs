//! `idem:agent/usage`: the token usage of a model call, recorded with its step.

use crate::runtime::bindings::idem::agent::usage::{
    Host, Recorded as WitRecorded, Tokens as WitTokens, UsageError,
};
use crate::runtime::end::trap_store;
use crate::runtime::view::IdemCtxView;
use crate::store::{Recorded, StoreError, Tokens, UsageRecord, UsageRefusal};

impl Host for IdemCtxView<'_> {
    async fn record_usage(
        &mut self,
        key: String,
        model: String,
        tokens: WitTokens,
    ) -> wasmtime::Result<Result<WitRecorded, UsageError>> {
        self.ctx.enter()?;
        let run = &self.ctx.run;
        if let Err(reason) = run.limits.check_key(&key) {
            return Ok(Err(UsageError::Invalid(reason)));
        }
        let stored = run.qualify(&key);
        let record = UsageRecord {
            fence: &run.fence,
            key: &stored,
            model: &model,
            tokens: Tokens {
                input: tokens.input,
                output: tokens.output,
                cached: tokens.cached,
            },
        };
        match run.store.record_usage(&record).await {
            Ok(Recorded::Spent) => Ok(Ok(WitRecorded::Spent)),
            Ok(Recorded::Saved) => Ok(Ok(WitRecorded::Saved)),
            // The agent's key, as it named it, not the store's qualified one.
            Err(StoreError::UsageRefused {
                refusal: UsageRefusal::UnknownStep,
                ..
            }) => Ok(Err(UsageError::UnknownStep(key))),
            Err(StoreError::UsageRefused { refusal, .. }) => {
                Ok(Err(UsageError::Invalid(refusal.to_string())))
            }
            Err(e) => Err(trap_store(e)),
        }
    }
}
