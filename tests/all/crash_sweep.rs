//! A 20-step agent dropped at every crash point of every step: each side effect lands
//! once, except a drop inside the effect, which is retried under the same key with a
//! higher attempt and counted as reclaimed. A drop right after the claim, before the
//! guest saw it, is retried without being flagged in doubt.

use idem::runtime::{CrashPoint, FaultPlan, Phase};
use idem_test_artifacts::STEPS;
use serde_json::json;

use crate::util::{TestHost, agent, key_counts};

const STEPS_N: u32 = 20;

#[test]
fn every_crash_point_of_every_step() {
    sweep(STEPS, STEPS_N, false);
}

/// The same sweep for an agent that saves each checkpoint in its step's commit
/// transaction (`Once::run_and_save`).
#[test]
fn every_crash_point_of_every_step_with_folded_saves() {
    sweep(STEPS, STEPS_N, true);
}

/// Drops `guest` (the `steps` protocol: the Rust guest or its Python twin) at every
/// crash point of every one of `n` steps.
pub(crate) fn sweep(guest: &str, n: u32, fold: bool) {
    let t = TestHost::new();
    let steps = agent(guest);
    let input = |log: &str| json!({ "steps": n, "log": format!("/data/{log}"), "fold": fold });

    let clean = t.run(&steps, "clean", input("clean.log"), FaultPlan::default());
    assert_eq!(clean.counts.executed, u64::from(n));
    assert_eq!(clean.counts.instances, 1);
    let clean_log = t.log("clean.log");
    assert_eq!(clean_log.len(), n as usize);

    for phase in Phase::ALL {
        for step in 1..=n {
            let run_id = format!("sweep-{phase}-{step}");
            let log = format!("{run_id}.log");
            let faults = FaultPlan {
                crash_at: vec![CrashPoint { phase, step }],
                ..FaultPlan::default()
            };
            let report = t.run(&steps, &run_id, input(&log), faults);
            let ctx = format!("crash at {phase}:{step}");
            assert_eq!(
                report.outcome, clean.outcome,
                "{ctx}: output differs from the uncrashed run"
            );
            assert_eq!(report.counts.instances, 2, "{ctx}");

            let lines = t.log(&log);
            let counts = key_counts(&lines);
            assert_eq!(
                counts.len(),
                n as usize,
                "{ctx}: every step's key is in the log"
            );
            let mut order: Vec<&str> = Vec::new();
            for line in &lines {
                if !order.contains(&line.key.as_str()) {
                    order.push(&line.key);
                }
            }
            // Keys first appear in step order, so the crashed step's key is this one.
            let crashed_key = order[step as usize - 1];
            match phase {
                Phase::InEffect => {
                    // The side effect ran, the commit did not: it runs again, same key,
                    // next attempt, flagged in doubt.
                    assert_eq!(lines.len(), n as usize + 1, "{ctx}");
                    let repeated: Vec<_> = lines.iter().filter(|l| l.key == crashed_key).collect();
                    assert_eq!(repeated.len(), 2, "{ctx}");
                    assert_eq!(
                        (repeated[0].attempt(), repeated[1].attempt()),
                        (1, 2),
                        "{ctx}"
                    );
                    assert!(
                        !repeated[0].flag("in_doubt") && repeated[1].flag("in_doubt"),
                        "{ctx}"
                    );
                    assert!(
                        repeated[1].token() > repeated[0].token(),
                        "{ctx}: fencing token grows"
                    );
                    assert_eq!(report.counts.reclaimed, 1, "{ctx}");
                    assert_eq!(report.counts.executed, u64::from(n) + 1, "{ctx}");
                }
                Phase::AfterClaim => {
                    // The claim was taken but never reached the guest: the host gave it
                    // back, so the retake is the next attempt and, truthfully, not in
                    // doubt: no side effect could have begun.
                    assert_eq!(lines.len(), n as usize, "{ctx}");
                    let line = lines.iter().find(|l| l.key == crashed_key).unwrap();
                    assert_eq!(line.attempt(), 2, "{ctx}");
                    assert!(
                        !line.flag("in_doubt"),
                        "{ctx}: flagged in doubt for nothing"
                    );
                    assert_eq!(report.counts.reclaimed, 0, "{ctx}");
                    assert_eq!(report.counts.executed, u64::from(n), "{ctx}");
                }
                Phase::BeforeClaim | Phase::AfterCommit | Phase::AfterSave => {
                    assert_eq!(lines.len(), n as usize, "{ctx}: no side effect repeats");
                    assert!(lines.iter().all(|l| l.attempt() == 1), "{ctx}");
                    assert_eq!(report.counts.reclaimed, 0, "{ctx}");
                    assert_eq!(report.counts.executed, u64::from(n), "{ctx}");
                }
                // Phases of spawns and joins: the `steps` agent has none.
                _ => unreachable!("{ctx}: not a phase of a step"),
            }
            // Only a drop between commit and checkpoint makes the next instance replay
            // a committed step, which it then skips. A folded save closes that gap.
            let skipped = u64::from(phase == Phase::AfterCommit && !fold);
            assert_eq!(report.counts.skipped, skipped, "{ctx}");
        }
    }
}
