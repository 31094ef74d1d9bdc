//! Runs' live streams on SQLite (`0016_live.sql`): the statements of
//! `InstanceStore::append_live` and `OperatorStore::live`. Each chunk is a row of its
//! own, its text sealed on its own in a store encrypted at rest; trimming drops whole
//! rows, counted by the text's length in clear.

use rusqlite::{Connection, params};

use super::{TxError, to_sql_int, u64_column};
use crate::store::rules::LIVE_ROWS;
use crate::store::{LiveChunk, LiveText, Payloads};

/// Appends `chunks` to the run's stream under the next sequence numbers, then trims it
/// to its newest `keep` bytes. The caller checked the run's fence.
pub(super) fn append(
    conn: &Connection,
    run_id: &str,
    chunks: &[LiveText],
    keep: usize,
    payloads: Payloads<'_>,
) -> Result<(), TxError> {
    if chunks.is_empty() {
        return Ok(());
    }
    let newest: Option<i64> = conn
        .prepare_cached("SELECT max(seq) FROM run_live WHERE run_id = ?1")?
        .query_row([run_id], |row| row.get(0))?;
    let mut seq = newest.map_or(0, |s| s.saturating_add(1));
    for chunk in chunks {
        let len = to_sql_int(chunk.text.len() as u64)?;
        conn.prepare_cached(
            "INSERT INTO run_live (run_id, seq, key, text, len) VALUES (?1, ?2, ?3, ?4, ?5)",
        )?
        .execute(params![
            run_id,
            seq,
            chunk.key,
            payloads.seal(chunk.text.as_bytes())?,
            len
        ])?;
        seq = seq.saturating_add(1);
    }
    // The oldest row of the newest ones that fit `keep` (and the row bound); the newest
    // row always stays, however long.
    let keep = to_sql_int(keep as u64)?;
    let first_kept: Option<i64> = conn
        .prepare_cached(
            "SELECT min(seq) FROM (
                 SELECT seq,
                        sum(len) OVER (ORDER BY seq DESC) AS tail,
                        row_number() OVER (ORDER BY seq DESC) AS n
                 FROM run_live WHERE run_id = ?1
             ) WHERE tail <= ?2 AND n <= ?3",
        )?
        .query_row(params![run_id, keep, LIVE_ROWS], |row| row.get(0))?;
    let cut = first_kept.unwrap_or(seq.saturating_sub(1));
    conn.prepare_cached("DELETE FROM run_live WHERE run_id = ?1 AND seq < ?2")?
        .execute(params![run_id, cut])?;
    Ok(())
}

/// The run's chunks after `after` (all for `None`), oldest first, at most `limit`.
pub(super) fn read(
    conn: &Connection,
    run_id: &str,
    after: Option<u64>,
    limit: usize,
    payloads: Payloads<'_>,
) -> Result<Vec<LiveChunk>, TxError> {
    let after = match after {
        Some(after) => to_sql_int(after)?,
        None => -1,
    };
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut stmt = conn.prepare_cached(
        "SELECT seq, key, text FROM run_live WHERE run_id = ?1 AND seq > ?2
         ORDER BY seq LIMIT ?3",
    )?;
    let mut rows = stmt.query(params![run_id, after, limit])?;
    let mut chunks = Vec::new();
    while let Some(row) = rows.next()? {
        let stored = row.get_ref(2)?.as_blob().map_err(rusqlite::Error::from)?;
        chunks.push(LiveChunk {
            seq: u64_column(row, 0)?,
            key: row.get(1)?,
            text: String::from_utf8_lossy(&payloads.open(stored)?).into_owned(),
        });
    }
    Ok(chunks)
}
