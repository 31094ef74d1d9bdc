//! Runs as a service: agents deployed to the store, runs submitted, `idem worker`
//! processes leasing and driving them — SIGKILLed, paused past their leases, drained
//! with SIGTERM — with every side effect counted at a real HTTP server on loopback.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use idem::store::{EventKind, PostgresStore, RunFilter, RunStatus, Store, SyncMode};
use idem_test_artifacts::{FETCHER, HOSTILE, LEDGER};
use serde_json::{Value, json};

use crate::http::{Seen, TestServer};
use crate::util::{
    StderrLines, block_on, integrity_ok, open_store_read_only, run_cli, stderr, stdout,
};

const KEY: &str = "idempotency-key";
const TOKEN: &str = "idempotency-token";

/// A store the workers share: a SQLite file in a temp dir, or a PostgreSQL database.
pub struct Service {
    dir: tempfile::TempDir,
    url: Option<String>,
    postgres: std::sync::OnceLock<std::sync::Arc<dyn Store>>,
}

impl Service {
    pub(crate) fn new() -> Service {
        Service {
            dir: tempfile::tempdir().unwrap(),
            url: None,
            postgres: std::sync::OnceLock::new(),
        }
    }

    /// Workers sharing the PostgreSQL database at `url`.
    pub fn on_postgres(url: String) -> Service {
        Service {
            url: Some(url),
            ..Service::new()
        }
    }

    pub(crate) fn db(&self) -> String {
        if let Some(url) = &self.url {
            return url.clone();
        }
        self.dir
            .path()
            .join("idem.db")
            .to_str()
            .unwrap()
            .to_string()
    }

    pub(crate) fn path(&self) -> PathBuf {
        self.dir.path().join("idem.db")
    }

    pub(crate) fn cli(&self, args: &[&str]) -> std::process::Output {
        let db = self.db();
        let mut all = args.to_vec();
        all.extend_from_slice(&["--db", &db]);
        run_cli(&all)
    }

    pub(crate) fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        stdout(&out)
    }

    /// Starts `idem worker` with these extra flags.
    pub(crate) fn worker(&self, name: &str, extra: &[&str]) -> Child {
        Command::new(env!("CARGO_BIN_EXE_idem"))
            .args([
                "worker",
                "--db",
                &self.db(),
                "--name",
                name,
                "--poll",
                "20ms",
            ])
            .args(extra)
            .env("IDEM_LOG", "error")
            .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    pub(crate) fn store(&self) -> std::sync::Arc<dyn Store> {
        match &self.url {
            Some(url) => std::sync::Arc::clone(self.postgres.get_or_init(|| {
                let store = block_on(PostgresStore::connect(url, SyncMode::Normal)).unwrap();
                std::sync::Arc::new(store)
            })),
            None => open_store_read_only(&self.path()),
        }
    }

    pub(crate) fn runs(&self) -> Vec<idem::store::RunRecord> {
        self.try_runs().unwrap()
    }

    pub(crate) fn try_runs(&self) -> Result<Vec<idem::store::RunRecord>, idem::store::StoreError> {
        block_on(self.store().runs(&RunFilter::default()))
    }

    /// Waits until every run is finished, or panics after `limit`.
    pub(crate) fn wait_all_finished(&self, limit: Duration, mut while_waiting: impl FnMut()) {
        let deadline = Instant::now() + limit;
        loop {
            // A database restarting under the test is not an answer yet.
            let runs = self.try_runs().unwrap_or_default();
            if !runs.is_empty() && runs.iter().all(|r| r.status.is_finished()) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "runs unfinished: {:?}",
                runs.iter()
                    .filter(|r| !r.status.is_finished())
                    .map(|r| (&r.run_id, r.status))
                    .collect::<Vec<_>>()
            );
            while_waiting();
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

pub(crate) fn signal(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Every key's requests, in arrival order.
pub(crate) fn by_key(seen: &[Seen]) -> BTreeMap<String, Vec<u64>> {
    let mut keys: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for s in seen {
        keys.entry(s.header(KEY).to_string())
            .or_default()
            .push(s.token(TOKEN));
    }
    keys
}

/// Every key reached the server with strictly growing tokens (a stale holder never
/// sent after a newer one), at most as often as it was granted, and the retakes beyond
/// the first request are accounted for by the runs' reclaimed counts.
pub(crate) fn assert_effects_fenced(service: &Service, server: &TestServer) -> usize {
    let seen = server.seen();
    let keys = by_key(&seen);
    let store = service.store();
    let mut granted = BTreeMap::new();
    let mut reclaimed = 0;
    for run in service.runs() {
        reclaimed += run.counts.reclaimed;
        for step in block_on(store.steps(&run.run_id)).unwrap() {
            let key = step.key.split_once(':').unwrap().1.to_string();
            granted.insert(key, (step.attempt, step.token, step.committed_at.is_some()));
        }
    }
    let mut repeats = 0;
    for (key, tokens) in &keys {
        assert!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "key {key}: tokens must grow in arrival order: {tokens:?}"
        );
        let (attempt, token, committed) = granted[key];
        assert!(
            committed,
            "key {key} reached the server but was never committed"
        );
        assert!(
            tokens.len() as u32 <= attempt,
            "key {key}: {} requests for {attempt} grants",
            tokens.len()
        );
        assert!(*tokens.last().unwrap() <= token, "key {key}");
        repeats += tokens.len() - 1;
    }
    assert!(
        repeats as u64 <= reclaimed,
        "{repeats} repeated requests, but only {reclaimed} retakes in doubt"
    );
    repeats
}

pub(crate) fn deploy_fetcher(service: &Service, server: &TestServer, extra: &[&str]) {
    let grant = format!("127.0.0.1:{}", server.port());
    let mut args = vec![
        "deploy",
        FETCHER,
        "--name",
        "fetcher",
        "--allow-http",
        &grant,
    ];
    args.extend_from_slice(extra);
    service.ok(&args);
}

/// A worker asked to stop before it started (here: while it waits for a database
/// nobody serves yet) drains nothing and exits 0, as a drained worker does, rather than
/// dying of the signal: a supervisor stopping workers cannot tell when each started.
#[test]
fn a_worker_stopped_while_it_starts_exits_0() {
    let url = format!(
        "postgres://root@127.0.0.1:{}/test",
        crate::postgres::free_port()
    );
    let mut worker = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["worker", "--db", &url])
        .env("IDEM_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = crate::util::StderrLines::of(&mut worker);
    lines.wait_for("cannot reach the server", Duration::from_secs(30));
    signal(&worker, "TERM");
    let status = worker.wait().unwrap();
    assert!(status.success(), "{status:?}: {}", lines.rest());
}

#[test]
fn three_workers_complete_200_runs_through_50_kills_each_effect_fenced() {
    workers_through_kills(200, 50, 0x3_0000_0200);
}

/// The same, longer: `cargo test -p idem-cli --test all -- --ignored workers_soak`.
#[test]
#[ignore = "a soak of several minutes; run by hand"]
fn workers_soak_1000_runs_300_kills() {
    workers_through_kills(1000, 300, 0x3_0000_1000);
}

/// `runs` runs of a three-step HTTP agent, three workers, at least `min_kills`
/// SIGKILLs of a random worker (restarted at once), at seeded moments.
fn workers_through_kills(runs: usize, min_kills: u32, seed: u64) {
    let service = Service::new();
    workers_through_kills_on(&service, runs, min_kills, seed, |_| {});
    integrity_ok(&service.path());
}

/// [`workers_through_kills`] on any store; `after_kill` is called with the number of
/// kills so far after each (to restart a database server under the workers, say).
pub fn workers_through_kills_on(
    service: &Service,
    runs: usize,
    min_kills: u32,
    seed: u64,
    mut after_kill: impl FnMut(u32),
) {
    const STEPS: u64 = 3;
    let server = TestServer::start();
    // Short leases: a killed worker's runs are taken over within a second.
    deploy_fetcher(service, &server, &["--lease", "1s"]);
    for i in 0..runs {
        let input =
            json!({ "steps": STEPS, "url": server.url(), "pause_ms": 100, "pause_after": true });
        service.ok(&[
            "submit",
            "fetcher",
            "--run-id",
            &format!("run-{i:03}"),
            "--input",
            &input.to_string(),
        ]);
    }
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut workers: Vec<Child> = (0..3)
        .map(|w| service.worker(&format!("w{w}"), &["--lease", "1s", "--concurrency", "4"]))
        .collect();
    let mut kills = 0;
    let mut next_kill = Instant::now() + Duration::from_millis(rng.u64(20..150));
    service.wait_all_finished(Duration::from_secs(3600), || {
        if kills < min_kills && Instant::now() >= next_kill {
            let w = rng.usize(0..workers.len());
            workers[w].kill().unwrap();
            workers[w].wait().unwrap();
            kills += 1;
            workers[w] = service.worker(&format!("w{w}"), &["--lease", "1s", "--concurrency", "4"]);
            after_kill(kills);
            next_kill = Instant::now() + Duration::from_millis(rng.u64(20..150));
        }
    });
    assert!(
        kills >= min_kills,
        "only {kills} kills before every run finished"
    );
    for worker in &mut workers {
        signal(worker, "TERM");
        let status = worker.wait().unwrap();
        assert!(status.success(), "a drained worker exits 0: {status:?}");
    }

    assert_all_completed(service, &server, runs, STEPS);
    let repeats = assert_effects_fenced(service, &server);
    let takeovers = assert_timelines_match(service, &["w0", "w1", "w2"], kills);
    eprintln!("{kills} kills, {repeats} effects repeated in doubt, {takeovers} takeovers");
}

/// Whether `holder` is a worker named one of `workers` (a worker's holder name is its
/// name and a unique suffix).
fn is_one_of(holder: &str, workers: &[&str]) -> bool {
    workers
        .iter()
        .any(|w| holder == *w || holder.starts_with(&format!("{w}-")))
}

/// Every run's timeline accounts for what its counts say, after workers were killed
/// under it: one start per instance (numbered 1, 2, ...), each by one of `workers`
/// under a lease token that never goes back; each takeover from a worker's expired
/// lease to a greater token, naming the lease whose start the timeline shows last; a run
/// that retook a claim in doubt shows a takeover; and the run's end last. Returns the
/// takeovers (at least one).
pub(crate) fn assert_timelines_match(service: &Service, workers: &[&str], kills: u32) -> u64 {
    let store = service.store();
    let mut takeovers = 0;
    for run in service.runs() {
        let id = &run.run_id;
        let timeline = block_on(store.events(id)).unwrap().unwrap();
        assert_eq!(timeline.dropped, 0, "{id}");
        let events = &timeline.events;
        let starts: Vec<&idem::store::RunEvent> = events
            .iter()
            .filter(|e| e.kind == EventKind::Started)
            .collect();
        let numbers: Vec<u64> = starts
            .iter()
            .map(|e| e.detail["instance"].as_u64().unwrap())
            .collect();
        assert_eq!(
            numbers,
            (1..=run.counts.instances).collect::<Vec<u64>>(),
            "{id}: one start per instance: {events:#?}"
        );
        let mut last_token = 0;
        for start in &starts {
            let holder = start.holder.as_deref().unwrap_or_default();
            assert!(is_one_of(holder, workers), "{id}: started by {holder:?}");
            let token = start.token.unwrap();
            assert!(
                token >= last_token,
                "{id}: tokens never go back: {events:#?}"
            );
            last_token = token;
        }
        let taken: Vec<&idem::store::RunEvent> = events
            .iter()
            .filter(|e| e.kind == EventKind::TookOver)
            .collect();
        for (at, e) in events.iter().enumerate() {
            if e.kind != EventKind::TookOver {
                continue;
            }
            let from = e.detail["from_holder"].as_str().unwrap();
            let from_token = e.detail["from_token"].as_u64().unwrap();
            assert!(is_one_of(from, workers), "{id}: taken over from {from:?}");
            assert!(from_token < e.token.unwrap(), "{id}");
            // The lease taken over is the one the timeline last shows: its holder's
            // instance started and never ended.
            let before = events[..at]
                .iter()
                .rev()
                .find(|b| b.token.is_some())
                .unwrap();
            assert_eq!(
                (before.kind, before.token, before.holder.as_deref()),
                (EventKind::Started, Some(from_token), Some(from)),
                "{id}: {events:#?}"
            );
        }
        if run.counts.reclaimed > 0 {
            assert!(
                !taken.is_empty(),
                "{id}: retook {} claims in doubt but shows no takeover: {events:#?}",
                run.counts.reclaimed
            );
        }
        takeovers += taken.len() as u64;
        let last = events.last().unwrap();
        assert_eq!(last.kind, EventKind::Finished, "{id}: {events:#?}");
        assert_eq!(last.detail["status"], "completed", "{id}");
    }
    assert!(
        takeovers >= 1,
        "{kills} kills but no takeover on any timeline"
    );
    show_a_taken_over_run(service);
    takeovers
}

/// `idem show --events` and `--step` on a run that was taken over: the takeover and
/// each start in words, the timeline in JSON, a step opened; unknown runs and steps
/// refused as bad input.
fn show_a_taken_over_run(service: &Service) {
    let store = service.store();
    let run = service
        .runs()
        .into_iter()
        .find(|r| {
            let timeline = block_on(store.events(&r.run_id)).unwrap().unwrap();
            timeline
                .events
                .iter()
                .any(|e| e.kind == EventKind::TookOver)
        })
        .unwrap();
    let id = run.run_id.as_str();
    let text = service.ok(&["show", id, "--events"]);
    assert!(text.contains("timeline ("), "{text}");
    assert!(text.contains("instance 1 started on w"), "{text}");
    assert!(text.contains("took over on w"), "{text}");
    assert!(text.contains("run ended completed"), "{text}");
    let json: Value =
        serde_json::from_str(&service.ok(&["show", id, "--events", "--json"])).unwrap();
    let starts = json["timeline"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "started")
        .count();
    assert_eq!(starts as u64, run.counts.instances);
    let step = &block_on(store.steps(id)).unwrap()[0];
    let agent_key = step.key.split_once(':').unwrap().1;
    let opened = service.ok(&["show", id, "--step", agent_key]);
    assert!(
        opened.contains(&format!("step       {}", step.key)),
        "{opened}"
    );
    assert!(opened.contains("result     ("), "{opened}");
    assert!(
        opened.contains("checkpoint saved with it at step"),
        "{opened}"
    );
    let opened: Value =
        serde_json::from_str(&service.ok(&["show", id, "--step", &step.key, "--json"])).unwrap();
    assert_eq!(opened["step"]["token"], step.token);
    // Bad input: exit code 2, and the store says which.
    let out = service.cli(&["show", "no-such-run", "--events"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let out = service.cli(&["show", id, "--step", "no-such-step"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("has no step"), "{}", stderr(&out));
}

/// Every one of `runs` runs of the fetcher completed with the right output, and each
/// of its `steps` keys reached `server`.
pub(crate) fn assert_all_completed(
    service: &Service,
    server: &TestServer,
    runs: usize,
    steps: u64,
) {
    let records = service.runs();
    assert_eq!(records.len(), runs);
    for run in &records {
        assert_eq!(run.status, RunStatus::Completed, "{}", run.run_id);
        let output: Value = serde_json::from_slice(run.outcome.as_deref().unwrap()).unwrap();
        assert_eq!(output["steps"], steps, "{}", run.run_id);
        let replies = output["replies"].as_array().unwrap();
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
        runs * steps as usize,
        "every key reached the server"
    );
}

#[test]
fn a_paused_worker_loses_its_runs_and_every_write_it_tries_after_is_refused() {
    let server = TestServer::start();
    let service = Service::new();
    deploy_fetcher(&service, &server, &["--lease", "1s"]);
    // Each step pauses after its request: the zombie is stopped holding claims whose
    // effects went out but were not committed.
    for i in 0..4 {
        let input =
            json!({ "steps": 4, "url": server.url(), "pause_ms": 300, "pause_after": true });
        service.ok(&[
            "submit",
            "fetcher",
            "--run-id",
            &format!("z{i}"),
            "--input",
            &input.to_string(),
        ]);
    }
    let mut zombie = service.worker("zombie", &["--lease", "1s"]);
    // Let it take every run and start on them.
    let deadline = Instant::now() + Duration::from_secs(60);
    while server.seen().len() < 4 {
        assert!(Instant::now() < deadline, "the zombie never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    signal(&zombie, "STOP");
    // Past its leases, another worker takes the runs over and finishes them.
    let mut taker = service.worker("taker", &["--lease", "1s"]);
    service.wait_all_finished(Duration::from_secs(120), || {});
    let committed_before: Vec<_> = service
        .runs()
        .iter()
        .map(|r| (r.run_id.clone(), r.outcome.clone(), r.counts))
        .collect();
    let requests_before = server.seen().len();
    // The zombie wakes up: it must find every lease gone and write nothing.
    signal(&zombie, "CONT");
    std::thread::sleep(Duration::from_secs(3));
    signal(&zombie, "TERM");
    let status = zombie.wait().unwrap();
    let mut zombie_err = String::new();
    std::io::Read::read_to_string(zombie.stderr.as_mut().unwrap(), &mut zombie_err).unwrap();
    assert!(status.success(), "{zombie_err}");
    let committed_after: Vec<_> = service
        .runs()
        .iter()
        .map(|r| (r.run_id.clone(), r.outcome.clone(), r.counts))
        .collect();
    assert_eq!(
        committed_before, committed_after,
        "the zombie changed nothing"
    );
    // Its in-flight effects could not go out again under claims it lost.
    assert_eq!(server.seen().len(), requests_before, "{zombie_err}");
    for run in service.runs() {
        assert_eq!(run.status, RunStatus::Completed);
    }
    assert_effects_fenced(&service, &server);
    signal(&taker, "TERM");
    assert!(taker.wait().unwrap().success());
    integrity_ok(&service.path());
}

/// A drain waits for the side effects in flight; a second SIGTERM is the operator's word
/// that waiting is over: the worker exits at once with 130 and its run stays leased, to
/// be taken over once the lease expires.
#[test]
fn a_second_sigterm_ends_a_draining_worker_at_once() {
    let server = TestServer::start();
    let service = Service::new();
    deploy_fetcher(&service, &server, &[]);
    // The effect sleeps for a minute after its request: a drain would wait for it.
    let input = json!({ "steps": 1, "url": server.url(), "pause_ms": 60_000, "pause_after": true });
    service.ok(&[
        "submit",
        "fetcher",
        "--run-id",
        "slow",
        "--input",
        &input.to_string(),
    ]);
    let mut worker = service.worker("w", &["--drain-timeout", "5m"]);
    let said = StderrLines::of(&mut worker);
    let deadline = Instant::now() + Duration::from_secs(60);
    while server.seen().is_empty() {
        assert!(Instant::now() < deadline, "the worker never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    signal(&worker, "TERM");
    said.wait_for("idem worker: draining", Duration::from_secs(30));
    let second = Instant::now();
    signal(&worker, "TERM");
    let status = worker.wait().unwrap();
    let rest = said.rest();
    assert_eq!(status.code(), Some(130), "{rest}");
    assert!(
        second.elapsed() < Duration::from_secs(30),
        "it did not wait for the effect"
    );
    assert!(rest.contains("idem worker: exiting at once"), "{rest}");
    let run = block_on(service.store().run("slow")).unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Running);
    assert!(run.lease.is_some(), "the lease is left to expire: {run:?}");
}

#[test]
fn sigterm_drains_gives_leases_back_and_another_worker_goes_on_at_once() {
    let server = TestServer::start();
    let service = Service::new();
    // Leases of ten minutes: if the drained worker did not give them back, nobody
    // could take its runs over within this test.
    deploy_fetcher(&service, &server, &["--lease", "10m"]);
    for i in 0..6 {
        let input = json!({ "steps": 5, "url": server.url(), "pause_ms": 200 });
        service.ok(&[
            "submit",
            "fetcher",
            "--run-id",
            &format!("d{i}"),
            "--input",
            &input.to_string(),
        ]);
    }
    let mut first = service.worker("first", &["--lease", "10m"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while server.seen().len() < 6 {
        assert!(Instant::now() < deadline, "the worker never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    signal(&first, "TERM");
    let status = first.wait().unwrap();
    assert_eq!(status.code(), Some(0), "a drained worker exits 0");
    // Drained: no run is left with a live lease, and none finished mid-effect.
    let store = service.store();
    let now = block_on(store.now()).unwrap();
    for run in service.runs() {
        if let Some(lease) = &run.lease {
            assert!(
                lease.expires <= now,
                "{} still leased: {lease:?}",
                run.run_id
            );
        }
    }
    assert!(
        block_on(store.open_claims(None))
            .unwrap()
            .iter()
            .all(|c| c.holder.is_none()),
        "in-flight steps ended: no claim is held"
    );
    let mut second = service.worker("second", &["--lease", "10m"]);
    service.wait_all_finished(Duration::from_secs(120), || {});
    for run in service.runs() {
        assert_eq!(run.status, RunStatus::Completed, "{}", run.run_id);
        assert_eq!(run.counts.reclaimed, 0, "a drain leaves nothing in doubt");
    }
    let keys = by_key(&server.seen());
    assert_eq!(keys.len(), 30);
    assert!(keys.values().all(|t| t.len() == 1), "each step once");
    signal(&second, "TERM");
    assert!(second.wait().unwrap().success());
}

#[test]
fn deploy_submit_ls_show_logs_cancel() {
    let service = Service::new();
    let out = service.ok(&["deploy", LEDGER, "--name", "ledger", "--json"]);
    let deployed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(deployed["new_component"], true);
    let digest = deployed["digest"].as_str().unwrap().to_string();
    // The same bytes again: nothing new.
    let again: Value =
        serde_json::from_str(&service.ok(&["deploy", LEDGER, "--name", "ledger", "--json"]))
            .unwrap();
    assert_eq!(again["new_component"], false);
    assert_eq!(again["digest"], digest.as_str());

    let input = json!({ "items": ["a", "b"], "log": "/data/ledger.log" }).to_string();
    let first: Value = serde_json::from_str(&service.ok(&[
        "submit", "ledger", "--run-id", "l1", "--input", &input, "--json",
    ]))
    .unwrap();
    assert_eq!(
        (first["created"].as_bool(), first["status"].as_str()),
        (Some(true), Some("queued"))
    );
    // Submitting is idempotent: the same id and input is the same run.
    let same: Value = serde_json::from_str(&service.ok(&[
        "submit", "ledger", "--run-id", "l1", "--input", &input, "--json",
    ]))
    .unwrap();
    assert_eq!(same["created"], false);
    // By digest too.
    service.ok(&["submit", &digest, "--run-id", "l2", "--input", &input]);

    let ls: Value =
        serde_json::from_str(&service.ok(&["ls", "--json", "--status", "queued"])).unwrap();
    assert_eq!(ls["runs"].as_array().unwrap().len(), 2);

    // A queued run is cancelled at once.
    let out = service.ok(&["cancel", "l2"]);
    assert!(out.contains("cancelled run l2"), "{out}");
    let show: Value = serde_json::from_str(&service.ok(&["show", "l2", "--json"])).unwrap();
    assert_eq!(show["run"]["status"], "cancelled");
    // Cancelling it again: it is finished.
    let out = service.cli(&["cancel", "l2"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("already cancelled"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn bad_input_to_the_service_commands_changes_nothing() {
    let service = Service::new();
    let dir = service.dir.path();
    let not_wasm = dir.join("not.wasm");
    std::fs::write(&not_wasm, b"hello").unwrap();
    let core = dir.join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").unwrap();
    for (file, expected) in [
        (not_wasm.to_str().unwrap(), "not a WebAssembly file"),
        (core.to_str().unwrap(), "core WebAssembly module"),
        (idem_test_artifacts::COMMAND, "not an idem agent"),
    ] {
        let out = service.cli(&["deploy", file]);
        assert_eq!(out.status.code(), Some(2), "{file}: {}", stderr(&out));
        assert!(stderr(&out).contains(expected), "{file}: {}", stderr(&out));
    }
    assert!(
        !service.path().exists(),
        "a refused deploy creates no store"
    );

    service.ok(&["deploy", HOSTILE, "--name", "hostile"]);
    let before = std::fs::read(service.path()).unwrap().len();
    let out = service.cli(&["submit", "nobody"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no agent is deployed as \"nobody\""),
        "{}",
        stderr(&out)
    );
    let out = service.cli(&["submit", &"ab".repeat(32)]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    service.ok(&[
        "submit",
        "hostile",
        "--run-id",
        "h",
        "--input",
        "{\"mode\":\"spin\",\"n\":1}",
    ]);
    let out = service.cli(&[
        "submit",
        "hostile",
        "--run-id",
        "h",
        "--input",
        "{\"mode\":\"spin\",\"n\":2}",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("\"h\"") && stderr(&out).contains("different input"),
        "{}",
        stderr(&out)
    );
    // A submission may narrow its deployment's grants, never widen them.
    let out = service.cli(&[
        "submit",
        "hostile",
        "--run-id",
        "w",
        "--allow-http",
        "example.com",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("does not allow"), "{}", stderr(&out));
    assert!(std::fs::read(service.path()).unwrap().len() >= before);

    let out = service.cli(&["cancel", "nothing-here"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    // Workers refuse a missing store, and a store from a newer idem.
    let missing = dir.join("missing.db");
    let out = run_cli(&["worker", "--db", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(!missing.exists());
    let conn = rusqlite::Connection::open(service.path()).unwrap();
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    conn.execute_batch(&format!("PRAGMA user_version = {}", version + 1))
        .unwrap();
    drop(conn);
    let out = service.cli(&["worker"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("newer than this idem supports"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_worker_that_cannot_provide_a_grant_gives_the_run_back_and_says_why() {
    let service = Service::new();
    let missing = service.dir.path().join("not-here");
    let grant = format!("{}::/data", missing.display());
    service.ok(&["deploy", LEDGER, "--name", "ledger", "--dir", &grant]);
    let input = json!({ "items": ["a"], "log": "/data/ledger.log" }).to_string();
    service.ok(&[
        "submit",
        "ledger",
        "--run-id",
        "needs-dir",
        "--input",
        &input,
    ]);
    let mut worker = service.worker("w", &[]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let note = loop {
        let run = block_on(service.store().run("needs-dir")).unwrap().unwrap();
        if let Some(note) = run.note {
            break note;
        }
        assert!(Instant::now() < deadline, "no note");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        note.contains("cannot serve") && note.contains("not-here"),
        "{note}"
    );
    let show = service.ok(&["show", "needs-dir"]);
    assert!(show.contains("cannot serve"), "{show}");
    signal(&worker, "TERM");
    assert!(worker.wait().unwrap().success());
    // Once the directory exists, the run can be served (by a fresh worker, which has
    // not set it aside).
    std::fs::create_dir(&missing).unwrap();
    let mut worker = service.worker("w2", &[]);
    service.wait_all_finished(Duration::from_secs(60), || {});
    signal(&worker, "TERM");
    assert!(worker.wait().unwrap().success());
    let lines = std::fs::read_to_string(missing.join("ledger.log")).unwrap();
    assert_eq!(lines.lines().count(), 1);
}

#[test]
fn cancelling_a_run_a_worker_holds_stops_it_and_releases_its_claims() {
    let server = TestServer::start();
    let service = Service::new();
    deploy_fetcher(&service, &server, &[]);
    // Twenty slow steps: the run is mid-effect (asleep in WASI) when it is cancelled.
    let input = json!({ "steps": 20, "url": server.url(), "pause_ms": 500 });
    service.ok(&[
        "submit",
        "fetcher",
        "--run-id",
        "slow",
        "--input",
        &input.to_string(),
    ]);
    let mut worker = service.worker("w", &[]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while server.seen().is_empty() {
        assert!(Instant::now() < deadline, "the worker never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = service.ok(&["cancel", "slow"]);
    assert!(out.contains("cancel requested"), "{out}");
    service.wait_all_finished(Duration::from_secs(30), || {});
    let run = block_on(service.store().run("slow")).unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Cancelled);
    assert!(
        block_on(service.store().open_claims(Some("slow")))
            .unwrap()
            .iter()
            .all(|c| c.holder.is_none()),
        "its claims were released"
    );
    assert!(server.seen().len() < 20, "it stopped before the end");
    signal(&worker, "TERM");
    assert!(worker.wait().unwrap().success());
}

#[test]
fn a_worker_waits_out_a_store_it_cannot_write_and_goes_on() {
    let service = Service::new();
    service.ok(&["deploy", HOSTILE, "--name", "hostile"]);
    let mut worker = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args([
            "worker",
            "--db",
            &service.db(),
            "--name",
            "patient",
            "--poll",
            "20ms",
        ])
        .env("IDEM_LOG", "warn")
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    // Another process holds the write lock for longer than the worker's busy timeout
    // (5 s): every poll of the worker fails meanwhile.
    let lock = rusqlite::Connection::open(service.path()).unwrap();
    lock.execute_batch("BEGIN EXCLUSIVE").unwrap();
    std::thread::sleep(Duration::from_secs(12));
    lock.execute_batch("ROLLBACK").unwrap();
    drop(lock);
    for i in 0..3 {
        service.ok(&[
            "submit",
            "hostile",
            "--run-id",
            &format!("after-{i}"),
            "--input",
            r#"{"mode":"spin","n":10}"#,
        ]);
    }
    service.wait_all_finished(Duration::from_secs(60), || {});
    signal(&worker, "TERM");
    let status = worker.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(worker.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{err}");
    assert_eq!(
        err.matches("cannot lease runs from the store").count(),
        1,
        "the outage is said once: {err}"
    );
    assert!(err.contains("the store is back"), "{err}");
    for run in service.runs() {
        assert_eq!(run.status, RunStatus::Completed, "{}", run.run_id);
    }
}
