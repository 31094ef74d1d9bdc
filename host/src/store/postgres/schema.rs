//! The numbered migrations of the PostgreSQL schema, applied on connect in one
//! transaction, and the refusal of a schema a newer idem wrote.
//!
//! The tables live in the connection's current schema (the first of its
//! `search_path`), so one database can hold several stores, one per schema. The
//! version is the greatest row of `idem_migrations`. Processes connecting at once take
//! a transaction-scoped advisory lock on the schema's name before they look, so one
//! migrates and the others find it done.

use super::conn::{Conn, write_tx};
use super::{PostgresStore, TxError, connect_reason, fault};
use crate::store::{DatabaseFault, StoreError, SyncMode};

/// `MIGRATIONS[i]` brings the schema from version `i` to version `i + 1`.
pub(super) const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/postgres/0001_init.sql"),
    include_str!("../migrations/postgres/0002_waits.sql"),
    include_str!("../migrations/postgres/0003_retired.sql"),
    include_str!("../migrations/postgres/0004_recycled.sql"),
    include_str!("../migrations/postgres/0005_epoch.sql"),
    include_str!("../migrations/postgres/0006_rebuilds.sql"),
    include_str!("../migrations/postgres/0007_children.sql"),
    include_str!("../migrations/postgres/0008_schedules.sql"),
    include_str!("../migrations/postgres/0009_flow.sql"),
    include_str!("../migrations/postgres/0010_pause.sql"),
    include_str!("../migrations/postgres/0011_rates.sql"),
    include_str!("../migrations/postgres/0012_sealing.sql"),
    include_str!("../migrations/postgres/0013_usage.sql"),
    include_str!("../migrations/postgres/0014_live.sql"),
    include_str!("../migrations/postgres/0015_blobs.sql"),
    include_str!("../migrations/postgres/0016_versions.sql"),
    include_str!("../migrations/postgres/0017_events.sql"),
    include_str!("../migrations/postgres/0018_history.sql"),
];

/// The schema version this build writes and understands.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Brings the store's schema up to date, or refuses one that is newer.
pub(super) async fn migrate(store: &PostgresStore, existing_only: bool) -> Result<(), StoreError> {
    probe(store).await?;
    let op = "migrate the schema";
    let applied: Result<i64, StoreError> =
        write_tx!(store, op, SyncMode::Full, None, |conn, _fenced| {
            conn.query_one(
                "SELECT pg_advisory_xact_lock(hashtext('idem migrate ' || current_schema()))",
                &[],
            )
            .await?;
            let from = version(conn, store, existing_only).await?;
            if from > SCHEMA_VERSION {
                return Err(TxError::Store(StoreError::SchemaTooNew {
                    location: store.location.clone(),
                    found: from,
                    supported: SCHEMA_VERSION,
                }));
            }
            let from_index = usize::try_from(from).unwrap_or(0);
            for (index, migration) in MIGRATIONS.iter().enumerate().skip(from_index) {
                conn.batch(migration).await?;
                let version = i64::try_from(index + 1).unwrap_or(i64::MAX);
                conn.execute(
                    "INSERT INTO idem_migrations (version) VALUES ($1)",
                    &[&version],
                )
                .await?;
            }
            Ok(from)
        });
    let applied = applied?;
    if applied < SCHEMA_VERSION {
        tracing::info!(
            "store {}: schema migrated from version {applied} to {SCHEMA_VERSION}",
            store.location
        );
    }
    Ok(())
}

/// Takes a first connection, telling apart the faults an operator fixes before
/// anything can work (the user or password refused, no such database) from the server
/// being down.
async fn probe(store: &PostgresStore) -> Result<(), StoreError> {
    let probe = store.pool.get().await.map_err(|e| {
        let (reason, unreachable) = match &e {
            deadpool_postgres::PoolError::Backend(e) => (
                connect_reason(e, store.user.as_deref(), &store.dbname),
                fault(e) == Some(DatabaseFault::Unreachable),
            ),
            other => (format!("cannot reach the server: {other}"), true),
        };
        if unreachable {
            // A fault that may pass by itself (the server restarting): typed, so that a
            // caller that can wait (a worker) tells it from one an operator must fix.
            StoreError::Database {
                location: store.location.clone(),
                op: "connect",
                fault: DatabaseFault::Unreachable,
                detail: reason,
            }
        } else {
            StoreError::Open {
                location: store.location.clone(),
                reason,
            }
        }
    })?;
    drop(probe);
    Ok(())
}

/// The schema's version, in the migration's transaction: 0 for a schema idem never
/// wrote, whose version table is created here, unless the schema holds other tables
/// (not ours to touch) or only an existing store was asked for.
async fn version(conn: &Conn, store: &PostgresStore, existing_only: bool) -> Result<i64, TxError> {
    let exists: bool = conn
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_tables
                        WHERE schemaname = current_schema()
                          AND tablename = 'idem_migrations')",
            &[],
        )
        .await?
        .try_get(0)?;
    if exists {
        return Ok(conn
            .query_one(
                "SELECT coalesce(max(version), 0)::int8 FROM idem_migrations",
                &[],
            )
            .await?
            .try_get(0)?);
    }
    let tables: i64 = conn
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()",
            &[],
        )
        .await?
        .try_get(0)?;
    if existing_only {
        return Err(TxError::Store(StoreError::Open {
            location: store.location.clone(),
            reason: "no idem store is there (`idem run` or `idem deploy` creates one)".to_owned(),
        }));
    }
    if tables > 0 {
        return Err(TxError::Store(StoreError::Open {
            location: store.location.clone(),
            reason: format!(
                "its schema holds {tables} tables but no idem store; idem left it \
                 untouched (point the URL at an empty database or schema)"
            ),
        }));
    }
    conn.execute(
        "CREATE TABLE idem_migrations (
             version    int8 PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now()
         )",
        &[],
    )
    .await?;
    Ok(0)
}
