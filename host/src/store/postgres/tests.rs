//! What only the PostgreSQL backend has: the schema's version checks, and the rules the
//! database itself enforces against any client, not only idem's statements.

use crate::store::tests::postgres_harness::{blocking, test_server, url_with_schema};
use crate::store::tests::{LEASE, block_on};
use crate::store::{
    Acquired, CatalogStore, ClaimOutcome, ClaimRequest, InstanceStore, OperatorStore,
    PostgresStore, RunFence, StoreError, Submission, SyncMode, WorkerStore,
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

/// Submits run `run_id` (of an empty component) and leases it: its lease token.
async fn leased(store: &PostgresStore, run_id: &str) -> u64 {
    store.put_component("00", b"").await.unwrap();
    let submission = Submission {
        run_id,
        agent: "a",
        digest: "00",
        namespace: "a",
        input: b"",
        authority: b"",
        replace_authority: false,
        priority: 0,
    };
    store.submit(&submission).await.unwrap();
    match store.acquire_run(run_id, "w", LEASE).await.unwrap() {
        Acquired::Leased(run) => run.token,
        other => panic!("{run_id}: a fresh run is leased, got {other:?}"),
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
        let fence = RunFence {
            run_id: "r".into(),
            token: leased(&store, "r").await,
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

/// Claims and commits of many runs at once go out in shared statements, and each
/// member still gets exactly the answer it would get alone: its grant, the other
/// holder of a key two runs want, its own lost lease, its own commit with its counts
/// and checkpoint.
#[test]
fn many_runs_writes_share_statements_and_each_keeps_its_own_answer() {
    use crate::store::{Checkpoint, ClaimRef, Commit, Counts};
    use std::sync::Arc;

    let Some(schema) = Schema::create("batch") else {
        return;
    };
    let store = Arc::new(schema.connect().unwrap());
    const RUNS: usize = 24;
    block_on(async {
        let mut fences = Vec::new();
        for i in 0..RUNS {
            let run_id = format!("r{i}");
            let token = leased(&store, &run_id).await;
            // The last run writes with a lease it never had: a zombie's.
            let token = if i == RUNS - 1 { token + 1 } else { token };
            fences.push(RunFence {
                run_id,
                token,
                sync: SyncMode::Full,
            });
        }
        let fences = Arc::new(fences);
        // Every run claims a key of its own; runs 0 and 1 also race for one key.
        let mut claims = tokio::task::JoinSet::new();
        for i in 0..RUNS + 2 {
            let (store, fences) = (store.clone(), fences.clone());
            claims.spawn(async move {
                let (run, key) = match i {
                    i if i < RUNS => (i, format!("k{i}")),
                    i => (i - RUNS, "shared".to_owned()),
                };
                let holder = format!("h{run}");
                let req = ClaimRequest {
                    key: &key,
                    fence: &fences[run],
                    holder: &holder,
                    fingerprint: Some("f"),
                    lease: LEASE,
                    durable: true,
                };
                (run, key.clone(), store.claim(&req).await)
            });
        }
        let mut grants = Vec::new();
        let (mut shared_granted, mut shared_held) = (0, 0);
        while let Some(answer) = claims.join_next().await {
            let (run, key, outcome) = answer.unwrap();
            match (key.as_str(), outcome) {
                (_, Err(StoreError::LeaseLost { run_id, .. })) if run == RUNS - 1 => {
                    assert_eq!(run_id, format!("r{run}"));
                }
                ("shared", Ok(ClaimOutcome::Granted(_))) => shared_granted += 1,
                ("shared", Ok(ClaimOutcome::Held(_))) => shared_held += 1,
                (_, Ok(ClaimOutcome::Granted(grant))) => {
                    assert_eq!((grant.attempt, grant.in_doubt), (1, false), "{key}");
                    grants.push((run, key, grant.token));
                }
                (key, other) => panic!("run {run}, key {key}: {other:?}"),
            }
        }
        assert_eq!((shared_granted, shared_held), (1, 1));
        assert_eq!(grants.len(), RUNS - 1);
        assert!(
            store.batches.largest() > 1,
            "{} claims at once went out one by one",
            RUNS + 2
        );

        // Commits: even runs with counts and a checkpoint, odd ones with neither.
        let mut commits = tokio::task::JoinSet::new();
        for (run, key, token) in grants {
            let (store, fences) = (store.clone(), fences.clone());
            commits.spawn(async move {
                let counts = Counts {
                    executed: run as u64 + 1,
                    instances: 1,
                    ..Counts::default()
                };
                let checkpoint = Checkpoint {
                    step: run as u64 + 10,
                    state: format!("state {run}").into_bytes(),
                };
                let even = run % 2 == 0;
                let result = format!("result {run}").into_bytes();
                let commit = Commit {
                    claim: ClaimRef {
                        key: &key,
                        token,
                        fence: &fences[run],
                    },
                    result: &result,
                    checkpoint: even.then_some(&checkpoint),
                    counts: even.then_some(&counts),
                };
                store.commit(&commit).await.unwrap();
            });
        }
        // The zombie's commit of a key it never held is refused for its lease.
        let zombie = ClaimRef {
            key: "k-zombie",
            token: 1,
            fence: &fences[RUNS - 1],
        };
        let refused = store
            .commit(&Commit {
                claim: zombie,
                result: b"x",
                checkpoint: None,
                counts: None,
            })
            .await;
        assert!(
            matches!(refused, Err(StoreError::LeaseLost { .. })),
            "{refused:?}"
        );
        while let Some(done) = commits.join_next().await {
            done.unwrap();
        }
        for run in 0..RUNS - 1 {
            let committed = store.committed(&format!("k{run}")).await.unwrap();
            assert_eq!(committed, Some(format!("result {run}").into_bytes()));
            let record = store.run(&format!("r{run}")).await.unwrap().unwrap();
            let progress = store.load_progress(&format!("r{run}")).await.unwrap();
            if run % 2 == 0 {
                assert_eq!(record.counts.executed, run as u64 + 1);
                let progress = progress.expect("a checkpoint was committed");
                assert_eq!(progress.step, run as u64 + 10);
                assert_eq!(progress.state, format!("state {run}").into_bytes());
            } else {
                assert_eq!(record.counts.executed, 0);
                assert_eq!(progress, None);
            }
        }
        assert_eq!(store.committed("k-zombie").await.unwrap(), None);
        assert_eq!(
            store.committed(&format!("k{}", RUNS - 1)).await.unwrap(),
            None
        );
    });
}

/// A run of a batch that another submitter creates between the batch's first read and
/// its insert: the batch's writes are rolled back and it goes one run at a time, each
/// member answered as a lone submit after the other's commit would be.
#[test]
fn a_batch_raced_by_another_submitter_is_answered_run_by_run() {
    let Some(schema) = Schema::create("raced_batch") else {
        return;
    };
    let store = schema.connect().unwrap();
    // A runtime with I/O: the test's own client talks to the server too.
    blocking(async {
        store.put_component("00", b"").await.unwrap();
        let (client, connection) = tokio_postgres::connect(&schema.url(), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(connection);
        // The other submitter's run, not yet committed: the batch's read misses it, and
        // its insert waits for it.
        client
            .batch_execute(
                "BEGIN;
                 INSERT INTO runs (run_id, agent, digest, namespace, status, created, updated)
                 VALUES ('raced', 'a', '00', 'a', 'queued', 1, 1);
                 INSERT INTO run_inputs (run_id, input, authority)
                 VALUES ('raced', '\\x7b7d', '\\x');",
            )
            .await
            .unwrap();
        let submission = |run_id, input| Submission {
            run_id,
            agent: "a",
            digest: "00",
            namespace: "a",
            input,
            authority: b"mine",
            replace_authority: false,
            priority: 0,
        };
        let batch = [
            submission("fresh", b"{}"),
            submission("raced", b"{}"),
            submission("raced", b"{\"other\":1}"),
        ];
        let commit = async {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            client.batch_execute("COMMIT").await.unwrap();
        };
        let (answers, ()) = tokio::join!(store.submit_many(&batch), commit);
        let answers = answers.unwrap();
        let fresh = answers[0].as_ref().unwrap();
        assert!(fresh.created);
        let raced = answers[1].as_ref().unwrap();
        assert!(!raced.created, "the other submitter's run is found");
        assert_eq!(raced.record.created, 1);
        assert!(matches!(answers[2], Err(StoreError::InputMismatch { .. })));
        // The other submitter's authority stands; the batch wrote each row once.
        assert_eq!(
            store.run_authority("raced").await.unwrap(),
            Some(Vec::new())
        );
        assert_eq!(
            store.run_authority("fresh").await.unwrap().as_deref(),
            Some(&b"mine"[..])
        );
        let rows = client
            .query_one("SELECT count(*) FROM runs", &[])
            .await
            .unwrap()
            .get::<_, i64>(0);
        assert_eq!(rows, 2);
    });
}

/// Leases run `parent`, spawns `n` children of deployment `kid` under it (keys `0`, `1`,
/// ...) and joins them all under key `all`, not yet suspended: its fence and its
/// children's ids.
async fn joining_parent(store: &PostgresStore, parent: &str, n: usize) -> (RunFence, Vec<String>) {
    use crate::store::{
        Admission, Deployment, JoinMode, JoinRequest, SpawnLimits, SpawnRequest, WaitState,
        child_run_id,
    };
    let token = leased(store, parent).await;
    let fence = RunFence {
        run_id: parent.into(),
        token,
        sync: SyncMode::Normal,
    };
    store
        .deploy(&Deployment {
            name: "kid",
            digest: "00",
            authority: b"",
            admission: Admission::Explicit,
            source: None,
        })
        .await
        .unwrap();
    let kids: Vec<String> = (0..n)
        .map(|k| child_run_id(parent, &k.to_string()))
        .collect();
    for (key, id) in kids.iter().enumerate() {
        store
            .spawn(&SpawnRequest {
                fence: &fence,
                key: &key.to_string(),
                child_id: id,
                deployment: "kid",
                input: b"{}",
                detached: false,
                limits: SpawnLimits {
                    max_depth: 3,
                    max_children: 64,
                },
            })
            .await
            .unwrap();
    }
    let join = JoinRequest {
        fence: &fence,
        key: "all",
        children: &kids,
        mode: JoinMode::All,
        timeout: None,
        max_children: 64,
    };
    assert_eq!(
        store.join(&join).await.unwrap(),
        WaitState::Pending { due: None }
    );
    (fence, kids)
}

/// Leases child run `child` for worker `w2`: its fence.
async fn child_fence(store: &PostgresStore, child: &str) -> RunFence {
    match store.acquire_run(child, "w2", LEASE).await.unwrap() {
        Acquired::Leased(run) => RunFence {
            run_id: child.to_owned(),
            token: run.token,
            sync: SyncMode::Normal,
        },
        other => panic!("{child}: {other:?}"),
    }
}

/// Ends every fence at once, each `Completed(b"1")` but where `end` says otherwise:
/// each one's answer, by its place.
async fn end_at_once(
    store: &std::sync::Arc<PostgresStore>,
    fences: Vec<RunFence>,
    end: impl Fn(usize) -> Option<crate::store::RunEnd<'static>>,
) -> Vec<Result<(), StoreError>> {
    use crate::store::{Counts, RunEnd};
    let mut ends = tokio::task::JoinSet::new();
    for (i, fence) in fences.into_iter().enumerate() {
        let (store, end) = (store.clone(), end(i).unwrap_or(RunEnd::Completed(b"1")));
        ends.spawn(async move { (i, store.finish_run(&fence, end, &Counts::default()).await) });
    }
    let mut answers: Vec<Option<Result<(), StoreError>>> = Vec::new();
    while let Some(answer) = ends.join_next().await {
        let (i, ended) = answer.unwrap();
        if answers.len() <= i {
            answers.resize_with(i + 1, || None);
        }
        answers[i] = Some(ended);
    }
    answers.into_iter().map(Option::unwrap).collect()
}

/// A parent's `join_left` and `wake_at`, as another client reads them.
async fn join_left(client: &tokio_postgres::Client, parent: &str) -> (Option<i64>, Option<i64>) {
    let row = client
        .query_one(
            "SELECT join_left, wake_at FROM runs WHERE run_id = $1",
            &[&parent],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// Another client of the schema.
async fn other_client(schema: &Schema) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&schema.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// The ends of many children of two suspended parents, made at once, go out in shared
/// statements, and each parent is counted down by exactly its children that ended: not
/// by one left in doubt, nor by a zombie's end refused for its lease.
#[test]
fn many_childrens_ends_share_statements_and_count_their_parents_down_exactly() {
    use crate::store::{Counts, RunEnd, RunStatus, Suspension};
    let Some(schema) = Schema::create("batched_ends") else {
        return;
    };
    let store = std::sync::Arc::new(schema.connect().unwrap());
    blocking(async {
        let (p1, kids1) = joining_parent(&store, "p1", 30).await;
        let (p2, kids2) = joining_parent(&store, "p2", 10).await;
        let suspension = Suspension {
            due: None,
            signal: None,
            join: Some("all"),
        };
        for parent in [&p1, &p2] {
            store
                .suspend_run(parent, &Counts::default(), &suspension)
                .await
                .unwrap();
        }
        let mut fences = Vec::new();
        for kid in kids1.iter().chain(&kids2) {
            fences.push(child_fence(&store, kid).await);
        }
        // p2's last child writes with a lease it never had: a zombie's.
        fences[39].token += 1;
        // p1's last child stops in doubt: not an end its parent counts.
        let answers = end_at_once(&store, fences, |i| (i == 29).then_some(RunEnd::InDoubt)).await;
        for (i, answer) in answers.iter().enumerate() {
            match (i, answer) {
                (39, Err(StoreError::LeaseLost { run_id, .. })) => assert_eq!(run_id, &kids2[9]),
                (i, Ok(())) if i != 39 => {}
                (i, other) => panic!("child {i}: {other:?}"),
            }
        }
        assert!(
            store.batches.largest() > 1,
            "40 ends at once went out one by one"
        );
        let client = other_client(&schema).await;
        assert_eq!(join_left(&client, "p1").await, (Some(1), Some(i64::MAX)));
        assert_eq!(join_left(&client, "p2").await, (Some(1), Some(i64::MAX)));
        for kid in kids1[..29].iter().chain(&kids2[..9]) {
            let run = store.run(kid).await.unwrap().unwrap();
            assert_eq!(run.status, RunStatus::Completed, "{kid}");
            assert_eq!(run.outcome.as_deref(), Some(&b"1"[..]), "{kid}");
            // Each end is on its run's timeline, written by the shared statement.
            let events = store.events(kid).await.unwrap().unwrap().events;
            let last = events.last().unwrap();
            assert_eq!(last.kind, crate::store::EventKind::Finished, "{kid}");
            assert_eq!(last.detail["status"], "completed", "{kid}");
        }
        let in_doubt = store.events(&kids1[29]).await.unwrap().unwrap().events;
        assert_eq!(in_doubt.last().unwrap().detail["status"], "in-doubt");
        assert_eq!(
            store.run(&kids2[9]).await.unwrap().unwrap().status,
            RunStatus::Running,
            "the zombie's end changed nothing"
        );
        assert!(
            store
                .events(&kids2[9])
                .await
                .unwrap()
                .unwrap()
                .events
                .is_empty(),
            "nor recorded anything"
        );
        // Its real holder's end is the last one p2 waits for.
        let last = child_fence_of(&store, &kids2[9]).await;
        store
            .finish_run(&last, RunEnd::Completed(b"1"), &Counts::default())
            .await
            .unwrap();
        let (left, wake_at) = join_left(&client, "p2").await;
        assert_eq!(left, Some(0));
        assert_ne!(wake_at, Some(i64::MAX), "p2 is due");
    });
}

/// The fence `child`'s current holder writes with.
async fn child_fence_of(store: &PostgresStore, child: &str) -> RunFence {
    let run = store.run(child).await.unwrap().unwrap();
    let lease = run.lease.unwrap();
    RunFence {
        run_id: child.to_owned(),
        token: lease.token,
        sync: SyncMode::Normal,
    }
}

/// Begins, on `client`, run `p`'s suspension in its join `all` with `left` children
/// counted as running, and holds it (the parent's row locked, the suspension not yet
/// visible to others): the future commits it after 300 ms.
async fn suspension_in_flight(
    client: &tokio_postgres::Client,
    left: i64,
) -> impl Future<Output = ()> + '_ {
    client
        .batch_execute(&format!(
            "BEGIN;
             UPDATE runs SET lease_holder = NULL, lease_expires = NULL, joining = 'all',
                             join_left = {left}, wake_at = 9223372036854775807
             WHERE run_id = 'p';"
        ))
        .await
        .unwrap();
    async move {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        client.batch_execute("COMMIT").await.unwrap();
    }
}

/// A child whose end is written while its parent's suspension is in flight (the
/// parent's row locked, its join not yet visible): the end's one statement waits for
/// the suspension, finds the end still owed to the parent, writes nothing, and the end
/// goes again in a transaction that counts it down. The parent is due, once.
#[test]
fn a_child_ending_while_its_parent_suspends_is_counted_down_once() {
    use crate::store::RunEnd;
    let Some(schema) = Schema::create("owed_count_down") else {
        return;
    };
    let store = schema.connect().unwrap();
    blocking(async {
        let (_, kids) = joining_parent(&store, "p", 2).await;
        let child = child_fence(&store, &kids[0]).await;
        // The parent's suspension, in flight: it counted both children as running.
        let client = other_client(&schema).await;
        let commit = suspension_in_flight(&client, 2).await;
        let counts = crate::store::Counts::default();
        let (ended, ()) = tokio::join!(
            store.finish_run(&child, RunEnd::Completed(b"1"), &counts),
            commit
        );
        ended.unwrap();
        let (left, wake_at) = join_left(&client, "p").await;
        assert_eq!(left, Some(1), "the end was counted down once");
        assert_eq!(wake_at, Some(i64::MAX), "one child is still running");
        let done = store.run(&kids[0]).await.unwrap().unwrap();
        assert_eq!(done.status, crate::store::RunStatus::Completed);
        assert_eq!(done.outcome.as_deref(), Some(&b"1"[..]));
    });
}

/// The same race for a batch of ends: the batch's statement waits for the suspension,
/// finds ends it cannot see owed to the parent, refuses itself, and each end goes
/// again alone. Every end is counted down once; the parent is due.
#[test]
fn ends_batched_while_their_parent_suspends_are_each_counted_down_once() {
    let Some(schema) = Schema::create("owed_batch") else {
        return;
    };
    let store = std::sync::Arc::new(schema.connect().unwrap());
    blocking(async {
        let (_, kids) = joining_parent(&store, "p", 8).await;
        let mut fences = Vec::new();
        for kid in &kids {
            fences.push(child_fence(&store, kid).await);
        }
        let client = other_client(&schema).await;
        let commit = suspension_in_flight(&client, 8).await;
        let (answers, ()) = tokio::join!(end_at_once(&store, fences, |_| None), commit);
        for (i, answer) in answers.iter().enumerate() {
            assert!(answer.is_ok(), "child {i}: {answer:?}");
        }
        assert!(
            store.batches.largest() > 1,
            "the ends queued went out one by one"
        );
        let (left, wake_at) = join_left(&client, "p").await;
        assert_eq!(left, Some(0), "each end was counted down once");
        assert_ne!(wake_at, Some(i64::MAX), "the parent is due");
    });
}

/// A schema written by version 15 (deployments without versions, runs without one, a
/// move recorded by digests only) migrates to 16: each name's deployments numbered in
/// the order they were made, each run on the latest version of its name with its
/// component, the old move a person's (`dev`), and the next deployment is version 3.
#[test]
fn a_version_15_schema_numbers_deployments_and_places_runs_on_them() {
    let Some(schema) = Schema::create("v15") else {
        return;
    };
    let mut setup = String::from(
        "CREATE TABLE idem_migrations (
             version    int8 PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now()
         );",
    );
    for (index, migration) in super::schema::MIGRATIONS[..15].iter().enumerate() {
        setup.push_str(migration);
        setup.push_str(&format!(
            ";\nINSERT INTO idem_migrations (version) VALUES ({});\n",
            index + 1
        ));
    }
    setup.push_str(
        "INSERT INTO components (digest, bytes, size, created)
         VALUES ('d1', '\\x00', 1, 1), ('d2', '\\x00', 1, 1);
         INSERT INTO deployments (name, digest, authority, admission, deployed_at)
         VALUES ('mailer', 'd1', '', 'explicit', 10), ('other', 'd1', '', 'explicit', 15),
                ('mailer', 'd2', '', 'explicit', 20);
         INSERT INTO runs (run_id, agent, digest, namespace, status, created, updated)
         VALUES ('a', 'mailer', 'd1', 'mailer', 'running', 40, 40),
                ('b', 'mailer', 'd2', 'mailer', 'queued', 41, 41);
         INSERT INTO run_inputs (run_id, input, authority)
         VALUES ('a', '', ''), ('b', '', '');
         INSERT INTO run_upgrades (run_id, from_digest, to_digest, at)
         VALUES ('b', 'd1', 'd2', 45);",
    );
    schema.sql(&setup).unwrap();
    let store = schema.connect().unwrap();
    block_on(async {
        let versions: Vec<(u64, String, u64)> = store
            .versions("mailer")
            .await
            .unwrap()
            .into_iter()
            .map(|v| (v.deployment.version, v.deployment.digest, v.runs_in_flight))
            .collect();
        assert_eq!(versions, [(1, "d1".into(), 1), (2, "d2".into(), 1)]);
        let a = store.run("a").await.unwrap().unwrap();
        let b = store.run("b").await.unwrap().unwrap();
        assert_eq!((a.version, b.version), (Some(1), Some(2)));
        let moves = store.run_moves("b").await.unwrap();
        assert_eq!(
            moves
                .iter()
                .map(|m| (m.from_version, m.reason))
                .collect::<Vec<_>>(),
            [(None, crate::store::MoveReason::Dev)]
        );
        store.put_component("d3", b"\0asm").await.unwrap();
        let d3 = store
            .deploy(&crate::store::Deployment {
                name: "mailer",
                digest: "d3",
                authority: b"",
                admission: crate::store::Admission::Explicit,
                source: None,
            })
            .await
            .unwrap();
        assert_eq!(d3.version, 3);
    });
}
