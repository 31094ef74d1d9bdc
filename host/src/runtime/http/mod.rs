//! Outbound HTTP for agents (`wasi:http`): which destinations an agent may reach, the
//! refusal of requests made outside any claim, and the idempotency headers stamped on
//! every request made while a claim is held.
//!
//! The policy is enforced in wasmtime-wasi-http's `send_request` hook, the one place
//! every outgoing request passes through after the guest has built it: a refused
//! request never opens a connection, and the guest sees `error-code.HTTP-request-denied`.
//! A request made under a claim is bound to it: once the claim settles (or the host
//! learns it was taken over), the rest of the request's body is not sent, so no part of
//! a side effect goes out after its claim ended. A run given a capture (`capture.rs`)
//! has its admitted requests answered by the capture instead of the network, and its
//! refused ones reported to it.
//!
//! `policy.rs`: what a run may reach; `gate.rs`: the hook that holds each request to
//! it.

mod gate;
mod policy;

pub(crate) use gate::HttpGate;
pub use gate::{DEFAULT_KEY_HEADER, DEFAULT_TOKEN_HEADER};
pub use policy::{HttpDestination, HttpDestinationError, HttpPolicy};
