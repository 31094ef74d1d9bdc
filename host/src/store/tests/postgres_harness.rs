//! PostgreSQL stores for the store tests: each test gets a schema of its own on a real
//! server, so tests run in parallel and leave nothing behind.
//!
//! `IDEM_TEST_POSTGRES` says where the server is: unset, the PostgreSQL tests are
//! skipped and each says so on stderr (`SKIPPED: PostgreSQL ...`); `required` (or `1`)
//! means the server at [`DEFAULT_URL`]; a `postgres://` URL means that server. When it
//! is set, a server that cannot be reached fails the test.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::Harness;
use crate::store::{Clock, PostgresOptions, PostgresStore, Store};

/// The server CI starts (trust authentication, database `test`).
pub(crate) const DEFAULT_URL: &str = "postgres://root@127.0.0.1:5432/test";

/// The server's URL, or `None` (after saying so) when PostgreSQL tests are skipped.
pub(crate) fn test_server() -> Option<String> {
    match std::env::var("IDEM_TEST_POSTGRES") {
        Err(_) => {
            eprintln!(
                "SKIPPED: PostgreSQL store test: IDEM_TEST_POSTGRES is not set (set it to \
                 `required` to run it against {DEFAULT_URL}, or to a postgres:// URL)"
            );
            None
        }
        Ok(value) if value == "required" || value == "1" => Some(DEFAULT_URL.to_owned()),
        Ok(url) => Some(url),
    }
}

/// Runs `future` on a runtime of its own, on a thread of its own: the harness is used
/// both outside any runtime (the store tests) and inside one (the model test).
pub(crate) fn blocking<F>(future: F) -> F::Output
where
    F: Future + Send,
    F::Output: Send,
{
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(future)
            })
            .join()
            .unwrap()
    })
}

/// A fresh schema name, unique across the processes of a test run.
fn schema_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "idem_test_{}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        fastrand::u32(..)
    )
}

/// `url` with the connection's `search_path` set to `schema`.
pub(crate) fn url_with_schema(url: &str, schema: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-csearch_path%3D{schema}")
}

/// A schema of its own on the test server, dropped with the harness.
pub(crate) struct PostgresHarness {
    server: String,
    schema: String,
    clock: Clock,
    store: Option<Arc<PostgresStore>>,
}

impl PostgresHarness {
    /// A store on the schema, opened with the harness's clock.
    pub(crate) fn open(&self) -> Arc<PostgresStore> {
        let url = url_with_schema(&self.server, &self.schema);
        let options = PostgresOptions {
            clock: self.clock.clone(),
            pool_size: 4,
            ..PostgresOptions::default()
        };
        let store = blocking(PostgresStore::connect_with(&url, &options))
            .unwrap_or_else(|e| panic!("IDEM_TEST_POSTGRES is set, but: {e}"));
        Arc::new(store)
    }
}

/// Runs one statement on the server as the test's administrator.
fn admin(server: &str, sql: &str) -> Result<(), tokio_postgres::Error> {
    let (server, sql) = (server.to_owned(), sql.to_owned());
    blocking(async move {
        let (client, connection) = tokio_postgres::connect(&server, tokio_postgres::NoTls).await?;
        let driver = tokio::spawn(connection);
        let result = client.batch_execute(&sql).await;
        drop(client);
        let _ = driver.await;
        result
    })
}

impl Harness for PostgresHarness {
    fn create(clock: &Clock) -> Option<Self> {
        let server = test_server()?;
        let schema = schema_name();
        if let Err(e) = admin(&server, &format!("CREATE SCHEMA {schema}")) {
            panic!(
                "IDEM_TEST_POSTGRES is set, but the PostgreSQL server at {server} cannot be \
                 used: {e} (start it, or unset IDEM_TEST_POSTGRES to skip these tests)"
            );
        }
        let mut harness = PostgresHarness {
            server,
            schema,
            clock: clock.clone(),
            store: None,
        };
        harness.store = Some(harness.open());
        Some(harness)
    }

    fn store(&self) -> Arc<dyn Store> {
        self.store.clone().unwrap()
    }

    fn reopen(&mut self) {
        self.store = None;
        self.store = Some(self.open());
    }

    fn open_another(&self) -> Arc<dyn Store> {
        self.open()
    }

    fn rows(&self, table: &str) -> u64 {
        let url = url_with_schema(&self.server, &self.schema);
        let sql = format!("SELECT count(*) FROM {table}");
        blocking(async move {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap();
            let driver = tokio::spawn(connection);
            let n: i64 = client.query_one(&sql, &[]).await.unwrap().get(0);
            drop(client);
            let _ = driver.await;
            n as u64
        })
    }

    fn raw_holds(&self, needle: &[u8]) -> bool {
        let url = url_with_schema(&self.server, &self.schema);
        let schema = self.schema.clone();
        let (rows, wal_dir) = blocking(async move {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap();
            let driver = tokio::spawn(connection);
            let tables: Vec<String> = client
                .query(
                    "SELECT table_name::text FROM information_schema.tables
                     WHERE table_schema = $1",
                    &[&schema],
                )
                .await
                .unwrap()
                .iter()
                .map(|row| row.get(0))
                .collect();
            let mut rows = String::new();
            for table in tables {
                let sql = format!(
                    "SELECT coalesce(string_agg(t::text, E'\\n'), '') FROM {schema}.{table} t"
                );
                rows.push_str(
                    &client
                        .query_one(&sql, &[])
                        .await
                        .unwrap()
                        .get::<_, String>(0),
                );
            }
            // Written out of the server's buffers, so that the files hold what was
            // committed (commits here are asynchronous).
            let wal_dir = match client.batch_execute("CHECKPOINT").await {
                Ok(()) => client
                    .query_one("SHOW data_directory", &[])
                    .await
                    .ok()
                    .map(|row| std::path::PathBuf::from(row.get::<_, String>(0)).join("pg_wal")),
                Err(_) => None,
            };
            drop(client);
            let _ = driver.await;
            (rows, wal_dir)
        });
        let hex = super::sealing::hex(needle);
        if super::sealing::contains(rows.as_bytes(), needle)
            || super::sealing::contains(rows.as_bytes(), hex.as_bytes())
        {
            return true;
        }
        let segments = wal_dir
            .as_deref()
            .and_then(|dir| std::fs::read_dir(dir).ok());
        let Some(segments) = segments else {
            eprintln!(
                "NOT CHECKED: the PostgreSQL server's WAL is not readable by this process \
                 (not a superuser, or another machine's); its rows were"
            );
            return false;
        };
        segments.flatten().any(|entry| {
            let bytes = std::fs::read(entry.path()).unwrap_or_default();
            super::sealing::contains(&bytes, needle)
        })
    }
}

impl Drop for PostgresHarness {
    fn drop(&mut self) {
        self.store = None;
        // Best effort: a schema left behind by a failed drop is named after its test
        // process, and harmless.
        let _ = admin(
            &self.server,
            &format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema),
        );
    }
}
