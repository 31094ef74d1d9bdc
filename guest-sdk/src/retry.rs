//! Step retries: [`run_once_retry`] runs a side effect under a key until it succeeds,
//! waiting between attempts with a durable sleep (the run holds no instance while it
//! backs off), and commits the last error as the step's result once the attempts are
//! spent or the error is permanent, so that a replay never retries it again.

use std::fmt::Display;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::bindings::idem::agent::once::{self, Claim};
use crate::{Error, Key, Outcome, Step, StepError};

/// How [`run_once_retry`] retries a failing side effect.
///
/// The wait before attempt `n + 1` is `initial_delay × multiplierⁿ⁻¹`, at most
/// `max_delay`; with `jitter`, a random point between half of it and all of it (so that
/// many runs failing together do not retry together). The defaults: 5 attempts, 1 s
/// doubling up to 5 minutes, with jitter.
///
/// ```
/// use std::time::Duration;
/// use idem_sdk::RetryPolicy;
///
/// let policy = RetryPolicy { jitter: false, ..RetryPolicy::default() };
/// assert_eq!(policy.max_attempts, 5);
/// assert_eq!(policy.delay(1, 0), Duration::from_secs(1));
/// assert_eq!(policy.delay(3, 0), Duration::from_secs(4));
/// assert_eq!(policy.delay(30, 0), Duration::from_secs(300));
/// let jittered = RetryPolicy::default().delay(3, 12345);
/// assert!(jittered >= Duration::from_secs(2) && jittered <= Duration::from_secs(4));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (at least 1).
    pub max_attempts: u32,
    /// The wait after the first failed attempt.
    pub initial_delay: Duration,
    /// How much each wait grows over the one before.
    pub multiplier: u32,
    /// The longest wait.
    pub max_delay: Duration,
    /// Randomise each wait between half of it and all of it.
    pub jitter: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            initial_delay: Duration::from_secs(1),
            multiplier: 2,
            max_delay: Duration::from_secs(300),
            jitter: true,
        }
    }
}

impl RetryPolicy {
    /// The wait after failed attempt `attempt` (1-based), `random` choosing the jitter.
    pub fn delay(&self, attempt: u32, random: u64) -> Duration {
        let mut delay = self.initial_delay;
        for _ in 1..attempt {
            delay = delay.saturating_mul(self.multiplier.max(1));
            if delay >= self.max_delay {
                break;
            }
        }
        let delay = delay.min(self.max_delay);
        if !self.jitter {
            return delay;
        }
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        let half = ms / 2;
        Duration::from_millis(half + random % (ms - half + 1))
    }
}

/// Why an attempt failed: worth retrying, or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure<E> {
    /// Retried while attempts remain (a timeout, a 503).
    Transient(E),
    /// Committed at once as the step's result (a refused card, a 400).
    Permanent(E),
}

impl<E> From<E> for Failure<E> {
    /// Errors are transient unless marked [`Failure::Permanent`]: `?` retries.
    fn from(err: E) -> Self {
        Failure::Transient(err)
    }
}

/// What a retried step commits: its value, or the error that ended its attempts.
#[derive(Serialize, Deserialize)]
enum Settled<T> {
    Ok(T),
    Err(String),
}

/// Runs `f` once per attempt under `key` until it succeeds, as [`run_once`](crate::run_once)
/// runs it once, retrying as `policy` says:
///
/// - `Ok(value)`: committed, as `run_once` does;
/// - `Err(Failure::Transient(e))` with attempts left: the claim is released and the run
///   sleeps durably ([`sleep`](crate::sleep), under a key derived from `key` and the
///   attempt) for the policy's delay, holding no instance; it then claims the key again,
///   with the next [`Step::attempt`] (attempts count in the store, across instances);
/// - `Err(Failure::Permanent(e))`, or a transient one on the last attempt: `e` is
///   committed as the step's result and the call fails with [`Error::Effect`]; every
///   later call (a replay, another run sharing the key) fails the same way without
///   running `f`.
///
/// A key committed by `run_once_retry` must only be run with `run_once_retry`: its
/// stored result records success or failure.
///
/// ```no_run
/// use idem_sdk::{Failure, Key, RetryPolicy, run_once_retry};
///
/// let (receipt, _) = run_once_retry(&Key::for_run("charge", &"order-17")?,
///     &RetryPolicy::default(), |step| {
///         // A real agent calls its payment API here.
///         match step.attempt() {
///             1 => Err(Failure::Transient("503 from the payment API")),
///             _ if false => Err(Failure::Permanent("card refused")),
///             _ => Ok(format!("receipt {}", step.key())),
///         }
///     })?;
/// # Ok::<(), idem_sdk::Error>(())
/// ```
pub fn run_once_retry<T, E, F>(
    key: &Key,
    policy: &RetryPolicy,
    mut f: F,
) -> Result<(T, Outcome), Error>
where
    T: Serialize + DeserializeOwned,
    E: Display,
    F: FnMut(&Step) -> Result<T, Failure<E>>,
{
    loop {
        let claim = match once::run_once(key.as_str(), key.fingerprint())? {
            once::Outcome::Committed(committed) => {
                let settled: Settled<T> = serde_json::from_slice(&committed.value)
                    .map_err(|err| Error::codec(&format!("committed result of {key}"), err))?;
                return match settled {
                    Settled::Ok(value) => Ok((value, crate::once::obtained(committed.obtained))),
                    Settled::Err(message) => Err(Error::Effect(message)),
                };
            }
            once::Outcome::Claimed(claim) => claim,
        };
        let step = crate::once::step_of(&claim);
        let (settled, message) = match f(&step) {
            Ok(value) => (Settled::Ok(value), None),
            Err(Failure::Transient(err)) if step.attempt() < policy.max_attempts.max(1) => {
                Claim::release(claim);
                let delay = policy.delay(step.attempt(), random());
                // Kept in the run's log (`idem logs`): why the step is waiting.
                eprintln!(
                    "attempt {} of {key} failed: {err}; retrying in {} ms",
                    step.attempt(),
                    delay.as_millis()
                );
                crate::sleep(&backoff_key(key, step.attempt()), delay)?;
                continue;
            }
            Err(Failure::Transient(err)) => {
                let message = format!("{err} (gave up after attempt {})", step.attempt());
                (Settled::Err(message.clone()), Some(message))
            }
            Err(Failure::Permanent(err)) => {
                let message = format!("{err} (permanent, at attempt {})", step.attempt());
                (Settled::Err(message.clone()), Some(message))
            }
        };
        let bytes = match serde_json::to_vec(&settled) {
            Ok(bytes) => bytes,
            Err(err) => {
                Claim::release(claim);
                return Err(Error::codec(&format!("result of {key}"), err));
            }
        };
        match Claim::commit(claim, &bytes, None) {
            Ok(()) => {}
            // Taken over while `f` ran: whatever the taker committed is the answer.
            Err(StepError::ClaimLost(_)) => continue,
            Err(err) => return Err(Error::Step(err)),
        }
        if let Some(message) = message {
            return Err(Error::Effect(message));
        }
        let Settled::Ok(value) = settled else {
            return Err(Error::Agent(format!("the result of {key} was lost")));
        };
        let outcome = if step.in_doubt() {
            Outcome::Reclaimed {
                attempt: step.attempt(),
            }
        } else {
            Outcome::Executed
        };
        return Ok((value, outcome));
    }
}

/// The key of the sleep after failed attempt `attempt` of `key`: derived from both,
/// so a replay finds the same sleep, and short whatever the key's length.
pub(crate) fn backoff_key(key: &Key, attempt: u32) -> String {
    // FNV-1a: stable across builds and platforms, unlike std's hasher.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.as_str().bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("retry-{hash:016x}-{attempt}")
}

/// A random number for the jitter (from WASI's random source, through std's hasher
/// keys); recorded with the sleep, so a replay need not draw the same.
pub(crate) fn random() -> u64 {
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}
