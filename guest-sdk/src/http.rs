//! A small blocking HTTP client for agents, on the `wasi:http@0.2` imports.
//!
//! The host lets a request through only to destinations the operator granted
//! (`idem run --allow-http HOST[:PORT]`) and, unless told otherwise
//! (`--allow-http-outside-claims`), only from inside a [`run_once`](crate::run_once)
//! side effect. There it stamps every request with the step's idempotency key and the
//! claim's fencing token (`Idempotency-Key` and `Idempotency-Token`, renamed with
//! [`set_header_names`]), so the receiver can dedupe a retried effect:
//!
//! ```no_run
//! use idem_sdk::{Key, http::Request, run_once};
//!
//! let order = "order-17";
//! let (status, _outcome) = run_once(&Key::shared("charge", &order)?, |_step| {
//!     let response = Request::post("https://payments.example.com/charges")
//!         .header("content-type", "application/json")
//!         .body(format!(r#"{{"order":"{order}"}}"#))
//!         .send()?;
//!     if !response.is_success() {
//!         return Err(format!("charge refused with status {}", response.status).into());
//!     }
//!     Ok::<_, idem_sdk::Error>(response.status)
//! })?;
//! # Ok::<(), idem_sdk::Error>(())
//! ```

use std::time::Duration;

use wasi::http::outgoing_handler;
use wasi::http::types::{
    ErrorCode, Fields, FutureIncomingResponse, IncomingBody, IncomingResponse, Method,
    OutgoingBody, OutgoingRequest, RequestOptions, Scheme,
};
use wasi::io::streams::StreamError;

use crate::bindings::idem::agent::outbound;
use crate::{Error, Step};

/// The most bytes one `blocking-write-and-flush` call may take.
const WRITE_CHUNK: usize = 4096;
/// How many bytes to ask for per read of a response body.
const READ_CHUNK: u64 = 64 * 1024;

/// Renames the headers that carry the step's key and token on this instance's later
/// requests (by default `Idempotency-Key` and `Idempotency-Token`). Call it at the start
/// of [`Agent::run`](crate::Agent::run): a resumed instance starts with the defaults.
///
/// Fails with [`Error::Http`] unless both are valid, distinct header names that the host
/// does not manage itself (`host`, `content-length`, `connection`, ...).
///
/// ```no_run
/// idem_sdk::http::set_header_names("X-Request-Id", "X-Fencing-Token")?;
/// # Ok::<(), idem_sdk::Error>(())
/// ```
pub fn set_header_names(key: &str, token: &str) -> Result<(), Error> {
    outbound::set_header_names(key, token)
        .map_err(|reason| Error::Http(format!("header names refused: {reason}")))
}

/// An HTTP request, built up and then [`send`](Request::send)t.
///
/// ```no_run
/// use std::time::Duration;
/// use idem_sdk::http::Request;
///
/// let response = Request::get("http://127.0.0.1:8080/health")
///     .header("accept", "text/plain")
///     .timeout(Duration::from_secs(5))
///     .send()?;
/// println!("{} {}", response.status, String::from_utf8_lossy(&response.body));
/// # Ok::<(), idem_sdk::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    method: String,
    url: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    timeout: Option<Duration>,
    /// The claim (key, token) the request is tied to.
    under: Option<(String, u64)>,
}

/// A request on its way: the response to come, and whether its body went out.
type Started = (FutureIncomingResponse, Result<(), Error>);

/// A response, read to its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The header fields in the order received; names are lower-case.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The whole body.
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of header `name` (any case), if present and UTF-8.
    ///
    /// ```
    /// use idem_sdk::http::Response;
    ///
    /// let r = Response {
    ///     status: 200,
    ///     headers: vec![("content-type".into(), b"text/plain".to_vec())],
    ///     body: b"ok".to_vec(),
    /// };
    /// assert_eq!(r.header("Content-Type"), Some("text/plain"));
    /// assert_eq!(r.header("etag"), None);
    /// assert!(r.is_success());
    /// ```
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
    }

    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

impl Request {
    /// A request with any method (`"GET"`, `"POST"`, `"PROPFIND"`, ...) to `url`, an
    /// absolute `http://` or `https://` URL.
    pub fn new(method: &str, url: &str) -> Request {
        Request {
            method: method.to_owned(),
            url: url.to_owned(),
            headers: Vec::new(),
            body: Vec::new(),
            timeout: None,
            under: None,
        }
    }

    /// A `GET` request.
    pub fn get(url: &str) -> Request {
        Request::new("GET", url)
    }

    /// A `POST` request.
    pub fn post(url: &str) -> Request {
        Request::new("POST", url)
    }

    /// A `PUT` request.
    pub fn put(url: &str) -> Request {
        Request::new("PUT", url)
    }

    /// A `DELETE` request.
    pub fn delete(url: &str) -> Request {
        Request::new("DELETE", url)
    }

    /// Adds a header field. `Content-Length` is set from the body; the key and token
    /// headers are set by the host and replace any given here.
    pub fn header(mut self, name: &str, value: &str) -> Request {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Sets the body.
    pub fn body(mut self, bytes: impl Into<Vec<u8>>) -> Request {
        self.body = bytes.into();
        self
    }

    /// Bounds the wait for the connection, for the first byte of the response, and
    /// between later bytes. Without it the host's defaults apply.
    pub fn timeout(mut self, timeout: Duration) -> Request {
        self.timeout = Some(timeout);
        self
    }

    /// Ties the request to `step`'s claim: it is stamped with that step's key and token
    /// even while other claims are held (the steps of [`run_once_all`]), and refused by
    /// the host if that claim was settled or taken over before it is sent. Without it a
    /// request is stamped with the claim granted last.
    ///
    /// [`run_once_all`]: crate::run_once_all
    pub fn under(mut self, step: &Step) -> Request {
        self.under = Some((step.key().to_owned(), step.token()));
        self
    }

    /// Sends the request and reads the whole response.
    ///
    /// Fails with [`Error::Http`] when the URL is not usable, when the host denies the
    /// request (the message names the destination), or when the exchange fails. A
    /// response with any status, 4xx and 5xx included, is a `Response`.
    pub fn send(self) -> Result<Response, Error> {
        self.send_streaming(|_, _| {})
    }

    /// [`Request::send`], handing each piece of the response body to `on_body` (with
    /// the response's status) as it arrives: a server-sent event stream is read as it
    /// comes, not when it ends. The returned response still holds the whole body.
    ///
    /// ```no_run
    /// use idem_sdk::http::Request;
    ///
    /// let mut seen = 0;
    /// let response = Request::get("http://127.0.0.1:8080/events")
    ///     .send_streaming(|_status, piece| seen += piece.len())?;
    /// assert_eq!(seen, response.body.len());
    /// # Ok::<(), idem_sdk::Error>(())
    /// ```
    pub fn send_streaming(self, mut on_body: impl FnMut(u16, &[u8])) -> Result<Response, Error> {
        let url = Url::parse(&self.url)?;
        let (future, written) = self.start(&url)?;
        let response = response(&future).map_err(|code| request_error(&url, &code))?;
        written?;
        read_response(response, &url, &mut on_body)
    }

    /// Sends the request (tied to its claim) and its body, without waiting for the
    /// response: the future, and whether the body went out.
    fn start(&self, url: &Url<'_>) -> Result<Started, Error> {
        let request = self.outgoing(url)?;
        let body = request
            .body()
            .map_err(|()| Error::Http("the request body was already taken".into()))?;
        let options = self.timeout.map(options);
        if let Some((key, token)) = &self.under {
            outbound::stamp_next_request(key, *token);
        }
        let future =
            outgoing_handler::handle(request, options).map_err(|code| request_error(url, &code))?;
        // The body goes out after `handle`: the host streams it to the connection, and
        // a refused request closes it, which `response` then explains.
        let written = write_body(body, &self.body);
        Ok((future, written))
    }
}

/// Sends every request at once and returns each one's response (or error) in their
/// order: the requests are in flight together, so the whole takes about as long as the
/// slowest one, not the sum. Inside [`run_once_all`](crate::run_once_all), tie each
/// request to its step with [`Request::under`]: each then carries its own step's key
/// and token.
///
/// ```no_run
/// use idem_sdk::http::{Request, send_all};
///
/// let urls = ["http://127.0.0.1:8080/a", "http://127.0.0.1:8080/b"];
/// let responses = send_all(urls.iter().map(|url| Request::get(url)));
/// assert_eq!(responses.len(), 2);
/// ```
pub fn send_all(requests: impl IntoIterator<Item = Request>) -> Vec<Result<Response, Error>> {
    let requests: Vec<Request> = requests.into_iter().collect();
    // Every request goes out before any response is awaited.
    let started: Vec<Result<Started, Error>> = requests
        .iter()
        .map(|r| Url::parse(&r.url).and_then(|url| r.start(&url)))
        .collect();
    let mut responses: Vec<Option<Result<IncomingResponse, ErrorCode>>> =
        requests.iter().map(|_| None).collect();
    loop {
        let mut waiting = Vec::new();
        for (i, started) in started.iter().enumerate() {
            let Ok((future, _)) = started else { continue };
            if responses[i].is_some() {
                continue;
            }
            match future.get() {
                Some(Ok(result)) => responses[i] = Some(result),
                Some(Err(())) => {
                    responses[i] = Some(Err(ErrorCode::InternalError(Some(
                        "the response was already taken".into(),
                    ))));
                }
                None => waiting.push((i, future.subscribe())),
            }
        }
        if waiting.is_empty() {
            break;
        }
        let pollables: Vec<&wasi::io::poll::Pollable> = waiting.iter().map(|(_, p)| p).collect();
        wasi::io::poll::poll(&pollables);
    }
    requests
        .iter()
        .zip(started)
        .zip(responses)
        .map(|((request, started), response)| {
            let (_, written) = started?;
            let url = Url::parse(&request.url)?;
            let response = response
                .unwrap_or_else(|| Err(ErrorCode::InternalError(Some("no response came".into()))))
                .map_err(|code| request_error(&url, &code))?;
            written?;
            read_response(response, &url, &mut |_, _| {})
        })
        .collect()
}

impl Request {
    fn outgoing(&self, url: &Url<'_>) -> Result<OutgoingRequest, Error> {
        let fields = Fields::new();
        let has_body =
            !self.body.is_empty() || matches!(self.method.as_str(), "POST" | "PUT" | "PATCH");
        let length = has_body.then(|| self.body.len().to_string());
        let headers = self
            .headers
            .iter()
            .filter(|(k, _)| !(length.is_some() && k.eq_ignore_ascii_case("content-length")))
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .chain(length.as_deref().map(|l| ("content-length", l)));
        for (name, value) in headers {
            fields
                .append(name, value.as_bytes())
                .map_err(|err| Error::Http(format!("header {name:?} cannot be sent: {err:?}")))?;
        }
        let request = OutgoingRequest::new(fields);
        let refused = |what: &str| Error::Http(format!("{what} of {} refused", self.url));
        request
            .set_method(&method(&self.method))
            .map_err(|()| refused("method"))?;
        request
            .set_scheme(Some(&url.scheme))
            .map_err(|()| refused("scheme"))?;
        request
            .set_authority(Some(url.authority))
            .map_err(|()| refused("authority"))?;
        request
            .set_path_with_query(Some(url.path_with_query))
            .map_err(|()| refused("path"))?;
        Ok(request)
    }
}

fn method(name: &str) -> Method {
    match name {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "DELETE" => Method::Delete,
        "CONNECT" => Method::Connect,
        "OPTIONS" => Method::Options,
        "TRACE" => Method::Trace,
        "PATCH" => Method::Patch,
        other => Method::Other(other.to_owned()),
    }
}

fn options(timeout: Duration) -> RequestOptions {
    let options = RequestOptions::new();
    let nanos = u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX);
    // A host may not support a timeout; it then keeps its own, which is no reason to
    // refuse the request.
    let _ = options.set_connect_timeout(Some(nanos));
    let _ = options.set_first_byte_timeout(Some(nanos));
    let _ = options.set_between_bytes_timeout(Some(nanos));
    options
}

fn write_body(body: OutgoingBody, bytes: &[u8]) -> Result<(), Error> {
    let failed =
        |err: StreamError| Error::Http(format!("sending the request body failed: {err:?}"));
    {
        let stream = body
            .write()
            .map_err(|()| Error::Http("the request body stream was already taken".into()))?;
        for chunk in bytes.chunks(WRITE_CHUNK) {
            stream.blocking_write_and_flush(chunk).map_err(failed)?;
        }
        // The stream is a child of the body: it must be gone before `finish`.
    }
    OutgoingBody::finish(body, None)
        .map_err(|code| Error::Http(format!("finishing the request body failed: {code:?}")))
}

fn response(future: &FutureIncomingResponse) -> Result<IncomingResponse, ErrorCode> {
    loop {
        match future.get() {
            Some(Ok(result)) => return result,
            Some(Err(())) => {
                return Err(ErrorCode::InternalError(Some(
                    "the response was already taken".into(),
                )));
            }
            None => future.subscribe().block(),
        }
    }
}

fn read_response(
    response: IncomingResponse,
    url: &Url<'_>,
    on_body: &mut dyn FnMut(u16, &[u8]),
) -> Result<Response, Error> {
    let status = response.status();
    let headers = response.headers().entries();
    let incoming = response
        .consume()
        .map_err(|()| Error::Http("the response body was already taken".into()))?;
    let mut body = Vec::new();
    {
        let stream = incoming
            .stream()
            .map_err(|()| Error::Http("the response body stream was already taken".into()))?;
        loop {
            match stream.blocking_read(READ_CHUNK) {
                Ok(chunk) => {
                    on_body(status, &chunk);
                    body.extend_from_slice(&chunk);
                }
                Err(StreamError::Closed) => break,
                Err(StreamError::LastOperationFailed(err)) => {
                    let detail = wasi::http::types::http_error_code(&err)
                        .map_or_else(|| err.to_debug_string(), |code| format!("{code:?}"));
                    return Err(Error::Http(format!(
                        "reading the response of {} failed: {detail}",
                        url.full
                    )));
                }
            }
        }
    }
    // Trailers are not offered; finishing releases the body's resources.
    drop(IncomingBody::finish(incoming));
    Ok(Response {
        status,
        headers,
        body,
    })
}

fn request_error(url: &Url<'_>, code: &ErrorCode) -> Error {
    match code {
        // The host names the one cause: not granted, outside any claim, or no plain host.
        ErrorCode::HttpRequestDenied => Error::Http(outbound::last_denial().unwrap_or_else(|| {
            format!("HTTP request to {} denied by the host", url.destination())
        })),
        other => Error::Http(format!("HTTP request to {} failed: {other:?}", url.full)),
    }
}

/// The parts of an absolute URL that a `wasi:http` request is made of.
#[derive(Debug)]
struct Url<'a> {
    full: &'a str,
    scheme: Scheme,
    authority: &'a str,
    path_with_query: &'a str,
}

impl<'a> Url<'a> {
    fn parse(full: &'a str) -> Result<Url<'a>, Error> {
        let bad = |why: &str| Error::Http(format!("bad URL {full:?}: {why}"));
        let (scheme, rest) = full
            .split_once("://")
            .ok_or_else(|| bad("expected http:// or https://"))?;
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => Scheme::Http,
            "https" => Scheme::Https,
            _ => return Err(bad("expected http:// or https://")),
        };
        // The fragment is for the client alone: it is never sent.
        let rest = rest.split_once('#').map_or(rest, |(before, _)| before);
        let split = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(split);
        if authority.is_empty() {
            return Err(bad("no host"));
        }
        let path_with_query = if path.is_empty() { "/" } else { path };
        Ok(Url {
            full,
            scheme,
            authority,
            path_with_query,
        })
    }

    /// `host:port`, with the scheme's port when the URL names none: what the host's
    /// grants are written in.
    fn destination(&self) -> String {
        let has_port = match self.authority.rsplit_once(':') {
            Some((_, port)) => !port.contains(']'),
            None => false,
        };
        if has_port {
            return self.authority.to_owned();
        }
        let port = match self.scheme {
            Scheme::Https => 443,
            _ => 80,
        };
        format!("{}:{port}", self.authority)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(url: &str) -> (String, &str, &str) {
        let u = Url::parse(url).unwrap();
        let scheme = match u.scheme {
            Scheme::Http => "http".to_string(),
            Scheme::Https => "https".to_string(),
            Scheme::Other(ref s) => s.clone(),
        };
        (scheme, u.authority, u.path_with_query)
    }

    #[test]
    fn parses_urls() {
        assert_eq!(
            parts("http://127.0.0.1:8080/step/1?x=1#frag"),
            ("http".into(), "127.0.0.1:8080", "/step/1?x=1")
        );
        assert_eq!(
            parts("HTTPS://example.com"),
            ("https".into(), "example.com", "/")
        );
        assert_eq!(
            parts("http://example.com?q"),
            ("http".into(), "example.com", "?q")
        );
        assert_eq!(parts("http://[::1]:9/x"), ("http".into(), "[::1]:9", "/x"));
        for bad in ["example.com/x", "ftp://example.com", "http:///x", "http://"] {
            assert!(matches!(Url::parse(bad), Err(Error::Http(_))), "{bad}");
        }
    }

    #[test]
    fn names_destinations_with_their_port() {
        let d = |url: &str| Url::parse(url).unwrap().destination();
        assert_eq!(d("http://127.0.0.1:8080/x"), "127.0.0.1:8080");
        assert_eq!(d("http://example.com/x"), "example.com:80");
        assert_eq!(d("https://example.com"), "example.com:443");
        assert_eq!(d("http://[::1]/"), "[::1]:80");
        assert_eq!(d("http://[::1]:9/"), "[::1]:9");
    }

    #[test]
    fn builds_requests() {
        let r = Request::post("http://h/x")
            .header("a", "b")
            .body("hi")
            .timeout(Duration::from_secs(1));
        assert_eq!(r.method, "POST");
        assert_eq!(r.headers, [("a".to_string(), "b".to_string())]);
        assert_eq!(r.body, b"hi");
        assert_eq!(r.timeout, Some(Duration::from_secs(1)));
        assert_eq!(Request::get("u").method, "GET");
        assert_eq!(Request::put("u").method, "PUT");
        assert_eq!(Request::delete("u").method, "DELETE");
    }
}
