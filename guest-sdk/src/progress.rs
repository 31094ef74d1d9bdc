//! The run's checkpoint, typed: where the agent got to and the state it carries.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::Error;
use crate::bindings::idem::agent::progress;

/// A checkpoint saved by [`save`] and read back by [`load`].
///
/// ```
/// let checkpoint = idem_sdk::Checkpoint { step: 3, state: vec![1, 2, 3] };
/// assert_eq!(checkpoint.step, 3);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint<S> {
    /// The step the agent reached; what it means is the agent's business (usually the
    /// index of the next thing to do).
    pub step: u64,
    /// The state the agent carries across instances.
    pub state: S,
}

/// The last checkpoint this run saved, or `None` on a fresh run.
///
/// A checkpoint may lag the committed side effects (an instance can die between a
/// commit and the next `save`): resuming from it replays steps whose `run_once` then
/// finds them committed and skips them.
///
/// Fails with [`Error::Codec`] if the saved state does not decode as `S`.
///
/// ```no_run
/// let start = idem_sdk::load::<Vec<String>>()?.map_or(0, |c| c.step);
/// # Ok::<(), idem_sdk::Error>(())
/// ```
pub fn load<S: DeserializeOwned>() -> Result<Option<Checkpoint<S>>, Error> {
    let Some(checkpoint) = progress::load() else {
        return Ok(None);
    };
    let state = serde_json::from_slice(&checkpoint.state)
        .map_err(|err| Error::codec("checkpoint state", err))?;
    Ok(Some(Checkpoint {
        step: checkpoint.step,
        state,
    }))
}

/// Replaces the run's checkpoint with `step` and `state` (stored as JSON).
///
/// Fails with [`Error::Step`] if the host refuses the state as too large, and with
/// [`Error::Codec`] if `state` cannot be encoded.
///
/// ```no_run
/// let totals = vec![3_u64, 5];
/// idem_sdk::save(2, &totals)?;
/// # Ok::<(), idem_sdk::Error>(())
/// ```
pub fn save<S: Serialize>(step: u64, state: &S) -> Result<(), Error> {
    let bytes = serde_json::to_vec(state).map_err(|err| Error::codec("checkpoint state", err))?;
    progress::save(step, &bytes)?;
    Ok(())
}
