//! Pausing and resuming runs under load: three `idem worker` processes drive runs of a
//! multi-step HTTP agent while `idem pause` and `idem resume` (of runs, and of the
//! whole deployment) land at seeded moments. A paused run stops at its next host call
//! outside a side effect, sends nothing while paused, and goes on where it stopped when
//! resumed; every effect reaches the loopback server once per key (a repeat only as a
//! retake in doubt), every run completes with the right output. On SQLite and on
//! PostgreSQL. Also: a paused run stays paused across its worker's restart, and the
//! bad input of both commands changes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use idem::store::{PausedBy, RunRecord, RunStatus};
use serde_json::{Value, json};

use crate::http::{TestServer, post_key};
use crate::postgres::Schema;
use crate::util::{integrity_ok, stderr, stdout};
use crate::workers::{Service, assert_effects_fenced, by_key, deploy_fetcher, signal};

const STEPS: u64 = 3;
const WORKER: &[&str] = &["--lease", "6s", "--concurrency", "3"];

fn submit(service: &Service, server: &TestServer, run_id: &str, pause_ms: u64) {
    let input =
        json!({ "steps": STEPS, "url": server.url(), "pause_ms": pause_ms, "pause_after": true });
    service.ok(&[
        "submit",
        "fetcher",
        "--run-id",
        run_id,
        "--input",
        &input.to_string(),
    ]);
}

/// Requests the server saw for run `run_id`'s keys.
fn requests_of(server: &TestServer, run_id: &str) -> usize {
    let keys: BTreeSet<String> = (0..STEPS).map(|i| post_key(run_id, i)).collect();
    server
        .seen()
        .iter()
        .filter(|s| keys.contains(s.header("idempotency-key")))
        .count()
}

fn record(service: &Service, run_id: &str) -> RunRecord {
    service
        .runs()
        .into_iter()
        .find(|r| r.run_id == run_id)
        .unwrap()
}

/// Waits until `ok` holds of the store's runs, or panics after `limit`.
fn wait_for(service: &Service, limit: Duration, what: &str, ok: impl Fn(&[RunRecord]) -> bool) {
    let deadline = Instant::now() + limit;
    loop {
        let runs = service.try_runs().unwrap_or_default();
        if ok(&runs) {
            return;
        }
        assert!(Instant::now() < deadline, "waited {limit:?} for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A run paused and given back by its worker: it holds nothing.
fn parked(run: &RunRecord) -> bool {
    run.status == RunStatus::Paused && run.lease.is_none()
}

#[test]
fn pause_and_resume_50_runs_under_three_workers_repeats_nothing() {
    let service = Service::new();
    pause_and_resume_under_load(&service, 50, 0x9a_0050);
    integrity_ok(&service.path());
}

#[test]
fn pause_and_resume_under_load_on_postgres() {
    let Some(schema) = Schema::create("pause and resume under load") else {
        return;
    };
    let service = Service::on_postgres(schema.url());
    pause_and_resume_under_load(&service, 50, 0x9b_0050);
}

/// `runs` runs, three workers, and at seeded moments: a running run paused (its
/// worker stops it at its next host call), a paused run resumed, and once the whole
/// deployment paused then resumed.
fn pause_and_resume_under_load(service: &Service, runs: usize, seed: u64) {
    let server = TestServer::start();
    deploy_fetcher(service, &server, &["--lease", "6s"]);
    for i in 0..runs {
        submit(service, &server, &format!("run-{i:03}"), 300);
    }
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut workers: Vec<_> = (0..3)
        .map(|w| service.worker(&format!("w{w}"), WORKER))
        .collect();
    // Paused runs, with the requests their keys had once they were parked (None until
    // their worker gave them back).
    let mut paused: BTreeMap<String, Option<usize>> = BTreeMap::new();
    let (mut requested, mut at_once, mut resumed, mut refused) = (0, 0, 0, 0);
    let mut finished_first = 0;
    let mut deployment_paused = false;
    let mut next = Instant::now() + Duration::from_millis(rng.u64(10..80));
    service.wait_all_finished(Duration::from_secs(600), || {
        let records = service.try_runs().unwrap_or_default();
        // A paused run parked sends nothing more until it is resumed. One whose agent
        // returned before its worker heard of the pause ended as it ended; a parked one
        // never ends while paused.
        let mut ended_first = Vec::new();
        for (run_id, seen) in paused.iter_mut() {
            let run = records.iter().find(|r| &r.run_id == run_id).unwrap();
            if run.status == RunStatus::Completed {
                assert!(seen.is_none(), "run {run_id} completed while parked");
                ended_first.push(run_id.clone());
                continue;
            }
            match seen {
                None if parked(run) => *seen = Some(requests_of(&server, run_id)),
                Some(n) => assert_eq!(
                    requests_of(&server, run_id),
                    *n,
                    "paused run {run_id} sent a request"
                ),
                None => {}
            }
        }
        for run_id in ended_first {
            paused.remove(&run_id);
            finished_first += 1;
        }
        if Instant::now() < next {
            return;
        }
        next = Instant::now() + Duration::from_millis(rng.u64(10..80));
        // Once a third of the runs completed, the whole deployment, once.
        let done = records
            .iter()
            .filter(|r| r.status == RunStatus::Completed)
            .count();
        if !deployment_paused && done >= runs / 3 {
            deployment_paused = true;
            let out = service.ok(&["pause", "--deployment", "fetcher"]);
            assert!(out.starts_with("paused deployment fetcher"), "{out}");
            // Every worker stops its runs at their next host call: nothing is held, and
            // the server hears nothing more.
            wait_for(
                service,
                Duration::from_secs(60),
                "every run parked",
                |runs| runs.iter().all(|r| r.status.is_finished() || parked(r)),
            );
            let before = server.seen().len();
            std::thread::sleep(Duration::from_millis(300));
            assert_eq!(
                server.seen().len(),
                before,
                "a paused deployment sent a request"
            );
            let unfinished = service
                .runs()
                .iter()
                .filter(|r| !r.status.is_finished())
                .count();
            let out = service.ok(&["resume", "--deployment", "fetcher"]);
            assert!(out.starts_with("resumed deployment fetcher"), "{out}");
            // The runs paused one by one stay paused; the others are due again.
            let still: usize = service
                .runs()
                .iter()
                .filter(|r| r.status == RunStatus::Paused)
                .count();
            assert!(still <= paused.len() && still <= unfinished, "{still}");
            return;
        }
        if !paused.is_empty() && (rng.bool() || paused.len() >= 8) {
            let run_id = paused
                .keys()
                .nth(rng.usize(0..paused.len()))
                .unwrap()
                .clone();
            let out = service.cli(&["resume", &run_id]);
            let parked_before = paused.remove(&run_id).unwrap().is_some();
            if out.status.success() {
                assert_eq!(stdout(&out).trim(), format!("resumed run {run_id}"));
                resumed += 1;
            } else {
                // Its agent returned just now, before its worker heard of the pause.
                assert!(!parked_before, "run {run_id} completed while parked");
                assert!(
                    stderr(&out).contains("already completed"),
                    "{}",
                    stderr(&out)
                );
                finished_first += 1;
            }
            return;
        }
        let running: Vec<&RunRecord> = records
            .iter()
            .filter(|r| matches!(r.status, RunStatus::Running | RunStatus::Queued))
            .collect();
        if running.is_empty() {
            return;
        }
        let run_id = running[rng.usize(0..running.len())].run_id.clone();
        let out = service.cli(&["pause", &run_id]);
        if !out.status.success() {
            // It completed between the look and the pause: refused, nothing changed.
            assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
            assert!(
                stderr(&out).contains("already completed"),
                "{}",
                stderr(&out)
            );
            assert_eq!(record(service, &run_id).status, RunStatus::Completed);
            refused += 1;
            return;
        }
        let out = stdout(&out);
        if out.starts_with("pause requested: worker") {
            requested += 1;
        } else {
            assert_eq!(out.trim(), format!("paused run {run_id}"));
            at_once += 1;
        }
        paused.insert(run_id, None);
    });
    for worker in &mut workers {
        signal(worker, "TERM");
        assert!(worker.wait().unwrap().success());
    }
    eprintln!(
        "{requested} pauses asked of a worker, {at_once} at once, {resumed} resumes, \
         {refused} refused (completed first), {finished_first} ended before their worker heard"
    );
    assert!(requested >= 3, "only {requested} pauses reached a worker");
    assert!(resumed >= 3, "only {resumed} resumes");

    let records = service.runs();
    assert_eq!(records.len(), runs);
    for run in &records {
        assert_eq!(run.status, RunStatus::Completed, "{}", run.run_id);
        let output: Value = serde_json::from_slice(run.outcome.as_deref().unwrap()).unwrap();
        let replies = output["replies"].as_array().unwrap();
        assert_eq!(replies.len() as u64, STEPS, "{}", run.run_id);
        for (i, reply) in replies.iter().enumerate() {
            assert_eq!(
                reply["body"],
                format!("POST /step/{i} ok"),
                "{}",
                run.run_id
            );
        }
    }
    let keys = by_key(&server.seen());
    assert_eq!(
        keys.len(),
        runs * STEPS as usize,
        "every key reached the server"
    );
    // Nothing was killed: a pause cuts no side effect in two, so nothing repeats (a
    // drain that stopped an instance while its commit was being written once made
    // its claim be retaken in doubt; see `Watch::settle_started`).
    let repeats = assert_effects_fenced(service, &server);
    assert_eq!(repeats, 0, "effects repeated");
}

#[test]
fn a_paused_run_stays_paused_across_its_workers_restart() {
    let service = Service::new();
    let server = TestServer::start();
    deploy_fetcher(&service, &server, &["--lease", "1s"]);
    // Slow steps: the worker holds the run, mid-step, when the pause lands.
    submit(&service, &server, "slow", 400);
    let mut worker = service.worker("w0", &["--lease", "1s"]);
    wait_for(
        &service,
        Duration::from_secs(60),
        "the run leased",
        |runs| runs.iter().any(|r| r.lease.is_some()),
    );
    let out = service.ok(&["pause", "slow"]);
    assert!(out.starts_with("pause requested: worker w0"), "{out}");
    // Asking again changes nothing.
    assert_eq!(
        service.ok(&["pause", "slow"]).trim(),
        "run slow was paused already"
    );
    wait_for(
        &service,
        Duration::from_secs(30),
        "the run parked",
        |runs| parked(&runs[0]),
    );
    // The step in flight committed before the run stopped: every request is a
    // committed key, none was cut off.
    let sent = requests_of(&server, "slow");
    assert!(sent >= 1);
    let committed = crate::http::committed(&service.path(), "slow");
    assert_eq!(committed.len(), sent);
    let shown = service.ok(&["show", "slow"]);
    assert!(shown.contains("status    paused"), "{shown}");
    assert!(shown.contains("paused    by an operator"), "{shown}");
    let listed = service.ok(&["ls", "--status", "paused"]);
    assert!(listed.contains("slow"), "{listed}");
    assert!(!service.ok(&["ls", "--status", "running"]).contains("slow"));

    // The worker is killed and another starts: the run stays paused, sends nothing.
    worker.kill().unwrap();
    worker.wait().unwrap();
    let mut worker = service.worker("w1", &["--lease", "1s"]);
    std::thread::sleep(Duration::from_millis(1500));
    let run = record(&service, "slow");
    assert_eq!(
        (run.status, run.paused_by),
        (RunStatus::Paused, Some(PausedBy::Run))
    );
    assert_eq!(requests_of(&server, "slow"), sent);

    // Resumed: it goes on from its checkpoint and completes, each key sent once.
    assert_eq!(service.ok(&["resume", "slow"]).trim(), "resumed run slow");
    assert_eq!(
        service.ok(&["resume", "slow"]).trim(),
        "run slow was not paused"
    );
    service.wait_all_finished(Duration::from_secs(60), || {});
    let run = record(&service, "slow");
    assert_eq!(run.status, RunStatus::Completed);
    assert_eq!(requests_of(&server, "slow"), STEPS as usize);
    assert!(
        by_key(&server.seen())
            .values()
            .all(|tokens| tokens.len() == 1)
    );
    signal(&worker, "TERM");
    assert!(worker.wait().unwrap().success());
}

#[test]
fn bad_pauses_and_resumes_are_refused_and_change_nothing() {
    let service = Service::new();
    let server = TestServer::start();
    deploy_fetcher(&service, &server, &[]);
    submit(&service, &server, "queued", 0);
    let expect_refused = |args: &[&str], says: &str| {
        let out = service.cli(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    };
    expect_refused(&["pause", "ghost"], "run \"ghost\" does not exist");
    expect_refused(&["resume", "ghost"], "run \"ghost\" does not exist");
    // A list with one unknown run in it pauses none of them.
    expect_refused(
        &["pause", "queued", "ghost"],
        "run \"ghost\" does not exist",
    );
    assert_eq!(record(&service, "queued").status, RunStatus::Queued);
    expect_refused(&["pause", "--deployment", "nobody"], "nobody");
    expect_refused(&["resume", "--deployment", "nobody"], "nobody");
    // Neither runs nor a deployment: clap refuses.
    expect_refused(&["pause"], "RUN");
    // A finished run.
    service.ok(&["cancel", "queued"]);
    expect_refused(&["pause", "queued"], "already cancelled");
    expect_refused(&["resume", "queued"], "already cancelled");
    let run = record(&service, "queued");
    assert_eq!((run.status, run.paused_by), (RunStatus::Cancelled, None));
    assert!(!service.ok(&["ls", "--status", "paused"]).contains("queued"));
}

#[test]
fn the_api_pauses_and_resumes_runs_and_deployments_and_metrics_count_them() {
    let service = Service::new();
    let server = TestServer::start();
    deploy_fetcher(&service, &server, &[]);
    submit(&service, &server, "one", 0);
    submit(&service, &server, "two", 0);
    let served = crate::serve::Served::start(&service.db(), &["--no-auth", "--no-cache"]);
    let post = |path: &str| served.post_json(path, None, &json!({}));
    let r = post("/api/runs/one/pause");
    assert_eq!((r.status, r.json()), (200, json!({ "paused": "now" })));
    let r = post("/api/runs/one/pause");
    assert_eq!((r.status, r.json()), (200, json!({ "paused": "already" })));
    let shown = served.get("/api/runs/one").json();
    assert_eq!(shown["run"]["status"], "paused");
    assert_eq!(shown["run"]["paused_by"], "run");
    let metrics = crate::serve::scrape(&served);
    assert_eq!(metrics["idem_runs{status=\"paused\"}"], 1.0);
    assert_eq!(metrics["idem_runs{status=\"queued\"}"], 1.0);
    // The deployment: the other run too, and the list says it is paused.
    let r = post("/api/deployments/fetcher/pause");
    assert_eq!(
        (r.status, r.json()),
        (
            200,
            json!({ "deployment": "fetcher", "was_paused": false, "runs": 1, "held": 0 })
        )
    );
    assert_eq!(
        served.get("/api/deployments").json()["paused"][0]["name"],
        "fetcher"
    );
    let metrics = crate::serve::scrape(&served);
    assert_eq!(metrics["idem_runs{status=\"paused\"}"], 2.0);
    let listed = served.get("/api/runs?status=paused").json();
    assert_eq!(listed["runs"].as_array().unwrap().len(), 2, "{listed}");
    let r = post("/api/deployments/fetcher/resume");
    assert_eq!(r.json()["runs"], 1);
    let r = post("/api/runs/one/resume");
    assert_eq!((r.status, r.json()), (200, json!({ "resumed": true })));
    let r = post("/api/runs/one/resume");
    assert_eq!((r.status, r.json()), (200, json!({ "resumed": false })));
    // Bad input: typed errors, nothing changed.
    let r = post("/api/runs/ghost/pause");
    assert_eq!(
        (r.status, r.json()["error"]["code"].clone()),
        (404, json!("unknown_run"))
    );
    let r = post("/api/deployments/nobody/pause");
    assert_eq!(
        (r.status, r.json()["error"]["code"].clone()),
        (404, json!("unknown_deployment"))
    );
    service.ok(&["cancel", "two"]);
    let r = post("/api/runs/two/pause");
    assert_eq!(
        (r.status, r.json()["error"]["code"].clone()),
        (409, json!("run_finished"))
    );
    let metrics = crate::serve::scrape(&served);
    assert_eq!(metrics["idem_runs{status=\"paused\"}"], 0.0);
}
