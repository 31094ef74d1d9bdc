//! The capture hook: a way for an embedder to see every outbound HTTP request an agent
//! makes — and answer it itself, so that nothing leaves the host — together with the
//! requests the gate refused. `idem prove` uses it to count side effects per key
//! without hitting an agent's real destinations hundreds of times.
//!
//! The gate (`http.rs`) consults the capture after its policy check and after stamping
//! the key and token: a captured request is exactly what would have gone out.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use wasmtime_wasi_http::WasiBody;

/// The largest request body a capture is handed; a longer one fails the request.
pub const MAX_CAPTURED_BODY: usize = 16 << 20;

/// One request the gate let through, as it would have gone out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedRequest {
    /// The run that made it.
    pub run_id: String,
    /// `GET`, `POST`, ...
    pub method: String,
    /// The whole URL.
    pub url: String,
    /// Every header, the stamped key and token included, names lower-case.
    pub headers: Vec<(String, String)>,
    /// The whole body.
    pub body: Vec<u8>,
    /// The idempotency key of the claim it was made under (as the agent wrote it), or
    /// `None` when it was made outside any claim.
    pub key: Option<String>,
    /// The claim's fencing token.
    pub token: Option<u64>,
}

/// What a capture answers a request with.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CapturedResponse {
    /// The status code.
    pub status: u16,
    /// The headers.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

/// Why the gate refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum DenialKind {
    /// The destination is not granted to the run.
    NotGranted,
    /// It was made while the instance held no claim, and the policy keeps side effects
    /// inside claims.
    OutsideClaim,
    /// The claim it would be made under was lost (taken over, or its lease ran out).
    ClaimLost,
    /// Its URL has no plain host.
    NoAuthority,
}

/// Why the gate refused a request; logged by the host, seen by the guest as
/// `HTTP-request-denied`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Denial {
    NotGranted {
        destination: String,
    },
    OutsideClaim {
        destination: String,
    },
    ClaimLost {
        destination: String,
    },
    /// The claim the request was tied to (`stamp-next-request`) is no longer held.
    ClaimEnded {
        destination: String,
    },
    NoAuthority,
}

impl Denial {
    pub(crate) fn kind(&self) -> DenialKind {
        match self {
            Denial::NotGranted { .. } => DenialKind::NotGranted,
            Denial::OutsideClaim { .. } => DenialKind::OutsideClaim,
            Denial::ClaimLost { .. } | Denial::ClaimEnded { .. } => DenialKind::ClaimLost,
            Denial::NoAuthority => DenialKind::NoAuthority,
        }
    }
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Denial::NotGranted { destination } => write!(
                f,
                "HTTP request to {destination} denied: the destination is not granted to \
                 the run"
            ),
            Denial::OutsideClaim { destination } => write!(
                f,
                "HTTP request to {destination} denied: it was made outside any run-once \
                 claim, and the run's policy keeps side effects inside claims"
            ),
            Denial::ClaimLost { destination } => write!(
                f,
                "HTTP request to {destination} denied: the claim it would be made under was \
                 taken over by another holder"
            ),
            Denial::ClaimEnded { destination } => write!(
                f,
                "HTTP request to {destination} denied: the claim it was tied to is no longer \
                 held (committed, released or taken over)"
            ),
            Denial::NoAuthority => f.write_str(
                "HTTP request denied: its URL has no plain host (a user-info part or no \
                 authority at all)",
            ),
        }
    }
}

/// A request the gate refused: it never left the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeniedRequest {
    /// The run that made it.
    pub run_id: String,
    /// `GET`, `POST`, ...
    pub method: String,
    /// The whole URL.
    pub url: String,
    /// Why it was refused.
    pub kind: DenialKind,
    /// The gate's words, as it logs them.
    pub reason: String,
}

/// Why a capture could not answer a request; the agent sees the request fail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureError {
    /// Nothing recorded answers this request.
    #[error("no recorded answer for {method} {url}")]
    NoAnswer {
        /// The request's method.
        method: String,
        /// The request's URL.
        url: String,
    },
    /// Sending it on to a destination failed.
    #[error("sending {method} {url} failed: {reason}")]
    Upstream {
        /// The request's method.
        method: String,
        /// The request's URL.
        url: String,
        /// Why.
        reason: String,
    },
}

/// The future a capture answers with.
pub type CaptureFuture =
    Pin<Box<dyn Future<Output = Result<CapturedResponse, CaptureError>> + Send>>;

/// Sees and answers every outbound request of the runs it is given to
/// ([`RunOptions::capture`](super::RunOptions::capture)).
///
/// ```
/// use idem::runtime::{CaptureFuture, CapturedRequest, CapturedResponse, HttpCapture};
///
/// /// Answers every request with 204, so that nothing leaves the host.
/// #[derive(Debug)]
/// struct NoContent;
///
/// impl HttpCapture for NoContent {
///     fn exchange(&self, _request: CapturedRequest) -> CaptureFuture {
///         Box::pin(async { Ok(CapturedResponse { status: 204, ..Default::default() }) })
///     }
/// }
/// ```
pub trait HttpCapture: Send + Sync + fmt::Debug {
    /// Answers a request the gate let through (in place of sending it).
    fn exchange(&self, request: CapturedRequest) -> CaptureFuture;

    /// Hears of a request the gate refused. Ignored by default.
    fn denied(&self, denial: DeniedRequest) {
        let _ = denial;
    }
}

/// The response future `send_request` hands wasmtime-wasi-http.
pub(crate) type SendFuture = Box<
    dyn Future<
            Output = wasmtime_wasi_http::Result<(
                http::Response<WasiBody>,
                Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
            )>,
        > + Send,
>;

/// Sends an admitted request to `capture` instead of the network: reads its whole body
/// (as the network would), hands it over with the claim it was made under, and turns
/// the answer into the guest's response.
pub(crate) fn send_to(
    capture: Arc<dyn HttpCapture>,
    run_id: String,
    request: http::Request<WasiBody>,
    claim: Option<(String, u64)>,
) -> SendFuture {
    Box::new(async move {
        let (parts, body) = request.into_parts();
        let body = Limited::new(body, MAX_CAPTURED_BODY)
            .collect()
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "a captured request's body could not be read");
                wasmtime_wasi_http::Error::HttpRequestDenied
            })?
            .to_bytes();
        let headers = parts
            .headers
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let (key, token) = match claim {
            Some((key, token)) => (Some(key), Some(token)),
            None => (None, None),
        };
        let captured = CapturedRequest {
            run_id,
            method: parts.method.as_str().to_string(),
            url: parts.uri.to_string(),
            headers,
            body: body.to_vec(),
            key,
            token,
        };
        let answer = capture.exchange(captured).await.map_err(|e| {
            tracing::warn!(error = %e, "the capture did not answer a request");
            wasmtime_wasi_http::Error::HttpRequestDenied
        })?;
        let mut builder = http::Response::builder().status(answer.status);
        for (k, v) in &answer.headers {
            builder = builder.header(k, v);
        }
        let body: WasiBody = Full::new(Bytes::from(answer.body))
            .map_err(
                |never: std::convert::Infallible| -> wasmtime_wasi_http::Error { match never {} },
            )
            .boxed_unsync();
        let response = builder.body(body).map_err(|e| {
            tracing::warn!(error = %e, "the capture's answer is not a valid response");
            wasmtime_wasi_http::Error::HttpRequestDenied
        })?;
        let io: Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send> =
            Box::new(async { Ok(()) });
        Ok::<_, wasmtime_wasi_http::Error>((response, io))
    })
}
