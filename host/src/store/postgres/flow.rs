//! Flow control on PostgreSQL: deployments' limits, runs' concurrency keys, and what
//! the lease query counts to keep within them.
//!
//! Workers lease at once on many machines, so a count read by one could be stale by
//! the time it grants. A worker leasing while limits exist locks every `flow_limits`
//! row first (in deployment order, so two never wait on each other), then counts: a
//! second worker waits for the first to commit and counts its grants. Without limits
//! nothing is locked and nothing counted.

use super::TxError;
use super::conn::Conn;
use crate::store::{
    FlowCounts, FlowLimits, FlowRefusal, FlowSetting, Limit, StoreError, Submission, check_setting,
    key_of,
};

/// The concurrency key of a run being submitted, if its deployment reads one; a
/// deployment that reads one refuses input with nothing there.
pub(super) async fn flow_key(
    conn: &Conn,
    submission: &Submission<'_>,
) -> Result<Option<String>, TxError> {
    let row = conn
        .query_opt(
            "SELECT key_pointer FROM flow_limits WHERE deployment = $1",
            &[&submission.agent],
        )
        .await?;
    let Some(pointer) = row
        .map(|row| row.try_get::<_, Option<String>>(0))
        .transpose()?
        .flatten()
    else {
        return Ok(None);
    };
    let input = super::blobs::resolved(conn, submission.input).await?;
    match key_of(&pointer, &input, conn.payloads())? {
        Some(key) => Ok(Some(key)),
        None => Err(TxError::Store(StoreError::FlowKeyMissing {
            run_id: submission.run_id.to_string(),
            deployment: submission.agent.to_string(),
            pointer,
        })),
    }
}

/// Sets a deployment's limits, and the keys of its unfinished runs as the new pointer
/// reads them (a run whose input has nothing there goes unkeyed). The runs' rows are
/// written before the limits' row is locked, as a leasing worker locks runs' rows
/// only while holding the limits (and never waits for them).
pub(super) async fn set_flow(
    conn: &Conn,
    setting: &FlowSetting<'_>,
) -> Result<FlowLimits, TxError> {
    let refused = |refusal| {
        TxError::Store(StoreError::FlowRefused {
            deployment: setting.deployment.to_string(),
            refusal,
        })
    };
    check_setting(setting).map_err(refused)?;
    let known = conn
        .query_opt(
            "SELECT 1 FROM deployments WHERE name = $1 LIMIT 1",
            &[&setting.deployment],
        )
        .await?
        .is_some();
    if !known {
        return Err(refused(FlowRefusal::UnknownDeployment(
            setting.deployment.to_string(),
        )));
    }
    rekey(conn, setting.deployment, setting.key).await?;
    let (max_running, per_key) = (
        setting.max_running.map(i64::from),
        setting.per_key.map(i64::from),
    );
    conn.execute(
        "INSERT INTO flow_limits (deployment, max_running, key_pointer, per_key, updated)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (deployment) DO UPDATE SET max_running = excluded.max_running,
             key_pointer = excluded.key_pointer, per_key = excluded.per_key,
             updated = excluded.updated",
        &[
            &setting.deployment,
            &max_running,
            &setting.key,
            &per_key,
            &conn.now,
        ],
    )
    .await?;
    Ok(FlowLimits {
        deployment: setting.deployment.to_string(),
        max_running: setting.max_running,
        key: setting.key.map(str::to_string),
        per_key: setting.per_key,
        updated: conn.now,
    })
}

/// Reads the keys of the deployment's unfinished runs again with `pointer` (none
/// without one).
async fn rekey(conn: &Conn, deployment: &str, pointer: Option<&str>) -> Result<(), TxError> {
    let rows = conn
        .query(
            "SELECT r.run_id, i.input FROM runs r JOIN run_inputs i ON i.run_id = r.run_id
             WHERE r.agent = $1 AND r.status IN ('queued', 'running')
             ORDER BY r.run_id",
            &[&deployment],
        )
        .await?;
    for row in &rows {
        let (run_id, input): (String, Vec<u8>) = (row.try_get(0)?, row.try_get(1)?);
        let key = match pointer {
            Some(pointer) => {
                let input = super::blobs::resolved(conn, &input).await?;
                key_of(pointer, &input, conn.payloads())?
            }
            None => None,
        };
        conn.execute(
            "UPDATE runs SET flow_key = $2 WHERE run_id = $1",
            &[&run_id, &key],
        )
        .await?;
    }
    Ok(())
}

/// Clears a deployment's limits; whether it had any.
pub(super) async fn clear_flow(conn: &Conn, deployment: &str) -> Result<bool, TxError> {
    rekey(conn, deployment, None).await?;
    let cleared = conn
        .execute(
            "DELETE FROM flow_limits WHERE deployment = $1",
            &[&deployment],
        )
        .await?;
    Ok(cleared > 0)
}

/// Every deployment's limits, by deployment.
pub(super) async fn flows(conn: &Conn) -> Result<Vec<FlowLimits>, TxError> {
    let rows = conn
        .query(
            "SELECT deployment, max_running, key_pointer, per_key, updated FROM flow_limits
             ORDER BY deployment",
            &[],
        )
        .await?;
    rows.iter()
        .map(|row| {
            let limit = |idx| -> Result<Option<u32>, TxError> {
                Ok(row
                    .try_get::<_, Option<i64>>(idx)?
                    .map(|n| u32::try_from(n).unwrap_or(u32::MAX)))
            };
            Ok(FlowLimits {
                deployment: row.try_get(0)?,
                max_running: limit(1)?,
                key: row.try_get(2)?,
                per_key: limit(3)?,
                updated: row.try_get(4)?,
            })
        })
        .collect()
}

/// The limits in force, locked, and the live leases they count; `None` when no
/// deployment has limits (nothing is locked then).
pub(super) async fn counts(conn: &Conn) -> Result<Option<FlowCounts>, TxError> {
    let rows = conn
        .query(
            "SELECT deployment, max_running, per_key FROM flow_limits
             ORDER BY deployment FOR UPDATE",
            &[],
        )
        .await?;
    if rows.is_empty() {
        return Ok(None);
    }
    let mut counts = FlowCounts::default();
    let mut agents = Vec::with_capacity(rows.len());
    for row in &rows {
        let limit = Limit {
            max_running: row.try_get::<_, Option<i64>>(1)?.map(i64::unsigned_abs),
            per_key: row.try_get::<_, Option<i64>>(2)?.map(i64::unsigned_abs),
        };
        let agent: String = row.try_get(0)?;
        counts.limits.insert(agent.clone(), limit);
        agents.push(agent);
    }
    // Read after the locks are held: under READ COMMITTED this statement sees every
    // grant a worker that held them before committed.
    let rows = conn
        .query(
            "SELECT agent, flow_key, count(*) FROM runs
             WHERE agent = ANY ($1) AND status IN ('queued', 'running')
               AND lease_holder IS NOT NULL AND lease_expires > $2
             GROUP BY agent, flow_key",
            &[&agents, &conn.now],
        )
        .await?;
    for row in &rows {
        let (agent, key): (String, Option<String>) = (row.try_get(0)?, row.try_get(1)?);
        let count = row.try_get::<_, i64>(2)?.unsigned_abs();
        *counts.running.entry(agent.clone()).or_insert(0) += count;
        if let Some(key) = key {
            counts.by_key.insert((agent, key), count);
        }
    }
    Ok(Some(counts))
}
