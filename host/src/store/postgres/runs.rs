//! Runs on PostgreSQL: submitting, reading and listing them, their checkpoints,
//! counts and outcomes, upgrades and cancellation. The run leases themselves are
//! `leases.rs`.

use tokio_postgres::Row;

use super::conn::Conn;
use super::{TxError, to_sql_int, u64_col};
use crate::store::EventKind;
use crate::store::events::NewEvent;
use crate::store::history::{HISTORY_KEEP, HISTORY_KEEP_LARGE, Position};
use crate::store::values;
use crate::store::{
    BlobDigest, Cancelled, Checkpoint, Counts, MAX_PRIORITY, Payloads, RunFilter, RunLeaseInfo,
    RunRecord, RunStatus, StoreError, Submission, Submitted, key_of,
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
                    r.priority, r.flow_key, r.version
             FROM runs r
             LEFT JOIN LATERAL (SELECT step FROM progress WHERE progress.run_id = r.run_id
                                ORDER BY lease DESC, tick DESC LIMIT 1) p ON true
             LEFT JOIN run_outcomes o ON o.run_id = r.run_id ",
            $($tail)*
        )
    };
}

/// Submits runs in the caller's transaction, each answered as a lone [`submit`] of it
/// would be (in the batch's order: a run an earlier member created is found by a later
/// one), in a few statements whatever the batch's size:
/// - one round trip reads what the answers depend on: which runs exist (locked, as a
///   lone submit locks the run it finds), the concurrency-key pointers of the
///   deployments named, and which components the store holds; and, if some runs
///   exist, a second compares their inputs with the members' (on the server, as a
///   lone submit does);
/// - the answers are decided here, as each lone submit would decide, in order: a
///   refused member writes nothing;
/// - one round trip writes every new run, its input and its namespace's member, every
///   replaced authority and every failed run submitted again, set-based (`unnest`),
///   and reads the records back.
///
/// A run another submitter created since the first read makes the insert find fewer
/// new rows than decided: the writes are rolled back (to a savepoint taken with them)
/// and the batch is submitted one run at a time instead, as it was before.
pub(super) async fn submit_many(
    conn: &Conn,
    submissions: &[Submission<'_>],
) -> Result<Vec<Result<Submitted, StoreError>>, TxError> {
    if submissions.is_empty() {
        return Ok(Vec::new());
    }
    let facts = BatchFacts::read(conn, submissions).await?;
    let plan = plan_batch(submissions, &facts, conn.payloads());
    match write_batch(conn, submissions, &plan).await? {
        Some(records) => answer_batch(plan, records),
        None => one_by_one(conn, submissions).await,
    }
}

/// The batch submitted one run at a time, each in turn as a lone [`submit`].
async fn one_by_one(
    conn: &Conn,
    submissions: &[Submission<'_>],
) -> Result<Vec<Result<Submitted, StoreError>>, TxError> {
    let mut answers = Vec::with_capacity(submissions.len());
    for submission in submissions {
        answers.push(match submit(conn, submission).await {
            Err(TxError::Store(e)) if e.is_refusal() => Err(e),
            Err(e) => return Err(e),
            Ok(submitted) => Ok(submitted),
        });
    }
    Ok(answers)
}

/// One statement parameter, for statements sent together.
type Param<'a> = [&'a (dyn tokio_postgres::types::ToSql + Sync); 1];

/// What a batch's answers depend on, read before deciding them.
struct BatchFacts {
    /// The runs that exist, with their status.
    existing: std::collections::HashMap<String, String>,
    /// Per member whose run exists: whether its input is the run's.
    same_input: Vec<Option<bool>>,
    /// The concurrency-key pointer of each deployment named that has one.
    pointers: std::collections::HashMap<String, String>,
    /// The components named that the store holds.
    components: std::collections::HashSet<String>,
    /// The blobs of inputs kept as blobs whose deployment reads a concurrency key
    /// (read here: the plan is made without the database).
    blobs: std::collections::HashMap<BlobDigest, Vec<u8>>,
}

impl BatchFacts {
    /// A submission's input with its blob read in, when it is a reference the facts
    /// read.
    fn input<'v>(&'v self, kept: &'v [u8]) -> &'v [u8] {
        values::blobs::referred(kept)
            .and_then(|digest| self.blobs.get(&digest))
            .map_or(kept, Vec::as_slice)
    }

    async fn read(conn: &Conn, submissions: &[Submission<'_>]) -> Result<BatchFacts, TxError> {
        fn distinct(mut all: Vec<&str>) -> Vec<&str> {
            all.sort_unstable();
            all.dedup();
            all
        }
        let ids = distinct(submissions.iter().map(|s| s.run_id).collect());
        let agents = distinct(submissions.iter().map(|s| s.agent).collect());
        let digests = distinct(submissions.iter().map(|s| s.digest).collect());
        // Locked in run order, as `leases::renew_runs` and the batches lock runs.
        let (ids, agents, digests): (Param<'_>, Param<'_>, Param<'_>) =
            ([&ids], [&agents], [&digests]);
        let (runs, pointers, components) = tokio::try_join!(
            conn.query(
                "SELECT run_id, status FROM runs WHERE run_id = ANY ($1)
                 ORDER BY run_id FOR NO KEY UPDATE",
                &ids,
            ),
            conn.query(
                "SELECT deployment, key_pointer FROM flow_limits
                 WHERE deployment = ANY ($1) AND key_pointer IS NOT NULL",
                &agents,
            ),
            conn.query(
                "SELECT digest FROM components WHERE digest = ANY ($1)",
                &digests,
            ),
        )?;
        let existing: std::collections::HashMap<String, String> = runs
            .iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .collect::<Result<_, tokio_postgres::Error>>()?;
        let pointers: std::collections::HashMap<String, String> = pointers
            .iter()
            .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
            .collect::<Result<_, tokio_postgres::Error>>()?;
        let mut blobs = std::collections::HashMap::new();
        for s in submissions {
            if let Some(digest) = values::blobs::referred(s.input)
                && pointers.contains_key(s.agent)
                && !blobs.contains_key(&digest)
            {
                let bytes = super::blobs::resolved(conn, s.input).await?.into_owned();
                blobs.insert(digest, bytes);
            }
        }
        let mut same_input = vec![None; submissions.len()];
        if !existing.is_empty() {
            let mut places: Vec<i64> = Vec::new();
            let (mut found_ids, mut found_inputs): (Vec<&str>, Vec<&[u8]>) =
                (Vec::new(), Vec::new());
            for (at, s) in submissions.iter().enumerate() {
                if existing.contains_key(s.run_id) {
                    places.push(i64::try_from(at).unwrap_or(i64::MAX));
                    found_ids.push(s.run_id);
                    found_inputs.push(s.input);
                }
            }
            // Compared by the server: the runs' inputs are not copied out.
            let rows = conn
                .query(
                    "SELECT c.at, i.input = c.input
                     FROM unnest($1::int8[], $2::text[], $3::bytea[]) AS c(at, id, input)
                     JOIN run_inputs i ON i.run_id = c.id",
                    &[&places, &found_ids, &found_inputs],
                )
                .await?;
            for row in &rows {
                let at: i64 = row.try_get(0)?;
                if let Some(slot) = usize::try_from(at)
                    .ok()
                    .and_then(|at| same_input.get_mut(at))
                {
                    *slot = Some(row.try_get(1)?);
                }
            }
        }
        Ok(BatchFacts {
            existing,
            same_input,
            pointers,
            blobs,
            components: components
                .iter()
                .map(|row| row.try_get(0))
                .collect::<Result<_, tokio_postgres::Error>>()?,
        })
    }
}

/// A new run a batch creates: the member that creates it, its priority and key, and
/// the authority it ends the batch with (a later member may replace it).
struct NewRun {
    at: usize,
    priority: i32,
    flow_key: Option<String>,
    authority: usize,
}

/// What a batch writes, and each member's answer but its record.
#[derive(Default)]
struct BatchPlan {
    answers: Vec<Result<(String, bool), StoreError>>,
    created: Vec<NewRun>,
    /// Existing runs whose authority a member replaces: the run and the member whose
    /// authority it ends the batch with.
    authorities: Vec<(String, usize)>,
    /// Failed runs submitted again: set back to running, their outcome cleared.
    resumed: Vec<String>,
}

/// What a run named in a batch is, as the members before the current one left it.
enum Seen {
    /// It existed before the batch, with this status.
    Existing(String),
    /// The member at this place created it.
    Created(usize),
}

/// Decides each member's answer in order, as a lone [`submit`] of it would, after the
/// members before it: the same checks in the same order.
fn plan_batch(
    submissions: &[Submission<'_>],
    facts: &BatchFacts,
    payloads: Payloads<'_>,
) -> BatchPlan {
    use std::collections::HashMap;
    let mut plan = BatchPlan::default();
    let mut seen: HashMap<&str, Seen> = facts
        .existing
        .iter()
        .map(|(id, status)| (id.as_str(), Seen::Existing(status.clone())))
        .collect();
    let mut replaced: HashMap<&str, usize> = HashMap::new();
    for (at, submission) in submissions.iter().enumerate() {
        let run_id = submission.run_id;
        let answer = (|| {
            let priority = match i32::try_from(submission.priority) {
                Ok(priority) if submission.priority <= MAX_PRIORITY => priority,
                _ => {
                    return Err(StoreError::PriorityRefused {
                        priority: submission.priority,
                    });
                }
            };
            let exists = seen.contains_key(run_id);
            let flow_key = match facts.pointers.get(submission.agent) {
                None => None,
                Some(pointer) => match key_of(pointer, facts.input(submission.input), payloads)? {
                    Some(key) => Some(key),
                    None if exists => None,
                    None => {
                        return Err(StoreError::FlowKeyMissing {
                            run_id: run_id.to_owned(),
                            deployment: submission.agent.to_owned(),
                            pointer: pointer.clone(),
                        });
                    }
                },
            };
            let same = match seen.get_mut(run_id) {
                None => {
                    if !facts.components.contains(submission.digest) {
                        return Err(StoreError::UnknownComponent {
                            digest: submission.digest.to_owned(),
                        });
                    }
                    seen.insert(run_id, Seen::Created(plan.created.len()));
                    plan.created.push(NewRun {
                        at,
                        priority,
                        flow_key,
                        authority: at,
                    });
                    return Ok(true);
                }
                Some(Seen::Created(new)) => {
                    submissions[plan.created[*new].at].input == submission.input
                }
                Some(Seen::Existing(_)) => facts.same_input[at] == Some(true),
            };
            if !same {
                return Err(StoreError::InputMismatch {
                    run_id: run_id.to_owned(),
                });
            }
            match seen.get_mut(run_id) {
                Some(Seen::Created(new)) if submission.replace_authority => {
                    plan.created[*new].authority = at;
                }
                Some(Seen::Existing(status)) => {
                    if submission.replace_authority {
                        replaced.insert(run_id, at);
                    }
                    if status == RunStatus::Failed.as_str() {
                        plan.resumed.push(run_id.to_owned());
                        *status = RunStatus::Running.as_str().to_owned();
                    }
                }
                Some(Seen::Created(_)) | None => {}
            }
            Ok(false)
        })();
        plan.answers
            .push(answer.map(|created| (run_id.to_owned(), created)));
    }
    plan.authorities = replaced
        .into_iter()
        .map(|(id, at)| (id.to_owned(), at))
        .collect();
    plan.authorities.sort_unstable();
    plan.resumed.sort_unstable();
    plan
}

/// Writes what `plan` decided and reads the records of every run answered, in one
/// round trip; `None` when a run decided new was created meanwhile by another
/// submitter: nothing was written, and the batch goes one run at a time.
async fn write_batch(
    conn: &Conn,
    submissions: &[Submission<'_>],
    plan: &BatchPlan,
) -> Result<Option<std::collections::HashMap<String, RunRecord>>, TxError> {
    let client = conn.client();
    let new = &plan.created;
    let ids: Vec<&str> = new.iter().map(|n| submissions[n.at].run_id).collect();
    let agents: Vec<&str> = new.iter().map(|n| submissions[n.at].agent).collect();
    let digests: Vec<&str> = new.iter().map(|n| submissions[n.at].digest).collect();
    let namespaces: Vec<&str> = new.iter().map(|n| submissions[n.at].namespace).collect();
    let priorities: Vec<i32> = new.iter().map(|n| n.priority).collect();
    let keys: Vec<Option<&str>> = new.iter().map(|n| n.flow_key.as_deref()).collect();
    let inputs: Vec<&[u8]> = new.iter().map(|n| submissions[n.at].input).collect();
    let authorities: Vec<&[u8]> = new
        .iter()
        .map(|n| submissions[n.authority].authority)
        .collect();
    let mut members: Vec<(&str, &str)> = namespaces
        .iter()
        .copied()
        .zip(digests.iter().copied())
        .collect();
    members.sort_unstable();
    members.dedup();
    let (member_namespaces, member_digests): (Vec<&str>, Vec<&str>) = members.into_iter().unzip();
    let replaced_ids: Vec<&str> = plan.authorities.iter().map(|(id, _)| id.as_str()).collect();
    let replaced: Vec<&[u8]> = plan
        .authorities
        .iter()
        .map(|(_, at)| submissions[*at].authority)
        .collect();
    let mut answered: Vec<&str> = plan
        .answers
        .iter()
        .filter_map(|a| a.as_ref().ok().map(|(id, _)| id.as_str()))
        .collect();
    answered.sort_unstable();
    answered.dedup();
    let status = RunStatus::Queued.as_str();
    let running = RunStatus::Running.as_str();
    let now = conn.now;

    const INSERT_RUNS: &str =
        "INSERT INTO runs (run_id, agent, digest, namespace, status, created, updated,
                           priority, flow_key, version)
         SELECT c.id, c.agent, c.digest, c.namespace, $7, $8, $8, c.priority, c.key,
                (SELECT max(d.version) FROM deployments d
                 WHERE d.name = c.agent AND d.digest = c.digest)
         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int4[], $6::text[])
              WITH ORDINALITY AS c(id, agent, digest, namespace, priority, key, n)
         ORDER BY c.n
         ON CONFLICT (run_id) DO NOTHING";
    const INSERT_INPUTS: &str = "INSERT INTO run_inputs (run_id, input, authority)
         SELECT * FROM unnest($1::text[], $2::bytea[], $3::bytea[])";
    const ADD_MEMBERS: &str = "INSERT INTO namespace_members (namespace, digest, how, at)
         SELECT m.namespace, m.digest, 'run', $3
         FROM unnest($1::text[], $2::text[]) AS m(namespace, digest)
         ON CONFLICT (namespace, digest) DO NOTHING";
    const REPLACE_AUTHORITIES: &str = "UPDATE run_inputs SET authority = u.authority
         FROM unnest($1::text[], $2::bytea[]) AS u(id, authority) WHERE run_id = u.id";
    const RESUME: &str = "UPDATE runs SET status = $2, updated = $3 WHERE run_id = ANY ($1)";
    const CLEAR_OUTCOMES: &str = "DELETE FROM run_outcomes WHERE run_id = ANY ($1)";
    let records_sql = select_records!("WHERE r.run_id = ANY ($1)");

    // Prepared first (round trips only on a connection's first use of each), so that
    // the writes below go out together, in this order.
    let (insert_runs, insert_inputs, add_members, replace, resume, clear, records) = conn
        .call(async {
            tokio::try_join!(
                client.prepare_cached(INSERT_RUNS),
                client.prepare_cached(INSERT_INPUTS),
                client.prepare_cached(ADD_MEMBERS),
                client.prepare_cached(REPLACE_AUTHORITIES),
                client.prepare_cached(RESUME),
                client.prepare_cached(CLEAR_OUTCOMES),
                client.prepare_cached(records_sql),
            )
        })
        .await?;
    let some = !ids.is_empty();
    let savepoint = async {
        if some {
            client.batch_execute("SAVEPOINT submit_many").await
        } else {
            Ok(())
        }
    };
    let runs = async {
        if some {
            client
                .execute(
                    &insert_runs,
                    &[
                        &ids,
                        &agents,
                        &digests,
                        &namespaces,
                        &priorities,
                        &keys,
                        &status,
                        &now,
                    ],
                )
                .await
        } else {
            Ok(0)
        }
    };
    let inputs_written = async {
        if some {
            client
                .execute(&insert_inputs, &[&ids, &inputs, &authorities])
                .await
        } else {
            Ok(0)
        }
    };
    let members_written = async {
        if some {
            client
                .execute(&add_members, &[&member_namespaces, &member_digests, &now])
                .await
        } else {
            Ok(0)
        }
    };
    let replaced_written = async {
        if replaced_ids.is_empty() {
            Ok(0)
        } else {
            client.execute(&replace, &[&replaced_ids, &replaced]).await
        }
    };
    let resumed = async {
        if plan.resumed.is_empty() {
            Ok(0)
        } else {
            client
                .execute(&resume, &[&plan.resumed, &running, &now])
                .await
        }
    };
    let cleared = async {
        if plan.resumed.is_empty() {
            Ok(0)
        } else {
            client.execute(&clear, &[&plan.resumed]).await
        }
    };
    let read = async {
        if answered.is_empty() {
            Ok(Vec::new())
        } else {
            client.query(&records, &[&answered]).await
        }
    };
    // Each awaited in full, so that a failure of one leaves none of the others still
    // in flight when the savepoint is rolled back to.
    let (saved, runs, inputs_written, members_written, replaced_written, resumed, cleared, read) =
        conn.call(async {
            Ok::<_, tokio_postgres::Error>(tokio::join!(
                savepoint,
                runs,
                inputs_written,
                members_written,
                replaced_written,
                resumed,
                cleared,
                read
            ))
        })
        .await?;
    saved?;
    if runs? != ids.len() as u64 {
        conn.call(client.batch_execute("ROLLBACK TO SAVEPOINT submit_many"))
            .await?;
        return Ok(None);
    }
    inputs_written?;
    members_written?;
    replaced_written?;
    resumed?;
    cleared?;
    let records = read?
        .iter()
        .map(|row| {
            let record = record(row)?;
            Ok((record.run_id.clone(), record))
        })
        .collect::<Result<_, TxError>>()?;
    Ok(Some(records))
}

/// Each member's answer, with the record of its run.
fn answer_batch(
    plan: BatchPlan,
    mut records: std::collections::HashMap<String, RunRecord>,
) -> Result<Vec<Result<Submitted, StoreError>>, TxError> {
    // Members of one run share its record; the last one answered takes it.
    let mut left: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (id, _) in plan.answers.iter().flatten() {
        *left.entry(id.clone()).or_default() += 1;
    }
    plan.answers
        .into_iter()
        .map(|answer| {
            let (run_id, created) = match answer {
                Ok(answered) => answered,
                Err(e) => return Ok(Err(e)),
            };
            let count = left.get_mut(&run_id).map_or(0, |c| {
                *c -= 1;
                *c
            });
            let record = if count == 0 {
                records.remove(&run_id)
            } else {
                records.get(&run_id).cloned()
            };
            let record = record.ok_or_else(|| unknown_run(&run_id))?;
            Ok(Ok(Submitted { record, created }))
        })
        .collect()
}

/// Creates the run as queued if it is new, or finds it. Two submitters of one new run
/// meet at the primary key: the second waits for the first, then finds its run.
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
                 (run_id, agent, digest, namespace, status, created, updated, priority, flow_key,
                  version)
             VALUES ($1, $2, $3, $4, $5, $6, $6, $7, $8,
                     (SELECT max(version) FROM deployments WHERE name = $2 AND digest = $3))
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
        let event = NewEvent::new(
            EventKind::Cancelled,
            serde_json::json!({ "at_once": false }),
        );
        super::events::record(conn, run_id, &[event]).await?;
        super::children::cancel_descendants(conn, run_id).await?;
        return Ok(Cancelled::Requested { lease });
    }
    let event = NewEvent::new(EventKind::Cancelled, serde_json::json!({ "at_once": true }));
    super::events::record(conn, run_id, &[event]).await?;
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
    // Whoever cancelled it (its worker, an operator, an ancestor's cancellation), the
    // run ended here.
    let event = NewEvent::new(
        EventKind::Finished,
        serde_json::json!({ "status": RunStatus::Cancelled.as_str() }),
    );
    super::events::record(conn, run_id, &[event]).await?;
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

/// The run's input as kept (sealed, or a blob's reference), if the run exists.
pub(super) async fn input(conn: &Conn, run_id: &str) -> Result<Option<Vec<u8>>, TxError> {
    let row = conn
        .query_opt("SELECT input FROM run_inputs WHERE run_id = $1", &[&run_id])
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
            "SELECT step, state FROM progress WHERE run_id = $1 AND state IS NOT NULL
             ORDER BY lease DESC, tick DESC LIMIT 1",
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

/// Saves the run's checkpoint at `position`; its history keeps the ones before. The
/// caller checked the fence, so the run exists.
pub(super) async fn save_checkpoint(
    conn: &Conn,
    run_id: &str,
    checkpoint: &Checkpoint,
    position: Position,
) -> Result<(), TxError> {
    conn.execute(
        "INSERT INTO progress (run_id, lease, tick, step, state, updated)
         VALUES ($1, $2, $3, $4, $5, $6)
         ON CONFLICT (run_id, lease, tick) DO UPDATE
         SET step = excluded.step, state = excluded.state, updated = excluded.updated",
        &[
            &run_id,
            &to_sql_int(position.lease)?,
            &to_sql_int(position.tick)?,
            &to_sql_int(checkpoint.step)?,
            &checkpoint.state,
            &conn.now,
        ],
    )
    .await?;
    Ok(())
}

/// Collects the states of the run's large checkpoints but its last
/// [`HISTORY_KEEP_LARGE`], keeping their rows (their place in the history).
pub(super) async fn drop_large_states(conn: &Conn, run_id: &str) -> Result<u64, TxError> {
    let dropped = conn
        .execute(
            "UPDATE progress SET state = NULL
             WHERE run_id = $1 AND substr(state, 1, 4) = '\\x00494201'::bytea
               AND (lease, tick) <=
                 (SELECT lease, tick FROM progress
                  WHERE run_id = $1 AND substr(state, 1, 4) = '\\x00494201'::bytea
                  ORDER BY lease DESC, tick DESC LIMIT 1 OFFSET $2)",
            &[&run_id, &to_sql_int(HISTORY_KEEP_LARGE)?],
        )
        .await?;
    Ok(dropped)
}

/// Deletes the run's checkpoints but its last [`HISTORY_KEEP`], marking its history
/// cut when it deleted any; how many it deleted.
pub(super) async fn trim_history(conn: &Conn, run_id: &str) -> Result<u64, TxError> {
    let deleted = conn
        .execute(
            "DELETE FROM progress WHERE run_id = $1 AND (lease, tick) <=
                 (SELECT lease, tick FROM progress WHERE run_id = $1
                  ORDER BY lease DESC, tick DESC LIMIT 1 OFFSET $2)",
            &[&run_id, &to_sql_int(HISTORY_KEEP)?],
        )
        .await?;
    if deleted > 0 {
        conn.execute(
            "UPDATE runs SET history_cut = true WHERE run_id = $1 AND NOT history_cut",
            &[&run_id],
        )
        .await?;
    }
    Ok(deleted)
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
        version: row
            .try_get::<_, Option<i64>>(29)?
            .and_then(|v| u64::try_from(v).ok()),
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
