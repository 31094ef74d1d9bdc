//! A run's step history on SQLite, and forks made from it (`store/history.rs`).
//!
//! `steps` has no index by run (every step would pay for one), so reading a run's
//! steps scans them, as `idem show` does: history and forks are an operator's
//! questions, not a step's.

use rusqlite::{Connection, OptionalExtension, params};

use super::runs::{self, unknown_run};
use super::{TxError, to_sql_int, u32_column, u64_column};
use crate::store::{
    ForkRefusal, ForkRequest, Forked, HistoryCheckpoint, HistoryStep, Millis, Payloads, Position,
    RunHistory, SavedCheckpoint, StoreError, Submission, check_fork_exports, fork_events, fork_key,
    fork_namespace, plan_fork, steps_before,
};

/// The committed steps of a run, in order: a step committed before positions were kept
/// stands at lease 0, at its commit time.
const STEPS: &str = "SELECT key, token, attempt, committed_at, coalesce(commit_lease, 0),
                            coalesce(commit_tick, committed_at * 1000)
                     FROM steps WHERE run_id = ?1 AND result IS NOT NULL
                     ORDER BY 5, 6, key";

fn position(lease: i64, tick: i64) -> Position {
    Position {
        lease: u64::try_from(lease).unwrap_or(0),
        tick: u64::try_from(tick).unwrap_or(0),
    }
}

fn steps(conn: &Connection, run_id: &str) -> Result<Vec<HistoryStep>, TxError> {
    let mut n = 0;
    let steps = conn
        .prepare_cached(STEPS)?
        .query_map([run_id], |row| {
            Ok(HistoryStep {
                n: 0,
                key: row.get(0)?,
                token: u64_column(row, 1)?,
                attempt: u32_column(row, 2)?,
                committed_at: row.get(3)?,
                position: position(row.get(4)?, row.get(5)?),
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(steps
        .into_iter()
        .map(|step| {
            n += 1;
            HistoryStep { n, ..step }
        })
        .collect())
}

/// The run's kept checkpoints, in order, without their states.
fn checkpoints(conn: &Connection, run_id: &str) -> Result<Vec<HistoryCheckpoint>, TxError> {
    let rows = conn
        .prepare_cached(
            "SELECT lease, tick, step, coalesce(length(state), 0), updated, state IS NOT NULL
             FROM progress WHERE run_id = ?1
             ORDER BY lease, tick",
        )?
        .query_map([run_id], |row| {
            Ok(HistoryCheckpoint {
                position: position(row.get(0)?, row.get(1)?),
                step: u64_column(row, 2)?,
                bytes: u64_column(row, 3)?,
                saved_at: row.get(4)?,
                kept: row.get(5)?,
                after: 0,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(rows)
}

/// The run's history; `None` if there is no such run.
pub(super) fn history(conn: &Connection, run_id: &str) -> Result<Option<RunHistory>, TxError> {
    let run: Option<(bool, Option<String>, Option<i64>)> = conn
        .prepare_cached("SELECT history_cut, forked_from, fork_at FROM runs WHERE run_id = ?1")?
        .query_row([run_id], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .optional()?;
    let Some((collected, forked_from, fork_at)) = run else {
        return Ok(None);
    };
    let steps = steps(conn, run_id)?;
    let positions: Vec<Position> = steps.iter().map(|s| s.position).collect();
    let checkpoints = checkpoints(conn, run_id)?
        .into_iter()
        .map(|c| HistoryCheckpoint {
            after: steps_before(&positions, c.position),
            ..c
        })
        .collect();
    Ok(Some(RunHistory {
        steps,
        checkpoints,
        collected,
        forked_from: forked_from.map(|from| (from, fork_at.map_or(0, |at| at as u64))),
    }))
}

/// The run's last checkpoint saved before `before` (the last of all when `None`).
pub(super) fn checkpoint_before(
    conn: &Connection,
    run_id: &str,
    before: Option<Position>,
) -> Result<Option<SavedCheckpoint>, TxError> {
    let (lease, tick) = match before {
        Some(p) => (to_sql_int(p.lease)?, to_sql_int(p.tick)?),
        None => (i64::MAX, i64::MAX),
    };
    let saved = conn
        .prepare_cached(
            "SELECT lease, tick, step, state, updated FROM progress
             WHERE run_id = ?1 AND (lease, tick) < (?2, ?3) AND state IS NOT NULL
             ORDER BY lease DESC, tick DESC LIMIT 1",
        )?
        .query_row(params![run_id, lease, tick], |row| {
            Ok(SavedCheckpoint {
                position: position(row.get(0)?, row.get(1)?),
                checkpoint: crate::store::Checkpoint {
                    step: u64_column(row, 2)?,
                    state: row.get(3)?,
                },
                saved_at: row.get(4)?,
            })
        })
        .optional()?;
    Ok(saved)
}

fn refused(run_id: &str, refusal: ForkRefusal) -> TxError {
    TxError::Store(StoreError::ForkRefused {
        run_id: run_id.to_owned(),
        refusal,
    })
}

/// Makes the fork `req` asks for, in the caller's transaction: its run (queued, on the
/// version asked for, with the original's authority and `input` as kept, or the
/// original's), the results of the steps before `req.at` copied into its namespace, and
/// the checkpoint before them. A refusal fails the caller's transaction, which writes
/// nothing then.
pub(super) fn fork(
    conn: &Connection,
    req: &ForkRequest<'_>,
    now: Millis,
    payloads: Payloads<'_>,
) -> Result<Forked, TxError> {
    let run_id = req.run_id;
    let run: Option<(String, String, String, Option<i64>, bool, i64)> = conn
        .prepare_cached(
            "SELECT agent, digest, namespace, version, history_cut, priority FROM runs
             WHERE run_id = ?1",
        )?
        .query_row([run_id], |row| {
            Ok((
                row.get(0)?,
                row.get(1)?,
                row.get(2)?,
                row.get(3)?,
                row.get(4)?,
                row.get(5)?,
            ))
        })
        .optional()?;
    let Some((agent, digest, namespace, version, collected, priority)) = run else {
        return Err(unknown_run(run_id));
    };
    let taken: bool = conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM runs WHERE run_id = ?1)")?
        .query_row([req.new_run_id], |row| row.get(0))?;
    if taken {
        return Err(refused(
            run_id,
            ForkRefusal::RunExists {
                new_run_id: req.new_run_id.to_owned(),
            },
        ));
    }
    let steps = steps(conn, run_id)?;
    let positions: Vec<Position> = steps.iter().map(|s| s.position).collect();
    let kept: Vec<(Position, bool)> = checkpoints(conn, run_id)?
        .into_iter()
        .map(|c| (c.position, c.kept))
        .collect();
    let plan = plan_fork(req.at, &positions, &kept, collected).map_err(|r| refused(run_id, r))?;
    let (version, digest) = match req.version {
        None => (version, digest),
        Some(to) => {
            let exports = |v: i64| -> Result<Option<(String, Option<String>)>, TxError> {
                Ok(conn
                    .prepare_cached(
                        "SELECT digest, exports FROM deployments WHERE name = ?1 AND version = ?2",
                    )?
                    .query_row(params![agent, v], |row| Ok((row.get(0)?, row.get(1)?)))
                    .optional()?)
            };
            let Some((to_digest, to_exports)) = exports(to_sql_int(to)?)? else {
                return Err(TxError::Store(StoreError::UnknownVersion {
                    name: agent.clone(),
                    version: to,
                }));
            };
            let from_exports = match version {
                Some(v) => exports(v)?.and_then(|(_, e)| e),
                None => None,
            };
            check_fork_exports(
                run_id,
                &agent,
                version.map_or_else(|| digest.clone(), |v| format!("version {v}")),
                from_exports.as_deref(),
                to,
                to_exports.as_deref(),
            )?;
            (Some(to_sql_int(to)?), to_digest)
        }
    };
    let (input, authority): (Vec<u8>, Vec<u8>) = conn
        .prepare_cached("SELECT input, authority FROM run_inputs WHERE run_id = ?1")?
        .query_row([run_id], |row| Ok((row.get(0)?, row.get(1)?)))?;
    let namespace_to = fork_namespace(&namespace, req.new_run_id);
    runs::submit(
        conn,
        &Submission {
            run_id: req.new_run_id,
            agent: &agent,
            digest: &digest,
            namespace: &namespace_to,
            input: req.input.unwrap_or(&input),
            authority: &authority,
            replace_authority: false,
            priority: u32::try_from(priority).unwrap_or(0),
        },
        now,
        payloads,
    )?;
    conn.prepare_cached(
        "UPDATE runs SET version = ?2, forked_from = ?3, fork_at = ?4 WHERE run_id = ?1",
    )?
    .execute(params![
        req.new_run_id,
        version,
        run_id,
        to_sql_int(req.at)?
    ])?;
    let mut reused = 0;
    for (i, step) in steps[..plan.reused].iter().enumerate() {
        let Some(key) = fork_key(&step.key, &namespace, &namespace_to, run_id, req.new_run_id)
        else {
            continue;
        };
        // Copied as committed, standing at lease 0 in the original's order: before
        // anything the fork's own leases write.
        let copied = conn
            .prepare_cached(
                "INSERT OR IGNORE INTO steps
                     (key, run_id, token, attempt, claimed_at, lease_expires, fingerprint,
                      result, committed_at, commit_lease, commit_tick)
                 SELECT ?2, ?3, token, attempt, claimed_at, lease_expires, fingerprint,
                        result, committed_at, 0, ?4
                 FROM steps WHERE key = ?1",
            )?
            .execute(params![
                step.key,
                key,
                req.new_run_id,
                to_sql_int(2 * (i as u64 + 1))?
            ])?;
        if copied == 0 {
            // A key of an earlier run with this id, kept for gc's dedupe window.
            return Err(refused(
                run_id,
                ForkRefusal::KeysRemain {
                    new_run_id: req.new_run_id.to_owned(),
                },
            ));
        }
        reused += 1;
    }
    if let Some((at, after)) = plan.checkpoint {
        conn.prepare_cached(
            "INSERT INTO progress (run_id, lease, tick, step, state, updated)
             SELECT ?1, 0, ?5, step, state, ?6 FROM progress
             WHERE run_id = ?2 AND lease = ?3 AND tick = ?4",
        )?
        .execute(params![
            req.new_run_id,
            run_id,
            to_sql_int(at.lease)?,
            to_sql_int(at.tick)?,
            to_sql_int(2 * after + 1)?,
            now
        ])?;
    }
    let checkpoint: Option<u64> = match plan.checkpoint {
        Some(_) => runs::load_progress(conn, req.new_run_id)?.map(|c| c.step),
        None => None,
    };
    let [on_original, on_fork] = fork_events(req, reused, checkpoint);
    super::events::record(conn, run_id, &on_original, now)?;
    super::events::record(conn, req.new_run_id, &on_fork, now)?;
    let record = runs::run(conn, req.new_run_id)?.ok_or_else(|| unknown_run(req.new_run_id))?;
    Ok(Forked {
        record,
        namespace: namespace_to,
        reused,
        checkpoint,
    })
}
