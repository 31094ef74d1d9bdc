//! Runs: submitting, progress and counts, how runs end, cancelling, upgrades, values a
//! store cannot keep, and logs.

use super::{DIGEST, Env, RUN_LEASE, RUN_LEASE_MS, T0, claim, fence, req};
use crate::store::{
    Cancelled, Checkpoint, ClaimOutcome, Commit, Counts, MAX_STEP, RunEnd, RunFilter, RunLeaseInfo,
    RunStatus, StoreError, Submission,
};

fn submission<'a>(run_id: &'a str, input: &'a [u8]) -> Submission<'a> {
    Submission {
        run_id,
        agent: "billing",
        digest: DIGEST,
        namespace: "billing",
        input,
        authority: b"authority",
        replace_authority: false,
        priority: 0,
    }
}

pub(super) async fn submit_creates_a_queued_run_once(env: &Env<'_>) {
    let store = env.store;
    let first = env.submit("run-1", b"input").await;
    assert!(first.created);
    let record = first.record;
    assert_eq!(record.run_id, "run-1");
    assert_eq!(record.agent, "billing");
    assert_eq!(record.digest, DIGEST);
    assert_eq!(record.namespace, "billing");
    assert_eq!(record.status, RunStatus::Queued);
    assert_eq!(record.outcome, None);
    assert_eq!(record.step, None);
    assert_eq!(record.counts, Counts::default());
    assert_eq!(record.lease, None);
    assert!(!record.cancel_requested);
    assert_eq!(record.note, None);
    assert_eq!((record.created, record.updated), (T0, T0));
    env.advance(5);
    let again = env.submit("run-1", b"input").await;
    assert!(!again.created);
    assert_eq!(again.record, record);
    assert_eq!(store.run("run-1").await.unwrap(), Some(record));
    assert_eq!(store.run("run-2").await.unwrap(), None);
}

pub(super) async fn submit_with_other_input_is_refused(env: &Env<'_>) {
    let store = env.store;
    env.submit("run-1", b"input").await;
    let err = store
        .submit(&submission("run-1", b"other"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::InputMismatch { run_id } if run_id == "run-1"),
        "{err:?}"
    );
    // Empty input is input too.
    assert!(matches!(
        store.submit(&submission("run-1", b"")).await,
        Err(StoreError::InputMismatch { .. })
    ));
    assert_eq!(store.runs(&RunFilter::default()).await.unwrap().len(), 1);
}

pub(super) async fn a_batch_answers_each_run_as_a_lone_submit_would(env: &Env<'_>) {
    let store = env.store;
    env.submit("old", b"kept").await;
    let urgent = Submission {
        priority: 7,
        ..submission("urgent", b"u")
    };
    let absurd = Submission {
        priority: crate::store::MAX_PRIORITY + 1,
        ..submission("absurd", b"a")
    };
    let elsewhere = Submission {
        digest: "ff",
        ..submission("elsewhere", b"e")
    };
    let batch = [
        submission("new-1", b"one"),
        submission("old", b"kept"),
        submission("old", b"other"),
        absurd,
        elsewhere,
        urgent,
        submission("new-1", b"one"),
    ];
    let answers = store.submit_many(&batch).await.unwrap();
    assert_eq!(answers.len(), batch.len());
    let created: Vec<Option<bool>> = answers
        .iter()
        .map(|a| a.as_ref().ok().map(|s| s.created))
        .collect();
    assert_eq!(
        created,
        [
            Some(true),
            Some(false),
            None,
            None,
            None,
            Some(true),
            Some(false)
        ]
    );
    assert!(matches!(answers[2], Err(StoreError::InputMismatch { .. })));
    assert!(matches!(
        answers[3],
        Err(StoreError::PriorityRefused { .. })
    ));
    assert!(matches!(
        answers[4],
        Err(StoreError::UnknownComponent { .. })
    ));
    assert!(
        answers
            .iter()
            .flatten()
            .all(|s| s.record.status == RunStatus::Queued)
    );
    // The refused runs recorded nothing; the others are there once, as submitted.
    assert_eq!(env.run_ids().await, ["new-1", "old", "urgent"]);
    assert_eq!(store.run("urgent").await.unwrap().unwrap().priority, 7);
    assert_eq!(store.admitted("billing", "ff").await.unwrap(), Some(false));
    // An empty batch is answered with nothing.
    assert!(store.submit_many(&[]).await.unwrap().is_empty());
}

/// A batch of every kind of member at once, where later members meet what earlier ones
/// did: each is answered as a lone submit of it would be after the ones before it, and
/// the store holds exactly what those lone submits would have written.
pub(super) async fn a_mixed_batch_meets_its_own_earlier_members(env: &Env<'_>) {
    let store = env.store;
    store.put_component(DIGEST, b"\0asm").await.unwrap();
    store
        .deploy(&crate::store::Deployment {
            name: "billing",
            digest: DIGEST,
            authority: b"authority",
            admission: crate::store::Admission::Explicit,
            source: None,
        })
        .await
        .unwrap();
    store
        .set_flow(&crate::store::FlowSetting {
            deployment: "billing",
            max_running: None,
            key: Some("/customer"),
            per_key: Some(1),
        })
        .await
        .unwrap();
    // A failed run, and a queued one.
    let failed = store
        .submit(&submission("failed", br#"{"customer":"f"}"#))
        .await
        .unwrap();
    assert!(failed.created);
    let fence = env.acquire("failed", "w").await;
    store
        .finish_run(&fence, RunEnd::Failed(b"boom"), &Counts::default())
        .await
        .unwrap();
    store
        .submit(&submission("queued", br#"{"customer":"q"}"#))
        .await
        .unwrap();
    env.advance(3);
    let narrower = |s: Submission<'static>| Submission {
        authority: b"narrower",
        replace_authority: true,
        ..s
    };
    let batch = [
        // 0: refused (no key), so 1 creates it.
        submission("twice", br#"{"other":1}"#),
        // 1: new, with its key.
        submission("twice", br#"{"customer":"t"}"#),
        // 2: finds 1's run; its authority replaced.
        narrower(submission("twice", br#"{"customer":"t"}"#)),
        // 3: other input than 1's.
        submission("twice", br#"{"customer":"u"}"#),
        // 4: the failed run again, with a narrower authority: resumed.
        narrower(submission("failed", br#"{"customer":"f"}"#)),
        // 5: found again, now running: nothing more.
        submission("failed", br#"{"customer":"f"}"#),
        // 6: an existing run without its key: found (its key is its own).
        submission("queued", br#"{"customer":"q"}"#),
        // 7: an existing run named with a component the store lacks: found all the
        // same, as a lone submit finds it.
        Submission {
            digest: "ff",
            ..submission("queued", br#"{"customer":"q"}"#)
        },
        // 8: a new run of a missing component.
        Submission {
            digest: "ff",
            ..submission("missing", br#"{"customer":"m"}"#)
        },
        // 9: a new run without its key.
        submission("keyless", br#"{}"#),
        // 10: a new run, with a priority.
        Submission {
            priority: 3,
            ..submission("urgent", br#"{"customer":"z"}"#)
        },
    ];
    let answers = store.submit_many(&batch).await.unwrap();
    let lone: Vec<Result<bool, String>> = answers
        .iter()
        .map(|a| match a {
            Ok(s) => Ok(s.created),
            Err(e) => Err(format!("{e:?}")
                .split([' ', '{', '('])
                .next()
                .unwrap()
                .to_owned()),
        })
        .collect();
    let refused = |what: &str| Err::<bool, String>(what.to_owned());
    assert_eq!(
        lone,
        [
            refused("FlowKeyMissing"),
            Ok(true),
            Ok(false),
            refused("InputMismatch"),
            Ok(false),
            Ok(false),
            Ok(false),
            Ok(false),
            refused("UnknownComponent"),
            refused("FlowKeyMissing"),
            Ok(true),
        ]
    );
    // Each answer carries its run as the store now holds it.
    for answer in answers.iter().flatten() {
        let stored = store.run(&answer.record.run_id).await.unwrap().unwrap();
        assert_eq!(answer.record, stored);
    }
    let twice = &answers[1].as_ref().unwrap().record;
    assert_eq!(twice.status, RunStatus::Queued);
    assert_eq!(twice.flow_key.as_deref(), Some("t"));
    assert_eq!((twice.created, twice.updated), (T0 + 3, T0 + 3));
    let resumed = &answers[4].as_ref().unwrap().record;
    assert_eq!(resumed.status, RunStatus::Running);
    assert_eq!(
        (resumed.outcome.as_deref(), resumed.updated),
        (None, T0 + 3)
    );
    assert_eq!(answers[10].as_ref().unwrap().record.priority, 3);
    // Exactly the rows lone submits would have left.
    assert_eq!(env.run_ids().await, ["failed", "queued", "twice", "urgent"]);
    let authority = |id: &'static str| async move { store.run_authority(id).await.unwrap() };
    assert_eq!(authority("twice").await.as_deref(), Some(&b"narrower"[..]));
    assert_eq!(authority("failed").await.as_deref(), Some(&b"narrower"[..]));
    assert_eq!(
        authority("queued").await.as_deref(),
        Some(&b"authority"[..])
    );
    assert_eq!(
        authority("urgent").await.as_deref(),
        Some(&b"authority"[..])
    );
    assert_eq!(store.admitted("billing", "ff").await.unwrap(), Some(false));
    // The runs created come in the batch's order.
    let listed: Vec<String> = store
        .runs(&RunFilter::default())
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.created == T0 + 3)
        .map(|r| r.run_id)
        .collect();
    assert_eq!(listed, ["urgent", "twice"]);
}

pub(super) async fn submit_needs_the_component(env: &Env<'_>) {
    let store = env.store;
    let err = store.submit(&submission("run-1", b"in")).await.unwrap_err();
    assert!(
        matches!(&err, StoreError::UnknownComponent { digest } if digest == DIGEST),
        "{err:?}"
    );
    assert_eq!(store.run("run-1").await.unwrap(), None);
    assert_eq!(store.admitted("billing", DIGEST).await.unwrap(), None);
}

pub(super) async fn submit_resumes_a_failed_run_and_may_replace_its_authority(env: &Env<'_>) {
    let store = env.store;
    let fence = env.lease("run-1").await;
    store
        .finish_run(&fence, RunEnd::Failed(b"boom"), &Counts::default())
        .await
        .unwrap();
    assert_eq!(
        store.run("run-1").await.unwrap().unwrap().status,
        RunStatus::Failed
    );
    env.advance(2);
    let again = env.submit("run-1", b"in").await;
    assert!(!again.created);
    assert_eq!(again.record.status, RunStatus::Running);
    assert_eq!((again.record.outcome, again.record.lease), (None, None));
    assert_eq!(again.record.updated, T0 + 2);
    let leased = |run: crate::store::Acquired| match run {
        crate::store::Acquired::Leased(run) => run,
        other => panic!("{other:?}"),
    };
    // Authority kept unless replaced.
    let run = leased(store.acquire_run("run-1", "w", RUN_LEASE).await.unwrap());
    assert_eq!(run.authority, b"authority");
    assert_eq!(run.input, b"in");
    store
        .release_run(&fence_of(&run), &Counts::default(), None)
        .await
        .unwrap();
    let replaced = store
        .submit(&Submission {
            authority: b"narrower",
            replace_authority: true,
            priority: 0,
            ..submission("run-1", b"in")
        })
        .await
        .unwrap();
    assert!(!replaced.created);
    let run = leased(store.acquire_run("run-1", "w", RUN_LEASE).await.unwrap());
    assert_eq!(run.authority, b"narrower");
    // A completed run is returned as it is.
    store
        .finish_run(
            &fence_of(&run),
            RunEnd::Completed(b"out"),
            &Counts::default(),
        )
        .await
        .unwrap();
    let done = env.submit("run-1", b"in").await.record;
    assert_eq!(done.status, RunStatus::Completed);
    assert_eq!(done.outcome.as_deref(), Some(&b"out"[..]));
}

fn fence_of(run: &crate::store::LeasedRun) -> crate::store::RunFence {
    fence(&run.record.run_id, run.token)
}

pub(super) async fn progress_round_trip_stores_counts(env: &Env<'_>) {
    let store = env.store;
    let fence = env.lease("run-1").await;
    assert_eq!(store.load_progress("run-1").await.unwrap(), None);
    let counts = Counts {
        executed: 7,
        skipped: 3,
        awaited: 1,
        reclaimed: 2,
        instances: 4,
        recycled: 3,
    };
    let checkpoint = Checkpoint {
        step: 5,
        state: b"\x01\x02state".to_vec(),
    };
    env.advance(10);
    store
        .save_progress(&fence, &checkpoint, Some(&counts))
        .await
        .unwrap();
    assert_eq!(
        store.load_progress("run-1").await.unwrap(),
        Some(checkpoint)
    );
    let record = store.run("run-1").await.unwrap().unwrap();
    assert_eq!(record.counts, counts);
    assert_eq!(record.step, Some(5));
    assert_eq!((record.created, record.updated), (T0, T0 + 10));

    // A later checkpoint replaces the first; saved without counts, it leaves them be.
    let later = Checkpoint {
        step: MAX_STEP,
        state: vec![],
    };
    env.advance(10);
    store.save_progress(&fence, &later, None).await.unwrap();
    assert_eq!(store.load_progress("run-1").await.unwrap(), Some(later));
    assert_eq!(store.run("run-1").await.unwrap().unwrap().counts, counts);
    let more_still = Counts {
        executed: 8,
        instances: 5,
        ..counts
    };
    env.advance(10);
    store.save_counts(&fence, &more_still).await.unwrap();
    let record = store.run("run-1").await.unwrap().unwrap();
    assert_eq!(record.counts, more_still);
    assert_eq!(record.step, Some(MAX_STEP));
    assert_eq!(record.updated, T0 + 30);
    // Submitted again, the run reports where it stands.
    assert_eq!(env.submit("run-1", b"in").await.record, record);
}

pub(super) async fn runs_are_listed_newest_first_and_filtered(env: &Env<'_>) {
    let store = env.store;
    env.submit("old", b"").await;
    env.advance(2);
    env.submit("new", b"").await;
    store.put_component("cd34", b"other").await.unwrap();
    store
        .submit(&Submission {
            agent: "shipping",
            digest: "cd34",
            ..submission("other-agent", b"")
        })
        .await
        .unwrap();
    env.clock.set(T0 + 1);
    env.submit("mid-a", b"").await;
    env.submit("mid-b", b"").await;
    let ids = |filter: RunFilter<'static>| async move {
        let runs = store.runs(&filter).await.unwrap();
        runs.into_iter().map(|r| r.run_id).collect::<Vec<_>>()
    };
    assert_eq!(
        ids(RunFilter::default()).await,
        ["other-agent", "new", "mid-b", "mid-a", "old"]
    );
    assert_eq!(
        ids(RunFilter {
            agent: Some("billing"),
            limit: Some(2),
            ..RunFilter::default()
        })
        .await,
        ["new", "mid-b"]
    );
    env.acquire("mid-a", "w").await;
    assert_eq!(
        ids(RunFilter {
            status: Some(RunStatus::Queued),
            ..RunFilter::default()
        })
        .await,
        ["other-agent", "new", "mid-b", "old"]
    );
    assert_eq!(
        ids(RunFilter {
            status: Some(RunStatus::Running),
            agent: Some("billing"),
            parent: None,
            limit: None,
        })
        .await,
        ["mid-a"]
    );
    assert!(
        ids(RunFilter {
            limit: Some(0),
            ..RunFilter::default()
        })
        .await
        .is_empty()
    );
}

pub(super) async fn finish_run_records_the_outcome_and_ends_the_lease(env: &Env<'_>) {
    let store = env.store;
    let ok = env.lease("ok").await;
    let bad = env.lease("bad").await;
    let counts = Counts {
        executed: 2,
        instances: 1,
        ..Counts::default()
    };
    env.advance(9);
    store
        .finish_run(&ok, RunEnd::Completed(b"{\"total\":3}"), &counts)
        .await
        .unwrap();
    store
        .finish_run(&bad, RunEnd::Failed(b"card declined"), &counts)
        .await
        .unwrap();
    let done = store.run("ok").await.unwrap().unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    assert_eq!(done.outcome.as_deref(), Some(&b"{\"total\":3}"[..]));
    assert_eq!(done.counts, counts);
    assert_eq!((done.updated, done.lease), (T0 + 9, None));
    let failed = store.run("bad").await.unwrap().unwrap();
    assert_eq!(failed.status, RunStatus::Failed);
    assert_eq!(failed.outcome.as_deref(), Some(&b"card declined"[..]));
    assert_eq!(failed.lease, None);
}

pub(super) async fn finish_in_doubt_keeps_the_reason_park_stored(env: &Env<'_>) {
    let store = env.store;
    let fence = env.lease("run-1").await;
    let grant = env.grant("k", "a", &fence).await;
    store
        .park(&claim("k", grant.token, &fence), "unsure")
        .await
        .unwrap();
    store
        .finish_run(&fence, RunEnd::InDoubt, &Counts::default())
        .await
        .unwrap();
    let run = store.run("run-1").await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::InDoubt);
    assert_eq!(
        run.outcome.as_deref(),
        Some(&b"in doubt at key k: unsure"[..])
    );
    assert_eq!(run.lease, None);
}

pub(super) async fn finish_cancelled_releases_the_runs_open_claims(env: &Env<'_>) {
    let store = env.store;
    let fence = env.lease("run-1").await;
    let other = env.lease("run-2").await;
    let open = env.grant("open", "a", &fence).await;
    let parked = env.grant("parked", "a", &fence).await;
    let done = env.grant("done", "a", &fence).await;
    env.grant("theirs", "b", &other).await;
    env.commit("done", done.token, &fence, b"r").await.unwrap();
    store
        .park(&claim("parked", parked.token, &fence), "unsure")
        .await
        .unwrap();
    store.cancel_run("run-1").await.unwrap();
    store
        .finish_run(&fence, RunEnd::Cancelled, &Counts::default())
        .await
        .unwrap();
    let run = store.run("run-1").await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Cancelled);
    assert_eq!(
        (run.lease, run.cancel_requested, run.outcome),
        (None, false, None)
    );
    let holders: Vec<(String, Option<String>, Option<String>)> = store
        .open_claims(None)
        .await
        .unwrap()
        .into_iter()
        .map(|c| (c.key, c.holder, c.parked))
        .collect();
    assert_eq!(
        holders,
        [
            ("open".to_owned(), None, None),
            ("parked".to_owned(), None, Some("unsure".to_owned())),
            ("theirs".to_owned(), Some("b".to_owned()), None),
        ]
    );
    // Released, not in doubt: whoever claims it next starts afresh.
    let next = env.grant("open", "c", &other).await;
    assert!(!next.in_doubt);
    assert!(next.token > open.token);
    assert_eq!(
        store.committed("done").await.unwrap().as_deref(),
        Some(&b"r"[..])
    );
}

pub(super) async fn cancel_run_in_each_case(env: &Env<'_>) {
    let store = env.store;
    // Unknown.
    assert!(matches!(
        store.cancel_run("ghost").await,
        Err(StoreError::UnknownRun { run_id }) if run_id == "ghost"
    ));
    // Queued, nobody holds it: cancelled now.
    env.submit("queued", b"").await;
    assert_eq!(store.cancel_run("queued").await.unwrap(), Cancelled::Now);
    let run = store.run("queued").await.unwrap().unwrap();
    assert_eq!((run.status, run.lease), (RunStatus::Cancelled, None));
    assert!(
        store
            .acquire_runs("w", 10, RUN_LEASE, &[])
            .await
            .unwrap()
            .is_empty()
    );
    // Cancelled already.
    assert!(matches!(
        store.cancel_run("queued").await,
        Err(StoreError::RunFinished {
            status: RunStatus::Cancelled,
            ..
        })
    ));
    // A live lease: the worker is asked, and learns it when it renews.
    let held = env.lease("held").await;
    let grant = env.grant("k", "a", &held).await;
    let lease = RunLeaseInfo {
        worker: "w".to_owned(),
        token: held.token,
        expires: T0 + RUN_LEASE_MS,
    };
    assert_eq!(
        store.cancel_run("held").await.unwrap(),
        Cancelled::Requested {
            lease: lease.clone()
        }
    );
    let run = store.run("held").await.unwrap().unwrap();
    assert_eq!(
        (run.status, run.cancel_requested),
        (RunStatus::Running, true)
    );
    assert_eq!(run.lease, Some(lease));
    assert_eq!(
        store.open_claims(None).await.unwrap()[0].holder.as_deref(),
        Some("a")
    );
    // Its lease ran out with nobody renewing it: cancelled now, claims released, and the
    // worker that let it lapse is fenced off.
    env.advance(RUN_LEASE_MS);
    assert_eq!(store.cancel_run("held").await.unwrap(), Cancelled::Now);
    assert_eq!(store.open_claims(None).await.unwrap()[0].holder, None);
    assert!(matches!(
        env.commit("k", grant.token, &held, b"late").await,
        Err(StoreError::LeaseLost { .. })
    ));
    // Failed runs can be cancelled; completed ones cannot.
    let failed = env.lease("failed").await;
    store
        .finish_run(&failed, RunEnd::Failed(b"x"), &Counts::default())
        .await
        .unwrap();
    assert_eq!(store.cancel_run("failed").await.unwrap(), Cancelled::Now);
    let done = env.lease("done").await;
    store
        .finish_run(&done, RunEnd::Completed(b""), &Counts::default())
        .await
        .unwrap();
    assert!(matches!(
        store.cancel_run("done").await,
        Err(StoreError::RunFinished {
            status: RunStatus::Completed,
            ..
        })
    ));
    assert_eq!(
        store.run("done").await.unwrap().unwrap().status,
        RunStatus::Completed
    );
}

pub(super) async fn upgrade_moves_a_run_to_another_component(env: &Env<'_>) {
    let store = env.store;
    env.submit("run-1", b"in").await;
    env.advance(1);
    assert!(matches!(
        store.upgrade_run("run-1", "not-the-digest", "cd34").await,
        Err(StoreError::UnknownRun { .. })
    ));
    assert_eq!(store.run("run-1").await.unwrap().unwrap().digest, DIGEST);
    env.advance(1);
    store.upgrade_run("run-1", DIGEST, "cd34").await.unwrap();
    let run = store.run("run-1").await.unwrap().unwrap();
    assert_eq!((run.digest.as_str(), run.updated), ("cd34", T0 + 2));
    assert!(matches!(
        store.upgrade_run("ghost", DIGEST, "cd34").await,
        Err(StoreError::UnknownRun { .. })
    ));
}

pub(super) async fn values_a_store_cannot_keep_are_refused_and_write_nothing(env: &Env<'_>) {
    let store = env.store;
    let fence = env.lease("run-1").await;
    let grant = env.grant("k", "a", &fence).await;
    let before = store.run("run-1").await.unwrap().unwrap();
    let beyond = Checkpoint {
        step: MAX_STEP + 1,
        state: b"s".to_vec(),
    };
    let huge = Counts {
        skipped: u64::MAX,
        ..Counts::default()
    };
    let out_of_range = |result: Result<(), StoreError>, expected: &str| match result {
        Err(e @ StoreError::OutOfRange { what, .. }) => {
            assert_eq!(what, expected, "{e}");
            assert!(e.to_string().contains("9223372036854775807"), "{e}");
        }
        other => panic!("expected OutOfRange, got {other:?}"),
    };
    out_of_range(
        store.save_progress(&fence, &beyond, None).await,
        "checkpoint step",
    );
    out_of_range(store.save_counts(&fence, &huge).await, "count skipped");
    out_of_range(
        store.release_run(&fence, &huge, None).await,
        "count skipped",
    );
    out_of_range(
        store
            .finish_run(&fence, RunEnd::Completed(b""), &huge)
            .await,
        "count skipped",
    );
    // A commit carrying such a value does not commit its result either.
    out_of_range(
        store
            .commit(&Commit {
                claim: claim("k", grant.token, &fence),
                result: b"r",
                checkpoint: Some(&beyond),
                counts: None,
            })
            .await,
        "checkpoint step",
    );
    out_of_range(
        store
            .commit(&Commit {
                claim: claim("k", grant.token, &fence),
                result: b"r",
                checkpoint: None,
                counts: Some(&huge),
            })
            .await,
        "count skipped",
    );
    assert_eq!(store.committed("k").await.unwrap(), None);
    assert_eq!(store.load_progress("run-1").await.unwrap(), None);
    assert_eq!(store.run("run-1").await.unwrap().unwrap(), before);
    // Tokens beyond any a store hands out hold nothing: refused as lost, not as faults.
    let wild = super::fence("run-1", u64::MAX);
    assert!(matches!(
        store.save_counts(&wild, &Counts::default()).await,
        Err(StoreError::LeaseLost { .. })
    ));
    assert!(!store.release(&claim("k", u64::MAX, &fence)).await.unwrap());
    assert!(matches!(
        store.claim(&req("k", "b", &wild)).await,
        Err(StoreError::LeaseLost { .. })
    ));
    // The claim is still the holder's, and commits.
    env.commit("k", grant.token, &fence, b"r").await.unwrap();
    assert_eq!(
        store.claim(&req("k", "b", &fence)).await.unwrap(),
        ClaimOutcome::Committed(b"r".to_vec())
    );
}

pub(super) async fn logs_keep_the_last_bytes_across_appends(env: &Env<'_>) {
    let store = env.store;
    let fence = env.lease("run-1").await;
    let other = env.lease("run-2").await;
    assert_eq!(store.logs("run-1").await.unwrap(), b"");
    store.append_log(&fence, b"hello ", 100).await.unwrap();
    store.append_log(&fence, b"world", 100).await.unwrap();
    store.append_log(&other, b"elsewhere", 100).await.unwrap();
    assert_eq!(store.logs("run-1").await.unwrap(), b"hello world");
    // Only the last `keep` bytes stay, however they were appended.
    store.append_log(&fence, b"!", 8).await.unwrap();
    assert_eq!(store.logs("run-1").await.unwrap(), b"o world!");
    // Much more than a chunk at once, and many small appends: the tail is exact.
    let big: Vec<u8> = (0..20_000_u32).map(|i| (i % 251) as u8).collect();
    store.append_log(&fence, &big, 10_000).await.unwrap();
    assert_eq!(store.logs("run-1").await.unwrap(), &big[10_000..]);
    let mut expected = big[10_000..].to_vec();
    for i in 0..200_u32 {
        let line = format!("line {i}\n");
        store
            .append_log(&fence, line.as_bytes(), 10_000)
            .await
            .unwrap();
        expected.extend_from_slice(line.as_bytes());
    }
    let tail = expected[expected.len() - 10_000..].to_vec();
    assert_eq!(store.logs("run-1").await.unwrap(), tail);
    // Keeping less drops the rest; keeping nothing empties the log.
    store.append_log(&fence, b"", 3).await.unwrap();
    assert_eq!(store.logs("run-1").await.unwrap(), &tail[tail.len() - 3..]);
    store.append_log(&fence, b"gone", 0).await.unwrap();
    assert_eq!(store.logs("run-1").await.unwrap(), b"");
    assert_eq!(store.logs("run-2").await.unwrap(), b"elsewhere");
    assert_eq!(store.logs("ghost").await.unwrap(), b"");
}
