//! A run's timeline: what happened to the run, as an operator asks after it — each
//! instance started (by which worker, under which lease token) and how it ended, leases
//! taken over from holders whose lease had expired, waits, signals, pauses, upgrades.
//!
//! Events are written by the store itself, inside the transactions that already
//! happen once per instance or per lease (a lease's grant, an instance's start, a
//! suspension, a release, a run's end, an operator's write): never per step, so no
//! durable step pays for them. Each run numbers its events from 1 (`seq`, never
//! reused while the run exists) and keeps at most [`EVENTS_HEAD`] first and
//! [`EVENTS_TAIL`] last of them; the ones between are dropped as new ones come, and
//! counted ([`Timeline::dropped`]). They are deleted with their run (`idem gc`).
//!
//! Details are metadata the host wrote (holders, tokens, signal names, digests, the
//! reasons it gives), never a payload: a signal's payload, a step's result, a run's
//! input stay where they are and sealed as they are; an event names them only.

use serde::Serialize;

use crate::store::Millis;

/// How many of a run's first events are kept: how it began.
pub const EVENTS_HEAD: u64 = 100;

/// How many of a run's latest events are kept: what it did lately.
pub const EVENTS_TAIL: u64 = 900;

/// [`EVENTS_HEAD`] as a literal, for statements built with `concat!`.
#[cfg(feature = "postgres")]
macro_rules! events_head {
    () => {
        "100"
    };
}
#[cfg(feature = "postgres")]
pub(crate) use events_head;

/// [`EVENTS_TAIL`] as a literal, for statements built with `concat!`.
#[cfg(feature = "postgres")]
macro_rules! events_tail {
    () => {
        "900"
    };
}
#[cfg(feature = "postgres")]
pub(crate) use events_tail;

/// What happened to a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EventKind {
    /// An instance of the run started (`detail.instance`: how many the run has had,
    /// this one included, as `runs.instances` counts them).
    Started,
    /// A lease was granted while another holder's expired lease was still recorded:
    /// that holder's instance never ended (its process crashed, was killed, froze or
    /// lost the store). `holder`/`token` are the new lease's; `detail.from_holder`,
    /// `detail.from_token` and `detail.expired_at` the old one's.
    TookOver,
    /// The host dropped an instance on purpose and starts a fresh one under the same
    /// lease (`detail.reason`: recycling, a crash point, chaos).
    Recycled,
    /// The instance ended waiting and the run gave its lease back until it is due:
    /// `detail.due` (a sleep or a timeout), `detail.signal`, `detail.join`.
    Waiting,
    /// The instance ended and the lease was given back unfinished: drained, stopped,
    /// paused, or not servable by that worker (`detail.note`, `detail.paused`). With
    /// `detail.unstarted`, the instance its lease's grant started never ran (the worker
    /// could not serve the run) and the run's count of instances took it back.
    Released,
    /// The run ended (`detail.status`: completed, failed, in_doubt, cancelled).
    Finished,
    /// An operator sent a signal (`detail.name`; `detail.woke`: the run waited for it
    /// and is due at once). Never the payload.
    Signal,
    /// An operator paused the run.
    Paused,
    /// An operator resumed the run.
    Resumed,
    /// An operator cancelled the run (`detail.at_once`: no worker held it, so it ended
    /// now; else its worker is asked to stop).
    Cancelled,
    /// The run was moved to another component (`detail.from`, `detail.to`: digests).
    Upgraded,
    /// The run was forked (`detail.into`: the new run, `detail.at`: the step), or is a
    /// fork (`detail.from`: the run it was forked from, `detail.at`, `detail.reused`:
    /// results copied, `detail.checkpoint`: the step of the checkpoint it starts from).
    Forked,
}

impl EventKind {
    /// The kind's name, as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Started => "started",
            EventKind::TookOver => "took_over",
            EventKind::Recycled => "recycled",
            EventKind::Waiting => "waiting",
            EventKind::Released => "released",
            EventKind::Finished => "finished",
            EventKind::Signal => "signal",
            EventKind::Paused => "paused",
            EventKind::Resumed => "resumed",
            EventKind::Cancelled => "cancelled",
            EventKind::Upgraded => "upgraded",
            EventKind::Forked => "forked",
        }
    }

    /// The kind named `name`, if it is one.
    pub fn parse(name: &str) -> Option<EventKind> {
        Some(match name {
            "started" => EventKind::Started,
            "took_over" => EventKind::TookOver,
            "recycled" => EventKind::Recycled,
            "waiting" => EventKind::Waiting,
            "released" => EventKind::Released,
            "finished" => EventKind::Finished,
            "signal" => EventKind::Signal,
            "paused" => EventKind::Paused,
            "resumed" => EventKind::Resumed,
            "cancelled" => EventKind::Cancelled,
            "upgraded" => EventKind::Upgraded,
            "forked" => EventKind::Forked,
            _ => return None,
        })
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One event of a run's timeline, as the store keeps it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunEvent {
    /// Its place in the run's timeline, from 1.
    pub seq: u64,
    /// When, on the store's clock.
    pub at: Millis,
    /// What happened.
    pub kind: EventKind,
    /// The worker (holder) whose lease it happened under, when the event names one;
    /// filled in from the event that started the lease when the store wrote only its
    /// token.
    pub holder: Option<String>,
    /// The run lease token it happened under, if any.
    pub token: Option<u64>,
    /// The kind's facts (see [`EventKind`]), a JSON object.
    pub detail: serde_json::Value,
}

impl RunEvent {
    /// A one-line account of the event for a terminal or a page (not escaped: the
    /// caller escapes what it prints).
    pub fn summary(&self) -> String {
        let d = &self.detail;
        let text = |name: &str| d.get(name).and_then(|v| v.as_str()).map(str::to_owned);
        let num = |name: &str| d.get(name).and_then(serde_json::Value::as_u64);
        let by = match (&self.holder, self.token) {
            (Some(holder), Some(token)) => format!(" on {holder} (token {token})"),
            (None, Some(token)) => format!(" (token {token})"),
            (Some(holder), None) => format!(" on {holder}"),
            (None, None) => String::new(),
        };
        match self.kind {
            EventKind::Started => match num("instance") {
                Some(n) => format!("instance {n} started{by}"),
                None => format!("instance started{by}"),
            },
            EventKind::TookOver => format!(
                "took over{by} from {} (token {}), whose lease expired at {}: its instance never ended",
                text("from_holder").unwrap_or_else(|| "?".into()),
                num("from_token").map_or_else(|| "?".into(), |t| t.to_string()),
                num("expired_at").map_or_else(|| "?".into(), |t| t.to_string()),
            ),
            EventKind::Recycled => format!(
                "instance {} recycled{by}: {}",
                num("instance").map_or_else(|| "?".into(), |n| n.to_string()),
                text("reason").unwrap_or_default()
            ),
            EventKind::Waiting => {
                let mut on = Vec::new();
                if let Some(signal) = text("signal") {
                    on.push(format!("signal {signal}"));
                }
                if let Some(join) = text("join") {
                    on.push(format!("children of {join}"));
                }
                if let Some(due) = num("due") {
                    on.push(format!("until {due}"));
                }
                format!("instance ended waiting{by}: {}", on.join(", "))
            }
            EventKind::Released => {
                let why = match (text("note"), d.get("paused").and_then(|v| v.as_bool())) {
                    (Some(note), _) => note,
                    (None, Some(true)) => "paused".into(),
                    _ => "drained or stopped".into(),
                };
                if d.get("unstarted").and_then(serde_json::Value::as_bool) == Some(true) {
                    format!("lease given back{by}, its instance never run: {why}")
                } else {
                    format!("instance ended, lease given back{by}: {why}")
                }
            }
            EventKind::Finished => format!(
                "run ended {}{by}",
                text("status").unwrap_or_else(|| "?".into())
            ),
            EventKind::Signal => format!("signal {} received", text("name").unwrap_or_default()),
            EventKind::Paused => "paused by an operator".into(),
            EventKind::Resumed => "resumed by an operator".into(),
            EventKind::Cancelled => match d.get("at_once").and_then(|v| v.as_bool()) {
                Some(true) => "cancelled by an operator".into(),
                _ => "cancel requested by an operator; its worker stops it".into(),
            },
            EventKind::Upgraded => format!(
                "upgraded from {} to {}",
                text("from").unwrap_or_default(),
                text("to").unwrap_or_default()
            ),
            EventKind::Forked => {
                let at = d.get("at").and_then(serde_json::Value::as_u64).unwrap_or(0);
                match (text("into"), text("from")) {
                    (Some(into), _) => format!("forked at step {at} into run {into}"),
                    (None, from) => {
                        format!("forked from run {} at step {at}", from.unwrap_or_default())
                    }
                }
            }
        }
    }
}

/// A run's timeline: the events it keeps, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Timeline {
    /// The events kept: the run's first [`EVENTS_HEAD`] and last [`EVENTS_TAIL`].
    pub events: Vec<RunEvent>,
    /// Events recorded for the run but dropped to keep it bounded (those between the
    /// first and the last kept; `seq` shows the gap).
    pub dropped: u64,
}

impl Timeline {
    /// The timeline from the kept events and how many the run recorded in all: fills
    /// each event's missing holder from the event that started its lease (the store
    /// writes a token only, where the holder is not at hand).
    pub(crate) fn new(mut events: Vec<RunEvent>, recorded: u64) -> Timeline {
        let mut holders: std::collections::HashMap<u64, String> = Default::default();
        for event in &mut events {
            match (&event.holder, event.token) {
                (Some(holder), Some(token)) => {
                    holders.insert(token, holder.clone());
                }
                (None, Some(token)) => event.holder = holders.get(&token).cloned(),
                _ => {}
            }
        }
        let dropped = recorded.saturating_sub(events.len() as u64);
        Timeline { events, dropped }
    }
}

/// An event on its way to the store.
#[derive(Debug, Clone)]
pub(crate) struct NewEvent {
    pub(crate) kind: EventKind,
    pub(crate) holder: Option<String>,
    pub(crate) token: Option<u64>,
    pub(crate) detail: serde_json::Value,
}

impl NewEvent {
    /// An event of `kind` with `detail`, under no lease.
    pub(crate) fn new(kind: EventKind, detail: serde_json::Value) -> NewEvent {
        NewEvent {
            kind,
            holder: None,
            token: None,
            detail,
        }
    }

    /// The event under lease `token`.
    pub(crate) fn token(mut self, token: u64) -> NewEvent {
        self.token = Some(token);
        self
    }

    /// The event under `holder`'s lease. (PostgreSQL writes a grant's events in the
    /// grant's own statement.)
    #[cfg(feature = "sqlite")]
    pub(crate) fn holder(mut self, holder: &str) -> NewEvent {
        self.holder = Some(holder.to_owned());
        self
    }

    /// The detail as stored.
    pub(crate) fn detail_text(&self) -> String {
        self.detail.to_string()
    }
}

/// The detail of an event as stored, read back; a detail that is not JSON (only a
/// tampered store has one) is kept as a string rather than failing the read.
pub(crate) fn detail_from(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|_| serde_json::Value::String(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "postgres")]
    #[test]
    fn the_literal_bounds_are_the_bounds() {
        assert_eq!(events_head!(), EVENTS_HEAD.to_string());
        assert_eq!(events_tail!(), EVENTS_TAIL.to_string());
    }

    #[test]
    fn every_kind_reads_back_by_its_name() {
        for kind in [
            EventKind::Started,
            EventKind::TookOver,
            EventKind::Recycled,
            EventKind::Waiting,
            EventKind::Released,
            EventKind::Finished,
            EventKind::Signal,
            EventKind::Paused,
            EventKind::Resumed,
            EventKind::Cancelled,
            EventKind::Upgraded,
            EventKind::Forked,
        ] {
            assert_eq!(EventKind::parse(kind.as_str()), Some(kind));
            // The name serialised is the name stored.
            assert_eq!(
                serde_json::to_value(kind).unwrap(),
                serde_json::Value::String(kind.as_str().into())
            );
        }
        assert_eq!(EventKind::parse("merged"), None);
    }

    #[test]
    fn a_token_only_event_takes_its_holder_from_the_lease_start() {
        let event = |seq, kind, holder: Option<&str>, token| RunEvent {
            seq,
            at: 0,
            kind,
            holder: holder.map(str::to_owned),
            token,
            detail: serde_json::json!({}),
        };
        let timeline = Timeline::new(
            vec![
                event(1, EventKind::Started, Some("w1"), Some(3)),
                event(2, EventKind::Recycled, None, Some(3)),
                event(5, EventKind::Finished, None, Some(4)),
            ],
            7,
        );
        assert_eq!(timeline.events[1].holder.as_deref(), Some("w1"));
        // A lease whose start was dropped names no holder rather than a wrong one.
        assert_eq!(timeline.events[2].holder, None);
        assert_eq!(timeline.dropped, 4);
    }
}
