//! [`CatalogStore`]: what runs are made from — components and deployments.

use std::fmt;
use std::sync::Arc;

use crate::store::{
    BlobDigest, DataKeyRecord, Deployed, Deployment, DeploymentRecord, FlowLimits, FlowSetting,
    MoveRuns, RateLimit, RateSetting, Rollout, RunMove, Sealer, StoreError, VersionRecord,
};

/// What runs are made from: components by digest, deployments (a name pointing at a
/// component, with the authority it grants), the components a namespace admits, and
/// moving a run to another component; and the data keys that seal the store's payloads
/// (`store/sealing/`).
///
/// Called by deploying (`ops.rs`), by a host starting a run from a component file, and
/// by a worker loading the component a leased run is pinned to.
#[async_trait::async_trait]
pub trait CatalogStore: Send + Sync + fmt::Debug {
    /// Stores a component's bytes under their digest (hex SHA-256, checked by the
    /// caller). Returns whether they were new; storing the same bytes again is a no-op.
    async fn put_component(&self, digest: &str, bytes: &[u8]) -> Result<bool, StoreError>;

    /// Whether the store holds the component `digest`: asked before
    /// [`CatalogStore::put_component`] so that a start with a component the store already has
    /// need not read the component's file at all.
    async fn has_component(&self, digest: &str) -> Result<bool, StoreError>;

    /// A component's bytes.
    async fn component(&self, digest: &str) -> Result<Option<Vec<u8>>, StoreError>;

    /// Stores a large value's bytes (as the store keeps them: sealed, in a store
    /// encrypted at rest) under their SHA-256 `digest` (checked by the caller), or marks
    /// the blob used now if it is there: gc keeps a blob used within
    /// [`BLOB_GRACE`](crate::store::BLOB_GRACE) even when nothing refers to it yet. Only
    /// [`ValueStore`](crate::store::ValueStore) calls it, just before the write that
    /// refers to the blob.
    async fn put_blob(&self, digest: &BlobDigest, bytes: &[u8]) -> Result<(), StoreError>;

    /// A blob's bytes, as [`CatalogStore::put_blob`] stored them.
    async fn blob(&self, digest: &BlobDigest) -> Result<Option<Vec<u8>>, StoreError>;

    /// Points `deployment.name` at a component (which must be in the store, else
    /// [`StoreError::UnknownComponent`]) with an authority as the name's next version,
    /// and admits the component to the name's namespace as `deployment.admission`
    /// allows; then, as `rollout.in_flight` says, leaves the name's runs in flight where
    /// they are or moves them to it (recorded with each run), all in one transaction.
    /// Deploying what the name already points at, with the same authority, makes no new
    /// version (but still moves runs to it for [`InFlight::Upgrade`]).
    ///
    /// [`InFlight::Upgrade`]: crate::store::InFlight::Upgrade
    async fn deploy_version(
        &self,
        deployment: &Deployment<'_>,
        rollout: &Rollout<'_>,
    ) -> Result<Deployed, StoreError>;

    /// [`deploy_version`](Self::deploy_version) with the default rollout: in-flight runs
    /// stay pinned, the component's exports not recorded.
    async fn deploy(&self, deployment: &Deployment<'_>) -> Result<DeploymentRecord, StoreError> {
        Ok(self
            .deploy_version(deployment, &Rollout::default())
            .await?
            .record)
    }

    /// Every version of deployment `name`, oldest first, with how many runs are on each;
    /// empty for a name never deployed.
    async fn versions(&self, name: &str) -> Result<Vec<VersionRecord>, StoreError>;

    /// Moves runs of a deployment to another of its versions (their next instance runs
    /// its component) and records each move with its run, in one transaction: all
    /// move, or, on the first refusal, none. Returns the moves, in run order.
    ///
    /// Refused with [`StoreError::UnknownDeployment`], [`StoreError::UnknownVersion`],
    /// and for a run named in `request.runs`: [`StoreError::UnknownRun`],
    /// [`StoreError::NotOfDeployment`], [`StoreError::RunFinished`] (completed, failed or
    /// cancelled), [`StoreError::NeverMoved`] (moving back a run that never moved);
    /// and [`StoreError::ExportsDiffer`] for any run whose component and the target's
    /// both have recorded exports that differ. A named run already on the target
    /// version is left as it is.
    async fn move_runs(&self, request: &MoveRuns<'_>) -> Result<Vec<RunMove>, StoreError>;

    /// Every move of run `run_id` between components, oldest first.
    async fn run_moves(&self, run_id: &str) -> Result<Vec<RunMove>, StoreError>;

    /// What a name points at now.
    async fn deployment(&self, name: &str) -> Result<Option<DeploymentRecord>, StoreError>;

    /// Every name and what it points at now, by name.
    async fn deployments(&self) -> Result<Vec<DeploymentRecord>, StoreError>;

    /// Whether a component was admitted to a namespace ([`CatalogStore::deploy`]): `None` if
    /// the namespace has no component yet, else whether this one is among them.
    async fn admitted(&self, namespace: &str, digest: &str) -> Result<Option<bool>, StoreError>;

    /// Moves run `run_id` from the component `from` to the component `to` (and to the
    /// latest version of its deployment with that component) and records the upgrade as
    /// a person's ([`MoveReason::Dev`](crate::store::MoveReason::Dev)); fails with
    /// [`StoreError::UnknownRun`] if the run does not exist with digest `from`.
    async fn upgrade_run(&self, run_id: &str, from: &str, to: &str) -> Result<(), StoreError>;

    /// Puts limits on a deployment's runs, replacing any it had: the most that hold a
    /// live lease at once, and the most per concurrency key (read from each run's input
    /// at `setting.key`; the keys of its unfinished runs are read again now). Workers
    /// lease within them ([`WorkerStore::acquire_runs`](super::WorkerStore::acquire_runs)).
    /// Fails with [`StoreError::FlowRefused`] for an unknown deployment or absurd
    /// values, changing nothing.
    async fn set_flow(&self, setting: &FlowSetting<'_>) -> Result<FlowLimits, StoreError>;

    /// Removes a deployment's limits; whether it had any.
    async fn clear_flow(&self, deployment: &str) -> Result<bool, StoreError>;

    /// Every deployment's limits, by deployment.
    async fn flows(&self) -> Result<Vec<FlowLimits>, StoreError>;

    /// Puts a rate limit on a class of steps, replacing any it had: every run of every
    /// deployment that names the class on a step draws its tokens from it
    /// ([`WaitKind::Rate`](crate::store::WaitKind::Rate)). Tokens already reserved by
    /// waiting steps stay reserved. Fails with [`StoreError::RateRefused`] for absurd
    /// values, changing nothing.
    async fn set_rate(&self, setting: &RateSetting<'_>) -> Result<RateLimit, StoreError>;

    /// Removes a class's rate limit; whether it had one. Its steps then start at once.
    async fn clear_rate(&self, class: &str) -> Result<bool, StoreError>;

    /// Every class's rate limit, by class.
    async fn rates(&self) -> Result<Vec<RateLimit>, StoreError>;

    /// The store's data keys, wrapped: none unless it is encrypted at rest.
    async fn data_keys(&self) -> Result<Vec<DataKeyRecord>, StoreError>;

    /// Records a first data key, unless the store has one already (another process
    /// made it first: the caller reads [`data_keys`](Self::data_keys) again).
    async fn put_data_key(&self, record: &DataKeyRecord) -> Result<(), StoreError>;

    /// Replaces every data key's wrapping with `records` in one transaction, if they are
    /// still wrapped by the store key `old_key_id`; fails with
    /// [`SealError::Rotated`](crate::store::SealError::Rotated), changing nothing,
    /// otherwise.
    async fn rewrap_data_keys(
        &self,
        old_key_id: &str,
        records: &[DataKeyRecord],
    ) -> Result<(), StoreError>;

    /// Seals, from now on, the payloads the backend handles itself (logs' and live
    /// streams' chunks) and opens the inputs it reads concurrency keys from, with
    /// `sealer`. Called once, by whoever wraps the store in a sealing
    /// [`ValueStore`](crate::store::ValueStore).
    fn use_sealer(&self, sealer: Arc<Sealer>);
}
