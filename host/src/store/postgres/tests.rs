//! What only the PostgreSQL backend has: the schema's version checks, and the rules the
//! database itself enforces against any client, not only idem's statements.

use crate::store::tests::postgres_harness::{blocking, test_server, url_with_schema};
use crate::store::tests::{LEASE, block_on};
use crate::store::{
    ClaimOutcome, ClaimRequest, PostgresStore, RunFence, Store, StoreError, Submission, SyncMode,
};

/// A schema of its own, dropped at the end; `None` when PostgreSQL tests are skipped.
struct Schema {
    server: String,
    name: String,
}

impl Schema {
    fn create(tag: &str) -> Option<Schema> {
        let server = test_server()?;
        let name = format!(
            "idem_test_{tag}_{}_{}",
            std::process::id(),
            fastrand::u32(..)
        );
        let schema = Schema { server, name };
        schema
            .sql(&format!("CREATE SCHEMA {}", schema.name))
            .unwrap();
        Some(schema)
    }

    fn url(&self) -> String {
        url_with_schema(&self.server, &self.name)
    }

    /// Runs `sql` in the schema, as a client other than idem would.
    fn sql(&self, sql: &str) -> Result<(), tokio_postgres::Error> {
        let (url, sql) = (self.url(), sql.to_owned());
        blocking(async move {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
            let driver = tokio::spawn(connection);
            let result = client.batch_execute(&sql).await;
            drop(client);
            let _ = driver.await;
            result
        })
    }

    fn connect(&self) -> Result<PostgresStore, StoreError> {
        blocking(PostgresStore::connect(&self.url(), SyncMode::Normal))
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let _ = blocking({
            let (server, sql) = (
                self.server.clone(),
                format!("DROP SCHEMA {} CASCADE", self.name),
            );
            async move {
                let (client, connection) =
                    tokio_postgres::connect(&server, tokio_postgres::NoTls).await?;
                let driver = tokio::spawn(connection);
                let result = client.batch_execute(&sql).await;
                drop(client);
                let _ = driver.await;
                result
            }
        });
    }
}

#[test]
fn a_schema_from_a_newer_idem_is_refused() {
    let Some(schema) = Schema::create("newer") else {
        return;
    };
    drop(schema.connect().unwrap());
    schema
        .sql("INSERT INTO idem_migrations (version) VALUES (99)")
        .unwrap();
    match schema.connect() {
        Err(StoreError::SchemaTooNew {
            found, supported, ..
        }) => {
            assert_eq!(found, 99);
            assert_eq!(supported, super::schema::SCHEMA_VERSION);
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
}

#[test]
fn a_schema_with_other_tables_is_left_untouched() {
    let Some(schema) = Schema::create("foreign") else {
        return;
    };
    schema.sql("CREATE TABLE orders (id int)").unwrap();
    let err = schema.connect().unwrap_err().to_string();
    assert!(err.contains("holds 1 tables but no idem store"), "{err}");
    // Nothing was created beside the foreign table.
    schema.sql("SELECT count(*) FROM orders").unwrap();
    assert!(schema.sql("SELECT 1 FROM idem_migrations").is_err());
}

#[test]
fn the_database_refuses_changes_to_a_committed_key_and_tokens_going_down() {
    let Some(schema) = Schema::create("rules") else {
        return;
    };
    let store = schema.connect().unwrap();
    block_on(async {
        store.put_component("00", b"").await.unwrap();
        let submission = Submission {
            run_id: "r",
            agent: "a",
            digest: "00",
            namespace: "a",
            input: b"",
            authority: b"",
            replace_authority: false,
        };
        store.submit(&submission).await.unwrap();
        let crate::store::Acquired::Leased(run) = store.acquire_run("r", "w", LEASE).await.unwrap()
        else {
            panic!("a fresh run is leased");
        };
        let fence = RunFence {
            run_id: "r".into(),
            token: run.token,
            sync: SyncMode::Normal,
        };
        let req = |key| ClaimRequest {
            key,
            fence: &fence,
            holder: "h",
            fingerprint: None,
            lease: LEASE,
            durable: true,
        };
        let ClaimOutcome::Granted(grant) = store.claim(&req("done")).await.unwrap() else {
            panic!("granted");
        };
        let claim = crate::store::ClaimRef {
            key: "done",
            token: grant.token,
            fence: &fence,
        };
        store
            .commit(&crate::store::Commit {
                claim,
                result: b"once",
                checkpoint: None,
                counts: None,
            })
            .await
            .unwrap();
        store.claim(&req("open")).await.unwrap();
    });
    drop(store);
    for sql in [
        "UPDATE steps SET result = 'twice' WHERE key = 'done'",
        "DELETE FROM steps WHERE key = 'done'",
        "UPDATE steps SET token = 0 WHERE key = 'open'",
        "UPDATE steps SET attempt = attempt + 1 WHERE key = 'open'",
        "UPDATE runs SET lease_token = lease_token - 1 WHERE run_id = 'r'",
        "UPDATE runs SET lease_holder = 'other' WHERE run_id = 'r'",
        "INSERT INTO steps (key, run_id, token, attempt, claimed_at, lease_expires) \
         VALUES ('done', 'r', 9, 9, 0, 0)",
    ] {
        let err = schema.sql(sql).expect_err(sql);
        let code = err.code().map(|c| c.code().to_owned());
        assert!(
            matches!(code.as_deref(), Some("23000" | "23505")),
            "{sql}: {err:?}"
        );
    }
    // What idem itself does still works: a new grant with a greater token.
    schema
        .sql("UPDATE steps SET token = token + 1, attempt = attempt + 1 WHERE key = 'open'")
        .unwrap();
}
