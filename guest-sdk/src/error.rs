//! The SDK's one error type, and the readable text of the WIT `step-error`.

use crate::LiveError;
use crate::llm::UsageError;
use crate::{JoinError, SpawnError, StepError, WaitError};

/// Why an SDK call, or the agent itself, failed.
///
/// Agents return it from [`Agent::run`](crate::Agent::run); its `Display` text becomes
/// the `err` of the component's `run` export. Plain strings convert into
/// [`Error::Agent`], so an agent's own failures need no type of their own:
///
/// ```
/// use idem_sdk::Error;
///
/// fn check(items: &[String]) -> Result<(), Error> {
///     if items.is_empty() {
///         Err("no items to process")?;
///     }
///     Ok(())
/// }
///
/// let err = check(&[]).unwrap_err();
/// assert_eq!(err.to_string(), "no items to process");
/// assert!(matches!(err, Error::Agent(_)));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A durable call (`run-once`, `commit`, `save`) was refused by the host.
    #[error("{}", step_error_text(.0))]
    Step(StepError),
    /// A durable wait ([`sleep`](crate::sleep), [`wait_for_signal`](crate::wait_for_signal))
    /// was refused by the host.
    #[error("{}", wait_error_text(.0))]
    Wait(WaitError),
    /// A [`spawn`](crate::spawn) was refused by the host.
    #[error("{}", spawn_error_text(.0))]
    Spawn(SpawnError),
    /// A join ([`join_all`](crate::join_all), ...) was refused by the host.
    #[error("{}", join_error_text(.0))]
    Join(JoinError),
    /// [`wait_for_signal`](crate::wait_for_signal) timed out before the signal (named
    /// here) came.
    #[error("timed out waiting for signal {0:?}")]
    TimedOut(String),
    /// A join timed out before its children ended; carries the join's key.
    #[error("timed out joining children under key {0:?}")]
    JoinTimedOut(String),
    /// The side effect passed to [`run_once`](crate::run_once) failed; its claim was
    /// released, so running the agent again retries it under the same key.
    #[error("side effect failed: {0}")]
    Effect(String),
    /// A value could not be encoded to, or decoded from, JSON.
    #[error("JSON: {0}")]
    Codec(String),
    /// An outbound HTTP request ([`http`](crate::http)) could not be made or was
    /// denied by the host; a response with an error status is not this.
    #[error("{0}")]
    Http(String),
    /// The host refused to record a model call's usage
    /// ([`llm::record_usage`](crate::llm::record_usage)).
    #[error("{}", usage_error_text(.0))]
    Usage(UsageError),
    /// The host refused text published to the run's live stream
    /// ([`publish`](crate::publish)).
    #[error("{}", live_error_text(.0))]
    Live(LiveError),
    /// A model call of [`llm`](crate::llm) failed.
    #[error("{0}")]
    Llm(#[from] crate::llm::LlmError),
    /// The agent's own failure.
    #[error("{0}")]
    Agent(String),
    /// An I/O operation of the agent failed (a file it opened, say). Converted from
    /// [`std::io::Error`], so that agents can use `?` on file operations.
    #[error("{0}")]
    Io(String),
}

/// What an agent that cannot find a file should know: the error's numbers are WASI's
/// (`os error 44` is ENOENT), and it only sees what the host granted it.
const NOT_FOUND_HINT: &str = "an agent sees only the directories the host granted it, under \
                              the paths it granted them as; any other file does not exist \
                              for it";

impl From<std::io::Error> for Error {
    /// Keeps the error's text; for a file not found, adds why that often happens to an
    /// agent.
    ///
    /// ```
    /// use std::io::{Error as IoError, ErrorKind};
    ///
    /// let err = idem_sdk::Error::from(IoError::new(ErrorKind::NotFound, "/etc/app.toml"));
    /// assert!(err.to_string().starts_with("/etc/app.toml ("));
    /// assert!(err.to_string().contains("directories the host granted"));
    /// ```
    fn from(err: std::io::Error) -> Self {
        match err.kind() {
            std::io::ErrorKind::NotFound => Error::Io(format!("{err} ({NOT_FOUND_HINT})")),
            _ => Error::Io(err.to_string()),
        }
    }
}

impl From<StepError> for Error {
    fn from(err: StepError) -> Self {
        Error::Step(err)
    }
}

impl From<WaitError> for Error {
    fn from(err: WaitError) -> Self {
        Error::Wait(err)
    }
}

impl From<SpawnError> for Error {
    fn from(err: SpawnError) -> Self {
        Error::Spawn(err)
    }
}

impl From<UsageError> for Error {
    fn from(err: UsageError) -> Self {
        Error::Usage(err)
    }
}

impl From<LiveError> for Error {
    fn from(err: LiveError) -> Self {
        Error::Live(err)
    }
}

impl From<JoinError> for Error {
    fn from(err: JoinError) -> Self {
        Error::Join(err)
    }
}

impl From<String> for Error {
    fn from(text: String) -> Self {
        Error::Agent(text)
    }
}

impl From<&str> for Error {
    fn from(text: &str) -> Self {
        Error::Agent(text.to_owned())
    }
}

impl Error {
    /// Wraps a `serde_json` failure with what was being coded, so the run's error says
    /// which value was at fault.
    pub(crate) fn codec(what: &str, err: serde_json::Error) -> Self {
        Error::Codec(format!("{what}: {err}"))
    }
}

// The generated `Display` of `StepError` is its `Debug` form; agents and the host's
// `status` output deserve a sentence.
fn step_error_text(err: &StepError) -> String {
    match err {
        StepError::InvalidKey(reason) => format!("invalid key: {reason}"),
        StepError::TooLarge(detail) => format!("too large: {detail}"),
        StepError::ClaimLost(key) => format!("claim lost: {key}"),
        StepError::AwaitTimeout(key) => format!("await timeout: {key}"),
        StepError::InDoubt(key) => format!("in doubt, waiting for idem resolve: {key}"),
        StepError::KeyReused(detail) => format!("key reused with other input: {detail}"),
    }
}

fn wait_error_text(err: &WaitError) -> String {
    match err {
        WaitError::InvalidKey(reason) => format!("invalid wait: {reason}"),
        WaitError::InvalidTime(reason) => format!("invalid wait time: {reason}"),
        WaitError::KeyReused(detail) => format!("wait key reused: {detail}"),
        WaitError::ClaimsHeld(detail) => format!("cannot wait while holding claims: {detail}"),
    }
}

fn spawn_error_text(err: &SpawnError) -> String {
    match err {
        SpawnError::InvalidKey(reason) => format!("invalid spawn key: {reason}"),
        SpawnError::UnknownDeployment(detail)
        | SpawnError::KeyReused(detail)
        | SpawnError::TooLarge(detail)
        | SpawnError::Limit(detail)
        | SpawnError::Cycle(detail) => format!("spawn refused: {detail}"),
    }
}

fn usage_error_text(err: &UsageError) -> String {
    match err {
        UsageError::UnknownStep(key) => {
            format!("usage refused: key {key:?} is not a step this run committed")
        }
        UsageError::Invalid(reason) => format!("usage refused: {reason}"),
    }
}

fn live_error_text(err: &LiveError) -> String {
    match err {
        LiveError::InvalidKey(reason) => format!("publish refused: invalid key: {reason}"),
        LiveError::TooLarge(bound) => {
            format!("publish refused: the text is over the host's bound of {bound} bytes")
        }
    }
}

fn join_error_text(err: &JoinError) -> String {
    match err {
        JoinError::InvalidKey(reason) => format!("invalid join key: {reason}"),
        JoinError::NotAChild(run) => {
            format!("join refused: run {run:?} is not a child of this run")
        }
        JoinError::InvalidChildren(detail)
        | JoinError::KeyReused(detail)
        | JoinError::InvalidTime(detail) => format!("join refused: {detail}"),
        JoinError::ClaimsHeld(detail) => format!("cannot join while holding claims: {detail}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_errors_read_as_sentences() {
        let cases = [
            (StepError::InvalidKey("empty".into()), "invalid key: empty"),
            (
                StepError::TooLarge("limit 10, got 11".into()),
                "too large: limit 10, got 11",
            ),
            (StepError::ClaimLost("k".into()), "claim lost: k"),
            (StepError::AwaitTimeout("k".into()), "await timeout: k"),
            (
                StepError::InDoubt("k".into()),
                "in doubt, waiting for idem resolve: k",
            ),
        ];
        for (err, text) in cases {
            assert_eq!(Error::from(err).to_string(), text);
        }
    }

    #[test]
    fn io_errors_keep_their_text_and_explain_a_missing_file() {
        let denied = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "no");
        assert!(matches!(Error::from(denied), Error::Io(t) if t == "no"));
        let missing = Error::from(std::io::Error::from(std::io::ErrorKind::NotFound));
        assert!(missing.to_string().contains(NOT_FOUND_HINT), "{missing}");
    }

    #[test]
    fn strings_become_agent_errors() {
        assert!(matches!(Error::from("x"), Error::Agent(t) if t == "x"));
        assert!(matches!(Error::from(String::from("y")), Error::Agent(t) if t == "y"));
    }
}
