//! `idem flow`: limits on a deployment's runs that every worker keeps, because the
//! store applies them as it leases: at most N running at once, and at most N per
//! concurrency key read from each run's input.
//!
//! A command of its own rather than flags of `idem deploy`: limits are an operator's
//! standing rule for a name, changed during an incident without a component at hand,
//! and kept across redeploys of the name.

use clap::{Parser, Subcommand};
use idem::store::{FlowLimits, FlowSetting};

use super::args::DbArgs;
use super::display;
use crate::exit::Exit;

#[derive(Debug, Parser)]
pub struct FlowCommand {
    #[command(subcommand)]
    action: FlowAction,
}

#[derive(Debug, Subcommand)]
enum FlowAction {
    /// Put limits on a deployment's runs, replacing any it had.
    Set(SetArgs),
    /// Remove a deployment's limits.
    Clear(ClearArgs),
    /// List the deployments' limits.
    Ls(LsArgs),
}

#[derive(Debug, Parser)]
struct SetArgs {
    /// The deployment.
    deployment: String,
    #[command(flatten)]
    db: DbArgs,
    /// At most this many of its runs run (hold a worker's lease) at once, across every
    /// worker.
    #[arg(long, value_name = "N")]
    max_running: Option<u32>,
    /// Where each run's concurrency key is in its input: a JSON pointer (`/customer`).
    /// A run submitted with nothing there is refused.
    #[arg(long, value_name = "POINTER", requires = "per_key")]
    key: Option<String>,
    /// At most this many runs with the same key run at once.
    #[arg(long, value_name = "N", requires = "key")]
    per_key: Option<u32>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Parser)]
struct ClearArgs {
    /// The deployment.
    deployment: String,
    #[command(flatten)]
    db: DbArgs,
}

#[derive(Debug, Parser)]
struct LsArgs {
    #[command(flatten)]
    db: DbArgs,
    /// Print a JSON array instead of text.
    #[arg(long)]
    json: bool,
}

impl FlowCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        match self.action {
            FlowAction::Set(args) => {
                let store = args.db.open_existing().await?;
                let limits = store
                    .set_flow(&FlowSetting {
                        deployment: &args.deployment,
                        max_running: args.max_running,
                        key: args.key.as_deref(),
                        per_key: args.per_key,
                    })
                    .await?;
                if args.json {
                    println!("{}", display::json(&serde_json::to_value(&limits)?));
                } else {
                    println!("{}", describe(&limits));
                }
            }
            FlowAction::Clear(args) => {
                let store = args.db.open_existing().await?;
                if store.clear_flow(&args.deployment).await? {
                    println!("cleared the limits of {}", display::name(&args.deployment));
                } else {
                    println!("{} had no limits", display::name(&args.deployment));
                }
            }
            FlowAction::Ls(args) => {
                let store = args.db.open_read_only().await?;
                let all = store.flows().await?;
                if args.json {
                    println!("{}", display::json(&serde_json::to_value(&all)?));
                } else if all.is_empty() {
                    println!("no deployment has limits");
                } else {
                    for limits in &all {
                        println!("{}", describe(limits));
                    }
                }
            }
        }
        Ok(Exit::Done)
    }
}

/// One line saying a deployment's limits.
fn describe(limits: &FlowLimits) -> String {
    let mut parts = Vec::new();
    if let Some(max) = limits.max_running {
        parts.push(format!("at most {max} running"));
    }
    if let (Some(key), Some(per_key)) = (&limits.key, limits.per_key) {
        parts.push(format!(
            "at most {per_key} per key at {}",
            display::name(key)
        ));
    }
    format!(
        "{}: {}",
        display::name(&limits.deployment),
        parts.join(", ")
    )
}
