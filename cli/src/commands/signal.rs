//! `idem signal`: send a signal to a run. A run waiting for it (`wait_for_signal`) is
//! due at once; one that has not reached its wait yet finds the signal kept for it.

use clap::Parser;
use idem::runtime;

use super::args::{DbArgs, json_or_file};
use super::display;
use crate::exit::Exit;

#[derive(Debug, Parser)]
pub struct SignalCommand {
    /// The run.
    run_id: String,
    /// The signal's name, as the agent waits for it.
    name: String,
    /// The payload, as JSON, or `@FILE` to read it from a file (`@-`: from stdin; default
    /// `null`). At most the run's state limit (`--max-state-bytes` when it was submitted;
    /// 1 MiB by default).
    #[arg(long, value_name = "JSON|@FILE")]
    payload: Option<String>,
    #[command(flatten)]
    db: DbArgs,
}

impl SignalCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        let payload = match &self.payload {
            Some(value) => json_or_file("--payload", value)?,
            None => b"null".to_vec(),
        };
        let store = self.db.open_existing().await?;
        let sent = runtime::send_signal(store.as_ref(), &self.run_id, &self.name, &payload).await?;
        if sent.woke {
            println!(
                "signal {} sent: run {} was waiting for it and is due now",
                display::name(&self.name),
                display::name(&self.run_id)
            );
        } else {
            println!(
                "signal {} sent: kept for run {} until it waits for it",
                display::name(&self.name),
                display::name(&self.run_id)
            );
        }
        Ok(Exit::Done)
    }
}
