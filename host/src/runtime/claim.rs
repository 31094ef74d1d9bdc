//! The host's record of a claim handed to a guest: what the `claim` resource stands for.

use super::http::ClaimLive;

/// A claim the guest holds. Lives in the instance's resource table; when the instance
/// is dropped the table goes with it and the claim stays in the store, orphaned, exactly
/// as if the process had died.
#[derive(Debug, Clone)]
pub struct ClaimHandle {
    /// The key in the store: the agent's namespace and its key.
    pub(crate) key: String,
    /// The key as the agent wrote it.
    pub(crate) guest_key: String,
    pub(crate) token: u64,
    pub(crate) attempt: u32,
    pub(crate) in_doubt: bool,
    /// The key's place in the run's order of first use: what a crash point's step
    /// counts.
    pub(crate) ordinal: u32,
    /// Whether the claim still stands: cleared when it settles or is found taken over,
    /// which stops requests (and request bodies) made under it.
    pub(crate) live: ClaimLive,
    /// The step's span (`idem.step`), open until the claim is committed or released.
    pub(crate) span: tracing::Span,
    /// When the step first asked for its key: the span's duration counts from here.
    pub(crate) asked: std::time::Instant,
}
