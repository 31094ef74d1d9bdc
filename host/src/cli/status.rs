//! `idem status`: what the store knows of runs — status, step reached, counts, and the
//! claims still open.

use std::path::PathBuf;

use clap::Parser;
use idem::store::{RunRecord, SqliteStore, Store};

use super::{BadInput, Exit};

#[derive(Debug, Parser)]
pub struct StatusCommand {
    /// One run to show in detail; all runs when omitted.
    run_id: Option<String>,
    /// The SQLite store.
    #[arg(long, default_value = "idem.db")]
    db: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

impl StatusCommand {
    pub fn execute(self) -> anyhow::Result<Exit> {
        // Opening creates a store; looking at one that is not there is a mistake.
        if !self.db.exists() {
            return Err(BadInput(format!("no store at {}", self.db.display())).into());
        }
        let store = SqliteStore::open_read_only(&self.db)?;
        let runs = match &self.run_id {
            Some(id) => vec![
                store
                    .run(id)?
                    .ok_or_else(|| BadInput(format!("no run {id:?} in {}", self.db.display())))?,
            ],
            None => store.runs()?,
        };
        let claims = store.open_claims(self.run_id.as_deref())?;
        if self.json {
            let doc = serde_json::json!({ "runs": runs, "open_claims": claims });
            println!("{doc}");
            return Ok(Exit::Done);
        }
        println!(
            "{:<32} {:<10} {:>6} {:>8} {:>8} {:>8} {:>9} {:>9}  agent",
            "RUN", "STATUS", "STEP", "EXECUTED", "SKIPPED", "AWAITED", "RECLAIMED", "INSTANCES"
        );
        for run in &runs {
            print_run(run);
        }
        if claims.is_empty() {
            println!("no open claims");
        } else {
            println!("open claims:");
            for c in &claims {
                let holder = match (&c.parked, &c.holder) {
                    (Some(reason), _) => format!("(parked in doubt: {reason})"),
                    (None, Some(holder)) => holder.clone(),
                    (None, None) => "(released)".to_string(),
                };
                println!(
                    "  {} run={} attempt={} token={} holder={holder} lease_expires={}",
                    c.key, c.run_id, c.attempt, c.token, c.lease_expires
                );
            }
        }
        Ok(Exit::Done)
    }
}

fn print_run(run: &RunRecord) {
    let status = serde_json::to_value(run.status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    let step = run
        .step
        .map(|s| s.to_string())
        .unwrap_or_else(|| "-".into());
    let c = &run.counts;
    println!(
        "{:<32} {:<10} {:>6} {:>8} {:>8} {:>8} {:>9} {:>9}  {}",
        run.run_id,
        status,
        step,
        c.executed,
        c.skipped,
        c.awaited,
        c.reclaimed,
        c.instances,
        run.agent
    );
}
