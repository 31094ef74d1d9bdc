//! idem on PostgreSQL through the real binary: `--db postgres://...` for every
//! subcommand, the errors an operator meets (server down, password refused, no such
//! database), an agent run end to end with what it wrote checked in the database, and
//! workers on a private server that is restarted under them.
//!
//! `IDEM_TEST_POSTGRES` as for the store tests: unset, these tests print `SKIPPED:` and
//! pass without a server; `required` runs them against postgres://root@127.0.0.1:5432/test.
//! The private servers (password auth, restarts) are started by the test itself with
//! `initdb` and `pg_ctl`, as the `postgres` user, on a free loopback port.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use idem_test_artifacts::LEDGER;

use crate::util::{run_cli, stderr, stdout};

/// The shared server CI starts.
pub const DEFAULT_URL: &str = "postgres://root@127.0.0.1:5432/test";

/// The shared server's URL, or `None` after saying the test is skipped.
pub fn test_server(test: &str) -> Option<String> {
    match std::env::var("IDEM_TEST_POSTGRES") {
        Err(_) => {
            eprintln!(
                "SKIPPED: PostgreSQL test {test}: IDEM_TEST_POSTGRES is not set (`required` \
                 runs it against {DEFAULT_URL})"
            );
            None
        }
        Ok(value) if value == "required" || value == "1" => Some(DEFAULT_URL.to_owned()),
        Ok(url) => Some(url),
    }
}

/// Runs SQL on a server as a client other than idem; the rows' columns as text.
pub fn sql(url: &str, query: &str) -> Vec<Vec<Option<String>>> {
    let (url, query) = (url.to_owned(), query.to_owned());
    crate::util::block_on(async move {
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
        let driver = tokio::spawn(connection);
        let messages = client.simple_query(&query).await.unwrap();
        drop(client);
        let _ = driver.await;
        messages
            .into_iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(row) => Some(
                    (0..row.len())
                        .map(|i| row.get(i).map(str::to_owned))
                        .collect(),
                ),
                _ => None,
            })
            .collect()
    })
}

/// One number a query returns.
pub fn count(url: &str, query: &str) -> i64 {
    sql(url, query)[0][0].as_deref().unwrap().parse().unwrap()
}

/// A schema of its own on the shared server, dropped at the end; its URL makes idem
/// keep its tables there.
pub struct Schema {
    server: String,
    name: String,
}

impl Schema {
    pub fn create(test: &str) -> Option<Schema> {
        let server = test_server(test)?;
        let name = format!("idem_cli_{}_{}", std::process::id(), fastrand::u32(..));
        sql(&server, &format!("CREATE SCHEMA {name}"));
        Some(Schema { server, name })
    }

    pub fn url(&self) -> String {
        format!("{}?options=-csearch_path%3D{}", self.server, self.name)
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            sql(&self.server, &format!("DROP SCHEMA {} CASCADE", self.name));
        }
    }
}

/// A port nobody listens on (now).
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A PostgreSQL server of the test's own, in a temp dir, on a free loopback port:
/// password authentication over TCP, and restarts that touch nobody else.
pub struct PrivateServer {
    dir: tempfile::TempDir,
    bin: PathBuf,
    pub port: u16,
}

/// The user and password every private server has.
pub const USER: &str = "idem";
pub const PASSWORD: &str = "s3cret";

impl PrivateServer {
    pub fn start(test: &str) -> Option<PrivateServer> {
        test_server(test)?;
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .ok()
            .and_then(|versions| {
                versions
                    .filter_map(Result::ok)
                    .map(|v| v.path().join("bin"))
                    .find(|bin| bin.join("initdb").exists())
            })
            .expect("IDEM_TEST_POSTGRES is set, but no initdb under /usr/lib/postgresql");
        let dir = tempfile::tempdir().unwrap();
        let server = PrivateServer {
            dir,
            bin,
            port: free_port(),
        };
        std::fs::write(server.root().join("pw"), PASSWORD).unwrap();
        std::fs::create_dir(server.root().join("sock")).unwrap();
        // Run as the `postgres` user: the server refuses to run as root.
        let chown = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(server.root())
            .status()
            .unwrap();
        assert!(chown.success());
        let initdb = server.bin.join("initdb");
        server.run_as_postgres(
            initdb.to_str().unwrap(),
            &[
                "-D",
                server.data().to_str().unwrap(),
                "-U",
                USER,
                "--pwfile",
                server.root().join("pw").to_str().unwrap(),
                "--auth-host=scram-sha-256",
                "--auth-local=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        server.pg_ctl(&["start"]);
        Some(server)
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn data(&self) -> PathBuf {
        self.root().join("data")
    }

    fn run_as_postgres(&self, program: &str, args: &[&str]) {
        let out = Command::new("runuser")
            .args(["-u", "postgres", "--", program])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{program} {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `pg_ctl ACTION` on the server, waiting for it.
    pub fn pg_ctl(&self, action: &[&str]) {
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {} -c fsync=off",
            self.port,
            self.root().join("sock").display()
        );
        let pg_ctl = self.bin.join("pg_ctl");
        let log = self.root().join("server.log");
        let data = self.data();
        let mut args = vec![
            "-D",
            data.to_str().unwrap(),
            "-l",
            log.to_str().unwrap(),
            "-o",
            &options,
            "-w",
            "-m",
            "fast",
        ];
        args.extend_from_slice(action);
        self.run_as_postgres(pg_ctl.to_str().unwrap(), &args);
    }

    /// The URL of database `db` as user `idem` with `password`.
    pub fn url_with(&self, password: &str, db: &str) -> String {
        format!("postgres://{USER}:{password}@127.0.0.1:{}/{db}", self.port)
    }

    /// The URL of the server's `postgres` database with the right password.
    pub fn url(&self) -> String {
        self.url_with(PASSWORD, "postgres")
    }
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        let pg_ctl = self.bin.join("pg_ctl");
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--", pg_ctl.to_str().unwrap()])
            .args([
                "-D",
                self.data().to_str().unwrap(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ])
            .output();
    }
}

fn ledger_input(items: &[&str]) -> String {
    serde_json::json!({ "items": items, "log": "/data/ledger.log" }).to_string()
}

fn run_ledger(db: &str, data: &Path, run_id: &str, items: &[&str]) -> Output {
    let grant = format!("{}::/data", data.display());
    run_cli(&[
        "run",
        LEDGER,
        "--db",
        db,
        "--dir",
        &grant,
        "--run-id",
        run_id,
        "--sync",
        "full",
        "--input",
        &ledger_input(items),
    ])
}

#[test]
fn a_ledger_run_on_postgres_end_to_end_with_counts_in_the_database() {
    let Some(schema) = Schema::create("ledger") else {
        return;
    };
    let url = schema.url();
    let data = tempfile::tempdir().unwrap();
    let out = run_ledger(&url, data.path(), "ledger-1", &["a", "b", "c"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let log = std::fs::read_to_string(data.path().join("ledger.log")).unwrap();
    assert_eq!(log.lines().count(), 3, "{log}");

    // What the database holds, read by a client other than idem.
    let q = |query: &str| count(&url, query);
    assert_eq!(q("SELECT count(*) FROM runs"), 1);
    assert_eq!(
        sql(
            &url,
            "SELECT status, executed, skipped, lease_holder FROM runs"
        )[0],
        vec![
            Some("completed".to_owned()),
            Some("3".to_owned()),
            Some("0".to_owned()),
            None
        ]
    );
    assert_eq!(q("SELECT count(*) FROM steps WHERE result IS NOT NULL"), 3);
    assert_eq!(q("SELECT count(*) FROM steps WHERE result IS NULL"), 0);
    assert_eq!(q("SELECT count(*) FROM components"), 1);
    assert_eq!(q("SELECT max(version) FROM idem_migrations"), 18);

    // Running it again executes nothing: every key is committed.
    let again = run_ledger(&url, data.path(), "ledger-1", &["a", "b", "c"]);
    assert!(again.status.success(), "{}", stderr(&again));
    let log = std::fs::read_to_string(data.path().join("ledger.log")).unwrap();
    assert_eq!(log.lines().count(), 3, "no side effect twice: {log}");
    assert_eq!(q("SELECT count(*) FROM steps"), 3);

    // The read-only commands read the same database.
    let ls = run_cli(&["ls", "--db", &url]);
    assert!(ls.status.success(), "{}", stderr(&ls));
    assert!(stdout(&ls).contains("ledger-1"), "{}", stdout(&ls));
    assert!(stdout(&ls).contains("completed"), "{}", stdout(&ls));
    let show = run_cli(&["show", "--db", &url, "ledger-1"]);
    assert!(show.status.success(), "{}", stderr(&show));
    assert!(stdout(&show).contains("completed"), "{}", stdout(&show));
}

#[test]
fn looking_at_an_empty_database_creates_nothing() {
    let Some(schema) = Schema::create("empty") else {
        return;
    };
    let url = schema.url();
    let out = run_cli(&["ls", "--db", &url]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no idem store is there"),
        "{}",
        stderr(&out)
    );
    let tables = count(
        &url,
        &format!(
            "SELECT count(*) FROM pg_tables WHERE schemaname = '{}'",
            schema.name
        ),
    );
    assert_eq!(tables, 0);
}

#[test]
fn an_unreachable_server_is_named_with_the_cause_and_exit_3() {
    if test_server("unreachable").is_none() {
        return;
    }
    let port = free_port();
    let url = format!("postgres://root@127.0.0.1:{port}/test");
    for args in [vec!["ls", "--db", &url], vec!["show", "--db", &url, "r"]] {
        let out = run_cli(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(3), "{args:?}: {err}");
        assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
        assert!(err.contains("cannot reach the server"), "{err}");
    }
    let data = tempfile::tempdir().unwrap();
    let out = run_ledger(&url, data.path(), "r", &["a"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert!(!data.path().join("ledger.log").exists(), "nothing ran");
}

#[test]
fn a_missing_database_and_a_wrong_password_are_named_with_exit_3() {
    let Some(server) = PrivateServer::start("wrong password") else {
        return;
    };
    let missing = server.url_with(PASSWORD, "no_such_db");
    let out = run_cli(&["ls", "--db", &missing]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("database \"no_such_db\" does not exist"),
        "{err}"
    );
    assert!(err.contains(&format!("127.0.0.1:{}", server.port)), "{err}");

    let wrong = server.url_with("not-the-password", "postgres");
    let out = run_cli(&["ls", "--db", &wrong]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("the server refused the password of user \"idem\""),
        "{err}"
    );
    assert!(
        !err.contains("not-the-password"),
        "the password is never shown: {err}"
    );

    // The right password opens (and creates) the store.
    let data = tempfile::tempdir().unwrap();
    let out = run_ledger(&server.url(), data.path(), "r", &["a", "b"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(count(&server.url(), "SELECT count(*) FROM steps"), 2);
}

/// Three `idem worker` processes on one private PostgreSQL server, 200 runs of a
/// three-step HTTP agent, seeded SIGKILLs of workers, every backend connection of the
/// workers killed once (`pg_terminate_backend`), and the server restarted once under
/// them: every run completes, every key reaches the HTTP server once except
/// retakes in doubt (each counted in its run), and the tokens a key arrives with only
/// grow, so no zombie's request came after its successor's.
#[test]
fn three_workers_on_postgres_complete_200_runs_through_kills_and_a_server_restart() {
    let Some(server) = PrivateServer::start("workers through a restart") else {
        return;
    };
    let service = crate::workers::Service::on_postgres(server.url());
    let (mut restarted, mut terminated) = (false, 0);
    let url = server.url();
    crate::workers::workers_through_kills_on(&service, 200, 20, 0x9_0000_0200, |kills| {
        if kills == 5 && terminated == 0 {
            terminated = count(
                &url,
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                 WHERE application_name = 'idem' AND pid <> pg_backend_pid()",
            );
        }
        if kills == 10 && !restarted {
            server.pg_ctl(&["restart"]);
            restarted = true;
        }
    });
    assert!(restarted, "the server was restarted during the test");
    assert!(
        terminated > 0,
        "backend connections were terminated during the test"
    );
    eprintln!("{terminated} backend connections terminated");
    assert_eq!(
        count(&url, "SELECT count(*) FROM runs WHERE status = 'completed'"),
        200
    );
    assert_eq!(
        count(&url, "SELECT count(*) FROM steps WHERE result IS NOT NULL"),
        600
    );
}

/// A worker started while its server is down says so once and waits for it (a command
/// exits 3 instead, above); once the server is up it starts and drives a run to the end.
#[test]
fn a_worker_started_while_the_server_is_down_waits_for_it() {
    let Some(server) = PrivateServer::start("worker waits for the server") else {
        return;
    };
    let url = server.url();
    let data = tempfile::tempdir().unwrap();
    let grant = format!("{}::/data", data.path().display());
    let deployed = run_cli(&[
        "deploy", LEDGER, "--db", &url, "--name", "ledger", "--dir", &grant,
    ]);
    assert!(deployed.status.success(), "{}", stderr(&deployed));
    server.pg_ctl(&["stop"]);

    let log = data.path().join("worker.log");
    let mut worker = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["worker", "--db", &url, "--poll", "50ms"])
        .env("IDEM_LOG", "warn")
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert!(worker.try_wait().unwrap().is_none(), "the worker gave up");
    let waiting = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        waiting.matches("cannot reach the server").count(),
        1,
        "said once, whatever the retries: {waiting}"
    );
    assert!(
        waiting.contains(&format!("127.0.0.1:{}", server.port)),
        "{waiting}"
    );
    assert!(!waiting.contains(PASSWORD), "{waiting}");

    server.pg_ctl(&["start"]);
    let submitted = run_cli(&[
        "submit",
        "ledger",
        "--db",
        &url,
        "--run-id",
        "after-wait",
        "--input",
        &ledger_input(&["a", "b"]),
    ]);
    assert!(submitted.status.success(), "{}", stderr(&submitted));
    let ledger = data.path().join("ledger.log");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::fs::read_to_string(&ledger).map_or(0, |l| l.lines().count()) < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the run never ran: {}",
            std::fs::read_to_string(&log).unwrap()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let term = Command::new("kill")
        .args(["-TERM", &worker.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let status = worker.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(0),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    assert_eq!(std::fs::read_to_string(&ledger).unwrap().lines().count(), 2);
}

/// A crash of the server may lose transactions it acknowledged with
/// `synchronous_commit = off` (a run lease under `--sync normal`, a claim whose step may
/// run again), while the idem process told of them lives on and holds their tokens.
/// After the crash, no such token is granted again: a run lease lost with the crash is
/// refused when its holder writes, and a claim lost with it is granted again under a
/// greater token. A claim made durable before its effect survives the crash.
#[test]
fn tokens_lost_in_a_server_crash_are_never_granted_again() {
    use idem::store::{
        Acquired, CatalogStore, ClaimOutcome, ClaimRequest, InstanceStore, OperatorStore,
        PostgresStore, RunFence, StoreError, Submission, SyncMode, WorkerStore,
    };
    use std::sync::Arc;
    use std::time::Duration;

    let Some(server) = PrivateServer::start("tokens after a server crash") else {
        return;
    };
    let url = server.url();
    // Unsynced writes stay in the server's memory until the crash (the WAL writer would
    // write them out within 200 ms by default).
    sql(&url, "ALTER SYSTEM SET wal_writer_delay = '10s'");
    sql(&url, "SELECT pg_reload_conf()");
    let lease = Duration::from_secs(600);
    let claim = |store: &PostgresStore, key: &str, fence: &RunFence, durable: bool| {
        let req = ClaimRequest {
            key,
            fence,
            holder: "h",
            fingerprint: None,
            lease,
            durable,
        };
        crate::util::block_on(store.claim(&req))
    };
    let granted = |outcome: Result<ClaimOutcome, StoreError>| match outcome {
        Ok(ClaimOutcome::Granted(grant)) => grant.token,
        other => panic!("not granted: {other:?}"),
    };
    let leased = |store: &PostgresStore, run_id: &str, sync: SyncMode| match crate::util::block_on(
        store.acquire_run(run_id, "w", lease),
    )
    .unwrap()
    {
        Acquired::Leased(run) => RunFence {
            run_id: run_id.into(),
            token: run.token,
            sync,
        },
        other => panic!("{run_id} not leased: {other:?}"),
    };
    let connect = |sync| crate::util::block_on(PostgresStore::connect(&url, sync)).unwrap();
    // Leases run `lost.run_id` again: above the token the crash lost, whose holder is
    // refused at its next write.
    let leased_above = |store: &PostgresStore, lost: &RunFence| {
        let again = leased(store, &lost.run_id, lost.sync);
        assert!(
            again.token > lost.token,
            "lease token {} granted again",
            lost.token
        );
        let refused = claim(store, "k-s", lost, true);
        assert!(
            matches!(refused, Err(StoreError::LeaseLost { .. })),
            "{refused:?}"
        );
        again
    };
    let crash = || {
        server.pg_ctl(&["-m", "immediate", "stop"]);
        server.pg_ctl(&["start"]);
    };
    let epoch = || sql(&url, "SELECT epoch FROM epoch")[0][0].clone();

    let (full, normal) = (connect(SyncMode::Full), connect(SyncMode::Normal));
    crate::util::block_on(async {
        full.put_component("ab12", b"\0asm").await.unwrap();
        for run_id in ["r", "s"] {
            full.submit(&Submission {
                run_id,
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
        }
    });
    // Synced, in this order, so that nothing synced comes after the unsynced writes.
    let r = leased(&full, "r", SyncMode::Full);
    let durable = granted(claim(&full, "k-durable", &r, true));
    let retried = granted(claim(&full, "k-retry", &r, false));
    let s = leased(&normal, "s", SyncMode::Normal);
    drop((full, normal));

    crash();
    let keys = sql(&url, "SELECT key FROM steps ORDER BY key");
    assert_eq!(
        keys,
        [[Some("k-durable".to_owned())]],
        "the crash kept the durable claim and lost the other"
    );

    let (full, normal) = (Arc::new(connect(SyncMode::Full)), connect(SyncMode::Normal));
    // The first grants after the crash are claims made at once, which go out together:
    // one of them moves the epoch on, and the lost claim's key, like every other, is
    // granted above the token it had.
    let tokens: Vec<u64> = crate::util::block_on(async {
        let mut claims = tokio::task::JoinSet::new();
        for i in 0..8 {
            let (store, fence) = (Arc::clone(&full), r.clone());
            claims.spawn(async move {
                let key = match i {
                    0 => "k-retry".to_owned(),
                    i => format!("k-{i}"),
                };
                let req = ClaimRequest {
                    key: &key,
                    fence: &fence,
                    holder: "h",
                    fingerprint: None,
                    lease,
                    durable: false,
                };
                store.claim(&req).await
            });
        }
        let mut tokens = Vec::new();
        while let Some(claimed) = claims.join_next().await {
            tokens.push(granted(claimed.unwrap()));
        }
        tokens
    });
    assert_eq!(tokens.len(), 8);
    assert!(
        tokens.iter().all(|&token| token > retried),
        "claim token {retried} granted again: {tokens:?}"
    );
    // The lost lease's holder is refused, not mistaken for the next holder.
    leased_above(&normal, &s);
    // The durable claim is still held; retaken after its holder died, it moves on too
    // (and, synced, makes everything before it durable).
    let taken = crate::util::block_on(full.take_over(
        &ClaimRequest {
            key: "k-durable",
            fence: &r,
            holder: "h2",
            fingerprint: None,
            lease,
            durable: true,
        },
        durable,
    ));
    assert!(granted(taken) > durable);
    assert_eq!(
        epoch().as_deref(),
        Some("1"),
        "the crash moved the epoch on once"
    );

    // A second crash, whose first grant after it is a run lease: the lease granted again
    // (unsynced) and lost with the crash is refused too.
    let s_lost = leased(&normal, "s", SyncMode::Normal);
    drop((full, normal));
    crash();
    leased_above(&connect(SyncMode::Normal), &s_lost);
    assert_eq!(epoch().as_deref(), Some("2"));
}
