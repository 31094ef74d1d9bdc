//! The data keys of a store encrypted at rest, on SQLite (`store/sealing/` says what
//! they are).

use rusqlite::{Connection, OptionalExtension, params};

use super::TxError;
use crate::store::{DataKeyRecord, SealError};

/// Every data key, by id. A store opened read-only may be of a schema from before
/// encryption at rest: it has none.
pub(super) fn data_keys(conn: &Connection) -> Result<Vec<DataKeyRecord>, TxError> {
    let table: Option<i64> = conn
        .prepare_cached("SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'data_keys'")?
        .query_row([], |row| row.get(0))
        .optional()?;
    if table.is_none() {
        return Ok(Vec::new());
    }
    let keys = conn
        .prepare_cached("SELECT id, key_id, wrapped, created FROM data_keys ORDER BY id")?
        .query_map([], |row| {
            Ok(DataKeyRecord {
                id: row.get(0)?,
                key_id: row.get(1)?,
                wrapped: row.get(2)?,
                created: row.get(3)?,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(keys)
}

/// Records the first data key, unless there is one.
pub(super) fn put_first(conn: &Connection, record: &DataKeyRecord) -> Result<(), TxError> {
    conn.prepare_cached(
        "INSERT INTO data_keys (id, key_id, wrapped, created)
         SELECT ?1, ?2, ?3, ?4 WHERE NOT EXISTS (SELECT 1 FROM data_keys)",
    )?
    .execute(params![
        record.id,
        record.key_id,
        record.wrapped,
        record.created
    ])?;
    Ok(())
}

/// Rewraps every data key, if all are still wrapped by `old_key_id`.
pub(super) fn rewrap(
    conn: &Connection,
    old_key_id: &str,
    records: &[DataKeyRecord],
) -> Result<(), TxError> {
    let others: i64 = conn
        .prepare_cached("SELECT count(*) FROM data_keys WHERE key_id <> ?1")?
        .query_row([old_key_id], |row| row.get(0))?;
    let total: i64 = conn
        .prepare_cached("SELECT count(*) FROM data_keys")?
        .query_row([], |row| row.get(0))?;
    if others > 0 || usize::try_from(total).ok() != Some(records.len()) {
        return Err(TxError::Store(SealError::Rotated.into()));
    }
    let mut update = conn.prepare_cached(
        "UPDATE data_keys SET key_id = ?2, wrapped = ?3, created = ?4 WHERE id = ?1 AND key_id = ?5",
    )?;
    for record in records {
        let changed = update.execute(params![
            record.id,
            record.key_id,
            record.wrapped,
            record.created,
            old_key_id
        ])?;
        if changed != 1 {
            return Err(TxError::Store(SealError::Rotated.into()));
        }
    }
    Ok(())
}
