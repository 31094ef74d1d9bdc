//! `run_once`: the typed face of the `run-once` import, and what it tells the agent.

use std::fmt::Display;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::bindings::idem::agent::once::{self, Claim, Obtained};
use crate::{Error, Key, StepError};

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
    /// downstream that dedupes on [`Step::key`] applies it once.
    Retry,
    /// At most once: do not run it again. The run stops in the `in-doubt` state, the
    /// key stays parked, and an operator settles it with `idem resolve RUN KEY
    /// --result JSON` (it happened) or `--retry` (it did not). This call does not
    /// return.
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
    match once::run_once(key.as_str())? {
        once::Outcome::Committed(committed) => decode(key, committed),
        once::Outcome::Claimed(claim) => match execute(key, claim, policy, f) {
            // The claim was taken over while `f` ran (this instance was paused past
            // its lease): the taker's commit is the key's result, so hand that back.
            Err(Error::Step(StepError::ClaimLost(lost))) => match once::run_once(key.as_str())? {
                once::Outcome::Committed(committed) => {
                    decode(key, committed).map(|(value, _)| (value, Outcome::Awaited))
                }
                // The taker released it instead; `f` is spent, so the caller decides.
                once::Outcome::Claimed(claim) => {
                    Claim::release(claim);
                    Err(Error::Step(StepError::ClaimLost(lost)))
                }
            },
            other => other,
        },
    }
}

fn decode<T: DeserializeOwned>(
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

/// Runs `f` under `claim` and settles the claim: commit on success, release otherwise.
/// The claim is moved into exactly one of `commit`/`release`/`stop` on every path. A
/// panic in `f` traps the instance: the claim is left to the host, which retakes it in
/// doubt.
fn execute<T, E, F>(
    key: &Key,
    claim: Claim,
    policy: InDoubt<'_, T>,
    f: F,
) -> Result<(T, Outcome), Error>
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
                )));
            }
            InDoubt::Probe(probe) => match probe(&step) {
                Ok(found) => probed = found,
                Err(err) => {
                    Claim::release(claim);
                    return Err(Error::Effect(format!("probe: {err}")));
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
                return Err(Error::Effect(err.to_string()));
            }
        },
    };
    let bytes = match serde_json::to_vec(&value) {
        Ok(bytes) => bytes,
        Err(err) => {
            Claim::release(claim);
            return Err(Error::codec(&format!("result of {key}"), err));
        }
    };
    Claim::commit(claim, &bytes)?;
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
