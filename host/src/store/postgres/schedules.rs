//! Schedules on PostgreSQL: creating, listing, pausing and deleting them, and firing the
//! ticks that are due. A worker fires a schedule with its row locked (`FOR UPDATE SKIP
//! LOCKED`): workers firing at once take different schedules, and one that finds a
//! schedule's row already fired sees its next tick moved past now and leaves it.

use tokio_postgres::Row;

use super::conn::Conn;
use super::{TxError, to_sql_int, u64_col};
use crate::store::rules::{TickAction, check_def, tick_action};
use crate::store::{
    Millis, ScheduleDef, ScheduleRecord, ScheduleSpec, ScheduledBy, StoreError, Submission, Tick,
    TickCounts, TickOutcome, schedule_run_id,
};

macro_rules! select {
    ($tail:literal) => {
        concat!(
            "SELECT name, deployment, kind, every_ms, cron, tz, input, catch_up, overlap,
                    paused, next_tick, last_tick, last_run, started, skipped, missed, failed,
                    last_error, created, updated
             FROM schedules ",
            $tail
        )
    };
}

fn record(row: &Row) -> Result<ScheduleRecord, TxError> {
    let kind: String = row.try_get(2)?;
    let spec = if kind == "every" {
        ScheduleSpec::Every {
            every_ms: row.try_get(3)?,
        }
    } else {
        ScheduleSpec::Cron {
            expr: row.try_get(4)?,
            tz: row.try_get(5)?,
        }
    };
    let overlap: String = row.try_get(8)?;
    let catch_up = u64_col(row, 7)?;
    Ok(ScheduleRecord {
        name: row.try_get(0)?,
        deployment: row.try_get(1)?,
        spec,
        input: row.try_get(6)?,
        catch_up: u32::try_from(catch_up).unwrap_or(u32::MAX),
        // The column's CHECK admits only the three names.
        overlap: overlap.parse().unwrap_or_default(),
        paused: row.try_get(9)?,
        next_tick: row.try_get(10)?,
        last_tick: row.try_get(11)?,
        last_run: row.try_get(12)?,
        ticks: TickCounts {
            started: u64_col(row, 13)?,
            skipped: u64_col(row, 14)?,
            missed: u64_col(row, 15)?,
            failed: u64_col(row, 16)?,
        },
        last_error: row.try_get(17)?,
        created: row.try_get(18)?,
        updated: row.try_get(19)?,
    })
}

fn unknown(name: &str) -> TxError {
    TxError::Store(StoreError::UnknownSchedule {
        name: name.to_owned(),
    })
}

pub(super) async fn create(conn: &Conn, def: &ScheduleDef<'_>) -> Result<ScheduleRecord, TxError> {
    let now = conn.now;
    let first = check_def(def, now)?;
    let refuse = |reason: String| {
        TxError::Store(StoreError::ScheduleRefused {
            name: def.name.to_owned(),
            reason,
        })
    };
    if super::components::deployment(conn, def.deployment)
        .await?
        .is_none()
    {
        return Err(refuse(format!(
            "no deployment is named {}",
            crate::text::quoted(def.deployment)
        )));
    }
    let (kind, every_ms, cron, tz) = match def.spec {
        ScheduleSpec::Every { every_ms } => ("every", Some(*every_ms), None, None),
        ScheduleSpec::Cron { expr, tz } => ("cron", None, Some(expr.as_str()), Some(tz.as_str())),
    };
    let catch_up = i64::from(def.catch_up);
    // Two creators of one name meet at the primary key: the second inserts nothing.
    let inserted = conn
        .execute(
            "INSERT INTO schedules (name, deployment, kind, every_ms, cron, tz, input, catch_up,
                                    overlap, next_tick, created, updated)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $11)
             ON CONFLICT (name) DO NOTHING",
            &[
                &def.name,
                &def.deployment,
                &kind,
                &every_ms,
                &cron,
                &tz,
                &def.input,
                &catch_up,
                &def.overlap.as_str(),
                &first,
                &now,
            ],
        )
        .await?;
    if inserted == 0 {
        return Err(refuse("a schedule of that name exists".to_owned()));
    }
    get(conn, def.name).await?.ok_or_else(|| unknown(def.name))
}

pub(super) async fn list(conn: &Conn) -> Result<Vec<ScheduleRecord>, TxError> {
    conn.query(select!("ORDER BY name COLLATE \"C\""), &[])
        .await?
        .iter()
        .map(record)
        .collect()
}

pub(super) async fn get(conn: &Conn, name: &str) -> Result<Option<ScheduleRecord>, TxError> {
    match conn.query_opt(select!("WHERE name = $1"), &[&name]).await? {
        Some(row) => Ok(Some(record(&row)?)),
        None => Ok(None),
    }
}

pub(super) async fn pause(
    conn: &Conn,
    name: &str,
    paused: bool,
) -> Result<ScheduleRecord, TxError> {
    let now = conn.now;
    let record = match conn
        .query_opt(select!("WHERE name = $1 FOR UPDATE"), &[&name])
        .await?
    {
        Some(row) => record(&row)?,
        None => return Err(unknown(name)),
    };
    if record.paused == paused {
        return Ok(record);
    }
    // Resumed, it starts from now: the ticks that fell while it was paused are not run.
    let next_tick = if paused {
        record.next_tick
    } else {
        record.spec.next_after(now)
    };
    conn.execute(
        "UPDATE schedules SET paused = $2, next_tick = $3, updated = $4 WHERE name = $1",
        &[&name, &paused, &next_tick, &now],
    )
    .await?;
    get(conn, name).await?.ok_or_else(|| unknown(name))
}

pub(super) async fn delete(conn: &Conn, name: &str) -> Result<(), TxError> {
    let deleted = conn
        .execute("DELETE FROM schedules WHERE name = $1", &[&name])
        .await?;
    if deleted == 0 {
        return Err(unknown(name));
    }
    Ok(())
}

pub(super) async fn run_schedule(
    conn: &Conn,
    run_id: &str,
) -> Result<Option<ScheduledBy>, TxError> {
    match conn
        .query_opt(
            "SELECT schedule, tick FROM scheduled_runs WHERE run_id = $1",
            &[&run_id],
        )
        .await?
    {
        Some(row) => Ok(Some(ScheduledBy {
            schedule: row.try_get(0)?,
            tick: row.try_get(1)?,
        })),
        None => Ok(None),
    }
}

/// The earliest tick after `after` of a schedule that is not paused.
pub(super) async fn next_tick(conn: &Conn, after: Millis) -> Result<Option<Millis>, TxError> {
    Ok(conn
        .query_one(
            "SELECT min(next_tick) FROM schedules
             WHERE NOT paused AND next_tick IS NOT NULL AND next_tick > $1",
            &[&after],
        )
        .await?
        .try_get(0)?)
}

/// Whether a schedule that is not paused is due on the store's clock (the manual
/// clock's `manual`, else the server's): read before a worker opens a transaction to
/// fire.
pub(super) async fn any_due(conn: &Conn, manual: Option<Millis>) -> Result<bool, TxError> {
    Ok(conn
        .query_opt(
            "SELECT 1 FROM schedules
             WHERE NOT paused AND next_tick IS NOT NULL
               AND next_tick <= coalesce($1::int8, (extract(epoch FROM now()) * 1000)::int8)
             LIMIT 1",
            &[&manual],
        )
        .await?
        .is_some())
}

/// Fires up to `max` due schedules, each as [`WorkerStore::fire_schedules`] says.
///
/// [`WorkerStore::fire_schedules`]: crate::store::WorkerStore::fire_schedules
pub(super) async fn fire(conn: &Conn, max: usize) -> Result<Vec<Tick>, TxError> {
    let now = conn.now;
    let limit = to_sql_int(max as u64)?;
    // Rows another worker is firing are skipped, not waited for; a row it fired and
    // committed is read again under the lock, its next tick past now.
    let rows = conn
        .query(
            select!(
                "WHERE NOT paused AND next_tick IS NOT NULL AND next_tick <= $1
                 ORDER BY next_tick LIMIT $2 FOR UPDATE SKIP LOCKED"
            ),
            &[&now, &limit],
        )
        .await?;
    let mut ticks = Vec::new();
    for row in rows {
        let schedule = record(&row)?;
        fire_one(conn, &schedule, now, &mut ticks).await?;
    }
    Ok(ticks)
}

async fn fire_one(
    conn: &Conn,
    schedule: &ScheduleRecord,
    now: Millis,
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
    let deployment = super::components::deployment(conn, &schedule.deployment).await?;
    let mut counts = schedule.ticks;
    counts.missed += plan.missed;
    let (mut last_tick, mut last_run) = (schedule.last_tick, schedule.last_run.clone());
    let mut last_error = schedule.last_error.clone();
    for tick in plan.fire {
        let previous = match &last_run {
            Some(run_id) => super::runs::run(conn, run_id).await?.map(|r| r.status),
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
                    cancel_previous(conn, previous).await?;
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
                // A refused submission may have written before it was refused: undone
                // alone, so that the schedule's own update still commits.
                conn.batch("SAVEPOINT tick").await?;
                match super::runs::submit(conn, &submission).await {
                    Ok(submitted) => {
                        conn.batch("RELEASE SAVEPOINT tick").await?;
                        Ok(submitted.created)
                    }
                    Err(TxError::Store(e)) => {
                        conn.batch("ROLLBACK TO SAVEPOINT tick").await?;
                        Err(e.to_string())
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        let outcome = match submitted {
            Ok(created) => {
                conn.execute(
                    "INSERT INTO scheduled_runs (run_id, schedule, tick) VALUES ($1, $2, $3)
                     ON CONFLICT (run_id) DO NOTHING",
                    &[&run_id, name, &tick],
                )
                .await?;
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
    conn.execute(
        "UPDATE schedules SET next_tick = $2, last_tick = $3, last_run = $4, started = $5,
                              skipped = $6, missed = $7, failed = $8, last_error = $9,
                              updated = $10
         WHERE name = $1",
        &[
            name,
            &plan.next_tick,
            &last_tick,
            &last_run,
            &to_sql_int(counts.started)?,
            &to_sql_int(counts.skipped)?,
            &to_sql_int(counts.missed)?,
            &to_sql_int(counts.failed)?,
            &last_error,
            &now,
        ],
    )
    .await?;
    Ok(())
}

/// Cancels the schedule's previous run, as an operator's cancel would; one that ended
/// meanwhile is left as it is.
async fn cancel_previous(conn: &Conn, run_id: &str) -> Result<(), TxError> {
    match super::runs::cancel_run(conn, run_id).await {
        Ok(_)
        | Err(TxError::Store(StoreError::RunFinished { .. } | StoreError::UnknownRun { .. })) => {
            Ok(())
        }
        Err(e) => Err(e),
    }
}
