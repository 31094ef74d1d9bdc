//! Large values' blobs on SQLite (`store/values/blobs.rs`): stored once by digest,
//! marked used at every write that refers to them, read back whole, collected by gc.

use rusqlite::{Connection, OptionalExtension, params};

use super::{TxError, u64_column};
use crate::store::values::blobs::{self, BlobDigest};
use crate::store::{BLOB_GRACE, Millis};

/// Stores a blob, or marks it used at `now` if the store holds it.
pub(super) fn put(
    conn: &Connection,
    digest: &BlobDigest,
    bytes: &[u8],
    now: Millis,
) -> Result<(), TxError> {
    let id = blobs::reference(digest);
    // The small row is touched, never the bytes' row: SQLite rewrites a whole row,
    // overflow pages and all, when any of its columns changes.
    let touched = conn
        .prepare_cached("UPDATE blobs SET used_at = max(used_at, ?2) WHERE id = ?1")?
        .execute(params![&id[..], now])?;
    if touched == 0 {
        let size = i64::try_from(bytes.len()).unwrap_or(i64::MAX);
        conn.prepare_cached("INSERT INTO blobs (id, size, used_at) VALUES (?1, ?2, ?3)")?
            .execute(params![&id[..], size, now])?;
        conn.prepare_cached(
            "INSERT INTO blob_bytes (id, bytes) VALUES (?1, ?2) ON CONFLICT (id) DO NOTHING",
        )?
        .execute(params![&id[..], bytes])?;
    }
    Ok(())
}

/// A blob's bytes.
pub(super) fn get(conn: &Connection, digest: &BlobDigest) -> Result<Option<Vec<u8>>, TxError> {
    let id = blobs::reference(digest);
    Ok(conn
        .prepare_cached("SELECT bytes FROM blob_bytes WHERE id = ?1")?
        .query_row([&id[..]], |row| row.get(0))
        .optional()?)
}

/// Whether blob `b` is one gc collects (uses `:before`): unused since before the cut
/// and referred to by no row.
fn collected() -> String {
    format!(
        "b.used_at < :before AND {}",
        blobs::unreferenced("X'00494201'", &[("latest_progress", "state")])
    )
}

/// The cut for blobs: gc's own, and never within [`BLOB_GRACE`] of `now`.
pub(super) fn cut(now: Millis, runs_before: Millis) -> Millis {
    let grace = Millis::try_from(BLOB_GRACE.as_millis()).unwrap_or(Millis::MAX);
    runs_before.min(now.saturating_sub(grace))
}

/// How many blobs gc collects.
pub(super) fn count(conn: &Connection, before: Millis) -> Result<u64, TxError> {
    let sql = format!("SELECT count(*) FROM blobs b WHERE {}", collected());
    Ok(conn
        .prepare_cached(&sql)?
        .query_row(rusqlite::named_params! { ":before": before }, |row| {
            u64_column(row, 0)
        })?)
}

/// Deletes up to a few blobs gc collects (they may be large); how many.
pub(super) fn delete(conn: &Connection, before: Millis) -> Result<u64, TxError> {
    let sql = format!("SELECT b.id FROM blobs b WHERE {} LIMIT 16", collected());
    let ids: Vec<Vec<u8>> = conn
        .prepare_cached(&sql)?
        .query_map(rusqlite::named_params! { ":before": before }, |row| {
            row.get(0)
        })?
        .collect::<Result<_, _>>()?;
    for id in &ids {
        conn.prepare_cached("DELETE FROM blob_bytes WHERE id = ?1")?
            .execute([id])?;
        conn.prepare_cached("DELETE FROM blobs WHERE id = ?1")?
            .execute([id])?;
    }
    Ok(ids.len() as u64)
}

/// A kept value with its blob read in, when it is a reference: what the backend reads
/// itself (a concurrency key in an input). A missing blob is an error.
pub(super) fn resolved<'v>(
    conn: &Connection,
    kept: &'v [u8],
) -> Result<std::borrow::Cow<'v, [u8]>, TxError> {
    let Some(digest) = blobs::referred(kept) else {
        return Ok(std::borrow::Cow::Borrowed(kept));
    };
    match get(conn, &digest)? {
        Some(bytes) => Ok(std::borrow::Cow::Owned(bytes)),
        None => Err(TxError::Store(crate::store::StoreError::BadBlob {
            digest: blobs::hex(&digest),
            reason: "no blob has this digest".to_owned(),
        })),
    }
}
