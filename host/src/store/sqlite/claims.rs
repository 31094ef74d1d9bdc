//! Claims and committed results on SQLite: the claim → commit protocol, each function
//! run inside the transaction the database thread opened.
//!
//! A key has one row in `steps` for its whole life: a grant inserts or updates it, and
//! the commit fills its result in place. Each transaction of a step so writes one b-tree
//! page of `steps` (and the run's checkpoint and counts when the commit carries them):
//! the run's fence is checked by reading the run's row, not by writing it. That is what
//! keeps a durable step near the floor.

use std::collections::HashMap;

use rusqlite::{Connection, OptionalExtension, Row, params};

use super::leases::{check_fence, fence_holds, lease_lost};
use super::runs::{self, set_outcome};
use super::{TxError, to_sql_int, u32_column, u64_column};
use crate::store::history::{self, Position};
use crate::store::rules::lease_expiry;
use crate::store::rules::{
    ClaimDecision, KeyRow, claim_lost, decide_claim, first_grant, next_token,
};
use crate::store::{
    ClaimOutcome, ClaimRef, ClaimRequest, Commit, Millis, OpenClaim, Resolution, RunFence,
    RunStatus, StepRecord, StoreError,
};

/// The key's row, if any.
fn current(conn: &Connection, key: &str) -> Result<Option<KeyRow>, TxError> {
    let current = conn
        .prepare_cached(
            "SELECT run_id, holder, token, attempt, lease_expires, parked, fingerprint, result
             FROM steps WHERE key = ?1",
        )?
        .query_row([key], |row| {
            Ok(KeyRow {
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

/// What a claim reads before it writes, in one statement (each statement costs a
/// step a few thousand instructions of its own): refuses the claim if `fence` is not
/// the run's current lease, else gives the store's retired mark, above which a key's
/// first token starts.
fn fence_and_retired(conn: &Connection, fence: &RunFence) -> Result<u64, TxError> {
    // A token beyond SQLite's range was never handed out, so it holds nothing.
    let Ok(token) = to_sql_int(fence.token) else {
        return Err(lease_lost(fence));
    };
    let (retired, holds) = conn
        .prepare_cached(
            "SELECT retired, EXISTS (SELECT 1 FROM runs
                 WHERE run_id = ?1 AND lease_token = ?2 AND lease_holder IS NOT NULL)
             FROM epoch WHERE id = 0",
        )?
        .query_row(params![fence.run_id, token], |row| {
            Ok((u64_column(row, 0)?, row.get::<_, bool>(1)?))
        })?;
    if holds {
        Ok(retired)
    } else {
        Err(lease_lost(fence))
    }
}

/// Claims `req.key` by the rules of `InstanceStore::claim`; with `stale_token`, also takes a
/// live claim held by that token (`InstanceStore::take_over`). Tokens granted are at least
/// `floor` (`epoch.rs`).
pub(super) fn claim(
    conn: &Connection,
    req: &ClaimRequest<'_>,
    stale_token: Option<u64>,
    now: Millis,
    floor: u64,
) -> Result<ClaimOutcome, TxError> {
    let retired = fence_and_retired(conn, req.fence)?;
    let run_id = req.fence.run_id.as_str();
    let lease_expires = lease_expiry(now, req.lease);
    // Most claims are of keys never seen: try the insert first, and look at the row
    // only when there is one. A key never seen may be one gc deleted: its first token
    // starts above every token a deleted key had (`epoch.retired`). The token is worked
    // out here, not in the statement and read back with `RETURNING`: for that SQLite
    // opens a statement journal and a temporary table to hold the returned row, which
    // cost about 16,000 instructions a claim, half of what its statements cost
    // (callgrind).
    let above_retired = next_token("fencing token", retired)?;
    let first = first_grant(first_grant(floor).token.max(above_retired));
    let inserted = conn
        .prepare_cached(
            "INSERT INTO steps
                 (key, run_id, holder, token, attempt, claimed_at, lease_expires, fingerprint)
             VALUES (?1, ?2, ?3, ?7, 1, ?4, ?5, ?6)
             ON CONFLICT (key) DO NOTHING",
        )?
        .execute(params![
            req.key,
            run_id,
            req.holder,
            now,
            lease_expires,
            req.fingerprint,
            to_sql_int(first.token)?
        ])?;
    if inserted == 1 {
        return Ok(ClaimOutcome::Granted(first));
    }
    let Some(current) = current(conn, req.key)? else {
        // The insert met a row that is not there: only a corrupt index would do that.
        return Err(TxError::Sql(rusqlite::Error::QueryReturnedNoRows));
    };
    let grant = match decide_claim(current, req.fingerprint, stale_token, now, floor)? {
        ClaimDecision::Answer(outcome) => return Ok(outcome),
        ClaimDecision::Grant(grant) => grant,
    };
    conn.prepare_cached(
        "UPDATE steps
         SET run_id = ?2, holder = ?3, token = ?4, attempt = ?5, claimed_at = ?6,
             lease_expires = ?7, fingerprint = coalesce(fingerprint, ?8)
         WHERE key = ?1",
    )?
    .execute(params![
        req.key,
        run_id,
        req.holder,
        to_sql_int(grant.token)?,
        grant.attempt,
        now,
        lease_expires,
        req.fingerprint
    ])?;
    if grant.in_doubt {
        count_reclaim(conn, run_id)?;
    }
    Ok(ClaimOutcome::Granted(grant))
}

/// Counts a claim retaken in doubt in its run's record, in the claim's own
/// transaction, so that `reclaimed` stays exact even when the process dies before it
/// flushes its other counts. Retakes are rare, so this extra page is too; a plain grant
/// is only counted in memory (`executed` lags until the next flush).
fn count_reclaim(conn: &Connection, run_id: &str) -> Result<(), TxError> {
    conn.prepare_cached("UPDATE runs SET reclaimed = reclaimed + 1 WHERE run_id = ?1")?
        .execute([run_id])?;
    Ok(())
}

fn lost(key: &str, token: u64) -> TxError {
    TxError::Store(claim_lost(key, token))
}

/// Writes the result into the key's row, if the claim's token still holds it, with the
/// checkpoint and counts if given: the result and the end of the claim are one row,
/// written at once.
pub(super) fn commit(conn: &Connection, commit: &Commit<'_>, now: Millis) -> Result<(), TxError> {
    let claim = &commit.claim;
    // Where the step stands in its run; a checkpoint saved with it stands there too.
    let position = Position {
        lease: claim.fence.token,
        tick: history::tick(),
    };
    // A token beyond SQLite's range was never handed out, so it holds nothing.
    let (Ok(token), Ok(fence_token)) = (to_sql_int(claim.token), to_sql_int(claim.fence.token))
    else {
        check_fence(conn, claim.fence)?;
        return Err(lost(claim.key, claim.token));
    };
    // The fence is checked in the write's own statement (a statement of its own costs a
    // step a few thousand instructions); only a refused write asks which check failed,
    // the fence first, as a claim does.
    let changed = conn
        .prepare_cached(
            "UPDATE steps SET run_id = ?3, holder = NULL, result = ?4, committed_at = ?5,
                              commit_lease = ?6, commit_tick = ?7
             WHERE key = ?1 AND token = ?2 AND holder IS NOT NULL
               AND EXISTS (SELECT 1 FROM runs
                   WHERE run_id = ?3 AND lease_token = ?6 AND lease_holder IS NOT NULL)",
        )?
        .execute(params![
            claim.key,
            token,
            claim.fence.run_id,
            commit.result,
            now,
            fence_token,
            to_sql_int(position.tick)?
        ])?;
    if changed != 1 {
        check_fence(conn, claim.fence)?;
        return Err(lost(claim.key, claim.token));
    }
    let run_id = claim.fence.run_id.as_str();
    if let Some(counts) = commit.counts {
        runs::save_counts(conn, run_id, counts, now)?;
    }
    if let Some(checkpoint) = commit.checkpoint {
        runs::save_checkpoint(conn, run_id, checkpoint, position, now)?;
    }
    Ok(())
}

/// Releases the claim if its token still holds it (and its fence is current); whether
/// it did.
pub(super) fn release(conn: &Connection, claim: &ClaimRef<'_>) -> Result<bool, TxError> {
    if !fence_holds(conn, claim.fence)? {
        return Ok(false);
    }
    let Ok(token) = to_sql_int(claim.token) else {
        return Ok(false);
    };
    let changed = conn
        .prepare_cached(
            "UPDATE steps SET holder = NULL
             WHERE key = ?1 AND token = ?2 AND holder IS NOT NULL",
        )?
        .execute(params![claim.key, token])?;
    Ok(changed == 1)
}

/// Moves the leases of the claims their tokens still hold (with a current fence) to
/// `expires`; per claim, whether it did. An expired lease is renewed too, as long as
/// nobody has taken the claim since.
pub(super) fn renew(
    conn: &Connection,
    claims: &[ClaimRef<'_>],
    expires: Millis,
) -> Result<Vec<bool>, TxError> {
    // Claims come in runs: each run's fence is read once.
    let mut fences: HashMap<(&str, u64), bool> = HashMap::new();
    let mut renewed = Vec::with_capacity(claims.len());
    for claim in claims {
        let fence = (claim.fence.run_id.as_str(), claim.fence.token);
        let holds = match fences.get(&fence) {
            Some(&holds) => holds,
            None => {
                let holds = fence_holds(conn, claim.fence)?;
                fences.insert(fence, holds);
                holds
            }
        };
        let token = to_sql_int(claim.token).ok().filter(|_| holds);
        let Some(token) = token else {
            renewed.push(false);
            continue;
        };
        let changed = conn
            .prepare_cached(
                "UPDATE steps SET lease_expires = ?3
                 WHERE key = ?1 AND token = ?2 AND holder IS NOT NULL",
            )?
            .execute(params![claim.key, token, expires])?;
        renewed.push(changed == 1);
    }
    Ok(renewed)
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
    // (in at the claim, out at the commit), and only status listings ask.
    let claims = conn
        .prepare_cached(
            "SELECT key, run_id, holder, token, attempt, lease_expires, parked FROM steps
             WHERE result IS NULL AND (?1 IS NULL OR run_id = ?1) ORDER BY key",
        )?
        .query_map([run_id], open_claim)?
        .collect::<rusqlite::Result<_>>()?;
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

/// The keys of a run: those it committed in the order it committed them, then its
/// open claims in the order they were granted.
pub(super) fn steps(conn: &Connection, run_id: &str) -> Result<Vec<StepRecord>, TxError> {
    // A scan, like `open_claims`: an index by run would cost every claim a page.
    let steps = conn
        .prepare_cached(
            "SELECT key, token, attempt, claimed_at, committed_at, holder, parked FROM steps
             WHERE run_id = ?1
             ORDER BY result IS NULL, coalesce(commit_lease, 0),
                      coalesce(commit_tick, committed_at * 1000), claimed_at, key",
        )?
        .query_map([run_id], |row| {
            Ok(StepRecord {
                key: row.get(0)?,
                token: u64_column(row, 1)?,
                attempt: u32_column(row, 2)?,
                claimed_at: row.get(3)?,
                committed_at: row.get(4)?,
                holder: row.get(5)?,
                parked: row.get(6)?,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(steps)
}

/// Parks the claim its token holds in doubt and marks its run in doubt, with the
/// reason as the run's outcome.
pub(super) fn park(
    conn: &Connection,
    claim: &ClaimRef<'_>,
    reason: &str,
    now: Millis,
) -> Result<(), TxError> {
    check_fence(conn, claim.fence)?;
    let Ok(token) = to_sql_int(claim.token) else {
        return Err(lost(claim.key, claim.token));
    };
    let changed = conn
        .prepare_cached(
            "UPDATE steps SET holder = NULL, parked = ?3
             WHERE key = ?1 AND token = ?2 AND holder IS NOT NULL",
        )?
        .execute(params![claim.key, token, reason])?;
    if changed != 1 {
        return Err(lost(claim.key, claim.token));
    }
    let run_id = claim.fence.run_id.as_str();
    conn.prepare_cached("UPDATE runs SET status = ?2, updated = ?3 WHERE run_id = ?1")?
        .execute(params![run_id, RunStatus::InDoubt.as_str(), now])?;
    let outcome = format!("in doubt at key {}: {reason}", claim.key);
    set_outcome(conn, run_id, Some(outcome.as_bytes()))
}

/// Settles a key parked by `run_id`; the run resumes, with no lease, once nothing of it
/// is parked.
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
            let token = to_sql_int(next_token("fencing token", current.token)?)?;
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
    let resumed = conn
        .prepare_cached(
            "UPDATE runs
             SET status = ?2, lease_holder = NULL, lease_expires = NULL, updated = ?3
             WHERE run_id = ?1 AND status = ?4
               AND NOT EXISTS (SELECT 1 FROM steps WHERE run_id = ?1 AND parked IS NOT NULL)",
        )?
        .execute(params![
            run_id,
            RunStatus::Running.as_str(),
            now,
            RunStatus::InDoubt.as_str()
        ])?;
    if resumed == 1 {
        set_outcome(conn, run_id, None)?;
    }
    Ok(())
}
