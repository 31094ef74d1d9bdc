//! The data keys of a store encrypted at rest, on PostgreSQL (`store/sealing/` says
//! what they are).

use super::TxError;
use super::conn::Conn;
use crate::store::{DataKeyRecord, SealError};

/// Every data key, by id.
pub(super) async fn data_keys(conn: &Conn) -> Result<Vec<DataKeyRecord>, TxError> {
    let rows = conn
        .query(
            "SELECT id, key_id, wrapped, created FROM data_keys ORDER BY id",
            &[],
        )
        .await?;
    rows.iter()
        .map(|row| {
            let id: i64 = row.try_get(0)?;
            Ok(DataKeyRecord {
                id: u32::try_from(id).map_err(|_| {
                    TxError::Store(SealError::Unreadable { what: "data key" }.into())
                })?,
                key_id: row.try_get(1)?,
                wrapped: row.try_get(2)?,
                created: row.try_get(3)?,
            })
        })
        .collect()
}

/// Records the first data key, unless there is one. Two processes making a new
/// store's key at once: the table's lock makes the second find the first's.
pub(super) async fn put_first(conn: &Conn, record: &DataKeyRecord) -> Result<(), TxError> {
    conn.execute("LOCK TABLE data_keys IN EXCLUSIVE MODE", &[])
        .await?;
    conn.execute(
        "INSERT INTO data_keys (id, key_id, wrapped, created)
         SELECT $1, $2, $3, $4 WHERE NOT EXISTS (SELECT 1 FROM data_keys)",
        &[
            &i64::from(record.id),
            &record.key_id,
            &record.wrapped,
            &record.created,
        ],
    )
    .await?;
    Ok(())
}

/// Rewraps every data key, if all are still wrapped by `old_key_id`.
pub(super) async fn rewrap(
    conn: &Conn,
    old_key_id: &str,
    records: &[DataKeyRecord],
) -> Result<(), TxError> {
    conn.execute("LOCK TABLE data_keys IN EXCLUSIVE MODE", &[])
        .await?;
    let row = conn
        .query_one(
            "SELECT count(*) FILTER (WHERE key_id <> $1), count(*) FROM data_keys",
            &[&old_key_id],
        )
        .await?;
    let (others, total): (i64, i64) = (row.try_get(0)?, row.try_get(1)?);
    if others > 0 || usize::try_from(total).ok() != Some(records.len()) {
        return Err(TxError::Store(SealError::Rotated.into()));
    }
    for record in records {
        let changed = conn
            .execute(
                "UPDATE data_keys SET key_id = $2, wrapped = $3, created = $4
                 WHERE id = $1 AND key_id = $5",
                &[
                    &i64::from(record.id),
                    &record.key_id,
                    &record.wrapped,
                    &record.created,
                    &old_key_id,
                ],
            )
            .await?;
        if changed != 1 {
            return Err(TxError::Store(SealError::Rotated.into()));
        }
    }
    Ok(())
}
