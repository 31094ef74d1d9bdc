//! idem's integration tests: real guests (built by `idem-test-artifacts`) under the real
//! host, side effects counted in real files, state checked in real SQLite stores.

// Test code: a failed unwrap is a failed test, with its message.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod bad_input;
mod batch;
mod bench_guest;
mod blobs;
mod browser;
mod cache;
mod children;
mod cli;
mod compat;
mod crash_sweep;
mod dedupe;
mod disk_faults;
mod doc_links;
mod flow;
mod fork;
mod fuzz_abi;
mod gc;
mod grants;
mod heartbeat;
mod http;
mod in_doubt;
mod kill;
mod lease;
mod limits;
mod live;
mod llm;
mod multi_process;
mod new;
mod operator_text;
#[cfg(feature = "otlp")]
mod otlp;
mod parallel;
mod pause;
mod pg_faults;
mod pinning;
mod postgres;
mod power_loss;
mod progress;
mod prove;
mod python;
mod rates;
mod recycle;
mod rehearse;
mod rogue;
mod schedules;
mod sealing;
mod serve;
mod spans;
mod store_faults;
mod util;
mod version;
mod versions;
mod waits;
pub mod workers;
