//! Large values' blobs on PostgreSQL, as on SQLite (`store/values/blobs.rs`): stored
//! once by digest, marked used at every write that refers to them, read back whole,
//! collected by gc.

use super::TxError;
use super::conn::Conn;
use crate::store::values::blobs::{self, BlobDigest};
use crate::store::{BLOB_GRACE, Millis};

/// Stores a blob, or marks it used now if the store holds it.
pub(super) async fn put(conn: &Conn, digest: &BlobDigest, bytes: &[u8]) -> Result<(), TxError> {
    let id = &blobs::reference(digest)[..];
    // Marking it used first spares sending bytes the store holds.
    let touched = conn
        .execute(
            "UPDATE blobs SET used_at = greatest(used_at, $2) WHERE id = $1",
            &[&id, &conn.now],
        )
        .await?;
    if touched == 0 {
        let size = i64::try_from(bytes.len()).unwrap_or(i64::MAX);
        // Two writers of one new blob: the second waits for the first's row, then
        // only marks it used.
        conn.execute(
            "INSERT INTO blobs (id, size, used_at) VALUES ($1, $2, $3)
             ON CONFLICT (id) DO UPDATE SET used_at = greatest(blobs.used_at, excluded.used_at)",
            &[&id, &size, &conn.now],
        )
        .await?;
        conn.execute(
            "INSERT INTO blob_bytes (id, bytes) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING",
            &[&id, &bytes],
        )
        .await?;
    }
    Ok(())
}

/// A blob's bytes.
pub(super) async fn get(conn: &Conn, digest: &BlobDigest) -> Result<Option<Vec<u8>>, TxError> {
    let id = &blobs::reference(digest)[..];
    match conn
        .query_opt("SELECT bytes FROM blob_bytes WHERE id = $1", &[&id])
        .await?
    {
        Some(row) => Ok(Some(row.try_get(0)?)),
        None => Ok(None),
    }
}

/// Whether blob `b` is one gc collects ($1 the cut): unused since before it and
/// referred to by no row.
fn collected() -> String {
    format!(
        "b.used_at < $1 AND {}",
        blobs::unreferenced("'\\x00494201'::bytea", &[])
    )
}

/// The cut for blobs: gc's own, and never within [`BLOB_GRACE`] of `now`.
pub(super) fn cut(now: Millis, runs_before: Millis) -> Millis {
    let grace = Millis::try_from(BLOB_GRACE.as_millis()).unwrap_or(Millis::MAX);
    runs_before.min(now.saturating_sub(grace))
}

/// How many blobs gc collects.
pub(super) async fn count(conn: &Conn, before: Millis) -> Result<u64, TxError> {
    let sql = format!("SELECT count(*) FROM blobs b WHERE {}", collected());
    let n: i64 = conn.query_one(&sql, &[&before]).await?.try_get(0)?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Deletes up to a few blobs gc collects (they may be large); how many. The rows are
/// locked and judged again under the lock: a writer that marked one used meanwhile
/// keeps it.
pub(super) async fn delete(conn: &Conn, before: Millis) -> Result<u64, TxError> {
    let sql = format!(
        "WITH gone AS (
             DELETE FROM blobs WHERE id IN
                 (SELECT b.id FROM blobs b WHERE {} LIMIT 16 FOR UPDATE)
             RETURNING id)
         DELETE FROM blob_bytes WHERE id IN (SELECT id FROM gone)",
        collected()
    );
    conn.execute(&sql, &[&before]).await
}

/// A kept value with its blob read in, when it is a reference: what the backend reads
/// itself (a concurrency key in an input). A missing blob is an error.
pub(super) async fn resolved<'v>(
    conn: &Conn,
    kept: &'v [u8],
) -> Result<std::borrow::Cow<'v, [u8]>, TxError> {
    let Some(digest) = blobs::referred(kept) else {
        return Ok(std::borrow::Cow::Borrowed(kept));
    };
    match get(conn, &digest).await? {
        Some(bytes) => Ok(std::borrow::Cow::Owned(bytes)),
        None => Err(TxError::Store(crate::store::StoreError::BadBlob {
            digest: blobs::hex(&digest),
            reason: "no blob has this digest".to_owned(),
        })),
    }
}
