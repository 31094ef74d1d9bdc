//! `idem:agent/progress`: the run's checkpoint, kept in the store.

use super::StepFailure;
use crate::runtime::bindings::idem::agent::progress::Host;
use crate::runtime::bindings::{StepError, WitCheckpoint};
use crate::runtime::end::trap_store;
use crate::runtime::faults::Phase;
use crate::runtime::view::IdemCtxView;
use crate::store::{Checkpoint, MAX_STEP};

impl Host for IdemCtxView<'_> {
    async fn load(&mut self) -> wasmtime::Result<Option<WitCheckpoint>> {
        self.ctx.enter()?;
        let checkpoint = match self.ctx.run.preloaded.take() {
            // Read with the lease, and not written since.
            Some(checkpoint) => checkpoint,
            None => {
                let run = &self.ctx.run;
                run.store
                    .load_progress(run.run_id())
                    .await
                    .map_err(trap_store)?
            }
        };
        Ok(checkpoint.map(|c| WitCheckpoint {
            step: c.step,
            state: c.state,
        }))
    }

    async fn save(&mut self, step: u64, state: Vec<u8>) -> Result<(), StepFailure> {
        self.ctx.enter()?;
        let limit = self.ctx.run.limits.max_state_bytes;
        if state.len() > limit {
            return Err(StepError::TooLarge(format!(
                "progress state is {} bytes, over the limit of {limit} bytes",
                state.len()
            ))
            .into());
        }
        if step > MAX_STEP {
            return Err(StepError::TooLarge(format!(
                "progress step {step} is over the largest step a store keeps ({MAX_STEP})"
            ))
            .into());
        }
        let checkpoint = Checkpoint { step, state };
        // Whatever this write's outcome, the checkpoint read with the lease is stale.
        self.ctx.run.preloaded = None;
        let counts = self.ctx.run.counts_due();
        let run = &self.ctx.run;
        run.store
            .save_progress(&run.fence, &checkpoint, counts.as_ref())
            .await?;
        let last = self.ctx.run.last_committed;
        if last > 0 {
            self.ctx.fault(Phase::AfterSave, last)?;
        }
        Ok(())
    }
}
