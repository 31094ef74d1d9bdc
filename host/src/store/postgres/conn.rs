//! A pooled connection as the statements use it: cached prepared statements, the
//! store's time, transactions that begin with the fence check pipelined, and the call
//! timeout on every round trip.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use deadpool_postgres::Object;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::{PostgresStore, TxError, is_race};
use crate::store::{Millis, Payloads, RunFence, Sealer, StoreError, SyncMode};

/// The store's time in milliseconds: the manual clock's when one is passed (`$1`),
/// else the server's, as of the transaction's start.
const NOW: &str = "SELECT coalesce($1::int8, (extract(epoch FROM now()) * 1000)::int8)";

/// The statement that makes a session's next transactions as durable as `sync` asks.
pub(super) fn durability(sync: SyncMode) -> &'static str {
    match sync {
        SyncMode::Full => "SET synchronous_commit TO on",
        SyncMode::Normal => "SET synchronous_commit TO off",
    }
}

/// How a transaction locks its run's row while it checks the fence.
#[derive(Debug, Clone, Copy)]
pub(super) enum Lock {
    /// The write leaves the run's row alone: other writes of the run go on beside it,
    /// and only a new lease (an update of the row) waits for it.
    Share,
    /// The write updates the run's row too (counts, status): taken at once, so two
    /// writes of one run never both hold a share and wait for each other to update.
    Update,
}

/// A pooled connection, in a transaction or not. One in a transaction that is dropped
/// before it ended (its caller stopped waiting) is closed, not returned to the pool:
/// the server rolls its transaction back. So is one whose call got no answer within
/// the call timeout: its answer may still come, and nothing else may read it.
pub(super) struct Conn {
    conn: Option<Object>,
    in_tx: bool,
    /// How long each call waits for its answer.
    limit: Duration,
    /// A call got no answer in time: the connection is not to be used again.
    lost: AtomicBool,
    /// The store's time, read in the transaction's first round trip (zero outside one).
    pub(super) now: Millis,
    /// The store's data keys, if it is encrypted at rest.
    sealer: Option<Arc<Sealer>>,
}

impl Conn {
    /// How this store keeps the payloads the backend handles itself (logs' chunks,
    /// inputs read for their concurrency keys).
    pub(super) fn payloads(&self) -> Payloads<'_> {
        Payloads(self.sealer.as_deref())
    }

    pub(super) fn client(&self) -> &Object {
        // Taken only in `drop`.
        self.conn.as_ref().unwrap_or_else(|| unreachable!())
    }

    /// `call`'s answer, or [`TxError::NoAnswer`] (and the connection marked lost) when
    /// none came within the call timeout.
    pub(super) async fn call<T>(
        &self,
        call: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, TxError> {
        match tokio::time::timeout(self.limit, call).await {
            Ok(answer) => Ok(answer?),
            Err(_) => {
                self.lost.store(true, Ordering::Relaxed);
                Err(TxError::NoAnswer)
            }
        }
    }

    /// Runs statements given as text, without parameters (a migration).
    pub(super) async fn batch(&self, sql: &str) -> Result<(), TxError> {
        self.call(self.client().batch_execute(sql)).await
    }

    /// Runs a statement; the rows it changed.
    pub(super) async fn execute(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, TxError> {
        let client = self.client();
        self.call(async {
            let stmt = client.prepare_cached(sql).await?;
            client.execute(&stmt, params).await
        })
        .await
    }

    /// Runs a query; its rows.
    pub(super) async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, TxError> {
        let client = self.client();
        self.call(async {
            let stmt = client.prepare_cached(sql).await?;
            client.query(&stmt, params).await
        })
        .await
    }

    /// Runs a query that returns at most one row.
    pub(super) async fn query_opt(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, TxError> {
        let client = self.client();
        self.call(async {
            let stmt = client.prepare_cached(sql).await?;
            client.query_opt(&stmt, params).await
        })
        .await
    }

    /// Runs a query that returns exactly one row.
    pub(super) async fn query_one(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, TxError> {
        let client = self.client();
        self.call(async {
            let stmt = client.prepare_cached(sql).await?;
            client.query_one(&stmt, params).await
        })
        .await
    }

    /// Whether `fence` is its run's current lease, locking the run's row as `lock`
    /// says until the transaction ends.
    pub(super) async fn fence_holds(&self, fence: &RunFence, lock: Lock) -> Result<bool, TxError> {
        // A token beyond the server's range was never handed out: it holds nothing.
        let Ok(token) = i64::try_from(fence.token) else {
            return Ok(false);
        };
        let sql = match lock {
            Lock::Share => {
                "SELECT 1 FROM runs
                 WHERE run_id = $1 AND lease_token = $2 AND lease_holder IS NOT NULL
                 FOR SHARE"
            }
            Lock::Update => {
                "SELECT 1 FROM runs
                 WHERE run_id = $1 AND lease_token = $2 AND lease_holder IS NOT NULL
                 FOR NO KEY UPDATE"
            }
        };
        Ok(self
            .query_opt(sql, &[&fence.run_id, &token])
            .await?
            .is_some())
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if (self.in_tx || self.lost.load(Ordering::Relaxed))
            && let Some(conn) = self.conn.take()
        {
            // Detached from the pool and dropped: the connection closes.
            drop(Object::take(conn));
        }
    }
}

/// What a transaction's first round trip found about its fence.
pub(super) enum Fenced {
    /// The write carries no fence.
    None,
    /// The fence holds, and the run's row is locked.
    Holds,
    /// Another lease was granted since: the write must change nothing.
    Lost,
}

impl PostgresStore {
    /// A pooled connection for a read outside any transaction.
    pub(super) async fn reader(&self, op: &'static str) -> Result<Conn, StoreError> {
        self.conn(op, false).await
    }

    /// A pooled connection, `in_tx` if a transaction is to begin on it (it is then
    /// closed, not pooled, should it be dropped before the transaction ends).
    async fn conn(&self, op: &'static str, in_tx: bool) -> Result<Conn, StoreError> {
        let conn = self.pool.get().await.map_err(|e| self.pool_failed(op, e))?;
        Ok(Conn {
            conn: Some(conn),
            in_tx,
            limit: self.call_timeout,
            lost: AtomicBool::new(false),
            now: 0,
            sealer: self.sealer.get().cloned(),
        })
    }

    /// The manual clock's time, passed to the server in place of its own.
    pub(super) fn manual_now(&self) -> Option<Millis> {
        self.clock.is_manual().then(|| self.clock.now())
    }

    /// The store's time, outside any transaction.
    pub(super) async fn server_now(&self, conn: &Conn) -> Result<Millis, TxError> {
        Ok(conn
            .query_one(NOW, &[&self.manual_now()])
            .await?
            .try_get(0)?)
    }

    /// Begins a transaction as durable as `sync` asks, reads the time, and checks the
    /// fence if there is one: one round trip.
    pub(super) async fn begin(
        &self,
        op: &'static str,
        sync: SyncMode,
        fence: Option<(&RunFence, Lock)>,
    ) -> Result<(Conn, Fenced), StoreError> {
        let mut conn = self.conn(op, true).await?;
        let begin = match sync {
            SyncMode::Full => "BEGIN; SET LOCAL synchronous_commit TO on",
            SyncMode::Normal => "BEGIN; SET LOCAL synchronous_commit TO off",
        };
        let manual = self.manual_now();
        let client = conn.client();
        // Prepared first (a round trip only on a connection's first use), so that the
        // three below go out together.
        let now_stmt = conn
            .call(client.prepare_cached(NOW))
            .await
            .map_err(|e| self.tx_error(op, e))?;
        let started = async { client.batch_execute(begin).await.map_err(TxError::Pg) };
        let now = async { Ok::<_, TxError>(client.query_one(&now_stmt, &[&manual]).await?) };
        let fenced = async {
            match fence {
                Some((fence, lock)) => Ok(if conn.fence_holds(fence, lock).await? {
                    Fenced::Holds
                } else {
                    Fenced::Lost
                }),
                None => Ok(Fenced::None),
            }
        };
        // One bound for the round trip: `fence_holds` bounds its own call too.
        let joined = match tokio::time::timeout(conn.limit, async {
            tokio::try_join!(started, now, fenced)
        })
        .await
        {
            Ok(joined) => joined,
            Err(_) => Err(TxError::NoAnswer),
        };
        let (now_row, fenced) = match joined {
            Ok(((), now_row, fenced)) => (now_row, fenced),
            Err(e) => return Err(self.tx_error(op, e)),
        };
        conn.now = now_row.try_get(0).map_err(|e| self.failed(op, e))?;
        Ok((conn, fenced))
    }

    /// Begins a transaction as durable as `sync` asks and runs `sql` (prepared first)
    /// in it, in one round trip: for a write whose first statement reads the clock and
    /// checks its fence itself. The connection, still in the transaction (`conn.now`
    /// is not read), with the statement's rows or its failure: the caller ends the
    /// transaction ([`PostgresStore::end`], [`PostgresStore::end_with`]) either way.
    pub(super) async fn begin_with(
        &self,
        op: &'static str,
        sync: SyncMode,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<(Conn, Result<Vec<Row>, TxError>), StoreError> {
        let conn = self.conn(op, true).await?;
        let begin = match sync {
            SyncMode::Full => "BEGIN; SET LOCAL synchronous_commit TO on",
            SyncMode::Normal => "BEGIN; SET LOCAL synchronous_commit TO off",
        };
        let client = conn.client();
        // Prepared first (a round trip only on a connection's first use), so that the
        // two below go out together.
        let stmt = conn
            .call(client.prepare_cached(sql))
            .await
            .map_err(|e| self.tx_error(op, e))?;
        let answer = conn
            .call(async {
                let (began, rows) =
                    tokio::join!(client.batch_execute(begin), client.query(&stmt, params));
                began?;
                rows
            })
            .await;
        if matches!(answer, Err(TxError::NoAnswer)) {
            return Err(self.tx_error(op, TxError::NoAnswer));
        }
        Ok((conn, answer))
    }

    /// [`PostgresStore::end`] of a transaction that succeeded so far, with one more
    /// statement (prepared first) sent together with its `COMMIT`: one round trip. A
    /// failure of the statement aborts the transaction, and its `COMMIT` then rolls it
    /// back.
    pub(super) async fn end_with(
        &self,
        mut conn: Conn,
        op: &'static str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<(), Option<StoreError>> {
        let client = conn.client();
        let stmt = match conn.call(client.prepare_cached(sql)).await {
            Ok(stmt) => stmt,
            Err(e) => return self.end(conn, op, Err::<(), _>(e)).await,
        };
        let answer = conn
            .call(async {
                let (done, committed) = tokio::join!(
                    client.execute(&stmt, params),
                    client.batch_execute("COMMIT")
                );
                done?;
                committed
            })
            .await;
        match answer {
            Ok(()) => {
                conn.in_tx = false;
                Ok(())
            }
            // The statement failed (and the `COMMIT` rolled back), or the `COMMIT`
            // did: either way the transaction is over, and whether it committed is
            // the server's answer, as for a lone `COMMIT`.
            Err(TxError::Pg(e)) => {
                conn.in_tx = e.as_db_error().is_none();
                Err(self.race_or(op, e))
            }
            Err(e) => Err(Some(self.tx_error(op, e))),
        }
    }

    /// Ends the transaction: commits it if `result` is a success, rolls it back
    /// otherwise. `Err(None)` asks the caller to run the transaction again: the server
    /// aborted it for racing another.
    pub(super) async fn end<T>(
        &self,
        mut conn: Conn,
        op: &'static str,
        result: Result<T, TxError>,
    ) -> Result<T, Option<StoreError>> {
        match result {
            Ok(value) => {
                // A `COMMIT` whose answer is lost (an error, or none in time) may have
                // committed or not: the caller is told, never sent it again from here.
                match conn.call(conn.client().batch_execute("COMMIT")).await {
                    Ok(()) => {}
                    Err(TxError::Pg(e)) => return Err(self.race_or(op, e)),
                    Err(e) => return Err(Some(self.tx_error(op, e))),
                }
                conn.in_tx = false;
                Ok(value)
            }
            Err(e) => {
                // A connection that cannot even roll back is closed when `conn` drops.
                if !matches!(e, TxError::NoAnswer)
                    && conn
                        .call(conn.client().batch_execute("ROLLBACK"))
                        .await
                        .is_ok()
                {
                    conn.in_tx = false;
                }
                match e {
                    TxError::Pg(e) => Err(self.race_or(op, e)),
                    e => Err(Some(self.tx_error(op, e))),
                }
            }
        }
    }

    fn race_or(&self, op: &'static str, e: tokio_postgres::Error) -> Option<StoreError> {
        if is_race(&e) {
            None
        } else {
            Some(self.failed(op, e))
        }
    }

    /// The store's error for a failure during `op`.
    pub(super) fn tx_error(&self, op: &'static str, e: TxError) -> StoreError {
        match e {
            TxError::Pg(e) => self.failed(op, e),
            TxError::Store(e) => e,
            TxError::NoAnswer => self.no_answer(op),
        }
    }
}

/// Runs a write transaction: `$body` (an expression that may use `$conn`, `$fenced`
/// and `?` on [`TxError`]s) inside a transaction begun by `begin`, committed if it
/// succeeds. A transaction the server aborted for racing another (a deadlock) is run
/// again, a few times.
macro_rules! write_tx {
    ($store:expr, $op:expr, $sync:expr, $fence:expr, |$conn:ident, $fenced:ident| $body:expr) => {{
        let store: &$crate::store::postgres::PostgresStore = $store;
        let mut tries = 0u32;
        loop {
            let ($conn, $fenced) = store.begin($op, $sync, $fence).await?;
            #[allow(unused_variables, unused_braces)]
            let result = async {
                let $conn = &$conn;
                let $fenced = &$fenced;
                $body
            }
            .await;
            match store.end($conn, $op, result).await {
                Ok(value) => break Ok(value),
                Err(Some(e)) => break Err(e),
                Err(None) if tries < 5 => tries += 1,
                Err(None) => {
                    break Err($crate::store::StoreError::Backend {
                        op: $op,
                        source: "the server kept aborting the transaction as deadlocked".into(),
                    });
                }
            }
        }
    }};
}

pub(super) use write_tx;
