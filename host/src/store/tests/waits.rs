//! Durable waits: sleeps recorded once under their key, signals taken exactly once,
//! suspended runs that no worker takes before they are due, and refused waits that
//! write nothing.

use std::time::Duration;

use super::{Env, RUN_LEASE, T0};
use crate::store::{
    Counts, RunStatus, StoreError, Suspension, WaitKind, WaitRequest, WaitState, Wake,
};

fn sleep(ms: u64) -> WaitKind<'static> {
    WaitKind::Sleep(Wake::After(Duration::from_millis(ms)))
}

pub(super) async fn a_sleep_keeps_its_first_wake_time_and_elapses_on_the_clock(env: &Env<'_>) {
    let store = env.store;
    env.submit("r", b"in").await;
    let fence = env.lease("r").await;
    let wait = |kind| WaitRequest {
        fence: &fence,
        key: "nap",
        kind,
    };
    let pending = WaitState::Pending {
        due: Some(T0 + 60_000),
    };
    assert_eq!(store.wait(&wait(sleep(60_000))).await.unwrap(), pending);
    env.advance(30_000);
    // Reached again (a replay) with another duration: the first wake time stands.
    assert_eq!(store.wait(&wait(sleep(1))).await.unwrap(), pending);
    env.advance(30_000);
    assert_eq!(
        store.wait(&wait(sleep(60_000))).await.unwrap(),
        WaitState::Elapsed
    );
    // Another kind of wait under the same key is refused.
    let signal = WaitKind::Signal {
        name: "go",
        timeout: None,
    };
    assert!(matches!(
        store.wait(&wait(signal)).await,
        Err(StoreError::WaitRefused { .. })
    ));
    let waits = store.waits("r").await.unwrap();
    assert_eq!(waits.len(), 1);
    assert_eq!((waits[0].due, waits[0].created), (Some(T0 + 60_000), T0));
    assert_eq!(waits[0].join_children, None, "a sleep lists no children");
}

pub(super) async fn a_suspended_run_is_leased_only_when_due_in_due_order(env: &Env<'_>) {
    let store = env.store;
    for (run, due_s) in [("late", 30), ("early", 10), ("middle", 20)] {
        let fence = env.lease(run).await;
        let req = WaitRequest {
            fence: &fence,
            key: "nap",
            kind: sleep(due_s * 1000),
        };
        let WaitState::Pending { due } = store.wait(&req).await.unwrap() else {
            panic!("a sleep in the future is pending");
        };
        let suspension = Suspension {
            due,
            signal: None,
            join: None,
        };
        store
            .suspend_run(&fence, &Counts::default(), &suspension)
            .await
            .unwrap();
        // The old fence holds nothing now.
        assert!(matches!(
            store
                .suspend_run(&fence, &Counts::default(), &suspension)
                .await,
            Err(StoreError::LeaseLost { .. })
        ));
        let record = store.run(run).await.unwrap().unwrap();
        assert_eq!(
            (record.status, record.lease, record.wake_at),
            (RunStatus::Running, None, due)
        );
    }
    assert!(
        store
            .acquire_runs("w", 10, RUN_LEASE, &[])
            .await
            .unwrap()
            .is_empty()
    );
    // What an idle worker sleeps towards: the earliest run not due yet.
    let now = store.now().await.unwrap();
    assert_eq!(store.next_due(now).await.unwrap(), Some(T0 + 10_000));
    env.advance(15_000);
    let now = store.now().await.unwrap();
    assert_eq!(store.next_due(now).await.unwrap(), Some(T0 + 20_000));
    env.advance(15_000);
    let got = store.acquire_runs("w", 10, RUN_LEASE, &[]).await.unwrap();
    let ids: Vec<&str> = got.iter().map(|r| r.record.run_id.as_str()).collect();
    assert_eq!(ids, ["early", "middle", "late"]);
    assert!(got.iter().all(|r| r.record.wake_at.is_none()));
    // Held runs are nobody's to wake.
    let now = store.now().await.unwrap();
    assert_eq!(store.next_due(now).await.unwrap(), None);
}

pub(super) async fn a_signal_is_taken_once_by_the_wait_that_records_it(env: &Env<'_>) {
    let store = env.store;
    env.submit("r", b"in").await;
    // Sent before anything waits: kept.
    let sent = store.send_signal("r", "go", b"1", 100).await.unwrap();
    assert!(!sent.woke);
    store.send_signal("r", "go", b"2", 100).await.unwrap();
    let fence = env.lease("r").await;
    let wait = |key| WaitRequest {
        fence: &fence,
        key,
        kind: WaitKind::Signal {
            name: "go",
            timeout: Some(Duration::from_secs(60)),
        },
    };
    let first = WaitState::Received(b"1".to_vec());
    assert_eq!(store.wait(&wait("w1")).await.unwrap(), first);
    // Asked again (a replay), the same wait answers the same payload.
    assert_eq!(store.wait(&wait("w1")).await.unwrap(), first);
    assert_eq!(
        store.wait(&wait("w2")).await.unwrap(),
        WaitState::Received(b"2".to_vec())
    );
    let pending = WaitState::Pending {
        due: Some(T0 + 60_000),
    };
    assert_eq!(store.wait(&wait("w3")).await.unwrap(), pending);
    let suspension = Suspension {
        due: Some(T0 + 60_000),
        signal: Some("go"),
        join: None,
    };
    store
        .suspend_run(&fence, &Counts::default(), &suspension)
        .await
        .unwrap();
    assert!(
        store
            .acquire_runs("w", 1, RUN_LEASE, &[])
            .await
            .unwrap()
            .is_empty()
    );
    // Sent while it waits: the run is due at once.
    assert!(store.send_signal("r", "go", b"3", 100).await.unwrap().woke);
    assert_eq!(store.run("r").await.unwrap().unwrap().wake_at, Some(T0));
    let got = store.acquire_runs("w", 1, RUN_LEASE, &[]).await.unwrap();
    let fence = crate::store::RunFence {
        run_id: "r".into(),
        token: got[0].token,
        sync: crate::store::SyncMode::Normal,
    };
    let w3 = WaitRequest {
        fence: &fence,
        key: "w3",
        kind: WaitKind::Signal {
            name: "go",
            timeout: Some(Duration::from_secs(60)),
        },
    };
    assert_eq!(
        store.wait(&w3).await.unwrap(),
        WaitState::Received(b"3".to_vec())
    );
    // A wait whose timeout passed with no signal times out, and stays timed out even
    // if a signal comes after.
    let w4 = WaitRequest {
        key: "w4",
        ..w3.clone()
    };
    assert!(matches!(
        store.wait(&w4).await.unwrap(),
        WaitState::Pending { .. }
    ));
    env.advance(60_000);
    assert_eq!(store.wait(&w4).await.unwrap(), WaitState::TimedOut);
    store.send_signal("r", "go", b"4", 100).await.unwrap();
    assert_eq!(store.wait(&w4).await.unwrap(), WaitState::TimedOut);
}

pub(super) async fn a_signal_sent_between_a_wait_and_its_suspension_is_not_missed(env: &Env<'_>) {
    let store = env.store;
    env.submit("r", b"in").await;
    let fence = env.lease("r").await;
    let req = WaitRequest {
        fence: &fence,
        key: "w",
        kind: WaitKind::Signal {
            name: "go",
            timeout: None,
        },
    };
    assert_eq!(
        store.wait(&req).await.unwrap(),
        WaitState::Pending { due: None }
    );
    // The run still holds its lease: the signal is kept, not a wake-up.
    assert!(!store.send_signal("r", "go", b"x", 100).await.unwrap().woke);
    let suspension = Suspension {
        due: None,
        signal: Some("go"),
        join: None,
    };
    store
        .suspend_run(&fence, &Counts::default(), &suspension)
        .await
        .unwrap();
    assert_eq!(store.run("r").await.unwrap().unwrap().wake_at, Some(T0));
    assert_eq!(
        store
            .acquire_runs("w", 1, RUN_LEASE, &[])
            .await
            .unwrap()
            .len(),
        1
    );
}

pub(super) async fn bad_signals_and_waits_are_refused_and_write_nothing(env: &Env<'_>) {
    let store = env.store;
    assert!(matches!(
        store.send_signal("nobody", "go", b"1", 100).await,
        Err(StoreError::UnknownRun { .. })
    ));
    env.submit("r", b"in").await;
    for (name, payload) in [
        ("", &b"1"[..]),
        ("go", &[0_u8; 101][..]),
        ("a\u{202e}b", b"1"),
    ] {
        assert!(matches!(
            store.send_signal("r", name, payload, 100).await,
            Err(StoreError::SignalRefused { .. })
        ));
    }
    let fence = env.lease("r").await;
    for kind in [
        WaitKind::Sleep(Wake::After(Duration::MAX)),
        WaitKind::Sleep(Wake::At(-1)),
        WaitKind::Sleep(Wake::At(i64::MAX)),
        WaitKind::Signal {
            name: "go",
            timeout: Some(Duration::from_secs(200 * 365 * 24 * 3600)),
        },
    ] {
        let req = WaitRequest {
            fence: &fence,
            key: "bad",
            kind,
        };
        assert!(matches!(
            store.wait(&req).await,
            Err(StoreError::WaitRefused { .. })
        ));
    }
    assert!(store.waits("r").await.unwrap().is_empty());
    let record = store.run("r").await.unwrap().unwrap();
    assert_eq!((record.wake_at, record.waiting_for), (None, None));
    env.submit("gone", b"in").await;
    store.cancel_run("gone").await.unwrap();
    assert!(matches!(
        store.send_signal("gone", "go", b"1", 100).await,
        Err(StoreError::RunFinished { .. })
    ));
}

fn rate(class: &str) -> WaitKind<'_> {
    WaitKind::Rate { class }
}

async fn set_llm(store: &dyn crate::store::Store, limit: u32, burst: u32) {
    store
        .set_rate(&crate::store::RateSetting {
            class: "llm",
            limit,
            period: Duration::from_secs(60),
            burst,
        })
        .await
        .unwrap();
}

pub(super) async fn a_rate_token_is_reserved_once_at_the_next_free_slot(env: &Env<'_>) {
    let store = env.store;
    set_llm(store, 60, 1).await;
    let mut fences = Vec::new();
    for run in ["a", "b", "c"] {
        env.submit(run, b"in").await;
        fences.push(env.lease(run).await);
    }
    let token = |fence| WaitRequest {
        fence,
        key: "rate:step",
        kind: rate("llm"),
    };
    // Slots a second apart, in the order they were asked for.
    assert_eq!(
        store.wait(&token(&fences[0])).await.unwrap(),
        WaitState::Elapsed
    );
    for (i, fence) in fences.iter().enumerate().skip(1) {
        let due = Some(T0 + 1000 * i as i64);
        assert_eq!(
            store.wait(&token(fence)).await.unwrap(),
            WaitState::Pending { due }
        );
    }
    // Asked again (a replay), each keeps its slot and takes no other.
    assert_eq!(
        store.wait(&token(&fences[2])).await.unwrap(),
        WaitState::Pending {
            due: Some(T0 + 2000)
        }
    );
    let limits = store.rates().await.unwrap();
    assert_eq!(limits[0].next_free, Some(T0 + 3000), "three tokens lent");
    env.advance(2000);
    assert_eq!(
        store.wait(&token(&fences[2])).await.unwrap(),
        WaitState::Elapsed
    );
    assert_eq!(store.rates().await.unwrap()[0].next_free, Some(T0 + 3000));

    // A class with no limit lends at once and keeps nothing of it.
    let free = WaitRequest {
        fence: &fences[0],
        key: "rate:other",
        kind: rate("search"),
    };
    assert_eq!(store.wait(&free).await.unwrap(), WaitState::Elapsed);
    assert_eq!(store.rates().await.unwrap().len(), 1);

    // The token's key is the run's: a sleep or another class under it is refused.
    for kind in [sleep(1), rate("search")] {
        let reused = WaitRequest {
            fence: &fences[1],
            key: "rate:step",
            kind,
        };
        match store.wait(&reused).await {
            Err(StoreError::WaitRefused { reason, .. }) => {
                assert!(reason.contains("token of rate class"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }
    let waits = store.waits("b").await.unwrap();
    assert_eq!(waits.len(), 1);
    assert_eq!(waits[0].rate.as_deref(), Some("llm"));
    assert_eq!(waits[0].due, Some(T0 + 1000));

    // A new limit keeps the slots reserved and spaces the next by its own interval.
    set_llm(store, 120, 1).await;
    assert_eq!(store.rates().await.unwrap()[0].next_free, Some(T0 + 3000));
    env.submit("d", b"in").await;
    let d = env.lease("d").await;
    assert_eq!(
        store.wait(&token(&d)).await.unwrap(),
        WaitState::Pending {
            due: Some(T0 + 3000)
        }
    );
    assert_eq!(store.rates().await.unwrap()[0].next_free, Some(T0 + 3500));
    assert!(store.clear_rate("llm").await.unwrap());
    assert!(store.rates().await.unwrap().is_empty());
}

pub(super) async fn racing_handles_never_lend_one_token_twice(
    harness: &mut dyn super::Harness,
    clock: &crate::store::Clock,
) {
    const RUNS: usize = 30;
    let handles: Vec<std::sync::Arc<dyn crate::store::Store>> = vec![
        harness.store(),
        harness.open_another(),
        harness.open_another(),
    ];
    let env = Env {
        store: handles[0].as_ref(),
        clock,
    };
    set_llm(env.store, 60, 1).await;
    let mut fences = Vec::new();
    for i in 0..RUNS {
        let run = format!("r{i:02}");
        env.submit(&run, b"in").await;
        fences.push(env.lease(&run).await);
    }
    let dues: Vec<Option<i64>> = std::thread::scope(|scope| {
        let threads: Vec<_> = fences
            .chunks(RUNS / handles.len())
            .zip(&handles)
            .map(|(fences, store)| {
                scope.spawn(move || {
                    super::block_on(async move {
                        let mut dues = Vec::new();
                        for fence in fences {
                            let req = WaitRequest {
                                fence,
                                key: "rate:step",
                                kind: rate("llm"),
                            };
                            dues.push(match store.wait(&req).await.unwrap() {
                                WaitState::Elapsed => Some(T0),
                                WaitState::Pending { due } => due,
                                other => panic!("{other:?}"),
                            });
                        }
                        dues
                    })
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect()
    });
    let mut dues: Vec<i64> = dues.into_iter().map(Option::unwrap).collect();
    dues.sort_unstable();
    let expected: Vec<i64> = (0..RUNS as i64).map(|i| T0 + i * 1000).collect();
    assert_eq!(dues, expected, "every slot lent once, none twice");
}

/// A claim of `key` for `fence`'s run with a token of `llm` taken first.
async fn rated(
    store: &dyn crate::store::Store,
    fence: &crate::store::RunFence,
    key: &str,
) -> crate::store::Rated {
    let req = crate::store::ClaimRequest {
        key,
        fence,
        holder: "h",
        fingerprint: None,
        lease: Duration::from_secs(30),
        durable: false,
    };
    let token = WaitRequest {
        fence,
        key: "rate:step",
        kind: rate("llm"),
    };
    store.claim_rated(&req, &token).await.unwrap()
}

pub(super) async fn a_rated_claim_takes_its_token_and_claims_in_one_go(env: &Env<'_>) {
    let store = env.store;
    set_llm(store, 60, 1).await;
    let mut fences = Vec::new();
    for run in ["a", "b"] {
        env.submit(run, b"in").await;
        fences.push(env.lease(run).await);
    }
    // The first token is free now: the claim is granted with it.
    let crate::store::Rated::Claimed(crate::store::ClaimOutcome::Granted(first)) =
        rated(store, &fences[0], "billing:a").await
    else {
        panic!("the first step is claimed at once");
    };
    // The second waits a second, and nothing is claimed meanwhile.
    assert_eq!(
        rated(store, &fences[1], "billing:b").await,
        crate::store::Rated::Due(Some(T0 + 1000))
    );
    assert!(store.steps("b").await.unwrap().is_empty());
    // Asked again before its time (a replay), it keeps its slot and takes no other.
    assert_eq!(
        rated(store, &fences[1], "billing:b").await,
        crate::store::Rated::Due(Some(T0 + 1000))
    );
    assert_eq!(store.rates().await.unwrap()[0].next_free, Some(T0 + 2000));
    env.advance(1000);
    assert!(matches!(
        rated(store, &fences[1], "billing:b").await,
        crate::store::Rated::Claimed(crate::store::ClaimOutcome::Granted(_))
    ));
    // A step committed, replayed with its token: its result, and no token more.
    env.commit("billing:a", first.token, &fences[0], b"done")
        .await
        .unwrap();
    assert_eq!(
        rated(store, &fences[0], "billing:a").await,
        crate::store::Rated::Claimed(crate::store::ClaimOutcome::Committed(b"done".to_vec()))
    );
    assert_eq!(store.rates().await.unwrap()[0].next_free, Some(T0 + 2000));
}
