//! Schedules on SQLite: creating, listing, pausing and deleting them, and firing the
//! ticks that are due. The database thread runs one write transaction at a time, so
//! a schedule's firing (its runs submitted, its next tick moved) is never seen half
//! done and never done twice.

use rusqlite::{Connection, OptionalExtension, Row, params};

use super::{TxError, to_sql_int, u32_column, u64_column};
use crate::store::rules::{TickAction, check_def, tick_action};
use crate::store::{
    Millis, Payloads, ScheduleDef, ScheduleRecord, ScheduleSpec, ScheduledBy, StoreError,
    Submission, Tick, TickCounts, TickOutcome, schedule_run_id,
};

const SELECT: &str = "SELECT name, deployment, kind, every_ms, cron, tz, input, catch_up, overlap,
        paused, next_tick, last_tick, last_run, started, skipped, missed, failed, last_error,
        created, updated
    FROM schedules ";

fn record(row: &Row<'_>) -> rusqlite::Result<ScheduleRecord> {
    let kind: String = row.get(2)?;
    let spec = if kind == "every" {
        ScheduleSpec::Every {
            every_ms: row.get(3)?,
        }
    } else {
        ScheduleSpec::Cron {
            expr: row.get(4)?,
            tz: row.get(5)?,
        }
    };
    let overlap: String = row.get(8)?;
    Ok(ScheduleRecord {
        name: row.get(0)?,
        deployment: row.get(1)?,
        spec,
        input: row.get(6)?,
        catch_up: u32_column(row, 7)?,
        // The column's CHECK admits only the three names.
        overlap: overlap.parse().unwrap_or_default(),
        paused: row.get(9)?,
        next_tick: row.get(10)?,
        last_tick: row.get(11)?,
        last_run: row.get(12)?,
        ticks: TickCounts {
            started: u64_column(row, 13)?,
            skipped: u64_column(row, 14)?,
            missed: u64_column(row, 15)?,
            failed: u64_column(row, 16)?,
        },
        last_error: row.get(17)?,
        created: row.get(18)?,
        updated: row.get(19)?,
    })
}

fn unknown(name: &str) -> TxError {
    TxError::Store(StoreError::UnknownSchedule {
        name: name.to_owned(),
    })
}

pub(super) fn create(
    conn: &Connection,
    def: &ScheduleDef<'_>,
    now: Millis,
) -> Result<ScheduleRecord, TxError> {
    let first = check_def(def, now)?;
    let refuse = |reason: String| {
        TxError::Store(StoreError::ScheduleRefused {
            name: def.name.to_owned(),
            reason,
        })
    };
    if get(conn, def.name)?.is_some() {
        return Err(refuse("a schedule of that name exists".to_owned()));
    }
    if super::components::deployment(conn, def.deployment)?.is_none() {
        return Err(refuse(format!(
            "no deployment is named {}",
            crate::text::quoted(def.deployment)
        )));
    }
    let (kind, every_ms, cron, tz) = match def.spec {
        ScheduleSpec::Every { every_ms } => ("every", Some(*every_ms), None, None),
        ScheduleSpec::Cron { expr, tz } => ("cron", None, Some(expr.as_str()), Some(tz.as_str())),
    };
    conn.prepare_cached(
        "INSERT INTO schedules (name, deployment, kind, every_ms, cron, tz, input, catch_up,
                                overlap, next_tick, created, updated)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?11)",
    )?
    .execute(params![
        def.name,
        def.deployment,
        kind,
        every_ms,
        cron,
        tz,
        def.input,
        def.catch_up,
        def.overlap.as_str(),
        first,
        now
    ])?;
    get(conn, def.name)?.ok_or_else(|| unknown(def.name))
}

pub(super) fn list(conn: &Connection) -> Result<Vec<ScheduleRecord>, TxError> {
    let mut stmt = conn.prepare_cached(&format!("{SELECT} ORDER BY name"))?;
    let records = stmt.query_map([], record)?.collect::<Result<_, _>>()?;
    Ok(records)
}

pub(super) fn get(conn: &Connection, name: &str) -> Result<Option<ScheduleRecord>, TxError> {
    Ok(conn
        .prepare_cached(&format!("{SELECT} WHERE name = ?1"))?
        .query_row([name], record)
        .optional()?)
}

pub(super) fn pause(
    conn: &Connection,
    name: &str,
    paused: bool,
    now: Millis,
) -> Result<ScheduleRecord, TxError> {
    let record = get(conn, name)?.ok_or_else(|| unknown(name))?;
    if record.paused == paused {
        return Ok(record);
    }
    // Resumed, it starts from now: the ticks that fell while it was paused are not run.
    let next_tick = if paused {
        record.next_tick
    } else {
        record.spec.next_after(now)
    };
    conn.prepare_cached(
        "UPDATE schedules SET paused = ?2, next_tick = ?3, updated = ?4 WHERE name = ?1",
    )?
    .execute(params![name, paused, next_tick, now])?;
    get(conn, name)?.ok_or_else(|| unknown(name))
}

pub(super) fn delete(conn: &Connection, name: &str) -> Result<(), TxError> {
    let deleted = conn
        .prepare_cached("DELETE FROM schedules WHERE name = ?1")?
        .execute([name])?;
    if deleted == 0 {
        return Err(unknown(name));
    }
    Ok(())
}

pub(super) fn run_schedule(
    conn: &Connection,
    run_id: &str,
) -> Result<Option<ScheduledBy>, TxError> {
    Ok(conn
        .prepare_cached("SELECT schedule, tick FROM scheduled_runs WHERE run_id = ?1")?
        .query_row([run_id], |row| {
            Ok(ScheduledBy {
                schedule: row.get(0)?,
                tick: row.get(1)?,
            })
        })
        .optional()?)
}

/// The earliest tick after `after` of a schedule that is not paused.
pub(super) fn next_tick(conn: &Connection, after: Millis) -> Result<Option<Millis>, TxError> {
    Ok(conn
        .prepare_cached(
            "SELECT min(next_tick) FROM schedules
             WHERE paused = 0 AND next_tick IS NOT NULL AND next_tick > ?1",
        )?
        .query_row([after], |row| row.get(0))?)
}

/// Whether a schedule that is not paused is due at `now`: read before a worker opens
/// a write transaction to fire.
pub(super) fn any_due(conn: &Connection, now: Millis) -> Result<bool, TxError> {
    Ok(conn
        .prepare_cached(
            "SELECT 1 FROM schedules
             WHERE paused = 0 AND next_tick IS NOT NULL AND next_tick <= ?1 LIMIT 1",
        )?
        .query_row([now], |_| Ok(()))
        .optional()?
        .is_some())
}

/// Fires up to `max` due schedules, each as [`WorkerStore::fire_schedules`] says.
///
/// [`WorkerStore::fire_schedules`]: crate::store::WorkerStore::fire_schedules
pub(super) fn fire(
    conn: &Connection,
    max: usize,
    now: Millis,
    payloads: Payloads<'_>,
) -> Result<Vec<Tick>, TxError> {
    let names: Vec<String> = conn
        .prepare_cached(
            "SELECT name FROM schedules
             WHERE paused = 0 AND next_tick IS NOT NULL AND next_tick <= ?1
             ORDER BY next_tick LIMIT ?2",
        )?
        .query_map(params![now, to_sql_int(max as u64)?], |row| row.get(0))?
        .collect::<Result<_, _>>()?;
    let mut ticks = Vec::new();
    for name in names {
        let Some(schedule) = get(conn, &name)? else {
            continue;
        };
        fire_one(conn, &schedule, now, payloads, &mut ticks)?;
    }
    Ok(ticks)
}

fn fire_one(
    conn: &Connection,
    schedule: &ScheduleRecord,
    now: Millis,
    payloads: Payloads<'_>,
    ticks: &mut Vec<Tick>,
) -> Result<(), TxError> {
    let name = &schedule.name;
    let Some(next_tick) = schedule.next_tick else {
        return Ok(());
    };
    let plan = schedule
        .spec
        .plan(next_tick, now, schedule.catch_up)
        .unwrap_or_default();
    let deployment = super::components::deployment(conn, &schedule.deployment)?;
    let mut counts = schedule.ticks;
    counts.missed += plan.missed;
    let (mut last_tick, mut last_run) = (schedule.last_tick, schedule.last_run.clone());
    let mut last_error = schedule.last_error.clone();
    for tick in plan.fire {
        let previous = match &last_run {
            Some(run_id) => super::runs::run(conn, run_id)?.map(|r| r.status),
            None => None,
        };
        let action = tick_action(previous, schedule.overlap);
        if action == TickAction::Skip {
            counts.skipped += 1;
            ticks.push(Tick {
                schedule: name.clone(),
                tick,
                outcome: TickOutcome::Skipped,
            });
            continue;
        }
        let run_id = schedule_run_id(name, tick);
        let submitted = match &deployment {
            None => Err(format!(
                "no deployment is named {}",
                crate::text::quoted(&schedule.deployment)
            )),
            Some(deployment) => {
                if action == TickAction::CancelThenStart
                    && let Some(previous) = &last_run
                {
                    cancel_previous(conn, previous, now)?;
                }
                let submission = Submission {
                    run_id: &run_id,
                    agent: &deployment.name,
                    digest: &deployment.digest,
                    namespace: &deployment.name,
                    input: &schedule.input,
                    authority: &deployment.authority,
                    replace_authority: false,
                    priority: 0,
                };
                match super::runs::submit(conn, &submission, now, payloads) {
                    Ok(submitted) => Ok(submitted.created),
                    Err(TxError::Store(e)) => Err(e.to_string()),
                    Err(e) => return Err(e),
                }
            }
        };
        let outcome = match submitted {
            Ok(created) => {
                conn.prepare_cached(
                    "INSERT INTO scheduled_runs (run_id, schedule, tick) VALUES (?1, ?2, ?3)
                     ON CONFLICT (run_id) DO NOTHING",
                )?
                .execute(params![run_id, name, tick])?;
                counts.started += 1;
                last_tick = Some(tick);
                last_run = Some(run_id.clone());
                TickOutcome::Started { run_id, created }
            }
            Err(reason) => {
                counts.failed += 1;
                last_error = Some(reason.clone());
                TickOutcome::Failed(reason)
            }
        };
        ticks.push(Tick {
            schedule: name.clone(),
            tick,
            outcome,
        });
    }
    conn.prepare_cached(
        "UPDATE schedules SET next_tick = ?2, last_tick = ?3, last_run = ?4, started = ?5,
                              skipped = ?6, missed = ?7, failed = ?8, last_error = ?9,
                              updated = ?10
         WHERE name = ?1",
    )?
    .execute(params![
        name,
        plan.next_tick,
        last_tick,
        last_run,
        to_sql_int(counts.started)?,
        to_sql_int(counts.skipped)?,
        to_sql_int(counts.missed)?,
        to_sql_int(counts.failed)?,
        last_error,
        now
    ])?;
    Ok(())
}

/// Cancels the schedule's previous run, as an operator's cancel would; one that ended
/// meanwhile is left as it is.
fn cancel_previous(conn: &Connection, run_id: &str, now: Millis) -> Result<(), TxError> {
    match super::runs::cancel_run(conn, run_id, now) {
        Ok(_)
        | Err(TxError::Store(StoreError::RunFinished { .. } | StoreError::UnknownRun { .. })) => {
            Ok(())
        }
        Err(e) => Err(e),
    }
}
