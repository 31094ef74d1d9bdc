//! Large values through real processes: a run whose every checkpoint carries 20 MiB of
//! history is SIGKILLed after some steps and resumed by a new process, on SQLite and
//! PostgreSQL. Each step's effect lands once (counted in the agent's log file); the
//! resumed run finds the history its last checkpoint saved (the agent checks it, byte
//! for byte); the run's rows hold only references, each checkpoint one blob. Then the
//! real `idem gc` collects the blobs of the checkpoints the last one replaced, once
//! they went unused for its age, and keeps the one the run still refers to.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use idem::store::HISTORY_KEEP_LARGE;
use idem_test_artifacts::STEPS;
use serde_json::Value;

use crate::postgres::{Schema, count};
use crate::util::{raw_db, run_cli, stderr, stdout};

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

/// The blobs `idem gc` deleted (`extra`: more flags).
fn gc(db: &str, extra: &[&str]) -> i64 {
    let mut args = vec!["gc", "--db", db, "--finished-before", "1h", "--json"];
    args.extend_from_slice(extra);
    let out = run_cli(&args);
    assert!(out.status.success(), "gc failed: {}", stderr(&out));
    let doc: Value = serde_json::from_str(&stdout(&out)).unwrap();
    doc["report"]["blobs"].as_i64().unwrap()
}

/// `idem gc --finished-before 1h` beside the run that just finished: a blob used within
/// that hour is kept; once the blobs are older (their `used_at` moved back two hours in
/// the store, as two hours passing would), it takes every blob but those the run's
/// history keeps (its last few large checkpoints), then, with `--history-before 0s`,
/// every blob but the one its last checkpoint refers to; the run (finished within the
/// hour in the store's eyes) stays readable.
fn superseded_blobs_are_collected(db: &str, q: &dyn Fn(&str) -> i64, age_blobs: &dyn Fn()) {
    let written = q("SELECT count(*) FROM blobs");
    assert!(
        written >= 2,
        "each checkpoint makes its own blob: {written}"
    );
    assert_eq!(gc(db, &[]), 0, "a blob within the grace is kept");
    assert_eq!(q("SELECT count(*) FROM blobs"), written);
    age_blobs();
    let kept = written.min(HISTORY_KEEP_LARGE as i64);
    assert_eq!(gc(db, &[]), written - kept);
    assert_eq!(q("SELECT count(*) FROM blobs"), kept);
    assert_eq!(gc(db, &["--history-before", "0s"]), kept - 1);
    assert_eq!(q("SELECT count(*) FROM blobs"), 1);
    assert_eq!(q("SELECT count(*) FROM blob_bytes"), 1);
    let out = run_cli(&["show", "big", "--db", db, "--json"]);
    assert!(out.status.success(), "show failed: {}", stderr(&out));
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
    // The run's rows keep references; the history is in blobs, 20 MiB or more each.
    assert_eq!(
        q("SELECT count(*) FROM progress WHERE run_id = 'big' AND length(state) = 36"),
        STEPS_N.min(HISTORY_KEEP_LARGE) as i64,
        "the history keeps the last few large checkpoints, each a reference"
    );
    assert!(q("SELECT count(*) FROM blobs") >= 1);
    assert_eq!(
        q(&format!(
            "SELECT count(*) FROM blobs WHERE size < {BALLAST} OR size > 2 * {BALLAST}"
        )),
        0
    );
    assert_eq!(q("SELECT max(length(state)) FROM progress"), 36);
    superseded_blobs_are_collected(db.to_str().unwrap(), &q, &|| {
        rusqlite::Connection::open(&db)
            .unwrap()
            .execute("UPDATE blobs SET used_at = used_at - 7200000", [])
            .unwrap();
    });
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
        STEPS_N.min(HISTORY_KEEP_LARGE) as i64,
        "the history keeps the last few large checkpoints, each a reference"
    );
    assert!(q("SELECT count(*) FROM blobs") >= 1);
    assert_eq!(
        q(&format!(
            "SELECT count(*) FROM blobs WHERE size < {BALLAST} OR size > 2 * {BALLAST}"
        )),
        0
    );
    superseded_blobs_are_collected(&url, &q, &|| {
        crate::postgres::sql(&url, "UPDATE blobs SET used_at = used_at - 7200000");
    });
}
