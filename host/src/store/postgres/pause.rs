//! Pausing and resuming runs and deployments on PostgreSQL: the `paused` column of a
//! run and the `paused_deployments` table (migration 10, whose trigger pauses each run
//! that becomes unfinished under a paused deployment's name).
//!
//! A run's pause locks its row, as a cancel does, so a worker leasing it at that moment
//! (`FOR UPDATE SKIP LOCKED`) either passes over it or had it first and learns the
//! pause at its next renewal. A deployment's pause or resume locks the rows it will
//! change first, then takes the name's advisory lock that the trigger takes shared as
//! a run of that name starts (in that order, so that a transaction holding one of
//! those rows while it starts a run never waits on the pause while the pause waits on
//! it); a run started meanwhile is seen by the pause's update, or sees the pause.

use super::TxError;
use super::conn::Conn;
use super::runs::{lease_from, status_from, unknown_run};
use crate::store::EventKind;
use crate::store::events::NewEvent;
use crate::store::{
    DeploymentPaused, Paused, PausedBy, PausedDeployment, Resumed, RunLeaseInfo, RunStatus,
    StoreError,
};

/// A run's status underneath, who paused it, and its lease; the row locked.
async fn pause_row(
    conn: &Conn,
    run_id: &str,
) -> Result<(RunStatus, Option<String>, Option<RunLeaseInfo>), TxError> {
    let row = conn
        .query_opt(
            "SELECT status, paused, lease_holder, lease_token, lease_expires
             FROM runs WHERE run_id = $1 FOR NO KEY UPDATE",
            &[&run_id],
        )
        .await?
        .ok_or_else(|| unknown_run(run_id))?;
    Ok((status_from(&row, 0)?, row.try_get(1)?, lease_from(&row, 2)?))
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
pub(super) async fn pause_run(conn: &Conn, run_id: &str) -> Result<Paused, TxError> {
    let (status, paused, lease) = pause_row(conn, run_id).await?;
    refuse_finished(run_id, status)?;
    if paused.as_deref() != Some(PausedBy::Run.as_str()) {
        conn.execute(
            "UPDATE runs SET paused = $2, updated = $3 WHERE run_id = $1",
            &[&run_id, &PausedBy::Run.as_str(), &conn.now],
        )
        .await?;
    }
    if paused.is_none() {
        let event = NewEvent::new(EventKind::Paused, serde_json::json!({}));
        super::events::record(conn, run_id, &[event]).await?;
    }
    Ok(
        match (paused, lease.filter(|lease| lease.expires > conn.now)) {
            (Some(_), _) => Paused::Already,
            (None, Some(lease)) => Paused::Requested { lease },
            (None, None) => Paused::Now,
        },
    )
}

/// Resumes the run: it is due as it was before it was paused.
pub(super) async fn resume_run(conn: &Conn, run_id: &str) -> Result<Resumed, TxError> {
    let (status, paused, _) = pause_row(conn, run_id).await?;
    refuse_finished(run_id, status)?;
    if paused.is_none() {
        return Ok(Resumed::NotPaused);
    }
    conn.execute(
        "UPDATE runs SET paused = NULL, updated = $2 WHERE run_id = $1",
        &[&run_id, &conn.now],
    )
    .await?;
    let event = NewEvent::new(EventKind::Resumed, serde_json::json!({}));
    super::events::record(conn, run_id, &[event]).await?;
    Ok(Resumed::Now)
}

/// Refuses a name no deployment has.
async fn require_deployment(conn: &Conn, name: &str) -> Result<(), TxError> {
    let known = conn
        .query_opt(
            "SELECT 1 FROM deployments WHERE name = $1 LIMIT 1",
            &[&name],
        )
        .await?
        .is_some();
    if known {
        Ok(())
    } else {
        Err(TxError::Store(StoreError::UnknownDeployment {
            name: name.to_owned(),
        }))
    }
}

/// Takes the name's advisory lock, exclusive, until the transaction ends.
async fn lock_name(conn: &Conn, name: &str) -> Result<(), TxError> {
    conn.query_one(
        "SELECT pg_advisory_xact_lock(hashtext('idem pause ' || current_schema() || ' ' || $1))",
        &[&name],
    )
    .await?;
    Ok(())
}

/// Pauses the deployment and its unfinished runs that are not paused yet.
pub(super) async fn pause_deployment(conn: &Conn, name: &str) -> Result<DeploymentPaused, TxError> {
    require_deployment(conn, name).await?;
    conn.query(
        "SELECT run_id FROM runs
         WHERE agent = $1 AND status IN ('queued', 'running') AND paused IS NULL
         ORDER BY run_id FOR NO KEY UPDATE",
        &[&name],
    )
    .await?;
    lock_name(conn, name).await?;
    let inserted = conn
        .execute(
            "INSERT INTO paused_deployments (name, since) VALUES ($1, $2)
             ON CONFLICT (name) DO NOTHING",
            &[&name, &conn.now],
        )
        .await?;
    let held: i64 = conn
        .query_one(
            "SELECT count(*) FROM runs
             WHERE agent = $1 AND status IN ('queued', 'running') AND paused IS NULL
               AND lease_holder IS NOT NULL AND lease_expires > $2",
            &[&name, &conn.now],
        )
        .await?
        .try_get(0)?;
    let runs = conn
        .execute(
            "UPDATE runs SET paused = 'deployment', updated = $2
             WHERE agent = $1 AND status IN ('queued', 'running') AND paused IS NULL",
            &[&name, &conn.now],
        )
        .await?;
    Ok(DeploymentPaused {
        was_paused: inserted == 0,
        runs,
        held: held.unsigned_abs(),
    })
}

/// Resumes the deployment and the runs paused with it (not those an operator paused
/// one by one).
pub(super) async fn resume_deployment(
    conn: &Conn,
    name: &str,
) -> Result<DeploymentPaused, TxError> {
    require_deployment(conn, name).await?;
    conn.query(
        "SELECT run_id FROM runs WHERE agent = $1 AND paused = 'deployment'
         ORDER BY run_id FOR NO KEY UPDATE",
        &[&name],
    )
    .await?;
    lock_name(conn, name).await?;
    let deleted = conn
        .execute("DELETE FROM paused_deployments WHERE name = $1", &[&name])
        .await?;
    let runs = conn
        .execute(
            "UPDATE runs SET paused = NULL, updated = $2
             WHERE agent = $1 AND paused = 'deployment'",
            &[&name, &conn.now],
        )
        .await?;
    Ok(DeploymentPaused {
        was_paused: deleted > 0,
        runs,
        held: 0,
    })
}

/// The paused deployments, by name.
pub(super) async fn paused_deployments(conn: &Conn) -> Result<Vec<PausedDeployment>, TxError> {
    conn.query(
        "SELECT name, since FROM paused_deployments ORDER BY name",
        &[],
    )
    .await?
    .iter()
    .map(|row| {
        Ok(PausedDeployment {
            name: row.try_get(0)?,
            since: row.try_get(1)?,
        })
    })
    .collect()
}
