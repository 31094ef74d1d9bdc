//! `idem:agent/progress`: the run's checkpoint, kept in the store.

use crate::runtime::bindings::idem::agent::progress::Host;
use crate::runtime::bindings::{StepError, WitCheckpoint};
use crate::runtime::faults::Phase;
use crate::runtime::state::InstanceState;
use crate::store::{Checkpoint, now_millis};

impl Host for InstanceState {
    fn load(&mut self) -> wasmtime::Result<Option<WitCheckpoint>> {
        self.touch();
        let checkpoint = self
            .run
            .store
            .load_progress(&self.run.run_id)
            .map_err(InstanceState::trap_store)?;
        Ok(checkpoint.map(|c| WitCheckpoint {
            step: c.step,
            state: c.state,
        }))
    }

    fn save(&mut self, step: u64, state: Vec<u8>) -> wasmtime::Result<Result<(), StepError>> {
        self.touch();
        let limit = self.run.limits.max_state_bytes;
        if state.len() > limit {
            return Ok(Err(StepError::TooLarge(format!(
                "progress state is {} bytes, over the limit of {limit} bytes",
                state.len()
            ))));
        }
        let checkpoint = Checkpoint { step, state };
        self.run
            .store
            .save_progress(
                &self.run.run_id,
                &checkpoint,
                &self.run.counts,
                now_millis(),
            )
            .map_err(InstanceState::trap_store)?;
        let last = self.run.last_committed;
        if last > 0 {
            self.fault(Phase::AfterSave, last)?;
        }
        Ok(Ok(()))
    }
}
