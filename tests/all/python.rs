//! Python agents (built with componentize-py against `guest-sdk-python`) under the same
//! assertions as the Rust guests: the crash sweep, seeded chaos, the in-doubt policies
//! with `idem resolve`, HTTP to a loopback server, keys shared with a Rust agent, the
//! Python ledger's side-effect log against the Rust ledger's, and step retries
//! (`idem.run_once_retry`) against the Rust SDK's.
//!
//! Where componentize-py is not set up (`scripts/test` does it), each test prints
//! `SKIPPED: Python ...` and returns.

use idem::runtime::{CrashPoint, FaultPlan, HttpPolicy, Phase};
use idem::store::RunStatus;
use idem_test_artifacts::{LEDGER, PY_LEDGER, PY_STEPS, PY_WAITER, STEPS, WAITER};
use serde_json::json;

use crate::http::TestServer;
use crate::util::{TestHost, agent, block_on, key_counts, raw_db};

/// The Python guest's path, or `None` (with a loud note) when it was not built.
pub(crate) fn built(path: &'static str, test: &str) -> Option<&'static str> {
    if path.is_empty() {
        eprintln!(
            "SKIPPED: Python agents were not built (no componentize-py): {test}; \
             run scripts/test, which installs it"
        );
        return None;
    }
    Some(path)
}

#[test]
fn python_crash_sweep_every_phase_every_step() {
    let Some(guest) = built(PY_STEPS, "crash sweep") else {
        return;
    };
    crate::crash_sweep::sweep(guest, 8, false);
}

#[test]
fn python_crash_sweep_with_folded_saves() {
    let Some(guest) = built(PY_STEPS, "crash sweep, folded") else {
        return;
    };
    crate::crash_sweep::sweep(guest, 8, true);
}

/// The `with idem.once(key) as step:` form under the same sweep: correct after its
/// commit (a second commit raises `ClaimSettled` inside the guest, never a trap).
#[test]
fn python_crash_sweep_of_the_with_block() {
    let Some(guest) = built(PY_STEPS, "crash sweep, with") else {
        return;
    };
    sweep_with(guest);
}

fn sweep_with(guest: &str) {
    let t = TestHost::new();
    let a = agent(guest);
    let n = 6_u32;
    let input = |log: &str| json!({ "steps": n, "log": format!("/data/{log}"), "with": true, "fold": true });
    let clean = t.run(&a, "clean", input("clean.log"), FaultPlan::default());
    assert_eq!(
        clean.status,
        RunStatus::Completed,
        "{}",
        String::from_utf8_lossy(&clean.outcome)
    );
    assert_eq!(clean.counts.executed, u64::from(n));
    for phase in Phase::ALL {
        for step in 1..=n {
            let run_id = format!("with-{phase}-{step}");
            let log = format!("{run_id}.log");
            let faults = FaultPlan {
                crash_at: vec![CrashPoint { phase, step }],
                ..FaultPlan::default()
            };
            let report = t.run(&a, &run_id, input(&log), faults);
            let ctx = format!("with, crash at {phase}:{step}");
            assert_eq!(report.outcome, clean.outcome, "{ctx}");
            let lines = t.log(&log);
            let extra = usize::from(phase == Phase::InEffect);
            assert_eq!(lines.len(), n as usize + extra, "{ctx}");
            assert_eq!(key_counts(&lines).len(), n as usize, "{ctx}");
            assert_eq!(report.counts.reclaimed, extra as u64, "{ctx}");
        }
    }
}

#[test]
fn python_seeded_chaos_keeps_output_and_effects() {
    let Some(guest) = built(PY_STEPS, "chaos") else {
        return;
    };
    crate::recycle::chaos(guest, 10, 2_000, 6);
}

/// The Rust guest and its Python twin run the same steps with `Key::shared` keys in
/// one namespace: whichever runs second executes nothing and returns the same output.
#[test]
fn rust_and_python_runs_share_keys_and_dedupe() {
    let Some(py) = built(PY_STEPS, "shared keys") else {
        return;
    };
    let t = TestHost::new();
    let input = |log: &str| json!({ "steps": 6, "log": format!("/data/{log}"), "shared": true });

    let mut opts = t.options("rust-run", input("rust.log"), FaultPlan::default());
    opts.namespace = Some("orders".into());
    let rust = t.run_with(&agent(STEPS), &opts).unwrap();
    assert_eq!(rust.counts.executed, 6);

    let mut opts = t.options("python-run", input("python.log"), FaultPlan::default());
    opts.namespace = Some("orders".into());
    opts.upgrade = true;
    let python = t.run_with(&agent(py), &opts).unwrap();
    assert_eq!(
        python.status,
        RunStatus::Completed,
        "{}",
        String::from_utf8_lossy(&python.outcome)
    );
    assert_eq!((python.counts.executed, python.counts.skipped), (0, 6));
    assert_eq!(
        python.outcome, rust.outcome,
        "the same results, read back from Rust's commits"
    );
    assert!(
        !t.data().join("python.log").exists(),
        "the Python run repeated an effect"
    );
    assert_eq!(t.log("rust.log").len(), 6);

    // And the other way round, on fresh keys: Python first, Rust skips.
    let input = |log: &str| json!({ "steps": 9, "log": format!("/data/{log}"), "shared": true });
    let mut opts = t.options("python-run-2", input("python2.log"), FaultPlan::default());
    opts.namespace = Some("orders".into());
    let python = t.run_with(&agent(py), &opts).unwrap();
    assert_eq!((python.counts.executed, python.counts.skipped), (3, 6));
    let mut opts = t.options("rust-run-2", input("rust2.log"), FaultPlan::default());
    opts.namespace = Some("orders".into());
    opts.upgrade = true;
    let rust = t.run_with(&agent(STEPS), &opts).unwrap();
    assert_eq!((rust.counts.executed, rust.counts.skipped), (0, 9));
    assert_eq!(python.outcome, rust.outcome);
}

/// The Python ledger and the Rust ledger, same input and run id, separate stores:
/// byte-identical side-effect logs and outputs, also across a crash and resume.
#[test]
fn python_ledger_log_is_the_rust_ledgers() {
    let Some(py) = built(PY_LEDGER, "ledger twin") else {
        return;
    };
    let items = ["apples", "pears", "café", "apples", "🍐 x2"];
    for crash in [
        None,
        Some(CrashPoint {
            phase: Phase::InEffect,
            step: 3,
        }),
    ] {
        let mut logs = Vec::new();
        let mut outputs = Vec::new();
        for guest in [LEDGER, py] {
            let t = TestHost::new();
            let faults = FaultPlan {
                crash_at: crash.into_iter().collect(),
                ..FaultPlan::default()
            };
            let report = t.run(
                &agent(guest),
                "ledger-1",
                json!({ "items": items, "log": "/data/ledger.log" }),
                faults,
            );
            assert_eq!(
                report.status,
                RunStatus::Completed,
                "{}",
                String::from_utf8_lossy(&report.outcome)
            );
            logs.push(std::fs::read_to_string(t.data().join("ledger.log")).unwrap());
            outputs.push(report.outcome);
        }
        assert_eq!(logs[0], logs[1], "crash {crash:?}");
        assert_eq!(outputs[0], outputs[1], "crash {crash:?}");
        assert_eq!(
            logs[0].lines().count(),
            items.len() + usize::from(crash.is_some())
        );
    }
}

/// An exception escaping the agent fails the run with its type, text and traceback
/// (not a trap); the failed effect's claim was released, and running again retries it.
#[test]
fn python_exceptions_fail_the_run_with_a_traceback_and_release_the_claim() {
    let Some(py) = built(PY_STEPS, "exceptions") else {
        return;
    };
    let t = TestHost::new();
    let input = json!({ "steps": 4, "log": "/data/log.txt", "fail_at": 2 });
    let failed = t.run(&agent(py), "fails", input.clone(), FaultPlan::default());
    assert_eq!(failed.status, RunStatus::Failed);
    let text = String::from_utf8_lossy(&failed.outcome).into_owned();
    assert!(
        text.starts_with("RuntimeError: step 2 fails on its first attempt"),
        "{text}"
    );
    assert!(
        text.contains("Traceback (most recent call last)") && text.contains("in effect"),
        "{text}"
    );
    // With its source lines, which `@idem.agent` read while the component was built:
    // the app's and the SDK's own.
    assert!(
        text.contains("    raise RuntimeError(f\"step {i} fails on its first attempt\")")
            && text.contains("_json.dumps(fn(value), \"output\")"),
        "{text}"
    );
    assert_eq!(t.log("log.txt").len(), 2);

    let again = t.run(&agent(py), "fails", input, FaultPlan::default());
    assert_eq!(
        again.status,
        RunStatus::Completed,
        "{}",
        String::from_utf8_lossy(&again.outcome)
    );
    let lines = t.log("log.txt");
    assert_eq!(lines.len(), 4);
    assert_eq!(
        lines[2].attempt(),
        2,
        "the released claim is retaken at attempt 2"
    );
    assert!(!lines[2].flag("in_doubt"));
}

/// Each step POSTs through `idem.http` to a real server on 127.0.0.1: every request
/// arrives once, with its body, stamped with the key and token the log recorded; a crash
/// inside the effect resends the step under the same key with a higher token.
#[test]
fn python_http_reaches_the_loopback_server_once_per_step() {
    let Some(py) = built(PY_STEPS, "HTTP") else {
        return;
    };
    let server = TestServer::start();
    let t = TestHost::new();
    let mut opts = t.options(
        "fetch",
        json!({ "steps": 4, "log": "/data/log.txt", "url": server.url() }),
        FaultPlan {
            crash_at: vec![CrashPoint {
                phase: Phase::InEffect,
                step: 2,
            }],
            ..FaultPlan::default()
        },
    );
    opts.authority.http = HttpPolicy {
        allow: vec![format!("127.0.0.1:{}", server.port()).parse().unwrap()],
        outside_claims: false,
    };
    let report = t.run_with(&agent(py), &opts).unwrap();
    assert_eq!(
        report.status,
        RunStatus::Completed,
        "{}",
        String::from_utf8_lossy(&report.outcome)
    );
    let lines = t.log("log.txt");
    let by_step = server.steps();
    assert_eq!(by_step.len(), 4);
    for (i, seen) in &by_step {
        let expected = if *i == 1 { 2 } else { 1 };
        assert_eq!(seen.len(), expected, "step {i}");
        for (s, line) in seen.iter().zip(
            lines
                .iter()
                .filter(|l| l.key == seen[0].header("idempotency-key")),
        ) {
            assert_eq!(s.method, "POST");
            assert_eq!(s.body, i.to_string().into_bytes(), "the body arrived whole");
            assert_eq!(s.header("content-length"), i.to_string().len().to_string());
            assert_eq!(s.token("idempotency-token"), line.token(), "step {i}");
        }
    }
    let resent = &by_step[&1];
    assert_eq!(
        resent[0].header("idempotency-key"),
        resent[1].header("idempotency-key")
    );
    assert!(resent[1].token("idempotency-token") > resent[0].token("idempotency-token"));

    // Not granted: refused by the host, raised as HttpDenied, nothing arrives.
    let before = server.seen().len();
    let t = TestHost::new();
    let report = t.run(
        &agent(py),
        "denied",
        json!({ "steps": 1, "log": "/data/log.txt", "url": server.url() }),
        FaultPlan::default(),
    );
    let text = String::from_utf8_lossy(&report.outcome).into_owned();
    assert_eq!(report.status, RunStatus::Failed, "{text}");
    assert!(
        text.starts_with("HttpDenied: HTTP request to 127.0.0.1:")
            && text.contains(" denied: the destination is not granted to the run"),
        "{text}"
    );
    assert_eq!(server.seen().len(), before);
}

/// `in_doubt=idem.FAIL`: a crash inside step 3's effect stops the run in doubt; the
/// operator settles the key with `idem resolve --result`, and the run completes
/// without running the effect again, with the clean run's output.
#[test]
fn python_in_doubt_fail_then_resolve_with_a_result() {
    let Some(py) = built(PY_STEPS, "in doubt, resolve --result") else {
        return;
    };
    let make = || crate::in_doubt::CliRun::of(py, "py-steps");
    crate::in_doubt::resolve_with_a_result(make, make);
}

/// The same, settled with `idem resolve --retry`: the effect runs once more, not in doubt.
#[test]
fn python_in_doubt_fail_then_resolve_retry() {
    let Some(py) = built(PY_STEPS, "in doubt, resolve --retry") else {
        return;
    };
    crate::in_doubt::resolve_retry(&crate::in_doubt::CliRun::of(py, "py-steps"));
}

/// `in_doubt=probe`: the probe finds the applied effect in the log and commits its
/// value without appending again.
#[test]
fn python_in_doubt_probe_does_not_repeat_the_effect() {
    let Some(py) = built(PY_STEPS, "in doubt, probe") else {
        return;
    };
    let t = TestHost::new();
    let faults = FaultPlan {
        crash_at: vec![CrashPoint {
            phase: Phase::InEffect,
            step: 3,
        }],
        ..FaultPlan::default()
    };
    let report = t.run(
        &agent(py),
        "probe",
        json!({ "steps": 5, "log": "/data/log.txt", "policy": "probe" }),
        faults,
    );
    assert_eq!(
        report.status,
        RunStatus::Completed,
        "{}",
        String::from_utf8_lossy(&report.outcome)
    );
    let lines = t.log("log.txt");
    assert_eq!(lines.len(), 5, "the probed effect was not appended again");
    assert!(key_counts(&lines).values().all(|&c| c == 1));
    let clean = t.run(
        &agent(py),
        "probe-clean",
        json!({ "steps": 5, "log": "/data/clean.log" }),
        FaultPlan::default(),
    );
    assert_eq!(report.outcome, clean.outcome);
}

/// `idem.run_once_retry` in the waiter's Python twin against `run_once_retry` in the Rust
/// waiter, same input and run id, separate stores: each attempt appends a line to a
/// file, so the attempts are counted where they happened. Two failures then success,
/// a permanent error, and attempts spent — each with a crash after the retried step's
/// commit, whose replay must not attempt again. Both languages make the same attempts
/// in the same instances, back off under the same keys for the same delays, log the
/// same reasons, and commit byte-identical results, so either reads the other's.
#[test]
fn python_step_retries_attempt_exactly_as_the_rust_sdk_does() {
    let Some(py) = built(PY_WAITER, "step retries") else {
        return;
    };
    let cases = [
        (
            json!({"fail": 2, "max_attempts": 5, "initial_ms": 50}),
            "ok-3",
            3,
        ),
        (
            json!({"fail": 9, "permanent": true, "max_attempts": 5, "initial_ms": 50}),
            "error: refused 1 (permanent, at attempt 1)",
            1,
        ),
        (
            json!({"fail": 9, "max_attempts": 3, "initial_ms": 50}),
            "error: flaky 3 (gave up after attempt 3)",
            3,
        ),
    ];
    for (retry, what, attempts) in cases {
        let mut seen = Vec::new();
        for guest in [WAITER, py] {
            let t = TestHost::new();
            let input = json!({"log": "/data/retry.log", "waits": [{"retry": retry}]});
            let faults = FaultPlan {
                crash_at: vec!["before-claim:3".parse().unwrap()],
                ..FaultPlan::default()
            };
            let mut opts = t.options("retried", input, faults);
            // The same namespace, so that the stored keys are comparable.
            opts.namespace = Some("waiter".into());
            let report = t.run_with(&agent(guest), &opts).unwrap();
            let ctx = format!("{guest}, {retry}");
            assert_eq!(report.status, RunStatus::Completed, "{ctx}");
            let expected = json!({ "results": [what] }).to_string();
            assert_eq!(String::from_utf8_lossy(&report.outcome), expected, "{ctx}");

            let log = std::fs::read_to_string(t.data().join("retry.log")).unwrap();
            let lines: Vec<&str> = log.lines().collect();
            let tries: Vec<&str> = lines
                .iter()
                .copied()
                .filter(|l| l.starts_with("try "))
                .collect();
            assert_eq!(tries.len(), attempts, "{ctx}: {lines:?}");
            for (n, line) in tries.iter().enumerate() {
                // Each failed attempt ends its instance with the backoff.
                let expected = format!("try 0 attempt={} gen={n}", n + 1);
                assert_eq!(*line, expected, "{ctx}: {lines:?}");
            }
            assert_eq!(lines.first(), Some(&"start gen=0"), "{ctx}");
            assert_eq!(
                lines.iter().filter(|l| l.starts_with("after ")).count(),
                1,
                "{ctx}"
            );

            let waits = block_on(t.store().waits("retried")).unwrap();
            let backoff: Vec<(String, i64)> = waits
                .iter()
                .map(|w| (w.key.clone(), w.due.unwrap() - w.created))
                .collect();
            // One backoff after each failed attempt but the last: 50 ms, doubling.
            let delays: Vec<i64> = backoff.iter().map(|(_, d)| *d).collect();
            assert_eq!(delays, [50, 100][..attempts - 1], "{ctx}");
            let committed: Vec<(String, Vec<u8>)> = {
                let conn = raw_db(&t.db());
                let mut q = conn
                    .prepare("SELECT key, result FROM steps WHERE run_id = ?1 ORDER BY key")
                    .unwrap();
                q.query_map(["retried"], |row| Ok((row.get(0)?, row.get(1)?)))
                    .unwrap()
                    .map(Result::unwrap)
                    .collect()
            };
            let logs = String::from_utf8(block_on(t.store().logs("retried")).unwrap()).unwrap();
            let reasons: Vec<String> = logs
                .lines()
                .filter(|l| l.contains("; retrying in "))
                .map(str::to_owned)
                .collect();
            assert_eq!(reasons.len(), attempts - 1, "{ctx}: {logs}");
            seen.push((log, report.outcome, backoff, committed, reasons));
        }
        assert_eq!(seen[0], seen[1], "Rust, then Python, for {retry}");
    }
}

/// componentize-py itself, on an app that imports `idem` but forgot `@idem.agent`: the
/// build fails naming the decorator, not componentize-py's `WitWorld` (the SDK watches
/// the module that imports it; `guest-sdk-python/src/idem/_agent.py`).
#[test]
fn a_python_build_without_the_agent_decorator_fails_naming_it() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let venv = std::env::var_os("IDEM_PYTHON_VENV")
        .map_or_else(|| root.join("target/py"), std::path::PathBuf::from);
    let tool = venv.join("bin/componentize-py");
    if PY_STEPS.is_empty() || !tool.is_file() {
        eprintln!("SKIPPED: Python agents were not built (no componentize-py): no-agent build");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let app = dir.path().join("app");
    std::fs::create_dir(&app).unwrap();
    std::fs::write(
        app.join("noagent.py"),
        "import idem\n\n\ndef run(input):\n    return input\n",
    )
    .unwrap();
    // The SDK as a wheel installs it: real files, `wit/` (a link here) included.
    let sdk = dir.path().join("sdk");
    std::fs::create_dir(&sdk).unwrap();
    let copied = std::process::Command::new("cp")
        .arg("-rL")
        .arg(root.join("guest-sdk-python/src/idem"))
        .arg(sdk.join("idem"))
        .status()
        .unwrap();
    assert!(copied.success());
    let out = std::process::Command::new(&tool)
        .args(["componentize", "noagent", "-o"])
        .arg(dir.path().join("x.wasm"))
        .arg("-p")
        .arg(&app)
        .arg("-p")
        .arg(&sdk)
        .env_remove("VIRTUAL_ENV")
        .env("RUST_BACKTRACE", "0")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("module 'noagent' has no agent: decorate the function that takes the run's input with @idem.agent"),
        "{err}"
    );
    assert!(!dir.path().join("x.wasm").exists());
}

/// A large component's first run says what takes the time, on a pipe too: the compile
/// (once per build, with the cache) and the copy into a store that lacks it; the next
/// run, cached and stored, says neither.
#[test]
fn a_large_components_first_run_says_it_compiles_and_stores_it() {
    let Some(py) = built(PY_STEPS, "compile notice") else {
        return;
    };
    let cli = crate::util::CliDir::new();
    let cache = cli.dir.path().join("cache");
    let cache = cache.to_str().unwrap();
    let input = r#"{"steps":1,"log":"/data/log.txt"}"#;
    let first = cli.run(py, "notice", input, &["--cache-dir", cache]);
    let err = crate::util::stderr(&first);
    assert!(first.status.success(), "{err}");
    assert!(
        err.contains("idem: compiling ")
            && err.contains(" MB), once per build: the cache keeps the compiled code…"),
        "{err}"
    );
    assert!(
        err.contains("idem: storing ") && err.contains("in the store, once per build"),
        "{err}"
    );
    let again = cli.run(py, "notice-2", input, &["--cache-dir", cache]);
    let err = crate::util::stderr(&again);
    assert!(again.status.success(), "{err}");
    assert!(
        !err.contains("idem: compiling") && !err.contains("idem: storing"),
        "{err}"
    );
}
