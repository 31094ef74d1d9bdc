//! `idem gc`: delete finished runs and the keys, logs and components only they used,
//! keeping what live runs and the dedupe window still need; and, if asked, the step
//! history of finished runs that stay.

use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use idem::ops;
use idem::store::{GcReport, GcRequest};

use super::args::DbArgs;
use super::display;
use crate::exit::{Exit, op_error};

#[derive(Debug, Parser)]
pub struct GcCommand {
    #[command(flatten)]
    db: DbArgs,
    /// Delete runs that finished (completed or cancelled) at least this long ago: a
    /// whole number and a unit, as in 30d, 12h, 90m or 30s.
    #[arg(long, default_value = "30d", value_name = "AGE", value_parser = age)]
    finished_before: Duration,
    /// Keep keys committed within this window even when their run goes: a run reusing
    /// such a key finds its result instead of running its step again. Keep it longer
    /// than any run could be resubmitted with the same id.
    #[arg(long, default_value = "7d", value_name = "AGE", value_parser = age)]
    dedupe_window: Duration,
    /// Of finished runs that stay, keep only the last checkpoint once they finished at
    /// least this long ago: their step history goes (`idem show --steps` lists no
    /// earlier checkpoints, and `idem fork` refuses them). Kept by default.
    #[arg(long, value_name = "AGE", value_parser = age)]
    history_before: Option<Duration>,
    /// Delete failed runs too (they are resumable: submitting one again resumes it,
    /// so by default they stay).
    #[arg(long)]
    include_failed: bool,
    /// Count what would be deleted, and delete nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

fn age(text: &str) -> Result<Duration, String> {
    ops::parse_age("the age", text).map_err(|e| e.to_string())
}

impl GcCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        let store = self.db.open_existing().await?;
        let req = GcRequest {
            finished_before: self.finished_before,
            dedupe_window: self.dedupe_window,
            include_failed: self.include_failed,
            history_before: self.history_before,
            dry_run: self.dry_run,
        };
        let report = ops::gc(store.as_ref(), &req)
            .await
            .map_err(op_error)
            .context("cannot collect garbage")?;
        if self.json {
            let value = serde_json::json!({ "dry_run": self.dry_run, "report": report });
            println!("{}", display::json(&value));
        } else {
            println!("{}", summary(&report, self.dry_run));
        }
        Ok(Exit::Done)
    }
}

/// One line per kind of row, after a line saying what was done.
fn summary(report: &GcReport, dry_run: bool) -> String {
    let verb = if dry_run { "would delete" } else { "deleted" };
    let mut text = format!("{verb} {} rows", report.total());
    for (n, what) in [
        (report.runs, "runs"),
        (report.results, "committed keys"),
        (report.claims, "uncommitted claims"),
        (report.checkpoints, "checkpoints"),
        (report.log_chunks, "log chunks"),
        (report.waits, "waits"),
        (report.signals, "signals"),
        (report.upgrades, "upgrade records"),
        (report.usage, "usage records"),
        (report.live_chunks, "live stream chunks"),
        (report.events, "timeline events"),
        (report.components, "components"),
        (report.blobs, "large values (blobs)"),
    ] {
        text += &format!("\n  {n:>8} {what}");
    }
    text
}
