//! Recycling as a feature: `--recycle-every N` for several N, and seeded chaos that drops
//! instances at host calls and mid-computation (fuel). Same output, same exactly-once
//! property.

use idem::runtime::FaultPlan;
use idem::store::EventKind;
use idem_test_artifacts::STEPS;
use serde_json::json;

use crate::util::{TestHost, agent, block_on, key_counts};

const STEPS_N: u64 = 20;

#[test]
fn recycle_every_n_keeps_output_and_effects() {
    let t = TestHost::new();
    let steps = agent(STEPS);
    let input = |log: &str| json!({ "steps": STEPS_N, "log": format!("/data/{log}") });
    let clean = t.run(&steps, "clean", input("clean.log"), FaultPlan::default());

    for n in [1u64, 2, 3, 7, 20] {
        let run_id = format!("every-{n}");
        let log = format!("{run_id}.log");
        let faults = FaultPlan {
            recycle_every: Some(n as u32),
            ..FaultPlan::default()
        };
        let report = t.run(&steps, &run_id, input(&log), faults);
        assert_eq!(report.outcome, clean.outcome, "N={n}");
        assert_eq!(report.counts.instances, STEPS_N.div_ceil(n), "N={n}");
        assert_eq!(report.counts.executed, STEPS_N, "N={n}");
        assert_eq!(
            (report.counts.skipped, report.counts.reclaimed),
            (0, 0),
            "N={n}"
        );
        let lines = t.log(&log);
        assert_eq!(
            lines.len(),
            STEPS_N as usize,
            "N={n}: one side effect per step"
        );
        assert!(key_counts(&lines).values().all(|&c| c == 1), "N={n}");
        // Its timeline: one start per instance, one recycle between each two, all under
        // the one lease of the drive, and the end.
        let timeline = block_on(t.store().events(&run_id)).unwrap().unwrap();
        let kinds: Vec<EventKind> = timeline.events.iter().map(|e| e.kind).collect();
        let mut expected = vec![EventKind::Started];
        for _ in 1..report.counts.instances {
            expected.extend([EventKind::Recycled, EventKind::Started]);
        }
        expected.push(EventKind::Finished);
        assert_eq!(kinds, expected, "N={n}");
        let tokens: std::collections::BTreeSet<Option<u64>> =
            timeline.events.iter().map(|e| e.token).collect();
        assert_eq!(tokens.len(), 1, "N={n}: one lease");
        // Each instance saw its generation: N lines per generation.
        for (i, line) in lines.iter().enumerate() {
            assert_eq!(
                line.fields["gen"],
                (i as u64 / n).to_string(),
                "N={n} line {i}"
            );
        }
    }
}

#[test]
fn seeded_chaos_mid_computation_keeps_output_and_effects() {
    chaos(STEPS, STEPS_N, 200_000, 12);
}

/// Runs `guest` (the `steps` protocol) under `seeds` chaos seeds, `spin` iterations of
/// computation per step, and checks each run against a clean one.
pub(crate) fn chaos(guest: &str, n: u64, spin: u64, seeds: u64) {
    let t = TestHost::new();
    let steps = agent(guest);
    // Enough guest computation per step that random fuel budgets run out inside it.
    let input = |log: &str, fold: bool| json!({ "steps": n, "spin": spin, "log": format!("/data/{log}"), "fold": fold });
    let clean = t.run(
        &steps,
        "clean",
        input("clean.log", false),
        FaultPlan::default(),
    );

    let mut total_instances = 0;
    for seed in 1..=seeds {
        // Even seeds save checkpoints in the commit transaction, odd ones separately.
        let fold = seed % 2 == 0;
        let run_id = format!("chaos-{seed}");
        let log = format!("{run_id}.log");
        let faults = FaultPlan {
            chaos: Some(seed),
            ..FaultPlan::default()
        };
        let report = t.run(&steps, &run_id, input(&log, fold), faults);
        assert_eq!(report.outcome, clean.outcome, "seed {seed}");
        total_instances += report.counts.instances;

        let lines = t.log(&log);
        let counts = key_counts(&lines);
        assert_eq!(counts.len(), n as usize, "seed {seed}: every step ran");
        // A key repeats only when a drop fell inside its side effect: the repeat is a
        // retaken claim (higher attempt, in doubt), and each is counted as reclaimed.
        let repeats: u64 = counts.values().map(|&c| c as u64 - 1).sum();
        assert!(
            repeats <= report.counts.reclaimed,
            "seed {seed}: {repeats} repeats, {:?}",
            report.counts
        );
        for key in counts.keys() {
            let attempts: Vec<u32> = lines
                .iter()
                .filter(|l| &l.key == key)
                .map(|l| l.attempt())
                .collect();
            assert!(
                attempts.windows(2).all(|w| w[0] < w[1]),
                "seed {seed}: {key} attempts {attempts:?}"
            );
        }
        // In doubt only on a retake. A retake is not in doubt when the drop came right
        // after the claim, before the guest saw it: the host gave the key back.
        for line in &lines {
            assert!(
                !line.flag("in_doubt") || line.attempt() > 1,
                "seed {seed}: {line:?}"
            );
        }
        let in_doubt = lines.iter().filter(|l| l.flag("in_doubt")).count() as u64;
        assert_eq!(in_doubt, report.counts.reclaimed, "seed {seed}");
        assert_eq!(
            report.counts.executed,
            n + report.counts.reclaimed,
            "seed {seed}: every extra execution is a reclaim"
        );
    }
    // The seeds must actually have dropped instances, or this test proves nothing.
    assert!(
        total_instances > seeds * 3,
        "chaos made only {total_instances} instances over {seeds} runs"
    );
}

#[test]
fn the_same_chaos_seed_drops_the_same_way() {
    let t = TestHost::new();
    let steps = agent(STEPS);
    let input =
        |log: &str| json!({ "steps": STEPS_N, "spin": 50_000, "log": format!("/data/{log}") });
    let faults = FaultPlan {
        chaos: Some(42),
        ..FaultPlan::default()
    };
    let a = t.run(&steps, "a", input("a.log"), faults.clone());
    let b = t.run(&steps, "b", input("b.log"), faults);
    assert_eq!(a.counts, b.counts);
}
