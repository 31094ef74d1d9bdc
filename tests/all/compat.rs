//! Components built by earlier SDKs (`tests/compat/`) still run on this host, exactly
//! once: the WIT only grows, and an import of an earlier `idem:agent` version is served
//! by this one.

use crate::util::{key_counts, read_log, run_cli, stderr, stdout};

/// The ledger example as the 0.1.0 SDK built it.
const LEDGER_0_1_0: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/compat/ledger-sdk-0.1.0.wasm"
);

#[test]
fn a_ledger_built_by_the_0_1_0_sdk_runs_each_key_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("idem.db");
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let items: Vec<String> = (0..6).map(|i| format!("item-{i}")).collect();
    let input = serde_json::json!({ "items": items, "log": "/data/ledger.log" }).to_string();
    let grant = format!("{}::/data", data.display());
    let out = run_cli(&[
        "run",
        LEDGER_0_1_0,
        "--db",
        db.to_str().unwrap(),
        "--dir",
        &grant,
        "--input",
        &input,
        "--recycle-every",
        "2",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(doc["status"], "completed");
    assert_eq!(doc["counts"]["executed"], 6);
    assert_eq!(doc["output"]["processed"], 6);
    let lines = read_log(&data.join("ledger.log"));
    assert_eq!(lines.len(), 6);
    assert!(key_counts(&lines).values().all(|&c| c == 1));
}
