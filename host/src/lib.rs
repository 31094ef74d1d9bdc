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
//! - [`store`]: durable state behind the async [`Store`](store::Store) trait (claims,
//!   runs and their leases, components); the SQLite backend.
//! - [`runtime`]: the wasmtime engine, instance lifecycle, and the host imports; a
//!   [`Host`](runtime::Host) drives runs.
//! - [`prove`]: crash-tests an agent at every crash point and checks what it did.
//! - [`worker`]: leases runs from the store's queue and drives many at once.
//! - [`ops`]: what an operator does (submit, resolve, deploy, look at a run), shared by
//!   the commands and the HTTP API.
//! - [`serve`]: the HTTP API, the web page of runs, and the metrics.
//! - [`text`]: guest- and store-derived text made safe to show.
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
pub mod prove;
pub mod runtime;
pub mod serve;
pub mod store;
pub mod text;
pub mod worker;
