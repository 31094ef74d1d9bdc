//! Child runs on SQLite: spawning them exactly once, joining children, counting a
//! parent's join down as its children end, and cancelling a run's descendants. Each
//! function runs inside the transaction of the database thread.

use std::collections::HashMap;

use rusqlite::{Connection, OptionalExtension, params};

use super::TxError;
use super::leases::check_fence;
use super::runs::{lease_from, mark_cancelled, status_from};
use super::waits::settle;
use crate::store::rules::{
    Found, SpawnFacts, SpawnPlan, WaitRow, join_asked, join_mode, join_reused, plan_spawns,
};
use crate::store::{
    ChildEnd, JoinMode, JoinRefusal, JoinRequest, Millis, RunStatus, SpawnAnswers, SpawnBatch,
    StoreError, WaitState,
};

/// The statuses in which a child has ended for a join ([`crate::store::child_ended`]).
const ENDED: &str = "('completed', 'failed', 'cancelled')";

/// Spawns the batch's children, each answered as a spawn of it alone would be.
pub(super) fn spawn_many(
    conn: &Connection,
    batch: &SpawnBatch<'_>,
    now: Millis,
) -> Result<SpawnAnswers, TxError> {
    check_fence(conn, batch.fence)?;
    let parent = batch.fence.run_id.as_str();
    let mut facts = SpawnFacts::default();
    {
        let mut existing = conn.prepare_cached(
            "SELECT r.parent, r.agent, i.input = ?2 FROM runs r
             JOIN run_inputs i ON i.run_id = r.run_id WHERE r.run_id = ?1",
        )?;
        let mut deployment = conn.prepare_cached(
            "SELECT digest, authority FROM deployments WHERE name = ?1 ORDER BY id DESC LIMIT 1",
        )?;
        for child in batch.children {
            let found = existing
                .query_row(params![child.child_id, child.input], |row| {
                    Ok(Found {
                        parent: row.get(0)?,
                        agent: row.get(1)?,
                        same_input: row.get(2)?,
                    })
                })
                .optional()?;
            facts.found.push(found);
            if !facts.deployments.contains_key(child.deployment)
                && let Some(found) = deployment
                    .query_row([child.deployment], |row| Ok((row.get(0)?, row.get(1)?)))
                    .optional()?
            {
                facts.deployments.insert(child.deployment.to_owned(), found);
            }
        }
    }
    facts.depth = conn
        .prepare_cached("SELECT depth FROM runs WHERE run_id = ?1")?
        .query_row([parent], |row| row.get(0))?;
    facts.children = conn
        .prepare_cached("SELECT count(*) FROM runs WHERE parent = ?1")?
        .query_row([parent], |row| row.get(0))?;
    facts.ancestors = spawned_ancestors(conn, parent)?;
    let SpawnPlan {
        answers,
        create,
        depth,
    } = plan_spawns(batch, &facts);
    let mut run = conn.prepare_cached(
        "INSERT INTO runs (run_id, agent, digest, namespace, status, created, updated,
                           parent, spawn_key, depth, detached, version)
         VALUES (?1, ?2, ?3, ?2, 'queued', ?4, ?4, ?5, ?6, ?7, ?8,
                 (SELECT max(version) FROM deployments WHERE name = ?2 AND digest = ?3))",
    )?;
    let mut input = conn
        .prepare_cached("INSERT INTO run_inputs (run_id, input, authority) VALUES (?1, ?2, ?3)")?;
    let mut members = Vec::new();
    for new in &create {
        let child = &batch.children[new.at];
        run.execute(params![
            child.child_id,
            child.deployment,
            new.digest,
            now,
            parent,
            child.key,
            depth,
            child.detached
        ])?;
        input.execute(params![child.child_id, child.input, new.authority])?;
        if !members.contains(&(child.deployment, &new.digest)) {
            members.push((child.deployment, &new.digest));
        }
    }
    for (deployment, digest) in members {
        super::components::add_member(conn, deployment, digest, "run", now)?;
    }
    Ok(answers)
}

/// The parent and its ancestors that were spawned, as (deployment, key) → run id.
fn spawned_ancestors(
    conn: &Connection,
    run_id: &str,
) -> Result<HashMap<(String, String), String>, TxError> {
    let mut stmt = conn.prepare_cached(
        "WITH RECURSIVE up(id) AS (
             SELECT ?1
             UNION SELECT r.parent FROM runs r JOIN up ON r.run_id = up.id
             WHERE r.parent IS NOT NULL
         )
         SELECT r.run_id, r.agent, r.spawn_key FROM runs r JOIN up ON r.run_id = up.id
         WHERE r.spawn_key IS NOT NULL",
    )?;
    let rows = stmt.query_map([run_id], |row| {
        Ok(((row.get(1)?, row.get(2)?), row.get(0)?))
    })?;
    let mut found = HashMap::new();
    for row in rows {
        let (at, id) = row?;
        found.entry(at).or_insert(id);
    }
    Ok(found)
}

/// Records the join if new and says where it stands.
pub(super) fn join(
    conn: &Connection,
    req: &JoinRequest<'_>,
    now: Millis,
) -> Result<WaitState, TxError> {
    check_fence(conn, req.fence)?;
    let run_id = req.fence.run_id.as_str();
    let refused = |refusal: JoinRefusal| {
        TxError::Store(StoreError::JoinRefused {
            run_id: run_id.to_owned(),
            key: req.key.to_owned(),
            refusal,
        })
    };
    let asked_due =
        join_asked(now, req.children, req.timeout, req.max_children).map_err(&refused)?;
    let row = conn
        .prepare_cached(
            "SELECT signal, join_mode, due, outcome, payload, rate_class FROM waits
             WHERE run_id = ?1 AND key = ?2",
        )?
        .query_row(params![run_id, req.key], |row| {
            Ok(WaitRow {
                signal: row.get(0)?,
                join_mode: row.get(1)?,
                due: row.get(2)?,
                outcome: row.get(3)?,
                payload: row.get(4)?,
                rate: row.get(5)?,
            })
        })
        .optional()?;
    let due = match row {
        Some(WaitRow {
            signal,
            join_mode: mode,
            due,
            outcome,
            payload,
            rate,
        }) => {
            if mode.as_deref().and_then(join_mode) != Some(req.mode)
                || !same_members(conn, run_id, req.key, req.children)?
            {
                return Err(refused(join_reused(
                    req.key,
                    signal.as_deref(),
                    rate.as_deref(),
                    mode.as_deref(),
                )));
            }
            match outcome.as_deref() {
                Some("received") => {
                    return recorded_ends(conn, run_id, req.key, req.mode, payload.as_deref());
                }
                Some(_) => return Ok(WaitState::TimedOut),
                None => due,
            }
        }
        None => {
            for child in req.children {
                let parent: Option<Option<String>> = conn
                    .prepare_cached("SELECT parent FROM runs WHERE run_id = ?1")?
                    .query_row([child], |row| row.get(0))
                    .optional()?;
                if parent.flatten().as_deref() != Some(run_id) {
                    return Err(refused(JoinRefusal::NotAChild(child.clone())));
                }
            }
            conn.prepare_cached(
                "INSERT INTO waits (run_id, key, due, created, join_mode)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![run_id, req.key, asked_due, now, req.mode.as_str()])?;
            let mut insert = conn.prepare_cached(
                "INSERT INTO join_members (run_id, key, child, seq) VALUES (?1, ?2, ?3, ?4)",
            )?;
            for (seq, child) in (0_i64..).zip(req.children) {
                insert.execute(params![run_id, req.key, child, seq])?;
            }
            asked_due
        }
    };
    settle_if_over(conn, run_id, req.key, req.mode, due, now)
}

/// Whether the join recorded under `key` lists exactly `children`, in that order.
fn same_members(
    conn: &Connection,
    run_id: &str,
    key: &str,
    children: &[String],
) -> Result<bool, TxError> {
    let recorded: Vec<String> = conn
        .prepare_cached(
            "SELECT child FROM join_members WHERE run_id = ?1 AND key = ?2 ORDER BY seq",
        )?
        .query_map(params![run_id, key], |row| row.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    Ok(recorded == children)
}

/// Settles the open join if its children have ended (copying their ends into it) or
/// its time passed; else says it is pending.
fn settle_if_over(
    conn: &Connection,
    run_id: &str,
    key: &str,
    mode: JoinMode,
    due: Option<Millis>,
    now: Millis,
) -> Result<WaitState, TxError> {
    let over = match mode {
        JoinMode::All => {
            let left: i64 = conn
                .prepare_cached(&format!(
                    "SELECT count(*) FROM join_members m LEFT JOIN runs r ON r.run_id = m.child
                     WHERE m.run_id = ?1 AND m.key = ?2
                       AND r.run_id IS NOT NULL AND r.status NOT IN {ENDED}"
                ))?
                .query_row(params![run_id, key], |row| row.get(0))?;
            left == 0
        }
        JoinMode::Any => {
            let first: Option<i64> = conn
                .prepare_cached(&format!(
                    "SELECT m.seq FROM join_members m JOIN runs r ON r.run_id = m.child
                     WHERE m.run_id = ?1 AND m.key = ?2 AND r.status IN {ENDED}
                     ORDER BY r.updated, m.seq LIMIT 1"
                ))?
                .query_row(params![run_id, key], |row| row.get(0))
                .optional()?;
            if let Some(seq) = first {
                copy_end(conn, run_id, key, Some(seq))?;
                settle(
                    conn,
                    run_id,
                    key,
                    "received",
                    Some(seq.to_string().as_bytes()),
                    now,
                )?;
                return recorded_ends(conn, run_id, key, mode, Some(seq.to_string().as_bytes()));
            }
            false
        }
    };
    if over {
        copy_end(conn, run_id, key, None)?;
        settle(conn, run_id, key, "received", None, now)?;
        return recorded_ends(conn, run_id, key, mode, None);
    }
    match due {
        Some(due) if due <= now => {
            settle(conn, run_id, key, "timed-out", None, now)?;
            Ok(WaitState::TimedOut)
        }
        due => Ok(WaitState::Pending { due }),
    }
}

/// Copies the ends of the join's children (of the one at `seq`, if given) into the
/// join. A child gc removed (which gc only does once its parent ended) reads as failed.
fn copy_end(conn: &Connection, run_id: &str, key: &str, seq: Option<i64>) -> Result<(), TxError> {
    conn.prepare_cached(
        "UPDATE join_members
         SET status = coalesce((SELECT status FROM runs WHERE run_id = child), 'failed'),
             outcome = CASE
                 WHEN EXISTS (SELECT 1 FROM runs WHERE run_id = child)
                 THEN coalesce((SELECT outcome FROM run_outcomes WHERE run_id = child), x'')
                 ELSE CAST('the child run is gone' AS BLOB) END
         WHERE run_id = ?1 AND key = ?2 AND (?3 IS NULL OR seq = ?3)",
    )?
    .execute(params![run_id, key, seq])?;
    Ok(())
}

/// The ends a settled join recorded: every child's, or (for `any`) the one at the
/// index its payload names.
fn recorded_ends(
    conn: &Connection,
    run_id: &str,
    key: &str,
    mode: JoinMode,
    payload: Option<&[u8]>,
) -> Result<WaitState, TxError> {
    let seq: Option<i64> = match mode {
        JoinMode::All => None,
        JoinMode::Any => payload
            .and_then(|p| std::str::from_utf8(p).ok())
            .and_then(|p| p.parse().ok()),
    };
    let ends = conn
        .prepare_cached(
            "SELECT seq, child, status, outcome FROM join_members
             WHERE run_id = ?1 AND key = ?2 AND status IS NOT NULL AND (?3 IS NULL OR seq = ?3)
             ORDER BY seq",
        )?
        .query_map(params![run_id, key, seq], |row| {
            Ok(ChildEnd {
                index: row.get(0)?,
                run_id: row.get(1)?,
                status: status_from(row, 2)?,
                outcome: row.get::<_, Option<Vec<u8>>>(3)?.unwrap_or_default(),
            })
        })?
        .collect::<rusqlite::Result<_>>()?;
    Ok(WaitState::Joined(ends))
}

/// How many of the join's children the parent still waits for: those not ended (for
/// `all`), or 1 while none has (for `any`).
pub(super) fn join_left(conn: &Connection, run_id: &str, key: &str) -> Result<i64, TxError> {
    let mode: Option<String> = conn
        .prepare_cached("SELECT join_mode FROM waits WHERE run_id = ?1 AND key = ?2")?
        .query_row(params![run_id, key], |row| row.get(0))
        .optional()?
        .flatten();
    let (not_ended, ended): (i64, i64) = conn
        .prepare_cached(&format!(
            "SELECT count(*) FILTER (WHERE r.status NOT IN {ENDED}),
                    count(*) FILTER (WHERE r.status IN {ENDED})
             FROM join_members m JOIN runs r ON r.run_id = m.child
             WHERE m.run_id = ?1 AND m.key = ?2"
        ))?
        .query_row(params![run_id, key], |row| Ok((row.get(0)?, row.get(1)?)))?;
    Ok(match mode.as_deref().and_then(join_mode) {
        Some(JoinMode::Any) => i64::from(ended == 0),
        _ => not_ended,
    })
}

/// Counts the run's end down in its parent's join, if the parent is suspended joining
/// it: the child that brings it to zero makes the parent due now.
pub(super) fn count_down_parent(
    conn: &Connection,
    child: &str,
    now: Millis,
) -> Result<(), TxError> {
    conn.prepare_cached(
        "UPDATE runs
         SET join_left = join_left - 1,
             wake_at = CASE WHEN join_left <= 1 THEN ?2 ELSE wake_at END,
             updated = ?2
         WHERE run_id = (SELECT parent FROM runs WHERE run_id = ?1)
           AND lease_holder IS NULL AND join_left > 0
           AND EXISTS (SELECT 1 FROM join_members m
                       WHERE m.run_id = runs.run_id AND m.key = runs.joining AND m.child = ?1)",
    )?
    .execute(params![child, now])?;
    Ok(())
}

/// Cancels the descendants of `run_id` that are not detached (nor below a detached
/// one) and not completed or cancelled: at once where no live lease is on them, else
/// by asking their workers.
pub(super) fn cancel_descendants(
    conn: &Connection,
    run_id: &str,
    now: Millis,
) -> Result<(), TxError> {
    let tree: Vec<(String, Option<crate::store::RunLeaseInfo>)> = conn
        .prepare_cached(
            "WITH RECURSIVE tree(id) AS (
                 SELECT run_id FROM runs WHERE parent = ?1 AND detached = 0
                 UNION SELECT r.run_id FROM runs r JOIN tree t ON r.parent = t.id
                 WHERE r.detached = 0
             )
             SELECT r.run_id, r.lease_holder, r.lease_token, r.lease_expires, r.status
             FROM runs r JOIN tree t ON r.run_id = t.id
             WHERE r.status NOT IN ('completed', 'cancelled')",
        )?
        .query_map([run_id], |row| {
            let _: RunStatus = status_from(row, 4)?;
            Ok((row.get(0)?, lease_from(row, 1)?))
        })?
        .collect::<rusqlite::Result<_>>()?;
    for (child, lease) in tree {
        if lease.is_some_and(|lease| lease.expires > now) {
            conn.prepare_cached(
                "UPDATE runs SET cancel_requested = 1, updated = ?2 WHERE run_id = ?1",
            )?
            .execute(params![child, now])?;
        } else {
            mark_cancelled(conn, &child, now)?;
        }
    }
    Ok(())
}
