//! Deployments: a name pointing at a component, how a component joins a namespace, the
//! versions of a name (each deployment is the name's next one), and moving runs between
//! them.

use super::Millis;
#[cfg(doc)]
use super::{CatalogStore, StoreError};

/// A component deployed under a name: [`CatalogStore::deploy`].
#[derive(Debug, Clone)]
pub struct Deployment<'a> {
    /// The name (which is also the namespace its runs' keys live in by default).
    pub name: &'a str,
    /// The component's digest; the component must be in the store.
    pub digest: &'a str,
    /// The most the deployment's runs may reach, as the runtime encodes it.
    pub authority: &'a [u8],
    /// How the component joins the name's namespace.
    pub admission: Admission,
    /// Where the component was loaded from when a person ran a local file (`idem
    /// run`): the file on this machine. A first-use deployment from the source of the
    /// name's current first-use deployment joins as [`Admission::Rebuild`]. `None` for
    /// an operator's deployment, which no rebuild follows implicitly.
    pub source: Option<&'a str>,
}

/// How a component joins a namespace that other components may already use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Admission {
    /// An operator's explicit act (`deploy`, or an upgrade): the component joins the
    /// namespace whoever else is in it.
    Explicit,
    /// Implied by running a component under a name: it joins only a namespace nobody
    /// uses yet, or one it is already in; otherwise [`StoreError::NamespaceTaken`] —
    /// unless it is a rebuild.
    FirstUse,
    /// A first use that joined a namespace other components use because it came from
    /// the same [`Deployment::source`] as the name's current deployment, itself a first
    /// use or a rebuild: a new build of the file a person runs while developing. Never
    /// asked for; the store records it in place of `FirstUse`.
    Rebuild,
}

impl Admission {
    /// The name the store keeps.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Admission::Explicit => "explicit",
            Admission::FirstUse => "first-use",
            Admission::Rebuild => "rebuild",
        }
    }

    /// The admission a store keeps under `name`, if it is one.
    pub(crate) fn from_name(name: &str) -> Option<Admission> {
        [Admission::Explicit, Admission::FirstUse, Admission::Rebuild]
            .into_iter()
            .find(|a| a.as_str() == name)
    }
}

/// A deployment as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeploymentRecord {
    /// The name.
    pub name: String,
    /// The component it points at.
    pub digest: String,
    /// The authority it grants, encoded.
    #[serde(skip)]
    pub authority: Vec<u8>,
    /// When it was deployed.
    pub deployed_at: Millis,
    /// How its component joined the namespace.
    pub admission: Admission,
    /// The local file it was run from, for a deployment made by running one.
    pub source: Option<String>,
    /// Which of its name's deployments this is: 1 for the first, then 2, 3 … in the
    /// order they were made.
    pub version: u64,
    /// What the runs in flight on the name's earlier versions did when it was made.
    pub in_flight: InFlight,
    /// What its component exports ([`Rollout::exports`]), if it was known.
    #[serde(skip)]
    pub exports: Option<String>,
}

/// What the runs in flight on a name's earlier versions do when a newer version is
/// deployed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InFlight {
    /// They finish on the version they are on (a run is pinned to its component).
    #[default]
    Pin,
    /// They move to the new version: their next instance runs its component.
    Upgrade,
}

impl InFlight {
    /// The name the store keeps.
    pub fn as_str(self) -> &'static str {
        match self {
            InFlight::Pin => "pin",
            InFlight::Upgrade => "upgrade",
        }
    }

    /// The policy a store keeps under `name`, if it is one.
    pub fn from_name(name: &str) -> Option<InFlight> {
        [InFlight::Pin, InFlight::Upgrade]
            .into_iter()
            .find(|p| p.as_str() == name)
    }
}

/// How a deployment is rolled out: [`CatalogStore::deploy_version`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Rollout<'a> {
    /// What the runs in flight on the name's other versions do.
    pub in_flight: InFlight,
    /// What the component exports, as the runtime renders it
    /// ([`LoadedAgent::exports`](crate::runtime::LoadedAgent::exports)). A run moves only
    /// between versions whose exports are the same (or not known: deployments made by
    /// an older idem).
    pub exports: Option<&'a str>,
}

/// A deployment made, and the runs it moved.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Deployed {
    /// The deployment (the current one unchanged, if it was deployed again).
    pub record: DeploymentRecord,
    /// The runs [`InFlight::Upgrade`] moved to it.
    pub moved: Vec<RunMove>,
    /// The runs in flight that [`InFlight::Upgrade`] left where they are because their
    /// version's component exports something else: they could not resume on this one.
    pub kept: Vec<String>,
}

/// Why a run moved to another version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MoveReason {
    /// A person resumed it with another build ([`CatalogStore::upgrade_run`]: `idem run
    /// --upgrade`, or a rebuild of the file it was run from).
    Dev,
    /// A deployment with [`InFlight::Upgrade`] moved it.
    Policy,
    /// An operator moved it to a version ([`MoveTo::Version`]).
    Operator,
    /// An operator moved it back ([`MoveTo::Back`]).
    Rollback,
}

impl MoveReason {
    /// The name the store keeps.
    pub fn as_str(self) -> &'static str {
        match self {
            MoveReason::Dev => "dev",
            MoveReason::Policy => "policy",
            MoveReason::Operator => "operator",
            MoveReason::Rollback => "rollback",
        }
    }

    /// The reason a store keeps under `name`, if it is one.
    pub fn from_name(name: &str) -> Option<MoveReason> {
        [
            MoveReason::Dev,
            MoveReason::Policy,
            MoveReason::Operator,
            MoveReason::Rollback,
        ]
        .into_iter()
        .find(|r| r.as_str() == name)
    }
}

/// A run moved from one component (and version) to another, as the store records it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RunMove {
    /// The run.
    pub run_id: String,
    /// The version it was on; `None` for a run of a component never deployed under its
    /// name, or a move recorded before versions were.
    pub from_version: Option<u64>,
    /// The version it is on now (`None` as for `from_version`).
    pub to_version: Option<u64>,
    /// The component it was on.
    pub from_digest: String,
    /// The component it is on now.
    pub to_digest: String,
    /// Why it moved.
    pub reason: MoveReason,
    /// When.
    pub at: Millis,
}

/// Where [`CatalogStore::move_runs`] moves runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveTo {
    /// To this version of their deployment.
    Version(u64),
    /// Back to the version each was on before its last move.
    Back,
}

/// Runs of one deployment to move: [`CatalogStore::move_runs`].
#[derive(Debug, Clone, Copy)]
pub struct MoveRuns<'a> {
    /// The deployment (its name).
    pub name: &'a str,
    /// Where to.
    pub to: MoveTo,
    /// The runs; empty for every run of the deployment in flight (queued, running,
    /// paused or in doubt) that is not there already ([`MoveTo::Version`]) or that has
    /// moved before ([`MoveTo::Back`]).
    pub runs: &'a [String],
}

/// One version of a deployment, with the runs on it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct VersionRecord {
    /// The deployment that made it.
    #[serde(flatten)]
    pub deployment: DeploymentRecord,
    /// Whether it is the name's latest version, which new runs take.
    pub current: bool,
    /// Its runs that have not ended: queued, running (waiting included), paused or in
    /// doubt.
    pub runs_in_flight: u64,
    /// All its runs the store keeps.
    pub runs: u64,
}
