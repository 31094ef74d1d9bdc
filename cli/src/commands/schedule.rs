//! `idem schedule`: runs of a deployment started on a cron expression (in a time zone)
//! or at a fixed interval. `create` checks everything before writing; `ls`, `show`,
//! `pause`, `resume` and `delete` act on the store. Workers fire the ticks: there is no
//! scheduler process to run.

use clap::{Args, Parser, Subcommand};
use idem::ops::{self, ScheduleRequest, ScheduleView};
use idem::store::{Millis, Overlap, ScheduleRecord, ScheduleSpec};

use super::args::{DbArgs, json_or_file};
use super::display;
use crate::exit::{BadInput, Exit, op_error};

#[derive(Debug, Subcommand)]
pub enum ScheduleCommand {
    /// Create a schedule: each tick starts one run of the deployment, whose id is
    /// `<NAME>@<tick, RFC 3339 UTC>`.
    Create(Box<CreateCommand>),
    /// List schedules: their spec, state, next tick and tick counts.
    Ls(LsCommand),
    /// Show one schedule: its definition, next ticks, counts and latest run.
    Show(NamedCommand),
    /// Pause a schedule: no tick fires until it is resumed.
    Pause(NamedCommand),
    /// Resume a paused schedule from now (the ticks that fell while paused are not run).
    Resume(NamedCommand),
    /// Delete a schedule; the runs it started stay.
    Delete(NamedCommand),
}

#[derive(Debug, Parser)]
pub struct CreateCommand {
    /// The schedule's name, unique in the store (no '/' or '@').
    name: String,
    /// The deployment each tick starts a run of (the component the name points at
    /// when the tick fires).
    #[arg(long, value_name = "NAME")]
    deployment: String,
    #[command(flatten)]
    when: When,
    /// The time zone the cron expression is read in (IANA, as `Europe/Paris`).
    #[arg(long, value_name = "ZONE", default_value = "UTC", requires = "cron")]
    tz: String,
    /// The input of every run, as JSON, or `@FILE` to read it from a file (`@-`: stdin).
    #[arg(long, default_value = "null", allow_negative_numbers = true)]
    input: String,
    /// When workers were down past some ticks: start the latest and up to N of the
    /// missed ones before it (oldest first). The default starts only the latest.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 0,
        conflicts_with = "skip_missed"
    )]
    catch_up: u32,
    /// Start only the latest of the ticks missed (the default, said out loud).
    #[arg(long)]
    skip_missed: bool,
    /// What a tick does while the previous tick's run is still queued or running: skip
    /// the tick, allow the runs to overlap, or cancel the previous run.
    #[arg(long, value_name = "POLICY", default_value = "skip", value_parser = parse_overlap)]
    overlap: Overlap,
    #[command(flatten)]
    db: DbArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// When the schedule ticks: one of `--cron` and `--every`.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
struct When {
    /// A cron expression: 5 fields (minute hour day-of-month month day-of-week), or 6
    /// with seconds first; `L`, `W` and `#` as croner reads them.
    #[arg(long, value_name = "EXPR")]
    cron: Option<String>,
    /// A fixed interval, aligned to the Unix epoch (`1h` ticks on the hour): a whole
    /// number and a unit, `ms`, `s`, `m`, `h` or `d`; at least 100ms, at most 366d.
    #[arg(long, value_name = "DURATION")]
    every: Option<String>,
}

fn parse_overlap(s: &str) -> Result<Overlap, String> {
    s.parse()
}

#[derive(Debug, Parser)]
pub struct LsCommand {
    #[command(flatten)]
    db: DbArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Parser)]
pub struct NamedCommand {
    /// The schedule.
    name: String,
    #[command(flatten)]
    db: DbArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

impl ScheduleCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        match self {
            ScheduleCommand::Create(cmd) => cmd.execute().await,
            ScheduleCommand::Ls(cmd) => cmd.execute().await,
            ScheduleCommand::Show(cmd) => cmd.show().await,
            ScheduleCommand::Pause(cmd) => cmd.pause(true).await,
            ScheduleCommand::Resume(cmd) => cmd.pause(false).await,
            ScheduleCommand::Delete(cmd) => cmd.delete().await,
        }
    }
}

impl CreateCommand {
    async fn execute(self) -> anyhow::Result<Exit> {
        let spec = match (&self.when.cron, &self.when.every) {
            (Some(expr), _) => ScheduleSpec::Cron {
                expr: expr.clone(),
                tz: self.tz.clone(),
            },
            (None, Some(every)) => ScheduleSpec::Every {
                every_ms: ops::parse_every(every).map_err(|e| BadInput(format!("--every: {e}")))?,
            },
            (None, None) => unreachable!("clap requires --cron or --every"),
        };
        // Checked before the store is opened: a mistake in the spec is named with its
        // flag, and nothing is touched.
        let now = idem::store::Clock::system().now();
        spec.check(now)
            .map_err(|e| BadInput(format!("{}: {e}", spec_flag(&spec, &e))))?;
        let input = json_or_file("--input", &self.input)?;
        let store = self.db.open_existing().await?;
        let record = ops::create_schedule(
            store.as_ref(),
            &ScheduleRequest {
                name: &self.name,
                deployment: &self.deployment,
                spec,
                input: &input,
                catch_up: self.catch_up,
                overlap: self.overlap,
            },
        )
        .await
        .map_err(op_error)?;
        if self.json {
            let view = ScheduleView::of(store.as_ref(), &record.name).await?;
            println!("{}", display::json(&serde_json::to_value(&view)?));
        } else {
            let next = record
                .next_tick
                .map_or_else(|| "never".to_owned(), display::utc);
            println!(
                "created schedule {} ({}): runs of {}, next tick {next}",
                display::name(&record.name),
                ops::spec_text(&record.spec),
                display::name(&record.deployment)
            );
        }
        Ok(Exit::Done)
    }
}

/// The flag a spec error is about.
fn spec_flag(spec: &ScheduleSpec, e: &idem::store::SpecError) -> &'static str {
    match (spec, e) {
        (_, idem::store::SpecError::TimeZone { .. }) => "--tz",
        (ScheduleSpec::Every { .. }, _) => "--every",
        _ => "--cron",
    }
}

impl LsCommand {
    async fn execute(self) -> anyhow::Result<Exit> {
        let store = self.db.open_read_only().await?;
        let schedules = store.schedules().await?;
        if self.json {
            let now = store.now().await?;
            let doc = serde_json::json!({ "schedules": schedules, "now": now });
            println!("{}", display::json(&doc));
            return Ok(Exit::Done);
        }
        if schedules.is_empty() {
            println!("no schedules");
            return Ok(Exit::Done);
        }
        println!(
            "{:<20} {:<16} {:<28} {:<8} {:<21} {:>7} {:>7} {:>6} {:>6}",
            "NAME",
            "DEPLOYMENT",
            "WHEN",
            "STATE",
            "NEXT TICK",
            "STARTED",
            "SKIPPED",
            "MISSED",
            "FAILED"
        );
        for s in &schedules {
            println!("{}", row(s));
        }
        Ok(Exit::Done)
    }
}

fn row(s: &ScheduleRecord) -> String {
    let state = if s.paused { "paused" } else { "active" };
    let next = match (s.paused, s.next_tick) {
        (true, _) => "-".to_owned(),
        (false, Some(t)) => display::utc(t),
        (false, None) => "never".to_owned(),
    };
    format!(
        "{:<20} {:<16} {:<28} {:<8} {:<21} {:>7} {:>7} {:>6} {:>6}",
        display::name(&s.name),
        display::name(&s.deployment),
        display::name(&ops::spec_text(&s.spec)),
        state,
        next,
        s.ticks.started,
        s.ticks.skipped,
        s.ticks.missed,
        s.ticks.failed
    )
}

impl NamedCommand {
    async fn show(self) -> anyhow::Result<Exit> {
        let store = self.db.open_read_only().await?;
        let view = ScheduleView::of(store.as_ref(), &self.name).await?;
        if self.json {
            println!("{}", display::json(&serde_json::to_value(&view)?));
            return Ok(Exit::Done);
        }
        print_view(&view);
        Ok(Exit::Done)
    }

    async fn pause(self, paused: bool) -> anyhow::Result<Exit> {
        let store = self.db.open_existing().await?;
        let before = store.schedule(&self.name).await?;
        let record = store.pause_schedule(&self.name, paused).await?;
        let changed = before.is_some_and(|b| b.paused != paused);
        if self.json {
            let doc = serde_json::json!({ "schedule": record, "changed": changed });
            println!("{}", display::json(&doc));
            return Ok(Exit::Done);
        }
        let name = display::name(&record.name);
        match (paused, changed) {
            (true, true) => println!("paused schedule {name}"),
            (true, false) => println!("schedule {name} was paused already"),
            (false, true) => println!(
                "resumed schedule {name}: next tick {}",
                record
                    .next_tick
                    .map_or_else(|| "never".to_owned(), display::utc)
            ),
            (false, false) => println!("schedule {name} was not paused"),
        }
        Ok(Exit::Done)
    }

    async fn delete(self) -> anyhow::Result<Exit> {
        let store = self.db.open_existing().await?;
        store.delete_schedule(&self.name).await?;
        if self.json {
            let doc = serde_json::json!({ "deleted": self.name });
            println!("{}", display::json(&doc));
        } else {
            println!(
                "deleted schedule {} (the runs it started stay)",
                display::name(&self.name)
            );
        }
        Ok(Exit::Done)
    }
}

fn print_view(view: &ScheduleView) {
    let s = &view.schedule;
    let now: Millis = view.now;
    println!("schedule   {}", display::name(&s.name));
    println!("deployment {}", display::name(&s.deployment));
    println!("when       {}", display::name(&ops::spec_text(&s.spec)));
    println!("state      {}", if s.paused { "paused" } else { "active" });
    println!("input      {}", display::payload(&s.input));
    let catch_up = match s.catch_up {
        0 => "skip missed ticks (start only the latest)".to_owned(),
        n => format!("catch up to {n} missed ticks"),
    };
    println!("missed     {catch_up}");
    println!("overlap    {}", s.overlap);
    for (i, tick) in view.upcoming.iter().enumerate() {
        let label = if i == 0 { "next ticks" } else { "" };
        println!(
            "{label:<10} {} ({})",
            display::utc(*tick),
            display::until(now, *tick)
        );
    }
    let t = &s.ticks;
    println!(
        "ticks      started {}  skipped {}  missed {}  failed {}",
        t.started, t.skipped, t.missed, t.failed
    );
    if let Some(run) = &view.last_run {
        println!("last run   {} ({})", display::name(&run.run_id), run.status);
    } else if let Some(run_id) = &s.last_run {
        println!("last run   {} (collected)", display::name(run_id));
    }
    if let Some(error) = &s.last_error {
        println!("last error {}", display::name(error));
    }
    println!("created    {} ago", display::age(now, s.created));
}
