//! The host's implementations of the `idem:agent` imports, one file per interface.

mod once;
mod outbound;
mod progress;
mod run_info;

impl super::bindings::idem::agent::types::Host for super::state::InstanceState {}
