//! Runs on PostgreSQL: submitting, reading and listing them, their checkpoints,
//! counts and outcomes, upgrades and cancellation. The run leases themselves are
//! `leases.rs`.

use tokio_postgres::Row;

use super::conn::Conn;
use super::{TxError, to_sql_int, u64_col};
use crate::store::{
    Cancelled, Checkpoint, Counts, MAX_PRIORITY, RunFilter, RunLeaseInfo, RunRecord, RunStatus,
    StoreError, Submission, Submitted,
};

/// A run's status as shown: `paused` for a queued or running run an operator paused
/// (the `status` column keeps what it is underneath: resuming it clears `paused`).
macro_rules! run_status {
    () => {
        "CASE WHEN r.paused IS NOT NULL AND r.status IN ('queued', 'running') \
         THEN 'paused' ELSE r.status END"
    };
}

/// A `SELECT` of whole run records followed by `$tail`; [`record`] reads its rows.
macro_rules! select_records {
    ($($tail:tt)*) => {
        concat!(
            "SELECT r.run_id, r.agent, r.digest, r.namespace, ", run_status!(), ", o.outcome,
                    r.executed, r.skipped, r.awaited, r.reclaimed, r.instances,
                    r.lease_holder, r.lease_token, r.lease_expires, r.cancel_requested,
                    r.note, r.created, r.updated, p.step, r.wake_at, r.waiting_for,
                    r.recycled, r.parent, r.spawn_key, r.detached, r.joining, r.paused,
                    r.priority, r.flow_key
             FROM runs r
             LEFT JOIN progress p ON p.run_id = r.run_id
             LEFT JOIN run_outcomes o ON o.run_id = r.run_id ",
            $($tail)*
        )
    };
}

/// Creates the run as queued if it is new, or finds it. Two submitters of one new run
/// meet at the primary key: the second waits for the first, then finds its run.
/// Submits runs in the caller's transaction, each answered as a lone [`submit`] of it
/// would be. A submission's one refusal that comes after its first write (a missing
/// component) is looked for first, once per component, so a refused run writes nothing.
pub(super) async fn submit_many(
    conn: &Conn,
    submissions: &[Submission<'_>],
) -> Result<Vec<Result<Submitted, StoreError>>, TxError> {
    // Whether each component named is in the store.
    let mut known = std::collections::HashMap::new();
    let mut answers = Vec::with_capacity(submissions.len());
    for submission in submissions {
        let digest = submission.digest;
        if !known.contains_key(digest) {
            let found = match super::components::require(conn, digest).await {
                Ok(()) => true,
                Err(TxError::Store(StoreError::UnknownComponent { .. })) => false,
                Err(e) => return Err(e),
            };
            known.insert(digest, found);
        }
        if known.get(digest) == Some(&false) {
            answers.push(Err(StoreError::UnknownComponent {
                digest: digest.to_owned(),
            }));
            continue;
        }
        answers.push(match submit(conn, submission).await {
            Err(TxError::Store(e)) if e.is_refusal() => Err(e),
            Err(e) => return Err(e),
            Ok(submitted) => Ok(submitted),
        });
    }
    Ok(answers)
}

pub(super) async fn submit(conn: &Conn, submission: &Submission<'_>) -> Result<Submitted, TxError> {
    let run_id = submission.run_id;
    let now = conn.now;
    let priority = match i32::try_from(submission.priority) {
        Ok(priority) if submission.priority <= MAX_PRIORITY => priority,
        _ => {
            return Err(TxError::Store(StoreError::PriorityRefused {
                priority: submission.priority,
            }));
        }
    };
    // Refused before the insert: an existing run keeps its key, so only a new one's
    // input must have one.
    let flow_key = match super::flow::flow_key(conn, submission).await {
        Ok(key) => key,
        Err(TxError::Store(StoreError::FlowKeyMissing { .. })) if exists(conn, run_id).await? => {
            None
        }
        Err(e) => return Err(e),
    };
    let inserted = conn
        .execute(
            "INSERT INTO runs
                 (run_id, agent, digest, namespace, status, created, updated, priority, flow_key)
             VALUES ($1, $2, $3, $4, $5, $6, $6, $7, $8)
             ON CONFLICT (run_id) DO NOTHING",
            &[
                &run_id,
                &submission.agent,
                &submission.digest,
                &submission.namespace,
                &RunStatus::Queued.as_str(),
                &now,
                &priority,
                &flow_key,
            ],
        )
        .await?;
    let created = if inserted == 1 {
        // Rolled back with the insert if the component is missing.
        super::components::require(conn, submission.digest).await?;
        conn.execute(
            "INSERT INTO run_inputs (run_id, input, authority) VALUES ($1, $2, $3)",
            &[&run_id, &submission.input, &submission.authority],
        )
        .await?;
        super::components::add_member(conn, submission.namespace, submission.digest, "run").await?;
        true
    } else {
        let row = conn
            .query_one(
                "SELECT i.input = $2, r.status FROM runs r
                 JOIN run_inputs i ON i.run_id = r.run_id
                 WHERE r.run_id = $1 FOR NO KEY UPDATE OF r",
                &[&run_id, &submission.input],
            )
            .await?;
        let (same, status): (bool, String) = (row.try_get(0)?, row.try_get(1)?);
        if !same {
            return Err(TxError::Store(StoreError::InputMismatch {
                run_id: run_id.to_owned(),
            }));
        }
        if submission.replace_authority {
            conn.execute(
                "UPDATE run_inputs SET authority = $2 WHERE run_id = $1",
                &[&run_id, &submission.authority],
            )
            .await?;
        }
        if status == RunStatus::Failed.as_str() {
            conn.execute(
                "UPDATE runs SET status = $2, updated = $3 WHERE run_id = $1",
                &[&run_id, &RunStatus::Running.as_str(), &now],
            )
            .await?;
            set_outcome(conn, run_id, None).await?;
        }
        false
    };
    let record = run(conn, run_id)
        .await?
        .ok_or_else(|| unknown_run(run_id))?;
    Ok(Submitted { record, created })
}

/// Moves the run to another component and records it.
pub(super) async fn upgrade_run(
    conn: &Conn,
    run_id: &str,
    from: &str,
    to: &str,
) -> Result<(), TxError> {
    let row = conn
        .query_opt(
            "UPDATE runs SET digest = $3, updated = $4 WHERE run_id = $1 AND digest = $2
             RETURNING namespace",
            &[&run_id, &from, &to, &conn.now],
        )
        .await?;
    let Some(row) = row else {
        return Err(unknown_run(run_id));
    };
    let namespace: String = row.try_get(0)?;
    conn.execute(
        "INSERT INTO run_upgrades (run_id, from_digest, to_digest, at) VALUES ($1, $2, $3, $4)",
        &[&run_id, &from, &to, &conn.now],
    )
    .await?;
    super::components::add_member(conn, &namespace, to, "upgrade").await
}

/// Cancels the run now if no live lease is on it, or asks its worker to.
pub(super) async fn cancel_run(conn: &Conn, run_id: &str) -> Result<Cancelled, TxError> {
    let row = conn
        .query_opt(
            "SELECT status, lease_holder, lease_token, lease_expires FROM runs
             WHERE run_id = $1 FOR NO KEY UPDATE",
            &[&run_id],
        )
        .await?;
    let Some(row) = row else {
        return Err(unknown_run(run_id));
    };
    let (status, lease) = (status_from(&row, 0)?, lease_from(&row, 1)?);
    if matches!(status, RunStatus::Completed | RunStatus::Cancelled) {
        return Err(TxError::Store(StoreError::RunFinished {
            run_id: run_id.to_owned(),
            status,
        }));
    }
    if let Some(lease) = lease.filter(|lease| lease.expires > conn.now) {
        conn.execute(
            "UPDATE runs SET cancel_requested = true, updated = $2 WHERE run_id = $1",
            &[&run_id, &conn.now],
        )
        .await?;
        super::children::cancel_descendants(conn, run_id).await?;
        return Ok(Cancelled::Requested { lease });
    }
    end_as_cancelled(conn, run_id).await?;
    Ok(Cancelled::Now)
}

/// Cancels the run as [`mark_cancelled`] does, and its children that are not
/// detached, and theirs.
pub(super) async fn end_as_cancelled(conn: &Conn, run_id: &str) -> Result<(), TxError> {
    mark_cancelled(conn, run_id).await?;
    super::children::cancel_descendants(conn, run_id).await
}

/// Sets the run cancelled with no lease and releases its open claims that are not
/// parked; a parent joining it counts it as ended.
pub(super) async fn mark_cancelled(conn: &Conn, run_id: &str) -> Result<(), TxError> {
    conn.execute(
        "UPDATE runs
         SET status = $2, lease_holder = NULL, lease_expires = NULL, cancel_requested = false,
             wake_at = NULL, waiting_for = NULL, joining = NULL, join_left = NULL, updated = $3
         WHERE run_id = $1",
        &[&run_id, &RunStatus::Cancelled.as_str(), &conn.now],
    )
    .await?;
    set_outcome(conn, run_id, None).await?;
    conn.execute(
        "UPDATE steps SET holder = NULL WHERE run_id = $1 AND holder IS NOT NULL",
        &[&run_id],
    )
    .await?;
    super::children::count_down_parent(conn, run_id).await
}

/// Stores or clears the run's outcome.
pub(super) async fn set_outcome(
    conn: &Conn,
    run_id: &str,
    outcome: Option<&[u8]>,
) -> Result<(), TxError> {
    match outcome {
        Some(outcome) => {
            conn.execute(
                "INSERT INTO run_outcomes (run_id, outcome) VALUES ($1, $2)
                 ON CONFLICT (run_id) DO UPDATE SET outcome = excluded.outcome",
                &[&run_id, &outcome],
            )
            .await?
        }
        None => {
            conn.execute("DELETE FROM run_outcomes WHERE run_id = $1", &[&run_id])
                .await?
        }
    };
    Ok(())
}

/// The run's record, if it exists.
pub(super) async fn run(conn: &Conn, run_id: &str) -> Result<Option<RunRecord>, TxError> {
    match conn
        .query_opt(select_records!("WHERE r.run_id = $1"), &[&run_id])
        .await?
    {
        Some(row) => Ok(Some(record(&row)?)),
        None => Ok(None),
    }
}

/// The records of the runs `ids` that exist, by run id.
pub(super) async fn runs_by_id(
    conn: &Conn,
    ids: &[String],
) -> Result<std::collections::HashMap<String, RunRecord>, TxError> {
    let rows = conn
        .query(select_records!("WHERE r.run_id = ANY ($1)"), &[&ids])
        .await?;
    rows.iter()
        .map(|row| {
            let record = record(row)?;
            Ok((record.run_id.clone(), record))
        })
        .collect()
}

/// The authority the run was submitted with, if it exists.
pub(super) async fn authority(conn: &Conn, run_id: &str) -> Result<Option<Vec<u8>>, TxError> {
    let row = conn
        .query_opt(
            "SELECT authority FROM run_inputs WHERE run_id = $1",
            &[&run_id],
        )
        .await?;
    Ok(row.map(|row| row.try_get(0)).transpose()?)
}

/// Runs as the filter asks, newest first; runs submitted in the same millisecond by
/// submission order.
pub(super) async fn runs(conn: &Conn, filter: &RunFilter<'_>) -> Result<Vec<RunRecord>, TxError> {
    let limit = filter
        .limit
        .map(|limit| i64::try_from(limit).unwrap_or(i64::MAX));
    let rows = conn
        .query(
            select_records!(
                "WHERE ($1::text IS NULL OR ",
                run_status!(),
                " = $1) AND ($2::text IS NULL OR r.agent = $2)
                   AND ($4::text IS NULL OR r.parent = $4)
                 ORDER BY r.created DESC, r.seq DESC LIMIT $3"
            ),
            &[
                &filter.status.map(RunStatus::as_str),
                &filter.agent,
                &limit,
                &filter.parent,
            ],
        )
        .await?;
    rows.iter().map(record).collect()
}

/// The run's last checkpoint.
pub(super) async fn load_progress(
    conn: &Conn,
    run_id: &str,
) -> Result<Option<Checkpoint>, TxError> {
    let row = conn
        .query_opt(
            "SELECT step, state FROM progress WHERE run_id = $1",
            &[&run_id],
        )
        .await?;
    match row {
        Some(row) => Ok(Some(Checkpoint {
            step: u64_col(&row, 0)?,
            state: row.try_get(1)?,
        })),
        None => Ok(None),
    }
}

/// Replaces the run's checkpoint. The caller checked the fence, so the run exists.
pub(super) async fn save_checkpoint(
    conn: &Conn,
    run_id: &str,
    checkpoint: &Checkpoint,
) -> Result<(), TxError> {
    conn.execute(
        "INSERT INTO progress (run_id, step, state, updated) VALUES ($1, $2, $3, $4)
         ON CONFLICT (run_id) DO UPDATE
         SET step = excluded.step, state = excluded.state, updated = excluded.updated",
        &[
            &run_id,
            &to_sql_int(checkpoint.step)?,
            &checkpoint.state,
            &conn.now,
        ],
    )
    .await?;
    Ok(())
}

/// Stores the run's counts as given. The caller checked the fence, so the run exists.
pub(super) async fn save_counts(conn: &Conn, run_id: &str, counts: &Counts) -> Result<(), TxError> {
    conn.execute(
        "UPDATE runs
         SET executed = $2, skipped = $3, awaited = $4, reclaimed = $5, instances = $6,
             recycled = $8, updated = $7
         WHERE run_id = $1",
        &[
            &run_id,
            &to_sql_int(counts.executed)?,
            &to_sql_int(counts.skipped)?,
            &to_sql_int(counts.awaited)?,
            &to_sql_int(counts.reclaimed)?,
            &to_sql_int(counts.instances)?,
            &conn.now,
            &to_sql_int(counts.recycled)?,
        ],
    )
    .await?;
    Ok(())
}

/// Whether the run exists.
async fn exists(conn: &Conn, run_id: &str) -> Result<bool, TxError> {
    Ok(conn
        .query_opt("SELECT 1 FROM runs WHERE run_id = $1", &[&run_id])
        .await?
        .is_some())
}

pub(super) fn unknown_run(run_id: &str) -> TxError {
    TxError::Store(StoreError::UnknownRun {
        run_id: run_id.to_owned(),
    })
}

/// Reads one row of [`select_records!`].
pub(super) fn record(row: &Row) -> Result<RunRecord, TxError> {
    let step = match row.try_get::<_, Option<i64>>(18)? {
        Some(_) => Some(u64_col(row, 18)?),
        None => None,
    };
    Ok(RunRecord {
        run_id: row.try_get(0)?,
        agent: row.try_get(1)?,
        digest: row.try_get(2)?,
        namespace: row.try_get(3)?,
        status: status_from(row, 4)?,
        outcome: row.try_get(5)?,
        counts: Counts {
            executed: u64_col(row, 6)?,
            skipped: u64_col(row, 7)?,
            awaited: u64_col(row, 8)?,
            reclaimed: u64_col(row, 9)?,
            instances: u64_col(row, 10)?,
            recycled: u64_col(row, 21)?,
        },
        lease: lease_from(row, 11)?,
        cancel_requested: row.try_get(14)?,
        note: row.try_get(15)?,
        created: row.try_get(16)?,
        updated: row.try_get(17)?,
        step,
        wake_at: row.try_get(19)?,
        waiting_for: row.try_get(20)?,
        parent: row.try_get(22)?,
        spawn_key: row.try_get(23)?,
        detached: row.try_get(24)?,
        joining: row.try_get(25)?,
        paused_by: row
            .try_get::<_, Option<String>>(26)?
            .as_deref()
            .and_then(crate::store::PausedBy::parse),
        priority: u32::try_from(row.try_get::<_, i32>(27)?).unwrap_or(u32::MAX),
        flow_key: row.try_get(28)?,
    })
}

/// Reads a lease from `lease_holder, lease_token, lease_expires` at `idx`..`idx + 3`.
pub(super) fn lease_from(row: &Row, idx: usize) -> Result<Option<RunLeaseInfo>, TxError> {
    let holder: Option<String> = row.try_get(idx)?;
    let expires: Option<i64> = row.try_get(idx + 2)?;
    match (holder, expires) {
        (Some(worker), Some(expires)) => Ok(Some(RunLeaseInfo {
            worker,
            token: u64_col(row, idx + 1)?,
            expires,
        })),
        _ => Ok(None),
    }
}

pub(super) fn status_from(row: &Row, idx: usize) -> Result<RunStatus, TxError> {
    let name: String = row.try_get(idx)?;
    name.parse().map_err(|e: String| {
        TxError::Store(StoreError::Backend {
            op: "read a run",
            source: e.into(),
        })
    })
}
