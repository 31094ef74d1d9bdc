//! Versioned deployments end to end: `idem deploy --in-flight pin|upgrade`, `idem
//! upgrade`, `idem rollback` and `idem deployments`, with `idem worker` processes
//! driving runs of the waiter (a step before and a step after a signal wait, each
//! appending a line to the run's own file). On SQLite and on PostgreSQL.
//!
//! Which component a run's next instance ran is proven, not assumed: while a run
//! resumes, the components it must not run are broken in the store (a byte appended:
//! a worker cannot load them, and says so in the run's note), and the run still
//! completes. Each effect is counted in the run's file: exactly once.

use std::process::Child;
use std::time::{Duration, Instant};

use idem::store::RunRecord;
use idem_test_artifacts::{WAITER, WIDER};
use serde_json::{Value, json};

use crate::postgres::{Schema, sql};
use crate::serve::{Served, request};
use crate::util::{stderr, stdout};
use crate::workers::{Service, signal};

/// The waiter with one more custom section: another component (digest), the same code.
fn build(dir: &std::path::Path, tag: &str) -> String {
    let mut bytes = std::fs::read(WAITER).unwrap();
    let (name, payload) = (b"idem-test".as_slice(), tag.as_bytes());
    bytes.push(0); // custom section
    bytes.push(u8::try_from(1 + name.len() + payload.len()).unwrap());
    bytes.push(u8::try_from(name.len()).unwrap());
    bytes.extend_from_slice(name);
    bytes.extend_from_slice(payload);
    let path = dir.join(format!("waiter-{tag}.wasm"));
    std::fs::write(&path, bytes).unwrap();
    path.to_str().unwrap().to_owned()
}

/// A store, a data folder the waiter may write to, and its builds.
struct Bench {
    service: Service,
    files: tempfile::TempDir,
}

impl Bench {
    fn new(service: Service) -> Bench {
        let files = tempfile::tempdir().unwrap();
        std::fs::create_dir(files.path().join("data")).unwrap();
        Bench { service, files }
    }

    /// Deploys `agent` as the next version of `waiter`; its JSON answer.
    fn deploy(&self, agent: &str, in_flight: &str) -> Value {
        let grant = format!("{}::/data", self.files.path().join("data").display());
        let out = self.service.ok(&[
            "deploy",
            agent,
            "--name",
            "waiter",
            "--dir",
            &grant,
            "--in-flight",
            in_flight,
            "--json",
        ]);
        serde_json::from_str(&out).unwrap()
    }

    fn submit(&self, run_id: &str) {
        let input = json!({ "log": format!("/data/{run_id}.log"), "waits": [{ "signal": "go" }] });
        self.service.ok(&[
            "submit",
            "waiter",
            "--run-id",
            run_id,
            "--input",
            &input.to_string(),
        ]);
    }

    fn record(&self, run_id: &str) -> RunRecord {
        self.service
            .runs()
            .into_iter()
            .find(|r| r.run_id == run_id)
            .unwrap()
    }

    /// Runs a worker until `ok` holds of every run in `runs`, then stops it (by SIGTERM:
    /// it drains) and waits for it.
    fn work_until(&self, runs: &[&str], what: &str, ok: impl Fn(&RunRecord) -> bool) {
        let mut worker: Child = self.service.worker("w", &["--lease", "6s"]);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let all = self.service.try_runs().unwrap_or_default();
            let done = runs
                .iter()
                .all(|id| all.iter().any(|r| r.run_id == *id && ok(r)));
            if done {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "runs {runs:?} not {what}: {:?}",
                all.iter()
                    .map(|r| (&r.run_id, r.status, &r.waiting_for, &r.note))
                    .collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        signal(&worker, "TERM");
        worker.wait().unwrap();
    }

    fn wait_for_go(&self, runs: &[&str]) {
        self.work_until(runs, "waiting for the signal", |r| {
            r.waiting_for.as_deref() == Some("go") && r.lease.is_none()
        });
    }

    fn complete(&self, runs: &[&str]) {
        for run in runs {
            self.service
                .ok(&["signal", run, "go", "--payload", &json!(run).to_string()]);
        }
        self.work_until(runs, "completed", |r| {
            r.status == idem::store::RunStatus::Completed
        });
    }

    /// Breaks component `digest` in the store (its bytes no longer hash to it), or
    /// mends it.
    fn tamper(&self, digest: &str, broken: bool) {
        let db = self.service.db();
        if db.starts_with("postgres") {
            let bytes = if broken {
                "bytes || '\\x00'::bytea"
            } else {
                "substring(bytes from 1 for length(bytes) - 1)"
            };
            sql(
                &db,
                &format!("UPDATE components SET bytes = {bytes} WHERE digest = '{digest}'"),
            );
            return;
        }
        let conn = rusqlite::Connection::open(self.service.path()).unwrap();
        let mut bytes: Vec<u8> = conn
            .query_row(
                "SELECT bytes FROM components WHERE digest = ?1",
                [digest],
                |row| row.get(0),
            )
            .unwrap();
        if broken {
            bytes.push(0);
        } else {
            bytes.pop();
        }
        conn.execute(
            "UPDATE components SET bytes = ?1 WHERE digest = ?2",
            rusqlite::params![bytes, digest],
        )
        .unwrap();
    }

    /// The lines run `run_id` appended to its file.
    fn lines(&self, run_id: &str) -> Vec<String> {
        let path = self.files.path().join("data").join(format!("{run_id}.log"));
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|line| line.split(" gen=").next().unwrap().to_owned())
            .collect()
    }

    /// Each effect of the run happened once: the step before the wait and the one after.
    fn assert_effects_once(&self, run_id: &str) {
        assert_eq!(
            self.lines(run_id),
            ["start".to_owned(), format!("after 0 \"{run_id}\"")],
            "run {run_id}"
        );
        let output = self.record(run_id).outcome.unwrap();
        let output: Value = serde_json::from_slice(&output).unwrap();
        // The signal's payload, as the waiter reports it: its JSON text.
        assert_eq!(output, json!({ "results": [json!(run_id).to_string()] }));
    }

    fn versions(&self) -> Vec<(u64, u64, u64)> {
        let out = self.service.ok(&["deployments", "waiter", "--json"]);
        let doc: Value = serde_json::from_str(&out).unwrap();
        doc["deployments"][0]["versions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| {
                (
                    v["version"].as_u64().unwrap(),
                    v["runs_in_flight"].as_u64().unwrap(),
                    v["runs"].as_u64().unwrap(),
                )
            })
            .collect()
    }
}

fn on(bench: &Bench, run_id: &str) -> (Option<u64>, String) {
    let run = bench.record(run_id);
    (run.version, run.digest)
}

fn moved(doc: &Value) -> Vec<(String, u64, u64, String)> {
    doc["moved"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["run_id"].as_str().unwrap().to_owned(),
                m["from_version"].as_u64().unwrap(),
                m["to_version"].as_u64().unwrap(),
                m["reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// `pin` keeps a run on version 1 while a new run takes version 2; a later deployment
/// with `--in-flight upgrade` moves the run in flight to it, which it finishes on.
fn pin_then_upgrade_policy(bench: &Bench) {
    let dir = bench.files.path();
    let (v1, v2, v3) = (build(dir, "v1"), build(dir, "v2"), build(dir, "v3"));
    let d1 = bench.deploy(&v1, "pin");
    assert_eq!(d1["version"], 1);
    let d1 = d1["digest"].as_str().unwrap().to_owned();
    bench.submit("old");
    bench.wait_for_go(&["old"]);

    let d2 = bench.deploy(&v2, "pin");
    assert_eq!((d2["version"].as_u64(), moved(&d2).len()), (Some(2), 0));
    let d2 = d2["digest"].as_str().unwrap().to_owned();
    bench.submit("new");
    assert_eq!(on(bench, "old"), (Some(1), d1.clone()));
    assert_eq!(on(bench, "new"), (Some(2), d2.clone()));
    bench.wait_for_go(&["new"]);
    assert_eq!(bench.versions(), [(1, 1, 1), (2, 1, 1)]);
    // `idem ls` shows the version each run is on.
    let listed = bench.service.ok(&["ls"]);
    let version_of = |run: &str| {
        let line = listed
            .lines()
            .find(|l| l.starts_with(&format!("{run} ")))
            .unwrap_or_else(|| panic!("{run} not listed: {listed}"));
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields[fields.len() - 2].to_owned()
    };
    assert_eq!(
        (version_of("old"), version_of("new")),
        ("1".into(), "2".into())
    );

    // The pinned run resumes on version 1: version 2 is broken meanwhile.
    bench.tamper(&d2, true);
    bench.complete(&["old"]);
    bench.tamper(&d2, false);
    assert_eq!(on(bench, "old"), (Some(1), d1.clone()));
    bench.assert_effects_once("old");

    // Version 3 moves the runs in flight (only `new`); it resumes on version 3.
    let d3 = bench.deploy(&v3, "upgrade");
    assert_eq!(moved(&d3), [("new".to_owned(), 2, 3, "policy".to_owned())]);
    let d3 = d3["digest"].as_str().unwrap().to_owned();
    assert_eq!(on(bench, "new"), (Some(3), d3));
    assert_eq!(bench.versions(), [(1, 0, 1), (2, 0, 0), (3, 1, 1)]);
    bench.tamper(&d1, true);
    bench.tamper(&d2, true);
    bench.complete(&["new"]);
    bench.assert_effects_once("new");
    let show = bench.service.ok(&["show", "new"]);
    assert!(
        show.contains("version 2 -> version 3 (deployed with --in-flight upgrade)"),
        "{show}"
    );
}

/// `idem upgrade` moves the runs in flight to version 2, `idem rollback` one of them
/// back to version 1; each finishes on where it was moved, each effect once.
fn upgrade_then_rollback(bench: &Bench) {
    let dir = bench.files.path();
    let (v1, v2) = (build(dir, "v1"), build(dir, "v2"));
    let d1 = bench.deploy(&v1, "pin")["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    bench.submit("a");
    bench.submit("b");
    bench.wait_for_go(&["a", "b"]);
    let d2 = bench.deploy(&v2, "pin")["digest"]
        .as_str()
        .unwrap()
        .to_owned();

    let out = bench
        .service
        .ok(&["upgrade", "waiter", "--to", "2", "--json"]);
    let doc: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        moved(&doc),
        [
            ("a".to_owned(), 1, 2, "operator".to_owned()),
            ("b".to_owned(), 1, 2, "operator".to_owned()),
        ]
    );
    // Asking again moves nothing: they are there.
    let out = bench.service.ok(&["upgrade", "waiter", "--to", "2"]);
    assert!(out.contains("no run of waiter moved"), "{out}");

    let out = bench.service.ok(&["rollback", "waiter", "b"]);
    assert!(
        out.contains("b: version 2 -> version 1 (idem rollback)"),
        "{out}"
    );
    assert_eq!(on(bench, "a"), (Some(2), d2.clone()));
    assert_eq!(on(bench, "b"), (Some(1), d1.clone()));

    bench.tamper(&d1, true);
    bench.complete(&["a"]);
    bench.tamper(&d1, false);
    bench.tamper(&d2, true);
    bench.complete(&["b"]);
    bench.assert_effects_once("a");
    bench.assert_effects_once("b");
    let show = bench.service.ok(&["show", "b"]);
    assert!(show.contains("agent     waiter version 1"), "{show}");
    assert!(
        show.contains("version 1 -> version 2 (idem upgrade)")
            && show.contains("version 2 -> version 1 (idem rollback)"),
        "{show}"
    );
}

/// Bad input is refused with a clear error and exit 2, and moves nothing.
fn bad_input_changes_nothing(bench: &Bench) {
    let dir = bench.files.path();
    let v1 = build(dir, "v1");
    bench.deploy(&v1, "pin");
    bench.submit("a");
    bench.submit("done");
    bench.wait_for_go(&["a", "done"]);
    bench.complete(&["done"]);
    bench.deploy(&build(dir, "v2"), "pin");
    let refused = |args: &[&str], says: &str| {
        let out = bench.service.cli(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
        assert!(stdout(&out).is_empty(), "{args:?}: {}", stdout(&out));
    };
    refused(
        &["upgrade", "nobody", "--to", "1"],
        "no deployment is named",
    );
    refused(&["upgrade", "waiter", "--to", "9", "a"], "has no version 9");
    refused(
        &["upgrade", "waiter", "--to", "2", "a", "ghost"],
        "run \"ghost\" does not exist",
    );
    refused(
        &["upgrade", "waiter", "--to", "2", "a", "done"],
        "is already completed",
    );
    refused(&["rollback", "waiter", "a"], "has never moved");
    refused(&["deployments", "nobody"], "no deployment is named");

    // A component of another agent (it exports `describe` besides `run`) as version 3:
    // a rollout leaves the run where it is, and an upgrade to it is refused.
    let d3 = bench.deploy(WIDER, "upgrade");
    assert_eq!((d3["version"].as_u64(), moved(&d3).len()), (Some(3), 0));
    assert_eq!(d3["kept"], json!(["a"]));
    refused(
        &["upgrade", "waiter", "--to", "3", "a"],
        "export different things",
    );
    refused(
        &["upgrade", "waiter", "--to", "3"],
        "export different things",
    );
    assert_eq!(on(bench, "a").0, Some(1));
    assert!(!bench.service.ok(&["show", "a"]).contains("moved"));
    // A build of the same agent still moves: the refusals changed nothing.
    let out = bench.service.ok(&["upgrade", "waiter", "--to", "2", "a"]);
    assert!(out.contains("a: version 1 -> version 2"), "{out}");
}

#[test]
fn pin_keeps_old_runs_and_an_upgrade_rollout_moves_them() {
    pin_then_upgrade_policy(&Bench::new(Service::new()));
}

#[test]
fn pin_keeps_old_runs_and_an_upgrade_rollout_moves_them_on_postgres() {
    let Some(schema) = Schema::create("versions: pin and upgrade policy") else {
        return;
    };
    pin_then_upgrade_policy(&Bench::new(Service::on_postgres(schema.url())));
}

#[test]
fn an_upgrade_then_a_rollback_each_finish_where_moved() {
    upgrade_then_rollback(&Bench::new(Service::new()));
}

#[test]
fn an_upgrade_then_a_rollback_each_finish_where_moved_on_postgres() {
    let Some(schema) = Schema::create("versions: upgrade then rollback") else {
        return;
    };
    upgrade_then_rollback(&Bench::new(Service::on_postgres(schema.url())));
}

#[test]
fn bad_upgrades_and_rollbacks_are_refused_and_move_nothing() {
    bad_input_changes_nothing(&Bench::new(Service::new()));
}

#[test]
fn bad_upgrades_and_rollbacks_are_refused_and_move_nothing_on_postgres() {
    let Some(schema) = Schema::create("versions: bad input") else {
        return;
    };
    bad_input_changes_nothing(&Bench::new(Service::on_postgres(schema.url())));
}

/// The API deploys versions, lists them with their runs, moves runs to a version and
/// back (with the server's token, as every write), and refuses bad moves with codes.
#[test]
fn the_api_lists_versions_and_moves_runs_and_refuses_bad_moves() {
    let bench = Bench::new(Service::new());
    let dir = bench.files.path();
    let token = "versions-tok";
    let token_path = dir.join("token");
    std::fs::write(&token_path, format!("{token}\n")).unwrap();
    let served = Served::start(
        &bench.service.db(),
        &["--token-file", token_path.to_str().unwrap(), "--no-cache"],
    );
    let auth = format!("Bearer {token}");
    let deploy = |file: &str, in_flight: &str| {
        let path = format!("/api/deployments?name=waiter&in_flight={in_flight}");
        let headers = [
            ("Content-Type", "application/wasm"),
            ("Authorization", auth.as_str()),
        ];
        let r = request(
            served.addr,
            "POST",
            &path,
            &headers,
            &std::fs::read(file).unwrap(),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    };
    assert_eq!(deploy(&build(dir, "v1"), "pin")["version"], 1);
    bench.submit("r1");
    bench.submit("r2");
    let d2 = deploy(&build(dir, "v2"), "pin");
    assert_eq!((d2["version"].as_u64(), moved(&d2).len()), (Some(2), 0));

    let post = |path: &str, body: Value| served.post_json(path, Some(token), &body);
    let r = served.post_json("/api/deployments/waiter/upgrade", None, &json!({ "to": 2 }));
    assert_eq!((r.status, r.code().as_str()), (401, "unauthorized"));
    let r = post(
        "/api/deployments/waiter/upgrade",
        json!({ "to": 2, "runs": ["r1"] }),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        moved(&r.json()),
        [("r1".to_owned(), 1, 2, "operator".to_owned())]
    );
    let versions = served.get("/api/deployments/waiter/versions").json();
    let counts: Vec<(u64, u64, bool)> = versions["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["version"].as_u64().unwrap(),
                v["runs_in_flight"].as_u64().unwrap(),
                v["current"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(counts, [(1, 1, false), (2, 1, true)]);

    for (path, body, status, code) in [
        ("upgrade", json!({ "to": 9 }), 404, "unknown_version"),
        (
            "upgrade",
            json!({ "to": 2, "runs": ["r2", "ghost"] }),
            404,
            "unknown_run",
        ),
        ("rollback", json!({ "runs": ["r2"] }), 409, "never_moved"),
        (
            "upgrade",
            json!({ "to": 2, "what": 1 }),
            400,
            "malformed_json",
        ),
    ] {
        let r = post(&format!("/api/deployments/waiter/{path}"), body.clone());
        assert_eq!((r.status, r.code().as_str()), (status, code), "{body}");
    }
    let r = post("/api/deployments/nobody/rollback", json!({}));
    assert_eq!((r.status, r.code().as_str()), (404, "unknown_deployment"));
    // A rehearsal: r2 (on version 1) walks on 2 as on 1; it needs the token, and an
    // unknown version is refused; it moves nothing.
    let r = served.post_json(
        "/api/deployments/waiter/rehearse",
        None,
        &json!({ "to": 2 }),
    );
    assert_eq!((r.status, r.code().as_str()), (401, "unauthorized"));
    let r = post(
        "/api/deployments/waiter/rehearse",
        json!({ "to": 2, "runs": ["r2"] }),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let rehearsal = r.json();
    assert_eq!(rehearsal["safe"], true, "{rehearsal}");
    assert_eq!(
        rehearsal["report"]["runs"][0]["run_id"], "r2",
        "{rehearsal}"
    );
    assert_eq!(
        rehearsal["report"]["runs"][0]["verdict"], "compatible",
        "{rehearsal}"
    );
    let r = post("/api/deployments/waiter/rehearse", json!({ "to": 9 }));
    assert_eq!((r.status, r.code().as_str()), (404, "unknown_version"));
    assert_eq!(on(&bench, "r2").0, Some(1), "the refusals moved nothing");

    let r = post("/api/deployments/waiter/rollback", json!({}));
    assert_eq!(
        moved(&r.json()),
        [("r1".to_owned(), 2, 1, "rollback".to_owned())]
    );
    let run = served.get("/api/runs/r1").json();
    assert_eq!(run["run"]["version"], 1);
    assert_eq!(run["moves"].as_array().unwrap().len(), 2);

    // A rollout through the API: both runs move to version 3.
    let d3 = deploy(&build(dir, "v3"), "upgrade");
    let ids: Vec<String> = moved(&d3).into_iter().map(|m| m.0).collect();
    assert_eq!(ids, ["r1", "r2"]);
}

/// A run driven in the foreground (`idem run`, waiting in its own process for a
/// signal) that an operator moves meanwhile: its next instance runs the version it was
/// moved to, loaded from the store, not the file the process was started with. Proven
/// by breaking that version in the store: the process cannot go on (it would have, on
/// the code it holds), gives the run back and says why; once mended, a worker finishes
/// the run on it, each effect once.
#[test]
fn a_foreground_run_moved_meanwhile_resumes_on_its_new_version() {
    let bench = Bench::new(Service::new());
    let dir = bench.files.path();
    let (v1, v2) = (build(dir, "v1"), build(dir, "v2"));
    let grant = format!("{}::/data", dir.join("data").display());
    let input = json!({ "log": "/data/f.log", "waits": [{ "signal": "go" }] }).to_string();
    let db = bench.service.db();
    let foreground = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .args([
            "run",
            &v1,
            "--db",
            &db,
            "--dir",
            &grant,
            "--namespace",
            "waiter",
        ])
        .args(["--input", &input, "--run-id", "f", "--json"])
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    // The store is opened only once the first step ran: the file is being made before.
    while bench.lines("f").is_empty()
        || bench
            .service
            .try_runs()
            .ok()
            .and_then(|runs| runs.into_iter().find(|r| r.run_id == "f"))
            .is_none_or(|r| r.waiting_for.as_deref() != Some("go"))
    {
        assert!(Instant::now() < deadline, "the run never reached its wait");
        std::thread::sleep(Duration::from_millis(20));
    }
    let d2 = bench.deploy(&v2, "pin");
    assert_eq!(d2["version"], 2);
    let d2 = d2["digest"].as_str().unwrap().to_owned();
    bench.service.ok(&["upgrade", "waiter", "--to", "2", "f"]);
    bench.tamper(&d2, true);
    bench
        .service
        .ok(&["signal", "f", "go", "--payload", &json!("f").to_string()]);
    let out = foreground.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "it went on with the file's code: {err}"
    );
    assert!(err.contains(&d2), "{err}");
    let run = bench.record("f");
    assert!(run.lease.is_none(), "given back: {run:?}");
    assert_eq!(bench.lines("f"), ["start"], "nothing ran past the wait");

    bench.tamper(&d2, false);
    bench.work_until(&["f"], "completed", |r| {
        r.status == idem::store::RunStatus::Completed
    });
    bench.assert_effects_once("f");
    assert_eq!(on(&bench, "f"), (Some(2), d2));
}
