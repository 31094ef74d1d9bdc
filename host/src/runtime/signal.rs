//! Sending a signal to a run, measured against the run's own state limit: a payload
//! the run could not hold as state would be refused the moment the agent took it, so it
//! is refused here, before anything is written.

use super::authority::Authority;
use super::error::HostError;
use crate::store::{SignalSent, Store, StoreError};

/// Sends signal `name` with `payload` (JSON) to `run_id`. The payload may be at most the
/// run's `max_state_bytes`, as its authority grants it.
pub async fn send_signal(
    store: &dyn Store,
    run_id: &str,
    name: &str,
    payload: &[u8],
) -> Result<SignalSent, HostError> {
    let authority = store
        .run_authority(run_id)
        .await?
        .ok_or_else(|| StoreError::UnknownRun {
            run_id: run_id.to_owned(),
        })?;
    let limit = Authority::decode(&authority)?.limits.max_state_bytes;
    Ok(store.send_signal(run_id, name, payload, limit).await?)
}
