//! A run's step history on SQLite, and forks made from it (`store/history.rs`).
//!
//! `steps` has no index by run (every step would pay for one), so reading a run's
//! steps scans them, as `idem show` does: history and forks are an operator's
//! questions, not a step's.
//!
//! A run's checkpoints live in three places. Its last one is in `latest_progress`,
//! updated in place at every save: what a resumed run loads. Its history is in
//! `progress`, clustered by run, but a save does not insert there: written one at a
//! time, the rows of many runs stepping at once cost a page each per step (the journal,
//! "session 27", counted the WAL's frames), and a statement each. The connection gathers
//! them in memory instead ([`keep`]), exactly as committed (a save that does not commit
//! takes its row back: `thread::on_rollback`), and writes a run's gathered rows to
//! `progress` together: when they reach [`GATHER_ROWS`] or [`GATHER_BYTES`], when the
//! run's lease ends, when a poll finds the lease they were saved under gone, and when the
//! store closes. A process that dies loses what it gathered, at most one batch a run: a
//! fork then starts from an earlier checkpoint and replays the steps between from their
//! copied results, which is correct, only longer. A state kept as a blob is written at
//! once (gc collects a blob no database row refers to). Readers on this connection see
//! the three together; another process sees the history up to the last batch written,
//! and the last checkpoint.

use std::collections::HashMap;
use std::rc::Rc;
use std::sync::{LazyLock, Mutex, PoisonError};

use rusqlite::{Connection, OptionalExtension, params};

use super::runs::{self, unknown_run};
use super::{TxError, to_sql_int, u32_column, u64_column};
use crate::store::values::blobs;
use crate::store::{
    Checkpoint, ForkRefusal, ForkRequest, Forked, HistoryCheckpoint, HistoryStep, Millis, Payloads,
    Position, RunHistory, SavedCheckpoint, StoreError, Submission, check_fork_exports, fork_events,
    fork_key, fork_namespace, plan_fork, steps_before,
};

/// A run's gathered checkpoints are written once there are this many: the rows of one
/// run, written together, share their pages.
const GATHER_ROWS: usize = 32;

/// ... or once their states come to this many bytes: what a process holds for a run
/// stays small however large its states.
const GATHER_BYTES: usize = 32 << 10;

/// A checkpoint as a save keeps it, in the store's integers: the run's last one, and one
/// gathered for its history until it is written.
#[derive(Debug, Clone)]
pub(super) struct Saved {
    pub(super) lease: i64,
    pub(super) tick: i64,
    pub(super) step: i64,
    pub(super) state: Vec<u8>,
    pub(super) updated: Millis,
}

impl Saved {
    /// `checkpoint`, saved at `position` at `now`.
    pub(super) fn new(
        checkpoint: &Checkpoint,
        position: Position,
        now: Millis,
    ) -> Result<Saved, TxError> {
        Ok(Saved {
            lease: to_sql_int(position.lease)?,
            tick: to_sql_int(position.tick)?,
            step: to_sql_int(checkpoint.step)?,
            state: checkpoint.state.clone(),
            updated: now,
        })
    }

    fn position(&self) -> Position {
        position(self.lease, self.tick)
    }

    /// The statement parameters `(run_id, lease, tick, step, state, updated)`, the
    /// order every statement writing a checkpoint takes them in.
    pub(super) fn params<'a>(&'a self, run_id: &'a &str) -> [&'a dyn rusqlite::ToSql; 6] {
        [
            run_id,
            &self.lease,
            &self.tick,
            &self.step,
            &self.state,
            &self.updated,
        ]
    }
}

/// Each connection's gathered checkpoints, by run, in the order saved; a connection is
/// known by its address, where it stays from its store's opening to its closing (it
/// lives in its database thread's state), and its entry goes when it closes
/// ([`write_on_close`]). Held only for a moment, by whoever holds that connection.
type ByRun = HashMap<String, Run>;

/// What a connection gathered for one run: the rows not written yet, and how many full
/// batches it wrote (every [`TRIM_EVERY`]th also collects the run's oldest).
#[derive(Debug, Default)]
struct Run {
    rows: Vec<Saved>,
    batches: u32,
}
static GATHERED: LazyLock<Mutex<HashMap<usize, ByRun>>> = LazyLock::new(Mutex::default);

fn connection_key(conn: &Connection) -> usize {
    std::ptr::from_ref(conn) as usize
}

fn with_gathered<T>(key: usize, f: impl FnOnce(&mut ByRun) -> T) -> T {
    let mut all = GATHERED.lock().unwrap_or_else(PoisonError::into_inner);
    f(all.entry(key).or_default())
}

/// What the connection gathered for the run, copied.
fn gathered_of(conn: &Connection, run_id: &str) -> Vec<Saved> {
    let all = GATHERED.lock().unwrap_or_else(PoisonError::into_inner);
    all.get(&connection_key(conn))
        .and_then(|runs| runs.get(run_id))
        .map(|run| run.rows.clone())
        .unwrap_or_default()
}

/// Adds a checkpoint the run saved to its history: gathered, or written with what was
/// gathered before it when the batch is full or its state is a blob's reference.
pub(super) fn keep(conn: &Connection, run_id: &str, row: Saved) -> Result<(), TxError> {
    if blobs::referred(&row.state).is_some() {
        write_gathered(conn, run_id)?;
        conn.prepare_cached(
            "INSERT INTO progress (run_id, lease, tick, step, state, updated)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (run_id, lease, tick) DO UPDATE
             SET step = excluded.step, state = excluded.state, updated = excluded.updated",
        )?
        .execute(row.params(&run_id))?;
        runs::trim_history(conn, run_id)?;
        return runs::drop_large_states(conn, run_id);
    }
    let key = connection_key(conn);
    let (lease, tick) = (row.lease, row.tick);
    let full = with_gathered(key, |runs| {
        let rows = match runs.get_mut(run_id) {
            Some(run) => &mut run.rows,
            None => &mut runs.entry(run_id.to_owned()).or_default().rows,
        };
        rows.push(row);
        rows.len() >= GATHER_ROWS
            || rows.iter().map(|r| r.state.len()).sum::<usize>() >= GATHER_BYTES
    });
    let run = run_id.to_owned();
    super::thread::on_rollback(move || {
        with_gathered(key, |runs| {
            if let Some(run) = runs.get_mut(&run) {
                run.rows.retain(|r| (r.lease, r.tick) != (lease, tick));
            }
        });
    });
    if full {
        write(conn, run_id, false)?;
    }
    Ok(())
}

/// Writes the run's gathered checkpoints to its history (none if the run is gone), and
/// collects those past [`HISTORY_KEEP`](crate::store::HISTORY_KEEP); forgets the run:
/// its lease ends, or its history is read whole (a fork).
pub(super) fn write_gathered(conn: &Connection, run_id: &str) -> Result<(), TxError> {
    write(conn, run_id, true)
}

/// Writes the run's gathered checkpoints: all of them and forgetting the run when it
/// `ends`, else a full batch, collecting the run's oldest every [`TRIM_EVERY`] batches.
fn write(conn: &Connection, run_id: &str, ends: bool) -> Result<(), TxError> {
    let key = connection_key(conn);
    let taken = with_gathered(key, |runs| {
        if ends {
            let run = runs.remove(run_id)?;
            let wrote = run.batches > 0;
            let trim = wrote || !run.rows.is_empty();
            Some((run.rows, trim))
        } else {
            let run = runs.get_mut(run_id)?;
            run.batches += 1;
            Some((std::mem::take(&mut run.rows), run.batches % TRIM_EVERY == 0))
        }
    });
    let Some((rows, trim)) = taken else {
        return Ok(());
    };
    let rows = Rc::new(rows);
    let (run, taken) = (run_id.to_owned(), Rc::clone(&rows));
    // Undone after whatever was gathered later in the transaction: back in front.
    super::thread::on_rollback(move || {
        with_gathered(key, |runs| {
            let run = runs.entry(run).or_default();
            let later = std::mem::take(&mut run.rows);
            run.rows = Rc::try_unwrap(taken).unwrap_or_else(|rows| (*rows).clone());
            run.rows.extend(later);
        });
    });
    if rows.len() == GATHER_ROWS {
        // A full batch, the common case: one statement for all its rows.
        let mut values: Vec<&dyn rusqlite::ToSql> = Vec::with_capacity(1 + 5 * GATHER_ROWS);
        values.push(&run_id);
        for row in rows.iter() {
            values.extend([
                &row.lease as &dyn rusqlite::ToSql,
                &row.tick,
                &row.step,
                &row.state,
                &row.updated,
            ]);
        }
        conn.prepare_cached(&FULL_BATCH)?
            .execute(values.as_slice())?;
    } else {
        let mut insert = conn.prepare_cached(
            "INSERT INTO progress (run_id, lease, tick, step, state, updated)
             SELECT ?1, ?2, ?3, ?4, ?5, ?6 WHERE EXISTS (SELECT 1 FROM runs WHERE run_id = ?1)
             ON CONFLICT (run_id, lease, tick) DO NOTHING",
        )?;
        for row in rows.iter() {
            insert.execute(row.params(&run_id))?;
        }
    }
    if trim {
        runs::trim_history(conn, run_id)?;
    }
    Ok(())
}

/// The statement that writes a full batch of a run's gathered checkpoints: `?1` the
/// run, then five values a row; nothing if the run is gone.
static FULL_BATCH: LazyLock<String> = LazyLock::new(|| {
    let rows: Vec<String> = (0..GATHER_ROWS)
        .map(|i| {
            let p = 2 + 5 * i;
            format!("(?{}, ?{}, ?{}, ?{}, ?{})", p, p + 1, p + 2, p + 3, p + 4)
        })
        .collect();
    format!(
        "INSERT INTO progress (run_id, lease, tick, step, state, updated)
         SELECT ?1, column1, column2, column3, column4, column5 FROM (VALUES {})
         WHERE EXISTS (SELECT 1 FROM runs WHERE run_id = ?1)
         ON CONFLICT (run_id, lease, tick) DO NOTHING",
        rows.join(", ")
    )
});

/// Full batches of a run between two collections of its checkpoints past
/// [`HISTORY_KEEP`](crate::store::HISTORY_KEEP): collecting walks the run's last
/// thousand rows, so it is paid once in this many batches, and a running run's history
/// passes its bound by at most this many batches (256 checkpoints); its lease's end
/// brings it back.
const TRIM_EVERY: u32 = 8;

/// Writes the gathered checkpoints of the runs this process no longer leases under the
/// lease they were saved under (lost, taken over, ended elsewhere), or of every run.
pub(super) fn write_all_gathered(conn: &Connection, only_unleased: bool) -> Result<(), TxError> {
    let runs: Vec<(String, i64)> = {
        let all = GATHERED.lock().unwrap_or_else(PoisonError::into_inner);
        match all.get(&connection_key(conn)) {
            Some(runs) => runs
                .iter()
                .filter_map(|(id, run)| Some((id.clone(), run.rows.last()?.lease)))
                .collect(),
            None => return Ok(()),
        }
    };
    for (run_id, lease) in &runs {
        let held = only_unleased
            && conn
                .prepare_cached(
                    "SELECT EXISTS (SELECT 1 FROM runs WHERE run_id = ?1 AND lease_token = ?2
                                    AND lease_holder IS NOT NULL)",
                )?
                .query_row(params![run_id, lease], |row| row.get::<_, bool>(0))?;
        if !held {
            write_gathered(conn, run_id)?;
        }
    }
    Ok(())
}

/// Writes every gathered checkpoint before the connection closes, in a transaction of
/// its own, and forgets the connection; what cannot be written (a full disk, a lock
/// held past the busy timeout) is lost as a crash would lose it.
pub(super) fn write_on_close(conn: &Connection) {
    let key = connection_key(conn);
    let any = with_gathered(key, |runs| runs.values().any(|run| !run.rows.is_empty()));
    if any && conn.execute_batch("BEGIN IMMEDIATE").is_ok() {
        let done = match write_all_gathered(conn, false) {
            Ok(()) => conn.execute_batch("COMMIT").is_ok(),
            Err(_) => false,
        };
        if !done {
            let _ = conn.execute_batch("ROLLBACK");
        }
    }
    GATHERED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&key);
}

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

/// The run's kept checkpoints, in order, without their states: its history, what this
/// connection gathered, and its last (module docs).
fn checkpoints(conn: &Connection, run_id: &str) -> Result<Vec<HistoryCheckpoint>, TxError> {
    let mut rows: Vec<(HistoryCheckpoint, u8)> = conn
        .prepare_cached(
            "SELECT lease, tick, step, coalesce(length(state), 0), updated, state IS NOT NULL,
                    0
             FROM progress WHERE run_id = ?1
             UNION ALL
             SELECT lease, tick, step, length(state), updated, 1, 2
             FROM latest_progress WHERE run_id = ?1",
        )?
        .query_map([run_id], |row| {
            Ok((
                HistoryCheckpoint {
                    position: position(row.get(0)?, row.get(1)?),
                    step: u64_column(row, 2)?,
                    bytes: u64_column(row, 3)?,
                    saved_at: row.get(4)?,
                    kept: row.get(5)?,
                    after: 0,
                },
                row.get(6)?,
            ))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    rows.extend(gathered_of(conn, run_id).into_iter().map(|g| {
        let checkpoint = HistoryCheckpoint {
            position: g.position(),
            step: u64::try_from(g.step).unwrap_or(0),
            bytes: g.state.len() as u64,
            saved_at: g.updated,
            kept: true,
            after: 0,
        };
        (checkpoint, 1)
    }));
    // A checkpoint may be in two places (the last one, once written); the history's
    // row, first, is the one that says whether its state is still kept.
    rows.sort_by_key(|(c, source)| (c.position, *source));
    rows.dedup_by_key(|(c, _)| c.position);
    Ok(rows.into_iter().map(|(c, _)| c).collect())
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
    let stored = conn
        .prepare_cached(
            "SELECT lease, tick, step, state, updated FROM (
                 SELECT lease, tick, step, state, updated FROM progress
                 WHERE run_id = ?1 AND (lease, tick) < (?2, ?3) AND state IS NOT NULL
                 UNION ALL
                 SELECT lease, tick, step, state, updated FROM latest_progress
                 WHERE run_id = ?1 AND (lease, tick) < (?2, ?3))
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
    let gathered = gathered_of(conn, run_id)
        .into_iter()
        .filter(|g| (g.lease, g.tick) < (lease, tick))
        .max_by_key(|g| (g.lease, g.tick))
        .map(|g| SavedCheckpoint {
            position: g.position(),
            checkpoint: crate::store::Checkpoint {
                step: u64::try_from(g.step).unwrap_or(0),
                state: g.state,
            },
            saved_at: g.updated,
        });
    Ok(match (stored, gathered) {
        (Some(s), Some(g)) => Some(if g.position > s.position { g } else { s }),
        (s, g) => s.or(g),
    })
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
    write_gathered(conn, run_id)?;
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
        // The fork's first checkpoint is its last as well. The original's may be only
        // its last, written by another process that has not written its history yet.
        conn.prepare_cached(
            "INSERT INTO progress (run_id, lease, tick, step, state, updated)
             SELECT ?1, 0, ?5, step, state, ?6 FROM (
                 SELECT step, state FROM progress
                 WHERE run_id = ?2 AND lease = ?3 AND tick = ?4 AND state IS NOT NULL
                 UNION ALL
                 SELECT step, state FROM latest_progress
                 WHERE run_id = ?2 AND lease = ?3 AND tick = ?4)
             LIMIT 1",
        )?
        .execute(params![
            req.new_run_id,
            run_id,
            to_sql_int(at.lease)?,
            to_sql_int(at.tick)?,
            to_sql_int(2 * after + 1)?,
            now
        ])?;
        conn.prepare_cached(
            "INSERT INTO latest_progress (run_id, lease, tick, step, state, updated)
             SELECT run_id, lease, tick, step, state, updated FROM progress WHERE run_id = ?1",
        )?
        .execute([req.new_run_id])?;
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
