//! [`Overlay`]: a store whose roles come from separate handles, so that a decorator
//! replaces the one role it observes and the rest is the underlying store's.
//!
//! Why an overlay type, written once here, rather than the other ways to let a
//! decorator wrap one role:
//! - the host holding one handle per role would put four handles in every
//!   constructor that takes a store (`Host`, workers, the HTTP API) and in every
//!   embedder's code, for the sake of decorators that only `prove` and tests use;
//! - default methods forwarding to an inner store would let a decorator that forgot a
//!   method of its role forward it silently; here a decorator implements its whole
//!   role (the compiler holds it to every method) and nothing else;
//! - a macro writing the forwards at each decorator would hide code and repeat it.
//!
//! Each call through an overlay costs one more dynamic call and boxed future; the
//! backends are not wrapped in one unless a decorator asks for it. Provided methods are
//! forwarded too, so that a backend's own (one-transaction) version of them is the one
//! called.

use std::sync::Arc;
use std::time::Duration;

use super::{CatalogStore, InstanceStore, OperatorStore, Store, WorkerStore};
use crate::store::{
    Acquired, BlobDigest, Cancelled, Checkpoint, ClaimOutcome, ClaimRef, ClaimRequest, Commit,
    Counts, DataKeyRecord, Deployed, Deployment, DeploymentPaused, DeploymentRecord, FlowLimits,
    FlowSetting, ForkRequest, Forked, GcReport, GcRequest, JoinRequest, LeaseState, LeasedRun,
    LiveChunk, LiveText, Millis, MoveRuns, OpenClaim, Paused, PausedDeployment, Position, Presence,
    RateLimit, RateSetting, Rated, Recorded, Resolution, Resumed, Rollout, RunEnd, RunFence,
    RunFilter, RunHistory, RunMove, RunRecord, SavedCheckpoint, ScheduleDef, ScheduleRecord,
    ScheduledBy, Sealer, SignalSent, SpawnAnswers, SpawnBatch, SpawnRequest, Spawned, StepRecord,
    StoreError, Submission, Submitted, Suspension, Tick, Timeline, UsageFilter, UsageRecord,
    UsageTotal, VersionRecord, WaitRecord, WaitRequest, WaitState,
};

/// A [`Store`] assembled from one handle per role: an underlying store's, with any
/// role replaced (by a decorator of that role, usually).
///
/// ```
/// use std::sync::Arc;
/// use idem::store::{InstanceStore, Overlay, SqliteStore, Store, SyncMode};
///
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("idem.db");
/// let base: Arc<dyn Store> = Arc::new(SqliteStore::open(&path, SyncMode::Normal)?);
/// // A decorator of the instance role would wrap `Arc::clone(&base)` here.
/// let instance = Arc::clone(&base) as Arc<dyn InstanceStore>;
/// let store: Arc<dyn Store> = Arc::new(Overlay::new(base).with_instance(instance));
/// # drop(store);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Overlay {
    instance: Arc<dyn InstanceStore>,
    worker: Arc<dyn WorkerStore>,
    catalog: Arc<dyn CatalogStore>,
    operator: Arc<dyn OperatorStore>,
}

impl Overlay {
    /// Every role from `store`.
    pub fn new(store: Arc<dyn Store>) -> Overlay {
        Overlay {
            instance: Arc::clone(&store) as Arc<dyn InstanceStore>,
            worker: Arc::clone(&store) as Arc<dyn WorkerStore>,
            catalog: Arc::clone(&store) as Arc<dyn CatalogStore>,
            operator: store,
        }
    }

    /// The instance role from `instance` instead.
    pub fn with_instance(mut self, instance: Arc<dyn InstanceStore>) -> Overlay {
        self.instance = instance;
        self
    }

    /// The worker role from `worker` instead.
    pub fn with_worker(mut self, worker: Arc<dyn WorkerStore>) -> Overlay {
        self.worker = worker;
        self
    }

    /// The catalog role from `catalog` instead.
    pub fn with_catalog(mut self, catalog: Arc<dyn CatalogStore>) -> Overlay {
        self.catalog = catalog;
        self
    }

    /// The operator role from `operator` instead.
    pub fn with_operator(mut self, operator: Arc<dyn OperatorStore>) -> Overlay {
        self.operator = operator;
        self
    }
}

#[async_trait::async_trait]
impl InstanceStore for Overlay {
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        self.instance.claim(req).await
    }

    async fn claim_rated(
        &self,
        req: &ClaimRequest<'_>,
        token: &WaitRequest<'_>,
    ) -> Result<Rated, StoreError> {
        self.instance.claim_rated(req, token).await
    }

    async fn take_over(
        &self,
        req: &ClaimRequest<'_>,
        stale_token: u64,
    ) -> Result<ClaimOutcome, StoreError> {
        self.instance.take_over(req, stale_token).await
    }

    async fn commit(&self, commit: &Commit<'_>) -> Result<(), StoreError> {
        self.instance.commit(commit).await
    }

    async fn release(&self, claim: &ClaimRef<'_>) -> Result<bool, StoreError> {
        self.instance.release(claim).await
    }

    async fn renew(
        &self,
        claims: &[ClaimRef<'_>],
        lease: Duration,
    ) -> Result<Vec<bool>, StoreError> {
        self.instance.renew(claims, lease).await
    }

    async fn park(&self, claim: &ClaimRef<'_>, reason: &str) -> Result<(), StoreError> {
        self.instance.park(claim, reason).await
    }

    async fn committed(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.instance.committed(key).await
    }

    async fn load_progress(&self, run_id: &str) -> Result<Option<Checkpoint>, StoreError> {
        self.instance.load_progress(run_id).await
    }

    async fn save_progress(
        &self,
        fence: &RunFence,
        checkpoint: &Checkpoint,
        counts: Option<&Counts>,
    ) -> Result<(), StoreError> {
        self.instance.save_progress(fence, checkpoint, counts).await
    }

    async fn save_counts(&self, fence: &RunFence, counts: &Counts) -> Result<(), StoreError> {
        self.instance.save_counts(fence, counts).await
    }

    async fn start_instance(
        &self,
        fence: &RunFence,
        counts: &Counts,
        recycled: Option<&str>,
    ) -> Result<(), StoreError> {
        self.instance.start_instance(fence, counts, recycled).await
    }

    async fn append_log(
        &self,
        fence: &RunFence,
        bytes: &[u8],
        keep: usize,
    ) -> Result<(), StoreError> {
        self.instance.append_log(fence, bytes, keep).await
    }

    async fn wait(&self, req: &WaitRequest<'_>) -> Result<WaitState, StoreError> {
        self.instance.wait(req).await
    }

    async fn spawn(&self, req: &SpawnRequest<'_>) -> Result<Spawned, StoreError> {
        self.instance.spawn(req).await
    }

    async fn spawn_many(&self, batch: &SpawnBatch<'_>) -> Result<SpawnAnswers, StoreError> {
        self.instance.spawn_many(batch).await
    }

    async fn join(&self, req: &JoinRequest<'_>) -> Result<WaitState, StoreError> {
        self.instance.join(req).await
    }

    async fn record_usage(&self, record: &UsageRecord<'_>) -> Result<Recorded, StoreError> {
        self.instance.record_usage(record).await
    }

    async fn append_live(
        &self,
        fence: &RunFence,
        chunks: &[LiveText],
        keep: usize,
    ) -> Result<(), StoreError> {
        self.instance.append_live(fence, chunks, keep).await
    }
}

#[async_trait::async_trait]
impl WorkerStore for Overlay {
    async fn now(&self) -> Result<Millis, StoreError> {
        self.worker.now().await
    }

    async fn next_due(&self, after: Millis) -> Result<Option<Millis>, StoreError> {
        self.worker.next_due(after).await
    }

    async fn acquire_runs(
        &self,
        worker: &str,
        max: usize,
        lease: Duration,
        skip: &[String],
    ) -> Result<Vec<LeasedRun>, StoreError> {
        self.worker.acquire_runs(worker, max, lease, skip).await
    }

    async fn acquire_run(
        &self,
        run_id: &str,
        worker: &str,
        lease: Duration,
    ) -> Result<Acquired, StoreError> {
        self.worker.acquire_run(run_id, worker, lease).await
    }

    async fn renew_runs(
        &self,
        fences: &[RunFence],
        lease: Duration,
    ) -> Result<Vec<LeaseState>, StoreError> {
        self.worker.renew_runs(fences, lease).await
    }

    async fn release_run(
        &self,
        fence: &RunFence,
        counts: &Counts,
        note: Option<&str>,
    ) -> Result<(), StoreError> {
        self.worker.release_run(fence, counts, note).await
    }

    async fn suspend_run(
        &self,
        fence: &RunFence,
        counts: &Counts,
        suspension: &Suspension<'_>,
    ) -> Result<(), StoreError> {
        self.worker.suspend_run(fence, counts, suspension).await
    }

    async fn finish_run(
        &self,
        fence: &RunFence,
        end: RunEnd<'_>,
        counts: &Counts,
    ) -> Result<(), StoreError> {
        self.worker.finish_run(fence, end, counts).await
    }

    async fn be_present(&self, holder: &str) -> Result<Presence, StoreError> {
        self.worker.be_present(holder).await
    }

    async fn is_gone(&self, holder: &str) -> Result<bool, StoreError> {
        self.worker.is_gone(holder).await
    }

    async fn gone_holders(&self) -> Result<Vec<String>, StoreError> {
        self.worker.gone_holders().await
    }

    async fn end_leases_of_gone(&self, holder: &str) -> Result<u64, StoreError> {
        self.worker.end_leases_of_gone(holder).await
    }

    async fn fire_schedules(&self, max: usize) -> Result<Vec<Tick>, StoreError> {
        self.worker.fire_schedules(max).await
    }
}

#[async_trait::async_trait]
impl CatalogStore for Overlay {
    async fn put_component(&self, digest: &str, bytes: &[u8]) -> Result<bool, StoreError> {
        self.catalog.put_component(digest, bytes).await
    }

    async fn has_component(&self, digest: &str) -> Result<bool, StoreError> {
        self.catalog.has_component(digest).await
    }

    async fn component(&self, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.catalog.component(digest).await
    }

    async fn put_blob(&self, digest: &BlobDigest, bytes: &[u8]) -> Result<(), StoreError> {
        self.catalog.put_blob(digest, bytes).await
    }

    async fn blob(&self, digest: &BlobDigest) -> Result<Option<Vec<u8>>, StoreError> {
        self.catalog.blob(digest).await
    }

    async fn deploy_version(
        &self,
        deployment: &Deployment<'_>,
        rollout: &Rollout<'_>,
    ) -> Result<Deployed, StoreError> {
        self.catalog.deploy_version(deployment, rollout).await
    }

    async fn deploy(&self, deployment: &Deployment<'_>) -> Result<DeploymentRecord, StoreError> {
        self.catalog.deploy(deployment).await
    }

    async fn versions(&self, name: &str) -> Result<Vec<VersionRecord>, StoreError> {
        self.catalog.versions(name).await
    }

    async fn move_runs(&self, request: &MoveRuns<'_>) -> Result<Vec<RunMove>, StoreError> {
        self.catalog.move_runs(request).await
    }

    async fn run_moves(&self, run_id: &str) -> Result<Vec<RunMove>, StoreError> {
        self.catalog.run_moves(run_id).await
    }

    async fn deployment(&self, name: &str) -> Result<Option<DeploymentRecord>, StoreError> {
        self.catalog.deployment(name).await
    }

    async fn deployments(&self) -> Result<Vec<DeploymentRecord>, StoreError> {
        self.catalog.deployments().await
    }

    async fn admitted(&self, namespace: &str, digest: &str) -> Result<Option<bool>, StoreError> {
        self.catalog.admitted(namespace, digest).await
    }

    async fn set_flow(&self, setting: &FlowSetting<'_>) -> Result<FlowLimits, StoreError> {
        self.catalog.set_flow(setting).await
    }

    async fn clear_flow(&self, deployment: &str) -> Result<bool, StoreError> {
        self.catalog.clear_flow(deployment).await
    }

    async fn flows(&self) -> Result<Vec<FlowLimits>, StoreError> {
        self.catalog.flows().await
    }

    async fn set_rate(&self, setting: &RateSetting<'_>) -> Result<RateLimit, StoreError> {
        self.catalog.set_rate(setting).await
    }

    async fn clear_rate(&self, class: &str) -> Result<bool, StoreError> {
        self.catalog.clear_rate(class).await
    }

    async fn rates(&self) -> Result<Vec<RateLimit>, StoreError> {
        self.catalog.rates().await
    }

    async fn upgrade_run(&self, run_id: &str, from: &str, to: &str) -> Result<(), StoreError> {
        self.catalog.upgrade_run(run_id, from, to).await
    }

    async fn data_keys(&self) -> Result<Vec<DataKeyRecord>, StoreError> {
        self.catalog.data_keys().await
    }

    async fn put_data_key(&self, record: &DataKeyRecord) -> Result<(), StoreError> {
        self.catalog.put_data_key(record).await
    }

    async fn rewrap_data_keys(
        &self,
        old_key_id: &str,
        records: &[DataKeyRecord],
    ) -> Result<(), StoreError> {
        self.catalog.rewrap_data_keys(old_key_id, records).await
    }

    fn use_sealer(&self, sealer: Arc<Sealer>) {
        self.catalog.use_sealer(sealer);
    }
}

#[async_trait::async_trait]
impl OperatorStore for Overlay {
    async fn submit(&self, submission: &Submission<'_>) -> Result<Submitted, StoreError> {
        self.operator.submit(submission).await
    }

    async fn submit_many(
        &self,
        submissions: &[Submission<'_>],
    ) -> Result<Vec<Result<Submitted, StoreError>>, StoreError> {
        self.operator.submit_many(submissions).await
    }

    async fn run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        self.operator.run(run_id).await
    }

    async fn run_authority(&self, run_id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.operator.run_authority(run_id).await
    }

    async fn run_input(&self, run_id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.operator.run_input(run_id).await
    }

    async fn runs(&self, filter: &RunFilter<'_>) -> Result<Vec<RunRecord>, StoreError> {
        self.operator.runs(filter).await
    }

    async fn cancel_run(&self, run_id: &str) -> Result<Cancelled, StoreError> {
        self.operator.cancel_run(run_id).await
    }

    async fn pause_run(&self, run_id: &str) -> Result<Paused, StoreError> {
        self.operator.pause_run(run_id).await
    }

    async fn resume_run(&self, run_id: &str) -> Result<Resumed, StoreError> {
        self.operator.resume_run(run_id).await
    }

    async fn pause_deployment(&self, name: &str) -> Result<DeploymentPaused, StoreError> {
        self.operator.pause_deployment(name).await
    }

    async fn resume_deployment(&self, name: &str) -> Result<DeploymentPaused, StoreError> {
        self.operator.resume_deployment(name).await
    }

    async fn paused_deployments(&self) -> Result<Vec<PausedDeployment>, StoreError> {
        self.operator.paused_deployments().await
    }

    async fn resolve(
        &self,
        run_id: &str,
        key: &str,
        resolution: Resolution<'_>,
    ) -> Result<(), StoreError> {
        self.operator.resolve(run_id, key, resolution).await
    }

    async fn send_signal(
        &self,
        run_id: &str,
        name: &str,
        payload: &[u8],
        max_payload: usize,
    ) -> Result<SignalSent, StoreError> {
        self.operator
            .send_signal(run_id, name, payload, max_payload)
            .await
    }

    async fn open_claims(&self, run_id: Option<&str>) -> Result<Vec<OpenClaim>, StoreError> {
        self.operator.open_claims(run_id).await
    }

    async fn steps(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        self.operator.steps(run_id).await
    }

    async fn waits(&self, run_id: &str) -> Result<Vec<WaitRecord>, StoreError> {
        self.operator.waits(run_id).await
    }

    async fn events(&self, run_id: &str) -> Result<Option<Timeline>, StoreError> {
        self.operator.events(run_id).await
    }

    async fn history(&self, run_id: &str) -> Result<Option<RunHistory>, StoreError> {
        self.operator.history(run_id).await
    }

    async fn checkpoint_before(
        &self,
        run_id: &str,
        before: Option<Position>,
    ) -> Result<Option<SavedCheckpoint>, StoreError> {
        self.operator.checkpoint_before(run_id, before).await
    }

    async fn fork(&self, req: &ForkRequest<'_>) -> Result<Forked, StoreError> {
        self.operator.fork(req).await
    }

    async fn logs(&self, run_id: &str) -> Result<Vec<u8>, StoreError> {
        self.operator.logs(run_id).await
    }

    async fn live(
        &self,
        run_id: &str,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<LiveChunk>, StoreError> {
        self.operator.live(run_id, after, limit).await
    }

    async fn gc(&self, req: &GcRequest) -> Result<GcReport, StoreError> {
        self.operator.gc(req).await
    }

    async fn create_schedule(&self, def: &ScheduleDef<'_>) -> Result<ScheduleRecord, StoreError> {
        self.operator.create_schedule(def).await
    }

    async fn schedules(&self) -> Result<Vec<ScheduleRecord>, StoreError> {
        self.operator.schedules().await
    }

    async fn schedule(&self, name: &str) -> Result<Option<ScheduleRecord>, StoreError> {
        self.operator.schedule(name).await
    }

    async fn pause_schedule(&self, name: &str, paused: bool) -> Result<ScheduleRecord, StoreError> {
        self.operator.pause_schedule(name, paused).await
    }

    async fn delete_schedule(&self, name: &str) -> Result<(), StoreError> {
        self.operator.delete_schedule(name).await
    }

    async fn run_schedule(&self, run_id: &str) -> Result<Option<ScheduledBy>, StoreError> {
        self.operator.run_schedule(run_id).await
    }

    async fn usage(&self, filter: &UsageFilter<'_>) -> Result<Vec<UsageTotal>, StoreError> {
        self.operator.usage(filter).await
    }
}
