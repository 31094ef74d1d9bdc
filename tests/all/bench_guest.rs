//! The bench agent (`tests/guests/bench`) does what `host/benches/idem.rs` relies on: one
//! duration per timed step, resuming from its checkpoint after a drop, and host calls
//! that leave the store alone. What the durations are is the bench's business.

use idem::runtime::FaultPlan;
use idem_test_artifacts::BENCH;
use serde_json::{Value, json};

use crate::util::{TestHost, agent};

fn output(outcome: &[u8]) -> Value {
    serde_json::from_slice(outcome).unwrap()
}

#[test]
fn timed_steps_report_one_duration_per_step() {
    let t = TestHost::new();
    let input = json!({ "mode": "steps", "n": 5, "timed": true });
    let report = t.run(&agent(BENCH), "timed", input, FaultPlan::default());
    assert_eq!(report.counts.executed, 5);
    let out = output(&report.outcome);
    assert_eq!(out["n"], 5);
    assert_eq!(out["step_ns"].as_array().unwrap().len(), 5);
    assert!(out["first_step_done_unix_ns"].as_u64().unwrap() > 0);

    let untimed = t.run(
        &agent(BENCH),
        "untimed",
        json!({ "mode": "steps", "n": 3 }),
        FaultPlan::default(),
    );
    assert_eq!(output(&untimed.outcome), json!({ "n": 3 }));
}

#[test]
fn recycled_steps_resume_from_the_checkpoint() {
    let t = TestHost::new();
    let faults = FaultPlan {
        recycle_every: Some(1),
        ..FaultPlan::default()
    };
    let report = t.run(
        &agent(BENCH),
        "recycled",
        json!({ "mode": "steps", "n": 4 }),
        faults,
    );
    // One instance per step, and no step replayed: the checkpoint was honoured.
    assert_eq!(report.counts.instances, 4);
    assert_eq!(report.counts.executed, 4);
    assert_eq!(report.counts.skipped, 0);
}

#[test]
fn calls_leave_the_store_alone() {
    let t = TestHost::new();
    let input = json!({ "mode": "calls", "n": 100 });
    let report = t.run(&agent(BENCH), "calls", input, FaultPlan::default());
    assert_eq!((report.counts.executed, report.counts.skipped), (0, 0));
    assert!(
        crate::util::block_on(t.store().load_progress("calls"))
            .unwrap()
            .is_none()
    );
    assert!(output(&report.outcome)["calls_ns"].as_u64().is_some());
}
