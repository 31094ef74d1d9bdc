//! The idem guest SDK: what an agent links to make its side effects happen exactly once.
//!
//! An agent is a WebAssembly component (`wasm32-wasip2`) exporting the `idem:agent`
//! world. The host may drop its instance at any host call and run it again, with the
//! same input, on a fresh instance; the agent finds its way back through two durable
//! records the host keeps for it:
//!
//! - **keys**: [`run_once`] runs a side effect at most once per committed [`Key`] and
//!   hands back the stored result on every later call, in this run or (with
//!   [`Key::shared`]) in any other;
//! - **a checkpoint**: [`save`] and [`load`] keep where the agent got to and a small
//!   state, so a resumed instance need not replay from the start.
//!
//! Agents reach the network only through [`http`], and only where the operator granted
//! it; requests made inside a side effect carry its idempotency key and fencing token.
//!
//! # Example
//!
//! An agent that sends one greeting per name, at most once each, and resumes where it
//! stopped. Build it as a `cdylib` for `wasm32-wasip2`.
//!
//! ```
//! use idem_sdk::{Agent, Error, Key, load, run_once, save};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Deserialize)]
//! struct Input {
//!     names: Vec<String>,
//! }
//!
//! #[derive(Serialize)]
//! struct Output {
//!     greeted: usize,
//! }
//!
//! struct Greeter;
//!
//! impl Agent for Greeter {
//!     type Input = Input;
//!     type Output = Output;
//!
//!     fn run(input: Input) -> Result<Output, Error> {
//!         // Resume after the last name whose greeting was saved as done.
//!         let start = load::<()>()?.map_or(0, |c| c.step);
//!         for (i, name) in input.names.iter().enumerate().skip(start as usize) {
//!             // Keyed by content, never by time or attempt: a resumed instance
//!             // computes the same key and skips what was already sent.
//!             let key = Key::for_run("greet", name)?;
//!             run_once(&key, |step| {
//!                 // The real side effect; `step.key()` lets the receiver dedupe.
//!                 println!("hello, {name} ({})", step.key());
//!                 Ok::<_, std::io::Error>(())
//!             })?;
//!             save(i as u64 + 1, &())?;
//!         }
//!         Ok(Output { greeted: input.names.len() })
//!     }
//! }
//!
//! idem_sdk::export_agent!(Greeter);
//! # fn main() {}
//! ```
//!
//! # Layout
//!
//! - `agent.rs`: the [`Agent`] trait and [`export_agent!`].
//! - `once.rs`: [`run_once`], [`Step`] and [`Outcome`].
//! - `once_all.rs`: [`run_once_all`]: several steps whose side effects are in flight
//!   together, each under its own claim.
//! - `key.rs`: [`Key`], how a side effect is named.
//! - `retry.rs`: [`run_once_retry`] and [`RetryPolicy`]: retries with durable backoff.
//! - `progress.rs`: [`load`], [`save`] and [`Checkpoint`].
//! - `run_info.rs`: [`run_id`] and [`generation`].
//! - `waits.rs`: [`sleep`], [`sleep_until`] and [`wait_for_signal`]: durable waits that
//!   hold no instance.
//! - `children.rs`: [`spawn`], [`spawn_many`], [`spawn_all`], [`join`], [`join_all`] and
//!   [`join_any`]: child runs started exactly once and waited for durably.
//! - `http.rs`: [`http::Request`], a blocking client on `wasi:http` whose requests
//!   inside [`run_once`] carry the step's key and token, and [`http::send_all`], which
//!   keeps several requests in flight together.
//! - `llm/`: [`llm::Client`], model calls (OpenAI-compatible and Anthropic) as steps
//!   whose committed result is the response body (streamed as it comes with
//!   [`llm::Client::stream`]), and the tool-call loop.
//! - `live.rs`: [`publish`]: text a step shows on the run's live stream while it runs.
//! - `error.rs`: [`Error`].
//! - `bindings.rs`: the raw `wit-bindgen` output for `../wit`; agents never need it.
//!
//! The SDK also compiles for the host's native target, so that the workspace builds and
//! its pure parts ([`Key::shared`], [`Error`]) can be unit tested there; a call into the
//! host outside a component panics.

// The generated bindings name this crate by its path, as agent crates do.
extern crate self as idem_sdk;

mod agent;
#[doc(hidden)]
pub mod bindings;
mod children;
mod error;
pub mod http;
mod key;
mod live;
pub mod llm;
mod once;
mod once_all;
mod progress;
mod retry;
mod run_info;
mod waits;

pub use agent::Agent;
pub use bindings::idem::agent::children::{JoinError, SpawnError};
pub use bindings::idem::agent::types::StepError;
pub use bindings::idem::agent::waits::WaitError;
pub use children::{
    Child, ChildOutcome, ChildSpec, join, join_all, join_any, spawn, spawn_all, spawn_detached,
    spawn_many,
};
pub use error::Error;
pub use key::Key;
pub use live::{LiveError, MAX_CHUNK_BYTES, publish};
pub use once::{InDoubt, Once, Outcome, Step, run_once, run_once_with};
pub use once_all::run_once_all;
pub use progress::{Checkpoint, load, save};
pub use retry::{Failure, RetryPolicy, run_once_retry};
pub use run_info::{generation, run_id};
pub use waits::{sleep, sleep_until, take_token, wait_for_signal};

/// Runtime support for the generated bindings, reached by path from agent crates.
#[doc(hidden)]
pub use wit_bindgen::rt as __rt;

/// What [`export_agent!`] expands to call; not part of the API.
#[doc(hidden)]
pub mod __private {
    pub use crate::agent::run;
}
