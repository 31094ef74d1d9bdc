//! `idem usage`: the token usage of model calls per deployment and model, over the whole
//! store or one deployment's or one run's runs, priced by an optional table.

use clap::Parser;
use idem::ops::PricedUsage;
use idem::store::UsageFilter;

use super::args::{DbArgs, PricesArgs};
use super::display;
use crate::exit::Exit;

#[derive(Debug, Parser)]
pub struct UsageCommand {
    #[command(flatten)]
    db: DbArgs,
    /// Only the calls of this deployment's runs.
    #[arg(long, value_name = "NAME")]
    deployment: Option<String>,
    /// Only the calls of this run.
    #[arg(long, value_name = "RUN")]
    run: Option<String>,
    #[command(flatten)]
    prices: PricesArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

impl UsageCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        let prices = self.prices.load()?;
        let store = self.db.open_read_only().await?;
        let totals = store
            .usage(&UsageFilter {
                run_id: self.run.as_deref(),
                deployment: self.deployment.as_deref(),
            })
            .await?;
        let usage = PricedUsage::of(totals, prices.as_ref());
        if self.json {
            println!("{}", display::json(&serde_json::json!({ "usage": usage })));
            return Ok(Exit::Done);
        }
        if usage.is_empty() {
            println!("no model call recorded its usage");
        }
        for line in display::usage_lines(&usage, true) {
            println!("{line}");
        }
        Ok(Exit::Done)
    }
}
