//! `idem pause`: stop runs, or a whole deployment, until `idem resume`. A run no worker
//! holds is paused at once; a run a worker drives stops at its next host call outside a
//! side effect (a step in flight commits first) and its lease is given back. A paused
//! run holds nothing: no instance, no lease; its signals and waits are kept.

use clap::Parser;
use idem::ops;
use idem::store::{Paused, RunRecord, StoreError};

use super::args::DbArgs;
use super::display;
use crate::exit::{BadInput, Exit};

#[derive(Debug, Parser)]
pub struct PauseCommand {
    /// The runs to pause (each must be queued or running). Pausing a paused run
    /// changes nothing.
    #[arg(value_name = "RUN", required_unless_present = "deployment")]
    run_ids: Vec<String>,
    /// Pause this deployment: its unfinished runs, and every run started under its name
    /// (submitted, spawned, resumed after a failure) until `idem resume --deployment`.
    #[arg(long, value_name = "NAME", conflicts_with = "run_ids")]
    deployment: Option<String>,
    #[command(flatten)]
    db: DbArgs,
}

/// Finds every run named, refusing the whole command (changing nothing) if one does
/// not exist or is finished: a list with a mistake in it is not half done.
pub(super) async fn check_runs(
    store: &dyn idem::store::Store,
    run_ids: &[String],
) -> anyhow::Result<Vec<RunRecord>> {
    let mut runs = Vec::with_capacity(run_ids.len());
    for run_id in run_ids {
        let run = store
            .run(run_id)
            .await?
            .ok_or_else(|| StoreError::UnknownRun {
                run_id: run_id.clone(),
            })?;
        if run.status.is_finished() {
            return Err(BadInput(format!(
                "run {} is already {}: only a queued, running or paused run can be paused \
                 or resumed; nothing was changed",
                display::name(run_id),
                run.status
            ))
            .into());
        }
        runs.push(run);
    }
    Ok(runs)
}

impl PauseCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        let store = self.db.open_existing().await?;
        if let Some(agent) = &self.deployment {
            let (name, paused) = ops::pause_deployment(store.as_ref(), agent)
                .await
                .map_err(crate::exit::op_error)?;
            let already = if paused.was_paused {
                " (it was paused already)"
            } else {
                ""
            };
            println!(
                "paused deployment {}{already}: {} runs paused now ({} of them stop at their \
                 workers' next host call); runs started under the name stay paused until \
                 idem resume --deployment",
                display::name(&name),
                paused.runs,
                paused.held
            );
            return Ok(Exit::Done);
        }
        check_runs(store.as_ref(), &self.run_ids).await?;
        for run_id in &self.run_ids {
            match ops::pause(store.as_ref(), run_id)
                .await
                .map_err(crate::exit::op_error)?
            {
                Paused::Now => println!("paused run {}", display::name(run_id)),
                Paused::Requested { lease } => println!(
                    "pause requested: worker {} stops run {} at its next host call and gives \
                     it back",
                    display::name(&lease.worker),
                    display::name(run_id)
                ),
                Paused::Already => println!("run {} was paused already", display::name(run_id)),
            }
        }
        Ok(Exit::Done)
    }
}
