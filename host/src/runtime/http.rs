//! Outbound HTTP for agents (`wasi:http`): which destinations an agent may reach, the
//! refusal of requests made outside any claim, and the idempotency headers stamped on
//! every request made while a claim is held.
//!
//! The policy is enforced in wasmtime-wasi-http's `send_request` hook, the one place
//! every outgoing request passes through after the guest has built it: a refused
//! request never opens a connection, and the guest sees `error-code.HTTP-request-denied`.
//! A request made under a claim is bound to it: once the claim settles (or the host
//! learns it was taken over), the rest of the request's body is not sent, so no part of
//! a side effect goes out after its claim ended. A run given a capture (`capture.rs`)
//! has its admitted requests answered by the capture instead of the network, and its
//! refused ones reported to it.

use std::fmt;
use std::str::FromStr;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use wasmtime_wasi_http::{DEFAULT_FORBIDDEN_HEADERS, RequestOptions, WasiBody, WasiHttpHooks};

use super::capture::{Denial, DeniedRequest, HttpCapture};
use super::limits::Limits;

/// The header that carries the step's idempotency key unless the agent renames it.
pub const DEFAULT_KEY_HEADER: &str = "idempotency-key";
/// The header that carries the claim's fencing token unless the agent renames it.
pub const DEFAULT_TOKEN_HEADER: &str = "idempotency-token";

/// What outbound HTTP an agent is granted. The default grants nothing: an agent
/// reaches no network unless the operator names each destination.
///
/// ```
/// use idem::runtime::{HttpDestination, HttpPolicy};
///
/// let policy = HttpPolicy {
///     allow: vec!["api.example.com".parse()?, "127.0.0.1:8080".parse()?],
///     outside_claims: false,
/// };
/// assert!(policy.allows("API.example.com", 443));
/// assert!(policy.allows("127.0.0.1", 8080));
/// assert!(!policy.allows("127.0.0.1", 8081));
/// assert!(!HttpPolicy::default().allows("127.0.0.1", 8080));
/// # Ok::<(), idem::runtime::HttpDestinationError>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpPolicy {
    /// The destinations requests may go to.
    pub allow: Vec<HttpDestination>,
    /// Whether requests made while the instance holds no claim are let through. Off by
    /// default: side effects belong inside
    /// `run-once`, where they carry an idempotency key.
    pub outside_claims: bool,
}

impl HttpPolicy {
    /// Whether a request to `host:port` is granted. Host names compare without regard
    /// to case; an IPv6 literal may come with or without its brackets.
    pub fn allows(&self, host: &str, port: u16) -> bool {
        let host = normalize_host(host);
        self.allow.iter().any(|d| d.matches(&host, port))
    }
}

/// One granted destination: a host, and a port or every port.
///
/// Parsed from `HOST[:PORT]`; an IPv6 address is written in brackets (`[::1]:8080`).
/// Without a port, every port of the host is granted.
///
/// ```
/// use idem::runtime::HttpDestination;
///
/// let d: HttpDestination = "Example.COM:8443".parse()?;
/// assert_eq!((d.host.as_str(), d.port), ("example.com", Some(8443)));
/// let v6: HttpDestination = "[::1]".parse()?;
/// assert_eq!((v6.host.as_str(), v6.port), ("::1", None));
/// assert_eq!(v6.to_string(), "[::1]");
/// assert!("http://example.com".parse::<HttpDestination>().is_err());
/// # Ok::<(), idem::runtime::HttpDestinationError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpDestination {
    /// The host name or IP address, lower-cased, IPv6 without brackets.
    pub host: String,
    /// The port, or `None` for every port.
    pub port: Option<u16>,
}

impl serde::Serialize for HttpDestination {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for HttpDestination {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl HttpDestination {
    fn matches(&self, host: &str, port: u16) -> bool {
        self.host == host && self.port.is_none_or(|p| p == port)
    }
}

impl fmt::Display for HttpDestination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]", self.host)?;
        } else {
            f.write_str(&self.host)?;
        }
        match self.port {
            Some(port) => write!(f, ":{port}"),
            None => Ok(()),
        }
    }
}

/// Why a `HOST[:PORT]` destination could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HttpDestinationError {
    /// Nothing was given.
    #[error("expected HOST[:PORT], got an empty string")]
    Empty,
    /// The host part is not a host name or IP address.
    #[error(
        "expected HOST[:PORT] (a host name or IP address, IPv6 in brackets, \
         no scheme or path), got {input:?}: {reason}"
    )]
    BadHost {
        /// What was given.
        input: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The port is not a number from 1 to 65535.
    #[error("expected HOST[:PORT] with a port from 1 to 65535, got {input:?}")]
    BadPort {
        /// What was given.
        input: String,
    },
}

impl FromStr for HttpDestination {
    type Err = HttpDestinationError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        if input.is_empty() {
            return Err(HttpDestinationError::Empty);
        }
        let bad_host = |reason| HttpDestinationError::BadHost {
            input: input.to_string(),
            reason,
        };
        if input.contains('/') {
            return Err(bad_host("a destination has no scheme and no path"));
        }
        let (host, port) = if let Some(rest) = input.strip_prefix('[') {
            let (host, after) = rest
                .split_once(']')
                .ok_or_else(|| bad_host("an IPv6 address misses its closing bracket"))?;
            if host.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(bad_host("the bracketed part is not an IPv6 address"));
            }
            match after {
                "" => (host, None),
                _ => match after.strip_prefix(':') {
                    Some(port) => (host, Some(port)),
                    None => return Err(bad_host("only :PORT may follow the brackets")),
                },
            }
        } else {
            match input.split_once(':') {
                Some((host, port)) if !port.contains(':') => (host, Some(port)),
                Some(_) => return Err(bad_host("an IPv6 address must be in brackets")),
                None => (input, None),
            }
        };
        if host.is_empty() {
            return Err(bad_host("the host is empty"));
        }
        let name_char = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_';
        if !input.starts_with('[') && !host.chars().all(name_char) {
            return Err(bad_host(
                "a host name holds only letters, digits, '-', '.' and '_'",
            ));
        }
        let port = match port {
            None => None,
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 && p.bytes().all(|b| b.is_ascii_digit()) => Some(n),
                _ => {
                    return Err(HttpDestinationError::BadPort {
                        input: input.to_string(),
                    });
                }
            },
        };
        Ok(HttpDestination {
            host: host.to_ascii_lowercase(),
            port,
        })
    }
}

fn normalize_host(host: &str) -> String {
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
        .to_ascii_lowercase()
}

/// Why an agent's header names were refused: the text the guest gets back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HeaderNamesError {
    #[error("{0:?} is not a valid HTTP header name")]
    Invalid(String),
    #[error("{0:?} is a header the host manages itself and cannot carry a key or token")]
    Reserved(String),
    #[error("the key and token headers must differ, both are {0:?}")]
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

/// Whether a claim still stands, as far as this host knows: shared by its handle, the
/// heartbeat that renews it, and every request (and request body) sent under it. It
/// stops standing when it settles, when the heartbeat finds it taken over, and — without
/// anyone saying so — when its lease runs out on this host's clock before a renewal
/// came back (a process paused past its lease must not act on it when it wakes).
#[derive(Debug, Clone)]
pub(crate) struct ClaimLive(Arc<LiveState>);

#[derive(Debug)]
struct LiveState {
    ended: AtomicBool,
    /// Until when the lease is known to hold.
    valid_until: std::sync::Mutex<Instant>,
}

impl ClaimLive {
    /// A claim asked for at `asked` with a lease of `lease`.
    pub(crate) fn new(asked: Instant, lease: Duration) -> ClaimLive {
        ClaimLive(Arc::new(LiveState {
            ended: AtomicBool::new(false),
            valid_until: std::sync::Mutex::new(asked.checked_add(lease).unwrap_or(asked)),
        }))
    }

    fn until(&self) -> std::sync::MutexGuard<'_, Instant> {
        self.0
            .valid_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A renewal sent at `sent` came back: the lease holds until `sent + lease`.
    pub(crate) fn renewed(&self, sent: Instant, lease: Duration) {
        if let Some(until) = sent.checked_add(lease) {
            let mut current = self.until();
            *current = (*current).max(until);
        }
    }

    /// The claim settled or was lost: nothing more goes out under it.
    pub(crate) fn end(&self) {
        self.0.ended.store(true, Ordering::SeqCst);
    }

    pub(crate) fn is_live(&self) -> bool {
        !self.0.ended.load(Ordering::SeqCst) && Instant::now() < *self.until()
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
    /// Innermost (most recently granted) last: a request is stamped with the claim of
    /// the step it is made for.
    held: Vec<HeldClaim>,
    capture: Option<Arc<dyn HttpCapture>>,
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
            capture,
        }
    }

    /// Lets a request through or says why not; stamps the key and token headers when
    /// a claim is held, replacing whatever the guest put under those names, and returns
    /// the claim the request is bound to.
    fn admit(&self, request: &mut http::Request<WasiBody>) -> Result<Option<Admitted>, Denial> {
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
        let Some(claim) = self.held.last() else {
            return if self.policy.outside_claims {
                Ok(None)
            } else {
                Err(Denial::OutsideClaim { destination })
            };
        };
        if !claim.live.is_live() {
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
                    Some(capture) => super::capture::send_to(
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
    fn parses_destinations() {
        let d = |s: &str| s.parse::<HttpDestination>();
        assert_eq!(
            d("localhost").unwrap(),
            HttpDestination {
                host: "localhost".into(),
                port: None
            }
        );
        assert_eq!(d("10.0.0.1:80").unwrap().port, Some(80));
        assert_eq!(d("[::1]:8080").unwrap().host, "::1");
        assert_eq!(d("[::1]:8080").unwrap().to_string(), "[::1]:8080");
        assert_eq!(d(""), Err(HttpDestinationError::Empty));
        for bad in [
            "host:0",
            "host:65536",
            "host:",
            "host:+1",
            "host:x",
            "[::1]:99999",
        ] {
            assert!(
                matches!(d(bad), Err(HttpDestinationError::BadPort { .. })),
                "{bad}"
            );
        }
        for bad in [
            ":80",
            "http://host",
            "host/path",
            "::1",
            "[::1",
            "[nothost]",
            "[::1]x",
            "a b",
            "user@host",
        ] {
            assert!(
                matches!(d(bad), Err(HttpDestinationError::BadHost { .. })),
                "{bad}"
            );
        }
        let err = d("http://x").unwrap_err().to_string();
        assert!(
            err.contains("HOST[:PORT]") && err.contains("http://x"),
            "{err}"
        );
    }

    #[test]
    fn refuses_destinations_not_granted() {
        let gate = gate(&["127.0.0.1:8080", "example.com"], true);
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
    fn a_claim_whose_lease_ran_out_here_is_not_live() {
        let asked = Instant::now() - Duration::from_secs(2);
        let live = ClaimLive::new(asked, Duration::from_secs(1));
        assert!(
            !live.is_live(),
            "a paused holder must not act on an expired lease"
        );
        live.renewed(Instant::now(), Duration::from_secs(30));
        assert!(live.is_live());
        live.end();
        assert!(!live.is_live());
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
