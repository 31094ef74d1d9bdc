//! `idem resolve`: an operator settles a key that a run parked in doubt — the side
//! effect happened (commit the result it had) or it did not (retry it).

use std::path::PathBuf;

use clap::Parser;
use idem::store::{Resolution, SqliteStore, Store, SyncMode, now_millis};

use super::{BadInput, Exit, args};

#[derive(Debug, Parser)]
#[command(group(clap::ArgGroup::new("how").required(true).args(["result", "retry"])))]
pub struct ResolveCommand {
    /// The run that parked the key.
    run_id: String,
    /// The parked key.
    key: String,
    /// The side effect happened: commit this JSON as the key's result.
    #[arg(long, value_name = "JSON")]
    result: Option<String>,
    /// The side effect did not happen: release the key so the run executes it again.
    #[arg(long)]
    retry: bool,
    /// The SQLite store.
    #[arg(long, default_value = "idem.db")]
    db: PathBuf,
    /// Durability of the resolution's commit.
    #[arg(long, default_value = "normal", value_parser = args::sync_mode)]
    sync: SyncMode,
}

impl ResolveCommand {
    pub fn execute(self) -> anyhow::Result<Exit> {
        if let Some(result) = &self.result {
            serde_json::from_str::<serde_json::Value>(result)
                .map_err(|e| BadInput(format!("--result is not valid JSON: {e}")))?;
        }
        if !self.db.exists() {
            return Err(BadInput(format!("no store at {}", self.db.display())).into());
        }
        let store = SqliteStore::open(&self.db, self.sync)?;
        let resolution = match &self.result {
            Some(result) => Resolution::Commit(result.as_bytes()),
            None => Resolution::Retry,
        };
        store.resolve(&self.run_id, &self.key, resolution, now_millis())?;
        let status = store
            .run(&self.run_id)?
            .map(|r| serde_json::to_value(r.status).unwrap_or_default())
            .unwrap_or_default();
        println!(
            "resolved {} of run {} ({}); run status: {}",
            self.key,
            self.run_id,
            if self.retry { "retry" } else { "committed" },
            status.as_str().unwrap_or("unknown")
        );
        Ok(Exit::Done)
    }
}
