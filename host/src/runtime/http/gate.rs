//! The gate every outbound request of an instance passes: admitted by the run's
//! policy, stamped with the claim it is made under (or refused outside claims), cut
//! off mid-body when that claim ends, and answered by the run's capture if it has one.
//! A request refused because its claim was taken over ends the instance at its next
//! call into idem ([`HttpGate::take_lost`]), as a refused commit does: the next
//! instance finds the key committed or held by the taker, and the run goes on.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use wasmtime_wasi_http::{DEFAULT_FORBIDDEN_HEADERS, RequestOptions, WasiBody, WasiHttpHooks};

use super::policy::{HttpDestination, HttpPolicy, normalize_host};
use crate::runtime::capture::{Denial, DeniedRequest, HttpCapture};
use crate::runtime::claim::ClaimLive;
use crate::runtime::limits::Limits;

/// The header that carries the step's idempotency key unless the agent renames it.
pub const DEFAULT_KEY_HEADER: &str = "idempotency-key";
/// The header that carries the claim's fencing token unless the agent renames it.
pub const DEFAULT_TOKEN_HEADER: &str = "idempotency-token";

/// Why an agent's header names were refused: the text the guest gets back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HeaderNamesError {
    #[error("{} is not a valid HTTP header name", crate::text::quoted(.0))]
    Invalid(String),
    #[error(
        "{} is a header the host manages itself and cannot carry a key or token",
        crate::text::quoted(.0)
    )]
    Reserved(String),
    #[error("the key and token headers must differ, both are {}", crate::text::quoted(.0))]
    Same(String),
}

/// The names of the two headers stamped on requests made under a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeaderNames {
    key: HeaderName,
    token: HeaderName,
}

impl Default for HeaderNames {
    fn default() -> Self {
        HeaderNames {
            key: HeaderName::from_static(DEFAULT_KEY_HEADER),
            token: HeaderName::from_static(DEFAULT_TOKEN_HEADER),
        }
    }
}

impl HeaderNames {
    /// Checks an agent's choice: two distinct valid names, neither one that frames the
    /// message or that wasi:http forbids (`host`, `connection`, ...), which the stamp
    /// would otherwise corrupt.
    pub(crate) fn new(key: &str, token: &str) -> Result<HeaderNames, HeaderNamesError> {
        let parse = |name: &str| {
            let parsed = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| HeaderNamesError::Invalid(name.to_string()))?;
            if parsed == http::header::CONTENT_LENGTH || DEFAULT_FORBIDDEN_HEADERS.contains(&parsed)
            {
                return Err(HeaderNamesError::Reserved(name.to_string()));
            }
            Ok(parsed)
        };
        let (key, token) = (parse(key)?, parse(token)?);
        if key == token {
            return Err(HeaderNamesError::Same(key.as_str().to_string()));
        }
        Ok(HeaderNames { key, token })
    }
}

/// A claim granted to the instance and not yet committed or released.
#[derive(Debug, Clone)]
struct HeldClaim {
    key: HeaderValue,
    token: u64,
    live: ClaimLive,
}

/// The `send_request` hook of one instance: its policy, the header names its agent
/// chose, the claims it holds, and the capture that answers in place of the network,
/// if the run has one.
#[derive(Debug)]
pub(crate) struct HttpGate {
    run_id: String,
    policy: HttpPolicy,
    names: HeaderNames,
    /// Innermost (most recently granted) last: a request not tied to a claim is
    /// stamped with the claim of the step it is made in.
    held: Vec<HeldClaim>,
    /// The claim (key as the agent wrote it, token) the agent tied its next request
    /// to: with several claims held, only the agent knows which one a request is for.
    next: Option<(String, u64)>,
    capture: Option<Arc<dyn HttpCapture>>,
    /// The key of a claim another holder took over, found by a refused request.
    lost: Option<String>,
    /// Why the latest refused request was refused, for the agent to say.
    last_denial: Option<String>,
}

/// The claim an admitted request was stamped with.
#[derive(Debug, Clone)]
struct Admitted {
    live: ClaimLive,
    key: String,
    token: u64,
}

impl HttpGate {
    pub(crate) fn new(
        run_id: &str,
        policy: &HttpPolicy,
        capture: Option<Arc<dyn HttpCapture>>,
    ) -> HttpGate {
        HttpGate {
            run_id: run_id.to_string(),
            policy: policy.clone(),
            names: HeaderNames::default(),
            held: Vec::new(),
            next: None,
            capture,
            lost: None,
            last_denial: None,
        }
    }

    /// Why the latest refused request of this instance was refused, naming its one
    /// cause in the library's terms.
    pub(crate) fn last_denial(&self) -> Option<&str> {
        self.last_denial.as_deref()
    }

    /// The key of a claim a request found taken over, once: the instance must end (the
    /// guest was told only that the request was denied, and its side effect is not its
    /// own any more), so that a fresh one resumes the run from the store.
    pub(crate) fn take_lost(&mut self) -> Option<String> {
        self.lost.take()
    }

    /// Lets a request through or says why not; stamps the key and token headers when
    /// a claim is held (the one the request was tied to, else the innermost),
    /// replacing whatever the guest put under those names, and returns the claim the
    /// request is bound to.
    fn admit(&mut self, request: &mut http::Request<WasiBody>) -> Result<Option<Admitted>, Denial> {
        // A tie is for the next request only, admitted or not.
        let tied = self.next.take();
        let uri = request.uri();
        let authority = uri.authority().ok_or(Denial::NoAuthority)?;
        // The connector dials the whole authority string: refusing user-info keeps the
        // host checked here and the host dialled the same.
        if authority.as_str().contains('@') {
            return Err(Denial::NoAuthority);
        }
        let https = uri.scheme() == Some(&http::uri::Scheme::HTTPS);
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let host = normalize_host(authority.host());
        let destination = HttpDestination {
            host: host.clone(),
            port: Some(port),
        }
        .to_string();
        if !self.policy.allows(&host, port) {
            return Err(Denial::NotGranted { destination });
        }
        let claim = match tied {
            Some((key, token)) => self
                .held
                .iter()
                .find(|c| c.token == token && c.key.as_bytes() == key.as_bytes())
                .ok_or_else(|| Denial::ClaimEnded {
                    destination: destination.clone(),
                })?,
            None => match self.held.last() {
                Some(claim) => claim,
                None if self.policy.outside_claims => return Ok(None),
                None => return Err(Denial::OutsideClaim { destination }),
            },
        };
        if !claim.live.is_live() {
            // The claim the request was for, tied or the innermost: its instance ends.
            self.lost = Some(String::from_utf8_lossy(claim.key.as_bytes()).into_owned());
            return Err(Denial::ClaimLost { destination });
        }
        let headers = request.headers_mut();
        headers.insert(self.names.key.clone(), claim.key.clone());
        headers.insert(self.names.token.clone(), HeaderValue::from(claim.token));
        Ok(Some(Admitted {
            live: claim.live.clone(),
            // Keys are stamped only when they are valid header values, which are
            // visible ASCII: always UTF-8.
            key: String::from_utf8_lossy(claim.key.as_bytes()).into_owned(),
            token: claim.token,
        }))
    }

    /// A claim was handed to the guest: requests are stamped with it until it settles.
    /// Keys are checked for control characters before any grant, so every key is a
    /// valid header value; one that is not is simply not stamped.
    pub(crate) fn claim_granted(&mut self, key: &str, token: u64, live: ClaimLive) {
        match HeaderValue::from_str(key) {
            Ok(key) => self.held.push(HeldClaim { key, token, live }),
            Err(_) => tracing::warn!(key, "key is not a valid header value; not stamped"),
        }
    }

    /// The claim on `key` with `token` was committed, released or dropped. Tokens
    /// count per key, so two keys held at once may share one: both name the claim.
    pub(crate) fn claim_settled(&mut self, key: &str, token: u64) {
        self.held
            .retain(|c| !(c.token == token && c.key.as_bytes() == key.as_bytes()));
    }

    /// Ties the instance's next request to the claim on `key` (as the agent wrote
    /// it) with `token`.
    pub(crate) fn stamp_next(&mut self, key: String, token: u64) {
        self.next = Some((key, token));
    }

    /// Renames the key and token headers for this instance's later requests.
    pub(crate) fn set_header_names(
        &mut self,
        key: &str,
        token: &str,
    ) -> Result<(), HeaderNamesError> {
        self.names = HeaderNames::new(key, token)?;
        Ok(())
    }
}

impl WasiHttpHooks for HttpGate {
    fn send_request(
        &mut self,
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        fut: Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
    ) -> Box<
        dyn Future<
                Output = wasmtime_wasi_http::Result<(
                    http::Response<WasiBody>,
                    Box<dyn Future<Output = wasmtime_wasi_http::Result<()>> + Send>,
                )>,
            > + Send,
    > {
        match self.admit(&mut request) {
            Ok(bound) => {
                let claim = bound.as_ref().map(|a| (a.key.clone(), a.token));
                let request = match bound {
                    Some(Admitted { live, .. }) => {
                        request.map(|body| ClaimBoundBody { inner: body, live }.boxed_unsync())
                    }
                    None => request,
                };
                match &self.capture {
                    Some(capture) => crate::runtime::capture::send_to(
                        Arc::clone(capture),
                        self.run_id.clone(),
                        request,
                        claim,
                    ),
                    None => wasmtime_wasi_http::default_hooks().send_request(request, options, fut),
                }
            }
            Err(denial) => {
                tracing::warn!(run_id = %crate::text::escape(&self.run_id, false), "{denial}");
                self.last_denial = Some(denial.to_string());
                if let Some(capture) = &self.capture {
                    capture.denied(DeniedRequest {
                        run_id: self.run_id.clone(),
                        method: request.method().as_str().to_string(),
                        url: request.uri().to_string(),
                        kind: denial.kind(),
                        reason: denial.to_string(),
                    });
                }
                Box::new(async { Err(wasmtime_wasi_http::Error::HttpRequestDenied) })
            }
        }
    }

    fn p2_outgoing_body_buffer_chunks(&mut self) -> usize {
        // With the chunk size below, a body holds at most two chunks in the host
        // (the buffered one and the one being sent): what `Limits::HANDLE_BYTES` charges.
        1
    }

    fn p2_outgoing_body_chunk_size(&mut self) -> usize {
        Limits::BODY_CHUNK_BYTES
    }
}

/// A request body that stops once the claim it was sent under ends: the rest of a side
/// effect never leaves after its commit (or after another holder took the key over).
struct ClaimBoundBody {
    inner: WasiBody,
    live: ClaimLive,
}

impl Body for ClaimBoundBody {
    type Data = Bytes;
    type Error = wasmtime_wasi_http::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if !self.live.is_live() {
            tracing::warn!("request body cut: its claim ended before the body was sent");
            return Poll::Ready(Some(Err(wasmtime_wasi_http::Error::HttpRequestDenied)));
        }
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    fn request(uri: &str, headers: &[(&str, &str)]) -> http::Request<WasiBody> {
        use http_body_util::BodyExt;
        let mut builder = http::Request::builder().method("POST").uri(uri);
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        let body = http_body_util::Empty::new()
            .map_err(|never: std::convert::Infallible| match never {})
            .boxed_unsync();
        builder.body(body).unwrap()
    }

    fn gate(allow: &[&str], outside_claims: bool) -> HttpGate {
        let policy = HttpPolicy {
            allow: allow.iter().map(|d| d.parse().unwrap()).collect(),
            outside_claims,
        };
        HttpGate::new("run", &policy, None)
    }

    #[test]
    fn refuses_destinations_not_granted() {
        let mut gate = gate(&["127.0.0.1:8080", "example.com"], true);
        assert!(
            gate.admit(&mut request("http://127.0.0.1:8080/", &[]))
                .is_ok()
        );
        assert!(
            gate.admit(&mut request("https://EXAMPLE.com/x", &[]))
                .is_ok()
        );
        assert!(
            gate.admit(&mut request("http://example.com:9/", &[]))
                .is_ok()
        );
        assert_eq!(
            gate.admit(&mut request("http://127.0.0.1:8081/", &[]))
                .err(),
            Some(Denial::NotGranted {
                destination: "127.0.0.1:8081".into()
            })
        );
        // The default port of the scheme is what is checked when none is written.
        assert_eq!(
            gate.admit(&mut request("http://127.0.0.1/", &[])).err(),
            Some(Denial::NotGranted {
                destination: "127.0.0.1:80".into()
            })
        );
        assert_eq!(
            gate.admit(&mut request("http://evil@127.0.0.1:8080/", &[]))
                .err(),
            Some(Denial::NoAuthority)
        );
        assert!(
            HttpGate::new("run", &HttpPolicy::default(), None)
                .admit(&mut request("http://127.0.0.1:8080/", &[]))
                .is_err()
        );
    }

    #[test]
    fn stamps_the_innermost_held_claim_and_refuses_outside_claims() {
        let mut gate = gate(&["127.0.0.1"], false);
        let denied = gate
            .admit(&mut request("http://127.0.0.1:1/", &[]))
            .unwrap_err();
        assert!(matches!(denied, Denial::OutsideClaim { .. }));
        assert!(denied.to_string().contains("127.0.0.1:1"), "{denied}");

        let lease = Duration::from_secs(30);
        let (a, b) = (
            ClaimLive::new(Instant::now(), lease),
            ClaimLive::new(Instant::now(), lease),
        );
        gate.claim_granted("run/a", 7, a.clone());
        gate.claim_granted("run/b", 9, b.clone());
        let mut req = request(
            "http://127.0.0.1:1/",
            &[("Idempotency-Key", "forged"), ("idempotency-token", "1")],
        );
        gate.admit(&mut req).unwrap();
        let all = |name: &str| -> Vec<&str> {
            req.headers()
                .get_all(name)
                .iter()
                .map(|v| v.to_str().unwrap())
                .collect()
        };
        assert_eq!(all("idempotency-key"), ["run/b"]);
        assert_eq!(all("idempotency-token"), ["9"]);

        // A claim the host knows was taken over stamps nothing: the request stays home.
        b.end();
        assert!(matches!(
            gate.admit(&mut request("http://127.0.0.1:1/", &[])),
            Err(Denial::ClaimLost { .. })
        ));

        gate.claim_settled("run/b", 9);
        gate.set_header_names("X-Step", "X-Fence").unwrap();
        let mut req = request("http://127.0.0.1:1/", &[]);
        gate.admit(&mut req).unwrap();
        assert_eq!(req.headers()["x-step"], "run/a");
        assert_eq!(req.headers()["x-fence"], "7");
        assert!(req.headers().get("idempotency-key").is_none());

        gate.claim_settled("run/a", 7);
        assert!(
            gate.admit(&mut request("http://127.0.0.1:1/", &[]))
                .is_err()
        );
    }

    #[test]
    fn a_tied_request_carries_its_own_claim_and_is_refused_once_it_ends() {
        let mut gate = gate(&["127.0.0.1"], false);
        let lease = Duration::from_secs(30);
        let live = || ClaimLive::new(Instant::now(), lease);
        let (a, b, c) = (live(), live(), live());
        // Tokens count per key: two held claims may share one.
        gate.claim_granted("run/a", 3, a.clone());
        gate.claim_granted("run/b", 3, b.clone());
        gate.claim_granted("run/c", 5, c.clone());
        let stamped = |gate: &mut HttpGate| {
            let mut req = request(
                "http://127.0.0.1:1/",
                &[("Idempotency-Key", "forged"), ("idempotency-token", "1")],
            );
            gate.admit(&mut req).map(|_| {
                let h = req.headers();
                (
                    h["idempotency-key"].to_str().unwrap().to_string(),
                    h["idempotency-token"].to_str().unwrap().to_string(),
                )
            })
        };
        for (key, token) in [("run/a", 3), ("run/b", 3), ("run/c", 5)] {
            gate.stamp_next(key.into(), token);
            assert_eq!(
                stamped(&mut gate).unwrap(),
                (key.to_string(), token.to_string())
            );
        }
        // A tie is for one request: the next untied one goes under the innermost.
        assert_eq!(stamped(&mut gate).unwrap(), ("run/c".into(), "5".into()));

        a.end();
        gate.stamp_next("run/a".into(), 3);
        assert!(matches!(stamped(&mut gate), Err(Denial::ClaimLost { .. })));
        // A settled claim is refused even while others are held, and so is a tie to
        // a token the claim does not have.
        gate.claim_settled("run/b", 3);
        gate.stamp_next("run/b".into(), 3);
        assert!(matches!(stamped(&mut gate), Err(Denial::ClaimEnded { .. })));
        gate.stamp_next("run/c".into(), 4);
        assert!(matches!(stamped(&mut gate), Err(Denial::ClaimEnded { .. })));
        gate.stamp_next("run/c".into(), 5);
        assert_eq!(stamped(&mut gate).unwrap(), ("run/c".into(), "5".into()));
    }

    #[tokio::test]
    async fn a_body_stops_when_its_claim_ends() {
        let live = ClaimLive::new(Instant::now(), Duration::from_secs(30));
        let chunks =
            futures_lite_body(vec![Bytes::from_static(b"one"), Bytes::from_static(b"two")]);
        let mut body = ClaimBoundBody {
            inner: chunks,
            live: live.clone(),
        };
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(first.into_data().unwrap(), "one");
        live.end();
        assert!(
            body.frame().await.unwrap().is_err(),
            "the second chunk is cut"
        );
    }

    /// A body of the given chunks, as the guest's writes would make it.
    fn futures_lite_body(chunks: Vec<Bytes>) -> WasiBody {
        Chunks(chunks.into()).boxed_unsync()
    }

    struct Chunks(std::collections::VecDeque<Bytes>);

    impl Body for Chunks {
        type Data = Bytes;
        type Error = wasmtime_wasi_http::Error;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.0.pop_front().map(|c| Ok(Frame::data(c))))
        }
    }

    #[test]
    fn checks_header_names() {
        assert!(HeaderNames::new("X-Key", "X-Token").is_ok());
        assert_eq!(
            HeaderNames::new("bad name", "x"),
            Err(HeaderNamesError::Invalid("bad name".into()))
        );
        assert_eq!(
            HeaderNames::new("", "x"),
            Err(HeaderNamesError::Invalid(String::new()))
        );
        assert_eq!(
            HeaderNames::new("X-Same", "x-same"),
            Err(HeaderNamesError::Same("x-same".into()))
        );
        for reserved in ["Host", "content-length", "transfer-encoding", "connection"] {
            assert_eq!(
                HeaderNames::new(reserved, "x"),
                Err(HeaderNamesError::Reserved(reserved.into()))
            );
        }
    }
}
