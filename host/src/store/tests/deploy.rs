//! Components, deployments and namespace admission.

use super::{DIGEST, Env, T0};
use crate::store::{Admission, Deployment, DeploymentRecord, InFlight, StoreError, Submission};

fn deployment<'a>(name: &'a str, digest: &'a str, admission: Admission) -> Deployment<'a> {
    Deployment {
        name,
        digest,
        authority: b"grant",
        admission,
        source: None,
    }
}

pub(super) async fn put_component_is_idempotent(env: &Env<'_>) {
    let store = env.store;
    assert_eq!(store.component("d1").await.unwrap(), None);
    assert!(!store.has_component("d1").await.unwrap());
    assert!(store.put_component("d1", b"\0asm one").await.unwrap());
    assert!(store.has_component("d1").await.unwrap());
    assert!(!store.put_component("d1", b"\0asm one").await.unwrap());
    assert!(store.put_component("d2", b"").await.unwrap());
    // Large enough to be checkpointed out of the WAL (SQLite) right after it is stored.
    let large = vec![7; 2 << 20];
    assert!(store.put_component("d3", &large).await.unwrap());
    assert_eq!(store.component("d3").await.unwrap(), Some(large));
    assert_eq!(
        store.component("d1").await.unwrap().as_deref(),
        Some(&b"\0asm one"[..])
    );
    assert_eq!(
        store.component("d2").await.unwrap().as_deref(),
        Some(&b""[..])
    );
}

pub(super) async fn deploy_points_a_name_and_redeploying_is_a_no_op(env: &Env<'_>) {
    let store = env.store;
    store.put_component("d1", b"one").await.unwrap();
    store.put_component("d2", b"two").await.unwrap();
    assert_eq!(store.deployment("billing").await.unwrap(), None);
    let first = store
        .deploy(&deployment("billing", "d1", Admission::FirstUse))
        .await
        .unwrap();
    assert_eq!(
        first,
        DeploymentRecord {
            name: "billing".to_owned(),
            digest: "d1".to_owned(),
            authority: b"grant".to_vec(),
            deployed_at: T0,
            admission: Admission::FirstUse,
            source: None,
            version: 1,
            in_flight: InFlight::Pin,
            exports: None,
        }
    );
    // The same component with the same authority again: nothing changes, not even the
    // time or how it was admitted.
    env.advance(10);
    let again = store
        .deploy(&deployment("billing", "d1", Admission::Explicit))
        .await
        .unwrap();
    assert_eq!(again, first);
    assert_eq!(
        store.deployment("billing").await.unwrap(),
        Some(first.clone())
    );
    // Another authority is a new deployment; so is another component.
    let wider = store
        .deploy(&Deployment {
            authority: b"wider",
            ..deployment("billing", "d1", Admission::Explicit)
        })
        .await
        .unwrap();
    assert_eq!(
        (wider.deployed_at, wider.authority.as_slice()),
        (T0 + 10, &b"wider"[..])
    );
    env.advance(10);
    let upgraded = store
        .deploy(&deployment("billing", "d2", Admission::Explicit))
        .await
        .unwrap();
    assert_eq!(
        store.deployment("billing").await.unwrap(),
        Some(upgraded.clone())
    );
    // Back to the first: it is not current, so it is deployed again.
    env.advance(10);
    let back = store
        .deploy(&deployment("billing", "d1", Admission::FirstUse))
        .await
        .unwrap();
    assert_eq!((back.digest.as_str(), back.deployed_at), ("d1", T0 + 30));
    // Each deployment that changed something is the name's next version.
    assert_eq!((wider.version, upgraded.version, back.version), (2, 3, 4));
    assert_eq!(store.deployment("billing").await.unwrap(), Some(back));
}

pub(super) async fn deploy_needs_the_component(env: &Env<'_>) {
    let store = env.store;
    let err = store
        .deploy(&deployment("billing", "missing", Admission::Explicit))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::UnknownComponent { digest } if digest == "missing"),
        "{err:?}"
    );
    assert_eq!(store.deployment("billing").await.unwrap(), None);
    assert_eq!(store.admitted("billing", "missing").await.unwrap(), None);
}

pub(super) async fn deployments_lists_what_each_name_points_at(env: &Env<'_>) {
    let store = env.store;
    store.put_component("d1", b"one").await.unwrap();
    store.put_component("d2", b"two").await.unwrap();
    assert_eq!(store.deployments().await.unwrap(), []);
    store
        .deploy(&deployment("zeta", "d1", Admission::Explicit))
        .await
        .unwrap();
    store
        .deploy(&deployment("alpha", "d1", Admission::Explicit))
        .await
        .unwrap();
    env.advance(1);
    store
        .deploy(&deployment("zeta", "d2", Admission::Explicit))
        .await
        .unwrap();
    let current: Vec<(String, String, i64)> = store
        .deployments()
        .await
        .unwrap()
        .into_iter()
        .map(|d| (d.name, d.digest, d.deployed_at))
        .collect();
    assert_eq!(
        current,
        [
            ("alpha".to_owned(), "d1".to_owned(), T0),
            ("zeta".to_owned(), "d2".to_owned(), T0 + 1),
        ]
    );
}

pub(super) async fn first_use_admission_keeps_namespaces_apart(env: &Env<'_>) {
    let store = env.store;
    for digest in ["d1", "d2", "d3"] {
        store
            .put_component(digest, digest.as_bytes())
            .await
            .unwrap();
    }
    assert_eq!(store.admitted("billing", "d1").await.unwrap(), None);
    // First use of an empty namespace admits the component.
    store
        .deploy(&deployment("billing", "d1", Admission::FirstUse))
        .await
        .unwrap();
    assert_eq!(store.admitted("billing", "d1").await.unwrap(), Some(true));
    assert_eq!(store.admitted("billing", "d2").await.unwrap(), Some(false));
    // Another component may not slip into it by first use.
    let err = store
        .deploy(&deployment("billing", "d2", Admission::FirstUse))
        .await
        .unwrap_err();
    match &err {
        StoreError::NamespaceTaken {
            namespace,
            owner,
            digest,
        } => assert_eq!(
            (namespace.as_str(), owner.as_str(), digest.as_str()),
            ("billing", "d1", "d2")
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        store.deployment("billing").await.unwrap().unwrap().digest,
        "d1"
    );
    assert_eq!(store.admitted("billing", "d2").await.unwrap(), Some(false));
    // An explicit deployment admits it; after that, first use of it is fine, even once
    // the name points elsewhere again.
    store
        .deploy(&deployment("billing", "d2", Admission::Explicit))
        .await
        .unwrap();
    assert_eq!(store.admitted("billing", "d2").await.unwrap(), Some(true));
    store
        .deploy(&deployment("billing", "d1", Admission::FirstUse))
        .await
        .unwrap();
    store
        .deploy(&deployment("billing", "d2", Admission::FirstUse))
        .await
        .unwrap();
    // The owner named is the component the name points at now.
    let err = store
        .deploy(&deployment("billing", "d3", Admission::FirstUse))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::NamespaceTaken { owner, .. } if owner == "d2"),
        "{err:?}"
    );
    // Namespaces are apart: d3 is first in its own.
    store
        .deploy(&deployment("shipping", "d3", Admission::FirstUse))
        .await
        .unwrap();
    assert_eq!(store.admitted("shipping", "d3").await.unwrap(), Some(true));
    assert_eq!(store.admitted("shipping", "d1").await.unwrap(), Some(false));
}

pub(super) async fn runs_make_their_components_members(env: &Env<'_>) {
    let store = env.store;
    // A run submitted into a namespace nobody deployed to makes its component a member:
    // its keys are there now.
    env.submit("run-1", b"in").await;
    assert_eq!(store.admitted("billing", DIGEST).await.unwrap(), Some(true));
    store.put_component("other", b"x").await.unwrap();
    let err = store
        .deploy(&deployment("billing", "other", Admission::FirstUse))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::NamespaceTaken { owner, digest, .. }
            if owner == DIGEST && digest == "other"),
        "{err:?}"
    );
    // Upgrading a run to a component is an operator's act: it joins the namespace.
    store.upgrade_run("run-1", DIGEST, "other").await.unwrap();
    assert_eq!(
        store.admitted("billing", "other").await.unwrap(),
        Some(true)
    );
    store
        .deploy(&deployment("billing", "other", Admission::FirstUse))
        .await
        .unwrap();
    // A run in another namespace joins that one only.
    store
        .submit(&Submission {
            run_id: "run-2",
            agent: "billing",
            digest: DIGEST,
            namespace: "custom",
            input: b"",
            authority: b"",
            replace_authority: false,
            priority: 0,
        })
        .await
        .unwrap();
    assert_eq!(store.admitted("custom", DIGEST).await.unwrap(), Some(true));
    assert_eq!(
        store.admitted("custom", "other").await.unwrap(),
        Some(false)
    );
}

/// The dev loop: a first use from the source (the local file) the name's current first
/// use came from joins a namespace it is not in, as a rebuild, kept with its source; a
/// first use from another source, or with none, or after an operator's deployment, is
/// refused as ever.
pub(super) async fn a_rebuild_from_the_same_source_joins_and_nothing_else_does(env: &Env<'_>) {
    let store = env.store;
    for digest in ["d1", "d2", "d3", "d4", "d5"] {
        store.put_component(digest, b"x").await.unwrap();
    }
    let from = |digest, source| Deployment {
        source,
        ..deployment("billing", digest, Admission::FirstUse)
    };
    let mine = Some("m1:/home/me/agent.wasm");
    let first = store.deploy(&from("d1", mine)).await.unwrap();
    assert_eq!(
        (first.admission, first.source.as_deref()),
        (Admission::FirstUse, mine)
    );
    env.advance(10);
    let rebuilt = store.deploy(&from("d2", mine)).await.unwrap();
    assert_eq!(
        (
            rebuilt.digest.as_str(),
            rebuilt.admission,
            rebuilt.source.as_deref()
        ),
        ("d2", Admission::Rebuild, mine)
    );
    assert_eq!(store.deployment("billing").await.unwrap(), Some(rebuilt));
    assert_eq!(store.admitted("billing", "d2").await.unwrap(), Some(true));
    // A rebuild of a rebuild is one too.
    let again = store.deploy(&from("d3", mine)).await.unwrap();
    assert_eq!(again.admission, Admission::Rebuild);
    // Another file, or none: refused, the name unchanged.
    for source in [
        Some("m1:/tmp/elsewhere/agent.wasm"),
        Some("m2:/home/me/agent.wasm"),
        None,
    ] {
        let err = store.deploy(&from("d4", source)).await.unwrap_err();
        assert!(
            matches!(&err, StoreError::NamespaceTaken { owner, digest, .. }
                if owner == "d3" && digest == "d4"),
            "{source:?}: {err:?}"
        );
    }
    assert_eq!(store.admitted("billing", "d4").await.unwrap(), Some(false));
    assert_eq!(store.deployment("billing").await.unwrap(), Some(again));
    // Once an operator deployed the name, no rebuild follows it implicitly, even from
    // the file it was last run from.
    store
        .deploy(&deployment("billing", "d4", Admission::Explicit))
        .await
        .unwrap();
    let err = store.deploy(&from("d5", mine)).await.unwrap_err();
    assert!(matches!(&err, StoreError::NamespaceTaken { .. }), "{err:?}");
    assert_eq!(store.admitted("billing", "d5").await.unwrap(), Some(false));
}
