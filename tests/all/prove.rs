//! `idem prove`, the real binary: the examples come out clean (exit 0), and each
//! mistake of the `sloppy` guest is caught with the right kind of violation and a
//! command that, run, shows the mistake again. A parent that spawns and joins is
//! crashed around each spawn and its join, and says its children were not run.

use std::process::Output;

use idem_test_artifacts::{BENCH, DEDUPE, FANOUT, LEDGER, SLOPPY};
use serde_json::{Value, json};

use crate::http::TestServer;
use crate::util::{CliDir, read_log, run_cli, stderr, stdout};

/// `idem prove`'s exit code when it found violations.
const VIOLATIONS: i32 = 7;

fn prove(agent: &str, dir: &CliDir, input: &Value, extra: &[&str]) -> (Output, Value) {
    let grant = format!("{}::/data", dir.data().display());
    let input = input.to_string();
    let scratch = dir.dir.path().join("scratch");
    let scratch = scratch.to_str().unwrap();
    let mut args = vec![
        "prove",
        agent,
        "--input",
        &input,
        "--dir",
        &grant,
        "--json",
        "--scratch",
        scratch,
    ];
    args.extend_from_slice(extra);
    let out = run_cli(&args);
    let doc = serde_json::from_str(&stdout(&out)).unwrap_or_else(|e| {
        panic!(
            "prove printed no JSON ({e}): {}\n{}",
            stdout(&out),
            stderr(&out)
        )
    });
    (out, doc)
}

fn scenarios(doc: &Value) -> &Vec<Value> {
    doc["scenarios"].as_array().unwrap()
}

/// Every violation of one kind, with the scenario it was found in.
fn violations<'a>(doc: &'a Value, kind: &str) -> Vec<(&'a Value, &'a Value)> {
    scenarios(doc)
        .iter()
        .flat_map(|s| {
            s["violations"]
                .as_array()
                .unwrap()
                .iter()
                .map(move |v| (s, v))
        })
        .filter(|(_, v)| v["kind"] == kind)
        .collect()
}

/// Runs a reproducing command as a shell would, with this build's `idem`.
fn reproduce(command: &str) -> Output {
    let command = command
        .strip_prefix("idem ")
        .unwrap_or_else(|| panic!("not an idem command: {command}"));
    std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("\"$IDEM\" {command}"))
        .env("IDEM", env!("CARGO_BIN_EXE_idem"))
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .env("IDEM_LOG", "warn")
        .output()
        .unwrap()
}

#[test]
fn the_ledger_example_is_proven_clean() {
    let dir = CliDir::new();
    let items: Vec<String> = (0..6).map(|i| format!("item-{i}")).collect();
    let input = json!({ "items": items, "log": "/data/ledger.log" });
    let junit = dir.dir.path().join("junit.xml");
    let (out, doc) = prove(
        LEDGER,
        &dir,
        &input,
        &[
            "--chaos",
            "2",
            "--kills",
            "2",
            "--junit",
            junit.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{doc:#}\n{}", stderr(&out));
    assert_eq!(doc["passed"], true);
    assert_eq!(doc["clean"]["keys"].as_array().unwrap().len(), 6);
    // The clean run, 5 phases × 6 steps, 2 chaos seeds, the kills.
    assert_eq!(scenarios(&doc).len(), 1 + 30 + 2 + 1);
    for s in scenarios(&doc) {
        let name = s["name"].as_str().unwrap();
        assert!(s["violations"].as_array().unwrap().is_empty(), "{s:#}");
        if name.starts_with("in-effect") {
            // The append ran, the commit did not: it runs again, flagged in doubt.
            assert_eq!(s["duplicates_in_doubt"], 1, "{s:#}");
            assert_eq!(s["effects"], 7, "{s:#}");
        } else if s["scenario"]["kind"] == "crash" {
            assert_eq!(s["duplicates_in_doubt"], 0, "{s:#}");
            assert_eq!(s["effects"], 6, "{s:#}");
        }
        if s["scenario"]["kind"] == "crash" {
            // The ledger saves its checkpoint in each commit: every boundary is passed.
            assert_eq!(s["reached"], true, "{s:#}");
            assert_eq!(s["instances"], 2, "{s:#}");
        }
    }
    // The kills ran in child processes on one store; the report says how many landed
    // on a live process (the moments are random within a run's length).
    let kills = scenarios(&doc).last().unwrap();
    assert_eq!(kills["scenario"]["kind"], "kills", "{kills:#}");
    assert!(kills["kills"].as_u64().is_some_and(|k| k <= 2), "{kills:#}");
    // Each scenario wrote to its own copy: the granted directory itself is untouched.
    assert!(!dir.data().join("ledger.log").exists());
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert_eq!(xml.matches("<testcase ").count(), 34, "{xml}");
    assert!(xml.contains("failures=\"0\""), "{xml}");
    assert!(xml.contains("name=\"in-effect:3\""), "{xml}");
}

#[test]
fn the_dedupe_example_is_proven_clean_with_its_table() {
    let dir = CliDir::new();
    let grant = format!("{}::/data", dir.data().display());
    let input = json!({ "items": ["a", "b", "c"], "log": "/data/charges.log" }).to_string();
    let out = run_cli(&["prove", DEDUPE, "--input", &input, "--dir", &grant]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(text.contains("verdict: PASSED"), "{text}");
    // Dedupe saves no checkpoint: its after-save points are never reached.
    let after_save = text
        .lines()
        .find(|l| l.starts_with("after-save"))
        .unwrap_or_else(|| panic!("{text}"));
    let columns: Vec<&str> = after_save.split_whitespace().collect();
    assert_eq!(&columns[1..3], ["3", "3"], "{after_save}");
    // Not a terminal: no progress bar, nothing but errors on stderr.
    assert_eq!(stderr(&out), "");
}

/// The distinct keys in a log the `sloppy` guest wrote.
fn distinct_keys(path: &std::path::Path) -> usize {
    let lines = read_log(path);
    let keys: std::collections::BTreeSet<_> = lines.iter().map(|l| l.key.clone()).collect();
    keys.len()
}

fn unstable(mode: &str) {
    let dir = CliDir::new();
    let input = json!({ "mode": mode, "items": 3, "log": "/data/sloppy.log" });
    let (out, doc) = prove(SLOPPY, &dir, &input, &[]);
    assert_eq!(out.status.code(), Some(VIOLATIONS), "{doc:#}");
    assert_eq!(doc["passed"], false);
    let found = violations(&doc, "unstable-key");
    assert!(!found.is_empty(), "{doc:#}");
    // Each names the step whose key changed, and says what keys must derive from.
    for (_, v) in &found {
        assert!(
            v["step"].as_u64().is_some_and(|s| (1..=3).contains(&s)),
            "{v:#}"
        );
        assert!(v["hint"].as_str().unwrap().contains("attempt"), "{v:#}");
    }
    // A crash after step 2's commit replays step 2 under a new key.
    let (scenario, v) = found
        .iter()
        .find(|(s, _)| s["name"] == "after-commit:2")
        .unwrap_or_else(|| panic!("{doc:#}"));
    assert!(
        v["detail"].as_str().unwrap().contains("key changed"),
        "{v:#}"
    );
    assert!(!violations(&doc, "duplicate-effect").is_empty(), "{doc:#}");

    // The command reproduces it: run for real, step 2 is logged under two keys.
    let command = scenario["reproduce"].as_str().unwrap();
    assert!(command.ends_with("--crash-at after-commit:2"), "{command}");
    let log = dir.data().join("sloppy.log");
    assert!(!log.exists(), "the proof wrote to the granted directory");
    let run = reproduce(command);
    assert!(run.status.success(), "{}", stderr(&run));
    assert_eq!(read_log(&log).len(), 4, "one step ran twice");
    assert_eq!(distinct_keys(&log), 4, "under a new key");
}

#[test]
fn keys_from_the_clock_are_caught() {
    unstable("clock");
}

#[test]
fn keys_from_an_attempt_counter_are_caught() {
    unstable("attempt");
}

#[test]
fn a_request_outside_run_once_is_caught_and_nothing_reaches_the_destination() {
    let dir = CliDir::new();
    let real = TestServer::start();
    let stub = TestServer::start();
    let input = json!({ "mode": "outside", "items": 3, "url": real.url() });
    let allow = format!("127.0.0.1:{}", real.port());
    let (out, doc) = prove(
        SLOPPY,
        &dir,
        &input,
        &["--allow-http", &allow, "--stub", &stub.url()],
    );
    assert_eq!(out.status.code(), Some(VIOLATIONS), "{doc:#}");
    // Found in every scenario, the clean run first.
    let found = violations(&doc, "effect-outside-claim");
    assert_eq!(found.len(), scenarios(&doc).len(), "{doc:#}");
    let (clean, v) = &found[0];
    assert_eq!(clean["name"], "clean");
    assert!(v["detail"].as_str().unwrap().contains("/notify"), "{v:#}");
    // Nothing else is wrong: an in-effect crash repeats its request, in doubt.
    let kinds: Vec<_> = scenarios(&doc)
        .iter()
        .flat_map(|s| s["violations"].as_array().unwrap())
        .map(|v| v["kind"].as_str().unwrap())
        .filter(|k| *k != "effect-outside-claim")
        .collect();
    assert!(kinds.is_empty(), "{kinds:?}");
    let in_effect = scenarios(&doc)
        .iter()
        .find(|s| s["name"] == "in-effect:2")
        .unwrap();
    assert_eq!(in_effect["duplicates_in_doubt"], 1, "{in_effect:#}");
    // The clean run's requests went to the stub, once each; the real destination saw
    // nothing, and the refused request reached no one.
    assert!(real.seen().is_empty(), "{:?}", real.seen());
    let paths: Vec<String> = stub.seen().iter().map(|s| s.path.clone()).collect();
    assert_eq!(paths, ["/step/0", "/step/1", "/step/2"]);

    // The command reproduces it: the host refuses the request and says why.
    let command = clean["reproduce"].as_str().unwrap();
    let run = reproduce(command);
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(
        stderr(&run).contains("outside any run-once claim"),
        "{}",
        stderr(&run)
    );
    assert!(real.seen().iter().all(|s| s.path != "/notify"));
    assert_eq!(real.seen().len(), 3);
}

#[test]
fn an_output_that_depends_on_the_generation_is_caught() {
    let dir = CliDir::new();
    let input = json!({ "mode": "generation", "items": 3, "log": "/data/sloppy.log" });
    let (out, doc) = prove(
        SLOPPY,
        &dir,
        &input,
        &["--phases", "before-claim", "--steps", "2"],
    );
    assert_eq!(out.status.code(), Some(VIOLATIONS), "{doc:#}");
    assert_eq!(scenarios(&doc).len(), 3);
    let found = violations(&doc, "output-differs");
    assert_eq!(found.len(), 2, "{doc:#}");
    let (scenario, v) = &found[0];
    assert!(
        v["detail"]
            .as_str()
            .unwrap()
            .contains("generation: 0 in the clean run, 1 here"),
        "{v:#}"
    );
    let run = reproduce(scenario["reproduce"].as_str().unwrap());
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(
        stdout(&run).contains(r#""generation":1"#),
        "{}",
        stdout(&run)
    );
}

/// An agent whose effects idem prove cannot see (the bench guest's no-op steps, like
/// README's `mailer`, which only formats a string) passes, and the report says plainly
/// that it observed nothing and what it can observe; one that writes a granted file
/// gets no such line.
#[test]
fn a_proof_that_observed_no_side_effect_says_so() {
    let dir = CliDir::new();
    let input = json!({ "mode": "steps", "n": 3 }).to_string();
    let out = run_cli(&[
        "prove",
        BENCH,
        "--input",
        &input,
        "--phases",
        "after-commit",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("observed no side effect: idem prove sees only HTTP requests")
            && text.contains("--dir grants")
            && text.contains("3 steps"),
        "{text}"
    );
    let (out, doc) = prove(
        BENCH,
        &dir,
        &json!({ "mode": "steps", "n": 3 }),
        &["--phases", "none"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(doc["no_effect_observed"], true, "{doc}");

    let input = json!({ "items": ["a"], "log": "/data/ledger.log" });
    let (out, doc) = prove(LEDGER, &dir, &input, &["--phases", "none"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(doc["no_effect_observed"], false, "{doc}");
}

#[test]
fn bad_flags_are_refused_before_anything_runs() {
    for (flag, value) in [
        ("--phases", "mid-effect"),
        ("--steps", "0"),
        ("--chaos", "x"),
        ("--stub", "127.0.0.1:80"),
    ] {
        let out = run_cli(&["prove", LEDGER, flag, value]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{flag} {value}: {}",
            stderr(&out)
        );
    }
}

#[test]
fn a_spawn_under_an_unstable_key_is_caught() {
    let dir = CliDir::new();
    let input = json!({ "mode": "spawn-unstable", "items": 2, "log": "/data/sloppy.log" });
    let (out, doc) = prove(SLOPPY, &dir, &input, &[]);
    assert_eq!(out.status.code(), Some(VIOLATIONS), "{doc:#}");
    assert_eq!(doc["clean"]["spawns"], json!(["child-0"]), "{doc:#}");
    let found = violations(&doc, "unstable-spawn-key");
    // A crash right after the spawn: the replay spawned a second child.
    let (scenario, v) = found
        .iter()
        .find(|(s, _)| s["name"] == "after-spawn:1")
        .unwrap_or_else(|| panic!("{doc:#}"));
    let detail = v["detail"].as_str().unwrap();
    assert!(detail.contains("2 children here against 1"), "{v:#}");
    assert!(detail.contains("\"child-1\""), "{v:#}");
    assert!(v["hint"].as_str().unwrap().contains("generation"), "{v:#}");
    assert!(
        scenario["reproduce"]
            .as_str()
            .unwrap()
            .ends_with("--crash-at after-spawn:1"),
        "{scenario:#}"
    );
    // A crash before the spawn: the replay spawned under another key than the clean run.
    assert!(
        found.iter().any(|(s, _)| s["name"] == "before-spawn:1"),
        "{doc:#}"
    );
    // The steps themselves are right: nothing but the spawns is wrong.
    let kinds: std::collections::BTreeSet<&str> = scenarios(&doc)
        .iter()
        .flat_map(|s| s["violations"].as_array().unwrap())
        .map(|v| v["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["unstable-spawn-key"].into(), "{doc:#}");
    let log = dir.data().join("sloppy.log");
    assert!(!log.exists(), "the proof wrote to the granted directory");
}

#[test]
fn a_parent_is_crashed_around_its_spawns_and_join_and_says_its_children_were_not_run() {
    let dir = CliDir::new();
    let input = json!({ "deployment": "fetcher", "children": 3, "url": "http://127.0.0.1:9" });
    let (out, doc) = prove(FANOUT, &dir, &input, &[]);
    assert_eq!(out.status.code(), Some(0), "{doc:#}");
    assert_eq!(doc["passed"], true);
    assert_eq!(
        doc["clean"]["spawns"],
        json!(["item-0", "item-1", "item-2"])
    );
    assert_eq!(doc["clean"]["awaits"], "all");
    let note = doc["notes"][0].as_str().unwrap();
    assert!(
        note.starts_with(
            "children not run: the run spawned 3 children and waits for them in join \"all\""
        ),
        "{note}"
    );
    let names: Vec<&str> = scenarios(&doc)
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    for point in [
        "before-spawn:1",
        "after-spawn:1",
        "before-spawn:3",
        "after-spawn:3",
        "before-join:1",
        "after-join:1",
    ] {
        assert!(names.contains(&point), "{point}: {names:?}");
    }
    let reached =
        |name: &str| scenarios(&doc).iter().find(|s| s["name"] == name).unwrap()["reached"].clone();
    assert_eq!(reached("after-spawn:2"), true);
    assert_eq!(reached("before-join:1"), true);
    assert_eq!(
        reached("after-join:1"),
        false,
        "the join never gets its children in a proof"
    );

    // The text report says so too.
    let grant = format!("{}::/data", dir.data().display());
    let scratch = dir.dir.path().join("scratch");
    let out = run_cli(&[
        "prove",
        FANOUT,
        "--input",
        &input.to_string(),
        "--dir",
        &grant,
        "--scratch",
        scratch.to_str().unwrap(),
        "--phases",
        "after-spawn",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("\nchildren not run: "), "{text}");
    assert!(text.contains("\nafter-spawn "), "{text}");
}
