//! What the agent may know about the run it serves.

use crate::bindings::idem::agent::run_info;

/// The run's id: stable across instances and host restarts, so it may go into keys
/// (as [`Key::for_run`](crate::Key::for_run) does) and into logs.
///
/// ```no_run
/// println!("serving run {}", idem_sdk::run_id());
/// ```
pub fn run_id() -> String {
    run_info::run_id()
}

/// How many instances the host created for this run before this one: 0 for the first,
/// higher after each crash, kill or recycle. For logs and tests only: an agent whose
/// effects depend on it is no longer replay-safe.
///
/// ```no_run
/// if idem_sdk::generation() > 0 {
///     println!("resumed after {} lost instances", idem_sdk::generation());
/// }
/// ```
pub fn generation() -> u32 {
    run_info::generation()
}
