//! `idem resume`: let paused runs, or a paused deployment, go on. A resumed run is due
//! as it was when it was paused (at once, or when its wait ends) and continues from its
//! checkpoint and committed steps, as a recycled run does.

use clap::Parser;
use idem::ops;
use idem::store::Resumed;

use super::args::DbArgs;
use super::display;
use crate::exit::Exit;

#[derive(Debug, Parser)]
pub struct ResumeCommand {
    /// The runs to resume. Resuming a run that is not paused changes nothing.
    #[arg(value_name = "RUN", required_unless_present = "deployment")]
    run_ids: Vec<String>,
    /// Resume this deployment and the runs paused with it (runs paused one by one stay
    /// paused).
    #[arg(long, value_name = "NAME", conflicts_with = "run_ids")]
    deployment: Option<String>,
    #[command(flatten)]
    db: DbArgs,
}

impl ResumeCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        let store = self.db.open_existing().await?;
        if let Some(agent) = &self.deployment {
            let (name, resumed) = ops::resume_deployment(store.as_ref(), agent)
                .await
                .map_err(crate::exit::op_error)?;
            let was = if resumed.was_paused {
                ""
            } else {
                " (it was not paused)"
            };
            println!(
                "resumed deployment {}{was}: {} runs paused with it resumed",
                display::name(&name),
                resumed.runs
            );
            return Ok(Exit::Done);
        }
        super::pause::check_runs(store.as_ref(), &self.run_ids).await?;
        for run_id in &self.run_ids {
            match ops::resume(store.as_ref(), run_id)
                .await
                .map_err(crate::exit::op_error)?
            {
                Resumed::Now => println!("resumed run {}", display::name(run_id)),
                Resumed::NotPaused => println!("run {} was not paused", display::name(run_id)),
            }
        }
        Ok(Exit::Done)
    }
}
