//! A rogue agent tries to get around the host's limits and claims through the real
//! `idem` binary: blocking in WASI, holding claims past its return, streaming a side
//! effect after its commit, hoarding host resources, handing odd values. Each attempt
//! ends in a clear error (or a value the agent gets), never a hang, a panic or a store
//! fault, and nothing committed is lost.

use std::io::Read;
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use idem_test_artifacts::ROGUE;
use serde_json::{Value, json};

use crate::util::{CliDir, integrity_ok, run_cli, stderr, stdout};

/// Runs the rogue agent in `mode` with `--json`; returns the exit code and document.
fn rogue(cli: &CliDir, run_id: &str, input: Value, flags: &[&str]) -> (Option<i32>, Value, String) {
    let mut extra = vec!["--json"];
    extra.extend_from_slice(flags);
    let out = cli.run(ROGUE, run_id, &input.to_string(), &extra);
    let doc = serde_json::from_str(&stdout(&out)).unwrap_or(Value::Null);
    (out.status.code(), doc, stderr(&out))
}

fn error_of(doc: &Value) -> String {
    doc["error"].as_str().unwrap_or_default().to_string()
}

#[test]
fn a_guest_blocked_in_wasi_outside_a_claim_hits_the_compute_limit() {
    let cli = CliDir::new();
    // A minute's sleep against a half-second limit: before the watchdog, the run
    // simply slept the minute.
    let (code, doc, err) = rogue(
        &cli,
        "sleeper",
        json!({ "mode": "sleep", "n": 60_000 }),
        &["--max-compute", "500ms"],
    );
    assert_eq!(code, Some(1), "{doc} {err}");
    assert!(error_of(&doc).contains("compute limit exceeded"), "{doc}");
    assert!(
        doc["hint"]
            .as_str()
            .unwrap_or_default()
            .contains("--max-compute")
    );
    integrity_ok(std::path::Path::new(&cli.db()));
}

#[test]
fn a_guest_blocked_in_wasi_inside_a_side_effect_hits_the_effect_limit() {
    let cli = CliDir::new();
    let (code, doc, err) = rogue(
        &cli,
        "slow-effect",
        json!({ "mode": "sleep-in-effect", "n": 60_000 }),
        &["--effect-timeout", "500ms"],
    );
    assert_eq!(code, Some(1), "{doc} {err}");
    assert!(
        error_of(&doc).contains("side-effect time limit exceeded"),
        "{doc}"
    );
    // Nothing was committed for the abandoned effect: its claim waits, in doubt.
    let status = run_cli(&["status", "--db", &cli.db(), "--json"]);
    let status: Value = serde_json::from_str(&stdout(&status)).unwrap();
    assert_eq!(
        status["open_claims"].as_array().unwrap().len(),
        1,
        "{status}"
    );
}

#[test]
fn every_claim_held_at_once_is_timed_not_just_the_first() {
    let cli = CliDir::new();
    // Claims a and b; a is committed, b is held through a minute's sleep.
    let (code, doc, err) = rogue(
        &cli,
        "two",
        json!({ "mode": "two-claims", "n": 60_000 }),
        &["--effect-timeout", "500ms"],
    );
    assert_eq!(code, Some(1), "{doc} {err}");
    let error = error_of(&doc);
    assert!(
        error.contains("side-effect time limit exceeded") && error.contains("\"b\""),
        "{doc}"
    );
}

#[test]
fn a_run_that_returns_holding_a_claim_fails_and_leaves_it_in_doubt() {
    let cli = CliDir::new();
    let (code, doc, err) = rogue(&cli, "holder", json!({ "mode": "return-holding" }), &[]);
    assert_eq!(code, Some(1), "{doc} {err}");
    assert_eq!(doc["status"], "failed");
    let error = error_of(&doc);
    assert!(
        error.contains("holding claims") && error.contains("\"held\""),
        "{doc}"
    );
    // The claim is not left to its lease: ended at once, so the next holder retakes
    // it (in doubt) without waiting.
    let status = run_cli(&["status", "--db", &cli.db(), "--json"]);
    let status: Value = serde_json::from_str(&stdout(&status)).unwrap();
    let claims = status["open_claims"].as_array().unwrap();
    assert_eq!(claims.len(), 1, "{status}");
    assert_eq!(claims[0]["key"], "rogue:held");
    let expires = claims[0]["lease_expires"].as_i64().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!(expires <= now, "the lease was ended, not left running");
}

#[test]
fn running_a_key_this_instance_holds_fails_at_once() {
    let cli = CliDir::new();
    // With a 60 s await timeout: before, the second run-once waited it out and then
    // failed with await-timeout.
    let (code, doc, err) = rogue(
        &cli,
        "rerun",
        json!({ "mode": "rerun-held" }),
        &["--await-timeout", "60s"],
    );
    assert_eq!(code, Some(0), "{doc} {err}");
    let output = doc["output"].as_str().unwrap();
    assert!(
        output.contains("InvalidKey") && output.contains("already claimed by this instance"),
        "{output}"
    );
}

#[test]
fn odd_values_are_errors_for_the_agent_not_store_faults() {
    let cli = CliDir::new();
    let (code, doc, err) = rogue(&cli, "huge-step", json!({ "mode": "huge-step" }), &[]);
    assert_eq!(code, Some(0), "{doc} {err}");
    let output = doc["output"].as_str().unwrap();
    assert!(
        output.contains("too large") && output.contains("largest step"),
        "the agent got a value: {output}"
    );
    // The output limit: a run cannot store an unbounded output.
    let (code, doc, _) = rogue(
        &cli,
        "big-output",
        json!({ "mode": "big-output", "n": 2_000_000 }),
        &["--max-output-bytes", "1MiB"],
    );
    assert_eq!(code, Some(1), "{doc}");
    assert!(error_of(&doc).contains("output limit exceeded"), "{doc}");
    assert!(doc["hint"].as_str().unwrap().contains("--max-output-bytes"));
    let (code, doc, err) = rogue(
        &cli,
        "big-output",
        json!({ "mode": "big-output", "n": 2_000_000 }),
        &["--max-output-bytes", "4MiB"],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(doc["output"].as_str().unwrap().len(), 2_000_000);
    integrity_ok(std::path::Path::new(&cli.db()));
}

#[test]
fn host_resources_count_against_the_memory_limit() {
    let cli = CliDir::new();
    // 2 000 header sets of 60 KiB: 120 MiB of host memory the linear memory limit did
    // not see before. Each handle is now charged against --max-memory.
    let (code, doc, err) = rogue(
        &cli,
        "hoard",
        json!({ "mode": "fields", "n": 2000 }),
        &["--max-memory", "64MiB"],
    );
    assert_eq!(code, Some(1), "{doc} {err}");
    let error = error_of(&doc);
    assert!(error.contains("limit exceeded"), "{doc}");
    assert!(
        doc["hint"].as_str().unwrap().contains("--max-memory"),
        "{doc}"
    );
    // A few are fine.
    let (code, doc, err) = rogue(
        &cli,
        "few",
        json!({ "mode": "fields", "n": 50 }),
        &["--max-memory", "64MiB"],
    );
    assert_eq!(code, Some(0), "{doc} {err}");
}

#[test]
fn no_byte_of_a_request_body_leaves_after_its_claim_is_committed() {
    // A raw server: it keeps every byte each connection sent, whatever the framing.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let received = Arc::new(Mutex::new(Vec::<u8>::new()));
    let server = {
        let received = Arc::clone(&received);
        std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            stream
                .set_read_timeout(Some(std::time::Duration::from_secs(10)))
                .unwrap();
            let mut buf = [0u8; 4096];
            while let Ok(n) = stream.read(&mut buf) {
                if n == 0 {
                    break;
                }
                received.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        })
    };
    let cli = CliDir::new();
    let grant = format!("127.0.0.1:{port}");
    let (code, doc, err) = rogue(
        &cli,
        "streamer",
        json!({ "mode": "stream-after-commit", "url": format!("http://127.0.0.1:{port}") }),
        &["--allow-http", &grant],
    );
    server.join().unwrap();
    let received = String::from_utf8_lossy(&received.lock().unwrap()).into_owned();
    assert!(
        received.contains("before-commit"),
        "the part sent under the claim arrived: {received:?} ({doc} {err})"
    );
    assert!(
        !received.contains("after-commit"),
        "the part written after the commit must not leave the host: {received:?}"
    );
    assert_eq!(code, Some(0), "{doc} {err}");
}

#[test]
fn flags_idem_cannot_enforce_are_refused_before_anything_runs() {
    let cli = CliDir::new();
    for (flags, expected) in [
        (vec!["--lease", "0s"], "--lease"),
        (vec!["--await-timeout", "99999999h"], "365 days"),
        (vec!["--max-compute", "0ms"], "--max-compute"),
    ] {
        let out = cli.run(ROGUE, "odd", "{\"mode\":\"sleep\",\"n\":1}", &flags);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(expected),
            "{flags:?}: {}",
            stderr(&out)
        );
        assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    }
    assert!(
        !std::path::Path::new(&cli.db()).exists(),
        "a refused command creates no store"
    );
}
