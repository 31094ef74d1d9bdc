//! Durable waits: runs that sleep or wait for a signal hold no instance and no lease,
//! and are resumed when due — by the foreground, by a worker, by another worker after a
//! SIGKILL. Time moves on the store's manual clock, driven by the test; side effects
//! are counted in the guest's log file and the store.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::runtime::{Authority, DirGrant, FaultPlan, Host, RunOptions, RunReport};
use idem::store::{
    Admission, Cancelled, Clock, Deployment, OpenOptions, PostgresOptions, PostgresStore,
    RunFilter, RunRecord, RunStatus, SqliteStore, Store, StoreError, Submission, SyncMode,
};
use idem::worker::{Worker, WorkerOptions, WorkerReport};

use crate::postgres::Schema;
use crate::util::{agent, block_on, host, run_cli, stderr, tokio};

const HOUR: Duration = Duration::from_secs(3600);
pub(crate) const T0: i64 = 1_800_000_000_000;

/// A host on a store whose clock the test moves, with a data dir granted as `/data`.
pub(crate) struct Waits {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) clock: Clock,
    pub(crate) host: Arc<Host>,
    /// The agent runs are of: the waiter, or its Python twin.
    pub(crate) agent: &'static str,
    pub(crate) _schema: Option<Schema>,
}

impl Waits {
    pub(crate) fn sqlite() -> Waits {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        let clock = Clock::manual(T0);
        let options = OpenOptions {
            clock: clock.clone(),
            ..OpenOptions::default()
        };
        let store = SqliteStore::open_with(&dir.path().join("idem.db"), &options).unwrap();
        Waits {
            host: Arc::new(host(Arc::new(store))),
            dir,
            clock,
            agent: idem_test_artifacts::WAITER,
            _schema: None,
        }
    }

    pub(crate) fn postgres(test: &str) -> Option<Waits> {
        let schema = Schema::create(test)?;
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        let clock = Clock::manual(T0);
        let options = PostgresOptions {
            clock: clock.clone(),
            pool_size: 32,
            ..PostgresOptions::default()
        };
        let store = block_on(PostgresStore::connect_with(&schema.url(), &options)).unwrap();
        Some(Waits {
            host: Arc::new(host(Arc::new(store))),
            dir,
            clock,
            agent: idem_test_artifacts::WAITER,
            _schema: Some(schema),
        })
    }

    pub(crate) fn both(test: &str, body: impl Fn(Waits)) {
        body(Waits::sqlite());
        if let Some(waits) = Waits::postgres(test) {
            body(waits);
        }
    }

    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        self.host.store()
    }

    pub(crate) fn authority(&self) -> Authority {
        Authority {
            dirs: vec![DirGrant {
                host: self.dir.path().join("data"),
                guest: "/data".to_string(),
            }],
            sync: SyncMode::Normal,
            ..Authority::default()
        }
    }

    pub(crate) fn options(&self, run_id: &str, input: serde_json::Value) -> RunOptions {
        RunOptions {
            run_id: run_id.to_string(),
            input: serde_json::to_vec(&input).unwrap(),
            authority: self.authority(),
            faults: FaultPlan::default(),
            ..RunOptions::default()
        }
    }

    /// Drives a run in the foreground on a task of its own.
    pub(crate) fn spawn_run(
        &self,
        run_id: &str,
        input: serde_json::Value,
    ) -> tokio::task::JoinHandle<RunReport> {
        self.spawn_with(self.options(run_id, input))
    }

    pub(crate) fn spawn_with(&self, opts: RunOptions) -> tokio::task::JoinHandle<RunReport> {
        let (host, waiter) = (Arc::clone(&self.host), agent(self.agent));
        tokio().spawn(async move { host.run(&waiter, &opts).await.unwrap() })
    }

    /// Deploys the waiter as `waiter` and queues runs for workers.
    pub(crate) fn submit(&self, runs: &[(String, serde_json::Value)]) {
        let waiter = agent(self.agent);
        let authority = self.authority().encode();
        block_on(async {
            let store = self.store();
            store
                .put_component(waiter.digest(), waiter.bytes().unwrap())
                .await
                .unwrap();
            store
                .deploy(&Deployment {
                    name: "waiter",
                    digest: waiter.digest(),
                    authority: &authority,
                    admission: Admission::Explicit,
                    source: None,
                })
                .await
                .unwrap();
            for (run_id, input) in runs {
                store
                    .submit(&Submission {
                        run_id,
                        agent: "waiter",
                        digest: waiter.digest(),
                        namespace: "waiter",
                        input: &serde_json::to_vec(input).unwrap(),
                        authority: &authority,
                        replace_authority: false,
                        priority: 0,
                    })
                    .await
                    .unwrap();
            }
        });
    }

    /// Starts a worker on this host; stop it with the sender.
    pub(crate) fn worker(
        &self,
        concurrency: usize,
    ) -> (
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<WorkerReport>,
    ) {
        let worker = Arc::new(Worker::new(
            Arc::clone(&self.host),
            WorkerOptions {
                concurrency,
                poll: Duration::from_millis(5),
                ..WorkerOptions::default()
            },
        ));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let handle = tokio().spawn(async move {
            worker
                .run(async {
                    let _ = stopped.await;
                })
                .await
                .unwrap()
        });
        (stop, handle)
    }

    pub(crate) fn record(&self, run_id: &str) -> RunRecord {
        block_on(self.store().run(run_id)).unwrap().unwrap()
    }

    /// Whether the run exists and is suspended in a wait.
    pub(crate) fn suspended(&self, run_id: &str) -> bool {
        block_on(self.store().run(run_id))
            .unwrap()
            .is_some_and(|r| suspended(&r))
    }

    pub(crate) fn runs(&self) -> Vec<RunRecord> {
        block_on(self.store().runs(&RunFilter::default())).unwrap()
    }

    pub(crate) fn log(&self, name: &str) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("data").join(name))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    pub(crate) fn signal(
        &self,
        run_id: &str,
        name: &str,
        payload: &str,
    ) -> Result<bool, StoreError> {
        block_on(
            self.store()
                .send_signal(run_id, name, payload.as_bytes(), 1 << 20),
        )
        .map(|sent| sent.woke)
    }
}

/// Polls (every few milliseconds, for at most `limit` of real time) until `done`.
pub(crate) fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether the run is suspended in a wait: running, no lease, a wake time.
pub(crate) fn suspended(record: &RunRecord) -> bool {
    record.status == RunStatus::Running && record.lease.is_none() && record.wake_at.is_some()
}

#[test]
fn a_run_sleeping_one_hour_resumes_in_the_foreground_when_the_clock_passes() {
    Waits::both("sleep_one_hour", |w| sleeps_one_hour(&w));
}

fn sleeps_one_hour(w: &Waits) {
    {
        let input = serde_json::json!({"log": "/data/w.log", "waits": [{"sleep_ms": 3_600_000}]});
        let run = w.spawn_run("nap", input);
        wait_until("the run sleeps", Duration::from_secs(30), || {
            w.suspended("nap")
        });
        let record = w.record("nap");
        assert_eq!(record.wake_at, Some(T0 + 3_600_000));
        assert_eq!(record.waiting_for, None);
        assert_eq!(
            w.host.live_instances(),
            0,
            "a sleeping run holds no instance"
        );
        assert_eq!(w.log("w.log"), ["start gen=0"]);

        // A minute short of the hour: nothing wakes it.
        w.clock.advance(HOUR - Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(300));
        assert!(w.suspended("nap"));
        assert_eq!(w.log("w.log").len(), 1);

        w.clock.advance(Duration::from_secs(60));
        let report = block_on(run).unwrap();
        assert_eq!(report.status, RunStatus::Completed);
        assert_eq!(
            String::from_utf8(report.outcome).unwrap(),
            r#"{"results":["slept"]}"#
        );
        assert_eq!(w.log("w.log"), ["start gen=0", "after 0 slept gen=1"]);
        let waits = block_on(w.store().waits("nap")).unwrap();
        assert_eq!(waits.len(), 1);
        assert_eq!(waits[0].due, Some(T0 + 3_600_000));
        assert_eq!(w.record("nap").wake_at, None);

        // Run again: the elapsed sleep returns at once, nothing runs again.
        let input = serde_json::json!({"log": "/data/w.log", "waits": [{"sleep_ms": 3_600_000}]});
        let again = block_on(w.spawn_run("nap", input)).unwrap();
        assert!(again.already_finished);
        assert_eq!(w.log("w.log").len(), 2);
    }
}

#[test]
fn a_replayed_sleep_keeps_its_first_wake_time() {
    let w = Waits::sqlite();
    // Dropped right before its second step's claim, after the sleep was recorded: the
    // next instance reaches the same sleep and finds its first wake time.
    let mut opts = w.options(
        "replay",
        serde_json::json!({"log": "/data/r.log", "waits": [{"sleep_ms": 1000}]}),
    );
    opts.faults.crash_at = vec!["before-claim:2".parse().unwrap()];
    let run = w.spawn_with(opts);
    wait_until("the run sleeps", Duration::from_secs(30), || {
        w.suspended("replay")
    });
    w.clock.advance(Duration::from_millis(400));
    std::thread::sleep(Duration::from_millis(100));
    assert!(w.suspended("replay"), "not due before its first time");
    w.clock.advance(Duration::from_millis(600));
    let report = block_on(run).unwrap();
    assert_eq!(report.status, RunStatus::Completed);
    assert_eq!(w.log("r.log").len(), 2);
    let waits = block_on(w.store().waits("replay")).unwrap();
    assert_eq!(waits[0].due, Some(T0 + 1000));
}

fn sleepers_wake_in_due_order(w: &Waits, count: usize) {
    // Due times spread over `count` seconds, in an order unlike submission's.
    let due_s = |i: usize| (i * 7919) % count + 1;
    let runs: Vec<(String, serde_json::Value)> = (0..count)
        .map(|i| {
            let input = serde_json::json!({
                "log": "/data/sleepers.log",
                "waits": [{"sleep_ms": due_s(i) as u64 * 1000}],
            });
            (format!("s{i:05}"), input)
        })
        .collect();
    w.submit(&runs);
    let (stop, worker) = w.worker(256);
    wait_until("every run sleeps", Duration::from_secs(600), || {
        w.runs().iter().filter(|r| suspended(r)).count() == count
    });
    assert_eq!(
        w.host.live_instances(),
        0,
        "{count} sleeping runs hold no instance"
    );
    assert_eq!(w.log("sleepers.log").len(), count, "each started once");

    // Time passes in tenths: exactly the runs due by then wake, and no other.
    for tenth in 1..=10 {
        let until = count * tenth / 10;
        w.clock.set(T0 + until as i64 * 1000);
        wait_until("the due runs complete", Duration::from_secs(600), || {
            w.runs()
                .iter()
                .filter(|r| r.status == RunStatus::Completed)
                .count()
                == until
        });
        for (i, (run_id, _)) in runs.iter().enumerate() {
            if due_s(i) > until {
                let record = w.record(run_id);
                assert!(suspended(&record), "{run_id} woke before its time");
            }
        }
        if tenth == 5 {
            assert_eq!(w.host.live_instances(), 0);
        }
    }
    stop.send(()).unwrap();
    let report = block_on(worker).unwrap();
    assert_eq!(report.finished, count as u64);
    assert_eq!(report.suspended, count as u64);
    assert_eq!(w.log("sleepers.log").len(), 2 * count, "each step once");
}

#[test]
fn a_worker_holding_10000_sleeping_runs_has_no_live_instance_and_wakes_them_in_due_order() {
    sleepers_wake_in_due_order(&Waits::sqlite(), 10_000);
}

#[test]
fn sleepers_wake_in_due_order_on_postgres() {
    if let Some(w) = Waits::postgres("sleepers_wake_in_due_order") {
        sleepers_wake_in_due_order(&w, 500);
    }
}

#[test]
fn a_sleeping_run_whose_worker_was_sigkilled_is_woken_by_another_worker() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let db = dir.path().join("idem.db");
    let db_s = db.to_str().unwrap();
    let grant = format!("{}::/data", data.display());
    let ok = |args: &[&str]| {
        let out = run_cli(args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    };
    ok(&[
        "deploy",
        idem_test_artifacts::WAITER,
        "--name",
        "waiter",
        "--db",
        db_s,
        "--dir",
        &grant,
    ]);
    let input = r#"{"log": "/data/k.log", "waits": [{"sleep_ms": 3600000}]}"#;
    ok(&[
        "submit", "waiter", "--db", db_s, "--input", input, "--run-id", "k1",
    ]);
    let mut worker = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["worker", "--db", db_s, "--name", "doomed", "--poll", "20ms"])
        .env("IDEM_LOG", "error")
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let reader = crate::util::open_store_read_only(&db);
    wait_until("the run sleeps", Duration::from_secs(60), || {
        block_on(reader.run("k1"))
            .unwrap()
            .is_some_and(|r| suspended(&r))
    });
    let wake_at = block_on(reader.run("k1"))
        .unwrap()
        .unwrap()
        .wake_at
        .unwrap();
    worker.kill().unwrap();
    worker.wait().unwrap();

    // Another worker, on the same store, whose clock the test moves past the hour.
    let clock = Clock::manual(wake_at - 1000);
    let options = OpenOptions {
        clock: clock.clone(),
        ..OpenOptions::default()
    };
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_with(&db, &options).unwrap());
    let w = Waits {
        host: Arc::new(host(store)),
        dir,
        clock,
        agent: idem_test_artifacts::WAITER,
        _schema: None,
    };
    let (stop, other) = w.worker(8);
    std::thread::sleep(Duration::from_millis(200));
    assert!(w.suspended("k1"), "not before its time");
    w.clock.set(wake_at);
    wait_until("the run completes", Duration::from_secs(60), || {
        w.record("k1").status == RunStatus::Completed
    });
    stop.send(()).unwrap();
    assert_eq!(block_on(other).unwrap().finished, 1);
    assert_eq!(w.log("k.log"), ["start gen=0", "after 0 slept gen=1"]);
}

#[test]
fn a_signal_sent_before_during_and_after_a_crash_is_received_exactly_once() {
    Waits::both("signals_exactly_once", |w| signals_exactly_once(&w));
}

/// The same as the test above, and the one-hour sleep, with the waiter's Python twin.
#[test]
fn a_python_agent_sleeps_and_takes_signals_exactly_once() {
    if idem_test_artifacts::PY_WAITER.is_empty() {
        eprintln!(
            "SKIPPED: Python agents were not built (no componentize-py): waits; \
             run scripts/test, which installs it"
        );
        return;
    }
    let python = || Waits {
        agent: idem_test_artifacts::PY_WAITER,
        ..Waits::sqlite()
    };
    signals_exactly_once(&python());
    sleeps_one_hour(&python());
}

fn signals_exactly_once(w: &Waits) {
    {
        let input = |log: &str| {
            serde_json::json!({"log": format!("/data/{log}"), "waits": [
                {"signal": "approval", "timeout_ms": 3_600_000},
                {"signal": "approval", "timeout_ms": 3_600_000},
            ]})
        };
        // Before: both signals are kept until the waits ask, and taken in order.
        w.submit(&[("before".to_string(), input("before.log"))]);
        assert!(!w.signal("before", "approval", r#"{"n":1}"#).unwrap());
        assert!(!w.signal("before", "approval", r#"{"n":2}"#).unwrap());
        let report = block_on(w.spawn_run("before", input("before.log"))).unwrap();
        assert_eq!(report.status, RunStatus::Completed);
        assert_eq!(
            w.log("before.log"),
            [
                "start gen=0",
                r#"after 0 {"n":1} gen=0"#,
                r#"after 1 {"n":2} gen=0"#
            ]
        );

        // During: the run waits holding no instance; each signal wakes it at once.
        let run = w.spawn_run("during", input("during.log"));
        wait_until("the run waits", Duration::from_secs(30), || {
            w.suspended("during")
        });
        assert_eq!(w.record("during").waiting_for.as_deref(), Some("approval"));
        assert_eq!(w.host.live_instances(), 0);
        assert!(w.signal("during", "approval", r#""one""#).unwrap());
        wait_until("the second wait", Duration::from_secs(30), || {
            w.log("during.log").len() == 2 && w.suspended("during")
        });
        assert!(w.signal("during", "approval", r#""two""#).unwrap());
        assert_eq!(block_on(run).unwrap().status, RunStatus::Completed);
        assert_eq!(
            w.log("during.log"),
            [
                "start gen=0",
                r#"after 0 "one" gen=1"#,
                r#"after 1 "two" gen=2"#
            ]
        );

        // After a crash: the instance is dropped right after the first receipt (before
        // the step that follows); the next one gets the same payload from the wait's
        // record, and the second signal goes to the second wait only.
        w.submit(&[("crash".to_string(), input("crash.log"))]);
        w.signal("crash", "approval", r#""first""#).unwrap();
        w.signal("crash", "approval", r#""second""#).unwrap();
        let mut opts = w.options("crash", input("crash.log"));
        opts.faults.crash_at = vec![
            "before-claim:2".parse().unwrap(),
            "before-claim:3".parse().unwrap(),
        ];
        let report = block_on(w.spawn_with(opts)).unwrap();
        assert_eq!(report.status, RunStatus::Completed);
        assert_eq!(
            String::from_utf8(report.outcome).unwrap(),
            r#"{"results":["\"first\"","\"second\""]}"#
        );
        assert_eq!(
            w.log("crash.log"),
            [
                "start gen=0",
                r#"after 0 "first" gen=1"#,
                r#"after 1 "second" gen=2"#
            ]
        );
        // A third signal after the run completed is refused, and nothing is kept.
        assert!(matches!(
            w.signal("crash", "approval", "3"),
            Err(StoreError::RunFinished { .. })
        ));
    }
}

#[test]
fn a_signal_wait_times_out_typed_and_a_replay_times_out_again() {
    Waits::both("signal_timeout", |w| {
        let input = serde_json::json!({"log": "/data/t.log", "waits": [
            {"signal": "approval", "timeout_ms": 60_000}]});
        let run = w.spawn_run("late", input);
        wait_until("the run waits", Duration::from_secs(30), || {
            w.suspended("late")
        });
        assert_eq!(w.record("late").wake_at, Some(T0 + 60_000));
        w.clock.advance(Duration::from_secs(60));
        let report = block_on(run).unwrap();
        assert_eq!(
            String::from_utf8(report.outcome).unwrap(),
            r#"{"results":["timed-out"]}"#
        );
        let waits = block_on(w.store().waits("late")).unwrap();
        assert_eq!(waits[0].outcome.as_deref(), Some("timed-out"));
    });
}

#[test]
fn cancelling_a_sleeping_or_waiting_run_ends_it_at_once() {
    Waits::both("cancel_waiting", |w| {
        // Held by a worker: the worker holds nothing while it sleeps.
        w.submit(&[(
            "sleeper".to_string(),
            serde_json::json!({"log": "/data/c.log", "waits": [{"sleep_ms": 3_600_000}]}),
        )]);
        let (stop, worker) = w.worker(4);
        wait_until("the run sleeps", Duration::from_secs(30), || {
            w.suspended("sleeper")
        });
        assert_eq!(
            block_on(w.store().cancel_run("sleeper")).unwrap(),
            Cancelled::Now
        );
        let record = w.record("sleeper");
        assert_eq!(record.status, RunStatus::Cancelled);
        assert_eq!(record.wake_at, None);
        w.clock.advance(HOUR * 2);
        std::thread::sleep(Duration::from_millis(200));
        stop.send(()).unwrap();
        assert_eq!(block_on(worker).unwrap().finished, 0);
        assert_eq!(w.log("c.log"), ["start gen=0"]);

        // Waiting in the foreground for a signal: `idem run` returns cancelled.
        let run = w.spawn_run(
            "waiter",
            serde_json::json!({"log": "/data/f.log", "waits": [{"signal": "go"}]}),
        );
        wait_until("the run waits", Duration::from_secs(30), || {
            w.suspended("waiter")
        });
        assert_eq!(w.record("waiter").wake_at, Some(i64::MAX));
        block_on(w.store().cancel_run("waiter")).unwrap();
        let report = block_on(run).unwrap();
        assert_eq!(report.status, RunStatus::Cancelled);
        assert_eq!(w.log("f.log"), ["start gen=0"]);
        assert!(matches!(
            w.signal("waiter", "go", "null"),
            Err(StoreError::RunFinished { .. })
        ));
    });
}

#[test]
fn absurd_waits_fail_the_run_with_a_clear_error_and_record_nothing() {
    let w = Waits::sqlite();
    for (run_id, wait, expected) in [
        (
            "forever",
            serde_json::json!({"sleep_ms": u64::MAX}),
            "invalid wait time",
        ),
        (
            "negative",
            serde_json::json!({"until_ms": -5000}),
            "before the Unix epoch",
        ),
        (
            "far",
            serde_json::json!({"until_ms": i64::MAX}),
            "more than 100 years away",
        ),
        (
            "long-timeout",
            serde_json::json!({"signal": "x", "timeout_ms": 4_000_000_000_000_u64}),
            "longest wait a store keeps",
        ),
        (
            "bad-name",
            serde_json::json!({"signal": ""}),
            "must not be empty",
        ),
    ] {
        let input = serde_json::json!({"log": "/data/a.log", "waits": [wait]});
        let report = block_on(w.spawn_run(run_id, input)).unwrap();
        assert_eq!(report.status, RunStatus::Failed, "{run_id}");
        let error = String::from_utf8(report.outcome).unwrap();
        assert!(error.contains(expected), "{run_id}: {error}");
        assert!(block_on(w.store().waits(run_id)).unwrap().is_empty());
        assert_eq!(w.record(run_id).wake_at, None);
    }
}

#[test]
fn idem_signal_refuses_unknown_and_finished_runs_bad_names_and_large_payloads() {
    let w = Waits::sqlite();
    let db = w.dir.path().join("idem.db");
    let db = db.to_str().unwrap();
    w.submit(&[(
        "open".to_string(),
        serde_json::json!({"log": "/data/s.log", "waits": []}),
    )]);
    block_on(w.spawn_run(
        "done",
        serde_json::json!({"log": "/data/s.log", "waits": []}),
    ))
    .unwrap();
    let big = std::env::temp_dir().join(format!("idem-big-{}.json", std::process::id()));
    // Over the default state limit (64 MiB) by its quotes.
    std::fs::write(&big, format!("\"{}\"", "x".repeat(64 << 20))).unwrap();
    let big_arg = format!("@{}", big.display());
    for (args, expected) in [
        (vec!["nobody", "go"], "run \"nobody\" does not exist"),
        (vec!["done", "go"], "already completed"),
        (vec!["open", ""], "must not be empty"),
        (vec!["open", "go", "--payload", "{nope"], "not valid JSON"),
        (
            vec!["open", "go", "--payload", &big_arg],
            "over the state limit",
        ),
    ] {
        let mut all = vec!["signal"];
        all.extend_from_slice(&args);
        all.extend_from_slice(&["--db", db]);
        let out = run_cli(&all);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains(expected),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    std::fs::remove_file(&big).unwrap();
    // The limit is the run's own: a run submitted with a 1 KiB state limit refuses a
    // 2 KiB payload that a run with the default limit takes.
    let out = run_cli(&[
        "submit",
        "waiter",
        "--run-id",
        "small",
        "--max-state-bytes",
        "1024",
        "--input",
        r#"{"log": "/data/s.log", "waits": []}"#,
        "--db",
        db,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let payload = format!("\"{}\"", "y".repeat(2048));
    let out = run_cli(&["signal", "small", "go", "--payload", &payload, "--db", db]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("over the state limit of 1024 bytes"),
        "{}",
        stderr(&out)
    );
    // Nothing was kept for any of them.
    let conn = crate::util::raw_db(std::path::Path::new(db));
    let signals: i64 = conn
        .query_row("SELECT count(*) FROM signals", [], |r| r.get(0))
        .unwrap();
    assert_eq!(signals, 0);
    let out = run_cli(&[
        "signal",
        "open",
        "go",
        "--payload",
        r#"{"ok":true}"#,
        "--db",
        db,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run_cli(&["signal", "open", "go", "--payload", &payload, "--db", db]);
    assert!(out.status.success(), "{}", stderr(&out));
    let signals: i64 = conn
        .query_row("SELECT count(*) FROM signals", [], |r| r.get(0))
        .unwrap();
    assert_eq!(signals, 2);
}

#[test]
fn the_approval_example_pays_once_after_idem_signal_through_submit_and_a_worker() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let db = dir.path().join("idem.db");
    let db_s = db.to_str().unwrap();
    let grant = format!("{}::/data", data.display());
    let ok = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend_from_slice(&["--db", db_s]);
        let out = run_cli(&all);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        crate::util::stdout(&out)
    };
    ok(&[
        "deploy",
        idem_test_artifacts::APPROVAL,
        "--name",
        "payments",
        "--dir",
        &grant,
    ]);
    let input = |id: &str| {
        format!(
            r#"{{"payment": {{"id": "{id}", "to": "acme", "cents": 12500}},
                "log": "/data/payments.log", "timeout_s": 86400}}"#
        )
    };
    for id in ["p-1", "p-2"] {
        ok(&["submit", "payments", "--input", &input(id), "--run-id", id]);
    }
    // Approved before the run even reaches its wait: kept for it.
    ok(&[
        "signal",
        "p-2",
        "approval",
        "--payload",
        r#"{"approved": false, "by": "bob"}"#,
    ]);
    let mut worker = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["worker", "--db", db_s, "--name", "w", "--poll", "20ms"])
        .env("IDEM_LOG", "error")
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let reader = crate::util::open_store_read_only(&db);
    let run = |id: &str| block_on(reader.run(id)).unwrap().unwrap();
    wait_until(
        "p-1 waits for its approval",
        Duration::from_secs(60),
        || suspended(&run("p-1")) && run("p-2").status == RunStatus::Completed,
    );
    let shown = ok(&["show", "p-1"]);
    assert!(shown.contains("waiting for approval until"), "{shown}");
    let listed = ok(&["ls"]);
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with("p-1") && l.contains("waiting"))
    );
    let sent = ok(&[
        "signal",
        "p-1",
        "approval",
        "--payload",
        r#"{"approved": true, "by": "alice"}"#,
    ]);
    assert!(sent.contains("is due now"), "{sent}");
    wait_until("p-1 completes", Duration::from_secs(60), || {
        run("p-1").status == RunStatus::Completed
    });
    worker.kill().unwrap();
    worker.wait().unwrap();
    assert_eq!(
        run("p-1").outcome.unwrap(),
        br#"{"payment":"p-1","status":"paid","by":"alice"}"#
    );
    assert_eq!(
        run("p-2").outcome.unwrap(),
        br#"{"payment":"p-2","status":"refused","by":"bob"}"#
    );
    let log = std::fs::read_to_string(data.join("payments.log")).unwrap();
    let count = |prefix: &str| log.lines().filter(|l| l.starts_with(prefix)).count();
    assert_eq!(count("prepared p-1 to acme 12500 cents"), 1, "{log}");
    assert_eq!(count("prepared p-2 to acme 12500 cents"), 1, "{log}");
    assert_eq!(count("paid "), 1, "{log}");
    assert_eq!(
        count("paid p-1 to acme 12500 cents approved by alice"),
        1,
        "{log}"
    );
    // A second approval after it paid is refused: the run is finished.
    let out = run_cli(&["signal", "p-1", "approval", "--db", db_s]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("already completed"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_step_failing_twice_then_succeeding_shows_attempts_1_2_3_with_its_backoff_recorded() {
    Waits::both("retry_backoff", |w| {
        let retry = serde_json::json!({"retry": {
            "fail": 2, "max_attempts": 5, "initial_ms": 1000, "jitter": false}});
        let input = serde_json::json!({"log": "/data/retry.log", "waits": [retry]});
        let run = w.spawn_run("flaky", input.clone());
        // Attempt 1 failed: the run backs off 1 s, holding no instance.
        wait_until("the first backoff", Duration::from_secs(30), || {
            w.suspended("flaky")
        });
        assert_eq!(w.record("flaky").wake_at, Some(T0 + 1000));
        assert_eq!(w.host.live_instances(), 0);
        w.clock.advance(Duration::from_millis(1000));
        // Attempt 2 failed: 2 s more.
        wait_until("the second backoff", Duration::from_secs(30), || {
            w.suspended("flaky") && w.record("flaky").wake_at == Some(T0 + 3000)
        });
        w.clock.advance(Duration::from_millis(2000));
        let report = block_on(run).unwrap();
        assert_eq!(report.status, RunStatus::Completed);
        assert_eq!(
            String::from_utf8(report.outcome).unwrap(),
            r#"{"results":["ok-3"]}"#
        );
        assert_eq!(
            w.log("retry.log"),
            [
                "start gen=0",
                "try 0 attempt=1 gen=0",
                "try 0 attempt=2 gen=1",
                "try 0 attempt=3 gen=2",
                "after 0 ok-3 gen=2",
            ]
        );
        // The backoff, as the store recorded it: one sleep per failed attempt.
        let waits = block_on(w.store().waits("flaky")).unwrap();
        let backoff: Vec<(i64, i64)> = waits
            .iter()
            .map(|wait| (wait.created - T0, wait.due.unwrap() - wait.created))
            .collect();
        assert_eq!(backoff, [(0, 1000), (1000, 2000)]);
        assert!(waits.iter().all(|wait| wait.key.starts_with("retry-")));
        let steps = block_on(w.store().steps("flaky")).unwrap();
        let flaky = steps.iter().find(|s| s.key.contains("/flaky/")).unwrap();
        assert_eq!(flaky.attempt, 3);
        assert!(flaky.committed_at.is_some());
        let logs = String::from_utf8(block_on(w.store().logs("flaky")).unwrap()).unwrap();
        assert!(
            logs.contains("failed: flaky 1; retrying in 1000 ms"),
            "{logs}"
        );
        assert!(
            logs.contains("failed: flaky 2; retrying in 2000 ms"),
            "{logs}"
        );
    });
}

#[test]
fn a_permanent_error_or_the_last_attempts_error_is_committed_and_returned_on_replay() {
    Waits::both("retry_permanent", |w| {
        // Permanent: committed at the first attempt, no backoff.
        let permanent = serde_json::json!({"retry": {
            "fail": 9, "permanent": true, "max_attempts": 5, "initial_ms": 1000}});
        let mut opts = w.options(
            "refused",
            serde_json::json!({"log": "/data/p.log", "waits": [permanent]}),
        );
        // Dropped right after the error was committed (before the next step): the
        // next instance gets the error back from the store without a second attempt.
        opts.faults.crash_at = vec!["before-claim:3".parse().unwrap()];
        let report = block_on(w.spawn_with(opts)).unwrap();
        let expected = r#"{"results":["error: refused 1 (permanent, at attempt 1)"]}"#;
        assert_eq!(String::from_utf8(report.outcome).unwrap(), expected);
        assert!(block_on(w.store().waits("refused")).unwrap().is_empty());
        assert_eq!(
            w.log("p.log"),
            [
                "start gen=0",
                "try 0 attempt=1 gen=0",
                "after 0 error: refused 1 (permanent, at attempt 1) gen=1"
            ]
        );

        // Transient to the end: two attempts, then the error is committed; the replay
        // (the instance dropped right after, before the next step) returns it without
        // a third attempt.
        let spent = serde_json::json!({"retry": {
            "fail": 9, "max_attempts": 2, "initial_ms": 500, "jitter": true}});
        let mut opts = w.options(
            "spent",
            serde_json::json!({"log": "/data/s.log", "waits": [spent]}),
        );
        opts.faults.crash_at = vec!["before-claim:3".parse().unwrap()];
        let run = w.spawn_with(opts);
        wait_until("the backoff", Duration::from_secs(30), || {
            w.suspended("spent")
        });
        let due = w.record("spent").wake_at.unwrap();
        assert!(
            (T0 + 250..=T0 + 500).contains(&due),
            "jittered: {}",
            due - T0
        );
        w.clock.set(due);
        let report = block_on(run).unwrap();
        let expected = r#"{"results":["error: flaky 2 (gave up after attempt 2)"]}"#;
        assert_eq!(String::from_utf8(report.outcome).unwrap(), expected);
        let log = w.log("s.log");
        assert_eq!(
            log.iter().filter(|l| l.starts_with("try ")).count(),
            2,
            "{log:?}"
        );
        assert_eq!(log.iter().filter(|l| l.starts_with("after ")).count(), 1);
        assert!(report.counts.instances >= 3, "{:?}", report.counts);
    });
}
