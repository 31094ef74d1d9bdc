//! Faults on the wire between workers and PostgreSQL: three `idem worker` processes
//! reach the server through a fault proxy (`util/proxy.rs`) that cuts and resets every
//! connection, adds latency, black-holes new connections and silences live ones
//! (half-open), and cuts a commit before it reaches the server or after it did and
//! before its answer came back, on a seeded schedule. Once the faults stop, every run
//! completes with the right output, every key reached the HTTP server, and a key that
//! did so more than once did it as a retake in doubt with a higher token.
//!
//! `IDEM_TEST_POSTGRES` as for the other PostgreSQL tests (each run in a schema of its
//! own). The seed is printed; `IDEM_TEST_SEED=0x...` replays one.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::http::TestServer;
use crate::postgres::Schema;
use crate::util::proxy::{FaultProxy, Mode, On, Then, Trap};
use crate::workers::{
    Service, assert_all_completed, assert_effects_fenced, deploy_fetcher, signal,
};

const STEPS: u64 = 3;

/// The call timeout the workers run with: a black-holed call gives up after it.
const DB_TIMEOUT: &str = "2s";

#[test]
fn three_workers_complete_100_runs_through_seeded_faults_on_the_wire() {
    faults_on_the_wire("faults on the wire", 100, 0x00fa_0100);
}

/// The same, longer: `IDEM_TEST_POSTGRES=required cargo test -p idem-cli --test all
/// --features idem-cli/otlp -- --ignored pg_faults_soak`.
#[test]
#[ignore = "a soak of several minutes; run by hand"]
fn pg_faults_soak_1000_runs() {
    faults_on_the_wire("faults on the wire, soak", 1000, 0x00fa_1000);
}

/// A URL's parts: up to the host (`postgres://USER@`), the host and port, the rest.
fn split_url(url: &str) -> (String, &str, &str) {
    let (scheme, after) = url.split_once("://").unwrap();
    let (user, host) = match after.split_once('@') {
        Some((user, host)) => (format!("{user}@"), host),
        None => (String::new(), after),
    };
    let at = host.find(['/', '?']).unwrap_or(host.len());
    (format!("{scheme}://{user}"), &host[..at], &host[at..])
}

/// The server's address, from its URL.
fn server_addr(url: &str) -> SocketAddr {
    let (_, host, _) = split_url(url);
    let host = host.replace("localhost", "127.0.0.1");
    let host = if host.contains(':') {
        host
    } else {
        format!("{host}:5432")
    };
    host.parse().unwrap()
}

/// `url` with its server replaced by the proxy's.
fn through(url: &str, proxy: &FaultProxy) -> String {
    let (head, _, rest) = split_url(url);
    format!("{head}127.0.0.1:{}{rest}", proxy.port())
}

fn worker(url: &str, name: &str, log: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["worker", "--db", url, "--name", name, "--poll", "20ms"])
        .args(["--lease", "1s", "--concurrency", "4", "--db-pool", "4"])
        .args(["--db-timeout", DB_TIMEOUT])
        .env("IDEM_LOG", "info")
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .stdout(Stdio::null())
        .stderr(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .unwrap(),
        )
        .spawn()
        .unwrap()
}

fn faults_on_the_wire(test: &str, runs: usize, seed: u64) {
    let Some(schema) = Schema::create(test) else {
        return;
    };
    let seed = match std::env::var("IDEM_TEST_SEED") {
        Ok(s) => u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap(),
        Err(_) => seed,
    };
    eprintln!("{test}: seed {seed:#x} (replay with IDEM_TEST_SEED={seed:#x})");
    let direct = schema.url();
    let addr = server_addr(&direct);
    let proxy = FaultProxy::start(addr);
    let proxied = through(&direct, &proxy);
    let service = Service::on_postgres(direct);
    let server = TestServer::start();
    deploy_fetcher(&service, &server, &["--lease", "1s"]);
    for i in 0..runs {
        let input =
            json!({ "steps": STEPS, "url": server.url(), "pause_ms": 100, "pause_after": true });
        service.ok(&[
            "submit",
            "fetcher",
            "--run-id",
            &format!("run-{i:04}"),
            "--input",
            &input.to_string(),
        ]);
    }

    let logs = tempfile::tempdir().unwrap();
    let log = |w: usize| logs.path().join(format!("w{w}.log"));
    let mut workers: Vec<Child> = (0..3)
        .map(|w| worker(&proxied, &format!("w{w}"), &log(w)))
        .collect();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut faults: Vec<String> = Vec::new();
    let mut next = Instant::now() + Duration::from_millis(rng.u64(100..400));
    // A fault that lasts (a black hole, latency) until this moment.
    let mut lasting: Option<Instant> = None;
    let started = Instant::now();
    // Faults go on while runs are unfinished, up to a bound that keeps the test short;
    // the last ones are healed before the check.
    let budget = runs / 2 + 20;
    service.wait_all_finished(Duration::from_secs(600), || {
        let now = Instant::now();
        if lasting.is_some_and(|until| now >= until) {
            proxy.heal();
            lasting = None;
        }
        if faults.len() >= budget || now < next || lasting.is_some() {
            return;
        }
        let fault = match rng.u32(0..9) {
            0 => {
                proxy.cut_all();
                "cut all".to_string()
            }
            1 => {
                proxy.reset_all();
                "reset all".to_string()
            }
            2 => {
                proxy.hole_all();
                "silence all (half-open)".to_string()
            }
            3 => {
                let ms = rng.u64(300..2500);
                proxy.set_mode(Mode::BlackHole);
                lasting = Some(now + Duration::from_millis(ms));
                format!("black hole {ms} ms")
            }
            4 => {
                let ms = rng.u64(300..1500);
                proxy.set_mode(Mode::Refuse);
                proxy.reset_all();
                lasting = Some(now + Duration::from_millis(ms));
                format!("refuse {ms} ms")
            }
            5 => {
                let (delay, ms) = (rng.u64(20..300), rng.u64(500..2000));
                proxy.set_delay(Duration::from_millis(delay));
                lasting = Some(now + Duration::from_millis(ms));
                format!("latency {delay} ms for {ms} ms")
            }
            n => {
                let then = [Then::CutBefore, Then::CutAfter, Then::HoleAfter][n as usize - 6];
                let on = if rng.u32(0..4) == 0 {
                    On::Request
                } else {
                    On::Commit
                };
                let skip = rng.u32(0..4);
                proxy.arm(Trap { on, skip, then });
                format!("trap {then:?} on {on:?} after {skip}")
            }
        };
        faults.push(fault);
        next = now + Duration::from_millis(rng.u64(100..600));
    });
    proxy.heal();
    let elapsed = started.elapsed();
    for worker in &mut workers {
        signal(worker, "TERM");
        let status = worker.wait().unwrap();
        assert!(status.success(), "a drained worker exits 0: {status:?}");
    }
    let said: String = (0..3)
        .map(|w| std::fs::read_to_string(log(w)).unwrap())
        .collect();
    assert!(!said.contains("panicked"), "{said}");

    assert_all_completed(&service, &server, runs, STEPS);
    let repeats = assert_effects_fenced(&service, &server);
    let stats = proxy.stats();
    let read_back = said
        .matches("a commit's answer was lost; read back, it had committed")
        .count();
    eprintln!(
        "{test}: seed {seed:#x}: {runs} runs in {elapsed:.1?}; {} faults; {} connections, \
         {} commits, {} traps fired ({} on commits); {read_back} commits settled by reading \
         back; {repeats} effects repeated in doubt",
        faults.len(),
        stats.connections.load(Ordering::Relaxed),
        stats.commits.load(Ordering::Relaxed),
        stats.traps_fired.load(Ordering::Relaxed),
        stats.commit_traps_fired.load(Ordering::Relaxed),
    );
    eprintln!("{test}: faults in order: {faults:?}");
    assert!(
        faults.len() >= 10,
        "only {} faults before every run finished",
        faults.len()
    );
    assert!(
        stats.commit_traps_fired.load(Ordering::Relaxed) > 0,
        "no trap fired on a commit"
    );
}

/// Runs `f` on a thread of its own, failing the test (instead of hanging it) if it has
/// not returned within a minute.
fn within_a_minute<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(60))
        .unwrap_or_else(|_| panic!("{what} hung"))
}

/// A commit cut on the wire, at each moment, through the library: cut after it reached
/// the server (its answer lost), it is read back and reported committed; silenced
/// after it reached the server, the same once the call timeout passes; cut before it
/// reached the server, it is reported failed, and the key stays claimed by its holder
/// (to be retaken in doubt), its commit never sent twice. A black-holed server makes
/// every call fail within the call timeout, naming it, and the store works again
/// once the server answers.
#[test]
fn a_commit_cut_on_the_wire_is_settled_by_reading_back_and_a_black_hole_times_out() {
    use idem::store::{
        Acquired, CatalogStore, ClaimOutcome, ClaimRef, ClaimRequest, Commit, InstanceStore,
        OperatorStore, PostgresOptions, PostgresStore, RunFence, StoreError, Submission, SyncMode,
        WorkerStore,
    };
    use std::sync::Arc;

    let Some(schema) = Schema::create("a commit cut on the wire") else {
        return;
    };
    let direct = schema.url();
    let addr = server_addr(&direct);
    let proxy = Arc::new(FaultProxy::start(addr));
    // The read-back that settles a cut commit has one call timeout to reach the
    // server again through a new connection: 1 s was too short on a loaded machine
    // (this test failed so beside the seeded-faults one and a build).
    let options = PostgresOptions {
        call_timeout: Duration::from_secs(5),
        ..PostgresOptions::default()
    };
    let store = Arc::new(
        crate::util::block_on(PostgresStore::connect_with(
            &through(&direct, &proxy),
            &options,
        ))
        .unwrap(),
    );
    let lease = Duration::from_secs(600);
    let fence = crate::util::block_on(async {
        store.put_component("ab12", b"\0asm").await.unwrap();
        store
            .submit(&Submission {
                run_id: "r",
                agent: "a",
                digest: "ab12",
                namespace: "a",
                input: b"",
                authority: b"",
                replace_authority: false,
                priority: 0,
            })
            .await
            .unwrap();
        match store.acquire_run("r", "w", lease).await.unwrap() {
            Acquired::Leased(run) => RunFence {
                run_id: "r".into(),
                token: run.token,
                sync: SyncMode::Full,
            },
            other => panic!("not leased: {other:?}"),
        }
    });
    // Claims `key`, arms `then` on the next commit, commits; the commit's answer.
    let commit_cut = |key: &'static str, then: Then| {
        let (store, proxy, fence) = (Arc::clone(&store), Arc::clone(&proxy), fence.clone());
        within_a_minute(key, move || {
            crate::util::block_on(async {
                let req = ClaimRequest {
                    key,
                    fence: &fence,
                    holder: "h",
                    fingerprint: None,
                    lease,
                    durable: false,
                };
                let token = match store.claim(&req).await.unwrap() {
                    ClaimOutcome::Granted(grant) => grant.token,
                    other => panic!("{key}: {other:?}"),
                };
                proxy.arm(Trap {
                    on: On::Commit,
                    skip: 0,
                    then,
                });
                let claim = ClaimRef {
                    key,
                    token,
                    fence: &fence,
                };
                let result = format!("result of {key}");
                store
                    .commit(&Commit {
                        claim,
                        result: result.as_bytes(),
                        checkpoint: None,
                        counts: None,
                    })
                    .await
            })
        })
    };
    let committed = |key: &str| {
        crate::postgres::sql(
            &direct,
            &format!("SELECT result IS NOT NULL, holder FROM steps WHERE key = '{key}'"),
        )
    };
    let fired = || proxy.stats().commit_traps_fired.load(Ordering::Relaxed);

    commit_cut("after", Then::CutAfter).unwrap();
    assert_eq!(fired(), 1);
    assert_eq!(committed("after"), [[Some("t".to_owned()), None]]);

    commit_cut("silenced", Then::HoleAfter).unwrap();
    assert_eq!(fired(), 2);
    assert_eq!(committed("silenced"), [[Some("t".to_owned()), None]]);

    let e = commit_cut("before", Then::CutBefore).unwrap_err();
    assert_eq!(fired(), 3);
    assert!(matches!(e, StoreError::Database { .. }), "{e:?}");
    assert_eq!(
        committed("before"),
        [[Some("f".to_owned()), Some("h".to_owned())]],
        "not committed, still claimed by its holder"
    );

    // A black hole: every connection silenced, new ones never answered.
    proxy.set_mode(Mode::BlackHole);
    proxy.hole_all();
    let s = Arc::clone(&store);
    let e = within_a_minute("a call into a black hole", move || {
        crate::util::block_on(s.runs(&idem::store::RunFilter::default()))
    })
    .unwrap_err();
    let text = e.to_string();
    assert!(text.contains("cannot be reached"), "{text}");
    proxy.heal();
    let s = Arc::clone(&store);
    let runs = within_a_minute("a call after the black hole", move || {
        crate::util::block_on(s.runs(&idem::store::RunFilter::default()))
    })
    .unwrap();
    assert_eq!(runs.len(), 1);
}
