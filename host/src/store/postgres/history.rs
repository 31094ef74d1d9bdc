//! A run's step history on PostgreSQL, and forks made from it (`store/history.rs`;
//! SQLite's `sqlite/history.rs` says the same in its dialect).

use super::conn::Conn;
use super::runs::{self, unknown_run};
use super::{TxError, to_sql_int, u32_col, u64_col};
use crate::store::{
    Checkpoint, ForkRefusal, ForkRequest, Forked, HistoryCheckpoint, HistoryStep, Position,
    RunHistory, SavedCheckpoint, StoreError, Submission, check_fork_exports, fork_events, fork_key,
    fork_namespace, plan_fork, steps_before,
};

fn position(row: &tokio_postgres::Row, at: usize) -> Result<Position, TxError> {
    Ok(Position {
        lease: u64_col(row, at)?,
        tick: u64_col(row, at + 1)?,
    })
}

/// The committed steps of a run, in order: a step committed before positions were kept
/// stands at lease 0, at its commit time.
async fn steps(conn: &Conn, run_id: &str) -> Result<Vec<HistoryStep>, TxError> {
    let rows = conn
        .query(
            "SELECT key, token, attempt, committed_at, coalesce(commit_lease, 0),
                    coalesce(commit_tick, committed_at * 1000)
             FROM steps WHERE run_id = $1 AND result IS NOT NULL
             ORDER BY 5, 6, key COLLATE \"C\"",
            &[&run_id],
        )
        .await?;
    let mut steps = Vec::with_capacity(rows.len());
    for (i, row) in rows.iter().enumerate() {
        steps.push(HistoryStep {
            n: i as u64 + 1,
            key: row.try_get(0)?,
            token: u64_col(row, 1)?,
            attempt: u32_col(row, 2)?,
            committed_at: row.try_get(3)?,
            position: position(row, 4)?,
        });
    }
    Ok(steps)
}

/// The run's kept checkpoints, in order, without their states.
async fn checkpoints(conn: &Conn, run_id: &str) -> Result<Vec<HistoryCheckpoint>, TxError> {
    let rows = conn
        .query(
            "SELECT lease, tick, step, coalesce(octet_length(state), 0), updated, state IS NOT NULL
             FROM progress
             WHERE run_id = $1 ORDER BY lease, tick",
            &[&run_id],
        )
        .await?;
    rows.iter()
        .map(|row| {
            let bytes: i32 = row.try_get(3)?;
            Ok(HistoryCheckpoint {
                position: position(row, 0)?,
                step: u64_col(row, 2)?,
                bytes: u64::try_from(bytes).unwrap_or(0),
                saved_at: row.try_get(4)?,
                kept: row.try_get(5)?,
                after: 0,
            })
        })
        .collect()
}

/// The run's history; `None` if there is no such run.
pub(super) async fn history(conn: &Conn, run_id: &str) -> Result<Option<RunHistory>, TxError> {
    let Some(run) = conn
        .query_opt(
            "SELECT history_cut, forked_from, fork_at FROM runs WHERE run_id = $1",
            &[&run_id],
        )
        .await?
    else {
        return Ok(None);
    };
    let collected: bool = run.try_get(0)?;
    let forked_from: Option<String> = run.try_get(1)?;
    let fork_at: Option<i64> = run.try_get(2)?;
    let steps = steps(conn, run_id).await?;
    let positions: Vec<Position> = steps.iter().map(|s| s.position).collect();
    let checkpoints = checkpoints(conn, run_id)
        .await?
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
pub(super) async fn checkpoint_before(
    conn: &Conn,
    run_id: &str,
    before: Option<Position>,
) -> Result<Option<SavedCheckpoint>, TxError> {
    let (lease, tick) = match before {
        Some(p) => (to_sql_int(p.lease)?, to_sql_int(p.tick)?),
        None => (i64::MAX, i64::MAX),
    };
    let row = conn
        .query_opt(
            "SELECT lease, tick, step, state, updated FROM progress
             WHERE run_id = $1 AND (lease, tick) < ($2, $3) AND state IS NOT NULL
             ORDER BY lease DESC, tick DESC LIMIT 1",
            &[&run_id, &lease, &tick],
        )
        .await?;
    match row {
        Some(row) => Ok(Some(SavedCheckpoint {
            position: position(&row, 0)?,
            checkpoint: Checkpoint {
                step: u64_col(&row, 2)?,
                state: row.try_get(3)?,
            },
            saved_at: row.try_get(4)?,
        })),
        None => Ok(None),
    }
}

fn refused(run_id: &str, refusal: ForkRefusal) -> TxError {
    TxError::Store(StoreError::ForkRefused {
        run_id: run_id.to_owned(),
        refusal,
    })
}

/// Makes the fork `req` asks for, in the caller's transaction (as SQLite's does): its
/// run, the results before `req.at` copied into its namespace, the checkpoint before
/// them. A refusal fails the transaction, which writes nothing then.
pub(super) async fn fork(conn: &Conn, req: &ForkRequest<'_>) -> Result<Forked, TxError> {
    let run_id = req.run_id;
    let now = conn.now;
    // Locked: a lease taken meanwhile writes after the fork read the run's history.
    let Some(run) = conn
        .query_opt(
            "SELECT agent, digest, namespace, version, history_cut, priority FROM runs
             WHERE run_id = $1 FOR SHARE",
            &[&run_id],
        )
        .await?
    else {
        return Err(unknown_run(run_id));
    };
    let agent: String = run.try_get(0)?;
    let digest: String = run.try_get(1)?;
    let namespace: String = run.try_get(2)?;
    let version: Option<i64> = run.try_get(3)?;
    let collected: bool = run.try_get(4)?;
    let priority: i32 = run.try_get(5)?;
    let taken = conn
        .query_opt("SELECT 1 FROM runs WHERE run_id = $1", &[&req.new_run_id])
        .await?
        .is_some();
    if taken {
        return Err(refused(
            run_id,
            ForkRefusal::RunExists {
                new_run_id: req.new_run_id.to_owned(),
            },
        ));
    }
    let steps = steps(conn, run_id).await?;
    let positions: Vec<Position> = steps.iter().map(|s| s.position).collect();
    let kept: Vec<(Position, bool)> = checkpoints(conn, run_id)
        .await?
        .into_iter()
        .map(|c| (c.position, c.kept))
        .collect();
    let plan = plan_fork(req.at, &positions, &kept, collected).map_err(|r| refused(run_id, r))?;
    let exports = async |v: i64| -> Result<Option<(String, Option<String>)>, TxError> {
        let row = conn
            .query_opt(
                "SELECT digest, exports FROM deployments WHERE name = $1 AND version = $2",
                &[&agent, &v],
            )
            .await?;
        Ok(match row {
            Some(row) => Some((row.try_get(0)?, row.try_get(1)?)),
            None => None,
        })
    };
    let (version, digest) = match req.version {
        None => (version, digest),
        Some(to) => {
            let Some((to_digest, to_exports)) = exports(to_sql_int(to)?).await? else {
                return Err(TxError::Store(StoreError::UnknownVersion {
                    name: agent.clone(),
                    version: to,
                }));
            };
            let from_exports = match version {
                Some(v) => exports(v).await?.and_then(|(_, e)| e),
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
    let inputs = conn
        .query_one(
            "SELECT input, authority FROM run_inputs WHERE run_id = $1",
            &[&run_id],
        )
        .await?;
    let (input, authority): (Vec<u8>, Vec<u8>) = (inputs.try_get(0)?, inputs.try_get(1)?);
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
    )
    .await?;
    conn.execute(
        "UPDATE runs SET version = $2, forked_from = $3, fork_at = $4 WHERE run_id = $1",
        &[&req.new_run_id, &version, &run_id, &to_sql_int(req.at)?],
    )
    .await?;
    let mut reused = 0;
    for (i, step) in steps[..plan.reused].iter().enumerate() {
        let Some(key) = fork_key(&step.key, &namespace, &namespace_to, run_id, req.new_run_id)
        else {
            continue;
        };
        // Copied as committed, standing at lease 0 in the original's order: before
        // anything the fork's own leases write.
        let copied = conn
            .execute(
                "INSERT INTO steps
                     (key, run_id, token, attempt, claimed_at, lease_expires, fingerprint,
                      result, committed_at, commit_lease, commit_tick)
                 SELECT $2, $3, token, attempt, claimed_at, lease_expires, fingerprint,
                        result, committed_at, 0, $4
                 FROM steps WHERE key = $1
                 ON CONFLICT (key) DO NOTHING",
                &[
                    &step.key,
                    &key,
                    &req.new_run_id,
                    &to_sql_int(2 * (i as u64 + 1))?,
                ],
            )
            .await?;
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
        conn.execute(
            "INSERT INTO progress (run_id, lease, tick, step, state, updated)
             SELECT $1, 0, $5, step, state, $6 FROM progress
             WHERE run_id = $2 AND lease = $3 AND tick = $4",
            &[
                &req.new_run_id,
                &run_id,
                &to_sql_int(at.lease)?,
                &to_sql_int(at.tick)?,
                &to_sql_int(2 * after + 1)?,
                &now,
            ],
        )
        .await?;
    }
    let checkpoint = match plan.checkpoint {
        Some(_) => runs::load_progress(conn, req.new_run_id)
            .await?
            .map(|c| c.step),
        None => None,
    };
    let [on_original, on_fork] = fork_events(req, reused, checkpoint);
    super::events::record(conn, run_id, &[on_original]).await?;
    super::events::record(conn, req.new_run_id, &[on_fork]).await?;
    let record = runs::run(conn, req.new_run_id)
        .await?
        .ok_or_else(|| unknown_run(req.new_run_id))?;
    Ok(Forked {
        record,
        namespace: namespace_to,
        reused,
        checkpoint,
    })
}
