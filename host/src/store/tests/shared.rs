//! What takes more than one handle: a store reopened keeps everything, and handles
//! racing (as processes would) never share a claim or a run.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use super::{Env, Harness, LEASE_MS, T0, block_on, claim, granted, req};
use crate::store::{Checkpoint, ClaimOutcome, ClaimRequest, Clock, Counts, HeldClaim, Store};

pub(super) async fn reopening_keeps_everything(harness: &mut dyn Harness, clock: &Clock) {
    let store = harness.store();
    let env = Env {
        store: store.as_ref(),
        clock,
    };
    let fence = env.lease("run-1").await;
    let counts = Counts {
        executed: 1,
        ..Counts::default()
    };
    let checkpoint = Checkpoint {
        step: 3,
        state: b"s".to_vec(),
    };
    store
        .save_progress(&fence, &checkpoint, Some(&counts))
        .await
        .unwrap();
    let done = env.grant("done", "a", &fence).await;
    env.commit("done", done.token, &fence, b"result")
        .await
        .unwrap();
    let open = env.grant("open", "a", &fence).await;
    store.append_log(&fence, b"log", 10).await.unwrap();
    let run = store.run("run-1").await.unwrap();
    let claims = store.open_claims(None).await.unwrap();
    let steps = store.steps("run-1").await.unwrap();
    drop(store);

    harness.reopen();
    let store = harness.store();
    assert_eq!(store.run("run-1").await.unwrap(), run);
    assert_eq!(
        store.load_progress("run-1").await.unwrap(),
        Some(checkpoint)
    );
    assert_eq!(
        store.committed("done").await.unwrap(),
        Some(b"result".to_vec())
    );
    assert_eq!(store.open_claims(None).await.unwrap(), claims);
    assert_eq!(store.steps("run-1").await.unwrap(), steps);
    assert_eq!(store.logs("run-1").await.unwrap(), b"log");
    clock.advance(Duration::from_millis(1));
    assert_eq!(
        store.claim(&req("open", "b", &fence)).await.unwrap(),
        ClaimOutcome::Held(HeldClaim {
            holder: "a".to_owned(),
            token: open.token,
            lease_expires: T0 + LEASE_MS,
        })
    );
    // The key's tokens go on from where they were: a takeover outranks the holder.
    let next = granted(
        store
            .take_over(&req("open", "b", &fence), open.token)
            .await
            .unwrap(),
    );
    assert!(next.token > open.token);
    // And so do the run's: the lease taken before the restart still fences.
    store.save_counts(&fence, &counts).await.unwrap();
}

pub(super) async fn two_handles_race_for_claims(harness: &mut dyn Harness, clock: &Clock) {
    const THREADS: usize = 8;
    const KEYS: usize = 25;
    let handles: [Arc<dyn Store>; 2] = [harness.store(), harness.open_another()];
    let env = Env {
        store: handles[0].as_ref(),
        clock,
    };
    let fence = env.lease("race").await;

    // THREADS × KEYS = 200 claims. Each thread walks the keys from its own offset so
    // that threads of both handles meet on every key.
    let wins: Vec<Vec<(usize, u64)>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let store = Arc::clone(&handles[t % 2]);
                let fence = &fence;
                scope.spawn(move || {
                    block_on(async move {
                        let holder = format!("thread-{t}");
                        let mut wins = Vec::new();
                        for i in 0..KEYS {
                            let k = (i + t * 3) % KEYS;
                            let key = format!("key-{k}");
                            let request = ClaimRequest {
                                key: &key,
                                fence,
                                holder: &holder,
                                fingerprint: None,
                                lease: Duration::from_secs(3600),
                                durable: true,
                            };
                            match store.claim(&request).await.unwrap() {
                                ClaimOutcome::Granted(grant) => {
                                    assert_eq!(grant.attempt, 1);
                                    assert!(!grant.in_doubt);
                                    let commit = crate::store::Commit {
                                        claim: claim(&key, grant.token, fence),
                                        result: holder.as_bytes(),
                                        checkpoint: None,
                                        counts: None,
                                    };
                                    store.commit(&commit).await.unwrap();
                                    wins.push((k, grant.token));
                                }
                                ClaimOutcome::Held(_) | ClaimOutcome::Committed(_) => {}
                                other => panic!("nothing is parked in this race: {other:?}"),
                            }
                        }
                        wins
                    })
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });

    let mut winner_of: HashMap<usize, usize> = HashMap::new();
    let mut tokens = Vec::new();
    for (t, thread_wins) in wins.iter().enumerate() {
        for &(k, token) in thread_wins {
            assert_eq!(winner_of.insert(k, t), None, "key-{k} granted twice");
            tokens.push(token);
        }
    }
    assert_eq!(winner_of.len(), KEYS, "every key granted exactly once");
    // One grant per key, across both handles: each is its key's first token.
    assert!(tokens.iter().all(|&t| t == 1), "tokens {tokens:?}");
    for (k, t) in winner_of {
        let expected = format!("thread-{t}").into_bytes();
        for store in &handles {
            assert_eq!(
                store.committed(&format!("key-{k}")).await.unwrap(),
                Some(expected.clone())
            );
        }
    }
    assert_eq!(handles[1].open_claims(None).await.unwrap(), vec![]);
}

pub(super) async fn two_handles_acquire_disjoint_runs(harness: &mut dyn Harness, clock: &Clock) {
    const RUNS: usize = 60;
    const WORKERS: usize = 6;
    let handles: [Arc<dyn Store>; 2] = [harness.store(), harness.open_another()];
    let env = Env {
        store: handles[0].as_ref(),
        clock,
    };
    for i in 0..RUNS {
        env.submit(&format!("run-{i:02}"), b"in").await;
    }
    // Workers of both handles poll at once, a few runs at a time, until none is left.
    let taken: Vec<Vec<(String, u64)>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let store = Arc::clone(&handles[w % 2]);
                scope.spawn(move || {
                    block_on(async move {
                        let worker = format!("worker-{w}");
                        let mut taken = Vec::new();
                        loop {
                            let lease = Duration::from_secs(3600);
                            let got = store.acquire_runs(&worker, 3, lease, &[]).await.unwrap();
                            if got.is_empty() {
                                return taken;
                            }
                            for run in got {
                                let lease = run.record.lease.as_ref().unwrap();
                                assert_eq!(
                                    (lease.worker.as_str(), lease.token),
                                    (worker.as_str(), run.token)
                                );
                                taken.push((run.record.run_id, run.token));
                            }
                        }
                    })
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let mut seen = HashSet::new();
    for (run_id, token) in taken.iter().flatten() {
        assert!(seen.insert(run_id.clone()), "{run_id} leased twice");
        assert_eq!(*token, 1, "{run_id}");
    }
    assert_eq!(seen.len(), RUNS, "every run leased once");
    // Each handle sees each run held by the worker that got it.
    for (w, runs) in taken.iter().enumerate() {
        for (run_id, token) in runs {
            for store in &handles {
                let lease = store.run(run_id).await.unwrap().unwrap().lease.unwrap();
                assert_eq!(lease.worker, format!("worker-{w}"));
                assert_eq!(lease.token, *token);
            }
        }
    }
}
