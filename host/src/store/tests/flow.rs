//! Flow control: a deployment's limit on running runs and per concurrency key, kept
//! by the lease query however many handles lease at once; priorities; refusals.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::{DIGEST, Env, Harness, RUN_LEASE, RUN_LEASE_MS, T0, block_on, fence};
use crate::store::{
    Admission, Clock, Counts, Deployment, FlowRefusal, FlowSetting, LeasedRun, RunEnd, Store,
    StoreError, Submission,
};

fn ids(runs: &[LeasedRun]) -> Vec<&str> {
    runs.iter().map(|r| r.record.run_id.as_str()).collect()
}

/// Deploys `billing`, which the runs of [`Env::submit`] are submitted under.
async fn deploy(store: &dyn Store) {
    store.put_component(DIGEST, b"\0asm").await.unwrap();
    store
        .deploy(&Deployment {
            name: "billing",
            digest: DIGEST,
            authority: b"authority",
            admission: Admission::Explicit,
            source: None,
        })
        .await
        .unwrap();
}

async fn submit(env: &Env<'_>, run_id: &str, input: &str, priority: u32) {
    env.store
        .submit(&Submission {
            run_id,
            agent: "billing",
            digest: DIGEST,
            namespace: "billing",
            input: input.as_bytes(),
            authority: b"authority",
            replace_authority: false,
            priority,
        })
        .await
        .unwrap();
}

async fn finish(env: &Env<'_>, run: &LeasedRun) {
    env.store
        .finish_run(
            &fence(&run.record.run_id, run.token),
            RunEnd::Completed(b""),
            &Counts::default(),
        )
        .await
        .unwrap();
}

pub(super) async fn a_deployment_limit_holds_across_workers(env: &Env<'_>) {
    let store = env.store;
    deploy(store).await;
    let limits = store
        .set_flow(&FlowSetting {
            deployment: "billing",
            max_running: Some(2),
            ..FlowSetting::default()
        })
        .await
        .unwrap();
    assert_eq!((limits.max_running, limits.key), (Some(2), None));
    for i in 0..5 {
        env.clock.set(T0 + i);
        submit(env, &format!("r{i}"), "{}", 0).await;
    }
    let a = store.acquire_runs("a", 5, RUN_LEASE, &[]).await.unwrap();
    assert_eq!(ids(&a), ["r0", "r1"]);
    assert!(
        store
            .acquire_runs("b", 5, RUN_LEASE, &[])
            .await
            .unwrap()
            .is_empty()
    );
    finish(env, &a[0]).await;
    let b = store.acquire_runs("b", 5, RUN_LEASE, &[]).await.unwrap();
    assert_eq!(ids(&b), ["r2"]);
    // A lease that ran out no longer counts: its run is free, and taken again first.
    env.advance(RUN_LEASE_MS + 1);
    let c = store.acquire_runs("c", 5, RUN_LEASE, &[]).await.unwrap();
    assert_eq!(ids(&c), ["r1", "r2"]);
    // Cleared, the deployment is unlimited again.
    assert!(store.clear_flow("billing").await.unwrap());
    assert!(!store.clear_flow("billing").await.unwrap());
    let d = store.acquire_runs("d", 5, RUN_LEASE, &[]).await.unwrap();
    assert_eq!(ids(&d), ["r3", "r4"]);
    assert!(store.flows().await.unwrap().is_empty());
}

pub(super) async fn a_concurrency_key_serialises_runs_per_key(env: &Env<'_>) {
    let store = env.store;
    deploy(store).await;
    // Submitted before the key is set: setting it reads their keys.
    submit(env, "early-a", r#"{"customer":"a"}"#, 0).await;
    submit(env, "early-none", r#"{"other":1}"#, 0).await;
    store
        .set_flow(&FlowSetting {
            deployment: "billing",
            max_running: None,
            key: Some("/customer"),
            per_key: Some(1),
        })
        .await
        .unwrap();
    let early = store.run("early-a").await.unwrap().unwrap();
    assert_eq!(early.flow_key.as_deref(), Some("a"));
    let unkeyed = store.run("early-none").await.unwrap().unwrap();
    assert_eq!(unkeyed.flow_key, None);
    env.advance(1);
    submit(env, "a2", r#"{"customer":"a"}"#, 0).await;
    env.advance(1);
    submit(env, "b1", r#"{"customer":"b"}"#, 0).await;
    env.advance(1);
    submit(env, "n1", r#"{"customer":7}"#, 0).await;
    env.advance(1);
    submit(env, "n2", r#"{"customer":"7"}"#, 0).await;
    assert_eq!(
        store.run("n1").await.unwrap().unwrap().flow_key.as_deref(),
        Some("7")
    );

    // One run per key; the unkeyed run is not held back.
    let first = store.acquire_runs("w1", 10, RUN_LEASE, &[]).await.unwrap();
    assert_eq!(ids(&first), ["early-a", "early-none", "b1", "n1"]);
    assert!(
        store
            .acquire_runs("w2", 10, RUN_LEASE, &[])
            .await
            .unwrap()
            .is_empty()
    );
    finish(env, &first[0]).await;
    let second = store.acquire_runs("w2", 10, RUN_LEASE, &[]).await.unwrap();
    assert_eq!(ids(&second), ["a2"]);
    finish(env, &first[3]).await;
    let third = store.acquire_runs("w2", 10, RUN_LEASE, &[]).await.unwrap();
    assert_eq!(ids(&third), ["n2"]);
}

pub(super) async fn priorities_lease_highest_first_then_oldest(env: &Env<'_>) {
    let store = env.store;
    deploy(store).await;
    for (i, (run, priority)) in [
        ("old", 0),
        ("p5", 5),
        ("p10", 10),
        ("p5-later", 5),
        ("new", 0),
    ]
    .into_iter()
    .enumerate()
    {
        env.clock.set(T0 + i as i64);
        submit(env, run, "{}", priority).await;
    }
    assert_eq!(store.run("p10").await.unwrap().unwrap().priority, 10);
    let got = store.acquire_runs("w", 2, RUN_LEASE, &[]).await.unwrap();
    assert_eq!(ids(&got), ["p10", "p5"]);
    let got = store.acquire_runs("w", 2, RUN_LEASE, &[]).await.unwrap();
    assert_eq!(ids(&got), ["p5-later", "old"]);
    // Under a limit, priority picks among the runs that fit.
    store
        .set_flow(&FlowSetting {
            deployment: "billing",
            max_running: Some(5),
            ..FlowSetting::default()
        })
        .await
        .unwrap();
    submit(env, "urgent", "{}", 1000).await;
    let got = store.acquire_runs("w", 5, RUN_LEASE, &[]).await.unwrap();
    assert_eq!(ids(&got), ["urgent"]);
}

pub(super) async fn bad_flow_settings_are_refused_and_change_nothing(env: &Env<'_>) {
    let store = env.store;
    deploy(store).await;
    let good = FlowSetting {
        deployment: "billing",
        max_running: Some(3),
        key: Some("/customer"),
        per_key: Some(1),
    };
    store.set_flow(&good).await.unwrap();
    let before = store.flows().await.unwrap();
    let bad = [
        (
            FlowSetting {
                max_running: Some(0),
                ..good
            },
            FlowRefusal::Zero,
        ),
        (
            FlowSetting {
                per_key: Some(0),
                ..good
            },
            FlowRefusal::Zero,
        ),
        (
            FlowSetting {
                max_running: Some(u32::MAX),
                ..good
            },
            FlowRefusal::Absurd(u64::from(u32::MAX)),
        ),
        (
            FlowSetting {
                key: Some("customer"),
                ..good
            },
            FlowRefusal::BadPointer("customer".into()),
        ),
        (
            FlowSetting { key: None, ..good },
            FlowRefusal::KeyWithoutLimit,
        ),
        (
            FlowSetting {
                deployment: "billing",
                ..FlowSetting::default()
            },
            FlowRefusal::Empty,
        ),
        (
            FlowSetting {
                deployment: "nobody",
                ..good
            },
            FlowRefusal::UnknownDeployment("nobody".into()),
        ),
    ];
    for (setting, expected) in bad {
        match store.set_flow(&setting).await {
            Err(StoreError::FlowRefused { refusal, .. }) => assert_eq!(refusal, expected),
            other => panic!("{setting:?}: expected a refusal, got {other:?}"),
        }
        assert_eq!(store.flows().await.unwrap(), before);
    }

    // A run whose input misses the key, or with an absurd priority, is not created.
    let submission = Submission {
        run_id: "no-key",
        agent: "billing",
        digest: DIGEST,
        namespace: "billing",
        input: br#"{"client":"a"}"#,
        authority: b"authority",
        replace_authority: false,
        priority: 0,
    };
    match store.submit(&submission).await {
        Err(StoreError::FlowKeyMissing {
            run_id, pointer, ..
        }) => assert_eq!((run_id.as_str(), pointer.as_str()), ("no-key", "/customer")),
        other => panic!("expected a missing key, got {other:?}"),
    }
    let absurd = Submission {
        run_id: "absurd",
        input: br#"{"customer":"a"}"#,
        priority: 1001,
        ..submission
    };
    assert!(matches!(
        store.submit(&absurd).await,
        Err(StoreError::PriorityRefused { priority: 1001 })
    ));
    assert!(store.run("no-key").await.unwrap().is_none());
    assert!(store.run("absurd").await.unwrap().is_none());
}

/// Three handles (three processes, or three machines on PostgreSQL) lease and finish
/// runs at once; a shared count, raised after each lease and lowered before each end
/// (so never above the store's own), never passes the limit, and reaches it.
pub(super) async fn racing_handles_never_exceed_a_limit(harness: &mut dyn Harness, clock: &Clock) {
    const RUNS: usize = 60;
    const LIMIT: usize = 3;
    let handles: Vec<Arc<dyn Store>> = vec![
        harness.store(),
        harness.open_another(),
        harness.open_another(),
    ];
    let env = Env {
        store: handles[0].as_ref(),
        clock,
    };
    deploy(env.store).await;
    env.store
        .set_flow(&FlowSetting {
            deployment: "billing",
            max_running: Some(LIMIT as u32),
            ..FlowSetting::default()
        })
        .await
        .unwrap();
    for i in 0..RUNS {
        submit(&env, &format!("run-{i:02}"), "{}", 0).await;
    }
    let running = AtomicUsize::new(0);
    let most = AtomicUsize::new(0);
    let done: Vec<Vec<String>> = std::thread::scope(|scope| {
        let workers: Vec<_> = handles
            .iter()
            .enumerate()
            .map(|(w, store)| {
                let (store, running, most) = (Arc::clone(store), &running, &most);
                scope.spawn(move || {
                    block_on(async move {
                        let worker = format!("worker-{w}");
                        let mut done = Vec::new();
                        let mut idle = 0;
                        while idle < 200 {
                            let lease = Duration::from_secs(3600);
                            let got = store.acquire_runs(&worker, 2, lease, &[]).await.unwrap();
                            if got.is_empty() {
                                idle += 1;
                                std::thread::yield_now();
                                continue;
                            }
                            idle = 0;
                            let now = running.fetch_add(got.len(), Ordering::SeqCst) + got.len();
                            most.fetch_max(now, Ordering::SeqCst);
                            for run in got {
                                running.fetch_sub(1, Ordering::SeqCst);
                                store
                                    .finish_run(
                                        &fence(&run.record.run_id, run.token),
                                        RunEnd::Completed(b""),
                                        &Counts::default(),
                                    )
                                    .await
                                    .unwrap();
                                done.push(run.record.run_id);
                            }
                        }
                        done
                    })
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let all: HashSet<&String> = done.iter().flatten().collect();
    assert_eq!(all.len(), RUNS, "every run ran once");
    assert_eq!(done.iter().map(Vec::len).sum::<usize>(), RUNS);
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= LIMIT,
        "{most} runs held at once, over the limit of {LIMIT}"
    );
}
