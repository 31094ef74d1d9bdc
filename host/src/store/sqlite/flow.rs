//! Flow control on SQLite: deployments' limits, runs' concurrency keys, and what the
//! lease query counts to keep within them. Every lease is granted in the one write
//! transaction of the database's writer, so a count read there is exact.

use rusqlite::{Connection, OptionalExtension, params};

use super::TxError;
use crate::store::{
    FlowCounts, FlowLimits, FlowRefusal, FlowSetting, Limit, Millis, Payloads, StoreError,
    Submission, check_setting, key_of,
};

/// The concurrency key of a run being submitted, if its deployment reads one; a
/// deployment that reads one refuses input with nothing there.
pub(super) fn flow_key(
    conn: &Connection,
    submission: &Submission<'_>,
    payloads: Payloads<'_>,
) -> Result<Option<String>, TxError> {
    let pointer: Option<Option<String>> = conn
        .prepare_cached("SELECT key_pointer FROM flow_limits WHERE deployment = ?1")?
        .query_row([submission.agent], |row| row.get(0))
        .optional()?;
    let Some(pointer) = pointer.flatten() else {
        return Ok(None);
    };
    let input = super::blobs::resolved(conn, submission.input)?;
    match key_of(&pointer, &input, payloads)? {
        Some(key) => Ok(Some(key)),
        None => Err(TxError::Store(StoreError::FlowKeyMissing {
            run_id: submission.run_id.to_string(),
            deployment: submission.agent.to_string(),
            pointer,
        })),
    }
}

/// Sets a deployment's limits, and the keys of its unfinished runs as the new pointer
/// reads them (a run whose input has nothing there goes unkeyed).
pub(super) fn set_flow(
    conn: &Connection,
    setting: &FlowSetting<'_>,
    now: Millis,
    payloads: Payloads<'_>,
) -> Result<FlowLimits, TxError> {
    let refused = |refusal| {
        TxError::Store(StoreError::FlowRefused {
            deployment: setting.deployment.to_string(),
            refusal,
        })
    };
    check_setting(setting).map_err(refused)?;
    let known = conn
        .prepare_cached("SELECT 1 FROM deployments WHERE name = ?1 LIMIT 1")?
        .query_row([setting.deployment], |_| Ok(()))
        .optional()?
        .is_some();
    if !known {
        return Err(refused(FlowRefusal::UnknownDeployment(
            setting.deployment.to_string(),
        )));
    }
    conn.prepare_cached(
        "INSERT INTO flow_limits (deployment, max_running, key_pointer, per_key, updated)
         VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (deployment) DO UPDATE SET max_running = excluded.max_running,
             key_pointer = excluded.key_pointer, per_key = excluded.per_key,
             updated = excluded.updated",
    )?
    .execute(params![
        setting.deployment,
        setting.max_running,
        setting.key,
        setting.per_key,
        now
    ])?;
    rekey(conn, setting.deployment, setting.key, payloads)?;
    Ok(FlowLimits {
        deployment: setting.deployment.to_string(),
        max_running: setting.max_running,
        key: setting.key.map(str::to_string),
        per_key: setting.per_key,
        updated: now,
    })
}

/// Reads the keys of the deployment's unfinished runs again with `pointer` (none
/// without one).
fn rekey(
    conn: &Connection,
    deployment: &str,
    pointer: Option<&str>,
    payloads: Payloads<'_>,
) -> Result<(), TxError> {
    let runs: Vec<(String, Vec<u8>)> = conn
        .prepare_cached(
            "SELECT r.run_id, i.input FROM runs r JOIN run_inputs i ON i.run_id = r.run_id
             WHERE r.agent = ?1 AND r.status IN ('queued', 'running')",
        )?
        .query_map([deployment], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let mut update = conn.prepare_cached("UPDATE runs SET flow_key = ?2 WHERE run_id = ?1")?;
    for (run_id, input) in runs {
        let key = match pointer {
            Some(pointer) => key_of(pointer, &super::blobs::resolved(conn, &input)?, payloads)?,
            None => None,
        };
        update.execute(params![run_id, key])?;
    }
    Ok(())
}

/// Clears a deployment's limits; whether it had any.
pub(super) fn clear_flow(conn: &Connection, deployment: &str) -> Result<bool, TxError> {
    let cleared = conn
        .prepare_cached("DELETE FROM flow_limits WHERE deployment = ?1")?
        .execute([deployment])?;
    if cleared > 0 {
        rekey(conn, deployment, None, Payloads::default())?;
    }
    Ok(cleared > 0)
}

/// Every deployment's limits, by deployment.
pub(super) fn flows(conn: &Connection) -> Result<Vec<FlowLimits>, TxError> {
    let limits = conn
        .prepare_cached(
            "SELECT deployment, max_running, key_pointer, per_key, updated FROM flow_limits
             ORDER BY deployment",
        )?
        .query_map([], |row| {
            Ok(FlowLimits {
                deployment: row.get(0)?,
                max_running: row.get(1)?,
                key: row.get(2)?,
                per_key: row.get(3)?,
                updated: row.get(4)?,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(limits)
}

/// The limits in force and the live leases they count, or `None` when no deployment
/// has limits: the lease query then counts nothing.
pub(super) fn counts(conn: &Connection, now: Millis) -> Result<Option<FlowCounts>, TxError> {
    let mut counts = FlowCounts::default();
    {
        let mut stmt =
            conn.prepare_cached("SELECT deployment, max_running, per_key FROM flow_limits")?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let limit = Limit {
                max_running: row.get::<_, Option<i64>>(1)?.map(|n| n.unsigned_abs()),
                per_key: row.get::<_, Option<i64>>(2)?.map(|n| n.unsigned_abs()),
            };
            counts.limits.insert(row.get(0)?, limit);
        }
    }
    if counts.limits.is_empty() {
        return Ok(None);
    }
    // A run counts while a live lease is on it: one whose lease ran out is free for
    // any worker, and counted again by whoever takes it.
    let mut stmt = conn.prepare_cached(
        "SELECT flow_key, count(*) FROM runs
         WHERE agent = ?1 AND status IN ('queued', 'running')
           AND lease_holder IS NOT NULL AND lease_expires > ?2
         GROUP BY flow_key",
    )?;
    let agents: Vec<String> = counts.limits.keys().cloned().collect();
    for agent in agents {
        let mut rows = stmt.query(params![agent, now])?;
        let mut running = 0;
        while let Some(row) = rows.next()? {
            let key: Option<String> = row.get(0)?;
            let count = row.get::<_, i64>(1)?.unsigned_abs();
            running += count;
            if let Some(key) = key {
                counts.by_key.insert((agent.clone(), key), count);
            }
        }
        counts.running.insert(agent, running);
    }
    Ok(Some(counts))
}
