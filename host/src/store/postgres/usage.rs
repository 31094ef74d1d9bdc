//! Token usage on PostgreSQL: the statements of `InstanceStore::record_usage` and
//! `OperatorStore::usage` (`0013_usage.sql`).

use super::conn::Conn;
use super::{TxError, to_sql_int, u64_col};
use crate::store::{Recorded, StoreError, UsageFilter, UsageRecord, UsageRefusal, UsageTotal};

/// Records `record` if its key has no usage yet, else counts a replay, in one
/// statement; the caller checked the fence.
pub(super) async fn record(conn: &Conn, record: &UsageRecord<'_>) -> Result<Recorded, TxError> {
    let t = record.tokens;
    let (input, output, cached) = (
        to_sql_int(t.input)?,
        to_sql_int(t.output)?,
        to_sql_int(t.cached)?,
    );
    // The update sees the table as it was before the statement, so it counts a replay
    // only when the row was there already (the insert did nothing).
    let row = conn
        .query_one(
            "WITH step AS (
                 SELECT 1 FROM steps WHERE key = $1 AND run_id = $2 AND result IS NOT NULL
             ), ins AS (
                 INSERT INTO step_usage (key, run_id, model, input, output, cached, recorded)
                 SELECT $1, $2, $3, $4, $5, $6, $7 FROM step
                 ON CONFLICT (key) DO NOTHING
                 RETURNING 1
             ), upd AS (
                 UPDATE step_usage SET replays = replays + 1
                 WHERE key = $1 AND EXISTS (SELECT 1 FROM step)
                   AND NOT EXISTS (SELECT 1 FROM ins)
                 RETURNING 1
             )
             SELECT EXISTS (SELECT 1 FROM step), EXISTS (SELECT 1 FROM ins),
                    EXISTS (SELECT 1 FROM upd)",
            &[
                &record.key,
                &record.fence.run_id,
                &record.model,
                &input,
                &output,
                &cached,
                &conn.now,
            ],
        )
        .await?;
    let (step, inserted, replayed): (bool, bool, bool) =
        (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
    match (step, inserted, replayed) {
        (true, true, _) => Ok(Recorded::Spent),
        (true, false, true) => Ok(Recorded::Saved),
        (true, false, false) => Err(TxError::Store(StoreError::Backend {
            op: "record a model call's usage",
            source: "the usage row was neither inserted nor found".into(),
        })),
        (false, _, _) => Err(TxError::Store(StoreError::UsageRefused {
            run_id: record.fence.run_id.clone(),
            key: record.key.to_owned(),
            refusal: UsageRefusal::UnknownStep,
        })),
    }
}

/// The usage `filter` selects, per deployment and model.
pub(super) async fn totals(
    conn: &Conn,
    filter: &UsageFilter<'_>,
) -> Result<Vec<UsageTotal>, TxError> {
    let rows = conn
        .query(
            "SELECT r.agent, u.model, count(*)::int8, sum(u.input)::int8, sum(u.output)::int8,
                    sum(u.cached)::int8, sum(u.replays)::int8,
                    sum(u.input * u.replays)::int8, sum(u.output * u.replays)::int8,
                    sum(u.cached * u.replays)::int8
             FROM step_usage u JOIN runs r ON r.run_id = u.run_id
             WHERE ($1::text IS NULL OR u.run_id = $1) AND ($2::text IS NULL OR r.agent = $2)
             GROUP BY r.agent, u.model
             ORDER BY r.agent COLLATE \"C\", u.model COLLATE \"C\"",
            &[&filter.run_id, &filter.deployment],
        )
        .await?;
    rows.iter()
        .map(|row| {
            let mut sums = [0; 8];
            for (i, sum) in sums.iter_mut().enumerate() {
                *sum = u64_col(row, i + 2)?;
            }
            Ok(UsageTotal::from_sums(
                row.try_get(0)?,
                row.try_get(1)?,
                sums,
            ))
        })
        .collect()
}
