//! Claims and committed results on SQLite: the claim → commit protocol, each function
//! run inside the transaction its caller opened.
//!
//! A key has one row in `steps` for its whole life: a grant inserts or updates it, and
//! the commit fills its result in place. Each transaction of a step so writes one b-tree
//! page of `steps`, which is what keeps a durable step near the floor.

use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, Row, params};

use super::runs::status_name;
use super::{TxError, to_sql_int, u32_column, u64_column};
use crate::store::{
    ClaimOutcome, ClaimRequest, Grant, HeldClaim, Millis, OpenClaim, Resolution, RunStatus,
    StoreError,
};

/// A key's claim row as it stands.
struct Current {
    run_id: String,
    holder: Option<String>,
    token: u64,
    attempt: u32,
    lease_expires: Millis,
    parked: Option<String>,
    fingerprint: Option<String>,
    /// The committed result, once there is one.
    result: Option<Vec<u8>>,
}

/// The key's row, if any.
fn current(conn: &Connection, key: &str) -> Result<Option<Current>, TxError> {
    let current = conn
        .prepare_cached(
            "SELECT run_id, holder, token, attempt, lease_expires, parked, fingerprint, result
             FROM steps WHERE key = ?1",
        )?
        .query_row([key], |row| {
            Ok(Current {
                run_id: row.get(0)?,
                holder: row.get(1)?,
                token: u64_column(row, 2)?,
                attempt: u32_column(row, 3)?,
                lease_expires: row.get(4)?,
                parked: row.get(5)?,
                fingerprint: row.get(6)?,
                result: row.get(7)?,
            })
        })
        .optional()?;
    Ok(current)
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
    let lease_expires = lease_expiry(req.now, req.lease);
    // Most claims are of keys never seen: try the insert first, and look at the row
    // only when there is one.
    let inserted = conn
        .prepare_cached(
            "INSERT INTO steps (key, run_id, holder, token, attempt, lease_expires, fingerprint)
             VALUES (?1, ?2, ?3, 1, 1, ?4, ?5)
             ON CONFLICT (key) DO NOTHING",
        )?
        .execute(params![
            req.key,
            req.run_id,
            req.holder,
            lease_expires,
            req.fingerprint
        ])?;
    if inserted == 1 {
        return Ok(ClaimOutcome::Granted(Grant {
            token: 1,
            attempt: 1,
            in_doubt: false,
        }));
    }
    let Some(current) = current(conn, req.key)? else {
        // The insert met a row that is not there: only a corrupt index would do that.
        return Err(TxError::Sql(rusqlite::Error::QueryReturnedNoRows));
    };

    if let Some(conflict) = conflict(current.fingerprint.clone(), req.fingerprint) {
        return Ok(conflict);
    }
    if let Some(result) = current.result {
        return Ok(ClaimOutcome::Committed(result));
    }
    if let Some(reason) = current.parked {
        return Ok(ClaimOutcome::Parked {
            run_id: current.run_id,
            reason,
        });
    }
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
    let token = next_token(current.token)?;
    let attempt = current.attempt.saturating_add(1);
    conn.prepare_cached(
        "UPDATE steps
         SET run_id = ?2, holder = ?3, token = ?4, attempt = ?5, lease_expires = ?6,
             fingerprint = coalesce(fingerprint, ?7)
         WHERE key = ?1",
    )?
    .execute(params![
        req.key,
        req.run_id,
        req.holder,
        to_sql_int(token)?,
        attempt,
        lease_expires,
        req.fingerprint
    ])?;
    if in_doubt {
        count_reclaim(conn, req.run_id)?;
    }
    Ok(ClaimOutcome::Granted(Grant {
        token,
        attempt,
        in_doubt,
    }))
}

/// A conflict if the key is bound to a fingerprint and the request names another. A
/// side without a fingerprint binds nothing: the agent did not say what the step does.
fn conflict(bound: Option<String>, asked: Option<&str>) -> Option<ClaimOutcome> {
    match (bound, asked) {
        (Some(bound), Some(asked)) if bound != asked => {
            Some(ClaimOutcome::Conflict { fingerprint: bound })
        }
        _ => None,
    }
}

/// Counts a claim retaken in doubt in its run's record, in the claim's own
/// transaction, so that `reclaimed` stays exact even when the process dies before it
/// flushes its other counts. Retakes are rare, so this extra page is too; a plain grant
/// is only counted in memory (`executed` lags until the next flush). A claim made
/// outside any known run counts nowhere.
fn count_reclaim(conn: &Connection, run_id: &str) -> Result<(), TxError> {
    conn.prepare_cached("UPDATE runs SET reclaimed = reclaimed + 1 WHERE run_id = ?1")?
        .execute([run_id])?;
    Ok(())
}

/// The token of the key's next grant: one more than its last. Tokens only fence the
/// holders of one key against each other, so per-key order is all they need.
fn next_token(last: u64) -> Result<u64, TxError> {
    let next = last
        .checked_add(1)
        .ok_or_else(|| rusqlite::Error::ToSqlConversionFailure("fencing token overflow".into()))?;
    Ok(next)
}

/// The error for a commit or park by a token that no longer holds the key.
fn lost(key: &str, token: u64) -> TxError {
    TxError::Store(StoreError::ClaimLost {
        key: key.to_owned(),
        token,
    })
}

/// Writes the result into the key's row, if `token` still holds its claim: the result
/// and the end of the claim are one row, written at once. Runs inside a write
/// transaction.
pub(super) fn commit(
    conn: &Connection,
    key: &str,
    token: u64,
    run_id: &str,
    result: &[u8],
    now: Millis,
) -> Result<(), TxError> {
    // A token beyond SQLite's range was never handed out, so it holds nothing.
    let Ok(token_sql) = to_sql_int(token) else {
        return Err(lost(key, token));
    };
    let changed = conn
        .prepare_cached(
            "UPDATE steps SET run_id = ?3, holder = NULL, result = ?4, committed_at = ?5
             WHERE key = ?1 AND token = ?2 AND holder IS NOT NULL",
        )?
        .execute(params![key, token_sql, run_id, result, now])?;
    if changed != 1 {
        return Err(lost(key, token));
    }
    Ok(())
}

/// Releases the claim held by `token`; whether it still held it.
pub(super) fn release(conn: &Connection, key: &str, token: u64) -> Result<bool, TxError> {
    let Ok(token) = to_sql_int(token) else {
        return Ok(false);
    };
    let changed = conn
        .prepare_cached(
            "UPDATE steps SET holder = NULL
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
            "UPDATE steps SET lease_expires = ?3
             WHERE key = ?1 AND token = ?2 AND holder IS NOT NULL",
        )?
        .execute(params![key, token, expires])?;
    Ok(changed == 1)
}

/// The committed result of `key`, if any.
pub(super) fn committed(conn: &Connection, key: &str) -> Result<Option<Vec<u8>>, TxError> {
    let result = conn
        .prepare_cached("SELECT result FROM steps WHERE key = ?1 AND result IS NOT NULL")?
        .query_row([key], |row| row.get(0))
        .optional()?;
    Ok(result)
}

/// Claims not committed yet, of one run or of all, ordered by key.
pub(super) fn open_claims(
    conn: &Connection,
    run_id: Option<&str>,
) -> Result<Vec<OpenClaim>, TxError> {
    // A scan of every key: indexing the open ones would cost each step two more pages
    // (in at the claim, out at the commit), and only `idem status` asks.
    let claims = match run_id {
        Some(run_id) => conn
            .prepare_cached(
                "SELECT key, run_id, holder, token, attempt, lease_expires, parked FROM steps
                 WHERE result IS NULL AND run_id = ?1 ORDER BY key",
            )?
            .query_map([run_id], open_claim)?
            .collect::<rusqlite::Result<_>>()?,
        None => conn
            .prepare_cached(
                "SELECT key, run_id, holder, token, attempt, lease_expires, parked FROM steps
                 WHERE result IS NULL ORDER BY key",
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
        parked: row.get(6)?,
    })
}

/// Parks the claim held by `token` in doubt and marks its run in doubt. Runs inside a
/// write transaction.
pub(super) fn park(
    conn: &Connection,
    key: &str,
    token: u64,
    run_id: &str,
    reason: &str,
    now: Millis,
) -> Result<(), TxError> {
    let Ok(token_sql) = to_sql_int(token) else {
        return Err(lost(key, token));
    };
    let changed = conn
        .prepare_cached(
            "UPDATE steps SET holder = NULL, parked = ?3
             WHERE key = ?1 AND token = ?2 AND holder IS NOT NULL",
        )?
        .execute(params![key, token_sql, reason])?;
    if changed != 1 {
        return Err(lost(key, token));
    }
    let outcome = format!("in doubt at key {key}: {reason}");
    let changed = conn
        .prepare_cached(
            "UPDATE runs SET status = ?2, outcome = ?3, updated = ?4 WHERE run_id = ?1",
        )?
        .execute(params![
            run_id,
            status_name(RunStatus::InDoubt),
            outcome.as_bytes(),
            now
        ])?;
    if changed != 1 {
        return Err(TxError::Store(StoreError::UnknownRun {
            run_id: run_id.to_owned(),
        }));
    }
    Ok(())
}

/// Settles a key parked by `run_id`. Runs inside a write transaction.
pub(super) fn resolve(
    conn: &Connection,
    run_id: &str,
    key: &str,
    resolution: Resolution<'_>,
    now: Millis,
) -> Result<(), TxError> {
    let not_parked = || {
        TxError::Store(StoreError::NotInDoubt {
            run_id: run_id.to_owned(),
            key: key.to_owned(),
        })
    };
    let current = current(conn, key)?.ok_or_else(not_parked)?;
    if current.parked.is_none() || current.run_id != run_id {
        return Err(not_parked());
    }
    match resolution {
        Resolution::Commit(result) => {
            // A fresh token: the resolution is a commit of its own, after every
            // holder that ever had the key.
            let token = to_sql_int(next_token(current.token)?)?;
            conn.prepare_cached(
                "UPDATE steps
                 SET holder = NULL, parked = NULL, token = ?2, result = ?3, committed_at = ?4
                 WHERE key = ?1",
            )?
            .execute(params![key, token, result, now])?;
        }
        Resolution::Retry => {
            conn.prepare_cached("UPDATE steps SET parked = NULL, holder = NULL WHERE key = ?1")?
                .execute([key])?;
        }
    }
    // The run resumes once nothing of it is parked any more.
    conn.prepare_cached(
        "UPDATE runs SET status = ?2, outcome = NULL, updated = ?3
         WHERE run_id = ?1 AND status = ?4
           AND NOT EXISTS (SELECT 1 FROM steps WHERE run_id = ?1 AND parked IS NOT NULL)",
    )?
    .execute(params![
        run_id,
        status_name(RunStatus::Running),
        now,
        status_name(RunStatus::InDoubt)
    ])?;
    Ok(())
}
