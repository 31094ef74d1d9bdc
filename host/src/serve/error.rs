//! What the API answers when it refuses: an HTTP status and a JSON body
//! `{"error": {"code": "...", "message": "..."}}` whose `code` is stable (clients match
//! on it) and whose message says why in words.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::ops::OpError;
use crate::prove::ProveError;
use crate::runtime::{AuthorityError, HostError};
use crate::store::StoreError;

/// A refused or failed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The stable code: one of [`CODES`].
    pub code: &'static str,
    /// Why, in words.
    pub message: String,
}

/// Every code the API answers with, and the status it comes with; the OpenAPI document
/// lists them.
pub const CODES: &[(&str, u16, &str)] = &[
    ("bad_request", 400, "a parameter is missing or invalid"),
    (
        "malformed_json",
        400,
        "the body is not the JSON the route takes",
    ),
    ("not_json", 400, "a value that must be JSON is not"),
    (
        "invalid_name",
        400,
        "a run id, namespace or deployment name is invalid",
    ),
    (
        "invalid_component",
        400,
        "the body is not an idem agent component",
    ),
    (
        "authority_refused",
        400,
        "the authority asked for is invalid or wider than the deployment's",
    ),
    (
        "signal_refused",
        400,
        "the signal's name or payload is refused",
    ),
    ("ambiguous_key", 400, "the key names two parked keys"),
    (
        "flow_refused",
        400,
        "a deployment's limits are zero, absurd or inconsistent",
    ),
    (
        "rate_refused",
        400,
        "a rate limit is zero, absurd, or its class name is invalid",
    ),
    (
        "flow_key_missing",
        400,
        "the input has nothing where the deployment reads its concurrency key",
    ),
    (
        "priority_refused",
        400,
        "the priority is beyond the highest",
    ),
    ("unauthorized", 401, "the bearer token is missing or wrong"),
    ("forbidden", 403, "the request is not allowed from here"),
    ("not_found", 404, "no such route"),
    ("unknown_run", 404, "no such run"),
    ("unknown_step", 404, "the run has no such step"),
    ("unknown_schedule", 404, "no such schedule"),
    ("unknown_version", 404, "the deployment has no such version"),
    (
        "unknown_deployment",
        404,
        "no agent is deployed under that name",
    ),
    (
        "method_not_allowed",
        405,
        "the route does not take this method",
    ),
    ("input_mismatch", 409, "the run id exists with other input"),
    (
        "not_parked",
        409,
        "the key is not parked in doubt by the run",
    ),
    ("run_finished", 409, "the run is finished"),
    (
        "not_of_deployment",
        409,
        "the run is a run of another deployment",
    ),
    (
        "never_moved",
        409,
        "the run never moved to another version: nothing to roll back",
    ),
    (
        "exports_differ",
        409,
        "the run's component and the version's export different things (another agent)",
    ),
    (
        "schedule_refused",
        409,
        "the schedule's name is taken, or its spec, time zone, interval or catch-up is refused",
    ),
    (
        "namespace_taken",
        409,
        "another component owns the namespace",
    ),
    (
        "fork_refused",
        409,
        "the fork is refused: no such step, its checkpoint was collected, or the run id is taken",
    ),
    ("body_too_large", 413, "the body is over the limit"),
    (
        "unsupported_media_type",
        415,
        "the body's content type is not the route's",
    ),
    (
        "store_unavailable",
        503,
        "the store cannot be reached or is locked",
    ),
    ("internal", 500, "the server failed"),
];

impl ApiError {
    /// An error with `code` (which must be in [`CODES`]) and its status.
    pub fn new(code: &'static str, message: impl Into<String>) -> ApiError {
        let status = CODES
            .iter()
            .find(|(c, _, _)| *c == code)
            .and_then(|(_, s, _)| StatusCode::from_u16(*s).ok())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "error": { "code": self.code, "message": self.message }
        });
        (self.status, axum::Json(body)).into_response()
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        let code = match &e {
            StoreError::UnknownRun { .. } => "unknown_run",
            StoreError::UnknownStep { .. } => "unknown_step",
            StoreError::UnknownDeployment { .. } => "unknown_deployment",
            StoreError::InputMismatch { .. } => "input_mismatch",
            StoreError::NotInDoubt { .. } => "not_parked",
            StoreError::RunFinished { .. } => "run_finished",
            StoreError::UnknownVersion { .. } => "unknown_version",
            StoreError::NotOfDeployment { .. } => "not_of_deployment",
            StoreError::NeverMoved { .. } => "never_moved",
            StoreError::ExportsDiffer { .. } => "exports_differ",
            StoreError::NamespaceTaken { .. } => "namespace_taken",
            StoreError::ForkRefused { .. } => "fork_refused",
            StoreError::SignalRefused { .. } => "signal_refused",
            StoreError::UnknownSchedule { .. } => "unknown_schedule",
            StoreError::ScheduleRefused { .. } => "schedule_refused",
            StoreError::FlowRefused {
                refusal: crate::store::FlowRefusal::UnknownDeployment(_),
                ..
            } => "unknown_deployment",
            StoreError::FlowRefused { .. } => "flow_refused",
            StoreError::FlowKeyMissing { .. } => "flow_key_missing",
            StoreError::RateRefused { .. } => "rate_refused",
            StoreError::PriorityRefused { .. } => "priority_refused",
            StoreError::Database { .. } | StoreError::Open { .. } => "store_unavailable",
            _ => "internal",
        };
        ApiError::new(code, e.to_string())
    }
}

impl From<HostError> for ApiError {
    fn from(e: HostError) -> ApiError {
        let e = match e {
            HostError::Store(inner) => return ApiError::from(inner),
            other => other,
        };
        let code = match &e {
            HostError::UnknownDeployment { .. } => "unknown_deployment",
            HostError::InvalidRunId { .. } | HostError::InvalidNamespace { .. } => "invalid_name",
            HostError::Authority(
                AuthorityError::Wider { .. }
                | AuthorityError::Limit(_)
                | AuthorityError::SameGuestPath { .. },
            ) => "authority_refused",
            HostError::NotWasm { .. }
            | HostError::CoreModule { .. }
            | HostError::InvalidComponent { .. }
            | HostError::WrongWorld { .. } => "invalid_component",
            _ => "internal",
        };
        ApiError::new(code, e.to_string())
    }
}

impl From<OpError> for ApiError {
    fn from(e: OpError) -> ApiError {
        match e {
            OpError::Store(e) => e.into(),
            OpError::Host(e) => e.into(),
            OpError::NotJson { .. } => ApiError::new("not_json", e.to_string()),
            OpError::NotParked { message } => ApiError::new("not_parked", message),
            OpError::Ambiguous { message } => ApiError::new("ambiguous_key", message),
            OpError::BadAge { .. } => ApiError::new("bad_request", e.to_string()),
            OpError::Prove(e) => match *e {
                ProveError::Store(e) => e.into(),
                ProveError::Host(e) => e.into(),
                e => ApiError::new("internal", e.to_string()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_a_valid_status_and_is_listed_once() {
        for (i, (code, status, _)) in CODES.iter().enumerate() {
            assert!(StatusCode::from_u16(*status).is_ok(), "{code}");
            assert!(CODES[i + 1..].iter().all(|(c, _, _)| c != code), "{code}");
            assert_eq!(ApiError::new(code, "x").status.as_u16(), *status);
        }
    }
}
