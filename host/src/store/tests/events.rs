//! Runs' timelines: what each lease, instance, wait, signal and end records, in which
//! order, under which holder and token; the bound; and writes refused that record
//! nothing.

use super::{Env, RUN_LEASE, RUN_LEASE_MS, T0, fence};
use crate::store::{
    Counts, EVENTS_HEAD, EVENTS_TAIL, EventKind, LeasedRun, RunEnd, RunEvent, RunFence, StoreError,
    Suspension,
};

fn kinds(events: &[RunEvent]) -> Vec<EventKind> {
    events.iter().map(|e| e.kind).collect()
}

fn instances(n: u64) -> Counts {
    Counts {
        instances: n,
        ..Counts::default()
    }
}

async fn lease_one(env: &Env<'_>, worker: &str) -> (LeasedRun, RunFence) {
    let mut got = env
        .store
        .acquire_runs(worker, 1, RUN_LEASE, &[])
        .await
        .unwrap();
    assert_eq!(got.len(), 1, "{worker} leases the run");
    let run = got.remove(0);
    let fence = fence(&run.record.run_id, run.token);
    (run, fence)
}

pub(super) async fn a_timeline_records_each_instance_takeover_wait_and_end(env: &Env<'_>) {
    let store = env.store;
    env.submit("r", b"in").await;
    assert_eq!(store.events("r").await.unwrap().unwrap().events, []);

    // w1's grant starts instance 1; a recycle ends it and starts instance 2.
    let (first, f1) = lease_one(env, "w1").await;
    assert!(first.instance_counted);
    env.advance(5);
    store
        .start_instance(&f1, &instances(2), Some("recycled after 2 steps"))
        .await
        .unwrap();
    // Instance 2 ends waiting; a signal comes (its payload is not recorded).
    let due = env.clock.now() + 1_000;
    let suspension = Suspension {
        due: Some(due),
        signal: Some("go"),
        join: None,
    };
    store
        .suspend_run(&f1, &instances(2), &suspension)
        .await
        .unwrap();
    let sent = store.send_signal("r", "go", b"secret", 100).await.unwrap();
    assert!(sent.woke);
    // w2 takes the run, given back: no takeover. Its lease then runs out with its
    // instance (a kill), and w3 takes it over.
    let (_, f2) = lease_one(env, "w2").await;
    env.advance(RUN_LEASE_MS + 1);
    let (taken, f3) = lease_one(env, "w3").await;
    assert!(taken.taken_over);
    // The killed holder's writes are refused, and record nothing.
    assert!(matches!(
        store.start_instance(&f2, &instances(4), None).await,
        Err(StoreError::LeaseLost { .. })
    ));
    store
        .finish_run(&f3, RunEnd::Completed(b"out"), &instances(4))
        .await
        .unwrap();

    let timeline = store.events("r").await.unwrap().unwrap();
    let events = &timeline.events;
    assert_eq!(
        kinds(events),
        [
            EventKind::Started,
            EventKind::Recycled,
            EventKind::Started,
            EventKind::Waiting,
            EventKind::Signal,
            EventKind::Started,
            EventKind::TookOver,
            EventKind::Started,
            EventKind::Finished,
        ]
    );
    assert_eq!(timeline.dropped, 0);
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, (1..=9).collect::<Vec<u64>>());
    assert_eq!(events[0].at, T0);
    assert_eq!(events[1].at, T0 + 5);
    // Each event names the worker and lease it happened under.
    let by: Vec<(Option<&str>, Option<u64>)> = events
        .iter()
        .map(|e| (e.holder.as_deref(), e.token))
        .collect();
    assert_eq!(
        by,
        [
            (Some("w1"), Some(f1.token)),
            (Some("w1"), Some(f1.token)),
            (Some("w1"), Some(f1.token)),
            (Some("w1"), Some(f1.token)),
            (None, None),
            (Some("w2"), Some(f2.token)),
            (Some("w3"), Some(f3.token)),
            (Some("w3"), Some(f3.token)),
            (Some("w3"), Some(f3.token)),
        ]
    );
    // The starts count the instances as the run does, each numbered.
    let started: Vec<u64> = events
        .iter()
        .filter(|e| e.kind == EventKind::Started)
        .map(|e| e.detail["instance"].as_u64().unwrap())
        .collect();
    assert_eq!(started, [1, 2, 3, 4]);
    let run = store.run("r").await.unwrap().unwrap();
    assert_eq!(run.counts.instances, 4);
    assert_eq!(events[1].detail["reason"], "recycled after 2 steps");
    assert_eq!(events[3].detail["signal"], "go");
    assert_eq!(events[3].detail["due"], due);
    assert_eq!(events[4].detail["name"], "go");
    assert_eq!(events[4].detail["woke"], true);
    assert!(!events[4].detail.to_string().contains("secret"));
    // The takeover names the lease it took over: w2's, expired.
    assert_eq!(events[6].detail["from_holder"], "w2");
    assert_eq!(events[6].detail["from_token"], f2.token);
    assert_eq!(events[6].detail["expired_at"], T0 + 5 + RUN_LEASE_MS);
    assert_eq!(events[8].detail["status"], "completed");
    assert!(
        events[6].summary().contains("took over on w3"),
        "{}",
        events[6].summary()
    );

    assert_eq!(store.events("nobody").await.unwrap(), None);
}

pub(super) async fn operators_writes_are_on_the_timeline(env: &Env<'_>) {
    let store = env.store;
    let f = env.lease("r").await;
    // A lease taken by `acquire_run` counts no instance: the host's start does.
    store.start_instance(&f, &instances(1), None).await.unwrap();
    store.pause_run("r").await.unwrap();
    // Pausing again changes nothing, and records nothing.
    store.pause_run("r").await.unwrap();
    store.release_run(&f, &instances(1), None).await.unwrap();
    store.resume_run("r").await.unwrap();
    store.put_component("cd34", b"\0asm").await.unwrap();
    store.upgrade_run("r", super::DIGEST, "cd34").await.unwrap();
    store.cancel_run("r").await.unwrap();

    let events = store.events("r").await.unwrap().unwrap().events;
    assert_eq!(
        kinds(&events),
        [
            EventKind::Started,
            EventKind::Paused,
            EventKind::Released,
            EventKind::Resumed,
            EventKind::Upgraded,
            EventKind::Cancelled,
            EventKind::Finished,
        ]
    );
    assert_eq!(events[0].holder.as_deref(), Some("w"));
    assert_eq!(events[2].detail["paused"], true);
    assert_eq!(events[2].holder.as_deref(), Some("w"));
    assert_eq!(events[4].detail["to"], "cd34");
    assert_eq!(events[5].detail["at_once"], true);
    assert_eq!(events[6].detail["status"], "cancelled");
}

pub(super) async fn a_timeline_keeps_its_first_and_last_events(env: &Env<'_>) {
    let store = env.store;
    env.submit("r", b"in").await;
    let over = 25;
    let total = EVENTS_HEAD + EVENTS_TAIL + over;
    for i in 0..total {
        store
            .send_signal("r", &format!("s{i}"), b"", 100)
            .await
            .unwrap();
    }
    let timeline = store.events("r").await.unwrap().unwrap();
    assert_eq!(timeline.events.len() as u64, EVENTS_HEAD + EVENTS_TAIL);
    assert_eq!(timeline.dropped, over);
    let seqs: Vec<u64> = timeline.events.iter().map(|e| e.seq).collect();
    let kept: Vec<u64> = (1..=EVENTS_HEAD)
        .chain(EVENTS_HEAD + over + 1..=total)
        .collect();
    assert_eq!(seqs, kept);
    // Numbered as they came: the first kept is the first signal, the last the last.
    assert_eq!(timeline.events[0].detail["name"], "s0");
    assert_eq!(
        timeline.events.last().unwrap().detail["name"],
        format!("s{}", total - 1)
    );
}
