//! Run leases and fences: which runs workers get, leases running out, and every write
//! made with a lease that is no longer the run's.

use std::time::Duration;

use super::{Env, RUN_LEASE, RUN_LEASE_MS, T0, claim, fence, req};
use crate::store::{
    Acquired, Checkpoint, Commit, Counts, LeaseState, LeasedRun, Resolution, RunEnd, RunFence,
    RunLeaseInfo, RunStatus, StoreError,
};

fn ids(runs: &[LeasedRun]) -> Vec<&str> {
    runs.iter().map(|r| r.record.run_id.as_str()).collect()
}

fn fence_of(run: &LeasedRun) -> RunFence {
    fence(&run.record.run_id, run.token)
}

fn lease_lost<T: std::fmt::Debug>(result: Result<T, StoreError>, fence: &RunFence) {
    match result {
        Err(StoreError::LeaseLost { run_id, token }) => {
            assert_eq!(
                (run_id.as_str(), token),
                (fence.run_id.as_str(), fence.token)
            );
        }
        other => panic!("expected LeaseLost, got {other:?}"),
    }
}

pub(super) async fn acquire_runs_takes_the_oldest_free_runs(env: &Env<'_>) {
    let store = env.store;
    for (i, run) in ["r1", "cancelled", "done", "held", "skipped", "r6", "r7"]
        .into_iter()
        .enumerate()
    {
        env.clock.set(T0 + i as i64);
        env.submit(run, run.as_bytes()).await;
    }
    store.cancel_run("cancelled").await.unwrap();
    let done = env.acquire("done", "other").await;
    store
        .finish_run(&done, RunEnd::Completed(b""), &Counts::default())
        .await
        .unwrap();
    env.acquire("held", "other").await;
    let now = T0 + 10;
    env.clock.set(now);

    let skip = ["skipped".to_owned()];
    let got = store.acquire_runs("w", 2, RUN_LEASE, &skip).await.unwrap();
    assert_eq!(ids(&got), ["r1", "r6"]);
    let r1 = &got[0];
    assert_eq!(r1.token, 1);
    assert_eq!(
        (r1.input.as_slice(), r1.authority.as_slice()),
        (&b"r1"[..], &b"authority"[..])
    );
    assert_eq!(r1.record.status, RunStatus::Running);
    assert_eq!(
        r1.record.lease,
        Some(RunLeaseInfo {
            worker: "w".to_owned(),
            token: 1,
            expires: now + RUN_LEASE_MS,
        })
    );
    assert_eq!(store.run("r1").await.unwrap().as_ref(), Some(&r1.record));
    // Runs just leased are held now; the one skipped is free for whoever does not skip.
    let got = store.acquire_runs("w", 10, RUN_LEASE, &skip).await.unwrap();
    assert_eq!(ids(&got), ["r7"]);
    let got = store.acquire_runs("w2", 10, RUN_LEASE, &[]).await.unwrap();
    assert_eq!(ids(&got), ["skipped"]);
    assert!(
        store
            .acquire_runs("w", 10, RUN_LEASE, &[])
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .acquire_runs("w", 0, RUN_LEASE, &[])
            .await
            .unwrap()
            .is_empty()
    );
}

/// A run leased from the queue comes with its checkpoint and its first instance
/// counted by the grant, durably, before any instance runs; one leased by id comes
/// with its checkpoint and is counted by its host, as before.
pub(super) async fn a_queue_lease_counts_its_first_instance_and_carries_the_checkpoint(
    env: &Env<'_>,
) {
    let store = env.store;
    let fence = env.lease("r").await;
    let checkpoint = Checkpoint {
        step: 4,
        state: b"state".to_vec(),
    };
    store
        .save_progress(&fence, &checkpoint, None)
        .await
        .unwrap();
    let counts = Counts {
        executed: 2,
        instances: 3,
        ..Counts::default()
    };
    store.release_run(&fence, &counts, None).await.unwrap();
    env.submit("fresh", b"in").await;
    let got = store.acquire_runs("w", 4, RUN_LEASE, &[]).await.unwrap();
    assert_eq!(ids(&got), ["r", "fresh"]);
    let (r, fresh) = (&got[0], &got[1]);
    assert!(r.instance_counted && fresh.instance_counted);
    assert!(r.checkpoint_read && fresh.checkpoint_read);
    assert_eq!(
        r.record.counts,
        Counts {
            instances: 4,
            ..counts
        }
    );
    assert_eq!(r.checkpoint.as_ref(), Some(&checkpoint));
    assert_eq!(
        (fresh.record.counts.instances, &fresh.checkpoint),
        (1, &None)
    );
    // The store holds what the records say.
    assert_eq!(
        store.run("r").await.unwrap().unwrap().counts,
        r.record.counts
    );
    let fence = fence_of(r);
    store.release_run(&fence, &counts, None).await.unwrap();
    match store.acquire_run("r", "w", RUN_LEASE).await.unwrap() {
        Acquired::Leased(again) => {
            assert!(!again.instance_counted && again.checkpoint_read);
            assert_eq!(again.record.counts, counts);
            assert_eq!(again.checkpoint, Some(checkpoint));
        }
        other => panic!("{other:?}"),
    }
}

pub(super) async fn an_expired_lease_is_acquired_again_with_a_greater_token(env: &Env<'_>) {
    let store = env.store;
    let first = env.lease("r1").await;
    env.advance(RUN_LEASE_MS - 1);
    assert!(
        store
            .acquire_runs("w2", 10, RUN_LEASE, &[])
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store.acquire_run("r1", "w2", RUN_LEASE).await.unwrap(),
        Acquired::Held(RunLeaseInfo {
            worker: "w".to_owned(),
            token: first.token,
            expires: T0 + RUN_LEASE_MS,
        })
    );
    env.advance(1);
    let got = store.acquire_runs("w2", 10, RUN_LEASE, &[]).await.unwrap();
    assert_eq!(ids(&got), ["r1"]);
    assert!(got[0].token > first.token);
    // The worker whose lease ran out is fenced off for good.
    lease_lost(store.save_counts(&first, &Counts::default()).await, &first);
    let renewed = store
        .renew_runs(std::slice::from_ref(&first), RUN_LEASE)
        .await;
    assert_eq!(renewed.unwrap(), [LeaseState::Lost]);
    // And again, by the other route: the next grant's token is greater still.
    env.advance(RUN_LEASE_MS);
    let third = env.acquire("r1", "w3").await;
    assert!(third.token > got[0].token);
}

pub(super) async fn acquire_run_reports_held_finished_and_unknown(env: &Env<'_>) {
    let store = env.store;
    assert!(matches!(
        store.acquire_run("ghost", "w", RUN_LEASE).await,
        Err(StoreError::UnknownRun { run_id }) if run_id == "ghost"
    ));
    env.submit("queued", b"").await;
    let Acquired::Leased(run) = store.acquire_run("queued", "w", RUN_LEASE).await.unwrap() else {
        panic!("a queued run is leased");
    };
    assert_eq!((run.token, run.record.status), (1, RunStatus::Running));
    assert!(matches!(
        store.acquire_run("queued", "w2", RUN_LEASE).await.unwrap(),
        Acquired::Held(lease) if lease.worker == "w" && lease.token == 1
    ));
    // The worker that holds it may take it again, with a new token: it knows it does
    // not drive the run any more, and the old fence is stale from now on.
    let Acquired::Leased(again) = store.acquire_run("queued", "w", RUN_LEASE).await.unwrap() else {
        panic!("its own worker gets the run again");
    };
    assert_eq!(again.token, 2);
    assert!(
        again.taken_over,
        "counts the first lease had not written are lost"
    );
    let ends: [(&str, RunEnd<'_>); 3] = [
        ("completed", RunEnd::Completed(b"out")),
        ("failed", RunEnd::Failed(b"err")),
        ("in-doubt", RunEnd::InDoubt),
    ];
    for (run_id, end) in ends {
        let fence = env.lease(run_id).await;
        store
            .finish_run(&fence, end, &Counts::default())
            .await
            .unwrap();
    }
    env.submit("cancelled", b"").await;
    store.cancel_run("cancelled").await.unwrap();
    for (run_id, status) in [
        ("completed", RunStatus::Completed),
        ("failed", RunStatus::Failed),
        ("in-doubt", RunStatus::InDoubt),
        ("cancelled", RunStatus::Cancelled),
    ] {
        match store.acquire_run(run_id, "w", RUN_LEASE).await.unwrap() {
            Acquired::Finished(record) => {
                assert_eq!((record.status, record.lease), (status, None), "{run_id}");
            }
            other => panic!("{run_id}: {other:?}"),
        }
    }
}

pub(super) async fn every_fenced_write_with_a_stale_fence_is_refused_and_writes_nothing(
    env: &Env<'_>,
) {
    let store = env.store;
    let stale = env.lease("r1").await;
    let held = env.grant("k", "a", &stale).await;
    store
        .save_progress(
            &stale,
            &Checkpoint {
                step: 1,
                state: b"s".to_vec(),
            },
            None,
        )
        .await
        .unwrap();
    store.append_log(&stale, b"log", 100).await.unwrap();
    store.append_live(&stale, &late_text(), 100).await.unwrap();
    // The worker stalls past its lease; another takes the run over.
    env.advance(RUN_LEASE_MS);
    let current = env.acquire("r1", "w2").await;
    assert!(current.token > stale.token);

    let snapshot = || async {
        (
            store.run("r1").await.unwrap(),
            store.open_claims(None).await.unwrap(),
            store.steps("r1").await.unwrap(),
            store.load_progress("r1").await.unwrap(),
            store.logs("r1").await.unwrap(),
            store.live("r1", None, 100).await.unwrap(),
            store.committed("k").await.unwrap(),
        )
    };
    let before = snapshot().await;
    let ghost = fence("no-such-run", 1);
    for fence in [&stale, &ghost] {
        let counts = Counts {
            executed: 99,
            ..Counts::default()
        };
        let checkpoint = Checkpoint {
            step: 9,
            state: b"late".to_vec(),
        };
        // The claim's token still holds the key: only the fence refuses these.
        let own = claim("k", held.token, fence);
        lease_lost(store.claim(&req("new-key", "a", fence)).await, fence);
        lease_lost(
            store.take_over(&req("k", "a", fence), held.token).await,
            fence,
        );
        let commit = Commit {
            claim: own.clone(),
            result: b"late",
            checkpoint: Some(&checkpoint),
            counts: Some(&counts),
        };
        lease_lost(store.commit(&commit).await, fence);
        assert!(!store.release(&own).await.unwrap());
        assert_eq!(
            store
                .renew(std::slice::from_ref(&own), RUN_LEASE)
                .await
                .unwrap(),
            [false]
        );
        lease_lost(store.park(&own, "late").await, fence);
        lease_lost(
            store.save_progress(fence, &checkpoint, Some(&counts)).await,
            fence,
        );
        lease_lost(store.save_counts(fence, &counts).await, fence);
        lease_lost(store.append_log(fence, b"late", 100).await, fence);
        lease_lost(store.append_live(fence, &late_text(), 100).await, fence);
        lease_lost(store.release_run(fence, &counts, Some("late")).await, fence);
        for end in [
            RunEnd::Completed(b"late"),
            RunEnd::Failed(b"late"),
            RunEnd::InDoubt,
            RunEnd::Cancelled,
        ] {
            lease_lost(store.finish_run(fence, end, &counts).await, fence);
        }
        assert_eq!(
            store
                .renew_runs(std::slice::from_ref(fence), RUN_LEASE)
                .await
                .unwrap(),
            [LeaseState::Lost]
        );
    }
    assert_eq!(snapshot().await, before);
    // The current holder's writes go through.
    store
        .save_counts(&current, &Counts::default())
        .await
        .unwrap();
    env.commit("k", held.token, &current, b"r").await.unwrap();
}

pub(super) async fn a_lease_given_back_fences_its_own_writes(env: &Env<'_>) {
    let store = env.store;
    let released = env.lease("released").await;
    store
        .release_run(&released, &Counts::default(), None)
        .await
        .unwrap();
    let finished = env.lease("finished").await;
    store
        .finish_run(&finished, RunEnd::Completed(b""), &Counts::default())
        .await
        .unwrap();
    for fence in [&released, &finished] {
        let before = store.run(&fence.run_id).await.unwrap();
        lease_lost(store.save_counts(fence, &Counts::default()).await, fence);
        lease_lost(store.append_log(fence, b"x", 10).await, fence);
        lease_lost(store.append_live(fence, &late_text(), 10).await, fence);
        assert!(
            store
                .live(&fence.run_id, None, 10)
                .await
                .unwrap()
                .is_empty()
        );
        lease_lost(
            store
                .finish_run(fence, RunEnd::Failed(b"x"), &Counts::default())
                .await,
            fence,
        );
        let renewed = store
            .renew_runs(std::slice::from_ref(fence), RUN_LEASE)
            .await;
        assert_eq!(renewed.unwrap(), [LeaseState::Lost]);
        assert_eq!(store.run(&fence.run_id).await.unwrap(), before);
    }
}

pub(super) async fn renew_runs_reports_held_lost_and_cancel_requests(env: &Env<'_>) {
    let store = env.store;
    let calm = env.lease("calm").await;
    let asked = env.lease("asked").await;
    store.cancel_run("asked").await.unwrap();
    env.advance(100);
    let wrong = RunFence {
        token: calm.token + 5,
        ..calm.clone()
    };
    let fences = [calm.clone(), asked.clone(), wrong, fence("ghost", 1)];
    let expires = T0 + 100 + RUN_LEASE_MS;
    assert_eq!(
        store.renew_runs(&fences, RUN_LEASE).await.unwrap(),
        [
            LeaseState::Held {
                expires,
                cancel_requested: false,
                pause_requested: false,
            },
            LeaseState::Held {
                expires,
                cancel_requested: true,
                pause_requested: false,
            },
            LeaseState::Lost,
            LeaseState::Lost,
        ]
    );
    let lease = store.run("calm").await.unwrap().unwrap().lease.unwrap();
    assert_eq!((lease.worker.as_str(), lease.expires), ("w", expires));
    // A lease that ran out is renewed too, as long as nobody took the run meanwhile.
    env.advance(RUN_LEASE_MS + 1_000);
    let renewed = store
        .renew_runs(std::slice::from_ref(&calm), Duration::from_secs(1))
        .await
        .unwrap();
    assert!(matches!(renewed[..], [LeaseState::Held { .. }]));
    assert!(store.renew_runs(&[], RUN_LEASE).await.unwrap().is_empty());
}

pub(super) async fn release_run_frees_the_run_at_once(env: &Env<'_>) {
    let store = env.store;
    let first = env.lease("r1").await;
    let counts = Counts {
        executed: 4,
        instances: 2,
        ..Counts::default()
    };
    env.advance(1);
    store
        .release_run(&first, &counts, Some("cannot reach api.example.com"))
        .await
        .unwrap();
    let run = store.run("r1").await.unwrap().unwrap();
    assert_eq!((run.status, run.lease), (RunStatus::Running, None));
    assert_eq!(run.counts, counts);
    assert_eq!(run.note.as_deref(), Some("cannot reach api.example.com"));
    assert_eq!(run.updated, T0 + 1);
    // Well within the lease it gave back, another worker gets the run, fenced anew.
    let got = store.acquire_runs("w2", 1, RUN_LEASE, &[]).await.unwrap();
    assert_eq!(ids(&got), ["r1"]);
    assert!(got[0].token > first.token);
    let second = fence("r1", got[0].token);
    store.release_run(&second, &counts, None).await.unwrap();
    assert_eq!(store.run("r1").await.unwrap().unwrap().note, None);
}

pub(super) async fn resolve_frees_the_run_for_any_worker(env: &Env<'_>) {
    let store = env.store;
    let fence = env.lease("r1").await;
    let grant = env.grant("k", "a", &fence).await;
    store
        .park(&claim("k", grant.token, &fence), "unsure")
        .await
        .unwrap();
    store
        .finish_run(&fence, RunEnd::InDoubt, &Counts::default())
        .await
        .unwrap();
    assert!(
        store
            .acquire_runs("w", 10, RUN_LEASE, &[])
            .await
            .unwrap()
            .is_empty()
    );
    store.resolve("r1", "k", Resolution::Retry).await.unwrap();
    let got = store.acquire_runs("w2", 10, RUN_LEASE, &[]).await.unwrap();
    assert_eq!(ids(&got), ["r1"]);
    assert!(got[0].token > fence.token);
}

/// A chunk of live text a fenced-out writer tries to publish.
fn late_text() -> [crate::store::LiveText; 1] {
    [crate::store::LiveText {
        key: "k".into(),
        text: "late".into(),
    }]
}
