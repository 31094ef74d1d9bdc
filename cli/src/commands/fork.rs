//! `idem fork`: a new run started from the checkpoint a run saved before one of its
//! steps, reusing the results it committed before that step; every later step runs
//! again under the fork's own keys. The fork is queued for workers, as `idem submit`
//! queues a run.

use clap::Parser;
use idem::ops::{self, ForkSpec};

use super::args::{DbArgs, json_or_file};
use super::display;
use crate::exit::{Exit, op_error};

#[derive(Debug, Parser)]
pub struct ForkCommand {
    /// The run to fork.
    #[arg(value_name = "RUN")]
    run: String,
    /// The step to fork at, as `idem show --steps` numbers the run's committed steps
    /// (from 1): the fork starts from the checkpoint saved before it, and reuses the
    /// results of the steps before it.
    #[arg(long, value_name = "STEP")]
    at: u64,
    /// The fork's input, as JSON, or `@FILE` to read it from a file (`@-`: from stdin).
    /// Defaults to the run's. A step whose key depends on the input runs again.
    #[arg(long, allow_negative_numbers = true)]
    input: Option<String>,
    /// The version of the run's deployment the fork runs (`idem deployments`).
    /// Defaults to the run's; one exporting other functions is refused.
    #[arg(long, value_name = "V")]
    version: Option<u64>,
    /// The fork's run id. Defaults to the run's id, `-fork-` and eight hex digits.
    #[arg(long = "run-id", value_name = "NEW")]
    new_run_id: Option<String>,
    #[command(flatten)]
    db: DbArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

impl ForkCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        let input = match &self.input {
            Some(text) => Some(json_or_file("--input", text)?),
            None => None,
        };
        let store = self.db.open_existing().await?;
        let forked = ops::fork(
            store.as_ref(),
            &ForkSpec {
                run_id: &self.run,
                at: self.at,
                input: input.as_deref(),
                version: self.version,
                new_run_id: self.new_run_id.as_deref(),
            },
        )
        .await
        .map_err(op_error)?;
        let run = &forked.record;
        if self.json {
            let value = serde_json::json!({
                "run_id": run.run_id,
                "forked_from": self.run,
                "at": self.at,
                "version": run.version,
                "namespace": forked.namespace,
                "reused": forked.reused,
                "checkpoint": forked.checkpoint,
                "status": run.status,
            });
            println!("{}", display::json(&value));
            return Ok(Exit::Done);
        }
        let from = match forked.checkpoint {
            Some(step) => format!("the checkpoint saved at step {step}"),
            None => "the beginning (no checkpoint was saved before that step)".to_string(),
        };
        println!(
            "forked {} at step {} into {} (queued)",
            display::name(&self.run),
            self.at,
            display::name(&run.run_id)
        );
        println!("  starts from    {from}");
        println!(
            "  reuses         {} committed result{} (steps 1 to {})",
            forked.reused,
            if forked.reused == 1 { "" } else { "s" },
            self.at - 1
        );
        println!(
            "  runs again     step {} on, under the keys of namespace {}",
            self.at,
            display::name(&forked.namespace)
        );
        if let Some(version) = run.version {
            println!("  version        {version}");
        }
        Ok(Exit::Done)
    }
}
