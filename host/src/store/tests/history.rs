//! A run's step history (its committed steps and every checkpoint it saved, in order,
//! even within one millisecond), forks made from it, what is refused (changing
//! nothing), and gc collecting a finished run's history.

use std::time::Duration;

use super::{Env, claim};
use crate::store::{
    Checkpoint, Commit, Counts, EventKind, ForkRefusal, ForkRequest, GcRequest, RunEnd, RunStatus,
    StoreError, fork_namespace,
};

/// Run `r1` of `billing`, leased, with `steps` steps committed (keys `billing:r1/s{i}`,
/// results `result {i}`), each with a checkpoint at step `i` (state `state {i}`). The
/// clock never moves: the order comes from positions, not times.
async fn run_of(env: &Env<'_>, steps: u64) -> crate::store::RunFence {
    let fence = env.lease("r1").await;
    for i in 1..=steps {
        commit_step(env, &fence, i, true).await;
    }
    fence
}

async fn commit_step(env: &Env<'_>, fence: &crate::store::RunFence, i: u64, save: bool) {
    let key = format!("billing:r1/s{i}");
    let grant = env.grant(&key, "a", fence).await;
    let checkpoint = Checkpoint {
        step: i,
        state: format!("state {i}").into_bytes(),
    };
    env.store
        .commit(&Commit {
            claim: claim(&key, grant.token, fence),
            result: format!("result {i}").as_bytes(),
            checkpoint: save.then_some(&checkpoint),
            counts: None,
        })
        .await
        .unwrap();
}

fn fork<'a>(run_id: &'a str, at: u64, new_run_id: &'a str) -> ForkRequest<'a> {
    ForkRequest {
        run_id,
        at,
        new_run_id,
        input: None,
        version: None,
    }
}

pub(super) async fn a_runs_history_keeps_its_steps_and_checkpoints_in_order(env: &Env<'_>) {
    let store = env.store;
    let fence = run_of(env, 1).await;
    commit_step(env, &fence, 2, false).await;
    // A save of its own after step 2, then step 3 with its checkpoint.
    store
        .save_progress(
            &fence,
            &Checkpoint {
                step: 20,
                state: b"saved alone".to_vec(),
            },
            None,
        )
        .await
        .unwrap();
    commit_step(env, &fence, 3, true).await;
    // Step 4 under a new lease.
    store
        .release_run(&fence, &Counts::default(), None)
        .await
        .unwrap();
    let second = env.acquire("r1", "w2").await;
    assert!(second.token > fence.token);
    commit_step(env, &second, 4, false).await;

    let history = store.history("r1").await.unwrap().unwrap();
    let keys: Vec<(u64, &str)> = history
        .steps
        .iter()
        .map(|s| (s.n, s.key.as_str()))
        .collect();
    assert_eq!(
        keys,
        [
            (1, "billing:r1/s1"),
            (2, "billing:r1/s2"),
            (3, "billing:r1/s3"),
            (4, "billing:r1/s4")
        ]
    );
    assert_eq!(history.steps[3].position.lease, second.token);
    let saved: Vec<(u64, u64)> = history
        .checkpoints
        .iter()
        .map(|c| (c.step, c.after))
        .collect();
    assert_eq!(saved, [(1, 1), (20, 2), (3, 3)]);
    assert!(!history.collected);
    assert_eq!(history.forked_from, None);
    // The run resumes from its last checkpoint, and lists it.
    assert_eq!(store.load_progress("r1").await.unwrap().unwrap().step, 3);
    assert_eq!(store.run("r1").await.unwrap().unwrap().step, Some(3));
    // A checkpoint read back from its history, by position.
    let before_3 = store
        .checkpoint_before("r1", Some(history.steps[2].position))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        before_3.checkpoint,
        Checkpoint {
            step: 20,
            state: b"saved alone".to_vec()
        }
    );
    assert!(store.history("nobody").await.unwrap().is_none());
}

pub(super) async fn a_fork_reuses_the_steps_before_and_runs_the_rest_under_its_keys(env: &Env<'_>) {
    let store = env.store;
    let fence = run_of(env, 5).await;
    let forked = store.fork(&fork("r1", 3, "f1")).await.unwrap();
    let ns = fork_namespace("billing", "f1");
    assert_eq!(forked.namespace, ns);
    assert_eq!((forked.reused, forked.checkpoint), (2, Some(2)));
    assert_eq!(forked.record.status, RunStatus::Queued);
    assert_eq!(forked.record.namespace, ns);
    assert_eq!(forked.record.step, Some(2));
    // Steps 1 and 2 are the fork's own keys now (the run's id in them is the fork's),
    // with the original's results; steps 3 to 5 are not there to be found.
    for i in 1..=2 {
        assert_eq!(
            store.committed(&format!("{ns}:f1/s{i}")).await.unwrap(),
            Some(format!("result {i}").into_bytes())
        );
    }
    for i in 3..=5 {
        assert_eq!(
            store.committed(&format!("{ns}:f1/s{i}")).await.unwrap(),
            None
        );
    }
    assert_eq!(
        store.load_progress("f1").await.unwrap(),
        Some(Checkpoint {
            step: 2,
            state: b"state 2".to_vec()
        })
    );
    // The fork has the original's input; it runs under its own lease and keys.
    let leased = env.acquire("f1", "w").await;
    let grant = env.grant(&format!("{ns}:f1/s3"), "a", &leased).await;
    assert_eq!(grant.attempt, 1);
    let history = store.history("f1").await.unwrap().unwrap();
    assert_eq!(history.forked_from, Some(("r1".to_owned(), 3)));
    assert_eq!(history.steps.len(), 2);
    assert_eq!(history.checkpoints.len(), 1);
    assert_eq!(history.checkpoints[0].after, 2);
    // Both timelines say so.
    let forked_event = |run: &'static str| async move {
        store
            .events(run)
            .await
            .unwrap()
            .unwrap()
            .events
            .into_iter()
            .find(|e| e.kind == EventKind::Forked)
            .unwrap()
            .detail
    };
    assert_eq!(forked_event("r1").await["into"], "f1");
    assert_eq!(forked_event("f1").await["from"], "r1");
    assert_eq!(forked_event("f1").await["reused"], 2);
    // The original is untouched: its five results, its lease.
    for i in 1..=5 {
        assert_eq!(
            store.committed(&format!("billing:r1/s{i}")).await.unwrap(),
            Some(format!("result {i}").into_bytes())
        );
    }
    assert_eq!(store.history("r1").await.unwrap().unwrap().steps.len(), 5);
    commit_step(env, &fence, 6, true).await;

    // A fork at step 1 starts from nothing and reuses nothing; with other input.
    let other = store
        .fork(&ForkRequest {
            input: Some(b"{\"other\":1}"),
            ..fork("r1", 1, "f2")
        })
        .await
        .unwrap();
    assert_eq!((other.reused, other.checkpoint), (0, None));
    assert_eq!(store.load_progress("f2").await.unwrap(), None);
    assert_eq!(
        store.run_input("f2").await.unwrap().unwrap(),
        b"{\"other\":1}"
    );
    // A fork of a fork.
    let again = store.fork(&fork("f1", 2, "f3")).await.unwrap();
    assert_eq!((again.reused, again.checkpoint), (1, None));
    let ns3 = fork_namespace(&ns, "f3");
    assert_eq!(
        store.committed(&format!("{ns3}:f3/s1")).await.unwrap(),
        Some(b"result 1".to_vec())
    );
}

pub(super) async fn bad_forks_are_refused_and_change_nothing(env: &Env<'_>) {
    let store = env.store;
    run_of(env, 3).await;
    env.submit("taken", b"in").await;
    let runs = env.run_ids().await;
    let refusal = |e: StoreError| match e {
        StoreError::ForkRefused { refusal, .. } => refusal,
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert!(matches!(
        store.fork(&fork("nobody", 1, "f")).await,
        Err(StoreError::UnknownRun { .. })
    ));
    assert_eq!(
        refusal(store.fork(&fork("r1", 0, "f")).await.unwrap_err()),
        ForkRefusal::AtZero
    );
    assert_eq!(
        refusal(store.fork(&fork("r1", 4, "f")).await.unwrap_err()),
        ForkRefusal::PastEnd { at: 4, steps: 3 }
    );
    assert_eq!(
        refusal(store.fork(&fork("r1", 2, "taken")).await.unwrap_err()),
        ForkRefusal::RunExists {
            new_run_id: "taken".into()
        }
    );
    assert!(matches!(
        store
            .fork(&ForkRequest {
                version: Some(9),
                ..fork("r1", 2, "f")
            })
            .await,
        Err(StoreError::UnknownVersion { version: 9, .. })
    ));
    assert_eq!(env.run_ids().await, runs);
    let ns = fork_namespace("billing", "f");
    assert_eq!(store.committed(&format!("{ns}:f/s1")).await.unwrap(), None);
    assert_eq!(store.history("r1").await.unwrap().unwrap().steps.len(), 3);
}

pub(super) async fn gc_collects_a_finished_runs_history_when_asked(env: &Env<'_>) {
    let store = env.store;
    let fence = run_of(env, 5).await;
    store
        .finish_run(&fence, RunEnd::Completed(b"done"), &Counts::default())
        .await
        .unwrap();
    let gc = |dry_run| GcRequest {
        finished_before: Duration::from_secs(30 * 86_400),
        dedupe_window: Duration::from_secs(7 * 86_400),
        include_failed: false,
        history_before: Some(Duration::from_secs(3600)),
        dry_run,
    };
    // Within the hour nothing goes.
    assert_eq!(store.gc(&gc(false)).await.unwrap().checkpoints, 0);
    assert_eq!(
        store
            .history("r1")
            .await
            .unwrap()
            .unwrap()
            .checkpoints
            .len(),
        5
    );
    env.advance(2 * 3_600_000);
    assert_eq!(store.gc(&gc(true)).await.unwrap().checkpoints, 4);
    assert_eq!(
        store
            .history("r1")
            .await
            .unwrap()
            .unwrap()
            .checkpoints
            .len(),
        5
    );
    let report = store.gc(&gc(false)).await.unwrap();
    assert_eq!((report.checkpoints, report.runs), (4, 0));
    let history = store.history("r1").await.unwrap().unwrap();
    assert!(history.collected);
    assert_eq!(history.steps.len(), 5);
    assert_eq!(history.checkpoints.len(), 1);
    assert_eq!(store.load_progress("r1").await.unwrap().unwrap().step, 5);
    // Every checkpoint a fork could start from is gone: refused, nothing made.
    for at in [3, 5] {
        assert!(matches!(
            store.fork(&fork("r1", at, "f")).await,
            Err(StoreError::ForkRefused {
                refusal: ForkRefusal::HistoryCollected { .. },
                ..
            })
        ));
    }
    assert_eq!(env.run_ids().await, ["r1"]);
    // A second pass finds nothing more.
    assert_eq!(store.gc(&gc(false)).await.unwrap().checkpoints, 0);
}
