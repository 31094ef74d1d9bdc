//! Leases are renewed while a side effect runs: a holder busy for longer than its lease
//! keeps its claim, so a concurrent run awaits it instead of taking it over.

use std::thread;
use std::time::Duration;

use idem::runtime::{FaultPlan, Limits};
use idem_test_artifacts::STEPS;
use serde_json::json;

use crate::util::{TestHost, agent, key_counts};

#[test]
fn a_side_effect_longer_than_its_lease_keeps_its_claim() {
    let t = TestHost::with_limits(Limits {
        lease: Duration::from_millis(300),
        ..Limits::default()
    });
    let steps = agent(STEPS);
    // Each effect takes four leases; without renewal the other run would take the
    // claim over after one and run the effect a second time.
    let input = json!({ "steps": 2, "log": "/data/log.txt", "pause_ms": 1200, "shared": true });
    let reports = thread::scope(|s| {
        let handles: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|run_id| {
                let (t, steps, input) = (&t, &steps, input.clone());
                s.spawn(move || t.run(steps, run_id, input, FaultPlan::default()))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    let lines = t.log("log.txt");
    assert_eq!(lines.len(), 2, "each shared step ran once: {reports:?}");
    assert!(key_counts(&lines).values().all(|&c| c == 1));
    assert_eq!(reports.iter().map(|r| r.counts.reclaimed).sum::<u64>(), 0);
    assert_eq!(reports.iter().map(|r| r.counts.executed).sum::<u64>(), 2);
    assert!(reports.iter().map(|r| r.counts.awaited).sum::<u64>() >= 1);
}

/// A run's lease is renewed while it works, however often its steps claim keys: a
/// host that grants claims faster than its beat must still beat. (Each new claim wakes
/// the heartbeat; once, that pushed the beat back every time, and a busy run lost its
/// lease to a worker that took it over mid-step.)
#[test]
fn a_busy_run_keeps_its_lease_while_it_claims_faster_than_the_beat() {
    let t = TestHost::with_limits(Limits {
        lease: Duration::from_millis(300),
        ..Limits::default()
    });
    let steps = agent(STEPS);
    // 60 steps of 20 ms: over a second of claims every 20 ms, against a 300 ms lease
    // renewed every 100 ms.
    let input = json!({ "steps": 60, "log": "/data/busy.log", "pause_ms": 20 });
    let store = t.store().clone();
    let report = thread::scope(|s| {
        let run = s.spawn(|| t.run(&steps, "busy", input, FaultPlan::default()));
        let mut checked = 0;
        while !run.is_finished() {
            thread::sleep(Duration::from_millis(150));
            let (record, now) = crate::util::block_on(async {
                (store.run("busy").await.unwrap(), store.now().await.unwrap())
            });
            if let Some(lease) = record.and_then(|r| r.lease)
                && !run.is_finished()
            {
                assert!(
                    lease.expires > now,
                    "the lease ran out while the run worked: {lease:?} at {now}"
                );
                checked += 1;
            }
        }
        assert!(checked >= 3, "the lease was looked at while the run worked");
        run.join().unwrap()
    });
    assert_eq!(report.counts.executed, 60);
}
