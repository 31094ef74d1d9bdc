//! Durable waits on SQLite: a run's sleeps and signal waits, its suspension while it
//! waits, and the signals sent to it. Each function runs inside the transaction of the
//! database thread.

use rusqlite::{Connection, OptionalExtension, params};

use super::TxError;
use super::leases::check_fence;
use super::runs::{save_counts, status_from, unknown_run};
use crate::store::EventKind;
use crate::store::events::NewEvent;
use crate::store::rules::{Recorded, WaitRow, asked, sleep_state};
use crate::store::{
    Counts, Millis, RunFence, RunStatus, SignalSent, StoreError, Suspension, WaitKind, WaitRecord,
    WaitState, check_signal_name, check_signal_payload,
};

/// Records the wait if new and says where it stands; a signal wait takes its signal
/// here, in the caller's transaction.
pub(super) fn wait(
    conn: &Connection,
    fence: &RunFence,
    key: &str,
    kind: &WaitKind<'_>,
    now: Millis,
) -> Result<WaitState, TxError> {
    check_fence(conn, fence)?;
    let refused = |reason: String| {
        TxError::Store(StoreError::WaitRefused {
            run_id: fence.run_id.clone(),
            key: key.to_owned(),
            reason,
        })
    };
    let asked = asked(now, kind).map_err(refused)?;
    let row = conn
        .prepare_cached(
            "SELECT signal, due, outcome, payload, join_mode, rate_class FROM waits
             WHERE run_id = ?1 AND key = ?2",
        )?
        .query_row(params![fence.run_id, key], |row| {
            Ok(WaitRow {
                signal: row.get(0)?,
                due: row.get(1)?,
                outcome: row.get(2)?,
                payload: row.get(3)?,
                join_mode: row.get(4)?,
                rate: row.get(5)?,
            })
        })
        .optional()?;
    let due = match row {
        Some(row) => match row.state(key, &asked).map_err(refused)? {
            Recorded::Settled(state) => return Ok(state),
            Recorded::Open(due) => due,
        },
        None => {
            // A rate wait is due when the token reserved for it now is free.
            let due = match asked.rate {
                Some(class) => Some(super::rates::reserve(conn, class, now)?),
                None => asked.due,
            };
            conn.prepare_cached(
                "INSERT INTO waits (run_id, key, signal, due, created, rate_class)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?
            .execute(params![
                fence.run_id,
                key,
                asked.signal,
                due,
                now,
                asked.rate
            ])?;
            due
        }
    };
    match asked.signal {
        None => Ok(sleep_state(due, now)),
        Some(name) => take_signal(conn, &fence.run_id, key, name, due, now),
    }
}

/// A signal wait not over: takes the oldest signal `name` sent to the run and not yet
/// received, or times the wait out once `due` passed.
fn take_signal(
    conn: &Connection,
    run_id: &str,
    key: &str,
    name: &str,
    due: Option<Millis>,
    now: Millis,
) -> Result<WaitState, TxError> {
    let signal: Option<(i64, Vec<u8>)> = conn
        .prepare_cached(
            "SELECT id, payload FROM signals
             WHERE run_id = ?1 AND name = ?2 AND taken_by IS NULL ORDER BY id LIMIT 1",
        )?
        .query_row(params![run_id, name], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()?;
    if let Some((id, payload)) = signal {
        conn.prepare_cached("UPDATE signals SET taken_by = ?2 WHERE id = ?1")?
            .execute(params![id, key])?;
        settle(conn, run_id, key, "received", Some(&payload), now)?;
        return Ok(WaitState::Received(payload));
    }
    match due {
        Some(due) if due <= now => {
            settle(conn, run_id, key, "timed-out", None, now)?;
            Ok(WaitState::TimedOut)
        }
        due => Ok(WaitState::Pending { due }),
    }
}

/// Records how the wait `key` of run `run_id` ended, with what it received.
pub(super) fn settle(
    conn: &Connection,
    run_id: &str,
    key: &str,
    outcome: &str,
    payload: Option<&[u8]>,
    now: Millis,
) -> Result<(), TxError> {
    conn.prepare_cached(
        "UPDATE waits SET outcome = ?3, payload = ?4, settled = ?5 WHERE run_id = ?1 AND key = ?2",
    )?
    .execute(params![run_id, key, outcome, payload, now])?;
    Ok(())
}

/// Ends the run's lease while it waits, with its counts and its wake time.
pub(super) fn suspend_run(
    conn: &Connection,
    fence: &RunFence,
    counts: &Counts,
    suspension: &Suspension<'_>,
    now: Millis,
) -> Result<(), TxError> {
    check_fence(conn, fence)?;
    save_counts(conn, &fence.run_id, counts, now)?;
    super::history::write_gathered(conn, &fence.run_id)?;
    // A signal sent between the wait's look and this suspension is not missed: the
    // run is due at once.
    let arrived = match suspension.signal {
        Some(name) => conn
            .prepare_cached(
                "SELECT 1 FROM signals WHERE run_id = ?1 AND name = ?2 AND taken_by IS NULL",
            )?
            .query_row(params![fence.run_id, name], |_| Ok(()))
            .optional()?
            .is_some(),
        None => false,
    };
    // Likewise a child that ended since the join looked: counted here, in the
    // transaction after which each child's end counts itself down.
    let join_left = match suspension.join {
        Some(key) => Some(super::children::join_left(conn, &fence.run_id, key)?),
        None => None,
    };
    let wake_at = if arrived || join_left == Some(0) {
        now
    } else {
        suspension.due.unwrap_or(Millis::MAX)
    };
    conn.prepare_cached(
        "UPDATE runs
         SET lease_holder = NULL, lease_expires = NULL, note = NULL, wake_at = ?2,
             waiting_for = ?3, joining = ?5, join_left = ?6, updated = ?4
         WHERE run_id = ?1",
    )?
    .execute(params![
        fence.run_id,
        wake_at,
        suspension.signal,
        now,
        suspension.join,
        join_left
    ])?;
    let event = NewEvent::new(
        EventKind::Waiting,
        serde_json::json!({
            "due": suspension.due,
            "signal": suspension.signal,
            "join": suspension.join,
            "due_now": arrived || join_left == Some(0),
        }),
    );
    super::events::record(conn, &fence.run_id, &event.token(fence.token), now)
}

/// Sends a signal; a run suspended waiting for it is due now.
pub(super) fn send_signal(
    conn: &Connection,
    run_id: &str,
    name: &str,
    payload: &[u8],
    max_payload: usize,
    now: Millis,
) -> Result<SignalSent, TxError> {
    let refused = |reason: String| {
        TxError::Store(StoreError::SignalRefused {
            run_id: run_id.to_owned(),
            reason,
        })
    };
    check_signal_name(name).map_err(refused)?;
    check_signal_payload(payload.len(), max_payload).map_err(refused)?;
    let row: Option<(RunStatus, Option<String>, bool)> = conn
        .prepare_cached(
            "SELECT status, waiting_for, lease_holder IS NULL FROM runs WHERE run_id = ?1",
        )?
        .query_row([run_id], |row| {
            Ok((status_from(row, 0)?, row.get(1)?, row.get(2)?))
        })
        .optional()?;
    let Some((status, waiting_for, free)) = row else {
        return Err(unknown_run(run_id));
    };
    if matches!(status, RunStatus::Completed | RunStatus::Cancelled) {
        return Err(TxError::Store(StoreError::RunFinished {
            run_id: run_id.to_owned(),
            status,
        }));
    }
    let id: i64 = conn
        .prepare_cached(
            "INSERT INTO signals (run_id, name, payload, sent) VALUES (?1, ?2, ?3, ?4)
             RETURNING id",
        )?
        .query_row(params![run_id, name, payload, now], |row| row.get(0))?;
    let woke = free && waiting_for.as_deref() == Some(name);
    if woke {
        conn.prepare_cached("UPDATE runs SET wake_at = ?2, updated = ?2 WHERE run_id = ?1")?
            .execute(params![run_id, now])?;
    }
    // The name only: the payload may be secret, and stays sealed where it is (here it
    // may be sealed already, so not even its size is the agent's).
    let event = NewEvent::new(
        EventKind::Signal,
        serde_json::json!({ "name": name, "woke": woke }),
    );
    super::events::record(conn, run_id, &event, now)?;
    Ok(SignalSent {
        id: id.unsigned_abs(),
        woke,
    })
}

/// The run's waits, in the order they were first reached.
pub(super) fn waits(conn: &Connection, run_id: &str) -> Result<Vec<WaitRecord>, TxError> {
    let records = conn
        .prepare_cached(
            "SELECT key, signal, due, created, outcome, settled, join_mode,
                    CASE WHEN join_mode IS NULL THEN NULL ELSE
                        (SELECT COUNT(*) FROM join_members m
                         WHERE m.run_id = waits.run_id AND m.key = waits.key) END,
                    rate_class
             FROM waits WHERE run_id = ?1 ORDER BY created, key",
        )?
        .query_map([run_id], |row| {
            Ok(WaitRecord {
                key: row.get(0)?,
                signal: row.get(1)?,
                due: row.get(2)?,
                created: row.get(3)?,
                outcome: row.get(4)?,
                settled: row.get(5)?,
                join: row.get(6)?,
                join_children: row.get::<_, Option<i64>>(7)?.map(|n| n.max(0) as u64),
                rate: row.get(8)?,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(records)
}
