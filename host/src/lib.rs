//! idem runs long-lived agents as WebAssembly components and makes their side effects
//! happen exactly once, even when the instance running them is thrown away mid-flight.
//!
//! An agent imports `run-once(key)` from the host. The host claims the key in its
//! store, lets the agent run the side effect, and commits the result and the committed
//! mark in one transaction; a key found committed is handed back without running the
//! side effect again. Progress lives in the store too, so the host can drop an instance
//! at any host call and resume the run on a fresh one, in this process or another.
//!
//! # Layout
//! - [`store`]: durable state behind async role traits summed up as
//!   [`Store`](store::Store) (claims, runs and their leases, components); the SQLite
//!   and PostgreSQL backends.
//! - [`runtime`]: the wasmtime engine, instance lifecycle, and the host imports; a
//!   [`Host`](runtime::Host) drives runs.
//! - [`prove`]: crash-tests an agent at every crash point and checks what it did.
//! - [`worker`]: leases runs from the store's queue and drives many at once.
//! - [`ops`]: what an operator does (submit, resolve, deploy, move runs between versions,
//!   look at a run), shared by the commands and the HTTP API.
//! - [`serve`]: the HTTP API, the web page of runs, and the metrics.
//! - [`text`]: guest- and store-derived text made safe to show.
//!
//! Cargo features pick the parts that are compiled; all are on by default:
//! - `sqlite`: the SQLite backend, `store::SqliteStore`.
//! - `postgres`: the PostgreSQL backend, `store::PostgresStore` (tokio-postgres and
//!   deadpool).
//! - `serve`: the [`serve`] module (axum, prometheus-client, the hyper server).
//! - `prove`: the [`prove`] module; turns on `sqlite`.
//!
//! With `default-features = false, features = ["sqlite"]`, an embedder gets the
//! runtime, workers and operator functions on SQLite and compiles none of the HTTP
//! server, metrics or PostgreSQL client; [`store::open`] refuses the location of a
//! backend left out with [`StoreError::BackendNotBuilt`](store::StoreError::BackendNotBuilt).
//!
//! # Embedding
//! ```no_run
//! use std::sync::Arc;
//! use idem::runtime::{Host, RunOptions, Runtime};
//! use idem::store::{OpenOptions, SqliteStore};
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = SqliteStore::open_with("idem.db".as_ref(), &OpenOptions::default())?;
//! let host = Host::new(Arc::new(Runtime::new(None)?), Arc::new(store))?;
//! let agent = host.runtime().load("agent.wasm".as_ref())?;
//! let report = host.run(&agent, &RunOptions {
//!     run_id: "demo-1".into(),
//!     input: br#"{"items":["a","b"]}"#.to_vec(),
//!     ..RunOptions::default()
//! }).await?;
//! println!("{} instances, {} executed", report.counts.instances, report.counts.executed);
//! # Ok(())
//! # }
//! ```

pub mod ops;
#[cfg(feature = "prove")]
pub mod prove;
pub mod runtime;
#[cfg(feature = "serve")]
pub mod serve;
pub mod store;
pub mod text;
pub mod worker;
