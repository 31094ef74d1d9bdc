//! The store's epoch: fencing tokens granted after a reboot start above every token
//! granted before it.
//!
//! A claim made with durability `with-commit` is written without a sync of its own and
//! becomes durable with its commit's. Power loss before that commit may lose it, and
//! the key is then granted again; a token counted on from the key's durable row could
//! then repeat one that a downstream system already saw. So tokens have a floor,
//! `epoch << 32`, and the epoch moves on, durably, at the first open after the machine
//! booted again (Linux's boot id; where there is none, at every open). Run leases'
//! tokens, which fence a run's writes, take the same floor, as on PostgreSQL: a lease
//! granted under `sync normal` is not synced either. Within an epoch tokens count on
//! per key and per run from their rows; a store's first epoch is 0, so its tokens
//! start at 1.

use rusqlite::{Connection, TransactionBehavior};

/// Tokens of epoch `e` start at `e << EPOCH_SHIFT`.
const EPOCH_SHIFT: u32 = 32;

/// The running kernel's boot id: a fresh one at every boot.
fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    Some(id.trim().to_owned()).filter(|id| !id.is_empty())
}

/// The token floor of this open: the epoch's, after moving the epoch on if the machine
/// booted since the store last recorded its boot. The move is synced before any token
/// of the new epoch can be granted. `boot` stands in for the machine's boot id in the
/// power-loss tests, which simulate a reboot.
pub(super) fn token_floor(conn: &mut Connection, boot: Option<&str>) -> rusqlite::Result<u64> {
    let boot = boot.map(str::to_owned).or_else(boot_id);
    let read = |conn: &Connection| -> rusqlite::Result<(i64, Option<String>)> {
        conn.query_row("SELECT epoch, boot_id FROM epoch WHERE id = 0", [], |row| {
            Ok((row.get(0)?, row.get(1)?))
        })
    };
    let (epoch, recorded) = read(conn)?;
    if boot.is_some() && recorded == boot {
        return Ok(floor(epoch));
    }
    let synchronous: i64 = conn.pragma_query_value(None, "synchronous", |r| r.get(0))?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    let moved = (|| -> rusqlite::Result<i64> {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        // Judged again under the write lock: another process may have moved it.
        let (epoch, recorded) = read(&tx)?;
        let epoch = match (&recorded, &boot) {
            (Some(recorded), Some(boot)) if recorded == boot => epoch,
            // Recorded by a store made before epochs, or never opened since: nothing
            // unsynced was ever written, so the epoch stays.
            (None, Some(_)) => epoch,
            _ => epoch + 1,
        };
        tx.execute(
            "UPDATE epoch SET epoch = ?1, boot_id = ?2 WHERE id = 0",
            rusqlite::params![epoch, boot],
        )?;
        tx.commit()?;
        Ok(epoch)
    })();
    conn.pragma_update(None, "synchronous", synchronous)?;
    Ok(floor(moved?))
}

/// The first token of `epoch`.
fn floor(epoch: i64) -> u64 {
    u64::try_from(epoch).unwrap_or(0) << EPOCH_SHIFT
}
