//! Claims and committed results on PostgreSQL: the claim → commit protocol, each
//! function run inside the transaction `begin` opened (whose fence check already
//! locked the run's row).
//!
//! A key has one row in `steps` for its whole life, as on SQLite. A claim that finds
//! the row locks it (`FOR UPDATE`) before deciding, so two claimants of one key, on
//! any machines, are served one after the other; the database refuses a token that
//! does not grow and any change to a committed row (`steps_rules`).

use super::conn::Conn;
use super::epoch::token_floor;
use super::{TxError, to_sql_int, u32_col, u64_col};
use crate::store::rules::lease_expiry;
use crate::store::rules::{
    ClaimDecision, KeyRow, claim_lost, decide_claim, first_grant, next_token,
};
use crate::store::{
    ClaimOutcome, ClaimRef, ClaimRequest, OpenClaim, Resolution, RunStatus, StepRecord, StoreError,
};

/// The key's row, if any, locked until the transaction ends.
async fn current(conn: &Conn, key: &str) -> Result<Option<KeyRow>, TxError> {
    let Some(row) = conn
        .query_opt(
            "SELECT run_id, holder, token, attempt, lease_expires, parked, fingerprint, result
             FROM steps WHERE key = $1 FOR UPDATE",
            &[&key],
        )
        .await?
    else {
        return Ok(None);
    };
    Ok(Some(KeyRow {
        run_id: row.try_get(0)?,
        holder: row.try_get(1)?,
        token: u64_col(&row, 2)?,
        attempt: u32_col(&row, 3)?,
        lease_expires: row.try_get(4)?,
        parked: row.try_get(5)?,
        fingerprint: row.try_get(6)?,
        result: row.try_get(7)?,
    }))
}

/// Claims `req.key` by the rules of `InstanceStore::claim`; with `stale_token`, also takes a
/// live claim held by that token (`InstanceStore::take_over`). The caller checked the fence.
pub(super) async fn claim(
    conn: &Conn,
    req: &ClaimRequest<'_>,
    stale_token: Option<u64>,
) -> Result<ClaimOutcome, TxError> {
    let now = conn.now;
    let run_id = req.fence.run_id.as_str();
    let lease_expires = lease_expiry(now, req.lease);
    let floor = token_floor(conn).await?;
    // Most claims are of keys never seen: try the insert first. A concurrent insert of
    // the same key makes this one wait for it, then do nothing. A key never seen may be
    // one gc deleted: its first token starts above every token a deleted key had
    // (`retired`; gc deletes under a lock that waits for this transaction).
    let inserted = conn
        .query_opt(
            "INSERT INTO steps
                 (key, run_id, holder, token, attempt, claimed_at, lease_expires, fingerprint)
             VALUES ($1, $2, $3, greatest((SELECT token + 1 FROM retired WHERE id = 0), $7),
                     1, $4, $5, $6)
             ON CONFLICT (key) DO NOTHING
             RETURNING token",
            &[
                &req.key,
                &run_id,
                &req.holder,
                &now,
                &lease_expires,
                &req.fingerprint,
                &to_sql_int(floor)?,
            ],
        )
        .await?;
    if let Some(row) = inserted {
        return Ok(ClaimOutcome::Granted(first_grant(u64_col(&row, 0)?)));
    }
    let Some(current) = current(conn, req.key).await? else {
        // The insert met the row, and this transaction has written to `steps` since,
        // which keeps gc (the only deleter) out until it ends.
        return Err(TxError::Store(StoreError::Backend {
            op: "claim a key",
            source: format!("key {:?} vanished while being claimed", req.key).into(),
        }));
    };
    let grant = match decide_claim(current, req.fingerprint, stale_token, now, floor)? {
        ClaimDecision::Answer(outcome) => return Ok(outcome),
        ClaimDecision::Grant(grant) => grant,
    };
    conn.execute(
        "UPDATE steps
         SET run_id = $2, holder = $3, token = $4, attempt = $5, claimed_at = $6,
             lease_expires = $7, fingerprint = coalesce(fingerprint, $8)
         WHERE key = $1",
        &[
            &req.key,
            &run_id,
            &req.holder,
            &to_sql_int(grant.token)?,
            &i32::try_from(grant.attempt).unwrap_or(i32::MAX),
            &now,
            &lease_expires,
            &req.fingerprint,
        ],
    )
    .await?;
    if grant.in_doubt {
        // In the claim's own transaction, so `reclaimed` stays exact across crashes.
        conn.execute(
            "UPDATE runs SET reclaimed = reclaimed + 1 WHERE run_id = $1",
            &[&run_id],
        )
        .await?;
    }
    Ok(ClaimOutcome::Granted(grant))
}

fn lost(key: &str, token: u64) -> TxError {
    TxError::Store(claim_lost(key, token))
}

/// Releases the claim if its token still holds it; whether it did. The caller checked
/// the fence.
pub(super) async fn release(conn: &Conn, claim: &ClaimRef<'_>) -> Result<bool, TxError> {
    let Ok(token) = i64::try_from(claim.token) else {
        return Ok(false);
    };
    let changed = conn
        .execute(
            "UPDATE steps SET holder = NULL
             WHERE key = $1 AND token = $2 AND holder IS NOT NULL",
            &[&claim.key, &token],
        )
        .await?;
    Ok(changed == 1)
}

/// Moves the lease of one claim its token still holds to `expires`; whether it did.
pub(super) async fn renew_one(
    conn: &Conn,
    claim: &ClaimRef<'_>,
    expires: i64,
) -> Result<bool, TxError> {
    let Ok(token) = i64::try_from(claim.token) else {
        return Ok(false);
    };
    let changed = conn
        .execute(
            "UPDATE steps SET lease_expires = $3
             WHERE key = $1 AND token = $2 AND holder IS NOT NULL",
            &[&claim.key, &token, &expires],
        )
        .await?;
    Ok(changed == 1)
}

/// The committed result of `key`, if any.
pub(super) async fn committed(conn: &Conn, key: &str) -> Result<Option<Vec<u8>>, TxError> {
    let row = conn
        .query_opt(
            "SELECT result FROM steps WHERE key = $1 AND result IS NOT NULL",
            &[&key],
        )
        .await?;
    Ok(match row {
        Some(row) => Some(row.try_get(0)?),
        None => None,
    })
}

/// Claims not committed yet, of one run or of all, ordered by key.
pub(super) async fn open_claims(
    conn: &Conn,
    run_id: Option<&str>,
) -> Result<Vec<OpenClaim>, TxError> {
    let rows = conn
        .query(
            "SELECT key, run_id, holder, token, attempt, lease_expires, parked FROM steps
             WHERE result IS NULL AND ($1::text IS NULL OR run_id = $1) ORDER BY key COLLATE \"C\"",
            &[&run_id],
        )
        .await?;
    rows.iter()
        .map(|row| {
            Ok(OpenClaim {
                key: row.try_get(0)?,
                run_id: row.try_get(1)?,
                holder: row.try_get(2)?,
                token: u64_col(row, 3)?,
                attempt: u32_col(row, 4)?,
                lease_expires: row.try_get(5)?,
                parked: row.try_get(6)?,
            })
        })
        .collect()
}

/// The keys of a run: those it committed in the order it committed them, then its
/// open claims in the order they were granted.
pub(super) async fn steps(conn: &Conn, run_id: &str) -> Result<Vec<StepRecord>, TxError> {
    let rows = conn
        .query(
            "SELECT key, token, attempt, claimed_at, committed_at, holder, parked FROM steps
             WHERE run_id = $1
             ORDER BY result IS NULL, coalesce(commit_lease, 0),
                      coalesce(commit_tick, committed_at * 1000), claimed_at,
                      key COLLATE \"C\"",
            &[&run_id],
        )
        .await?;
    rows.iter()
        .map(|row| {
            Ok(StepRecord {
                key: row.try_get(0)?,
                token: u64_col(row, 1)?,
                attempt: u32_col(row, 2)?,
                claimed_at: row.try_get(3)?,
                committed_at: row.try_get(4)?,
                holder: row.try_get(5)?,
                parked: row.try_get(6)?,
            })
        })
        .collect()
}

/// Parks the claim its token holds in doubt and marks its run in doubt. The caller
/// checked the fence (locking the run's row for update).
pub(super) async fn park(conn: &Conn, claim: &ClaimRef<'_>, reason: &str) -> Result<(), TxError> {
    let Ok(token) = i64::try_from(claim.token) else {
        return Err(lost(claim.key, claim.token));
    };
    let changed = conn
        .execute(
            "UPDATE steps SET holder = NULL, parked = $3
             WHERE key = $1 AND token = $2 AND holder IS NOT NULL",
            &[&claim.key, &token, &reason],
        )
        .await?;
    if changed != 1 {
        return Err(lost(claim.key, claim.token));
    }
    let run_id = claim.fence.run_id.as_str();
    conn.execute(
        "UPDATE runs SET status = $2, updated = $3 WHERE run_id = $1",
        &[&run_id, &RunStatus::InDoubt.as_str(), &conn.now],
    )
    .await?;
    let outcome = format!("in doubt at key {}: {reason}", claim.key);
    super::runs::set_outcome(conn, run_id, Some(outcome.as_bytes())).await
}

/// Settles a key parked by `run_id`; the run resumes, with no lease, once nothing of it
/// is parked.
pub(super) async fn resolve(
    conn: &Conn,
    run_id: &str,
    key: &str,
    resolution: Resolution<'_>,
) -> Result<(), TxError> {
    let not_parked = || {
        TxError::Store(StoreError::NotInDoubt {
            run_id: run_id.to_owned(),
            key: key.to_owned(),
        })
    };
    // The run's row first, as every fenced write locks it: no deadlock with them.
    conn.query_opt(
        "SELECT 1 FROM runs WHERE run_id = $1 FOR NO KEY UPDATE",
        &[&run_id],
    )
    .await?;
    let current = current(conn, key).await?.ok_or_else(not_parked)?;
    if current.parked.is_none() || current.run_id != run_id {
        return Err(not_parked());
    }
    let now = conn.now;
    match resolution {
        Resolution::Commit(result) => {
            let token = to_sql_int(next_token("fencing token", current.token)?)?;
            conn.execute(
                "UPDATE steps
                 SET holder = NULL, parked = NULL, token = $2, result = $3, committed_at = $4
                 WHERE key = $1",
                &[&key, &token, &result, &now],
            )
            .await?;
        }
        Resolution::Retry => {
            conn.execute(
                "UPDATE steps SET parked = NULL, holder = NULL WHERE key = $1",
                &[&key],
            )
            .await?;
        }
    }
    let resumed = conn
        .execute(
            "UPDATE runs
             SET status = $2, lease_holder = NULL, lease_expires = NULL, updated = $3
             WHERE run_id = $1 AND status = $4
               AND NOT EXISTS (SELECT 1 FROM steps WHERE run_id = $1 AND parked IS NOT NULL)",
            &[
                &run_id,
                &RunStatus::Running.as_str(),
                &now,
                &RunStatus::InDoubt.as_str(),
            ],
        )
        .await?;
    if resumed == 1 {
        super::runs::set_outcome(conn, run_id, None).await?;
    }
    Ok(())
}
