//! The rules of durable waits both backends keep: when a wait is due, which waits are
//! refused, and where a recorded wait stands. A backend reads the wait's row and
//! writes what these say.

use std::time::Duration;

use crate::store::{
    JoinMode, JoinRefusal, MAX_WAIT, Millis, SyncMode, WaitKind, WaitState, Wake, check_class_name,
    check_signal_name,
};

/// The time a wait is due, from when it was first reached; `None` for an absurd one
/// (beyond [`MAX_WAIT`] or before the epoch).
pub(crate) fn due_at(now: Millis, kind: &WaitKind<'_>) -> Result<Option<Millis>, String> {
    let after = |d: Duration| after(now, d);
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
        // The bucket says, when the token is reserved.
        WaitKind::Rate { .. } => Ok(None),
    }
}

/// `d` after `now`, unless `d` is longer than a store keeps a wait.
fn after(now: Millis, d: Duration) -> Result<Millis, String> {
    if d > MAX_WAIT {
        return Err(format!(
            "{} s is longer than the longest wait a store keeps ({} s, 100 years)",
            d.as_secs(),
            MAX_WAIT.as_secs()
        ));
    }
    let ms = Millis::try_from(d.as_millis()).unwrap_or(Millis::MAX);
    Ok(now.saturating_add(ms))
}

/// A join as asked, checked before anything is read: its due time if it is new
/// (`timeout` after `now`), or why it is refused.
pub(crate) fn join_asked(
    now: Millis,
    children: &[String],
    timeout: Option<Duration>,
    max_children: u32,
) -> Result<Option<Millis>, JoinRefusal> {
    if children.is_empty() {
        return Err(JoinRefusal::NoChildren);
    }
    if u32::try_from(children.len()).map_or(true, |n| n > max_children) {
        return Err(JoinRefusal::TooMany {
            count: children.len(),
            max: max_children,
        });
    }
    let mut seen = std::collections::HashSet::with_capacity(children.len());
    if let Some(twice) = children.iter().find(|c| !seen.insert(c.as_str())) {
        return Err(JoinRefusal::Repeated(twice.clone()));
    }
    timeout
        .map(|d| after(now, d))
        .transpose()
        .map_err(JoinRefusal::InvalidTime)
}

/// The refusal of a join whose key was recorded for another wait (`signal`, `rate`:
/// what it waited for, neither for a sleep) or for a join `mode` of other children.
pub(crate) fn join_reused(
    key: &str,
    signal: Option<&str>,
    rate: Option<&str>,
    mode: Option<&str>,
) -> JoinRefusal {
    let was = match mode {
        Some(mode) => format!("a join of {mode} of other children"),
        None => kind_of(signal, rate),
    };
    JoinRefusal::KeyReused(format!(
        "key {} was used for {was}; give each wait its own key",
        crate::text::quoted(key)
    ))
}

/// Parses a join's mode as the store spells it.
pub(crate) fn join_mode(text: &str) -> Option<JoinMode> {
    match text {
        "all" => Some(JoinMode::All),
        "any" => Some(JoinMode::Any),
        _ => None,
    }
}

/// A wait as asked, checked: when it is due if it is new, and the signal it waits for
/// (`None` for a sleep) or the rate class it takes a token of.
pub(crate) struct Asked<'a> {
    pub(crate) due: Option<Millis>,
    pub(crate) signal: Option<&'a str>,
    pub(crate) rate: Option<&'a str>,
}

/// Checks a wait before anything is read or written: its time ([`due_at`]) and its
/// signal's name; the reason it is refused, if it is.
pub(crate) fn asked<'a>(now: Millis, kind: &WaitKind<'a>) -> Result<Asked<'a>, String> {
    let due = due_at(now, kind)?;
    let (signal, rate) = match kind {
        WaitKind::Sleep(_) => (None, None),
        WaitKind::Signal { name, .. } => {
            check_signal_name(name)?;
            (Some(*name), None)
        }
        WaitKind::Rate { class } => {
            check_class_name(class)?;
            (None, Some(*class))
        }
    };
    Ok(Asked { due, signal, rate })
}

/// A wait's row as a backend read it.
pub(crate) struct WaitRow {
    pub(crate) signal: Option<String>,
    /// Set for a join: `all` or `any`.
    pub(crate) join_mode: Option<String>,
    /// Set for a rate token: its class.
    pub(crate) rate: Option<String>,
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
        if let Some(mode) = &self.join_mode {
            return Err(format!(
                "key {} was used for a join of {mode}, not {}; give each wait its own key",
                crate::text::quoted(key),
                asked.kind()
            ));
        }
        if self.signal.as_deref() != asked.signal || self.rate.as_deref() != asked.rate {
            return Err(format!(
                "key {} was used for {}, not {}; give each wait its own key",
                crate::text::quoted(key),
                kind_of(self.signal.as_deref(), self.rate.as_deref()),
                asked.kind()
            ));
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

impl Asked<'_> {
    /// The wait's kind as a refusal names it.
    fn kind(&self) -> String {
        kind_of(self.signal, self.rate)
    }
}

/// A wait's kind as a refusal names it, from its signal or rate class.
fn kind_of(signal: Option<&str>, rate: Option<&str>) -> String {
    match rate {
        Some(class) => format!("a token of rate class {}", crate::text::quoted(class)),
        None => kind(signal),
    }
}

/// A wait's kind as a refusal names it.
fn kind(signal: Option<&str>) -> String {
    match signal {
        None => "a sleep".to_string(),
        Some(name) => format!("a wait for signal {}", crate::text::quoted(name)),
    }
}

/// How durable a wait's record must be when the run asks `sync` of its writes. A rate
/// token's record needs no sync of its own: the step's commit (or the run's suspension
/// when the token is not free yet) follows it in the same log and is synced as the run
/// asks, taking it along. Power lost before that loses the token with the effect's
/// claim, and the step takes another when it runs again.
pub(crate) fn wait_sync(kind: &WaitKind<'_>, sync: SyncMode) -> SyncMode {
    match kind {
        WaitKind::Rate { .. } => SyncMode::Normal,
        WaitKind::Sleep(_) | WaitKind::Signal { .. } => sync,
    }
}
