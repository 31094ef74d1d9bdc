//! [`OperatorStore`]: what an operator does to runs, and sees of them.

use std::fmt;

use crate::store::{
    Cancelled, DeploymentPaused, ForkRequest, Forked, GcReport, GcRequest, LiveChunk, OpenClaim,
    Paused, PausedDeployment, Position, Resolution, Resumed, RunFilter, RunHistory, RunRecord,
    SavedCheckpoint, ScheduleDef, ScheduleRecord, ScheduledBy, SignalSent, StepRecord, StoreError,
    Submission, Submitted, Timeline, UsageFilter, UsageTotal, WaitRecord,
};
#[cfg(doc)]
use crate::store::{InstanceStore, RunStatus, WorkerStore};

/// What an operator does to runs and sees of them: submitting, listing and looking at
/// runs (their record, steps, open claims, waits, log), cancelling, settling a parked
/// key, sending a signal, and collecting what finished.
///
/// Called by the operator's functions (`ops.rs`), the HTTP API (`serve/`), the CLI's
/// commands and `prove`'s checks.
#[async_trait::async_trait]
pub trait OperatorStore: Send + Sync + fmt::Debug {
    /// Creates the run as [`RunStatus::Queued`] if it is new; returns it either way. An
    /// existing run with other input is refused ([`StoreError::InputMismatch`]); a failed
    /// one is set back to running (submitting again resumes it); a finished one is
    /// returned as it is.
    async fn submit(&self, submission: &Submission<'_>) -> Result<Submitted, StoreError>;

    /// Submits runs in one transaction where the backend can (one sync for the lot),
    /// each answered, in order, as a lone [`OperatorStore::submit`] of it would be: a
    /// refused run ([`StoreError::is_refusal`]) records nothing and the others are
    /// submitted. Fails as a whole, recording nothing, only when the store does.
    async fn submit_many(
        &self,
        submissions: &[Submission<'_>],
    ) -> Result<Vec<Result<Submitted, StoreError>>, StoreError> {
        let mut answers = Vec::with_capacity(submissions.len());
        for submission in submissions {
            answers.push(match self.submit(submission).await {
                Err(e) if !e.is_refusal() => return Err(e),
                answer => answer,
            });
        }
        Ok(answers)
    }

    /// The run's record, if it exists.
    async fn run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError>;

    /// The authority the run was submitted with (encoded), if the run exists.
    async fn run_authority(&self, run_id: &str) -> Result<Option<Vec<u8>>, StoreError>;

    /// The input the run was submitted with, if the run exists.
    async fn run_input(&self, run_id: &str) -> Result<Option<Vec<u8>>, StoreError>;

    /// Runs, newest first.
    async fn runs(&self, filter: &RunFilter<'_>) -> Result<Vec<RunRecord>, StoreError>;

    /// Cancels a run: at once if no worker holds a live lease on it, else by asking its
    /// worker. Fails with [`StoreError::UnknownRun`], or [`StoreError::RunFinished`] for a
    /// run that completed or was cancelled already.
    async fn cancel_run(&self, run_id: &str) -> Result<Cancelled, StoreError>;

    /// Pauses a run: no worker takes it until [`resume_run`](Self::resume_run); a
    /// worker holding it stops it at its next host call outside a side effect. Pausing a
    /// paused run changes nothing ([`Paused::Already`]). Fails with
    /// [`StoreError::UnknownRun`], or [`StoreError::RunFinished`] for a run that is not
    /// queued or running.
    async fn pause_run(&self, run_id: &str) -> Result<Paused, StoreError>;

    /// Resumes a paused run (however it was paused): it is due as it was. Resuming a
    /// run that is not paused changes nothing ([`Resumed::NotPaused`]). Fails as
    /// [`pause_run`](Self::pause_run) does.
    async fn resume_run(&self, run_id: &str) -> Result<Resumed, StoreError>;

    /// Pauses deployment `name`: its unfinished runs, and every run that becomes
    /// unfinished under the name until it is resumed. Fails with
    /// [`StoreError::UnknownDeployment`].
    async fn pause_deployment(&self, name: &str) -> Result<DeploymentPaused, StoreError>;

    /// Resumes deployment `name` and the runs paused with it; runs paused one by one
    /// stay paused. Fails with [`StoreError::UnknownDeployment`].
    async fn resume_deployment(&self, name: &str) -> Result<DeploymentPaused, StoreError>;

    /// The paused deployments, by name.
    async fn paused_deployments(&self) -> Result<Vec<PausedDeployment>, StoreError>;

    /// Settles a key parked by run `run_id`: commits a result under a fresh token, or
    /// releases the claim for a retry. The run goes back to [`RunStatus::Running`] (with
    /// no lease, so any worker may take it) once none of its keys is parked. Fails with
    /// [`StoreError::NotInDoubt`] if the key is not parked by that run.
    async fn resolve(
        &self,
        run_id: &str,
        key: &str,
        resolution: Resolution<'_>,
    ) -> Result<(), StoreError>;

    /// Sends signal `name` with `payload` to run `run_id`; if the run is suspended
    /// waiting for it, the run is due at once. Fails with [`StoreError::UnknownRun`],
    /// [`StoreError::RunFinished`] for a run that completed, failed or was cancelled,
    /// and [`StoreError::SignalRefused`] for an invalid name or a payload over
    /// `max_payload` bytes.
    async fn send_signal(
        &self,
        run_id: &str,
        name: &str,
        payload: &[u8],
        max_payload: usize,
    ) -> Result<SignalSent, StoreError>;

    /// Claims not committed yet, of one run or of all runs, ordered by key.
    async fn open_claims(&self, run_id: Option<&str>) -> Result<Vec<OpenClaim>, StoreError>;

    /// The keys run `run_id` claimed (and still holds or committed): those it committed
    /// in the order it committed them (as its history numbers them), then its open
    /// claims in the order they were granted.
    async fn steps(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError>;

    /// The run's waits, in the order they were first reached.
    async fn waits(&self, run_id: &str) -> Result<Vec<WaitRecord>, StoreError>;

    /// The run's timeline: what happened to it, oldest first, bounded
    /// ([`Timeline`]); `None` for an unknown run.
    async fn events(&self, run_id: &str) -> Result<Option<Timeline>, StoreError>;

    /// The run's step history: the steps it committed and the checkpoints it keeps,
    /// each in order ([`RunHistory`]); `None` for an unknown run.
    async fn history(&self, run_id: &str) -> Result<Option<RunHistory>, StoreError>;

    /// The run's last checkpoint saved before `before` (its last of all for `None`),
    /// from its history; `None` if it kept none.
    async fn checkpoint_before(
        &self,
        run_id: &str,
        before: Option<Position>,
    ) -> Result<Option<SavedCheckpoint>, StoreError>;

    /// Starts a new run from the checkpoint run `req.run_id` saved before its step
    /// `req.at`, with the results it committed before that step copied into the new
    /// run's own namespace ([`ForkRequest`], [`Forked`]), in one transaction; the new
    /// run is queued. [`StoreError::ForkRefused`], [`StoreError::UnknownRun`],
    /// [`StoreError::UnknownVersion`] or [`StoreError::ExportsDiffer`] write nothing.
    async fn fork(&self, req: &ForkRequest<'_>) -> Result<Forked, StoreError>;

    /// The run's log (the last bytes its agent wrote to stderr and stdout).
    async fn logs(&self, run_id: &str) -> Result<Vec<u8>, StoreError>;

    /// The chunks of the run's live stream after sequence number `after` (all it keeps
    /// for `None`), oldest first, at most `limit` of them; none for an unknown run.
    async fn live(
        &self,
        run_id: &str,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<LiveChunk>, StoreError>;

    /// Deletes what `req` names ([`GcRequest`]) and reports how many rows of each kind
    /// went; with `req.dry_run`, deletes nothing and reports the same counts. Never
    /// deletes a row a live run (queued, running, suspended, in doubt) holds, a parked
    /// key, a claim whose lease is live, or a key inside the dedupe window.
    ///
    /// Works in small transactions, so that the store's other writers keep going while
    /// it runs. Fencing tokens keep increasing per key across a deletion: a key granted
    /// again after gc deleted it gets a token greater than every token it had.
    async fn gc(&self, req: &GcRequest) -> Result<GcReport, StoreError>;

    /// Creates a schedule whose first tick is the first after now on the store's clock.
    /// Fails with [`StoreError::ScheduleRefused`], writing nothing, if the name is taken,
    /// the deployment does not exist, or the spec or catch-up is out of range.
    async fn create_schedule(&self, def: &ScheduleDef<'_>) -> Result<ScheduleRecord, StoreError>;

    /// Every schedule, by name.
    async fn schedules(&self) -> Result<Vec<ScheduleRecord>, StoreError>;

    /// The schedule, if it exists.
    async fn schedule(&self, name: &str) -> Result<Option<ScheduleRecord>, StoreError>;

    /// Pauses a schedule (no tick fires), or resumes it: its next tick is then the first
    /// after now, and the ticks that fell while it was paused are not started. Pausing
    /// a paused schedule (or resuming a running one) changes nothing. Fails with
    /// [`StoreError::UnknownSchedule`].
    async fn pause_schedule(&self, name: &str, paused: bool) -> Result<ScheduleRecord, StoreError>;

    /// Deletes a schedule; the runs it started stay (and still name it). Fails with
    /// [`StoreError::UnknownSchedule`].
    async fn delete_schedule(&self, name: &str) -> Result<(), StoreError>;

    /// The schedule and tick that started run `run_id`, if a schedule did.
    async fn run_schedule(&self, run_id: &str) -> Result<Option<ScheduledBy>, StoreError>;

    /// The token usage of model calls that `filter` selects, summed per deployment and
    /// model (ordered by both): spent once per call, saved once per replay.
    async fn usage(&self, filter: &UsageFilter<'_>) -> Result<Vec<UsageTotal>, StoreError>;
}
