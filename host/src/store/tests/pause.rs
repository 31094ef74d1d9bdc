//! Pausing and resuming runs and deployments: what a worker may lease, what it learns
//! at renewal, what a paused run keeps, and the refusals that change nothing.

use super::{Env, RUN_LEASE, RUN_LEASE_MS, T0};
use crate::store::{
    Acquired, Admission, Counts, Deployment, DeploymentPaused, LeaseState, Paused, PausedBy,
    Resumed, RunEnd, RunLeaseInfo, RunStatus, StoreError, Suspension,
};

/// The ids of the runs `worker` leases now (every one that is due).
async fn lease_all(env: &Env<'_>, worker: &str) -> Vec<String> {
    let mut ids: Vec<String> = env
        .store
        .acquire_runs(worker, 100, RUN_LEASE, &[])
        .await
        .unwrap()
        .into_iter()
        .map(|run| run.record.run_id)
        .collect();
    ids.sort();
    ids
}

async fn status(env: &Env<'_>, run_id: &str) -> (RunStatus, Option<PausedBy>) {
    let run = env.store.run(run_id).await.unwrap().unwrap();
    (run.status, run.paused_by)
}

async fn deploy_billing(env: &Env<'_>) {
    env.store
        .put_component(super::DIGEST, b"\0asm")
        .await
        .unwrap();
    env.store
        .deploy(&Deployment {
            name: "billing",
            digest: super::DIGEST,
            authority: b"authority",
            admission: Admission::Explicit,
            source: None,
        })
        .await
        .unwrap();
}

pub(super) async fn a_paused_run_is_not_leased_until_resumed(env: &Env<'_>) {
    let store = env.store;
    env.submit("queued", b"").await;
    env.submit("other", b"").await;
    assert_eq!(store.pause_run("queued").await.unwrap(), Paused::Now);
    assert_eq!(
        status(env, "queued").await,
        (RunStatus::Paused, Some(PausedBy::Run))
    );
    // Twice is the same: nothing more changes.
    assert_eq!(store.pause_run("queued").await.unwrap(), Paused::Already);
    // Listed under its own status, and not under the one it keeps underneath.
    let paused = store
        .runs(&crate::store::RunFilter {
            status: Some(RunStatus::Paused),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(paused.len(), 1);
    assert_eq!(paused[0].run_id, "queued");
    let queued = store
        .runs(&crate::store::RunFilter {
            status: Some(RunStatus::Queued),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(queued.len(), 1);
    assert_eq!(queued[0].run_id, "other");
    // Not leased, neither from the queue nor by name; not due either.
    assert_eq!(lease_all(env, "w").await, vec!["other".to_string()]);
    assert_eq!(store.next_due(T0 - 1).await.unwrap(), None);
    assert!(matches!(
        store.acquire_run("queued", "w", RUN_LEASE).await.unwrap(),
        Acquired::Paused(record) if record.status == RunStatus::Paused
    ));
    // Resumed: it is due as it was, and a worker takes it.
    assert_eq!(store.resume_run("queued").await.unwrap(), Resumed::Now);
    assert_eq!(
        store.resume_run("queued").await.unwrap(),
        Resumed::NotPaused
    );
    assert_eq!(status(env, "queued").await, (RunStatus::Queued, None));
    assert_eq!(lease_all(env, "w").await, vec!["queued".to_string()]);
}

pub(super) async fn a_held_run_learns_its_pause_at_renewal_and_parks_holding_nothing(
    env: &Env<'_>,
) {
    let store = env.store;
    let held = env.lease("held").await;
    let grant = env.grant("k", "a", &held).await;
    let lease = RunLeaseInfo {
        worker: "w".to_owned(),
        token: held.token,
        expires: T0 + RUN_LEASE_MS,
    };
    assert_eq!(
        store.pause_run("held").await.unwrap(),
        Paused::Requested { lease }
    );
    // Its worker still writes under its fence: the step in flight commits.
    env.commit("k", grant.token, &held, b"done").await.unwrap();
    assert_eq!(
        store
            .renew_runs(std::slice::from_ref(&held), RUN_LEASE)
            .await
            .unwrap(),
        vec![LeaseState::Held {
            expires: T0 + RUN_LEASE_MS,
            cancel_requested: false,
            pause_requested: true,
        }]
    );
    // It gives the lease back: the run is paused, holding nothing, and not leased.
    store
        .release_run(&held, &Counts::default(), None)
        .await
        .unwrap();
    let run = store.run("held").await.unwrap().unwrap();
    assert_eq!((run.status, run.lease), (RunStatus::Paused, None));
    assert_eq!(run.paused_by, Some(PausedBy::Run));
    assert!(lease_all(env, "w2").await.is_empty());
    // The old fence writes nothing more.
    assert!(matches!(
        env.commit("k2", grant.token, &held, b"late").await,
        Err(StoreError::LeaseLost { .. })
    ));
    // Resumed, a worker takes it with a new token and finds its committed step.
    store.resume_run("held").await.unwrap();
    let fence2 = env.acquire("held", "w2").await;
    assert!(fence2.token > held.token);
    assert_eq!(store.steps("held").await.unwrap().len(), 1);
    // A lease expiring while the run is paused (its worker died) changes nothing: it
    // stays paused.
    store.pause_run("held").await.unwrap();
    env.advance(RUN_LEASE_MS + 1);
    assert!(lease_all(env, "w3").await.is_empty());
    assert_eq!(status(env, "held").await.0, RunStatus::Paused);
}

pub(super) async fn a_paused_suspended_run_keeps_its_signal_and_wakes_when_resumed(env: &Env<'_>) {
    let store = env.store;
    let fence = env.lease("r").await;
    store
        .suspend_run(
            &fence,
            &Counts::default(),
            &Suspension {
                due: None,
                signal: Some("go"),
                join: None,
            },
        )
        .await
        .unwrap();
    assert_eq!(store.pause_run("r").await.unwrap(), Paused::Now);
    // The signal is kept, and would make it due; paused, nobody takes it.
    assert!(store.send_signal("r", "go", b"1", 100).await.unwrap().woke);
    assert!(lease_all(env, "w").await.is_empty());
    let run = store.run("r").await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Paused);
    // Resumed, it is due at once.
    store.resume_run("r").await.unwrap();
    assert_eq!(lease_all(env, "w").await, vec!["r".to_string()]);
}

pub(super) async fn pausing_finished_or_unknown_runs_is_refused_and_changes_nothing(env: &Env<'_>) {
    let store = env.store;
    assert!(matches!(
        store.pause_run("ghost").await,
        Err(StoreError::UnknownRun { run_id }) if run_id == "ghost"
    ));
    assert!(matches!(
        store.resume_run("ghost").await,
        Err(StoreError::UnknownRun { .. })
    ));
    for (run_id, end) in [
        ("done", RunEnd::Completed(b"out")),
        ("failed", RunEnd::Failed(b"no")),
        ("cancelled", RunEnd::Cancelled),
    ] {
        let fence = env.lease(run_id).await;
        store
            .finish_run(&fence, end, &Counts::default())
            .await
            .unwrap();
        let before = store.run(run_id).await.unwrap().unwrap();
        assert!(matches!(
            store.pause_run(run_id).await,
            Err(StoreError::RunFinished { status, .. }) if status == before.status
        ));
        assert!(matches!(
            store.resume_run(run_id).await,
            Err(StoreError::RunFinished { .. })
        ));
        assert_eq!(store.run(run_id).await.unwrap().unwrap(), before);
    }
    // A paused run that ends (its worker finished it before it heard) is not paused:
    // submitted again after a failure, it runs.
    let fence = env.lease("ends").await;
    store.pause_run("ends").await.unwrap();
    store
        .finish_run(&fence, RunEnd::Failed(b"boom"), &Counts::default())
        .await
        .unwrap();
    assert_eq!(status(env, "ends").await, (RunStatus::Failed, None));
    env.submit("ends", b"in").await;
    assert_eq!(status(env, "ends").await, (RunStatus::Running, None));
    // A paused run can be cancelled.
    env.submit("p", b"").await;
    store.pause_run("p").await.unwrap();
    assert_eq!(
        store.cancel_run("p").await.unwrap(),
        crate::store::Cancelled::Now
    );
    assert_eq!(status(env, "p").await, (RunStatus::Cancelled, None));
    // Pausing an unknown deployment is refused.
    assert!(matches!(
        store.pause_deployment("nobody").await,
        Err(StoreError::UnknownDeployment { name }) if name == "nobody"
    ));
    assert!(matches!(
        store.resume_deployment("nobody").await,
        Err(StoreError::UnknownDeployment { .. })
    ));
    assert!(store.paused_deployments().await.unwrap().is_empty());
}

pub(super) async fn a_paused_deployment_pauses_its_runs_and_every_run_started_under_it(
    env: &Env<'_>,
) {
    let store = env.store;
    deploy_billing(env).await;
    env.submit("queued", b"").await;
    let held = env.lease("held").await;
    env.submit("mine", b"").await;
    store.pause_run("mine").await.unwrap();
    let failed = env.lease("failed").await;
    store
        .finish_run(&failed, RunEnd::Failed(b"no"), &Counts::default())
        .await
        .unwrap();
    assert_eq!(
        store.pause_deployment("billing").await.unwrap(),
        DeploymentPaused {
            was_paused: false,
            runs: 2,
            held: 1
        }
    );
    // Idempotent.
    assert_eq!(
        store.pause_deployment("billing").await.unwrap(),
        DeploymentPaused {
            was_paused: true,
            runs: 0,
            held: 0
        }
    );
    let paused = store.paused_deployments().await.unwrap();
    assert_eq!(paused.len(), 1);
    assert_eq!((paused[0].name.as_str(), paused[0].since), ("billing", T0));
    assert_eq!(
        status(env, "queued").await,
        (RunStatus::Paused, Some(PausedBy::Deployment))
    );
    assert_eq!(
        status(env, "mine").await,
        (RunStatus::Paused, Some(PausedBy::Run))
    );
    // The holder hears it at renewal.
    assert!(matches!(
        store
            .renew_runs(std::slice::from_ref(&held), RUN_LEASE)
            .await
            .unwrap()[..],
        [LeaseState::Held {
            pause_requested: true,
            ..
        }]
    ));
    store
        .release_run(&held, &Counts::default(), None)
        .await
        .unwrap();
    // Runs that start under its name are paused as they start: new ones, and a failed
    // one submitted again.
    env.submit("new", b"").await;
    env.submit("failed", b"in").await;
    assert_eq!(
        status(env, "new").await,
        (RunStatus::Paused, Some(PausedBy::Deployment))
    );
    assert_eq!(
        status(env, "failed").await,
        (RunStatus::Paused, Some(PausedBy::Deployment))
    );
    assert!(lease_all(env, "w").await.is_empty());
    // Resuming the deployment resumes the runs paused with it, not the one paused on
    // its own.
    assert_eq!(
        store.resume_deployment("billing").await.unwrap(),
        DeploymentPaused {
            was_paused: true,
            runs: 4,
            held: 0
        }
    );
    assert!(store.paused_deployments().await.unwrap().is_empty());
    assert_eq!(
        lease_all(env, "w").await,
        vec![
            "failed".to_string(),
            "held".to_string(),
            "new".to_string(),
            "queued".to_string()
        ]
    );
    assert_eq!(status(env, "mine").await.0, RunStatus::Paused);
    env.submit("later", b"").await;
    assert_eq!(status(env, "later").await, (RunStatus::Queued, None));
    // Resuming a deployment that is not paused changes nothing.
    assert_eq!(
        store.resume_deployment("billing").await.unwrap(),
        DeploymentPaused {
            was_paused: false,
            runs: 0,
            held: 0
        }
    );
}
