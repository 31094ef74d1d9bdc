//! Forking a run from one of its steps (`idem fork`, `POST /api/runs/{id}/fork`), and
//! its step history as an operator reads it (`idem show --steps`).

use sha2::{Digest, Sha256};

use super::{OpError, check_json};
use crate::runtime::check_run_id;
use crate::store::{ForkRequest, Forked, RunHistory, Store, StoreError};

/// A fork to make: [`fork`].
#[derive(Debug, Clone, Copy)]
pub struct ForkSpec<'a> {
    /// The run to fork.
    pub run_id: &'a str,
    /// The step to fork at, as `idem show --steps` numbers them (from 1).
    pub at: u64,
    /// The new run's input (JSON); the original's when `None`.
    pub input: Option<&'a [u8]>,
    /// The version of the deployment to run; the original run's when `None`.
    pub version: Option<u64>,
    /// The new run's id; [`fork_run_id`] when `None`.
    pub new_run_id: Option<&'a str>,
}

/// A new run id for a fork of `run_id`: the run's id (shortened), `-fork-`, and eight
/// hex digits drawn from the clock, so that forking one run again makes another fork.
pub fn fork_run_id(run_id: &str) -> String {
    let head: String = run_id.chars().take(200).collect();
    let seed = format!("{run_id}/{}/{}", crate::store::tick(), std::process::id());
    let digest = Sha256::digest(seed.as_bytes());
    let hex: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("{head}-fork-{hex}")
}

/// Starts a new run from the checkpoint run `spec.run_id` saved before its step
/// `spec.at`, reusing the results it committed before that step and running the rest
/// under keys of its own (`store/history.rs`). The new run is queued for workers.
pub async fn fork(store: &dyn Store, spec: &ForkSpec<'_>) -> Result<Forked, OpError> {
    if let Some(input) = spec.input {
        check_json("input", input)?;
    }
    let new_run_id = match spec.new_run_id {
        Some(id) => {
            check_run_id(id)?;
            id.to_owned()
        }
        None => fork_run_id(spec.run_id),
    };
    Ok(store
        .fork(&ForkRequest {
            run_id: spec.run_id,
            at: spec.at,
            new_run_id: &new_run_id,
            input: spec.input,
            version: spec.version,
        })
        .await?)
}

/// Run `run_id`'s step history; [`StoreError::UnknownRun`] if there is no such run.
pub async fn history(store: &dyn Store, run_id: &str) -> Result<RunHistory, StoreError> {
    store
        .history(run_id)
        .await?
        .ok_or_else(|| StoreError::UnknownRun {
            run_id: run_id.to_owned(),
        })
}
