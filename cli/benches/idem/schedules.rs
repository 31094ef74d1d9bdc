//! The schedules rows: 1,000 schedules on one store, all ticking at the same instant
//! (every 10 s, aligned to the epoch), fired and driven by one worker on the system
//! clock: how long after its tick each run was submitted, and how long after its tick
//! it had run (a run of no steps, so its end is its start and a few host calls).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::ensure;
use idem::store::{
    Admission, Deployment, OpenOptions as StoreOptions, Overlap, RunFilter, ScheduleDef,
    ScheduleSpec, SqliteStore, Store,
};
use idem::worker::{Worker, WorkerOptions};
use serde_json::json;

use super::report::{Table, progress};
use super::{Bed, Plan};

pub(crate) fn schedules(bed: &Bed, plan: &Plan, table: &mut Table) -> anyhow::Result<()> {
    let n = plan.schedules;
    progress(&format!("  {n} schedules ticking at once, one worker"));
    let db = bed.dir.join("schedules.db");
    let every = 10_000;
    let (submitted, ran) = bed.tokio.block_on(async {
        let store: Arc<dyn Store> =
            Arc::new(SqliteStore::open_with(&db, &StoreOptions::default())?);
        let agent = &bed.agent;
        store.put_component(agent.digest(), agent.bytes()?).await?;
        store
            .deploy(&Deployment {
                name: "bench",
                digest: agent.digest(),
                authority: &idem::runtime::Authority::default().encode(),
                admission: Admission::Explicit,
                source: None,
            })
            .await?;
        let spec = ScheduleSpec::Every { every_ms: every };
        let input = serde_json::to_vec(&json!({ "mode": "steps", "n": 0 }))?;
        for i in 0..n {
            store
                .create_schedule(&ScheduleDef {
                    name: &format!("s{i:04}"),
                    deployment: "bench",
                    spec: &spec,
                    input: &input,
                    catch_up: 0,
                    overlap: Overlap::Skip,
                })
                .await?;
        }
        let host = Arc::new(idem::runtime::Host::new(
            Arc::clone(&bed.runtime),
            Arc::clone(&store),
        )?);
        let worker = Arc::new(Worker::new(
            host,
            WorkerOptions {
                concurrency: 64,
                ..WorkerOptions::default()
            },
        ));
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let working = tokio::spawn(Arc::clone(&worker).run(async move {
            let _ = done_rx.await;
        }));
        // One tick of every schedule: the first after they were created.
        let began = Instant::now();
        let runs = loop {
            let runs = store.runs(&RunFilter::default()).await?;
            if runs.len() >= n && runs.iter().all(|r| r.status.is_finished()) {
                break runs;
            }
            ensure!(
                began.elapsed() < Duration::from_secs(600),
                "only {} of {n} runs",
                runs.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        for i in 0..n {
            store.pause_schedule(&format!("s{i:04}"), true).await?;
        }
        let _ = done_tx.send(());
        working.await??;
        let (mut submitted, mut ran) = (Vec::new(), Vec::new());
        for run in &runs {
            let Some(by) = store.run_schedule(&run.run_id).await? else {
                continue;
            };
            submitted.push((run.created - by.tick) as f64);
            ran.push((run.updated - by.tick) as f64);
        }
        Ok::<_, anyhow::Error>((submitted, ran))
    })?;
    table.row(
        format!("schedules: tick to run submitted, {n} schedules ticking at once, one worker"),
        "ms",
        submitted,
    );
    table.row(
        format!("schedules: tick to run done (a run of no steps), {n} schedules ticking at once"),
        "ms",
        ran,
    );
    Ok(())
}
