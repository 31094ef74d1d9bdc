//! `idem fork` on SQLite and PostgreSQL, through the real binary and a real worker: a
//! five-step run forked at step 3 runs steps 3 to 5 again under the fork's own keys
//! and reuses steps 1 and 2, counted in the agents' log files. Two agents: `steps`
//! checkpoints every step (the fork starts from step 2's checkpoint and never asks for
//! steps 1 and 2), `release` saves none and replays from the start (the fork finds
//! steps 1 and 2 committed, copied from the original, and runs neither again). Bad
//! forks are refused with exit 2, creating nothing, and so is a fork of a run whose
//! history `idem gc --history-before` collected.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use idem_test_artifacts::{RELEASE, STEPS};

use crate::util::{key_counts, read_log, run_cli, stderr, stdout};

fn json(out: &std::process::Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", stderr(out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(out)))
}

fn worker(db: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["worker", "--db", db, "--poll", "20ms"])
        .env("IDEM_LOG", "error")
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Waits until run `run_id` completed; its output.
fn completed(db: &str, run_id: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let shown = json(&run_cli(&["show", run_id, "--db", db, "--json"]));
        match shown["run"]["status"].as_str() {
            Some("completed") => return shown["outcome"].clone(),
            Some("queued" | "running") => {}
            other => panic!("{run_id} ended {other:?}: {shown}"),
        }
        assert!(Instant::now() < deadline, "{run_id} not done in 90 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs agent `file` to completion in the foreground as `run_id`.
fn run(db: &str, file: &str, run_id: &str, input: &str, data: &Path) {
    let grant = format!("{}::/data", data.display());
    let out = run_cli(&[
        "run", file, "--db", db, "--run-id", run_id, "--input", input, "--dir", &grant,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// The keys a log holds, each with how often, of lines whose key starts with `prefix`.
fn keys_of(log: &Path, prefix: &str) -> Vec<(String, usize)> {
    key_counts(&read_log(log))
        .into_iter()
        .filter(|(key, _)| key.starts_with(prefix))
        .collect()
}

fn forks_one_agent(db: &str, file: &str, input: &str, log: &Path, data: &Path) {
    run(db, file, "orig", input, data);
    let original = keys_of(log, "orig/");
    assert_eq!(original.len(), 5, "{original:?}");
    assert!(original.iter().all(|(_, n)| *n == 1), "{original:?}");

    let shown = json(&run_cli(&["show", "orig", "--db", db, "--steps", "--json"]));
    let steps = shown["history"]["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 5, "{shown}");
    assert_eq!(steps[2]["n"], 3);

    let forked = json(&run_cli(&[
        "fork", "orig", "--at", "3", "--run-id", "f1", "--db", db, "--json",
    ]));
    assert_eq!(forked["reused"], 2, "{forked}");
    assert_eq!(forked["status"], "queued");
    let mut worker = worker(db);
    let output = completed(db, "f1");
    worker.kill().unwrap();
    worker.wait().unwrap();
    assert_eq!(
        output,
        completed(db, "orig"),
        "the fork ends as the original did"
    );

    // Steps 3 to 5 ran once more each, under the fork's keys (its run id in them, the
    // same content); steps 1 and 2 did not run again; the original's keys ran once.
    let fork_keys = keys_of(log, "f1/");
    let expected: Vec<(String, usize)> = original[..]
        .iter()
        .map(|(key, _)| (key.replacen("orig/", "f1/", 1), 1))
        .collect();
    let later: Vec<&(String, usize)> = expected
        .iter()
        .filter(|(key, _)| fork_keys.iter().any(|(k, _)| k == key))
        .collect();
    assert_eq!(fork_keys.len(), 3, "{fork_keys:?}");
    assert_eq!(
        later.len(),
        3,
        "the fork's keys are the original's, renamed"
    );
    assert!(fork_keys.iter().all(|(_, n)| *n == 1), "{fork_keys:?}");
    assert_eq!(keys_of(log, "orig/"), original);
    assert_eq!(read_log(log).len(), 8);
    // The fork's history: two steps copied, three of its own.
    let shown = json(&run_cli(&["show", "f1", "--db", db, "--steps", "--json"]));
    assert_eq!(shown["history"]["steps"].as_array().unwrap().len(), 5);
    assert_eq!(
        shown["history"]["forked_from"],
        serde_json::json!(["orig", 3])
    );
}

fn bad_forks_change_nothing(db: &str) {
    // The ids of the runs the store holds, however `ls --json` nests them.
    let listed = || {
        let mut ids: Vec<String> = Vec::new();
        let mut stack = vec![json(&run_cli(&["ls", "--db", db, "--json"]))];
        while let Some(value) = stack.pop() {
            match value {
                serde_json::Value::Array(items) => stack.extend(items),
                serde_json::Value::Object(fields) => {
                    if let Some(serde_json::Value::String(id)) = fields.get("run_id") {
                        ids.push(id.clone());
                    }
                    stack.extend(fields.into_iter().map(|(_, v)| v));
                }
                _ => {}
            }
        }
        ids.sort();
        ids
    };
    let before = listed();
    for (args, says) in [
        (&["--at", "6"][..], "committed 5 steps"),
        (&["--at", "0"][..], "numbered from 1"),
        (&["--at", "2", "--run-id", "f1"][..], "exists"),
        (&["--at", "2", "--version", "9"][..], "no version 9"),
        (&["--at", "2", "--input", "{nope"][..], "not valid JSON"),
        (&["--at", "2", "--run-id", "a/b"][..], "'/'"),
    ] {
        let mut all = vec!["fork", "orig", "--db", db];
        all.extend_from_slice(args);
        let out = run_cli(&all);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }
    let out = run_cli(&["fork", "nobody", "--at", "1", "--db", db]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(listed(), before);

    // Once gc took the finished run's history, its forks are refused; the run stays.
    let out = run_cli(&["gc", "--db", db, "--history-before", "0s", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        report["report"]["checkpoints"].as_u64().unwrap() >= 4,
        "{report}"
    );
    let out = run_cli(&["fork", "orig", "--at", "3", "--db", db]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("collected"), "{}", stderr(&out));
    assert_eq!(listed(), before);
}

fn forks_on(db: &str) {
    let data = tempfile::tempdir().unwrap();
    let steps_input = r#"{"steps": 5, "log": "/data/steps.log"}"#;
    forks_one_agent(
        db,
        STEPS,
        steps_input,
        &data.path().join("steps.log"),
        data.path(),
    );
    bad_forks_change_nothing(db);
}

fn forks_replaying(db: &str) {
    let data = tempfile::tempdir().unwrap();
    let input = r#"{"items": 5, "log": "/data/release.log"}"#;
    forks_one_agent(
        db,
        RELEASE,
        input,
        &data.path().join("release.log"),
        data.path(),
    );
}

#[test]
fn a_fork_runs_the_later_steps_under_its_own_keys_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    forks_on(dir.path().join("idem.db").to_str().unwrap());
    let dir = tempfile::tempdir().unwrap();
    forks_replaying(dir.path().join("idem.db").to_str().unwrap());
}

#[test]
fn a_fork_runs_the_later_steps_under_its_own_keys_on_postgres() {
    let Some(schema) = crate::postgres::Schema::create("fork") else {
        return;
    };
    forks_on(&schema.url());
    let Some(schema) = crate::postgres::Schema::create("fork, replaying") else {
        return;
    };
    forks_replaying(&schema.url());
}
