//! Versions of a deployment on PostgreSQL, as on SQLite: listing them with their runs,
//! and moving runs between them, each move recorded in `run_upgrades` with its reason.
//! Moves of one name are serialised with its deployments (the same advisory lock), and
//! the runs that move are locked while they are read.

use tokio_postgres::Row;

use super::conn::Conn;
use super::{TxError, u64_col};
use crate::store::EventKind;
use crate::store::events::NewEvent;
use crate::store::rules::{IN_FLIGHT_SQL, OnMismatch, Planned, RunFacts, VersionFacts, plan_moves};
use crate::store::{MoveReason, MoveRuns, MoveTo, RunMove, RunStatus, StoreError, VersionRecord};

/// Every version of `name`, oldest first, with how many runs are on each.
pub(super) async fn versions(conn: &Conn, name: &str) -> Result<Vec<VersionRecord>, TxError> {
    let sql = format!(
        "SELECT d.name, d.digest, d.authority, d.admission, d.deployed_at, d.source,
                d.version, d.in_flight, d.exports,
                (SELECT count(*) FROM runs r WHERE r.agent = d.name AND r.version = d.version
                    AND r.status IN {IN_FLIGHT_SQL}),
                (SELECT count(*) FROM runs r WHERE r.agent = d.name AND r.version = d.version)
         FROM deployments d WHERE d.name = $1 ORDER BY d.version"
    );
    let rows = conn.query(&sql, &[&name]).await?;
    let mut records = rows
        .iter()
        .map(|row| {
            Ok(VersionRecord {
                deployment: super::components::record(row)?,
                current: false,
                runs_in_flight: u64_col(row, 9)?,
                runs: u64_col(row, 10)?,
            })
        })
        .collect::<Result<Vec<_>, TxError>>()?;
    if let Some(last) = records.last_mut() {
        last.current = true;
    }
    Ok(records)
}

/// Moves what `request` asks for, or nothing when it is refused.
pub(super) async fn move_runs(
    conn: &Conn,
    request: &MoveRuns<'_>,
) -> Result<Vec<RunMove>, TxError> {
    lock_name(conn, request.name).await?;
    let versions = version_facts(conn, request.name).await?;
    let runs = if request.runs.is_empty() {
        in_flight_runs(conn, request.name).await?
    } else {
        let mut runs = Vec::with_capacity(request.runs.len());
        for id in request.runs {
            runs.extend(run_facts(conn, id).await?);
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
    let mut moves = Vec::with_capacity(planned.len());
    for p in &planned {
        moves.push(apply(conn, p, reason).await?);
    }
    Ok(moves)
}

/// Moves the runs of `name` in flight to its new `version`; returns the moves and the
/// runs kept where they are because their exports differ. The caller holds the name's
/// lock (it deploys).
pub(super) async fn roll_out(
    conn: &Conn,
    name: &str,
    version: u64,
) -> Result<(Vec<RunMove>, Vec<String>), TxError> {
    let versions = version_facts(conn, name).await?;
    let runs = in_flight_runs(conn, name).await?;
    let (planned, kept) = plan_moves(
        name,
        MoveTo::Version(version),
        &[],
        &versions,
        &runs,
        OnMismatch::Keep,
    )
    .map_err(TxError::Store)?;
    let mut moves = Vec::with_capacity(planned.len());
    for p in &planned {
        moves.push(apply(conn, p, MoveReason::Policy).await?);
    }
    Ok((moves, kept))
}

/// Moves run `run_id` from component `from` to `to` (and to the latest version of its
/// deployment with `to`), as a person asked (`idem run --upgrade`, or a rebuild).
pub(super) async fn upgrade_run(
    conn: &Conn,
    run_id: &str,
    from: &str,
    to: &str,
) -> Result<(), TxError> {
    let Some(run) = run_facts(conn, run_id)
        .await?
        .filter(|run| run.digest == from)
    else {
        return Err(TxError::Store(StoreError::UnknownRun {
            run_id: run_id.to_owned(),
        }));
    };
    let row = conn
        .query_one(
            "SELECT max(version) FROM deployments WHERE name = $1 AND digest = $2",
            &[&run.agent, &to],
        )
        .await?;
    let to_version: Option<i64> = row.try_get(0)?;
    let planned = Planned {
        run_id: run.run_id,
        from_version: run.version,
        from_digest: run.digest,
        to_version: to_version.and_then(|v| u64::try_from(v).ok()),
        to_digest: to.to_owned(),
    };
    apply(conn, &planned, MoveReason::Dev).await.map(drop)
}

/// Every move of run `run_id`, oldest first.
pub(super) async fn run_moves(conn: &Conn, run_id: &str) -> Result<Vec<RunMove>, TxError> {
    let rows = conn
        .query(
            "SELECT run_id, from_version, to_version, from_digest, to_digest, reason, at
             FROM run_upgrades WHERE run_id = $1 ORDER BY seq",
            &[&run_id],
        )
        .await?;
    rows.iter().map(move_record).collect()
}

/// Serialises moves and deployments of one name (the lock `components::deploy` takes).
pub(super) async fn lock_name(conn: &Conn, name: &str) -> Result<(), TxError> {
    conn.query_one(
        "SELECT pg_advisory_xact_lock(hashtext('idem deploy ' || $1))",
        &[&name],
    )
    .await?;
    Ok(())
}

/// Points the run at its new component and version, records the move, and makes the
/// component a member of the run's namespace.
async fn apply(conn: &Conn, p: &Planned, reason: MoveReason) -> Result<RunMove, TxError> {
    let to_version = p.to_version.map(i64::try_from).transpose().ok().flatten();
    let from_version = p.from_version.map(i64::try_from).transpose().ok().flatten();
    let row = conn
        .query_one(
            "UPDATE runs SET digest = $2, version = $3, updated = $4 WHERE run_id = $1
             RETURNING namespace",
            &[&p.run_id, &p.to_digest, &to_version, &conn.now],
        )
        .await?;
    let namespace: String = row.try_get(0)?;
    conn.execute(
        "INSERT INTO run_upgrades
             (run_id, from_digest, to_digest, at, from_version, to_version, reason)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
        &[
            &p.run_id,
            &p.from_digest,
            &p.to_digest,
            &conn.now,
            &from_version,
            &to_version,
            &reason.as_str(),
        ],
    )
    .await?;
    let event = NewEvent::new(
        EventKind::Upgraded,
        serde_json::json!({
            "from": p.from_digest, "to": p.to_digest,
            "from_version": p.from_version, "to_version": p.to_version,
            "reason": reason.as_str(),
        }),
    );
    super::events::record(conn, &p.run_id, &[event]).await?;
    super::components::add_member(conn, &namespace, &p.to_digest, "upgrade").await?;
    Ok(RunMove {
        run_id: p.run_id.clone(),
        from_version: p.from_version,
        to_version: p.to_version,
        from_digest: p.from_digest.clone(),
        to_digest: p.to_digest.clone(),
        reason,
        at: conn.now,
    })
}

async fn version_facts(conn: &Conn, name: &str) -> Result<Vec<VersionFacts>, TxError> {
    let rows = conn
        .query(
            "SELECT version, digest, exports FROM deployments WHERE name = $1 ORDER BY version",
            &[&name],
        )
        .await?;
    rows.iter()
        .map(|row| {
            Ok(VersionFacts {
                version: u64_col(row, 0)?,
                digest: row.try_get(1)?,
                exports: row.try_get(2)?,
            })
        })
        .collect()
}

/// The columns [`facts`] reads, from `runs r` with its last move; the runs are locked.
macro_rules! run_facts_select {
    ($($tail:tt)*) => {
        concat!(
            "SELECT r.run_id, r.agent, r.status, r.version, r.digest,
                    u.from_version, u.from_digest
             FROM runs r
             LEFT JOIN LATERAL (SELECT from_version, from_digest FROM run_upgrades
                                WHERE run_id = r.run_id ORDER BY seq DESC LIMIT 1) u ON true ",
            $($tail)*
        )
    };
}

async fn run_facts(conn: &Conn, run_id: &str) -> Result<Option<RunFacts>, TxError> {
    let row = conn
        .query_opt(
            run_facts_select!("WHERE r.run_id = $1 FOR UPDATE OF r"),
            &[&run_id],
        )
        .await?;
    row.as_ref().map(facts).transpose()
}

/// The runs of `name` in flight, oldest first.
async fn in_flight_runs(conn: &Conn, name: &str) -> Result<Vec<RunFacts>, TxError> {
    let sql = format!(
        "{} WHERE r.agent = $1 AND r.status IN {IN_FLIGHT_SQL}
         ORDER BY r.created, r.seq FOR UPDATE OF r",
        run_facts_select!()
    );
    let rows = conn.query(&sql, &[&name]).await?;
    rows.iter().map(facts).collect()
}

fn optional_version(row: &Row, idx: usize) -> Result<Option<u64>, TxError> {
    match row.try_get::<_, Option<i64>>(idx)? {
        Some(_) => u64_col(row, idx).map(Some),
        None => Ok(None),
    }
}

fn facts(row: &Row) -> Result<RunFacts, TxError> {
    let status: String = row.try_get(2)?;
    let from_digest: Option<String> = row.try_get(6)?;
    Ok(RunFacts {
        run_id: row.try_get(0)?,
        agent: row.try_get(1)?,
        status: status.parse::<RunStatus>().map_err(|e| {
            TxError::Store(StoreError::Backend {
                op: "read a run",
                source: e.into(),
            })
        })?,
        version: optional_version(row, 3)?,
        digest: row.try_get(4)?,
        back: match from_digest {
            Some(digest) => Some((optional_version(row, 5)?, digest)),
            None => None,
        },
    })
}

fn move_record(row: &Row) -> Result<RunMove, TxError> {
    let reason: String = row.try_get(5)?;
    Ok(RunMove {
        run_id: row.try_get(0)?,
        from_version: optional_version(row, 1)?,
        to_version: optional_version(row, 2)?,
        from_digest: row.try_get(3)?,
        to_digest: row.try_get(4)?,
        reason: MoveReason::from_name(&reason).ok_or_else(|| {
            TxError::Store(StoreError::Backend {
                op: "read a run's moves",
                source: format!("unknown reason {reason:?}").into(),
            })
        })?,
        at: row.try_get(6)?,
    })
}
