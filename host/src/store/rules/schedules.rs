//! The rules of schedules both backends keep: which definitions a store refuses, and
//! what a tick does given the run of the previous tick.

use crate::store::{
    MAX_CATCH_UP, MAX_SCHEDULE_NAME_BYTES, Millis, Overlap, RunStatus, ScheduleDef, StoreError,
};

/// Refuses a definition a store cannot keep (before the deployment is looked up); the
/// schedule's first tick (`None`: the spec never comes due).
pub(crate) fn check_def(def: &ScheduleDef<'_>, now: Millis) -> Result<Millis, StoreError> {
    let refuse = |reason: String| StoreError::ScheduleRefused {
        name: def.name.to_owned(),
        reason,
    };
    if def.name.is_empty() || def.name.len() > MAX_SCHEDULE_NAME_BYTES {
        return Err(refuse(format!(
            "a schedule's name has 1 to {MAX_SCHEDULE_NAME_BYTES} bytes"
        )));
    }
    if crate::text::check_visible(def.name).is_err() || def.name.contains(['/', '@']) {
        return Err(refuse(
            "a schedule's name is visible text without '/' or '@' (its runs are named \
             <schedule>@<tick>)"
                .to_owned(),
        ));
    }
    if def.catch_up > MAX_CATCH_UP {
        return Err(refuse(format!(
            "catch-up {} is over the most a schedule starts at once ({MAX_CATCH_UP})",
            def.catch_up
        )));
    }
    def.spec.check(now).map_err(|e| refuse(e.to_string()))?;
    def.spec
        .next_after(now)
        .ok_or_else(|| refuse("it never comes due".to_owned()))
}

/// What a tick does about the run of the schedule's previous tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TickAction {
    /// Start the tick's run.
    Start,
    /// Start nothing: the previous run is still going.
    Skip,
    /// Cancel the previous run, then start the tick's run.
    CancelThenStart,
}

/// The action for a tick whose schedule's previous run stands at `previous` (`None`:
/// no previous run, or it was collected).
pub(crate) fn tick_action(previous: Option<RunStatus>, overlap: Overlap) -> TickAction {
    let going = previous.is_some_and(|status| !status.is_finished());
    match (going, overlap) {
        (false, _) | (true, Overlap::Allow) => TickAction::Start,
        (true, Overlap::Skip) => TickAction::Skip,
        (true, Overlap::CancelPrevious) => TickAction::CancelThenStart,
    }
}
