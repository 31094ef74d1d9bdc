//! Schedules through the real binary: `idem schedule create` and worker processes that
//! fire the ticks — each tick one run, through SIGKILLs of the workers, on SQLite and
//! on PostgreSQL — with every run's side effect counted at a loopback HTTP server; the
//! catch-up and overlap policies on real workers; and bad definitions refused with
//! nothing written.

use std::process::Child;
use std::time::{Duration, Instant};

use idem::store::{Millis, RunStatus, ScheduleRecord, schedule_run_id};
use serde_json::{Value, json};

use crate::http::{TestServer, post_key};
use crate::util::{block_on, stderr};
use crate::workers::{Service, assert_effects_fenced, by_key, deploy_fetcher, signal};

fn schedule(service: &Service, name: &str) -> ScheduleRecord {
    block_on(service.store().schedule(name)).unwrap().unwrap()
}

/// The ticks of the runs the schedule started, from the store, sorted.
fn ticks_of(service: &Service, name: &str) -> Vec<(Millis, String)> {
    let store = service.store();
    let mut ticks: Vec<(Millis, String)> = service
        .runs()
        .into_iter()
        .filter_map(|run| {
            let by = block_on(store.run_schedule(&run.run_id)).unwrap()?;
            (by.schedule == name).then_some((by.tick, run.run_id))
        })
        .collect();
    ticks.sort();
    ticks
}

fn stop(workers: &mut [Child]) {
    for worker in workers {
        signal(worker, "TERM");
        let status = worker.wait().unwrap();
        assert!(status.success(), "a drained worker exits 0: {status:?}");
    }
}

#[test]
fn a_schedule_fires_each_of_100_ticks_once_through_kills() {
    let service = Service::new();
    ticks_through_kills(&service, 0x5c_4ed);
    crate::util::integrity_ok(&service.path());
}

#[test]
fn a_schedule_fires_each_of_100_ticks_once_through_kills_on_postgres() {
    let Some(schema) = crate::postgres::Schema::create("schedule-kills") else {
        return;
    };
    let service = Service::on_postgres(schema.url());
    ticks_through_kills(&service, 0x5c_4ee);
    let url = schema.url();
    // Counted in the database itself: one run per tick, one tick per run.
    let runs = crate::postgres::count(&url, "SELECT count(*) FROM runs");
    let ticks = crate::postgres::count(&url, "SELECT count(DISTINCT tick) FROM scheduled_runs");
    assert_eq!(runs, ticks);
}

/// A schedule ticking every 100 ms (catch-up 100, overlap allowed) fires at least 100
/// ticks while three workers are SIGKILLed at seeded moments and restarted: every
/// tick from the first to the last started exactly one run (named after its tick),
/// none was missed, and each run's one side effect reached the server (again only as
/// a retake in doubt).
fn ticks_through_kills(service: &Service, seed: u64) {
    const EVERY: Millis = 100;
    const TICKS: u64 = 100;
    let server = TestServer::start();
    deploy_fetcher(service, &server, &["--lease", "1s"]);
    let input = json!({ "steps": 1, "url": server.url() });
    service.ok(&[
        "schedule",
        "create",
        "tick",
        "--deployment",
        "fetcher",
        "--every",
        "100ms",
        "--catch-up",
        "100",
        "--overlap",
        "allow",
        "--input",
        &input.to_string(),
    ]);
    let flags = ["--lease", "1s", "--concurrency", "8"];
    let mut workers: Vec<Child> = (0..3)
        .map(|w| service.worker(&format!("w{w}"), &flags))
        .collect();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut kills = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while schedule(service, "tick").ticks.started < TICKS {
        assert!(Instant::now() < deadline, "{:?}", schedule(service, "tick"));
        std::thread::sleep(Duration::from_millis(rng.u64(30..250)));
        let w = rng.usize(0..workers.len());
        workers[w].kill().unwrap();
        workers[w].wait().unwrap();
        kills += 1;
        workers[w] = service.worker(&format!("w{w}"), &flags);
    }
    service.ok(&["schedule", "pause", "tick"]);
    service.wait_all_finished(Duration::from_secs(120), || {});
    stop(&mut workers);

    let record = schedule(service, "tick");
    let ticks = ticks_of(service, "tick");
    let runs = service.runs();
    assert!(ticks.len() as u64 >= TICKS, "{record:?}");
    assert_eq!(ticks.len(), runs.len(), "every run was started by a tick");
    assert_eq!(record.ticks.started, ticks.len() as u64, "{record:?}");
    assert_eq!(
        (
            record.ticks.missed,
            record.ticks.skipped,
            record.ticks.failed
        ),
        (0, 0, 0),
        "{record:?}"
    );
    // One run per tick, and no tick between the first and the last left out.
    for pair in ticks.windows(2) {
        assert_eq!(pair[1].0 - pair[0].0, EVERY, "{pair:?}");
    }
    for (tick, run_id) in &ticks {
        assert_eq!(run_id, &schedule_run_id("tick", *tick));
    }
    for run in &runs {
        assert_eq!(run.status, RunStatus::Completed, "{}", run.run_id);
    }
    let keys = by_key(&server.seen());
    for (_, run_id) in &ticks {
        assert!(
            keys.contains_key(&post_key(run_id, 0)),
            "{run_id}'s effect never reached the server"
        );
    }
    assert_eq!(keys.len(), ticks.len(), "one effect per tick");
    let repeats = assert_effects_fenced(service, &server);
    eprintln!(
        "{} ticks, {kills} kills, {repeats} effects repeated in doubt",
        ticks.len()
    );
}

/// Deploys the fetcher and creates a schedule of it with these flags; each run makes
/// one request, sleeping `pause_ms` in it.
fn scheduled_fetcher(service: &Service, server: &TestServer, pause_ms: u64, flags: &[&str]) {
    deploy_fetcher(service, server, &["--lease", "1s"]);
    let input = json!({ "steps": 1, "url": server.url(), "pause_ms": pause_ms });
    let input = input.to_string();
    let mut args = vec![
        "schedule",
        "create",
        "s",
        "--deployment",
        "fetcher",
        "--input",
        &input,
    ];
    args.extend_from_slice(flags);
    service.ok(&args);
}

#[test]
fn overlap_skip_runs_one_at_a_time_and_counts_the_ticks_it_skipped() {
    let service = Service::new();
    let server = TestServer::start();
    scheduled_fetcher(
        &service,
        &server,
        700,
        &["--every", "200ms", "--overlap", "skip"],
    );
    let mut workers = vec![service.worker("w", &["--lease", "1s"])];
    std::thread::sleep(Duration::from_millis(2500));
    service.ok(&["schedule", "pause", "s"]);
    service.wait_all_finished(Duration::from_secs(30), || {});
    stop(&mut workers);
    let record = schedule(&service, "s");
    let mut runs = service.runs();
    runs.sort_by_key(|r| r.created);
    assert!(runs.len() >= 2, "{record:?}");
    assert!(record.ticks.skipped >= 2, "{record:?}");
    // Each run was started after the one before it ended.
    for pair in runs.windows(2) {
        assert_eq!(pair[0].status, RunStatus::Completed);
        assert!(pair[1].created >= pair[0].updated, "{pair:?}");
    }
    assert_eq!(server.seen().len(), runs.len());
}

#[test]
fn overlap_cancel_previous_cancels_the_run_still_going() {
    let service = Service::new();
    let server = TestServer::start();
    scheduled_fetcher(
        &service,
        &server,
        5_000,
        &["--every", "300ms", "--overlap", "cancel-previous"],
    );
    let mut workers = vec![service.worker("w", &["--lease", "1s"])];
    let deadline = Instant::now() + Duration::from_secs(30);
    while schedule(&service, "s").ticks.started < 4 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(50));
    }
    service.ok(&["schedule", "pause", "s"]);
    let last = schedule(&service, "s").last_run.unwrap();
    service.ok(&["cancel", &last]);
    service.wait_all_finished(Duration::from_secs(30), || {});
    stop(&mut workers);
    let record = schedule(&service, "s");
    assert_eq!(record.ticks.skipped, 0, "{record:?}");
    let runs = service.runs();
    assert_eq!(runs.len() as u64, record.ticks.started);
    for run in &runs {
        assert_eq!(run.status, RunStatus::Cancelled, "{}", run.run_id);
    }
}

#[test]
fn a_late_schedule_catches_up_its_limit_and_counts_the_rest_missed() {
    let service = Service::new();
    let server = TestServer::start();
    scheduled_fetcher(
        &service,
        &server,
        0,
        &["--every", "200ms", "--catch-up", "2", "--overlap", "allow"],
    );
    // No worker for a while: five ticks or more fall.
    std::thread::sleep(Duration::from_millis(1200));
    let mut workers = vec![service.worker("w", &["--lease", "1s"])];
    let deadline = Instant::now() + Duration::from_secs(30);
    while schedule(&service, "s").ticks.started < 3 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    service.ok(&["schedule", "pause", "s"]);
    service.wait_all_finished(Duration::from_secs(30), || {});
    stop(&mut workers);
    let record = schedule(&service, "s");
    let ticks = ticks_of(&service, "s");
    // The first firing started the latest tick and the two before it, together. In
    // the order they were made: run ids do not sort by tick (`s@…36Z` is a whole second,
    // after `s@…36.600Z`).
    let mut runs = service.runs();
    runs.sort_by_key(|r| (r.created, r.run_id.clone()));
    assert_eq!(runs[0].created, runs[2].created, "{runs:?}");
    assert_eq!(ticks[1].0 - ticks[0].0, 200);
    assert_eq!(ticks[2].0 - ticks[1].0, 200);
    assert!(record.ticks.missed >= 2, "{record:?}");
    assert_eq!(server.seen().len() as u64, record.ticks.started);
}

#[test]
fn schedule_commands_list_show_and_name_the_schedule_of_a_run() {
    let service = Service::new();
    let server = TestServer::start();
    scheduled_fetcher(
        &service,
        &server,
        0,
        &["--cron", "0 9 * * MON", "--tz", "Europe/Paris"],
    );
    let ls = service.ok(&["schedule", "ls"]);
    assert!(ls.contains("cron \"0 9 * * MON\" (Europe/Paris)"), "{ls}");
    let doc: Value =
        serde_json::from_str(&service.ok(&["schedule", "show", "s", "--json"])).unwrap();
    assert_eq!(doc["schedule"]["overlap"], "skip");
    assert_eq!(doc["upcoming"].as_array().unwrap().len(), 5);
    assert_eq!(doc["input"]["steps"], 1);
    // Mondays 09:00 in Paris: 07:00 or 08:00 UTC.
    let next = doc["upcoming"][0].as_i64().unwrap();
    let hour = next.rem_euclid(86_400_000) / 3_600_000;
    assert!(hour == 7 || hour == 8, "{doc}");
    let list: Value = serde_json::from_str(&service.ok(&["schedule", "ls", "--json"])).unwrap();
    assert_eq!(list["schedules"][0]["name"], "s");
    // A schedule of an interval fires on a worker; `idem show` names it.
    service.ok(&[
        "schedule",
        "create",
        "fast",
        "--deployment",
        "fetcher",
        "--every",
        "100ms",
        "--input",
        &json!({ "steps": 1, "url": server.url() }).to_string(),
    ]);
    let mut workers = vec![service.worker("w", &[])];
    let deadline = Instant::now() + Duration::from_secs(30);
    while schedule(&service, "fast").ticks.started < 1 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    service.ok(&["schedule", "pause", "fast"]);
    let paused = service.ok(&["schedule", "pause", "fast"]);
    assert!(paused.contains("was paused already"), "{paused}");
    service.wait_all_finished(Duration::from_secs(30), || {});
    stop(&mut workers);
    let run_id = schedule(&service, "fast").last_run.unwrap();
    let shown = service.ok(&["show", &run_id]);
    assert!(shown.contains("schedule  fast (tick "), "{shown}");
    let doc: Value = serde_json::from_str(&service.ok(&["show", &run_id, "--json"])).unwrap();
    assert_eq!(doc["schedule"]["schedule"], "fast");
    service.ok(&["schedule", "delete", "fast"]);
    let ls = service.ok(&["schedule", "ls"]);
    assert!(!ls.contains("fast"), "{ls}");
}

#[test]
fn bad_schedules_are_refused_with_a_reason_and_change_nothing() {
    let service = Service::new();
    let server = TestServer::start();
    scheduled_fetcher(&service, &server, 0, &["--every", "1h"]);
    let listed = || -> Value {
        let doc: Value = serde_json::from_str(&service.ok(&["schedule", "ls", "--json"])).unwrap();
        doc["schedules"].clone()
    };
    let before = listed();
    let cases: &[(&[&str], &str)] = &[
        (&["--cron", "61 * * * *"], "--cron: invalid cron expression"),
        (
            &["--cron", "every morning"],
            "--cron: invalid cron expression",
        ),
        (
            &["--cron", "0 9 * * *", "--tz", "Mars/Olympus"],
            "--tz: unknown time zone",
        ),
        (
            &["--every", "0s"],
            "--every: interval of 0 ms is out of range",
        ),
        (&["--every", "10ms"], "out of range"),
        (&["--every", "500d"], "out of range"),
        (&["--every", "soon"], "is not a length of time"),
        (
            &["--every", "1h", "--deployment", "nobody"],
            "no agent is deployed as",
        ),
        (
            &["--every", "1h", "--catch-up", "5000"],
            "over the most a schedule starts",
        ),
        (
            &["--every", "1h", "--input", "{not json"],
            "--input is not valid JSON",
        ),
        (
            &["--every", "1h", "--overlap", "queue"],
            "unknown overlap policy",
        ),
        (
            &["--every", "1h", "--cron", "* * * * *"],
            "cannot be used with",
        ),
        (&[], "required"),
    ];
    for (flags, expected) in cases {
        let mut args = vec!["schedule", "create", "new"];
        if !flags.contains(&"--deployment") {
            args.extend_from_slice(&["--deployment", "fetcher"]);
        }
        args.extend_from_slice(flags);
        let out = service.cli(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(expected),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    // A taken name, and names a run id cannot carry.
    for (name, expected) in [
        ("s", "a schedule of that name exists"),
        ("a/b", "without '/' or '@'"),
        ("a@b", "without '/' or '@'"),
    ] {
        let out = service.cli(&[
            "schedule",
            "create",
            name,
            "--deployment",
            "fetcher",
            "--every",
            "1m",
        ]);
        assert_eq!(out.status.code(), Some(2), "{name}: {}", stderr(&out));
        assert!(stderr(&out).contains(expected), "{name}: {}", stderr(&out));
    }
    for verb in ["show", "pause", "resume", "delete"] {
        let out = service.cli(&["schedule", verb, "nothing"]);
        assert_eq!(out.status.code(), Some(2), "{verb}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("schedule \"nothing\" does not exist"),
            "{}",
            stderr(&out)
        );
    }
    assert_eq!(listed(), before);
    assert!(service.runs().is_empty());
}

#[test]
fn the_api_creates_pauses_resumes_and_deletes_schedules() {
    let service = Service::new();
    let server = TestServer::start();
    deploy_fetcher(&service, &server, &[]);
    let served = crate::serve::Served::start(&service.db(), &["--no-auth", "--no-cache"]);
    let input = json!({ "steps": 1, "url": server.url() });
    let r = served.post_json(
        "/api/schedules",
        None,
        &json!({ "name": "hourly", "deployment": "fetcher", "every": "1h", "input": input }),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["schedule"]["paused"], false);
    let created = schedule(&service, "hourly");

    // Paused: the store has it paused, its next tick kept; asking again changes
    // nothing.
    let r = served.post_json("/api/schedules/hourly/pause", None, &json!({}));
    assert_eq!(r.status, 200, "{}", r.text());
    let paused = schedule(&service, "hourly");
    assert!(paused.paused);
    assert_eq!(paused.next_tick, created.next_tick);
    assert_eq!(r.json()["schedule"], serde_json::to_value(&paused).unwrap());
    let again = served.post_json("/api/schedules/hourly/pause", None, &json!({}));
    assert_eq!(again.status, 200, "{}", again.text());
    assert_eq!(
        schedule(&service, "hourly"),
        paused,
        "paused twice: unchanged"
    );
    let listed = served.get("/api/schedules").json();
    assert_eq!(listed["schedules"][0]["paused"], true, "{listed}");
    let shown = served.get("/api/schedules/hourly").json();
    assert_eq!(
        shown["upcoming"],
        json!([]),
        "no ticks while paused: {shown}"
    );

    // Resumed: from now, its next tick after the store's clock.
    let now = listed["now"].as_i64().unwrap();
    let r = served.post_json("/api/schedules/hourly/resume", None, &json!({}));
    assert_eq!(r.status, 200, "{}", r.text());
    let resumed = schedule(&service, "hourly");
    assert!(!resumed.paused);
    assert!(resumed.next_tick.unwrap() > now, "{resumed:?}");
    assert_eq!(r.json()["schedule"]["paused"], false);

    // An unknown schedule: refused with its code, nothing changed.
    for verb in ["pause", "resume"] {
        let r = served.post_json(&format!("/api/schedules/ghost/{verb}"), None, &json!({}));
        assert_eq!((r.status, r.code().as_str()), (404, "unknown_schedule"));
    }
    assert_eq!(schedule(&service, "hourly"), resumed);

    let r = request_delete(&served, "/api/schedules/hourly");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        block_on(service.store().schedule("hourly"))
            .unwrap()
            .is_none()
    );
    assert_eq!(
        request_delete(&served, "/api/schedules/hourly").code(),
        "unknown_schedule"
    );
}

fn request_delete(served: &crate::serve::Served, path: &str) -> crate::serve::Reply {
    crate::serve::request(served.addr, "DELETE", path, &[], b"")
}
