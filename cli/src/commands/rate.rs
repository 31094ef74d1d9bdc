//! `idem rate`: rate limits on classes of steps, kept in the store and shared by every
//! worker and run. An agent names a step's class (`Once::new(&key).rate("llm")`,
//! `idem.run_once(key, fn, rate="llm")`); a step over its class's limit waits for its
//! token holding no instance.
//!
//! A command of its own rather than a flag of `idem flow`: `flow` limits a deployment's
//! runs, this limits steps of any deployment that name a class, as a model provider's
//! quota limits every agent that calls it.

use std::time::Duration;

use clap::{Parser, Subcommand};
use idem::store::{RateLimit, RateSetting};

use super::args::{DbArgs, duration};
use super::display;
use crate::exit::Exit;

#[derive(Debug, Parser)]
pub struct RateCommand {
    #[command(subcommand)]
    action: RateAction,
}

#[derive(Debug, Subcommand)]
enum RateAction {
    /// Limit a class of steps, replacing the limit it had.
    Set(SetArgs),
    /// Remove a class's limit: its steps start at once.
    Clear(ClearArgs),
    /// List the classes' limits.
    Ls(LsArgs),
}

#[derive(Debug, Parser)]
struct SetArgs {
    /// The class, as agents name it on their steps (`llm`).
    class: String,
    #[command(flatten)]
    db: DbArgs,
    /// At most this many steps of the class start per period, spaced evenly, across
    /// every worker and run.
    #[arg(long, value_name = "N")]
    limit: u32,
    /// The period the limit counts over (`1s`, `1m`, `1h`; at most a day).
    #[arg(long, value_name = "DURATION", value_parser = duration, default_value = "1m")]
    per: Duration,
    /// How many may start at once after the class was idle; 1 spaces every start
    /// evenly. In any window of one period, at most LIMIT + BURST - 1 steps start.
    #[arg(long, value_name = "N", default_value_t = 1)]
    burst: u32,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Parser)]
struct ClearArgs {
    /// The class.
    class: String,
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

impl RateCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        match self.action {
            RateAction::Set(args) => {
                let store = args.db.open_existing().await?;
                let limit = store
                    .set_rate(&RateSetting {
                        class: &args.class,
                        limit: args.limit,
                        period: args.per,
                        burst: args.burst,
                    })
                    .await?;
                if args.json {
                    println!("{}", display::json(&serde_json::to_value(&limit)?));
                } else {
                    println!("{}", describe(&limit));
                }
            }
            RateAction::Clear(args) => {
                let store = args.db.open_existing().await?;
                if store.clear_rate(&args.class).await? {
                    println!("cleared the rate limit of {}", display::name(&args.class));
                } else {
                    println!("{} had no rate limit", display::name(&args.class));
                }
            }
            RateAction::Ls(args) => {
                let store = args.db.open_read_only().await?;
                let all = store.rates().await?;
                if args.json {
                    println!("{}", display::json(&serde_json::to_value(&all)?));
                } else if all.is_empty() {
                    println!("no class has a rate limit");
                } else {
                    for limit in &all {
                        println!("{}", describe(limit));
                    }
                }
            }
        }
        Ok(Exit::Done)
    }
}

/// One line saying a class's limit and when its next token is free.
fn describe(limit: &RateLimit) -> String {
    let mut line = format!(
        "{}: at most {} per {}",
        display::name(&limit.class),
        limit.limit,
        period(limit.period_ms)
    );
    if limit.burst > 1 {
        line.push_str(&format!(", {} at once", limit.burst));
    }
    if let Some(at) = limit.next_free {
        line.push_str(&format!("; tokens reserved until {}", display::utc(at)));
    }
    line
}

/// A period as `--per` takes it: in the largest unit that divides it.
fn period(ms: u64) -> String {
    match ms {
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1_000 == 0 => format!("{}s", ms / 1_000),
        ms => format!("{ms}ms"),
    }
}
