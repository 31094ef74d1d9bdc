//! Claims and committed results on SQLite: the claim → commit protocol, each function
//! run inside the transaction its caller opened.

use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, Row, params};

use super::{TxError, to_sql_int, u32_column, u64_column};
use crate::store::{ClaimOutcome, ClaimRequest, Grant, HeldClaim, Millis, OpenClaim, StoreError};

/// A key's claim row as it stands.
struct Current {
    holder: Option<String>,
    token: u64,
    attempt: u32,
    lease_expires: Millis,
}

/// When a lease of `lease` taken at `now` runs out. Saturates: an absurdly long lease
/// simply never expires.
pub(super) fn lease_expiry(now: Millis, lease: Duration) -> Millis {
    let lease = Millis::try_from(lease.as_millis()).unwrap_or(Millis::MAX);
    now.saturating_add(lease)
}

/// Claims `req.key` by the rules of `Store::claim`; with `stale_token`, also takes a
/// live claim held by that token (`Store::take_over`). Runs inside a write transaction.
pub(super) fn claim(
    conn: &Connection,
    req: &ClaimRequest<'_>,
    stale_token: Option<u64>,
) -> Result<ClaimOutcome, TxError> {
    if let Some(result) = committed(conn, req.key)? {
        return Ok(ClaimOutcome::Committed(result));
    }
    let current = conn
        .prepare_cached("SELECT holder, token, attempt, lease_expires FROM claims WHERE key = ?1")?
        .query_row([req.key], |row| {
            Ok(Current {
                holder: row.get(0)?,
                token: u64_column(row, 1)?,
                attempt: u32_column(row, 2)?,
                lease_expires: row.get(3)?,
            })
        })
        .optional()?;
    let lease_expires = lease_expiry(req.now, req.lease);

    let Some(current) = current else {
        let token = next_token(conn)?;
        conn.prepare_cached(
            "INSERT INTO claims (key, run_id, holder, token, attempt, lease_expires)
             VALUES (?1, ?2, ?3, ?4, 1, ?5)",
        )?
        .execute(params![
            req.key,
            req.run_id,
            req.holder,
            to_sql_int(token)?,
            lease_expires
        ])?;
        return Ok(ClaimOutcome::Granted(Grant {
            token,
            attempt: 1,
            in_doubt: false,
        }));
    };

    let in_doubt = match current.holder {
        // Released: the holder gave up before starting, or knows it did not finish.
        None => false,
        Some(_) if current.lease_expires <= req.now || stale_token == Some(current.token) => {
            // The holder vanished without committing or releasing: it may have begun
            // the side effect.
            true
        }
        Some(holder) => {
            return Ok(ClaimOutcome::Held(HeldClaim {
                holder,
                token: current.token,
                lease_expires: current.lease_expires,
            }));
        }
    };
    let token = next_token(conn)?;
    let attempt = current.attempt.saturating_add(1);
    conn.prepare_cached(
        "UPDATE claims
         SET run_id = ?2, holder = ?3, token = ?4, attempt = ?5, lease_expires = ?6
         WHERE key = ?1",
    )?
    .execute(params![
        req.key,
        req.run_id,
        req.holder,
        to_sql_int(token)?,
        attempt,
        lease_expires
    ])?;
    Ok(ClaimOutcome::Granted(Grant {
        token,
        attempt,
        in_doubt,
    }))
}

/// The next fencing token: one greater than any handed out before, in this store.
fn next_token(conn: &Connection) -> Result<u64, TxError> {
    let token = conn
        .prepare_cached("UPDATE fencing SET last_token = last_token + 1 RETURNING last_token")?
        .query_row([], |row| u64_column(row, 0))?;
    Ok(token)
}

/// Writes the result and removes the claim, if `token` still holds it. Runs inside a
/// write transaction, so a refused commit leaves nothing behind.
pub(super) fn commit(
    conn: &Connection,
    key: &str,
    token: u64,
    run_id: &str,
    result: &[u8],
    now: Millis,
) -> Result<(), TxError> {
    let lost = || {
        TxError::Store(StoreError::ClaimLost {
            key: key.to_owned(),
            token,
        })
    };
    // A token beyond SQLite's range was never handed out, so it holds nothing.
    let Ok(token_sql) = to_sql_int(token) else {
        return Err(lost());
    };
    let attempt: Option<i64> = conn
        .prepare_cached(
            "DELETE FROM claims WHERE key = ?1 AND token = ?2 AND holder IS NOT NULL
             RETURNING attempt",
        )?
        .query_row(params![key, token_sql], |row| row.get(0))
        .optional()?;
    let Some(attempt) = attempt else {
        return Err(lost());
    };
    conn.prepare_cached(
        "INSERT INTO results (key, run_id, result, token, attempt, committed_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![key, run_id, result, token_sql, attempt, now])?;
    Ok(())
}

/// Releases the claim held by `token`; whether it still held it.
pub(super) fn release(conn: &Connection, key: &str, token: u64) -> Result<bool, TxError> {
    let Ok(token) = to_sql_int(token) else {
        return Ok(false);
    };
    let changed = conn
        .prepare_cached(
            "UPDATE claims SET holder = NULL
             WHERE key = ?1 AND token = ?2 AND holder IS NOT NULL",
        )?
        .execute(params![key, token])?;
    Ok(changed == 1)
}

/// Moves the lease of the claim held by `token` to `expires`; whether it still held it.
/// An expired lease is renewed too, as long as nobody has taken the claim since.
pub(super) fn renew(
    conn: &Connection,
    key: &str,
    token: u64,
    expires: Millis,
) -> Result<bool, TxError> {
    let Ok(token) = to_sql_int(token) else {
        return Ok(false);
    };
    let changed = conn
        .prepare_cached(
            "UPDATE claims SET lease_expires = ?3
             WHERE key = ?1 AND token = ?2 AND holder IS NOT NULL",
        )?
        .execute(params![key, token, expires])?;
    Ok(changed == 1)
}

/// The committed result of `key`, if any.
pub(super) fn committed(conn: &Connection, key: &str) -> Result<Option<Vec<u8>>, TxError> {
    let result = conn
        .prepare_cached("SELECT result FROM results WHERE key = ?1")?
        .query_row([key], |row| row.get(0))
        .optional()?;
    Ok(result)
}

/// Claims not committed yet, of one run or of all, ordered by key.
pub(super) fn open_claims(
    conn: &Connection,
    run_id: Option<&str>,
) -> Result<Vec<OpenClaim>, TxError> {
    // Two statements rather than `?1 IS NULL OR run_id = ?1`, which would keep the
    // planner off the by-run index.
    let claims = match run_id {
        Some(run_id) => conn
            .prepare_cached(
                "SELECT key, run_id, holder, token, attempt, lease_expires FROM claims
                 WHERE run_id = ?1 ORDER BY key",
            )?
            .query_map([run_id], open_claim)?
            .collect::<rusqlite::Result<_>>()?,
        None => conn
            .prepare_cached(
                "SELECT key, run_id, holder, token, attempt, lease_expires FROM claims
                 ORDER BY key",
            )?
            .query_map([], open_claim)?
            .collect::<rusqlite::Result<_>>()?,
    };
    Ok(claims)
}

fn open_claim(row: &Row<'_>) -> rusqlite::Result<OpenClaim> {
    Ok(OpenClaim {
        key: row.get(0)?,
        run_id: row.get(1)?,
        holder: row.get(2)?,
        token: u64_column(row, 3)?,
        attempt: u32_column(row, 4)?,
        lease_expires: row.get(5)?,
    })
}
