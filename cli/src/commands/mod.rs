//! The `idem` subcommands, one file each, and the dispatcher that runs the one asked
//! for. What they share lives beside them (`args`, `display`) or at the crate's root
//! (`crate::exit`, `crate::hint`, `crate::shutdown`), never here.

mod args;
mod cancel;
mod deploy;
mod display;
mod flow;
mod fork;
mod gc;
mod generate;
mod logs;
mod ls;
mod new;
mod pause;
mod progress;
mod prove;
mod rate;
mod rekey;
mod resolve;
mod resume;
mod run;
mod schedule;
mod serve;
mod show;
mod signal;
mod status;
mod submit;
mod usage;
mod versions;
mod worker;

use clap::{CommandFactory, Parser, Subcommand};

use crate::exit::Exit;

/// Runs WebAssembly agents whose side effects happen exactly once.
#[derive(Debug, Parser)]
#[command(name = "idem", version = env!("IDEM_VERSION"), about, long_about = None)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run (or resume) an agent to completion in this process.
    // Boxed: its many options would make every `Command` as large as a run's.
    Run(Box<run::RunCommand>),
    /// Store an agent in the store under a name, with what its runs may reach.
    Deploy(Box<deploy::DeployCommand>),
    /// List each deployment's versions and how many runs are on each.
    Deployments(versions::DeploymentsCommand),
    /// Move runs of a deployment that have not ended to one of its versions (at their
    /// next instance).
    Upgrade(versions::UpgradeCommand),
    /// Move runs of a deployment back to the version each was on before its last move.
    Rollback(versions::RollbackCommand),
    /// Queue a run of a deployed agent for workers; returns at once.
    Submit(Box<submit::SubmitCommand>),
    /// Lease queued runs from the store and drive them until stopped.
    Worker(worker::WorkerCommand),
    /// Limit a deployment's running runs, in all and per concurrency key.
    Flow(flow::FlowCommand),
    /// Limit a class of steps (`llm`) to a rate shared by every worker and run.
    Rate(rate::RateCommand),
    /// List runs.
    Ls(ls::LsCommand),
    /// Show one run: its lease, steps, open claims.
    Show(show::ShowCommand),
    /// Start a new run from the checkpoint a run saved before one of its steps, reusing
    /// the results committed before it; later steps run again under the fork's keys.
    Fork(fork::ForkCommand),
    /// Cancel a run.
    Cancel(cancel::CancelCommand),
    /// Pause runs, or a deployment: no worker takes them until they are resumed.
    Pause(pause::PauseCommand),
    /// Resume paused runs, or a paused deployment: they go on where they stopped.
    Resume(resume::ResumeCommand),
    /// Send a signal to a run (one waiting for it wakes at once).
    Signal(signal::SignalCommand),
    /// Print a run's log (what its agent wrote to stderr and stdout); with `-f`, follow it and
    /// the run's live stream until the run ends.
    Logs(logs::LogsCommand),
    /// Sum the token usage of model calls per deployment and model (spent, and saved by
    /// replays), priced by an optional table.
    Usage(usage::UsageCommand),
    /// Show runs, their progress, counts and open claims (`ls` and `show` in one).
    Status(status::StatusCommand),
    /// Settle a key that a run parked in doubt, so that the run can resume.
    Resolve(resolve::ResolveCommand),
    /// Start runs of a deployment on a cron expression or an interval: create, list,
    /// show, pause, resume and delete schedules (workers fire their ticks).
    #[command(subcommand)]
    Schedule(schedule::ScheduleCommand),
    /// Serve the JSON HTTP API, the web page of runs and `/metrics` over a store.
    Serve(Box<serve::ServeCommand>),
    /// Delete finished runs and what only they used, keeping what live runs and the
    /// dedupe window need.
    Gc(gc::GcCommand),
    /// Rotate the key of a store encrypted at rest (its data keys rewrapped; no value
    /// rewritten).
    Rekey(rekey::RekeyCommand),
    /// Crash-test an agent at every crash point in scratch stores, and report what broke.
    Prove(Box<prove::ProveCommand>),
    /// Write a new agent project (Rust or Python) ready to build, run and prove.
    New(new::NewCommand),
    /// Print the completion script of a shell for idem.
    Completions(generate::CompletionsCommand),
    /// Print idem's man page (or write a page per command into a directory).
    Man(generate::ManCommand),
    /// Print this reference, in Markdown, as docs/reference/cli.md holds it.
    #[command(hide = true)]
    CliReference(generate::CliReferenceCommand),
}

impl Command {
    /// The level logged at unless `IDEM_LOG` says otherwise.
    pub fn log_level(&self) -> &'static str {
        match self {
            // A proof crashes the agent on purpose hundreds of times: the warnings each
            // crash would log are its findings, reported as such at the end.
            Command::Prove(_) => "error",
            _ => "warn",
        }
    }

    /// Runs the subcommand.
    pub async fn execute(self) -> anyhow::Result<Exit> {
        match self {
            Command::Run(cmd) => cmd.execute().await,
            Command::Deploy(cmd) => cmd.execute().await,
            Command::Deployments(cmd) => cmd.execute().await,
            Command::Upgrade(cmd) => cmd.execute().await,
            Command::Rollback(cmd) => cmd.execute().await,
            Command::Submit(cmd) => cmd.execute().await,
            Command::Worker(cmd) => cmd.execute().await,
            Command::Flow(cmd) => cmd.execute().await,
            Command::Rate(cmd) => cmd.execute().await,
            Command::Ls(cmd) => cmd.execute().await,
            Command::Show(cmd) => cmd.execute().await,
            Command::Fork(cmd) => cmd.execute().await,
            Command::Usage(cmd) => cmd.execute().await,
            Command::Cancel(cmd) => cmd.execute().await,
            Command::Pause(cmd) => cmd.execute().await,
            Command::Resume(cmd) => cmd.execute().await,
            Command::Signal(cmd) => cmd.execute().await,
            Command::Logs(cmd) => cmd.execute().await,
            Command::Status(cmd) => cmd.execute().await,
            Command::Resolve(cmd) => cmd.execute().await,
            Command::Schedule(cmd) => cmd.execute().await,
            Command::Serve(cmd) => cmd.execute().await,
            Command::Gc(cmd) => cmd.execute().await,
            Command::Rekey(cmd) => cmd.execute().await,
            Command::Prove(cmd) => cmd.execute().await,
            Command::New(cmd) => cmd.execute().await,
            Command::Completions(cmd) => cmd.execute(Args::command()),
            Command::Man(cmd) => cmd.execute(Args::command()),
            Command::CliReference(cmd) => cmd.execute(Args::command()),
        }
    }
}
