//! Runs' logs on SQLite: the last bytes each run's agent wrote, in chunks.
//!
//! An append fills the newest chunk up to [`CHUNK`] bytes and adds new chunks after
//! it, then drops the oldest bytes beyond what the run keeps: whole chunks, and the
//! head of the oldest one left. A chunk fits a page, so an append rewrites a page or
//! two however much of the log is kept, where one blob per run would be rewritten
//! whole (and with it its overflow pages) at every append.

use rusqlite::{Connection, OptionalExtension, params};

use super::TxError;
use crate::store::Payloads;

/// Bytes per chunk: a row of this size stays within one 4 KiB page.
const CHUNK: usize = 3 * 1024;

/// Appends `bytes` to the run's log and keeps only its last `keep` bytes. The caller
/// checked the run's fence. In a store encrypted at rest each chunk is sealed on its
/// own, so a chunk changed is opened, changed and sealed again.
pub(super) fn append(
    conn: &Connection,
    run_id: &str,
    bytes: &[u8],
    keep: usize,
    payloads: Payloads<'_>,
) -> Result<(), TxError> {
    // Bytes that would be dropped at once are never written.
    let mut rest = &bytes[bytes.len().saturating_sub(keep)..];
    let newest: Option<(i64, Vec<u8>)> = conn
        .prepare_cached(
            "SELECT seq, bytes FROM run_logs WHERE run_id = ?1 ORDER BY seq DESC LIMIT 1",
        )?
        .query_row([run_id], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()?;
    let mut seq = match newest {
        Some((seq, stored)) => {
            let mut chunk = payloads.open(&stored)?.into_owned();
            let room = CHUNK.saturating_sub(chunk.len()).min(rest.len());
            if room > 0 {
                chunk.extend_from_slice(&rest[..room]);
                rest = &rest[room..];
                conn.prepare_cached(
                    "UPDATE run_logs SET bytes = ?3 WHERE run_id = ?1 AND seq = ?2",
                )?
                .execute(params![run_id, seq, payloads.seal(&chunk)?])?;
            }
            seq.saturating_add(1)
        }
        None => 0,
    };
    for chunk in rest.chunks(CHUNK) {
        conn.prepare_cached("INSERT INTO run_logs (run_id, seq, bytes) VALUES (?1, ?2, ?3)")?
            .execute(params![run_id, seq, payloads.seal(chunk)?])?;
        seq = seq.saturating_add(1);
    }
    trim(conn, run_id, keep, payloads)
}

/// Drops the oldest bytes of the run's log beyond `keep`.
fn trim(
    conn: &Connection,
    run_id: &str,
    keep: usize,
    payloads: Payloads<'_>,
) -> Result<(), TxError> {
    let keep = i64::try_from(keep).unwrap_or(i64::MAX);
    let overhead = i64::try_from(payloads.overhead()).unwrap_or(0);
    // `length` of a blob reads its size, not its bytes; a sealed chunk is longer than
    // its bytes by the same overhead each.
    let total: i64 = conn
        .prepare_cached(
            "SELECT coalesce(sum(length(bytes) - ?2), 0) FROM run_logs WHERE run_id = ?1",
        )?
        .query_row(params![run_id, overhead], |row| row.get(0))?;
    let mut excess = total.saturating_sub(keep);
    while excess > 0 {
        let Some((seq, len)) = conn
            .prepare_cached(
                "SELECT seq, length(bytes) - ?2 FROM run_logs WHERE run_id = ?1
                 ORDER BY seq LIMIT 1",
            )?
            .query_row(params![run_id, overhead], |row| {
                Ok((row.get::<_, i64>(0)?, row.get::<_, i64>(1)?))
            })
            .optional()?
        else {
            break;
        };
        if len <= excess {
            conn.prepare_cached("DELETE FROM run_logs WHERE run_id = ?1 AND seq = ?2")?
                .execute(params![run_id, seq])?;
            excess -= len;
        } else {
            let stored: Vec<u8> = conn
                .prepare_cached("SELECT bytes FROM run_logs WHERE run_id = ?1 AND seq = ?2")?
                .query_row(params![run_id, seq], |row| row.get(0))?;
            let chunk = payloads.open(&stored)?;
            let cut = usize::try_from(excess)
                .unwrap_or(usize::MAX)
                .min(chunk.len());
            conn.prepare_cached("UPDATE run_logs SET bytes = ?3 WHERE run_id = ?1 AND seq = ?2")?
                .execute(params![run_id, seq, payloads.seal(&chunk[cut..])?])?;
            excess = 0;
        }
    }
    Ok(())
}

/// The run's log, oldest byte first.
pub(super) fn read(
    conn: &Connection,
    run_id: &str,
    payloads: Payloads<'_>,
) -> Result<Vec<u8>, TxError> {
    let mut log = Vec::new();
    let mut stmt =
        conn.prepare_cached("SELECT bytes FROM run_logs WHERE run_id = ?1 ORDER BY seq")?;
    let mut rows = stmt.query([run_id])?;
    while let Some(row) = rows.next()? {
        let chunk = row.get_ref(0)?.as_blob().map_err(rusqlite::Error::from)?;
        log.extend_from_slice(&payloads.open(chunk)?);
    }
    Ok(log)
}
