//! The upgrade rehearsal rows: a store holding N runs of `release` v1 in flight (two of
//! their four steps done, then asleep for an hour), every one rehearsed on the
//! compatible v2 in one call — the wall time, per run, and this process's resident
//! memory before and during.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::ensure;
use idem::prove::{UpgradeRehearsal, Verdict, rehearse_upgrade};
use idem::runtime::Host;
use idem::store::{
    Admission, Deployment, OpenOptions as StoreOptions, RunFilter, SqliteStore, Store, Submission,
};
use idem::worker::{Worker, WorkerOptions};
use idem_test_artifacts::{RELEASE, RELEASE_V2};
use serde_json::json;

use super::report::{Table, progress};
use super::{Bed, Plan};

/// Resident memory of this process, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    kib * 1024
}

pub(crate) fn rehearse(bed: &Bed, plan: &Plan, table: &mut Table) -> anyhow::Result<()> {
    let n = plan.rehearse;
    progress(&format!("  {n} runs left in flight, then rehearsed on v2"));
    let v1 = Arc::new(bed.runtime.load(Path::new(RELEASE))?);
    let v2 = bed.runtime.load(Path::new(RELEASE_V2))?;
    let db = bed.dir.join("rehearse.db");
    let scratch = bed.dir.join("rehearse-scratch");
    let (wall, before, peak, verdicts) = bed.tokio.block_on(async {
        let store: Arc<dyn Store> =
            Arc::new(SqliteStore::open_with(&db, &StoreOptions::default())?);
        store.put_component(v1.digest(), v1.bytes()?).await?;
        store
            .deploy(&Deployment {
                name: "release",
                digest: v1.digest(),
                authority: &[],
                admission: Admission::Explicit,
                source: None,
            })
            .await?;
        let input = serde_json::to_vec(&json!({"items": 4, "pause_at": 2, "pause_ms": 3_600_000}))?;
        let ids: Vec<String> = (0..n).map(|i| format!("inflight-{i:05}")).collect();
        for id in &ids {
            store
                .submit(&Submission {
                    run_id: id,
                    agent: "release",
                    digest: v1.digest(),
                    namespace: "release",
                    input: &input,
                    authority: &[],
                    replace_authority: false,
                    priority: 0,
                })
                .await?;
        }
        let host = Arc::new(Host::new(Arc::clone(&bed.runtime), Arc::clone(&store))?);
        let worker = Arc::new(Worker::new(
            Arc::clone(&host),
            WorkerOptions {
                concurrency: 256,
                ..WorkerOptions::default()
            },
        ));
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let working = tokio::spawn(Arc::clone(&worker).run(async move {
            let _ = done_rx.await;
        }));
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
        let _ = done_tx.send(());
        working.await??;
        drop(worker);
        drop(host);

        let before = rss();
        let (peak, sampling) = (
            Arc::new(AtomicU64::new(before)),
            Arc::new(AtomicBool::new(true)),
        );
        let sampler = {
            let (peak, sampling) = (Arc::clone(&peak), Arc::clone(&sampling));
            tokio::spawn(async move {
                while sampling.load(Ordering::Relaxed) {
                    peak.fetch_max(rss(), Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        };
        let began = Instant::now();
        let report = rehearse_upgrade(
            &bed.runtime,
            &store,
            &v2,
            &UpgradeRehearsal { runs: ids, scratch },
        )
        .await?;
        let wall = began.elapsed();
        sampling.store(false, Ordering::Relaxed);
        sampler.await?;
        let compatible = report
            .runs
            .iter()
            .filter(|r| r.verdict == Verdict::Compatible)
            .count();
        Ok::<_, anyhow::Error>((wall, before, peak.load(Ordering::Relaxed), compatible))
    })?;
    ensure!(
        verdicts == n,
        "{verdicts} of {n} runs found compatible with a compatible v2"
    );
    table.row(
        format!("upgrade rehearsal: {n} in-flight runs (2 of 4 steps done, asleep) on a compatible v2, one call, SQLite"),
        "s",
        vec![wall.as_secs_f64()],
    );
    table.row(
        "upgrade rehearsal: the same, per run (two walks: the old version's and the new one's)"
            .to_string(),
        "ms",
        vec![wall.as_secs_f64() * 1000.0 / n as f64],
    );
    table.row_with_ratio(
        format!("upgrade rehearsal: resident memory of the process during the {n} runs' rehearsal"),
        "MiB",
        vec![peak as f64 / (1 << 20) as f64],
        format!(
            "{:.2}× before it ({:.1} MiB)",
            peak as f64 / before as f64,
            before as f64 / (1 << 20) as f64
        ),
    );
    Ok(())
}
