//! Group commit: the claims, commits and ends of many runs, sent at once, share one
//! statement and one transaction, so the server parses, plans, locks and flushes once
//! for all of them.
//!
//! Measured on two cores, a step's server-side CPU, not the disk, bounds how many
//! steps many runs make per second; a statement of N rows costs far less than N
//! statements. One task per kind of write (claims, commits, ends) collects what callers
//! queued while the previous batches were in flight, and runs it as one
//! [`one_trip`](super::one_trip) statement over arrays (`unnest`). Each row carries its
//! own fence, so one run whose lease was taken over changes nothing of its own and
//! leaves the others' rows alone; each caller reads its own row exactly as it would read
//! the one-row statement's.
//!
//! A write made while no other is queued or in flight goes alone, in its one-row
//! statement, from its caller's task: one run's steps pay neither the hand-over to a
//! batch task nor the larger statement. Writes made while it is in flight queue, and
//! go together.
//!
//! A batch never holds two rows for one key (nor, for commits, for one run): the later
//! one waits for the next batch, so the rows of one statement never meet. Two batches
//! in flight at once never meet either: a run makes one write at a time, and a key is
//! claimed before it is committed. Its rows go
//! in run order, and so every write that locks several runs' rows locks them in one
//! order: two such writes never wait for each other (the server would break the cycle
//! only after `deadlock_timeout`, a second).
//!
//! When the server refuses a batch (a deadlock with another worker's batch, a rule
//! one row broke), the transaction rolled back and wrote nothing: each member is then
//! sent alone, with the one-row path's retries and errors. When the batch's outcome is
//! unknown (the connection was lost before the answer came), every member gets the
//! error, as a lone statement's caller would: its claim is retaken in doubt later,
//! never silently run twice. A caller that stops waiting does not stop its batch; like
//! a lost answer, its claim is then retaken in doubt after its lease.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{mpsc, oneshot};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::conn::durability;
use super::epoch::epoch_alive_floor;
use super::{Clock, fault, words};
use crate::store::events::{events_head, events_tail};
use crate::store::{DatabaseFault, Millis, StoreError, SyncMode};

/// A batch's plan is the same whatever its size (every lookup is by primary key), so
/// the server plans it once per connection instead of at every call, where the custom
/// plans it would try first cost more than running them. (The setting stays with the
/// connection in the pool; the other statements are lookups by key too.)
const GENERIC_PLANS: &str = "SET plan_cache_mode TO force_generic_plan";

/// Most rows in one statement. Past a few dozen the per-row work dominates; the cap
/// bounds the statement's size and how long its locks are held.
const MAX_ROWS: usize = 128;

/// Many runs' claims of keys never seen. Parameters: `$1` manual time, then arrays of
/// run, run lease token, key, holder, lease in ms and fingerprint. Returns one row per
/// request, with the one-row claim's columns (`one_trip::CLAIM_NEW`) and the request's
/// place (1-based) last. Inserts go in key order, so two batches racing for the same
/// keys wait for each other instead of deadlocking.
const CLAIM_MANY: &str = concat!(
    "WITH ",
    "clock AS (SELECT coalesce($1::int8, (extract(epoch FROM now()) * 1000)::int8) AS now), ",
    "alive AS (",
    epoch_alive_floor!(),
    "), ",
    "req AS (SELECT * FROM unnest($2::text[], $3::int8[], $4::text[], $5::text[], $6::int8[],
                                  $7::text[])
             WITH ORDINALITY AS r(run_id, lease_token, key, holder, lease_ms, fingerprint, ord)),
     fence AS (SELECT req.ord FROM req
               CROSS JOIN LATERAL (SELECT 1 FROM runs
                                   WHERE runs.run_id = req.run_id
                                     AND runs.lease_token = req.lease_token
                                     AND runs.lease_holder IS NOT NULL
                                   FOR SHARE) AS held),
     ins AS (INSERT INTO steps
                 (key, run_id, holder, token, attempt, claimed_at, lease_expires, fingerprint)
             SELECT req.key, req.run_id, req.holder,
                    greatest((SELECT token + 1 FROM retired WHERE id = 0), alive.floor),
                    1, clock.now,
                    CASE WHEN clock.now > 9223372036854775807 - req.lease_ms
                         THEN 9223372036854775807 ELSE clock.now + req.lease_ms END,
                    req.fingerprint
             FROM req JOIN fence ON fence.ord = req.ord CROSS JOIN clock CROSS JOIN alive
             ORDER BY req.key
             ON CONFLICT (key) DO NOTHING
             RETURNING key, token)
     SELECT fence.ord IS NOT NULL, ins.key IS NOT NULL, clock.now,
            s.run_id, s.holder, s.token, s.attempt, s.lease_expires, s.parked, s.fingerprint,
            s.result, ins.token, req.ord
     FROM req
     CROSS JOIN clock
     LEFT JOIN fence ON fence.ord = req.ord
     LEFT JOIN ins ON ins.key = req.key
     LEFT JOIN LATERAL (SELECT * FROM steps WHERE steps.key = req.key) AS s ON true"
);

/// Many runs' commits, each with its counts and checkpoint when given. Parameters: `$1`
/// manual time, then arrays of run, run lease token, key, claim token, result, whether
/// counts are given, the six counts, whether a checkpoint is given, its step and its
/// state; then `$17`, the statement's tick (where each commit stands in its run, with
/// its lease token: a batch holds one commit per run). Returns, per request, whether its fence held, whether its claim was still
/// the caller's (and is now committed), and its place (1-based). Every write reads
/// from `fence` through `done`, as the one-row commit's do.
const COMMIT_MANY: &str = concat!(
    "WITH ",
    "clock AS (SELECT coalesce($1::int8, (extract(epoch FROM now()) * 1000)::int8) AS now), ",
    "req AS (SELECT * FROM unnest($2::text[], $3::int8[], $4::text[], $5::int8[], $6::bytea[],
                                  $7::bool[], $8::int8[], $9::int8[], $10::int8[], $11::int8[],
                                  $12::int8[], $13::int8[], $14::bool[], $15::int8[], $16::bytea[])
             WITH ORDINALITY AS r(run_id, lease_token, key, token, result,
                                  has_counts, executed, skipped, awaited, reclaimed, instances,
                                  recycled, has_checkpoint, step, state, ord)),
     fence AS (SELECT req.ord FROM req
               CROSS JOIN LATERAL (SELECT 1 FROM runs
                                   WHERE runs.run_id = req.run_id
                                     AND runs.lease_token = req.lease_token
                                     AND runs.lease_holder IS NOT NULL
                                   FOR NO KEY UPDATE) AS held),
     done AS (UPDATE steps
              SET run_id = req.run_id, holder = NULL, result = req.result,
                  committed_at = clock.now, commit_lease = req.lease_token,
                  commit_tick = $17
              FROM req JOIN fence ON fence.ord = req.ord CROSS JOIN clock
              WHERE steps.key = req.key AND steps.token = req.token
                AND steps.holder IS NOT NULL
              RETURNING steps.key),
     counts_row AS (UPDATE runs
                    SET executed = req.executed, skipped = req.skipped, awaited = req.awaited,
                        reclaimed = req.reclaimed, instances = req.instances,
                        recycled = req.recycled, updated = clock.now
                    FROM req JOIN done ON done.key = req.key CROSS JOIN clock
                    WHERE runs.run_id = req.run_id AND req.has_counts),
     progress_row AS (INSERT INTO progress (run_id, lease, tick, step, state, updated)
                      SELECT req.run_id, req.lease_token, $17, req.step, req.state, clock.now
                      FROM req JOIN done ON done.key = req.key CROSS JOIN clock
                      WHERE req.has_checkpoint
                      ON CONFLICT (run_id, lease, tick) DO UPDATE
                      SET step = excluded.step, state = excluded.state,
                          updated = excluded.updated)
     SELECT fence.ord IS NOT NULL, done.key IS NOT NULL, req.ord
     FROM req
     LEFT JOIN fence ON fence.ord = req.ord
     LEFT JOIN done ON done.key = req.key"
);

/// Many runs' ends (but cancellations), each as [`leases::FINISH_ALONE`] ends one,
/// and every parent among them counted down once for all its children in the batch:
/// a fan-out's children, ending together, take their parent's row once per batch
/// instead of once each, where they queued on it one after another. Parameters: `$1`
/// manual time, then arrays of run, run lease token, the six counts, status, outcome
/// (NULL: left as it is) and whether the parent counts this end. Returns, per request,
/// whether its fence held (and it ended), and its place (1-based).
///
/// Parents are locked `FOR NO KEY UPDATE` in run order (`locked`), as
/// [`count_down_parent`] locks one, and read twice: as the statement's snapshot saw
/// them (`seen`) and as the lock found them. A parent the snapshot saw suspended in the
/// join the lock finds it in is counted down by its members among the batch
/// (`ended`, from the snapshot, complete since the join's members were written with its
/// suspension; `down` re-checks the join under the lock). A parent the lock finds
/// joining but the snapshot did not (its suspension committed meanwhile) may be owed
/// ends the snapshot cannot see: the statement then refuses itself, as
/// [`leases::FINISH_ALONE`] does, writing nothing, and each member goes alone.
///
/// [`count_down_parent`]: super::children::count_down_parent
/// [`leases::FINISH_ALONE`]: super::leases::FINISH_ALONE
const FINISH_MANY: &str = concat!(
    "WITH
     clock AS (SELECT coalesce($1::int8, (extract(epoch FROM now()) * 1000)::int8) AS now),
     req AS (SELECT * FROM unnest($2::text[], $3::int8[], $4::int8[], $5::int8[], $6::int8[],
                                  $7::int8[], $8::int8[], $9::int8[], $10::text[], $11::bytea[],
                                  $12::bool[])
             WITH ORDINALITY AS r(run_id, lease_token, executed, skipped, awaited, reclaimed,
                                  instances, recycled, status, outcome, counted_down, ord)),
     fin AS (UPDATE runs
             SET executed = req.executed, skipped = req.skipped, awaited = req.awaited,
                 reclaimed = req.reclaimed, instances = req.instances,
                 recycled = req.recycled, status = req.status, lease_holder = NULL,
                 lease_expires = NULL, cancel_requested = false, updated = clock.now,
                 events = runs.events + 1
             FROM req CROSS JOIN clock
             WHERE runs.run_id = req.run_id AND runs.lease_token = req.lease_token
               AND runs.lease_holder IS NOT NULL
             RETURNING runs.run_id, runs.parent, req.counted_down, runs.events, req.lease_token,
                       req.status),
     ev AS (INSERT INTO run_events (run_id, seq, at, kind, token, detail)
            SELECT fin.run_id, fin.events, clock.now, 'finished', fin.lease_token,
                   json_build_object('status', fin.status)::text
            FROM fin CROSS JOIN clock),
     cut AS (DELETE FROM run_events e USING fin
             WHERE e.run_id = fin.run_id AND e.seq > ",
    events_head!(),
    "
               AND e.seq <= fin.events - ",
    events_tail!(),
    "),
     kept AS (INSERT INTO run_outcomes (run_id, outcome)
              SELECT req.run_id, req.outcome FROM req JOIN fin ON fin.run_id = req.run_id
              WHERE req.outcome IS NOT NULL
              ON CONFLICT (run_id) DO UPDATE SET outcome = excluded.outcome),
     owing AS (SELECT DISTINCT parent AS run_id FROM fin
               WHERE fin.counted_down AND fin.parent IS NOT NULL),
     locked AS (SELECT p.run_id, p.joining AS key,
                       p.lease_holder IS NULL AND coalesce(p.join_left, 0) > 0 AS joining
                FROM runs p WHERE p.run_id IN (SELECT run_id FROM owing)
                ORDER BY p.run_id
                FOR NO KEY UPDATE OF p),
     seen AS (SELECT p.run_id, p.joining AS key,
                     p.lease_holder IS NULL AND coalesce(p.join_left, 0) > 0 AS joining
              FROM runs p WHERE p.run_id IN (SELECT run_id FROM owing)),
     ended AS (SELECT seen.run_id, seen.key, count(*) AS n
               FROM fin JOIN seen ON seen.run_id = fin.parent
               JOIN join_members m
                 ON m.run_id = seen.run_id AND m.key = seen.key AND m.child = fin.run_id
               WHERE fin.counted_down AND seen.joining
               GROUP BY seen.run_id, seen.key),
     down AS (UPDATE runs
              SET join_left = greatest(runs.join_left - ended.n, 0),
                  wake_at = CASE WHEN runs.join_left <= ended.n THEN clock.now
                                 ELSE runs.wake_at END,
                  updated = clock.now
              FROM ended JOIN locked ON locked.run_id = ended.run_id CROSS JOIN clock
              WHERE runs.run_id = ended.run_id AND runs.joining = ended.key
                AND runs.lease_holder IS NULL AND runs.join_left > 0
              RETURNING runs.run_id),
     owed AS (SELECT locked.run_id FROM locked LEFT JOIN seen ON seen.run_id = locked.run_id
              WHERE locked.joining
                AND NOT (coalesce(seen.joining, false) AND seen.key = locked.key)
              LIMIT 1)
     SELECT fin.run_id IS NOT NULL,
            CASE WHEN EXISTS (SELECT 1 FROM owed)
                 THEN ('idem: a count-down is owed to ' || (SELECT run_id FROM owed))::int4 = 0
                 ELSE false END,
            req.ord
     FROM req LEFT JOIN fin ON fin.run_id = req.run_id"
);

/// What every batched write carries: its key, and the run and lease it is fenced by.
pub(super) struct Fenced {
    pub(super) run_id: String,
    pub(super) lease_token: i64,
    pub(super) key: String,
    pub(super) sync: SyncMode,
}

/// A claim of a key never seen, as `one_trip::CLAIM_NEW` takes it.
pub(super) struct ClaimJob {
    pub(super) fenced: Fenced,
    pub(super) holder: String,
    pub(super) lease_ms: Millis,
    pub(super) fingerprint: Option<String>,
}

/// A commit, as `one_trip::commit_sql` takes it.
pub(super) struct CommitJob {
    pub(super) op: &'static str,
    pub(super) fenced: Fenced,
    pub(super) token: i64,
    pub(super) result: Vec<u8>,
    pub(super) counts: Option<[i64; 6]>,
    pub(super) checkpoint: Option<(i64, Vec<u8>)>,
}

/// A run's end (but a cancellation), as [`leases::FINISH_ALONE`] takes it; its key is
/// the run's id (a run ends once).
///
/// [`leases::FINISH_ALONE`]: super::leases::FINISH_ALONE
pub(super) struct FinishJob {
    pub(super) fenced: Fenced,
    pub(super) counts: [i64; 6],
    pub(super) status: &'static str,
    pub(super) outcome: Option<Vec<u8>>,
    pub(super) counted_down: bool,
}

/// Why a batch did not answer a member with its row.
enum Unbatched {
    /// The server refused the batch and it wrote nothing: send the member alone.
    Alone,
    /// The batch's outcome is unknown (or the server cannot be used): the member's
    /// write may or may not have happened, as when a lone statement's answer is lost.
    Failed(StoreError),
}

type Reply = oneshot::Sender<Result<Row, Unbatched>>;

/// What a batch task needs of the store: a connection, the time, and how to name a
/// failure.
#[derive(Clone)]
pub(super) struct Target {
    pub(super) pool: deadpool_postgres::Pool,
    pub(super) location: String,
    pub(super) clock: Clock,
    /// How long a batch waits for its answer.
    pub(super) call_timeout: std::time::Duration,
}

/// The queues of the batch tasks (claims, commits, ends), which run on the store's runtime and end when
/// this is dropped.
#[derive(Debug)]
pub(super) struct Batches {
    claims: mpsc::UnboundedSender<(ClaimJob, Reply)>,
    commits: mpsc::UnboundedSender<(CommitJob, Reply)>,
    finishes: mpsc::UnboundedSender<(FinishJob, Reply)>,
    /// Writes queued, in flight, or sent alone.
    busy: AtomicUsize,
    /// The most rows one statement has carried: tests show batches do form.
    #[cfg(test)]
    largest: Arc<AtomicUsize>,
}

impl Batches {
    pub(super) fn start(runtime: &tokio::runtime::Handle, target: Target) -> Batches {
        let (claims, claim_rx) = mpsc::unbounded_channel();
        let (commits, commit_rx) = mpsc::unbounded_channel();
        let (finishes, finish_rx) = mpsc::unbounded_channel();
        let largest = Arc::new(AtomicUsize::new(0));
        runtime.spawn(serve(claim_rx, target.clone(), largest.clone()));
        runtime.spawn(serve(commit_rx, target.clone(), Arc::clone(&largest)));
        runtime.spawn(serve(finish_rx, target, Arc::clone(&largest)));
        Batches {
            claims,
            commits,
            finishes,
            busy: AtomicUsize::new(0),
            #[cfg(test)]
            largest,
        }
    }

    /// The most rows one statement has carried so far.
    #[cfg(test)]
    pub(super) fn largest(&self) -> usize {
        self.largest.load(Ordering::Relaxed)
    }

    /// The row answering the write: `alone` sends it in its one-row statement when no
    /// other write is queued or in flight (a batch would only add a hand-over to its
    /// task and a larger statement); otherwise `job` joins the next batch of its kind,
    /// and goes alone after all if the server refused that batch.
    pub(super) async fn claim<Alone: Future<Output = Result<Row, StoreError>>>(
        &self,
        job: impl FnOnce() -> ClaimJob,
        alone: impl Fn() -> Alone,
    ) -> Result<Row, StoreError> {
        self.write(job, alone, Ok).await
    }

    /// [`Batches::claim`], for a commit.
    pub(super) async fn commit<Alone: Future<Output = Result<Row, StoreError>>>(
        &self,
        job: impl FnOnce() -> CommitJob,
        alone: impl Fn() -> Alone,
    ) -> Result<Row, StoreError> {
        self.write(job, alone, Ok).await
    }

    /// A run's end: `alone` is the whole of the one-run path (its retries, and the
    /// count-down it may owe a parent), taken when no other write is queued or in
    /// flight, or when the server refused the batch; `lost` is the error of a fence
    /// the batch found broken.
    pub(super) async fn finish<Alone: Future<Output = Result<(), StoreError>>>(
        &self,
        job: impl FnOnce() -> FinishJob,
        alone: impl Fn() -> Alone,
        lost: impl FnOnce() -> StoreError,
    ) -> Result<(), StoreError> {
        let ended = |row: Row| match row.try_get::<_, bool>(0) {
            Ok(true) => Ok(()),
            Ok(false) => Err(lost()),
            Err(e) => Err(StoreError::Backend {
                op: "finish a run",
                source: Box::new(e),
            }),
        };
        self.write(job, alone, ended).await
    }

    async fn write<J: Job, T, Alone: Future<Output = Result<T, StoreError>>>(
        &self,
        job: impl FnOnce() -> J,
        alone: impl Fn() -> Alone,
        from_row: impl FnOnce(Row) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let idle = self
            .busy
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
        if !idle {
            self.busy.fetch_add(1, Ordering::AcqRel);
        }
        // Writes made while this one is counted queue, and go together.
        let _turn = Turn(&self.busy);
        if idle {
            return alone().await;
        }
        let job = job();
        let op = job.op();
        let (reply, answer) = oneshot::channel();
        if J::queue(self).send((job, reply)).is_err() {
            // Never received, so never sent.
            return alone().await;
        }
        match answer.await {
            Ok(Ok(row)) => from_row(row),
            Ok(Err(Unbatched::Alone)) => alone().await,
            Ok(Err(Unbatched::Failed(e))) => Err(e),
            // The task stopped (the store's runtime is shutting down) with the batch
            // perhaps sent: the write's outcome is unknown.
            Err(_) => Err(StoreError::Backend {
                op,
                source: "the store's batch task stopped before it answered".into(),
            }),
        }
    }
}

/// A write queued, in flight or sent alone; counted in [`Batches`]'s `busy` until
/// dropped.
struct Turn<'a>(&'a AtomicUsize);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A write many callers' batches are made of.
trait Job: Send + Sync + Sized + 'static {
    /// Whether one batch may hold only one write of a run (besides one per key).
    const ONE_PER_RUN: bool;
    /// Batches of this kind in flight at once. A commit batch waits for its flush of the
    /// server's log under `synchronous_commit = on`; a second one runs meanwhile (8 and
    /// 64 runs under `--sync full`: 8–18 % and 2–8 % more steps per second, three
    /// turns each). A claim batch waits for no flush (a claim that must be durable
    /// first is rare), and one at a time makes larger batches, so less work per row.
    const IN_FLIGHT: usize;
    fn fenced(&self) -> &Fenced;
    fn op(&self) -> &'static str;
    /// Where writes of this kind queue.
    fn queue(batches: &Batches) -> &mpsc::UnboundedSender<(Self, Reply)>;
    /// Sends `jobs` as one statement: one row per job, in their order.
    fn send(
        target: &Target,
        session: &mut Option<Session>,
        jobs: &[&Self],
    ) -> impl Future<Output = Answer> + Send;
}

impl Job for ClaimJob {
    const ONE_PER_RUN: bool = false;
    const IN_FLIGHT: usize = 1;

    fn fenced(&self) -> &Fenced {
        &self.fenced
    }

    fn op(&self) -> &'static str {
        "claim a key"
    }

    fn queue(batches: &Batches) -> &mpsc::UnboundedSender<(Self, Reply)> {
        &batches.claims
    }

    async fn send(target: &Target, session: &mut Option<Session>, jobs: &[&Self]) -> Answer {
        let manual = target.manual_now();
        let (run_ids, lease_tokens, keys) = fenced_columns(jobs);
        let holders: Vec<&str> = jobs.iter().map(|j| j.holder.as_str()).collect();
        let leases: Vec<i64> = jobs.iter().map(|j| j.lease_ms).collect();
        let fingerprints: Vec<Option<&str>> =
            jobs.iter().map(|j| j.fingerprint.as_deref()).collect();
        target
            .run(
                session,
                strongest(jobs),
                CLAIM_MANY,
                &[
                    &manual,
                    &run_ids,
                    &lease_tokens,
                    &keys,
                    &holders,
                    &leases,
                    &fingerprints,
                ],
                jobs.len(),
            )
            .await
    }
}

impl Job for CommitJob {
    // A run's progress row is upserted at most once per statement.
    const ONE_PER_RUN: bool = true;
    const IN_FLIGHT: usize = 2;

    fn fenced(&self) -> &Fenced {
        &self.fenced
    }

    fn op(&self) -> &'static str {
        self.op
    }

    fn queue(batches: &Batches) -> &mpsc::UnboundedSender<(Self, Reply)> {
        &batches.commits
    }

    async fn send(target: &Target, session: &mut Option<Session>, jobs: &[&Self]) -> Answer {
        let manual = target.manual_now();
        let (run_ids, lease_tokens, keys) = fenced_columns(jobs);
        let tokens: Vec<i64> = jobs.iter().map(|j| j.token).collect();
        let results: Vec<&[u8]> = jobs.iter().map(|j| j.result.as_slice()).collect();
        let has_counts: Vec<bool> = jobs.iter().map(|j| j.counts.is_some()).collect();
        let count =
            |i: usize| -> Vec<i64> { jobs.iter().map(|j| j.counts.map_or(0, |c| c[i])).collect() };
        let (executed, skipped, awaited) = (count(0), count(1), count(2));
        let (reclaimed, instances, recycled) = (count(3), count(4), count(5));
        let has_checkpoint: Vec<bool> = jobs.iter().map(|j| j.checkpoint.is_some()).collect();
        let steps: Vec<i64> = jobs
            .iter()
            .map(|j| j.checkpoint.as_ref().map_or(0, |c| c.0))
            .collect();
        let states: Vec<&[u8]> = jobs
            .iter()
            .map(|j| j.checkpoint.as_ref().map_or(&[][..], |c| c.1.as_slice()))
            .collect();
        let tick = i64::try_from(crate::store::tick()).unwrap_or(i64::MAX);
        target
            .run(
                session,
                strongest(jobs),
                COMMIT_MANY,
                &[
                    &manual,
                    &run_ids,
                    &lease_tokens,
                    &keys,
                    &tokens,
                    &results,
                    &has_counts,
                    &executed,
                    &skipped,
                    &awaited,
                    &reclaimed,
                    &instances,
                    &recycled,
                    &has_checkpoint,
                    &steps,
                    &states,
                    &tick,
                ],
                jobs.len(),
            )
            .await
    }
}

impl Job for FinishJob {
    const ONE_PER_RUN: bool = true;
    // As commits: a batch under `synchronous_commit = on` waits for its flush.
    const IN_FLIGHT: usize = 2;

    fn fenced(&self) -> &Fenced {
        &self.fenced
    }

    fn op(&self) -> &'static str {
        "finish a run"
    }

    fn queue(batches: &Batches) -> &mpsc::UnboundedSender<(Self, Reply)> {
        &batches.finishes
    }

    async fn send(target: &Target, session: &mut Option<Session>, jobs: &[&Self]) -> Answer {
        let manual = target.manual_now();
        let (run_ids, lease_tokens, _) = fenced_columns(jobs);
        let count = |i: usize| -> Vec<i64> { jobs.iter().map(|j| j.counts[i]).collect() };
        let (executed, skipped, awaited) = (count(0), count(1), count(2));
        let (reclaimed, instances, recycled) = (count(3), count(4), count(5));
        let statuses: Vec<&str> = jobs.iter().map(|j| j.status).collect();
        let outcomes: Vec<Option<&[u8]>> = jobs.iter().map(|j| j.outcome.as_deref()).collect();
        let counted_down: Vec<bool> = jobs.iter().map(|j| j.counted_down).collect();
        target
            .run(
                session,
                strongest(jobs),
                FINISH_MANY,
                &[
                    &manual,
                    &run_ids,
                    &lease_tokens,
                    &executed,
                    &skipped,
                    &awaited,
                    &reclaimed,
                    &instances,
                    &recycled,
                    &statuses,
                    &outcomes,
                    &counted_down,
                ],
                jobs.len(),
            )
            .await
    }
}

/// The run, lease token and key columns every batch statement starts with.
fn fenced_columns<'a, J: Job>(jobs: &[&'a J]) -> (Vec<&'a str>, Vec<i64>, Vec<&'a str>) {
    let fenced = || jobs.iter().map(|j| j.fenced());
    (
        fenced().map(|f| f.run_id.as_str()).collect(),
        fenced().map(|f| f.lease_token).collect(),
        fenced().map(|f| f.key.as_str()).collect(),
    )
}

/// What a batch's statement gave back: one row per member, in the members' order, or
/// the reason there are none.
/// (The statements select one row per request; a row missing all the same is an
/// answer lost.)
type Answer = Result<Vec<Option<Row>>, BatchError>;

/// Why a batch has no rows.
enum BatchError {
    Pg(tokio_postgres::Error),
    /// The pool had no connection to give.
    NoConnection(String),
    /// No answer within the call timeout: the outcome is unknown.
    NoAnswer,
}

/// Takes what is queued, up to [`MAX_ROWS`] without two rows meeting, sends it, and
/// again: while batches are in flight, the next one gathers. Up to [`Job::IN_FLIGHT`]
/// batches of a kind are in flight at once, each on a connection of its own.
async fn serve<J: Job>(
    mut rx: mpsc::UnboundedReceiver<(J, Reply)>,
    target: Target,
    largest: Arc<AtomicUsize>,
) {
    let mut waiting: VecDeque<(J, Reply)> = VecDeque::new();
    // Connections batches go out on while more keep coming; given back to the pool
    // whenever nothing is queued or in flight.
    let mut idle: Vec<Session> = Vec::new();
    let mut flights: tokio::task::JoinSet<Option<Session>> = tokio::task::JoinSet::new();
    let mut open = true;
    loop {
        while open
            && waiting.len() < MAX_ROWS * 2
            && let Ok(job) = rx.try_recv()
        {
            waiting.push_back(job);
        }
        while flights.len() < J::IN_FLIGHT && !waiting.is_empty() {
            let batch = take_batch(&mut waiting);
            largest.fetch_max(batch.len(), Ordering::Relaxed);
            let (target, mut session) = (target.clone(), idle.pop());
            flights.spawn(async move {
                let jobs: Vec<&J> = batch.iter().map(|(job, _)| job).collect();
                let answer = match tokio::time::timeout(
                    target.call_timeout,
                    J::send(&target, &mut session, &jobs),
                )
                .await
                {
                    Ok(answer) => answer,
                    Err(_) => {
                        super::forget_idle(&target.pool);
                        Err(BatchError::NoAnswer)
                    }
                };
                if answer.is_err()
                    && let Some(broken) = session.take()
                {
                    // Whatever went wrong may have left the session in a state of its
                    // own: closed rather than handed to another write.
                    drop(deadpool_postgres::Object::take(broken.conn));
                }
                answer_members(batch, answer, &target);
                session
            });
        }
        if flights.is_empty() && waiting.is_empty() {
            idle.clear();
            if !open {
                return;
            }
        }
        tokio::select! {
            job = rx.recv(), if open => match job {
                Some(job) => waiting.push_back(job),
                None => open = false,
            },
            Some(done) = flights.join_next() => {
                if let Ok(Some(session)) = done {
                    idle.push(session);
                }
            }
        }
    }
}

/// A pooled connection kept by a batch task across batches, and the durability its
/// session is set to.
struct Session {
    conn: deadpool_postgres::Object,
    sync: Option<SyncMode>,
}

/// Up to [`MAX_ROWS`] of `waiting`, oldest first, no two of them meeting; the rest
/// stay, in their order, for the next batch.
fn take_batch<J: Job>(waiting: &mut VecDeque<(J, Reply)>) -> Vec<(J, Reply)> {
    let mut batch = Vec::with_capacity(waiting.len().min(MAX_ROWS));
    let mut keys = HashSet::new();
    let mut runs = HashSet::new();
    let mut later = VecDeque::new();
    while let Some(job) = waiting.pop_front() {
        let Fenced { key, run_id, .. } = job.0.fenced();
        let meets = keys.contains(key) || (J::ONE_PER_RUN && runs.contains(run_id));
        if batch.len() == MAX_ROWS || meets {
            later.push_back(job);
            continue;
        }
        keys.insert(key.clone());
        if J::ONE_PER_RUN {
            runs.insert(run_id.clone());
        }
        batch.push(job);
    }
    *waiting = later;
    // Runs' rows are locked in the order of the batch's rows: in run order, as every
    // write that locks several runs' rows does (`leases::renew_runs`), so that two of
    // them never wait for each other.
    batch.sort_by(|a, b| a.0.fenced().run_id.cmp(&b.0.fenced().run_id));
    batch
}

fn answer_members<J: Job>(batch: Vec<(J, Reply)>, answer: Answer, target: &Target) {
    let e = match answer {
        Ok(rows) => {
            for ((job, reply), row) in batch.into_iter().zip(rows) {
                let _ = reply.send(row.ok_or_else(|| {
                    Unbatched::Failed(StoreError::Backend {
                        op: job.op(),
                        source: "the batch's statement gave no row for this write".into(),
                    })
                }));
            }
            return;
        }
        Err(e) => e,
    };
    if let BatchError::Pg(e) = &e
        && fault(e) == Some(DatabaseFault::Unreachable)
    {
        super::forget_idle(&target.pool);
    }
    for (job, reply) in batch {
        let why = match &e {
            // A server error without a fault rolled the statement back: nothing was
            // written, and each member alone gets the lone path's own answer (its
            // retries after a deadlock, its error for a rule it broke). A fault leaves
            // the outcome unknown, or the server unusable: every member hears of it.
            BatchError::Pg(e) => match fault(e) {
                None => Unbatched::Alone,
                Some(fault) => Unbatched::Failed(StoreError::Database {
                    location: target.location.clone(),
                    op: job.op(),
                    fault,
                    detail: format!("PostgreSQL: {}", words(e)),
                }),
            },
            BatchError::NoConnection(detail) => Unbatched::Failed(StoreError::Database {
                location: target.location.clone(),
                op: job.op(),
                fault: DatabaseFault::Unreachable,
                detail: detail.clone(),
            }),
            BatchError::NoAnswer => Unbatched::Failed(super::no_answer(
                &target.location,
                job.op(),
                target.call_timeout,
            )),
        };
        let _ = reply.send(Err(why));
    }
}

/// The strongest durability any member asks for: a batch is one transaction.
fn strongest<J: Job>(jobs: &[&J]) -> SyncMode {
    if jobs.iter().any(|job| job.fenced().sync == SyncMode::Full) {
        SyncMode::Full
    } else {
        SyncMode::Normal
    }
}

impl Target {
    fn manual_now(&self) -> Option<Millis> {
        self.clock.is_manual().then(|| self.clock.now())
    }

    /// Runs `sql` as its own transaction, as durable as `sync` asks, in one round trip,
    /// on `session` (a pooled connection taken if there is none), and orders its rows by
    /// the place (the last column) of the member each answers.
    async fn run(
        &self,
        session: &mut Option<Session>,
        sync: SyncMode,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        members: usize,
    ) -> Answer {
        let session = match session {
            Some(session) => session,
            None => match self.pool.get().await {
                Ok(conn) => session.insert(Session { conn, sync: None }),
                Err(deadpool_postgres::PoolError::Backend(e)) => return Err(BatchError::Pg(e)),
                Err(other) => {
                    return Err(BatchError::NoConnection(format!("no connection: {other}")));
                }
            },
        };
        let conn = &session.conn;
        let stmt = conn.prepare_cached(sql).await.map_err(BatchError::Pg)?;
        let (fresh, set) = (session.sync.is_none(), session.sync != Some(sync));
        let plans = async {
            if fresh {
                conn.batch_execute(GENERIC_PLANS).await
            } else {
                Ok(())
            }
        };
        let durable = async {
            if set {
                conn.batch_execute(durability(sync)).await
            } else {
                Ok(())
            }
        };
        // Sent in this order, in one round trip.
        let ((), (), rows) =
            tokio::try_join!(plans, durable, conn.query(&stmt, params)).map_err(BatchError::Pg)?;
        session.sync = Some(sync);
        let mut ordered: Vec<Option<Row>> = (0..members).map(|_| None).collect();
        for row in rows {
            let at: i64 = row.try_get(row.len() - 1).map_err(BatchError::Pg)?;
            if let Some(slot) = usize::try_from(at - 1)
                .ok()
                .and_then(|i| ordered.get_mut(i))
            {
                *slot = Some(row);
            }
        }
        Ok(ordered)
    }
}
