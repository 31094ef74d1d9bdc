//! `idem logs`: what a run's agent wrote to stderr and stdout (the last 64 KiB, kept
//! in the store, escaped when it was written).

use std::io::Write;

use clap::Parser;
use idem::store::StoreError;

use super::args::DbArgs;
use crate::exit::Exit;

#[derive(Debug, Parser)]
pub struct LogsCommand {
    /// The run.
    run_id: String,
    #[command(flatten)]
    db: DbArgs,
}

impl LogsCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        let store = self.db.open_read_only().await?;
        if store.run(&self.run_id).await?.is_none() {
            return Err(StoreError::UnknownRun {
                run_id: self.run_id.clone(),
            }
            .into());
        }
        let log = store.logs(&self.run_id).await?;
        // Escaped again on the way out: the store file may not be what idem wrote.
        let text = idem::text::escape(&String::from_utf8_lossy(&log), true).into_owned();
        std::io::stdout().write_all(text.as_bytes())?;
        Ok(Exit::Done)
    }
}
