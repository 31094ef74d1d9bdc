//! In-doubt claims end to end: a step dropped inside its side effect is retaken in
//! doubt, and the agent's policy decides — retry under the same key, stop the run for
//! an operator (`idem resolve`), or probe the downstream.

use idem::runtime::{CrashPoint, FaultPlan, Phase};
use idem_test_artifacts::STEPS;
use serde_json::{Value, json};

use crate::util::{CliDir, TestHost, agent, key_counts, read_log, run_cli, stderr, stdout};

/// The value the steps guest commits for step `i` (its `mix(i, 0x5eed)`).
fn step_value(i: u64) -> u64 {
    (i ^ 0x5eed)
        .wrapping_mul(0x0000_0100_0000_01b3)
        .rotate_left(29)
}

fn crash_in_effect(step: u32) -> FaultPlan {
    FaultPlan {
        crash_at: vec![CrashPoint {
            phase: Phase::InEffect,
            step,
        }],
        ..FaultPlan::default()
    }
}

#[test]
fn probe_finds_the_applied_effect_and_does_not_repeat_it() {
    let t = TestHost::new();
    let steps = agent(STEPS);
    let clean = t.run(
        &steps,
        "clean",
        json!({ "steps": 5, "log": "/data/clean.log" }),
        FaultPlan::default(),
    );
    let input = json!({ "steps": 5, "log": "/data/probe.log", "policy": "probe" });
    let report = t.run(&steps, "probe", input, crash_in_effect(3));
    assert_eq!(report.outcome, clean.outcome);
    assert_eq!(report.counts.reclaimed, 1);
    let lines = t.log("probe.log");
    assert_eq!(lines.len(), 5, "the probe saw the effect: no second append");
    assert!(key_counts(&lines).values().all(|&c| c == 1));
}

#[test]
fn retry_repeats_the_effect_under_the_same_key() {
    let t = TestHost::new();
    let input = json!({ "steps": 5, "log": "/data/retry.log", "policy": "retry" });
    let report = t.run(&agent(STEPS), "retry", input, crash_in_effect(3));
    assert_eq!(report.counts.reclaimed, 1);
    let lines = t.log("retry.log");
    assert_eq!(lines.len(), 6);
    let key = &lines[2].key;
    let repeats: Vec<_> = lines.iter().filter(|l| &l.key == key).collect();
    assert_eq!(repeats.len(), 2);
    assert_eq!((repeats[0].attempt(), repeats[1].attempt()), (1, 2));
    assert!(repeats[1].flag("in_doubt"));
}

pub(crate) struct CliRun {
    cli: CliDir,
    guest: &'static str,
    /// The namespace the guest runs under: its file name.
    ns: &'static str,
}

impl CliRun {
    fn new() -> CliRun {
        CliRun::of(STEPS, "steps")
    }

    /// A run of `guest` (the `steps` protocol), deployed under `ns`.
    pub(crate) fn of(guest: &'static str, ns: &'static str) -> CliRun {
        CliRun {
            cli: CliDir::new(),
            guest,
            ns,
        }
    }

    fn db(&self) -> String {
        self.cli.db()
    }

    fn run(&self, run_id: &str, extra: &[&str]) -> std::process::Output {
        let input = json!({ "steps": 5, "log": "/data/log.txt", "policy": "fail" }).to_string();
        self.cli.run(self.guest, run_id, &input, extra)
    }

    fn status(&self, run_id: &str) -> Value {
        let out = run_cli(&["status", "--db", &self.db(), run_id, "--json"]);
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_str(&stdout(&out)).unwrap()
    }

    fn log(&self) -> Vec<crate::util::LogLine> {
        read_log(&self.cli.data().join("log.txt"))
    }
}

/// Runs with policy `fail` and a crash inside step 3's effect: the run stops in doubt.
fn stopped_in_doubt(cli: &CliRun) -> String {
    let out = cli.run("wire", &["--crash-at", "in-effect:3"]);
    assert_eq!(
        out.status.code(),
        Some(5),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        stdout(&out).contains("stopped in doubt"),
        "{}",
        stdout(&out)
    );
    assert_eq!(
        cli.log().len(),
        3,
        "steps 0-2 ran once; step 2's effect is the one in doubt"
    );

    let status = cli.status("wire");
    assert_eq!(status["runs"][0]["status"], "in-doubt");
    let claims = status["open_claims"].as_array().unwrap();
    assert_eq!(claims.len(), 1);
    assert!(claims[0]["parked"].is_string());
    // Status shows the key as the store keeps it: in the agent's namespace.
    let key = claims[0]["key"].as_str().unwrap().to_string();
    assert_eq!(key, format!("{}:{}", cli.ns, cli.log()[2].key));

    // Running it again does not guess: it names the key and how to settle it.
    let again = cli.run("wire", &[]);
    assert_eq!(again.status.code(), Some(5));
    assert!(
        stderr(&again).contains(&key) && stderr(&again).contains("idem resolve"),
        "{}",
        stderr(&again)
    );
    assert_eq!(cli.log().len(), 3);
    key
}

#[test]
fn fail_stops_the_run_and_resolve_with_a_result_completes_it() {
    resolve_with_a_result(CliRun::new, CliRun::new);
}

/// `policy: fail`, stopped in doubt, settled with `idem resolve --result`, run on.
pub(crate) fn resolve_with_a_result(make: impl Fn() -> CliRun, clean: impl Fn() -> CliRun) {
    let cli = make();
    let key = stopped_in_doubt(&cli);
    let db = cli.db();

    // A key that is not parked is refused and changes nothing.
    let wrong = run_cli(&[
        "resolve",
        "wire",
        "no-such-key",
        "--result",
        "1",
        "--db",
        &db,
    ]);
    assert_eq!(wrong.status.code(), Some(2), "{}", stderr(&wrong));
    assert!(stderr(&wrong).contains("not parked"), "{}", stderr(&wrong));

    // The operator checked downstream: the effect happened, with this value.
    let value = step_value(2).to_string();
    let out = run_cli(&["resolve", "wire", &key, "--result", &value, "--db", &db]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(cli.status("wire")["runs"][0]["status"], "running");

    let out = cli.run("wire", &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let lines = cli.log();
    assert_eq!(lines.len(), 5, "the resolved step was not executed again");
    assert!(key_counts(&lines).values().all(|&c| c == 1));

    let clean = clean();
    let out = clean.run("wire", &["--json"]);
    let clean_doc: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let out = cli.run("wire", &["--json"]);
    let doc: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(doc["output"], clean_doc["output"]);
}

#[test]
fn fail_stops_the_run_and_resolve_retry_runs_the_effect_again() {
    resolve_retry(&CliRun::new());
}

/// `policy: fail`, stopped in doubt, settled with `idem resolve --retry`, run on.
pub(crate) fn resolve_retry(cli: &CliRun) {
    let key = stopped_in_doubt(cli);
    let out = run_cli(&["resolve", "wire", &key, "--retry", "--db", &cli.db()]);
    assert!(out.status.success(), "{}", stderr(&out));

    let out = cli.run("wire", &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let lines = cli.log();
    assert_eq!(lines.len(), 6);
    let repeats: Vec<_> = lines
        .iter()
        .filter(|l| format!("{}:{}", cli.ns, l.key) == key)
        .collect();
    assert_eq!(repeats.len(), 2);
    // Attempt 2 was the in-doubt claim that stopped; the operator's retry is attempt 3,
    // not in doubt any more.
    assert_eq!((repeats[0].attempt(), repeats[1].attempt()), (1, 3));
    assert!(!repeats[1].flag("in_doubt"));
}
