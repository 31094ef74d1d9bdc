//! A model-based property test of the store: random sequences of claims, takeovers,
//! commits, releases, renewals, parks, resolutions, run leases (acquired, renewed,
//! given back, stolen by another worker), crashes, time passing and reopened handles,
//! from several holders on two handles of one real store (a SQLite file, a
//! PostgreSQL schema: the same test for each backend), checked step by step
//! against a small in-memory model of the rules in `store/mod.rs`.
//!
//! Each holder drives its own run and presents that run's fence with every write. A
//! fence goes stale when another worker is granted the run (after the holder's lease
//! ran out, or after it gave the lease back) or when the holder crashes and forgets
//! it: the model then expects every write made with it refused, and nothing changed.
//!
//! The model predicts every answer exactly (tokens included) and the whole visible
//! state after every step. Independently of the model, the test also checks the rules
//! themselves: at most one commit per key and a committed value that never changes or
//! disappears, strictly increasing tokens per key and per run, and attempts that grow by
//! one per grant.
//!
//! `PROPTEST_CASES=N` runs more cases than the suite's [`CASES`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::Config;

mod model;

use model::{Lease, Model};

#[cfg(feature = "postgres")]
use super::tests::PostgresHarness;
#[cfg(feature = "sqlite")]
use super::tests::SqliteHarness;
use super::tests::{Harness, block_on};
use super::{
    Acquired, Checkpoint, ClaimOutcome, ClaimRef, ClaimRequest, Clock, Commit, Counts, Grant,
    LeaseState, Millis, Resolution, RunFence, Store, StoreError, Submission, SyncMode,
};

/// Cases in the normal suite: a few seconds on a small machine.
const CASES: u32 = 64;
/// Keys, holders and operations per case: few keys, so that holders collide.
const KEYS: usize = 3;
const HOLDERS: usize = 3;
const MAX_OPS: usize = 80;
const LEASE_MS: Millis = 1_000;
const LEASE: Duration = Duration::from_millis(LEASE_MS as u64);
/// Run leases outlast claim leases, but time passing still ends them now and then.
const RUN_LEASE_MS: Millis = 3 * LEASE_MS;
const RUN_LEASE: Duration = Duration::from_millis(RUN_LEASE_MS as u64);
const T0: Millis = 1_700_000_000_000;

/// Which claim token an operation presents.
#[derive(Debug, Clone, Copy)]
enum TokenPick {
    /// The last token the holder was granted for the key (0, never handed out, if it
    /// holds none: it forgot it in a crash, or never had one).
    Own,
    /// The key's current token, whoever holds it: what a host presents when it knows
    /// the holder died.
    Current,
    /// Some small number: mostly stale, sometimes never handed out, now and then right.
    Guess(u64),
}

#[derive(Debug, Clone)]
enum Op {
    Claim {
        holder: usize,
        key: usize,
    },
    TakeOver {
        holder: usize,
        key: usize,
        stale: TokenPick,
    },
    /// A commit; with `save`, carrying the holder's run's next checkpoint.
    Commit {
        holder: usize,
        key: usize,
        token: TokenPick,
        value: u8,
        save: bool,
    },
    Release {
        holder: usize,
        key: usize,
        token: TokenPick,
    },
    Renew {
        holder: usize,
        key: usize,
        token: TokenPick,
    },
    Park {
        holder: usize,
        key: usize,
        token: TokenPick,
    },
    /// An operator settles `key` for run `run`: commit `Some(value)`, or retry.
    Resolve {
        run: usize,
        key: usize,
        value: Option<u8>,
    },
    /// The holder's worker leases its run (again).
    AcquireRun {
        holder: usize,
    },
    /// The holder's worker renews its run lease.
    RenewRun {
        holder: usize,
    },
    /// The holder's worker gives its run lease back.
    ReleaseRun {
        holder: usize,
    },
    /// Another worker leases the holder's run if it can, and gives it back at once:
    /// the holder's fence is stale from then on.
    Steal {
        holder: usize,
    },
    /// The holder's process dies: it forgets its claims and its run lease, and comes
    /// back as a new holder.
    Crash {
        holder: usize,
    },
    /// Time passes: leases run out.
    Advance {
        ms: Millis,
    },
    /// Both handles are closed and opened again, as restarted hosts would.
    Reopen,
}

fn token_pick() -> impl Strategy<Value = TokenPick> {
    prop_oneof![
        4 => Just(TokenPick::Own),
        1 => Just(TokenPick::Current),
        1 => (0u64..12).prop_map(TokenPick::Guess),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let holder = 0..HOLDERS;
    let key = 0..KEYS;
    prop_oneof![
        6 => (holder.clone(), key.clone()).prop_map(|(holder, key)| Op::Claim { holder, key }),
        2 => (holder.clone(), key.clone(), token_pick())
            .prop_map(|(holder, key, stale)| Op::TakeOver { holder, key, stale }),
        6 => (holder.clone(), key.clone(), token_pick(), any::<u8>(), any::<bool>()).prop_map(
            |(holder, key, token, value, save)| Op::Commit { holder, key, token, value, save }
        ),
        2 => (holder.clone(), key.clone(), token_pick())
            .prop_map(|(holder, key, token)| Op::Release { holder, key, token }),
        2 => (holder.clone(), key.clone(), token_pick())
            .prop_map(|(holder, key, token)| Op::Renew { holder, key, token }),
        1 => (holder.clone(), key.clone(), token_pick())
            .prop_map(|(holder, key, token)| Op::Park { holder, key, token }),
        1 => (holder.clone(), key, proptest::option::of(any::<u8>()))
            .prop_map(|(run, key, value)| Op::Resolve { run, key, value }),
        2 => holder.clone().prop_map(|holder| Op::AcquireRun { holder }),
        1 => holder.clone().prop_map(|holder| Op::RenewRun { holder }),
        1 => holder.clone().prop_map(|holder| Op::ReleaseRun { holder }),
        1 => holder.clone().prop_map(|holder| Op::Steal { holder }),
        1 => holder.prop_map(|holder| Op::Crash { holder }),
        3 => (0..=2 * LEASE_MS).prop_map(|ms| Op::Advance { ms }),
        1 => Just(Op::Reopen),
    ]
}

fn key_name(key: usize) -> String {
    format!("key-{key}")
}

fn run_name(run: usize) -> String {
    format!("run-{run}")
}

fn fence(run: usize, token: u64) -> RunFence {
    RunFence {
        run_id: run_name(run),
        token,
        sync: SyncMode::Normal,
    }
}

/// What the test saw the store do, checked against the rules without the model.
#[derive(Default)]
struct Observed {
    /// Every result the store ever reported committed, by key.
    committed: BTreeMap<usize, Vec<u8>>,
    /// Successful commits (and resolutions with a result) per key.
    commits: BTreeMap<usize, u32>,
    /// The greatest token granted so far, per key.
    max_token: BTreeMap<usize, u64>,
    /// The last attempt granted per key.
    attempts: BTreeMap<usize, u32>,
    /// The greatest run lease token granted so far, per run.
    max_run_token: BTreeMap<usize, u64>,
}

impl Observed {
    fn grant(&mut self, key: usize, grant: &Grant) -> Result<(), TestCaseError> {
        let before = self.max_token.insert(key, grant.token).unwrap_or(0);
        prop_assert!(
            grant.token > before,
            "key {}: token {} granted after {}",
            key,
            grant.token,
            before
        );
        let last = self.attempts.insert(key, grant.attempt).unwrap_or(0);
        prop_assert_eq!(grant.attempt, last + 1, "attempt of key {}", key);
        Ok(())
    }

    fn run_lease(&mut self, run: usize, token: u64) -> Result<(), TestCaseError> {
        let before = self.max_run_token.insert(run, token).unwrap_or(0);
        prop_assert!(
            token > before,
            "run {}: lease token {} after {}",
            run,
            token,
            before
        );
        Ok(())
    }

    fn commit(&mut self, key: usize) -> Result<(), TestCaseError> {
        let commits = self.commits.entry(key).or_insert(0);
        *commits += 1;
        prop_assert_eq!(*commits, 1, "key {} committed twice", key);
        Ok(())
    }
}

/// Two handles on one store, sharing the test's clock: holders alternate between
/// them, as two processes would.
struct Stores {
    clock: Clock,
    harness: Box<dyn Harness>,
    handles: Vec<Arc<dyn Store>>,
}

impl Stores {
    fn open(clock: Clock, harness: Box<dyn Harness>) -> Stores {
        let handles = vec![harness.store(), harness.open_another()];
        Stores {
            clock,
            harness,
            handles,
        }
    }

    fn of(&self, holder: usize) -> &dyn Store {
        self.handles[holder % self.handles.len()].as_ref()
    }

    fn reopen(self) -> Stores {
        let Stores {
            clock,
            mut harness,
            handles,
        } = self;
        drop(handles);
        harness.reopen();
        Stores::open(clock, harness)
    }
}

/// Makes a fresh store of one backend on the clock, or `None` when it is skipped.
type Backend = fn(&Clock) -> Option<Box<dyn Harness>>;

#[cfg(feature = "sqlite")]
fn sqlite(clock: &Clock) -> Option<Box<dyn Harness>> {
    Some(Box::new(SqliteHarness::create(clock)?))
}

#[cfg(feature = "postgres")]
fn postgres(clock: &Clock) -> Option<Box<dyn Harness>> {
    Some(Box::new(PostgresHarness::create(clock)?))
}

async fn run_case(backend: Backend, ops: &[Op]) -> Result<(), TestCaseError> {
    let clock = Clock::manual(T0);
    let Some(harness) = backend(&clock) else {
        return Ok(());
    };
    let mut stores = Stores::open(clock, harness);
    let mut model = Model::new();
    let mut seen = Observed::default();
    stores.of(0).put_component("00", b"").await?;
    for run in 0..HOLDERS {
        stores
            .of(run)
            .submit(&Submission {
                run_id: &run_name(run),
                agent: "model",
                digest: "00",
                namespace: "model",
                input: b"",
                authority: b"",
                replace_authority: false,
                priority: 0,
            })
            .await?;
        // Every holder starts with its run leased.
        apply(
            &mut stores,
            &mut model,
            &mut seen,
            &Op::AcquireRun { holder: run },
        )
        .await?;
    }

    for (step, op) in ops.iter().enumerate() {
        apply(&mut stores, &mut model, &mut seen, op)
            .await
            .map_err(|e| TestCaseError::fail(format!("step {step} {op:?}: {e}")))?;
        if matches!(op, Op::Reopen) {
            stores = stores.reopen();
        }
        check_state(&stores, &model, &mut seen)
            .await
            .map_err(|e| TestCaseError::fail(format!("after step {step} {op:?}: {e}")))?;
    }
    Ok(())
}

/// Expects a write refused for its stale fence.
fn refused_for_fence<T: std::fmt::Debug>(
    got: Result<T, StoreError>,
    fence: &RunFence,
) -> Result<(), TestCaseError> {
    match got {
        Err(StoreError::LeaseLost { run_id, token }) => {
            prop_assert_eq!((run_id, token), (fence.run_id.clone(), fence.token));
            Ok(())
        }
        other => Err(TestCaseError::fail(format!(
            "fence {} of {} is stale, yet: {other:?}",
            fence.token, fence.run_id
        ))),
    }
}

/// Runs one operation on the store and on the model; their answers must agree.
async fn apply(
    stores: &mut Stores,
    model: &mut Model,
    seen: &mut Observed,
    op: &Op,
) -> Result<(), TestCaseError> {
    match *op {
        Op::Claim { holder, key } | Op::TakeOver { holder, key, .. } => {
            let stale = match *op {
                Op::TakeOver { stale, .. } => Some(model.token(holder, key, stale)),
                _ => None,
            };
            let name = model.holder_name(holder);
            let fence = fence(holder, model.fence[holder]);
            let key_id = key_name(key);
            let req = ClaimRequest {
                key: &key_id,
                fence: &fence,
                holder: &name,
                fingerprint: None,
                lease: LEASE,
                durable: true,
            };
            let store = stores.of(holder);
            let got = match stale {
                None => store.claim(&req).await,
                Some(token) => store.take_over(&req, token).await,
            };
            match model.claim(holder, key, stale) {
                None => refused_for_fence(got, &fence)?,
                Some(expected) => {
                    let got = got?;
                    prop_assert_eq!(&got, &expected);
                    if let ClaimOutcome::Granted(grant) = &got {
                        seen.grant(key, grant)?;
                    }
                }
            }
        }
        Op::Commit {
            holder,
            key,
            token,
            value,
            save,
        } => {
            let token = model.token(holder, key, token);
            let fence = fence(holder, model.fence[holder]);
            let result = vec![value, key as u8];
            let checkpoint = Checkpoint {
                step: u64::from(value),
                state: vec![value; 3],
            };
            // Counts as a host would pass them: what its run has, plus something new;
            // and, as a host does between flushes, sometimes none.
            let counts = Counts {
                skipped: u64::from(value),
                ..model.runs[holder].counts
            };
            let flush = value % 2 == 0;
            let key_id = key_name(key);
            let commit = Commit {
                claim: ClaimRef {
                    key: &key_id,
                    token,
                    fence: &fence,
                },
                result: &result,
                checkpoint: save.then_some(&checkpoint),
                counts: flush.then_some(&counts),
            };
            let got = stores.of(holder).commit(&commit).await;
            if !model.fence_holds(holder) {
                return refused_for_fence(got, &fence);
            }
            let expected = model.commit(key, token, result);
            match got {
                Ok(()) => {
                    prop_assert!(expected, "commit with token {} accepted", token);
                    seen.commit(key)?;
                    let run = &mut model.runs[holder];
                    if flush {
                        run.counts = counts;
                    }
                    if save {
                        run.checkpoint = Some(checkpoint);
                    }
                }
                Err(StoreError::ClaimLost { key: k, token: t }) => {
                    prop_assert!(!expected, "commit with token {} refused", token);
                    prop_assert_eq!((k, t), (key_name(key), token));
                }
                Err(other) => return Err(TestCaseError::fail(format!("commit: {other}"))),
            }
        }
        Op::Release { holder, key, token } => {
            let token = model.token(holder, key, token);
            let fence = fence(holder, model.fence[holder]);
            let key_id = key_name(key);
            let claim = ClaimRef {
                key: &key_id,
                token,
                fence: &fence,
            };
            let got = stores.of(holder).release(&claim).await?;
            let expected = model.fence_holds(holder) && model.release(key, token);
            prop_assert_eq!(got, expected);
        }
        Op::Renew { holder, key, token } => {
            let token = model.token(holder, key, token);
            let fence = fence(holder, model.fence[holder]);
            let key_id = key_name(key);
            let claim = ClaimRef {
                key: &key_id,
                token,
                fence: &fence,
            };
            let got = stores.of(holder).renew(&[claim], LEASE).await?;
            let expected = model.fence_holds(holder) && model.renew(key, token);
            prop_assert_eq!(got, vec![expected]);
        }
        Op::Park { holder, key, token } => {
            let token = model.token(holder, key, token);
            let fence = fence(holder, model.fence[holder]);
            let reason = format!("parked by {}", model.holder_name(holder));
            let key_id = key_name(key);
            let claim = ClaimRef {
                key: &key_id,
                token,
                fence: &fence,
            };
            let got = stores.of(holder).park(&claim, &reason).await;
            if !model.fence_holds(holder) {
                return refused_for_fence(got, &fence);
            }
            let expected = model.park(key, token, holder, &reason);
            match got {
                Ok(()) => prop_assert!(expected, "park with token {} accepted", token),
                Err(StoreError::ClaimLost { .. }) => {
                    prop_assert!(!expected, "park with token {} refused", token)
                }
                Err(other) => return Err(TestCaseError::fail(format!("park: {other}"))),
            }
        }
        Op::Resolve { run, key, value } => {
            let result = value.map(|v| vec![v, key as u8, 0xaa]);
            let resolution = match &result {
                Some(bytes) => Resolution::Commit(bytes),
                None => Resolution::Retry,
            };
            let got = stores
                .of(run)
                .resolve(&run_name(run), &key_name(key), resolution)
                .await;
            let expected = model.resolve(run, key, result.clone());
            match got {
                Ok(()) => {
                    prop_assert!(expected, "resolve of key {} accepted", key);
                    if result.is_some() {
                        seen.commit(key)?;
                    }
                }
                Err(StoreError::NotInDoubt { .. }) => {
                    prop_assert!(!expected, "resolve of key {} refused", key)
                }
                Err(other) => return Err(TestCaseError::fail(format!("resolve: {other}"))),
            }
        }
        Op::AcquireRun { holder } | Op::Steal { holder } => {
            let stealing = matches!(op, Op::Steal { .. });
            let worker = if stealing {
                "thief".to_owned()
            } else {
                model.worker_name(holder)
            };
            let store = stores.of(holder + usize::from(stealing));
            let got = store
                .acquire_run(&run_name(holder), &worker, RUN_LEASE)
                .await?;
            match (model.acquire(holder, worker.clone()), got) {
                (Lease::Granted(token), Acquired::Leased(run)) => {
                    prop_assert_eq!(run.token, token);
                    prop_assert_eq!(run.record.lease, model.runs[holder].lease_info());
                    seen.run_lease(holder, token)?;
                    if stealing {
                        // The thief gives the run back at once: free, but fenced anew.
                        let counts = model.runs[holder].counts;
                        let thief = fence(holder, token);
                        store.release_run(&thief, &counts, Some("stolen")).await?;
                        model.runs[holder].lease = None;
                        model.runs[holder].note = Some("stolen".to_owned());
                    } else {
                        model.fence[holder] = token;
                    }
                }
                (Lease::Held(expected), Acquired::Held(got)) => prop_assert_eq!(got, expected),
                (Lease::Finished, Acquired::Finished(record)) => {
                    prop_assert_eq!(record.status, model.runs[holder].status)
                }
                (_, got) => {
                    return Err(TestCaseError::fail(format!("acquire: unexpected {got:?}")));
                }
            }
        }
        Op::RenewRun { holder } => {
            let fence = fence(holder, model.fence[holder]);
            let got = stores
                .of(holder)
                .renew_runs(std::slice::from_ref(&fence), RUN_LEASE)
                .await?;
            let expected = if model.fence_holds(holder) {
                let expires = model.now + RUN_LEASE_MS;
                if let Some(lease) = model.runs[holder].lease.as_mut() {
                    lease.1 = expires;
                }
                LeaseState::Held {
                    expires,
                    cancel_requested: false,
                    pause_requested: false,
                }
            } else {
                LeaseState::Lost
            };
            prop_assert_eq!(got, vec![expected]);
        }
        Op::ReleaseRun { holder } => {
            let fence = fence(holder, model.fence[holder]);
            let counts = model.runs[holder].counts;
            let note = format!("released by {}", model.worker_name(holder));
            let got = stores
                .of(holder)
                .release_run(&fence, &counts, Some(&note))
                .await;
            if !model.fence_holds(holder) {
                return refused_for_fence(got, &fence);
            }
            got?;
            model.runs[holder].lease = None;
            model.runs[holder].note = Some(note);
        }
        Op::Crash { holder } => {
            model.held[holder] = vec![None; KEYS];
            model.fence[holder] = 0;
            model.incarnation[holder] += 1;
        }
        Op::Advance { ms } => {
            model.now += ms;
            stores
                .clock
                .advance(Duration::from_millis(ms.unsigned_abs()));
        }
        Op::Reopen => {}
    }
    Ok(())
}

/// Everything the store shows matches the model, and no committed result changed or
/// went missing.
async fn check_state(
    stores: &Stores,
    model: &Model,
    seen: &mut Observed,
) -> Result<(), TestCaseError> {
    for (i, store) in stores.handles.iter().enumerate() {
        for key in 0..KEYS {
            let committed = store.committed(&key_name(key)).await?;
            match (seen.committed.get(&key), &committed) {
                (Some(first), now) => prop_assert_eq!(
                    now.as_ref(),
                    Some(first),
                    "key {} lost or changed its result",
                    key
                ),
                (None, Some(value)) => {
                    seen.committed.insert(key, value.clone());
                }
                (None, None) => {}
            }
            prop_assert_eq!(
                &committed,
                &model.committed[key],
                "handle {} key {}",
                i,
                key
            );
        }
        prop_assert_eq!(
            store.open_claims(None).await?,
            model.open_claims(),
            "handle {}",
            i
        );
        for (run, expected) in model.runs.iter().enumerate() {
            let record = store.run(&run_name(run)).await?;
            let record = record.ok_or_else(|| TestCaseError::fail("run vanished"))?;
            prop_assert_eq!(record.status, expected.status, "run {}", run);
            prop_assert_eq!(record.counts, expected.counts, "run {}", run);
            prop_assert_eq!(record.lease, expected.lease_info(), "run {}", run);
            prop_assert_eq!(&record.note, &expected.note, "run {}", run);
            let progress = store.load_progress(&run_name(run)).await?;
            prop_assert_eq!(&progress, &expected.checkpoint, "run {}", run);
        }
    }
    Ok(())
}

fn config() -> Config {
    let mut config = Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = CASES;
    }
    config
}

proptest! {
    #![proptest_config(config())]

    #[cfg(feature = "sqlite")]
    #[test]
    fn sqlite_keeps_the_rules_of_the_model(ops in proptest::collection::vec(op(), 1..MAX_OPS)) {
        block_on(run_case(sqlite, &ops))?;
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn postgres_keeps_the_rules_of_the_model(ops in proptest::collection::vec(op(), 1..MAX_OPS)) {
        // Skipped (loudly, once per case) without IDEM_TEST_POSTGRES.
        block_on(run_case(postgres, &ops))?;
    }
}
