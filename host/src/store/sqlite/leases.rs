//! Run leases on SQLite: which worker drives a run, and the fence every write made for
//! a run presents.
//!
//! A run's lease is three columns of its `runs` row: the holder, the expiry, and the
//! token of the latest grant. A grant takes the next token; a lease that ends (given
//! back, finished, cancelled) clears the holder and keeps the token. A fence holds
//! while the run's token is its token and the lease was not given back, expired or
//! not: nobody else took it. Checking one is a read of the run's row, so a durable step
//! writes no more pages for being fenced.

use std::collections::HashSet;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use super::runs::{self, end_as_cancelled, lease_from, set_outcome, status_from, unknown_run};
use super::{TxError, to_sql_int, u64_column};
use crate::store::events::NewEvent;
use crate::store::rules::lease_expiry;
use crate::store::rules::{LeaseDecision, decide_run_lease, run_lease_token};
use crate::store::{
    Acquired, Counts, EventKind, LeaseState, LeasedRun, Millis, RunEnd, RunFence, RunLeaseInfo,
    RunStatus, StoreError,
};

/// Whether `fence` is the run's current lease.
pub(super) fn fence_holds(conn: &Connection, fence: &RunFence) -> Result<bool, TxError> {
    // A token beyond SQLite's range was never handed out, so it holds nothing.
    let Ok(token) = to_sql_int(fence.token) else {
        return Ok(false);
    };
    let holds = conn
        .prepare_cached(
            "SELECT 1 FROM runs
             WHERE run_id = ?1 AND lease_token = ?2 AND lease_holder IS NOT NULL",
        )?
        .query_row(params![fence.run_id, token], |_| Ok(()))
        .optional()?
        .is_some();
    Ok(holds)
}

/// Refuses a write whose fence is not the run's current lease.
pub(super) fn check_fence(conn: &Connection, fence: &RunFence) -> Result<(), TxError> {
    if fence_holds(conn, fence)? {
        Ok(())
    } else {
        Err(lease_lost(fence))
    }
}

/// The refusal of a write whose fence is not the run's current lease.
pub(super) fn lease_lost(fence: &RunFence) -> TxError {
    TxError::Store(StoreError::LeaseLost {
        run_id: fence.run_id.clone(),
        token: fence.token,
    })
}

/// The earliest due time after `after` of an unfinished run nobody holds; the scan
/// walks `runs_due` in order and stops at the first.
pub(super) fn next_due(conn: &Connection, after: Millis) -> Result<Option<Millis>, TxError> {
    let due = conn
        .prepare_cached(
            "SELECT coalesce(wake_at, created) FROM runs
             WHERE status IN ('queued', 'running')
               AND coalesce(wake_at, created) > ?1
               AND lease_holder IS NULL
               AND paused IS NULL
             ORDER BY coalesce(wake_at, created)
             LIMIT 1",
        )?
        .query_row([after], |row| row.get(0))
        .optional()?;
    Ok(due)
}

/// Leases up to `max` runs nobody holds a live lease on, of the highest priority
/// first, then oldest first, under tokens of at least `floor` (`epoch.rs`), passing
/// over runs whose deployment or concurrency key is at its limit (`flow.rs`).
pub(super) fn acquire_runs(
    conn: &Connection,
    worker: &str,
    max: usize,
    lease: Duration,
    skip: &[String],
    now: Millis,
    floor: u64,
) -> Result<Vec<LeasedRun>, TxError> {
    if max == 0 {
        return Ok(Vec::new());
    }
    // A poll is this process's write that comes whatever its runs do: the history it
    // gathered for runs whose lease it lost goes out with it.
    super::history::write_all_gathered(conn, true)?;
    let skip: HashSet<&str> = skip.iter().map(String::as_str).collect();
    let mut flow = super::flow::counts(conn, now)?;
    let mut chosen = Vec::new();
    let mut seen = HashSet::new();
    // Runs with a priority first, from their own small index (one probe when there
    // are none); then every due run in due order, which passes over those already
    // chosen. The condition on status is the partial indexes' own, so each scan walks
    // only unfinished runs, in index order. A run whose token cannot grow (only a
    // tampered store has one) is left out rather than failing every poll.
    for sql in [
        "SELECT run_id, lease_token, lease_holder IS NOT NULL, agent, flow_key FROM runs
         WHERE priority > 0 AND status IN ('queued', 'running')
           AND coalesce(wake_at, created) <= ?1
           AND (lease_holder IS NULL OR lease_expires <= ?1)
           AND lease_token < 9223372036854775807
           AND paused IS NULL
         ORDER BY priority DESC, coalesce(wake_at, created), rowid",
        "SELECT run_id, lease_token, lease_holder IS NOT NULL, agent, flow_key FROM runs
         WHERE status IN ('queued', 'running')
           AND coalesce(wake_at, created) <= ?1
           AND (lease_holder IS NULL OR lease_expires <= ?1)
           AND lease_token < 9223372036854775807
           AND paused IS NULL
         ORDER BY coalesce(wake_at, created), rowid",
    ] {
        if chosen.len() == max {
            break;
        }
        let mut stmt = conn.prepare_cached(sql)?;
        let mut rows = stmt.query([now])?;
        while let Some(row) = rows.next()? {
            let run_id: String = row.get(0)?;
            if skip.contains(run_id.as_str()) || seen.contains(&run_id) {
                continue;
            }
            if let Some(flow) = flow.as_mut() {
                let agent: String = row.get(3)?;
                let key: Option<String> = row.get(4)?;
                if !flow.admit(&agent, key.as_deref()) {
                    seen.insert(run_id);
                    continue;
                }
            }
            seen.insert(run_id.clone());
            chosen.push((run_id, u64_column(row, 1)?, row.get::<_, bool>(2)?));
            if chosen.len() == max {
                break;
            }
        }
    }
    let expires = lease_expiry(now, lease);
    chosen
        .into_iter()
        .map(|(run_id, last, taken_over)| {
            let token = run_lease_token(last, floor)?;
            grant(conn, &run_id, token, worker, expires, now, taken_over, true)
        })
        .collect()
}

/// Leases one run, unless another worker's live lease is on it or it is finished. A
/// lease the same worker holds is granted again: the worker knows it is not driving
/// the run (a host keeps that to itself), so it may take it back at once. The token is
/// at least `floor` (`epoch.rs`).
pub(super) fn acquire_run(
    conn: &Connection,
    run_id: &str,
    worker: &str,
    lease: Duration,
    now: Millis,
    floor: u64,
) -> Result<Acquired, TxError> {
    let row: Option<(RunStatus, Option<RunLeaseInfo>, u64, bool)> = conn
        .prepare_cached(
            "SELECT status, lease_holder, lease_token, lease_expires, lease_token,
                    paused IS NOT NULL
             FROM runs WHERE run_id = ?1",
        )?
        .query_row([run_id], |row| {
            Ok((
                status_from(row, 0)?,
                lease_from(row, 1)?,
                u64_column(row, 4)?,
                row.get(5)?,
            ))
        })
        .optional()?;
    let Some((status, lease_now, last, paused)) = row else {
        return Err(unknown_run(run_id));
    };
    if paused && !status.is_finished() {
        let record = runs::run(conn, run_id)?.ok_or_else(|| unknown_run(run_id))?;
        return Ok(Acquired::Paused(record));
    }
    match decide_run_lease(status, lease_now, last, floor, worker, now)? {
        LeaseDecision::Finished => {
            let record = runs::run(conn, run_id)?.ok_or_else(|| unknown_run(run_id))?;
            Ok(Acquired::Finished(record))
        }
        LeaseDecision::Held(held) => Ok(Acquired::Held(held)),
        LeaseDecision::Grant { token, taken_over } => {
            let expires = lease_expiry(now, lease);
            grant(conn, run_id, token, worker, expires, now, taken_over, false)
                .map(Acquired::Leased)
        }
    }
}

/// Grants the run's lease to `worker` under `token` and sets it running; with
/// `count`, also counts the lease's first instance as started
/// ([`LeasedRun::instance_counted`]), sparing the host a transaction of its own for it.
// The grant's facts, each a column it writes: a struct for one private call would only
// move the list.
#[allow(clippy::too_many_arguments)]
fn grant(
    conn: &Connection,
    run_id: &str,
    token: u64,
    worker: &str,
    expires: Millis,
    now: Millis,
    taken_over: bool,
    count: bool,
) -> Result<LeasedRun, TxError> {
    // The lease as it was: one still recorded was never given back, so its holder's
    // instance never ended (a crash, a kill, a lost store): the takeover, on the
    // timeline.
    let before: Option<(String, i64, Option<Millis>)> = if taken_over {
        conn.prepare_cached(
            "SELECT lease_holder, lease_token, lease_expires FROM runs
             WHERE run_id = ?1 AND lease_holder IS NOT NULL",
        )?
        .query_row([run_id], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .optional()?
    } else {
        None
    };
    if let Some((from_holder, from_token, expired_at)) = before {
        let event = NewEvent::new(
            EventKind::TookOver,
            serde_json::json!({
                "from_holder": from_holder,
                "from_token": from_token,
                "expired_at": expired_at,
            }),
        );
        super::events::record(conn, run_id, &event.token(token).holder(worker), now)?;
    }
    let token_sql = to_sql_int(token)?;
    conn.prepare_cached(
        "UPDATE runs
         SET status = ?2, lease_holder = ?3, lease_token = ?4, lease_expires = ?5, updated = ?6,
             wake_at = NULL, waiting_for = NULL, joining = NULL, join_left = NULL,
             instances = instances + ?7
         WHERE run_id = ?1",
    )?
    .execute(params![
        run_id,
        RunStatus::Running.as_str(),
        worker,
        token_sql,
        expires,
        now,
        i64::from(count)
    ])?;
    let record = runs::run(conn, run_id)?.ok_or_else(|| unknown_run(run_id))?;
    if count {
        // The grant starts the lease's first instance: on the timeline with it.
        let event = NewEvent::new(
            EventKind::Started,
            serde_json::json!({ "instance": record.counts.instances }),
        );
        super::events::record(conn, run_id, &event.token(token).holder(worker), now)?;
    }
    let (input, authority) = conn
        .prepare_cached("SELECT input, authority FROM run_inputs WHERE run_id = ?1")?
        .query_row([run_id], |row| Ok((row.get(0)?, row.get(1)?)))?;
    let checkpoint = runs::load_progress(conn, run_id)?;
    Ok(LeasedRun {
        record,
        token,
        input,
        authority,
        taken_over,
        checkpoint,
        checkpoint_read: true,
        instance_counted: count,
    })
}

/// Extends each lease its fence still holds to `expires`.
pub(super) fn renew_runs(
    conn: &Connection,
    fences: &[RunFence],
    expires: Millis,
) -> Result<Vec<LeaseState>, TxError> {
    let mut states = Vec::with_capacity(fences.len());
    for fence in fences {
        let Ok(token) = to_sql_int(fence.token) else {
            states.push(LeaseState::Lost);
            continue;
        };
        let asked: Option<(bool, bool)> = conn
            .prepare_cached(
                "UPDATE runs SET lease_expires = ?3
                 WHERE run_id = ?1 AND lease_token = ?2 AND lease_holder IS NOT NULL
                 RETURNING cancel_requested, paused IS NOT NULL",
            )?
            .query_row(params![fence.run_id, token, expires], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })
            .optional()?;
        states.push(match asked {
            Some((cancel_requested, pause_requested)) => LeaseState::Held {
                expires,
                cancel_requested,
                pause_requested,
            },
            None => LeaseState::Lost,
        });
    }
    Ok(states)
}

/// Gives the lease back, with the run's counts and why; any worker may take it at once.
pub(super) fn release_run(
    conn: &Connection,
    fence: &RunFence,
    counts: &Counts,
    note: Option<&str>,
    now: Millis,
) -> Result<(), TxError> {
    check_fence(conn, fence)?;
    super::history::write_gathered(conn, &fence.run_id)?;
    // A host that gives back a lease whose grant counted an instance it never ran
    // takes the count back: the timeline says that instance never ran.
    let counted: u64 = conn
        .prepare_cached("SELECT instances FROM runs WHERE run_id = ?1")?
        .query_row([&fence.run_id], |row| u64_column(row, 0))?;
    runs::save_counts(conn, &fence.run_id, counts, now)?;
    let paused: bool = conn
        .prepare_cached(
            "UPDATE runs SET lease_holder = NULL, lease_expires = NULL, note = ?2 WHERE run_id = ?1
             RETURNING paused IS NOT NULL",
        )?
        .query_row(params![fence.run_id, note], |row| row.get(0))?;
    let event = NewEvent::new(
        EventKind::Released,
        serde_json::json!({
            "note": note,
            "paused": paused,
            "unstarted": counted > counts.instances,
        }),
    );
    super::events::record(conn, &fence.run_id, &event.token(fence.token), now)
}

/// Records that a new instance of the run starts under `fence`, with the run's counts
/// (which count it); and, if the instance before it under this lease was dropped on
/// purpose, that it was, and why.
pub(super) fn start_instance(
    conn: &Connection,
    fence: &RunFence,
    counts: &Counts,
    recycled: Option<&str>,
    now: Millis,
) -> Result<(), TxError> {
    check_fence(conn, fence)?;
    runs::save_counts(conn, &fence.run_id, counts, now)?;
    if let Some(reason) = recycled {
        let event = NewEvent::new(
            EventKind::Recycled,
            serde_json::json!({
                "instance": counts.instances.saturating_sub(1),
                "reason": reason,
            }),
        );
        super::events::record(conn, &fence.run_id, &event.token(fence.token), now)?;
    }
    let event = NewEvent::new(
        EventKind::Started,
        serde_json::json!({ "instance": counts.instances }),
    );
    super::events::record(conn, &fence.run_id, &event.token(fence.token), now)
}

/// Records how the run ended and ends its lease (keeping its token).
pub(super) fn finish_run(
    conn: &Connection,
    fence: &RunFence,
    end: RunEnd<'_>,
    counts: &Counts,
    now: Millis,
) -> Result<(), TxError> {
    check_fence(conn, fence)?;
    let run_id = fence.run_id.as_str();
    super::history::write_gathered(conn, run_id)?;
    runs::save_counts(conn, run_id, counts, now)?;
    if !matches!(end, RunEnd::Cancelled) {
        // A cancellation records its end where every cancellation does.
        let status = match end {
            RunEnd::Completed(_) => RunStatus::Completed,
            RunEnd::Failed(_) => RunStatus::Failed,
            _ => RunStatus::InDoubt,
        };
        let event = NewEvent::new(
            EventKind::Finished,
            serde_json::json!({ "status": status.as_str() }),
        );
        super::events::record(conn, run_id, &event.token(fence.token), now)?;
    }
    let status = match end {
        RunEnd::Completed(output) => {
            set_outcome(conn, run_id, Some(output))?;
            RunStatus::Completed
        }
        RunEnd::Failed(error) => {
            set_outcome(conn, run_id, Some(error))?;
            RunStatus::Failed
        }
        // The reason `park` stored stays the run's outcome.
        RunEnd::InDoubt => RunStatus::InDoubt,
        RunEnd::Cancelled => return end_as_cancelled(conn, run_id, now),
    };
    conn.prepare_cached(
        "UPDATE runs
         SET status = ?2, lease_holder = NULL, lease_expires = NULL, cancel_requested = 0,
             updated = ?3
         WHERE run_id = ?1",
    )?
    .execute(params![run_id, status.as_str(), now])?;
    if status != RunStatus::InDoubt {
        super::children::count_down_parent(conn, run_id, now)?;
    }
    Ok(())
}

/// Ends the live run leases `holder` holds, as if they had expired at `now`: its
/// process is gone. A scan of the runs, made once per holder found gone.
pub(super) fn end_leases_of(conn: &Connection, holder: &str, now: Millis) -> Result<u64, TxError> {
    let ended = conn
        .prepare_cached(
            "UPDATE runs SET lease_expires = ?2 WHERE lease_holder = ?1 AND lease_expires > ?2",
        )?
        .execute(params![holder, now])?;
    Ok(u64::try_from(ended).unwrap_or(u64::MAX))
}
