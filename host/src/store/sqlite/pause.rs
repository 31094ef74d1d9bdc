//! Pausing and resuming runs and deployments on SQLite: the `paused` column of a run
//! and the `paused_deployments` table (migration 12, whose triggers pause each run that
//! becomes unfinished under a paused deployment's name). One writer at a time, so a
//! pause and a lease never cross.

use rusqlite::{Connection, OptionalExtension, params};

use super::TxError;
use super::runs::{lease_from, status_from, unknown_run};
use crate::store::EventKind;
use crate::store::events::NewEvent;
use crate::store::{
    DeploymentPaused, Millis, Paused, PausedBy, PausedDeployment, Resumed, RunLeaseInfo, RunStatus,
    StoreError,
};

/// A run's status underneath, who paused it, and its lease.
type PauseRow = (RunStatus, Option<String>, Option<RunLeaseInfo>);

fn pause_row(conn: &Connection, run_id: &str) -> Result<PauseRow, TxError> {
    conn.prepare_cached(
        "SELECT status, paused, lease_holder, lease_token, lease_expires
         FROM runs WHERE run_id = ?1",
    )?
    .query_row([run_id], |row| {
        Ok((status_from(row, 0)?, row.get(1)?, lease_from(row, 2)?))
    })
    .optional()?
    .ok_or_else(|| unknown_run(run_id))
}

fn refuse_finished(run_id: &str, status: RunStatus) -> Result<(), TxError> {
    if status.is_finished() {
        return Err(TxError::Store(StoreError::RunFinished {
            run_id: run_id.to_owned(),
            status,
        }));
    }
    Ok(())
}

/// Pauses the run; its worker, if a live lease is on it, learns it at its next renewal.
pub(super) fn pause_run(conn: &Connection, run_id: &str, now: Millis) -> Result<Paused, TxError> {
    let (status, paused, lease) = pause_row(conn, run_id)?;
    refuse_finished(run_id, status)?;
    if paused.as_deref() != Some(PausedBy::Run.as_str()) {
        conn.prepare_cached("UPDATE runs SET paused = ?2, updated = ?3 WHERE run_id = ?1")?
            .execute(params![run_id, PausedBy::Run.as_str(), now])?;
    }
    if paused.is_none() {
        let event = NewEvent::new(EventKind::Paused, serde_json::json!({}));
        super::events::record(conn, run_id, &event, now)?;
    }
    Ok(match (paused, lease.filter(|lease| lease.expires > now)) {
        (Some(_), _) => Paused::Already,
        (None, Some(lease)) => Paused::Requested { lease },
        (None, None) => Paused::Now,
    })
}

/// Resumes the run: it is due as it was before it was paused.
pub(super) fn resume_run(conn: &Connection, run_id: &str, now: Millis) -> Result<Resumed, TxError> {
    let (status, paused, _) = pause_row(conn, run_id)?;
    refuse_finished(run_id, status)?;
    if paused.is_none() {
        return Ok(Resumed::NotPaused);
    }
    conn.prepare_cached("UPDATE runs SET paused = NULL, updated = ?2 WHERE run_id = ?1")?
        .execute(params![run_id, now])?;
    let event = NewEvent::new(EventKind::Resumed, serde_json::json!({}));
    super::events::record(conn, run_id, &event, now)?;
    Ok(Resumed::Now)
}

/// Refuses a name no deployment has.
fn require_deployment(conn: &Connection, name: &str) -> Result<(), TxError> {
    let known = conn
        .prepare_cached("SELECT 1 FROM deployments WHERE name = ?1 LIMIT 1")?
        .query_row([name], |_| Ok(()))
        .optional()?
        .is_some();
    if known {
        Ok(())
    } else {
        Err(TxError::Store(StoreError::UnknownDeployment {
            name: name.to_owned(),
        }))
    }
}

fn is_paused(conn: &Connection, name: &str) -> Result<bool, TxError> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM paused_deployments WHERE name = ?1")?
        .query_row([name], |_| Ok(()))
        .optional()?
        .is_some())
}

/// Pauses the deployment and its unfinished runs that are not paused yet. A scan of the
/// runs: pausing a deployment is rare.
pub(super) fn pause_deployment(
    conn: &Connection,
    name: &str,
    now: Millis,
) -> Result<DeploymentPaused, TxError> {
    require_deployment(conn, name)?;
    let was_paused = is_paused(conn, name)?;
    conn.prepare_cached(
        "INSERT INTO paused_deployments (name, since) VALUES (?1, ?2)
         ON CONFLICT (name) DO NOTHING",
    )?
    .execute(params![name, now])?;
    let held: i64 = conn
        .prepare_cached(
            "SELECT count(*) FROM runs
             WHERE agent = ?1 AND status IN ('queued', 'running') AND paused IS NULL
               AND lease_holder IS NOT NULL AND lease_expires > ?2",
        )?
        .query_row(params![name, now], |row| row.get(0))?;
    let runs = conn
        .prepare_cached(
            "UPDATE runs SET paused = 'deployment', updated = ?2
             WHERE agent = ?1 AND status IN ('queued', 'running') AND paused IS NULL",
        )?
        .execute(params![name, now])?;
    Ok(DeploymentPaused {
        was_paused,
        runs: u64::try_from(runs).unwrap_or(u64::MAX),
        held: held.unsigned_abs(),
    })
}

/// Resumes the deployment and the runs paused with it (not those an operator paused
/// one by one).
pub(super) fn resume_deployment(
    conn: &Connection,
    name: &str,
    now: Millis,
) -> Result<DeploymentPaused, TxError> {
    require_deployment(conn, name)?;
    let was_paused = is_paused(conn, name)?;
    conn.prepare_cached("DELETE FROM paused_deployments WHERE name = ?1")?
        .execute([name])?;
    let runs = conn
        .prepare_cached(
            "UPDATE runs SET paused = NULL, updated = ?2
             WHERE agent = ?1 AND paused = 'deployment'",
        )?
        .execute(params![name, now])?;
    Ok(DeploymentPaused {
        was_paused,
        runs: u64::try_from(runs).unwrap_or(u64::MAX),
        held: 0,
    })
}

/// The paused deployments, by name.
pub(super) fn paused_deployments(conn: &Connection) -> Result<Vec<PausedDeployment>, TxError> {
    let paused = conn
        .prepare_cached("SELECT name, since FROM paused_deployments ORDER BY name")?
        .query_map([], |row| {
            Ok(PausedDeployment {
                name: row.get(0)?,
                since: row.get(1)?,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(paused)
}
