//! Runs' logs on PostgreSQL: the last bytes each run's agent wrote, in chunks, as on
//! SQLite (an append rewrites the newest chunk and adds new ones, then drops the
//! oldest bytes beyond what the run keeps).

use super::TxError;
use super::conn::Conn;

/// Bytes per chunk: small enough that rewriting the newest one stays cheap.
const CHUNK: usize = 3 * 1024;

/// Appends `bytes` to the run's log and keeps only its last `keep` bytes. The caller
/// checked the run's fence.
pub(super) async fn append(
    conn: &Conn,
    run_id: &str,
    bytes: &[u8],
    keep: usize,
) -> Result<(), TxError> {
    let mut rest = &bytes[bytes.len().saturating_sub(keep)..];
    let newest = conn
        .query_opt(
            "SELECT seq, bytes FROM run_logs WHERE run_id = $1 ORDER BY seq DESC LIMIT 1",
            &[&run_id],
        )
        .await?;
    let mut seq: i64 = match newest {
        Some(row) => {
            let (seq, mut chunk): (i64, Vec<u8>) = (row.try_get(0)?, row.try_get(1)?);
            let room = CHUNK.saturating_sub(chunk.len()).min(rest.len());
            if room > 0 {
                chunk.extend_from_slice(&rest[..room]);
                rest = &rest[room..];
                conn.execute(
                    "UPDATE run_logs SET bytes = $3 WHERE run_id = $1 AND seq = $2",
                    &[&run_id, &seq, &chunk],
                )
                .await?;
            }
            seq.saturating_add(1)
        }
        None => 0,
    };
    for chunk in rest.chunks(CHUNK) {
        conn.execute(
            "INSERT INTO run_logs (run_id, seq, bytes) VALUES ($1, $2, $3)",
            &[&run_id, &seq, &chunk],
        )
        .await?;
        seq = seq.saturating_add(1);
    }
    trim(conn, run_id, keep).await
}

/// Drops the oldest bytes of the run's log beyond `keep`.
async fn trim(conn: &Conn, run_id: &str, keep: usize) -> Result<(), TxError> {
    let keep = i64::try_from(keep).unwrap_or(i64::MAX);
    let total: i64 = conn
        .query_one(
            "SELECT coalesce(sum(length(bytes)), 0)::int8 FROM run_logs WHERE run_id = $1",
            &[&run_id],
        )
        .await?
        .try_get(0)?;
    let mut excess = total.saturating_sub(keep);
    while excess > 0 {
        let Some(row) = conn
            .query_opt(
                "SELECT seq, length(bytes)::int8 FROM run_logs WHERE run_id = $1
                 ORDER BY seq LIMIT 1",
                &[&run_id],
            )
            .await?
        else {
            break;
        };
        let (seq, len): (i64, i64) = (row.try_get(0)?, row.try_get(1)?);
        if len <= excess {
            conn.execute(
                "DELETE FROM run_logs WHERE run_id = $1 AND seq = $2",
                &[&run_id, &seq],
            )
            .await?;
            excess -= len;
        } else {
            // `substr` of bytea counts bytes from 1.
            conn.execute(
                "UPDATE run_logs SET bytes = substr(bytes, ($3::int8 + 1)::int4)
                 WHERE run_id = $1 AND seq = $2",
                &[&run_id, &seq, &excess],
            )
            .await?;
            excess = 0;
        }
    }
    Ok(())
}

/// The run's log, oldest byte first.
pub(super) async fn read(conn: &Conn, run_id: &str) -> Result<Vec<u8>, TxError> {
    let rows = conn
        .query(
            "SELECT bytes FROM run_logs WHERE run_id = $1 ORDER BY seq",
            &[&run_id],
        )
        .await?;
    let mut log = Vec::new();
    for row in &rows {
        log.extend_from_slice(row.try_get::<_, &[u8]>(0)?);
    }
    Ok(log)
}
