//! Retention on PostgreSQL: the statements of `OperatorStore::gc`, in small transactions so
//! that workers' steps go on between them.
//!
//! The walk is SQLite's (`sqlite/gc.rs`): keys in order a chunk at a time, read first
//! and written only when something in the chunk goes; then runs by submission order.
//! A chunk's delete takes `steps` in SHARE ROW EXCLUSIVE mode: it waits for every
//! transaction that wrote to `steps` and holds off new ones until it commits, so no
//! claim can read the retired mark before this transaction raises it and insert a
//! deleted key after (`0003_retired.sql`). Readers are not held up.

use super::TxError;
use super::conn::Conn;
use super::{to_sql_int, u64_col};
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

    /// Whether run `r` is one gc collects; `runs_before` is its parameter. Not the
    /// child of a parent that may still join it.
    fn collected_run(&self, runs_before: &str) -> String {
        format!(
            "({} AND r.updated < {runs_before}::int8
              AND NOT EXISTS (SELECT 1 FROM runs pr WHERE pr.run_id = r.parent
                              AND pr.status NOT IN ('completed', 'cancelled')))",
            self.finished_status
        )
    }

    /// Whether step row `s` may go ($1 now, $2 keys cut, $3 runs cut): out of the
    /// dedupe window, not parked, nobody's live claim, and its run gone or collected.
    fn collected_step(&self) -> String {
        format!(
            "coalesce(s.committed_at, s.claimed_at) < $2::int8
             AND s.parked IS NULL
             AND (s.holder IS NULL OR s.lease_expires <= $1::int8)
             AND NOT EXISTS (SELECT 1 FROM runs r
                             WHERE r.run_id = s.run_id AND NOT {})",
            self.collected_run("$3")
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
pub(super) async fn scan_steps(
    conn: &Conn,
    cut: &Cut,
    after: &str,
) -> Result<Option<StepChunk>, TxError> {
    let limit = to_sql_int(GC_BATCH as u64)?;
    let row = conn
        .query_one(
            "SELECT max(key) FROM (SELECT key FROM steps WHERE key > $1 ORDER BY key LIMIT $2) k",
            &[&after, &limit],
        )
        .await?;
    let Some(last) = row.try_get::<_, Option<String>>(0)? else {
        return Ok(None);
    };
    let (results, claims, _) = count_steps(conn, cut, after, &last).await?;
    Ok(Some(StepChunk {
        last,
        results,
        claims,
    }))
}

/// Committed keys and claims in `(after, last]` that may go, and their greatest token.
async fn count_steps(
    conn: &Conn,
    cut: &Cut,
    after: &str,
    last: &str,
) -> Result<(u64, u64, u64), TxError> {
    let sql = format!(
        "SELECT count(*) FILTER (WHERE s.result IS NOT NULL),
                count(*) FILTER (WHERE s.result IS NULL),
                coalesce(max(s.token), 0)
         FROM steps s
         WHERE s.key > $4 AND s.key <= $5 AND {}",
        cut.collected_step()
    );
    let row = conn
        .query_one(
            &sql,
            &[&cut.now, &cut.keys_before, &cut.runs_before, &after, &last],
        )
        .await?;
    Ok((u64_col(&row, 0)?, u64_col(&row, 1)?, u64_col(&row, 2)?))
}

/// Deletes what may go in `(after, last]`, judged again under the lock on `steps`,
/// after raising the retired mark to its greatest token; the committed keys and claims
/// it deleted.
pub(super) async fn delete_steps(
    conn: &Conn,
    cut: &Cut,
    after: &str,
    last: &str,
) -> Result<(u64, u64), TxError> {
    conn.batch("LOCK TABLE steps IN SHARE ROW EXCLUSIVE MODE")
        .await?;
    let (results, claims, max_token) = count_steps(conn, cut, after, last).await?;
    if results + claims == 0 {
        return Ok((0, 0));
    }
    conn.execute(
        "UPDATE retired SET token = greatest(token, $1) WHERE id = 0",
        &[&to_sql_int(max_token)?],
    )
    .await?;
    let sql = format!(
        "DELETE FROM steps s WHERE s.key > $4 AND s.key <= $5 AND {}",
        cut.collected_step()
    );
    conn.execute(
        &sql,
        &[&cut.now, &cut.keys_before, &cut.runs_before, &after, &last],
    )
    .await?;
    Ok((results, claims))
}

/// The runs gc collects after submission number `after`, up to [`GC_BATCH`], with
/// their numbers.
pub(super) async fn collected_runs(
    conn: &Conn,
    cut: &Cut,
    after: i64,
) -> Result<Vec<(i64, String)>, TxError> {
    let sql = format!(
        "SELECT r.seq, r.run_id FROM runs r
         WHERE r.seq > $1 AND {}
         ORDER BY r.seq LIMIT $3",
        cut.collected_run("$2")
    );
    let limit = to_sql_int(GC_BATCH as u64)?;
    let rows = conn
        .query(&sql, &[&after, &cut.runs_before, &limit])
        .await?;
    rows.iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect()
}

/// The finished runs after submission number `after` (up to [`GC_BATCH`] of them, with
/// their numbers) that finished before the history cut-off, each with how many of its
/// checkpoints gc collects: all but its last.
pub(super) async fn history_runs(
    conn: &Conn,
    cut: &Cut,
    before: Millis,
    after: i64,
) -> Result<Vec<(i64, String, u64)>, TxError> {
    let sql = format!(
        "SELECT r.seq, r.run_id,
                greatest((SELECT count(*) FROM progress p WHERE p.run_id = r.run_id) - 1, 0)
         FROM runs r
         WHERE r.seq > $1 AND {} AND r.updated < $2
         ORDER BY r.seq LIMIT $3",
        cut.finished_status
    );
    let limit = to_sql_int(GC_BATCH as u64)?;
    let rows = conn.query(&sql, &[&after, &before, &limit]).await?;
    rows.iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?, u64_col(row, 2)?)))
        .collect()
}

/// Deletes all but the last checkpoint of the runs `ids` that are still finished
/// before the history cut-off (locked and judged again), marking their history cut;
/// how many it deleted.
pub(super) async fn collect_history(
    conn: &Conn,
    cut: &Cut,
    before: Millis,
    ids: &[String],
) -> Result<u64, TxError> {
    let sql = format!(
        "WITH still AS (SELECT r.run_id FROM runs r
                        WHERE r.run_id = ANY ($1) AND {} AND r.updated < $2
                        ORDER BY r.run_id FOR NO KEY UPDATE),
              gone AS (DELETE FROM progress p USING still
                       WHERE p.run_id = still.run_id AND (p.lease, p.tick) <
                           (SELECT lease, tick FROM progress l WHERE l.run_id = still.run_id
                            ORDER BY lease DESC, tick DESC LIMIT 1)
                       RETURNING p.run_id),
              cut AS (UPDATE runs SET history_cut = true
                      WHERE run_id IN (SELECT run_id FROM gone))
         SELECT count(*) FROM gone",
        cut.finished_status
    );
    let row = conn.query_one(&sql, &[&ids, &before]).await?;
    u64_col(&row, 0)
}

/// Counts (`dry_run`) or deletes the runs `ids` that gc still collects (locked and
/// judged again when deleting), with every row that hangs off them; adds them to
/// `report`.
pub(super) async fn collect_runs(
    conn: &Conn,
    cut: &Cut,
    ids: &[String],
    dry_run: bool,
    report: &mut GcReport,
) -> Result<(), TxError> {
    let sql = format!(
        "SELECT r.run_id FROM runs r WHERE r.run_id = ANY($1) AND {}{}",
        cut.collected_run("$2"),
        if dry_run { "" } else { " FOR UPDATE" }
    );
    let still: Vec<String> = conn
        .query(&sql, &[&ids, &cut.runs_before])
        .await?
        .iter()
        .map(|row| row.try_get(0))
        .collect::<Result<_, _>>()?;
    for (table, field) in GC_RUN_TABLES {
        let n = if dry_run {
            let row = conn
                .query_one(
                    &format!("SELECT count(*) FROM {table} WHERE run_id = ANY($1)"),
                    &[&still],
                )
                .await?;
            u64_col(&row, 0)?
        } else {
            conn.execute(
                &format!("DELETE FROM {table} WHERE run_id = ANY($1)"),
                &[&still],
            )
            .await?
        };
        *field(report) += n;
    }
    if !dry_run {
        for table in ["run_inputs", "run_outcomes", "runs"] {
            conn.execute(
                &format!("DELETE FROM {table} WHERE run_id = ANY($1)"),
                &[&still],
            )
            .await?;
        }
    }
    report.runs += still.len() as u64;
    Ok(())
}

/// Components gc collects ($1 runs cut): stored before the runs cut-off, and used by
/// no deployment (current or past: the deployment history names them) and no run that
/// stays.
fn collected_component(cut: &Cut) -> String {
    format!(
        "c.created < $1::int8
         AND NOT EXISTS (SELECT 1 FROM deployments d WHERE d.digest = c.digest)
         AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.digest = c.digest AND NOT {})",
        cut.collected_run("$1")
    )
}

/// How many components gc collects.
pub(super) async fn count_components(conn: &Conn, cut: &Cut) -> Result<u64, TxError> {
    let sql = format!(
        "SELECT count(*) FROM components c WHERE {}",
        collected_component(cut)
    );
    let row = conn.query_one(&sql, &[&cut.runs_before]).await?;
    u64_col(&row, 0)
}

/// Deletes up to a few components gc collects (they may be large); how many.
pub(super) async fn delete_components(conn: &Conn, cut: &Cut) -> Result<u64, TxError> {
    let sql = format!(
        "DELETE FROM components WHERE digest IN
             (SELECT c.digest FROM components c WHERE {} LIMIT 16 FOR UPDATE)",
        collected_component(cut)
    );
    conn.execute(&sql, &[&cut.runs_before]).await
}
