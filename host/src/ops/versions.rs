//! Versions of a deployment, for an operator: listing them with the runs on each, and
//! moving runs to a version (`idem upgrade`) or back (`idem rollback`). Every move is
//! recorded with its run; a refused request moves nothing.

use super::OpError;
use crate::store::{MoveRuns, MoveTo, RunMove, Store, StoreError, VersionRecord};

/// Every version of deployment `name`, oldest first, with how many runs are on each.
/// [`StoreError::UnknownDeployment`] for a name never deployed.
pub async fn versions(store: &dyn Store, name: &str) -> Result<Vec<VersionRecord>, OpError> {
    let versions = store.versions(name).await?;
    if versions.is_empty() {
        return Err(StoreError::UnknownDeployment {
            name: name.to_owned(),
        }
        .into());
    }
    Ok(versions)
}

/// Moves runs of deployment `name` that have not ended — `runs`, or all of them when
/// `runs` is empty — to its version `version`: each one's next instance runs that
/// version's component. Runs already there stay as they are. Refused, moving nothing,
/// for an unknown deployment or version, a named run that is unknown, of another
/// deployment or ended, and a run whose component exports something else than the
/// version's (a component of another agent).
pub async fn upgrade(
    store: &dyn Store,
    name: &str,
    version: u64,
    runs: &[String],
) -> Result<Vec<RunMove>, OpError> {
    Ok(store
        .move_runs(&MoveRuns {
            name,
            to: MoveTo::Version(version),
            runs,
        })
        .await?)
}

/// Moves each run of deployment `name` back to the version it was on before its last
/// move: `runs`, or, when `runs` is empty, every run of `name` that has not ended and
/// has moved before. Refused, moving nothing, as [`upgrade`] is, and for a named run
/// that never moved ([`StoreError::NeverMoved`]).
pub async fn rollback(
    store: &dyn Store,
    name: &str,
    runs: &[String],
) -> Result<Vec<RunMove>, OpError> {
    Ok(store
        .move_runs(&MoveRuns {
            name,
            to: MoveTo::Back,
            runs,
        })
        .await?)
}
