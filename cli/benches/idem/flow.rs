//! The flow-control rows: what a worker's lease query costs on a store holding a
//! backlog of queued runs, with no limits set, with a limit on another deployment, and
//! with its own deployment limited — the price limits put on leasing, and the proof
//! that a limit somewhere does not slow unlimited deployments.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::store::{
    Admission, Counts, Deployment, FlowSetting, OpenOptions, RunFence, SqliteStore, Store,
    Submission, SyncMode,
};

use super::report::{Table, median, micros, sorted};
use super::{Bed, Plan, repeat};

/// Runs a worker leases per poll.
const BATCH: usize = 8;

pub(crate) fn flow(bed: &Bed, plan: &Plan, table: &mut Table) -> anyhow::Result<()> {
    let path = bed.dir.join("flow.db");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_with(&path, &OpenOptions::default())?);
    let queued = plan.flow.n;
    bed.tokio.block_on(async {
        store.put_component("ab", b"\0asm").await?;
        for name in ["busy", "other"] {
            store
                .deploy(&Deployment {
                    name,
                    digest: "ab",
                    authority: b"",
                    admission: Admission::Explicit,
                    source: None,
                })
                .await?;
        }
        for i in 0..queued {
            store
                .submit(&Submission {
                    run_id: &format!("run-{i}"),
                    agent: "busy",
                    digest: "ab",
                    namespace: "busy",
                    input: format!(r#"{{"customer":"c{}"}}"#, i % 50).as_bytes(),
                    authority: b"",
                    replace_authority: false,
                    priority: 0,
                })
                .await?;
        }
        anyhow::Ok(())
    })?;
    let setups: [(&str, Option<FlowSetting<'_>>); 4] = [
        ("no limits", None),
        (
            "a limit on another deployment",
            Some(FlowSetting {
                deployment: "other",
                max_running: Some(4),
                ..FlowSetting::default()
            }),
        ),
        (
            "its deployment limited to 64 running",
            Some(FlowSetting {
                deployment: "busy",
                max_running: Some(64),
                ..FlowSetting::default()
            }),
        ),
        (
            "64 running, 1 per key of 50",
            Some(FlowSetting {
                deployment: "busy",
                max_running: Some(64),
                key: Some("/customer"),
                per_key: Some(1),
            }),
        ),
    ];
    // The setups in turns, each turn every setup once: the first polls of a store warm
    // its caches, and a setup measured alone first paid for them (its median moved
    // 1.5× between runs), which put the ratios to it off.
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); setups.len()];
    repeat(plan.flow, || {
        for ((_, setting), samples) in setups.iter().zip(samples.iter_mut()) {
            bed.tokio.block_on(async {
                for name in ["busy", "other"] {
                    store.clear_flow(name).await?;
                }
                if let Some(setting) = setting {
                    store.set_flow(setting).await?;
                }
                for _ in 0..20 {
                    let began = Instant::now();
                    let got = store
                        .acquire_runs("bench", BATCH, Duration::from_secs(60), &[])
                        .await?;
                    samples.push(micros(began.elapsed()));
                    anyhow::ensure!(got.len() == BATCH, "leased {} runs", got.len());
                    // Given back at once: every poll sees the same backlog.
                    for run in got {
                        let fence = RunFence {
                            run_id: run.record.run_id,
                            token: run.token,
                            sync: SyncMode::Normal,
                        };
                        store.release_run(&fence, &Counts::default(), None).await?;
                    }
                }
                anyhow::Ok(())
            })?;
        }
        Ok(())
    })?;
    let base = median(&sorted(samples[0].clone()));
    for (i, ((what, _), samples)) in setups.iter().zip(samples).enumerate() {
        let row = format!("lease {BATCH} of {queued} queued runs: {what}");
        if i == 0 {
            table.row(row, "µs", samples);
        } else {
            let m = median(&sorted(samples.clone()));
            table.row_with_ratio(row, "µs", samples, format!("{:.2}× no limits", m / base));
        }
    }
    Ok(())
}
