//! Durable waits on PostgreSQL: a run's sleeps and signal waits, its suspension while
//! it waits, and the signals sent to it. The same statements as SQLite's, each inside
//! the transaction its caller began (the run's row locked by the fence check).

use super::TxError;
use super::conn::Conn;
use super::runs::{save_counts, status_from, unknown_run};
use crate::store::EventKind;
use crate::store::events::NewEvent;
use crate::store::rules::{Recorded, WaitRow, asked, sleep_state};
use crate::store::{
    Counts, Millis, RunFence, RunStatus, SignalSent, StoreError, Suspension, WaitKind, WaitRecord,
    WaitState, check_signal_name, check_signal_payload,
};

/// Records the wait if new and says where it stands; a signal wait takes its signal
/// here, in the caller's transaction. The caller checked the fence.
pub(super) async fn wait(
    conn: &Conn,
    fence: &RunFence,
    key: &str,
    kind: &WaitKind<'_>,
) -> Result<WaitState, TxError> {
    let now = conn.now;
    let refused = |reason: String| {
        TxError::Store(StoreError::WaitRefused {
            run_id: fence.run_id.clone(),
            key: key.to_owned(),
            reason,
        })
    };
    let asked = asked(now, kind).map_err(refused)?;
    let row = conn
        .query_opt(
            "SELECT signal, due, outcome, payload, join_mode, rate_class FROM waits
             WHERE run_id = $1 AND key = $2",
            &[&fence.run_id, &key],
        )
        .await?;
    let due = match row {
        Some(row) => {
            let row = WaitRow {
                signal: row.try_get(0)?,
                due: row.try_get(1)?,
                outcome: row.try_get(2)?,
                payload: row.try_get(3)?,
                join_mode: row.try_get(4)?,
                rate: row.try_get(5)?,
            };
            match row.state(key, &asked).map_err(refused)? {
                Recorded::Settled(state) => return Ok(state),
                Recorded::Open(due) => due,
            }
        }
        None => {
            // A rate wait is due when the token reserved for it now is free.
            let due = match asked.rate {
                Some(class) => Some(super::rates::reserve(conn, class).await?),
                None => asked.due,
            };
            conn.execute(
                "INSERT INTO waits (run_id, key, signal, due, created, rate_class)
                 VALUES ($1, $2, $3, $4, $5, $6)",
                &[&fence.run_id, &key, &asked.signal, &due, &now, &asked.rate],
            )
            .await?;
            due
        }
    };
    match asked.signal {
        None => Ok(sleep_state(due, now)),
        Some(name) => take_signal(conn, &fence.run_id, key, name, due).await,
    }
}

/// A signal wait not over: takes the oldest signal `name` sent to the run and not yet
/// received, or times the wait out once `due` passed.
async fn take_signal(
    conn: &Conn,
    run_id: &str,
    key: &str,
    name: &str,
    due: Option<Millis>,
) -> Result<WaitState, TxError> {
    let signal = conn
        .query_opt(
            "SELECT id, payload FROM signals
             WHERE run_id = $1 AND name = $2 AND taken_by IS NULL ORDER BY id LIMIT 1
             FOR UPDATE",
            &[&run_id, &name],
        )
        .await?;
    if let Some(signal) = signal {
        let (id, payload): (i64, Vec<u8>) = (signal.try_get(0)?, signal.try_get(1)?);
        conn.execute(
            "UPDATE signals SET taken_by = $2 WHERE id = $1",
            &[&id, &key],
        )
        .await?;
        settle(conn, run_id, key, "received", Some(&payload)).await?;
        return Ok(WaitState::Received(payload));
    }
    match due {
        Some(due) if due <= conn.now => {
            settle(conn, run_id, key, "timed-out", None).await?;
            Ok(WaitState::TimedOut)
        }
        due => Ok(WaitState::Pending { due }),
    }
}

/// Records how the wait `key` of run `run_id` ended, with what it received.
pub(super) async fn settle(
    conn: &Conn,
    run_id: &str,
    key: &str,
    outcome: &str,
    payload: Option<&[u8]>,
) -> Result<(), TxError> {
    conn.execute(
        "UPDATE waits SET outcome = $3, payload = $4, settled = $5 WHERE run_id = $1 AND key = $2",
        &[&run_id, &key, &outcome, &payload, &conn.now],
    )
    .await?;
    Ok(())
}

/// Ends the run's lease while it waits, with its counts and its wake time. The caller
/// checked the fence.
pub(super) async fn suspend_run(
    conn: &Conn,
    fence: &RunFence,
    counts: &Counts,
    suspension: &Suspension<'_>,
) -> Result<(), TxError> {
    save_counts(conn, &fence.run_id, counts).await?;
    // A signal sent between the wait's look and this suspension is not missed: the
    // run is due at once.
    let arrived = match suspension.signal {
        Some(name) => conn
            .query_opt(
                "SELECT 1 FROM signals WHERE run_id = $1 AND name = $2 AND taken_by IS NULL
                 LIMIT 1",
                &[&fence.run_id, &name],
            )
            .await?
            .is_some(),
        None => false,
    };
    // Likewise a child that ended since the join looked: counted here, with the run's
    // row locked, after which each child's end counts itself down.
    let join_left = match suspension.join {
        Some(key) => Some(super::children::join_left(conn, &fence.run_id, key).await?),
        None => None,
    };
    let wake_at = if arrived || join_left == Some(0) {
        conn.now
    } else {
        suspension.due.unwrap_or(Millis::MAX)
    };
    conn.execute(
        "UPDATE runs
         SET lease_holder = NULL, lease_expires = NULL, note = NULL, wake_at = $2,
             waiting_for = $3, joining = $5, join_left = $6, updated = $4
         WHERE run_id = $1",
        &[
            &fence.run_id,
            &wake_at,
            &suspension.signal,
            &conn.now,
            &suspension.join,
            &join_left,
        ],
    )
    .await?;
    let event = NewEvent::new(
        EventKind::Waiting,
        serde_json::json!({
            "due": suspension.due,
            "signal": suspension.signal,
            "join": suspension.join,
            "due_now": arrived || join_left == Some(0),
        }),
    );
    super::events::record(conn, &fence.run_id, &[event.token(fence.token)]).await
}

/// Sends a signal; a run suspended waiting for it is due now.
pub(super) async fn send_signal(
    conn: &Conn,
    run_id: &str,
    name: &str,
    payload: &[u8],
    max_payload: usize,
) -> Result<SignalSent, TxError> {
    let refused = |reason: String| {
        TxError::Store(StoreError::SignalRefused {
            run_id: run_id.to_owned(),
            reason,
        })
    };
    check_signal_name(name).map_err(refused)?;
    check_signal_payload(payload.len(), max_payload).map_err(refused)?;
    // Locked, so that a suspension of the run sees this signal or is seen by it.
    let row = conn
        .query_opt(
            "SELECT status, waiting_for, lease_holder IS NULL FROM runs
             WHERE run_id = $1 FOR NO KEY UPDATE",
            &[&run_id],
        )
        .await?;
    let Some(row) = row else {
        return Err(unknown_run(run_id));
    };
    let status = status_from(&row, 0)?;
    let (waiting_for, free): (Option<String>, bool) = (row.try_get(1)?, row.try_get(2)?);
    if matches!(status, RunStatus::Completed | RunStatus::Cancelled) {
        return Err(TxError::Store(StoreError::RunFinished {
            run_id: run_id.to_owned(),
            status,
        }));
    }
    let id: i64 = conn
        .query_one(
            "INSERT INTO signals (run_id, name, payload, sent) VALUES ($1, $2, $3, $4)
             RETURNING id",
            &[&run_id, &name, &payload, &conn.now],
        )
        .await?
        .try_get(0)?;
    let woke = free && waiting_for.as_deref() == Some(name);
    if woke {
        conn.execute(
            "UPDATE runs SET wake_at = $2, updated = $2 WHERE run_id = $1",
            &[&run_id, &conn.now],
        )
        .await?;
    }
    // The name only: the payload may be secret, and stays sealed where it is (here it
    // may be sealed already, so not even its size is the agent's).
    let event = NewEvent::new(
        EventKind::Signal,
        serde_json::json!({ "name": name, "woke": woke }),
    );
    super::events::record(conn, run_id, &[event]).await?;
    Ok(SignalSent {
        id: id.unsigned_abs(),
        woke,
    })
}

/// The run's waits, in the order they were first reached.
pub(super) async fn waits(conn: &Conn, run_id: &str) -> Result<Vec<WaitRecord>, TxError> {
    let rows = conn
        .query(
            "SELECT key, signal, due, created, outcome, settled, join_mode,
                    CASE WHEN join_mode IS NULL THEN NULL ELSE
                        (SELECT COUNT(*) FROM join_members m
                         WHERE m.run_id = waits.run_id AND m.key = waits.key) END,
                    rate_class
             FROM waits WHERE run_id = $1 ORDER BY created, key",
            &[&run_id],
        )
        .await?;
    rows.iter()
        .map(|row| {
            Ok(WaitRecord {
                key: row.try_get(0)?,
                signal: row.try_get(1)?,
                due: row.try_get(2)?,
                created: row.try_get(3)?,
                outcome: row.try_get(4)?,
                settled: row.try_get(5)?,
                join: row.try_get(6)?,
                join_children: row.try_get::<_, Option<i64>>(7)?.map(|n| n.max(0) as u64),
                rate: row.try_get(8)?,
            })
        })
        .collect()
}
