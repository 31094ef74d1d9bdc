//! `idem cancel`: stop a run — at once if no worker holds it, else at its worker's next
//! host call; its claims are released and its status becomes `cancelled`. Its child
//! runs go with it (but detached ones), and it says which.

use clap::Parser;
use idem::ops;
use idem::store::{Cancelled, RunStatus};

use super::args::DbArgs;
use super::display;
use crate::exit::Exit;

#[derive(Debug, Parser)]
pub struct CancelCommand {
    /// The run.
    run_id: String,
    #[command(flatten)]
    db: DbArgs,
}

impl CancelCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        let store = self.db.open_existing().await?;
        let report = ops::cancel(store.as_ref(), &self.run_id)
            .await
            .map_err(crate::exit::op_error)?;
        match report.run {
            Cancelled::Now => println!("cancelled run {}", display::name(&self.run_id)),
            Cancelled::Requested { lease } => println!(
                "cancel requested: worker {} stops run {} at its next host call",
                display::name(&lease.worker),
                display::name(&self.run_id)
            ),
        }
        if !report.descendants.is_empty() {
            let asked = report
                .descendants
                .iter()
                .filter(|d| d.status != RunStatus::Cancelled)
                .count();
            println!(
                "with it {} children and their descendants ({} cancelled now, {asked} at their \
                 workers' next host call):",
                report.descendants.len(),
                report.descendants.len() - asked
            );
            for d in &report.descendants {
                let how = if d.status == RunStatus::Cancelled {
                    "cancelled"
                } else {
                    "cancel requested"
                };
                println!("  {} ({how})", display::name(&d.run_id));
            }
        }
        Ok(Exit::Done)
    }
}
