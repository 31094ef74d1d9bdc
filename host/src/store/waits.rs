//! The values of durable waits: sleeps and signals a run waits on while it holds no
//! instance and no lease ([`InstanceStore::wait`],
//! [`WorkerStore::suspend_run`],
//! [`OperatorStore::send_signal`]).

use std::time::Duration;

#[cfg(doc)]
use super::{InstanceStore, OperatorStore, WorkerStore};
use super::{Millis, RunFence};

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
    /// The signal's timeout passed first.
    TimedOut,
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
}

/// A wait as `idem show` lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WaitRecord {
    /// The wait's key.
    pub key: String,
    /// The signal waited for; `None` for a sleep.
    pub signal: Option<String>,
    /// When the sleep ends or the signal wait times out (`None`: never).
    pub due: Option<Millis>,
    /// When the wait was first reached.
    pub created: Millis,
    /// How a signal wait ended (`received`, `timed-out`), if it did.
    pub outcome: Option<String>,
    /// When it ended, if it did.
    pub settled: Option<Millis>,
}

/// What [`OperatorStore::send_signal`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SignalSent {
    /// The signal's sequence number within the store.
    pub id: u64,
    /// The run was waiting for this signal: it is due now.
    pub woke: bool,
}

/// The time a wait is due, from when it was first reached; `None` for an absurd one
/// (beyond [`MAX_WAIT`] or before the epoch).
pub(crate) fn due_at(now: Millis, kind: &WaitKind<'_>) -> Result<Option<Millis>, String> {
    let after = |d: Duration| -> Result<Millis, String> {
        if d > MAX_WAIT {
            return Err(format!(
                "{} s is longer than the longest wait a store keeps ({} s, 100 years)",
                d.as_secs(),
                MAX_WAIT.as_secs()
            ));
        }
        let ms = Millis::try_from(d.as_millis()).unwrap_or(Millis::MAX);
        Ok(now.saturating_add(ms))
    };
    match kind {
        WaitKind::Sleep(Wake::After(d)) => after(*d).map(Some),
        WaitKind::Sleep(Wake::At(at)) => {
            let latest = after(MAX_WAIT)?;
            if *at < 0 {
                Err(format!("time {at} ms is before the Unix epoch"))
            } else if *at > latest {
                Err(format!(
                    "time {at} ms is more than 100 years away (the longest wait a store keeps)"
                ))
            } else {
                Ok(Some(*at))
            }
        }
        WaitKind::Signal { timeout, .. } => timeout.map(after).transpose(),
    }
}

/// A wait as asked, checked: when it is due if it is new, and the signal it waits for
/// (`None` for a sleep).
pub(crate) struct Asked<'a> {
    pub(crate) due: Option<Millis>,
    pub(crate) signal: Option<&'a str>,
}

/// Checks a wait before anything is read or written: its time ([`due_at`]) and its
/// signal's name; the reason it is refused, if it is.
pub(crate) fn asked<'a>(now: Millis, kind: &WaitKind<'a>) -> Result<Asked<'a>, String> {
    let due = due_at(now, kind)?;
    let signal = match kind {
        WaitKind::Sleep(_) => None,
        WaitKind::Signal { name, .. } => {
            check_signal_name(name)?;
            Some(*name)
        }
    };
    Ok(Asked { due, signal })
}

/// A wait's row as a backend read it.
pub(crate) struct WaitRow {
    pub(crate) signal: Option<String>,
    pub(crate) due: Option<Millis>,
    pub(crate) outcome: Option<String>,
    pub(crate) payload: Option<Vec<u8>>,
}

/// Where a wait recorded before stands, before any signal is looked for.
pub(crate) enum Recorded {
    /// Over: the answer it gave when it settled, given again.
    Settled(WaitState),
    /// Not over: due at this time (`None`: only a signal ends it).
    Open(Option<Millis>),
}

impl WaitRow {
    /// Where the wait stands, asked again as `asked`; the reason it is refused if its
    /// key was used for another kind of wait.
    pub(crate) fn state(self, key: &str, asked: &Asked<'_>) -> Result<Recorded, String> {
        if self.signal.as_deref() != asked.signal {
            return Err(reused(key, self.signal.as_deref(), asked.signal));
        }
        Ok(match self.outcome.as_deref() {
            Some("received") => {
                Recorded::Settled(WaitState::Received(self.payload.unwrap_or_default()))
            }
            Some(_) => Recorded::Settled(WaitState::TimedOut),
            None => Recorded::Open(self.due),
        })
    }
}

/// Where an open sleep due at `due` stands at `now`.
pub(crate) fn sleep_state(due: Option<Millis>, now: Millis) -> WaitState {
    match due {
        Some(due) if due > now => WaitState::Pending { due: Some(due) },
        _ => WaitState::Elapsed,
    }
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

/// Why a wait's key cannot be used for this wait: it was used for another kind.
pub(crate) fn reused(key: &str, recorded: Option<&str>, wanted: Option<&str>) -> String {
    let kind = |signal: Option<&str>| match signal {
        None => "a sleep".to_string(),
        Some(name) => format!("a wait for signal {}", crate::text::quoted(name)),
    };
    format!(
        "key {} was used for {}, not {}; give each wait its own key",
        crate::text::quoted(key),
        kind(recorded),
        kind(wanted)
    )
}

/// A [`WaitKind`] that owns its name, to be sent to another thread.
#[derive(Debug, Clone)]
pub(crate) enum OwnedWaitKind {
    Sleep(Wake),
    Signal {
        name: String,
        timeout: Option<Duration>,
    },
}

impl OwnedWaitKind {
    pub(crate) fn new(kind: &WaitKind<'_>) -> Self {
        match *kind {
            WaitKind::Sleep(wake) => OwnedWaitKind::Sleep(wake),
            WaitKind::Signal { name, timeout } => OwnedWaitKind::Signal {
                name: name.to_owned(),
                timeout,
            },
        }
    }

    pub(crate) fn borrow(&self) -> WaitKind<'_> {
        match self {
            OwnedWaitKind::Sleep(wake) => WaitKind::Sleep(*wake),
            OwnedWaitKind::Signal { name, timeout } => WaitKind::Signal {
                name,
                timeout: *timeout,
            },
        }
    }
}
