//! Retention: gc deletes a finished run with exactly its rows (counted in the
//! database's own tables), a dry run deletes nothing and counts the same, live runs and
//! the dedupe window keep their keys, and a key deleted and granted again gets a token
//! greater than every token it had.

use std::time::Duration;

use super::{DIGEST, Env, Harness, claim};
use crate::store::{
    Checkpoint, Clock, Counts, GcReport, GcRequest, Millis, Recorded, RunEnd, RunStatus, Tokens,
    UsageFilter, UsageRecord, WaitKind, WaitRequest, Wake,
};

/// Records usage of the committed `key` for the fence's run.
async fn record_usage(env: &Env<'_>, key: &str, fence: &crate::store::RunFence) -> Recorded {
    let tokens = Tokens {
        input: 100,
        output: 20,
        cached: 0,
    };
    env.store
        .record_usage(&UsageRecord {
            fence,
            key,
            model: "m",
            tokens,
        })
        .await
        .unwrap()
}

const DAY: Millis = 86_400_000;

fn days(n: u64) -> Duration {
    Duration::from_secs(n * 86_400)
}

/// Runs finished 30 days ago go; keys stay 7 days.
fn request(dry_run: bool) -> GcRequest {
    GcRequest {
        history_before: None,
        finished_before: days(30),
        dedupe_window: days(7),
        include_failed: false,
        dry_run,
    }
}

/// The report's counts, without the cut-off times.
fn counts(report: &GcReport) -> GcReport {
    GcReport {
        runs_before: 0,
        keys_before: 0,
        ..*report
    }
}

/// Commits `key` for the fence's run: its token.
async fn commit(env: &Env<'_>, key: &str, fence: &crate::store::RunFence) -> u64 {
    let grant = env.grant(key, "h", fence).await;
    env.commit(key, grant.token, fence, key.as_bytes())
        .await
        .unwrap();
    grant.token
}

fn live_text(key: &str, text: &str) -> crate::store::LiveText {
    crate::store::LiveText {
        key: key.into(),
        text: text.into(),
    }
}

const TABLES: &[&str] = &[
    "runs",
    "run_inputs",
    "run_outcomes",
    "progress",
    "run_logs",
    "steps",
    "waits",
    "signals",
    "run_upgrades",
    "step_usage",
    "run_live",
    "components",
    "run_events",
];

fn rows(harness: &dyn Harness) -> Vec<u64> {
    TABLES.iter().map(|table| harness.rows(table)).collect()
}

pub(super) async fn gc_deletes_exactly_a_finished_runs_rows_and_a_dry_run_nothing(
    harness: &mut dyn Harness,
    clock: &Clock,
) {
    let store = harness.store();
    let env = Env {
        store: store.as_ref(),
        clock,
    };
    // Components stored long ago: one no run uses, one only the old run was moved to.
    store.put_component("cd34", b"\0asm").await.unwrap();
    store.put_component("ef56", b"\0asm").await.unwrap();

    // The old run: two committed keys (one with usage), a released claim, a
    // checkpoint, a log, a sleep, a signal and an upgrade; completed.
    env.submit("old", b"in").await;
    store.upgrade_run("old", DIGEST, "ef56").await.unwrap();
    let old = env.acquire("old", "w").await;
    commit(&env, "billing:a", &old).await;
    commit(&env, "billing:b", &old).await;
    assert_eq!(record_usage(&env, "billing:a", &old).await, Recorded::Spent);
    let c = env.grant("billing:c", "h", &old).await;
    assert!(
        store
            .release(&claim("billing:c", c.token, &old))
            .await
            .unwrap()
    );
    let checkpoint = Checkpoint {
        step: 2,
        state: b"state".to_vec(),
    };
    store.save_progress(&old, &checkpoint, None).await.unwrap();
    store.append_log(&old, b"hello", 1024).await.unwrap();
    store
        .append_live(&old, &[live_text("a", "one"), live_text("b", "two")], 1024)
        .await
        .unwrap();
    let nap = WaitRequest {
        fence: &old,
        key: "nap",
        kind: WaitKind::Sleep(Wake::After(Duration::from_secs(1))),
    };
    store.wait(&nap).await.unwrap();
    store.send_signal("old", "go", b"p", 1024).await.unwrap();
    store
        .finish_run(&old, RunEnd::Completed(b"out"), &Counts::default())
        .await
        .unwrap();

    // A live run, started as long ago: its committed key and checkpoint stay.
    let live = env.lease("live").await;
    commit(&env, "billing:live", &live).await;
    assert_eq!(
        record_usage(&env, "billing:live", &live).await,
        Recorded::Spent
    );
    store.save_progress(&live, &checkpoint, None).await.unwrap();
    store
        .append_live(&live, &[live_text("l", "stays")], 1024)
        .await
        .unwrap();

    env.advance(31 * DAY);
    // A run finished a day ago stays.
    let recent = env.lease("recent").await;
    commit(&env, "billing:recent", &recent).await;
    store
        .finish_run(&recent, RunEnd::Completed(b"out"), &Counts::default())
        .await
        .unwrap();
    env.advance(DAY);

    let expected = GcReport {
        runs: 1,
        results: 2,
        claims: 1,
        checkpoints: 1,
        log_chunks: 1,
        waits: 1,
        signals: 1,
        upgrades: 1,
        usage: 1,
        live_chunks: 2,
        components: 2,
        // Its timeline: the upgrade, the signal and its end.
        events: 3,
        ..GcReport::default()
    };
    let before = rows(harness);
    let dry = store.gc(&request(true)).await.unwrap();
    assert_eq!(counts(&dry), expected);
    let now = env.clock.now();
    assert_eq!(
        (dry.runs_before, dry.keys_before),
        (now - 30 * DAY, now - 7 * DAY)
    );
    assert_eq!(rows(harness), before, "a dry run deletes nothing");

    let done = store.gc(&request(false)).await.unwrap();
    assert_eq!(done, dry, "a dry run counts what gc then deletes");
    // Per table, in the order of `TABLES`: exactly the old run's rows went.
    let gone = [1, 1, 1, 1, 1, 3, 1, 1, 1, 1, 2, 2, 3];
    let after: Vec<u64> = before.iter().zip(gone).map(|(b, g)| b - g).collect();
    assert_eq!(rows(harness), after);

    assert_eq!(store.run("old").await.unwrap(), None);
    for key in ["billing:a", "billing:b"] {
        assert_eq!(store.committed(key).await.unwrap(), None);
    }
    for key in ["billing:live", "billing:recent"] {
        assert_eq!(
            store.committed(key).await.unwrap(),
            Some(key.as_bytes().to_vec())
        );
    }
    let live_run = store.run("live").await.unwrap().unwrap();
    assert_eq!(live_run.status, RunStatus::Running);
    assert_eq!(store.load_progress("live").await.unwrap(), Some(checkpoint));
    assert!(store.run("recent").await.unwrap().is_some());
    // The live run's usage stays, the old run's went with it.
    let usage = store.usage(&UsageFilter::default()).await.unwrap();
    assert_eq!(usage.iter().map(|u| u.calls).sum::<u64>(), 1);
    // So does its live stream.
    assert_eq!(store.live("live", None, 10).await.unwrap().len(), 1);
    assert!(store.live("old", None, 10).await.unwrap().is_empty());
    // Its timeline went with it; the others' stay.
    assert_eq!(store.events("old").await.unwrap(), None);
    assert!(
        !store
            .events("recent")
            .await
            .unwrap()
            .unwrap()
            .events
            .is_empty()
    );
    assert!(store.has_component(DIGEST).await.unwrap());
    assert!(!store.has_component("ef56").await.unwrap());
    // Nothing is left to collect.
    assert_eq!(store.gc(&request(false)).await.unwrap().total(), 0);
}

pub(super) async fn a_deleted_key_granted_again_gets_a_greater_token(env: &Env<'_>) {
    let store = env.store;
    let first = env.lease("first").await;
    // A few grants, so that the key's token is past its first.
    let g = env.grant("billing:k", "h", &first).await;
    assert!(
        store
            .release(&claim("billing:k", g.token, &first))
            .await
            .unwrap()
    );
    let token = commit(env, "billing:k", &first).await;
    assert!(token > g.token);
    store
        .finish_run(&first, RunEnd::Completed(b"out"), &Counts::default())
        .await
        .unwrap();
    env.advance(31 * DAY);
    let report = store.gc(&request(false)).await.unwrap();
    assert_eq!((report.runs, report.results), (1, 1));
    assert_eq!(store.committed("billing:k").await.unwrap(), None);

    // Granted again, the key is new (its step runs again), and outranks every holder
    // it ever had.
    let again = env.lease("again").await;
    let grant = env.grant("billing:k", "h2", &again).await;
    assert_eq!((grant.attempt, grant.in_doubt), (1, false));
    assert!(
        grant.token > token,
        "token {} after gc, {token} before",
        grant.token
    );
    // A stale commit by a holder of the deleted key is refused.
    assert!(env.commit("billing:k", token, &again, b"x").await.is_err());
    env.commit("billing:k", grant.token, &again, b"y")
        .await
        .unwrap();
}

pub(super) async fn keys_inside_the_dedupe_window_outlive_their_run(env: &Env<'_>) {
    let store = env.store;
    let run = env.lease("r").await;
    commit(env, "billing:k", &run).await;
    store
        .finish_run(&run, RunEnd::Completed(b"out"), &Counts::default())
        .await
        .unwrap();
    env.advance(2 * DAY);
    let req = GcRequest {
        history_before: None,
        finished_before: days(1),
        ..request(false)
    };
    let report = store.gc(&req).await.unwrap();
    assert_eq!((report.runs, report.results), (1, 0));
    assert_eq!(store.run("r").await.unwrap(), None);
    assert_eq!(
        store.committed("billing:k").await.unwrap(),
        Some(b"billing:k".to_vec())
    );
    // Out of the window, the key its run left behind goes too.
    env.advance(6 * DAY);
    let dry = store
        .gc(&GcRequest {
            history_before: None,
            dry_run: true,
            ..req.clone()
        })
        .await
        .unwrap();
    assert_eq!((dry.runs, dry.results), (0, 1));
    let report = store.gc(&req).await.unwrap();
    assert_eq!(counts(&report), counts(&dry));
    assert_eq!(store.committed("billing:k").await.unwrap(), None);
}

pub(super) async fn failed_runs_stay_unless_asked_and_live_claims_always(env: &Env<'_>) {
    let store = env.store;
    let failed = env.lease("failed").await;
    commit(env, "billing:f", &failed).await;
    store
        .finish_run(&failed, RunEnd::Failed(b"boom"), &Counts::default())
        .await
        .unwrap();
    // A running run with a claim whose lease will have run out, and a run in doubt.
    let live = env.lease("live").await;
    commit(env, "billing:done", &live).await;
    env.grant("billing:open", "h", &live).await;
    let doubt = env.lease("doubt").await;
    let parked = env.grant("billing:parked", "h", &doubt).await;
    store
        .park(&claim("billing:parked", parked.token, &doubt), "why")
        .await
        .unwrap();
    env.advance(31 * DAY);

    let report = store.gc(&request(false)).await.unwrap();
    assert_eq!(report.total(), 0, "{report:?}");
    let report = store
        .gc(&GcRequest {
            history_before: None,
            include_failed: true,
            ..request(false)
        })
        .await
        .unwrap();
    assert_eq!((report.runs, report.results, report.claims), (1, 1, 0));
    assert_eq!(store.run("failed").await.unwrap(), None);
    assert!(store.committed("billing:done").await.unwrap().is_some());
    let open: Vec<String> = store
        .open_claims(None)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.key)
        .collect();
    assert_eq!(open, ["billing:open", "billing:parked"]);
    assert_eq!(
        store.run("doubt").await.unwrap().unwrap().status,
        RunStatus::InDoubt
    );
}
