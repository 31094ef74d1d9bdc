//! The engine, the instance lifecycle and the host imports.
//!
//! - [`Runtime`] (`engine.rs`, `cache.rs`): one engine per process, components compiled
//!   once and cached on disk (sealed with a per-user key, in a directory only the user
//!   can change), an `InstancePre` per agent.
//! - [`check_grants`] (`grants.rs`): refuses directory grants that would expose the
//!   store or the component cache to an agent; `guest_links.rs` keeps the symbolic
//!   links an agent makes inside its grant.
//! - [`Host`] (`host.rs`): what every run of a process shares. [`Host::run`]
//!   (`foreground.rs`, `deploy.rs`) drives one run in the foreground as
//!   [`RunOptions`] (`options.rs`) say and returns a [`RunReport`] (`report.rs`); a
//!   worker leases runs instead. Either way `drive.rs` creates instances
//!   (`instance.rs`: a fresh wasmtime `Store` each, dropped and never reused), and why
//!   each ended (`end.rs`: one type) becomes what the run does next (`next.rs`),
//!   applied to the store in one place.
//! - `imports/`: the `idem:agent` interfaces, one file each, on the view of `view.rs`
//!   (crate-private: see there why embedders do not link them); `state.rs`: what a
//!   store carries and how its memory is counted; `run_ctx.rs`: what a run carries
//!   between instances and its deadlines; `stop.rs`: how a run is told to stop;
//!   `heartbeat.rs`: lease renewal; `claim.rs`: a claim handed to a guest, and whether
//!   it still stands; `faults.rs`: planned drops; `limits.rs`: what a guest may hand
//!   the host; `names.rs`: run ids and namespaces; `authority.rs`: what a run may
//!   reach; `http/`: the outbound HTTP policy and the gate that holds requests to it;
//!   `exports.rs`: what a component exports, which an upgrade compares;
//!   `capture.rs`: the hook that lets an embedder answer outbound requests itself and
//!   hear of refused ones; `output.rs`: the guest's stderr and stdout, escaped, as the
//!   run's log; `live_text.rs`: the text it publishes, on its way to the run's live
//!   stream; `regular_file.rs`: files a user names, opened without waiting on a
//!   FIFO; `error.rs`: the runtime's errors.

mod agent_bytes;
mod authority;
mod bindings;
mod cache;
mod capture;
mod claim;
mod deploy;
mod drive;
mod end;
mod engine;
mod error;
mod exports;
mod faults;
mod foreground;
mod grants;
mod guest_links;
mod heartbeat;
mod host;
mod http;
mod imports;
mod instance;
mod limits;
mod live_text;
mod names;
mod next;
mod options;
mod output;
mod regular_file;
mod report;
mod run_ctx;
mod signal;
mod state;
mod stop;
mod view;

pub use authority::{Authority, AuthorityError, DirGrant};
pub use cache::{CacheError, UnsafeDir, default_cache_dir};
pub use capture::{
    CaptureError, CaptureFuture, CapturedRequest, CapturedResponse, DenialKind, DeniedRequest,
    HttpCapture, MAX_CAPTURED_BODY,
};
#[cfg(feature = "prove")]
pub(crate) use deploy::load_stored;
pub use deploy::local_source;
pub use engine::{CompileNotice, DEFAULT_INSTANCES, LoadedAgent, MAX_INSTANCES, Runtime};
pub use error::{Exposes, GrantError, HostError};
pub use faults::{CrashPoint, CrashPointError, FaultPlan, Phase, Recycle};
pub use grants::{Protected, check_grants};
pub use host::Host;
pub use http::{
    DEFAULT_KEY_HEADER, DEFAULT_TOKEN_HEADER, HttpDestination, HttpDestinationError, HttpPolicy,
};
pub use limits::{InvalidLimit, LimitExceeded, Limits};
pub use names::{check_namespace, check_run_id};
pub use options::RunOptions;
pub use output::{Echo, LOG_KEEP};
pub use regular_file::open_regular_file;
pub use report::{Rebuilt, RunFailure, RunReport, Waiting};
pub use signal::send_signal;
pub use stop::{Stop, StopSignal};

#[cfg(feature = "prove")]
pub(crate) use limits::cut;
pub(crate) use output::LogSink;
pub(crate) use stop::RunSignals;
