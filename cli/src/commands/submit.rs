//! `idem submit`: queue a run of a deployed agent and return at once; workers drive
//! it. Submitting is idempotent: the same run id with the same input is the same run.

use clap::Parser;
use idem::ops::{self, SubmitRequest};

use super::args::{AuthorityArgs, DbArgs, json_or_file};
use super::display;
use crate::exit::{Exit, op_error};

#[derive(Debug, Parser)]
pub struct SubmitCommand {
    /// The deployed agent: its name, or a component digest (64 hex digits) deployed
    /// under some name.
    agent: String,
    #[command(flatten)]
    db: DbArgs,
    /// The input, as JSON, or `@FILE` to read it from a file (`@-`: from stdin).
    // A negative number is JSON too: without `allow_negative_numbers`, clap takes the
    // value of `--input -1` for a flag.
    #[arg(long, default_value = "null", allow_negative_numbers = true)]
    input: String,
    /// The run's id. Defaults to the agent's name and a hash of the input.
    #[arg(long)]
    run_id: Option<String>,
    /// The namespace the run's keys live in; the component must be deployed under that
    /// name. Defaults to the deployment's name.
    #[arg(long)]
    namespace: Option<String>,
    /// The run's priority, 0 (the lowest) to 1000: workers lease due runs of higher
    /// priority first, then the oldest.
    #[arg(long, default_value_t = 0)]
    priority: u32,
    /// Narrow what the run may reach (the deployment's grants when not given).
    #[command(flatten)]
    authority: AuthorityArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

impl SubmitCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        let input = json_or_file("--input", &self.input)?;
        let store = self.db.open_existing().await?;
        let submitted = ops::submit(
            store.as_ref(),
            &SubmitRequest {
                agent: &self.agent,
                input: &input,
                run_id: self.run_id.as_deref(),
                namespace: self.namespace.as_deref(),
                priority: self.priority,
            },
            |base| self.authority.apply(base),
        )
        .await
        .map_err(op_error)?;
        let record = &submitted.record;
        if self.json {
            let doc = serde_json::json!({
                "run_id": record.run_id,
                "status": record.status,
                "created": submitted.created,
                "agent": record.agent,
                "digest": record.digest,
            });
            println!("{}", display::json(&doc));
        } else if submitted.created {
            println!(
                "submitted run {} ({})",
                display::name(&record.run_id),
                record.status
            );
        } else {
            println!(
                "run {} exists with this input ({})",
                display::name(&record.run_id),
                record.status
            );
        }
        Ok(Exit::Done)
    }
}
