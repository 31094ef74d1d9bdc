//! `idem cancel`: stop a run — at once if no worker holds it, else at its worker's next
//! host call; its claims are released and its status becomes `cancelled`.

use clap::Parser;
use idem::store::Cancelled;

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
        match store.cancel_run(&self.run_id).await? {
            Cancelled::Now => println!("cancelled run {}", display::name(&self.run_id)),
            Cancelled::Requested { lease } => println!(
                "cancel requested: worker {} stops run {} at its next host call",
                display::name(&lease.worker),
                display::name(&self.run_id)
            ),
        }
        Ok(Exit::Done)
    }
}
