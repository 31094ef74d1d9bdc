//! Store behaviour, written once and run against every backend: each backend adds a
//! [`Harness`] and one `store_tests!` line.
//!
//! Every test runs on a manual [`Clock`] that starts at [`T0`]: leases run out when a
//! test moves the clock, never because a machine was slow.
//!
//! # Layout
//! - `mod.rs`: the harness, the list of tests, and helpers every topic uses.
//! - `claims.rs`: the claim → commit protocol, parking and resolving.
//! - `runs.rs`: submitting, progress, counts, outcomes, cancel, logs.
//! - `leases.rs`: run leases and fences.
//! - `deploy.rs`: components, deployments and namespaces.
//! - `versions.rs`: versions of a deployment, rollouts, moving runs and back.
//! - `events.rs`: runs' timelines: what each lease, instance and operator records.
//! - `history.rs`: runs' step histories, forks made from them, and their collection.
//! - `flow.rs`: limits on running runs, concurrency keys, priorities.
//! - `waits.rs`: sleeps, signals and suspended runs.
//! - `schedules.rs`: schedules, their ticks and policies.
//! - `pause.rs`: pausing and resuming runs and deployments.
//! - `usage.rs`: token usage of model calls, spent once per key and saved per replay.
//! - `blobs.rs`: large values kept once by digest, and collected.
//! - `gc.rs`: retention: what gc deletes, what it keeps, and tokens across a deletion.
//! - `shared.rs`: what takes more than one handle: reopening, races between handles.
//! - `postgres_harness.rs`: a schema of its own per test on a real PostgreSQL server
//!   (`IDEM_TEST_POSTGRES`).

mod blobs;
mod children;
mod claims;
mod deploy;
mod events;
mod flow;
mod gc;
mod history;
mod leases;
mod live;
mod pause;
#[cfg(feature = "postgres")]
pub(crate) mod postgres_harness;
mod runs;
mod schedules;
mod sealing;
mod shared;
mod usage;
mod versions;
mod waits;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::{
    Acquired, ClaimOutcome, ClaimRef, ClaimRequest, Clock, Grant, Millis, RunFence, Store,
    Submission, Submitted, SyncMode,
};
#[cfg(feature = "sqlite")]
use super::{OpenOptions, SqliteStore};

/// Runs a future to completion on a runtime of its own: store tests are synchronous
/// `#[test]`s that drive the async store.
pub(crate) fn block_on<F: Future>(future: F) -> F::Output {
    // With timers: the PostgreSQL store bounds every call with a timeout.
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
        .block_on(future)
}

/// A fresh, empty database of one backend, owned for the length of a test.
pub(crate) trait Harness {
    /// Creates the database and opens a handle on it whose time is `clock`; `None`
    /// when the backend is not available here and its tests are skipped (they say so).
    fn create(clock: &Clock) -> Option<Self>
    where
        Self: Sized;
    /// The open handle.
    fn store(&self) -> Arc<dyn Store>;
    /// Closes the handle and opens the same database again, as a restarted host would.
    fn reopen(&mut self);
    /// Opens a second, independent handle on the same database, as another process
    /// would.
    fn open_another(&self) -> Arc<dyn Store>;
    /// How many rows `table` holds, counted in the database itself, not through the
    /// store.
    fn rows(&self, table: &str) -> u64;
    /// Whether the database's own bytes hold `needle`: for SQLite its files (WAL
    /// included); for PostgreSQL its rows and, where this process may read them, the
    /// server's WAL files. Looked for as the bytes and as their hex (PostgreSQL's text of
    /// a `bytea`).
    fn raw_holds(&self, needle: &[u8]) -> bool;
}

/// What a store test works with: the store and the clock it reads.
pub(super) struct Env<'a> {
    pub(super) store: &'a dyn Store,
    pub(super) clock: &'a Clock,
}

/// Instantiates every test below for one backend, in a module named `$backend`.
macro_rules! store_tests {
    ($backend:ident: $harness:ident) => {
        store_tests!(@expand $backend: $harness;
            store: [
                claims::first_claim_is_granted,
                claims::second_claimant_sees_held,
                claims::commit_then_claim_returns_result,
                claims::stale_commit_after_takeover_is_refused,
                claims::refused_commit_writes_nothing,
                claims::release_lets_next_claim_retake,
                claims::release_and_renew_need_the_current_token,
                claims::renew_keeps_the_claim,
                claims::renewing_with_a_zero_lease_ends_the_leases,
                claims::expired_lease_is_taken_over_in_doubt,
                claims::take_over_with_matching_token,
                claims::take_over_with_other_token_reports_holder,
                claims::take_over_of_committed_key_returns_result,
                claims::tokens_increase_per_key,
                claims::open_claims_by_run,
                claims::steps_are_listed_in_the_order_they_were_claimed,
                claims::park_blocks_the_key_until_resolved_with_a_result,
                claims::resolve_retry_releases_the_key,
                claims::park_and_resolve_need_the_right_token_and_run,
                claims::retakes_in_doubt_are_counted_in_their_run,
                claims::commit_with_progress_is_one_transaction,
                claims::fingerprints_bind_keys_to_their_input,
                usage::usage_is_spent_once_per_key_and_replays_are_saved,
                usage::usage_of_a_step_the_run_did_not_commit_is_refused,
                runs::submit_creates_a_queued_run_once,
                runs::submit_with_other_input_is_refused,
                runs::submit_needs_the_component,
                runs::a_batch_answers_each_run_as_a_lone_submit_would,
                runs::a_mixed_batch_meets_its_own_earlier_members,
                runs::submit_resumes_a_failed_run_and_may_replace_its_authority,
                runs::progress_round_trip_stores_counts,
                runs::runs_are_listed_newest_first_and_filtered,
                runs::finish_run_records_the_outcome_and_ends_the_lease,
                runs::finish_in_doubt_keeps_the_reason_park_stored,
                runs::finish_cancelled_releases_the_runs_open_claims,
                runs::cancel_run_in_each_case,
                runs::upgrade_moves_a_run_to_another_component,
                runs::values_a_store_cannot_keep_are_refused_and_write_nothing,
                runs::logs_keep_the_last_bytes_across_appends,
                events::a_timeline_records_each_instance_takeover_wait_and_end,
                events::operators_writes_are_on_the_timeline,
                events::a_timeline_keeps_its_first_and_last_events,
                live::live_chunks_are_numbered_per_run_and_read_after_a_number,
                live::live_streams_keep_their_newest_bytes_and_rows,
                leases::acquire_runs_takes_the_oldest_free_runs,
                leases::a_queue_lease_counts_its_first_instance_and_carries_the_checkpoint,
                leases::an_expired_lease_is_acquired_again_with_a_greater_token,
                leases::acquire_run_reports_held_finished_and_unknown,
                leases::every_fenced_write_with_a_stale_fence_is_refused_and_writes_nothing,
                leases::a_lease_given_back_fences_its_own_writes,
                leases::renew_runs_reports_held_lost_and_cancel_requests,
                leases::release_run_frees_the_run_at_once,
                leases::resolve_frees_the_run_for_any_worker,
                deploy::put_component_is_idempotent,
                deploy::deploy_points_a_name_and_redeploying_is_a_no_op,
                deploy::deploy_needs_the_component,
                deploy::deployments_lists_what_each_name_points_at,
                deploy::first_use_admission_keeps_namespaces_apart,
                deploy::runs_make_their_components_members,
                deploy::a_rebuild_from_the_same_source_joins_and_nothing_else_does,
                versions::versions_count_up_and_pinned_runs_stay,
                versions::an_upgrade_rollout_moves_runs_in_flight_and_records_each,
                versions::runs_move_to_a_version_and_back,
                versions::bad_moves_are_refused_and_change_nothing,
                versions::a_dev_upgrade_is_recorded_with_its_versions,
                history::a_runs_history_keeps_its_steps_and_checkpoints_in_order,
                history::a_fork_reuses_the_steps_before_and_runs_the_rest_under_its_keys,
                history::bad_forks_are_refused_and_change_nothing,
                history::gc_collects_a_finished_runs_history_when_asked,
                waits::a_sleep_keeps_its_first_wake_time_and_elapses_on_the_clock,
                waits::a_suspended_run_is_leased_only_when_due_in_due_order,
                waits::a_signal_is_taken_once_by_the_wait_that_records_it,
                waits::a_signal_sent_between_a_wait_and_its_suspension_is_not_missed,
                waits::bad_signals_and_waits_are_refused_and_write_nothing,
                waits::a_rate_token_is_reserved_once_at_the_next_free_slot,
                waits::a_rated_claim_takes_its_token_and_claims_in_one_go,
                children::a_spawn_happens_once_per_key_with_the_deployments_grants,
                children::bad_spawns_are_refused_and_write_nothing,
                children::a_batch_answers_each_child_as_a_spawn_of_it_alone_would,
                children::a_parent_joining_all_is_due_once_when_its_last_child_ends,
                children::a_join_of_any_takes_the_first_child_to_end,
                children::a_child_ending_before_the_suspension_makes_the_parent_due_at_once,
                children::bad_joins_are_refused_and_write_nothing,
                children::a_join_times_out_on_the_stores_clock,
                children::cancelling_a_parent_cancels_its_children_but_not_detached_ones,
                pause::a_paused_run_is_not_leased_until_resumed,
                pause::a_held_run_learns_its_pause_at_renewal_and_parks_holding_nothing,
                pause::a_paused_suspended_run_keeps_its_signal_and_wakes_when_resumed,
                pause::pausing_finished_or_unknown_runs_is_refused_and_changes_nothing,
                pause::a_paused_deployment_pauses_its_runs_and_every_run_started_under_it,
                gc::a_deleted_key_granted_again_gets_a_greater_token,
                gc::keys_inside_the_dedupe_window_outlive_their_run,
                gc::failed_runs_stay_unless_asked_and_live_claims_always,
                schedules::a_tick_starts_one_run_of_the_deployment_once,
                schedules::late_ticks_are_caught_up_to_the_limit_and_the_rest_missed,
                schedules::overlapping_ticks_skip_allow_or_cancel_the_previous_run,
                schedules::paused_schedules_fire_nothing_and_resume_from_now,
                schedules::cron_ticks_fall_in_their_time_zone,
                schedules::bad_schedules_are_refused_and_write_nothing,
                flow::a_deployment_limit_holds_across_workers,
                flow::a_concurrency_key_serialises_runs_per_key,
                flow::priorities_lease_highest_first_then_oldest,
                flow::bad_flow_settings_are_refused_and_change_nothing,
            ];
            harness: [
                shared::reopening_keeps_everything,
                shared::two_handles_race_for_claims,
                shared::two_handles_acquire_disjoint_runs,
                gc::gc_deletes_exactly_a_finished_runs_rows_and_a_dry_run_nothing,
                schedules::two_handles_fire_each_tick_once,
                flow::racing_handles_never_exceed_a_limit,
                waits::racing_handles_never_lend_one_token_twice,
            ]
        );
    };
    (@expand $backend:ident: $harness:ident;
        store: [$($module:ident :: $store_test:ident),* $(,)?];
        harness: [$($hmodule:ident :: $harness_test:ident),* $(,)?]
    ) => {
        mod $backend {
            use super::Harness as _;
            $(
                #[test]
                fn $store_test() {
                    let clock = super::Clock::manual(super::T0);
                    let Some(harness) = super::$harness::create(&clock) else { return };
                    let store = harness.store();
                    let env = super::Env { store: store.as_ref(), clock: &clock };
                    super::block_on(super::$module::$store_test(&env));
                }
            )*
            $(
                #[test]
                fn $harness_test() {
                    let clock = super::Clock::manual(super::T0);
                    let Some(mut harness) = super::$harness::create(&clock) else { return };
                    super::block_on(super::$hmodule::$harness_test(&mut harness, &clock));
                }
            )*
        }
    };
}

#[cfg(feature = "sqlite")]
store_tests!(sqlite: SqliteHarness);
#[cfg(feature = "postgres")]
store_tests!(postgres: PostgresHarness);
// Every test again on stores encrypted at rest: sealing must change nothing a caller
// sees, whatever the store compares, copies or cuts inside (`sealing.rs`).
#[cfg(feature = "sqlite")]
store_tests!(sqlite_sealed: SealedSqlite);
#[cfg(feature = "postgres")]
store_tests!(postgres_sealed: SealedPostgres);
#[cfg(feature = "sqlite")]
type SealedSqlite = sealing::SealedHarness<SqliteHarness>;
#[cfg(feature = "postgres")]
type SealedPostgres = sealing::SealedHarness<PostgresHarness>;

#[cfg(feature = "postgres")]
pub(crate) use postgres_harness::PostgresHarness;

/// A SQLite store in a file of its own temporary directory: real WAL, real locks.
#[cfg(feature = "sqlite")]
pub(crate) struct SqliteHarness {
    dir: tempfile::TempDir,
    clock: Clock,
    store: Option<Arc<SqliteStore>>,
}

#[cfg(feature = "sqlite")]
impl SqliteHarness {
    fn open(&self) -> Arc<SqliteStore> {
        let options = OpenOptions {
            clock: self.clock.clone(),
            ..OpenOptions::default()
        };
        Arc::new(SqliteStore::open_with(&self.dir.path().join("idem.db"), &options).unwrap())
    }
}

#[cfg(feature = "sqlite")]
impl Harness for SqliteHarness {
    fn create(clock: &Clock) -> Option<Self> {
        let mut harness = SqliteHarness {
            dir: tempfile::tempdir().unwrap(),
            clock: clock.clone(),
            store: None,
        };
        harness.store = Some(harness.open());
        Some(harness)
    }

    fn store(&self) -> Arc<dyn Store> {
        self.store.clone().unwrap()
    }

    fn reopen(&mut self) {
        // Dropped first, so the file is really closed (and its WAL checkpointed).
        self.store = None;
        self.store = Some(self.open());
    }

    fn open_another(&self) -> Arc<dyn Store> {
        self.open()
    }

    fn rows(&self, table: &str) -> u64 {
        let conn = rusqlite::Connection::open(self.dir.path().join("idem.db")).unwrap();
        conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |row| {
            row.get::<_, i64>(0)
        })
        .map(|n| n as u64)
        .unwrap()
    }

    fn raw_holds(&self, needle: &[u8]) -> bool {
        let hex = sealing::hex(needle);
        std::fs::read_dir(self.dir.path()).unwrap().any(|entry| {
            let bytes = std::fs::read(entry.unwrap().path()).unwrap_or_default();
            sealing::contains(&bytes, needle) || sealing::contains(&bytes, hex.as_bytes())
        })
    }
}

pub(super) const T0: Millis = 1_700_000_000_000;
pub(crate) const LEASE: Duration = Duration::from_secs(10);
pub(super) const LEASE_MS: Millis = 10_000;
/// Run leases outlast every claim lease in these tests unless a test says otherwise.
pub(super) const RUN_LEASE: Duration = Duration::from_secs(3600);
pub(super) const RUN_LEASE_MS: Millis = 3_600_000;
/// The component every test run is made from.
pub(super) const DIGEST: &str = "ab12";

impl Env<'_> {
    /// Moves the store's clock.
    pub(super) fn advance(&self, ms: Millis) {
        self.clock.advance(Duration::from_millis(ms.unsigned_abs()));
    }

    /// Submits run `run_id` of agent `billing` (in namespace `billing`) with `input`.
    /// The ids of every run in the store, sorted.
    pub(super) async fn run_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .store
            .runs(&crate::store::RunFilter::default())
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.run_id)
            .collect();
        ids.sort();
        ids
    }

    pub(super) async fn submit(&self, run_id: &str, input: &[u8]) -> Submitted {
        self.store.put_component(DIGEST, b"\0asm").await.unwrap();
        self.store
            .submit(&Submission {
                run_id,
                agent: "billing",
                digest: DIGEST,
                namespace: "billing",
                input,
                authority: b"authority",
                replace_authority: false,
                priority: 0,
            })
            .await
            .unwrap()
    }

    /// Submits run `run_id` and leases it to worker `w`: its fence.
    pub(super) async fn lease(&self, run_id: &str) -> RunFence {
        self.submit(run_id, b"in").await;
        self.acquire(run_id, "w").await
    }

    /// Leases an existing run to `worker`: its fence.
    pub(super) async fn acquire(&self, run_id: &str, worker: &str) -> RunFence {
        match self
            .store
            .acquire_run(run_id, worker, RUN_LEASE)
            .await
            .unwrap()
        {
            Acquired::Leased(run) => fence(run_id, run.token),
            other => panic!("{run_id}: expected a lease, got {other:?}"),
        }
    }

    /// Claims `key` for the fence's run as `holder`; the grant.
    pub(super) async fn grant(&self, key: &str, holder: &str, fence: &RunFence) -> Grant {
        granted(self.store.claim(&req(key, holder, fence)).await.unwrap())
    }

    /// Commits `key` with `result`, as the holder of `token`.
    pub(super) async fn commit(
        &self,
        key: &str,
        token: u64,
        fence: &RunFence,
        result: &[u8],
    ) -> Result<(), super::StoreError> {
        self.store
            .commit(&super::Commit {
                claim: claim(key, token, fence),
                result,
                checkpoint: None,
                counts: None,
            })
            .await
    }
}

pub(super) fn fence(run_id: &str, token: u64) -> RunFence {
    RunFence {
        run_id: run_id.to_owned(),
        token,
        sync: SyncMode::Normal,
    }
}

pub(super) fn req<'a>(key: &'a str, holder: &'a str, fence: &'a RunFence) -> ClaimRequest<'a> {
    ClaimRequest {
        key,
        fence,
        holder,
        fingerprint: None,
        lease: LEASE,
        durable: true,
    }
}

pub(super) fn claim<'a>(key: &'a str, token: u64, fence: &'a RunFence) -> ClaimRef<'a> {
    ClaimRef { key, token, fence }
}

pub(super) fn granted(outcome: ClaimOutcome) -> Grant {
    match outcome {
        ClaimOutcome::Granted(grant) => grant,
        other => panic!("expected a grant, got {other:?}"),
    }
}
