//! [`CatalogStore`]: what runs are made from — components and deployments.

use std::fmt;
use std::sync::Arc;

use crate::store::{
    BlobDigest, DataKeyRecord, Deployment, DeploymentRecord, FlowLimits, FlowSetting, RateLimit,
    RateSetting, Sealer, StoreError,
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
    /// [`StoreError::UnknownComponent`]) with an authority, and admits the component
    /// to the name's namespace as `deployment.admission` allows. Deploying what the
    /// name already points at, with the same authority, changes nothing.
    async fn deploy(&self, deployment: &Deployment<'_>) -> Result<DeploymentRecord, StoreError>;

    /// What a name points at now.
    async fn deployment(&self, name: &str) -> Result<Option<DeploymentRecord>, StoreError>;

    /// Every name and what it points at now, by name.
    async fn deployments(&self) -> Result<Vec<DeploymentRecord>, StoreError>;

    /// Whether a component was admitted to a namespace ([`CatalogStore::deploy`]): `None` if
    /// the namespace has no component yet, else whether this one is among them.
    async fn admitted(&self, namespace: &str, digest: &str) -> Result<Option<bool>, StoreError>;

    /// Moves run `run_id` from the component `from` to the component `to` and records
    /// the upgrade; fails with [`StoreError::UnknownRun`] if the run does not exist with
    /// digest `from`.
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
