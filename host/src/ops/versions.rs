//! Versions of a deployment, for an operator: listing them with the runs on each, and
//! moving runs to a version (`idem upgrade`) or back (`idem rollback`). Every move is
//! recorded with its run; a refused request moves nothing. A move can be rehearsed
//! first ([`rehearse`]), changing nothing.

#[cfg(feature = "prove")]
use std::path::Path;
#[cfg(feature = "prove")]
use std::sync::Arc;

use super::OpError;
#[cfg(feature = "prove")]
use crate::prove::{UpgradeRehearsal, UpgradeReport, rehearse_upgrade};
#[cfg(feature = "prove")]
use crate::runtime::{LoadedAgent, Runtime, load_stored};
#[cfg(feature = "prove")]
use crate::store::RunFilter;
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

/// Rehearses moving runs of deployment `name` to its version `version` — `runs`, or
/// every run of `name` that has not ended, oldest first — against the store, which is
/// only read ([`rehearse_upgrade`]): what each run would do on that version, and
/// whether anything it committed would run again. Refused for an unknown deployment or
/// version, and a named run that is unknown or of another deployment; an ended run is
/// refused by the rehearsal ([`StoreError::RunFinished`]).
#[cfg(feature = "prove")]
pub async fn rehearse(
    store: &Arc<dyn Store>,
    runtime: &Arc<Runtime>,
    name: &str,
    version: u64,
    runs: &[String],
    scratch: &Path,
) -> Result<UpgradeReport, OpError> {
    let target = versions(store.as_ref(), name)
        .await?
        .into_iter()
        .find(|v| v.deployment.version == version)
        .ok_or_else(|| StoreError::UnknownVersion {
            name: name.to_owned(),
            version,
        })?;
    let to = load_stored(runtime, store.as_ref(), &target.deployment.digest, name).await?;
    rehearse_build(store, runtime, name, &to, runs, scratch).await
}

/// Rehearses moving runs of deployment `name` — `runs`, or every run of `name` that has
/// not ended — to `to`, a build not deployed yet (`idem prove AGENT --against-store`),
/// as [`rehearse`] does to a version: the check a CI job makes before a deploy.
#[cfg(feature = "prove")]
pub async fn rehearse_build(
    store: &Arc<dyn Store>,
    runtime: &Arc<Runtime>,
    name: &str,
    to: &LoadedAgent,
    runs: &[String],
    scratch: &Path,
) -> Result<UpgradeReport, OpError> {
    if store.deployment(name).await?.is_none() {
        return Err(StoreError::UnknownDeployment {
            name: name.to_owned(),
        }
        .into());
    }
    let runs = runs_of(store.as_ref(), name, runs).await?;
    Ok(rehearse_upgrade(
        runtime,
        store,
        to,
        &UpgradeRehearsal {
            runs,
            scratch: scratch.to_path_buf(),
        },
    )
    .await?)
}

/// `runs`, each checked to be a run of `name`; or, when empty, every run of `name`
/// that has not ended, oldest first.
#[cfg(feature = "prove")]
async fn runs_of(store: &dyn Store, name: &str, runs: &[String]) -> Result<Vec<String>, OpError> {
    if runs.is_empty() {
        let filter = RunFilter {
            agent: Some(name),
            ..RunFilter::default()
        };
        let mut live: Vec<String> = store
            .runs(&filter)
            .await?
            .into_iter()
            .filter(|r| !r.status.is_finished())
            .map(|r| r.run_id)
            .collect();
        live.reverse();
        return Ok(live);
    }
    for run_id in runs {
        let record = store
            .run(run_id)
            .await?
            .ok_or_else(|| StoreError::UnknownRun {
                run_id: run_id.clone(),
            })?;
        if record.agent != name {
            return Err(StoreError::NotOfDeployment {
                run_id: run_id.clone(),
                agent: record.agent,
                name: name.to_owned(),
            }
            .into());
        }
    }
    Ok(runs.to_vec())
}
