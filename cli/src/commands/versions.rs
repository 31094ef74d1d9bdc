//! `idem deployments`, `idem upgrade` and `idem rollback`: the versions of a
//! deployment and the runs on each, and moving runs that have not ended to a version
//! or back to where they were. A moved run's next instance runs its new version's
//! component; every move is recorded with the run (`idem show`). `idem upgrade
//! --dry-run` rehearses a move against the runs in flight instead (`idem::prove`'s
//! `rehearse_upgrade`) and changes nothing.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use idem::ops;
use idem::prove::{Next, RunRehearsal, UpgradeReport, Verdict};
use idem::runtime::Runtime;
use idem::store::{MoveReason, RunMove, VersionRecord};

use super::args::{CacheArgs, DbArgs};
use super::display;
use super::prove::xml_escape;
use crate::exit::{BadInput, Exit, op_error};

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
    /// Move nothing: rehearse the move. Each run is resumed twice in scratch stores,
    /// on the version it is on and on VERSION, from its real checkpoint, its committed
    /// results read from the store (opened read-only) and nothing sent, up to the
    /// first step it has no result for. Exits 7 when any run would run a committed
    /// step again, take another next step, or break on VERSION.
    #[arg(long)]
    dry_run: bool,
    /// With --dry-run, also write a JUnit XML report to FILE: one test case per run.
    #[arg(long, value_name = "FILE", requires = "dry_run")]
    junit: Option<PathBuf>,
    /// With --dry-run: where the scratch stores go (removed after). Defaults to the
    /// system's temp dir.
    #[arg(long, value_name = "DIR", requires = "dry_run")]
    scratch: Option<PathBuf>,
    #[command(flatten)]
    cache: CacheArgs,
}

impl UpgradeCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        if self.dry_run {
            return self.rehearse().await;
        }
        let store = self.db.open_existing().await?;
        let moves = ops::upgrade(store.as_ref(), &self.name, self.to, &self.runs)
            .await
            .map_err(op_error)?;
        print_moves(&self.name, &moves, self.json);
        Ok(Exit::Done)
    }
}

impl UpgradeCommand {
    /// `--dry-run`.
    async fn rehearse(&self) -> anyhow::Result<Exit> {
        let store = self.db.open_read_only().await?;
        let runtime = Arc::new(Runtime::new(self.cache.dir())?);
        let scratch = self.scratch.clone().unwrap_or_else(std::env::temp_dir);
        let report = ops::rehearse(&store, &runtime, &self.name, self.to, &self.runs, &scratch)
            .await
            .map_err(op_error)?;
        let target = format!("version {}", self.to);
        report_rehearsal(
            &self.name,
            &target,
            &report,
            self.json,
            self.junit.as_deref(),
        )
    }
}

/// A rehearsal of moving runs of deployment `name` to `target` (`version 3`, or a
/// build not deployed yet), as text or JSON, and as JUnit XML to `junit` if given; exit
/// 7 when any run would not be safe.
pub fn report_rehearsal(
    name: &str,
    target: &str,
    report: &UpgradeReport,
    json: bool,
    junit_to: Option<&std::path::Path>,
) -> anyhow::Result<Exit> {
    if let Some(path) = junit_to {
        std::fs::write(path, junit(name, target, report))
            .map_err(|e| BadInput(format!("cannot write --junit file {}: {e}", path.display())))?;
    }
    if json {
        let value = serde_json::json!({
            "deployment": name,
            "to": target,
            "safe": report.is_safe(),
            "report": report,
        });
        println!("{}", display::json(&value));
    } else {
        print_rehearsal(name, target, report);
    }
    Ok(if report.is_safe() {
        Exit::Done
    } else {
        Exit::Violations
    })
}

/// Where a walk stopped, as a person reads it.
fn next_text(next: &Next) -> String {
    match next {
        Next::Step { key } => format!("runs step {}", display::name(key)),
        Next::Wait { key } => format!("waits for signal {}", display::name(key)),
        Next::Spawn { key } => format!("spawns child {}", display::name(key)),
        Next::Join { key } => format!("joins {}", display::name(key)),
        Next::Completed { .. } => "completes".to_string(),
        Next::Failed { error } => format!("fails: {}", display::name(error)),
    }
}

/// What a run's rehearsal found, on one line.
fn verdict_text(run: &RunRehearsal) -> String {
    match &run.verdict {
        Verdict::Compatible => {
            let next = run
                .new
                .as_ref()
                .map(|w| next_text(&w.next))
                .unwrap_or_default();
            let replayed = run.new.as_ref().map_or(0, |w| w.replayed.len());
            format!("ok: replays its {replayed} committed steps, then {next} as before")
        }
        Verdict::AlreadyOn => "ok: already on this version".to_string(),
        Verdict::OutputDiffers { old, new } => format!(
            "ok, with another output: {} instead of {}",
            display::name(new),
            display::name(old)
        ),
        Verdict::Repeats { steps, instead } => {
            let keys: Vec<String> = steps
                .iter()
                .map(|s| format!("step {} ({})", s.step, display::name(&s.key)))
                .collect();
            format!(
                "WOULD REPEAT {}: the new version never asks for their keys; it first {}",
                keys.join(", "),
                next_text(instead)
            )
        }
        Verdict::Diverges { old, new } => format!(
            "DIVERGES: next, the version it is on {}, the new one {}",
            next_text(old),
            next_text(new)
        ),
        Verdict::Breaks { error } => format!("BREAKS: {}", display::name(error)),
        Verdict::ExportsDiffer { new, .. } => format!(
            "REFUSED: the new component exports another agent's interface ({})",
            display::name(new)
        ),
        Verdict::Unchecked { why } => format!("UNCHECKED: {}", display::name(why)),
    }
}

fn print_rehearsal(name: &str, target: &str, report: &UpgradeReport) {
    let bad = report.unsafe_runs().count();
    println!(
        "rehearsed moving {} run{} of {} to {}: {}",
        report.runs.len(),
        if report.runs.len() == 1 { "" } else { "s" },
        display::name(name),
        display::name(target),
        if bad == 0 {
            "nothing would run again".to_string()
        } else {
            format!("{bad} would not be safe (nothing was moved)")
        }
    );
    for run in &report.runs {
        println!("  {}: {}", display::name(&run.run_id), verdict_text(run));
    }
}

/// The rehearsal as JUnit XML: one test case per run, failed where it is not safe.
fn junit(name: &str, target: &str, report: &UpgradeReport) -> String {
    let failures = report.unsafe_runs().count();
    let suite = format!("moving runs of {name} to {target}");
    let mut xml = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        xml,
        "<testsuites name=\"idem upgrade\" tests=\"{}\" failures=\"{failures}\">",
        report.runs.len()
    );
    let _ = writeln!(
        xml,
        "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failures}\">",
        xml_escape(&suite),
        report.runs.len()
    );
    for run in &report.runs {
        let _ = write!(
            xml,
            "    <testcase classname=\"idem.upgrade.{}\" name=\"{}\"",
            xml_escape(name),
            xml_escape(&run.run_id)
        );
        if run.verdict.is_safe() {
            xml.push_str("/>\n");
            continue;
        }
        let _ = writeln!(
            xml,
            ">\n      <failure message=\"{}\"/>\n    </testcase>",
            xml_escape(&verdict_text(run))
        );
    }
    xml.push_str("  </testsuite>\n</testsuites>\n");
    xml
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
