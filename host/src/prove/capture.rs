//! The proof's HTTP capture: during the clean run it sends each request once — to its
//! real destination, or to a stub the caller names — and records the answer; during
//! every other scenario it answers from those records, so that nothing leaves the
//! host. Either way it keeps every request with the key and token it was stamped with,
//! and every request the gate refused.

use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use serde::{Deserialize, Serialize};

use crate::runtime::{
    CaptureError, CaptureFuture, CapturedRequest, CapturedResponse, DeniedRequest, HttpCapture,
    MAX_CAPTURED_BODY,
};

/// Where the clean run's requests go.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Upstream {
    /// To the destinations the agent names (still only those granted to it).
    #[default]
    Network,
    /// To this base URL (`http://127.0.0.1:8080`): the scheme and authority of every
    /// request are replaced by the stub's, its path and query kept.
    Stub(http::Uri),
}

impl Upstream {
    /// A stub server at `url`: `http://` or `https://`, a host, and nothing after it
    /// but `/`.
    ///
    /// ```
    /// use idem::prove::Upstream;
    ///
    /// assert!(Upstream::stub("http://127.0.0.1:8080").is_ok());
    /// assert!(Upstream::stub("127.0.0.1:8080").is_err());
    /// assert!(Upstream::stub("http://stub/path").is_err());
    /// ```
    pub fn stub(url: &str) -> Result<Upstream, StubError> {
        let err = |reason| StubError {
            url: url.to_string(),
            reason,
        };
        let uri: http::Uri = url.parse().map_err(|_| err("it is not a URL"))?;
        match uri.scheme_str() {
            Some("http" | "https") => {}
            _ => return Err(err("it must start with http:// or https://")),
        }
        if uri.authority().is_none() {
            return Err(err("it names no host"));
        }
        if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
            return Err(err("it must have no path: requests keep their own"));
        }
        Ok(Upstream::Stub(uri))
    }
}

/// A stub URL that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{url:?} cannot be a stub: {reason}")]
pub struct StubError {
    /// What was given.
    pub url: String,
    /// Why not.
    pub reason: &'static str,
}

/// One request the capture answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Exchange {
    pub(crate) method: String,
    pub(crate) url: String,
    pub(crate) body: Vec<u8>,
    pub(crate) key: Option<String>,
    pub(crate) token: Option<u64>,
    pub(crate) status: u16,
    pub(crate) response_headers: Vec<(String, String)>,
    pub(crate) response_body: Vec<u8>,
}

/// What the clean run got, to answer every later scenario with: by method, URL and
/// body first, then by key (a body that holds a token, say, differs between attempts).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Answers {
    exchanges: Vec<Exchange>,
}

impl Answers {
    pub(crate) fn new(exchanges: Vec<Exchange>) -> Answers {
        Answers { exchanges }
    }

    pub(crate) fn find(&self, request: &CapturedRequest) -> Option<CapturedResponse> {
        let same = |e: &&Exchange| {
            e.method == request.method && e.url == request.url && e.body == request.body
        };
        let found = self.exchanges.iter().find(same).or_else(|| {
            let key = request.key.as_ref()?;
            self.exchanges.iter().find(|e| e.key.as_ref() == Some(key))
        })?;
        Some(CapturedResponse {
            status: found.status,
            headers: found.response_headers.clone(),
            body: found.response_body.clone(),
        })
    }
}

#[derive(Debug)]
enum Mode {
    Forward(Upstream),
    Replay(Arc<Answers>),
}

/// Everything one run's capture saw.
#[derive(Debug, Clone, Default)]
pub(crate) struct Captured {
    pub(crate) exchanges: Vec<Exchange>,
    pub(crate) denials: Vec<DeniedRequest>,
}

/// The capture of one scenario.
#[derive(Debug)]
pub(crate) struct Recorder {
    mode: Mode,
    seen: Arc<Mutex<Captured>>,
}

impl Recorder {
    /// Sends each request on, once, and records the answers.
    pub(crate) fn forward(upstream: Upstream) -> Recorder {
        Recorder {
            mode: Mode::Forward(upstream),
            seen: Arc::default(),
        }
    }

    /// Answers from what the clean run recorded.
    pub(crate) fn replay(answers: Arc<Answers>) -> Recorder {
        Recorder {
            mode: Mode::Replay(answers),
            seen: Arc::default(),
        }
    }

    pub(crate) fn captured(&self) -> Captured {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl HttpCapture for Recorder {
    fn exchange(&self, request: CapturedRequest) -> CaptureFuture {
        let seen = Arc::clone(&self.seen);
        let answer: CaptureFuture = match &self.mode {
            Mode::Replay(answers) => {
                let found = answers
                    .find(&request)
                    .ok_or_else(|| CaptureError::NoAnswer {
                        method: request.method.clone(),
                        url: request.url.clone(),
                    });
                Box::pin(async move { found })
            }
            Mode::Forward(upstream) => Box::pin(send(upstream.clone(), request.clone())),
        };
        Box::pin(async move {
            // Recorded whether or not it is answered: the agent made the request, and
            // with a real destination it may have had its effect.
            let result = answer.await;
            let (status, response_headers, response_body) = match &result {
                Ok(r) => (r.status, r.headers.clone(), r.body.clone()),
                Err(_) => (0, Vec::new(), Vec::new()),
            };
            seen.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .exchanges
                .push(Exchange {
                    method: request.method,
                    url: request.url,
                    body: request.body,
                    key: request.key,
                    token: request.token,
                    status,
                    response_headers,
                    response_body,
                });
            result
        })
    }

    fn denied(&self, denial: DeniedRequest) {
        self.seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .denials
            .push(denial);
    }
}

/// Sends a captured request to its destination (or the stub) and reads the whole
/// answer.
async fn send(
    upstream: Upstream,
    request: CapturedRequest,
) -> Result<CapturedResponse, CaptureError> {
    let fail = |reason: String| CaptureError::Upstream {
        method: request.method.clone(),
        url: request.url.clone(),
        reason,
    };
    let uri: http::Uri = request.url.parse().map_err(|e| fail(format!("{e}")))?;
    let uri = match &upstream {
        Upstream::Network => uri,
        Upstream::Stub(base) => {
            let mut parts = base.clone().into_parts();
            parts.path_and_query = uri.path_and_query().cloned();
            http::Uri::from_parts(parts).map_err(|e| fail(format!("{e}")))?
        }
    };
    let mut builder = http::Request::builder()
        .method(request.method.as_str())
        .uri(uri);
    for (k, v) in &request.headers {
        builder = builder.header(k, v);
    }
    let body = Full::new(Bytes::from(request.body.clone()))
        .map_err(|never: std::convert::Infallible| -> wasmtime_wasi_http::Error { match never {} })
        .boxed_unsync();
    let outgoing = builder.body(body).map_err(|e| fail(e.to_string()))?;
    let (response, io) = wasmtime_wasi_http::default_send_request(outgoing, None)
        .await
        .map_err(|e| fail(e.to_string()))?;
    // The connection is driven by its own task while the body is read.
    let io = tokio::spawn(io);
    let (parts, body) = response.into_parts();
    let body = Limited::new(body, MAX_CAPTURED_BODY)
        .collect()
        .await
        .map_err(|e| fail(e.to_string()))?
        .to_bytes();
    io.abort();
    Ok(CapturedResponse {
        status: parts.status.as_u16(),
        headers: parts
            .headers
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body: body.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(url: &str, body: &str, key: Option<&str>) -> CapturedRequest {
        CapturedRequest {
            run_id: "r".into(),
            method: "POST".into(),
            url: url.into(),
            headers: Vec::new(),
            body: body.as_bytes().to_vec(),
            key: key.map(str::to_string),
            token: Some(1),
        }
    }

    fn exchange(url: &str, body: &str, key: &str, status: u16) -> Exchange {
        Exchange {
            method: "POST".into(),
            url: url.into(),
            body: body.as_bytes().to_vec(),
            key: Some(key.into()),
            token: Some(1),
            status,
            response_headers: Vec::new(),
            response_body: Vec::new(),
        }
    }

    #[test]
    fn answers_match_the_request_then_the_key() {
        let answers = Answers::new(vec![
            exchange("http://a/1", "x", "k1", 201),
            exchange("http://a/2", "y", "k2", 202),
        ]);
        let status = |r: &CapturedRequest| answers.find(r).map(|a| a.status);
        assert_eq!(status(&request("http://a/2", "y", None)), Some(202));
        // Another body (a token in it, say) under the same key: the key's answer.
        assert_eq!(status(&request("http://a/1", "x2", Some("k1"))), Some(201));
        assert_eq!(status(&request("http://a/3", "z", Some("k3"))), None);
    }

    #[tokio::test]
    async fn replay_records_what_it_answers_and_what_it_cannot() {
        let recorder = Recorder::replay(Arc::new(Answers::new(vec![exchange(
            "http://a/1",
            "x",
            "k1",
            200,
        )])));
        assert!(
            recorder
                .exchange(request("http://a/1", "x", Some("k1")))
                .await
                .is_ok()
        );
        assert!(
            recorder
                .exchange(request("http://b/", "", Some("k9")))
                .await
                .is_err()
        );
        let seen = recorder.captured();
        assert_eq!(seen.exchanges.len(), 2);
        assert_eq!(seen.exchanges[1].status, 0);
    }
}
