//! `idem gc` through the binary: a dry run counts and deletes nothing, gc deletes a
//! finished run with exactly its rows, and a run reusing the deleted keys runs their
//! steps again under greater tokens.

use std::path::Path;

use idem_test_artifacts::LEDGER;

use crate::util::{CliDir, raw_db, read_log, run_cli, stderr, stdout};

fn rows(db: &Path, table: &str) -> i64 {
    raw_db(db)
        .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
        .unwrap()
}

const TABLES: &[&str] = &[
    "runs",
    "run_inputs",
    "run_outcomes",
    "progress",
    "steps",
    "run_logs",
];

fn all_rows(db: &Path) -> Vec<i64> {
    TABLES.iter().map(|t| rows(db, t)).collect()
}

fn gc(db: &str, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["gc", "--db", db, "--json"];
    args.extend_from_slice(extra);
    let out = run_cli(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_str(&stdout(&out)).unwrap()
}

/// The report's counts, without the cut-off times (they move with the clock).
fn counts(answer: &serde_json::Value) -> serde_json::Value {
    let mut report = answer["report"].clone();
    let fields = report.as_object_mut().unwrap();
    fields.remove("runs_before").unwrap();
    fields.remove("keys_before").unwrap();
    report
}

#[test]
fn gc_deletes_a_finished_run_and_its_keys_run_again_under_greater_tokens() {
    let dir = CliDir::new();
    let db = dir.db();
    let items: Vec<String> = (0..5).map(|i| format!("item-{i}")).collect();
    let input = serde_json::json!({ "items": items, "log": "/data/ledger.log" }).to_string();
    let out = dir.run(LEDGER, "ledger-1", &input, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let first = read_log(&dir.data().join("ledger.log"));
    assert_eq!(first.len(), 5);
    let db_path = Path::new(&db);
    let before = all_rows(db_path);
    assert_eq!(before[0], 1);
    assert_eq!(before[4], 5, "one committed row per item");

    // Finished a moment ago: the default (30 days) keeps it.
    let kept = gc(&db, &[]);
    assert_eq!(kept["report"]["runs"], 0);
    assert_eq!(all_rows(db_path), before);

    let now = ["--finished-before", "0s", "--dedupe-window", "0s"];
    let dry = gc(&db, &[&now[..], &["--dry-run"]].concat());
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["report"]["runs"], 1);
    assert_eq!(dry["report"]["results"], 5);
    assert_eq!(all_rows(db_path), before, "a dry run deletes nothing");

    let done = gc(&db, &now);
    assert_eq!(done["dry_run"], false);
    assert_eq!(
        counts(&done),
        counts(&dry),
        "a dry run counts what gc then deletes"
    );
    let report = &done["report"];
    let gone = [
        report["runs"].as_i64().unwrap(),
        report["runs"].as_i64().unwrap(),
        report["runs"].as_i64().unwrap(),
        report["checkpoints"].as_i64().unwrap(),
        report["results"].as_i64().unwrap() + report["claims"].as_i64().unwrap(),
        report["log_chunks"].as_i64().unwrap(),
    ];
    let expected: Vec<i64> = before.iter().zip(gone).map(|(b, g)| b - g).collect();
    assert_eq!(all_rows(db_path), expected);
    assert_eq!(rows(db_path, "runs"), 0);
    assert_eq!(rows(db_path, "steps"), 0);

    // The same run again: its keys' results are gone, so their steps run again, each
    // under a token greater than the one it had before gc.
    let out = dir.run(LEDGER, "ledger-1", &input, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let all = read_log(&dir.data().join("ledger.log"));
    assert_eq!(all.len(), 10);
    for old in &first {
        let new = all[5..].iter().find(|l| l.key == old.key).unwrap();
        assert!(
            new.token() > old.token(),
            "{}: token {} after gc, {} before",
            old.key,
            new.token(),
            old.token()
        );
    }

    // A length of time without a unit is refused before anything is touched.
    let bad = run_cli(&["gc", "--db", &db, "--finished-before", "7"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).contains("not a length of time"),
        "{}",
        stderr(&bad)
    );
    assert_eq!(rows(db_path, "runs"), 1);
}
