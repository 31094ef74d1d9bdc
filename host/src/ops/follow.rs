//! Following a run as it goes: its live stream's chunks as they reach the store, then
//! its end. What `idem logs -f` and `GET /api/runs/{id}/stream` both read.

use std::time::Duration;

use crate::store::{LiveChunk, OperatorStore, RunStatus, StoreError};

/// How often a follower looks at the store for new chunks: the instance flushes them
/// every ~150 ms, so a reader sees text within a few hundred milliseconds.
pub const FOLLOW_POLL: Duration = Duration::from_millis(200);

/// Chunks read from the store at once.
const BATCH: usize = 256;

/// What a follower read next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Followed {
    /// New chunks of the run's live stream, oldest first.
    Chunks(Vec<LiveChunk>),
    /// The run ended (or is gone, `None`: collected meanwhile) with no chunk left
    /// unread: nothing more will come.
    Ended(Option<RunStatus>),
}

/// Reads a run's live stream after a sequence number, one batch at a time.
///
/// ```no_run
/// # async fn f(store: &dyn idem::store::OperatorStore) -> Result<(), idem::store::StoreError> {
/// use idem::ops::{Follow, Followed};
///
/// let mut follow = Follow::new("run-1", None);
/// loop {
///     match follow.next(store).await? {
///         Followed::Chunks(chunks) => chunks.iter().for_each(|c| print!("{}", c.text)),
///         Followed::Ended(status) => break println!("\nended: {status:?}"),
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Follow {
    run_id: String,
    after: Option<u64>,
}

impl Follow {
    /// Follows `run_id` from the chunk after `after` (from the oldest kept for `None`).
    pub fn new(run_id: &str, after: Option<u64>) -> Follow {
        Follow {
            run_id: run_id.to_owned(),
            after,
        }
    }

    /// The sequence number of the last chunk handed out (or given to [`Follow::new`]).
    pub fn after(&self) -> Option<u64> {
        self.after
    }

    /// Waits for the next chunks, or the run's end. Dropping the future while it waits
    /// loses nothing: the position moves only when chunks are returned.
    pub async fn next(&mut self, store: &dyn OperatorStore) -> Result<Followed, StoreError> {
        loop {
            // The status first: an instance writes its last chunks before its run's
            // end, so chunks read after an ended status are all there will be.
            let status = store.run(&self.run_id).await?.map(|r| r.status);
            let chunks = store.live(&self.run_id, self.after, BATCH).await?;
            if let Some(last) = chunks.last() {
                self.after = Some(last.seq);
                return Ok(Followed::Chunks(chunks));
            }
            match status {
                Some(status) if !status.is_finished() => {}
                ended => return Ok(Followed::Ended(ended)),
            }
            tokio::time::sleep(FOLLOW_POLL).await;
        }
    }
}
