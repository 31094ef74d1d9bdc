//! The store's epoch on PostgreSQL: tokens granted after the server lost acknowledged
//! transactions start above every token granted before.
//!
//! A write committed with `synchronous_commit = off` is acknowledged before it reaches
//! the disk, and a crash of the server (its process, its machine, a failover) may lose
//! it. The idem process that was told of it lives on and acts on it: a worker drives
//! the run whose lease it was granted, an effect is sent under the claim's token. If
//! that grant is lost, the token counted on from the durable row would be handed out
//! again, to another worker or another attempt, and fencing would no longer tell the
//! two apart. So tokens have a floor, `epoch << 32`, and the epoch moves on at the first
//! grant after such a crash, in a transaction that commits synchronously. Crash
//! recovery empties the unlogged `epoch_alive` (and only such events do): a grant that
//! finds it empty is the first after one. Within an epoch, tokens count on per key and
//! per run from their rows, as before.

use super::TxError;
use super::conn::Conn;

/// Tokens of epoch `e` start at `e << EPOCH_SHIFT` (as on SQLite).
const EPOCH_SHIFT: u32 = 32;

/// The floor of the current epoch as a statement that grants reads it (a `SELECT` with
/// one column, `floor`): no row when the server lost transactions since the epoch was
/// recorded, and the grant must then go through [`token_floor`] instead. A macro, so
/// that statements can `concat!` it.
macro_rules! epoch_alive_floor {
    () => {
        "SELECT epoch << 32 AS floor FROM epoch_alive WHERE id = 0"
    };
}
pub(super) use epoch_alive_floor;

/// The floor under every token this transaction grants: the current epoch's, after
/// moving the epoch on if the server crashed since it was recorded. Moving it makes
/// this transaction commit synchronously, so that no token of the new epoch is acted
/// on before the move is durable.
pub(super) async fn token_floor(conn: &Conn) -> Result<u64, TxError> {
    let alive = "SELECT epoch FROM epoch_alive WHERE id = 0";
    if let Some(row) = conn.query_opt(alive, &[]).await? {
        return Ok(floor(row.try_get(0)?));
    }
    // Writers that find it empty at once move it on once: the first takes the lock and
    // moves it, the others then find the new epoch.
    conn.query_one("SELECT epoch FROM epoch WHERE id = 0 FOR UPDATE", &[])
        .await?;
    if let Some(row) = conn.query_opt(alive, &[]).await? {
        return Ok(floor(row.try_get(0)?));
    }
    let row = conn
        .query_one(
            "UPDATE epoch SET epoch = epoch + 1 WHERE id = 0 RETURNING epoch",
            &[],
        )
        .await?;
    let epoch: i64 = row.try_get(0)?;
    conn.execute(
        "INSERT INTO epoch_alive (id, epoch) VALUES (0, $1)",
        &[&epoch],
    )
    .await?;
    conn.batch("SET LOCAL synchronous_commit TO on").await?;
    tracing::info!(
        epoch,
        "the server lost acknowledged transactions in a crash; tokens start above \
         every earlier one from here"
    );
    Ok(floor(epoch))
}

fn floor(epoch: i64) -> u64 {
    u64::try_from(epoch).unwrap_or(0) << EPOCH_SHIFT
}
