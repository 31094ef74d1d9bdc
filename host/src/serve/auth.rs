//! Who may do what. Bound to loopback, the server answers reads from anyone on the
//! machine; bound anywhere else, every request for data needs the bearer token.
//! Mutating requests always need the token, unless the server was started without
//! auth — which only loopback allows. The page's own files hold no data and are open.
//!
//! A browser on the same machine could be steered by another site into posting to a
//! loopback server, so mutating requests must also not come from another origin
//! (`Origin`, `Sec-Fetch-Site`), and their bodies must carry a content type that a
//! cross-site form cannot send without the browser asking first.

use std::net::SocketAddr;

use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::http::header::{AUTHORIZATION, HOST, ORIGIN};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::ServeError;
use super::error::ApiError;
use super::routes::Access;

/// The rules a server enforces, fixed when it starts.
#[derive(Clone)]
pub struct AuthPolicy {
    token: Option<String>,
    loopback: bool,
    no_auth: bool,
}

impl std::fmt::Debug for AuthPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token itself.
        f.debug_struct("AuthPolicy")
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .field("loopback", &self.loopback)
            .field("no_auth", &self.no_auth)
            .finish()
    }
}

impl AuthPolicy {
    /// The policy for a server bound to `addr`. Refused: a non-loopback address without
    /// a token, `no_auth` anywhere but loopback, and an empty token.
    pub fn new(
        addr: SocketAddr,
        token: Option<String>,
        no_auth: bool,
    ) -> Result<AuthPolicy, ServeError> {
        let loopback = addr.ip().is_loopback();
        if token.as_deref().is_some_and(|t| t.trim().is_empty()) {
            return Err(ServeError::EmptyToken);
        }
        if no_auth && !loopback {
            return Err(ServeError::NoAuthOffLoopback { addr });
        }
        if !loopback && token.is_none() {
            return Err(ServeError::TokenRequired { addr });
        }
        Ok(AuthPolicy {
            token: token.map(|t| t.trim().to_string()),
            loopback,
            no_auth,
        })
    }

    /// Whether a request of `access` with these headers may go on.
    pub fn check(&self, access: Access, headers: &HeaderMap) -> Result<(), ApiError> {
        match access {
            Access::Page => Ok(()),
            Access::Read if self.loopback => Ok(()),
            Access::Read => self.bearer(headers),
            Access::Mutate => {
                same_origin(headers)?;
                if self.no_auth {
                    Ok(())
                } else if self.token.is_none() {
                    Err(ApiError::new(
                        "forbidden",
                        "this server was started without a token and with auth on: it takes \
                         no mutating requests",
                    ))
                } else {
                    self.bearer(headers)
                }
            }
        }
    }

    fn bearer(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let given = headers
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        match (given, &self.token) {
            (Some(given), Some(token)) if constant_time_eq(given.as_bytes(), token.as_bytes()) => {
                Ok(())
            }
            (None, _) => Err(ApiError::new(
                "unauthorized",
                "this request needs the server's token: `Authorization: Bearer TOKEN`",
            )),
            _ => Err(ApiError::new("unauthorized", "the bearer token is wrong")),
        }
    }
}

/// Refuses a request a browser sent from another site.
fn same_origin(headers: &HeaderMap) -> Result<(), ApiError> {
    let site = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok());
    if matches!(site, Some("cross-site" | "same-site")) {
        return Err(ApiError::new(
            "forbidden",
            "a mutating request from another site is refused",
        ));
    }
    if let Some(origin) = headers.get(ORIGIN) {
        let host = headers.get(HOST).and_then(|v| v.to_str().ok());
        let origin = origin.to_str().unwrap_or("");
        let origin_host = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"));
        if host.is_none() || origin_host != host {
            return Err(ApiError::new(
                "forbidden",
                "a mutating request from another origin is refused",
            ));
        }
    }
    Ok(())
}

/// Compares without stopping at the first difference, so the time taken does not tell
/// how much of a guessed token was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The middleware that applies the policy to one route.
pub(super) async fn gate(
    State((policy, access)): State<(std::sync::Arc<AuthPolicy>, Access)>,
    request: Request,
    next: Next,
) -> Response {
    match policy.check(access, request.headers()) {
        Ok(()) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn starting_rules() {
        let lo: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:1".parse().unwrap();
        assert!(matches!(
            AuthPolicy::new(any, None, false),
            Err(ServeError::TokenRequired { .. })
        ));
        assert!(matches!(
            AuthPolicy::new(any, Some("t".into()), true),
            Err(ServeError::NoAuthOffLoopback { .. })
        ));
        assert!(matches!(
            AuthPolicy::new(lo, Some(" ".into()), false),
            Err(ServeError::EmptyToken)
        ));
        assert!(AuthPolicy::new(any, Some("t".into()), false).is_ok());
        assert!(AuthPolicy::new(lo, None, true).is_ok());
    }

    #[test]
    fn who_may_do_what() {
        let lo: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:1".parse().unwrap();
        let none = headers(&[]);
        let good = headers(&[("authorization", "Bearer s3cret")]);
        let bad = headers(&[("authorization", "Bearer s3creT")]);

        let local = AuthPolicy::new(lo, Some("s3cret".into()), false).unwrap();
        assert!(local.check(Access::Read, &none).is_ok());
        assert_eq!(
            local.check(Access::Mutate, &none).unwrap_err().code,
            "unauthorized"
        );
        assert_eq!(
            local.check(Access::Mutate, &bad).unwrap_err().code,
            "unauthorized"
        );
        assert!(local.check(Access::Mutate, &good).is_ok());

        let read_only = AuthPolicy::new(lo, None, false).unwrap();
        assert_eq!(
            read_only.check(Access::Mutate, &good).unwrap_err().code,
            "forbidden"
        );

        let open = AuthPolicy::new(lo, None, true).unwrap();
        assert!(open.check(Access::Mutate, &none).is_ok());
        let cross = headers(&[("origin", "http://evil.example"), ("host", "127.0.0.1:1")]);
        assert_eq!(
            open.check(Access::Mutate, &cross).unwrap_err().code,
            "forbidden"
        );
        let same = headers(&[("origin", "http://127.0.0.1:1"), ("host", "127.0.0.1:1")]);
        assert!(open.check(Access::Mutate, &same).is_ok());

        let remote = AuthPolicy::new(any, Some("s3cret".into()), false).unwrap();
        assert_eq!(
            remote.check(Access::Read, &none).unwrap_err().code,
            "unauthorized"
        );
        assert!(remote.check(Access::Read, &good).is_ok());
        assert!(remote.check(Access::Page, &none).is_ok());
    }
}
