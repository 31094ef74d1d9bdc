//! Retention: what gc deletes, and what it reports it deleted.

use std::time::Duration;

use super::Millis;
#[cfg(doc)]
use super::{OperatorStore, WorkerStore};

/// What [`OperatorStore::gc`] deletes: finished runs, and the keys, claims, progress, logs,
/// waits and components only they used.
///
/// Times are ages measured back from the store's own clock ([`WorkerStore::now`]), so every
/// handle on a store collects the same rows whoever asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcRequest {
    /// Runs that finished at least this long ago go (their record, input, outcome,
    /// checkpoint, log, waits, signals and upgrades).
    pub finished_before: Duration,
    /// Keys committed (or, for a claim never committed, claimed) less than this long
    /// ago stay, even when the run that committed them goes: a run reusing such a key
    /// finds its result and does not run its step again. A key left behind by a
    /// deleted run goes at a later gc, once it is older than the window.
    pub dedupe_window: Duration,
    /// Failed runs count as finished too. They are resumable (submitting one again
    /// resumes it), so by default they stay.
    pub include_failed: bool,
    /// Finished runs that stay (they finished after `finished_before`) keep only their
    /// last checkpoint once they finished at least this long ago: their step history
    /// goes, and a fork of them is refused. `None` keeps it while the run stays.
    pub history_before: Option<Duration>,
    /// Count what would go, and delete nothing.
    pub dry_run: bool,
}

/// What [`OperatorStore::gc`] deleted (or, on a dry run, would delete): rows, per table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct GcReport {
    /// Runs, each with its input and outcome.
    pub runs: u64,
    /// Committed keys (results).
    pub results: u64,
    /// Claims never committed (released, or left by a run that stopped).
    pub claims: u64,
    /// Checkpoints: those of the runs deleted, and those of runs that stay whose
    /// history went ([`GcRequest::history_before`]).
    pub checkpoints: u64,
    /// Chunks of run logs.
    pub log_chunks: u64,
    /// Durable sleeps and signal waits.
    pub waits: u64,
    /// Signals sent to runs.
    pub signals: u64,
    /// Records of runs moved to another component.
    pub upgrades: u64,
    /// Token usage of model calls, one per step that recorded it.
    pub usage: u64,
    /// Chunks of runs' live streams.
    pub live_chunks: u64,
    /// Events of runs' timelines.
    pub events: u64,
    /// Components no run and no deployment uses.
    pub components: u64,
    /// Large values' blobs no row refers to any more.
    pub blobs: u64,
    /// Runs finished before this time (on the store's clock) were collected.
    pub runs_before: Millis,
    /// Keys committed before this time were collected.
    pub keys_before: Millis,
}

impl GcReport {
    /// Adds `other`'s counts to these.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) fn add(&mut self, other: &GcReport) {
        self.runs += other.runs;
        self.results += other.results;
        self.claims += other.claims;
        self.checkpoints += other.checkpoints;
        self.log_chunks += other.log_chunks;
        self.waits += other.waits;
        self.signals += other.signals;
        self.upgrades += other.upgrades;
        self.usage += other.usage;
        self.live_chunks += other.live_chunks;
        self.events += other.events;
        self.components += other.components;
        self.blobs += other.blobs;
    }

    /// Of a batch of finished runs, each `(position, id, checkpoints past its last)`,
    /// the ids whose history has checkpoints to collect; a dry run, which collects
    /// nothing, counts them here instead.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) fn histories_to_collect(
        &mut self,
        batch: Vec<(i64, String, u64)>,
        dry_run: bool,
    ) -> Vec<String> {
        batch
            .into_iter()
            .filter(|(_, _, extra)| *extra > 0)
            .map(|(_, id, extra)| {
                if dry_run {
                    self.checkpoints += extra;
                }
                id
            })
            .collect()
    }

    /// Rows of every kind, summed.
    pub fn total(&self) -> u64 {
        self.runs
            + self.results
            + self.claims
            + self.checkpoints
            + self.log_chunks
            + self.waits
            + self.signals
            + self.upgrades
            + self.usage
            + self.live_chunks
            + self.events
            + self.components
            + self.blobs
    }
}
