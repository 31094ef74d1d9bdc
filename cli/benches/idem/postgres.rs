//! The `postgres` section: the floor under a durable step on a PostgreSQL server (a
//! `SELECT 1` round trip, a one-row write transaction with `synchronous_commit` on and
//! off), the durable step on the PostgreSQL store in both sync modes with its ratio to
//! that floor, throughput with 1, 8 and 64 concurrent runs, the same queue of runs
//! driven by one worker and by three, and how fast three workers competing on one queue
//! lease runs.
//!
//! The server is `IDEM_BENCH_POSTGRES` (a URL), else the one the tests use
//! (postgres://root@127.0.0.1:5432/test); everything lives in a schema of the bench's
//! own, dropped at the end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use idem::runtime::{Authority, Host};
use idem::store::{
    CatalogStore, OperatorStore, PostgresOptions, PostgresStore, RunFilter, RunStatus, Store,
    SyncMode, WorkerStore,
};
use serde_json::json;
use tokio_postgres::NoTls;

use super::report::{Table, median, micros, progress, sorted};
use super::service::{bench_worker, deploy, submit_all, unfinished};
use super::{Bed, BenchHost, CONCURRENCY, Plan, concurrent_runs, repeat};

const DEFAULT_URL: &str = "postgres://root@127.0.0.1:5432/test";

pub(crate) fn postgres(bed: &Bed, plan: &Plan, table: &mut Table) -> anyhow::Result<()> {
    let server = std::env::var("IDEM_BENCH_POSTGRES").unwrap_or_else(|_| DEFAULT_URL.into());
    let schema = format!("idem_bench_{}", std::process::id());
    let url = format!("{server}?options=-csearch_path%3D{schema}");
    let admin = bed.tokio.block_on(client(&server)).with_context(|| {
        format!("the postgres section needs a PostgreSQL server at {server} (IDEM_BENCH_POSTGRES)")
    })?;
    bed.tokio
        .block_on(admin.batch_execute(&format!("CREATE SCHEMA {schema}")))?;
    let result = measure(bed, plan, table, &url);
    bed.tokio
        .block_on(admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")))?;
    result
}

pub(crate) async fn client(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

fn measure(bed: &Bed, plan: &Plan, table: &mut Table, url: &str) -> anyhow::Result<()> {
    let turns = plan.postgres;
    let floor_n = (turns.n * 4) as usize;

    progress("  PostgreSQL floor");
    let db = bed.tokio.block_on(client(url))?;
    bed.tokio
        .block_on(db.batch_execute("CREATE TABLE floor (id int8 PRIMARY KEY, v bytea NOT NULL)"))?;
    let select = bed.tokio.block_on(db.prepare("SELECT 1"))?;
    let mut samples = Vec::with_capacity(floor_n);
    for _ in 0..floor_n {
        let t = Instant::now();
        bed.tokio.block_on(db.query_one(&select, &[]))?;
        samples.push(micros(t.elapsed()));
    }
    table.row("postgres: SELECT 1 round trip", "µs", samples);

    let insert = bed
        .tokio
        .block_on(db.prepare("INSERT INTO floor (id, v) VALUES ($1, $2)"))?;
    let mut floor = Vec::new();
    let mut id = 0i64;
    for (sync, setting) in [(SyncMode::Normal, "off"), (SyncMode::Full, "on")] {
        let begin = format!("BEGIN; SET LOCAL synchronous_commit TO {setting}");
        let mut samples = Vec::with_capacity(floor_n);
        for _ in 0..floor_n {
            id += 1;
            let t = Instant::now();
            bed.tokio.block_on(async {
                db.batch_execute(&begin).await?;
                db.execute(&insert, &[&id, &b"result".as_slice()]).await?;
                db.batch_execute("COMMIT").await
            })?;
            samples.push(micros(t.elapsed()));
        }
        let samples = sorted(samples);
        floor.push((sync, median(&samples)));
        table.row(
            format!("postgres: one-row write transaction, synchronous_commit {setting}"),
            "µs",
            samples,
        );
    }

    // The store's schema must hold nothing but the store.
    bed.tokio.block_on(db.batch_execute("DROP TABLE floor"))?;

    for (sync, floor_us) in floor {
        progress(&format!("  durable step on PostgreSQL, sync {sync}"));
        let host = host(bed, url, sync)?;
        bed.timed_run(&host, 10, true)?;
        let mut samples = Vec::new();
        repeat(turns, || {
            samples.extend(bed.timed_run(&host, turns.n, true)?);
            Ok(())
        })?;
        let samples = sorted(samples);
        let ratio = median(&samples) / floor_us;
        table.row_with_ratio(
            format!("postgres: durable step (claim + commit with checkpoint), sync {sync}"),
            "µs",
            samples,
            format!("{ratio:.1}× one-row txn"),
        );
    }

    for sync in [SyncMode::Normal, SyncMode::Full] {
        progress(&format!("  throughput on PostgreSQL, sync {sync}"));
        let host = host(bed, url, sync)?;
        let n = turns.n / 2;
        let mut rates = vec![Vec::new(); CONCURRENCY.len()];
        repeat(turns, || {
            for (runs, rate) in CONCURRENCY.iter().zip(&mut rates) {
                rate.push(concurrent_runs(bed, &host, *runs, n)?.rate);
            }
            Ok(())
        })?;
        let one = median(&sorted(rates[0].clone()));
        for (runs, rate) in CONCURRENCY.into_iter().zip(rates) {
            let ratio = median(&sorted(rate.clone())) / one;
            let ratio = (runs > 1).then(|| format!("{ratio:.1}× 1 run"));
            table.rate_row(
                format!("postgres: throughput, {runs} concurrent runs × {n} steps, sync {sync}"),
                rate,
                ratio,
            );
        }
    }

    progress("  queued runs through 1 and 3 workers");
    let (runs, steps) = (turns.n as usize * 2, 25);
    let mut one = None;
    for workers in [1, 3] {
        let rate = bed
            .tokio
            .block_on(workers_rate(bed, url, workers, runs, steps))?;
        let ratio = one.map(|one: f64| format!("{:.2}× 1 worker", rate / one));
        one.get_or_insert(rate);
        table.rate_row(
            format!(
                "postgres: {runs} queued runs × {steps} steps through {workers} worker(s) \
                 (64 runs each at once, pool {}), sync full",
                worker_pool(workers)
            ),
            vec![rate],
            ratio,
        );
    }

    progress("  runs leased per second by 3 workers");
    let queued = floor_n * 2;
    let rate = bed.tokio.block_on(lease_rate(bed, url, queued))?;
    table.row(
        format!("postgres: runs leased per second, 3 workers competing, {queued} queued runs"),
        "runs/s",
        vec![rate],
    );
    Ok(())
}

/// A host on a PostgreSQL store whose runs ask for `sync`; its pool fits 64 runs.
pub(crate) fn host(bed: &Bed, url: &str, sync: SyncMode) -> anyhow::Result<BenchHost> {
    let options = PostgresOptions {
        pool_size: 64,
        ..PostgresOptions::default()
    };
    let store = bed
        .tokio
        .block_on(PostgresStore::connect_with(url, &options))?;
    let _inside = bed.tokio.enter();
    Ok(BenchHost {
        host: Arc::new(Host::new(Arc::clone(&bed.runtime), Arc::new(store))?),
        sync,
        sqlite: None,
    })
}

/// Submits `queued` runs, then three handles (as three worker processes) lease them in
/// batches of 16 until the queue is empty: runs leased per second, all together.
async fn lease_rate(bed: &Bed, url: &str, queued: usize) -> anyhow::Result<f64> {
    let store = PostgresStore::connect(url, SyncMode::Normal).await?;
    let agent = &bed.agent;
    store.put_component(agent.digest(), agent.bytes()?).await?;
    for i in 0..queued {
        store
            .submit(&idem::store::Submission {
                run_id: &format!("lease-{i}"),
                agent: "bench",
                digest: agent.digest(),
                namespace: "bench",
                input: b"{}",
                authority: b"",
                replace_authority: false,
                priority: 0,
            })
            .await?;
    }
    let mut workers = Vec::new();
    for _ in 0..3 {
        workers.push(Arc::new(
            PostgresStore::connect(url, SyncMode::Normal).await?,
        ));
    }
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for (w, worker) in workers.into_iter().enumerate() {
        tasks.spawn(async move {
            let mut leased = 0usize;
            loop {
                let got = worker
                    .acquire_runs(&format!("w{w}"), 16, Duration::from_secs(600), &[])
                    .await?;
                if got.is_empty() {
                    return Ok::<_, anyhow::Error>(leased);
                }
                leased += got.len();
            }
        });
    }
    let mut total = 0;
    while let Some(done) = tasks.join_next().await {
        total += done??;
    }
    let elapsed = started.elapsed();
    ensure!(
        total == queued,
        "{total} runs leased of {queued}: each run leased exactly once"
    );
    Ok(total as f64 / elapsed.as_secs_f64())
}

/// Each worker's pool: 64 alone; together, what keeps the workers' connections within
/// the server's default `max_connections` (100) beside the bench's own, as README asks
/// of workers sharing a server. (With 64 each, three workers' connections were refused
/// and the workers spent the row backing off: 47 steps/s.)
fn worker_pool(workers: usize) -> usize {
    match workers {
        1 => 64,
        n => 84 / n,
    }
}

/// Deploys the bench agent as `bench-{workers}w` (sync full), queues `runs` runs of
/// `steps` steps under it, then starts `workers` workers, each with its own store handle
/// and host as a worker process has, each driving 64 runs at once: steps per second from
/// the workers' start until every run finished. Loading the agent is included (once per
/// worker; the bench's cache makes it a few ms).
async fn workers_rate(
    bed: &Bed,
    url: &str,
    workers: usize,
    runs: usize,
    steps: u64,
) -> anyhow::Result<f64> {
    let name = format!("bench-{workers}w");
    let store = PostgresStore::connect(url, SyncMode::Full).await?;
    let agent = &bed.agent;
    let authority = Authority {
        sync: SyncMode::Full,
        ..Authority::default()
    };
    let authority = deploy(&store, agent, &name, &authority).await?;
    let input = json!({ "mode": "steps", "n": steps });
    submit_all(
        &store,
        agent,
        &name,
        &authority,
        (0..runs).map(|i| (format!("{name}-{i}"), input.clone())),
    )
    .await?;
    let options = PostgresOptions {
        pool_size: worker_pool(workers),
        ..PostgresOptions::default()
    };
    // Connected before the clock starts: a worker process opens its store once.
    let mut ready = Vec::with_capacity(workers);
    for _ in 0..workers {
        let store: Arc<dyn Store> = Arc::new(PostgresStore::connect_with(url, &options).await?);
        ready.push(bench_worker(Arc::new(Host::new(
            Arc::clone(&bed.runtime),
            store,
        )?)));
    }
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    let mut driving = tokio::task::JoinSet::new();
    for worker in ready {
        let mut stopped = stopped.clone();
        driving.spawn(worker.run(async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        }));
    }
    // Every earlier row's runs have finished, so what is unfinished is this row's.
    while unfinished(&store).await? > 0 {
        ensure!(
            started.elapsed() < Duration::from_secs(600),
            "runs through {workers} worker(s) stuck"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let elapsed = started.elapsed();
    let _ = stop.send(true);
    while let Some(done) = driving.join_next().await {
        done??;
    }
    let filter = RunFilter {
        agent: Some(&name),
        ..RunFilter::default()
    };
    let completed = store
        .runs(&filter)
        .await?
        .iter()
        .filter(|r| r.status == RunStatus::Completed)
        .count();
    ensure!(completed == runs, "{completed} of {runs} runs completed");
    Ok((runs as u64 * steps) as f64 / elapsed.as_secs_f64())
}
