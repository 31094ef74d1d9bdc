//! Versions of a deployment on SQLite: listing them with their runs, and moving runs
//! between them (a rollout's policy, an operator's upgrade or rollback, a person's
//! `idem run --upgrade`), each move recorded in `run_upgrades` with its reason.
//!
//! Which runs move where is decided in `rules/versions.rs`; this reads the facts and
//! writes the moves, inside the caller's transaction.

use rusqlite::types::Type;
use rusqlite::{Connection, OptionalExtension, Row, params};

use super::{TxError, to_sql_int, u64_column};
use crate::store::EventKind;
use crate::store::events::NewEvent;
use crate::store::rules::{IN_FLIGHT_SQL, OnMismatch, Planned, RunFacts, VersionFacts, plan_moves};
use crate::store::{
    Millis, MoveReason, MoveRuns, MoveTo, RunMove, RunStatus, StoreError, VersionRecord,
};

/// Every version of `name`, oldest first, with how many runs are on each.
pub(super) fn versions(conn: &Connection, name: &str) -> Result<Vec<VersionRecord>, TxError> {
    let sql = format!(
        "SELECT d.name, d.digest, d.authority, d.admission, d.deployed_at, d.source,
                d.version, d.in_flight, d.exports,
                (SELECT count(*) FROM runs r WHERE r.agent = d.name AND r.version = d.version
                    AND r.status IN {IN_FLIGHT_SQL}),
                (SELECT count(*) FROM runs r WHERE r.agent = d.name AND r.version = d.version)
         FROM deployments d WHERE d.name = ?1 ORDER BY d.version"
    );
    let mut records: Vec<VersionRecord> = conn
        .prepare_cached(&sql)?
        .query_map([name], |row| {
            Ok(VersionRecord {
                deployment: super::components::record(row)?,
                current: false,
                runs_in_flight: u64_column(row, 9)?,
                runs: u64_column(row, 10)?,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    if let Some(last) = records.last_mut() {
        last.current = true;
    }
    Ok(records)
}

/// Moves what `request` asks for, or nothing when it is refused.
pub(super) fn move_runs(
    conn: &Connection,
    request: &MoveRuns<'_>,
    now: Millis,
) -> Result<Vec<RunMove>, TxError> {
    let versions = version_facts(conn, request.name)?;
    let runs = if request.runs.is_empty() {
        in_flight_runs(conn, request.name)?
    } else {
        let mut runs = Vec::with_capacity(request.runs.len());
        for id in request.runs {
            runs.extend(run_facts(conn, id)?);
        }
        runs
    };
    let (planned, _) = plan_moves(
        request.name,
        request.to,
        request.runs,
        &versions,
        &runs,
        OnMismatch::Refuse,
    )
    .map_err(TxError::Store)?;
    let reason = match request.to {
        MoveTo::Version(_) => MoveReason::Operator,
        MoveTo::Back => MoveReason::Rollback,
    };
    planned
        .iter()
        .map(|p| apply(conn, p, reason, now))
        .collect()
}

/// Moves the runs of `name` in flight to its new `version` (a rollout with
/// [`InFlight::Upgrade`](crate::store::InFlight::Upgrade)); returns the moves and the
/// runs kept where they are because their exports differ.
pub(super) fn roll_out(
    conn: &Connection,
    name: &str,
    version: u64,
    now: Millis,
) -> Result<(Vec<RunMove>, Vec<String>), TxError> {
    let versions = version_facts(conn, name)?;
    let runs = in_flight_runs(conn, name)?;
    let (planned, kept) = plan_moves(
        name,
        MoveTo::Version(version),
        &[],
        &versions,
        &runs,
        OnMismatch::Keep,
    )
    .map_err(TxError::Store)?;
    let moved = planned
        .iter()
        .map(|p| apply(conn, p, MoveReason::Policy, now))
        .collect::<Result<_, _>>()?;
    Ok((moved, kept))
}

/// Moves run `run_id` from component `from` to `to` (and to the latest version of its
/// deployment with `to`), as a person asked (`idem run --upgrade`, or a rebuild).
pub(super) fn upgrade_run(
    conn: &Connection,
    run_id: &str,
    from: &str,
    to: &str,
    now: Millis,
) -> Result<(), TxError> {
    let Some(run) = run_facts(conn, run_id)?.filter(|run| run.digest == from) else {
        return Err(TxError::Store(StoreError::UnknownRun {
            run_id: run_id.to_owned(),
        }));
    };
    let to_version: Option<i64> = conn
        .prepare_cached("SELECT max(version) FROM deployments WHERE name = ?1 AND digest = ?2")?
        .query_row(params![run.agent, to], |row| row.get(0))?;
    let planned = Planned {
        run_id: run.run_id,
        from_version: run.version,
        from_digest: run.digest,
        to_version: to_version.and_then(|v| u64::try_from(v).ok()),
        to_digest: to.to_owned(),
    };
    apply(conn, &planned, MoveReason::Dev, now).map(drop)
}

/// Every move of run `run_id`, oldest first.
pub(super) fn run_moves(conn: &Connection, run_id: &str) -> Result<Vec<RunMove>, TxError> {
    let moves = conn
        .prepare_cached(
            "SELECT run_id, from_version, to_version, from_digest, to_digest, reason, at
             FROM run_upgrades WHERE run_id = ?1 ORDER BY rowid",
        )?
        .query_map([run_id], move_record)?
        .collect::<rusqlite::Result<_>>()?;
    Ok(moves)
}

/// Points the run at its new component and version, records the move, and makes the
/// component a member of the run's namespace (an operator's deployment admitted it
/// already; a run moved there by hand keeps it a member after that deployment is gone).
fn apply(
    conn: &Connection,
    p: &Planned,
    reason: MoveReason,
    now: Millis,
) -> Result<RunMove, TxError> {
    let to_version = p.to_version.map(to_sql_int).transpose()?;
    let from_version = p.from_version.map(to_sql_int).transpose()?;
    let namespace: String = conn
        .prepare_cached(
            "UPDATE runs SET digest = ?2, version = ?3, updated = ?4 WHERE run_id = ?1
             RETURNING namespace",
        )?
        .query_row(params![p.run_id, p.to_digest, to_version, now], |row| {
            row.get(0)
        })?;
    conn.prepare_cached(
        "INSERT INTO run_upgrades
             (run_id, from_digest, to_digest, at, from_version, to_version, reason)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )?
    .execute(params![
        p.run_id,
        p.from_digest,
        p.to_digest,
        now,
        from_version,
        to_version,
        reason.as_str()
    ])?;
    let event = NewEvent::new(
        EventKind::Upgraded,
        serde_json::json!({
            "from": p.from_digest, "to": p.to_digest,
            "from_version": p.from_version, "to_version": p.to_version,
            "reason": reason.as_str(),
        }),
    );
    super::events::record(conn, &p.run_id, &event, now)?;
    super::components::add_member(conn, &namespace, &p.to_digest, "upgrade", now)?;
    Ok(RunMove {
        run_id: p.run_id.clone(),
        from_version: p.from_version,
        to_version: p.to_version,
        from_digest: p.from_digest.clone(),
        to_digest: p.to_digest.clone(),
        reason,
        at: now,
    })
}

fn version_facts(conn: &Connection, name: &str) -> Result<Vec<VersionFacts>, TxError> {
    let facts = conn
        .prepare_cached(
            "SELECT version, digest, exports FROM deployments WHERE name = ?1 ORDER BY version",
        )?
        .query_map([name], |row| {
            Ok(VersionFacts {
                version: u64_column(row, 0)?,
                digest: row.get(1)?,
                exports: row.get(2)?,
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(facts)
}

/// The columns [`facts`] reads, from `runs r`.
macro_rules! run_facts_columns {
    () => {
        "SELECT r.run_id, r.agent, r.status, r.version, r.digest,
                u.from_version, u.from_digest
         FROM runs r
         LEFT JOIN run_upgrades u ON u.rowid =
             (SELECT max(rowid) FROM run_upgrades WHERE run_id = r.run_id) "
    };
}

fn run_facts(conn: &Connection, run_id: &str) -> Result<Option<RunFacts>, TxError> {
    let facts = conn
        .prepare_cached(concat!(run_facts_columns!(), "WHERE r.run_id = ?1"))?
        .query_row([run_id], facts)
        .optional()?;
    Ok(facts)
}

/// The runs of `name` in flight, oldest first.
fn in_flight_runs(conn: &Connection, name: &str) -> Result<Vec<RunFacts>, TxError> {
    let sql = format!(
        "{} WHERE r.agent = ?1 AND r.status IN {IN_FLIGHT_SQL} ORDER BY r.created, r.rowid",
        run_facts_columns!()
    );
    let runs = conn
        .prepare_cached(&sql)?
        .query_map([name], facts)?
        .collect::<rusqlite::Result<_>>()?;
    Ok(runs)
}

fn facts(row: &Row<'_>) -> rusqlite::Result<RunFacts> {
    let status: String = row.get(2)?;
    let version = |idx| -> rusqlite::Result<Option<u64>> {
        match row.get::<_, Option<i64>>(idx)? {
            Some(_) => u64_column(row, idx).map(Some),
            None => Ok(None),
        }
    };
    let from_digest: Option<String> = row.get(6)?;
    Ok(RunFacts {
        run_id: row.get(0)?,
        agent: row.get(1)?,
        status: status
            .parse::<RunStatus>()
            .map_err(|e| rusqlite::Error::FromSqlConversionFailure(2, Type::Text, e.into()))?,
        version: version(3)?,
        digest: row.get(4)?,
        back: match from_digest {
            Some(digest) => Some((version(5)?, digest)),
            None => None,
        },
    })
}

fn move_record(row: &Row<'_>) -> rusqlite::Result<RunMove> {
    let version = |idx| -> rusqlite::Result<Option<u64>> {
        match row.get::<_, Option<i64>>(idx)? {
            Some(_) => u64_column(row, idx).map(Some),
            None => Ok(None),
        }
    };
    let reason: String = row.get(5)?;
    Ok(RunMove {
        run_id: row.get(0)?,
        from_version: version(1)?,
        to_version: version(2)?,
        from_digest: row.get(3)?,
        to_digest: row.get(4)?,
        // The schema's CHECK constraint keeps anything else out.
        reason: MoveReason::from_name(&reason).ok_or_else(|| {
            rusqlite::Error::FromSqlConversionFailure(
                5,
                Type::Text,
                format!("unknown reason {reason:?}").into(),
            )
        })?,
        at: row.get(6)?,
    })
}
