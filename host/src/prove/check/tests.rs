//! The invariants held against small hand-made observations.

use super::*;
use crate::prove::capture::Captured;
use crate::prove::observe::{Answer, Event};
use crate::store::StepRecord;

fn call(key: &str, holder: &str, in_doubt: bool) -> Event {
    Event::Call {
        key: format!("ns:{key}"),
        holder: holder.into(),
        answer: Answer::Granted { token: 1, in_doubt },
    }
}

fn commit(key: &str, step: u64) -> Event {
    Event::Commit {
        key: format!("ns:{key}"),
        checkpoint: Some(step),
    }
}

fn step(key: &str) -> StepRecord {
    StepRecord {
        key: format!("ns:{key}"),
        token: 1,
        attempt: 1,
        claimed_at: 0,
        committed_at: Some(1),
        holder: None,
        parked: None,
    }
}

fn observation(events: Vec<Event>, keys: &[&str], output: &str) -> Observation {
    Observation {
        ended: Ended::Completed(output.as_bytes().to_vec()),
        namespace: "ns".into(),
        events,
        steps: keys.iter().map(|k| step(k)).collect(),
        open: Vec::new(),
        children: Vec::new(),
        captured: Captured::default(),
        files: Files::new(),
        instances: 1,
        reclaimed: 0,
        kills: None,
    }
}

fn clean() -> Baseline {
    let events = vec![
        Event::Load { step: None },
        call("a", "h/0", false),
        commit("a", 1),
        call("b", "h/0", false),
        commit("b", 2),
        call("c", "h/0", false),
        commit("c", 3),
    ];
    Baseline::new(&observation(events, &["a", "b", "c"], "{}"), b"{}".to_vec())
}

#[test]
fn a_faithful_replay_passes() {
    let events = vec![
        Event::Load { step: None },
        call("a", "h/0", false),
        commit("a", 1),
        call("b", "h/0", false),
        Event::Load { step: Some(1) },
        call("b", "h/1", true),
        commit("b", 2),
        call("c", "h/1", false),
        commit("c", 3),
    ];
    let found = check(
        &observation(events, &["a", "b", "c"], "{}"),
        Some(&clean()),
        &Files::new(),
    );
    assert_eq!(found.violations, Vec::new());
}

#[test]
fn a_key_that_changes_names_its_step() {
    let events = vec![
        Event::Load { step: None },
        call("a", "h/0", false),
        commit("a", 1),
        call("b", "h/0", false),
        Event::Load { step: Some(1) },
        call("b2", "h/1", false),
        commit("b2", 2),
        call("c2", "h/1", false),
        commit("c2", 3),
    ];
    let obs = observation(events, &["a", "b", "b2", "c2"], "{}");
    let found = check(&obs, Some(&clean()), &Files::new());
    let unstable: Vec<_> = found
        .violations
        .iter()
        .filter(|v| v.kind == ViolationKind::UnstableKey)
        .map(|v| (v.step, v.key.clone().unwrap()))
        .collect();
    assert_eq!(
        unstable,
        [(Some(2), "b2".to_string()), (Some(3), "c2".to_string())]
    );
    assert!(
        found
            .violations
            .iter()
            .any(|v| v.kind == ViolationKind::KeyNotCommitted && v.step == Some(3))
    );
}

#[test]
fn progress_saved_before_its_commits_is_ahead() {
    let events = vec![
        Event::Load { step: None },
        call("a", "h/0", false),
        Event::Save { step: 2 },
        commit("a", 1),
    ];
    let found = check(
        &observation(events, &["a"], "{}"),
        Some(&clean()),
        &Files::new(),
    );
    assert!(
        found
            .violations
            .iter()
            .any(|v| v.kind == ViolationKind::ProgressAhead && v.key.as_deref() == Some("a")),
        "{:?}",
        found.violations
    );
}

#[test]
fn outputs_are_compared_field_by_field() {
    let text = output_difference(br#"{"n":1,"g":0}"#, br#"{"n":1,"g":1}"#);
    assert!(text.contains("g: 0 in the clean run, 1 here"), "{text}");
    assert!(!text.contains("n:"), "{text}");
}

#[test]
fn repeated_file_lines_need_retakes_in_doubt() {
    let mut base = clean();
    base.files.insert("/data/log".into(), b"a\nb\n".to_vec());
    let mut obs = observation(Vec::new(), &["a", "b", "c"], "{}");
    obs.files.insert("/data/log".into(), b"a\nb\nb\n".to_vec());
    let found = check(&obs, Some(&base), &Files::new());
    assert!(
        found
            .violations
            .iter()
            .any(|v| v.kind == ViolationKind::DuplicateEffect)
    );
    obs.reclaimed = 1;
    let found = check(&obs, Some(&base), &Files::new());
    assert_eq!(found.duplicates_in_doubt, 1);
    assert!(found.violations.is_empty(), "{:?}", found.violations);
}

#[test]
fn a_child_the_clean_run_never_spawned_is_an_unstable_spawn_key() {
    let mut base = clean();
    base.children = vec![("kid-1".into(), "r~1".into())];
    let mut obs = observation(Vec::new(), &["a", "b", "c"], "{}");
    obs.children = base.children.clone();
    let found = check(&obs, Some(&base), &Files::new());
    assert!(found.violations.is_empty(), "{:?}", found.violations);
    obs.children.push(("kid-2".into(), "r~2".into()));
    let found = check(&obs, Some(&base), &Files::new());
    let kinds: Vec<_> = found.violations.iter().map(|v| v.kind).collect();
    assert_eq!(kinds, [ViolationKind::UnstableSpawnKey]);
    assert_eq!(found.violations[0].key.as_deref(), Some("kid-2"));
    assert!(
        found.violations[0]
            .detail
            .contains("2 children here against 1"),
        "{:?}",
        found.violations
    );
}
