//! Child runs: spawned exactly once under their key, refused past the limits and in a
//! cycle with nothing written, joined durably (a parent suspended in a join is due when
//! its last child ends, and only then), and cancelled with their parent unless
//! detached.

use std::time::Duration;

use super::{DIGEST, Env, RUN_LEASE, T0};
use crate::store::{
    Admission, Cancelled, ChildSpec, Counts, Deployment, JoinMode, JoinRefusal, JoinRequest,
    RunEnd, RunFence, RunFilter, RunStatus, SpawnBatch, SpawnLimits, SpawnRefusal, SpawnRequest,
    StoreError, Suspension, WaitState, child_run_id,
};

const LIMITS: SpawnLimits = SpawnLimits {
    max_depth: 3,
    max_children: 4,
};

/// Deploys `worker` (the children's deployment) with authority `child-grant`.
async fn deploy_worker(env: &Env<'_>) {
    env.store.put_component(DIGEST, b"\0asm").await.unwrap();
    env.store
        .deploy(&Deployment {
            name: "worker",
            digest: DIGEST,
            authority: b"child-grant",
            admission: Admission::Explicit,
            source: None,
        })
        .await
        .unwrap();
}

fn spawn_req<'a>(fence: &'a RunFence, key: &'a str, child_id: &'a str) -> SpawnRequest<'a> {
    SpawnRequest {
        fence,
        key,
        child_id,
        deployment: "worker",
        input: b"{}",
        detached: false,
        limits: LIMITS,
    }
}

/// Spawns `key` from the fenced run; the child's id.
async fn spawn(env: &Env<'_>, fence: &RunFence, key: &str) -> String {
    let id = child_run_id(&fence.run_id, key);
    env.store.spawn(&spawn_req(fence, key, &id)).await.unwrap();
    id
}

fn join_req<'a>(
    fence: &'a RunFence,
    key: &'a str,
    children: &'a [String],
    mode: JoinMode,
) -> JoinRequest<'a> {
    JoinRequest {
        fence,
        key,
        children,
        mode,
        timeout: None,
        max_children: 100,
    }
}

async fn wake_at(env: &Env<'_>, run_id: &str) -> Option<i64> {
    env.store.run(run_id).await.unwrap().unwrap().wake_at
}

async fn status(env: &Env<'_>, run_id: &str) -> (RunStatus, bool) {
    let r = env.store.run(run_id).await.unwrap().unwrap();
    (r.status, r.cancel_requested)
}

/// Leases `child` and finishes it with `end`.
async fn finish(env: &Env<'_>, child: &str, end: RunEnd<'_>) {
    let fence = env.acquire(child, "w2").await;
    env.store
        .finish_run(&fence, end, &Counts::default())
        .await
        .unwrap();
}

pub(super) async fn a_spawn_happens_once_per_key_with_the_deployments_grants(env: &Env<'_>) {
    let store = env.store;
    deploy_worker(env).await;
    let fence = env.lease("p").await;
    let id = child_run_id("p", "a");
    let first = store.spawn(&spawn_req(&fence, "a", &id)).await.unwrap();
    assert!(first.created);
    // The parent resumed: the same key finds the same child and starts nothing.
    let again = store.spawn(&spawn_req(&fence, "a", &id)).await.unwrap();
    assert_eq!((again.run_id.as_str(), again.created), (id.as_str(), false));
    let child = store.run(&id).await.unwrap().unwrap();
    assert_eq!(
        (
            child.status,
            child.agent.as_str(),
            child.parent.as_deref(),
            child.spawn_key.as_deref()
        ),
        (RunStatus::Queued, "worker", Some("p"), Some("a"))
    );
    assert_eq!(child.namespace, "worker");
    assert_eq!(
        store.run_authority(&id).await.unwrap().as_deref(),
        Some(&b"child-grant"[..])
    );
    let listed = store
        .runs(&RunFilter {
            parent: Some("p"),
            ..RunFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    // The same key with other input is refused, changing nothing.
    let other = SpawnRequest {
        input: b"{\"other\":1}",
        ..spawn_req(&fence, "a", &id)
    };
    assert!(matches!(
        store.spawn(&other).await,
        Err(StoreError::SpawnRefused {
            refusal: SpawnRefusal::KeyReused {
                what: "other input",
                ..
            },
            ..
        })
    ));
    // A stale fence spawns nothing.
    let stale = RunFence {
        token: fence.token + 1,
        ..fence.clone()
    };
    let id_b = child_run_id("p", "b");
    assert!(matches!(
        store.spawn(&spawn_req(&stale, "b", &id_b)).await,
        Err(StoreError::LeaseLost { .. })
    ));
    assert_eq!(store.run(&id_b).await.unwrap(), None);
}

pub(super) async fn bad_spawns_are_refused_and_write_nothing(env: &Env<'_>) {
    let store = env.store;
    deploy_worker(env).await;
    let fence = env.lease("p").await;
    let refusal = |r: Result<_, StoreError>| match r {
        Err(StoreError::SpawnRefused { refusal, .. }) => refusal,
        other => panic!("expected a refusal, got {other:?}"),
    };
    let id = child_run_id("p", "x");
    let unknown = SpawnRequest {
        deployment: "nobody",
        ..spawn_req(&fence, "x", &id)
    };
    assert_eq!(
        refusal(store.spawn(&unknown).await),
        SpawnRefusal::UnknownDeployment("nobody".into())
    );
    for key in ["c1", "c2", "c3", "c4"] {
        spawn(env, &fence, key).await;
    }
    let fifth = child_run_id("p", "c5");
    assert_eq!(
        refusal(store.spawn(&spawn_req(&fence, "c5", &fifth)).await),
        SpawnRefusal::TooMany { count: 4 }
    );
    assert_eq!(store.run(&fifth).await.unwrap(), None);
    // Depth: p (0) -> c1 (1) -> d (2) -> e (3) -> past the limit of 3.
    let mut parent = child_run_id("p", "c1");
    for (depth, key) in [(2, "d"), (3, "e")] {
        let f = env.acquire(&parent, "w").await;
        let id = spawn(env, &f, key).await;
        assert_eq!(store.run(&id).await.unwrap().unwrap().parent, Some(parent));
        let _ = depth;
        parent = id;
    }
    let f = env.acquire(&parent, "w").await;
    let deep = child_run_id(&parent, "f");
    assert_eq!(
        refusal(store.spawn(&spawn_req(&f, "f", &deep)).await),
        SpawnRefusal::TooDeep { depth: 4, max: 3 }
    );
    // A child spawning what its parent was spawned as (deployment and key) would
    // spawn itself for ever.
    let c2 = child_run_id("p", "c2");
    let f = env.acquire(&c2, "w").await;
    let again = child_run_id(&c2, "c2");
    assert!(matches!(
        refusal(store.spawn(&spawn_req(&f, "c2", &again)).await),
        SpawnRefusal::Cycle { ancestor, .. } if ancestor == c2
    ));
    assert_eq!(store.run(&again).await.unwrap(), None);
}

pub(super) async fn a_batch_answers_each_child_as_a_spawn_of_it_alone_would(env: &Env<'_>) {
    let store = env.store;
    deploy_worker(env).await;
    let fence = env.lease("p").await;
    let keys = ["a", "b", "a", "x", "c", "d", "e"];
    let ids: Vec<String> = keys.iter().map(|k| child_run_id("p", k)).collect();
    let child = |at: usize| ChildSpec {
        key: keys[at],
        child_id: &ids[at],
        deployment: "worker",
        input: b"{}",
        detached: at == 1,
    };
    let mut specs: Vec<ChildSpec<'_>> = (0..keys.len()).map(child).collect();
    // `a` again with other input, `x` of an unknown deployment.
    specs[2].input = b"{\"other\":1}";
    specs[3].deployment = "nobody";
    let batch = SpawnBatch {
        fence: &fence,
        children: &specs,
        limits: LIMITS,
    };
    let answers = store.spawn_many(&batch).await.unwrap();
    let summary: Vec<Result<bool, SpawnRefusal>> = answers
        .iter()
        .map(|a| a.as_ref().map(|s| s.created).map_err(Clone::clone))
        .collect();
    assert_eq!(
        summary,
        vec![
            Ok(true),
            Ok(true),
            Err(SpawnRefusal::KeyReused {
                key: "a".into(),
                what: "other input"
            }),
            Err(SpawnRefusal::UnknownDeployment("nobody".into())),
            Ok(true),
            Ok(true),
            // The limit of 4 children counts those created earlier in the batch.
            Err(SpawnRefusal::TooMany { count: 4 }),
        ]
    );
    for (at, answer) in answers.iter().enumerate() {
        if let Ok(spawned) = answer {
            assert_eq!(spawned.run_id, ids[at]);
        }
    }
    let listed = store
        .runs(&RunFilter {
            parent: Some("p"),
            ..RunFilter::default()
        })
        .await
        .unwrap();
    let mut listed: Vec<(String, bool)> = listed
        .into_iter()
        .map(|r| (r.spawn_key.unwrap_or_default(), r.detached))
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        vec![
            ("a".into(), false),
            ("b".into(), true),
            ("c".into(), false),
            ("d".into(), false)
        ]
    );
    assert_eq!(store.run(&ids[6]).await.unwrap(), None);
    assert_eq!(
        store.run_authority(&ids[4]).await.unwrap().as_deref(),
        Some(&b"child-grant"[..])
    );
    // The same batch again (a resumed parent) starts nothing and answers the same,
    // with `created` false.
    let again = store.spawn_many(&batch).await.unwrap();
    for (first, second) in answers.iter().zip(&again) {
        match (first, second) {
            (Ok(a), Ok(b)) => {
                assert_eq!((a.run_id.as_str(), b.created), (b.run_id.as_str(), false))
            }
            (Err(a), Err(b)) => assert_eq!(a, b),
            other => panic!("answered differently: {other:?}"),
        }
    }
    // A stale fence spawns nothing at all.
    let stale = RunFence {
        token: fence.token + 1,
        ..fence.clone()
    };
    let late = [ChildSpec {
        key: "late",
        child_id: "p~late",
        deployment: "worker",
        input: b"{}",
        detached: false,
    }];
    assert!(matches!(
        store
            .spawn_many(&SpawnBatch {
                fence: &stale,
                children: &late,
                limits: LIMITS,
            })
            .await,
        Err(StoreError::LeaseLost { .. })
    ));
    assert_eq!(store.run("p~late").await.unwrap(), None);
}

pub(super) async fn a_parent_joining_all_is_due_once_when_its_last_child_ends(env: &Env<'_>) {
    let store = env.store;
    deploy_worker(env).await;
    let fence = env.lease("p").await;
    let kids = vec![
        spawn(env, &fence, "a").await,
        spawn(env, &fence, "b").await,
        spawn(env, &fence, "c").await,
    ];
    // One child ends before the join is reached.
    finish(env, &kids[1], RunEnd::Failed(b"boom")).await;
    let req = join_req(&fence, "all", &kids, JoinMode::All);
    assert_eq!(
        store.join(&req).await.unwrap(),
        WaitState::Pending { due: None }
    );
    let suspension = Suspension {
        due: None,
        signal: None,
        join: Some("all"),
    };
    store
        .suspend_run(&fence, &Counts::default(), &suspension)
        .await
        .unwrap();
    assert_eq!(wake_at(env, "p").await, Some(i64::MAX));
    finish(env, &kids[0], RunEnd::Completed(b"\"A\"")).await;
    // Two of three ended: still not due.
    assert_eq!(wake_at(env, "p").await, Some(i64::MAX));
    env.advance(5);
    finish(env, &kids[2], RunEnd::Cancelled).await;
    assert_eq!(wake_at(env, "p").await, Some(T0 + 5));
    let fence = env.acquire("p", "w").await;
    let req = join_req(&fence, "all", &kids, JoinMode::All);
    let WaitState::Joined(ends) = store.join(&req).await.unwrap() else {
        panic!("every child ended");
    };
    let seen: Vec<(u32, RunStatus, &[u8])> = ends
        .iter()
        .map(|e| (e.index, e.status, e.outcome.as_slice()))
        .collect();
    assert_eq!(
        seen,
        [
            (0, RunStatus::Completed, &b"\"A\""[..]),
            (1, RunStatus::Failed, &b"boom"[..]),
            (2, RunStatus::Cancelled, &b""[..]),
        ]
    );
    // Asked again (a replay), the join answers the same.
    assert_eq!(store.join(&req).await.unwrap(), WaitState::Joined(ends));
    // Other children under the same key are refused.
    let fewer = kids[..2].to_vec();
    assert!(matches!(
        store
            .join(&join_req(&fence, "all", &fewer, JoinMode::All))
            .await,
        Err(StoreError::JoinRefused {
            refusal: JoinRefusal::KeyReused(_),
            ..
        })
    ));
    let waits = store.waits("p").await.unwrap();
    assert_eq!(waits[0].join.as_deref(), Some("all"));
    assert_eq!(
        waits[0].join_children,
        Some(3),
        "the join lists three children"
    );
}

pub(super) async fn a_join_of_any_takes_the_first_child_to_end(env: &Env<'_>) {
    let store = env.store;
    deploy_worker(env).await;
    let fence = env.lease("p").await;
    let kids = vec![spawn(env, &fence, "a").await, spawn(env, &fence, "b").await];
    let req = join_req(&fence, "any", &kids, JoinMode::Any);
    assert_eq!(
        store.join(&req).await.unwrap(),
        WaitState::Pending { due: None }
    );
    let suspension = Suspension {
        due: None,
        signal: None,
        join: Some("any"),
    };
    store
        .suspend_run(&fence, &Counts::default(), &suspension)
        .await
        .unwrap();
    env.advance(7);
    finish(env, &kids[1], RunEnd::Completed(b"2")).await;
    assert_eq!(store.run("p").await.unwrap().unwrap().wake_at, Some(T0 + 7));
    env.advance(1);
    finish(env, &kids[0], RunEnd::Completed(b"1")).await;
    let fence = env.acquire("p", "w").await;
    let req = join_req(&fence, "any", &kids, JoinMode::Any);
    let WaitState::Joined(ends) = store.join(&req).await.unwrap() else {
        panic!("a child ended");
    };
    assert_eq!(ends.len(), 1);
    assert_eq!((ends[0].index, ends[0].outcome.as_slice()), (1, &b"2"[..]));
    assert_eq!(store.join(&req).await.unwrap(), WaitState::Joined(ends));
}

pub(super) async fn a_child_ending_before_the_suspension_makes_the_parent_due_at_once(
    env: &Env<'_>,
) {
    let store = env.store;
    deploy_worker(env).await;
    let fence = env.lease("p").await;
    let kids = vec![spawn(env, &fence, "a").await];
    let req = join_req(&fence, "j", &kids, JoinMode::All);
    assert_eq!(
        store.join(&req).await.unwrap(),
        WaitState::Pending { due: None }
    );
    // The child ends between the join's look and the parent's suspension.
    finish(env, &kids[0], RunEnd::Completed(b"1")).await;
    let suspension = Suspension {
        due: None,
        signal: None,
        join: Some("j"),
    };
    store
        .suspend_run(&fence, &Counts::default(), &suspension)
        .await
        .unwrap();
    let got = store.acquire_runs("w", 10, RUN_LEASE, &[]).await.unwrap();
    assert_eq!(got.len(), 1, "the parent is due at once");
    assert_eq!(got[0].record.run_id, "p");
}

pub(super) async fn bad_joins_are_refused_and_write_nothing(env: &Env<'_>) {
    let store = env.store;
    deploy_worker(env).await;
    let fence = env.lease("p").await;
    env.submit("stranger", b"in").await;
    let kid = spawn(env, &fence, "a").await;
    let refused = |r: Result<WaitState, StoreError>| match r {
        Err(StoreError::JoinRefused { refusal, .. }) => refusal,
        other => panic!("expected a refusal, got {other:?}"),
    };
    let cases: Vec<(Vec<String>, JoinRefusal)> = vec![
        (vec![], JoinRefusal::NoChildren),
        (
            vec![kid.clone(), kid.clone()],
            JoinRefusal::Repeated(kid.clone()),
        ),
        (
            vec![kid.clone(), "stranger".into()],
            JoinRefusal::NotAChild("stranger".into()),
        ),
        (
            vec!["no-such-run".into()],
            JoinRefusal::NotAChild("no-such-run".into()),
        ),
    ];
    for (children, expected) in cases {
        let req = join_req(&fence, "j", &children, JoinMode::All);
        assert_eq!(refused(store.join(&req).await), expected);
    }
    let many: Vec<String> = (0..101).map(|i| format!("r{i}")).collect();
    assert!(matches!(
        refused(
            store
                .join(&join_req(&fence, "j", &many, JoinMode::All))
                .await
        ),
        JoinRefusal::TooMany { count: 101, .. }
    ));
    let forever = JoinRequest {
        timeout: Some(Duration::MAX),
        ..join_req(&fence, "j", std::slice::from_ref(&kid), JoinMode::All)
    };
    assert!(matches!(
        refused(store.join(&forever).await),
        JoinRefusal::InvalidTime(_)
    ));
    assert!(store.waits("p").await.unwrap().is_empty());
}

pub(super) async fn a_join_times_out_on_the_stores_clock(env: &Env<'_>) {
    let store = env.store;
    deploy_worker(env).await;
    let fence = env.lease("p").await;
    let kids = vec![spawn(env, &fence, "a").await];
    let req = JoinRequest {
        timeout: Some(Duration::from_secs(10)),
        ..join_req(&fence, "j", &kids, JoinMode::All)
    };
    assert_eq!(
        store.join(&req).await.unwrap(),
        WaitState::Pending {
            due: Some(T0 + 10_000)
        }
    );
    env.advance(10_000);
    assert_eq!(store.join(&req).await.unwrap(), WaitState::TimedOut);
    // Timed out is recorded: the child ending later changes nothing.
    finish(env, &kids[0], RunEnd::Completed(b"1")).await;
    assert_eq!(store.join(&req).await.unwrap(), WaitState::TimedOut);
}

pub(super) async fn cancelling_a_parent_cancels_its_children_but_not_detached_ones(env: &Env<'_>) {
    let store = env.store;
    deploy_worker(env).await;
    let fence = env.lease("p").await;
    let queued = spawn(env, &fence, "queued").await;
    let running = spawn(env, &fence, "running").await;
    let done = spawn(env, &fence, "done").await;
    let detached_id = child_run_id("p", "detached");
    store
        .spawn(&SpawnRequest {
            detached: true,
            ..spawn_req(&fence, "detached", &detached_id)
        })
        .await
        .unwrap();
    finish(env, &done, RunEnd::Completed(b"1")).await;
    let running_fence = env.acquire(&running, "w3").await;
    let grandchild = spawn(env, &running_fence, "g").await;
    // The parent is held by its worker: the cancel is asked of it, and the children
    // go at once (or are asked, where a worker holds them).
    assert!(matches!(
        store.cancel_run("p").await.unwrap(),
        Cancelled::Requested { .. }
    ));
    assert_eq!(
        status(env, &queued).await,
        (RunStatus::Cancelled, false),
        "queued"
    );
    assert_eq!(
        status(env, &running).await,
        (RunStatus::Running, true),
        "held by a worker: asked"
    );
    assert_eq!(
        status(env, &grandchild).await,
        (RunStatus::Cancelled, false),
        "a child's child"
    );
    assert_eq!(status(env, &done).await, (RunStatus::Completed, false));
    assert_eq!(status(env, &detached_id).await, (RunStatus::Queued, false));
    // The running child's worker ends it cancelled.
    store
        .finish_run(&running_fence, RunEnd::Cancelled, &Counts::default())
        .await
        .unwrap();
    assert_eq!(status(env, &running).await, (RunStatus::Cancelled, false));
}
