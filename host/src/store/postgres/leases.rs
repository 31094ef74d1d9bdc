//! Run leases on PostgreSQL: which worker drives a run.
//!
//! As on SQLite, a run's lease is its row's holder, expiry and token. Workers poll the
//! queue with `FOR UPDATE SKIP LOCKED`: each locks the free runs it takes and passes
//! over those another worker is taking at that moment, so workers on many machines
//! never queue behind each other and never take the same run.

use std::time::Duration;

use super::conn::Conn;
use super::epoch::token_floor;
use super::runs::{self, end_as_cancelled, lease_from, status_from, unknown_run};
use super::{TxError, to_sql_int, u64_col};
use crate::store::EventKind;
use crate::store::events::NewEvent;
use crate::store::events::{EVENTS_HEAD, EVENTS_TAIL, events_head, events_tail};
use crate::store::rules::lease_expiry;
use crate::store::rules::{LeaseDecision, decide_run_lease, run_lease_token};
use crate::store::{
    Acquired, Checkpoint, Counts, LeaseState, LeasedRun, Millis, RunFence, RunStatus,
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

/// The grant of [`grant`]: `$1` runs, `$2` status, `$3` worker, `$4` expiry, `$5` time,
/// `$6` tokens, `$7` whether it counts each run's first instance, `$8` and `$9` the
/// timeline's bounds. Puts the grant on each run's timeline in the same statement: a
/// lease still recorded (`old`, read under the candidates' row locks) was never given
/// back, so its holder's instance never ended: a takeover; and, when counted, the
/// instance's start.
const GRANT: &str = "WITH
     g AS (SELECT * FROM unnest($1::text[], $6::int8[]) AS g(id, token)),
     old AS (SELECT r.run_id, r.lease_holder, r.lease_token, r.lease_expires
             FROM runs r JOIN g ON r.run_id = g.id),
     up AS (UPDATE runs
            SET status = $2, lease_holder = $3, lease_token = g.token, lease_expires = $4,
                updated = $5, wake_at = NULL, waiting_for = NULL, joining = NULL,
                join_left = NULL,
                instances = runs.instances + CASE WHEN $7 THEN 1 ELSE 0 END,
                events = runs.events + CASE WHEN $7 THEN 1 ELSE 0 END
                         + CASE WHEN old.lease_holder IS NOT NULL THEN 1 ELSE 0 END
            FROM g JOIN old ON old.run_id = g.id
            WHERE runs.run_id = g.id
            RETURNING runs.run_id, runs.events, runs.instances, g.token,
                      old.lease_holder AS from_holder, old.lease_token AS from_token,
                      old.lease_expires AS expired_at),
     ev AS (INSERT INTO run_events (run_id, seq, at, kind, holder, token, detail)
            SELECT run_id, events - CASE WHEN $7 THEN 1 ELSE 0 END, $5, 'took_over', $3, token,
                   json_build_object('from_holder', from_holder, 'from_token', from_token,
                                     'expired_at', expired_at)::text
            FROM up WHERE from_holder IS NOT NULL
            UNION ALL
            SELECT run_id, events, $5, 'started', $3, token,
                   json_build_object('instance', instances)::text
            FROM up WHERE $7),
     cut AS (DELETE FROM run_events e USING up
             WHERE e.run_id = up.run_id AND e.seq > $8 AND e.seq <= up.events - $9)
     SELECT count(*) FROM up";

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
        GRANT,
        &[
            &ids,
            &RunStatus::Running.as_str(),
            &worker,
            &expires,
            &conn.now,
            &tokens,
            &count,
            &to_sql_int(EVENTS_HEAD)?,
            &to_sql_int(EVENTS_TAIL)?,
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
             FROM run_inputs i
             LEFT JOIN LATERAL (SELECT step, state FROM progress
                                WHERE progress.run_id = i.run_id
                                ORDER BY lease DESC, tick DESC LIMIT 1) p ON true
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
    // A host that gives back a lease whose grant counted an instance it never ran
    // takes the count back: the timeline says that instance never ran.
    let counted = conn
        .query_one(
            "SELECT instances FROM runs WHERE run_id = $1",
            &[&fence.run_id],
        )
        .await?;
    let counted = u64_col(&counted, 0)?;
    runs::save_counts(conn, &fence.run_id, counts).await?;
    let row = conn
        .query_one(
            "UPDATE runs SET lease_holder = NULL, lease_expires = NULL, note = $2 WHERE run_id = $1
             RETURNING paused IS NOT NULL",
            &[&fence.run_id, &note],
        )
        .await?;
    let paused: bool = row.try_get(0)?;
    let event = NewEvent::new(
        EventKind::Released,
        serde_json::json!({
            "note": note,
            "paused": paused,
            "unstarted": counted > counts.instances,
        }),
    );
    super::events::record(conn, &fence.run_id, &[event.token(fence.token)]).await
}

/// Records that a new instance of the run starts under `fence`, with the run's counts
/// (which count it); and, if the instance before it under this lease was dropped on
/// purpose, that it was, and why. The caller checked the fence.
pub(super) async fn start_instance(
    conn: &Conn,
    fence: &RunFence,
    counts: &Counts,
    recycled: Option<&str>,
) -> Result<(), TxError> {
    runs::save_counts(conn, &fence.run_id, counts).await?;
    let mut events = Vec::with_capacity(2);
    if let Some(reason) = recycled {
        let event = NewEvent::new(
            EventKind::Recycled,
            serde_json::json!({
                "instance": counts.instances.saturating_sub(1),
                "reason": reason,
            }),
        );
        events.push(event.token(fence.token));
    }
    let event = NewEvent::new(
        EventKind::Started,
        serde_json::json!({ "instance": counts.instances }),
    );
    events.push(event.token(fence.token));
    super::events::record(conn, &fence.run_id, &events).await
}

/// Records that the run ended cancelled, with its counts, and ends its lease (keeping
/// its token), its descendants cancelled with it. The caller checked the fence, with
/// the run's row locked. (Every other end is [`FINISH_ALONE`].)
pub(super) async fn finish_cancelled(
    conn: &Conn,
    fence: &RunFence,
    counts: &Counts,
) -> Result<(), TxError> {
    runs::save_counts(conn, &fence.run_id, counts).await?;
    end_as_cancelled(conn, &fence.run_id).await
}

/// A run's end (but a cancellation) in one statement, as a worker records it: the
/// clock, the fence (the run's row is updated only under its current lease, and so
/// locked), the outcome, and its count-down in the join its parent waits in. `$1`
/// manual time, `$2` run, `$3` lease token, `$4` to `$9` the counts, `$10` status,
/// `$11` the outcome (NULL: left as it is), `$12` whether the parent counts this end.
/// Returns whether the fence held, the time, the parent, and whether this end is still
/// owed to the parent.
///
/// The parent's row is locked `FOR NO KEY UPDATE` first, whatever it is doing, as
/// [`count_down_parent`] locks it (its doc says why): the lock waits for a suspension
/// of the parent in flight, and reads what it left. The count-down (`down`) then
/// updates the parent if the statement's snapshot already saw it suspended joining
/// (a sibling's count-down committed since is waited for and counted from, as any
/// `UPDATE` does). If the lock found the parent joining but the snapshot did not (its
/// suspension committed in between), this end is still owed to it, and only a later
/// statement, whose snapshot sees the suspension, can count it down ([`COUNT_DOWN`]).
///
/// [`FINISH_ALONE`] is the statement as its own transaction: the parent's row stays
/// locked only while the server runs it, where a transaction held it over a round
/// trip to the worker and back, and every sibling ending meanwhile queued behind it
/// (a `log_statement` trace and `pg_stat_activity` of a 1,000-child fan-out: most
/// finishes waiting on the parent's row, its holder idle in its transaction). When
/// the end is owed, it refuses itself instead (a cast that fails, naming the parent),
/// writing nothing, and the end goes again as [`FINISH_IN_TX`] in a transaction, with
/// [`COUNT_DOWN`] before its `COMMIT`.
///
/// [`count_down_parent`]: super::children::count_down_parent
macro_rules! finish {
    ($owed:literal) => {
        concat!(
            "WITH clock AS (SELECT coalesce($1::int8, (extract(epoch FROM now()) * 1000)::int8) AS now),
             fin AS (
                 UPDATE runs
                 SET executed = $4, skipped = $5, awaited = $6, reclaimed = $7, instances = $8,
                     recycled = $9, status = $10, lease_holder = NULL, lease_expires = NULL,
                     cancel_requested = false, updated = clock.now, events = runs.events + 1
                 FROM clock
                 WHERE run_id = $2 AND lease_token = $3 AND lease_holder IS NOT NULL
                 RETURNING runs.parent, runs.events),
             ev AS (
                 INSERT INTO run_events (run_id, seq, at, kind, token, detail)
                 SELECT $2, fin.events, clock.now, 'finished', $3,
                        json_build_object('status', $10::text)::text
                 FROM fin CROSS JOIN clock),
             cut AS (
                 DELETE FROM run_events e USING fin
                 WHERE e.run_id = $2 AND e.seq > ", events_head!(), "
                   AND e.seq <= fin.events - ", events_tail!(), "),
             kept AS (
                 INSERT INTO run_outcomes (run_id, outcome)
                 SELECT $2, $11::bytea FROM fin WHERE $11::bytea IS NOT NULL
                 ON CONFLICT (run_id) DO UPDATE SET outcome = excluded.outcome),
             parent AS (
                 SELECT p.run_id, p.lease_holder IS NULL AND coalesce(p.join_left, 0) > 0 AS joining
                 FROM runs p JOIN fin ON p.run_id = fin.parent
                 WHERE $12
                 FOR NO KEY UPDATE OF p),
             down AS (
                 UPDATE runs
                 SET join_left = runs.join_left - 1,
                     wake_at = CASE WHEN runs.join_left <= 1 THEN clock.now ELSE runs.wake_at END,
                     updated = clock.now
                 FROM parent, clock
                 WHERE runs.run_id = parent.run_id
                   AND runs.lease_holder IS NULL AND runs.join_left > 0
                   AND EXISTS (SELECT 1 FROM join_members m
                               WHERE m.run_id = runs.run_id AND m.key = runs.joining
                                 AND m.child = $2)
                 RETURNING 1),
             owed AS (
                 SELECT parent.joining AND NOT EXISTS (SELECT 1 FROM down) AS owed FROM parent)
             SELECT EXISTS (SELECT 1 FROM fin), (SELECT now FROM clock), parent.run_id, ",
            $owed,
            " FROM (SELECT 1) AS one LEFT JOIN parent ON true LEFT JOIN owed ON true"
        )
    };
}

/// [`finish!`] as its own transaction: refuses itself (SQLSTATE 22P02, its message
/// starting with [`OWED`]) when the end is still owed to the parent.
pub(super) const FINISH_ALONE: &str = finish!(
    "CASE WHEN owed.owed
          THEN ('idem: a count-down is owed to ' || parent.run_id)::int4 = 0
          ELSE false END"
);

/// [`finish!`] inside a transaction: says whether the end is still owed to the parent.
pub(super) const FINISH_IN_TX: &str = finish!("coalesce(owed.owed, false)");

/// How [`FINISH_ALONE`]'s refusal of itself starts.
pub(super) const OWED: &str = "idem: a count-down is owed";

/// Whether `e` is [`FINISH_ALONE`] refusing itself: nothing was written.
pub(super) fn is_owed(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_some_and(|db| {
        *db.code() == tokio_postgres::error::SqlState::INVALID_TEXT_REPRESENTATION
            && db.message().contains(OWED)
    })
}

/// Counts a child's end (`$2`) down in its parent's join (`$1`) at `$3`, if the parent
/// still waits on it: the last statement of [`count_down_parent`], sent with the
/// finish's `COMMIT` when [`FINISH_IN_TX`] found the count-down owed.
///
/// [`count_down_parent`]: super::children::count_down_parent
pub(super) const COUNT_DOWN: &str = super::children::COUNT_DOWN;

/// What [`finish!`] found: `None` if the fence did not hold (nothing was written),
/// else the parent this end is still owed to (to count down with [`COUNT_DOWN`]), if
/// any, and the time.
pub(super) fn finished(
    rows: &[tokio_postgres::Row],
) -> Result<Option<(Option<String>, Millis)>, TxError> {
    let Some(row) = rows.first() else {
        return Err(TxError::Store(crate::store::StoreError::Backend {
            op: "finish a run",
            source: "the finish statement returned no row".into(),
        }));
    };
    if !row.try_get::<_, bool>(0)? {
        return Ok(None);
    }
    let now: Millis = row.try_get(1)?;
    let owed: Option<bool> = row.try_get(3)?;
    let parent = match owed {
        Some(true) => Some(row.try_get::<_, String>(2)?),
        _ => None,
    };
    Ok(Some((parent, now)))
}
