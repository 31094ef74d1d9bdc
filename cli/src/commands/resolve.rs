//! `idem resolve`: an operator settles a key that a run parked in doubt — the side
//! effect happened (commit the result it had) or it did not (retry it). The key may be
//! given as the agent sees it or as the store keeps it (`namespace:key`).

use clap::Parser;
use idem::ops;
use idem::store::Resolution;
use idem::text::escape_for_terminal as shown;

use super::args::DbArgs;
use crate::exit::{BadInput, Exit, op_error};

#[derive(Debug, Parser)]
#[command(group(clap::ArgGroup::new("how").required(true).args(["result", "retry"])))]
pub struct ResolveCommand {
    /// The run that parked the key.
    run_id: String,
    /// The parked key: as the agent sees it, or as `idem status` shows it
    /// (`namespace:key`).
    key: String,
    /// The side effect happened: commit this JSON as the key's result.
    #[arg(long, value_name = "JSON")]
    result: Option<String>,
    /// The side effect did not happen: release the key so the run executes it again.
    #[arg(long)]
    retry: bool,
    #[command(flatten)]
    db: DbArgs,
}

impl ResolveCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        if let Some(result) = &self.result {
            serde_json::from_str::<serde_json::Value>(result)
                .map_err(|e| BadInput(format!("--result is not valid JSON: {e}")))?;
        }
        let store = self.db.open_existing().await?;
        let resolution = match &self.result {
            Some(result) => Resolution::Commit(result.as_bytes()),
            None => Resolution::Retry,
        };
        let resolved = ops::resolve(store.as_ref(), &self.run_id, &self.key, resolution)
            .await
            .map_err(op_error)?;
        println!(
            "resolved {} of run {} ({}); run status: {}",
            shown(&resolved.key),
            shown(&self.run_id),
            if self.retry { "retry" } else { "committed" },
            resolved.status.map_or("unknown", |s| s.as_str()),
        );
        Ok(Exit::Done)
    }
}
