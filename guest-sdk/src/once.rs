//! `run_once`: the typed face of the `run-once` import, and what it tells the agent.

use std::fmt::Display;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::bindings::idem::agent::once::{self, Claim, Obtained};
use crate::bindings::idem::agent::progress;
use crate::{Checkpoint, Error, Key, StepError};

/// How [`run_once`] reached its result.
///
/// ```
/// use idem_sdk::Outcome;
///
/// // Only the first two mean the side effect ran in this call.
/// let ran = |o: Outcome| matches!(o, Outcome::Executed | Outcome::Reclaimed { .. });
/// assert!(ran(Outcome::Reclaimed { attempt: 2 }));
/// assert!(!ran(Outcome::Skipped));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// This call claimed the key, ran the side effect and committed its result.
    Executed,
    /// As `Executed`, but an earlier holder of the key may have begun the side effect
    /// and died before committing: the downstream may see it twice unless it dedupes
    /// on the key (or the [`Step::token`]).
    Reclaimed {
        /// The attempt this call's claim had.
        attempt: u32,
    },
    /// The claim was in doubt and the [`InDoubt::Probe`] found that the downstream had
    /// applied the side effect: its answer was committed without running `f` again.
    Probed,
    /// The key was committed before this call: the side effect did not run again.
    Skipped,
    /// Another live holder was running the key; this call waited for its commit.
    Awaited,
}

/// What the side effect passed to [`run_once`] may know about its claim.
///
/// Pass [`key`](Step::key) or [`token`](Step::token) downstream: they let the receiver
/// dedupe a retried effect or refuse a stale holder's late write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    key: String,
    attempt: u32,
    token: u64,
    in_doubt: bool,
}

impl Step {
    /// The idempotency key being executed.
    ///
    /// ```no_run
    /// # use idem_sdk::{Key, run_once};
    /// let (echo, _) = run_once(&Key::new("k"), |step| Ok::<_, String>(step.key().to_owned()))?;
    /// assert_eq!(echo, "k");
    /// # Ok::<(), idem_sdk::Error>(())
    /// ```
    pub fn key(&self) -> &str {
        &self.key
    }

    /// 1 on the key's first execution; higher when an earlier claim was released (its
    /// side effect failed) or retaken from a holder that died.
    ///
    /// ```no_run
    /// # use idem_sdk::{Key, run_once};
    /// run_once(&Key::new("k"), |step| {
    ///     if step.attempt() > 3 {
    ///         return Err("giving up after three attempts");
    ///     }
    ///     Ok(())
    /// })?;
    /// # Ok::<(), idem_sdk::Error>(())
    /// ```
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The fencing token: strictly greater than every token handed out for this key
    /// before, so a downstream that remembers the highest token it saw can refuse a
    /// stale holder.
    ///
    /// ```no_run
    /// # use idem_sdk::{Key, run_once};
    /// run_once(&Key::new("k"), |step| {
    ///     let header = format!("Fencing-Token: {}", step.token());
    ///     Ok::<_, String>(header.len())
    /// })?;
    /// # Ok::<(), idem_sdk::Error>(())
    /// ```
    pub fn token(&self) -> u64 {
        self.token
    }

    /// True when an earlier holder may have begun this side effect and died before
    /// committing it.
    ///
    /// ```no_run
    /// # use idem_sdk::{Key, run_once};
    /// run_once(&Key::new("k"), |step| {
    ///     if step.in_doubt() {
    ///         // Ask the downstream whether it already saw `step.key()`.
    ///     }
    ///     Ok::<_, String>(())
    /// })?;
    /// # Ok::<(), idem_sdk::Error>(())
    /// ```
    pub fn in_doubt(&self) -> bool {
        self.in_doubt
    }
}

/// Runs the side effect `f` at most once per committed `key`, across instances, host
/// restarts and runs sharing the key.
///
/// If the key was already committed, `f` is not called: its stored result is decoded
/// and returned with [`Outcome::Skipped`] (or [`Outcome::Awaited`] when this call waited
/// for another live holder). Otherwise this call holds the key's claim and calls `f`:
///
/// - `Ok(value)`: `value` is stored as JSON and the key committed; the outcome is
///   [`Outcome::Executed`], or [`Outcome::Reclaimed`] when an earlier holder died
///   mid-way.
/// - `Err(e)`: the claim is released and the call fails with [`Error::Effect`]; a later
///   call (in this run or after a resume) retries under the same key, with a higher
///   [`Step::attempt`].
///
/// If the host refuses the key or the commit, the call fails with [`Error::Step`] — except
/// when the claim was taken over while `f` ran (this instance was paused past its lease)
/// and the taker committed: then the taker's result is returned, as
/// [`Outcome::Awaited`]. If
/// `f`'s value cannot be encoded to JSON, the claim is released and the call fails with
/// [`Error::Codec`]: the side effect ran, but its result could not be recorded.
///
/// ```no_run
/// use idem_sdk::{Key, Outcome, run_once};
///
/// let order = "order-17";
/// let (receipt, outcome) = run_once(&Key::shared("charge", &order)?, |step| {
///     // A real agent calls its payment API here, passing `step.key()` along.
///     Ok::<_, std::io::Error>(format!("receipt for {order} (token {})", step.token()))
/// })?;
/// if outcome == Outcome::Skipped {
///     println!("already charged: {receipt}");
/// }
/// # Ok::<(), idem_sdk::Error>(())
/// ```
pub fn run_once<T, E, F>(key: &Key, f: F) -> Result<(T, Outcome), Error>
where
    T: Serialize + DeserializeOwned,
    E: Display,
    F: FnOnce(&Step) -> Result<T, E>,
{
    run_once_with(key, InDoubt::Retry, f)
}

/// What [`run_once_with`] does when it gets a claim in doubt: an earlier holder may
/// have begun the side effect and died before committing it.
pub enum InDoubt<'a, T> {
    /// Run the side effect again under the same key (the default of [`run_once`]): a
    /// downstream that dedupes on [`Step::key`] applies it once. The claim becomes
    /// durable with the commit (one sync per step under `--sync full`); power loss
    /// before the commit may then run the effect again unflagged, under the same key and
    /// a greater token.
    Retry,
    /// At most once: do not run it again. The run stops in the `in-doubt` state, the
    /// key stays parked, and an operator settles it with `idem resolve RUN KEY
    /// --result JSON` (it happened) or `--retry` (it did not). This call does not
    /// return. The claim is durable before `f` runs, so even power loss cannot hide an
    /// effect that may have begun.
    Fail,
    /// Ask the downstream: `Ok(Some(value))` means the effect was applied and `value`
    /// is its result (committed without running `f`); `Ok(None)` means it was not, so
    /// `f` runs; `Err` releases the claim and fails the call.
    Probe(&'a dyn Fn(&Step) -> Result<Option<T>, String>),
}

/// [`run_once`] with a policy for claims in doubt.
///
/// ```no_run
/// use idem_sdk::{InDoubt, Key, run_once_with};
///
/// // A payment that must never be sent twice without a human deciding.
/// let key = Key::shared("wire", &("acct-9", 250))?;
/// let (receipt, _) = run_once_with(&key, InDoubt::Fail, |step| {
///     Ok::<_, String>(format!("wired with token {}", step.token()))
/// })?;
/// # let _: String = receipt;
/// # Ok::<(), idem_sdk::Error>(())
/// ```
pub fn run_once_with<T, E, F>(
    key: &Key,
    policy: InDoubt<'_, T>,
    f: F,
) -> Result<(T, Outcome), Error>
where
    T: Serialize + DeserializeOwned,
    E: Display,
    F: FnOnce(&Step) -> Result<T, E>,
{
    Once::new(key).in_doubt(policy).run(f)
}

/// A durable step, configured before it runs: the key, the in-doubt policy, and
/// optionally the checkpoint to save with its commit.
///
/// [`Once::run_and_save`] is the fast path of the classic loop: the result and the next
/// checkpoint are written in ONE host transaction, where [`run_once`] followed by
/// [`save`](crate::save) takes two.
///
/// ```no_run
/// use idem_sdk::{Checkpoint, InDoubt, Key, Once};
///
/// let items = ["a", "b"];
/// let mut total = 0_u64;
/// for (i, item) in items.iter().enumerate() {
///     let (len, _) = Once::new(&Key::for_run("measure", item)?)
///         .in_doubt(InDoubt::Retry)
///         .run_and_save(
///             |_step| Ok::<_, String>(item.len() as u64),
///             |len| Checkpoint { step: i as u64 + 1, state: total + len },
///         )?;
///     total += len;
/// }
/// # Ok::<(), idem_sdk::Error>(())
/// ```
pub struct Once<'a, T> {
    key: &'a Key,
    policy: InDoubt<'a, T>,
    rate: Option<&'a str>,
}

/// A checkpoint to save with a step's commit, computed from the step's value.
type ThenSave<'a, T> = Box<dyn FnOnce(&T) -> Result<(u64, Vec<u8>), Error> + 'a>;

impl<'a, T: Serialize + DeserializeOwned> Once<'a, T> {
    /// A step on `key` with the default policy, [`InDoubt::Retry`].
    pub fn new(key: &'a Key) -> Self {
        Once {
            key,
            policy: InDoubt::Retry,
            rate: None,
        }
    }

    /// Names the step's rate class: the step takes a token of the class with its claim
    /// (as [`take_token`](crate::take_token) takes one), waiting for one holding no
    /// instance while the class is over its limit. A step whose token was taken before
    /// (the run resumed) takes no other.
    ///
    /// ```no_run
    /// use idem_sdk::{Key, Once};
    /// let key = Key::new("summarise/doc-17");
    /// let (summary, _) = Once::new(&key)
    ///     .rate("llm")
    ///     .run(|_step| Ok::<_, String>("a summary".to_string()))?;
    /// # let _: String = summary;
    /// # Ok::<(), idem_sdk::Error>(())
    /// ```
    pub fn rate(mut self, class: &'a str) -> Self {
        self.rate = Some(class);
        self
    }

    /// Sets what happens when the claim is in doubt.
    pub fn in_doubt(mut self, policy: InDoubt<'a, T>) -> Self {
        self.policy = policy;
        self
    }

    /// Runs the step, as [`run_once`] does.
    pub fn run<E, F>(self, f: F) -> Result<(T, Outcome), Error>
    where
        E: Display,
        F: FnOnce(&Step) -> Result<T, E>,
    {
        self.go(f, None)
    }

    /// Runs the step and saves the checkpoint `progress` makes from its value: in the
    /// commit's own transaction when the effect runs here, or right after when the key
    /// was already committed.
    pub fn run_and_save<E, F, S, P>(self, f: F, progress: P) -> Result<(T, Outcome), Error>
    where
        E: Display,
        F: FnOnce(&Step) -> Result<T, E>,
        S: Serialize,
        P: FnOnce(&T) -> Checkpoint<S> + 'a,
    {
        let then: ThenSave<'a, T> = Box::new(move |value: &T| {
            let checkpoint = progress(value);
            let state = serde_json::to_vec(&checkpoint.state)
                .map_err(|err| Error::codec("checkpoint state", err))?;
            Ok((checkpoint.step, state))
        });
        self.go(f, Some(then))
    }

    fn go<E, F>(self, f: F, then: Option<ThenSave<'a, T>>) -> Result<(T, Outcome), Error>
    where
        E: Display,
        F: FnOnce(&Step) -> Result<T, E>,
    {
        let key = self.key;
        // A step that retries in doubt needs its claim durable only with its commit (one
        // sync per step); one that stops or probes in doubt needs it durable before the
        // effect, or a crash of the machine could hide that the effect began.
        let durability = match self.policy {
            InDoubt::Retry => once::Durability::WithCommit,
            InDoubt::Fail | InDoubt::Probe(_) => once::Durability::BeforeEffect,
        };
        let first = match self.rate {
            // The token and the claim in one host call (one store transaction).
            Some(class) => {
                once::run_once_rated(key.as_str(), key.fingerprint(), durability, class)?
            }
            None => once::run_once_with(key.as_str(), key.fingerprint(), durability)?,
        };
        let (value, outcome, then) = match first {
            once::Outcome::Committed(committed) => {
                let (value, outcome) = decode(key, committed)?;
                (value, outcome, then)
            }
            once::Outcome::Claimed(claim) => match execute(key, claim, self.policy, f, then) {
                Ok((value, outcome)) => (value, outcome, None),
                // The claim was taken over while `f` ran (this instance was paused past
                // its lease): the taker's commit is the key's result, so hand that back.
                Err(Failed::Lost(lost, then)) => {
                    match once::run_once_with(key.as_str(), key.fingerprint(), durability)? {
                        once::Outcome::Committed(committed) => {
                            let (value, _) = decode(key, committed)?;
                            (value, Outcome::Awaited, then)
                        }
                        // The taker released it instead; `f` is spent, so the caller decides.
                        once::Outcome::Claimed(claim) => {
                            Claim::release(claim);
                            return Err(Error::Step(StepError::ClaimLost(lost)));
                        }
                    }
                }
                Err(Failed::Other(err)) => return Err(err),
            },
        };
        // Not folded into a commit (the key was committed elsewhere): save on its own.
        if let Some(then) = then {
            let (step, state) = then(&value)?;
            progress::save(step, &state)?;
        }
        Ok((value, outcome))
    }
}

/// Why [`execute`] did not commit.
enum Failed<'a, T> {
    /// The claim was lost before the commit; the checkpoint was not saved.
    Lost(String, Option<ThenSave<'a, T>>),
    /// Anything else, already settled.
    Other(Error),
}

impl<T> From<Error> for Failed<'_, T> {
    fn from(err: Error) -> Self {
        Failed::Other(err)
    }
}

/// The [`Outcome`] of a result another call committed.
pub(crate) fn obtained(obtained: Obtained) -> Outcome {
    match obtained {
        Obtained::Skipped => Outcome::Skipped,
        Obtained::Awaited => Outcome::Awaited,
    }
}

/// What the side effect may know about `claim`.
pub(crate) fn step_of(claim: &Claim) -> Step {
    Step {
        key: claim.key(),
        attempt: claim.attempt(),
        token: claim.token(),
        in_doubt: claim.in_doubt(),
    }
}

pub(crate) fn decode<T: DeserializeOwned>(
    key: &Key,
    committed: once::Committed,
) -> Result<(T, Outcome), Error> {
    let value = serde_json::from_slice(&committed.value)
        .map_err(|err| Error::codec(&format!("committed result of {key}"), err))?;
    let outcome = match committed.obtained {
        Obtained::Skipped => Outcome::Skipped,
        Obtained::Awaited => Outcome::Awaited,
    };
    Ok((value, outcome))
}

/// Runs `f` under `claim` and settles the claim: commit on success (with the
/// checkpoint `then` makes, in the same transaction), release otherwise.
/// The claim is moved into exactly one of `commit`/`release`/`stop` on every path. A
/// panic in `f` traps the instance: the claim is left to the host, which retakes it in
/// doubt.
fn execute<'a, T, E, F>(
    key: &Key,
    claim: Claim,
    policy: InDoubt<'_, T>,
    f: F,
    then: Option<ThenSave<'a, T>>,
) -> Result<(T, Outcome), Failed<'a, T>>
where
    T: Serialize,
    E: Display,
    F: FnOnce(&Step) -> Result<T, E>,
{
    let step = Step {
        key: claim.key(),
        attempt: claim.attempt(),
        token: claim.token(),
        in_doubt: claim.in_doubt(),
    };
    let mut probed = None;
    if step.in_doubt {
        match policy {
            InDoubt::Retry => {}
            InDoubt::Fail => {
                Claim::stop(
                    claim,
                    &format!("attempt {} of {key} may have run already", step.attempt - 1),
                );
                // The host ends the instance inside `stop`; reaching this line means a
                // host that does not implement it.
                return Err(Error::Agent(format!(
                    "the host did not stop the run in doubt at {key}"
                ))
                .into());
            }
            InDoubt::Probe(probe) => match probe(&step) {
                Ok(found) => probed = found,
                Err(err) => {
                    Claim::release(claim);
                    return Err(Error::Effect(format!("probe: {err}")).into());
                }
            },
        }
    }
    let (value, applied) = match probed {
        Some(value) => (value, true),
        None => match f(&step) {
            Ok(value) => (value, false),
            Err(err) => {
                Claim::release(claim);
                return Err(Error::Effect(err.to_string()).into());
            }
        },
    };
    let bytes = match serde_json::to_vec(&value) {
        Ok(bytes) => bytes,
        Err(err) => {
            Claim::release(claim);
            return Err(Error::codec(&format!("result of {key}"), err).into());
        }
    };
    let (checkpoint, then) = match then {
        None => (None, None),
        Some(then) => match then(&value) {
            Ok((step, state)) => (Some(once::Checkpoint { step, state }), None),
            Err(err) => {
                Claim::release(claim);
                return Err(err.into());
            }
        },
    };
    match Claim::commit(claim, &bytes, checkpoint.as_ref()) {
        Ok(()) => {}
        Err(StepError::ClaimLost(lost)) => return Err(Failed::Lost(lost, then)),
        Err(err) => return Err(Error::Step(err).into()),
    }
    let outcome = if applied {
        Outcome::Probed
    } else if step.in_doubt {
        Outcome::Reclaimed {
            attempt: step.attempt,
        }
    } else {
        Outcome::Executed
    };
    Ok((value, outcome))
}
