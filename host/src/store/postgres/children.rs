//! Child runs on PostgreSQL: spawning them exactly once, joining children, counting a
//! parent's join down as its children end, and cancelling a run's descendants. The
//! same statements as SQLite's, each inside the transaction its caller began (the
//! parent's row locked by the fence check).

use super::TxError;
use super::conn::Conn;
use super::runs::{lease_from, mark_cancelled, status_from};
use super::waits::settle;
use crate::store::rules::{
    Found, SpawnFacts, SpawnPlan, join_asked, join_mode, join_reused, plan_spawns,
};
use crate::store::{
    ChildEnd, JoinMode, JoinRefusal, JoinRequest, SpawnAnswers, SpawnBatch, StoreError, WaitState,
};

/// Spawns the batch's children, each answered as a spawn of it alone would be, in a
/// fixed number of statements whatever the batch's size. The caller checked the fence
/// with the parent's row locked `FOR SHARE`: only the lease's holder spawns (one
/// instance, one spawn at a time), and its children ending meanwhile share the lock
/// ([`count_down_parent`]).
pub(super) async fn spawn_many(
    conn: &Conn,
    batch: &SpawnBatch<'_>,
) -> Result<SpawnAnswers, TxError> {
    let parent = batch.fence.run_id.as_str();
    let ids: Vec<&str> = batch.children.iter().map(|c| c.child_id).collect();
    let inputs: Vec<&[u8]> = batch.children.iter().map(|c| c.input).collect();
    let mut facts = SpawnFacts {
        found: vec![None; ids.len()],
        ..SpawnFacts::default()
    };
    let found = conn
        .query(
            "SELECT c.n, r.parent, r.agent, i.input = c.input
             FROM unnest($1::text[], $2::bytea[]) WITH ORDINALITY AS c(id, input, n)
             JOIN runs r ON r.run_id = c.id JOIN run_inputs i ON i.run_id = r.run_id",
            &[&ids, &inputs],
        )
        .await?;
    for row in &found {
        let n: i64 = row.try_get(0)?;
        let at = usize::try_from(n.saturating_sub(1)).unwrap_or(usize::MAX);
        if let Some(slot) = facts.found.get_mut(at) {
            *slot = Some(Found {
                parent: row.try_get(1)?,
                agent: row.try_get(2)?,
                same_input: row.try_get(3)?,
            });
        }
    }
    let mut names: Vec<&str> = batch.children.iter().map(|c| c.deployment).collect();
    names.sort_unstable();
    names.dedup();
    let deployments = conn
        .query(
            "SELECT DISTINCT ON (name) name, digest, authority FROM deployments
             WHERE name = ANY ($1) ORDER BY name, id DESC",
            &[&names],
        )
        .await?;
    for row in &deployments {
        facts
            .deployments
            .insert(row.try_get(0)?, (row.try_get(1)?, row.try_get(2)?));
    }
    let row = conn
        .query_one(
            "SELECT depth, (SELECT count(*) FROM runs WHERE parent = $1) FROM runs
             WHERE run_id = $1",
            &[&parent],
        )
        .await?;
    facts.depth = i64::from(row.try_get::<_, i32>(0)?);
    facts.children = row.try_get(1)?;
    let ancestors = conn
        .query(
            "WITH RECURSIVE up(id) AS (
                 SELECT $1::text
                 UNION SELECT r.parent FROM runs r JOIN up ON r.run_id = up.id
                 WHERE r.parent IS NOT NULL
             )
             SELECT r.run_id, r.agent, r.spawn_key FROM runs r JOIN up ON r.run_id = up.id
             WHERE r.spawn_key IS NOT NULL",
            &[&parent],
        )
        .await?;
    for row in &ancestors {
        facts
            .ancestors
            .entry((row.try_get(1)?, row.try_get(2)?))
            .or_insert(row.try_get(0)?);
    }
    let SpawnPlan {
        answers,
        create,
        depth,
    } = plan_spawns(batch, &facts);
    if create.is_empty() {
        return Ok(answers);
    }
    let depth = i32::try_from(depth).unwrap_or(i32::MAX);
    let children: Vec<_> = create.iter().map(|new| &batch.children[new.at]).collect();
    let ids: Vec<&str> = children.iter().map(|c| c.child_id).collect();
    let agents: Vec<&str> = children.iter().map(|c| c.deployment).collect();
    let keys: Vec<&str> = children.iter().map(|c| c.key).collect();
    let detached: Vec<bool> = children.iter().map(|c| c.detached).collect();
    let digests: Vec<&str> = create.iter().map(|new| new.digest.as_str()).collect();
    conn.execute(
        "INSERT INTO runs (run_id, agent, digest, namespace, status, created, updated,
                           parent, spawn_key, depth, detached, version)
         SELECT c.id, c.agent, c.digest, c.agent, 'queued', $6, $6, $7, c.key, $8, c.detached,
                (SELECT max(d.version) FROM deployments d
                 WHERE d.name = c.agent AND d.digest = c.digest)
         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bool[])
              WITH ORDINALITY AS c(id, agent, digest, key, detached, n)
         ORDER BY c.n",
        &[
            &ids, &agents, &digests, &keys, &detached, &conn.now, &parent, &depth,
        ],
    )
    .await?;
    let inputs: Vec<&[u8]> = children.iter().map(|c| c.input).collect();
    let authorities: Vec<&[u8]> = create.iter().map(|new| new.authority.as_slice()).collect();
    conn.execute(
        "INSERT INTO run_inputs (run_id, input, authority)
         SELECT * FROM unnest($1::text[], $2::bytea[], $3::bytea[])",
        &[&ids, &inputs, &authorities],
    )
    .await?;
    let mut members: Vec<(&str, &str)> = agents.iter().copied().zip(digests).collect();
    members.sort_unstable();
    members.dedup();
    for (deployment, digest) in members {
        super::components::add_member(conn, deployment, digest, "run").await?;
    }
    Ok(answers)
}

/// Records the join if new and says where it stands. The caller checked the fence.
pub(super) async fn join(conn: &Conn, req: &JoinRequest<'_>) -> Result<WaitState, TxError> {
    let run_id = req.fence.run_id.as_str();
    let refused = |refusal: JoinRefusal| {
        TxError::Store(StoreError::JoinRefused {
            run_id: run_id.to_owned(),
            key: req.key.to_owned(),
            refusal,
        })
    };
    let asked_due =
        join_asked(conn.now, req.children, req.timeout, req.max_children).map_err(&refused)?;
    let row = conn
        .query_opt(
            "SELECT signal, join_mode, due, outcome, payload, rate_class FROM waits
             WHERE run_id = $1 AND key = $2",
            &[&run_id, &req.key],
        )
        .await?;
    let due = match row {
        Some(row) => {
            let signal: Option<String> = row.try_get(0)?;
            let mode: Option<String> = row.try_get(1)?;
            let (due, outcome): (Option<i64>, Option<String>) = (row.try_get(2)?, row.try_get(3)?);
            let payload: Option<Vec<u8>> = row.try_get(4)?;
            let rate: Option<String> = row.try_get(5)?;
            if mode.as_deref().and_then(join_mode) != Some(req.mode)
                || !same_members(conn, run_id, req.key, req.children).await?
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
                    return recorded_ends(conn, run_id, req.key, req.mode, payload.as_deref())
                        .await;
                }
                Some(_) => return Ok(WaitState::TimedOut),
                None => due,
            }
        }
        None => {
            let parents = conn
                .query(
                    "SELECT c.id, r.parent FROM unnest($1::text[]) AS c(id)
                     LEFT JOIN runs r ON r.run_id = c.id",
                    &[&req.children],
                )
                .await?;
            for row in &parents {
                let parent: Option<String> = row.try_get(1)?;
                if parent.as_deref() != Some(run_id) {
                    return Err(refused(JoinRefusal::NotAChild(row.try_get(0)?)));
                }
            }
            conn.execute(
                "INSERT INTO waits (run_id, key, due, created, join_mode)
                 VALUES ($1, $2, $3, $4, $5)",
                &[&run_id, &req.key, &asked_due, &conn.now, &req.mode.as_str()],
            )
            .await?;
            conn.execute(
                "INSERT INTO join_members (run_id, key, child, seq)
                 SELECT $1, $2, c.id, (c.n - 1)::int4
                 FROM unnest($3::text[]) WITH ORDINALITY AS c(id, n)",
                &[&run_id, &req.key, &req.children],
            )
            .await?;
            asked_due
        }
    };
    settle_if_over(conn, run_id, req.key, req.mode, due).await
}

/// Whether the join recorded under `key` lists exactly `children`, in that order.
async fn same_members(
    conn: &Conn,
    run_id: &str,
    key: &str,
    children: &[String],
) -> Result<bool, TxError> {
    let rows = conn
        .query(
            "SELECT child FROM join_members WHERE run_id = $1 AND key = $2 ORDER BY seq",
            &[&run_id, &key],
        )
        .await?;
    let recorded: Vec<String> = rows
        .iter()
        .map(|row| row.try_get(0))
        .collect::<Result<_, _>>()?;
    Ok(recorded == children)
}

/// Settles the open join if its children have ended (copying their ends into it) or
/// its time passed; else says it is pending.
async fn settle_if_over(
    conn: &Conn,
    run_id: &str,
    key: &str,
    mode: JoinMode,
    due: Option<i64>,
) -> Result<WaitState, TxError> {
    let over = match mode {
        JoinMode::All => {
            let left: i64 = conn
                .query_one(
                    "SELECT count(*) FROM join_members m JOIN runs r ON r.run_id = m.child
                     WHERE m.run_id = $1 AND m.key = $2
                       AND r.status NOT IN ('completed', 'failed', 'cancelled')",
                    &[&run_id, &key],
                )
                .await?
                .try_get(0)?;
            left == 0
        }
        JoinMode::Any => {
            let first = conn
                .query_opt(
                    "SELECT m.seq FROM join_members m JOIN runs r ON r.run_id = m.child
                     WHERE m.run_id = $1 AND m.key = $2
                       AND r.status IN ('completed', 'failed', 'cancelled')
                     ORDER BY r.updated, m.seq LIMIT 1",
                    &[&run_id, &key],
                )
                .await?;
            if let Some(row) = first {
                let seq: i32 = row.try_get(0)?;
                let payload = seq.to_string().into_bytes();
                copy_end(conn, run_id, key, Some(seq)).await?;
                settle(conn, run_id, key, "received", Some(&payload)).await?;
                return recorded_ends(conn, run_id, key, mode, Some(&payload)).await;
            }
            false
        }
    };
    if over {
        copy_end(conn, run_id, key, None).await?;
        settle(conn, run_id, key, "received", None).await?;
        return recorded_ends(conn, run_id, key, mode, None).await;
    }
    match due {
        Some(due) if due <= conn.now => {
            settle(conn, run_id, key, "timed-out", None).await?;
            Ok(WaitState::TimedOut)
        }
        due => Ok(WaitState::Pending { due }),
    }
}

/// Copies the ends of the join's children (of the one at `seq`, if given) into the
/// join. A child gc removed (which gc only does once its parent ended) reads as failed.
async fn copy_end(conn: &Conn, run_id: &str, key: &str, seq: Option<i32>) -> Result<(), TxError> {
    conn.execute(
        "UPDATE join_members m
         SET status = coalesce(r.status, 'failed'),
             outcome = CASE WHEN r.run_id IS NULL THEN convert_to('the child run is gone', 'UTF8')
                            ELSE coalesce(o.outcome, ''::bytea) END
         FROM join_members j
         LEFT JOIN runs r ON r.run_id = j.child
         LEFT JOIN run_outcomes o ON o.run_id = j.child
         WHERE j.run_id = m.run_id AND j.key = m.key AND j.child = m.child
           AND m.run_id = $1 AND m.key = $2 AND ($3::int4 IS NULL OR m.seq = $3)",
        &[&run_id, &key, &seq],
    )
    .await?;
    Ok(())
}

/// The ends a settled join recorded: every child's, or (for `any`) the one at the
/// index its payload names.
async fn recorded_ends(
    conn: &Conn,
    run_id: &str,
    key: &str,
    mode: JoinMode,
    payload: Option<&[u8]>,
) -> Result<WaitState, TxError> {
    let seq: Option<i32> = match mode {
        JoinMode::All => None,
        JoinMode::Any => payload
            .and_then(|p| std::str::from_utf8(p).ok())
            .and_then(|p| p.parse().ok()),
    };
    let rows = conn
        .query(
            "SELECT seq, child, status, outcome FROM join_members
             WHERE run_id = $1 AND key = $2 AND status IS NOT NULL
               AND ($3::int4 IS NULL OR seq = $3)
             ORDER BY seq",
            &[&run_id, &key, &seq],
        )
        .await?;
    let ends = rows
        .iter()
        .map(|row| {
            let index: i32 = row.try_get(0)?;
            Ok(ChildEnd {
                index: u32::try_from(index).unwrap_or(0),
                run_id: row.try_get(1)?,
                status: status_from(row, 2)?,
                outcome: row.try_get::<_, Option<Vec<u8>>>(3)?.unwrap_or_default(),
            })
        })
        .collect::<Result<_, TxError>>()?;
    Ok(WaitState::Joined(ends))
}

/// How many of the join's children the parent still waits for: those not ended (for
/// `all`), or 1 while none has (for `any`).
pub(super) async fn join_left(conn: &Conn, run_id: &str, key: &str) -> Result<i64, TxError> {
    let mode: Option<String> = conn
        .query_opt(
            "SELECT join_mode FROM waits WHERE run_id = $1 AND key = $2",
            &[&run_id, &key],
        )
        .await?
        .map(|row| row.try_get(0))
        .transpose()?
        .flatten();
    let row = conn
        .query_one(
            "SELECT count(*) FILTER (WHERE r.status NOT IN ('completed', 'failed', 'cancelled')),
                    count(*) FILTER (WHERE r.status IN ('completed', 'failed', 'cancelled'))
             FROM join_members m JOIN runs r ON r.run_id = m.child
             WHERE m.run_id = $1 AND m.key = $2",
            &[&run_id, &key],
        )
        .await?;
    let (not_ended, ended): (i64, i64) = (row.try_get(0)?, row.try_get(1)?);
    Ok(match mode.as_deref().and_then(join_mode) {
        Some(JoinMode::Any) => i64::from(ended == 0),
        _ => not_ended,
    })
}

/// Counts the run's end down in its parent's join, if the parent is suspended joining
/// it.
///
/// The parent's row is read first without a lock. Suspended in a join, it is counted
/// down by an `UPDATE` (which locks the row, so siblings ending at once take turns,
/// each one short statement). Otherwise it is locked `FOR NO KEY UPDATE` and read
/// again: a suspension of the parent locks its row for update, so either it committed
/// before this lock (and the second read sees it, and this end is counted down) or it
/// waits for this transaction and then sees this child ended. Not `FOR SHARE`: siblings
/// that queued behind the parent's suspension would all get the shared lock when it
/// commits, all find the parent joining, and all try to update the row they share —
/// a deadlock PostgreSQL breaks one victim per `deadlock_timeout` (a second), which
/// held a fan-out of 1,000 children on PostgreSQL to 30 a second.
pub(super) async fn count_down_parent(conn: &Conn, child: &str) -> Result<(), TxError> {
    let row = conn
        .query_opt(
            "SELECT p.run_id, p.lease_holder IS NULL AND coalesce(p.join_left, 0) > 0
             FROM runs c JOIN runs p ON p.run_id = c.parent WHERE c.run_id = $1",
            &[&child],
        )
        .await?;
    let Some(row) = row else {
        return Ok(());
    };
    let (parent, mut joining): (String, bool) = (row.try_get(0)?, row.try_get(1)?);
    if !joining {
        joining = conn
            .query_one(
                "SELECT lease_holder IS NULL AND coalesce(join_left, 0) > 0 FROM runs
                 WHERE run_id = $1 FOR NO KEY UPDATE",
                &[&parent],
            )
            .await?
            .try_get(0)?;
    }
    if !joining {
        return Ok(());
    }
    conn.execute(COUNT_DOWN, &[&parent, &child, &conn.now])
        .await?;
    Ok(())
}

/// Counts child `$2`'s end down in the join its parent `$1` is suspended in, at `$3`,
/// if the parent still waits on it; the last of them to end makes the parent due.
pub(super) const COUNT_DOWN: &str = "UPDATE runs
     SET join_left = join_left - 1,
         wake_at = CASE WHEN join_left <= 1 THEN $3 ELSE wake_at END,
         updated = $3
     WHERE run_id = $1
       AND lease_holder IS NULL AND join_left > 0
       AND EXISTS (SELECT 1 FROM join_members m
                   WHERE m.run_id = runs.run_id AND m.key = runs.joining AND m.child = $2)";

/// Cancels the descendants of `run_id` that are not detached (nor below a detached
/// one) and not completed or cancelled: at once where no live lease is on them, else
/// by asking their workers.
pub(super) async fn cancel_descendants(conn: &Conn, run_id: &str) -> Result<(), TxError> {
    let rows = conn
        .query(
            "WITH RECURSIVE tree(id) AS (
                 SELECT run_id FROM runs WHERE parent = $1 AND NOT detached
                 UNION SELECT r.run_id FROM runs r JOIN tree t ON r.parent = t.id
                 WHERE NOT r.detached
             )
             SELECT r.run_id, r.lease_holder, r.lease_token, r.lease_expires
             FROM runs r JOIN tree t ON r.run_id = t.id
             WHERE r.status NOT IN ('completed', 'cancelled')
             ORDER BY r.run_id
             FOR NO KEY UPDATE OF r",
            &[&run_id],
        )
        .await?;
    for row in &rows {
        let child: String = row.try_get(0)?;
        let lease = lease_from(row, 1)?;
        if lease.is_some_and(|lease| lease.expires > conn.now) {
            conn.execute(
                "UPDATE runs SET cancel_requested = true, updated = $2 WHERE run_id = $1",
                &[&child, &conn.now],
            )
            .await?;
        } else {
            mark_cancelled(conn, &child).await?;
        }
    }
    Ok(())
}
