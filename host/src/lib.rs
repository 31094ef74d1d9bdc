//! idem runs long-lived agents as WebAssembly components and makes their side effects
//! happen exactly once, even when the instance running them is thrown away mid-flight.
//!
//! An agent imports `run-once(key)` from the host. The host claims the key in its
//! store, lets the agent run the side effect, and commits the result and the committed
//! mark in one transaction; a key found committed is handed back without running the
//! side effect again. Progress lives in the store too, so the host can drop an instance
//! at any host call and resume the run on a fresh one.
//!
//! # Layout
//! - [`store`]: durable state behind the [`Store`](store::Store) trait; SQLite backend.
//! - [`runtime`]: the wasmtime engine, instance lifecycle, and the host imports.
//! - `cli` (binary only): the `idem` command.
//!
//! # Embedding
//! ```no_run
//! use std::sync::Arc;
//! use idem::runtime::{Host, Limits, RunOptions, Runtime};
//! use idem::store::{SqliteStore, SyncMode};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = SqliteStore::open("idem.db".as_ref(), SyncMode::Normal)?;
//! let host = Host::new(Arc::new(Runtime::new(None)?), Arc::new(store), Limits::default());
//! let agent = host.runtime().load("agent.wasm".as_ref())?;
//! let report = host.run(&agent, &RunOptions {
//!     run_id: "demo-1".into(),
//!     input: br#"{"items":["a","b"]}"#.to_vec(),
//!     ..RunOptions::default()
//! })?;
//! println!("{} instances, {} executed", report.counts.instances, report.counts.executed);
//! # Ok(())
//! # }
//! ```

pub mod runtime;
pub mod store;
