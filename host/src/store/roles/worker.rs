//! [`WorkerStore`]: what a worker needs to lease runs and drive them to an end.

use std::fmt;
use std::time::Duration;

#[cfg(doc)]
use crate::store::InstanceStore;
use crate::store::{
    Acquired, Counts, LeaseState, LeasedRun, Millis, Presence, RunEnd, RunFence, StoreError,
    Suspension, Tick,
};

/// What a worker needs to lease runs and drive them: the store's clock, the queue of
/// runs that are due, the leases it holds on runs (acquired, renewed, given back), a
/// run suspended while it waits, and a run's end.
///
/// Called by the worker loop (`worker.rs`) and by the host driving a run
/// (`runtime/`: the run loop and the heartbeat that renews run leases).
#[async_trait::async_trait]
pub trait WorkerStore: Send + Sync + fmt::Debug {
    /// The time on the store's clock: what every lease is compared with.
    async fn now(&self) -> Result<Millis, StoreError>;

    /// The earliest time after `after` at which a run nobody holds becomes due (a sleep
    /// ends, a wait times out) or a schedule that is not paused ticks, if any: a worker
    /// with nothing due sleeps until then instead of a whole poll.
    async fn next_due(&self, after: Millis) -> Result<Option<Millis>, StoreError>;

    /// Leases up to `max` runs that are queued or running with no live lease (and not
    /// cancelled, not among `skip`) to `worker` for `lease`, oldest first, each with a
    /// new token. Workers calling at once get disjoint runs.
    async fn acquire_runs(
        &self,
        worker: &str,
        max: usize,
        lease: Duration,
        skip: &[String],
    ) -> Result<Vec<LeasedRun>, StoreError>;

    /// Leases run `run_id` to `worker` for `lease` if no other worker holds a live lease
    /// on it. A live lease `worker` itself holds is granted again, with a new token: a
    /// host that asks knows it is not driving the run any more.
    async fn acquire_run(
        &self,
        run_id: &str,
        worker: &str,
        lease: Duration,
    ) -> Result<Acquired, StoreError>;

    /// Renews run leases to `lease` from now; per fence, whether it is still held.
    async fn renew_runs(
        &self,
        fences: &[RunFence],
        lease: Duration,
    ) -> Result<Vec<LeaseState>, StoreError>;

    /// Gives a run lease back without finishing the run, storing its counts and, if
    /// given, a note saying why; the run is free for any worker at once.
    async fn release_run(
        &self,
        fence: &RunFence,
        counts: &Counts,
        note: Option<&str>,
    ) -> Result<(), StoreError>;

    /// Gives the run's lease back while it waits: with its counts, the run stays
    /// running but no worker takes it before `suspension.due`, unless the signal it
    /// waits for is sent (or already was: the run is then due at once).
    async fn suspend_run(
        &self,
        fence: &RunFence,
        counts: &Counts,
        suspension: &Suspension<'_>,
    ) -> Result<(), StoreError>;

    /// Records how the run ended, with its final counts, and ends its lease.
    async fn finish_run(
        &self,
        fence: &RunFence,
        end: RunEnd<'_>,
        counts: &Counts,
    ) -> Result<(), StoreError>;

    /// Makes `holder` (a process's name, as its run leases carry it) known as alive for
    /// as long as the returned [`Presence`] is kept, so that when its process dies,
    /// however it dies, others learn it at once ([`is_gone`](Self::is_gone)) instead of
    /// after its leases. A store that cannot see its holders' processes returns
    /// [`Presence::untold`].
    async fn be_present(&self, holder: &str) -> Result<Presence, StoreError>;

    /// Whether `holder`'s process is known to have died while present. `false` when the
    /// store cannot tell, or the holder withdrew: its leases alone decide then. A
    /// frozen process is not gone.
    async fn is_gone(&self, holder: &str) -> Result<bool, StoreError>;

    /// The holders known to be gone whose run leases may still be live.
    async fn gone_holders(&self) -> Result<Vec<String>, StoreError>;

    /// Ends the live run leases of `holder`, as if they had expired now, so that any
    /// worker takes its runs at once (their claims are taken over by whoever claims
    /// their keys next, in doubt); returns how many ended. Changes nothing, and
    /// returns 0, unless the store knows the holder is gone ([`is_gone`](Self::is_gone)).
    async fn end_leases_of_gone(&self, holder: &str) -> Result<u64, StoreError>;

    /// Fires the ticks of schedules that are due on the store's clock, up to `max`
    /// schedules: per schedule, in one transaction, starts the run of each tick to start
    /// (the latest due, and missed ones up to its catch-up), applies its overlap policy,
    /// and moves its next tick past them. Workers calling at once fire each tick once:
    /// a schedule is fired by one of them, and the others skip it. Ticks that a
    /// schedule did not catch up are counted as missed. Cheap when nothing is due (one
    /// read).
    async fn fire_schedules(&self, max: usize) -> Result<Vec<Tick>, StoreError>;
}
