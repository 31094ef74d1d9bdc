//! `run_once_all`: several steps claimed together, their side effects in flight at
//! once (the face of the `run-once-many` import).

use std::fmt::Display;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::bindings::idem::agent::once::{self, Claim};
use crate::once::{decode, step_of};
use crate::{Error, Key, Outcome, Step, StepError};

/// Runs the side effects of several steps together, each at most once per committed
/// key, and returns each step's value and [`Outcome`] in the order of `keys`.
///
/// The keys are claimed in one call (all or none: a key refused fails the call and
/// holds nothing). Keys already committed are not run again: their stored values are
/// returned. `f` is called once with the [`Step`]s still to execute (in the order of
/// `keys`) and returns one result per step, in the same order; it is where the effects
/// run concurrently, for example with [`http::send_all`](crate::http::send_all), whose
/// requests each carry their own step's key and token ([`Request::under`]). Each `Ok`
/// is committed under its own key; each `Err` releases its claim, and the call then
/// fails with [`Error::Effect`] naming the first such step — the others stay committed,
/// so running the agent again runs only the failed ones.
///
/// After a crash, keys committed are skipped, keys whose effects were in flight are
/// retaken in doubt ([`Outcome::Reclaimed`], same key, greater token), and keys never
/// claimed run normally. Steps in doubt are run again (the policy of
/// [`InDoubt::Retry`](crate::InDoubt::Retry)): the downstream dedupes on the key.
/// The host limits the claims one instance holds at once (64 by default): more keys
/// than that fail with [`StepError::TooLarge`], claiming nothing.
///
/// [`Request::under`]: crate::http::Request::under
///
/// ```no_run
/// use idem_sdk::{Key, http::{Request, send_all}, run_once_all};
///
/// let tools = ["weather", "calendar", "search"];
/// let keys = tools
///     .iter()
///     .map(|t| Key::for_run("tool", t))
///     .collect::<Result<Vec<_>, _>>()?;
/// let answers = run_once_all(&keys, |steps| {
///     // Only the steps not yet committed; each request goes under its own claim.
///     let requests = steps.iter().map(|step| {
///         let tool = step.key().rsplit('/').next().unwrap_or_default();
///         Request::post(&format!("http://127.0.0.1:8080/{tool}")).under(step)
///     });
///     send_all(requests)
///         .into_iter()
///         .map(|r| r.map(|response| response.status))
///         .collect()
/// })?;
/// for (status, outcome) in answers {
///     println!("{status} ({outcome:?})");
/// }
/// # Ok::<(), idem_sdk::Error>(())
/// ```
pub fn run_once_all<T, E, F>(keys: &[Key], f: F) -> Result<Vec<(T, Outcome)>, Error>
where
    T: Serialize + DeserializeOwned,
    E: Display,
    F: FnOnce(&[Step]) -> Vec<Result<T, E>>,
{
    let requests: Vec<once::StepRequest> = keys
        .iter()
        .map(|key| once::StepRequest {
            key: key.as_str().to_owned(),
            fingerprint: key.fingerprint().map(str::to_owned),
            durability: once::Durability::WithCommit,
        })
        .collect();
    let mut results: Vec<Option<(T, Outcome)>> = keys.iter().map(|_| None).collect();
    // Claims not yet settled are dropped on every early return, which releases them.
    let mut claimed = Vec::new();
    for (i, outcome) in once::run_once_many(&requests)?.into_iter().enumerate() {
        match outcome {
            once::Outcome::Committed(committed) => {
                results[i] = Some(decode(&keys[i], committed)?);
            }
            once::Outcome::Claimed(claim) => claimed.push((i, step_of(&claim), claim)),
        }
    }
    if !claimed.is_empty() {
        settle(keys, claimed, f, &mut results)?;
    }
    results
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| Error::Agent("run_once_all: a step was left without a result".into()))
}

/// Runs `f` for the claimed steps, then commits or releases each claim by its result.
fn settle<T, E, F>(
    keys: &[Key],
    claimed: Vec<(usize, Step, Claim)>,
    f: F,
    results: &mut [Option<(T, Outcome)>],
) -> Result<(), Error>
where
    T: Serialize + DeserializeOwned,
    E: Display,
    F: FnOnce(&[Step]) -> Vec<Result<T, E>>,
{
    let steps: Vec<Step> = claimed.iter().map(|(_, step, _)| step.clone()).collect();
    let values = f(&steps);
    if values.len() != steps.len() {
        return Err(Error::Agent(format!(
            "run_once_all: the side effects returned {} results for {} steps",
            values.len(),
            steps.len()
        )));
    }
    let mut failed = None;
    for ((i, step, claim), value) in claimed.into_iter().zip(values) {
        match commit(&keys[i], &step, claim, value) {
            Ok(done) => results[i] = Some(done),
            Err(err) => {
                failed.get_or_insert(err);
            }
        }
    }
    failed.map_or(Ok(()), Err)
}

/// Settles one claim by its effect's result.
fn commit<T, E>(
    key: &Key,
    step: &Step,
    claim: Claim,
    value: Result<T, E>,
) -> Result<(T, Outcome), Error>
where
    T: Serialize + DeserializeOwned,
    E: Display,
{
    let value = match value {
        Ok(value) => value,
        Err(err) => {
            Claim::release(claim);
            return Err(Error::Effect(format!("{key}: {err}")));
        }
    };
    let bytes = match serde_json::to_vec(&value) {
        Ok(bytes) => bytes,
        Err(err) => {
            Claim::release(claim);
            return Err(Error::codec(&format!("result of {key}"), err));
        }
    };
    match Claim::commit(claim, &bytes, None) {
        Ok(()) => {}
        // Taken over while the effect ran (this instance was paused past its lease): the
        // taker's commit is the key's result.
        Err(StepError::ClaimLost(lost)) => {
            return match once::run_once_with(
                key.as_str(),
                key.fingerprint(),
                once::Durability::WithCommit,
            )? {
                once::Outcome::Committed(committed) => {
                    Ok((decode(key, committed)?.0, Outcome::Awaited))
                }
                once::Outcome::Claimed(claim) => {
                    Claim::release(claim);
                    Err(Error::Step(StepError::ClaimLost(lost)))
                }
            };
        }
        Err(err) => return Err(Error::Step(err)),
    }
    let outcome = if step.in_doubt() {
        Outcome::Reclaimed {
            attempt: step.attempt(),
        }
    } else {
        Outcome::Executed
    };
    Ok((value, outcome))
}
