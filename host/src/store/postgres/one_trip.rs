//! A step's two writes in one round trip each: the claim of a key never seen (or found
//! committed) and the commit, each one statement that is its own transaction.
//!
//! The general path (`conn.rs`) spends a round trip on `BEGIN` with the fence check, one
//! per statement and one on `COMMIT`: five to seven per step, where the server's work
//! is a few rows. Here the fence check, the clock and the writes are common table
//! expressions of one statement, which the server runs atomically in its own
//! transaction; the session's `synchronous_commit` is set in the same round trip. The
//! statements write nothing unless the fence holds (every write reads from the fence's
//! row, locked as the general path locks it), so a refused fence changes nothing.
//!
//! Only the cases that need a locked decision fall back to the general path: a key
//! held, parked or free again, or a claim whose fence the statement found lost (the
//! general path then reports it with its usual error). A committed row never changes
//! (`steps_rules`), so reading one without a lock is as good as reading it locked.

use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::batch::{ClaimJob, CommitJob, Fenced};
use super::conn::durability;
use super::epoch::epoch_alive_floor;
use super::{PostgresStore, TxError, is_race, to_sql_int, u32_col, u64_col};
use crate::store::rules::{ClaimDecision, KeyRow, claim_lost, decide_claim, first_grant};
use crate::store::{ClaimOutcome, ClaimRequest, Commit, Millis, StoreError, SyncMode};

/// Claims a key never seen, or reads it committed. The clock is `conn.rs`'s `NOW`. Parameters: `$1` manual time, `$2`
/// run, `$3` run lease token, `$4` key, `$5` holder, `$6` lease in ms, `$7` fingerprint.
/// Returns one row: whether the fence held, whether the key was inserted, the time, the
/// key's row as the statement's snapshot saw it (all null if it had none), and the token
/// inserted. A key never seen may be one gc deleted: its first token starts above every
/// token a deleted key had (`retired`), and every token starts at the epoch's floor
/// (`epoch.rs`); with no epoch alive, nothing is inserted and the general path moves it
/// on.
const CLAIM_NEW: &str = concat!(
    "WITH ",
    "clock AS (SELECT coalesce($1::int8, (extract(epoch FROM now()) * 1000)::int8) AS now), ",
    "alive AS (",
    epoch_alive_floor!(),
    "), ",
    "fence AS (SELECT 1 FROM runs
              WHERE run_id = $2 AND lease_token = $3 AND lease_holder IS NOT NULL
              FOR SHARE),
     ins AS (INSERT INTO steps
                 (key, run_id, holder, token, attempt, claimed_at, lease_expires, fingerprint)
             SELECT $4, $2, $5,
                    greatest((SELECT token + 1 FROM retired WHERE id = 0), alive.floor),
                    1, clock.now,
                    CASE WHEN clock.now > 9223372036854775807 - $6::int8
                         THEN 9223372036854775807 ELSE clock.now + $6::int8 END,
                    $7
             FROM clock, fence, alive
             ON CONFLICT (key) DO NOTHING
             RETURNING token)
     SELECT EXISTS (SELECT 1 FROM fence), EXISTS (SELECT 1 FROM ins), (SELECT now FROM clock),
            s.run_id, s.holder, s.token, s.attempt, s.lease_expires, s.parked, s.fingerprint,
            s.result, (SELECT token FROM ins)
     FROM (SELECT 1) AS one
     LEFT JOIN steps s ON s.key = $4"
);

/// What [`PostgresStore::claim_in_one_trip`] settled.
pub(super) enum OneTrip<T> {
    /// The answer.
    Done(T),
    /// The case needs the general path's locked decision.
    Fallback,
}

impl PostgresStore {
    /// Runs one statement as its own transaction, as durable as `sync` asks, in one
    /// round trip; run again if the server aborted it for racing another.
    async fn one_statement(
        &self,
        op: &'static str,
        sync: SyncMode,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, StoreError> {
        self.try_one_statement(op, sync, sql, params)
            .await?
            .map_err(|e| self.failed(op, e))
    }

    /// [`Self::one_statement`], with the server's refusal of the statement (which
    /// rolled it back) given back as it is, for the caller to read.
    pub(super) async fn try_one_statement(
        &self,
        op: &'static str,
        sync: SyncMode,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Result<Row, tokio_postgres::Error>, StoreError> {
        let mut tries = 0u32;
        loop {
            let conn = self.pool.get().await.map_err(|e| self.pool_failed(op, e))?;
            let answer = tokio::time::timeout(self.call_timeout, async {
                // Prepared first (a round trip only on a connection's first use), so
                // that the two below go out together.
                let stmt = conn.prepare_cached(sql).await?;
                let set = conn.batch_execute(durability(sync));
                let row = conn.query_one(&stmt, params);
                tokio::try_join!(set, row)
            })
            .await;
            match answer {
                Ok(Ok(((), row))) => return Ok(Ok(row)),
                Ok(Err(e)) if is_race(&e) && tries < 5 => tries += 1,
                Ok(Err(e)) if e.as_db_error().is_some() && !is_race(&e) => return Ok(Err(e)),
                Ok(Err(e)) => return Err(self.failed(op, e)),
                Err(_) => {
                    // Its answer may still come: the connection goes, not to the pool.
                    drop(deadpool_postgres::Object::take(conn));
                    return Err(self.no_answer(op));
                }
            }
        }
    }

    /// The claim of `req` when the key is new (granted its first grant) or
    /// committed (answered); [`OneTrip::Fallback`] otherwise.
    pub(super) async fn claim_in_one_trip(
        &self,
        req: &ClaimRequest<'_>,
    ) -> Result<OneTrip<ClaimOutcome>, StoreError> {
        // A token beyond the server's range holds nothing: the general path says so.
        let Ok(token) = i64::try_from(req.fence.token) else {
            return Ok(OneTrip::Fallback);
        };
        let lease = Millis::try_from(req.lease.as_millis()).unwrap_or(Millis::MAX);
        let alone = || async move {
            let manual = self.manual_now();
            self.one_statement(
                "claim a key",
                req.sync(),
                CLAIM_NEW,
                &[
                    &manual,
                    &req.fence.run_id,
                    &token,
                    &req.key,
                    &req.holder,
                    &lease,
                    &req.fingerprint,
                ],
            )
            .await
        };
        let job = || ClaimJob {
            fenced: Fenced {
                run_id: req.fence.run_id.clone(),
                lease_token: token,
                key: req.key.to_owned(),
                sync: req.sync(),
            },
            holder: req.holder.to_owned(),
            lease_ms: lease,
            fingerprint: req.fingerprint.map(str::to_owned),
        };
        let row = self.batches.claim(job, alone).await?;
        let read = || -> Result<OneTrip<ClaimOutcome>, TxError> {
            let (fence_held, inserted): (bool, bool) = (row.try_get(0)?, row.try_get(1)?);
            if inserted {
                return Ok(OneTrip::Done(ClaimOutcome::Granted(first_grant(u64_col(
                    &row, 11,
                )?))));
            }
            let result: Option<Vec<u8>> = row.try_get(10)?;
            if !fence_held || result.is_none() {
                return Ok(OneTrip::Fallback);
            }
            let now: Millis = row.try_get(2)?;
            let current = KeyRow {
                run_id: row.try_get(3)?,
                holder: row.try_get(4)?,
                token: u64_col(&row, 5)?,
                attempt: u32_col(&row, 6)?,
                lease_expires: row.try_get(7)?,
                parked: row.try_get(8)?,
                fingerprint: row.try_get(9)?,
                result,
            };
            Ok(
                match decide_claim(current, req.fingerprint, None, now, 0)? {
                    ClaimDecision::Answer(outcome) => OneTrip::Done(outcome),
                    ClaimDecision::Grant(_) => OneTrip::Fallback,
                },
            )
        };
        read().map_err(|e| self.tx_error("claim a key", e))
    }

    /// Commits `commit` (with its checkpoint and counts) in one statement. A fence the
    /// statement found lost, or a claim no longer the caller's, wrote nothing.
    pub(super) async fn commit_in_one_trip(&self, commit: &Commit<'_>) -> Result<(), StoreError> {
        let op = match commit.checkpoint {
            Some(_) => "commit a result and save progress",
            None => "commit a result",
        };
        let claim = &commit.claim;
        let fence = claim.fence;
        let Ok(lease_token) = i64::try_from(fence.token) else {
            return Err(StoreError::LeaseLost {
                run_id: fence.run_id.clone(),
                token: fence.token,
            });
        };
        let Ok(token) = i64::try_from(claim.token) else {
            return Err(claim_lost(claim.key, claim.token));
        };
        let counts = commit
            .counts
            .map(|c| -> Result<[i64; 6], TxError> {
                Ok([
                    to_sql_int(c.executed)?,
                    to_sql_int(c.skipped)?,
                    to_sql_int(c.awaited)?,
                    to_sql_int(c.reclaimed)?,
                    to_sql_int(c.instances)?,
                    to_sql_int(c.recycled)?,
                ])
            })
            .transpose()
            .map_err(|e| self.tx_error(op, e))?;
        let step = commit
            .checkpoint
            .map(|c| to_sql_int(c.step))
            .transpose()
            .map_err(|e| self.tx_error(op, e))?;
        let alone = || self.commit_alone(commit, op, lease_token, token, counts, step);
        let job = || CommitJob {
            op,
            fenced: Fenced {
                run_id: fence.run_id.clone(),
                lease_token,
                key: claim.key.to_owned(),
                sync: fence.sync,
            },
            token,
            result: commit.result.to_vec(),
            counts,
            checkpoint: step.zip(commit.checkpoint.map(|c| c.state.clone())),
        };
        let row = match self.batches.commit(job, alone).await {
            Ok(row) => row,
            Err(lost) if answer_lost(&lost) => {
                return self.settle_commit(commit, token, lost).await;
            }
            Err(e) => return Err(e),
        };
        let (fence_held, committed): (bool, bool) = (
            row.try_get(0).map_err(|e| self.failed(op, e))?,
            row.try_get(1).map_err(|e| self.failed(op, e))?,
        );
        if !fence_held {
            return Err(StoreError::LeaseLost {
                run_id: fence.run_id.clone(),
                token: fence.token,
            });
        }
        if !committed {
            return Err(claim_lost(claim.key, claim.token));
        }
        Ok(())
    }

    /// Settles a commit whose answer was lost with its connection (or never came) by
    /// reading the key back on another (again and again, for up to the call timeout,
    /// while the server cannot be reached): committed under the caller's token with its
    /// result, the statement went through (and wrote the counts and checkpoint with
    /// it, in the same transaction), and the run goes on as if the answer had come.
    /// Anything else, or no answer to the read either, is the original error: the run
    /// stops, and the claim is retaken in doubt after its lease, by whichever holder
    /// then finds it uncommitted. The commit is never sent again from here: a
    /// statement still running on the server would be met by its own twin.
    async fn settle_commit(
        &self,
        commit: &Commit<'_>,
        token: i64,
        lost: StoreError,
    ) -> Result<(), StoreError> {
        let op = "read back a commit";
        let read_once = || async {
            let conn = self.reader(op).await?;
            conn.query_opt(
                "SELECT 1 FROM steps
                 WHERE key = $1 AND token = $2 AND holder IS NULL AND result = $3",
                &[&commit.claim.key, &token, &commit.result],
            )
            .await
            .map_err(|e| self.tx_error(op, e))
        };
        // The cut that lost the answer may have ended the pool's other connections
        // too (each failure closes the idle ones, and the next try opens a fresh one),
        // or the server may be away a moment: tried again, with growing pauses, for
        // as long as one call may take.
        let deadline = tokio::time::Instant::now() + self.call_timeout;
        let mut pause = std::time::Duration::from_millis(20);
        let mut read = read_once().await;
        while read.is_err() && tokio::time::Instant::now() + pause < deadline {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(std::time::Duration::from_millis(500));
            read = read_once().await;
        }
        let key = crate::text::escape(commit.claim.key, false);
        match read {
            Ok(Some(_)) => {
                tracing::info!(%key, error = %lost, "a commit's answer was lost; read back, it had committed");
                Ok(())
            }
            Ok(None) => {
                tracing::info!(%key, error = %lost, "a commit's answer was lost; read back, it had not committed");
                Err(lost)
            }
            Err(e) => {
                tracing::info!(%key, error = %lost, read = %e, "a commit's answer was lost, and so was the read back");
                Err(lost)
            }
        }
    }

    /// [`Self::commit_in_one_trip`]'s statement for this commit alone.
    async fn commit_alone(
        &self,
        commit: &Commit<'_>,
        op: &'static str,
        lease_token: i64,
        token: i64,
        counts: Option<[i64; 6]>,
        step: Option<i64>,
    ) -> Result<Row, StoreError> {
        let claim = &commit.claim;
        let fence = claim.fence;
        let manual = self.manual_now();
        let sql = commit_sql(counts.is_some(), step.is_some());
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![
            &manual,
            &fence.run_id,
            &lease_token,
            &claim.key,
            &token,
            &commit.result,
        ];
        if let Some(counts) = &counts {
            params.extend(counts.iter().map(|c| c as &(dyn ToSql + Sync)));
        }
        if let (Some(step), Some(checkpoint)) = (&step, commit.checkpoint) {
            params.push(step);
            params.push(&checkpoint.state);
        }
        // Where the step stands in its run, last: each statement names its place.
        let tick = i64::try_from(crate::store::tick()).unwrap_or(i64::MAX);
        params.push(&tick);
        self.one_statement(op, fence.sync, sql, &params).await
    }
}

/// The commit statement, with the counts (`$7`–`$12`) and the checkpoint (the next two
/// parameters) when given, then the commit's tick (its position in the run, with `$3`).
/// `$1` manual time, `$2` run, `$3` run lease token, `$4` key, `$5` claim token, `$6`
/// result. Every write reads from `fence` (through `done`), so
/// nothing is written unless the fence held and the claim was still the caller's.
fn commit_sql(counts: bool, checkpoint: bool) -> &'static str {
    // Four fixed texts, so that each is prepared once per connection.
    macro_rules! commit {
        ($lock:literal, $tick:literal, $counts:literal, $progress:literal) => {
            concat!(
                "WITH ",
                "clock AS (SELECT coalesce($1::int8, (extract(epoch FROM now()) * 1000)::int8) AS now), ",
                "fence AS (SELECT 1 FROM runs
                          WHERE run_id = $2 AND lease_token = $3 AND lease_holder IS NOT NULL ",
                $lock,
                "), done AS (UPDATE steps
                             SET run_id = $2, holder = NULL, result = $6, committed_at = clock.now,
                                 commit_lease = $3, commit_tick = ",
                $tick,
                "
                             FROM clock, fence
                             WHERE key = $4 AND token = $5 AND holder IS NOT NULL
                             RETURNING 1)",
                $counts,
                $progress,
                " SELECT EXISTS (SELECT 1 FROM fence), EXISTS (SELECT 1 FROM done)"
            )
        };
    }
    match (counts, checkpoint) {
        (false, false) => commit!("FOR SHARE", "$7", "", ""),
        (false, true) => commit!(
            "FOR SHARE",
            "$9",
            "",
            ", progress_row AS (INSERT INTO progress (run_id, lease, tick, step, state, updated)
                 SELECT $2, $3, $9, $7, $8, clock.now FROM clock, done
                 ON CONFLICT (run_id, lease, tick) DO UPDATE
                 SET step = excluded.step, state = excluded.state, updated = excluded.updated)"
        ),
        (true, false) => commit!(
            "FOR NO KEY UPDATE",
            "$13",
            ", counts_row AS (UPDATE runs
                 SET executed = $7, skipped = $8, awaited = $9, reclaimed = $10,
                     instances = $11, recycled = $12, updated = clock.now
                 FROM clock, done WHERE run_id = $2)",
            ""
        ),
        (true, true) => commit!(
            "FOR NO KEY UPDATE",
            "$15",
            ", counts_row AS (UPDATE runs
                 SET executed = $7, skipped = $8, awaited = $9, reclaimed = $10,
                     instances = $11, recycled = $12, updated = clock.now
                 FROM clock, done WHERE run_id = $2)",
            ", progress_row AS (INSERT INTO progress (run_id, lease, tick, step, state, updated)
                 SELECT $2, $3, $15, $13, $14, clock.now FROM clock, done
                 ON CONFLICT (run_id, lease, tick) DO UPDATE
                 SET step = excluded.step, state = excluded.state, updated = excluded.updated)"
        ),
    }
}

/// Whether `e` leaves a write's outcome unknown: the connection failed, or no answer
/// came in time, after the statement may have reached the server.
fn answer_lost(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::Database {
            fault: crate::store::DatabaseFault::Unreachable,
            ..
        }
    )
}
