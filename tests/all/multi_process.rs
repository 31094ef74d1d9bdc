//! Several `idem` processes on one SQLite store, running overlapping runs that share
//! keys: each key executes once in total, the rest skip or await, and SQLITE_BUSY never
//! reaches the user.

use std::process::{Command, Stdio};

use idem_test_artifacts::STEPS;
use serde_json::{Value, json};

use crate::util::{integrity_ok, key_counts, read_log};

const PROCESSES: usize = 4;
const KEYS: u64 = 200;

#[test]
fn four_processes_share_200_keys() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let db = dir.path().join("idem.db");
    let grant = format!("{}::/data", data.display());
    let input = json!({ "steps": KEYS, "log": "/data/log.txt", "shared": true }).to_string();

    let children: Vec<_> = (0..PROCESSES)
        .map(|p| {
            Command::new(env!("CARGO_BIN_EXE_idem"))
                .args(["run", STEPS, "--db", db.to_str().unwrap(), "--dir", &grant])
                .args([
                    "--input",
                    &input,
                    "--run-id",
                    &format!("proc-{p}"),
                    "--json",
                ])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let docs: Vec<Value> = children
        .into_iter()
        .map(|child| {
            let out = child.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{err}");
            assert!(!err.contains("locked") && !err.contains("busy"), "{err}");
            serde_json::from_slice(&out.stdout).unwrap()
        })
        .collect();

    let count = |doc: &Value, what: &str| doc["counts"][what].as_u64().unwrap();
    let executed: u64 = docs.iter().map(|d| count(d, "executed")).sum();
    assert_eq!(executed, KEYS, "each key executed once over all processes");
    for doc in &docs {
        assert_eq!(doc["status"], "completed");
        assert_eq!(count(doc, "reclaimed"), 0);
        assert_eq!(
            count(doc, "executed") + count(doc, "skipped") + count(doc, "awaited"),
            KEYS
        );
    }
    assert!(docs.windows(2).all(|w| w[0]["output"] == w[1]["output"]));
    let lines = read_log(&data.join("log.txt"));
    assert_eq!(lines.len(), KEYS as usize);
    assert!(key_counts(&lines).values().all(|&c| c == 1));
    integrity_ok(&db);
}
