//! Schedules: creating them, firing their ticks on the store's clock (each once, with
//! the catch-up and overlap policies), pausing, resuming, deleting, and refusing bad
//! definitions with nothing written.

use std::sync::Arc;

use super::{DIGEST, Env, Harness, T0};
use crate::store::{
    Admission, Clock, Counts, Deployment, Overlap, RunEnd, RunStatus, ScheduleDef, ScheduleSpec,
    Store, StoreError, Tick, TickOutcome, schedule_run_id,
};

const EVERY: i64 = 10_000;

async fn deploy(store: &dyn Store) {
    store.put_component(DIGEST, b"\0asm").await.unwrap();
    store
        .deploy(&Deployment {
            name: "billing",
            digest: DIGEST,
            authority: b"grant",
            admission: Admission::Explicit,
            source: None,
        })
        .await
        .unwrap();
}

fn every(ms: i64) -> ScheduleSpec {
    ScheduleSpec::Every { every_ms: ms }
}

fn def<'a>(
    name: &'a str,
    spec: &'a ScheduleSpec,
    catch_up: u32,
    overlap: Overlap,
) -> ScheduleDef<'a> {
    ScheduleDef {
        name,
        deployment: "billing",
        spec,
        input: br#"{"report":"daily"}"#,
        catch_up,
        overlap,
    }
}

fn started(ticks: &[Tick]) -> Vec<(i64, String)> {
    ticks
        .iter()
        .filter_map(|t| match &t.outcome {
            TickOutcome::Started { run_id, .. } => Some((t.tick, run_id.clone())),
            _ => None,
        })
        .collect()
}

pub(super) async fn a_tick_starts_one_run_of_the_deployment_once(env: &Env<'_>) {
    let store = env.store;
    deploy(store).await;
    let spec = every(EVERY);
    let created = store
        .create_schedule(&def("nightly", &spec, 0, Overlap::Allow))
        .await
        .unwrap();
    // Aligned to the epoch: the first tick after creation.
    assert_eq!(created.next_tick, Some(T0 + EVERY));
    assert_eq!(store.next_due(T0).await.unwrap(), Some(T0 + EVERY));
    assert!(store.fire_schedules(10).await.unwrap().is_empty());
    env.advance(EVERY);
    let ticks = store.fire_schedules(10).await.unwrap();
    let run_id = schedule_run_id("nightly", T0 + EVERY);
    assert_eq!(started(&ticks), vec![(T0 + EVERY, run_id.clone())]);
    // Fired: nothing more until the next tick.
    assert!(store.fire_schedules(10).await.unwrap().is_empty());
    let run = store.run(&run_id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Queued);
    assert_eq!(
        (run.agent.as_str(), run.digest.as_str()),
        ("billing", DIGEST)
    );
    assert_eq!(
        store.run_authority(&run_id).await.unwrap().as_deref(),
        Some(&b"grant"[..])
    );
    let by = store.run_schedule(&run_id).await.unwrap().unwrap();
    assert_eq!((by.schedule.as_str(), by.tick), ("nightly", T0 + EVERY));
    let record = store.schedule("nightly").await.unwrap().unwrap();
    assert_eq!(record.next_tick, Some(T0 + 2 * EVERY));
    assert_eq!(record.last_run.as_deref(), Some(run_id.as_str()));
    assert_eq!((record.ticks.started, record.ticks.missed), (1, 0));
    assert_eq!(store.runs(&Default::default()).await.unwrap().len(), 1);
}

pub(super) async fn late_ticks_are_caught_up_to_the_limit_and_the_rest_missed(env: &Env<'_>) {
    let store = env.store;
    deploy(store).await;
    let spec = every(EVERY);
    store
        .create_schedule(&def("catchup", &spec, 2, Overlap::Allow))
        .await
        .unwrap();
    store
        .create_schedule(&def("latest", &spec, 0, Overlap::Allow))
        .await
        .unwrap();
    // Six ticks fall while no worker fires (+10s .. +60s), and a bit more time.
    env.advance(6 * EVERY + 500);
    let ticks = store.fire_schedules(10).await.unwrap();
    let of = |name: &str| -> Vec<i64> {
        ticks
            .iter()
            .filter(|t| t.schedule == name)
            .map(|t| t.tick)
            .collect()
    };
    assert_eq!(
        of("catchup"),
        vec![T0 + 4 * EVERY, T0 + 5 * EVERY, T0 + 6 * EVERY]
    );
    assert_eq!(of("latest"), vec![T0 + 6 * EVERY]);
    let catchup = store.schedule("catchup").await.unwrap().unwrap();
    assert_eq!((catchup.ticks.started, catchup.ticks.missed), (3, 3));
    assert_eq!(catchup.next_tick, Some(T0 + 7 * EVERY));
    let latest = store.schedule("latest").await.unwrap().unwrap();
    assert_eq!((latest.ticks.started, latest.ticks.missed), (1, 5));
    assert_eq!(store.runs(&Default::default()).await.unwrap().len(), 4);
}

pub(super) async fn overlapping_ticks_skip_allow_or_cancel_the_previous_run(env: &Env<'_>) {
    let store = env.store;
    deploy(store).await;
    let spec = every(EVERY);
    for (name, overlap) in [
        ("skip", Overlap::Skip),
        ("allow", Overlap::Allow),
        ("cancel", Overlap::CancelPrevious),
    ] {
        store
            .create_schedule(&def(name, &spec, 0, overlap))
            .await
            .unwrap();
    }
    env.advance(EVERY);
    assert_eq!(started(&store.fire_schedules(10).await.unwrap()).len(), 3);
    let first = |name| schedule_run_id(name, T0 + EVERY);
    // The cancel schedule's first run is leased by a worker: cancelling asks it.
    let leased = env.acquire(&first("cancel"), "w").await;
    env.advance(EVERY);
    let ticks = store.fire_schedules(10).await.unwrap();
    let outcome = |name: &str| {
        ticks
            .iter()
            .find(|t| t.schedule == name)
            .unwrap()
            .outcome
            .clone()
    };
    assert_eq!(outcome("skip"), TickOutcome::Skipped);
    assert!(matches!(outcome("allow"), TickOutcome::Started { .. }));
    assert!(matches!(outcome("cancel"), TickOutcome::Started { .. }));
    let previous = store.run(&first("cancel")).await.unwrap().unwrap();
    assert!(previous.cancel_requested);
    // The allow schedule's two runs are both queued; the skip schedule has one.
    assert_eq!(
        store.run(&first("allow")).await.unwrap().unwrap().status,
        RunStatus::Queued
    );
    assert!(
        store
            .run(&schedule_run_id("skip", T0 + 2 * EVERY))
            .await
            .unwrap()
            .is_none()
    );
    // The cancelled run's worker records its end; the next tick of `cancel` finds the
    // second run unleased and cancels it at once.
    store
        .finish_run(&leased, RunEnd::Cancelled, &Counts::default())
        .await
        .unwrap();
    // The skip schedule's run ends: its next tick starts again.
    let skip_fence = env.acquire(&first("skip"), "w").await;
    store
        .finish_run(&skip_fence, RunEnd::Completed(b"done"), &Counts::default())
        .await
        .unwrap();
    env.advance(EVERY);
    let ticks = store.fire_schedules(10).await.unwrap();
    assert_eq!(started(&ticks).len(), 3);
    let second = store
        .run(&schedule_run_id("cancel", T0 + 2 * EVERY))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(second.status, RunStatus::Cancelled);
    let skip = store.schedule("skip").await.unwrap().unwrap();
    assert_eq!((skip.ticks.started, skip.ticks.skipped), (2, 1));
}

pub(super) async fn paused_schedules_fire_nothing_and_resume_from_now(env: &Env<'_>) {
    let store = env.store;
    deploy(store).await;
    let spec = every(EVERY);
    store
        .create_schedule(&def("hourly", &spec, 5, Overlap::Allow))
        .await
        .unwrap();
    let paused = store.pause_schedule("hourly", true).await.unwrap();
    assert!(paused.paused);
    // Pausing again changes nothing.
    assert_eq!(store.pause_schedule("hourly", true).await.unwrap(), paused);
    assert_eq!(store.next_due(T0).await.unwrap(), None);
    env.advance(5 * EVERY + 1);
    assert!(store.fire_schedules(10).await.unwrap().is_empty());
    let resumed = store.pause_schedule("hourly", false).await.unwrap();
    // From now: the five ticks that fell while paused are neither run nor caught up.
    assert_eq!(resumed.next_tick, Some(T0 + 6 * EVERY));
    env.advance(EVERY);
    let ticks = store.fire_schedules(10).await.unwrap();
    assert_eq!(started(&ticks).len(), 1);
    let run_id = schedule_run_id("hourly", T0 + 6 * EVERY);
    store.delete_schedule("hourly").await.unwrap();
    assert!(store.schedule("hourly").await.unwrap().is_none());
    assert!(matches!(
        store.delete_schedule("hourly").await,
        Err(StoreError::UnknownSchedule { .. })
    ));
    assert!(matches!(
        store.pause_schedule("hourly", true).await,
        Err(StoreError::UnknownSchedule { .. })
    ));
    // Its run stays, and still names it.
    assert!(store.run(&run_id).await.unwrap().is_some());
    assert_eq!(
        store.run_schedule(&run_id).await.unwrap().unwrap().schedule,
        "hourly"
    );
    env.advance(10 * EVERY);
    assert!(store.fire_schedules(10).await.unwrap().is_empty());
}

pub(super) async fn cron_ticks_fall_in_their_time_zone(env: &Env<'_>) {
    let store = env.store;
    deploy(store).await;
    // T0 is 2023-11-14T22:13:20Z; 09:00 in Tokyo (UTC+9) is 00:00Z the next day.
    let spec = ScheduleSpec::Cron {
        expr: "0 9 * * *".into(),
        tz: "Asia/Tokyo".into(),
    };
    let created = store
        .create_schedule(&def("tokyo", &spec, 0, Overlap::Skip))
        .await
        .unwrap();
    let tick = created.next_tick.unwrap();
    assert_eq!(crate::store::tick_text(tick), "2023-11-15T00:00:00Z");
    env.clock.set(tick);
    let ticks = store.fire_schedules(10).await.unwrap();
    assert_eq!(
        started(&ticks),
        vec![(tick, "tokyo@2023-11-15T00:00:00Z".to_owned())]
    );
    assert_eq!(
        store.schedule("tokyo").await.unwrap().unwrap().next_tick,
        Some(tick + 24 * 3_600_000)
    );
}

pub(super) async fn bad_schedules_are_refused_and_write_nothing(env: &Env<'_>) {
    let store = env.store;
    deploy(store).await;
    let good = every(EVERY);
    store
        .create_schedule(&def("taken", &good, 0, Overlap::Skip))
        .await
        .unwrap();
    let before = store.schedules().await.unwrap();
    let cron = |expr: &str, tz: &str| ScheduleSpec::Cron {
        expr: expr.into(),
        tz: tz.into(),
    };
    let bad_specs = [
        cron("61 * * * *", "UTC"),
        cron("every day", "UTC"),
        cron("0 9 * * *", "Europe/Atlantis"),
        every(0),
        every(-1),
        every(99),
        every(400 * 86_400_000),
    ];
    for spec in &bad_specs {
        let refused = store
            .create_schedule(&def("new", spec, 0, Overlap::Skip))
            .await;
        assert!(
            matches!(refused, Err(StoreError::ScheduleRefused { .. })),
            "{spec:?}: {refused:?}"
        );
    }
    for name in ["", "a/b", "a@b", "tab\there", &"x".repeat(201)] {
        let refused = store
            .create_schedule(&def(name, &good, 0, Overlap::Skip))
            .await;
        assert!(
            matches!(refused, Err(StoreError::ScheduleRefused { .. })),
            "{name:?}"
        );
    }
    let refused = store
        .create_schedule(&def("new", &good, 1_001, Overlap::Skip))
        .await;
    assert!(matches!(refused, Err(StoreError::ScheduleRefused { .. })));
    let refused = store
        .create_schedule(&def("taken", &good, 0, Overlap::Allow))
        .await;
    let Err(StoreError::ScheduleRefused { reason, .. }) = refused else {
        panic!("a taken name: {refused:?}");
    };
    assert!(reason.contains("exists"), "{reason}");
    let mut unknown = def("new", &good, 0, Overlap::Skip);
    unknown.deployment = "nobody";
    let refused = store.create_schedule(&unknown).await;
    let Err(StoreError::ScheduleRefused { reason, .. }) = refused else {
        panic!("an unknown deployment: {refused:?}");
    };
    assert!(reason.contains("nobody"), "{reason}");
    assert_eq!(store.schedules().await.unwrap(), before);
    assert!(matches!(
        store.pause_schedule("nothing", true).await,
        Err(StoreError::UnknownSchedule { .. })
    ));
}

/// Two handles (two workers) fire at once, tick after tick: each tick starts its run
/// once, none is skipped.
pub(super) async fn two_handles_fire_each_tick_once<H: Harness>(harness: &mut H, clock: &Clock) {
    let a = harness.store();
    let b = harness.open_another();
    deploy(a.as_ref()).await;
    let spec = every(EVERY);
    for name in ["s1", "s2", "s3"] {
        a.create_schedule(&def(name, &spec, 0, Overlap::Allow))
            .await
            .unwrap();
    }
    let mut fired = Vec::new();
    for _ in 0..20 {
        clock.advance(std::time::Duration::from_millis(EVERY as u64));
        let (x, y) = tokio::join!(fire(&a), fire(&b));
        fired.extend(started(&x));
        fired.extend(started(&y));
    }
    fired.sort();
    let before = fired.len();
    fired.dedup();
    assert_eq!(before, fired.len(), "a tick was started twice");
    assert_eq!(fired.len(), 60);
    assert_eq!(harness.rows("scheduled_runs"), 60);
    assert_eq!(harness.rows("runs"), 60);
    for name in ["s1", "s2", "s3"] {
        let s = a.schedule(name).await.unwrap().unwrap();
        assert_eq!((s.ticks.started, s.ticks.missed), (20, 0));
    }
}

async fn fire(store: &Arc<dyn Store>) -> Vec<Tick> {
    store.fire_schedules(10).await.unwrap()
}
