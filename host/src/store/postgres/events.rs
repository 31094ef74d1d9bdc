//! Runs' timelines on PostgreSQL (`0017_events.sql`): recording events inside the
//! transaction of the write they belong to, and reading a run's timeline back.
//!
//! A run's events are numbered by `runs.events`, incremented by the statement that
//! records them: its `UPDATE` takes (or already holds) the run's row lock, so two
//! writers of one run's events never take one number.

use super::conn::Conn;
use super::{TxError, to_sql_int, u64_col};
use crate::store::events::{EVENTS_HEAD, EVENTS_TAIL, NewEvent, detail_from};
use crate::store::{EventKind, RunEvent, Timeline};

/// Records a run's events and drops those between its first [`EVENTS_HEAD`] and last
/// [`EVENTS_TAIL`]. Parameters: `$1` run, `$2` time, `$3` to `$6` arrays of kind,
/// holder, token and detail, `$7` and `$8` the bounds.
const RECORD: &str = "WITH
     e AS (SELECT * FROM unnest($3::text[], $4::text[], $5::int8[], $6::text[])
           WITH ORDINALITY AS e(kind, holder, token, detail, ord)),
     n AS (UPDATE runs SET events = events + (SELECT count(*) FROM e)
           WHERE run_id = $1 RETURNING events, lease_holder, lease_token),
     ins AS (INSERT INTO run_events (run_id, seq, at, kind, holder, token, detail)
             SELECT $1, n.events - (SELECT count(*) FROM e) + e.ord, $2, e.kind,
                    coalesce(e.holder,
                             CASE WHEN e.token = n.lease_token THEN n.lease_holder END),
                    e.token, e.detail
             FROM n CROSS JOIN e),
     cut AS (DELETE FROM run_events
             WHERE run_id = $1 AND seq > $7 AND seq <= (SELECT events FROM n) - $8)
     SELECT 1";

/// Records `events` for run `run_id` at the transaction's time under the run's next
/// numbers, and drops those that fall out of the kept tail: one statement. A run that
/// does not exist records nothing. An event under the run's current lease that names
/// no holder is recorded with the lease's.
pub(super) async fn record(conn: &Conn, run_id: &str, events: &[NewEvent]) -> Result<(), TxError> {
    if events.is_empty() {
        return Ok(());
    }
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    let holders: Vec<Option<&str>> = events.iter().map(|e| e.holder.as_deref()).collect();
    let tokens: Vec<Option<i64>> = events
        .iter()
        .map(|e| e.token.map(to_sql_int).transpose())
        .collect::<Result<_, _>>()?;
    let details: Vec<String> = events.iter().map(NewEvent::detail_text).collect();
    let (head, tail) = (to_sql_int(EVENTS_HEAD)?, to_sql_int(EVENTS_TAIL)?);
    conn.execute(
        RECORD,
        &[
            &run_id, &conn.now, &kinds, &holders, &tokens, &details, &head, &tail,
        ],
    )
    .await?;
    Ok(())
}

/// The run's timeline, or `None` if the run does not exist.
pub(super) async fn read(conn: &Conn, run_id: &str) -> Result<Option<Timeline>, TxError> {
    let Some(row) = conn
        .query_opt("SELECT events FROM runs WHERE run_id = $1", &[&run_id])
        .await?
    else {
        return Ok(None);
    };
    let recorded = u64_col(&row, 0)?;
    let rows = conn
        .query(
            "SELECT seq, at, kind, holder, token, detail FROM run_events
             WHERE run_id = $1 ORDER BY seq",
            &[&run_id],
        )
        .await?;
    let mut events = Vec::with_capacity(rows.len());
    for row in &rows {
        let kind: String = row.try_get(2)?;
        // A kind a newer host wrote is passed over: the rest still shows.
        let Some(kind) = EventKind::parse(&kind) else {
            continue;
        };
        let token: Option<i64> = row.try_get(4)?;
        let detail: String = row.try_get(5)?;
        events.push(RunEvent {
            seq: u64_col(row, 0)?,
            at: row.try_get(1)?,
            kind,
            holder: row.try_get(3)?,
            token: token.map(i64::unsigned_abs),
            detail: detail_from(&detail),
        });
    }
    Ok(Some(Timeline::new(events, recorded)))
}
