//! The PostgreSQL backend of [`Store`](super::Store): one database that workers on many
//! machines share, with the same rules as SQLite, enforced by the server.
//!
//! Every write is one transaction on a pooled connection (`deadpool-postgres` over
//! `tokio-postgres`). Its first round trip pipelines `BEGIN`, the transaction's
//! `synchronous_commit` (`on` for [`SyncMode::Full`], `off` for [`SyncMode::Normal`]),
//! the time, and the check of the run's fence, which locks the run's row against a new
//! lease until the write commits: a worker whose lease was taken over writes nothing
//! after the takeover. Then come the write's statements and `COMMIT`.
//!
//! A claim that may become durable with its commit (`ClaimRequest::durable` false) is
//! committed with `synchronous_commit = off`: the server flushes its log in order, so
//! the commit's flush covers it. A server crash may lose it (and any write under
//! [`SyncMode::Normal`]) after idem was told of it; the store's epoch (`epoch.rs`)
//! keeps every token granted after such a crash above every token granted before.
//!
//! Time is the server's: each transaction reads `now()` once and every lease it grants
//! or compares uses that value. A store opened with a manual [`Clock`] (tests) passes
//! the clock's time instead, in the same statement, so tests move time by hand here as
//! on SQLite and no lease ever expires because a machine was slow.
//!
//! Connections are driven by a small runtime of the store's own, so a handle works from
//! any runtime (or several in turn, as the tests' do) and a caller's runtime shutting
//! down never strands a connection mid-transaction. A transaction whose caller stops
//! waiting is not returned to the pool: its connection is closed, and the server rolls
//! the transaction back.
//!
//! # Layout
//! - `postgres.rs`: [`PostgresStore`], [`PostgresOptions`], connecting, and how the
//!   server's errors become [`StoreError`]s.
//! - `conn.rs`: a pooled connection, transactions, and the fence check.
//! - `epoch.rs`: the floor under every token granted, moved on after a server crash.
//! - `one_trip.rs`: a step's claim and commit, each in one round trip.
//! - `batch.rs`: group commit, many runs' claims (and commits) in one statement.
//! - `api.rs`: the [`Store`](super::Store) methods.
//! - `schema.rs`: the numbered migrations, applied on open.
//! - `tests.rs`: what only this backend has (the store tests are `store/tests/`).
//! - `claims.rs`, `runs.rs`, `leases.rs`, `components.rs`, `logs.rs`, `waits.rs`: the
//!   statements.

mod api;
mod batch;
mod blobs;
mod children;
mod claims;
mod components;
mod conn;
mod epoch;
mod events;
mod flow;
mod gc;
mod history;
mod leases;
mod live;
mod logs;
mod one_trip;
mod pause;
mod rates;
mod runs;
mod schedules;
mod schema;
mod sealing;
#[cfg(test)]
mod tests;
mod usage;
mod versions;
mod waits;

use super::rules::SQL_MAX;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::error::SqlState;
use tokio_postgres::{NoTls, Socket};

use super::error::redact;
use super::{Clock, DatabaseFault, StoreError, SyncMode};

/// How [`PostgresStore::connect_with`] connects.
///
/// ```
/// use std::time::Duration;
/// use idem::store::{Clock, PostgresOptions, SyncMode};
///
/// let options = PostgresOptions {
///     sync: SyncMode::Full,
///     pool_size: 32,
///     connect_timeout: Duration::from_secs(2),
///     call_timeout: Duration::from_secs(10),
///     clock: Clock::system(),
///     existing_only: false,
/// };
/// assert_eq!(options.pool_size, 32);
/// ```
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// Durability of the writes that carry no [`RunFence`](super::RunFence); a fenced
    /// write asks for its run's own.
    pub sync: SyncMode,
    /// Most connections the handle opens. Each in-flight write holds one for its
    /// transaction, so this caps how many run at once; the server's `max_connections`
    /// caps the sum over every process sharing it.
    pub pool_size: usize,
    /// How long opening a connection may take before the server counts as unreachable.
    pub connect_timeout: Duration,
    /// How long any one call to the server may wait for its answer: a statement, a
    /// round trip of a transaction, its `COMMIT`, a connection from the pool (opened,
    /// logged in, or waited for). Past it the call fails as
    /// [`DatabaseFault::Unreachable`] and its connection is closed, so a server that
    /// stopped answering (a black-holed network, a half-open connection) never holds a
    /// caller for longer. The server is given the same bound (`statement_timeout` and
    /// `idle_in_transaction_session_timeout`), so that a session whose client is cut
    /// off lets go of its locks. A write whose answer is lost this way is read back
    /// (a step's commit), or left to be retaken in doubt, never silently sent again.
    /// The bound is a Tokio timer: the store is used from a runtime with time enabled
    /// (`enable_time` or `enable_all`, as `#[tokio::main]` has).
    pub call_timeout: Duration,
    /// The store's time: [`Clock::system`] reads the server's `now()`; a manual clock
    /// (tests) is passed to the server instead.
    pub clock: Clock,
    /// Refuse a database (or schema) without an idem store instead of creating one:
    /// looking at a store never creates it.
    pub existing_only: bool,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions {
            sync: SyncMode::Normal,
            pool_size: 16,
            connect_timeout: Duration::from_secs(5),
            call_timeout: Duration::from_secs(10),
            clock: Clock::system(),
            existing_only: false,
        }
    }
}

/// A [`Store`](super::Store) in a PostgreSQL database, shared by every process (on
/// any machine) that connects to it.
///
/// ```no_run
/// use idem::store::{PostgresStore, SyncMode, WorkerStore};
///
/// # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = PostgresStore::connect("postgres://idem@db.internal/idem", SyncMode::Full).await?;
/// println!("the server's time: {}", store.now().await?);
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct PostgresStore {
    /// The URL without its password: what errors name.
    location: String,
    /// The user and database connected as, named when the server refuses them.
    user: Option<String>,
    dbname: String,
    pool: Pool,
    /// Durability of writes without a fence.
    sync: SyncMode,
    /// How long one call may wait for the server's answer.
    call_timeout: Duration,
    clock: Clock,
    /// The group-commit queues of a step's claims and commits.
    batches: batch::Batches,
    /// Drives the connections; shut down (without waiting) when the handle drops.
    runtime: Option<tokio::runtime::Runtime>,
    /// The store's data keys, once it is known to be encrypted at rest: logs' chunks
    /// are sealed with them, and inputs opened to read their concurrency keys.
    sealer: std::sync::OnceLock<std::sync::Arc<super::Sealer>>,
}

impl PostgresStore {
    /// Connects to the database at `url` (`postgres://USER[:PASSWORD]@HOST[:PORT]/DB`,
    /// or any form `tokio-postgres` parses) and brings its schema up to date.
    ///
    /// Fails with [`StoreError::Open`] naming the server and the cause when it cannot
    /// be reached, refuses the user or password, or has no such database; with
    /// [`StoreError::SchemaTooNew`] if a newer idem migrated it.
    pub async fn connect(url: &str, sync: SyncMode) -> Result<PostgresStore, StoreError> {
        Self::connect_with(
            url,
            &PostgresOptions {
                sync,
                ..PostgresOptions::default()
            },
        )
        .await
    }

    /// [`PostgresStore::connect`] with every option spelled out.
    pub async fn connect_with(
        url: &str,
        options: &PostgresOptions,
    ) -> Result<PostgresStore, StoreError> {
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| StoreError::Open {
            location: redact(url),
            reason: format!("not a PostgreSQL URL: {e}"),
        })?;
        let location = describe(&config);
        let user = config.get_user().map(str::to_owned);
        let dbname = config
            .get_dbname()
            .or(config.get_user())
            .unwrap_or("")
            .to_owned();
        config.connect_timeout(options.connect_timeout);
        if config.get_application_name().is_none() {
            config.application_name("idem");
        }
        let call_timeout = options.call_timeout.max(Duration::from_millis(1));
        bound_the_server(&mut config, call_timeout);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("idem-postgres")
            .enable_all()
            .build()
            .map_err(|e| StoreError::Open {
                location: location.clone(),
                reason: format!("cannot start the store's connection thread: {e}"),
            })?;
        let manager = Manager::from_connect(
            config,
            SpawnOn(runtime.handle().clone(), call_timeout),
            ManagerConfig {
                // A connection the server closed is dropped when it comes back to the
                // pool; one that died unnoticed fails its next statement, and the
                // write is retried by its caller.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(options.pool_size.max(1))
            // Waiting for a free connection, opening one (its login included) and
            // checking one that comes back: each bounded like a call.
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(call_timeout))
            .create_timeout(Some(call_timeout))
            .recycle_timeout(Some(call_timeout))
            .build()
            .map_err(|e| StoreError::Open {
                location: location.clone(),
                reason: format!("cannot build the connection pool: {e}"),
            })?;
        let batches = batch::Batches::start(
            runtime.handle(),
            batch::Target {
                pool: pool.clone(),
                location: location.clone(),
                clock: options.clock.clone(),
                call_timeout,
            },
        );
        let store = PostgresStore {
            location,
            user,
            dbname,
            pool,
            sync: options.sync,
            call_timeout,
            clock: options.clock.clone(),
            batches,
            runtime: Some(runtime),
            sealer: std::sync::OnceLock::new(),
        };
        schema::migrate(&store, options.existing_only).await?;
        Ok(store)
    }

    /// The server and database this store is on, without the password.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// The error for a failure of the server during `op`: a [`StoreError::Database`]
    /// naming the server when the cause is one its operator can fix, otherwise a
    /// [`StoreError::Backend`].
    fn failed(&self, op: &'static str, e: tokio_postgres::Error) -> StoreError {
        let fault = fault(&e);
        if fault == Some(DatabaseFault::Unreachable) {
            forget_idle(&self.pool);
        }
        match fault {
            Some(fault) => StoreError::Database {
                location: self.location.clone(),
                op,
                fault,
                detail: format!("PostgreSQL: {}", words(&e)),
            },
            None => StoreError::Backend {
                op,
                source: Box::new(e),
            },
        }
    }

    /// The error for a call during `op` that got no answer within the call timeout;
    /// the idle connections are closed with it ([`forget_idle`]).
    fn no_answer(&self, op: &'static str) -> StoreError {
        forget_idle(&self.pool);
        no_answer(&self.location, op, self.call_timeout)
    }

    /// The error for a connection the pool could not hand out during `op`.
    fn pool_failed(&self, op: &'static str, e: deadpool_postgres::PoolError) -> StoreError {
        match e {
            deadpool_postgres::PoolError::Backend(e) => self.failed(op, e),
            other => StoreError::Database {
                location: self.location.clone(),
                op,
                fault: DatabaseFault::Unreachable,
                detail: format!("no connection: {other}"),
            },
        }
    }
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        // Not `Runtime::drop`, which blocks, and panics inside another runtime.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Closes every idle connection of `pool`, after a call on one of their like got no
/// answer or lost its connection: the same cause (a network cut, a server restarted
/// or silent) most likely ended or holds them too, and each would cost the next caller
/// a failed call (or a call timeout) to find out. Calls
/// after this open fresh connections, which fail at once while the server is away and
/// work as soon as it is back.
fn forget_idle(pool: &Pool) {
    pool.retain(|_, _| false);
}

/// The error for a call during `op` on the server at `location` that got no answer
/// within `limit`.
fn no_answer(location: &str, op: &'static str, limit: Duration) -> StoreError {
    StoreError::Database {
        location: location.to_owned(),
        op,
        fault: DatabaseFault::Unreachable,
        detail: format!(
            "no answer within the call timeout ({}); the connection was closed",
            super::error::human_duration(limit)
        ),
    }
}

/// Tells the server the call timeout, unless the URL's `options` say otherwise (theirs
/// come after, and win): a statement runs (or waits for a lock) at most that long, and a
/// session whose client went silent inside a transaction is ended, its locks released,
/// after that long. And TCP keepalives find a dead peer of an idle connection in under
/// a minute rather than the system's two hours, unless the URL sets them.
fn bound_the_server(config: &mut tokio_postgres::Config, limit: Duration) {
    let ms = limit.as_millis();
    let ours = format!("-c statement_timeout={ms} -c idle_in_transaction_session_timeout={ms}");
    let options = match config.get_options() {
        Some(theirs) => format!("{ours} {theirs}"),
        None => ours,
    };
    config.options(options);
    if config.get_keepalives_idle() == Duration::from_secs(2 * 60 * 60) {
        config.keepalives_idle(Duration::from_secs(30));
    }
}

/// Opens connections on the store's own runtime, and drives them there; an attempt
/// that has not logged in within the call timeout is abandoned.
struct SpawnOn(tokio::runtime::Handle, Duration);

type ConnectFuture<'a> = Pin<
    Box<
        dyn Future<
                Output = Result<
                    (tokio_postgres::Client, tokio::task::JoinHandle<()>),
                    tokio_postgres::Error,
                >,
            > + Send
            + 'a,
    >,
>;

impl deadpool_postgres::Connect for SpawnOn {
    fn connect(&self, config: &tokio_postgres::Config) -> ConnectFuture<'_> {
        let (config, handle, limit) = (config.clone(), self.0.clone(), self.1);
        Box::pin(async move {
            let driver = handle.clone();
            let connected = handle
                .spawn(async move {
                    // The pool's own timeout stops waiting, but only this ends the
                    // attempt: a server that never answers the login would keep it
                    // (and its socket) forever.
                    let Ok(connected) = tokio::time::timeout(limit, config.connect(NoTls)).await
                    else {
                        return Err(tokio_postgres::Error::__private_api_timeout());
                    };
                    let (client, connection) = connected?;
                    let task = driver.spawn(drive(connection));
                    Ok((client, task))
                })
                .await;
            // The task fails only when the store's runtime is shutting down, that is
            // when the store is being dropped: nobody is left to use the connection.
            connected.unwrap_or_else(|_| Err(tokio_postgres::Error::__private_api_timeout()))
        })
    }
}

async fn drive(connection: tokio_postgres::Connection<Socket, tokio_postgres::tls::NoTlsStream>) {
    if let Err(e) = connection.await {
        tracing::debug!("PostgreSQL connection ended: {e}");
    }
}

/// `postgres://USER@HOST:PORT/DB`: the server as errors name it, never the password.
fn describe(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        Some(tokio_postgres::config::Host::Unix(path)) => path.display().to_string(),
        None => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config
        .get_user()
        .map(|u| format!("{u}@"))
        .unwrap_or_default();
    let db = config.get_dbname().or(config.get_user()).unwrap_or("");
    format!("postgres://{user}{host}:{port}/{db}")
}

/// The fault a server error stands for, if the user can do something about it.
fn fault(e: &tokio_postgres::Error) -> Option<DatabaseFault> {
    if e.is_closed() {
        return Some(DatabaseFault::Unreachable);
    }
    let Some(code) = e.code() else {
        // No SQLSTATE: the socket failed (refused, reset, timed out).
        return Some(DatabaseFault::Unreachable);
    };
    let class = &code.code()[..2];
    match code {
        _ if class == "08" => Some(DatabaseFault::Unreachable),
        c if *c == SqlState::ADMIN_SHUTDOWN
            || *c == SqlState::CRASH_SHUTDOWN
            || *c == SqlState::CANNOT_CONNECT_NOW
            || *c == SqlState::TOO_MANY_CONNECTIONS =>
        {
            Some(DatabaseFault::Unreachable)
        }
        c if *c == SqlState::DISK_FULL => Some(DatabaseFault::Full),
        c if *c == SqlState::READ_ONLY_SQL_TRANSACTION => Some(DatabaseFault::ReadOnly),
        c if *c == SqlState::DATA_CORRUPTED || *c == SqlState::INDEX_CORRUPTED => {
            Some(DatabaseFault::Corrupt)
        }
        c if *c == SqlState::IO_ERROR => Some(DatabaseFault::Io),
        _ => None,
    }
}

/// Whether the server aborted the transaction only because it raced another (a
/// deadlock, a serialization failure): the same transaction again may well succeed.
fn is_race(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(c) if *c == SqlState::T_R_DEADLOCK_DETECTED || *c == SqlState::T_R_SERIALIZATION_FAILURE
    )
}

/// The server's words for an error (with its SQLSTATE), or the socket's.
fn words(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => {
            let mut text = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(cause) = source {
                text = format!("{text}: {cause}");
                source = cause.source();
            }
            text
        }
    }
}

/// Why connecting failed, in words that name the cause for the operator.
fn connect_reason(e: &tokio_postgres::Error, config_user: Option<&str>, db: &str) -> String {
    let user = config_user.unwrap_or("(default)");
    match e.code() {
        Some(c) if *c == SqlState::INVALID_PASSWORD => format!(
            "the server refused the password of user {user:?}: {}",
            words(e)
        ),
        Some(c) if *c == SqlState::INVALID_AUTHORIZATION_SPECIFICATION => {
            format!("the server refused user {user:?}: {}", words(e))
        }
        Some(c) if *c == SqlState::UNDEFINED_DATABASE => format!(
            "database {db:?} does not exist on the server (create it first: `createdb {db}`): {}",
            words(e)
        ),
        _ if fault(e) == Some(DatabaseFault::Unreachable) => {
            format!("cannot reach the server: {}", words(e))
        }
        _ => words(e),
    }
}

/// A failure inside an operation: the server's, to be named with the operation, or
/// already one of the store's own.
#[derive(Debug)]
enum TxError {
    Pg(tokio_postgres::Error),
    Store(StoreError),
    /// No answer within the call timeout: the connection is given up.
    NoAnswer,
}

impl From<tokio_postgres::Error> for TxError {
    fn from(e: tokio_postgres::Error) -> Self {
        TxError::Pg(e)
    }
}

impl From<StoreError> for TxError {
    fn from(e: StoreError) -> Self {
        TxError::Store(e)
    }
}

// PostgreSQL integers are signed; the API counts in u64/u32. Values a caller passes are
// checked before anything is sent (`rules::check_*`, shared with SQLite); values
// read back that are out of range are refused rather than wrapped.

fn to_sql_int(value: u64) -> Result<i64, TxError> {
    i64::try_from(value).map_err(|_| {
        TxError::Store(StoreError::OutOfRange {
            what: "value",
            value,
            max: SQL_MAX,
        })
    })
}

fn out_of_range(column: &str, value: i64) -> TxError {
    TxError::Store(StoreError::Backend {
        op: "read a row",
        source: format!("column {column} holds {value}, out of range").into(),
    })
}

fn u64_col(row: &tokio_postgres::Row, idx: usize) -> Result<u64, TxError> {
    let value: i64 = row.try_get(idx)?;
    u64::try_from(value).map_err(|_| out_of_range(row.columns()[idx].name(), value))
}

fn u32_col(row: &tokio_postgres::Row, idx: usize) -> Result<u32, TxError> {
    let value: i32 = row.try_get(idx)?;
    u32::try_from(value).map_err(|_| out_of_range(row.columns()[idx].name(), value.into()))
}
