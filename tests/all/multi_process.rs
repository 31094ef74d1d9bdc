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

/// Two `idem run` of one run at once: the first runs the agent's first step and waits
/// for a signal, the second joins it in the wait, and whichever wakes first finishes
/// the run. Each used to report the run's counts as its own, so the two reports
/// counted every step twice; each now says what it did, and the run's totals apart.
#[test]
fn two_processes_of_one_run_each_report_their_own_counts() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let db = dir.path().join("idem.db");
    let db = db.to_str().unwrap();
    let grant = format!("{}::/data", data.display());
    let input = json!({ "log": "/data/w.log", "waits": [{ "signal": "go" }] }).to_string();
    let spawn = |json: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_idem"));
        cmd.args([
            "run",
            idem_test_artifacts::WAITER,
            "--db",
            db,
            "--dir",
            &grant,
        ])
        .args(["--input", &input, "--run-id", "shared"])
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        if json {
            cmd.arg("--json");
        }
        cmd.spawn().unwrap()
    };

    let first = spawn(false);
    let log = data.join("w.log");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !std::fs::read_to_string(&log).is_ok_and(|l| l.contains("start")) {
        assert!(
            std::time::Instant::now() < deadline,
            "the first step never ran"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let second = spawn(true);
    // Time for the second to reach the wait; if it comes later it finds the run done,
    // and its report must still add up.
    std::thread::sleep(std::time::Duration::from_secs(2));
    let sent = crate::util::run_cli(&["signal", "shared", "go", "--db", db]);
    assert!(sent.status.success(), "{}", crate::util::stderr(&sent));

    let [first, second] = [first, second].map(|child| {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", crate::util::stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    });
    let doc: Value = serde_json::from_str(&second).unwrap();
    assert_eq!(doc["status"], "completed");
    let totals = json!({
        "executed": 2, "skipped": 1, "awaited": 0, "reclaimed": 0, "instances": 2, "recycled": 0
    });
    assert_eq!(doc["counts"], totals, "the run's totals: {doc}");
    assert_eq!(
        doc["instances_now"], doc["counts_now"]["instances"],
        "{doc}"
    );

    // The first did the first step at least, so it prints its own counts and then the
    // totals, each labelled; or, if it also did the rest, the one line both are.
    let total_line = "executed 2  skipped 1  awaited 0  reclaimed 0  instances 2";
    let first_counts = if first.contains("this process: ") {
        assert!(
            first.contains(&format!("run totals: {total_line}")),
            "{first}"
        );
        let mine = first
            .lines()
            .find_map(|l| l.strip_prefix("this process: "))
            .unwrap();
        let words: Vec<&str> = mine.split_whitespace().collect();
        let pairs = words
            .chunks(2)
            .map(|w| (w[0], w[1].parse::<u64>().unwrap()));
        pairs.collect::<std::collections::BTreeMap<_, _>>()
    } else {
        assert!(first.lines().any(|l| l == total_line), "{first}");
        [("executed", 2), ("skipped", 1), ("instances", 2)].into()
    };
    assert!(first_counts["executed"] >= 1, "{first}");
    for what in ["executed", "skipped", "instances"] {
        let second = doc["counts_now"][what].as_u64().unwrap();
        assert_eq!(
            first_counts[what] + second,
            totals[what],
            "{what}: the two reports add up to the run's\n{first}\n{doc}"
        );
    }
}
