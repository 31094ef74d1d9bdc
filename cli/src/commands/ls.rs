//! `idem ls`: the runs in a store, newest first, filtered by status, agent or parent.

use clap::Parser;
use idem::store::{RunFilter, RunStatus};

use super::args::DbArgs;
use super::display;
use crate::exit::Exit;

#[derive(Debug, Parser)]
pub struct LsCommand {
    #[command(flatten)]
    db: DbArgs,
    /// Only runs with this status: queued, running, paused, completed, failed,
    /// in-doubt, cancelled.
    #[arg(long, value_parser = parse_status)]
    status: Option<RunStatus>,
    /// Only runs of this agent (deployment name).
    #[arg(long)]
    agent: Option<String>,
    /// Only the child runs this run spawned.
    #[arg(long, value_name = "RUN")]
    parent: Option<String>,
    /// At most this many runs.
    #[arg(long, default_value = "100")]
    limit: usize,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

fn parse_status(s: &str) -> Result<RunStatus, String> {
    s.parse()
}

impl LsCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        let store = self.db.open_read_only().await?;
        let runs = store
            .runs(&RunFilter {
                status: self.status,
                agent: self.agent.as_deref(),
                parent: self.parent.as_deref(),
                limit: Some(self.limit),
            })
            .await?;
        if self.json {
            println!("{}", display::json(&serde_json::json!({ "runs": runs })));
            return Ok(Exit::Done);
        }
        let now = store.now().await?;
        println!("{}", display::runs_header());
        for run in &runs {
            println!("{}", display::run_row(run, now));
        }
        Ok(Exit::Done)
    }
}
