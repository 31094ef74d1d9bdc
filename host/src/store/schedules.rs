//! Schedules: a deployment started on a cron expression or a fixed interval, what a
//! schedule is ([`ScheduleDef`], [`ScheduleRecord`]), when its ticks fall
//! ([`Every`](ScheduleSpec::Every) and [`Cron`](ScheduleSpec::Cron) stepped on the
//! store's clock), and what firing one did ([`Tick`]).
//!
//! A tick's run id is derived from the schedule and the tick's time
//! ([`schedule_run_id`]), so a tick fired twice (two workers, a retry) submits one run.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds};

use super::Millis;
#[cfg(doc)]
use super::{OperatorStore, WorkerStore};

/// The shortest interval a schedule may tick at: ticks closer than this would keep a
/// store busy firing rather than running (a worker polls every 200 ms by default).
pub const MIN_EVERY_MS: Millis = 100;
/// The longest interval: a year. A longer one is almost surely a mistake in its unit.
pub const MAX_EVERY_MS: Millis = 366 * 24 * 3600 * 1000;
/// The most missed ticks a schedule may catch up: each is a run started at once.
pub const MAX_CATCH_UP: u32 = 1_000;
/// The longest schedule name, in bytes.
pub const MAX_SCHEDULE_NAME_BYTES: usize = 200;

/// When a schedule's ticks fall.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum ScheduleSpec {
    /// Every `every_ms` milliseconds, aligned to the Unix epoch (an hourly schedule
    /// ticks on the hour, as Temporal's intervals do), in UTC.
    Every {
        /// The interval.
        every_ms: Millis,
    },
    /// A cron expression (5 fields, or 6 with seconds first) read in an IANA time zone.
    Cron {
        /// The expression.
        expr: String,
        /// The zone, as `Europe/Paris`; `UTC` by default.
        tz: String,
    },
}

/// Why a schedule's definition was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// The cron expression does not parse.
    #[error("invalid cron expression {expr:?}: {reason}")]
    Cron {
        /// The expression.
        expr: String,
        /// What the parser said.
        reason: String,
    },
    /// The time zone is not an IANA zone name.
    #[error("unknown time zone {tz:?}: expected an IANA name such as UTC or Europe/Paris")]
    TimeZone {
        /// The zone given.
        tz: String,
    },
    /// The interval is shorter than a second or longer than a year.
    #[error("interval of {every_ms} ms is out of range: at least 100ms and at most 366d")]
    Interval {
        /// The interval given.
        every_ms: Millis,
    },
    /// The cron expression never matches a time (30 February, say).
    #[error("cron expression {expr:?} never comes due")]
    Never {
        /// The expression.
        expr: String,
    },
}

/// A spec checked and ready to step.
enum Stepper {
    Every(Millis),
    Cron(Box<Cron>, Tz),
}

impl ScheduleSpec {
    /// Checks the spec: the expression parses, the zone exists, the interval is sane,
    /// and a cron expression comes due at least once after `now`.
    pub fn check(&self, now: Millis) -> Result<(), SpecError> {
        let stepper = self.stepper()?;
        if let (Stepper::Cron(..), ScheduleSpec::Cron { expr, .. }) = (&stepper, self)
            && stepper.after(now).is_none()
        {
            return Err(SpecError::Never { expr: expr.clone() });
        }
        Ok(())
    }

    fn stepper(&self) -> Result<Stepper, SpecError> {
        match self {
            ScheduleSpec::Every { every_ms } => {
                if (MIN_EVERY_MS..=MAX_EVERY_MS).contains(every_ms) {
                    Ok(Stepper::Every(*every_ms))
                } else {
                    Err(SpecError::Interval {
                        every_ms: *every_ms,
                    })
                }
            }
            ScheduleSpec::Cron { expr, tz } => {
                let zone = Tz::from_str(tz).map_err(|_| SpecError::TimeZone { tz: tz.clone() })?;
                let cron = CronParser::builder()
                    .seconds(Seconds::Optional)
                    .build()
                    .parse(expr)
                    .map_err(|e| SpecError::Cron {
                        expr: expr.clone(),
                        reason: e.to_string(),
                    })?;
                Ok(Stepper::Cron(Box::new(cron), zone))
            }
        }
    }

    /// The first tick strictly after `t`, if the spec is valid and one comes.
    pub fn next_after(&self, t: Millis) -> Option<Millis> {
        self.stepper().ok()?.after(t)
    }

    /// The last tick at or before `t`, if the spec is valid and one came.
    pub fn last_at_or_before(&self, t: Millis) -> Option<Millis> {
        self.stepper().ok()?.at_or_before(t)
    }

    /// Plans what firing the schedule does at `now`, when its next unfired tick is
    /// `next_tick` (at or before `now`) and up to `catch_up` missed ticks are started:
    /// the ticks to start, oldest first (the latest due tick always, and before it
    /// up to `catch_up` of the missed ones), how many missed ticks are skipped, and
    /// the next tick after the latest due one. `None` if the spec cannot be stepped.
    pub fn plan(&self, next_tick: Millis, now: Millis, catch_up: u32) -> Option<Plan> {
        let stepper = self.stepper().ok()?;
        let next = |t| stepper.after(t);
        let Some(latest) = stepper.at_or_before(now).filter(|&l| l >= next_tick) else {
            // Nothing due (the spec moved under a stored tick): start again from now.
            return Some(Plan {
                fire: Vec::new(),
                missed: 0,
                next_tick: next(now),
            });
        };
        let mut fire = vec![latest];
        while fire.len() <= catch_up as usize {
            match stepper.before(fire[fire.len() - 1]) {
                Some(t) if t >= next_tick => fire.push(t),
                _ => break,
            }
        }
        fire.reverse();
        let missed = stepper.count(next_tick, fire[0]);
        Some(Plan {
            fire,
            missed,
            next_tick: next(latest),
        })
    }
}

/// What firing a schedule at one moment does: [`ScheduleSpec::plan`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// The ticks to start, oldest first.
    pub fire: Vec<Millis>,
    /// Ticks that came due and are skipped (beyond the catch-up).
    pub missed: u64,
    /// The schedule's next tick; `None` if it never comes again.
    pub next_tick: Option<Millis>,
}

/// The most ticks counted one by one as missed; past it the count stops growing.
const MAX_COUNTED: u64 = 100_000;

impl Stepper {
    fn after(&self, t: Millis) -> Option<Millis> {
        match self {
            Stepper::Every(every) => t.div_euclid(*every).checked_add(1)?.checked_mul(*every),
            Stepper::Cron(cron, zone) => {
                let at = zone.from_utc_datetime(&utc(t)?.naive_utc());
                // Cron times are whole seconds: the next one after `t` is after its second.
                let next = cron.find_next_occurrence(&at, false).ok()?;
                Some(next.with_timezone(&Utc).timestamp_millis())
            }
        }
    }

    fn at_or_before(&self, t: Millis) -> Option<Millis> {
        match self {
            Stepper::Every(every) => t.div_euclid(*every).checked_mul(*every),
            Stepper::Cron(cron, zone) => {
                let at = zone.from_utc_datetime(&utc(t.div_euclid(1000) * 1000)?.naive_utc());
                let last = cron.find_previous_occurrence(&at, true).ok()?;
                Some(last.with_timezone(&Utc).timestamp_millis())
            }
        }
    }

    fn before(&self, t: Millis) -> Option<Millis> {
        self.at_or_before(t.checked_sub(1)?)
    }

    /// How many ticks fall in `[from, until)`, up to [`MAX_COUNTED`].
    fn count(&self, from: Millis, until: Millis) -> u64 {
        if until <= from {
            return 0;
        }
        match self {
            Stepper::Every(every) => {
                let n = (until - 1).div_euclid(*every) - (from - 1).div_euclid(*every);
                u64::try_from(n).unwrap_or(0)
            }
            Stepper::Cron(..) => {
                let (mut n, mut t) = (0, from);
                // `from` is a tick itself (a stored next tick), so it counts.
                if self.at_or_before(from) == Some(from) {
                    n += 1;
                }
                while n < MAX_COUNTED {
                    match self.after(t) {
                        Some(next) if next < until => {
                            n += 1;
                            t = next;
                        }
                        _ => break,
                    }
                }
                n
            }
        }
    }
}

fn utc(t: Millis) -> Option<DateTime<Utc>> {
    DateTime::<Utc>::from_timestamp_millis(t)
}

/// A tick's time as its run id spells it: RFC 3339 in UTC, to the second (with
/// milliseconds only when the tick has them).
pub fn tick_text(tick: Millis) -> String {
    match utc(tick) {
        Some(at) if tick.rem_euclid(1000) == 0 => at.format("%Y-%m-%dT%H:%M:%SZ").to_string(),
        Some(at) => at.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
        None => tick.to_string(),
    }
}

/// The run a schedule's tick starts: `<schedule>@<tick in RFC 3339, UTC>`. Two workers
/// firing one tick submit this same run, and submitting is idempotent.
///
/// ```
/// assert_eq!(
///     idem::store::schedule_run_id("nightly", 1_700_000_000_000),
///     "nightly@2023-11-14T22:13:20Z"
/// );
/// ```
pub fn schedule_run_id(schedule: &str, tick: Millis) -> String {
    format!("{schedule}@{}", tick_text(tick))
}

/// What a schedule does when a tick comes while the run of its previous tick is still
/// queued or running.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize, Hash,
)]
#[serde(rename_all = "kebab-case")]
pub enum Overlap {
    /// The tick starts nothing (counted as skipped): one run at a time (the default,
    /// as Temporal's).
    #[default]
    Skip,
    /// The tick starts its run anyway: runs of several ticks may overlap.
    Allow,
    /// The previous run is cancelled (at once, or at its next host call if a worker
    /// drives it) and the tick starts its run.
    CancelPrevious,
}

impl Overlap {
    /// The policy's name, as the store and the CLI spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Skip => "skip",
            Overlap::Allow => "allow",
            Overlap::CancelPrevious => "cancel-previous",
        }
    }
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Overlap {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Overlap::Skip, Overlap::Allow, Overlap::CancelPrevious]
            .into_iter()
            .find(|o| o.as_str() == s)
            .ok_or_else(|| {
                format!("unknown overlap policy {s:?}: expected skip, allow or cancel-previous")
            })
    }
}

/// A schedule to create: [`OperatorStore::create_schedule`].
#[derive(Debug, Clone)]
pub struct ScheduleDef<'a> {
    /// Its name, unique in the store.
    pub name: &'a str,
    /// The deployment each tick starts a run of (what the name points at when the tick
    /// fires, with the deployment's authority).
    pub deployment: &'a str,
    /// When it ticks.
    pub spec: &'a ScheduleSpec,
    /// The input of every run it starts (JSON).
    pub input: &'a [u8],
    /// How many missed ticks are started when the schedule is late (workers were
    /// down); 0 starts only the latest.
    pub catch_up: u32,
    /// What a tick does while the previous run is still going.
    pub overlap: Overlap,
}

/// How many ticks ended each way, since the schedule was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct TickCounts {
    /// Ticks that started a run.
    pub started: u64,
    /// Ticks that started nothing because the previous run was still going.
    pub skipped: u64,
    /// Ticks that came due while no worker fired and were not caught up.
    pub missed: u64,
    /// Ticks that could not start their run (a run of that id exists with other
    /// input, say): `last_error` says why.
    pub failed: u64,
}

/// A schedule as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ScheduleRecord {
    /// Its name.
    pub name: String,
    /// The deployment it starts.
    pub deployment: String,
    /// When it ticks.
    pub spec: ScheduleSpec,
    /// The input of its runs.
    #[serde(skip)]
    pub input: Vec<u8>,
    /// Missed ticks it catches up.
    pub catch_up: u32,
    /// Its overlap policy.
    pub overlap: Overlap,
    /// Paused: no tick fires until it is resumed.
    pub paused: bool,
    /// Its next tick on the store's clock; `None` if none comes again.
    pub next_tick: Option<Millis>,
    /// The latest tick that started a run, and that run.
    pub last_tick: Option<Millis>,
    /// The run the latest started tick submitted.
    pub last_run: Option<String>,
    /// Its ticks so far, by outcome.
    pub ticks: TickCounts,
    /// Why the latest failed tick failed.
    pub last_error: Option<String>,
    /// When it was created.
    pub created: Millis,
    /// When its record last changed.
    pub updated: Millis,
}

/// What one tick did when a worker fired it: [`WorkerStore::fire_schedules`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tick {
    /// The schedule.
    pub schedule: String,
    /// The tick's time.
    pub tick: Millis,
    /// What it did.
    pub outcome: TickOutcome,
}

/// How a tick ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TickOutcome {
    /// It submitted this run (`created`: the run is new).
    Started {
        /// The run.
        run_id: String,
        /// Whether the run was new (false: that tick's run existed already).
        created: bool,
    },
    /// The previous run was still going and the policy is [`Overlap::Skip`].
    Skipped,
    /// Its run could not be submitted, for this reason.
    Failed(String),
}

/// The schedule that started a run, and the tick: [`OperatorStore::run_schedule`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ScheduledBy {
    /// The schedule's name.
    pub schedule: String,
    /// The tick's time.
    pub tick: Millis,
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Millis = 3_600_000;

    #[test]
    fn intervals_align_to_the_epoch_and_plan_catch_up() {
        let spec = ScheduleSpec::Every { every_ms: HOUR };
        assert_eq!(spec.next_after(10 * HOUR), Some(11 * HOUR));
        assert_eq!(spec.next_after(10 * HOUR + 1), Some(11 * HOUR));
        // Ticks 11h..15h due at 15h30: the latest always, two missed caught up, two
        // skipped.
        let plan = spec.plan(11 * HOUR, 15 * HOUR + HOUR / 2, 2).unwrap();
        assert_eq!(plan.fire, vec![13 * HOUR, 14 * HOUR, 15 * HOUR]);
        assert_eq!(plan.missed, 2);
        assert_eq!(plan.next_tick, Some(16 * HOUR));
        let plan = spec.plan(11 * HOUR, 11 * HOUR, 5).unwrap();
        assert_eq!((plan.fire, plan.missed), (vec![11 * HOUR], 0));
    }

    #[test]
    fn cron_steps_in_its_zone_across_dst() {
        let spec = ScheduleSpec::Cron {
            expr: "30 2 * * *".into(),
            tz: "Europe/Paris".into(),
        };
        spec.check(0).unwrap();
        // 2026-03-29: Paris skips 02:00-03:00; croner runs the missing 02:30 at 03:00
        // local (01:00 UTC), the OCPS rule.
        let before = DateTime::parse_from_rfc3339("2026-03-28T12:00:00Z")
            .unwrap()
            .timestamp_millis();
        let next = spec.next_after(before).unwrap();
        assert_eq!(tick_text(next), "2026-03-29T01:00:00Z");
        let plan = spec.plan(next, next + 3 * 24 * HOUR, 1).unwrap();
        assert_eq!(plan.fire.len(), 2);
        assert_eq!(plan.missed, 2);
    }

    #[test]
    fn bad_specs_are_refused() {
        let cron = |expr: &str, tz: &str| ScheduleSpec::Cron {
            expr: expr.into(),
            tz: tz.into(),
        };
        assert!(matches!(
            cron("61 * * * *", "UTC").check(0),
            Err(SpecError::Cron { .. })
        ));
        assert!(matches!(
            cron("* * *", "UTC").check(0),
            Err(SpecError::Cron { .. })
        ));
        assert!(matches!(
            cron("0 * * * *", "Mars/Olympus").check(0),
            Err(SpecError::TimeZone { .. })
        ));
        assert!(matches!(
            cron("0 0 30 2 *", "UTC").check(0),
            Err(SpecError::Never { .. }) | Err(SpecError::Cron { .. })
        ));
        for every_ms in [0, -5, 99, MAX_EVERY_MS + 1] {
            assert!(matches!(
                ScheduleSpec::Every { every_ms }.check(0),
                Err(SpecError::Interval { .. })
            ));
        }
    }
}
