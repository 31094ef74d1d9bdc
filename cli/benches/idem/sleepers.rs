//! The sleepers rows: a worker holding thousands of runs suspended in durable sleeps —
//! its resident memory against an idle worker's, the instances it holds (none), and how
//! long after a run's due time the worker takes it up again.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use idem::runtime::{Authority, DirGrant, Host, LoadedAgent};
use idem::store::{
    Admission, Clock, Deployment, OpenOptions as StoreOptions, RunFilter, RunStatus, SqliteStore,
    Store, Submission,
};
use idem::worker::{Worker, WorkerOptions};
use idem_test_artifacts::WAITER;
use serde_json::json;

use super::report::{Table, millis, progress};
use super::{Bed, Plan};

/// How many runs sleep, and how many wake-ups are timed.
pub(crate) struct SleepersPlan {
    pub(crate) sleepers: usize,
    pub(crate) samples: usize,
}

/// Deploys the waiter as `waiter` with `data` granted as `/data`; returns the
/// authority its runs are submitted with.
async fn deploy_waiter(
    store: &dyn Store,
    waiter: &LoadedAgent,
    data: &Path,
) -> anyhow::Result<Vec<u8>> {
    let authority = Authority {
        dirs: vec![DirGrant {
            host: data.to_path_buf(),
            guest: "/data".into(),
        }],
        ..Authority::default()
    }
    .encode();
    store
        .put_component(waiter.digest(), waiter.bytes()?)
        .await?;
    store
        .deploy(&Deployment {
            name: "waiter",
            digest: waiter.digest(),
            authority: &authority,
            admission: Admission::Explicit,
            source: None,
        })
        .await?;
    Ok(authority)
}

/// Queues a run of the waiter deployed by [`deploy_waiter`].
async fn submit_waiter(
    store: &dyn Store,
    waiter: &LoadedAgent,
    authority: &[u8],
    run_id: &str,
    input: &serde_json::Value,
) -> anyhow::Result<()> {
    store
        .submit(&Submission {
            run_id,
            agent: "waiter",
            digest: waiter.digest(),
            namespace: "waiter",
            input: &serde_json::to_vec(input)?,
            authority,
            replace_authority: false,
            priority: 0,
        })
        .await?;
    Ok(())
}

/// Resident memory of this process, in bytes.
fn rss() -> anyhow::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    Ok(kib * 1024)
}

async fn peak_rss_over(d: Duration) -> anyhow::Result<u64> {
    let until = Instant::now() + d;
    let mut peak = 0;
    while Instant::now() < until {
        peak = peak.max(rss()?);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(peak)
}

pub(crate) fn sleepers(bed: &Bed, plan: &Plan, table: &mut Table) -> anyhow::Result<()> {
    let plan = &plan.sleepers;
    let n = plan.sleepers;
    progress(&format!("  {n} runs sleeping on one worker"));
    let waiter = Arc::new(bed.runtime.load(Path::new(WAITER))?);
    let data = bed.dir.join("sleepers-data");
    std::fs::create_dir_all(&data)?;
    let db = bed.dir.join("sleepers.db");
    let poll = WorkerOptions::default().poll;
    let (idle, holding, live, latencies) = bed.tokio.block_on(async {
        // The store's clock is the bench's: it moves a run's due time into the past at
        // a known instant, and the wake-up is timed from there, in real time.
        let t0 = Clock::system().now();
        let clock = Clock::manual(t0);
        let options = StoreOptions {
            clock: clock.clone(),
            ..StoreOptions::default()
        };
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open_with(&db, &options)?);
        let authority = deploy_waiter(store.as_ref(), &waiter, &data).await?;
        let host = Arc::new(Host::new(Arc::clone(&bed.runtime), Arc::clone(&store))?);
        // The default poll: what a user's worker does.
        let worker = Arc::new(Worker::new(
            Arc::clone(&host),
            WorkerOptions {
                concurrency: 512,
                ..WorkerOptions::default()
            },
        ));
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let working = tokio::spawn(Arc::clone(&worker).run(async move {
            let _ = done_rx.await;
        }));
        let idle = peak_rss_over(Duration::from_secs(1)).await?;
        // Run i sleeps until t0 + (i + 1) s: its due order is its number.
        for i in 0..n {
            let input = json!({"log": "/data/sleepers.log",
                               "waits": [{"until_ms": t0 + 1000 * (i as i64 + 1)}]});
            submit_waiter(
                store.as_ref(),
                &waiter,
                &authority,
                &format!("sleeper-{i:05}"),
                &input,
            )
            .await?;
        }
        let started = Instant::now();
        loop {
            let runs = store.runs(&RunFilter::default()).await?;
            let asleep = runs
                .iter()
                .filter(|r| r.lease.is_none() && r.wake_at.is_some())
                .count();
            if asleep == n {
                break;
            }
            ensure!(
                started.elapsed() < Duration::from_secs(1800),
                "only {asleep} of {n} runs fell asleep"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let live = host.live_instances();
        let holding = peak_rss_over(Duration::from_secs(2)).await?;
        let mut latencies = Vec::with_capacity(plan.samples);
        for k in 0..plan.samples {
            let run_id = format!("sleeper-{k:05}");
            clock.set(t0 + 1000 * (k as i64 + 1));
            let due = Instant::now();
            loop {
                let record = store
                    .run(&run_id)
                    .await?
                    .with_context(|| format!("{run_id} disappeared from the store"))?;
                if record.lease.is_some() || record.status == RunStatus::Completed {
                    latencies.push(millis(due.elapsed()));
                    break;
                }
                ensure!(
                    due.elapsed() < Duration::from_secs(60),
                    "{run_id} never woke"
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            while store.run(&run_id).await?.map(|r| r.status) != Some(RunStatus::Completed) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let _ = done_tx.send(());
        working.await??;
        Ok::<_, anyhow::Error>((idle, holding, live, latencies))
    })?;
    table.row(
        format!(
            "sleepers: wake-up after the due time, {n} runs sleeping, worker poll {} ms",
            poll.as_millis()
        ),
        "ms",
        latencies,
    );
    table.row(
        format!("sleepers: live instances while {n} runs sleep on one worker"),
        "instances",
        vec![live as f64],
    );
    table.row(
        "sleepers: worker resident memory, no runs".to_string(),
        "MiB",
        vec![idle as f64 / (1 << 20) as f64],
    );
    table.row_with_ratio(
        format!("sleepers: worker resident memory, {n} runs sleeping"),
        "MiB",
        vec![holding as f64 / (1 << 20) as f64],
        format!(
            "{:.2}× none; {:.2} KiB per sleeping run",
            holding as f64 / idle as f64,
            holding.saturating_sub(idle) as f64 / 1024.0 / n as f64
        ),
    );
    let lateness = on_time(bed, &waiter, plan.samples)?;
    table.row(
        format!(
            "sleepers: wake-up after the due time on the system clock, one run due at a time, \
             worker poll {} ms",
            poll.as_millis()
        ),
        "ms",
        lateness,
    );
    Ok(())
}

/// How late a worker on the system clock takes up a run whose sleep just ended: one run
/// at a time sleeps 150-400 ms, and the lateness is the wall time at which the bench
/// first sees it leased again minus its recorded wake time (both in store ms).
fn on_time(bed: &Bed, waiter: &Arc<LoadedAgent>, samples: usize) -> anyhow::Result<Vec<f64>> {
    let data = bed.dir.join("on-time-data");
    std::fs::create_dir_all(&data)?;
    let db = bed.dir.join("on-time.db");
    bed.tokio.block_on(async {
        let store: Arc<dyn Store> =
            Arc::new(SqliteStore::open_with(&db, &StoreOptions::default())?);
        let authority = deploy_waiter(store.as_ref(), waiter, &data).await?;
        let host = Arc::new(Host::new(Arc::clone(&bed.runtime), Arc::clone(&store))?);
        let worker = Arc::new(Worker::new(Arc::clone(&host), WorkerOptions::default()));
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let working = tokio::spawn(Arc::clone(&worker).run(async move {
            let _ = done_rx.await;
        }));
        let mut lateness = Vec::with_capacity(samples);
        for k in 0..samples {
            let run_id = format!("on-time-{k:04}");
            let sleep_ms = 150 + (k as u64 * 97) % 250;
            let input = json!({"log": "/data/on-time.log", "waits": [{"sleep_ms": sleep_ms}]});
            submit_waiter(store.as_ref(), waiter, &authority, &run_id, &input).await?;
            let started = Instant::now();
            let wake_at = loop {
                let record = store
                    .run(&run_id)
                    .await?
                    .with_context(|| format!("{run_id} disappeared from the store"))?;
                if let (None, Some(wake_at)) = (&record.lease, record.wake_at) {
                    break wake_at;
                }
                ensure!(
                    started.elapsed() < Duration::from_secs(60),
                    "{run_id} never fell asleep"
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            };
            loop {
                let record = store
                    .run(&run_id)
                    .await?
                    .with_context(|| format!("{run_id} disappeared from the store"))?;
                if record.lease.is_some() || record.status == RunStatus::Completed {
                    let now = Clock::system().now();
                    lateness.push((now - wake_at) as f64);
                    break;
                }
                ensure!(
                    started.elapsed() < Duration::from_secs(60),
                    "{run_id} never woke"
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            while store.run(&run_id).await?.map(|r| r.status) != Some(RunStatus::Completed) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let _ = done_tx.send(());
        working.await??;
        Ok(lateness)
    })
}
