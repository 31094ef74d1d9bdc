//! `idem serve`: a JSON HTTP API over a store, the web page of runs and steps built on
//! it, and metrics — an operator's view of what is happening now.
//!
//! # Layout
//! - `routes.rs`: the one table of routes; the router and the OpenAPI document are
//!   both made from it.
//! - `api.rs`: the JSON handlers, each a thin call into [`crate::ops`] or the store.
//! - `stream.rs`: a run's live stream as server-sent events.
//! - `auth.rs`: who may do what (loopback, the bearer token, other origins).
//! - `error.rs`: [`ApiError`], the stable error codes.
//! - `openapi.rs`: the OpenAPI document.
//! - `metrics.rs`: `/metrics` in the Prometheus text format.
//! - `page.rs` and `page/`: the web page, embedded in the binary (no CDN).
//!
//! ```no_run
//! use std::sync::Arc;
//! use idem::runtime::Runtime;
//! use idem::serve::{ServeOptions, Server};
//! use idem::store::{OpenOptions, SqliteStore};
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = Arc::new(SqliteStore::open_with("idem.db".as_ref(), &OpenOptions::default())?);
//! let server = Server::bind(store, Arc::new(Runtime::new(None)?), ServeOptions::default()).await?;
//! println!("serving on http://{}", server.local_addr());
//! server.run(async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(())
//! # }
//! ```

mod api;
mod auth;
mod error;
mod metrics;
mod openapi;
mod page;
mod routes;
mod stream;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::middleware;
use axum::routing::{MethodRouter, get, post};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::sync::watch;
use tokio::task::JoinSet;

pub use auth::AuthPolicy;
pub use error::{ApiError, CODES};
pub use openapi::document as openapi_document;
pub use routes::{Access, Body, ROUTES, Route};

use crate::runtime::Runtime;
use crate::store::Store;

/// How a server listens and what it accepts.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Where to listen; loopback unless a token is given.
    pub listen: SocketAddr,
    /// The bearer token; required off loopback, and for mutating requests unless
    /// `no_auth`.
    pub token: Option<String>,
    /// Take mutating requests without a token: loopback only.
    pub no_auth: bool,
    /// Largest JSON request body, in bytes.
    pub max_body_bytes: usize,
    /// Largest component a deploy may upload, in bytes.
    pub max_component_bytes: usize,
    /// How long a client may take to send a request's headers (from the moment the
    /// connection is open, or the previous response was sent) before its connection is
    /// closed: one slow or silent client cannot hold a connection forever.
    pub header_read_timeout: Duration,
    /// The price table that turns token usage into cost in the API, the page and
    /// `/metrics`; none, no cost is shown.
    pub prices: Option<crate::ops::Prices>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 8089)),
            token: None,
            no_auth: false,
            max_body_bytes: 2 << 20,
            // A Python agent is ~19 MB (the interpreter and its standard library).
            max_component_bytes: 64 << 20,
            header_read_timeout: Duration::from_secs(10),
            prices: None,
        }
    }
}

/// Why a server did not start or stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// Bound off loopback without a token.
    #[error("listening on {addr}, off loopback, needs a bearer token")]
    TokenRequired {
        /// The address.
        addr: SocketAddr,
    },
    /// `no_auth` asked for off loopback.
    #[error("running without auth is allowed on loopback only, not on {addr}")]
    NoAuthOffLoopback {
        /// The address.
        addr: SocketAddr,
    },
    /// The token is empty.
    #[error("the bearer token is empty")]
    EmptyToken,
    /// The address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("serving failed: {0}")]
    Io(#[from] std::io::Error),
}

/// What the handlers share.
#[derive(Clone)]
pub(crate) struct ServeState {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) runtime: Arc<Runtime>,
    pub(crate) settled: Arc<metrics::SettledSteps>,
    pub(crate) prices: Option<Arc<crate::ops::Prices>>,
    /// Changes (closes) when the server stops: open event streams end then, rather
    /// than hold the server's graceful shutdown until their runs end.
    pub(crate) stopping: watch::Receiver<()>,
}

/// A server bound to its address, not yet serving.
pub struct Server {
    listener: tokio::net::TcpListener,
    router: Router,
    addr: SocketAddr,
    header_read_timeout: Duration,
    stop: watch::Sender<()>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// Checks the options and binds. `runtime` checks and compiles deployed components;
    /// a worker in the same process may share it.
    pub async fn bind(
        store: Arc<dyn Store>,
        runtime: Arc<Runtime>,
        options: ServeOptions,
    ) -> Result<Server, ServeError> {
        let policy = AuthPolicy::new(options.listen, options.token.clone(), options.no_auth)?;
        let listener = tokio::net::TcpListener::bind(options.listen)
            .await
            .map_err(|source| ServeError::Bind {
                addr: options.listen,
                source,
            })?;
        let addr = listener.local_addr()?;
        let (stop, stopping) = watch::channel(());
        let state = ServeState {
            store,
            runtime,
            settled: Arc::default(),
            prices: options.prices.clone().map(Arc::new),
            stopping,
        };
        Ok(Server {
            listener,
            router: router(state, Arc::new(policy), &options),
            addr,
            header_read_timeout: options.header_read_timeout,
            stop,
        })
    }

    /// The address it listens on (with the port the OS chose, for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until `shutdown` completes, then finishes the requests in flight.
    ///
    /// Each connection is served by hyper's HTTP/1 connection with a header-read
    /// timeout ([`ServeOptions::header_read_timeout`]), which `axum::serve` does not
    /// expose.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServeError> {
        let mut http = http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(self.header_read_timeout);
        let stopping = self.stop.subscribe();
        let stop = self.stop;
        let mut connections = JoinSet::new();
        let mut shutdown = pin!(shutdown);
        loop {
            let stream = tokio::select! {
                () = &mut shutdown => break,
                // Reaped as they end, so the set holds only live connections.
                Some(_) = connections.join_next(), if !connections.is_empty() => continue,
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        accept_failed(e).await;
                        continue;
                    }
                },
            };
            let service = TowerToHyperService::new(self.router.clone());
            let conn = http.serve_connection(TokioIo::new(stream), service);
            let mut stopping = stopping.clone();
            connections.spawn(async move {
                let mut conn = pin!(conn);
                tokio::select! {
                    // A client that timed out or went away is no error of the server's.
                    _ = conn.as_mut() => return,
                    _ = stopping.changed() => conn.as_mut().graceful_shutdown(),
                }
                let _ = conn.await;
            });
        }
        drop(self.listener);
        drop(stop);
        while connections.join_next().await.is_some() {}
        Ok(())
    }
}

/// Waits after a failed accept: at once for a connection the client dropped before it
/// was taken, a while for a lack of resources (out of file descriptors), so as not to
/// spin.
async fn accept_failed(e: std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    tracing::warn!("cannot accept a connection: {e}");
    tokio::time::sleep(Duration::from_millis(200)).await;
}

/// The router: every route of [`ROUTES`] with its handler, its gate and its body limit.
fn router(state: ServeState, policy: Arc<AuthPolicy>, options: &ServeOptions) -> Router {
    let mut router = Router::new();
    for route in ROUTES {
        let limit = match route.body {
            Body::Component => options.max_component_bytes,
            Body::Json(_) | Body::Empty => options.max_body_bytes,
        };
        let handler = handler(route)
            .route_layer(middleware::from_fn_with_state(
                (Arc::clone(&policy), route.access),
                auth::gate,
            ))
            .route_layer(DefaultBodyLimit::max(limit));
        router = router.route(route.path, handler);
    }
    router
        .fallback(|| async { ApiError::new("not_found", "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new("method_not_allowed", "the route does not take this method")
        })
        .with_state(state)
}

/// The handler of a route, by its id.
fn handler(route: &Route) -> MethodRouter<ServeState> {
    match route.id {
        "page_runs" | "page_run" | "page_deployments" => get(page::index),
        "page_script" => get(page::script),
        "page_style" => get(page::style),
        "openapi" => get(openapi::serve),
        "metrics" => get(metrics::serve),
        "list_runs" => get(api::list_runs),
        "submit_run" => post(api::submit_run),
        "submit_runs" => post(api::submit_runs),
        "show_run" => get(api::show_run),
        "stream_run" => get(stream::stream_run),
        "run_events" => get(api::run_events),
        "show_step" => get(api::show_step),
        "run_history" => get(api::run_history),
        "fork_run" => post(api::fork_run),
        "signal_run" => post(api::signal_run),
        "resolve_key" => post(api::resolve_key),
        "cancel_run" => post(api::cancel_run),
        "pause_run" => post(api::pause_run),
        "resume_run" => post(api::resume_run),
        "pause_deployment" => post(api::pause_deployment),
        "resume_deployment" => post(api::resume_deployment),
        "list_deployments" => get(api::list_deployments),
        "list_versions" => get(api::list_versions),
        "upgrade_runs" => post(api::upgrade_runs),
        "rehearse_upgrade" => post(api::rehearse_upgrade),
        "rollback_runs" => post(api::rollback_runs),
        "usage" => get(api::usage),
        "deploy" => post(api::deploy),
        "gc" => post(api::gc),
        "list_schedules" => get(api::list_schedules),
        "create_schedule" => post(api::create_schedule),
        "show_schedule" => get(api::show_schedule),
        "delete_schedule" => axum::routing::delete(api::delete_schedule),
        "pause_schedule" => post(api::pause_schedule),
        "resume_schedule" => post(api::resume_schedule),
        "list_flow" => get(api::list_flow),
        "set_flow" => post(api::set_flow),
        "clear_flow" => post(api::clear_flow),
        "list_rates" => get(api::list_rates),
        "set_rate" => post(api::set_rate),
        "clear_rate" => post(api::clear_rate),
        // A route in the table without a handler: the tests build the router and
        // call every route, so this cannot ship.
        _ => get(|| async { ApiError::new("internal", "route without a handler") }),
    }
}
