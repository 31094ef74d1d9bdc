//! Runs and their checkpoints on SQLite: records, progress, counts and how runs end.

use rusqlite::types::Type;
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::{TxError, to_sql_int, u64_column};
use crate::store::{Checkpoint, Counts, Millis, RunEnd, RunRecord, RunSpec, RunStatus, StoreError};

/// A `SELECT` of whole run records (with the checkpoint's step), followed by `$tail`.
macro_rules! select_records {
    ($tail:literal) => {
        concat!(
            "SELECT r.run_id, r.agent, r.digest, r.status, r.outcome,
                    r.executed, r.skipped, r.awaited, r.reclaimed, r.instances,
                    r.created, r.updated, p.step, r.namespace
             FROM runs r LEFT JOIN progress p ON p.run_id = r.run_id ",
            $tail
        )
    };
}

/// Creates the run if it is new and returns its record. Runs inside a write
/// transaction, so two processes opening the same run agree on its input.
pub(super) fn open_run(conn: &Connection, spec: &RunSpec<'_>) -> Result<RunRecord, TxError> {
    let input: Option<Vec<u8>> = conn
        .prepare_cached("SELECT input FROM runs WHERE run_id = ?1")?
        .query_row([spec.run_id], |row| row.get(0))
        .optional()?;
    match input {
        Some(input) if input != spec.input => {
            return Err(StoreError::InputMismatch {
                run_id: spec.run_id.to_owned(),
            }
            .into());
        }
        Some(_) => {
            // Opening a run means driving it: a failed run goes back to running (its
            // committed steps stay) so that status shows what is happening.
            conn.prepare_cached(
                "UPDATE runs SET status = ?2, outcome = NULL, updated = ?3
                 WHERE run_id = ?1 AND status = ?4",
            )?
            .execute(params![
                spec.run_id,
                status_name(RunStatus::Running),
                spec.now,
                status_name(RunStatus::Failed)
            ])?;
        }
        None => {
            conn.prepare_cached(
                "INSERT INTO runs
                 (run_id, agent, digest, input, status, created, updated, namespace)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6, ?7)",
            )?
            .execute(params![
                spec.run_id,
                spec.agent,
                spec.digest,
                spec.input,
                status_name(RunStatus::Running),
                spec.now,
                spec.namespace
            ])?;
        }
    }
    run(conn, spec.run_id)?.ok_or_else(|| unknown_run(spec.run_id))
}

/// Moves the run to another component and records it.
pub(super) fn upgrade_run(
    conn: &Connection,
    run_id: &str,
    from: &str,
    to: &str,
    now: Millis,
) -> Result<(), TxError> {
    let changed = conn
        .prepare_cached(
            "UPDATE runs SET digest = ?3, updated = ?4 WHERE run_id = ?1 AND digest = ?2",
        )?
        .execute(params![run_id, from, to, now])?;
    if changed != 1 {
        return Err(unknown_run(run_id));
    }
    conn.prepare_cached(
        "INSERT INTO run_upgrades (run_id, from_digest, to_digest, at) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![run_id, from, to, now])?;
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

/// Every run, newest first; runs opened in the same millisecond by insertion order.
pub(super) fn runs(conn: &Connection) -> Result<Vec<RunRecord>, TxError> {
    let records = conn
        .prepare_cached(select_records!("ORDER BY r.created DESC, r.rowid DESC"))?
        .query_map([], record)?
        .collect::<rusqlite::Result<_>>()?;
    Ok(records)
}

/// The run's last checkpoint.
pub(super) fn load_progress(
    conn: &Connection,
    run_id: &str,
) -> Result<Option<Checkpoint>, TxError> {
    let checkpoint = conn
        .prepare_cached("SELECT step, state FROM progress WHERE run_id = ?1")?
        .query_row([run_id], |row| {
            Ok(Checkpoint {
                step: u64_column(row, 0)?,
                state: row.get(1)?,
            })
        })
        .optional()?;
    Ok(checkpoint)
}

/// Replaces the checkpoint, and stores the counts if given. Runs inside a write
/// transaction, so the two never disagree.
pub(super) fn save_progress(
    conn: &Connection,
    run_id: &str,
    checkpoint: &Checkpoint,
    counts: Option<&Counts>,
    now: Millis,
) -> Result<(), TxError> {
    if let Some(counts) = counts {
        save_counts(conn, run_id, counts, now)?;
    }
    let step = to_sql_int(checkpoint.step)?;
    // The row exists after a run's first save: an UPDATE that leaves `run_id` alone
    // neither tries an insert first nor checks the foreign key again.
    let updated = conn
        .prepare_cached(
            "UPDATE progress SET step = ?2, state = ?3, updated = ?4 WHERE run_id = ?1",
        )?
        .execute(params![run_id, step, checkpoint.state, now])?;
    if updated == 1 {
        return Ok(());
    }
    conn.prepare_cached(
        "INSERT INTO progress (run_id, step, state, updated) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![run_id, step, checkpoint.state, now])
    .map_err(|e| match e.sqlite_error() {
        // The checkpoint's foreign key: the run was never opened.
        Some(e) if e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY => {
            unknown_run(run_id)
        }
        _ => TxError::Sql(e),
    })?;
    Ok(())
}

/// Stores the run's counts as given.
pub(super) fn save_counts(
    conn: &Connection,
    run_id: &str,
    counts: &Counts,
    now: Millis,
) -> Result<(), TxError> {
    let changed = conn
        .prepare_cached(
            "UPDATE runs
             SET executed = ?2, skipped = ?3, awaited = ?4, reclaimed = ?5, instances = ?6,
                 updated = ?7
             WHERE run_id = ?1",
        )?
        .execute(params![
            run_id,
            to_sql_int(counts.executed)?,
            to_sql_int(counts.skipped)?,
            to_sql_int(counts.awaited)?,
            to_sql_int(counts.reclaimed)?,
            to_sql_int(counts.instances)?,
            now
        ])?;
    if changed == 0 {
        return Err(unknown_run(run_id));
    }
    Ok(())
}

/// Records the run's end: its status, outcome bytes and final counts.
pub(super) fn finish_run(
    conn: &Connection,
    run_id: &str,
    end: RunEnd<'_>,
    counts: &Counts,
    now: Millis,
) -> Result<(), TxError> {
    let (status, outcome) = match end {
        RunEnd::Completed(output) => (RunStatus::Completed, output),
        RunEnd::Failed(error) => (RunStatus::Failed, error.as_bytes()),
    };
    save_counts(conn, run_id, counts, now)?;
    conn.prepare_cached("UPDATE runs SET status = ?2, outcome = ?3 WHERE run_id = ?1")?
        .execute(params![run_id, status_name(status), outcome])?;
    Ok(())
}

fn unknown_run(run_id: &str) -> TxError {
    TxError::Store(StoreError::UnknownRun {
        run_id: run_id.to_owned(),
    })
}

/// Reads one row of [`select_records!`].
fn record(row: &Row<'_>) -> rusqlite::Result<RunRecord> {
    let step = match row.get::<_, Option<i64>>(12)? {
        Some(_) => Some(u64_column(row, 12)?),
        None => None,
    };
    Ok(RunRecord {
        run_id: row.get(0)?,
        agent: row.get(1)?,
        digest: row.get(2)?,
        status: status_from(row, 3)?,
        outcome: row.get(4)?,
        counts: Counts {
            executed: u64_column(row, 5)?,
            skipped: u64_column(row, 6)?,
            awaited: u64_column(row, 7)?,
            reclaimed: u64_column(row, 8)?,
            instances: u64_column(row, 9)?,
        },
        created: row.get(10)?,
        updated: row.get(11)?,
        namespace: row.get(13)?,
        step,
    })
}

pub(super) fn status_name(status: RunStatus) -> &'static str {
    match status {
        RunStatus::Running => "running",
        RunStatus::Completed => "completed",
        RunStatus::Failed => "failed",
        RunStatus::InDoubt => "in-doubt",
    }
}

fn status_from(row: &Row<'_>, idx: usize) -> rusqlite::Result<RunStatus> {
    let name: String = row.get(idx)?;
    match name.as_str() {
        "running" => Ok(RunStatus::Running),
        "completed" => Ok(RunStatus::Completed),
        "failed" => Ok(RunStatus::Failed),
        "in-doubt" => Ok(RunStatus::InDoubt),
        _ => Err(rusqlite::Error::FromSqlConversionFailure(
            idx,
            Type::Text,
            Box::new(UnknownStatus(name)),
        )),
    }
}

/// A status the schema's CHECK constraint should have kept out.
#[derive(Debug, thiserror::Error)]
#[error("unknown run status {0:?}")]
struct UnknownStatus(String);
