//! Retention on SQLite: the statements of `OperatorStore::gc`, each run in a small read or
//! write of the database thread so that a worker's steps go on between them.
//!
//! `steps` has no index by run (a step's transaction would pay for it), so gc walks
//! the keys in order, a chunk at a time: a chunk is read first (outside any write) and
//! only a chunk with something to delete is written, under the write lock for the few
//! milliseconds its rows take. Runs are walked by rowid the same way. Every write
//! judges its rows again under the lock: a run resubmitted meanwhile is live again and
//! keeps everything.

use rusqlite::{Connection, named_params};

use super::{TxError, to_sql_int, u64_column};
use crate::store::rules::{GC_BATCH, GC_RUN_TABLES, gc_cutoffs, gc_statuses, history_cutoff};
use crate::store::{GcReport, GcRequest, Millis};

/// What one gc collects, fixed when it starts.
#[derive(Debug, Clone)]
pub(super) struct Cut {
    /// The store's time when gc started: a claim whose lease ran out before it is
    /// nobody's.
    now: Millis,
    runs_before: Millis,
    keys_before: Millis,
    /// `r.status IN (...)`: the statuses counted as finished.
    finished_status: String,
    /// Finished runs that stay lose all but their last checkpoint if they finished
    /// before this time.
    pub(super) history_before: Option<Millis>,
}

impl Cut {
    pub(super) fn new(now: Millis, req: &GcRequest) -> Cut {
        let (runs_before, keys_before) = gc_cutoffs(now, req);
        let names: Vec<String> = gc_statuses(req)
            .iter()
            .map(|status| format!("'{}'", status.as_str()))
            .collect();
        Cut {
            now,
            runs_before,
            keys_before,
            finished_status: format!("r.status IN ({})", names.join(", ")),
            history_before: history_cutoff(now, req),
        }
    }

    /// A report with nothing counted yet, naming the cut.
    pub(super) fn report(&self) -> GcReport {
        GcReport {
            runs_before: self.runs_before,
            keys_before: self.keys_before,
            ..GcReport::default()
        }
    }

    /// Whether run `r` is one gc collects (uses `:runs_before`): finished before the
    /// cut, and not the child of a parent that may still join it.
    fn collected_run(&self) -> String {
        format!(
            "({} AND r.updated < :runs_before
              AND NOT EXISTS (SELECT 1 FROM runs pr WHERE pr.run_id = r.parent
                              AND pr.status NOT IN ('completed', 'cancelled')))",
            self.finished_status
        )
    }

    /// Whether step row `s` may go (uses `:now`, `:keys_before`, `:runs_before`): out
    /// of the dedupe window, not parked, nobody's live claim, and its run gone or
    /// collected.
    fn collected_step(&self) -> String {
        format!(
            "coalesce(s.committed_at, s.claimed_at) < :keys_before
             AND s.parked IS NULL
             AND (s.holder IS NULL OR s.lease_expires <= :now)
             AND NOT EXISTS (SELECT 1 FROM runs r
                             WHERE r.run_id = s.run_id AND NOT {})",
            self.collected_run()
        )
    }
}

/// One chunk of keys, as a read found it.
#[derive(Debug)]
pub(super) struct StepChunk {
    /// The chunk's last key: the next chunk starts after it.
    pub(super) last: String,
    /// Committed keys that may go.
    pub(super) results: u64,
    /// Claims never committed that may go.
    pub(super) claims: u64,
}

/// The chunk of keys after `after` (up to [`GC_BATCH`] keys) and what in it may go;
/// `None` past the last key.
pub(super) fn scan_steps(
    conn: &Connection,
    cut: &Cut,
    after: &str,
) -> Result<Option<StepChunk>, TxError> {
    let last: Option<String> = conn
        .prepare_cached(
            "SELECT max(key) FROM (SELECT key FROM steps WHERE key > ?1 ORDER BY key LIMIT ?2)",
        )?
        .query_row(
            rusqlite::params![after, to_sql_int(GC_BATCH as u64)?],
            |row| row.get(0),
        )?;
    let Some(last) = last else {
        return Ok(None);
    };
    let (results, claims, _) = count_steps(conn, cut, after, &last)?;
    Ok(Some(StepChunk {
        last,
        results,
        claims,
    }))
}

/// Committed keys and claims in `(after, last]` that may go, and their greatest token.
fn count_steps(
    conn: &Connection,
    cut: &Cut,
    after: &str,
    last: &str,
) -> Result<(u64, u64, u64), TxError> {
    let sql = format!(
        "SELECT coalesce(sum(s.result IS NOT NULL), 0), coalesce(sum(s.result IS NULL), 0),
                coalesce(max(s.token), 0)
         FROM steps s
         WHERE s.key > :after AND s.key <= :last AND {}",
        cut.collected_step()
    );
    let counts = conn.prepare_cached(&sql)?.query_row(
        named_params! {
            ":after": after, ":last": last, ":now": cut.now,
            ":keys_before": cut.keys_before, ":runs_before": cut.runs_before,
        },
        |row| {
            Ok((
                u64_column(row, 0)?,
                u64_column(row, 1)?,
                u64_column(row, 2)?,
            ))
        },
    )?;
    Ok(counts)
}

/// Deletes what may go in `(after, last]`, judged again under the write lock, after
/// raising the retired mark to its greatest token (`0006_retired.sql`); the committed
/// keys and claims it deleted.
pub(super) fn delete_steps(
    conn: &Connection,
    cut: &Cut,
    after: &str,
    last: &str,
) -> Result<(u64, u64), TxError> {
    let (results, claims, max_token) = count_steps(conn, cut, after, last)?;
    if results + claims == 0 {
        return Ok((0, 0));
    }
    conn.prepare_cached("UPDATE epoch SET retired = max(retired, ?1) WHERE id = 0")?
        .execute([to_sql_int(max_token)?])?;
    let sql = format!(
        "DELETE FROM steps AS s WHERE s.key > :after AND s.key <= :last AND {}",
        cut.collected_step()
    );
    let deleted = conn.prepare_cached(&sql)?.execute(named_params! {
        ":after": after, ":last": last, ":now": cut.now,
        ":keys_before": cut.keys_before, ":runs_before": cut.runs_before,
    })?;
    debug_assert_eq!(deleted as u64, results + claims);
    Ok((results, claims))
}

/// The runs gc collects after rowid `after`, up to [`GC_BATCH`], with their rowids.
pub(super) fn collected_runs(
    conn: &Connection,
    cut: &Cut,
    after: i64,
) -> Result<Vec<(i64, String)>, TxError> {
    let sql = format!(
        "SELECT r.rowid, r.run_id FROM runs r
         WHERE r.rowid > :after AND {}
         ORDER BY r.rowid LIMIT :limit",
        cut.collected_run()
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let rows = stmt.query_map(
        named_params! {
            ":after": after, ":runs_before": cut.runs_before,
            ":limit": to_sql_int(GC_BATCH as u64)?,
        },
        |row| Ok((row.get(0)?, row.get(1)?)),
    )?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Counts (`dry_run`) or deletes the runs `ids` that gc still collects, judged under
/// the write lock when deleting, with every row that hangs off them; adds them to
/// `report`.
pub(super) fn collect_runs(
    conn: &Connection,
    cut: &Cut,
    ids: &[String],
    dry_run: bool,
    report: &mut GcReport,
) -> Result<(), TxError> {
    let listed = serde_json::to_string(ids)
        .map_err(|e| TxError::Sql(rusqlite::Error::ToSqlConversionFailure(Box::new(e))))?;
    // The batch, narrowed to the runs still collected now.
    let sql = format!(
        "SELECT json_group_array(r.run_id) FROM runs r
         WHERE r.run_id IN (SELECT value FROM json_each(:ids)) AND {}",
        cut.collected_run()
    );
    let still: String = conn.prepare_cached(&sql)?.query_row(
        named_params! { ":ids": listed, ":runs_before": cut.runs_before },
        |row| row.get(0),
    )?;
    for (table, field) in GC_RUN_TABLES {
        let n = if dry_run {
            conn.prepare_cached(&format!(
                "SELECT count(*) FROM {table} WHERE run_id IN (SELECT value FROM json_each(?1))"
            ))?
            .query_row([&still], |row| u64_column(row, 0))?
        } else {
            conn.prepare_cached(&format!(
                "DELETE FROM {table} WHERE run_id IN (SELECT value FROM json_each(?1))"
            ))?
            .execute([&still])? as u64
        };
        *field(report) += n;
    }
    let runs = if dry_run {
        conn.prepare_cached("SELECT count(*) FROM json_each(?1)")?
            .query_row([&still], |row| u64_column(row, 0))?
    } else {
        for table in ["run_inputs", "run_outcomes"] {
            conn.prepare_cached(&format!(
                "DELETE FROM {table} WHERE run_id IN (SELECT value FROM json_each(?1))"
            ))?
            .execute([&still])?;
        }
        conn.prepare_cached("DELETE FROM runs WHERE run_id IN (SELECT value FROM json_each(?1))")?
            .execute([&still])? as u64
    };
    report.runs += runs;
    Ok(())
}

/// The finished runs after rowid `after` (up to [`GC_BATCH`] of them, with their
/// rowids) that finished before the history cut-off, each with how many of its
/// checkpoints gc collects: all but its last.
pub(super) fn history_runs(
    conn: &Connection,
    cut: &Cut,
    before: Millis,
    after: i64,
) -> Result<Vec<(i64, String, u64)>, TxError> {
    let sql = format!(
        "SELECT r.rowid, r.run_id,
                max((SELECT count(*) FROM progress p WHERE p.run_id = r.run_id) - 1, 0)
         FROM runs r
         WHERE r.rowid > :after AND {} AND r.updated < :before
         ORDER BY r.rowid LIMIT :limit",
        cut.finished_status
    );
    let mut stmt = conn.prepare_cached(&sql)?;
    let rows = stmt.query_map(
        named_params! {
            ":after": after, ":before": before, ":limit": to_sql_int(GC_BATCH as u64)?,
        },
        |row| Ok((row.get(0)?, row.get(1)?, u64_column(row, 2)?)),
    )?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Deletes all but the last checkpoint of the runs `ids` that are still finished
/// before the history cut-off (judged under the write lock), marking their history
/// cut; how many it deleted.
pub(super) fn collect_history(
    conn: &Connection,
    cut: &Cut,
    before: Millis,
    ids: &[String],
) -> Result<u64, TxError> {
    let still = format!(
        "EXISTS (SELECT 1 FROM runs r WHERE r.run_id = :run AND {} AND r.updated < :before)",
        cut.finished_status
    );
    let mut deleted = 0;
    for id in ids {
        let n = conn
            .prepare_cached(&format!(
                "DELETE FROM progress WHERE run_id = :run AND (lease, tick) <
                     (SELECT lease, tick FROM progress WHERE run_id = :run
                      ORDER BY lease DESC, tick DESC LIMIT 1)
                   AND {still}"
            ))?
            .execute(named_params! { ":run": id, ":before": before })?;
        if n > 0 {
            conn.prepare_cached("UPDATE runs SET history_cut = 1 WHERE run_id = ?1")?
                .execute([id])?;
        }
        deleted += n as u64;
    }
    Ok(deleted)
}

/// Components gc collects: stored before the runs cut-off, and used by no deployment
/// (current or past: the deployment history names them) and no run that stays.
fn collected_component(cut: &Cut) -> String {
    format!(
        "c.created < :runs_before
         AND NOT EXISTS (SELECT 1 FROM deployments d WHERE d.digest = c.digest)
         AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.digest = c.digest AND NOT {})",
        cut.collected_run()
    )
}

/// How many components gc collects.
pub(super) fn count_components(conn: &Connection, cut: &Cut) -> Result<u64, TxError> {
    let sql = format!(
        "SELECT count(*) FROM components c WHERE {}",
        collected_component(cut)
    );
    Ok(conn
        .prepare_cached(&sql)?
        .query_row(named_params! { ":runs_before": cut.runs_before }, |row| {
            u64_column(row, 0)
        })?)
}

/// Deletes up to a few components gc collects (they may be large); how many.
pub(super) fn delete_components(conn: &Connection, cut: &Cut) -> Result<u64, TxError> {
    let sql = format!(
        "DELETE FROM components WHERE digest IN
             (SELECT c.digest FROM components c WHERE {} LIMIT 16)",
        collected_component(cut)
    );
    Ok(conn
        .prepare_cached(&sql)?
        .execute(named_params! { ":runs_before": cut.runs_before })? as u64)
}
