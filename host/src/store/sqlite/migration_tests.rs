//! Stores written by earlier schemas open at the current one with everything intact:
//! each test writes a file the way an older idem did (its migrations, its rows), then
//! opens it with this one.

use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;

use super::SqliteStore;
use super::schema::SCHEMA_VERSION;
use crate::store::tests::block_on;
use crate::store::{
    Acquired, Admission, CatalogStore, Checkpoint, ClaimOutcome, ClaimRequest, Counts, Deployment,
    InstanceStore, OpenClaim, OperatorStore, RunFence, RunFilter, RunStatus, StoreError, SyncMode,
    WorkerStore,
};

/// Creates a store file at schema `version` (its first `version` migrations) with the
/// rows of `sql`, as the idem of that version would have left it.
fn old_store(path: &Path, version: usize, sql: &str) {
    let migrations = [
        include_str!("../migrations/sqlite/0001_init.sql"),
        include_str!("../migrations/sqlite/0002_steps.sql"),
    ];
    let conn = Connection::open(path).unwrap();
    conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA foreign_keys = ON;")
        .unwrap();
    for migration in &migrations[..version] {
        conn.execute_batch(migration).unwrap();
    }
    conn.execute_batch(&format!(
        "PRAGMA application_id = 1768187245; PRAGMA user_version = {version};"
    ))
    .unwrap();
    conn.execute_batch(sql).unwrap();
}

/// Creates a store file at schema `version` with this build's first `version`
/// migrations and the rows of `sql`, as the idem of that version left it (foreign keys
/// off, as its migrations ran).
fn store_at(path: &Path, version: usize, sql: &str) {
    let conn = Connection::open(path).unwrap();
    conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA foreign_keys = OFF;")
        .unwrap();
    for migration in &super::schema::MIGRATIONS[..version] {
        conn.execute_batch(migration).unwrap();
    }
    conn.execute_batch(&format!(
        "PRAGMA application_id = 1768187245; PRAGMA user_version = {version};"
    ))
    .unwrap();
    conn.execute_batch(sql).unwrap();
}

fn tables(store: &SqliteStore) -> Vec<String> {
    block_on(store.db.read(|conn, _| {
        conn.prepare("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")?
            .query_map([], |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<String>>>()
    }))
    .unwrap()
}

/// A store written by version 2 (one `steps` row per key; runs with their input and
/// outcome in the row) opens as version 3 with its runs, results, claims and
/// checkpoints intact, its runs' components members of their namespaces, and its runs
/// ready for workers to lease.
#[test]
fn version_2_store_migrates_with_runs_results_and_checkpoints_intact() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    old_store(
        &path,
        2,
        "INSERT INTO runs (run_id, agent, digest, namespace, input, status, outcome,
                           executed, skipped, awaited, reclaimed, instances, created, updated)
         VALUES ('done', 'billing', 'd-old', 'billing', x'7b7d', 'completed', x'6f7574',
                 3, 1, 0, 0, 2, 100, 200),
                ('going', 'billing', 'd-new', 'billing', x'696e', 'running', NULL,
                 1, 0, 0, 1, 1, 300, 400),
                ('stuck', 'shipping', 'd-ship', 'shipping', x'', 'in-doubt',
                 CAST('in doubt at key shipping:k: unsure' AS BLOB), 0, 0, 0, 0, 1, 300, 500),
                ('broke', 'shipping', 'd-ship', 'shipping', x'', 'failed', CAST('boom' AS BLOB),
                 0, 0, 0, 0, 1, 50, 60);
         INSERT INTO run_upgrades (run_id, from_digest, to_digest, at)
         VALUES ('going', 'd-old', 'd-new', 350);
         INSERT INTO progress (run_id, step, state, updated)
         VALUES ('going', 7, x'0102', 400), ('done', 9223372036854775807, x'', 200);
         INSERT INTO steps (key, run_id, holder, token, attempt, lease_expires, parked,
                            fingerprint, result, committed_at)
         VALUES ('billing:a', 'done', NULL, 2, 2, 150, NULL, 'f', x'7231', 150),
                ('billing:b', 'going', 'old-instance', 5, 1, 9000, NULL, NULL, NULL, NULL),
                ('shipping:k', 'stuck', NULL, 3, 2, 450, 'unsure', NULL, NULL, NULL);",
    );
    let store = SqliteStore::open(&path, SyncMode::Normal).unwrap();
    assert_eq!(
        tables(&store),
        [
            "blob_bytes",
            "blobs",
            "components",
            "data_keys",
            "deployments",
            "epoch",
            "flow_limits",
            "join_members",
            "latest_progress",
            "namespace_members",
            "paused_deployments",
            "progress",
            "rate_limits",
            "run_events",
            "run_inputs",
            "run_live",
            "run_logs",
            "run_outcomes",
            "run_upgrades",
            "runs",
            "scheduled_runs",
            "schedules",
            "signals",
            "step_usage",
            "steps",
            "waits",
        ]
    );
    block_on(async {
        // Runs: statuses, outcomes, counts, steps and times as they were; no leases.
        let done = store.run("done").await.unwrap().unwrap();
        assert_eq!(
            (done.status, done.outcome.as_deref(), done.step),
            (
                RunStatus::Completed,
                Some(&b"out"[..]),
                Some(i64::MAX as u64)
            )
        );
        assert_eq!(
            done.counts,
            Counts {
                executed: 3,
                skipped: 1,
                awaited: 0,
                reclaimed: 0,
                instances: 2,
                recycled: 0,
            }
        );
        assert_eq!((done.created, done.updated, done.lease), (100, 200, None));
        let stuck = store.run("stuck").await.unwrap().unwrap();
        assert_eq!(stuck.status, RunStatus::InDoubt);
        assert_eq!(
            stuck.outcome.as_deref(),
            Some(&b"in doubt at key shipping:k: unsure"[..])
        );
        let order: Vec<String> = store
            .runs(&RunFilter::default())
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.run_id)
            .collect();
        assert_eq!(order, ["stuck", "going", "done", "broke"]);
        // Results, claims and checkpoints.
        assert_eq!(
            store.committed("billing:a").await.unwrap(),
            Some(b"r1".to_vec())
        );
        assert_eq!(
            store.open_claims(Some("going")).await.unwrap(),
            [OpenClaim {
                key: "billing:b".to_owned(),
                run_id: "going".to_owned(),
                holder: Some("old-instance".to_owned()),
                token: 5,
                attempt: 1,
                lease_expires: 9000,
                parked: None,
            }]
        );
        assert_eq!(
            store.load_progress("going").await.unwrap(),
            Some(Checkpoint {
                step: 7,
                state: vec![1, 2],
            })
        );
        let steps = store.steps("done").await.unwrap();
        assert_eq!(
            (steps[0].claimed_at, steps[0].committed_at),
            (150, Some(150))
        );
        // Every component a run of version 2 ran is a member of the run's namespace,
        // so that a first use by another component is refused.
        for (namespace, digest) in [
            ("billing", "d-old"),
            ("billing", "d-new"),
            ("shipping", "d-ship"),
        ] {
            assert_eq!(
                store.admitted(namespace, digest).await.unwrap(),
                Some(true),
                "{namespace} {digest}"
            );
        }
        assert_eq!(
            store.admitted("billing", "d-ship").await.unwrap(),
            Some(false)
        );
        store.put_component("intruder", b"").await.unwrap();
        let taken = store
            .deploy(&Deployment {
                name: "billing",
                digest: "intruder",
                authority: b"",
                admission: Admission::FirstUse,
                source: None,
            })
            .await;
        assert!(
            matches!(taken, Err(StoreError::NamespaceTaken { .. })),
            "{taken:?}"
        );
        // The running run is free for a worker, with its input and an empty authority;
        // finished ones are not.
        let leased = store
            .acquire_runs("w", 10, Duration::from_secs(60), &[])
            .await
            .unwrap();
        assert_eq!(leased.len(), 1);
        let going = &leased[0];
        assert_eq!(going.record.run_id, "going");
        assert_eq!(
            (going.input.as_slice(), going.authority.as_slice()),
            (&b"in"[..], &b""[..])
        );
        assert_eq!(going.token, 1);
        assert!(matches!(
            store
                .acquire_run("stuck", "w", Duration::from_secs(60))
                .await
                .unwrap(),
            Acquired::Finished(_)
        ));
        // The key's tokens go on: the old holder's claim is taken over above them.
        let fence = RunFence {
            run_id: "going".to_owned(),
            token: going.token,
            sync: SyncMode::Normal,
        };
        let req = ClaimRequest {
            key: "billing:b",
            fence: &fence,
            holder: "new-instance",
            fingerprint: None,
            lease: Duration::from_secs(60),
            durable: true,
        };
        let ClaimOutcome::Granted(grant) = store.take_over(&req, 5).await.unwrap() else {
            panic!("the old holder's claim is taken over");
        };
        assert_eq!((grant.token, grant.attempt, grant.in_doubt), (6, 2, true));
        // Resolving the run parked under version 2 works as it did.
        store
            .resolve(
                "stuck",
                "shipping:k",
                crate::store::Resolution::Commit(b"ok"),
            )
            .await
            .unwrap();
        assert_eq!(
            store.run("stuck").await.unwrap().unwrap().status,
            RunStatus::Running
        );
    });
    drop(store);
    // Opened again, nothing is migrated twice; the file is consistent.
    let conn = Connection::open(&path).unwrap();
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    let violations: i64 = conn
        .query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(violations, 0);
    drop(conn);
    drop(SqliteStore::open(&path, SyncMode::Normal).unwrap());
}

/// A store written by version 1 of the schema (claims and results in two tables, a
/// store-wide token counter) opens at the current version with every claim and result
/// intact, and its keys' tokens go on above the ones handed out before.
#[test]
fn version_1_store_migrates_with_claims_and_results_intact() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    old_store(
        &path,
        1,
        "INSERT INTO runs (run_id, agent, digest, namespace, input, status, created, updated)
             VALUES ('r', 'a', 'd', 'ns', x'', 'running', 0, 0);
         INSERT INTO claims (key, run_id, holder, token, attempt, lease_expires)
             VALUES ('ns:open', 'r', 'old-instance', 41, 2, 9223372036854775807);
         INSERT INTO results (key, run_id, result, token, attempt, committed_at)
             VALUES ('ns:done', 'r', x'6f6b', 40, 1, 5);
         UPDATE fencing SET last_token = 41;",
    );
    let store = SqliteStore::open(&path, SyncMode::Normal).unwrap();
    block_on(async {
        assert_eq!(
            store.committed("ns:done").await.unwrap(),
            Some(b"ok".to_vec())
        );
        assert_eq!(
            store.open_claims(None).await.unwrap(),
            vec![OpenClaim {
                key: "ns:open".into(),
                run_id: "r".into(),
                holder: Some("old-instance".into()),
                token: 41,
                attempt: 2,
                lease_expires: i64::MAX,
                parked: None,
            }]
        );
        let Acquired::Leased(run) = store
            .acquire_run("r", "w", Duration::from_secs(60))
            .await
            .unwrap()
        else {
            panic!("the run is leased");
        };
        let fence = RunFence {
            run_id: "r".to_owned(),
            token: run.token,
            sync: SyncMode::Normal,
        };
        let req = |key| ClaimRequest {
            key,
            fence: &fence,
            holder: "new-instance",
            fingerprint: None,
            lease: Duration::from_secs(60),
            durable: true,
        };
        assert_eq!(
            store.claim(&req("ns:done")).await.unwrap(),
            ClaimOutcome::Committed(b"ok".to_vec())
        );
        let ClaimOutcome::Granted(grant) = store.take_over(&req("ns:open"), 41).await.unwrap()
        else {
            panic!("the old holder's claim is taken over");
        };
        assert_eq!((grant.token, grant.attempt, grant.in_doubt), (42, 3, true));
    });
    assert!(
        !tables(&store)
            .iter()
            .any(|t| t == "claims" || t == "fencing")
    );
}

/// A store written by version 17 (deployments without versions, runs without one, an
/// `idem run --upgrade` recorded by digests only) opens as version 18: each name's
/// deployments numbered in the order they were made, each run on the latest version of
/// its name with its component, the old move a person's (`dev`), and rolling it back
/// finds the version by its component.
#[test]
fn version_17_store_numbers_deployments_and_places_runs_on_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    store_at(
        &path,
        17,
        "INSERT INTO components (digest, bytes, size, created)
         VALUES ('d1', x'00', 1, 1), ('d2', x'00', 1, 1);
         INSERT INTO deployments (name, digest, authority, admission, deployed_at, source)
         VALUES ('mailer', 'd1', x'', 'explicit', 10, NULL),
                ('other', 'd1', x'', 'explicit', 15, NULL),
                ('mailer', 'd2', x'', 'explicit', 20, NULL);
         INSERT INTO runs (run_id, agent, digest, namespace, status, created, updated)
         VALUES ('a', 'mailer', 'd1', 'mailer', 'running', 40, 40),
                ('b', 'mailer', 'd2', 'mailer', 'queued', 41, 41),
                ('c', 'mailer', 'gone', 'mailer', 'queued', 42, 42);
         INSERT INTO run_inputs (run_id, input, authority)
         VALUES ('a', x'', x''), ('b', x'', x''), ('c', x'', x'');
         INSERT INTO run_upgrades (run_id, from_digest, to_digest, at)
         VALUES ('b', 'd1', 'd2', 45);",
    );
    let store = SqliteStore::open(&path, SyncMode::Normal).unwrap();
    block_on(async {
        let versions: Vec<(u64, String, u64)> = store
            .versions("mailer")
            .await
            .unwrap()
            .into_iter()
            .map(|v| (v.deployment.version, v.deployment.digest, v.runs_in_flight))
            .collect();
        assert_eq!(versions, [(1, "d1".into(), 1), (2, "d2".into(), 1)]);
        assert_eq!(
            store.versions("other").await.unwrap()[0].deployment.version,
            1
        );
        let version = |id: &'static str| {
            let store = &store;
            async move { store.run(id).await.unwrap().unwrap().version }
        };
        assert_eq!(
            (version("a").await, version("b").await, version("c").await),
            (Some(1), Some(2), None)
        );
        let moves = store.run_moves("b").await.unwrap();
        assert_eq!(
            moves
                .iter()
                .map(|m| (m.from_version, m.to_version, m.reason))
                .collect::<Vec<_>>(),
            [(None, None, crate::store::MoveReason::Dev)]
        );
        let back = store
            .move_runs(&crate::store::MoveRuns {
                name: "mailer",
                to: crate::store::MoveTo::Back,
                runs: &["b".to_owned()],
            })
            .await
            .unwrap();
        assert_eq!(
            (back[0].to_version, back[0].to_digest.as_str()),
            (Some(1), "d1")
        );
        // The next deployment of the name is its version 3.
        store.put_component("d3", b"\0asm").await.unwrap();
        let d3 = store
            .deploy(&Deployment {
                name: "mailer",
                digest: "d3",
                authority: b"",
                admission: Admission::Explicit,
                source: None,
            })
            .await
            .unwrap();
        assert_eq!(d3.version, 3);
    });
}

#[test]
fn version_19_store_keeps_its_checkpoints_and_orders_its_steps_by_commit_time() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    store_at(
        &path,
        19,
        "INSERT INTO components (digest, bytes, size, created) VALUES ('d1', x'00', 1, 1);
         INSERT INTO runs (run_id, agent, digest, namespace, status, created, updated)
         VALUES ('a', 'mailer', 'd1', 'mailer', 'running', 40, 40);
         INSERT INTO run_inputs (run_id, input, authority) VALUES ('a', x'7b7d', x'');
         INSERT INTO progress (run_id, step, state, updated) VALUES ('a', 2, x'7332', 50);
         INSERT INTO steps (key, run_id, token, attempt, claimed_at, lease_expires, result,
                            committed_at)
         VALUES ('mailer:a/second', 'a', 1, 1, 45, 45, x'32', 46),
                ('mailer:a/first', 'a', 1, 1, 41, 41, x'31', 42);",
    );
    let store = SqliteStore::open(&path, SyncMode::Normal).unwrap();
    block_on(async {
        assert_eq!(
            store.load_progress("a").await.unwrap(),
            Some(Checkpoint {
                step: 2,
                state: b"s2".to_vec()
            })
        );
        let history = store.history("a").await.unwrap().unwrap();
        let keys: Vec<&str> = history.steps.iter().map(|s| s.key.as_str()).collect();
        assert_eq!(keys, ["mailer:a/first", "mailer:a/second"]);
        assert_eq!(history.checkpoints.len(), 1);
        // The checkpoint stands at its time: after both steps.
        assert_eq!(history.checkpoints[0].after, 2);
        // A fork at the second step: the first's result copied, no checkpoint before it.
        let forked = store
            .fork(&crate::store::ForkRequest {
                run_id: "a",
                at: 2,
                new_run_id: "f",
                input: None,
                version: None,
            })
            .await
            .unwrap();
        assert_eq!((forked.reused, forked.checkpoint), (1, None));
        let ns = crate::store::fork_namespace("mailer", "f");
        assert_eq!(
            store.committed(&format!("{ns}:f/first")).await.unwrap(),
            Some(b"1".to_vec())
        );
    });
}

#[test]
fn version_21_store_keeps_its_history_and_gc_still_collects_it_with_its_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    store_at(
        &path,
        21,
        "INSERT INTO components (digest, bytes, size, created) VALUES ('d1', x'00', 1, 1);
         INSERT INTO runs (run_id, agent, digest, namespace, status, created, updated)
         VALUES ('a', 'mailer', 'd1', 'mailer', 'completed', 40, 40);
         INSERT INTO run_inputs (run_id, input, authority) VALUES ('a', x'7b7d', x'');
         INSERT INTO progress (run_id, lease, tick, step, state, updated)
         VALUES ('a', 1, 10, 1, x'7331', 41), ('a', 1, 20, 2, NULL, 42),
                ('a', 2, 5, 3, x'7333', 43);
         INSERT INTO latest_progress (run_id, lease, tick, step, state, updated)
         VALUES ('a', 2, 5, 3, x'7333', 43);",
    );
    let store = SqliteStore::open(&path, SyncMode::Normal).unwrap();
    block_on(async {
        let history = store.history("a").await.unwrap().unwrap();
        let kept: Vec<(u64, u64, u64, bool)> = history
            .checkpoints
            .iter()
            .map(|c| (c.position.lease, c.position.tick, c.step, c.kept))
            .collect();
        assert_eq!(kept, [(1, 10, 1, true), (1, 20, 2, false), (2, 5, 3, true)]);
        // The history no longer refers to its run by a foreign key: gc deletes it with
        // the run, as it deletes the run's other rows.
        let report = store
            .gc(&crate::store::GcRequest {
                finished_before: Duration::ZERO,
                dedupe_window: Duration::ZERO,
                include_failed: false,
                history_before: None,
                dry_run: false,
            })
            .await
            .unwrap();
        assert_eq!((report.runs, report.checkpoints), (1, 3));
        assert!(store.history("a").await.unwrap().is_none());
    });
    let left: i64 = block_on(
        store
            .db
            .read(|conn, _| conn.query_row("SELECT count(*) FROM progress", [], |r| r.get(0))),
    )
    .unwrap();
    assert_eq!(left, 0);
}
