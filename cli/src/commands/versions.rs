//! `idem deployments`, `idem upgrade` and `idem rollback`: the versions of a
//! deployment and the runs on each, and moving runs that have not ended to a version
//! or back to where they were. A moved run's next instance runs its new version's
//! component; every move is recorded with the run (`idem show`).

use clap::Parser;
use idem::ops;
use idem::store::{MoveReason, RunMove, VersionRecord};

use super::args::DbArgs;
use super::display;
use crate::exit::{Exit, op_error};

#[derive(Debug, Parser)]
pub struct DeploymentsCommand {
    /// Only this deployment. Defaults to every one.
    name: Option<String>,
    #[command(flatten)]
    db: DbArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

impl DeploymentsCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        let store = self.db.open_read_only().await?;
        let names = match &self.name {
            Some(name) => vec![name.clone()],
            None => store
                .deployments()
                .await?
                .into_iter()
                .map(|d| d.name)
                .collect(),
        };
        let mut all = Vec::with_capacity(names.len());
        for name in names {
            let versions = ops::versions(store.as_ref(), &name)
                .await
                .map_err(op_error)?;
            all.push((name, versions));
        }
        if self.json {
            let doc: Vec<serde_json::Value> = all
                .iter()
                .map(|(name, versions)| serde_json::json!({ "name": name, "versions": versions }))
                .collect();
            println!(
                "{}",
                display::json(&serde_json::json!({ "deployments": doc }))
            );
            return Ok(Exit::Done);
        }
        let now = store.now().await?;
        for (name, versions) in &all {
            println!("{}", display::name(name));
            println!("  VERSION  DIGEST        DEPLOYED     IN-FLIGHT  RUNS LIVE/ALL");
            for v in versions {
                println!("  {}", version_row(v, now));
            }
        }
        Ok(Exit::Done)
    }
}

fn version_row(v: &VersionRecord, now: idem::store::Millis) -> String {
    let d = &v.deployment;
    format!(
        "{:<8} {:<13} {:<12} {:<10} {}/{}{}",
        format!("{}{}", d.version, if v.current { "*" } else { "" }),
        short(&d.digest),
        format!("{} ago", display::age(now, d.deployed_at)),
        d.in_flight.as_str(),
        v.runs_in_flight,
        v.runs,
        if v.current {
            "  (current: new runs)"
        } else {
            ""
        }
    )
}

/// The first 12 hex digits of a digest: as many as a person compares.
fn short(digest: &str) -> &str {
    digest.get(..12).unwrap_or(digest)
}

#[derive(Debug, Parser)]
pub struct UpgradeCommand {
    /// The deployment.
    name: String,
    /// The version to move the runs to (`idem deployments NAME` lists them).
    #[arg(long, value_name = "VERSION")]
    to: u64,
    /// The runs to move. Defaults to every run of the deployment that has not ended.
    #[arg(value_name = "RUN")]
    runs: Vec<String>,
    #[command(flatten)]
    db: DbArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

impl UpgradeCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        let store = self.db.open_existing().await?;
        let moves = ops::upgrade(store.as_ref(), &self.name, self.to, &self.runs)
            .await
            .map_err(op_error)?;
        print_moves(&self.name, &moves, self.json);
        Ok(Exit::Done)
    }
}

#[derive(Debug, Parser)]
pub struct RollbackCommand {
    /// The deployment.
    name: String,
    /// The runs to move back. Defaults to every run of the deployment that has not
    /// ended and has moved before.
    #[arg(value_name = "RUN")]
    runs: Vec<String>,
    #[command(flatten)]
    db: DbArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

impl RollbackCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        let store = self.db.open_existing().await?;
        let moves = ops::rollback(store.as_ref(), &self.name, &self.runs)
            .await
            .map_err(op_error)?;
        print_moves(&self.name, &moves, self.json);
        Ok(Exit::Done)
    }
}

/// A move, as a person reads it: `run r1: version 1 -> 2 (operator)`.
pub fn move_line(m: &RunMove) -> String {
    let at = |v: Option<u64>, digest: &str| match v {
        Some(v) => format!("version {v}"),
        None => format!("component {}", short(digest)),
    };
    let why = match m.reason {
        MoveReason::Dev => "idem run --upgrade",
        MoveReason::Policy => "deployed with --in-flight upgrade",
        MoveReason::Operator => "idem upgrade",
        MoveReason::Rollback => "idem rollback",
    };
    format!(
        "{} -> {} ({why})",
        at(m.from_version, &m.from_digest),
        at(m.to_version, &m.to_digest)
    )
}

fn print_moves(name: &str, moves: &[RunMove], json: bool) {
    if json {
        println!(
            "{}",
            display::json(&serde_json::json!({ "deployment": name, "moved": moves }))
        );
        return;
    }
    if moves.is_empty() {
        println!("no run of {} moved", display::name(name));
        return;
    }
    println!(
        "moved {} run{} of {} (each takes its new version at its next instance):",
        moves.len(),
        if moves.len() == 1 { "" } else { "s" },
        display::name(name)
    );
    for m in moves {
        println!("  {}: {}", display::name(&m.run_id), move_line(m));
    }
}
