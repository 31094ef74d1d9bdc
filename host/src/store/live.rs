//! Runs' live streams: text a step publishes while it runs (a model's tokens, progress),
//! kept a while so that `idem logs -f`, `GET /api/runs/{id}/stream` and the web page can
//! show it as it comes. Written by a running instance
//! ([`InstanceStore::append_live`](crate::store::InstanceStore::append_live)), fenced
//! like its log; read by an operator after a sequence number
//! ([`OperatorStore::live`](crate::store::OperatorStore::live)).
//!
//! Not durable by design: a crash loses what the instance had not flushed, and the store
//! keeps only a run's last [`LIVE_KEEP`] bytes (the oldest rows trimmed). The step's
//! committed result is the truth; the stream is a view of it being made.

/// How much of a run's live stream the store keeps: its last bytes of text, in whole
/// chunks (the oldest go first).
pub const LIVE_KEEP: usize = 256 << 10;

/// The largest text one `publish` may carry, in bytes: a few screens, so that one call
/// cannot fill the stream's bound alone.
pub const MAX_LIVE_CHUNK_BYTES: usize = 16 << 10;

/// Text published under a step's key, on its way to the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveText {
    /// The step's key, as the agent named it.
    pub key: String,
    /// The text (escaped by the host: no control characters reach a reader's terminal).
    pub text: String,
}

/// One chunk of a run's live stream as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LiveChunk {
    /// Its place in the run's stream: increasing, never reused while the run exists
    /// (trimmed chunks leave a gap at the start).
    pub seq: u64,
    /// The step's key, as the agent named it.
    pub key: String,
    /// The text.
    pub text: String,
}
