//! What an operator does to schedules — create, look at, pause, resume, delete — for
//! the `idem schedule` commands and the HTTP API alike.

use std::time::Duration;

use super::{OpError, check_json, payload_value};
use crate::runtime::HostError;
use crate::store::{
    Millis, Overlap, RunRecord, ScheduleDef, ScheduleRecord, ScheduleSpec, Store, StoreError,
};

/// A schedule to create: [`create_schedule`].
#[derive(Debug, Clone)]
pub struct ScheduleRequest<'a> {
    /// Its name.
    pub name: &'a str,
    /// The deployment (by name) each tick starts a run of.
    pub deployment: &'a str,
    /// When it ticks.
    pub spec: ScheduleSpec,
    /// The input of its runs (JSON).
    pub input: &'a [u8],
    /// Missed ticks started when it is late.
    pub catch_up: u32,
    /// What a tick does while the previous run is still going.
    pub overlap: Overlap,
}

/// Creates a schedule, after checking what the store cannot: the input is JSON and the
/// deployment exists (by name: a schedule follows the name as it is redeployed).
pub async fn create_schedule(
    store: &dyn Store,
    req: &ScheduleRequest<'_>,
) -> Result<ScheduleRecord, OpError> {
    check_json("input", req.input)?;
    if store.deployment(req.deployment).await?.is_none() {
        return Err(HostError::UnknownDeployment {
            name: req.deployment.to_owned(),
        }
        .into());
    }
    Ok(store
        .create_schedule(&ScheduleDef {
            name: req.name,
            deployment: req.deployment,
            spec: &req.spec,
            input: req.input,
            catch_up: req.catch_up,
            overlap: req.overlap,
        })
        .await?)
}

/// An interval as an operator writes it (`500ms`, `30s`, `5m`, `1h`, `1d`), in
/// milliseconds.
///
/// ```
/// assert_eq!(idem::ops::parse_every("5m")?, 300_000);
/// assert_eq!(idem::ops::parse_every("250ms")?, 250);
/// assert!(idem::ops::parse_every("5").is_err());
/// # Ok::<(), idem::ops::OpError>(())
/// ```
pub fn parse_every(text: &str) -> Result<Millis, OpError> {
    if let Some(ms) = text.strip_suffix("ms")
        && !ms.is_empty()
        && ms.bytes().all(|b| b.is_ascii_digit())
    {
        return ms.parse().map_err(|_| OpError::BadAge {
            what: "interval",
            given: text.to_owned(),
        });
    }
    let every = super::parse_age("interval", text)?;
    Ok(Millis::try_from(every.as_millis()).unwrap_or(Millis::MAX))
}

/// How many upcoming ticks a view lists.
pub const UPCOMING_SHOWN: usize = 5;

/// Everything the store knows of one schedule, as `idem schedule show --json` and the
/// API print it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ScheduleView {
    /// The schedule.
    pub schedule: ScheduleRecord,
    /// The input of its runs, as JSON.
    pub input: serde_json::Value,
    /// Its next ticks (none while paused), soonest first.
    pub upcoming: Vec<Millis>,
    /// The run its latest started tick submitted, as it stands now (`None` if it was
    /// collected, or none started yet).
    pub last_run: Option<RunRecord>,
    /// The store's clock when this was read.
    pub now: Millis,
}

impl ScheduleView {
    /// Schedule `name` as the store has it; [`StoreError::UnknownSchedule`] if none.
    pub async fn of(store: &dyn Store, name: &str) -> Result<ScheduleView, StoreError> {
        let schedule = store
            .schedule(name)
            .await?
            .ok_or_else(|| StoreError::UnknownSchedule {
                name: name.to_owned(),
            })?;
        let now = store.now().await?;
        let last_run = match &schedule.last_run {
            Some(run_id) => store.run(run_id).await?,
            None => None,
        };
        Ok(ScheduleView {
            input: payload_value(&schedule.input),
            upcoming: upcoming(&schedule),
            last_run,
            schedule,
            now,
        })
    }
}

/// The schedule's next [`UPCOMING_SHOWN`] ticks, from its next one.
pub fn upcoming(schedule: &ScheduleRecord) -> Vec<Millis> {
    let mut ticks = Vec::new();
    let mut next = if schedule.paused {
        None
    } else {
        schedule.next_tick
    };
    while let Some(tick) = next
        && ticks.len() < UPCOMING_SHOWN
    {
        ticks.push(tick);
        next = schedule.spec.next_after(tick);
    }
    ticks
}

/// A length of time as `idem` prints it: `1h`, `90s`, `1500ms`.
pub fn every_text(every_ms: Millis) -> String {
    let every = Duration::from_millis(u64::try_from(every_ms).unwrap_or(0));
    let secs = every.as_secs();
    if every.subsec_millis() != 0 {
        format!("{every_ms}ms")
    } else if secs.is_multiple_of(86_400) {
        format!("{}d", secs / 86_400)
    } else if secs.is_multiple_of(3_600) {
        format!("{}h", secs / 3_600)
    } else if secs.is_multiple_of(60) {
        format!("{}m", secs / 60)
    } else {
        format!("{secs}s")
    }
}

/// A schedule's spec as `idem` prints it: `every 5m`, `cron "0 9 * * MON" (Europe/Paris)`.
pub fn spec_text(spec: &ScheduleSpec) -> String {
    match spec {
        ScheduleSpec::Every { every_ms } => format!("every {}", every_text(*every_ms)),
        ScheduleSpec::Cron { expr, tz } => format!("cron {expr:?} ({tz})"),
    }
}
