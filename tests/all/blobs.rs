//! Large values through real processes: a run whose every checkpoint carries 20 MiB of
//! history is SIGKILLed after some steps and resumed by a new process, on SQLite and
//! PostgreSQL. Each step's effect lands once (counted in the agent's log file); the
//! resumed run finds the history its last checkpoint saved (the agent checks it, byte
//! for byte); the run's rows hold only references, each checkpoint one blob.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use idem_test_artifacts::STEPS;
use serde_json::Value;

use crate::postgres::{Schema, count};
use crate::util::{raw_db, stderr, stdout};

const STEPS_N: u64 = 5;
const BALLAST: usize = 20 << 20;

fn input(log: &str) -> String {
    serde_json::json!({
        "steps": STEPS_N, "log": log, "ballast": BALLAST, "pause_ms": 100,
    })
    .to_string()
}

fn start(db: &str, input: &str, data: &std::path::Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args([
            "run", STEPS, "--db", db, "--run-id", "big", "--input", input,
        ])
        .args(["--json", "--dir", &format!("{}::/data", data.display())])
        .env("IDEM_LOG", "error")
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn lines(log: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Kills the run once two steps' effects landed (so at least one 20 MiB checkpoint
/// is in the store), resumes it in a new process, and checks what the log saw.
fn killed_and_resumed(db: &str, data: &std::path::Path) {
    let input = input("/data/log.txt");
    let log = &data.join("log.txt");
    let mut child = start(db, &input, data);
    let deadline = Instant::now() + Duration::from_secs(120);
    while lines(log).len() < 2 {
        assert!(Instant::now() < deadline, "no two steps in 120 s");
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the run ended before it was killed: {status}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let before = lines(log).len();
    assert!(before < STEPS_N as usize + 1, "killed too late to matter");

    let out = start(db, &input, data).wait_with_output().unwrap();
    assert!(out.status.success(), "resume failed: {}", stderr(&out));
    let doc: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(doc["status"], "completed", "{doc}");
    assert_eq!(doc["output"]["steps"], STEPS_N, "{doc}");

    // Each step's effect once; a repeat only in doubt, under the same key.
    let log = lines(log);
    let mut keys: Vec<&str> = Vec::new();
    for line in &log {
        let key = line.split(' ').next().unwrap();
        if keys.contains(&key) {
            assert!(
                line.contains("in_doubt=true"),
                "a repeat not in doubt: {log:?}"
            );
        } else {
            assert!(line.contains("attempt=1 "), "{log:?}");
            keys.push(key);
        }
    }
    assert_eq!(keys.len(), STEPS_N as usize, "{log:?}");
}

#[test]
fn a_20_mib_checkpoint_survives_sigkill_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("idem.db");
    // Not the store's directory: the agent may not be granted the store's files.
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    killed_and_resumed(db.to_str().unwrap(), &data);
    let conn = raw_db(&db);
    let q = |sql: &str| -> i64 { conn.query_row(sql, [], |r| r.get(0)).unwrap() };
    // The run's row keeps a reference; the history is in blobs, 20 MiB or more each.
    assert_eq!(
        q("SELECT count(*) FROM progress WHERE run_id = 'big' AND length(state) = 36"),
        1
    );
    assert!(q("SELECT count(*) FROM blobs") >= 1);
    assert_eq!(
        q(&format!(
            "SELECT count(*) FROM blobs WHERE size < {BALLAST} OR size > 2 * {BALLAST}"
        )),
        0
    );
    assert_eq!(q("SELECT max(length(state)) FROM progress"), 36);
}

#[test]
fn a_20_mib_checkpoint_survives_sigkill_on_postgres() {
    let Some(schema) = Schema::create("a_20_mib_checkpoint_survives_sigkill_on_postgres") else {
        return;
    };
    let url = schema.url();
    let dir = tempfile::tempdir().unwrap();
    killed_and_resumed(&url, dir.path());
    let q = |sql: &str| count(&url, sql);
    assert_eq!(
        q("SELECT count(*) FROM progress WHERE run_id = 'big' AND length(state) = 36"),
        1
    );
    assert!(q("SELECT count(*) FROM blobs") >= 1);
    assert_eq!(
        q(&format!(
            "SELECT count(*) FROM blobs WHERE size < {BALLAST} OR size > 2 * {BALLAST}"
        )),
        0
    );
}
