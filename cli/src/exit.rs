//! The exit codes `idem` documents, and how an error maps to one: from the first typed
//! error of the library (or [`BadInput`] of the CLI's own) in its chain.

use std::process::ExitCode;

use idem::ops::OpError;
use idem::prove::ProveError;
use idem::runtime::HostError;
use idem::store::{SealError, StoreError};

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
    /// `idem prove` found violations, or `idem upgrade --dry-run` runs the upgrade
    /// would break.
    Violations = 7,
    /// `idem run` was interrupted; the run was given back, to be resumed. Also the code
    /// of a second signal, which ends any command at once (`crate::shutdown`).
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
            e if e.is_refusal() => Exit::BadInput,
            StoreError::LeaseLost { .. } => Exit::Host,
            // The key given (or missing) is the user's to fix; a value that does not
            // open is the store's.
            StoreError::Sealing(
                SealError::Unreadable { .. } | SealError::UnknownDataKey { .. },
            ) => Exit::Store,
            StoreError::Sealing(_) => Exit::BadInput,
            _ => Exit::Store,
        }
    }
}

/// A shared operation's error as the commands report it: the store's and the host's
/// errors as themselves (so [`Exit::classify`] and [`crate::hint::for_error`] find
/// them), the rest as bad input.
pub fn op_error(e: OpError) -> anyhow::Error {
    match e {
        OpError::Store(e) => e.into(),
        OpError::Host(e) => e.into(),
        OpError::Prove(e) => (*e).into(),
        other => BadInput(other.to_string()).into(),
    }
}
