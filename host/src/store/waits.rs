//! The values of durable waits: sleeps and signals a run waits on while it holds no
//! instance and no lease ([`InstanceStore::wait`],
//! [`WorkerStore::suspend_run`],
//! [`OperatorStore::send_signal`]).

use std::time::Duration;

use super::{ChildEnd, JoinMode, Millis, RunFence};
#[cfg(doc)]
use super::{InstanceStore, OperatorStore, WorkerStore};

/// The longest a run may sleep or wait for a signal: 100 years. Anything longer is a
/// mistake (a unit confused, a negative number wrapped), refused rather than kept.
pub const MAX_WAIT: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The longest signal name accepted.
pub const MAX_SIGNAL_NAME_BYTES: usize = 128;

/// When a sleep ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// This long after the sleep was first reached, on the store's clock.
    After(Duration),
    /// At this time on the store's clock.
    At(Millis),
}

/// What a wait waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitKind<'a> {
    /// A time.
    Sleep(Wake),
    /// A signal called `name`, for at most `timeout` (`None`: for ever).
    Signal {
        /// The signal's name.
        name: &'a str,
        /// How long to wait for it, from when the wait was first reached.
        timeout: Option<Duration>,
    },
    /// A token of the rate-limited class `class` ([`RateSetting`](super::RateSetting)):
    /// due when the token reserved for it at its first reach is free (at once where the
    /// class has no limit).
    Rate {
        /// The class.
        class: &'a str,
    },
}

/// The key a step's rate token is recorded under among its run's waits
/// ([`WaitKind::Rate`]): one format, whether the step takes its token with its claim
/// or on its own (`take-token`), so that a replay finds the token either way.
pub fn rate_wait_key(step_key: &str) -> String {
    format!("rate:{step_key}")
}

/// A wait of a run, recorded under a key of that run: [`InstanceStore::wait`].
#[derive(Debug, Clone)]
pub struct WaitRequest<'a> {
    /// The run and its lease.
    pub fence: &'a RunFence,
    /// The wait's key, unique within the run (keys of other runs are apart).
    pub key: &'a str,
    /// What it waits for.
    pub kind: WaitKind<'a>,
}

/// Where a wait stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitState {
    /// The sleep's time has come.
    Elapsed,
    /// The signal was received (now, or when the wait was first reached): its payload.
    Received(Vec<u8>),
    /// The signal's (or the join's) timeout passed first.
    TimedOut,
    /// The join got its children: every child listed, in order (`All`), or the one
    /// that ended first (`Any`).
    Joined(Vec<ChildEnd>),
    /// Not over: due at this time (`None`: only a signal ends it).
    Pending {
        /// When it is due on the store's clock, if ever without a signal.
        due: Option<Millis>,
    },
}

/// What a suspended run waits for: [`WorkerStore::suspend_run`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Suspension<'a> {
    /// When it is due without a signal (`None`: never).
    pub due: Option<Millis>,
    /// The signal that makes it due at once, if it waits for one.
    pub signal: Option<&'a str>,
    /// The key of the join it waits on, if it does: it is due at once when the join's
    /// children have ended (all of them, or one for a join of any).
    pub join: Option<&'a str>,
}

/// A wait as `idem show` lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WaitRecord {
    /// The wait's key.
    pub key: String,
    /// The signal waited for; `None` for a sleep or a join.
    pub signal: Option<String>,
    /// For a join, whether it waits for `all` its children or `any`.
    pub join: Option<String>,
    /// For a rate token, its class.
    pub rate: Option<String>,
    /// For a join, how many children it lists.
    pub join_children: Option<u64>,
    /// When the sleep ends or the signal wait times out (`None`: never).
    pub due: Option<Millis>,
    /// When the wait was first reached.
    pub created: Millis,
    /// How a signal wait ended (`received`, `timed-out`), if it did.
    pub outcome: Option<String>,
    /// When it ended, if it did.
    pub settled: Option<Millis>,
}

/// A join of children, recorded under a key of the parent run as a wait is:
/// [`InstanceStore::join`].
#[derive(Debug, Clone)]
pub struct JoinRequest<'a> {
    /// The parent run and its lease.
    pub fence: &'a RunFence,
    /// The join's key, among the run's waits.
    pub key: &'a str,
    /// The children, each a run this run spawned, in the order the answer keeps.
    pub children: &'a [String],
    /// Wait for all of them, or the first to end.
    pub mode: JoinMode,
    /// How long to wait, from when the join was first reached (`None`: for ever).
    pub timeout: Option<std::time::Duration>,
    /// The most children one join may list.
    pub max_children: u32,
}

/// Why a join was refused. Nothing was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JoinRefusal {
    /// The list of children is empty.
    #[error("a join needs at least one child")]
    NoChildren,
    /// More children than a join may list.
    #[error("a join lists {count} children, over the limit of {max}")]
    TooMany {
        /// How many were listed.
        count: usize,
        /// The limit.
        max: u32,
    },
    /// A child listed twice.
    #[error("child {} is listed twice", crate::text::quoted(.0))]
    Repeated(String),
    /// A run that is not a child of this run (or no run at all).
    #[error("run {} is not a child of this run", crate::text::quoted(.0))]
    NotAChild(String),
    /// The key was used by another wait, or by a join of other children or mode.
    #[error("{0}")]
    KeyReused(String),
    /// The timeout is beyond what a store keeps.
    #[error("{0}")]
    InvalidTime(String),
}

/// What [`OperatorStore::send_signal`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignalSent {
    /// The signal's sequence number within the store.
    pub id: u64,
    /// The run was waiting for this signal: it is due now.
    pub woke: bool,
}

/// Whether a signal's payload of `len` bytes is within `max` (the state limit): the
/// refusal's reason if not.
pub(crate) fn check_signal_payload(len: usize, max: usize) -> Result<(), String> {
    if len > max {
        return Err(format!(
            "its payload is {len} bytes, over the state limit of {max} bytes"
        ));
    }
    Ok(())
}

/// Checks a signal name: 1 to 128 bytes of visible text.
pub fn check_signal_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("a signal name must not be empty".into());
    }
    if name.len() > MAX_SIGNAL_NAME_BYTES {
        return Err(format!(
            "signal name is {} bytes, over the limit of {MAX_SIGNAL_NAME_BYTES}",
            name.len()
        ));
    }
    crate::text::check_visible(name)
        .map_err(|hidden| format!("signal name holds {hidden}; use visible text"))
}
