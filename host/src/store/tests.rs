//! Store behaviour, written once and run against every backend: each backend adds a
//! [`Harness`] and one `store_tests!` line.

use std::collections::HashMap;
use std::time::Duration;

use super::{
    Checkpoint, ClaimOutcome, ClaimRequest, Counts, Grant, HeldClaim, Millis, OpenClaim,
    Resolution, RunEnd, RunSpec, RunStatus, SqliteStore, Store, StoreError, SyncMode,
};

/// A fresh, empty database of one backend, owned for the length of a test.
trait Harness {
    /// Creates the database and opens a handle on it.
    fn create() -> Self
    where
        Self: Sized;
    /// The open handle.
    fn store(&self) -> &dyn Store;
    /// Closes the handle and opens the same database again, as a restarted host would.
    fn reopen(&mut self);
    /// Opens a second, independent handle on the same database, as another process
    /// would.
    fn open_another(&self) -> Box<dyn Store>;
}

/// Instantiates every test below for one backend, in a module named `$backend`.
macro_rules! store_tests {
    ($backend:ident: $harness:ident) => {
        store_tests!(@expand $backend: $harness;
            store: [
                first_claim_is_granted,
                second_claimant_sees_held,
                commit_then_claim_returns_result,
                stale_commit_after_takeover_is_refused,
                refused_commit_writes_nothing,
                release_lets_next_claim_retake,
                release_and_renew_need_the_current_token,
                renew_keeps_the_claim,
                expired_lease_is_taken_over_in_doubt,
                take_over_with_matching_token,
                take_over_with_other_token_reports_holder,
                take_over_of_committed_key_returns_result,
                tokens_increase_across_keys,
                open_run_is_idempotent,
                open_run_with_other_input_is_refused,
                progress_round_trip_stores_counts,
                run_updates_need_an_opened_run,
                finish_run_records_outcome,
                runs_are_listed_newest_first,
                open_claims_by_run,
                park_blocks_the_key_until_resolved_with_a_result,
                resolve_retry_releases_the_key,
                park_and_resolve_need_the_right_token_and_run,
                failed_run_resumes_as_running,
                grants_are_counted_in_their_run,
                commit_and_save_is_one_transaction,
                upgrade_moves_a_run_to_another_component,
                fingerprints_bind_keys_to_their_input,
            ];
            harness: [
                reopening_keeps_everything,
                two_handles_race_for_claims,
            ]
        );
    };
    (@expand $backend:ident: $harness:ident;
        store: [$($store_test:ident),* $(,)?];
        harness: [$($harness_test:ident),* $(,)?]
    ) => {
        mod $backend {
            use super::Harness as _;
            $(
                #[test]
                fn $store_test() {
                    let harness = super::$harness::create();
                    super::$store_test(harness.store());
                }
            )*
            $(
                #[test]
                fn $harness_test() {
                    let mut harness = super::$harness::create();
                    super::$harness_test(&mut harness);
                }
            )*
        }
    };
}

store_tests!(sqlite: SqliteHarness);

/// A SQLite store in a file of its own temporary directory: real WAL, real locks.
struct SqliteHarness {
    dir: tempfile::TempDir,
    store: Option<SqliteStore>,
}

impl SqliteHarness {
    fn open(&self) -> SqliteStore {
        SqliteStore::open(&self.dir.path().join("idem.db"), SyncMode::Normal).unwrap()
    }
}

impl Harness for SqliteHarness {
    fn create() -> Self {
        let mut harness = SqliteHarness {
            dir: tempfile::tempdir().unwrap(),
            store: None,
        };
        harness.store = Some(harness.open());
        harness
    }

    fn store(&self) -> &dyn Store {
        self.store.as_ref().unwrap()
    }

    fn reopen(&mut self) {
        // Dropped first, so the file is really closed (and its WAL checkpointed).
        self.store = None;
        self.store = Some(self.open());
    }

    fn open_another(&self) -> Box<dyn Store> {
        Box::new(self.open())
    }
}

const T0: Millis = 1_700_000_000_000;
const LEASE: Duration = Duration::from_secs(10);
const LEASE_MS: Millis = 10_000;

fn req<'a>(key: &'a str, holder: &'a str, now: Millis) -> ClaimRequest<'a> {
    ClaimRequest {
        key,
        run_id: "run-1",
        holder,
        fingerprint: None,
        lease: LEASE,
        now,
    }
}

fn granted(outcome: ClaimOutcome) -> Grant {
    match outcome {
        ClaimOutcome::Granted(grant) => grant,
        other => panic!("expected a grant, got {other:?}"),
    }
}

fn spec<'a>(run_id: &'a str, input: &'a [u8], now: Millis) -> RunSpec<'a> {
    RunSpec {
        run_id,
        agent: "billing",
        digest: "ab12",
        namespace: "billing",
        input,
        now,
    }
}

fn first_claim_is_granted(store: &dyn Store) {
    let grant = granted(store.claim(&req("k", "a", T0)).unwrap());
    assert_eq!(grant.attempt, 1);
    assert!(!grant.in_doubt);
    assert!(grant.token > 0);
}

fn second_claimant_sees_held(store: &dyn Store) {
    let grant = granted(store.claim(&req("k", "a", T0)).unwrap());
    let second = store.claim(&req("k", "b", T0 + 1)).unwrap();
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
        store.claim(&req("k", "a", T0 + 2)).unwrap(),
        ClaimOutcome::Held(_)
    ));
}

fn commit_then_claim_returns_result(store: &dyn Store) {
    let grant = granted(store.claim(&req("k", "a", T0)).unwrap());
    store
        .commit("k", grant.token, "run-1", b"\x00result\xff")
        .unwrap();
    assert_eq!(
        store.claim(&req("k", "b", T0 + 1)).unwrap(),
        ClaimOutcome::Committed(b"\x00result\xff".to_vec())
    );
    assert_eq!(
        store.committed("k").unwrap(),
        Some(b"\x00result\xff".to_vec())
    );
    assert_eq!(store.committed("other").unwrap(), None);
    assert_eq!(store.open_claims(None).unwrap(), vec![]);
    // Committed even long after every lease, and to the committer too.
    assert_eq!(
        store.claim(&req("k", "a", T0 + 100 * LEASE_MS)).unwrap(),
        ClaimOutcome::Committed(b"\x00result\xff".to_vec())
    );
}

fn stale_commit_after_takeover_is_refused(store: &dyn Store) {
    let old = granted(store.claim(&req("k", "a", T0)).unwrap());
    let new = granted(store.claim(&req("k", "b", T0 + LEASE_MS)).unwrap());
    let err = store
        .commit("k", old.token, "run-1", b"from a")
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::ClaimLost { key, token } if key == "k" && *token == old.token),
        "{err:?}"
    );
    store.commit("k", new.token, "run-1", b"from b").unwrap();
    assert_eq!(store.committed("k").unwrap(), Some(b"from b".to_vec()));
    // And once committed, the old holder is refused for good.
    assert!(matches!(
        store.commit("k", old.token, "run-1", b"from a"),
        Err(StoreError::ClaimLost { .. })
    ));
    assert_eq!(store.committed("k").unwrap(), Some(b"from b".to_vec()));
}

fn refused_commit_writes_nothing(store: &dyn Store) {
    let old = granted(store.claim(&req("k", "a", T0)).unwrap());
    let new = granted(store.claim(&req("k", "b", T0 + LEASE_MS)).unwrap());
    assert!(matches!(
        store.commit("k", old.token, "run-1", b"from a"),
        Err(StoreError::ClaimLost { .. })
    ));
    // No result, and the new holder's claim is untouched.
    assert_eq!(store.committed("k").unwrap(), None);
    assert_eq!(
        store.open_claims(None).unwrap(),
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
        store.commit("k", u64::MAX, "run-1", b"x"),
        Err(StoreError::ClaimLost { .. })
    ));
    assert!(store.release("k", new.token).unwrap());
    assert!(matches!(
        store.commit("k", new.token, "run-1", b"x"),
        Err(StoreError::ClaimLost { .. })
    ));
    assert_eq!(store.committed("k").unwrap(), None);
}

fn release_lets_next_claim_retake(store: &dyn Store) {
    let first = granted(store.claim(&req("k", "a", T0)).unwrap());
    assert!(store.release("k", first.token).unwrap());
    let claims = store.open_claims(None).unwrap();
    assert_eq!(claims.len(), 1);
    assert_eq!(claims[0].holder, None);
    // Well within the old lease: a released claim is free at once.
    let second = granted(store.claim(&req("k", "b", T0 + 1)).unwrap());
    assert_eq!(second.attempt, 2);
    assert!(!second.in_doubt);
    assert!(second.token > first.token);
}

fn release_and_renew_need_the_current_token(store: &dyn Store) {
    let old = granted(store.claim(&req("k", "a", T0)).unwrap());
    let new = granted(store.claim(&req("k", "b", T0 + LEASE_MS)).unwrap());
    assert!(!store.release("k", old.token).unwrap());
    assert!(!store.renew("k", old.token, LEASE, T0 + LEASE_MS).unwrap());
    assert!(!store.release("missing", old.token).unwrap());
    let claims = store.open_claims(None).unwrap();
    assert_eq!(claims[0].holder.as_deref(), Some("b"));
    assert_eq!(claims[0].lease_expires, T0 + 2 * LEASE_MS);
    assert!(store.release("k", new.token).unwrap());
    // Released already: nothing left to release or renew.
    assert!(!store.release("k", new.token).unwrap());
    assert!(!store.renew("k", new.token, LEASE, T0 + LEASE_MS).unwrap());
}

fn renew_keeps_the_claim(store: &dyn Store) {
    let grant = granted(store.claim(&req("k", "a", T0)).unwrap());
    assert!(
        store
            .renew("k", grant.token, LEASE, T0 + LEASE_MS - 1)
            .unwrap()
    );
    // Past the first lease, but within the renewed one.
    assert_eq!(
        store.claim(&req("k", "b", T0 + LEASE_MS)).unwrap(),
        ClaimOutcome::Held(HeldClaim {
            holder: "a".to_owned(),
            token: grant.token,
            lease_expires: T0 + 2 * LEASE_MS - 1,
        })
    );
    // A holder late to renew keeps its claim if nobody took it meanwhile.
    assert!(
        store
            .renew("k", grant.token, LEASE, T0 + 5 * LEASE_MS)
            .unwrap()
    );
    assert!(matches!(
        store.claim(&req("k", "b", T0 + 5 * LEASE_MS + 1)).unwrap(),
        ClaimOutcome::Held(_)
    ));
}

fn expired_lease_is_taken_over_in_doubt(store: &dyn Store) {
    let first = granted(store.claim(&req("k", "a", T0)).unwrap());
    // One millisecond before expiry it is still held; at expiry it is not.
    assert!(matches!(
        store.claim(&req("k", "b", T0 + LEASE_MS - 1)).unwrap(),
        ClaimOutcome::Held(_)
    ));
    let second = granted(store.claim(&req("k", "b", T0 + LEASE_MS)).unwrap());
    assert_eq!(second.attempt, 2);
    assert!(second.in_doubt);
    assert!(second.token > first.token);
    let claims = store.open_claims(None).unwrap();
    assert_eq!(claims[0].holder.as_deref(), Some("b"));
    assert_eq!(claims[0].token, second.token);
}

fn take_over_with_matching_token(store: &dyn Store) {
    let first = granted(store.claim(&req("k", "a", T0)).unwrap());
    let second = granted(
        store
            .take_over(&req("k", "b", T0 + 1), first.token)
            .unwrap(),
    );
    assert_eq!(second.attempt, 2);
    assert!(second.in_doubt);
    assert!(second.token > first.token);
    assert!(matches!(
        store.commit("k", first.token, "run-1", b"a"),
        Err(StoreError::ClaimLost { .. })
    ));
    store.commit("k", second.token, "run-1", b"b").unwrap();
    assert_eq!(store.committed("k").unwrap(), Some(b"b".to_vec()));
}

fn take_over_with_other_token_reports_holder(store: &dyn Store) {
    let first = granted(store.claim(&req("k", "a", T0)).unwrap());
    let second = granted(
        store
            .take_over(&req("k", "b", T0 + 1), first.token)
            .unwrap(),
    );
    // Someone else already took it from `a`: `c` learns of `b`, it does not take over.
    assert_eq!(
        store
            .take_over(&req("k", "c", T0 + 2), first.token)
            .unwrap(),
        ClaimOutcome::Held(HeldClaim {
            holder: "b".to_owned(),
            token: second.token,
            lease_expires: T0 + 1 + LEASE_MS,
        })
    );
    // The usual rules still apply: once `b`'s lease runs out, the claim is free.
    let third = granted(
        store
            .take_over(&req("k", "c", T0 + 1 + LEASE_MS), first.token)
            .unwrap(),
    );
    assert_eq!(third.attempt, 3);
    assert!(third.in_doubt);
    // And a released claim is retaken without doubt.
    assert!(store.release("k", third.token).unwrap());
    let fourth = granted(
        store
            .take_over(&req("k", "d", T0 + 2 + LEASE_MS), 12345)
            .unwrap(),
    );
    assert_eq!(fourth.attempt, 4);
    assert!(!fourth.in_doubt);
}

fn take_over_of_committed_key_returns_result(store: &dyn Store) {
    let grant = granted(store.claim(&req("k", "a", T0)).unwrap());
    store.commit("k", grant.token, "run-1", b"done").unwrap();
    assert_eq!(
        store
            .take_over(&req("k", "b", T0 + 1), grant.token)
            .unwrap(),
        ClaimOutcome::Committed(b"done".to_vec())
    );
}

fn tokens_increase_across_keys(store: &dyn Store) {
    let mut last = 0;
    for i in 0..20_i64 {
        let key = format!("key-{}", i % 5);
        // The first round claims fresh keys; each later round, a lease later, retakes
        // the claims released before and takes over the ones that expired.
        let now = T0 + (i / 5) * LEASE_MS;
        let grant = granted(store.claim(&req(&key, "a", now)).unwrap());
        assert!(grant.token > last, "token {} after {last}", grant.token);
        last = grant.token;
        if i % 2 == 0 {
            assert!(store.release(&key, grant.token).unwrap());
        }
    }
}

fn open_run_is_idempotent(store: &dyn Store) {
    let first = store.open_run(&spec("run-1", b"input", T0)).unwrap();
    assert_eq!(first.run_id, "run-1");
    assert_eq!(first.agent, "billing");
    assert_eq!(first.digest, "ab12");
    assert_eq!(first.status, RunStatus::Running);
    assert_eq!(first.outcome, None);
    assert_eq!(first.step, None);
    assert_eq!(first.counts, Counts::default());
    assert_eq!(first.created, T0);
    assert_eq!(first.updated, T0);
    let again = store.open_run(&spec("run-1", b"input", T0 + 5)).unwrap();
    assert_eq!(again, first);
    assert_eq!(store.run("run-1").unwrap(), Some(first));
    assert_eq!(store.run("run-2").unwrap(), None);
}

fn open_run_with_other_input_is_refused(store: &dyn Store) {
    store.open_run(&spec("run-1", b"input", T0)).unwrap();
    let err = store
        .open_run(&spec("run-1", b"other", T0 + 1))
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::InputMismatch { run_id } if run_id == "run-1"),
        "{err:?}"
    );
    // Empty input is input too.
    assert!(matches!(
        store.open_run(&spec("run-1", b"", T0 + 1)),
        Err(StoreError::InputMismatch { .. })
    ));
    assert_eq!(store.runs().unwrap().len(), 1);
}

fn progress_round_trip_stores_counts(store: &dyn Store) {
    store.open_run(&spec("run-1", b"in", T0)).unwrap();
    assert_eq!(store.load_progress("run-1").unwrap(), None);
    let counts = Counts {
        executed: 7,
        skipped: 3,
        awaited: 1,
        reclaimed: 2,
        instances: 4,
    };
    let checkpoint = Checkpoint {
        step: 5,
        state: b"\x01\x02state".to_vec(),
    };
    store
        .save_progress("run-1", &checkpoint, &counts, T0 + 10)
        .unwrap();
    assert_eq!(store.load_progress("run-1").unwrap(), Some(checkpoint));
    let record = store.run("run-1").unwrap().unwrap();
    assert_eq!(record.counts, counts);
    assert_eq!(record.step, Some(5));
    assert_eq!(record.updated, T0 + 10);
    assert_eq!(record.created, T0);

    // A later checkpoint replaces the first, counts and all.
    let later = Checkpoint {
        step: 6,
        state: vec![],
    };
    let more = Counts {
        executed: 8,
        ..counts
    };
    store
        .save_progress("run-1", &later, &more, T0 + 20)
        .unwrap();
    assert_eq!(store.load_progress("run-1").unwrap(), Some(later));
    let more_still = Counts {
        instances: 5,
        ..more
    };
    store.save_counts("run-1", &more_still, T0 + 30).unwrap();
    let record = store.run("run-1").unwrap().unwrap();
    assert_eq!(record.counts, more_still);
    assert_eq!(record.step, Some(6));
    assert_eq!(record.updated, T0 + 30);
    // The reopened run reports where it stands.
    assert_eq!(
        store.open_run(&spec("run-1", b"in", T0 + 40)).unwrap(),
        record
    );
}

fn run_updates_need_an_opened_run(store: &dyn Store) {
    let checkpoint = Checkpoint {
        step: 1,
        state: vec![],
    };
    let counts = Counts::default();
    let unknown = |result: Result<(), StoreError>| {
        assert!(
            matches!(&result, Err(StoreError::UnknownRun { run_id }) if run_id == "ghost"),
            "{result:?}"
        );
    };
    unknown(store.save_progress("ghost", &checkpoint, &counts, T0));
    unknown(store.save_counts("ghost", &counts, T0));
    unknown(store.finish_run("ghost", RunEnd::Completed(b""), &counts, T0));
    assert_eq!(store.load_progress("ghost").unwrap(), None);
    assert_eq!(store.runs().unwrap(), vec![]);
}

fn finish_run_records_outcome(store: &dyn Store) {
    store.open_run(&spec("ok", b"in", T0)).unwrap();
    store.open_run(&spec("bad", b"in", T0)).unwrap();
    let counts = Counts {
        executed: 2,
        instances: 1,
        ..Counts::default()
    };
    store
        .finish_run("ok", RunEnd::Completed(b"{\"total\":3}"), &counts, T0 + 9)
        .unwrap();
    store
        .finish_run("bad", RunEnd::Failed("card declined"), &counts, T0 + 9)
        .unwrap();
    let ok = store.run("ok").unwrap().unwrap();
    assert_eq!(ok.status, RunStatus::Completed);
    assert_eq!(ok.outcome.as_deref(), Some(&b"{\"total\":3}"[..]));
    assert_eq!(ok.counts, counts);
    assert_eq!(ok.updated, T0 + 9);
    let bad = store.run("bad").unwrap().unwrap();
    assert_eq!(bad.status, RunStatus::Failed);
    assert_eq!(bad.outcome.as_deref(), Some(&b"card declined"[..]));
}

fn runs_are_listed_newest_first(store: &dyn Store) {
    store.open_run(&spec("old", b"", T0)).unwrap();
    store.open_run(&spec("new", b"", T0 + 2)).unwrap();
    store.open_run(&spec("mid-a", b"", T0 + 1)).unwrap();
    store.open_run(&spec("mid-b", b"", T0 + 1)).unwrap();
    let ids: Vec<String> = store
        .runs()
        .unwrap()
        .into_iter()
        .map(|r| r.run_id)
        .collect();
    assert_eq!(ids, ["new", "mid-b", "mid-a", "old"]);
}

fn open_claims_by_run(store: &dyn Store) {
    let other = |key, now| ClaimRequest {
        run_id: "run-2",
        ..req(key, "b", now)
    };
    let a1 = granted(store.claim(&req("a1", "a", T0)).unwrap());
    let a2 = granted(store.claim(&req("a2", "a", T0 + 1)).unwrap());
    let b1 = granted(store.claim(&other("b1", T0 + 2)).unwrap());
    let done = granted(store.claim(&req("done", "a", T0)).unwrap());
    store.commit("done", done.token, "run-1", b"").unwrap();
    assert!(store.release("a2", a2.token).unwrap());

    let run1 = store.open_claims(Some("run-1")).unwrap();
    assert_eq!(
        run1,
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
    let run2 = store.open_claims(Some("run-2")).unwrap();
    assert_eq!(run2.len(), 1);
    assert_eq!(run2[0].token, b1.token);
    let keys: Vec<String> = store
        .open_claims(None)
        .unwrap()
        .into_iter()
        .map(|c| c.key)
        .collect();
    assert_eq!(keys, ["a1", "a2", "b1"]);
    assert_eq!(store.open_claims(Some("run-3")).unwrap(), vec![]);
    // A claim retaken by another run moves to that run.
    let taken = ClaimRequest {
        run_id: "run-2",
        ..req("a2", "b", T0 + 3)
    };
    granted(store.claim(&taken).unwrap());
    assert_eq!(store.open_claims(Some("run-1")).unwrap().len(), 1);
    assert_eq!(store.open_claims(Some("run-2")).unwrap().len(), 2);
}

fn reopening_keeps_everything(harness: &mut dyn Harness) {
    let store = harness.store();
    store.open_run(&spec("run-1", b"in", T0)).unwrap();
    let counts = Counts {
        executed: 1,
        ..Counts::default()
    };
    let checkpoint = Checkpoint {
        step: 3,
        state: b"s".to_vec(),
    };
    store
        .save_progress("run-1", &checkpoint, &counts, T0 + 1)
        .unwrap();
    let done = granted(store.claim(&req("done", "a", T0)).unwrap());
    store
        .commit("done", done.token, "run-1", b"result")
        .unwrap();
    let open = granted(store.claim(&req("open", "a", T0)).unwrap());
    let run = store.run("run-1").unwrap();
    let claims = store.open_claims(None).unwrap();

    harness.reopen();
    let store = harness.store();
    assert_eq!(store.run("run-1").unwrap(), run);
    assert_eq!(store.load_progress("run-1").unwrap(), Some(checkpoint));
    assert_eq!(store.committed("done").unwrap(), Some(b"result".to_vec()));
    assert_eq!(store.open_claims(None).unwrap(), claims);
    assert_eq!(
        store.claim(&req("open", "b", T0 + 1)).unwrap(),
        ClaimOutcome::Held(HeldClaim {
            holder: "a".to_owned(),
            token: open.token,
            lease_expires: T0 + LEASE_MS,
        })
    );
    // The token counter survives too: no token is ever handed out twice.
    let next = granted(store.claim(&req("fresh", "b", T0 + 1)).unwrap());
    assert!(next.token > open.token);
}

fn two_handles_race_for_claims(harness: &mut dyn Harness) {
    const THREADS: usize = 8;
    const KEYS: usize = 25;
    let other = harness.open_another();
    let handles: [&dyn Store; 2] = [harness.store(), other.as_ref()];

    // THREADS × KEYS = 200 claims. Each thread walks the keys from its own offset so
    // that threads of both handles meet on every key.
    let wins: Vec<Vec<(usize, u64)>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let store = handles[t % 2];
                scope.spawn(move || {
                    let holder = format!("thread-{t}");
                    let mut wins = Vec::new();
                    for i in 0..KEYS {
                        let k = (i + t * 3) % KEYS;
                        let key = format!("key-{k}");
                        let request = ClaimRequest {
                            key: &key,
                            run_id: "race",
                            holder: &holder,
                            fingerprint: None,
                            lease: Duration::from_secs(3600),
                            now: T0,
                        };
                        match store.claim(&request).unwrap() {
                            ClaimOutcome::Granted(grant) => {
                                assert_eq!(grant.attempt, 1);
                                assert!(!grant.in_doubt);
                                store
                                    .commit(&key, grant.token, "race", holder.as_bytes())
                                    .unwrap();
                                wins.push((k, grant.token));
                            }
                            ClaimOutcome::Held(_) | ClaimOutcome::Committed(_) => {}
                            other => panic!("nothing is parked in this race: {other:?}"),
                        }
                    }
                    wins
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
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), KEYS, "tokens are unique across handles");
    for (k, t) in winner_of {
        let expected = format!("thread-{t}").into_bytes();
        for store in handles {
            assert_eq!(
                store.committed(&format!("key-{k}")).unwrap(),
                Some(expected.clone())
            );
        }
    }
    assert_eq!(other.open_claims(None).unwrap(), vec![]);
}

fn park_blocks_the_key_until_resolved_with_a_result(store: &dyn Store) {
    store.open_run(&spec("run-1", b"in", T0)).unwrap();
    let first = granted(store.claim(&req("k", "a", T0)).unwrap());
    // The holder dies in the effect; the next one gets it in doubt and parks it.
    let second = granted(store.claim(&req("k", "b", T0 + LEASE_MS)).unwrap());
    assert!(second.in_doubt);
    store
        .park(
            "k",
            second.token,
            "run-1",
            "may have run",
            T0 + LEASE_MS + 1,
        )
        .unwrap();

    let run = store.run("run-1").unwrap().unwrap();
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
    assert_eq!(
        store.claim(&req("k", "c", T0 + 100 * LEASE_MS)).unwrap(),
        parked
    );
    assert_eq!(
        store
            .take_over(&req("k", "c", T0 + 100 * LEASE_MS), second.token)
            .unwrap(),
        parked
    );
    let claims = store.open_claims(Some("run-1")).unwrap();
    assert_eq!(claims.len(), 1);
    assert_eq!(claims[0].parked.as_deref(), Some("may have run"));
    assert_eq!(claims[0].holder, None);
    // The parked holder cannot commit any more.
    assert!(matches!(
        store.commit("k", second.token, "run-1", b"late"),
        Err(StoreError::ClaimLost { .. })
    ));

    store
        .resolve(
            "run-1",
            "k",
            Resolution::Commit(b"done"),
            T0 + 200 * LEASE_MS,
        )
        .unwrap();
    assert_eq!(store.committed("k").unwrap().as_deref(), Some(&b"done"[..]));
    assert_eq!(
        store.claim(&req("k", "c", T0 + 201 * LEASE_MS)).unwrap(),
        ClaimOutcome::Committed(b"done".to_vec())
    );
    assert!(store.open_claims(None).unwrap().is_empty());
    let run = store.run("run-1").unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Running);
    assert_eq!(run.outcome, None);
    // The resolution took a fresh token, above every holder's.
    let next = granted(store.claim(&req("other", "d", T0)).unwrap());
    assert!(next.token > second.token + 1 && second.token > first.token);
}

fn resolve_retry_releases_the_key(store: &dyn Store) {
    store.open_run(&spec("run-1", b"in", T0)).unwrap();
    granted(store.claim(&req("k", "a", T0)).unwrap());
    let second = granted(store.claim(&req("k", "b", T0 + LEASE_MS)).unwrap());
    store
        .park("k", second.token, "run-1", "unsure", T0 + LEASE_MS)
        .unwrap();
    store
        .resolve("run-1", "k", Resolution::Retry, T0 + LEASE_MS + 1)
        .unwrap();
    assert_eq!(
        store.run("run-1").unwrap().unwrap().status,
        RunStatus::Running
    );
    // Released: the next claim is attempt 3 and, the operator having decided, not in
    // doubt.
    let third = granted(store.claim(&req("k", "c", T0 + LEASE_MS + 2)).unwrap());
    assert_eq!((third.attempt, third.in_doubt), (3, false));
}

fn park_and_resolve_need_the_right_token_and_run(store: &dyn Store) {
    store.open_run(&spec("run-1", b"in", T0)).unwrap();
    store.open_run(&spec("run-2", b"in", T0)).unwrap();
    let grant = granted(store.claim(&req("k", "a", T0)).unwrap());
    assert!(matches!(
        store.park("k", grant.token + 1, "run-1", "x", T0),
        Err(StoreError::ClaimLost { .. })
    ));
    // A live, unparked claim is not the operator's to resolve.
    assert!(matches!(
        store.resolve("run-1", "k", Resolution::Retry, T0),
        Err(StoreError::NotInDoubt { .. })
    ));
    store.park("k", grant.token, "run-1", "x", T0).unwrap();
    assert!(matches!(
        store.resolve("run-2", "k", Resolution::Commit(b"r"), T0),
        Err(StoreError::NotInDoubt { .. })
    ));
    assert!(matches!(
        store.resolve("run-1", "missing", Resolution::Commit(b"r"), T0),
        Err(StoreError::NotInDoubt { .. })
    ));
    assert_eq!(store.committed("k").unwrap(), None);
    assert_eq!(
        store.run("run-2").unwrap().unwrap().status,
        RunStatus::Running
    );
}

fn failed_run_resumes_as_running(store: &dyn Store) {
    store.open_run(&spec("run-1", b"in", T0)).unwrap();
    store
        .finish_run("run-1", RunEnd::Failed("boom"), &Counts::default(), T0 + 1)
        .unwrap();
    assert_eq!(
        store.run("run-1").unwrap().unwrap().status,
        RunStatus::Failed
    );
    let again = store.open_run(&spec("run-1", b"in", T0 + 2)).unwrap();
    assert_eq!(again.status, RunStatus::Running);
    assert_eq!(again.outcome, None);
}

fn grants_are_counted_in_their_run(store: &dyn Store) {
    store.open_run(&spec("run-1", b"in", T0)).unwrap();
    let first = granted(store.claim(&req("k", "a", T0)).unwrap());
    granted(store.claim(&req("j", "a", T0)).unwrap());
    let counts = store.run("run-1").unwrap().unwrap().counts;
    assert_eq!((counts.executed, counts.reclaimed), (2, 0));
    // A takeover in doubt counts as executed and reclaimed, durably, before any flush.
    let taken = granted(
        store
            .take_over(&req("k", "b", T0 + 1), first.token)
            .unwrap(),
    );
    assert!(taken.in_doubt);
    let counts = store.run("run-1").unwrap().unwrap().counts;
    assert_eq!((counts.executed, counts.reclaimed), (3, 1));
    // Found committed: not a grant, so not counted here.
    store.commit("k", taken.token, "run-1", b"r").unwrap();
    store.claim(&req("k", "c", T0 + 2)).unwrap();
    assert_eq!(store.run("run-1").unwrap().unwrap().counts.executed, 3);
}

fn commit_and_save_is_one_transaction(store: &dyn Store) {
    store.open_run(&spec("run-1", b"in", T0)).unwrap();
    let stale = granted(store.claim(&req("k", "a", T0)).unwrap());
    let taker = granted(
        store
            .take_over(&req("k", "b", T0 + 1), stale.token)
            .unwrap(),
    );
    let counts = Counts {
        executed: 7,
        ..Counts::default()
    };
    let checkpoint = Checkpoint {
        step: 1,
        state: b"s1".to_vec(),
    };
    // The stale holder's commit is refused and its checkpoint is not written either.
    assert!(matches!(
        store.commit_and_save(
            "k",
            stale.token,
            "run-1",
            b"old",
            &checkpoint,
            &counts,
            T0 + 2
        ),
        Err(StoreError::ClaimLost { .. })
    ));
    assert_eq!(store.load_progress("run-1").unwrap(), None);
    assert_eq!(store.committed("k").unwrap(), None);

    store
        .commit_and_save(
            "k",
            taker.token,
            "run-1",
            b"new",
            &checkpoint,
            &counts,
            T0 + 3,
        )
        .unwrap();
    assert_eq!(store.committed("k").unwrap().as_deref(), Some(&b"new"[..]));
    assert_eq!(store.load_progress("run-1").unwrap(), Some(checkpoint));
    assert_eq!(store.run("run-1").unwrap().unwrap().counts.executed, 7);
}

fn upgrade_moves_a_run_to_another_component(store: &dyn Store) {
    store.open_run(&spec("run-1", b"in", T0)).unwrap();
    assert!(matches!(
        store.upgrade_run("run-1", "not-the-digest", "cd34", T0 + 1),
        Err(StoreError::UnknownRun { .. })
    ));
    assert_eq!(store.run("run-1").unwrap().unwrap().digest, "ab12");
    store.upgrade_run("run-1", "ab12", "cd34", T0 + 2).unwrap();
    let run = store.run("run-1").unwrap().unwrap();
    assert_eq!((run.digest.as_str(), run.updated), ("cd34", T0 + 2));
}

fn fingerprints_bind_keys_to_their_input(store: &dyn Store) {
    let with = |key: &'static str, fingerprint: Option<&'static str>, holder, now| ClaimRequest {
        fingerprint,
        ..req(key, holder, now)
    };
    let conflict = |fingerprint: &str| ClaimOutcome::Conflict {
        fingerprint: fingerprint.to_owned(),
    };
    let grant = granted(store.claim(&with("k", Some("f1"), "a", T0)).unwrap());
    // In flight: another input is refused; the same input (or none) waits as usual.
    assert_eq!(
        store.claim(&with("k", Some("f2"), "b", T0)).unwrap(),
        conflict("f1")
    );
    assert!(matches!(
        store.claim(&with("k", Some("f1"), "b", T0)).unwrap(),
        ClaimOutcome::Held(_)
    ));
    assert!(matches!(
        store.claim(&with("k", None, "b", T0)).unwrap(),
        ClaimOutcome::Held(_)
    ));
    // Committed: the binding moves to the result.
    store.commit("k", grant.token, "run-1", b"r1").unwrap();
    assert_eq!(
        store.claim(&with("k", Some("f2"), "b", T0)).unwrap(),
        conflict("f1")
    );
    assert_eq!(
        store.claim(&with("k", Some("f1"), "b", T0)).unwrap(),
        ClaimOutcome::Committed(b"r1".to_vec())
    );
    // A key claimed without a fingerprint binds nothing; a later one may bind it.
    let open = granted(store.claim(&with("j", None, "a", T0)).unwrap());
    store.release("j", open.token).unwrap();
    let bound = granted(store.claim(&with("j", Some("g"), "a", T0)).unwrap());
    store.commit("j", bound.token, "run-1", b"r").unwrap();
    assert_eq!(
        store.claim(&with("j", Some("h"), "a", T0)).unwrap(),
        conflict("g")
    );
}
