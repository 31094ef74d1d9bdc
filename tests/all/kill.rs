//! Real faults on real processes: the `idem` binary SIGKILLed at random moments while
//! its agent makes HTTP calls, and a holder paused (SIGSTOP) past its lease.

use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use idem_test_artifacts::FETCHER;
use serde_json::{Value, json};

use crate::http::{TestServer, committed, post_key};
use crate::util::{StderrLines, integrity_ok, raw_db, run_cli, stderr, stdout};

const KEY: &str = "idempotency-key";
const TOKEN: &str = "idempotency-token";

fn spawn(db: &str, run_id: &str, input: &str, server: &TestServer, lease: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args([
            "run", FETCHER, "--db", db, "--run-id", run_id, "--input", input, "--json",
        ])
        .args([
            "--allow-http",
            &format!("127.0.0.1:{}", server.port()),
            "--lease",
            lease,
        ])
        .env("IDEM_LOG", "error")
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Per run: (results rows, the attempt each key was committed at).
fn attempts(db: &std::path::Path, run_id: &str) -> std::collections::BTreeMap<String, i64> {
    let conn = raw_db(db);
    let mut stmt = conn
        .prepare("SELECT key, attempt FROM steps WHERE run_id = ?1 AND result IS NOT NULL")
        .unwrap();
    stmt.query_map([run_id], |r| Ok((r.get::<_, String>(0)?, r.get(1)?)))
        .unwrap()
        .map(|row| {
            let (key, attempt) = row.unwrap();
            (key.strip_prefix("fetcher:").unwrap().to_string(), attempt)
        })
        .collect()
}

#[test]
fn sigkill_soak_500_steps() {
    const STEPS: u64 = 500;
    const MIN_KILLS: u32 = 50;
    let server = TestServer::start();
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("idem.db");
    let db = db_path.to_str().unwrap();
    // A little time inside each side effect, after its request: kills land between a
    // request and its commit, the window where a side effect is in doubt.
    let input = json!({ "steps": STEPS, "url": server.url(), "pause_ms": 2, "pause_after": true })
        .to_string();
    let mut rng = fastrand::Rng::with_seed(0x5eed_0001);
    let deadline = Instant::now() + Duration::from_secs(600);

    let mut kills = 0;
    let output = loop {
        assert!(
            Instant::now() < deadline,
            "the soak did not finish in time ({kills} kills)"
        );
        let mut child = spawn(db, "soak", &input, &server, "300ms");
        if kills < MIN_KILLS {
            std::thread::sleep(Duration::from_millis(rng.u64(10..120)));
            if child.try_wait().unwrap().is_none() {
                child.kill().unwrap();
                child.wait().unwrap();
                kills += 1;
                continue;
            }
        }
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
        break doc;
    };

    // The uncrashed reference, on its own store and server.
    let clean_server = TestServer::start();
    let clean_dir = tempfile::tempdir().unwrap();
    let clean_db = clean_dir.path().join("idem.db");
    let clean_input =
        json!({ "steps": STEPS, "url": clean_server.url(), "pause_ms": 0 }).to_string();
    let clean = spawn(
        clean_db.to_str().unwrap(),
        "soak",
        &clean_input,
        &clean_server,
        "30s",
    )
    .wait_with_output()
    .unwrap();
    let clean: Value = serde_json::from_slice(&clean.stdout).unwrap();
    assert_eq!(
        output["output"], clean["output"],
        "same output as an uncrashed run"
    );
    // After killed processes, the report does not claim counts it cannot know: the last
    // process says they may fall short; the uncrashed run's are exact.
    assert_eq!(output["counts_exact"], false, "{output}");
    assert_eq!(clean["counts_exact"], true, "{clean}");

    let by_step = server.steps();
    assert_eq!(by_step.len() as u64, STEPS, "every step reached the server");
    let committed_tokens = committed(&db_path, "soak");
    assert_eq!(
        committed_tokens.len() as u64,
        STEPS,
        "every result is committed"
    );
    let attempts = attempts(&db_path, "soak");
    let mut duplicates = 0;
    let mut keys_seen = BTreeSet::new();
    for (i, seen) in &by_step {
        let key = post_key("soak", *i);
        for s in seen {
            // Every request of a step, first or repeated, carries that step's key.
            assert_eq!(s.header(KEY), key, "step {i}");
            keys_seen.insert(s.header(KEY).to_string());
        }
        if seen.len() > 1 {
            duplicates += seen.len() - 1;
            // A repeat is a claim retaken in doubt: the step committed at a later attempt.
            assert!(
                attempts[&key] > 1,
                "step {i} repeated but committed at attempt 1"
            );
            let tokens: Vec<u64> = seen.iter().map(|s| s.token(TOKEN)).collect();
            assert!(
                tokens.windows(2).all(|w| w[0] < w[1]),
                "step {i}: tokens {tokens:?}"
            );
        }
        assert_eq!(
            seen.last().unwrap().token(TOKEN),
            committed_tokens[&key],
            "step {i}"
        );
    }
    // A server that honours the key applied each step exactly once.
    assert_eq!(keys_seen.len() as u64, STEPS);
    integrity_ok(&db_path);
    let reclaimed = output["counts"]["reclaimed"].as_u64().unwrap();
    // Every grant after a key's first was a takeover in doubt (this agent never
    // releases), and grants are counted in the claim's own transaction: exact, kills
    // or not.
    let retakes: i64 = attempts.values().map(|a| a - 1).sum();
    assert_eq!(reclaimed, retakes as u64);
    println!(
        "sigkill soak: {kills} kills, {reclaimed} reclaimed, {duplicates} duplicate requests \
         (all with their step's key), {} instances",
        output["counts"]["instances"]
    );
}

/// Waits until run `run_id` holds a claim, as `idem status` shows it.
fn until_claimed(db_path: &std::path::Path, run_id: &str) {
    let db = db_path.to_str().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(Instant::now() < deadline, "run {run_id} never claimed");
        if db_path.exists() {
            let status = run_cli(&["status", "--db", db, run_id, "--json"]);
            let doc: Value = serde_json::from_str(&stdout(&status)).unwrap_or(Value::Null);
            if doc["open_claims"].as_array().is_some_and(|c| !c.is_empty()) {
                return;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(child: &Child, signal: &str) {
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn a_zombie_holder_is_fenced_off() {
    let server = TestServer::start();
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("idem.db");
    let db = db_path.to_str().unwrap();
    // Step 0's side effect sleeps before its request: the holder is paused in there.
    let input =
        json!({ "steps": 2, "url": server.url(), "pause_ms": 1500, "pause_at": 0 }).to_string();

    let zombie = spawn(db, "z", &input, &server, "500ms");
    // Wait until it holds step 0's claim, then freeze it.
    until_claimed(&db_path, "z");
    signal(&zombie, "STOP");
    // Past its lease (no heartbeat from a stopped process), another host takes over.
    std::thread::sleep(Duration::from_millis(800));
    let taker = spawn(db, "z", &input, &server, "500ms")
        .wait_with_output()
        .unwrap();
    assert!(
        taker.status.success(),
        "{}",
        String::from_utf8_lossy(&taker.stderr)
    );
    let taker: Value = serde_json::from_slice(&taker.stdout).unwrap();
    assert_eq!(taker["counts"]["reclaimed"], 1);
    assert_eq!(taker["status"], "completed");

    // The zombie wakes up. Its leases ran out on its own clock while it was stopped:
    // it sends nothing under the claim it lost and writes nothing for the run it lost,
    // and says so.
    signal(&zombie, "CONT");
    let zombie = zombie.wait_with_output().unwrap();
    let zombie_err = String::from_utf8_lossy(&zombie.stderr).into_owned();
    assert_eq!(zombie.status.code(), Some(4), "{zombie_err}");
    assert!(zombie_err.contains("taken over"), "{zombie_err}");

    let steps = server.steps();
    let step0 = &steps[&0];
    assert_eq!(
        step0.len(),
        1,
        "only the taker's request: the zombie's stale one never left: {step0:#?}"
    );
    // The result is the taker's.
    let key = post_key("z", 0);
    assert_eq!(committed(&db_path, "z")[&key], step0[0].token(TOKEN));
    assert_eq!(steps[&1].len(), 1, "step 1 ran once");
    integrity_ok(&db_path);
}

/// A holder frozen inside a side effect past its claim's lease, whose claim another
/// holder took over and committed while the run's lease stayed its own: when it wakes,
/// its request under the lost claim is refused and never leaves, and, as with a refused
/// commit, the instance ends and the run resumes on a fresh one, which finds the
/// taker's result and completes (before, the refusal failed the run with `HttpDenied`).
#[test]
fn a_request_under_a_claim_taken_over_ends_the_instance_and_the_run_completes() {
    use idem::store::{ClaimOutcome, ClaimRef, ClaimRequest, Commit, OpenOptions};

    let server = TestServer::start();
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("idem.db");
    let db = db_path.to_str().unwrap();
    let input =
        json!({ "steps": 2, "url": server.url(), "pause_ms": 1500, "pause_at": 0 }).to_string();
    let frozen = spawn(db, "f", &input, &server, "500ms");
    until_claimed(&db_path, "f");
    signal(&frozen, "STOP");
    std::thread::sleep(Duration::from_millis(800));
    // Another run of the agent takes step 0's key over (its claim lease ran out) and
    // commits it; the frozen run's own lease nobody takes.
    let store = crate::util::open_store(&db_path, &OpenOptions::default());
    let other = crate::util::lease_by_hand(
        store.as_ref(),
        &crate::util::agent(FETCHER),
        "taker",
        "fetcher",
    );
    let key = format!("fetcher:{}", post_key("f", 0));
    let grant = match crate::util::block_on(store.claim(&ClaimRequest {
        key: &key,
        fence: &other,
        holder: "elsewhere/elsewhere/0",
        fingerprint: None,
        lease: Duration::from_secs(60),
        durable: true,
    }))
    .unwrap()
    {
        ClaimOutcome::Granted(grant) => grant,
        other => panic!("expected the key taken over, got {other:?}"),
    };
    crate::util::block_on(store.commit(&Commit {
        claim: ClaimRef {
            key: &key,
            token: grant.token,
            fence: &other,
        },
        result: br#"{"status":200,"body":"the taker's"}"#,
        checkpoint: None,
        counts: None,
    }))
    .unwrap();
    drop(store);

    signal(&frozen, "CONT");
    let out = frozen.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{err}");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["status"], "completed", "{doc}");
    assert_eq!(doc["output"]["replies"][0]["body"], "the taker's", "{doc}");
    let steps = server.steps();
    assert!(
        !steps.contains_key(&0),
        "the refused request never left: {steps:#?}"
    );
    assert_eq!(steps[&1].len(), 1, "step 1 ran once");
    integrity_ok(&db_path);
}

/// Ctrl-C stops `idem run` the way a worker drains: the side effect in flight ends at
/// its commit, the run's lease is given back, and the same command resumes at once — no
/// waiting out a lease, nothing in doubt.
#[test]
fn an_interrupted_run_gives_its_lease_back_and_resumes_at_once() {
    let server = TestServer::start();
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("idem.db");
    let db = db_path.to_str().unwrap();
    let input = json!({ "steps": 6, "url": server.url(), "pause_ms": 300 }).to_string();
    // A ten-minute lease: only a lease given back lets the second process go on.
    let first = spawn(db, "int", &input, &server, "10m");
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.seen().len() < 2 {
        assert!(Instant::now() < deadline, "the run never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    signal(&first, "INT");
    let first = first.wait_with_output().unwrap();
    assert_eq!(
        first.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let status = run_cli(&["show", "int", "--db", db, "--json"]);
    let show: Value = serde_json::from_str(&stdout(&status)).unwrap();
    assert!(
        show["run"]["lease"].is_null(),
        "the lease was given back: {show}"
    );
    assert!(
        show["open_claims"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["holder"].is_null()),
        "no claim left held: {show}"
    );
    let second = spawn(db, "int", &input, &server, "10m")
        .wait_with_output()
        .unwrap();
    assert!(
        second.status.success(),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    let doc: Value = serde_json::from_slice(&second.stdout).unwrap();
    assert_eq!(doc["counts"]["reclaimed"], 0, "nothing was left in doubt");
    let steps = server.steps();
    assert_eq!(steps.len(), 6);
    assert!(steps.values().all(|s| s.len() == 1), "each step once");
}

/// A second signal ends `idem run` where it stands, whichever of SIGINT or SIGTERM it
/// is: the first waits for the side effect in flight, the second does not.
#[test]
fn a_second_signal_ends_an_interrupted_run_at_once() {
    let server = TestServer::start();
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("idem.db");
    let db = db_path.to_str().unwrap();
    // A minute inside the first effect, after its request.
    let input = json!({ "steps": 2, "url": server.url(), "pause_ms": 60_000, "pause_after": true })
        .to_string();
    let mut first = spawn(db, "twice", &input, &server, "10m");
    let said = StderrLines::of(&mut first);
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.seen().is_empty() {
        assert!(Instant::now() < deadline, "the run never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    signal(&first, "INT");
    said.wait_for(
        "idem run: stopping at the next step",
        Duration::from_secs(30),
    );
    let second = Instant::now();
    signal(&first, "TERM");
    let status = first.wait().unwrap();
    let rest = said.rest();
    assert_eq!(status.code(), Some(130), "{rest}");
    assert!(
        second.elapsed() < Duration::from_secs(30),
        "it did not wait for the effect"
    );
    assert!(rest.contains("idem run: exiting at once"), "{rest}");
}

/// Waits until `server` has seen `n` requests.
fn until_seen(server: &TestServer, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while server.seen().len() < n {
        assert!(
            Instant::now() < deadline,
            "the server saw fewer than {n} requests"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The seed's scenario at the level of a process: `idem run` SIGKILLed inside a side
/// effect (its request made, its commit not), and the next `idem run` of the run takes
/// it over at once — the dead process's 30 s lease is not waited out, because the
/// kernel released the lock the process held for its lifetime — retaking the effect in
/// doubt under the same key with a higher token.
#[test]
fn a_sigkilled_run_is_taken_over_at_once_not_after_its_lease() {
    let server = TestServer::start();
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("idem.db");
    let db = db_path.to_str().unwrap();
    // The retaking process pauses there too (one input per run): 3 s, a tenth of the
    // lease.
    let input = json!({ "steps": 3, "url": server.url(), "pause_ms": 3000, "pause_at": 1,
                        "pause_after": true })
    .to_string();
    let mut first = spawn(db, "dead", &input, &server, "30s");
    // Step 0 done; step 1's request made: the holder sleeps before its commit.
    until_seen(&server, 2);
    first.kill().unwrap();
    first.wait().unwrap();
    let killed = Instant::now();

    let second = spawn(db, "dead", &input, &server, "30s")
        .wait_with_output()
        .unwrap();
    let took = killed.elapsed();
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(second.status.success(), "{err}");
    // A behaviour, not a speed: the lease was 30 s, and waiting it out would take that.
    assert!(
        took < Duration::from_secs(15),
        "the dead process's lease was waited out ({took:?}): {err}"
    );
    let doc: Value = serde_json::from_slice(&second.stdout).unwrap();
    assert_eq!(doc["status"], "completed", "{doc}");
    assert_eq!(
        doc["counts"]["reclaimed"], 1,
        "step 1 retaken in doubt: {doc}"
    );
    let steps = server.steps();
    assert_eq!(steps[&0].len(), 1, "step 0 committed before the kill");
    let step1 = &steps[&1];
    assert_eq!(
        step1.len(),
        2,
        "step 1 sent again after the kill: {step1:#?}"
    );
    assert_eq!(
        step1[0].header(KEY),
        step1[1].header(KEY),
        "under the same key"
    );
    assert!(
        step1[1].token(TOKEN) > step1[0].token(TOKEN),
        "with a higher token: {step1:#?}"
    );
    assert_eq!(steps[&2].len(), 1);
    integrity_ok(&db_path);
}

/// A frozen process is alive: its lock is still held, so it is not taken over before
/// its lease ends, only after.
#[test]
fn a_frozen_holder_is_not_taken_over_before_its_lease() {
    let server = TestServer::start();
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("idem.db");
    let db = db_path.to_str().unwrap();
    let input = json!({ "steps": 2, "url": server.url(), "pause_ms": 1500, "pause_at": 0,
                        "pause_after": true })
    .to_string();
    let frozen = spawn(db, "frozen", &input, &server, "3s");
    until_seen(&server, 1);
    signal(&frozen, "STOP");
    let stopped = Instant::now();
    let taker = spawn(db, "frozen", &input, &server, "3s")
        .wait_with_output()
        .unwrap();
    let took = stopped.elapsed();
    let err = String::from_utf8_lossy(&taker.stderr);
    assert!(taker.status.success(), "{err}");
    assert!(
        took >= Duration::from_secs(1),
        "a frozen (live) holder was taken over after {took:?}, before its 3 s lease: {err}"
    );
    signal(&frozen, "KILL");
    signal(&frozen, "CONT");
    let _ = frozen.wait_with_output();
    let steps = server.steps();
    assert_eq!(steps[&0].len(), 2, "retaken once, after the lease");
    assert_eq!(steps[&1].len(), 1);
}

fn worker(db: &str, name: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["worker", "--db", db, "--name", name, "--poll", "20ms"])
        .env("IDEM_LOG", "error")
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// A worker SIGKILLed inside a side effect: another worker, already polling, takes the
/// run over at its next poll, not after the dead worker's 30 s lease.
#[test]
fn a_sigkilled_workers_run_is_taken_over_by_another_worker_at_once() {
    let server = TestServer::start();
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("idem.db");
    let db = db_path.to_str().unwrap();
    let allow = format!("127.0.0.1:{}", server.port());
    let ok = |args: &[&str]| {
        let out = run_cli(args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    };
    ok(&[
        "deploy",
        FETCHER,
        "--name",
        "f",
        "--db",
        db,
        "--allow-http",
        &allow,
        "--lease",
        "30s",
    ]);
    let input = json!({ "steps": 3, "url": server.url(), "pause_ms": 3000, "pause_at": 1,
                        "pause_after": true })
    .to_string();
    ok(&[
        "submit", "f", "--db", db, "--input", &input, "--run-id", "w1",
    ]);
    let mut doomed = worker(db, "doomed");
    until_seen(&server, 2);
    let mut heir = worker(db, "heir");
    doomed.kill().unwrap();
    doomed.wait().unwrap();
    let killed = Instant::now();
    let deadline = killed + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "the run never completed");
        let out = run_cli(&["show", "w1", "--db", db, "--json"]);
        let doc: Value = serde_json::from_str(&stdout(&out)).unwrap_or(Value::Null);
        if doc["run"]["status"] == "completed" {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = killed.elapsed();
    heir.kill().unwrap();
    heir.wait().unwrap();
    // A behaviour, not a speed: waiting out the 30 s lease would take that.
    assert!(
        took < Duration::from_secs(15),
        "the lease was waited out: {took:?}"
    );
    let steps = server.steps();
    let step1 = &steps[&1];
    assert_eq!(step1.len(), 2, "step 1 retaken after the kill: {step1:#?}");
    assert_eq!(step1[0].header(KEY), step1[1].header(KEY));
    assert!(step1[1].token(TOKEN) > step1[0].token(TOKEN));
    assert_eq!((steps[&0].len(), steps[&2].len()), (1, 1));
    integrity_ok(&db_path);
}
