//! A model-based property test of the store: random sequences of claims, takeovers,
//! commits, releases, renewals, parks, resolutions, crashes, lease expiries and reopened
//! handles, from several holders on two handles of one real SQLite file, checked step by
//! step against a small in-memory model of the rules in `store/mod.rs`.
//!
//! The model predicts every answer exactly (tokens included: the store hands them out
//! one by one from a single counter) and the whole visible state after every step.
//! Independently of the model, the test also checks the rules themselves: at most one
//! commit per key and a committed value that never changes or disappears, strictly
//! increasing tokens, and attempts that grow by one per grant.
//!
//! `PROPTEST_CASES=N` runs more cases than the suite's [`CASES`].

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::Config;

use super::{
    Checkpoint, ClaimOutcome, ClaimRequest, Counts, Grant, HeldClaim, Millis, OpenClaim,
    Resolution, RunSpec, RunStatus, SqliteStore, Store, StoreError, SyncMode,
};

/// Cases in the normal suite: a few seconds on a small machine.
const CASES: u32 = 64;
/// Keys, holders and operations per case: few keys, so that holders collide.
const KEYS: usize = 3;
const HOLDERS: usize = 3;
const MAX_OPS: usize = 80;
const LEASE_MS: Millis = 1_000;
const LEASE: Duration = Duration::from_millis(LEASE_MS as u64);
const T0: Millis = 1_700_000_000_000;

/// Which token an operation presents.
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
    /// `commit`, or with `save`, `commit_and_save` of the holder's run.
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
    /// The holder's process dies: it forgets its claims and comes back as a new holder.
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

/// A key's claim, as the rules say it stands.
#[derive(Debug, Clone)]
struct ClaimModel {
    run: String,
    holder: Option<String>,
    token: u64,
    attempt: u32,
    lease_expires: Millis,
    parked: Option<String>,
}

/// A run's record, as far as the operations here change it.
#[derive(Debug, Clone)]
struct RunModel {
    status: RunStatus,
    counts: Counts,
    checkpoint: Option<Checkpoint>,
}

/// The store as the rules in `store/mod.rs` describe it, plus what each holder knows.
struct Model {
    now: Millis,
    last_token: u64,
    committed: Vec<Option<Vec<u8>>>,
    claims: Vec<Option<ClaimModel>>,
    runs: Vec<RunModel>,
    /// The token each holder was last granted per key; forgotten in a crash.
    held: Vec<Vec<Option<u64>>>,
    /// Bumped by a crash: the holder comes back under a new identity.
    incarnation: Vec<u32>,
}

impl Model {
    fn new() -> Model {
        Model {
            now: T0,
            last_token: 0,
            committed: vec![None; KEYS],
            claims: vec![None; KEYS],
            runs: vec![
                RunModel {
                    status: RunStatus::Running,
                    counts: Counts::default(),
                    checkpoint: None,
                };
                HOLDERS
            ],
            held: vec![vec![None; KEYS]; HOLDERS],
            incarnation: vec![0; HOLDERS],
        }
    }

    fn holder_name(&self, holder: usize) -> String {
        format!("h{holder}.{}", self.incarnation[holder])
    }

    fn token(&self, holder: usize, key: usize, pick: TokenPick) -> u64 {
        match pick {
            TokenPick::Own => self.held[holder][key].unwrap_or(0),
            TokenPick::Current => self.claims[key].as_ref().map_or(0, |c| c.token),
            TokenPick::Guess(token) => token,
        }
    }

    /// The live claim `token` holds on `key`, if it holds one: not released, not
    /// parked, not replaced by a later grant. Expiry alone does not end a holding.
    fn holding(&mut self, key: usize, token: u64) -> Option<&mut ClaimModel> {
        self.claims[key]
            .as_mut()
            .filter(|c| c.token == token && c.holder.is_some())
    }

    /// `claim`, or with `stale`, `take_over`.
    fn claim(&mut self, holder: usize, key: usize, stale: Option<u64>) -> ClaimOutcome {
        if let Some(value) = &self.committed[key] {
            return ClaimOutcome::Committed(value.clone());
        }
        let (attempt, in_doubt) = match &self.claims[key] {
            None => (1, false),
            Some(c) => match (&c.parked, &c.holder) {
                (Some(reason), _) => {
                    return ClaimOutcome::Parked {
                        run_id: c.run.clone(),
                        reason: reason.clone(),
                    };
                }
                (None, None) => (c.attempt + 1, false),
                (None, Some(_)) if c.lease_expires <= self.now || stale == Some(c.token) => {
                    (c.attempt + 1, true)
                }
                (None, Some(other)) => {
                    return ClaimOutcome::Held(HeldClaim {
                        holder: other.clone(),
                        token: c.token,
                        lease_expires: c.lease_expires,
                    });
                }
            },
        };
        self.last_token += 1;
        let token = self.last_token;
        self.claims[key] = Some(ClaimModel {
            run: run_name(holder),
            holder: Some(self.holder_name(holder)),
            token,
            attempt,
            lease_expires: self.now + LEASE_MS,
            parked: None,
        });
        self.held[holder][key] = Some(token);
        let counts = &mut self.runs[holder].counts;
        counts.executed += 1;
        counts.reclaimed += u64::from(in_doubt);
        ClaimOutcome::Granted(Grant {
            token,
            attempt,
            in_doubt,
        })
    }

    fn commit(&mut self, key: usize, token: u64, value: Vec<u8>) -> bool {
        if self.holding(key, token).is_none() {
            return false;
        }
        self.claims[key] = None;
        self.committed[key] = Some(value);
        true
    }

    fn release(&mut self, key: usize, token: u64) -> bool {
        match self.holding(key, token) {
            Some(claim) => {
                claim.holder = None;
                true
            }
            None => false,
        }
    }

    fn renew(&mut self, key: usize, token: u64) -> bool {
        let expires = self.now + LEASE_MS;
        match self.holding(key, token) {
            Some(claim) => {
                claim.lease_expires = expires;
                true
            }
            None => false,
        }
    }

    fn park(&mut self, key: usize, token: u64, run: usize, reason: &str) -> bool {
        match self.holding(key, token) {
            Some(claim) => {
                claim.holder = None;
                claim.parked = Some(reason.to_owned());
                self.runs[run].status = RunStatus::InDoubt;
                true
            }
            None => false,
        }
    }

    fn resolve(&mut self, run: usize, key: usize, value: Option<Vec<u8>>) -> bool {
        let run_id = run_name(run);
        let parked_by_run = |c: &ClaimModel| c.parked.is_some() && c.run == run_id;
        if !self.claims[key].as_ref().is_some_and(parked_by_run) {
            return false;
        }
        match value {
            Some(value) => {
                // A resolution is a commit of its own, under a fresh token.
                self.last_token += 1;
                self.claims[key] = None;
                self.committed[key] = Some(value);
            }
            None => {
                if let Some(claim) = self.claims[key].as_mut() {
                    claim.parked = None;
                    claim.holder = None;
                }
            }
        }
        let still_parked = self.claims.iter().flatten().any(parked_by_run);
        if self.runs[run].status == RunStatus::InDoubt && !still_parked {
            self.runs[run].status = RunStatus::Running;
        }
        true
    }

    fn open_claims(&self) -> Vec<OpenClaim> {
        self.claims
            .iter()
            .enumerate()
            .filter_map(|(key, claim)| {
                let c = claim.as_ref()?;
                Some(OpenClaim {
                    key: key_name(key),
                    run_id: c.run.clone(),
                    holder: c.holder.clone(),
                    token: c.token,
                    attempt: c.attempt,
                    lease_expires: c.lease_expires,
                    parked: c.parked.clone(),
                })
            })
            .collect()
    }
}

/// What the test saw the store do, checked against the rules without the model.
#[derive(Default)]
struct Observed {
    /// Every result the store ever reported committed, by key.
    committed: BTreeMap<usize, Vec<u8>>,
    /// Successful commits (and resolutions with a result) per key.
    commits: BTreeMap<usize, u32>,
    /// The greatest token granted so far.
    max_token: u64,
    /// The last attempt granted per key.
    attempts: BTreeMap<usize, u32>,
}

impl Observed {
    fn grant(&mut self, key: usize, grant: &Grant) -> Result<(), TestCaseError> {
        prop_assert!(
            grant.token > self.max_token,
            "token {} granted after {}",
            grant.token,
            self.max_token
        );
        self.max_token = grant.token;
        let last = self.attempts.insert(key, grant.attempt).unwrap_or(0);
        prop_assert_eq!(grant.attempt, last + 1, "attempt of key {}", key);
        Ok(())
    }

    fn commit(&mut self, key: usize) -> Result<(), TestCaseError> {
        let commits = self.commits.entry(key).or_insert(0);
        *commits += 1;
        prop_assert_eq!(*commits, 1, "key {} committed twice", key);
        Ok(())
    }
}

/// Two handles on one file: holders alternate between them, as two processes would.
struct Stores {
    dir: tempfile::TempDir,
    handles: Vec<SqliteStore>,
}

impl Stores {
    fn open(dir: tempfile::TempDir) -> Stores {
        let path = dir.path().join("idem.db");
        let handles = (0..2)
            .map(|_| SqliteStore::open(&path, SyncMode::Normal).unwrap())
            .collect();
        Stores { dir, handles }
    }

    fn of(&self, holder: usize) -> &SqliteStore {
        &self.handles[holder % self.handles.len()]
    }

    fn reopen(self) -> Stores {
        let Stores { dir, handles } = self;
        drop(handles);
        Stores::open(dir)
    }
}

fn run_case(ops: &[Op]) -> Result<(), TestCaseError> {
    let mut stores = Stores::open(tempfile::tempdir().unwrap());
    let mut model = Model::new();
    let mut seen = Observed::default();
    for run in 0..HOLDERS {
        stores.of(0).open_run(&RunSpec {
            run_id: &run_name(run),
            agent: "model",
            digest: "00",
            namespace: "model",
            input: b"",
            now: T0,
        })?;
    }

    for (step, op) in ops.iter().enumerate() {
        apply(&mut stores, &mut model, &mut seen, op)
            .map_err(|e| TestCaseError::fail(format!("step {step} {op:?}: {e}")))?;
        if matches!(op, Op::Reopen) {
            stores = stores.reopen();
        }
        check_state(&stores, &model, &mut seen)
            .map_err(|e| TestCaseError::fail(format!("after step {step} {op:?}: {e}")))?;
    }
    Ok(())
}

/// Runs one operation on the store and on the model; their answers must agree.
fn apply(
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
            let run_id = run_name(holder);
            let key_id = key_name(key);
            let req = ClaimRequest {
                key: &key_id,
                run_id: &run_id,
                holder: &name,
                fingerprint: None,
                lease: LEASE,
                now: model.now,
            };
            let store = stores.of(holder);
            let got = match stale {
                None => store.claim(&req)?,
                Some(token) => store.take_over(&req, token)?,
            };
            let expected = model.claim(holder, key, stale);
            prop_assert_eq!(&got, &expected);
            if let ClaimOutcome::Granted(grant) = &got {
                seen.grant(key, grant)?;
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
            let result = vec![value, key as u8];
            let run_id = run_name(holder);
            let checkpoint = Checkpoint {
                step: u64::from(value),
                state: vec![value; 3],
            };
            // Counts as a host would pass them: what its run has, plus something new.
            let counts = Counts {
                skipped: u64::from(value),
                ..model.runs[holder].counts
            };
            let store = stores.of(holder);
            let got = if save {
                store.commit_and_save(
                    &key_name(key),
                    token,
                    &run_id,
                    &result,
                    &checkpoint,
                    &counts,
                    model.now,
                )
            } else {
                store.commit(&key_name(key), token, &run_id, &result)
            };
            let expected = model.commit(key, token, result);
            match got {
                Ok(()) => {
                    prop_assert!(expected, "commit with token {} accepted", token);
                    seen.commit(key)?;
                    if save {
                        let run = &mut model.runs[holder];
                        run.counts = counts;
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
            let got = stores.of(holder).release(&key_name(key), token)?;
            prop_assert_eq!(got, model.release(key, token));
        }
        Op::Renew { holder, key, token } => {
            let token = model.token(holder, key, token);
            let got = stores
                .of(holder)
                .renew(&key_name(key), token, LEASE, model.now)?;
            prop_assert_eq!(got, model.renew(key, token));
        }
        Op::Park { holder, key, token } => {
            let token = model.token(holder, key, token);
            let reason = format!("parked by {}", model.holder_name(holder));
            let got = stores.of(holder).park(
                &key_name(key),
                token,
                &run_name(holder),
                &reason,
                model.now,
            );
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
                .resolve(&run_name(run), &key_name(key), resolution, model.now);
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
        Op::Crash { holder } => {
            model.held[holder] = vec![None; KEYS];
            model.incarnation[holder] += 1;
        }
        Op::Advance { ms } => model.now += ms,
        Op::Reopen => {}
    }
    Ok(())
}

/// Everything the store shows matches the model, and no committed result changed or
/// went missing.
fn check_state(stores: &Stores, model: &Model, seen: &mut Observed) -> Result<(), TestCaseError> {
    for (i, store) in stores.handles.iter().enumerate() {
        for key in 0..KEYS {
            let committed = store.committed(&key_name(key))?;
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
            store.open_claims(None)?,
            model.open_claims(),
            "handle {}",
            i
        );
        for (run, expected) in model.runs.iter().enumerate() {
            let record = store.run(&run_name(run))?;
            let record = record.ok_or_else(|| TestCaseError::fail("run vanished"))?;
            prop_assert_eq!(record.status, expected.status, "run {}", run);
            prop_assert_eq!(record.counts, expected.counts, "run {}", run);
            let progress = store.load_progress(&run_name(run))?;
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

    #[test]
    fn store_keeps_the_rules_of_the_model(ops in proptest::collection::vec(op(), 1..MAX_OPS)) {
        run_case(&ops)?;
    }
}
