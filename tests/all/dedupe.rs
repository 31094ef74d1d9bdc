//! Keys are global in a store: two runs whose steps share content-derived keys share
//! one execution. One run executes; the other skips, or awaits when they overlap.

use std::thread;

use idem::runtime::FaultPlan;
use idem_test_artifacts::DEDUPE;
use serde_json::json;

use crate::util::{TestHost, agent, key_counts};

#[test]
fn a_second_run_skips_what_the_first_committed() {
    let t = TestHost::new();
    let dedupe = agent(DEDUPE);
    let first = t.run(
        &dedupe,
        "first",
        json!({ "items": ["a", "b", "c"], "log": "/data/charges.log" }),
        FaultPlan::default(),
    );
    assert_eq!((first.counts.executed, first.counts.skipped), (3, 0));
    let second = t.run(
        &dedupe,
        "second",
        json!({ "items": ["b", "c", "d"], "log": "/data/charges.log" }),
        FaultPlan::default(),
    );
    assert_eq!(
        (
            second.counts.executed,
            second.counts.skipped,
            second.counts.awaited
        ),
        (1, 2, 0)
    );

    let lines = t.log("charges.log");
    assert_eq!(lines.len(), 4, "a, b, c, d charged once each");
    assert!(key_counts(&lines).values().all(|&c| c == 1));
    let by_second: Vec<_> = lines
        .iter()
        .filter(|l| l.fields["run"] == "second")
        .collect();
    assert_eq!(by_second.len(), 1);
    let output: serde_json::Value = serde_json::from_slice(&second.outcome).unwrap();
    assert_eq!(output["charged"], 3);
}

#[test]
fn overlapping_runs_await_each_other() {
    let t = TestHost::new();
    let dedupe = agent(DEDUPE);
    let items = ["x", "y", "z", "w"];
    // Each side effect takes long enough that the two runs meet on a key in flight.
    let input = json!({ "items": items, "log": "/data/charges.log", "pause_ms": 150 });
    let reports = thread::scope(|s| {
        let handles: Vec<_> = ["left", "right"]
            .into_iter()
            .map(|run_id| {
                let (t, dedupe, input) = (&t, &dedupe, input.clone());
                s.spawn(move || t.run(dedupe, run_id, input, FaultPlan::default()))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    let executed: u64 = reports.iter().map(|r| r.counts.executed).sum();
    let awaited: u64 = reports.iter().map(|r| r.counts.awaited).sum();
    let skipped: u64 = reports.iter().map(|r| r.counts.skipped).sum();
    assert_eq!(
        executed,
        items.len() as u64,
        "each key executed once in total"
    );
    assert_eq!(executed + awaited + skipped, 2 * items.len() as u64);
    assert!(
        awaited >= 1,
        "the runs started together, so one waited on the other: {reports:?}"
    );
    let lines = t.log("charges.log");
    assert_eq!(lines.len(), items.len());
    assert!(key_counts(&lines).values().all(|&c| c == 1));
    for r in &reports {
        let output: serde_json::Value = serde_json::from_slice(&r.outcome).unwrap();
        assert_eq!(output["charged"], items.len());
    }
}

#[test]
fn namespaces_keep_agents_apart() {
    use idem_test_artifacts::STEPS;

    let t = TestHost::new();
    let steps = agent(STEPS);
    let input = json!({ "steps": 3, "log": "/data/log.txt", "shared": true });
    let run = |run_id: &str, namespace: Option<&str>| {
        let mut opts = t.options(run_id, input.clone(), FaultPlan::default());
        opts.namespace = namespace.map(str::to_string);
        t.run_with(&steps, &opts)
    };
    // Same shared keys, two namespaces: neither sees the other's commits.
    let a = run("a", Some("tenant-a")).unwrap();
    let b = run("b", Some("tenant-b")).unwrap();
    assert_eq!((a.counts.executed, b.counts.executed), (3, 3));
    // The same namespace again: everything is already committed there.
    let a2 = run("a2", Some("tenant-a")).unwrap();
    assert_eq!((a2.counts.executed, a2.counts.skipped), (0, 3));
    assert_eq!(t.log("log.txt").len(), 6);
    // A run cannot move to another namespace: it would lose sight of its own commits.
    let err = run("a", Some("tenant-b")).unwrap_err().to_string();
    assert!(
        err.contains("namespace \"tenant-a\"") && err.contains("not \"tenant-b\""),
        "{err}"
    );
    let err = run("c", Some("no:colons")).unwrap_err().to_string();
    assert!(err.contains("invalid namespace"), "{err}");
}
