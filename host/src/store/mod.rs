//! Durable state behind backend-neutral, async traits: committed results, claims
//! (with leases and fencing tokens), runs and the leases workers hold on them,
//! checkpoints, logs, and the components and deployments runs are made from.
//!
//! The rules every backend keeps, whatever its storage:
//! - a key is committed at most once, and its result never changes afterwards;
//! - a commit succeeds only for the current holder of the key's claim (its token);
//!   the result and the end of the claim are one transaction;
//! - a claim whose lease expired may be taken by another holder, who gets a strictly
//!   greater token; the old holder's commit is then refused;
//! - fencing tokens increase per key: each grant of a key gets a greater token than
//!   every earlier grant of that key;
//! - a run is leased by at most one worker at a time; every write made for a run
//!   presents the run's lease token ([`RunFence`]) and is refused, changing nothing,
//!   once another lease was granted ([`StoreError::LeaseLost`]);
//! - every lease (of a claim or of a run) is compared with the store's own clock
//!   ([`Clock`]), never with the caller's: workers sharing a store share one time.
//!
//! # Roles
//! The store is split by who calls it, each role a small trait, and [`Store`] is their
//! sum (what a backend is, and what the host, a worker and the HTTP API hold):
//! - [`InstanceStore`], a running instance: claim, take over, commit, release, renew
//!   and park its keys; read a committed result; load and save its checkpoint and
//!   counts; append to its log and its live stream; record a durable wait; spawn a child run exactly once
//!   and join children.
//! - [`WorkerStore`], a worker driving runs: the store's clock, the next due time,
//!   acquiring, renewing and giving back run leases, suspending a run that waits,
//!   finishing a run (a child's end counts down its parent's join, in the same
//!   transaction); whether a holder's process lives, and ending the leases of one
//!   that is gone.
//! - [`CatalogStore`], what runs are made from: components by digest, deployments,
//!   the components a namespace admits, moving a run to another component.
//! - [`OperatorStore`], an operator: submit, list and look at runs (record, authority,
//!   steps, open claims, waits, log, live stream, timeline), cancel, resolve a parked key, send a signal, gc;
//!   create, list, pause, resume and delete schedules (`schedules.rs`), whose ticks
//!   workers fire ([`WorkerStore::fire_schedules`]).
//!
//! A decorator implements the one role it observes, and an [`Overlay`] makes it a
//! whole store with the underlying store's other roles (`roles/overlay.rs` says why
//! this way).
//!
//! # Where the next features land
//! - Flow control: concurrency limits are kept where runs are leased
//!   ([`WorkerStore::acquire_runs`]) and rate-limit token buckets where a step takes
//!   its claim ([`InstanceStore::claim`]); a limit's setting belongs to its deployment
//!   ([`CatalogStore`]).
//! - Versioned deployments and upgrades: [`CatalogStore`] (deployments keep their
//!   history; [`CatalogStore::upgrade_run`] is already there).
//! - Blobs (large payloads stored by digest): written and read by the instance whose
//!   step or checkpoint carries them, in the same transaction: [`InstanceStore`];
//!   collected by [`OperatorStore::gc`].
//! - Step history: read by operators beside [`OperatorStore::steps`] and
//!   [`OperatorStore::waits`]: [`OperatorStore`]. A run's timeline is there already
//!   ([`OperatorStore::events`]), written by the backends inside the writes that
//!   grant, start, suspend, release and end a run's instances
//!   ([`InstanceStore::start_instance`]).
//!
//! # Layout
//! - `mod.rs`: the roles, what lands where, and the re-exports.
//! - `roles/`: one file per role trait, [`Store`] their sum, and [`Overlay`].
//! - `fence.rs`, `claims.rs`, `progress.rs`, `runs.rs`, `children.rs`, `deploy.rs`,
//!   `waits.rs`, `gc.rs`, `schedules.rs`: the values the roles speak in, by topic.
//! - `events.rs`: a run's timeline ([`Timeline`]): its event kinds and its bound.
//! - `values/`: [`ValueStore`], the layer every value crosses: sealed (`sealing/`)
//!   when the store is encrypted, and kept once by digest when large (`values/blobs.rs`).
//! - `sealing/`: encryption at rest: the store key, data keys and sealed values.
//! - `clock.rs`: the store's time, and a manual clock tests drive.
//! - `error.rs`: [`StoreError`] and [`DatabaseFault`], in no backend's words.
//! - `parked.rs`: the keys a run parked in doubt, as an operator names them.
//! - `presence.rs`: whether a holder's process lives ([`WorkerStore::be_present`]).
//! - `open.rs`: opening a store by its location, with the backends this build has.
//! - `rules/`: the decisions both backends make alike (claims, tokens, leases, waits,
//!   the values a store cannot keep, gc); the backends share nothing else and never
//!   import each other.
//! - `sqlite/`: the SQLite backend (cargo feature `sqlite`); `migrations/sqlite/`: its
//!   numbered schema.
//! - `postgres/`: the PostgreSQL backend (cargo feature `postgres`);
//!   `migrations/postgres/`: its numbered schema.

mod children;
mod claims;
mod clock;
mod deploy;
mod error;
mod events;
mod fence;
mod flow;
mod gc;
mod history;
mod live;
#[cfg(test)]
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod model_tests;
mod open;
mod parked;
mod pause;
#[cfg(feature = "postgres")]
mod postgres;
mod presence;
mod progress;
mod rates;
mod roles;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod rules;
mod runs;
mod schedules;
mod sealing;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(test)]
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod tests;
mod usage;
mod values;
mod waits;

pub use children::{
    ChildEnd, ChildRecord, ChildSpec, JoinMode, SpawnAnswers, SpawnBatch, SpawnLimits,
    SpawnRefusal, SpawnRequest, Spawned, child_ended, child_run_id,
};
pub use claims::{
    ClaimOutcome, ClaimRef, ClaimRequest, Commit, Grant, HeldClaim, OpenClaim, Rated, Resolution,
    StepRecord,
};
pub use clock::Clock;
pub use deploy::{
    Admission, Deployed, Deployment, DeploymentRecord, InFlight, MoveReason, MoveRuns, MoveTo,
    Rollout, RunMove, VersionRecord,
};
pub use error::{DatabaseFault, StoreError};
pub use events::{EVENTS_HEAD, EVENTS_TAIL, EventKind, RunEvent, Timeline};
pub use fence::{ParseSyncModeError, RunFence, SyncMode};
pub(crate) use flow::{FlowCounts, Limit, check_setting, key_of};
pub use flow::{FlowLimits, FlowRefusal, FlowSetting, MAX_FLOW_LIMIT, MAX_PRIORITY};
pub use gc::{GcReport, GcRequest};
pub(crate) use history::tick;
pub use history::{
    ForkRefusal, ForkRequest, Forked, HISTORY_KEEP, HISTORY_KEEP_LARGE, HistoryCheckpoint,
    HistoryStep, Position, RunHistory, SavedCheckpoint, fork_namespace,
};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) use history::{check_fork_exports, fork_events, fork_key, plan_fork, steps_before};
pub use live::{LIVE_KEEP, LiveChunk, LiveText, MAX_LIVE_CHUNK_BYTES};
pub use open::{Location, StoreOptions, is_postgres_url, open};
pub use parked::{ParkedKeys, ParkedMatch, qualified_key};
pub use pause::{DeploymentPaused, Paused, PausedBy, PausedDeployment, Resumed};
#[cfg(feature = "postgres")]
pub use postgres::{PostgresOptions, PostgresStore};
pub use presence::Presence;
pub use progress::{Checkpoint, Counts, MAX_STEP};
pub(crate) use rates::{Bucket, check_rate};
pub use rates::{
    MAX_CLASS_NAME_BYTES, MAX_RATE, MAX_RATE_PERIOD, RateLimit, RateRefusal, RateSetting,
    check_class_name,
};
pub use roles::{CatalogStore, InstanceStore, OperatorStore, Overlay, Store, WorkerStore};
pub use runs::{
    Acquired, Cancelled, LeaseState, LeasedRun, RunEnd, RunFilter, RunLeaseInfo, RunRecord,
    RunStatus, Submission, Submitted,
};
pub use schedules::{
    MAX_CATCH_UP, MAX_EVERY_MS, MAX_SCHEDULE_NAME_BYTES, MIN_EVERY_MS, Overlap, Plan, ScheduleDef,
    ScheduleRecord, ScheduleSpec, ScheduledBy, SpecError, Tick, TickCounts, TickOutcome,
    schedule_run_id, tick_text,
};
pub(crate) use sealing::Payloads;
pub use sealing::{
    DataKeyRecord, MAGIC as SEALED_MAGIC, RekeyReport, SealError, Sealer, StoreKey, rewrap,
};
#[cfg(feature = "sqlite")]
pub use sqlite::{OpenOptions, SqliteStore};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) use usage::check_usage;
pub use usage::{
    MAX_CALL_TOKENS, MAX_MODEL_BYTES, Recorded, Tokens, UsageFilter, UsageRecord, UsageRefusal,
    UsageTotal,
};
pub use values::blobs::{BLOB_FROM, BlobDigest};
pub use values::{BLOB_GRACE, ValueStore};
pub(crate) use waits::check_signal_payload;
pub use waits::{
    JoinRefusal, JoinRequest, MAX_SIGNAL_NAME_BYTES, MAX_WAIT, SignalSent, Suspension, WaitKind,
    WaitRecord, WaitRequest, WaitState, Wake, check_signal_name, rate_wait_key,
};

/// Milliseconds since the Unix epoch: the unit of every lease and timestamp in a store.
pub type Millis = i64;
