//! `idem status`: what the store knows of runs — status, step reached, counts, the
//! error a failed run ended with, and the claims still open. The older name for `ls`
//! and `show` together.

use clap::Parser;
use idem::store::{RunFilter, StoreError};

use super::args::DbArgs;
use super::display;
use crate::exit::Exit;

#[derive(Debug, Parser)]
pub struct StatusCommand {
    /// One run to show; all runs when omitted.
    run_id: Option<String>,
    #[command(flatten)]
    db: DbArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

impl StatusCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        let store = self.db.open_read_only().await?;
        let runs = match &self.run_id {
            Some(id) => vec![
                store
                    .run(id)
                    .await?
                    .ok_or_else(|| StoreError::UnknownRun { run_id: id.clone() })?,
            ],
            None => store.runs(&RunFilter::default()).await?,
        };
        let claims = store.open_claims(self.run_id.as_deref()).await?;
        if self.json {
            let doc = serde_json::json!({ "runs": runs, "open_claims": claims });
            println!("{}", display::json(&doc));
            return Ok(Exit::Done);
        }
        let now = store.now().await?;
        println!("{}", display::runs_header());
        for run in &runs {
            println!("{}", display::run_row(run, now));
            // A list shows each failure's first line (for Python, `Type: message`);
            // one run asked for by id shows the whole error, traceback included.
            if let Some(error) = display::run_error(run) {
                match &self.run_id {
                    Some(_) => println!("  error: {}", error.replace('\n', "\n         ")),
                    None => println!("  error: {}", display::first_line(&error, 100)),
                }
            }
        }
        if claims.is_empty() {
            println!("no open claims");
        } else {
            println!("open claims:");
            for c in &claims {
                let holder = match (&c.parked, &c.holder) {
                    (Some(reason), _) => format!("(parked in doubt: {})", display::name(reason)),
                    (None, Some(holder)) => display::name(holder),
                    (None, None) => "(released)".to_string(),
                };
                println!(
                    "  {} run={} attempt={} token={} holder={holder} lease_expires={}",
                    display::name(&c.key),
                    display::name(&c.run_id),
                    c.attempt,
                    c.token,
                    c.lease_expires
                );
            }
        }
        Ok(Exit::Done)
    }
}
