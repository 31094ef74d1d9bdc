//! Runs' live streams on PostgreSQL (`0014_live.sql`), as on SQLite: a row per chunk
//! under the run's next sequence number, its text sealed on its own in a store
//! encrypted at rest, the run's oldest rows dropped beyond what it keeps.

use super::conn::Conn;
use super::{TxError, to_sql_int, u64_col};
use crate::store::rules::LIVE_ROWS;
use crate::store::{LiveChunk, LiveText};

/// Appends `chunks` to the run's stream under the next sequence numbers, then trims it
/// to its newest `keep` bytes. The caller checked the run's fence and holds the run's
/// row, so appends of one run take turns.
pub(super) async fn append(
    conn: &Conn,
    run_id: &str,
    chunks: &[LiveText],
    keep: usize,
) -> Result<(), TxError> {
    if chunks.is_empty() {
        return Ok(());
    }
    let newest: Option<i64> = conn
        .query_one(
            "SELECT max(seq) FROM run_live WHERE run_id = $1",
            &[&run_id],
        )
        .await?
        .try_get(0)?;
    let mut seq = newest.map_or(0, |s| s.saturating_add(1));
    for chunk in chunks {
        let len = to_sql_int(chunk.text.len() as u64)?;
        conn.execute(
            "INSERT INTO run_live (run_id, seq, key, text, len) VALUES ($1, $2, $3, $4, $5)",
            &[
                &run_id,
                &seq,
                &chunk.key,
                &conn.payloads().seal(chunk.text.as_bytes())?.as_ref(),
                &len,
            ],
        )
        .await?;
        seq = seq.saturating_add(1);
    }
    // The oldest row of the newest ones that fit `keep` (and the row bound); the newest
    // row always stays, however long.
    let keep = to_sql_int(keep as u64)?;
    let first_kept: Option<i64> = conn
        .query_one(
            "SELECT min(seq) FROM (
                 SELECT seq,
                        (sum(len) OVER (ORDER BY seq DESC))::int8 AS tail,
                        row_number() OVER (ORDER BY seq DESC) AS n
                 FROM run_live WHERE run_id = $1
             ) t WHERE tail <= $2::int8 AND n <= $3::int8",
            &[&run_id, &keep, &LIVE_ROWS],
        )
        .await?
        .try_get(0)?;
    let cut = first_kept.unwrap_or(seq.saturating_sub(1));
    conn.execute(
        "DELETE FROM run_live WHERE run_id = $1 AND seq < $2",
        &[&run_id, &cut],
    )
    .await?;
    Ok(())
}

/// The run's chunks after `after` (all for `None`), oldest first, at most `limit`.
pub(super) async fn read(
    conn: &Conn,
    run_id: &str,
    after: Option<u64>,
    limit: usize,
) -> Result<Vec<LiveChunk>, TxError> {
    let after = match after {
        Some(after) => to_sql_int(after)?,
        None => -1,
    };
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = conn
        .query(
            "SELECT seq, key, text FROM run_live WHERE run_id = $1 AND seq > $2
             ORDER BY seq LIMIT $3",
            &[&run_id, &after, &limit],
        )
        .await?;
    let mut chunks = Vec::with_capacity(rows.len());
    for row in &rows {
        let text = conn.payloads().open(row.try_get::<_, &[u8]>(2)?)?;
        chunks.push(LiveChunk {
            seq: u64_col(row, 0)?,
            key: row.try_get(1)?,
            text: String::from_utf8_lossy(&text).into_owned(),
        });
    }
    Ok(chunks)
}
