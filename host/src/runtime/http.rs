//! Outbound HTTP for agents (`wasi:http`): which destinations an agent may reach, the
//! refusal of requests made outside any claim, and the idempotency headers stamped on
//! every request made while a claim is held.
//!
//! The policy is enforced in wasmtime-wasi-http's `send_request` hook, the one place
//! every outgoing request passes through after the guest has built it: a refused
//! request never opens a connection, and the guest sees `error-code.HTTP-request-denied`.

use std::fmt;
use std::str::FromStr;

use http::{HeaderName, HeaderValue};
use wasmtime_wasi_http::{
    DEFAULT_FORBIDDEN_HEADERS, RequestOptions, WasiBody, WasiHttpCtx, WasiHttpCtxView,
    WasiHttpHooks, WasiHttpView,
};

use super::state::InstanceState;

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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HttpPolicy {
    /// The destinations requests may go to (`--allow-http`).
    pub allow: Vec<HttpDestination>,
    /// Whether requests made while the instance holds no claim are let through
    /// (`--allow-http-outside-claims`). Off by default: side effects belong inside
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

/// A claim granted to the instance and not yet committed or released.
#[derive(Debug, Clone)]
struct HeldClaim {
    key: HeaderValue,
    token: u64,
}

/// Why the gate refused a request; logged by the host, seen by the guest as
/// `HTTP-request-denied`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Denial {
    NotGranted { destination: String },
    OutsideClaim { destination: String },
    NoAuthority,
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Denial::NotGranted { destination } => write!(
                f,
                "HTTP request to {destination} denied: the destination is not granted \
                 (grant it with --allow-http)"
            ),
            Denial::OutsideClaim { destination } => write!(
                f,
                "HTTP request to {destination} denied: it was made outside any run-once \
                 claim (side effects belong inside run-once; --allow-http-outside-claims \
                 lets such requests through)"
            ),
            Denial::NoAuthority => f.write_str(
                "HTTP request denied: its URL has no plain host (a user-info part or no \
                 authority at all)",
            ),
        }
    }
}

/// The `send_request` hook of one instance: its policy, the header names its agent
/// chose, and the claims it holds.
#[derive(Debug)]
pub(crate) struct HttpGate {
    run_id: String,
    policy: HttpPolicy,
    names: HeaderNames,
    /// Innermost (most recently granted) last: a request is stamped with the claim of
    /// the step it is made for.
    held: Vec<HeldClaim>,
}

impl HttpGate {
    /// Lets a request through or says why not; stamps the key and token headers when
    /// a claim is held, replacing whatever the guest put under those names.
    fn admit(&self, request: &mut http::Request<WasiBody>) -> Result<(), Denial> {
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
                Ok(())
            } else {
                Err(Denial::OutsideClaim { destination })
            };
        };
        let headers = request.headers_mut();
        headers.insert(self.names.key.clone(), claim.key.clone());
        headers.insert(self.names.token.clone(), HeaderValue::from(claim.token));
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
            Ok(()) => wasmtime_wasi_http::default_hooks().send_request(request, options, fut),
            Err(denial) => {
                tracing::warn!(run_id = %self.run_id, "{denial}");
                Box::new(async { Err(wasmtime_wasi_http::Error::HttpRequestDenied) })
            }
        }
    }
}

/// The `wasi:http` part of an instance's store: the context wasmtime-wasi-http needs
/// and the gate its requests pass.
#[derive(Debug)]
pub(crate) struct HttpState {
    ctx: WasiHttpCtx,
    pub(crate) gate: HttpGate,
}

impl HttpState {
    pub(crate) fn new(run_id: &str, policy: &HttpPolicy) -> HttpState {
        HttpState {
            ctx: WasiHttpCtx::new(),
            gate: HttpGate {
                run_id: run_id.to_string(),
                policy: policy.clone(),
                names: HeaderNames::default(),
                held: Vec::new(),
            },
        }
    }

    /// A claim was handed to the guest: requests are stamped with it until it settles.
    /// Keys are checked for control characters before any grant, so every key is a
    /// valid header value; one that is not is simply not stamped.
    pub(crate) fn claim_granted(&mut self, key: &str, token: u64) {
        match HeaderValue::from_str(key) {
            Ok(key) => self.gate.held.push(HeldClaim { key, token }),
            Err(_) => tracing::warn!(key, "key is not a valid header value; not stamped"),
        }
    }

    /// The claim with `token` was committed, released or dropped. Tokens are unique in
    /// a store, so the token alone names it.
    pub(crate) fn claim_settled(&mut self, token: u64) {
        self.gate.held.retain(|c| c.token != token);
    }

    /// Renames the key and token headers for this instance's later requests.
    pub(crate) fn set_header_names(
        &mut self,
        key: &str,
        token: &str,
    ) -> Result<(), HeaderNamesError> {
        self.gate.names = HeaderNames::new(key, token)?;
        Ok(())
    }
}

impl WasiHttpView for InstanceState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http.ctx,
            table: &mut self.table,
            hooks: &mut self.http.gate,
        }
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

    fn state(allow: &[&str], outside_claims: bool) -> HttpState {
        let policy = HttpPolicy {
            allow: allow.iter().map(|d| d.parse().unwrap()).collect(),
            outside_claims,
        };
        HttpState::new("run", &policy)
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
        let gate = state(&["127.0.0.1:8080", "example.com"], true).gate;
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
            gate.admit(&mut request("http://127.0.0.1:8081/", &[])),
            Err(Denial::NotGranted {
                destination: "127.0.0.1:8081".into()
            })
        );
        // The default port of the scheme is what is checked when none is written.
        assert_eq!(
            gate.admit(&mut request("http://127.0.0.1/", &[])),
            Err(Denial::NotGranted {
                destination: "127.0.0.1:80".into()
            })
        );
        assert_eq!(
            gate.admit(&mut request("http://evil@127.0.0.1:8080/", &[])),
            Err(Denial::NoAuthority)
        );
        assert!(
            HttpState::new("run", &HttpPolicy::default())
                .gate
                .admit(&mut request("http://127.0.0.1:8080/", &[]))
                .is_err()
        );
    }

    #[test]
    fn stamps_the_innermost_held_claim_and_refuses_outside_claims() {
        let mut http = state(&["127.0.0.1"], false);
        let denied = http
            .gate
            .admit(&mut request("http://127.0.0.1:1/", &[]))
            .unwrap_err();
        assert!(matches!(denied, Denial::OutsideClaim { .. }));
        assert!(denied.to_string().contains("127.0.0.1:1"), "{denied}");

        http.claim_granted("run/a", 7);
        http.claim_granted("run/b", 9);
        let mut req = request(
            "http://127.0.0.1:1/",
            &[("Idempotency-Key", "forged"), ("idempotency-token", "1")],
        );
        http.gate.admit(&mut req).unwrap();
        let all = |name: &str| -> Vec<&str> {
            req.headers()
                .get_all(name)
                .iter()
                .map(|v| v.to_str().unwrap())
                .collect()
        };
        assert_eq!(all("idempotency-key"), ["run/b"]);
        assert_eq!(all("idempotency-token"), ["9"]);

        http.claim_settled(9);
        http.set_header_names("X-Step", "X-Fence").unwrap();
        let mut req = request("http://127.0.0.1:1/", &[]);
        http.gate.admit(&mut req).unwrap();
        assert_eq!(req.headers()["x-step"], "run/a");
        assert_eq!(req.headers()["x-fence"], "7");
        assert!(req.headers().get("idempotency-key").is_none());

        http.claim_settled(7);
        assert!(
            http.gate
                .admit(&mut request("http://127.0.0.1:1/", &[]))
                .is_err()
        );
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
