//! Runs on SQLite: submitting, reading and listing them, their checkpoints, counts and
//! outcomes, upgrades and cancellation. Each function runs inside the transaction (or,
//! for reads, between the transactions) of the database thread; the run leases
//! themselves are `leases.rs`.

use rusqlite::types::Type;
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::{TxError, to_sql_int, u64_column};
use crate::store::EventKind;
use crate::store::events::NewEvent;
use crate::store::history::{HISTORY_KEEP, HISTORY_KEEP_LARGE, Position};
use crate::store::{
    Cancelled, Checkpoint, Counts, MAX_PRIORITY, Millis, Payloads, RunFilter, RunLeaseInfo,
    RunRecord, RunStatus, StoreError, Submission, Submitted,
};

/// A run's status as shown: `paused` for a queued or running run an operator paused
/// (the `status` column keeps what it is underneath: resuming it clears `paused`).
macro_rules! run_status {
    () => {
        "CASE WHEN r.paused IS NOT NULL AND r.status IN ('queued', 'running') \
         THEN 'paused' ELSE r.status END"
    };
}

/// A `SELECT` of whole run records (with the checkpoint's step and the outcome),
/// followed by `$tail`. [`record`] reads its rows.
macro_rules! select_records {
    ($($tail:tt)*) => {
        concat!(
            "SELECT r.run_id, r.agent, r.digest, r.namespace, ", run_status!(), ", o.outcome,
                    r.executed, r.skipped, r.awaited, r.reclaimed, r.instances,
                    r.lease_holder, r.lease_token, r.lease_expires, r.cancel_requested,
                    r.note, r.created, r.updated,
                    (SELECT p.step FROM latest_progress p WHERE p.run_id = r.run_id),
                    r.wake_at, r.waiting_for,
                    r.recycled, r.parent, r.spawn_key, r.detached, r.joining, r.paused,
                    r.priority, r.flow_key, r.version
             FROM runs r
             LEFT JOIN run_outcomes o ON o.run_id = r.run_id ",
            $($tail)*
        )
    };
}

/// Creates the run as queued if it is new, or finds it; in one write transaction, so
/// two processes submitting the same run agree on its input.
pub(super) fn submit(
    conn: &Connection,
    submission: &Submission<'_>,
    now: Millis,
    payloads: Payloads<'_>,
) -> Result<Submitted, TxError> {
    let run_id = submission.run_id;
    // Compared by SQLite: a large input is not copied out to be compared.
    let existing: Option<(bool, String)> = conn
        .prepare_cached(
            "SELECT i.input = ?2, r.status FROM runs r JOIN run_inputs i ON i.run_id = r.run_id
             WHERE r.run_id = ?1",
        )?
        .query_row(params![run_id, submission.input], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })
        .optional()?;
    let created = match existing {
        Some((false, _)) => {
            return Err(TxError::Store(StoreError::InputMismatch {
                run_id: run_id.to_owned(),
            }));
        }
        Some((true, status)) => {
            if submission.replace_authority {
                conn.prepare_cached("UPDATE run_inputs SET authority = ?2 WHERE run_id = ?1")?
                    .execute(params![run_id, submission.authority])?;
            }
            if status == RunStatus::Failed.as_str() {
                // Submitting a failed run again resumes it (its committed steps stay).
                conn.prepare_cached("UPDATE runs SET status = ?2, updated = ?3 WHERE run_id = ?1")?
                    .execute(params![run_id, RunStatus::Running.as_str(), now])?;
                set_outcome(conn, run_id, None)?;
            }
            false
        }
        None => {
            super::components::require(conn, submission.digest)?;
            if submission.priority > MAX_PRIORITY {
                return Err(TxError::Store(StoreError::PriorityRefused {
                    priority: submission.priority,
                }));
            }
            let flow_key = super::flow::flow_key(conn, submission, payloads)?;
            conn.prepare_cached(
                "INSERT INTO runs
                     (run_id, agent, digest, namespace, status, created, updated, priority, flow_key,
                      version)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6, ?7, ?8,
                         (SELECT max(version) FROM deployments WHERE name = ?2 AND digest = ?3))",
            )?
            .execute(params![
                run_id,
                submission.agent,
                submission.digest,
                submission.namespace,
                RunStatus::Queued.as_str(),
                now,
                submission.priority,
                flow_key
            ])?;
            conn.prepare_cached(
                "INSERT INTO run_inputs (run_id, input, authority) VALUES (?1, ?2, ?3)",
            )?
            .execute(params![run_id, submission.input, submission.authority])?;
            // The run will write keys in the namespace: its component is a member.
            super::components::add_member(
                conn,
                submission.namespace,
                submission.digest,
                "run",
                now,
            )?;
            true
        }
    };
    let record = run(conn, run_id)?.ok_or_else(|| unknown_run(run_id))?;
    Ok(Submitted { record, created })
}

/// Cancels the run now if no live lease is on it, or asks its worker to.
pub(super) fn cancel_run(
    conn: &Connection,
    run_id: &str,
    now: Millis,
) -> Result<Cancelled, TxError> {
    let row: Option<(RunStatus, Option<RunLeaseInfo>)> = conn
        .prepare_cached(
            "SELECT status, lease_holder, lease_token, lease_expires FROM runs WHERE run_id = ?1",
        )?
        .query_row([run_id], |row| {
            Ok((status_from(row, 0)?, lease_from(row, 1)?))
        })
        .optional()?;
    let Some((status, lease)) = row else {
        return Err(unknown_run(run_id));
    };
    if matches!(status, RunStatus::Completed | RunStatus::Cancelled) {
        return Err(TxError::Store(StoreError::RunFinished {
            run_id: run_id.to_owned(),
            status,
        }));
    }
    if let Some(lease) = lease.filter(|lease| lease.expires > now) {
        conn.prepare_cached(
            "UPDATE runs SET cancel_requested = 1, updated = ?2 WHERE run_id = ?1",
        )?
        .execute(params![run_id, now])?;
        let event = NewEvent::new(
            EventKind::Cancelled,
            serde_json::json!({ "at_once": false }),
        );
        super::events::record(conn, run_id, &event, now)?;
        super::children::cancel_descendants(conn, run_id, now)?;
        return Ok(Cancelled::Requested { lease });
    }
    let event = NewEvent::new(EventKind::Cancelled, serde_json::json!({ "at_once": true }));
    super::events::record(conn, run_id, &event, now)?;
    end_as_cancelled(conn, run_id, now)?;
    Ok(Cancelled::Now)
}

/// Cancels the run as [`mark_cancelled`] does, and its children that are not
/// detached, and theirs ([`cancel_descendants`](super::children::cancel_descendants)).
pub(super) fn end_as_cancelled(
    conn: &Connection,
    run_id: &str,
    now: Millis,
) -> Result<(), TxError> {
    mark_cancelled(conn, run_id, now)?;
    super::children::cancel_descendants(conn, run_id, now)
}

/// Sets the run cancelled with no lease (its token stays, so no old fence works again)
/// and releases its open claims that are not parked: a cancelled run keeps no key from
/// anyone. A parent joining it counts it as ended.
pub(super) fn mark_cancelled(conn: &Connection, run_id: &str, now: Millis) -> Result<(), TxError> {
    conn.prepare_cached(
        "UPDATE runs
         SET status = ?2, lease_holder = NULL, lease_expires = NULL, cancel_requested = 0,
             wake_at = NULL, waiting_for = NULL, joining = NULL, join_left = NULL, updated = ?3
         WHERE run_id = ?1",
    )?
    .execute(params![run_id, RunStatus::Cancelled.as_str(), now])?;
    // Whoever cancelled it (its worker, an operator, an ancestor's cancellation), the
    // run ended here.
    let event = NewEvent::new(
        EventKind::Finished,
        serde_json::json!({ "status": RunStatus::Cancelled.as_str() }),
    );
    super::events::record(conn, run_id, &event, now)?;
    set_outcome(conn, run_id, None)?;
    // A scan of `steps`, as for every by-run question: cancelling is rare.
    conn.prepare_cached("UPDATE steps SET holder = NULL WHERE run_id = ?1 AND holder IS NOT NULL")?
        .execute([run_id])?;
    super::children::count_down_parent(conn, run_id, now)
}

/// Stores or clears the run's outcome.
pub(super) fn set_outcome(
    conn: &Connection,
    run_id: &str,
    outcome: Option<&[u8]>,
) -> Result<(), TxError> {
    match outcome {
        Some(outcome) => conn
            .prepare_cached(
                "INSERT INTO run_outcomes (run_id, outcome) VALUES (?1, ?2)
                 ON CONFLICT (run_id) DO UPDATE SET outcome = excluded.outcome",
            )?
            .execute(params![run_id, outcome])?,
        None => conn
            .prepare_cached("DELETE FROM run_outcomes WHERE run_id = ?1")?
            .execute([run_id])?,
    };
    Ok(())
}

/// The run's record, if it exists.
pub(super) fn run(conn: &Connection, run_id: &str) -> Result<Option<RunRecord>, TxError> {
    let record = conn
        .prepare_cached(select_records!("WHERE r.run_id = ?1"))?
        .query_row([run_id], record)
        .optional()?;
    Ok(record)
}

/// The authority the run was submitted with, if it exists.
pub(super) fn authority(conn: &Connection, run_id: &str) -> Result<Option<Vec<u8>>, TxError> {
    let authority = conn
        .prepare_cached("SELECT authority FROM run_inputs WHERE run_id = ?1")?
        .query_row([run_id], |row| row.get(0))
        .optional()?;
    Ok(authority)
}

/// The run's input as kept (sealed, or a blob's reference), if the run exists.
pub(super) fn input(conn: &Connection, run_id: &str) -> Result<Option<Vec<u8>>, TxError> {
    let input = conn
        .prepare_cached("SELECT input FROM run_inputs WHERE run_id = ?1")?
        .query_row([run_id], |row| row.get(0))
        .optional()?;
    Ok(input)
}

/// Runs as the filter asks, newest first; runs submitted in the same millisecond by
/// submission order.
pub(super) fn runs(conn: &Connection, filter: &OwnedFilter) -> Result<Vec<RunRecord>, TxError> {
    let limit = filter
        .limit
        .map_or(-1, |limit| i64::try_from(limit).unwrap_or(i64::MAX));
    let records = conn
        .prepare_cached(select_records!(
            "WHERE (?1 IS NULL OR ",
            run_status!(),
            " = ?1) AND (?2 IS NULL OR r.agent = ?2)
               AND (?4 IS NULL OR r.parent = ?4)
             ORDER BY r.created DESC, r.rowid DESC LIMIT ?3"
        ))?
        .query_map(
            params![
                filter.status.map(RunStatus::as_str),
                filter.agent,
                limit,
                filter.parent
            ],
            record,
        )?
        .collect::<rusqlite::Result<_>>()?;
    Ok(records)
}

/// A [`RunFilter`] that owns its strings, to be sent to the database thread.
pub(super) struct OwnedFilter {
    status: Option<RunStatus>,
    agent: Option<String>,
    parent: Option<String>,
    limit: Option<usize>,
}

impl From<&RunFilter<'_>> for OwnedFilter {
    fn from(filter: &RunFilter<'_>) -> Self {
        OwnedFilter {
            status: filter.status,
            agent: filter.agent.map(str::to_owned),
            parent: filter.parent.map(str::to_owned),
            limit: filter.limit,
        }
    }
}

/// The run's last checkpoint.
pub(super) fn load_progress(
    conn: &Connection,
    run_id: &str,
) -> Result<Option<Checkpoint>, TxError> {
    let checkpoint = conn
        .prepare_cached("SELECT step, state FROM latest_progress WHERE run_id = ?1")?
        .query_row([run_id], |row| {
            Ok(Checkpoint {
                step: u64_column(row, 0)?,
                state: row.get(1)?,
            })
        })
        .optional()?;
    Ok(checkpoint)
}

/// Saves the run's checkpoint at `position`: its last one, in place, and one more of
/// its history ([`super::history::keep`]). The caller checked the fence, so the run
/// exists.
pub(super) fn save_checkpoint(
    conn: &Connection,
    run_id: &str,
    checkpoint: &Checkpoint,
    position: Position,
    now: Millis,
) -> Result<(), TxError> {
    let row = super::history::Saved::new(checkpoint, position, now)?;
    // The row exists after a run's first save: an UPDATE that leaves `run_id` alone
    // neither tries an insert first nor checks the foreign key again, as an upsert
    // would at every save.
    let updated = conn
        .prepare_cached(
            "UPDATE latest_progress SET lease = ?2, tick = ?3, step = ?4, state = ?5,
                                        updated = ?6
             WHERE run_id = ?1",
        )?
        .execute(row.params(&run_id))?;
    if updated == 0 {
        conn.prepare_cached(
            "INSERT INTO latest_progress (run_id, lease, tick, step, state, updated)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )?
        .execute(row.params(&run_id))?;
    }
    super::history::keep(conn, run_id, row)
}

/// Collects the states of the run's large checkpoints but its last
/// [`HISTORY_KEEP_LARGE`], keeping their rows (their place in the history): called as
/// a large one is saved, whose blob costs far more than this.
pub(super) fn drop_large_states(conn: &Connection, run_id: &str) -> Result<(), TxError> {
    conn.prepare_cached(
        "UPDATE progress SET state = NULL
         WHERE run_id = ?1 AND substr(state, 1, 4) = X'00494201' AND (lease, tick) <=
             (SELECT lease, tick FROM progress
              WHERE run_id = ?1 AND substr(state, 1, 4) = X'00494201'
              ORDER BY lease DESC, tick DESC LIMIT 1 OFFSET ?2)",
    )?
    .execute(params![run_id, to_sql_int(HISTORY_KEEP_LARGE)?])?;
    Ok(())
}

/// Deletes the run's checkpoints but its last [`HISTORY_KEEP`], marking its history
/// cut when it deleted any.
pub(super) fn trim_history(conn: &Connection, run_id: &str) -> Result<u64, TxError> {
    let cut: Option<(i64, i64)> = conn
        .prepare_cached(
            "SELECT lease, tick FROM progress WHERE run_id = ?1
             ORDER BY lease DESC, tick DESC LIMIT 1 OFFSET ?2",
        )?
        .query_row(params![run_id, to_sql_int(HISTORY_KEEP)?], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })
        .optional()?;
    let Some((lease, tick)) = cut else {
        return Ok(0);
    };
    // Two ranges of the primary key: compared as a row value, `(lease, tick) <= cut`
    // is searched as `lease <= cut.lease` and tested row by row, every row of the run's
    // lease (most of its history) visited to delete a few.
    let mut deleted = conn
        .prepare_cached("DELETE FROM progress WHERE run_id = ?1 AND lease < ?2")?
        .execute(params![run_id, lease])?;
    deleted += conn
        .prepare_cached("DELETE FROM progress WHERE run_id = ?1 AND lease = ?2 AND tick <= ?3")?
        .execute(params![run_id, lease, tick])?;
    if deleted > 0 {
        conn.prepare_cached(
            "UPDATE runs SET history_cut = 1 WHERE run_id = ?1 AND history_cut = 0",
        )?
        .execute([run_id])?;
    }
    Ok(deleted as u64)
}

/// Stores the run's counts as given. The caller checked the fence, so the run exists.
pub(super) fn save_counts(
    conn: &Connection,
    run_id: &str,
    counts: &Counts,
    now: Millis,
) -> Result<(), TxError> {
    conn.prepare_cached(
        "UPDATE runs
         SET executed = ?2, skipped = ?3, awaited = ?4, reclaimed = ?5, instances = ?6,
             recycled = ?8, updated = ?7
         WHERE run_id = ?1",
    )?
    .execute(params![
        run_id,
        to_sql_int(counts.executed)?,
        to_sql_int(counts.skipped)?,
        to_sql_int(counts.awaited)?,
        to_sql_int(counts.reclaimed)?,
        to_sql_int(counts.instances)?,
        now,
        to_sql_int(counts.recycled)?
    ])?;
    Ok(())
}

pub(super) fn unknown_run(run_id: &str) -> TxError {
    TxError::Store(StoreError::UnknownRun {
        run_id: run_id.to_owned(),
    })
}

/// Reads one row of [`select_records!`].
pub(super) fn record(row: &Row<'_>) -> rusqlite::Result<RunRecord> {
    let step = match row.get::<_, Option<i64>>(18)? {
        Some(_) => Some(u64_column(row, 18)?),
        None => None,
    };
    Ok(RunRecord {
        run_id: row.get(0)?,
        agent: row.get(1)?,
        digest: row.get(2)?,
        namespace: row.get(3)?,
        status: status_from(row, 4)?,
        outcome: row.get(5)?,
        counts: Counts {
            executed: u64_column(row, 6)?,
            skipped: u64_column(row, 7)?,
            awaited: u64_column(row, 8)?,
            reclaimed: u64_column(row, 9)?,
            instances: u64_column(row, 10)?,
            recycled: u64_column(row, 21)?,
        },
        lease: lease_from(row, 11)?,
        cancel_requested: row.get(14)?,
        note: row.get(15)?,
        created: row.get(16)?,
        updated: row.get(17)?,
        step,
        wake_at: row.get(19)?,
        waiting_for: row.get(20)?,
        parent: row.get(22)?,
        spawn_key: row.get(23)?,
        detached: row.get(24)?,
        joining: row.get(25)?,
        paused_by: paused_by_from(row, 26)?,
        priority: u32::try_from(row.get::<_, i64>(27)?).unwrap_or(u32::MAX),
        flow_key: row.get(28)?,
        version: row
            .get::<_, Option<i64>>(29)?
            .and_then(|v| u64::try_from(v).ok()),
    })
}

/// Reads a lease from `lease_holder, lease_token, lease_expires` at `idx`..`idx + 3`.
pub(super) fn lease_from(row: &Row<'_>, idx: usize) -> rusqlite::Result<Option<RunLeaseInfo>> {
    let holder: Option<String> = row.get(idx)?;
    let expires: Option<Millis> = row.get(idx + 2)?;
    match (holder, expires) {
        (Some(worker), Some(expires)) => Ok(Some(RunLeaseInfo {
            worker,
            token: u64_column(row, idx + 1)?,
            expires,
        })),
        _ => Ok(None),
    }
}

pub(super) fn status_from(row: &Row<'_>, idx: usize) -> rusqlite::Result<RunStatus> {
    let name: String = row.get(idx)?;
    name.parse().map_err(|e: String| {
        // A status the schema's CHECK constraint should have kept out.
        rusqlite::Error::FromSqlConversionFailure(idx, Type::Text, e.into())
    })
}

/// Reads the `paused` column at `idx`.
fn paused_by_from(row: &Row<'_>, idx: usize) -> rusqlite::Result<Option<crate::store::PausedBy>> {
    let text: Option<String> = row.get(idx)?;
    match text {
        None => Ok(None),
        Some(text) => crate::store::PausedBy::parse(&text)
            .map(Some)
            .ok_or_else(|| {
                // A value the schema's CHECK constraint should have kept out.
                rusqlite::Error::FromSqlConversionFailure(
                    idx,
                    Type::Text,
                    format!("unknown pause {text:?}").into(),
                )
            }),
    }
}
