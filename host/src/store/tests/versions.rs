//! Versions of a deployment: numbering, the runs on each, a rollout's policy, moving
//! runs to a version and back, and what is refused (changing nothing).

use super::{Env, T0};
use crate::store::{
    Admission, Counts, Deployment, InFlight, MoveReason, MoveRuns, MoveTo, Rollout, RunEnd,
    StoreError, Submission,
};

/// Deploys component `digest` (put in the store first) as the next version of `mailer`.
async fn deploy(env: &Env<'_>, digest: &str, rollout: Rollout<'_>) -> u64 {
    let store = env.store;
    store
        .put_component(digest, digest.as_bytes())
        .await
        .unwrap();
    store
        .deploy_version(
            &Deployment {
                name: "mailer",
                digest,
                authority: b"grant",
                admission: Admission::Explicit,
                source: None,
            },
            &rollout,
        )
        .await
        .unwrap()
        .record
        .version
}

/// Submits run `run_id` of `mailer`'s current version.
async fn submit(env: &Env<'_>, run_id: &str) {
    let current = env.store.deployment("mailer").await.unwrap().unwrap();
    env.store
        .submit(&Submission {
            run_id,
            agent: "mailer",
            digest: &current.digest,
            namespace: "mailer",
            input: b"{}",
            authority: b"grant",
            replace_authority: false,
            priority: 0,
        })
        .await
        .unwrap();
}

/// Where each run is: (version, digest).
async fn on(env: &Env<'_>, run_id: &str) -> (Option<u64>, String) {
    let run = env.store.run(run_id).await.unwrap().unwrap();
    (run.version, run.digest)
}

fn exports(text: &str) -> Rollout<'_> {
    Rollout {
        in_flight: InFlight::Pin,
        exports: Some(text),
    }
}

pub(super) async fn versions_count_up_and_pinned_runs_stay(env: &Env<'_>) {
    let store = env.store;
    assert_eq!(store.versions("mailer").await.unwrap(), []);
    assert_eq!(deploy(env, "v1", exports("run")).await, 1);
    submit(env, "old").await;
    env.advance(10);
    assert_eq!(deploy(env, "v2", exports("run")).await, 2);
    submit(env, "new").await;
    assert_eq!(on(env, "old").await, (Some(1), "v1".to_owned()));
    assert_eq!(on(env, "new").await, (Some(2), "v2".to_owned()));
    // Deploying the current component again makes no version.
    assert_eq!(deploy(env, "v2", exports("run")).await, 2);

    let fence = env.acquire("old", "w").await;
    store
        .finish_run(&fence, RunEnd::Completed(b"ok"), &Counts::default())
        .await
        .unwrap();
    let versions = store.versions("mailer").await.unwrap();
    let seen: Vec<(u64, &str, bool, u64, u64, InFlight)> = versions
        .iter()
        .map(|v| {
            (
                v.deployment.version,
                v.deployment.digest.as_str(),
                v.current,
                v.runs_in_flight,
                v.runs,
                v.deployment.in_flight,
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (1, "v1", false, 0, 1, InFlight::Pin),
            (2, "v2", true, 1, 1, InFlight::Pin),
        ]
    );
    assert_eq!(versions[0].deployment.deployed_at, T0);
    assert!(store.run_moves("old").await.unwrap().is_empty());
}

pub(super) async fn an_upgrade_rollout_moves_runs_in_flight_and_records_each(env: &Env<'_>) {
    let store = env.store;
    deploy(env, "v1", exports("run")).await;
    submit(env, "a").await;
    submit(env, "b").await;
    submit(env, "done").await;
    let fence = env.acquire("done", "w").await;
    store
        .finish_run(&fence, RunEnd::Completed(b"ok"), &Counts::default())
        .await
        .unwrap();
    // A run leased now keeps its instance; the move takes effect at its next one.
    env.acquire("b", "w").await;
    env.advance(5);
    store.put_component("v2", b"v2").await.unwrap();
    let deployed = store
        .deploy_version(
            &Deployment {
                name: "mailer",
                digest: "v2",
                authority: b"grant",
                admission: Admission::Explicit,
                source: None,
            },
            &Rollout {
                in_flight: InFlight::Upgrade,
                exports: Some("run"),
            },
        )
        .await
        .unwrap();
    assert_eq!(deployed.record.version, 2);
    assert_eq!(deployed.record.in_flight, InFlight::Upgrade);
    let moved: Vec<&str> = deployed.moved.iter().map(|m| m.run_id.as_str()).collect();
    assert_eq!(moved, ["a", "b"]);
    assert!(deployed.kept.is_empty());
    assert_eq!(on(env, "a").await, (Some(2), "v2".to_owned()));
    assert_eq!(on(env, "b").await, (Some(2), "v2".to_owned()));
    assert_eq!(on(env, "done").await, (Some(1), "v1".to_owned()));
    let moves = store.run_moves("a").await.unwrap();
    assert_eq!(moves.len(), 1);
    assert_eq!(
        (
            moves[0].from_version,
            moves[0].to_version,
            moves[0].reason,
            moves[0].at
        ),
        (Some(1), Some(2), MoveReason::Policy, T0 + 5)
    );

    // A component that exports something else: the runs stay where they are.
    store.put_component("other", b"other").await.unwrap();
    let deployed = store
        .deploy_version(
            &Deployment {
                name: "mailer",
                digest: "other",
                authority: b"grant",
                admission: Admission::Explicit,
                source: None,
            },
            &Rollout {
                in_flight: InFlight::Upgrade,
                exports: Some("run; describe"),
            },
        )
        .await
        .unwrap();
    assert_eq!(deployed.record.version, 3);
    assert!(deployed.moved.is_empty());
    assert_eq!(deployed.kept, ["a", "b"]);
    assert_eq!(on(env, "a").await, (Some(2), "v2".to_owned()));
}

pub(super) async fn runs_move_to_a_version_and_back(env: &Env<'_>) {
    let store = env.store;
    deploy(env, "v1", exports("run")).await;
    submit(env, "a").await;
    submit(env, "b").await;
    deploy(env, "v2", exports("run")).await;
    submit(env, "c").await;
    env.advance(1);
    let named = ["a".to_owned()];
    let moves = store
        .move_runs(&MoveRuns {
            name: "mailer",
            to: MoveTo::Version(2),
            runs: &named,
        })
        .await
        .unwrap();
    assert_eq!(moves.len(), 1);
    assert_eq!(
        (moves[0].run_id.as_str(), moves[0].reason),
        ("a", MoveReason::Operator)
    );
    assert_eq!(on(env, "a").await, (Some(2), "v2".to_owned()));
    assert_eq!(on(env, "b").await, (Some(1), "v1".to_owned()));
    // Every run in flight not on version 2 yet: only b.
    let moves = store
        .move_runs(&MoveRuns {
            name: "mailer",
            to: MoveTo::Version(2),
            runs: &[],
        })
        .await
        .unwrap();
    let ids: Vec<&str> = moves.iter().map(|m| m.run_id.as_str()).collect();
    assert_eq!(ids, ["b"]);
    // Back: a and b return to version 1; c never moved and stays.
    env.advance(1);
    let moves = store
        .move_runs(&MoveRuns {
            name: "mailer",
            to: MoveTo::Back,
            runs: &[],
        })
        .await
        .unwrap();
    let ids: Vec<&str> = moves.iter().map(|m| m.run_id.as_str()).collect();
    assert_eq!(ids, ["a", "b"]);
    assert!(moves.iter().all(|m| m.reason == MoveReason::Rollback));
    assert_eq!(on(env, "a").await, (Some(1), "v1".to_owned()));
    assert_eq!(on(env, "c").await, (Some(2), "v2".to_owned()));
    let history: Vec<(Option<u64>, Option<u64>, MoveReason)> = store
        .run_moves("a")
        .await
        .unwrap()
        .iter()
        .map(|m| (m.from_version, m.to_version, m.reason))
        .collect();
    assert_eq!(
        history,
        [
            (Some(1), Some(2), MoveReason::Operator),
            (Some(2), Some(1), MoveReason::Rollback),
        ]
    );
    let counts: Vec<(u64, u64)> = store
        .versions("mailer")
        .await
        .unwrap()
        .iter()
        .map(|v| (v.deployment.version, v.runs_in_flight))
        .collect();
    assert_eq!(counts, [(1, 2), (2, 1)]);
}

pub(super) async fn bad_moves_are_refused_and_change_nothing(env: &Env<'_>) {
    let store = env.store;
    deploy(env, "v1", exports("run")).await;
    submit(env, "a").await;
    submit(env, "done").await;
    let fence = env.acquire("done", "w").await;
    store
        .finish_run(&fence, RunEnd::Completed(b"ok"), &Counts::default())
        .await
        .unwrap();
    deploy(env, "v2", exports("run")).await;
    deploy(env, "alien", exports("run; describe")).await;
    env.submit("billing-run", b"in").await;
    let ask = |to, runs: &'static [&'static str]| {
        let runs: Vec<String> = runs.iter().map(|r| (*r).to_owned()).collect();
        async move {
            store
                .move_runs(&MoveRuns {
                    name: "mailer",
                    to,
                    runs: &runs,
                })
                .await
        }
    };
    let err = |r: Result<_, StoreError>| r.expect_err("refused");
    assert!(matches!(
        err(store
            .move_runs(&MoveRuns {
                name: "nobody",
                to: MoveTo::Version(1),
                runs: &[],
            })
            .await),
        StoreError::UnknownDeployment { .. }
    ));
    assert!(matches!(
        err(ask(MoveTo::Version(7), &["a"]).await),
        StoreError::UnknownVersion { version: 7, .. }
    ));
    assert!(matches!(
        err(ask(MoveTo::Version(2), &["a", "ghost"]).await),
        StoreError::UnknownRun { run_id } if run_id == "ghost"
    ));
    assert!(matches!(
        err(ask(MoveTo::Version(2), &["a", "billing-run"]).await),
        StoreError::NotOfDeployment { agent, .. } if agent == "billing"
    ));
    assert!(matches!(
        err(ask(MoveTo::Version(2), &["a", "done"]).await),
        StoreError::RunFinished { run_id, .. } if run_id == "done"
    ));
    assert!(matches!(
        err(ask(MoveTo::Back, &["a"]).await),
        StoreError::NeverMoved { run_id } if run_id == "a"
    ));
    assert!(matches!(
        err(ask(MoveTo::Version(3), &["a"]).await),
        StoreError::ExportsDiffer { to: 3, .. }
    ));
    assert!(matches!(
        err(ask(MoveTo::Version(3), &[]).await),
        StoreError::ExportsDiffer { .. }
    ));
    // Nothing moved: a is where it started and no move was recorded.
    assert_eq!(on(env, "a").await, (Some(1), "v1".to_owned()));
    assert!(store.run_moves("a").await.unwrap().is_empty());
    assert!(err(ask(MoveTo::Version(2), &["a", "done"]).await).is_refusal());
}

pub(super) async fn a_dev_upgrade_is_recorded_with_its_versions(env: &Env<'_>) {
    let store = env.store;
    deploy(env, "v1", exports("run")).await;
    submit(env, "a").await;
    deploy(env, "v2", exports("run")).await;
    store.upgrade_run("a", "v1", "v2").await.unwrap();
    assert_eq!(on(env, "a").await, (Some(2), "v2".to_owned()));
    let moves = store.run_moves("a").await.unwrap();
    assert_eq!(
        moves
            .iter()
            .map(|m| (m.from_version, m.to_version, m.reason))
            .collect::<Vec<_>>(),
        [(Some(1), Some(2), MoveReason::Dev)]
    );
    // Rollback takes it back where the person moved it from.
    store
        .move_runs(&MoveRuns {
            name: "mailer",
            to: MoveTo::Back,
            runs: &["a".to_owned()],
        })
        .await
        .unwrap();
    assert_eq!(on(env, "a").await, (Some(1), "v1".to_owned()));
}
