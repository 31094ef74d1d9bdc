//! Token usage on SQLite: the statements of `InstanceStore::record_usage` and
//! `OperatorStore::usage` (`0015_usage.sql`).

use rusqlite::{Connection, OptionalExtension, params};

use super::{TxError, leases, to_sql_int, u64_column};
use crate::store::{
    Millis, Recorded, StoreError, UsageFilter, UsageRecord, UsageRefusal, UsageTotal,
};

/// Records `record` if its key has no usage yet, else counts a replay; in the caller's
/// write, after the fence is checked here.
pub(super) fn record(
    conn: &Connection,
    record: &UsageRecord<'_>,
    now: Millis,
) -> Result<Recorded, TxError> {
    leases::check_fence(conn, record.fence)?;
    let committed_by: Option<String> = conn
        .prepare_cached("SELECT run_id FROM steps WHERE key = ?1 AND result IS NOT NULL")?
        .query_row([record.key], |row| row.get(0))
        .optional()?;
    if committed_by.as_deref() != Some(record.fence.run_id.as_str()) {
        return Err(TxError::Store(StoreError::UsageRefused {
            run_id: record.fence.run_id.clone(),
            key: record.key.to_owned(),
            refusal: UsageRefusal::UnknownStep,
        }));
    }
    let t = record.tokens;
    let inserted = conn
        .prepare_cached(
            "INSERT INTO step_usage (key, run_id, model, input, output, cached, recorded)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (key) DO NOTHING",
        )?
        .execute(params![
            record.key,
            record.fence.run_id,
            record.model,
            to_sql_int(t.input)?,
            to_sql_int(t.output)?,
            to_sql_int(t.cached)?,
            now
        ])?;
    if inserted == 1 {
        return Ok(Recorded::Spent);
    }
    conn.prepare_cached("UPDATE step_usage SET replays = replays + 1 WHERE key = ?1")?
        .execute([record.key])?;
    Ok(Recorded::Saved)
}

/// The usage `filter` selects, per deployment and model.
pub(super) fn totals(
    conn: &Connection,
    filter: &UsageFilter<'_>,
) -> Result<Vec<UsageTotal>, TxError> {
    let mut stmt = conn.prepare_cached(
        "SELECT r.agent, u.model, count(*), sum(u.input), sum(u.output), sum(u.cached),
                sum(u.replays), sum(u.input * u.replays), sum(u.output * u.replays),
                sum(u.cached * u.replays)
         FROM step_usage u JOIN runs r ON r.run_id = u.run_id
         WHERE (?1 IS NULL OR u.run_id = ?1) AND (?2 IS NULL OR r.agent = ?2)
         GROUP BY r.agent, u.model
         ORDER BY r.agent, u.model",
    )?;
    let rows = stmt.query_map(params![filter.run_id, filter.deployment], |row| {
        let mut sums = [0; 8];
        for (i, sum) in sums.iter_mut().enumerate() {
            *sum = u64_column(row, i + 2)?;
        }
        Ok(UsageTotal::from_sums(row.get(0)?, row.get(1)?, sums))
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}
