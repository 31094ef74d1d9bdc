//! A run's history for an operator: its timeline (the store's events: each instance,
//! the worker and lease it ran under, takeovers, waits, signals, upgrades) and one step
//! opened — its committed result, the checkpoint saved with it, and its attempts as the
//! store keeps them — as `idem show --events`/`--step`, the API and the web page show them.

use crate::store::{
    EventKind, Millis, RunEvent, RunHistory, StepRecord, Store, StoreError, Timeline, qualified_key,
};

use super::payload_value;

/// Run `run_id`'s timeline; [`StoreError::UnknownRun`] if there is none.
pub async fn timeline(store: &dyn Store, run_id: &str) -> Result<Timeline, StoreError> {
    store
        .events(run_id)
        .await?
        .ok_or_else(|| StoreError::UnknownRun {
            run_id: run_id.to_owned(),
        })
}

/// One step of a run, opened: what the store keeps of it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StepView {
    /// The run.
    pub run_id: String,
    /// The step's record: its key (qualified), its latest claim's token and attempt,
    /// when it was claimed and committed, its holder while claimed, why it is parked.
    pub step: StepRecord,
    /// Its committed result (JSON as itself, anything else as text); `None` while it
    /// is not committed.
    pub result: Option<serde_json::Value>,
    /// The committed result's size in bytes.
    pub result_bytes: Option<usize>,
    /// Its latest claim was retaken from a holder that never committed it (the
    /// attempt before it may have run its side effect: an in-doubt repeat).
    pub retaken: bool,
    /// The instance that held the run when the step's latest claim was granted: the
    /// timeline's last start at or before it (with its worker and lease token), if the
    /// timeline still keeps it.
    pub claimed_in: Option<RunEvent>,
    /// Its number among the run's committed steps (`idem show --steps`, `idem fork
    /// --at`); `None` while it is not committed.
    pub n: Option<u64>,
    /// The checkpoint the run saved with this step, or after it and before its next
    /// step: where a fork at the next step starts. `None` if it saved none then (or it
    /// was collected).
    pub checkpoint: Option<CheckpointView>,
}

/// A run's checkpoint as a step view shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CheckpointView {
    /// The step number it was saved at (the agent's own count).
    pub step: u64,
    /// When it was saved.
    pub saved_at: Millis,
    /// Its state (JSON as itself, anything else as text).
    pub state: serde_json::Value,
    /// The state's size in bytes.
    pub bytes: usize,
}

/// Step `key` of run `run_id`: `key` as the store keeps it (`namespace:key`, as
/// `idem show` lists it), as the agent named it, or its number among the run's
/// committed steps (`idem show --steps`). [`StoreError::UnknownRun`] or
/// [`StoreError::UnknownStep`] if there is no such run or step.
pub async fn step_view(store: &dyn Store, run_id: &str, key: &str) -> Result<StepView, StoreError> {
    let run = store
        .run(run_id)
        .await?
        .ok_or_else(|| StoreError::UnknownRun {
            run_id: run_id.to_owned(),
        })?;
    let history = store.history(run_id).await?.unwrap_or(RunHistory {
        steps: Vec::new(),
        checkpoints: Vec::new(),
        collected: false,
        forked_from: None,
    });
    let qualified = qualified_key(&run.namespace, key);
    let steps = store.steps(run_id).await?;
    let by_key = |k: &str| steps.iter().find(|s| s.key == k);
    let step = by_key(key)
        .or_else(|| by_key(&qualified))
        .or_else(|| {
            // A number names the step the history numbers so.
            let n: u64 = key.parse().ok()?;
            let numbered = history.steps.iter().find(|s| s.n == n)?;
            by_key(&numbered.key)
        })
        .cloned()
        .ok_or_else(|| StoreError::UnknownStep {
            run_id: run_id.to_owned(),
            key: key.to_owned(),
        })?;
    let result = match step.committed_at {
        Some(_) => store.committed(&step.key).await?,
        None => None,
    };
    let at = history.steps.iter().position(|s| s.key == step.key);
    let checkpoint = match at {
        Some(i) => {
            let next = history.steps.get(i + 1).map(|s| s.position);
            store
                .checkpoint_before(run_id, next)
                .await?
                .filter(|saved| saved.position >= history.steps[i].position)
        }
        None => None,
    }
    .map(|saved| CheckpointView {
        step: saved.checkpoint.step,
        saved_at: saved.saved_at,
        bytes: saved.checkpoint.state.len(),
        state: payload_value(&saved.checkpoint.state),
    });
    let timeline = store.events(run_id).await?.unwrap_or(Timeline {
        events: Vec::new(),
        dropped: 0,
    });
    Ok(StepView {
        run_id: run_id.to_owned(),
        retaken: step.attempt > 1,
        claimed_in: instance_at(&timeline, step.claimed_at),
        result_bytes: result.as_ref().map(Vec::len),
        result: result.as_deref().map(payload_value),
        n: at.map(|i| history.steps[i].n),
        checkpoint,
        step,
    })
}

/// The timeline's last instance start at or before `at`.
fn instance_at(timeline: &Timeline, at: Millis) -> Option<RunEvent> {
    timeline
        .events
        .iter()
        .rev()
        .find(|e| e.kind == EventKind::Started && e.at <= at)
        .cloned()
}
