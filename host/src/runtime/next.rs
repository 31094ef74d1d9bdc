//! What a run does once an instance ended: one [`Next`] per [`InstanceEnd`], decided
//! from the end alone ([`Next::after`]), then applied to the store in one place (the
//! drive loop in `drive.rs`).

use super::end::{InstanceEnd, Suspend};
use super::error::HostError;
use super::limits::{LimitExceeded, Limits, cut};
use super::report::RunFailure;
use super::stop::Stop;
use crate::store::{RunEnd, RunStatus};
use crate::text;

/// What the run does after an instance ended (or before one starts).
#[derive(Debug)]
pub(crate) enum Next {
    /// The host dropped the instance on purpose: go on with a fresh one.
    Another {
        /// Why it was dropped.
        reason: String,
    },
    /// The run ended (completed, failed or cancelled): record it so.
    Finish(Ending),
    /// The agent parked a claim: the run ends in doubt at this key.
    InDoubt {
        /// The key (qualified).
        key: String,
    },
    /// The agent waits: give the run back, suspended until the wait is due.
    Suspend(Suspend),
    /// Stopped from outside to be resumed (a drain, or its timeout): give the lease
    /// back, the run unfinished.
    Release,
    /// Paused by an operator: give the lease back; the store keeps the run paused.
    Paused,
    /// The run used every instance one drive may: give it back with a note, and fail.
    GiveUp {
        /// Instances this drive created.
        instances: u64,
    },
    /// Write nothing more for the run (its lease is lost, or the store failed).
    Fail(HostError),
}

/// How a run ended, as its record and its report say.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Ending {
    /// Completed, failed or cancelled.
    pub(crate) status: RunStatus,
    /// The output when completed; the error text when failed; the reason when
    /// cancelled.
    pub(crate) outcome: Vec<u8>,
    /// Why it failed, when the host can name it.
    pub(crate) failure: Option<RunFailure>,
}

impl Ending {
    fn failed(message: String, failure: RunFailure) -> Next {
        Next::Finish(Ending {
            status: RunStatus::Failed,
            outcome: message.into_bytes(),
            failure: Some(failure),
        })
    }

    /// The end the store records.
    pub(crate) fn run_end(&self) -> RunEnd<'_> {
        match self.status {
            RunStatus::Completed => RunEnd::Completed(&self.outcome),
            RunStatus::Cancelled => RunEnd::Cancelled,
            _ => RunEnd::Failed(&self.outcome),
        }
    }
}

impl Next {
    /// What run `run_id`, held to `limits`, does after an instance ended with `end`.
    pub(crate) fn after(end: InstanceEnd, run_id: &str, limits: &Limits) -> Next {
        match end {
            InstanceEnd::Dropped(reason) => Next::Another { reason },
            InstanceEnd::Returned(output) if output.len() > limits.max_output_bytes => {
                let limit = LimitExceeded::Output {
                    size: output.len(),
                    limit: limits.max_output_bytes,
                };
                Ending::failed(limit.to_string(), RunFailure::Limit(limit))
            }
            InstanceEnd::Returned(output) => Next::Finish(Ending {
                status: RunStatus::Completed,
                outcome: output,
                failure: None,
            }),
            InstanceEnd::ClaimsLeftOpen(keys) => {
                let message = format!(
                    "the agent returned while holding claims on {}: each claim must be \
                     committed or released before run returns; the keys will be retaken \
                     in doubt",
                    keys.iter()
                        .map(|k| text::quoted(k))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                Ending::failed(message, RunFailure::ClaimsLeftOpen { keys })
            }
            InstanceEnd::AgentError(message) => Ending::failed(
                cut(&message, Limits::MAX_ERROR_BYTES),
                RunFailure::AgentError,
            ),
            InstanceEnd::Trapped(message) => Ending::failed(message, RunFailure::Trapped),
            // The run stops, resumable: committed steps stay, and driving it again (with
            // a larger limit, if the agent needs one) goes on.
            InstanceEnd::Limit(limit) => {
                Ending::failed(limit.to_string(), RunFailure::Limit(limit))
            }
            InstanceEnd::InDoubt(key) => Next::InDoubt { key },
            InstanceEnd::Suspended(suspend) => Next::Suspend(suspend),
            InstanceEnd::Stopped(Stop::Drain | Stop::Abort) => Next::Release,
            InstanceEnd::Stopped(Stop::Pause) => Next::Paused,
            InstanceEnd::Stopped(Stop::Cancel) => Next::Finish(Ending {
                status: RunStatus::Cancelled,
                outcome: b"cancelled by an operator".to_vec(),
                failure: None,
            }),
            InstanceEnd::Stopped(Stop::LeaseLost) => Next::Fail(HostError::LeaseLost {
                run_id: run_id.to_string(),
            }),
            InstanceEnd::Store(e) => Next::Fail(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn after(end: InstanceEnd) -> Next {
        let limits = Limits {
            max_output_bytes: 4,
            ..Limits::default()
        };
        Next::after(end, "r", &limits)
    }

    fn ending(next: Next) -> Ending {
        match next {
            Next::Finish(ending) => ending,
            other => panic!("not an ending: {other:?}"),
        }
    }

    #[test]
    fn an_output_over_its_limit_fails_the_run() {
        let ok = ending(after(InstanceEnd::Returned(b"1234".to_vec())));
        assert_eq!(ok.status, RunStatus::Completed);
        assert!(matches!(ok.run_end(), RunEnd::Completed(b"1234")));
        let over = ending(after(InstanceEnd::Returned(b"12345".to_vec())));
        assert_eq!(over.status, RunStatus::Failed);
        assert!(matches!(
            over.failure,
            Some(RunFailure::Limit(LimitExceeded::Output {
                size: 5,
                limit: 4
            }))
        ));
        assert!(
            matches!(over.run_end(), RunEnd::Failed(text) if String::from_utf8_lossy(text).contains("5"))
        );
    }

    #[test]
    fn stops_release_cancel_or_fail_as_they_say() {
        assert!(matches!(
            after(InstanceEnd::Stopped(Stop::Drain)),
            Next::Release
        ));
        assert!(matches!(
            after(InstanceEnd::Stopped(Stop::Abort)),
            Next::Release
        ));
        assert!(matches!(
            after(InstanceEnd::Stopped(Stop::Pause)),
            Next::Paused
        ));
        let cancelled = ending(after(InstanceEnd::Stopped(Stop::Cancel)));
        assert!(matches!(cancelled.run_end(), RunEnd::Cancelled));
        assert!(matches!(
            after(InstanceEnd::Stopped(Stop::LeaseLost)),
            Next::Fail(HostError::LeaseLost { run_id }) if run_id == "r"
        ));
    }

    #[test]
    fn a_dropped_instance_goes_on_and_claims_left_open_fail_the_run() {
        assert!(matches!(
            after(InstanceEnd::Dropped("recycle".into())),
            Next::Another { reason } if reason == "recycle"
        ));
        let open = ending(after(InstanceEnd::ClaimsLeftOpen(vec!["k".into()])));
        assert_eq!(
            open.failure,
            Some(RunFailure::ClaimsLeftOpen {
                keys: vec!["k".into()]
            })
        );
        assert!(String::from_utf8(open.outcome).unwrap().contains("\"k\""));
    }
}
