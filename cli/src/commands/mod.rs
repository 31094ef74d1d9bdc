//! The `idem` subcommands, one file each, the exit codes they share, and the hints
//! that turn the library's typed errors into what to type next.

mod args;
mod cancel;
mod deploy;
mod display;
mod gc;
mod logs;
mod ls;
mod progress;
mod prove;
mod resolve;
mod run;
mod serve;
mod show;
mod signal;
mod status;
mod submit;
mod worker;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use idem::ops::OpError;
use idem::prove::ProveError;
use idem::runtime::{AuthorityError, HostError};
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
    /// Run (or resume) an agent to completion in this process.
    // Boxed: its many options would make every `Command` as large as a run's.
    Run(Box<run::RunCommand>),
    /// Store an agent in the store under a name, with what its runs may reach.
    Deploy(Box<deploy::DeployCommand>),
    /// Queue a run of a deployed agent for workers; returns at once.
    Submit(Box<submit::SubmitCommand>),
    /// Lease queued runs from the store and drive them until stopped.
    Worker(worker::WorkerCommand),
    /// List runs.
    Ls(ls::LsCommand),
    /// Show one run: its lease, steps, open claims.
    Show(show::ShowCommand),
    /// Cancel a run.
    Cancel(cancel::CancelCommand),
    /// Send a signal to a run (one waiting for it wakes at once).
    Signal(signal::SignalCommand),
    /// Print a run's log (what its agent wrote to stderr and stdout).
    Logs(logs::LogsCommand),
    /// Show runs, their progress, counts and open claims (`ls` and `show` in one).
    Status(status::StatusCommand),
    /// Settle a key that a run parked in doubt, so that the run can resume.
    Resolve(resolve::ResolveCommand),
    /// Serve the JSON HTTP API, the web page of runs and `/metrics` over a store.
    Serve(Box<serve::ServeCommand>),
    /// Delete finished runs and what only they used, keeping what live runs and the
    /// dedupe window need.
    Gc(gc::GcCommand),
    /// Crash-test an agent at every crash point in scratch stores, and report what broke.
    Prove(Box<prove::ProveCommand>),
}

impl Command {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        match self {
            Command::Run(cmd) => cmd.execute().await,
            Command::Deploy(cmd) => cmd.execute().await,
            Command::Submit(cmd) => cmd.execute().await,
            Command::Worker(cmd) => cmd.execute().await,
            Command::Ls(cmd) => cmd.execute().await,
            Command::Show(cmd) => cmd.execute().await,
            Command::Cancel(cmd) => cmd.execute().await,
            Command::Signal(cmd) => cmd.execute().await,
            Command::Logs(cmd) => cmd.execute().await,
            Command::Status(cmd) => cmd.execute().await,
            Command::Resolve(cmd) => cmd.execute().await,
            Command::Serve(cmd) => cmd.execute().await,
            Command::Gc(cmd) => cmd.execute().await,
            Command::Prove(cmd) => cmd.execute().await,
        }
    }
}

/// The exit codes of `idem`, documented in the README.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// The run completed (or the command did what was asked).
    Done = 0,
    /// The agent returned an error (or trapped, or hit a limit); committed steps are
    /// kept and running the same run again resumes it.
    AgentFailed = 1,
    /// Bad input: arguments, the agent file, the run's input. Nothing was changed.
    BadInput = 2,
    /// The store failed or cannot be opened.
    Store = 3,
    /// The host failed (engine, a run that kept being dropped, a lease taken over).
    Host = 4,
    /// The run is stopped in doubt: `idem resolve` settles its parked keys.
    InDoubt = 5,
    /// The run was cancelled.
    Cancelled = 6,
    /// `idem prove` found violations.
    Violations = 7,
    /// `idem run` was interrupted; the run was given back, to be resumed.
    Interrupted = 130,
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
            // Its variants are transparent: the error they wrap is not in the chain.
            if let Some(e) = cause.downcast_ref::<ProveError>() {
                return match e {
                    ProveError::Host(HostError::Store(e)) | ProveError::Store(e) => {
                        Exit::for_store(e)
                    }
                    ProveError::Host(HostError::Engine(_) | HostError::NoRuntime) => Exit::Host,
                    ProveError::Host(_) => Exit::BadInput,
                    _ => Exit::Host,
                };
            }
            if let Some(e) = cause.downcast_ref::<HostError>() {
                return match e {
                    HostError::Store(e) => Exit::for_store(e),
                    HostError::TooManyInstances { .. }
                    | HostError::Engine(_)
                    | HostError::LeaseLost { .. }
                    | HostError::NoRuntime => Exit::Host,
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
            StoreError::InputMismatch { .. }
            | StoreError::NotInDoubt { .. }
            | StoreError::UnknownRun { .. }
            | StoreError::RunFinished { .. }
            | StoreError::UnknownComponent { .. }
            | StoreError::NamespaceTaken { .. }
            | StoreError::WaitRefused { .. }
            | StoreError::SignalRefused { .. } => Exit::BadInput,
            StoreError::LeaseLost { .. } => Exit::Host,
            _ => Exit::Store,
        }
    }
}

/// A shared operation's error as the commands report it: the store's and the host's
/// errors as themselves (so [`Exit::classify`] and [`hint`] find them), the rest as
/// bad input.
pub fn op_error(e: OpError) -> anyhow::Error {
    match e {
        OpError::Store(e) => e.into(),
        OpError::Host(e) => e.into(),
        other => BadInput(other.to_string()).into(),
    }
}

/// What to type next, for an error the library names in its own terms.
pub fn hint(err: &anyhow::Error) -> Option<String> {
    for cause in err.chain() {
        if let Some(e) = cause.downcast_ref::<HostError>() {
            return match e {
                HostError::Pinned { .. } => {
                    Some("pass --upgrade to resume the run with this component".into())
                }
                HostError::NamespaceMismatch { run_id, pinned, .. } => Some(format!(
                    "resume it with --namespace {} (or leave --namespace out)",
                    idem::text::escape(pinned, false)
                ))
                .filter(|_| !run_id.is_empty()),
                HostError::InDoubt { run_id, .. } => Some(format!(
                    "settle each key with `idem resolve {} KEY --result JSON` (the effect \
                     happened) or `--retry` (it did not), then run it again",
                    idem::text::escape(run_id, false)
                )),
                HostError::Authority(AuthorityError::Wider { .. }) => Some(
                    "a submission may only narrow what its deployment allows; deploy the \
                     agent again with the wider grant first"
                        .into(),
                ),
                HostError::Store(e) => store_hint(e),
                HostError::Cache(_) => Some(
                    "run with --no-cache, or make the directory private: yours, mode 700, below \
                     directories that only you or root can write to (or sticky ones, like /tmp)"
                        .into(),
                ),
                _ => None,
            };
        }
        if let Some(e) = cause.downcast_ref::<StoreError>() {
            return store_hint(e);
        }
    }
    None
}

fn store_hint(e: &StoreError) -> Option<String> {
    match e {
        StoreError::InputMismatch { .. } => {
            Some("a run id names one input: use another --run-id for other input".into())
        }
        StoreError::NamespaceTaken { namespace, .. } => Some(format!(
            "if this is a new build of that agent, deploy it there explicitly (`idem deploy \
             AGENT.wasm --name {ns}`) or pass --upgrade; otherwise pick another --namespace",
            ns = idem::text::escape(namespace, false)
        )),
        StoreError::LeaseLost { .. } => {
            Some("another worker drives the run now; `idem show RUN` says which".into())
        }
        _ => None,
    }
}
