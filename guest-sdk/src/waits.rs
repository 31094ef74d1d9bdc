//! Waiting without holding anything: [`sleep`], [`sleep_until`] and
//! [`wait_for_signal`]. A wait that is not over ends the instance; the host resumes the
//! run on a fresh instance when it is due, and the agent, replaying its way back to the
//! same wait with the same key, finds it over and goes on.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::de::DeserializeOwned;

use crate::Error;
use crate::bindings::idem::agent::waits::{self, Received, Wake};

/// Sleeps for `duration`, durably: the host records the wake time under `key` the first
/// time the sleep is reached, ends the instance, and resumes the run when the time
/// comes (a worker does, or `idem run` in the foreground). Reached again after that
/// time (the resumed run replaying its way here), it returns at once.
///
/// `key` names this sleep within the run, like a [`Key`](crate::Key) names a step:
/// derive it from what the agent is doing (`"backoff-order-17"`), never from the time
/// or a counter of instances, or a resumed agent sleeps again.
///
/// Fails with [`Error::Wait`] for an invalid key, a duration over 100 years, a key used
/// by another kind of wait, or a sleep reached while holding a claim.
///
/// ```no_run
/// use std::time::Duration;
/// // Wait out a rate limit without holding an instance.
/// idem_sdk::sleep("rate-limit-batch-3", Duration::from_secs(3600))?;
/// # Ok::<(), idem_sdk::Error>(())
/// ```
pub fn sleep(key: &str, duration: Duration) -> Result<(), Error> {
    let ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    waits::sleep(key, Wake::After(ms))?;
    Ok(())
}

/// Takes a token of the rate class `class` for the step `step_key` about to run, or
/// waits for one holding no instance. The operator limits a class's steps across every
/// worker and run (`idem rate set llm --limit 60 --per 1m`); a class with no limit
/// hands its token out at once. The token is reserved when this is first reached and
/// recorded with the run, so the run resumed after a crash or a wait finds it again and
/// takes no other. [`Once::rate`](crate::Once::rate) calls it before a step's claim.
///
/// Fails with [`Error::Wait`] for an invalid key or class name, or when reached while
/// holding a claim.
///
/// ```no_run
/// idem_sdk::take_token("summarise-doc-17", "llm")?;
/// # Ok::<(), idem_sdk::Error>(())
/// ```
pub fn take_token(step_key: &str, class: &str) -> Result<(), Error> {
    waits::take_token(step_key, class)?;
    Ok(())
}

/// Sleeps until `at` on the store's clock, durably, as [`sleep`] does. A time already
/// passed returns at once; one before the Unix epoch is refused.
///
/// ```no_run
/// use std::time::{Duration, SystemTime};
/// let tomorrow = SystemTime::now() + Duration::from_secs(24 * 3600);
/// idem_sdk::sleep_until("nightly-batch-2026-12-04", tomorrow)?;
/// # Ok::<(), idem_sdk::Error>(())
/// ```
pub fn sleep_until(key: &str, at: SystemTime) -> Result<(), Error> {
    let ms = match at.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_millis()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_millis()).map_or(i64::MIN, |ms| -ms),
    };
    waits::sleep(key, Wake::At(ms))?;
    Ok(())
}

/// Receives a signal called `name` sent to this run (`idem signal RUN NAME --payload
/// JSON`), its payload decoded from JSON as `T`; waits for one, holding no instance,
/// for at most `timeout` (`None`: for ever). A signal sent before the wait is kept
/// until a wait asks for it.
///
/// The signal is taken in the transaction that records it under `key`: reached again
/// (the run resumed after a crash), the wait answers the same payload, and no other
/// wait of the run receives that signal. Fails with [`Error::TimedOut`] when the
/// timeout passed first (recorded too: a replay times out again at once), and
/// [`Error::Codec`] if the payload does not decode as `T`.
///
/// ```no_run
/// use std::time::Duration;
/// #[derive(serde::Deserialize)]
/// struct Approval { approved: bool, by: String }
///
/// match idem_sdk::wait_for_signal::<Approval>("approve-payment-17", "approval",
///                                            Some(Duration::from_secs(24 * 3600))) {
///     Ok(approval) if approval.approved => { /* pay */ }
///     Ok(_) => { /* refused */ }
///     Err(idem_sdk::Error::TimedOut(_)) => { /* nobody answered in a day */ }
///     Err(e) => return Err(e),
/// }
/// # Ok::<(), idem_sdk::Error>(())
/// ```
pub fn wait_for_signal<T: DeserializeOwned>(
    key: &str,
    name: &str,
    timeout: Option<Duration>,
) -> Result<T, Error> {
    let timeout_ms = timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX));
    match waits::wait_for_signal(key, name, timeout_ms)? {
        Received::Payload(bytes) => {
            serde_json::from_slice(&bytes).map_err(|err| Error::codec("signal payload", err))
        }
        Received::TimedOut => Err(Error::TimedOut(name.to_owned())),
    }
}
