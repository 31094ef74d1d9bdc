//! The claim → commit protocol: grants, holders, leases, takeovers, tokens, parking
//! and resolving, fingerprints, and the steps a run lists.

use std::collections::HashMap;
use std::time::Duration;

use super::{Env, LEASE, LEASE_MS, T0, claim, granted, req};
use crate::store::{
    Checkpoint, ClaimOutcome, ClaimRequest, Commit, Counts, HeldClaim, OpenClaim, Resolution,
    RunStatus, StepRecord, StoreError,
};

pub(super) async fn first_claim_is_granted(env: &Env<'_>) {
    let fence = env.lease("run-1").await;
    let grant = env.grant("k", "a", &fence).await;
    assert_eq!(grant.attempt, 1);
    assert!(!grant.in_doubt);
    assert!(grant.token > 0);
}

pub(super) async fn second_claimant_sees_held(env: &Env<'_>) {
    let fence = env.lease("run-1").await;
    let grant = env.grant("k", "a", &fence).await;
    env.advance(1);
    let second = env.store.claim(&req("k", "b", &fence)).await.unwrap();
    assert_eq!(
        second,
        ClaimOutcome::Held(HeldClaim {
            holder: "a".to_owned(),
            token: grant.token,
            lease_expires: T0 + LEASE_MS,
        })
    );
    // The holder itself is no exception: a claim is granted once per lease.
    assert!(matches!(
        env.store.claim(&req("k", "a", &fence)).await.unwrap(),
        ClaimOutcome::Held(_)
    ));
}

pub(super) async fn commit_then_claim_returns_result(env: &Env<'_>) {
    let store = env.store;
    let fence = env.lease("run-1").await;
    let grant = env.grant("k", "a", &fence).await;
    env.commit("k", grant.token, &fence, b"\x00result\xff")
        .await
        .unwrap();
    let result = ClaimOutcome::Committed(b"\x00result\xff".to_vec());
    assert_eq!(store.claim(&req("k", "b", &fence)).await.unwrap(), result);
    assert_eq!(
        store.committed("k").await.unwrap(),
        Some(b"\x00result\xff".to_vec())
    );
    assert_eq!(store.committed("other").await.unwrap(), None);
    assert_eq!(store.open_claims(None).await.unwrap(), vec![]);
    // Committed even long after every lease, and to the committer too.
    env.advance(100 * LEASE_MS);
    assert_eq!(store.claim(&req("k", "a", &fence)).await.unwrap(), result);
}

pub(super) async fn stale_commit_after_takeover_is_refused(env: &Env<'_>) {
    let fence = env.lease("run-1").await;
    let old = env.grant("k", "a", &fence).await;
    env.advance(LEASE_MS);
    let new = env.grant("k", "b", &fence).await;
    let err = env
        .commit("k", old.token, &fence, b"from a")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::ClaimLost { key, token } if key == "k" && *token == old.token),
        "{err:?}"
    );
    env.commit("k", new.token, &fence, b"from b").await.unwrap();
    assert_eq!(
        env.store.committed("k").await.unwrap(),
        Some(b"from b".to_vec())
    );
    // And once committed, the old holder is refused for good.
    assert!(matches!(
        env.commit("k", old.token, &fence, b"from a").await,
        Err(StoreError::ClaimLost { .. })
    ));
    assert_eq!(
        env.store.committed("k").await.unwrap(),
        Some(b"from b".to_vec())
    );
}

pub(super) async fn refused_commit_writes_nothing(env: &Env<'_>) {
    let store = env.store;
    let fence = env.lease("run-1").await;
    let old = env.grant("k", "a", &fence).await;
    env.advance(LEASE_MS);
    let new = env.grant("k", "b", &fence).await;
    assert!(matches!(
        env.commit("k", old.token, &fence, b"from a").await,
        Err(StoreError::ClaimLost { .. })
    ));
    // No result, and the new holder's claim is untouched.
    assert_eq!(store.committed("k").await.unwrap(), None);
    assert_eq!(
        store.open_claims(None).await.unwrap(),
        vec![OpenClaim {
            key: "k".to_owned(),
            run_id: "run-1".to_owned(),
            holder: Some("b".to_owned()),
            token: new.token,
            attempt: 2,
            lease_expires: T0 + 2 * LEASE_MS,
            parked: None,
        }]
    );
    // A token never handed out, and a released claim, are refused the same way.
    assert!(matches!(
        env.commit("k", u64::MAX, &fence, b"x").await,
        Err(StoreError::ClaimLost { .. })
    ));
    assert!(store.release(&claim("k", new.token, &fence)).await.unwrap());
    assert!(matches!(
        env.commit("k", new.token, &fence, b"x").await,
        Err(StoreError::ClaimLost { .. })
    ));
    assert_eq!(store.committed("k").await.unwrap(), None);
}

pub(super) async fn release_lets_next_claim_retake(env: &Env<'_>) {
    let store = env.store;
    let fence = env.lease("run-1").await;
    let first = env.grant("k", "a", &fence).await;
    assert!(
        store
            .release(&claim("k", first.token, &fence))
            .await
            .unwrap()
    );
    let claims = store.open_claims(None).await.unwrap();
    assert_eq!(claims.len(), 1);
    assert_eq!(claims[0].holder, None);
    // Well within the old lease: a released claim is free at once.
    env.advance(1);
    let second = env.grant("k", "b", &fence).await;
    assert_eq!(second.attempt, 2);
    assert!(!second.in_doubt);
    assert!(second.token > first.token);
}

pub(super) async fn release_and_renew_need_the_current_token(env: &Env<'_>) {
    let store = env.store;
    let fence = env.lease("run-1").await;
    let old = env.grant("k", "a", &fence).await;
    env.advance(LEASE_MS);
    let new = env.grant("k", "b", &fence).await;
    assert!(!store.release(&claim("k", old.token, &fence)).await.unwrap());
    let renewed = store.renew(&[claim("k", old.token, &fence)], LEASE).await;
    assert_eq!(renewed.unwrap(), [false]);
    assert!(
        !store
            .release(&claim("missing", old.token, &fence))
            .await
            .unwrap()
    );
    let claims = store.open_claims(None).await.unwrap();
    assert_eq!(claims[0].holder.as_deref(), Some("b"));
    assert_eq!(claims[0].lease_expires, T0 + 2 * LEASE_MS);
    assert!(store.release(&claim("k", new.token, &fence)).await.unwrap());
    // Released already: nothing left to release or renew.
    assert!(!store.release(&claim("k", new.token, &fence)).await.unwrap());
    let renewed = store.renew(&[claim("k", new.token, &fence)], LEASE).await;
    assert_eq!(renewed.unwrap(), [false]);
}

pub(super) async fn renew_keeps_the_claim(env: &Env<'_>) {
    let store = env.store;
    let fence = env.lease("run-1").await;
    let grant = env.grant("k", "a", &fence).await;
    let other = env.grant("j", "a", &fence).await;
    env.advance(LEASE_MS - 1);
    let renewed = store
        .renew(
            &[
                claim("k", grant.token, &fence),
                claim("j", other.token + 1, &fence),
            ],
            LEASE,
        )
        .await;
    // Each claim for itself: `j` presented a token it was never granted.
    assert_eq!(renewed.unwrap(), [true, false]);
    // Past the first lease, but within the renewed one.
    env.advance(1);
    assert_eq!(
        store.claim(&req("k", "b", &fence)).await.unwrap(),
        ClaimOutcome::Held(HeldClaim {
            holder: "a".to_owned(),
            token: grant.token,
            lease_expires: T0 + 2 * LEASE_MS - 1,
        })
    );
    assert!(granted(store.claim(&req("j", "b", &fence)).await.unwrap()).in_doubt);
    // A holder late to renew keeps its claim if nobody took it meanwhile.
    env.advance(4 * LEASE_MS);
    let renewed = store.renew(&[claim("k", grant.token, &fence)], LEASE).await;
    assert_eq!(renewed.unwrap(), [true]);
    env.advance(1);
    assert!(matches!(
        store.claim(&req("k", "b", &fence)).await.unwrap(),
        ClaimOutcome::Held(_)
    ));
}

pub(super) async fn renewing_with_a_zero_lease_ends_the_leases(env: &Env<'_>) {
    let store = env.store;
    let fence = env.lease("run-1").await;
    let grant = env.grant("k", "a", &fence).await;
    let renewed = store
        .renew(&[claim("k", grant.token, &fence)], Duration::ZERO)
        .await;
    assert_eq!(renewed.unwrap(), [true]);
    // Still a claim (whoever comes next is told it is in doubt), but nobody waits.
    let next = env.grant("k", "b", &fence).await;
    assert!(next.in_doubt);
    assert_eq!(store.renew(&[], LEASE).await.unwrap(), Vec::<bool>::new());
}

pub(super) async fn expired_lease_is_taken_over_in_doubt(env: &Env<'_>) {
    let store = env.store;
    let fence = env.lease("run-1").await;
    let first = env.grant("k", "a", &fence).await;
    // One millisecond before expiry it is still held; at expiry it is not.
    env.advance(LEASE_MS - 1);
    assert!(matches!(
        store.claim(&req("k", "b", &fence)).await.unwrap(),
        ClaimOutcome::Held(_)
    ));
    env.advance(1);
    let second = env.grant("k", "b", &fence).await;
    assert_eq!(second.attempt, 2);
    assert!(second.in_doubt);
    assert!(second.token > first.token);
    let claims = store.open_claims(None).await.unwrap();
    assert_eq!(claims[0].holder.as_deref(), Some("b"));
    assert_eq!(claims[0].token, second.token);
}

pub(super) async fn take_over_with_matching_token(env: &Env<'_>) {
    let store = env.store;
    let fence = env.lease("run-1").await;
    let first = env.grant("k", "a", &fence).await;
    env.advance(1);
    let second = granted(
        store
            .take_over(&req("k", "b", &fence), first.token)
            .await
            .unwrap(),
    );
    assert_eq!(second.attempt, 2);
    assert!(second.in_doubt);
    assert!(second.token > first.token);
    assert!(matches!(
        env.commit("k", first.token, &fence, b"a").await,
        Err(StoreError::ClaimLost { .. })
    ));
    env.commit("k", second.token, &fence, b"b").await.unwrap();
    assert_eq!(store.committed("k").await.unwrap(), Some(b"b".to_vec()));
}

pub(super) async fn take_over_with_other_token_reports_holder(env: &Env<'_>) {
    let store = env.store;
    let fence = env.lease("run-1").await;
    let first = env.grant("k", "a", &fence).await;
    env.advance(1);
    let second = granted(
        store
            .take_over(&req("k", "b", &fence), first.token)
            .await
            .unwrap(),
    );
    // Someone else already took it from `a`: `c` learns of `b`, it does not take over.
    env.advance(1);
    assert_eq!(
        store
            .take_over(&req("k", "c", &fence), first.token)
            .await
            .unwrap(),
        ClaimOutcome::Held(HeldClaim {
            holder: "b".to_owned(),
            token: second.token,
            lease_expires: T0 + 1 + LEASE_MS,
        })
    );
    // The usual rules still apply: once `b`'s lease runs out, the claim is free.
    env.advance(LEASE_MS - 1);
    let third = granted(
        store
            .take_over(&req("k", "c", &fence), first.token)
            .await
            .unwrap(),
    );
    assert_eq!(third.attempt, 3);
    assert!(third.in_doubt);
    // And a released claim is retaken without doubt.
    assert!(
        store
            .release(&claim("k", third.token, &fence))
            .await
            .unwrap()
    );
    env.advance(1);
    let fourth = granted(
        store
            .take_over(&req("k", "d", &fence), 12345)
            .await
            .unwrap(),
    );
    assert_eq!(fourth.attempt, 4);
    assert!(!fourth.in_doubt);
}

pub(super) async fn take_over_of_committed_key_returns_result(env: &Env<'_>) {
    let fence = env.lease("run-1").await;
    let grant = env.grant("k", "a", &fence).await;
    env.commit("k", grant.token, &fence, b"done").await.unwrap();
    env.advance(1);
    assert_eq!(
        env.store
            .take_over(&req("k", "b", &fence), grant.token)
            .await
            .unwrap(),
        ClaimOutcome::Committed(b"done".to_vec())
    );
}

pub(super) async fn tokens_increase_per_key(env: &Env<'_>) {
    let fence = env.lease("run-1").await;
    let mut last = HashMap::new();
    for i in 0..20_i64 {
        let key = format!("key-{}", i % 5);
        // The first round claims fresh keys; each later round, a lease later, retakes
        // the claims released before and takes over the ones that expired.
        if i > 0 && i % 5 == 0 {
            env.advance(LEASE_MS);
        }
        let grant = env.grant(&key, "a", &fence).await;
        let before = last.insert(key.clone(), grant.token).unwrap_or(0);
        assert!(
            grant.token > before,
            "{key}: token {} after {before}",
            grant.token
        );
        if i % 2 == 0 {
            let released = env.store.release(&claim(&key, grant.token, &fence)).await;
            assert!(released.unwrap());
        }
    }
}

pub(super) async fn open_claims_by_run(env: &Env<'_>) {
    let store = env.store;
    let run1 = env.lease("run-1").await;
    let run2 = env.lease("run-2").await;
    let a1 = env.grant("a1", "a", &run1).await;
    env.advance(1);
    let a2 = env.grant("a2", "a", &run1).await;
    env.advance(1);
    let b1 = env.grant("b1", "b", &run2).await;
    let done = env.grant("done", "a", &run1).await;
    env.commit("done", done.token, &run1, b"").await.unwrap();
    assert!(store.release(&claim("a2", a2.token, &run1)).await.unwrap());

    assert_eq!(
        store.open_claims(Some("run-1")).await.unwrap(),
        vec![
            OpenClaim {
                key: "a1".to_owned(),
                run_id: "run-1".to_owned(),
                holder: Some("a".to_owned()),
                token: a1.token,
                attempt: 1,
                lease_expires: T0 + LEASE_MS,
                parked: None,
            },
            OpenClaim {
                key: "a2".to_owned(),
                run_id: "run-1".to_owned(),
                holder: None,
                token: a2.token,
                attempt: 1,
                lease_expires: T0 + 1 + LEASE_MS,
                parked: None,
            },
        ]
    );
    let of_run2 = store.open_claims(Some("run-2")).await.unwrap();
    assert_eq!(of_run2.len(), 1);
    assert_eq!(of_run2[0].token, b1.token);
    let keys: Vec<String> = store
        .open_claims(None)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.key)
        .collect();
    assert_eq!(keys, ["a1", "a2", "b1"]);
    assert_eq!(store.open_claims(Some("run-3")).await.unwrap(), vec![]);
    // A claim retaken by another run moves to that run.
    env.advance(1);
    env.grant("a2", "b", &run2).await;
    assert_eq!(store.open_claims(Some("run-1")).await.unwrap().len(), 1);
    assert_eq!(store.open_claims(Some("run-2")).await.unwrap().len(), 2);
}

pub(super) async fn steps_are_listed_in_the_order_they_were_claimed(env: &Env<'_>) {
    let store = env.store;
    let fence = env.lease("run-1").await;
    let other = env.lease("run-2").await;
    // Keys claimed in another order than their names sort in; two at the same time.
    let z = env.grant("z", "a", &fence).await;
    env.advance(5);
    let b = env.grant("b", "a", &fence).await;
    let a = env.grant("a", "a", &fence).await;
    env.grant("elsewhere", "x", &other).await;
    env.advance(5);
    env.commit("z", z.token, &fence, b"r").await.unwrap();
    assert!(store.release(&claim("a", a.token, &fence)).await.unwrap());
    let step = |key: &str, token, claimed_at, committed_at, holder: Option<&str>| StepRecord {
        key: key.to_owned(),
        token,
        attempt: 1,
        claimed_at,
        committed_at,
        holder: holder.map(str::to_owned),
        parked: None,
    };
    assert_eq!(
        store.steps("run-1").await.unwrap(),
        [
            step("z", z.token, T0, Some(T0 + 10), None),
            step("a", a.token, T0 + 5, None, None),
            step("b", b.token, T0 + 5, None, Some("a")),
        ]
    );
    // A key claimed again moves to the end: its latest grant is what counts.
    let again = env.grant("a", "a", &fence).await;
    let keys: Vec<(String, i64)> = store
        .steps("run-1")
        .await
        .unwrap()
        .into_iter()
        .map(|s| (s.key, s.claimed_at))
        .collect();
    assert_eq!(
        keys,
        [
            ("z".to_owned(), T0),
            ("b".to_owned(), T0 + 5),
            ("a".to_owned(), T0 + 10)
        ]
    );
    assert_eq!(again.attempt, 2);
    assert_eq!(store.steps("no-such-run").await.unwrap(), []);
}

pub(super) async fn park_blocks_the_key_until_resolved_with_a_result(env: &Env<'_>) {
    let store = env.store;
    let fence = env.lease("run-1").await;
    let first = env.grant("k", "a", &fence).await;
    // The holder dies in the effect; the next one gets it in doubt and parks it.
    env.advance(LEASE_MS);
    let second = env.grant("k", "b", &fence).await;
    assert!(second.in_doubt);
    env.advance(1);
    store
        .park(&claim("k", second.token, &fence), "may have run")
        .await
        .unwrap();

    let run = store.run("run-1").await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::InDoubt);
    assert_eq!(
        run.outcome.as_deref(),
        Some(&b"in doubt at key k: may have run"[..])
    );
    // Nobody takes a parked key, however old its lease.
    let parked = ClaimOutcome::Parked {
        run_id: "run-1".to_owned(),
        reason: "may have run".to_owned(),
    };
    env.advance(100 * LEASE_MS);
    assert_eq!(store.claim(&req("k", "c", &fence)).await.unwrap(), parked);
    assert_eq!(
        store
            .take_over(&req("k", "c", &fence), second.token)
            .await
            .unwrap(),
        parked
    );
    let claims = store.open_claims(Some("run-1")).await.unwrap();
    assert_eq!(claims.len(), 1);
    assert_eq!(claims[0].parked.as_deref(), Some("may have run"));
    assert_eq!(claims[0].holder, None);
    // The parked holder cannot commit any more.
    assert!(matches!(
        env.commit("k", second.token, &fence, b"late").await,
        Err(StoreError::ClaimLost { .. })
    ));

    env.advance(100 * LEASE_MS);
    store
        .resolve("run-1", "k", Resolution::Commit(b"done"))
        .await
        .unwrap();
    assert_eq!(
        store.committed("k").await.unwrap().as_deref(),
        Some(&b"done"[..])
    );
    let fresh = env.acquire("run-1", "w2").await;
    assert_eq!(
        store.claim(&req("k", "c", &fresh)).await.unwrap(),
        ClaimOutcome::Committed(b"done".to_vec())
    );
    assert!(store.open_claims(None).await.unwrap().is_empty());
    let run = store.run("run-1").await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Running);
    assert_eq!(run.outcome, None);
    assert!(second.token > first.token);
}

pub(super) async fn resolve_retry_releases_the_key(env: &Env<'_>) {
    let store = env.store;
    let fence = env.lease("run-1").await;
    env.grant("k", "a", &fence).await;
    env.advance(LEASE_MS);
    let second = env.grant("k", "b", &fence).await;
    store
        .park(&claim("k", second.token, &fence), "unsure")
        .await
        .unwrap();
    env.advance(1);
    store
        .resolve("run-1", "k", Resolution::Retry)
        .await
        .unwrap();
    let run = store.run("run-1").await.unwrap().unwrap();
    assert_eq!((run.status, run.outcome), (RunStatus::Running, None));
    // Released: the next claim is attempt 3 and, the operator having decided, not in
    // doubt.
    let fresh = env.acquire("run-1", "w2").await;
    let third = env.grant("k", "c", &fresh).await;
    assert_eq!((third.attempt, third.in_doubt), (3, false));
}

pub(super) async fn park_and_resolve_need_the_right_token_and_run(env: &Env<'_>) {
    let store = env.store;
    let fence = env.lease("run-1").await;
    env.lease("run-2").await;
    let grant = env.grant("k", "a", &fence).await;
    assert!(matches!(
        store.park(&claim("k", grant.token + 1, &fence), "x").await,
        Err(StoreError::ClaimLost { .. })
    ));
    assert_eq!(
        store.run("run-1").await.unwrap().unwrap().status,
        RunStatus::Running
    );
    // A live, unparked claim is not the operator's to resolve.
    assert!(matches!(
        store.resolve("run-1", "k", Resolution::Retry).await,
        Err(StoreError::NotInDoubt { .. })
    ));
    store
        .park(&claim("k", grant.token, &fence), "x")
        .await
        .unwrap();
    assert!(matches!(
        store.resolve("run-2", "k", Resolution::Commit(b"r")).await,
        Err(StoreError::NotInDoubt { .. })
    ));
    assert!(matches!(
        store
            .resolve("run-1", "missing", Resolution::Commit(b"r"))
            .await,
        Err(StoreError::NotInDoubt { .. })
    ));
    assert_eq!(store.committed("k").await.unwrap(), None);
    assert_eq!(
        store.run("run-2").await.unwrap().unwrap().status,
        RunStatus::Running
    );
}

pub(super) async fn retakes_in_doubt_are_counted_in_their_run(env: &Env<'_>) {
    let store = env.store;
    let fence = env.lease("run-1").await;
    let first = env.grant("k", "a", &fence).await;
    let j = env.grant("j", "a", &fence).await;
    // Plain grants are the host's to count (it flushes them with its counts).
    let counts = store.run("run-1").await.unwrap().unwrap().counts;
    assert_eq!((counts.executed, counts.reclaimed), (0, 0));
    // A takeover in doubt is counted durably, before any flush.
    env.advance(1);
    let taken = granted(
        store
            .take_over(&req("k", "b", &fence), first.token)
            .await
            .unwrap(),
    );
    assert!(taken.in_doubt);
    assert_eq!(
        store.run("run-1").await.unwrap().unwrap().counts.reclaimed,
        1
    );
    // A flush keeps what the claim counted when the host counted it too.
    let flushed = Counts {
        executed: 3,
        reclaimed: 1,
        ..Counts::default()
    };
    store.save_counts(&fence, &flushed).await.unwrap();
    // A released claim retaken is not in doubt; a key found committed is no grant.
    assert!(store.release(&claim("j", j.token, &fence)).await.unwrap());
    assert!(!env.grant("j", "a", &fence).await.in_doubt);
    env.commit("k", taken.token, &fence, b"r").await.unwrap();
    store.claim(&req("k", "c", &fence)).await.unwrap();
    assert_eq!(store.run("run-1").await.unwrap().unwrap().counts, flushed);
}

pub(super) async fn commit_with_progress_is_one_transaction(env: &Env<'_>) {
    let store = env.store;
    let fence = env.lease("run-1").await;
    let stale = env.grant("k", "a", &fence).await;
    env.advance(1);
    let taker = granted(
        store
            .take_over(&req("k", "b", &fence), stale.token)
            .await
            .unwrap(),
    );
    let counts = Counts {
        executed: 7,
        recycled: 2,
        ..Counts::default()
    };
    let checkpoint = Checkpoint {
        step: 1,
        state: b"s1".to_vec(),
    };
    let commit = |token, result: &'static [u8]| Commit {
        claim: claim("k", token, &fence),
        result,
        checkpoint: Some(&checkpoint),
        counts: Some(&counts),
    };
    // The stale holder's commit is refused and its checkpoint is not written either.
    assert!(matches!(
        store.commit(&commit(stale.token, b"old")).await,
        Err(StoreError::ClaimLost { .. })
    ));
    assert_eq!(store.load_progress("run-1").await.unwrap(), None);
    assert_eq!(store.committed("k").await.unwrap(), None);
    assert_eq!(
        store.run("run-1").await.unwrap().unwrap().counts.executed,
        0
    );

    env.advance(1);
    store.commit(&commit(taker.token, b"new")).await.unwrap();
    assert_eq!(
        store.committed("k").await.unwrap().as_deref(),
        Some(&b"new"[..])
    );
    assert_eq!(
        store.load_progress("run-1").await.unwrap(),
        Some(checkpoint.clone())
    );
    let run = store.run("run-1").await.unwrap().unwrap();
    assert_eq!(run.counts, counts);
    assert_eq!((run.step, run.updated), (Some(1), T0 + 2));
}

pub(super) async fn fingerprints_bind_keys_to_their_input(env: &Env<'_>) {
    let store = env.store;
    let fence = env.lease("run-1").await;
    let with = |key: &'static str, fingerprint: Option<&'static str>, holder| ClaimRequest {
        fingerprint,
        ..req(key, holder, &fence)
    };
    let conflict = |fingerprint: &str| ClaimOutcome::Conflict {
        fingerprint: fingerprint.to_owned(),
    };
    let grant = granted(store.claim(&with("k", Some("f1"), "a")).await.unwrap());
    // In flight: another input is refused; the same input (or none) waits as usual.
    assert_eq!(
        store.claim(&with("k", Some("f2"), "b")).await.unwrap(),
        conflict("f1")
    );
    assert!(matches!(
        store.claim(&with("k", Some("f1"), "b")).await.unwrap(),
        ClaimOutcome::Held(_)
    ));
    assert!(matches!(
        store.claim(&with("k", None, "b")).await.unwrap(),
        ClaimOutcome::Held(_)
    ));
    // Committed: the binding moves to the result.
    env.commit("k", grant.token, &fence, b"r1").await.unwrap();
    assert_eq!(
        store.claim(&with("k", Some("f2"), "b")).await.unwrap(),
        conflict("f1")
    );
    assert_eq!(
        store.claim(&with("k", Some("f1"), "b")).await.unwrap(),
        ClaimOutcome::Committed(b"r1".to_vec())
    );
    // A key claimed without a fingerprint binds nothing; a later one may bind it.
    let open = granted(store.claim(&with("j", None, "a")).await.unwrap());
    store
        .release(&claim("j", open.token, &fence))
        .await
        .unwrap();
    let bound = granted(store.claim(&with("j", Some("g"), "a")).await.unwrap());
    env.commit("j", bound.token, &fence, b"r").await.unwrap();
    assert_eq!(
        store.claim(&with("j", Some("h"), "a")).await.unwrap(),
        conflict("g")
    );
}
