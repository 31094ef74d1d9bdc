//! Runs' timelines on SQLite (`0019_events.sql`): recording an event inside the
//! transaction of the write it belongs to, and reading a run's timeline back.

use rusqlite::{Connection, OptionalExtension, params};

use super::{TxError, to_sql_int, u64_column};
use crate::store::events::{EVENTS_HEAD, EVENTS_TAIL, NewEvent, detail_from};
use crate::store::{EventKind, Millis, RunEvent, Timeline};

/// Records `event` for run `run_id` at `now` under the run's next number, and drops
/// the event that falls out of the kept tail; a run that does not exist records
/// nothing. An event under the run's current lease that names no holder is recorded
/// with the lease's. Three statements by primary key: called once per instance,
/// lease or operator's write, never per step.
pub(super) fn record(
    conn: &Connection,
    run_id: &str,
    event: &NewEvent,
    now: Millis,
) -> Result<(), TxError> {
    let numbered: Option<(i64, Option<String>, i64)> = conn
        .prepare_cached(
            "UPDATE runs SET events = events + 1 WHERE run_id = ?1
             RETURNING events, lease_holder, lease_token",
        )?
        .query_row([run_id], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .optional()?;
    let Some((seq, lease_holder, lease_token)) = numbered else {
        return Ok(());
    };
    let token = event.token.map(to_sql_int).transpose()?;
    let holder = match (&event.holder, token) {
        (Some(holder), _) => Some(holder.clone()),
        (None, Some(token)) if token == lease_token => lease_holder,
        (None, _) => None,
    };
    conn.prepare_cached(
        "INSERT INTO run_events (run_id, seq, at, kind, holder, token, detail)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![
        run_id,
        seq,
        now,
        event.kind.as_str(),
        holder,
        token,
        event.detail_text()
    ])?;
    trim(conn, run_id, seq)
}

/// Drops the run's events between its first [`EVENTS_HEAD`] and its last
/// [`EVENTS_TAIL`], `newest` being its latest number: at most one row each time, as
/// each event is recorded.
fn trim(conn: &Connection, run_id: &str, newest: i64) -> Result<(), TxError> {
    let (head, tail) = (to_sql_int(EVENTS_HEAD)?, to_sql_int(EVENTS_TAIL)?);
    if newest > head + tail {
        conn.prepare_cached("DELETE FROM run_events WHERE run_id = ?1 AND seq > ?2 AND seq <= ?3")?
            .execute(params![run_id, head, newest - tail])?;
    }
    Ok(())
}

/// The run's timeline, or `None` if the run does not exist.
pub(super) fn read(conn: &Connection, run_id: &str) -> Result<Option<Timeline>, TxError> {
    let recorded: Option<u64> = conn
        .prepare_cached("SELECT events FROM runs WHERE run_id = ?1")?
        .query_row([run_id], |row| u64_column(row, 0))
        .optional()?;
    let Some(recorded) = recorded else {
        return Ok(None);
    };
    let mut stmt = conn.prepare_cached(
        "SELECT seq, at, kind, holder, token, detail FROM run_events
         WHERE run_id = ?1 ORDER BY seq",
    )?;
    let mut rows = stmt.query([run_id])?;
    let mut events = Vec::new();
    while let Some(row) = rows.next()? {
        let kind: String = row.get(2)?;
        // A kind a newer host wrote is passed over: the rest still shows.
        let Some(kind) = EventKind::parse(&kind) else {
            continue;
        };
        let token: Option<i64> = row.get(4)?;
        let detail: String = row.get(5)?;
        events.push(RunEvent {
            seq: u64_column(row, 0)?,
            at: row.get(1)?,
            kind,
            holder: row.get(3)?,
            token: token.map(i64::unsigned_abs),
            detail: detail_from(&detail),
        });
    }
    Ok(Some(Timeline::new(events, recorded)))
}
