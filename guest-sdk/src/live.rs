//! The run's live stream: text a step publishes while it runs (a model's tokens as they
//! arrive, progress), shown by `idem logs -f`, `GET /api/runs/{id}/stream` and the web
//! page as it comes.

use crate::Error;
use crate::bindings::idem::agent::live;
pub use crate::bindings::idem::agent::live::LiveError;

/// The largest text one [`publish`] may carry, in bytes (the host's bound).
pub const MAX_CHUNK_BYTES: usize = 16 << 10;

/// Publishes `text` as the next chunk of step `key` (usually the key of the step that
/// is running: its readers show each step's text apart). The host gathers chunks and
/// writes them a few times a second; it never waits for a reader.
///
/// Not durable: text published just before the instance dies may never be seen, and
/// the host keeps only a run's newest text. The step's committed result is the truth,
/// so publish what the result will hold, not something a reader must not miss.
///
/// Fails with [`Error::Live`] for an empty, overlong or invisible key, or a text over
/// [`MAX_CHUNK_BYTES`]; nothing is published then. Empty text publishes nothing.
///
/// ```no_run
/// let key = format!("{}/summary", idem_sdk::run_id());
/// for part in ["Sum", "ming ", "up…"] {
///     idem_sdk::publish(&key, part)?;
/// }
/// # Ok::<(), idem_sdk::Error>(())
/// ```
pub fn publish(key: &str, text: &str) -> Result<(), Error> {
    live::publish(key, text).map_err(Error::Live)
}
