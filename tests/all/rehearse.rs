//! Upgrades rehearsed against the runs in flight of a real store, on SQLite and
//! PostgreSQL: a run of `release` v1 is left sleeping after two of its four steps
//! (its process SIGKILLed); a v2 that renamed the step's key is refused, naming the run
//! and the committed steps it would run again; a compatible v2 passes, and the run,
//! then upgraded to it, finishes with each step's effect once (counted in the agent's
//! log file). The rehearsals change nothing in the real store, which they open
//! read-only, and send nothing. The same through the CLI: `idem upgrade --dry-run`
//! against versions deployed under the run's name, its exit codes, JSON and JUnit, and
//! a component of another agent refused.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use idem::prove::{ProveError, UpgradeRehearsal, UpgradeReport, Verdict, rehearse_upgrade};
use idem::store::{RunStatus, StoreError, StoreOptions};
use idem_test_artifacts::{RELEASE, RELEASE_RENAMED, RELEASE_V2, WIDER};

use crate::postgres::Schema;
use crate::util::{agent, block_on, read_log, run_cli, runtime, stderr, stdout};

pub(crate) const RUN: &str = "rel";

fn input() -> String {
    serde_json::json!({
        "items": 4, "log": "/data/log.txt", "pause_at": 2, "pause_ms": 1500,
    })
    .to_string()
}

fn grant(data: &Path) -> String {
    format!("{}::/data", data.display())
}

/// Leaves a run of v1 in flight: two steps done, then its process killed in the sleep.
pub(crate) fn leave_in_flight(db: &str, data: &Path) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args([
            "run",
            RELEASE,
            "--db",
            db,
            "--run-id",
            RUN,
            "--input",
            &input(),
        ])
        .args(["--dir", &grant(data)])
        .env("IDEM_LOG", "error")
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let log = data.join("log.txt");
    let deadline = Instant::now() + Duration::from_secs(60);
    while read_log(&log).len() < 2 {
        assert!(Instant::now() < deadline, "no two steps in 60 s");
        assert!(child.try_wait().unwrap().is_none(), "the run ended early");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Into its sleep (or about to commit the second step: either is a run in flight).
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap();
    child.wait().unwrap();
}

fn rehearse(db: &str, to: &str, runs: &[&str]) -> Result<UpgradeReport, Box<ProveError>> {
    let scratch = tempfile::tempdir().unwrap();
    block_on(async {
        let store = idem::store::open(
            db,
            &StoreOptions {
                read_only: true,
                existing_only: true,
                ..StoreOptions::default()
            },
        )
        .await
        .unwrap();
        rehearse_upgrade(
            &runtime(),
            &store,
            &agent(to),
            &UpgradeRehearsal {
                runs: runs.iter().map(|r| r.to_string()).collect(),
                scratch: scratch.path().to_path_buf(),
            },
        )
        .await
        .map_err(Box::new)
    })
}

/// What the real store and the effects' log hold, to show a rehearsal changed nothing:
/// the run's record, steps, waits and open claims as `idem show` reads them.
fn state(db: &str, data: &Path) -> (usize, String) {
    let out = run_cli(&["show", RUN, "--db", db, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let kept = ["run", "steps", "waits", "open_claims"].map(|k| doc[k].to_string());
    (read_log(&data.join("log.txt")).len(), kept.join("\n"))
}

/// Each of the four steps' effects once in the log (a repeat only retaken in doubt,
/// under the same key), the last done by version 2.
fn each_effect_once(data: &Path) {
    let lines = read_log(&data.join("log.txt"));
    let mut keys: Vec<String> = Vec::new();
    for line in &lines {
        if keys.contains(&line.key) {
            // Retaken in doubt: the same key, a later attempt.
            assert!(line.attempt() > 1, "a repeat not in doubt: {lines:?}");
        } else {
            assert_eq!(line.attempt(), 1, "{lines:?}");
            keys.push(line.key.clone());
        }
    }
    assert_eq!(keys.len(), 4, "{lines:?}");
    assert_eq!(lines.last().unwrap().fields["version"], "2", "{lines:?}");
}

fn rehearsed_then_upgraded(db: &str, data: &Path) {
    leave_in_flight(db, data);
    let before = state(db, data);

    // The renamed key: refused, naming the run and each committed step.
    let report = rehearse(db, RELEASE_RENAMED, &[RUN]).unwrap();
    assert!(!report.is_safe(), "{report:?}");
    let run = &report.runs[0];
    assert_eq!(run.run_id, RUN);
    let Verdict::Repeats { steps, instead } = &run.verdict else {
        panic!("not refused as a repeat: {report:?}");
    };
    assert!(!steps.is_empty() && steps.len() <= 2, "{steps:?}");
    assert_eq!(steps[0].step, 1);
    assert!(steps[0].key.starts_with("rel/item/"), "{steps:?}");
    assert!(
        matches!(instead, idem::prove::Next::Step { key } if key.starts_with("rel/entry/")),
        "{instead:?}"
    );
    assert_eq!(state(db, data), before, "the rehearsal changed the store");

    // The compatible v2: passes, both versions next at the same step.
    let report = rehearse(db, RELEASE_V2, &[RUN]).unwrap();
    assert!(report.is_safe(), "{report:?}");
    assert_eq!(report.runs[0].verdict, Verdict::Compatible);
    let old = report.runs[0].old.as_ref().unwrap();
    assert_eq!(Some(old), report.runs[0].new.as_ref());
    assert!(!old.replayed.is_empty(), "{old:?}");
    assert_eq!(state(db, data), before, "the rehearsal changed the store");

    // Moved to v2, the run finishes: each step's effect once (a repeat only in doubt,
    // under the same key), the steps after the move done by v2.
    let out = run_cli(&[
        "run",
        RELEASE_V2,
        "--db",
        db,
        "--run-id",
        RUN,
        "--input",
        &input(),
        "--dir",
        &grant(data),
        "--upgrade",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["output"]["version"], 2, "{doc}");
    each_effect_once(data);

    // Bad input: an unknown run, and a run that has ended, are typed errors.
    let unknown = rehearse(db, RELEASE_V2, &["nobody"]).unwrap_err();
    assert!(
        matches!(*unknown, ProveError::Store(StoreError::UnknownRun { .. })),
        "{unknown}"
    );
    let ended = rehearse(db, RELEASE_V2, &[RUN]).unwrap_err();
    assert!(
        matches!(
            *ended,
            ProveError::Store(StoreError::RunFinished {
                status: RunStatus::Completed,
                ..
            })
        ),
        "{ended}"
    );
}

/// Runs `test` on a fresh SQLite store, with a fresh directory to grant.
fn on_sqlite(test: fn(&str, &Path)) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let db = dir.path().join("idem.db");
    test(db.to_str().unwrap(), &data);
}

/// Runs `test` on a schema of its own on the PostgreSQL server, if there is one.
fn on_postgres(name: &str, test: fn(&str, &Path)) {
    let Some(schema) = Schema::create(name) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    test(&schema.url(), &data);
}

#[test]
fn an_upgrade_is_rehearsed_against_the_runs_in_flight_on_sqlite() {
    on_sqlite(rehearsed_then_upgraded);
}

#[test]
fn an_upgrade_is_rehearsed_against_the_runs_in_flight_on_postgres() {
    on_postgres(
        "an_upgrade_is_rehearsed_against_the_runs_in_flight",
        rehearsed_then_upgraded,
    );
}

/// `idem upgrade --dry-run` against versions deployed under the run's name: the renamed
/// key exits 7 naming the run and its first committed step, the compatible version
/// exits 0 (JSON and JUnit say so), a component of another agent is refused, an unknown
/// version is bad input; none changes anything. Then the real move, and the run
/// finishes on the new version with each effect once.
fn dry_run_through_the_cli(db: &str, data: &Path) {
    leave_in_flight(db, data);
    for agent in [RELEASE_RENAMED, RELEASE_V2, WIDER] {
        let out = run_cli(&["deploy", agent, "--name", "release", "--db", db]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let before = state(db, data);
    let dry = |to: &str, extra: &[&str]| {
        let mut args = vec!["upgrade", "release", "--to", to, "--dry-run", "--db", db];
        args.extend_from_slice(extra);
        run_cli(&args)
    };

    let renamed = dry("2", &[]);
    assert_eq!(renamed.status.code(), Some(7), "{}", stderr(&renamed));
    let text = stdout(&renamed);
    assert!(
        text.contains("rel: WOULD REPEAT step 1 (rel/item/"),
        "{text}"
    );

    let dir = tempfile::tempdir().unwrap();
    let junit = dir.path().join("upgrade.xml");
    let compatible = dry("3", &["--json", "--junit", junit.to_str().unwrap()]);
    assert_eq!(compatible.status.code(), Some(0), "{}", stderr(&compatible));
    let doc: serde_json::Value = serde_json::from_slice(&compatible.stdout).unwrap();
    assert_eq!(doc["safe"], true, "{doc}");
    assert_eq!(doc["report"]["runs"][0]["run_id"], RUN, "{doc}");
    assert_eq!(doc["report"]["runs"][0]["verdict"], "compatible", "{doc}");
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains("tests=\"1\" failures=\"0\""), "{xml}");

    let other = dry("4", &[]);
    assert_eq!(other.status.code(), Some(7), "{}", stderr(&other));
    assert!(
        stdout(&other).contains("REFUSED: the new component exports another agent's"),
        "{}",
        stdout(&other)
    );

    let unknown = dry("9", &[]);
    assert_eq!(unknown.status.code(), Some(2), "{}", stderr(&unknown));
    assert!(stderr(&unknown).contains('9'), "{}", stderr(&unknown));

    // The same check of a build not deployed yet, from `idem prove`: a CI job's gate
    // before the deploy.
    let prove = |agent: &str, deployment: &str| {
        run_cli(&[
            "prove",
            agent,
            "--against-store",
            db,
            "--deployment",
            deployment,
        ])
    };
    let renamed = prove(RELEASE_RENAMED, "release");
    assert_eq!(renamed.status.code(), Some(7), "{}", stderr(&renamed));
    let text = stdout(&renamed);
    assert!(
        text.contains("rel: WOULD REPEAT step 1 (rel/item/"),
        "{text}"
    );
    let compatible = prove(RELEASE_V2, "release");
    assert_eq!(compatible.status.code(), Some(0), "{}", stderr(&compatible));
    assert!(
        stdout(&compatible).contains("nothing would run again"),
        "{}",
        stdout(&compatible)
    );
    let nobody = prove(RELEASE_V2, "nobody");
    assert_eq!(nobody.status.code(), Some(2), "{}", stderr(&nobody));
    assert!(stderr(&nobody).contains("nobody"), "{}", stderr(&nobody));
    assert_eq!(state(db, data), before, "a dry run changed the store");

    let moved = run_cli(&["upgrade", "release", "--to", "3", "--db", db]);
    assert!(moved.status.success(), "{}", stderr(&moved));
    let out = run_cli(&[
        "run",
        RELEASE_V2,
        "--db",
        db,
        "--run-id",
        RUN,
        "--input",
        &input(),
        "--dir",
        &grant(data),
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["output"]["version"], 2, "{doc}");
    each_effect_once(data);
}

#[test]
fn idem_upgrade_dry_run_gates_a_move_on_sqlite() {
    on_sqlite(dry_run_through_the_cli);
}

#[test]
fn idem_upgrade_dry_run_gates_a_move_on_postgres() {
    on_postgres("idem_upgrade_dry_run_gates_a_move", dry_run_through_the_cli);
}
