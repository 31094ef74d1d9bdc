//! The `idem` subcommands, one file each, and the exit codes they share.

mod args;
mod resolve;
mod run;
mod status;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use idem::runtime::HostError;
use idem::store::StoreError;

/// Runs WebAssembly agents whose side effects happen exactly once.
#[derive(Debug, Parser)]
#[command(name = "idem", version, about, long_about = None)]
pub struct Args {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run (or resume) an agent to completion.
    // Boxed: its many options would make every `Command` as large as a run's.
    Run(Box<run::RunCommand>),
    /// Show runs, their progress, counts and open claims.
    Status(status::StatusCommand),
    /// Settle a key that a run parked in doubt, so that the run can resume.
    Resolve(resolve::ResolveCommand),
}

impl Command {
    pub fn execute(self) -> anyhow::Result<Exit> {
        match self {
            Command::Run(cmd) => cmd.execute(),
            Command::Status(cmd) => cmd.execute(),
            Command::Resolve(cmd) => cmd.execute(),
        }
    }
}

/// The exit codes of `idem`, documented in the README.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The run completed (or the command did what was asked).
    Done = 0,
    /// The agent returned an error (or trapped); committed steps are kept and running
    /// the same run again resumes it.
    AgentFailed = 1,
    /// Bad input: arguments, the agent file, the run's input. Nothing was changed.
    BadInput = 2,
    /// The store failed or cannot be opened.
    Store = 3,
    /// The host failed (engine, or a run that kept being dropped).
    Host = 4,
    /// The run is stopped in doubt: `idem resolve` settles its parked keys.
    InDoubt = 5,
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> Self {
        ExitCode::from(e as u8)
    }
}

/// An error in what the user asked for, found before anything ran.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadInput(pub String);

impl Exit {
    /// The exit code for an error, from the first typed error in its chain.
    pub fn classify(err: &anyhow::Error) -> Exit {
        for cause in err.chain() {
            if cause.is::<BadInput>() {
                return Exit::BadInput;
            }
            if let Some(e) = cause.downcast_ref::<HostError>() {
                return match e {
                    HostError::Store(e) => Exit::for_store(e),
                    HostError::TooManyInstances { .. } | HostError::Engine(_) => Exit::Host,
                    HostError::InDoubt { .. } => Exit::InDoubt,
                    _ => Exit::BadInput,
                };
            }
            if let Some(e) = cause.downcast_ref::<StoreError>() {
                return Exit::for_store(e);
            }
        }
        Exit::Host
    }

    fn for_store(e: &StoreError) -> Exit {
        match e {
            StoreError::InputMismatch { .. } | StoreError::NotInDoubt { .. } => Exit::BadInput,
            _ => Exit::Store,
        }
    }
}
