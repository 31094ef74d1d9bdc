//! Pausing runs and deployments: why a run is paused ([`PausedBy`]) and what pausing
//! or resuming one did ([`Paused`], [`Resumed`], [`DeploymentPaused`]).
//!
//! A paused run is not finished: it keeps its status underneath (queued, or running
//! with its checkpoint, its waits and its signals) and is shown as
//! [`RunStatus::Paused`]; no worker leases it until it is resumed. A run a worker holds
//! when it is paused stops at its next host call outside a side effect, and its worker
//! gives the lease back. A deployment's pause is a flag on the deployment's name: each
//! of its unfinished runs is paused with it, and each run that becomes unfinished under
//! that name (submitted, spawned, submitted again after a failure, resolved) is paused
//! as it does, until the deployment is resumed.

use std::fmt;

use super::{Millis, RunLeaseInfo};
#[cfg(doc)]
use super::{OperatorStore, RunStatus};

/// Who paused a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PausedBy {
    /// An operator paused the run itself ([`OperatorStore::pause_run`]): only resuming
    /// the run resumes it.
    Run,
    /// Its deployment was paused ([`OperatorStore::pause_deployment`]): resuming the
    /// deployment (or the run) resumes it.
    Deployment,
}

impl PausedBy {
    /// The name the store keeps.
    pub fn as_str(self) -> &'static str {
        match self {
            PausedBy::Run => "run",
            PausedBy::Deployment => "deployment",
        }
    }

    /// Reads the name the store keeps; `None` for any other text.
    pub fn parse(text: &str) -> Option<PausedBy> {
        match text {
            "run" => Some(PausedBy::Run),
            "deployment" => Some(PausedBy::Deployment),
            _ => None,
        }
    }
}

impl fmt::Display for PausedBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What [`OperatorStore::pause_run`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Paused {
    /// No worker held the run: it is paused now, holding nothing.
    Now,
    /// A worker holds the run: it stops it at its next host call outside a side effect
    /// and gives the lease back; no worker takes it again until it is resumed.
    Requested {
        /// The worker's lease.
        lease: RunLeaseInfo,
    },
    /// The run was paused already (by an operator, or with its deployment: it is now
    /// paused by an operator); nothing else changed.
    Already,
}

/// What [`OperatorStore::resume_run`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resumed {
    /// The run was paused and is not any more: it is due as it was before (at once, or
    /// when its wait ends).
    Now,
    /// The run was not paused; nothing changed.
    NotPaused,
}

/// What [`OperatorStore::pause_deployment`] or [`OperatorStore::resume_deployment`]
/// did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct DeploymentPaused {
    /// Whether the deployment was paused before the call.
    pub was_paused: bool,
    /// Runs the call paused (or resumed).
    pub runs: u64,
    /// Of those paused, the runs a worker held: each stops at its next host call.
    pub held: u64,
}

/// A paused deployment ([`OperatorStore::paused_deployments`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PausedDeployment {
    /// The deployment's name.
    pub name: String,
    /// When it was paused, on the store's clock.
    pub since: Millis,
}
