//! Why an instance ended: one type, built in one place from whatever stopped the
//! guest (its return, a trap it caused, a trap the host raised on purpose, a limit, a
//! stop signal, the watchdog), and matched in one place by the run driver.

use super::faults::Recycle;
use super::limits::LimitExceeded;
use super::stop::Stop;
use crate::store::{Millis, StoreError};

/// A failure inside a host call that must end the instance (a trap), as opposed to a
/// `step-error` value the guest handles.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HostTrap {
    /// The store failed; the run stops with this error.
    #[error(transparent)]
    Store(StoreError),
    /// The agent parked an in-doubt claim: the run stops in doubt.
    #[error("run stopped in doubt at key {key}")]
    InDoubt {
        /// The key (qualified).
        key: String,
    },
}

/// The trap for a store failure inside a host call. A lost run lease is a stop, not a
/// failure: another holder drives the run now.
pub(crate) fn trap_store(e: StoreError) -> wasmtime::Error {
    match e {
        StoreError::LeaseLost { .. } => wasmtime::Error::new(Stop::LeaseLost),
        e => wasmtime::Error::new(HostTrap::Store(e)),
    }
}

/// The agent reached a wait that is not over: the instance ends, and the run holds no
/// instance and no lease until the wait is due.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the run waits{}{}{}", .signal.as_ref().map(|s| format!(" for signal {s:?}")).unwrap_or_default(), .join.as_ref().map(|k| format!(" for the children of join {k:?}")).unwrap_or_default(), .due.map(|d| format!(" until {d}")).unwrap_or_default())]
pub(crate) struct Suspend {
    /// When the wait is due without a signal (`None`: never).
    pub(crate) due: Option<Millis>,
    /// The signal it waits for, if any.
    pub(crate) signal: Option<String>,
    /// The key of the join it waits on, if any.
    pub(crate) join: Option<String>,
}

/// Why an instance ended.
#[derive(Debug)]
pub(crate) enum InstanceEnd {
    /// `run` returned this output.
    Returned(Vec<u8>),
    /// `run` returned this error.
    AgentError(String),
    /// The host dropped the instance on purpose (recycling, a crash point, chaos); the
    /// run goes on with a fresh one.
    Dropped(String),
    /// A limit ended it.
    Limit(LimitExceeded),
    /// `run` returned while the instance still held these claims (keys as the agent
    /// wrote them).
    ClaimsLeftOpen(Vec<String>),
    /// The agent stopped the run in doubt at this key.
    InDoubt(String),
    /// The guest trapped (panic, stack overflow, ...): the agent's error.
    Trapped(String),
    /// A signal from outside stopped it.
    Stopped(Stop),
    /// The agent waits: the run suspends until the wait is due.
    Suspended(Suspend),
    /// The store failed.
    Store(StoreError),
}

/// What the instance's fuel said when it ran out.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FuelState {
    /// The run's own fuel limit was reached (not just a chaos budget).
    pub(crate) run_budget_spent: bool,
    /// The run's fuel limit, if any.
    pub(crate) limit: Option<u64>,
    /// The fuel ran out on a chaos budget: a planned drop mid-computation.
    pub(crate) chaos: bool,
}

impl InstanceEnd {
    /// Classifies how a call of `run` (instantiation included) ended.
    pub(crate) fn classify(
        result: wasmtime::Result<Result<Vec<u8>, String>>,
        fuel: FuelState,
    ) -> InstanceEnd {
        let trap = match result {
            Ok(Ok(output)) => return InstanceEnd::Returned(output),
            Ok(Err(message)) => return InstanceEnd::AgentError(message),
            Err(trap) => trap,
        };
        if trap.downcast_ref::<wasmtime::Trap>() == Some(&wasmtime::Trap::OutOfFuel) {
            if fuel.run_budget_spent {
                return InstanceEnd::Limit(LimitExceeded::Fuel {
                    limit: fuel.limit.unwrap_or(0),
                });
            }
            if fuel.chaos {
                return InstanceEnd::Dropped("chaos fuel budget ran out".into());
            }
        }
        if let Some(drop) = trap.downcast_ref::<Recycle>() {
            return InstanceEnd::Dropped(drop.reason.clone());
        }
        if let Some(wasmtime::component::ResourceTableError::Full) =
            trap.downcast_ref::<wasmtime::component::ResourceTableError>()
        {
            return InstanceEnd::Limit(LimitExceeded::Handles);
        }
        if let Some(limit) = trap.downcast_ref::<LimitExceeded>() {
            return InstanceEnd::Limit(limit.clone());
        }
        if let Some(stop) = trap.downcast_ref::<Stop>() {
            return InstanceEnd::Stopped(*stop);
        }
        if let Some(suspend) = trap.downcast_ref::<Suspend>() {
            return InstanceEnd::Suspended(suspend.clone());
        }
        match trap.downcast::<HostTrap>() {
            Ok(HostTrap::Store(e)) => InstanceEnd::Store(e),
            Ok(HostTrap::InDoubt { key }) => InstanceEnd::InDoubt(key),
            // A trap the guest caused (panic, unreachable, stack overflow) is the
            // agent's error, not the host's.
            Err(trap) => InstanceEnd::Trapped(trap_message(&trap)),
        }
    }
}

/// The run's error text for a trap the guest caused: the trap's cause and what it
/// usually means, without the wasm backtrace (logged at debug level instead).
fn trap_message(trap: &wasmtime::Error) -> String {
    tracing::debug!(trap = format!("{trap:?}"), "agent trapped");
    let Some(code) = trap.downcast_ref::<wasmtime::Trap>() else {
        return format!("agent trapped: {}", trap.root_cause());
    };
    let hint = match code {
        wasmtime::Trap::UnreachableCodeReached => {
            " (the agent aborted: a panic or an uncaught exception; its message is in the \
             run's log)"
        }
        wasmtime::Trap::MemoryOutOfBounds => {
            " (an out-of-bounds access; in languages that keep their stack in linear \
             memory, such as Rust, often a stack overflow)"
        }
        wasmtime::Trap::StackOverflow => " (stack overflow: the call stack is exhausted)",
        _ => "",
    };
    format!("agent trapped: {code}{hint}")
}
