//! A hostile agent meets every limit of the host: the run ends with an error that names
//! the limit (and a hint that names its flag), the host survives, the store stays intact, and the run
//! resumes once the limit allows it. The memory limit sums every linear memory of an
//! instance: a guest with two memories cannot fit twice the limit into them.

use idem_test_artifacts::{HOSTILE, MULTIMEM};
use serde_json::{Value, json};

use crate::util::{CliDir, integrity_ok, read_log, stderr, stdout};

struct Case {
    cli: CliDir,
}

impl Case {
    fn new() -> Case {
        Case { cli: CliDir::new() }
    }

    fn db(&self) -> String {
        self.cli.db()
    }

    /// Runs the hostile agent; returns the exit code and the `--json` document.
    fn run(&self, run_id: &str, input: Value, flags: &[&str]) -> (Option<i32>, Value, String) {
        let mut extra = vec!["--json"];
        extra.extend_from_slice(flags);
        let out = self.cli.run(HOSTILE, run_id, &input.to_string(), &extra);
        let doc = serde_json::from_str(&stdout(&out)).unwrap_or(Value::Null);
        (out.status.code(), doc, stderr(&out))
    }

    fn failed_with(&self, run_id: &str, input: Value, flags: &[&str], expected: &[&str]) -> Value {
        let (code, doc, err) = self.run(run_id, input, flags);
        assert_eq!(code, Some(1), "{doc} {err}");
        assert_eq!(doc["status"], "failed", "{doc}");
        let message = doc["error"].as_str().unwrap_or_default().to_string();
        let hint = doc["hint"].as_str().unwrap_or_default().to_string();
        for part in expected {
            // The run's error names the limit; the CLI's hint names the flag.
            if part.starts_with("--") {
                assert!(
                    hint.contains(part),
                    "expected {part:?} in the hint {hint:?}"
                );
            } else {
                assert!(message.contains(part), "expected {part:?} in {message:?}");
            }
        }
        integrity_ok(std::path::Path::new(&self.db()));
        doc
    }
}

#[test]
fn a_guest_stuck_computing_hits_the_compute_limit_and_resumes_later() {
    let case = Case::new();
    // Half a second or more of computation with no host call, against a 100 ms limit.
    let input = json!({ "mode": "spin", "n": 300_000_000u64 });
    case.failed_with(
        "spin",
        input.clone(),
        &["--max-compute", "100ms"],
        &["compute limit exceeded", "--max-compute"],
    );
    let (code, doc, err) = case.run("spin", input, &["--max-compute", "60s"]);
    assert_eq!(
        code,
        Some(0),
        "the same run resumes and completes with room to compute: {err}"
    );
    assert_eq!(doc["status"], "completed");
}

#[test]
fn fuel_caps_a_run() {
    let case = Case::new();
    let input = json!({ "mode": "spin", "n": 100_000_000u64 });
    case.failed_with(
        "fuel",
        input,
        &["--max-fuel", "1000000"],
        &["fuel limit exceeded", "1000000", "--max-fuel"],
    );
}

#[test]
fn memory_and_stack_and_panics_are_agent_errors() {
    let case = Case::new();
    case.failed_with(
        "alloc",
        json!({ "mode": "alloc" }),
        &["--max-memory", "32MiB"],
        &["memory limit exceeded", "33554432", "--max-memory"],
    );
    case.failed_with(
        "recurse",
        json!({ "mode": "recurse" }),
        &[],
        &["agent trapped", "stack overflow"],
    );
    case.failed_with(
        "panic",
        json!({ "mode": "panic" }),
        &[],
        &["agent trapped", "unreachable"],
    );
    // The host survived all of it: a well-behaved run on the same store completes.
    let (code, doc, err) = case.run("fine", json!({ "mode": "spin", "n": 10 }), &[]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(doc["status"], "completed");
}

#[test]
fn oversized_payloads_and_bad_keys_are_errors_returned_to_the_guest() {
    let case = Case::new();
    case.failed_with(
        "big-result",
        json!({ "mode": "big-result", "n": 2_000_000 }),
        &["--max-result-bytes", "1MiB"],
        &["too large", "over the limit of 1048576 bytes"],
    );
    // Released, not committed: with a larger limit the same run commits it.
    let (code, doc, err) = case.run(
        "big-result",
        json!({ "mode": "big-result", "n": 2_000_000 }),
        &["--max-result-bytes", "4MiB"],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(doc["output"], "2000000 bytes");

    case.failed_with(
        "big-state",
        json!({ "mode": "big-state", "n": 4096 }),
        &["--max-state-bytes", "1KiB"],
        &[
            "too large",
            "progress state is 4098 bytes, over the limit of 1024 bytes",
        ],
    );
    case.failed_with(
        "long-key",
        json!({ "mode": "long-key", "n": 600 }),
        &[],
        &["invalid key", "600 bytes, over the limit of 512 bytes"],
    );
    let (code, _, err) = case.run(
        "long-key-ok",
        json!({ "mode": "long-key", "n": 600 }),
        &["--max-key-bytes", "1KiB"],
    );
    assert_eq!(code, Some(0), "{err}");
}

#[test]
fn a_side_effect_past_its_time_limit_is_not_committed() {
    let case = Case::new();
    let input = json!({ "mode": "slow-effect", "n": 300_000_000u64, "log": "/data/log.txt" });
    case.failed_with(
        "slow",
        input.clone(),
        &["--effect-timeout", "100ms"],
        &["side-effect time limit exceeded", "--effect-timeout"],
    );
    assert!(
        read_log(&case.cli.data().join("log.txt")).is_empty(),
        "the effect never finished"
    );
    // Given time, the run resumes: the abandoned claim is retaken, in doubt.
    let (code, doc, err) = case.run("slow", input, &[]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(doc["counts"]["reclaimed"], 1);
    let lines = read_log(&case.cli.data().join("log.txt"));
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0].attempt(), 2);
}

#[test]
fn a_key_reused_with_other_input_is_refused_by_name() {
    let case = Case::new();
    let (code, doc, err) = case.run("first", json!({ "mode": "bound-key", "n": 1 }), &[]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(doc["output"], "1");
    // The same key and input in another run: the committed result, not executed again.
    let (code, doc, err) = case.run("same", json!({ "mode": "bound-key", "n": 1 }), &[]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        (doc["counts"]["skipped"].as_u64(), doc["output"].as_str()),
        (Some(1), Some("1"))
    );
    // The same key with other input: refused, naming the key; the result is untouched.
    case.failed_with(
        "other",
        json!({ "mode": "bound-key", "n": 2 }),
        &[],
        &["key reused with other input", "\"bound\""],
    );
    let (_, doc, _) = case.run("again", json!({ "mode": "bound-key", "n": 1 }), &[]);
    assert_eq!(doc["output"], "1");
}

/// `multimem` has two memories (the engine takes multi-memory components, wasmtime's
/// default): 10 MiB in each fits a 16 MiB limit one memory at a time, not together.
/// The run fails on the second memory's growth, naming both memories' bytes
/// (161 + 161 pages: each starts with one), and succeeds once the limit holds the sum.
#[test]
fn the_memory_limit_sums_every_memory_of_the_instance() {
    let case = Case::new();
    let run = |run_id: &str, input: &str, limit: &str| {
        let out = case
            .cli
            .run(MULTIMEM, run_id, input, &["--json", "--max-memory", limit]);
        let doc: Value = serde_json::from_str(&stdout(&out)).unwrap_or(Value::Null);
        (out.status.code(), doc, stderr(&out))
    };
    let over = "memory limit exceeded: the agent's linear memory and host resources would \
                take 21102592 bytes, over the limit of 16777216 bytes";

    // Each memory alone fits: the exported one, then the hidden one.
    for (run_id, input) in [("abi-only", "[10,0]"), ("hoard-only", "[0,10]")] {
        let (code, doc, err) = run(run_id, input, "16MiB");
        assert_eq!(code, Some(0), "{doc} {err}");
        assert_eq!(doc["output"], serde_json::from_str::<Value>(input).unwrap());
    }
    // Both together do not: the point of the test.
    let (code, doc, err) = run("both", "[10,10]", "16MiB");
    assert_eq!(
        (code, doc["status"].as_str()),
        (Some(1), Some("failed")),
        "{err}"
    );
    assert_eq!(doc["error"], over);
    assert!(
        doc["hint"].as_str().unwrap().contains("--max-memory"),
        "{doc}"
    );
    // The hidden memory alone past the limit.
    let (code, doc, err) = run("hoard", "[0,20]", "16MiB");
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(doc["error"], over);
    // A limit that holds the sum lets the same run resume and complete.
    let (code, doc, err) = run("both", "[10,10]", "32MiB");
    assert_eq!(code, Some(0), "{doc} {err}");
    assert_eq!(doc["status"], "completed");
    assert_eq!(doc["output"], json!([10, 10]));
    integrity_ok(std::path::Path::new(&case.db()));
}
