//! Parallel effects in one instance: the `parallel` guest claims a batch of keys with
//! `run_once_all` and sends one request per key at once with `http::send_all`. A real
//! server on loopback, answering each request after a delay, records how many were in
//! flight together, which key and token each carried, and applies each key once (it
//! dedupes on the key, as the downstream of an in-doubt retake must). Every crash point
//! between the claims and the commits of a batch, a recycle between batches and a
//! SIGKILL with requests in flight leave each key executed exactly once; the retaken
//! ones in doubt, each under a greater token. On SQLite and PostgreSQL.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use idem::runtime::{
    Authority, CrashPoint, FaultPlan, Host, HttpPolicy, Limits, LoadedAgent, Phase, RunOptions,
    RunReport,
};
use idem::store::{PostgresOptions, PostgresStore, RunStatus, SqliteStore, SyncMode};
use idem_test_artifacts::{PARALLEL, PY_PARALLEL};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::http::{Seen, read_request};
use crate::postgres::Schema;
use crate::util::{agent, block_on, host, raw_db, run_cli, stderr, stdout};

const KEY: &str = "idempotency-key";
const TOKEN: &str = "idempotency-token";

/// What the server saw and did, behind one lock.
#[derive(Default)]
struct Record {
    active: usize,
    max_active: usize,
    seen: Vec<Seen>,
    /// Keys applied, with how many requests carried each (a repeat is not applied).
    carried: BTreeMap<String, usize>,
    /// While set, requests are held after they are recorded, and answered once cleared.
    hold: bool,
}

/// An HTTP/1.1 server on 127.0.0.1 answering each request on its own thread after
/// `delay`: `200` with body `done {BODY}`.
struct ParallelServer {
    addr: SocketAddr,
    record: Arc<(Mutex<Record>, Condvar)>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ParallelServer {
    fn start(delay: Duration) -> ParallelServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let record = Arc::new((Mutex::new(Record::default()), Condvar::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (record, stop) = (Arc::clone(&record), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let record = Arc::clone(&record);
                            std::thread::spawn(move || answer(stream, &record, delay));
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        Err(e) => panic!("test server accept: {e}"),
                    }
                }
            })
        };
        ParallelServer {
            addr,
            record,
            stop,
            thread: Some(thread),
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn policy(&self) -> HttpPolicy {
        HttpPolicy {
            allow: vec![format!("127.0.0.1:{}", self.addr.port()).parse().unwrap()],
            outside_claims: false,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Record) -> T) -> T {
        f(&mut self.record.0.lock().unwrap())
    }

    fn max_active(&self) -> usize {
        self.with(|r| r.max_active)
    }

    fn hold(&self, hold: bool) {
        self.with(|r| r.hold = hold);
        self.record.1.notify_all();
    }

    /// Waits until `n` requests are in flight at once.
    fn wait_active(&self, n: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.with(|r| r.active) < n {
            assert!(Instant::now() < deadline, "{n} requests never in flight");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The requests that carried `key`, in arrival order.
    fn requests_of(&self, key: &str) -> Vec<Seen> {
        self.with(|r| {
            r.seen
                .iter()
                .filter(|s| s.headers.get(KEY).is_some_and(|v| v == &[key.to_string()]))
                .cloned()
                .collect()
        })
    }
}

impl Drop for ParallelServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.hold(false);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn answer(stream: TcpStream, record: &(Mutex<Record>, Condvar), delay: Duration) {
    use std::io::Write;
    let Some(request) = read_request(&stream) else {
        return;
    };
    let reply = format!("done {}", String::from_utf8_lossy(&request.body));
    {
        let mut r = record.0.lock().unwrap();
        r.active += 1;
        r.max_active = r.max_active.max(r.active);
        let key = request.headers.get(KEY).and_then(|v| v.first()).cloned();
        *r.carried.entry(key.unwrap_or_default()).or_default() += 1;
        r.seen.push(request);
    }
    std::thread::sleep(delay);
    {
        let mut r = record.0.lock().unwrap();
        while r.hold {
            r = record
                .1
                .wait_timeout(r, Duration::from_millis(50))
                .unwrap()
                .0;
        }
        r.active -= 1;
    }
    let mut stream = stream;
    // The client may be gone (a killed process): nothing to tell it then.
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{reply}",
        reply.len()
    )
    .and_then(|()| stream.flush());
}

/// The key the guest derives for step `name` of run `run_id` (`Key::for_run("call",
/// name)`).
fn call_key(run_id: &str, name: &str) -> String {
    let digest = Sha256::digest(serde_json::to_vec(name).unwrap());
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("{run_id}/call/{hex}")
}

/// The names of the steps of `batches`, in the order the run first uses their keys.
fn names(batches: &[u32]) -> Vec<String> {
    batches
        .iter()
        .enumerate()
        .flat_map(|(b, &n)| (0..n).map(move |i| format!("b{b}-{i}")))
        .collect()
}

/// A host on SQLite or on a schema of its own on PostgreSQL.
struct Backend {
    host: Host,
    _dir: tempfile::TempDir,
    _schema: Option<Schema>,
}

impl Backend {
    fn sqlite() -> Backend {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("idem.db"), SyncMode::Normal).unwrap();
        Backend {
            host: host(Arc::new(store)),
            _dir: dir,
            _schema: None,
        }
    }

    fn postgres(test: &str) -> Option<Backend> {
        let schema = Schema::create(test)?;
        let options = PostgresOptions {
            pool_size: 16,
            ..PostgresOptions::default()
        };
        let store = block_on(PostgresStore::connect_with(&schema.url(), &options)).unwrap();
        Some(Backend {
            host: host(Arc::new(store)),
            _dir: tempfile::tempdir().unwrap(),
            _schema: Some(schema),
        })
    }

    /// Runs `body` on SQLite, then on PostgreSQL when the tests have a server.
    fn both(test: &str, body: impl Fn(&Backend, &str)) {
        body(&Backend::sqlite(), "sqlite");
        if let Some(pg) = Backend::postgres(test) {
            body(&pg, "postgres");
        }
    }

    fn run(
        &self,
        guest: &str,
        server: &ParallelServer,
        run_id: &str,
        input: Value,
        faults: FaultPlan,
        limits: Limits,
    ) -> RunReport {
        self.run_agent(&agent(guest), server, run_id, input, faults, limits)
    }

    /// [`Backend::run`] of an agent loaded already: no wait for the test binary's
    /// compiles of other agents.
    fn run_agent(
        &self,
        agent: &LoadedAgent,
        server: &ParallelServer,
        run_id: &str,
        input: Value,
        faults: FaultPlan,
        limits: Limits,
    ) -> RunReport {
        let opts = RunOptions {
            run_id: run_id.to_string(),
            input: serde_json::to_vec(&input).unwrap(),
            authority: Authority {
                http: server.policy(),
                limits,
                sync: SyncMode::Normal,
                ..Authority::default()
            },
            faults,
            ..RunOptions::default()
        };
        block_on(self.host.run(agent, &opts)).unwrap_or_else(|e| panic!("{e:#}"))
    }
}

fn output(report: &RunReport) -> Value {
    assert_eq!(
        report.status,
        RunStatus::Completed,
        "{}",
        String::from_utf8_lossy(&report.outcome)
    );
    serde_json::from_slice(&report.outcome).unwrap()
}

#[test]
fn n_parallel_effects_are_in_flight_at_once_each_under_its_own_claim() {
    in_flight(PARALLEL);
}

fn in_flight(guest: &str) {
    Backend::both("parallel_in_flight", |backend, name| {
        const N: u32 = 5;
        let server = ParallelServer::start(Duration::from_millis(500));
        // Compiled (or waited for, while another test compiles) first.
        let loaded = agent(guest);
        let report = backend.run_agent(
            &loaded,
            &server,
            "fan",
            json!({ "url": server.url(), "batches": [N] }),
            FaultPlan::default(),
            Limits::default(),
        );
        let out = output(&report);
        assert_eq!(
            server.max_active(),
            N as usize,
            "{name}: all in flight at once"
        );
        assert_eq!(report.counts.executed, u64::from(N), "{name}");
        for (i, step) in names(&[N]).iter().enumerate() {
            let seen = server.requests_of(&call_key("fan", step));
            assert_eq!(seen.len(), 1, "{name}: {step} sent once");
            // Its own claim's key, with the body of its own step.
            assert_eq!(seen[0].body, step.as_bytes(), "{name}");
            assert_eq!(out["replies"][0][i], format!("done {step}"), "{name}");
            assert_eq!(out["outcomes"][0][i], "executed", "{name}");
        }
        // That they were in flight together is the server's count above; what it saves
        // in time is the bench's to measure (`--bench parallel`), not a timed test's.
    });
}

/// What each key of a crashed run should have seen: the names in doubt after the crash
/// point (retaken, their effect sent twice) and the names committed before it.
fn expected(batches: &[u32], point: CrashPoint) -> (Vec<String>, Vec<String>) {
    let k = point.step as usize;
    // The batch the step is in, as a range of step numbers (1-based).
    let (mut start, mut first, mut last) = (1, 0, 0);
    for &n in batches {
        let end = start + n as usize - 1;
        if (start..=end).contains(&k) {
            (first, last) = (start, end);
            break;
        }
        start = end + 1;
    }
    let batch = first..=last;
    // Commits go in the batch's order: a drop at the commit of step k leaves k and the
    // rest of the batch in doubt; a drop after it, the rest. A drop before the batch's
    // claims reach the agent leaves none.
    let (committed_to, in_doubt_from) = match point.phase {
        Phase::InEffect => (k - 1, k),
        Phase::AfterCommit => (k, k + 1),
        _ => (batch.start() - 1, usize::MAX),
    };
    let (mut in_doubt, mut committed) = (Vec::new(), Vec::new());
    for (i, name) in names(batches).into_iter().enumerate() {
        let step = i + 1;
        if step < *batch.start() || (batch.contains(&step) && step <= committed_to) {
            committed.push(name);
        } else if batch.contains(&step) && step >= in_doubt_from {
            in_doubt.push(name);
        }
    }
    (in_doubt, committed)
}

/// Checks one crashed run: each key applied once at the server, the retaken ones sent
/// twice under the same key with a greater token, and told apart in the output.
fn check_crashed(
    server: &ParallelServer,
    report: &RunReport,
    run_id: &str,
    batches: &[u32],
    (in_doubt, committed): (&[String], &[String]),
    what: &str,
) {
    let out = output(report);
    assert_eq!(
        report.counts.reclaimed,
        in_doubt.len() as u64,
        "{what}: {out}"
    );
    let mut i = 0;
    for (b, &n) in batches.iter().enumerate() {
        for j in 0..n as usize {
            let step = &names(batches)[i];
            i += 1;
            let seen = server.requests_of(&call_key(run_id, step));
            assert_eq!(
                out["replies"][b][j],
                format!("done {step}"),
                "{what}: {step}"
            );
            let outcome = out["outcomes"][b][j].as_str().unwrap();
            if in_doubt.contains(step) {
                assert_eq!(seen.len(), 2, "{what}: {step} retaken in doubt, sent again");
                assert!(
                    seen[1].token(TOKEN) > seen[0].token(TOKEN),
                    "{what}: {step}: the retake carries a greater token"
                );
                assert_eq!(outcome, "reclaimed:2", "{what}: {step}");
            } else {
                assert_eq!(seen.len(), 1, "{what}: {step} sent once");
                let expect = if committed.contains(step) {
                    "skipped"
                } else {
                    "executed"
                };
                assert_eq!(outcome, expect, "{what}: {step}");
            }
        }
    }
}

#[test]
fn each_key_executes_once_under_every_crash_point_between_parallel_claims_and_commits() {
    sweep(PARALLEL);
}

fn sweep(guest: &str) {
    sweep_on(guest, &Backend::sqlite(), "sqlite");
}

/// Every phase that fires between a batch's claims and its commits, at every step.
fn sweep_on(guest: &str, backend: &Backend, name: &str) {
    let batches = [3, 2];
    let steps: u32 = batches.iter().sum();
    let server = ParallelServer::start(Duration::from_millis(20));
    for phase in [
        Phase::BeforeClaim,
        Phase::AfterClaim,
        Phase::InEffect,
        Phase::AfterCommit,
    ] {
        for step in 1..=steps {
            let point = CrashPoint { phase, step };
            let run_id = format!("crash-{phase}-{step}");
            let report = backend.run(
                guest,
                &server,
                &run_id,
                json!({ "url": server.url(), "batches": batches }),
                FaultPlan {
                    crash_at: vec![point],
                    ..FaultPlan::default()
                },
                Limits::default(),
            );
            assert_eq!(report.counts.instances, 2, "{name} {point}: one drop");
            let (in_doubt, committed) = expected(&batches, point);
            check_crashed(
                &server,
                &report,
                &run_id,
                &batches,
                (in_doubt.as_slice(), committed.as_slice()),
                &format!("{name} {point}"),
            );
        }
    }
}

#[test]
fn the_crash_sweep_of_parallel_claims_on_postgres() {
    if let Some(backend) = Backend::postgres("parallel_sweep") {
        sweep_on(PARALLEL, &backend, "postgres");
    }
}

#[test]
fn a_recycle_between_batches_and_crashes_on_postgres_keep_each_key_once() {
    recycle_and_crashes(PARALLEL);
}

fn recycle_and_crashes(guest: &str) {
    Backend::both("parallel_recycle", |backend, name| {
        let batches = [3, 2];
        let server = ParallelServer::start(Duration::from_millis(20));
        // The instance is dropped before the second batch's claims, the first committed.
        let report = backend.run(
            guest,
            &server,
            "recycled",
            json!({ "url": server.url(), "batches": batches }),
            FaultPlan {
                recycle_every: Some(3),
                ..FaultPlan::default()
            },
            Limits::default(),
        );
        let first: Vec<String> = names(&[3]);
        check_crashed(
            &server,
            &report,
            "recycled",
            &batches,
            (&[], first.as_slice()),
            name,
        );
        assert_eq!(server.max_active(), 3, "{name}");
        // A drop with two commits of a batch done and one left: in doubt, once more.
        for point in ["after-commit:2", "in-effect:4"] {
            let point: CrashPoint = point.parse().unwrap();
            let run_id = format!("pg-{}-{}", point.phase, point.step);
            let report = backend.run(
                guest,
                &server,
                &run_id,
                json!({ "url": server.url(), "batches": batches }),
                FaultPlan {
                    crash_at: vec![point],
                    ..FaultPlan::default()
                },
                Limits::default(),
            );
            let (in_doubt, committed) = expected(&batches, point);
            check_crashed(
                &server,
                &report,
                &run_id,
                &batches,
                (in_doubt.as_slice(), committed.as_slice()),
                &format!("{name} {point}"),
            );
        }
    });
}

#[test]
fn more_claims_than_the_instance_limit_are_refused_claiming_nothing() {
    over_limit(PARALLEL);
}

fn over_limit(guest: &str) {
    Backend::both("parallel_limit", |backend, name| {
        let server = ParallelServer::start(Duration::from_millis(10));
        let limits = Limits {
            max_claims: 4,
            ..Limits::default()
        };
        let report = backend.run(
            guest,
            &server,
            "limited",
            json!({ "url": server.url(), "batches": [4], "refuse_over": 5 }),
            FaultPlan::default(),
            limits,
        );
        let out = output(&report);
        let refused = out["refused"].as_str().unwrap();
        assert!(refused.contains("over the limit of 4"), "{name}: {refused}");
        // Refused whole: none of the five keys was claimed, and the instance went on
        // to hold four at once.
        assert_eq!(report.counts.executed, 4, "{name}");
        assert_eq!(server.max_active(), 4, "{name}");
    });
}

#[test]
fn a_request_tied_to_a_committed_claim_is_refused_before_it_leaves() {
    stale_tie(PARALLEL);
}

/// The guest commits a step, then, inside another, sends a request tied to the first:
/// the host refuses it, and nothing reaches the server.
fn stale_tie(guest: &str) {
    let server = ParallelServer::start(Duration::from_millis(0));
    let report = Backend::sqlite().run(
        guest,
        &server,
        "stale",
        json!({ "url": server.url(), "batches": [], "stale": true }),
        FaultPlan::default(),
        Limits::default(),
    );
    let out = output(&report);
    let refused = out["stale"]
        .as_str()
        .unwrap_or_else(|| panic!("sent: {out}"));
    assert!(
        refused.contains("denied: the claim it was tied to is no longer held"),
        "{refused}"
    );
    assert!(server.with(|r| r.seen.is_empty()), "nothing left the host");
}

/// The same from a Python agent (`idem.run_once_all`, `idem.http.send_all`).
#[test]
fn python_parallel_effects_in_flight_under_crash_points_and_the_limit() {
    let Some(guest) = crate::python::built(PY_PARALLEL, "parallel effects") else {
        return;
    };
    in_flight(guest);
    sweep(guest);
    recycle_and_crashes(guest);
    over_limit(guest);
    stale_tie(guest);
}

#[test]
fn the_max_claims_flag_sets_the_limit() {
    let server = ParallelServer::start(Duration::from_millis(10));
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("idem.db");
    let input = json!({ "url": server.url(), "batches": [2], "refuse_over": 3 }).to_string();
    let grant = format!("127.0.0.1:{}", server.addr.port());
    let out = run_cli(&[
        "run",
        PARALLEL,
        "--db",
        db.to_str().unwrap(),
        "--run-id",
        "flag",
        "--allow-http",
        &grant,
        "--max-claims",
        "2",
        "--input",
        &input,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("over the limit of 2"),
        "{}",
        stdout(&out)
    );
    let claimed: i64 = raw_db(&db)
        .query_row(
            "SELECT count(*) FROM steps WHERE key LIKE '%/over/%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(claimed, 0, "the refused keys changed nothing");
    let zero = run_cli(&[
        "run",
        PARALLEL,
        "--db",
        db.to_str().unwrap(),
        "--run-id",
        "zero",
        "--max-claims",
        "0",
        "--input",
        "{}",
    ]);
    assert_eq!(zero.status.code(), Some(2), "{}", stderr(&zero));
    assert!(stderr(&zero).contains("--max-claims"), "{}", stderr(&zero));
}

#[test]
fn a_sigkill_with_requests_in_flight_retakes_each_key_in_doubt_once() {
    const N: u32 = 4;
    let server = ParallelServer::start(Duration::from_millis(0));
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("idem.db");
    let input = json!({ "url": server.url(), "batches": [N] }).to_string();
    let grant = format!("127.0.0.1:{}", server.addr.port());
    let spawn = || {
        Command::new(env!("CARGO_BIN_EXE_idem"))
            .args([
                "run",
                PARALLEL,
                "--db",
                db.to_str().unwrap(),
                "--run-id",
                "killed",
            ])
            .args(["--input", &input, "--json", "--allow-http", &grant])
            .args(["--lease", "500ms"])
            .env("IDEM_LOG", "error")
            .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    server.hold(true);
    let mut child = spawn();
    server.wait_active(N as usize, Duration::from_secs(60));
    child.kill().unwrap();
    child.wait().unwrap();
    server.hold(false);

    let out = spawn().wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let names = names(&[N]);
    check_killed(&server, &doc, &names);
}

fn check_killed(server: &ParallelServer, doc: &Value, names: &[String]) {
    let out: Value = match &doc["output"] {
        Value::String(s) => serde_json::from_str(s).unwrap(),
        other => other.clone(),
    };
    for (i, step) in names.iter().enumerate() {
        let seen = server.requests_of(&call_key("killed", step));
        assert_eq!(
            seen.len(),
            2,
            "{step}: in flight at the kill, sent once more"
        );
        assert!(seen[1].token(TOKEN) > seen[0].token(TOKEN), "{step}");
        assert_eq!(out["outcomes"][0][i], "reclaimed:2", "{doc}");
        assert_eq!(out["replies"][0][i], format!("done {step}"), "{doc}");
    }
    assert_eq!(doc["counts"]["reclaimed"], names.len(), "{doc}");
}

/// `idem prove` crashes the agent between its parallel claims and between their
/// commits (each step's phases, in the order the keys were first used) and finds each
/// key's effect once, or twice only where its claim was retaken in doubt.
#[test]
fn idem_prove_passes_an_agent_with_parallel_claims() {
    let real = ParallelServer::start(Duration::from_millis(0));
    let stub = ParallelServer::start(Duration::from_millis(0));
    let batches = [3, 2];
    let dir = tempfile::tempdir().unwrap();
    let scratch = dir.path().join("scratch");
    // Its output says only what was committed: the outcomes differ from run to run.
    let input = json!({ "url": real.url(), "batches": batches, "plain": true }).to_string();
    let allow = format!("127.0.0.1:{}", real.addr.port());
    let out = run_cli(&[
        "prove",
        PARALLEL,
        "--input",
        &input,
        "--allow-http",
        &allow,
        "--stub",
        &stub.url(),
        "--phases",
        "before-claim,after-claim,in-effect,after-commit",
        "--json",
        "--scratch",
        scratch.to_str().unwrap(),
    ]);
    let doc: Value = serde_json::from_str(&stdout(&out))
        .unwrap_or_else(|e| panic!("{e}: {}\n{}", stdout(&out), stderr(&out)));
    assert_eq!(out.status.code(), Some(0), "{doc:#}\n{}", stderr(&out));
    assert_eq!(doc["passed"], true, "{doc:#}");
    let scenarios = doc["scenarios"].as_array().unwrap();
    assert_eq!(scenarios.len(), 1 + 4 * 5, "{doc:#}");
    for s in scenarios
        .iter()
        .filter(|s| s["scenario"]["kind"] == "crash")
    {
        let point: CrashPoint = s["name"].as_str().unwrap().parse().unwrap();
        let (in_doubt, _) = expected(&batches, point);
        assert!(s["violations"].as_array().unwrap().is_empty(), "{s:#}");
        assert_eq!(s["reached"], true, "{s:#}");
        assert_eq!(s["duplicates_in_doubt"], in_doubt.len(), "{s:#}");
        assert_eq!(s["effects"], 5 + in_doubt.len(), "{s:#}");
    }
    // The clean run's five requests went to the stub; none to the real destination.
    assert_eq!(stub.with(|r| r.seen.len()), 5);
    assert_eq!(real.with(|r| r.seen.len()), 0);
}

/// A process told to hold two instances at once runs five runs that each wait on the
/// server inside their instance: the server never sees more than two requests at once
/// (a run waits for a slot instead of failing to instantiate), and every run completes
/// with its one effect applied once.
#[test]
fn a_process_holds_no_more_instances_than_its_slots_and_the_others_wait() {
    let server = ParallelServer::start(Duration::from_millis(300));
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&dir.path().join("idem.db"), SyncMode::Normal).unwrap();
    let runtime = Arc::new(idem::runtime::Runtime::with_instances(None, 2).unwrap());
    let loaded = runtime
        .load(std::path::Path::new(PARALLEL))
        .unwrap_or_else(|e| panic!("{e:#}"));
    let host = {
        let _inside = crate::util::tokio().enter();
        Arc::new(Host::new(runtime, Arc::new(store)).unwrap())
    };
    let runs: Vec<_> = (0..5)
        .map(|i| {
            let (host, loaded) = (Arc::clone(&host), loaded.clone());
            let opts = RunOptions {
                run_id: format!("slot-{i}"),
                input: serde_json::to_vec(&json!({ "url": server.url(), "batches": [1] })).unwrap(),
                authority: Authority {
                    http: server.policy(),
                    sync: SyncMode::Normal,
                    ..Authority::default()
                },
                ..RunOptions::default()
            };
            crate::util::tokio().spawn(async move { host.run(&loaded, &opts).await })
        })
        .collect();
    for (i, run) in runs.into_iter().enumerate() {
        let report = block_on(run).unwrap().unwrap_or_else(|e| panic!("{e:#}"));
        output(&report);
        let key = call_key(&format!("slot-{i}"), &names(&[1])[0]);
        assert_eq!(server.requests_of(&key).len(), 1, "slot-{i} sent once");
    }
    assert_eq!(server.max_active(), 2, "two instances at once, never more");
}
