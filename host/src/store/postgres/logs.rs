//! Runs' logs on PostgreSQL: the last bytes each run's agent wrote, in chunks, as on
//! SQLite (an append rewrites the newest chunk and adds new ones, then drops the
//! oldest bytes beyond what the run keeps). In a store encrypted at rest each chunk is
//! sealed on its own.

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
            let (seq, stored): (i64, Vec<u8>) = (row.try_get(0)?, row.try_get(1)?);
            let mut chunk = conn.payloads().open(&stored)?.into_owned();
            let room = CHUNK.saturating_sub(chunk.len()).min(rest.len());
            if room > 0 {
                chunk.extend_from_slice(&rest[..room]);
                rest = &rest[room..];
                conn.execute(
                    "UPDATE run_logs SET bytes = $3 WHERE run_id = $1 AND seq = $2",
                    &[&run_id, &seq, &conn.payloads().seal(&chunk)?.as_ref()],
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
            &[&run_id, &seq, &conn.payloads().seal(chunk)?.as_ref()],
        )
        .await?;
        seq = seq.saturating_add(1);
    }
    trim(conn, run_id, keep).await
}

/// Drops the oldest bytes of the run's log beyond `keep`.
async fn trim(conn: &Conn, run_id: &str, keep: usize) -> Result<(), TxError> {
    let keep = i64::try_from(keep).unwrap_or(i64::MAX);
    // A sealed chunk is longer than its bytes by the same overhead each.
    let overhead = i64::try_from(conn.payloads().overhead()).unwrap_or(0);
    let total: i64 = conn
        .query_one(
            "SELECT coalesce(sum(length(bytes) - $2::int8), 0)::int8 FROM run_logs WHERE run_id = $1",
            &[&run_id, &overhead],
        )
        .await?
        .try_get(0)?;
    let mut excess = total.saturating_sub(keep);
    while excess > 0 {
        let Some(row) = conn
            .query_opt(
                "SELECT seq, (length(bytes) - $2::int8)::int8 FROM run_logs WHERE run_id = $1
                 ORDER BY seq LIMIT 1",
                &[&run_id, &overhead],
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
            let stored: Vec<u8> = conn
                .query_one(
                    "SELECT bytes FROM run_logs WHERE run_id = $1 AND seq = $2",
                    &[&run_id, &seq],
                )
                .await?
                .try_get(0)?;
            let chunk = conn.payloads().open(&stored)?;
            let cut = usize::try_from(excess)
                .unwrap_or(usize::MAX)
                .min(chunk.len());
            conn.execute(
                "UPDATE run_logs SET bytes = $3 WHERE run_id = $1 AND seq = $2",
                &[
                    &run_id,
                    &seq,
                    &conn.payloads().seal(&chunk[cut..])?.as_ref(),
                ],
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
        log.extend_from_slice(&conn.payloads().open(row.try_get::<_, &[u8]>(0)?)?);
    }
    Ok(log)
}
