//! Encryption at rest: a harness that seals any backend (so that every store test runs
//! on sealed stores too), and the tests that look at the database's own bytes for
//! what was sealed.

use std::sync::Arc;

use super::{Env, Harness, T0, block_on, fence};
use crate::store::sealing::seal_store;
use crate::store::{
    Acquired, Admission, ChildSpec, ClaimRef, Clock, Commit, Counts, Deployment, FlowSetting,
    JoinMode, JoinRequest, Overlap, Resolution, RunEnd, RunFilter, ScheduleDef, ScheduleSpec,
    SealError, SpawnBatch, SpawnLimits, Store, StoreError, StoreKey, Submission, WaitKind,
    WaitRequest, WaitState,
};

/// A key every sealed harness uses.
pub(crate) fn test_key() -> StoreKey {
    StoreKey::from_hex(&"5a".repeat(32)).unwrap()
}

/// `store` opened with `key`, on a thread of its own (the harness is used both outside
/// any runtime and inside one).
fn sealed(store: Arc<dyn Store>, key: Option<&StoreKey>) -> Result<Arc<dyn Store>, StoreError> {
    let key = key.cloned();
    std::thread::scope(|scope| {
        scope
            .spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap()
                    .block_on(seal_store(store, key.as_ref(), false))
            })
            .join()
            .unwrap()
    })
}

/// A backend's harness whose store is encrypted at rest with [`test_key`].
pub(crate) struct SealedHarness<H> {
    inner: H,
    store: Option<Arc<dyn Store>>,
}

impl<H: Harness> Harness for SealedHarness<H> {
    fn create(clock: &Clock) -> Option<Self> {
        let inner = H::create(clock)?;
        let store = sealed(inner.store(), Some(&test_key())).unwrap();
        Some(SealedHarness {
            inner,
            store: Some(store),
        })
    }

    fn store(&self) -> Arc<dyn Store> {
        self.store.clone().unwrap()
    }

    fn reopen(&mut self) {
        // Dropped first: it holds the backend's handle, which must really close.
        self.store = None;
        self.inner.reopen();
        self.store = Some(sealed(self.inner.store(), Some(&test_key())).unwrap());
    }

    fn open_another(&self) -> Arc<dyn Store> {
        sealed(self.inner.open_another(), Some(&test_key())).unwrap()
    }

    fn rows(&self, table: &str) -> u64 {
        self.inner.rows(table)
    }

    fn raw_holds(&self, needle: &[u8]) -> bool {
        self.inner.raw_holds(needle)
    }
}

/// `bytes` as lowercase hex digits.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `haystack` holds `needle`.
pub(crate) fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// Plants `secret` in every kind of payload a store keeps, through the store's own
/// API, and reads each back. Names, keys and ids carry `control`, which stays in clear.
pub(super) async fn plant(env: &Env<'_>, secret: &str, control: &str) {
    let store = env.store;
    let digest = "ab12";
    store.put_component(digest, b"\0asm").await.unwrap();
    let deployment = format!("agent-{control}");
    let authority = format!("{{\"env\":{{\"API_KEY\":\"{secret}-env\"}}}}");
    let record = store
        .deploy(&Deployment {
            name: &deployment,
            digest,
            authority: authority.as_bytes(),
            admission: Admission::Explicit,
            source: None,
        })
        .await
        .unwrap();
    assert_eq!(record.authority, authority.as_bytes());
    // A concurrency key read from the sealed input (the key itself is kept in clear).
    store
        .set_flow(&FlowSetting {
            deployment: &deployment,
            max_running: Some(5),
            key: Some("/customer"),
            per_key: Some(5),
        })
        .await
        .unwrap();

    let run_id = format!("run-{control}");
    let input = format!("{{\"customer\":\"c1\",\"note\":\"{secret}-input\"}}");
    let submission = Submission {
        run_id: &run_id,
        agent: &deployment,
        digest,
        namespace: &deployment,
        input: input.as_bytes(),
        authority: authority.as_bytes(),
        replace_authority: false,
        priority: 0,
    };
    assert!(store.submit(&submission).await.unwrap().created);
    // The same input again is the same run; other input is refused: compared sealed.
    assert!(!store.submit(&submission).await.unwrap().created);
    let other = Submission {
        input: b"{\"customer\":\"c1\"}",
        ..submission.clone()
    };
    assert!(matches!(
        store.submit(&other).await,
        Err(StoreError::InputMismatch { .. })
    ));
    assert_eq!(
        store.runs(&RunFilter::default()).await.unwrap()[0]
            .flow_key
            .as_deref(),
        Some("c1")
    );

    let leased = match store
        .acquire_run(&run_id, "w", super::RUN_LEASE)
        .await
        .unwrap()
    {
        Acquired::Leased(run) => run,
        other => panic!("expected a lease, got {other:?}"),
    };
    assert_eq!(leased.input, input.as_bytes());
    assert_eq!(leased.authority, authority.as_bytes());
    let run = fence(&run_id, leased.token);

    // A step's result and the checkpoint committed with it.
    let key = format!("{deployment}/step-{control}");
    let grant = env.grant(&key, "h", &run).await;
    let result = format!("{secret}-result");
    let checkpoint = crate::store::Checkpoint {
        step: 1,
        state: format!("{secret}-checkpoint").into_bytes(),
    };
    store
        .commit(&Commit {
            claim: ClaimRef {
                key: &key,
                token: grant.token,
                fence: &run,
            },
            result: result.as_bytes(),
            checkpoint: Some(&checkpoint),
            counts: Some(&Counts::default()),
        })
        .await
        .unwrap();
    assert_eq!(
        store.committed(&key).await.unwrap().unwrap(),
        result.as_bytes()
    );
    assert_eq!(
        store.load_progress(&run_id).await.unwrap().unwrap(),
        checkpoint
    );

    // Logs, long enough to span chunks and be cut at the front.
    let line = format!("{secret}-log line\n");
    // Long enough to span chunks and be cut at the front, whatever the secret's length.
    let line = format!("{line:<64}");
    for _ in 0..400 {
        store
            .append_log(&run, line.as_bytes(), 8 * 1024)
            .await
            .unwrap();
    }
    let log = store.logs(&run_id).await.unwrap();
    let whole = line.repeat(400);
    assert_eq!(log.len(), whole.len().min(8 * 1024));
    assert!(whole.as_bytes().ends_with(&log));

    // Live text, trimmed at the front by its length in clear.
    let chunk = crate::store::LiveText {
        key: "step".into(),
        text: format!("{secret}-live text"),
    };
    for _ in 0..20 {
        store
            .append_live(&run, std::slice::from_ref(&chunk), chunk.text.len() * 8)
            .await
            .unwrap();
    }
    let live = store.live(&run_id, None, 100).await.unwrap();
    assert_eq!(live.len(), 8);
    assert!(live.iter().all(|c| c.text == chunk.text && c.key == "step"));
    assert_eq!(live.last().map(|c| c.seq), Some(19));

    // A signal's payload, taken by the wait that records it.
    let payload = format!("{{\"approved\":\"{secret}-signal\"}}");
    store
        .send_signal(&run_id, "approve", payload.as_bytes(), payload.len())
        .await
        .unwrap();
    let state = store
        .wait(&WaitRequest {
            fence: &run,
            key: &format!("{deployment}/wait-{control}"),
            kind: WaitKind::Signal {
                name: "approve",
                timeout: None,
            },
        })
        .await
        .unwrap();
    assert_eq!(state, WaitState::Received(payload.clone().into_bytes()));
    // The limit is the clear payload's.
    let over = vec![b'x'; payload.len() + 1];
    assert!(matches!(
        store
            .send_signal(&run_id, "approve", &over, payload.len())
            .await,
        Err(StoreError::SignalRefused { .. })
    ));

    // A child spawned with sealed input, finished with a sealed output, joined.
    let child_id = format!("child-{control}");
    let child_input = format!("{{\"customer\":\"c2\",\"task\":\"{secret}-child-input\"}}");
    let spawn_key = format!("{deployment}/spawn-{control}");
    let spawned = store
        .spawn_many(&SpawnBatch {
            fence: &run,
            children: &[ChildSpec {
                key: &spawn_key,
                child_id: &child_id,
                deployment: &deployment,
                input: child_input.as_bytes(),
                detached: false,
            }],
            limits: SpawnLimits {
                max_depth: 4,
                max_children: 100,
            },
        })
        .await
        .unwrap();
    assert!(spawned[0].is_ok(), "{spawned:?}");
    let child = match store
        .acquire_run(&child_id, "w", super::RUN_LEASE)
        .await
        .unwrap()
    {
        Acquired::Leased(run) => run,
        other => panic!("expected a lease, got {other:?}"),
    };
    assert_eq!(child.input, child_input.as_bytes());
    assert_eq!(child.authority, authority.as_bytes());
    let child_output = format!("{secret}-child-output");
    store
        .finish_run(
            &fence(&child_id, child.token),
            RunEnd::Completed(child_output.as_bytes()),
            &Counts::default(),
        )
        .await
        .unwrap();
    let joined = store
        .join(&JoinRequest {
            fence: &run,
            key: &format!("{deployment}/join-{control}"),
            children: std::slice::from_ref(&child_id),
            mode: JoinMode::All,
            timeout: None,
            max_children: 100,
        })
        .await
        .unwrap();
    match joined {
        WaitState::Joined(ends) => assert_eq!(ends[0].outcome, child_output.as_bytes()),
        other => panic!("expected the join's children, got {other:?}"),
    }

    // A key parked in doubt and resolved with a result.
    let parked = format!("{deployment}/parked-{control}");
    let grant = env.grant(&parked, "h", &run).await;
    let claim = ClaimRef {
        key: &parked,
        token: grant.token,
        fence: &run,
    };
    store.park(&claim, "crashed mid-effect").await.unwrap();
    let resolved = format!("{secret}-resolved");
    store
        .resolve(&run_id, &parked, Resolution::Commit(resolved.as_bytes()))
        .await
        .unwrap();
    assert_eq!(
        store.committed(&parked).await.unwrap().unwrap(),
        resolved.as_bytes()
    );
    // Resolving gave the run back; it is leased again to finish.
    let run = env.acquire(&run_id, "w").await;

    // The run's output; and a second run's error text.
    let output = format!("{secret}-output");
    store
        .finish_run(
            &run,
            RunEnd::Completed(output.as_bytes()),
            &Counts::default(),
        )
        .await
        .unwrap();
    let record = store.run(&run_id).await.unwrap().unwrap();
    assert_eq!(record.outcome.as_deref(), Some(output.as_bytes()));
    let failing = format!("fails-{control}");
    store
        .submit(&Submission {
            run_id: &failing,
            ..submission.clone()
        })
        .await
        .unwrap();
    let failed = env.acquire(&failing, "w").await;
    let error = format!("{secret}-error");
    store
        .finish_run(
            &failed,
            RunEnd::Failed(error.as_bytes()),
            &Counts::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        store
            .run(&failing)
            .await
            .unwrap()
            .unwrap()
            .outcome
            .as_deref(),
        Some(error.as_bytes())
    );

    // A schedule's input, and the run its tick starts from it.
    let schedule_input = format!("{{\"customer\":\"c3\",\"job\":\"{secret}-schedule\"}}");
    let schedule = store
        .create_schedule(&ScheduleDef {
            name: &format!("nightly-{control}"),
            deployment: &deployment,
            spec: &ScheduleSpec::Every { every_ms: 60_000 },
            input: schedule_input.as_bytes(),
            catch_up: 0,
            overlap: Overlap::Allow,
        })
        .await
        .unwrap();
    assert_eq!(schedule.input, schedule_input.as_bytes());
    env.advance(61_000);
    let ticks = store.fire_schedules(10).await.unwrap();
    let started = ticks
        .iter()
        .find_map(|tick| match &tick.outcome {
            crate::store::TickOutcome::Started { run_id, .. } => Some(run_id.clone()),
            _ => None,
        })
        .expect("the tick started a run");
    let ticked = store
        .runs(&RunFilter::default())
        .await
        .unwrap()
        .into_iter()
        .find(|r| r.run_id == started)
        .unwrap();
    assert_eq!(ticked.flow_key.as_deref(), Some("c3"));
    match store
        .acquire_run(&started, "w", super::RUN_LEASE)
        .await
        .unwrap()
    {
        Acquired::Leased(run) => assert_eq!(run.input, schedule_input.as_bytes()),
        other => panic!("expected a lease, got {other:?}"),
    }
}

/// Every kind of payload, planted with a secret marker, is nowhere in the database's
/// own bytes, while a control marker in the names left in clear is found there (so
/// the search can find what is there).
fn nothing_in_clear<H: Harness>() {
    let clock = Clock::manual(T0);
    let Some(harness) = SealedHarness::<H>::create(&clock) else {
        return;
    };
    let tag = format!("{:08x}", fastrand::u32(..));
    let (secret, control) = (format!("SECRET{tag}"), format!("control{tag}"));
    let store = harness.store();
    let env = Env {
        store: store.as_ref(),
        clock: &clock,
    };
    block_on(plant(&env, &secret, &control));
    drop(store);
    assert!(
        harness.raw_holds(control.as_bytes()),
        "the control marker, in clear by design, was not found: the search is broken"
    );
    assert!(
        !harness.raw_holds(secret.as_bytes()),
        "a sealed payload is in the database in clear"
    );
}

/// Rotating the store key keeps every value readable under the new key; the old key,
/// no key or a wrong key is refused by name and changes nothing; a store holding
/// runs in clear cannot be given a key.
fn rotation_and_wrong_keys<H: Harness>() {
    let clock = Clock::manual(T0);
    let Some(harness) = SealedHarness::<H>::create(&clock) else {
        return;
    };
    let store = harness.store();
    let env = Env {
        store: store.as_ref(),
        clock: &clock,
    };
    block_on(plant(&env, "secret", "rot"));
    let before = block_on(store.data_keys()).unwrap();
    let new = StoreKey::from_hex(&"c3".repeat(32)).unwrap();
    let report = block_on(crate::store::rewrap(store.as_ref(), &test_key(), &new)).unwrap();
    assert_eq!(report.data_keys, 1);
    assert_eq!(report.to, new.id());
    // A second rotation from the old key finds it gone.
    assert!(matches!(
        block_on(crate::store::rewrap(store.as_ref(), &test_key(), &new)),
        Err(StoreError::Sealing(SealError::WrongKey { .. }))
    ));
    drop(store);

    let rotated = sealed(harness.inner.open_another(), Some(&new)).unwrap();
    let runs = block_on(rotated.runs(&RunFilter::default())).unwrap();
    assert_eq!(runs.len(), 4);
    let run = block_on(rotated.run("run-rot")).unwrap().unwrap();
    assert_eq!(run.outcome.as_deref(), Some(&b"secret-output"[..]));
    let after = block_on(rotated.data_keys()).unwrap();
    assert_ne!(before, after, "the data key is wrapped anew");

    for (key, what) in [(Some(test_key()), "the old key"), (None, "no key")] {
        let refused = sealed(harness.inner.open_another(), key.as_ref());
        match (refused, key.is_some()) {
            (Err(StoreError::Sealing(SealError::WrongKey { given, store })), true) => {
                assert_eq!((given, store), (test_key().id(), new.id()));
            }
            (Err(StoreError::Sealing(SealError::NoKey { store })), false) => {
                assert_eq!(store, new.id());
            }
            (other, _) => panic!("{what}: expected a refusal, got {:?}", other.map(|_| ())),
        }
    }
    assert_eq!(
        block_on(rotated.data_keys()).unwrap(),
        after,
        "nothing changed"
    );
    assert_eq!(
        block_on(rotated.run("run-rot"))
            .unwrap()
            .unwrap()
            .outcome
            .as_deref(),
        Some(&b"secret-output"[..])
    );
}

/// A store in clear that holds runs is not sealed by a key given later.
fn a_clear_store_with_runs_refuses_a_key<H: Harness>() {
    let clock = Clock::manual(T0);
    let Some(harness) = H::create(&clock) else {
        return;
    };
    let store = harness.store();
    let env = Env {
        store: store.as_ref(),
        clock: &clock,
    };
    block_on(env.submit("clear-run", b"{}"));
    drop(store);
    match sealed(harness.open_another(), Some(&test_key())) {
        Err(StoreError::Sealing(SealError::NotEmpty { holds })) => assert_eq!(holds, "runs"),
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    }
    assert!(block_on(harness.store().data_keys()).unwrap().is_empty());
}

macro_rules! sealing_tests {
    ($backend:ident: $harness:ty) => {
        mod $backend {
            #[test]
            fn nothing_in_clear() {
                super::nothing_in_clear::<$harness>();
            }

            #[test]
            fn rotation_and_wrong_keys() {
                super::rotation_and_wrong_keys::<$harness>();
            }

            #[test]
            fn a_clear_store_with_runs_refuses_a_key() {
                super::a_clear_store_with_runs_refuses_a_key::<$harness>();
            }
        }
    };
}

#[cfg(feature = "sqlite")]
sealing_tests!(sqlite: crate::store::tests::SqliteHarness);
#[cfg(feature = "postgres")]
sealing_tests!(postgres: crate::store::tests::PostgresHarness);
