//! Rehearsing an upgrade against the runs in flight: each run of the real store is
//! resumed twice in scratch stores — on the component it runs now and on the new one —
//! from its real checkpoint, every `run-once` answered from the real store's committed
//! results, until each version reaches the first thing it would do that the store has
//! not done yet. The two walks are compared: a key the old version found committed and
//! the new one never asks for is an effect the upgrade would run again.
//!
//! Nothing is written to the real store: it is only read (the run, its input,
//! authority, checkpoint, committed results and components). Nothing is sent: a step
//! the store has no result for stops the walk before its effect (its claim is answered
//! parked), outbound HTTP outside steps is answered by a capture that holds no answers,
//! and the granted directories are copies. A sleep is taken as over (time is not an
//! effect); a signal, a join or a spawn ends the walk there, as a step does.
//!
//! Why two walks and not only the new one: a key the new version claims that the store
//! has not committed may be the run's next step done right, or an old step derived
//! another way; only the old version's walk from the same checkpoint tells the two
//! apart.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;

use super::ProveError;
use super::capture::{Answers, Recorder};
use super::observe::StandIn;
use super::scenario::Scratch;
use crate::runtime::{
    Authority, Echo, FaultPlan, Host, HostError, LoadedAgent, RunOptions, Runtime, StopSignal,
    load_stored,
};
use crate::store::{
    Acquired, Checkpoint, ClaimOutcome, ClaimRef, ClaimRequest, Commit, Counts, InstanceStore,
    JoinRequest, LeaseState, LeasedRun, LiveText, Millis, OpenOptions, Overlay, Presence, Rated,
    Recorded, RunEnd, RunFence, RunStatus, SpawnAnswers, SpawnBatch, SqliteStore, Store,
    StoreError, Suspension, Tick, UsageRecord, WaitKind, WaitRequest, WaitState, WorkerStore,
};

/// What to rehearse: the runs (of the real store) and the component they would move to.
#[derive(Debug, Clone)]
pub struct UpgradeRehearsal {
    /// The runs, by id.
    pub runs: Vec<String>,
    /// Where scratch stores and directories are made (each removed after its walk).
    pub scratch: PathBuf,
}

/// How far one version got from the run's checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Walk {
    /// The keys it found committed, in the order it asked (namespace left out).
    pub replayed: Vec<String>,
    /// Where it stopped.
    pub next: Next,
}

/// Where a walk stopped: the first thing the store has not done yet, or the run's end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Next {
    /// A step whose key has no committed result: its effect would run.
    Step {
        /// The key.
        key: String,
    },
    /// A wait for a signal, or a rate token that is not free.
    Wait {
        /// The wait's key.
        key: String,
    },
    /// A spawn of children.
    Spawn {
        /// The first child's key.
        key: String,
    },
    /// A join of children.
    Join {
        /// The join's key.
        key: String,
    },
    /// The run would complete with this output (UTF-8, lossily).
    Completed {
        /// The output.
        output: String,
    },
    /// The instance trapped or the agent failed (its checkpoint unreadable, say).
    Failed {
        /// Why.
        error: String,
    },
}

/// What the rehearsal found for one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", rename_all = "kebab-case")]
pub enum Verdict {
    /// The new version walks as the old one does: nothing would run again.
    Compatible,
    /// The run is on the new component already.
    AlreadyOn,
    /// Keys the old version finds committed that the new one never asks for: their
    /// effects would run again under the keys the new version derives instead.
    Repeats {
        /// Each such key, with its position among the old version's steps (1-based).
        steps: Vec<RepeatedStep>,
        /// What the new version would do first instead.
        instead: Next,
    },
    /// Both replay the same committed steps, but the next thing each would do
    /// differs: the new version's next step runs under another key than the old
    /// one's (or is another kind of act), so a step the old version began — or will
    /// have begun when the upgrade lands — may run twice.
    Diverges {
        /// What the old version would do next.
        old: Next,
        /// What the new version would do next.
        new: Next,
    },
    /// The new version fails or traps where the old one does not (a checkpoint it
    /// cannot read, a panic on the old input).
    Breaks {
        /// Why.
        error: String,
    },
    /// Both complete, with different outputs.
    OutputDiffers {
        /// The old version's output.
        old: String,
        /// The new version's.
        new: String,
    },
    /// The new component exports something else than the one the run is on: another
    /// agent's, not a version of this one. Nothing is walked.
    ExportsDiffer {
        /// What the run's component exports.
        old: String,
        /// What the new one exports.
        new: String,
    },
    /// The old version itself could not be walked, so nothing can be compared.
    Unchecked {
        /// Why.
        why: String,
    },
}

impl Verdict {
    /// Whether moving the run to the new version is safe as far as the rehearsal can
    /// tell: nothing would run again and the new version does not break. A different
    /// output is allowed (it is often the point of an upgrade) and reported; a run the
    /// old version cannot walk is refused, as nothing vouches for it.
    pub fn is_safe(&self) -> bool {
        matches!(
            self,
            Verdict::Compatible | Verdict::AlreadyOn | Verdict::OutputDiffers { .. }
        )
    }
}

/// A committed step the new version would not find.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RepeatedStep {
    /// Its position among the old version's committed steps, from 1.
    pub step: usize,
    /// Its key.
    pub key: String,
}

/// The rehearsal of one run.
#[derive(Debug, Clone, Serialize)]
pub struct RunRehearsal {
    /// The run.
    pub run_id: String,
    /// The component it runs now.
    pub from: String,
    /// Its status in the real store.
    pub status: RunStatus,
    /// The old version's walk (`None` when the run is on the new component already).
    /// `old_walk` in JSON: the verdict beside it has an `old` of its own.
    #[serde(rename = "old_walk")]
    pub old: Option<Walk>,
    /// The new version's walk (`new_walk` in JSON).
    #[serde(rename = "new_walk")]
    pub new: Option<Walk>,
    /// What it means.
    #[serde(flatten)]
    pub verdict: Verdict,
}

/// The rehearsal of every run asked for.
#[derive(Debug, Clone, Serialize)]
pub struct UpgradeReport {
    /// The component the runs would move to.
    pub to: String,
    /// Each run, in the order asked.
    pub runs: Vec<RunRehearsal>,
}

impl UpgradeReport {
    /// Whether every run may move safely.
    pub fn is_safe(&self) -> bool {
        self.runs.iter().all(|r| r.verdict.is_safe())
    }

    /// The runs that may not.
    pub fn unsafe_runs(&self) -> impl Iterator<Item = &RunRehearsal> {
        self.runs.iter().filter(|r| !r.verdict.is_safe())
    }
}

/// Rehearses moving `rehearsal.runs` of `store` to `to`. A run that is unknown or ended
/// is an error (nothing is rehearsed); every run's verdict is in the report.
pub async fn rehearse_upgrade(
    runtime: &Arc<Runtime>,
    store: &Arc<dyn Store>,
    to: &LoadedAgent,
    rehearsal: &UpgradeRehearsal,
) -> Result<UpgradeReport, ProveError> {
    let mut runs = Vec::with_capacity(rehearsal.runs.len());
    for run_id in &rehearsal.runs {
        let record = store
            .run(run_id)
            .await?
            .ok_or_else(|| StoreError::UnknownRun {
                run_id: run_id.clone(),
            })?;
        if record.status.is_finished() {
            return Err(StoreError::RunFinished {
                run_id: run_id.clone(),
                status: record.status,
            }
            .into());
        }
        runs.push(record);
    }
    std::fs::create_dir_all(&rehearsal.scratch).map_err(|source| ProveError::Scratch {
        path: rehearsal.scratch.clone(),
        source,
    })?;
    // One scratch store for each component walked, shared by its runs' walks: a
    // store made and migrated per walk would cost more than the walk.
    let mut stages: HashMap<String, Stage> = HashMap::new();
    let mut report = UpgradeReport {
        to: to.digest().to_string(),
        runs: Vec::with_capacity(runs.len()),
    };
    for record in runs {
        let run = RealRun::read(store, &record.run_id, &record.namespace).await?;
        if record.digest == to.digest() {
            report.runs.push(RunRehearsal {
                run_id: record.run_id,
                from: record.digest,
                status: record.status,
                old: None,
                new: None,
                verdict: Verdict::AlreadyOn,
            });
            continue;
        }
        for digest in [&record.digest, &report.to] {
            if !stages.contains_key(digest) {
                let agent = if digest == &report.to {
                    to.clone()
                } else {
                    load_stored(runtime, store.as_ref(), digest, &record.agent).await?
                };
                let stage = Stage::new(runtime, store, agent, &rehearsal.scratch)?;
                stages.insert(digest.clone(), stage);
            }
        }
        let (old_exports, new_exports) = (
            stages[&record.digest].agent.exports(),
            stages[&report.to].agent.exports(),
        );
        if old_exports != new_exports {
            report.runs.push(RunRehearsal {
                run_id: record.run_id,
                from: record.digest,
                status: record.status,
                old: None,
                new: None,
                verdict: Verdict::ExportsDiffer {
                    old: old_exports,
                    new: new_exports,
                },
            });
            continue;
        }
        let old_walk = stages[&record.digest]
            .walk(&run, &rehearsal.scratch)
            .await?;
        let new_walk = stages[&report.to].walk(&run, &rehearsal.scratch).await?;
        let verdict = judge(&old_walk, &new_walk);
        report.runs.push(RunRehearsal {
            run_id: record.run_id,
            from: record.digest,
            status: record.status,
            old: Some(old_walk),
            new: Some(new_walk),
            verdict,
        });
    }
    Ok(report)
}

/// What the two walks mean.
fn judge(old: &Walk, new: &Walk) -> Verdict {
    if let Next::Failed { error } = &old.next {
        return Verdict::Unchecked {
            why: format!("the version the run is on fails the rehearsal itself: {error}"),
        };
    }
    let missing: Vec<RepeatedStep> = old
        .replayed
        .iter()
        .enumerate()
        .filter(|(_, key)| !new.replayed.contains(key))
        .map(|(i, key)| RepeatedStep {
            step: i + 1,
            key: key.clone(),
        })
        .collect();
    if !missing.is_empty() {
        return Verdict::Repeats {
            steps: missing,
            instead: new.next.clone(),
        };
    }
    if let Next::Failed { error } = &new.next {
        return Verdict::Breaks {
            error: error.clone(),
        };
    }
    match (&old.next, &new.next) {
        (Next::Completed { output: a }, Next::Completed { output: b }) if a != b => {
            Verdict::OutputDiffers {
                old: a.clone(),
                new: b.clone(),
            }
        }
        (a, b) if a != b => Verdict::Diverges {
            old: a.clone(),
            new: b.clone(),
        },
        _ => Verdict::Compatible,
    }
}

/// What a walk needs of the real run.
struct RealRun {
    run_id: String,
    namespace: String,
    input: Vec<u8>,
    authority: Authority,
}

impl RealRun {
    async fn read(
        store: &Arc<dyn Store>,
        run_id: &str,
        namespace: &str,
    ) -> Result<RealRun, ProveError> {
        let unknown = || StoreError::UnknownRun {
            run_id: run_id.to_string(),
        };
        let input = store.run_input(run_id).await?.ok_or_else(unknown)?;
        let authority = store.run_authority(run_id).await?.ok_or_else(unknown)?;
        let authority = Authority::decode(&authority).map_err(HostError::from)?;
        Ok(RealRun {
            run_id: run_id.to_string(),
            namespace: namespace.to_string(),
            input,
            authority,
        })
    }
}

/// One component's scratch store, where its walks run one after another.
struct Stage {
    /// Holds the store's file (removed with it).
    _dir: tempfile::TempDir,
    agent: LoadedAgent,
    host: Host,
    walker: Arc<Walker>,
}

impl Stage {
    fn new(
        runtime: &Arc<Runtime>,
        real: &Arc<dyn Store>,
        agent: LoadedAgent,
        root: &std::path::Path,
    ) -> Result<Stage, ProveError> {
        let dir = tempfile::Builder::new()
            .prefix("idem-rehearse-")
            .tempdir_in(root)
            .map_err(|source| ProveError::Scratch {
                path: root.to_path_buf(),
                source,
            })?;
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open_with(
            &dir.path().join("idem.db"),
            &OpenOptions::default(),
        )?);
        let walker = Arc::new(Walker {
            inner: Arc::clone(&store) as _,
            real: Arc::clone(real),
            walk: Mutex::default(),
            stand_in: StandIn {
                store: Arc::clone(&store),
                digest: agent.digest().to_string(),
                bytes: Arc::new(agent.bytes()?.to_vec()),
            },
        });
        let fresh = Arc::new(FreshLoads {
            inner: Arc::clone(&store) as _,
        });
        let host = Host::new(
            Arc::clone(runtime),
            Arc::new(
                Overlay::new(Arc::clone(&store))
                    .with_instance(Arc::clone(&walker) as _)
                    .with_worker(fresh),
            ),
        )?;
        Ok(Stage {
            _dir: dir,
            agent,
            host,
            walker,
        })
    }

    /// Walks the run from its real checkpoint, its granted directories fresh copies.
    async fn walk(&self, run: &RealRun, root: &std::path::Path) -> Result<Walk, ProveError> {
        let scratch = Scratch::new(root, &run.authority)?;
        let stop = StopSignal::new();
        self.walker.begin(&run.namespace, stop.clone());
        let capture = Arc::new(Recorder::replay(Arc::new(Answers::new(Vec::new()))));
        let opts = RunOptions {
            run_id: run.run_id.clone(),
            input: run.input.clone(),
            authority: scratch.authority.clone(),
            faults: FaultPlan::default(),
            upgrade: false,
            namespace: Some(run.namespace.clone()),
            capture: Some(capture as _),
            echo: Echo::Off,
            stop: Some(stop),
            source: None,
        };
        let result = self.host.run(&self.agent, &opts).await;
        let mut replayed = Vec::new();
        let mut next = None;
        for act in self.walker.acts() {
            match act {
                Act::Replayed(key) => replayed.push(key),
                Act::Stopped(at) => {
                    next = Some(at);
                    break;
                }
            }
        }
        let next = match next {
            Some(next) => next,
            None => match result {
                Ok(report) if report.status == RunStatus::Completed => Next::Completed {
                    output: String::from_utf8_lossy(&report.outcome).into_owned(),
                },
                Ok(report) => Next::Failed {
                    error: format!(
                        "{}: {}",
                        report.status,
                        String::from_utf8_lossy(&report.outcome)
                    ),
                },
                Err(e) => Next::Failed {
                    error: e.to_string(),
                },
            },
        };
        Ok(Walk { replayed, next })
    }
}

/// One thing a walk did that the comparison reads.
#[derive(Debug, Clone)]
enum Act {
    /// A key found committed in the real store.
    Replayed(String),
    /// The first thing the real store has not done: the walk ends here.
    Stopped(Next),
}

/// The instance role of a stage: committed results and the checkpoint come from the
/// real store, everything else goes to the scratch store, and the first act the real
/// store has not done stops the walk before it happens. Walks of a stage run one after
/// another; [`Walker::begin`] starts each.
#[derive(Debug)]
struct Walker {
    inner: Arc<dyn InstanceStore>,
    real: Arc<dyn Store>,
    walk: Mutex<WalkState>,
    /// Spawns are answered by the scratch store, whose deployments this fills.
    stand_in: StandIn,
}

/// The walk under way.
#[derive(Debug, Default)]
struct WalkState {
    /// The run's keys start with this (`namespace:`).
    namespace: String,
    acts: Vec<Act>,
    stop: StopSignal,
}

impl Walker {
    fn begin(&self, namespace: &str, stop: StopSignal) {
        *self.state() = WalkState {
            namespace: format!("{namespace}:"),
            acts: Vec::new(),
            stop,
        };
    }

    fn state(&self) -> std::sync::MutexGuard<'_, WalkState> {
        self.walk.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn acts(&self) -> Vec<Act> {
        self.state().acts.clone()
    }

    fn shown(&self, key: &str) -> String {
        let state = self.state();
        key.strip_prefix(&state.namespace)
            .unwrap_or(key)
            .to_string()
    }

    fn stopped(&self) -> bool {
        self.state()
            .acts
            .iter()
            .any(|a| matches!(a, Act::Stopped(_)))
    }

    /// Ends the walk at `next`: recorded once, and the run told to stop.
    fn stop_at(&self, next: Next) {
        let mut state = self.state();
        if !state.acts.iter().any(|a| matches!(a, Act::Stopped(_))) {
            state.acts.push(Act::Stopped(next));
        }
        state.stop.stop();
    }

    fn halted(&self, req: &ClaimRequest<'_>) -> ClaimOutcome {
        ClaimOutcome::Parked {
            run_id: req.fence.run_id.to_string(),
            reason: "the upgrade rehearsal stops before this step's effect".to_string(),
        }
    }

    async fn answer(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        if self.stopped() {
            return Ok(self.halted(req));
        }
        match self.real.committed(req.key).await? {
            Some(result) => {
                let shown = self.shown(req.key);
                self.state().acts.push(Act::Replayed(shown));
                Ok(ClaimOutcome::Committed(result))
            }
            None => {
                self.stop_at(Next::Step {
                    key: self.shown(req.key),
                });
                Ok(self.halted(req))
            }
        }
    }
}

#[async_trait::async_trait]
impl InstanceStore for Walker {
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        self.answer(req).await
    }

    async fn claim_rated(
        &self,
        req: &ClaimRequest<'_>,
        _token: &WaitRequest<'_>,
    ) -> Result<Rated, StoreError> {
        // A rate token is not an effect: the step is judged by its key alone.
        Ok(Rated::Claimed(self.answer(req).await?))
    }

    async fn take_over(
        &self,
        req: &ClaimRequest<'_>,
        _stale_token: u64,
    ) -> Result<ClaimOutcome, StoreError> {
        self.answer(req).await
    }

    async fn commit(&self, commit: &Commit<'_>) -> Result<(), StoreError> {
        self.inner.commit(commit).await
    }

    async fn release(&self, claim: &ClaimRef<'_>) -> Result<bool, StoreError> {
        self.inner.release(claim).await
    }

    async fn renew(
        &self,
        claims: &[ClaimRef<'_>],
        lease: Duration,
    ) -> Result<Vec<bool>, StoreError> {
        self.inner.renew(claims, lease).await
    }

    async fn park(&self, claim: &ClaimRef<'_>, reason: &str) -> Result<(), StoreError> {
        self.inner.park(claim, reason).await
    }

    async fn committed(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        self.real.committed(key).await
    }

    async fn load_progress(&self, run_id: &str) -> Result<Option<Checkpoint>, StoreError> {
        self.real.load_progress(run_id).await
    }

    async fn save_progress(
        &self,
        fence: &RunFence,
        checkpoint: &Checkpoint,
        counts: Option<&Counts>,
    ) -> Result<(), StoreError> {
        self.inner.save_progress(fence, checkpoint, counts).await
    }

    async fn save_counts(&self, fence: &RunFence, counts: &Counts) -> Result<(), StoreError> {
        self.inner.save_counts(fence, counts).await
    }

    async fn start_instance(
        &self,
        fence: &RunFence,
        counts: &Counts,
        recycled: Option<&str>,
    ) -> Result<(), StoreError> {
        self.inner.start_instance(fence, counts, recycled).await
    }

    async fn append_log(
        &self,
        fence: &RunFence,
        bytes: &[u8],
        keep: usize,
    ) -> Result<(), StoreError> {
        self.inner.append_log(fence, bytes, keep).await
    }

    async fn append_live(
        &self,
        fence: &RunFence,
        chunks: &[LiveText],
        keep: usize,
    ) -> Result<(), StoreError> {
        self.inner.append_live(fence, chunks, keep).await
    }

    async fn wait(&self, req: &WaitRequest<'_>) -> Result<WaitState, StoreError> {
        match req.kind {
            // Time passing is not an effect: the walk goes on past a sleep.
            WaitKind::Sleep(_) | WaitKind::Rate { .. } => Ok(WaitState::Elapsed),
            WaitKind::Signal { .. } => {
                self.stop_at(Next::Wait {
                    key: req.key.to_string(),
                });
                Ok(WaitState::Pending { due: None })
            }
        }
    }

    async fn spawn_many(&self, batch: &SpawnBatch<'_>) -> Result<SpawnAnswers, StoreError> {
        let key = batch
            .children
            .first()
            .map(|c| c.key.to_string())
            .unwrap_or_default();
        self.stop_at(Next::Spawn { key });
        // Answered as the scratch store answers, its deployments stood in for: the
        // walk has ended, so what the agent does with the answer is not read.
        let names: Vec<&str> = batch.children.iter().map(|c| c.deployment).collect();
        for name in names {
            self.stand_in.deploy(name).await?;
        }
        self.inner.spawn_many(batch).await
    }

    async fn join(&self, req: &JoinRequest<'_>) -> Result<WaitState, StoreError> {
        self.stop_at(Next::Join {
            key: req.key.to_string(),
        });
        Ok(WaitState::Pending { due: None })
    }

    async fn record_usage(&self, _record: &UsageRecord<'_>) -> Result<Recorded, StoreError> {
        // A replayed model call records its usage as saved: nothing of it is compared.
        Ok(Recorded::Saved)
    }
}

/// The worker role of a walk: the scratch store's, except that a lease never carries
/// the scratch store's checkpoint, so the instance asks for one (the real store's,
/// through [`Walker`]).
#[derive(Debug)]
struct FreshLoads {
    inner: Arc<dyn WorkerStore>,
}

fn unread(mut leased: LeasedRun) -> LeasedRun {
    leased.checkpoint = None;
    leased.checkpoint_read = false;
    leased
}

#[async_trait::async_trait]
impl WorkerStore for FreshLoads {
    async fn now(&self) -> Result<Millis, StoreError> {
        self.inner.now().await
    }

    async fn next_due(&self, after: Millis) -> Result<Option<Millis>, StoreError> {
        self.inner.next_due(after).await
    }

    async fn acquire_runs(
        &self,
        worker: &str,
        max: usize,
        lease: Duration,
        skip: &[String],
    ) -> Result<Vec<LeasedRun>, StoreError> {
        let runs = self.inner.acquire_runs(worker, max, lease, skip).await?;
        Ok(runs.into_iter().map(unread).collect())
    }

    async fn acquire_run(
        &self,
        run_id: &str,
        worker: &str,
        lease: Duration,
    ) -> Result<Acquired, StoreError> {
        Ok(match self.inner.acquire_run(run_id, worker, lease).await? {
            Acquired::Leased(leased) => Acquired::Leased(unread(leased)),
            other => other,
        })
    }

    async fn renew_runs(
        &self,
        fences: &[RunFence],
        lease: Duration,
    ) -> Result<Vec<LeaseState>, StoreError> {
        self.inner.renew_runs(fences, lease).await
    }

    async fn release_run(
        &self,
        fence: &RunFence,
        counts: &Counts,
        note: Option<&str>,
    ) -> Result<(), StoreError> {
        self.inner.release_run(fence, counts, note).await
    }

    async fn suspend_run(
        &self,
        fence: &RunFence,
        counts: &Counts,
        suspension: &Suspension<'_>,
    ) -> Result<(), StoreError> {
        self.inner.suspend_run(fence, counts, suspension).await
    }

    async fn finish_run(
        &self,
        fence: &RunFence,
        end: RunEnd<'_>,
        counts: &Counts,
    ) -> Result<(), StoreError> {
        self.inner.finish_run(fence, end, counts).await
    }

    async fn be_present(&self, holder: &str) -> Result<Presence, StoreError> {
        self.inner.be_present(holder).await
    }

    async fn is_gone(&self, holder: &str) -> Result<bool, StoreError> {
        self.inner.is_gone(holder).await
    }

    async fn gone_holders(&self) -> Result<Vec<String>, StoreError> {
        self.inner.gone_holders().await
    }

    async fn end_leases_of_gone(&self, holder: &str) -> Result<u64, StoreError> {
        self.inner.end_leases_of_gone(holder).await
    }

    async fn fire_schedules(&self, max: usize) -> Result<Vec<Tick>, StoreError> {
        self.inner.fire_schedules(max).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn walk(replayed: &[&str], next: Next) -> Walk {
        Walk {
            replayed: replayed.iter().map(|k| k.to_string()).collect(),
            next,
        }
    }

    fn step(key: &str) -> Next {
        Next::Step {
            key: key.to_string(),
        }
    }

    #[test]
    fn a_committed_key_the_new_version_never_asks_for_is_a_repeat() {
        let old = walk(&["item-0", "item-1"], step("item-2"));
        let new = walk(&[], step("entry-0"));
        assert_eq!(
            judge(&old, &new),
            Verdict::Repeats {
                steps: vec![
                    RepeatedStep {
                        step: 1,
                        key: "item-0".into()
                    },
                    RepeatedStep {
                        step: 2,
                        key: "item-1".into()
                    },
                ],
                instead: step("entry-0"),
            }
        );
    }

    #[test]
    fn the_same_walk_is_compatible_and_another_next_step_diverges() {
        let old = walk(&["a"], step("b"));
        assert_eq!(judge(&old, &walk(&["a"], step("b"))), Verdict::Compatible);
        assert_eq!(
            judge(&old, &walk(&["a"], step("c"))),
            Verdict::Diverges {
                old: step("b"),
                new: step("c")
            }
        );
        let failed = Next::Failed {
            error: "trap".into(),
        };
        assert_eq!(
            judge(&old, &walk(&["a"], failed.clone())),
            Verdict::Breaks {
                error: "trap".into()
            }
        );
        assert!(matches!(
            judge(&walk(&[], failed), &walk(&[], step("b"))),
            Verdict::Unchecked { .. }
        ));
    }

    #[test]
    fn outputs_are_compared_when_both_complete() {
        let done = |o: &str| Next::Completed { output: o.into() };
        let old = walk(&["a"], done("1"));
        assert_eq!(judge(&old, &walk(&["a"], done("1"))), Verdict::Compatible);
        assert_eq!(
            judge(&old, &walk(&["a"], done("2"))),
            Verdict::OutputDiffers {
                old: "1".into(),
                new: "2".into()
            }
        );
    }
}
