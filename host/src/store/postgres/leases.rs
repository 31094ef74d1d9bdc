//! Run leases on PostgreSQL: which worker drives a run.
//!
//! As on SQLite, a run's lease is its row's holder, expiry and token. Workers poll the
//! queue with `FOR UPDATE SKIP LOCKED`: each locks the free runs it takes and passes
//! over those another worker is taking at that moment, so workers on many machines
//! never queue behind each other and never take the same run.

use std::time::Duration;

use super::conn::Conn;
use super::epoch::token_floor;
use super::runs::{self, end_as_cancelled, lease_from, set_outcome, status_from, unknown_run};
use super::{TxError, to_sql_int, u64_col};
use crate::store::rules::lease_expiry;
use crate::store::rules::{LeaseDecision, decide_run_lease, run_lease_token};
use crate::store::{
    Acquired, Checkpoint, Counts, LeaseState, LeasedRun, Millis, RunEnd, RunFence, RunStatus,
};

/// The earliest due time after `after` of an unfinished run nobody holds; the scan
/// walks `runs_due` in order and stops at the first.
pub(super) async fn next_due(conn: &Conn, after: Millis) -> Result<Option<Millis>, TxError> {
    let row = conn
        .query_opt(
            "SELECT coalesce(wake_at, created) FROM runs
             WHERE status IN ('queued', 'running')
               AND coalesce(wake_at, created) > $1
               AND lease_holder IS NULL
               AND paused IS NULL
             ORDER BY coalesce(wake_at, created), seq
             LIMIT 1",
            &[&after],
        )
        .await?;
    Ok(row.map(|row| row.try_get(0)).transpose()?)
}

/// The due runs nobody holds a live lease on, locked for this transaction (passing
/// over those another worker is taking): up to `$3` of priority above 0, highest first,
/// then as many of priority 0 as make `$3`, oldest first; none in `$2`, none of a
/// deployment in `$4`, none of a deployment and key (`agent || chr(31) || flow_key`) in
/// `$5`. The last columns say whether any deployment has limits, and the floor of the
/// store's epoch (`epoch.rs`; NULL when the server lost transactions since it was
/// recorded, and the grant goes through [`token_floor`]).
const CANDIDATES: &str = "
    WITH prioritized AS (
        SELECT run_id, lease_token, lease_holder IS NOT NULL AS taken_over, agent, flow_key,
               0 AS pass, priority, coalesce(wake_at, created) AS due, seq
        FROM runs
        WHERE priority > 0 AND status IN ('queued', 'running')
          AND coalesce(wake_at, created) <= $1
          AND (lease_holder IS NULL OR lease_expires <= $1)
          AND lease_token < 9223372036854775807
          AND paused IS NULL
          AND NOT (run_id = ANY ($2)) AND NOT (agent = ANY ($4))
          AND NOT (coalesce(agent || chr(31) || flow_key, '') = ANY ($5))
        ORDER BY priority DESC, coalesce(wake_at, created), seq
        LIMIT $3
        FOR UPDATE SKIP LOCKED
    ), oldest AS (
        SELECT run_id, lease_token, lease_holder IS NOT NULL AS taken_over, agent, flow_key,
               1 AS pass, priority, coalesce(wake_at, created) AS due, seq
        FROM runs
        WHERE status IN ('queued', 'running')
          AND coalesce(wake_at, created) <= $1
          AND (lease_holder IS NULL OR lease_expires <= $1)
          AND lease_token < 9223372036854775807
          AND paused IS NULL
          AND priority = 0
          AND NOT (run_id = ANY ($2)) AND NOT (agent = ANY ($4))
          AND NOT (coalesce(agent || chr(31) || flow_key, '') = ANY ($5))
        ORDER BY coalesce(wake_at, created), seq
        LIMIT greatest($3 - (SELECT count(*) FROM prioritized), 0)
        FOR UPDATE SKIP LOCKED
    )
    SELECT run_id, lease_token, taken_over, agent, flow_key,
           EXISTS (SELECT 1 FROM flow_limits),
           (SELECT epoch << 32 FROM epoch_alive WHERE id = 0)
    FROM (SELECT * FROM prioritized UNION ALL SELECT * FROM oldest) AS due
    ORDER BY pass, priority DESC, due, seq";

/// How many times a lease query under limits looks again for runs, after the runs it
/// found filled a deployment's or a key's limit: each time passes over one more.
const FLOW_ROUNDS: usize = 4;

/// Leases up to `max` runs nobody holds a live lease on, of the highest priority
/// first, then oldest first, passing over runs whose deployment or concurrency key is
/// at its limit (`flow.rs`).
pub(super) async fn acquire_runs(
    conn: &Conn,
    worker: &str,
    max: usize,
    lease: Duration,
    skip: &[String],
) -> Result<Vec<LeasedRun>, TxError> {
    if max == 0 {
        return Ok(Vec::new());
    }
    let now = conn.now;
    let mut passed: Vec<String> = skip.to_vec();
    let (mut full_agents, mut full_keys) = (Vec::<String>::new(), Vec::<String>::new());
    let mut flow = None;
    let mut chosen: Vec<(String, u64, bool)> = Vec::new();
    // The epoch's floor as the candidates' query read it, in this transaction.
    let mut alive: Option<i64> = None;
    for _ in 0..FLOW_ROUNDS {
        let limit = i64::try_from(max - chosen.len()).unwrap_or(i64::MAX);
        let rows = conn
            .query(
                CANDIDATES,
                &[&now, &passed, &limit, &full_agents, &full_keys],
            )
            .await?;
        let limited = match rows.first() {
            Some(row) => {
                alive = row.try_get(6)?;
                row.try_get::<_, bool>(5)?
            }
            None => false,
        };
        if limited && flow.is_none() {
            flow = super::flow::counts(conn).await?;
        }
        let mut refused = false;
        for row in &rows {
            let run_id: String = row.try_get(0)?;
            if let Some(flow) = flow.as_mut() {
                let (agent, key): (String, Option<String>) = (row.try_get(3)?, row.try_get(4)?);
                if !flow.admit(&agent, key.as_deref()) {
                    refused = true;
                    if flow.saturated(&agent, None) {
                        full_agents.push(agent);
                    } else if let Some(key) = key {
                        full_keys.push(format!("{agent}\u{1f}{key}"));
                    }
                    passed.push(run_id);
                    continue;
                }
            }
            passed.push(run_id.clone());
            chosen.push((run_id, u64_col(row, 1)?, row.try_get(2)?));
        }
        if !refused || chosen.len() == max {
            break;
        }
    }
    if chosen.is_empty() {
        return Ok(Vec::new());
    }
    let expires = lease_expiry(now, lease);
    let floor = match alive.and_then(|floor| u64::try_from(floor).ok()) {
        Some(floor) => floor,
        None => token_floor(conn).await?,
    };
    let granted = chosen
        .into_iter()
        .map(|(run_id, last, taken_over)| Ok((run_id, run_lease_token(last, floor)?, taken_over)))
        .collect::<Result<Vec<_>, TxError>>()?;
    grant(conn, granted, worker, expires, true).await
}

/// Leases one run, unless another worker's live lease is on it or it is finished.
pub(super) async fn acquire_run(
    conn: &Conn,
    run_id: &str,
    worker: &str,
    lease: Duration,
) -> Result<Acquired, TxError> {
    let row = conn
        .query_opt(
            "SELECT status, lease_holder, lease_token, lease_expires, paused IS NOT NULL
             FROM runs WHERE run_id = $1 FOR NO KEY UPDATE",
            &[&run_id],
        )
        .await?;
    let Some(row) = row else {
        return Err(unknown_run(run_id));
    };
    let (status, lease_now, last) = (
        status_from(&row, 0)?,
        lease_from(&row, 1)?,
        u64_col(&row, 2)?,
    );
    if row.try_get::<_, bool>(4)? && !status.is_finished() {
        let record = runs::run(conn, run_id)
            .await?
            .ok_or_else(|| unknown_run(run_id))?;
        return Ok(Acquired::Paused(record));
    }
    // Read before deciding, as the rule needs it; a grant that finds the epoch lost
    // must move it on first anyway, and a refusal that does so only moves it early.
    let floor = token_floor(conn).await?;
    match decide_run_lease(status, lease_now, last, floor, worker, conn.now)? {
        LeaseDecision::Finished => {
            let record = runs::run(conn, run_id)
                .await?
                .ok_or_else(|| unknown_run(run_id))?;
            Ok(Acquired::Finished(record))
        }
        LeaseDecision::Held(held) => Ok(Acquired::Held(held)),
        LeaseDecision::Grant { token, taken_over } => {
            let expires = lease_expiry(conn.now, lease);
            let mut leased = grant(
                conn,
                vec![(run_id.to_owned(), token, taken_over)],
                worker,
                expires,
                false,
            )
            .await?;
            leased
                .pop()
                .map(Acquired::Leased)
                .ok_or_else(|| unknown_run(run_id))
        }
    }
}

/// Grants each run's lease to `worker` under its token and sets it running: one
/// statement for every lease, one read of the records and one of the inputs and
/// checkpoints, whatever the number of runs (one of each per run cost three round
/// trips a run). Each run is given as (run id, token, taken over). With `count`, the
/// grant also counts each run's first instance under the lease as started
/// ([`LeasedRun::instance_counted`]): the write a host would otherwise make, in a
/// transaction of its own, before that instance runs.
async fn grant(
    conn: &Conn,
    runs_granted: Vec<(String, u64, bool)>,
    worker: &str,
    expires: i64,
    count: bool,
) -> Result<Vec<LeasedRun>, TxError> {
    let mut ids = Vec::with_capacity(runs_granted.len());
    let mut tokens = Vec::with_capacity(runs_granted.len());
    let mut taken = Vec::with_capacity(runs_granted.len());
    for (run_id, token, taken_over) in runs_granted {
        tokens.push(to_sql_int(token)?);
        ids.push(run_id);
        taken.push(taken_over);
    }
    conn.execute(
        "UPDATE runs
         SET status = $2, lease_holder = $3, lease_token = g.token, lease_expires = $4,
             updated = $5, wake_at = NULL, waiting_for = NULL, joining = NULL, join_left = NULL,
             instances = instances + CASE WHEN $7 THEN 1 ELSE 0 END
         FROM unnest($1::text[], $6::int8[]) AS g(id, token)
         WHERE run_id = g.id",
        &[
            &ids,
            &RunStatus::Running.as_str(),
            &worker,
            &expires,
            &conn.now,
            &tokens,
            &count,
        ],
    )
    .await?;
    // The records, and the inputs with the checkpoints, asked for together: one round
    // trip.
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&ids];
    let (records, inputs) = tokio::try_join!(
        runs::runs_by_id(conn, &ids),
        conn.query(
            "SELECT i.run_id, i.input, i.authority, p.step, p.state
             FROM run_inputs i LEFT JOIN progress p ON p.run_id = i.run_id
             WHERE i.run_id = ANY ($1)",
            &params,
        )
    )?;
    let mut records = records;
    type Inputs = (Vec<u8>, Vec<u8>, Option<Checkpoint>);
    let mut inputs: std::collections::HashMap<String, Inputs> = inputs
        .iter()
        .map(|row| {
            let checkpoint = match row.try_get::<_, Option<i64>>(3)? {
                Some(_) => Some(Checkpoint {
                    step: u64_col(row, 3)?,
                    state: row.try_get(4)?,
                }),
                None => None,
            };
            Ok((
                row.try_get(0)?,
                (row.try_get(1)?, row.try_get(2)?, checkpoint),
            ))
        })
        .collect::<Result<_, TxError>>()?;
    let mut leased = Vec::with_capacity(ids.len());
    for ((run_id, token), taken_over) in ids.iter().zip(tokens).zip(taken) {
        let record = records.remove(run_id).ok_or_else(|| unknown_run(run_id))?;
        let (input, authority, checkpoint) =
            inputs.remove(run_id).ok_or_else(|| unknown_run(run_id))?;
        leased.push(LeasedRun {
            record,
            token: token.unsigned_abs(),
            input,
            authority,
            taken_over,
            checkpoint,
            checkpoint_read: true,
            instance_counted: count,
        });
    }
    Ok(leased)
}

/// Extends each lease its fence still holds to `expires`.
pub(super) async fn renew_runs(
    conn: &Conn,
    fences: &[RunFence],
    expires: i64,
) -> Result<Vec<LeaseState>, TxError> {
    let mut states = vec![LeaseState::Lost; fences.len()];
    // In run order, as the batches of `batch.rs` lock runs' rows: two writes that lock
    // several runs' rows in one order never wait for each other.
    let mut order: Vec<usize> = (0..fences.len()).collect();
    order.sort_by(|&a, &b| fences[a].run_id.cmp(&fences[b].run_id));
    for at in order {
        let fence = &fences[at];
        let Ok(token) = i64::try_from(fence.token) else {
            continue;
        };
        let row = conn
            .query_opt(
                "UPDATE runs SET lease_expires = $3
                 WHERE run_id = $1 AND lease_token = $2 AND lease_holder IS NOT NULL
                 RETURNING cancel_requested, paused IS NOT NULL",
                &[&fence.run_id, &token, &expires],
            )
            .await?;
        if let Some(row) = row {
            states[at] = LeaseState::Held {
                expires,
                cancel_requested: row.try_get(0)?,
                pause_requested: row.try_get(1)?,
            };
        }
    }
    Ok(states)
}

/// Gives the lease back, with the run's counts and why. The caller checked the fence.
pub(super) async fn release_run(
    conn: &Conn,
    fence: &RunFence,
    counts: &Counts,
    note: Option<&str>,
) -> Result<(), TxError> {
    runs::save_counts(conn, &fence.run_id, counts).await?;
    conn.execute(
        "UPDATE runs SET lease_holder = NULL, lease_expires = NULL, note = $2 WHERE run_id = $1",
        &[&fence.run_id, &note],
    )
    .await?;
    Ok(())
}

/// Records how the run ended and ends its lease (keeping its token). The caller
/// checked the fence, with the run's row locked.
///
/// The run's row, its outcome and the parent's join are written by statements sent
/// together (tokio-postgres pipelines statements awaited at once on one connection):
/// one round trip where one each took four, on the path every run ends by.
pub(super) async fn finish_run(
    conn: &Conn,
    fence: &RunFence,
    end: RunEnd<'_>,
    counts: &Counts,
) -> Result<(), TxError> {
    let run_id = fence.run_id.as_str();
    let (status, outcome) = match end {
        RunEnd::Completed(output) => (RunStatus::Completed, Some(output)),
        RunEnd::Failed(error) => (RunStatus::Failed, Some(error.as_bytes())),
        RunEnd::InDoubt => (RunStatus::InDoubt, None),
        RunEnd::Cancelled => {
            runs::save_counts(conn, run_id, counts).await?;
            return end_as_cancelled(conn, run_id).await;
        }
    };
    let row = async {
        conn.execute(
            "UPDATE runs
             SET executed = $2, skipped = $3, awaited = $4, reclaimed = $5, instances = $6,
                 recycled = $7, status = $8, lease_holder = NULL, lease_expires = NULL,
                 cancel_requested = false, updated = $9
             WHERE run_id = $1",
            &[
                &run_id,
                &to_sql_int(counts.executed)?,
                &to_sql_int(counts.skipped)?,
                &to_sql_int(counts.awaited)?,
                &to_sql_int(counts.reclaimed)?,
                &to_sql_int(counts.instances)?,
                &to_sql_int(counts.recycled)?,
                &status.as_str(),
                &conn.now,
            ],
        )
        .await
    };
    let kept = async {
        match outcome {
            Some(outcome) => set_outcome(conn, run_id, Some(outcome)).await,
            None => Ok(()),
        }
    };
    let parent = async {
        if status == RunStatus::InDoubt {
            return Ok(());
        }
        super::children::count_down_parent(conn, run_id).await
    };
    tokio::try_join!(row, kept, parent)?;
    Ok(())
}
