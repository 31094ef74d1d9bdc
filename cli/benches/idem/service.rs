//! The service rows: a worker holding many runs that wait on HTTP (threads, memory per
//! waiting run, wall time against the wait), short runs a worker drives per second, and
//! the time from a worker's death to its runs resumed by another.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use idem::runtime::{Authority, Host, HttpPolicy, Limits, LoadedAgent, Runtime};
use idem::store::{
    Admission, Deployment, OpenOptions as StoreOptions, PostgresStore, RunFilter, RunStatus,
    SqliteStore, Store, Submission, SyncMode,
};
use idem::worker::{Worker, WorkerOptions};
use idem_test_artifacts::FETCHER;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::report::{Table, median, millis, progress, sorted};
use super::{Bed, Plan};

/// How many runs and how long they wait, per plan.
pub(crate) struct ServicePlan {
    /// Runs held at once by one worker, each waiting on the server.
    pub(crate) waiting: usize,
    /// How long the server takes to answer each.
    pub(crate) wait: Duration,
    /// Short runs a worker drives, for runs per second.
    pub(crate) short_runs: usize,
    /// Turns of waiting runs, each with new runs on the same store and worker.
    pub(crate) waiting_turns: usize,
    /// Runs held at once for the second, larger figure (one turn; 0: none).
    pub(crate) waiting_many: usize,
    /// Turns of short runs, each with new runs on the same store and worker.
    pub(crate) short_turns: usize,
    /// Runs a worker holds when it is killed.
    pub(crate) takeover_runs: usize,
}

pub(crate) fn service(bed: &Bed, plan: &Plan, table: &mut Table) -> anyhow::Result<()> {
    let plan = &plan.service;
    waiting_runs(bed, plan, table)?;
    bulk_submit(bed, plan, table)?;
    takeover(bed, plan, table)?;
    Ok(())
}

/// Submitting `short_runs` runs from outside, as an operator's script would: one
/// `idem submit --batch` process for all of them, against one `idem submit` process per
/// run (sampled on a tenth of them), on SQLite and, where a server answers, PostgreSQL.
/// Each process opens the store itself; the agent is deployed by `idem deploy`.
fn bulk_submit(bed: &Bed, plan: &ServicePlan, table: &mut Table) -> anyhow::Result<()> {
    let sqlite = bed.dir.join("bulk.db");
    bulk_submit_into(bed, plan, table, "SQLite", &sqlite.display().to_string())?;
    in_postgres_schema(bed, "bulk", "bulk submission", |url| {
        bulk_submit_into(bed, plan, table, "PostgreSQL", url)
    })
}

/// Runs `measure` with the URL of a schema of its own on the bench's PostgreSQL server
/// (`IDEM_BENCH_POSTGRES`, else the tests' server), dropped afterwards; where no server
/// answers, says that `what` is skipped and returns.
fn in_postgres_schema(
    bed: &Bed,
    prefix: &str,
    what: &str,
    measure: impl FnOnce(&str) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let server = std::env::var("IDEM_BENCH_POSTGRES")
        .unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/test".into());
    let schema = format!("bench_{prefix}_{}", std::process::id());
    let created = bed.tokio.block_on(async {
        let (client, connection) = tokio_postgres::connect(&server, tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        client
            .batch_execute(&format!("CREATE SCHEMA {schema}"))
            .await?;
        anyhow::Ok(client)
    });
    let Ok(admin) = created else {
        progress(&format!(
            "  SKIPPED: {what} on PostgreSQL (no server at {server})"
        ));
        return Ok(());
    };
    let measured = measure(&format!("{server}?options=-csearch_path%3D{schema}"));
    bed.tokio
        .block_on(admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")))?;
    measured
}

fn bulk_submit_into(
    bed: &Bed,
    plan: &ServicePlan,
    table: &mut Table,
    name: &str,
    db: &str,
) -> anyhow::Result<()> {
    let n = plan.short_runs;
    progress(&format!(
        "  {n} runs submitted by `idem submit --batch`, {name}"
    ));
    let idem = |args: &[&str]| -> anyhow::Result<f64> {
        let began = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(args)
            .arg("--db")
            .arg(db)
            .output()?;
        ensure!(
            out.status.success(),
            "idem {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(began.elapsed().as_secs_f64())
    };
    idem(&["deploy", idem_test_artifacts::BENCH, "--name", "bench"])?;
    let (mut batched, mut alone) = (Vec::new(), Vec::new());
    for turn in 0..3 {
        let lines: String = (0..n)
            .map(|i| {
                let line = json!({ "input": { "mode": "steps", "n": 1 },
                                   "run_id": format!("bulk-{turn}-{i}") });
                format!("{line}\n")
            })
            .collect();
        let file = bed.dir.join(format!("bulk-{name}-{turn}.jsonl"));
        std::fs::write(&file, lines)?;
        let wall = idem(&[
            "submit",
            "bench",
            "--batch",
            &format!("@{}", file.display()),
        ])?;
        batched.push(n as f64 / wall);
        progress(&format!(
            "    turn {}: {:.0} runs/s",
            turn + 1,
            n as f64 / wall
        ));
        let sample = (n / 10).max(1);
        let mut wall = 0.0;
        for i in 0..sample {
            let input = json!({ "mode": "steps", "n": 1, "i": i, "turn": turn }).to_string();
            wall += idem(&["submit", "bench", "--input", &input])?;
        }
        alone.push(sample as f64 / wall);
    }
    let batched_median = super::report::median(&super::report::sorted(batched.clone()));
    let alone_median = super::report::median(&super::report::sorted(alone.clone()));
    table.row_with_ratio(
        format!(
            "submit: {n} runs by one `idem submit --batch` process (process start included), \
             {name}"
        ),
        "runs/s",
        batched,
        format!(
            "{:.0}× one `idem submit` process per run ({alone_median:.0} runs/s)",
            batched_median / alone_median
        ),
    );
    Ok(())
}

/// A loopback HTTP server that answers every request after `wait`, one task per
/// connection: a thousand waits cost it nothing but sockets.
///
/// It stands for a service elsewhere, so it runs on a thread and runtime of its own: on
/// the worker's runtime its accepts waited behind the worker's own work, and a listen
/// queue of 128 (tokio's default) overflowed when a thousand runs connected at once,
/// each dropped connection then retried a second later by the kernel — the server's
/// cost, not the worker's.
async fn slow_server(wait: Duration) -> anyhow::Result<u16> {
    let (port_tx, port_rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("bench-http-server".into())
        .spawn(move || {
            let serving = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(anyhow::Error::from)
                .and_then(|runtime| {
                    runtime.block_on(serve_slowly(wait, |port| {
                        let _ = port_tx.send(port);
                    }))
                });
            if let Err(e) = serving {
                eprintln!("the bench's HTTP server stopped: {e:#}");
            }
        })?;
    port_rx
        .await
        .context("the bench's HTTP server did not start")
}

/// Listens on loopback, tells `bound` its port, then answers every request after
/// `wait`, until the process ends.
async fn serve_slowly(wait: Duration, bound: impl FnOnce(u16)) -> anyhow::Result<()> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind("127.0.0.1:0".parse()?)?;
    // As a server meant for thousands of clients sets it (nginx, PostgreSQL: hundreds
    // to thousands); the kernel caps it at `net.core.somaxconn`.
    let listener = socket.listen(4096)?;
    bound(listener.local_addr()?.port());
    while let Ok((mut stream, _)) = listener.accept().await {
        tokio::spawn(async move {
            // The request: headers, then a body of its content-length (the SDK's
            // POST sends one).
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let Ok(n) = stream.read(&mut buf).await else {
                    return;
                };
                if n == 0 {
                    return;
                }
                seen.extend_from_slice(&buf[..n]);
                if let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&seen[..end]).to_ascii_lowercase();
                    let length = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse::<usize>().ok())
                        .unwrap_or(0);
                    if seen.len() >= end + 4 + length {
                        break;
                    }
                }
            }
            tokio::time::sleep(wait).await;
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
                .await;
        });
    }
    Ok(())
}

/// A store with `agent` deployed as `name`, granted HTTP to `127.0.0.1:port`.
async fn deployed(
    db: &Path,
    agent: &LoadedAgent,
    name: &str,
    port: Option<u16>,
    lease: Duration,
) -> anyhow::Result<(Arc<dyn Store>, Vec<u8>)> {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_with(db, &StoreOptions::default())?);
    let authority = Authority {
        http: HttpPolicy {
            allow: port
                .map(|p| format!("127.0.0.1:{p}").parse())
                .transpose()?
                .into_iter()
                .collect(),
            outside_claims: false,
        },
        limits: Limits {
            lease,
            ..Limits::default()
        },
        ..Authority::default()
    };
    let authority = deploy(store.as_ref(), agent, name, &authority).await?;
    Ok((store, authority))
}

/// Puts `agent` in `store` and deploys it as `name` with `authority`: the authority as
/// encoded, for submissions.
pub(crate) async fn deploy(
    store: &dyn Store,
    agent: &LoadedAgent,
    name: &str,
    authority: &Authority,
) -> anyhow::Result<Vec<u8>> {
    let authority = authority.encode();
    store.put_component(agent.digest(), agent.bytes()?).await?;
    store
        .deploy(&Deployment {
            name,
            digest: agent.digest(),
            authority: &authority,
            admission: Admission::Explicit,
            source: None,
        })
        .await?;
    Ok(authority)
}

/// A worker as the bench's rows run it: 64 runs at once, looking for more every 5 ms.
pub(crate) fn bench_worker(host: Arc<Host>) -> Arc<Worker> {
    Arc::new(Worker::new(
        host,
        WorkerOptions {
            concurrency: 64,
            poll: Duration::from_millis(5),
            ..WorkerOptions::default()
        },
    ))
}

/// Submits the runs in one `submit_many`, as `idem submit --batch` does; every one must
/// be accepted.
pub(crate) async fn submit_many(
    store: &dyn Store,
    agent: &LoadedAgent,
    name: &str,
    authority: &[u8],
    inputs: impl IntoIterator<Item = (String, serde_json::Value)>,
) -> anyhow::Result<()> {
    let runs = inputs
        .into_iter()
        .map(|(run_id, input)| Ok((run_id, serde_json::to_vec(&input)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let submissions: Vec<Submission<'_>> = runs
        .iter()
        .map(|(run_id, input)| Submission {
            run_id,
            agent: name,
            digest: agent.digest(),
            namespace: name,
            input,
            authority,
            replace_authority: false,
            priority: 0,
        })
        .collect();
    for answer in store.submit_many(&submissions).await? {
        answer?;
    }
    Ok(())
}

pub(crate) async fn submit_all(
    store: &dyn Store,
    agent: &LoadedAgent,
    name: &str,
    authority: &[u8],
    inputs: impl Iterator<Item = (String, serde_json::Value)>,
) -> anyhow::Result<usize> {
    let mut n = 0;
    for (run_id, input) in inputs {
        store
            .submit(&Submission {
                run_id: &run_id,
                agent: name,
                digest: agent.digest(),
                namespace: name,
                input: &serde_json::to_vec(&input)?,
                authority,
                replace_authority: false,
                priority: 0,
            })
            .await?;
        n += 1;
    }
    Ok(n)
}

/// Whether any run is still queued or running (1) or none is (0): the bench
/// polls this every few milliseconds while the worker it measures shares the store, so
/// it must not read every run's record (1,000 records decoded every 5 ms took a core's
/// worth of the short-runs row's time).
pub(crate) async fn unfinished(store: &dyn Store) -> anyhow::Result<usize> {
    for status in [RunStatus::Queued, RunStatus::Running] {
        let some = store
            .runs(&RunFilter {
                status: Some(status),
                limit: Some(1),
                ..Default::default()
            })
            .await?
            .len();
        if some > 0 {
            return Ok(some);
        }
    }
    Ok(0)
}

/// This process's threads and resident memory, from `/proc/self/status`.
fn threads_and_rss() -> anyhow::Result<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let field = |name: &str| -> anyhow::Result<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("{name} in /proc/self/status"))
    };
    Ok((field("Threads:")?, field("VmRSS:")? * 1024))
}

/// The waiting runs' rows: `plan.waiting` runs in turns on the bench's runtime, then
/// (issue 37's second figure) `plan.waiting_many` in one turn on a runtime whose pool
/// is sized for them as `idem worker --concurrency N` sizes its own: up to
/// `idem::runtime::MAX_INSTANCES` at once, the runs beyond waiting for a slot.
fn waiting_runs(bed: &Bed, plan: &ServicePlan, table: &mut Table) -> anyhow::Result<()> {
    waiting_row(
        bed,
        &bed.runtime,
        plan.waiting,
        plan.waiting_turns,
        plan.wait,
        table,
    )?;
    if plan.waiting_many > 0 {
        let runtime = Runtime::with_instances(None, plan.waiting_many)?;
        waiting_row(
            bed,
            &Arc::new(runtime),
            plan.waiting_many,
            1,
            plan.wait,
            table,
        )?;
    }
    Ok(())
}

/// `n` runs each waiting `wait` on a loopback server, submitted at once to one warm
/// worker of concurrency `n`, `turns` times on one store and worker: the wall time from
/// the submission to the last run's end, the process's threads, and its resident memory
/// per waiting run (in the first turn: later turns reuse its memory).
fn waiting_row(
    bed: &Bed,
    runtime: &Arc<Runtime>,
    n: usize,
    turns: usize,
    wait: Duration,
    table: &mut Table,
) -> anyhow::Result<()> {
    progress(&format!(
        "  {n} runs waiting {} ms each on loopback HTTP, {turns} turns",
        wait.as_millis(),
    ));
    let fetcher = Arc::new(runtime.load(Path::new(FETCHER))?);
    let db = bed.dir.join(format!("waiting-{n}.db"));
    let (walls, peak_threads, idle_threads, per_run) = bed.tokio.block_on(async {
        let port = slow_server(wait).await?;
        let (store, authority) = deployed(
            &db,
            &fetcher,
            "fetcher",
            Some(port),
            Duration::from_secs(30),
        )
        .await?;
        let url = format!("http://127.0.0.1:{port}");
        let host = Arc::new(Host::new(Arc::clone(runtime), Arc::clone(&store))?);
        let worker = Arc::new(Worker::new(
            host,
            WorkerOptions {
                concurrency: n,
                poll: Duration::from_millis(20),
                ..WorkerOptions::default()
            },
        ));
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let working = tokio::spawn(Arc::clone(&worker).run(async move {
            let _ = done_rx.await;
        }));
        // A first run compiles the agent: the row measures waiting runs, not a compile
        // (issue 37: the runs at the wait's own time).
        let input = |i: &str| (format!("wait-{i}"), json!({ "steps": 1, "url": url }));
        submit_many(
            store.as_ref(),
            &fetcher,
            "fetcher",
            &authority,
            [input("warm")],
        )
        .await?;
        wait_until(Duration::from_secs(60), || async {
            Ok(unfinished(store.as_ref()).await? == 0)
        })
        .await
        .context("the warm-up run did not finish")?;
        let (idle_threads, idle_rss) = threads_and_rss()?;
        let (mut peak_threads, mut peak_rss) = (idle_threads, idle_rss);
        let mut walls = Vec::new();
        let mut per_run = None;
        for turn in 0..turns {
            let started = Instant::now();
            submit_many(
                store.as_ref(),
                &fetcher,
                "fetcher",
                &authority,
                (0..n).map(|i| input(&format!("{turn}-{i}"))),
            )
            .await?;
            // Sampled while the runs wait: the worker's threads and memory at their
            // peak. Looked at every 10 ms, a fraction of a percent of the wait.
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                let (threads, rss) = threads_and_rss()?;
                peak_threads = peak_threads.max(threads);
                peak_rss = peak_rss.max(rss);
                if unfinished(store.as_ref()).await? == 0 {
                    walls.push(millis(started.elapsed()));
                    break;
                }
                ensure!(
                    started.elapsed() < wait * 20 + Duration::from_secs(60),
                    "the waiting runs did not finish"
                );
            }
            per_run.get_or_insert(peak_rss.saturating_sub(idle_rss) as f64 / n as f64);
        }
        let _ = done_tx.send(());
        working.await??;
        Ok::<_, anyhow::Error>((
            walls,
            peak_threads,
            idle_threads,
            per_run.unwrap_or_default(),
        ))
    })?;
    table.row_with_ratio(
        format!(
            "worker: {n} runs each waiting {} ms on HTTP, submitted at once (one \
             `submit_many`) to a warm worker → all done",
            wait.as_millis()
        ),
        "ms",
        walls.clone(),
        format!(
            "{:.2}× the wait",
            median(&sorted(walls.clone())) / 1000.0 / wait.as_secs_f64()
        ),
    );
    table.row(
        format!("worker: threads of the process while {n} runs wait (idle before: {idle_threads})"),
        "threads",
        vec![peak_threads as f64],
    );
    table.row(
        format!("worker: resident memory per waiting run ({n} runs, peak − idle, first turn)"),
        "KiB",
        vec![per_run / 1024.0],
    );
    Ok(())
}

/// Short runs through one worker, as issue 37 measures them: `short_runs` one-step runs
/// submitted at once (one `submit_many`) to a worker already running and warm (its
/// agent compiled by a first run), timed from the submission to the last run's end.
/// Several turns on one store, each with new runs; on SQLite and, where a server
/// answers, PostgreSQL.
pub(crate) fn short_runs(bed: &Bed, plan: &Plan, table: &mut Table) -> anyhow::Result<()> {
    let plan = &plan.service;
    let sqlite = bed.dir.join("short.db");
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open_with(&sqlite, &StoreOptions::default())?);
    short_runs_on(bed, plan, table, "SQLite", store)?;
    in_postgres_schema(bed, "short", "short runs", |url| {
        let store = bed
            .tokio
            .block_on(PostgresStore::connect(url, SyncMode::Normal))?;
        short_runs_on(bed, plan, table, "PostgreSQL", Arc::new(store))
    })
}

fn short_runs_on(
    bed: &Bed,
    plan: &ServicePlan,
    table: &mut Table,
    name: &str,
    store: Arc<dyn Store>,
) -> anyhow::Result<()> {
    let n = plan.short_runs;
    progress(&format!("  {n} short runs through one worker, {name}"));
    let agent = Arc::clone(&bed.agent);
    let rates = bed.tokio.block_on(async {
        let authority = deploy(store.as_ref(), &agent, "bench", &Authority::default()).await?;
        let submit = |ids: Vec<String>| {
            let (store, agent, authority) =
                (Arc::clone(&store), Arc::clone(&agent), authority.clone());
            async move {
                let input = json!({ "mode": "steps", "n": 1 });
                let runs = ids.into_iter().map(|id| (id, input.clone()));
                submit_many(store.as_ref(), &agent, "bench", &authority, runs).await
            }
        };
        let all_done = |limit: Duration| {
            let store = Arc::clone(&store);
            async move {
                let started = Instant::now();
                while unfinished(store.as_ref()).await? > 0 {
                    ensure!(started.elapsed() < limit, "short runs stuck");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                anyhow::Ok(())
            }
        };
        let host = Arc::new(Host::new(Arc::clone(&bed.runtime), Arc::clone(&store))?);
        let worker = bench_worker(host);
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let working = tokio::spawn(Arc::clone(&worker).run(async move {
            let _ = done_rx.await;
        }));
        // The worker compiles the agent for its first run: not part of the rate.
        submit(vec!["short-warm".into()]).await?;
        all_done(Duration::from_secs(120)).await?;
        let mut rates = Vec::new();
        for turn in 0..plan.short_turns {
            let ids = (0..n).map(|i| format!("short-{turn}-{i}")).collect();
            let started = Instant::now();
            submit(ids).await?;
            all_done(Duration::from_secs(600)).await?;
            let rate = n as f64 / started.elapsed().as_secs_f64();
            progress(&format!("    turn {}: {rate:.0} runs/s", turn + 1));
            rates.push(rate);
        }
        let _ = done_tx.send(());
        working.await??;
        let completed = store
            .runs(&RunFilter {
                status: Some(RunStatus::Completed),
                ..Default::default()
            })
            .await?
            .len();
        let all = n * plan.short_turns + 1;
        ensure!(
            completed == all,
            "{completed} of {all} short runs completed"
        );
        Ok::<_, anyhow::Error>(rates)
    })?;
    table.rate_row_in(
        format!(
            "worker: short runs (1 durable step each, sync normal) driven per second, {name}: \
             {n} runs submitted at once (submission included) to one warm worker, concurrency 64"
        ),
        "runs/s",
        rates,
        None,
    );
    Ok(())
}

fn takeover(bed: &Bed, plan: &ServicePlan, table: &mut Table) -> anyhow::Result<()> {
    let n = plan.takeover_runs;
    let lease = Duration::from_secs(1);
    progress(&format!(
        "  a worker holding {n} runs killed; another takes them over"
    ));
    let fetcher = Arc::new(bed.runtime.load(Path::new(FETCHER))?);
    let db = bed.dir.join("takeover.db");
    let samples = bed.tokio.block_on(async {
        // The runs wait on HTTP far longer than the test: whoever holds them holds them.
        let port = slow_server(Duration::from_secs(3600)).await?;
        let (store, authority) = deployed(&db, &fetcher, "fetcher", Some(port), lease).await?;
        let url = format!("http://127.0.0.1:{port}");
        submit_all(
            store.as_ref(),
            &fetcher,
            "fetcher",
            &authority,
            (0..n).map(|i| (format!("take-{i}"), json!({ "steps": 1, "url": url }))),
        )
        .await?;
        let mut doomed = spawn_worker(&db, "doomed", lease)?;
        // Every run held (and so renewed) by the doomed worker.
        wait_until(Duration::from_secs(60), || async {
            let runs = store.runs(&RunFilter::default()).await?;
            Ok(runs.iter().all(|r| {
                r.lease
                    .as_ref()
                    .is_some_and(|l| l.worker.starts_with("doomed"))
            }))
        })
        .await?;
        tokio::time::sleep(lease).await;
        doomed.kill()?;
        let killed = Instant::now();
        doomed.wait()?;
        let mut heir = spawn_worker(&db, "heir", lease)?;
        let mut resumed: Vec<f64> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        while seen.len() < n {
            ensure!(
                killed.elapsed() < Duration::from_secs(120),
                "runs never taken over"
            );
            for run in store.runs(&RunFilter::default()).await? {
                let taken = run
                    .lease
                    .as_ref()
                    .is_some_and(|l| l.worker.starts_with("heir"));
                if taken && seen.insert(run.run_id.clone()) {
                    resumed.push(millis(killed.elapsed()));
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        heir.kill()?;
        heir.wait()?;
        Ok::<_, anyhow::Error>(resumed)
    })?;
    table.row(
        format!(
            "worker killed → each of its {n} runs leased by another worker ({} ms lease)",
            lease.as_millis()
        ),
        "ms",
        samples,
    );
    Ok(())
}

fn spawn_worker(db: &Path, name: &str, lease: Duration) -> anyhow::Result<Child> {
    let child = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["worker", "--name", name, "--poll", "10ms"])
        .arg("--db")
        .arg(db)
        .args(["--lease", &format!("{}ms", lease.as_millis()), "--no-cache"])
        .env("IDEM_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    Ok(child)
}

async fn wait_until<F, Fut>(limit: Duration, mut done: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    let started = Instant::now();
    while !done().await? {
        if started.elapsed() > limit {
            bail!("gave up waiting after {} s", limit.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}
