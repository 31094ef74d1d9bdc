//! The [`Store`](crate::store::Store) of [`SqliteStore`], role by role: what each method
//! copies for the database thread (work crosses threads, so it owns what it needs), how
//! durable its write must be, and which statements do it. Values a store cannot keep
//! are refused here, before anything is sent.

use std::sync::Arc;
use std::time::Duration;

use super::owned::{
    OwnedEnd, OwnedFork, OwnedJoin, OwnedRef, OwnedRequest, OwnedSpawnBatch, OwnedSubmission,
    OwnedWaitKind,
};
use super::{
    SqliteStore, TxError, blobs, children, claims, components, events, flow, gc, history, leases,
    live, logs, pause, presence, rates, runs, schedules, sealing, usage, versions, waits,
};
use crate::store::rules::lease_expiry;
use crate::store::rules::{check_checkpoint, check_counts};
use crate::store::{
    Acquired, BlobDigest, Cancelled, CatalogStore, Checkpoint, ClaimOutcome, ClaimRef,
    ClaimRequest, Commit, Counts, DataKeyRecord, Deployed, Deployment, DeploymentPaused,
    DeploymentRecord, FlowLimits, FlowSetting, ForkRequest, Forked, GcReport, GcRequest,
    InstanceStore, JoinRequest, LeaseState, LeasedRun, Millis, MoveRuns, OpenClaim, OperatorStore,
    Paused, PausedDeployment, Payloads, Position, Presence, RateLimit, RateSetting, Rated,
    Resolution, Resumed, Rollout, RunEnd, RunFence, RunFilter, RunHistory, RunMove, RunRecord,
    SavedCheckpoint, ScheduleDef, ScheduleRecord, ScheduledBy, Sealer, SignalSent, SpawnAnswers,
    SpawnBatch, StepRecord, StoreError, Submission, Submitted, Suspension, SyncMode, Tick,
    Timeline, VersionRecord, WaitRecord, WaitRequest, WaitState, WorkerStore,
};
use crate::store::{
    LiveChunk, LiveText, Recorded, UsageFilter, UsageRecord, UsageTotal, check_usage,
};

#[async_trait::async_trait]
impl InstanceStore for SqliteStore {
    async fn claim(&self, req: &ClaimRequest<'_>) -> Result<ClaimOutcome, StoreError> {
        self.claim_key("claim a key", req, None).await
    }

    async fn take_over(
        &self,
        req: &ClaimRequest<'_>,
        stale_token: u64,
    ) -> Result<ClaimOutcome, StoreError> {
        self.claim_key("take over a claim", req, Some(stale_token))
            .await
    }

    async fn claim_rated(
        &self,
        req: &ClaimRequest<'_>,
        token: &WaitRequest<'_>,
    ) -> Result<Rated, StoreError> {
        let floor = self.token_floor;
        let write = |conn: &_, now| rated(conn, req, token, now, floor);
        self.write_or("take a token and claim a key", req.sync(), write, |_| {
            let req = OwnedRequest::new(req);
            let (fence, key) = (token.fence.clone(), token.key.to_owned());
            let kind = OwnedWaitKind::new(&token.kind);
            move |conn, now| {
                let token = WaitRequest {
                    fence: &fence,
                    key: &key,
                    kind: kind.borrow(),
                };
                rated(conn, &req.borrow(), &token, now, floor)
            }
        })
        .await
    }

    async fn commit(&self, commit: &Commit<'_>) -> Result<(), StoreError> {
        if let Some(checkpoint) = commit.checkpoint {
            check_checkpoint(checkpoint)?;
        }
        if let Some(counts) = commit.counts {
            check_counts(counts)?;
        }
        let op = match commit.checkpoint {
            Some(_) => "commit a result and save progress",
            None => "commit a result",
        };
        let write = |conn: &_, now| claims::commit(conn, commit, now);
        self.write_or(op, commit.claim.fence.sync, write, |_| {
            let claim = OwnedRef::new(&commit.claim);
            let result = commit.result.to_vec();
            let (checkpoint, counts) = (commit.checkpoint.cloned(), commit.counts.copied());
            move |conn, now| {
                let commit = Commit {
                    claim: claim.borrow(),
                    result: &result,
                    checkpoint: checkpoint.as_ref(),
                    counts: counts.as_ref(),
                };
                claims::commit(conn, &commit, now)
            }
        })
        .await
    }

    async fn release(&self, claim: &ClaimRef<'_>) -> Result<bool, StoreError> {
        let claim = OwnedRef::new(claim);
        self.write("release a claim", claim.fence.sync, move |conn, _| {
            claims::release(conn, &claim.borrow())
        })
        .await
    }

    async fn renew(
        &self,
        claims: &[ClaimRef<'_>],
        lease: Duration,
    ) -> Result<Vec<bool>, StoreError> {
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        let sync = strongest(claims.iter().map(|c| c.fence.sync));
        let owned: Vec<OwnedRef> = claims.iter().map(OwnedRef::new).collect();
        self.write("renew claims", sync, move |conn, now| {
            let claims: Vec<ClaimRef<'_>> = owned.iter().map(OwnedRef::borrow).collect();
            claims::renew(conn, &claims, lease_expiry(now, lease))
        })
        .await
    }

    async fn park(&self, claim: &ClaimRef<'_>, reason: &str) -> Result<(), StoreError> {
        let (claim, reason) = (OwnedRef::new(claim), reason.to_owned());
        self.write(
            "park a claim in doubt",
            claim.fence.sync,
            move |conn, now| claims::park(conn, &claim.borrow(), &reason, now),
        )
        .await
    }

    async fn committed(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let key = key.to_owned();
        self.read("read a result", move |conn| claims::committed(conn, &key))
            .await
    }

    async fn load_progress(&self, run_id: &str) -> Result<Option<Checkpoint>, StoreError> {
        let run_id = run_id.to_owned();
        self.read("load progress", move |conn| {
            runs::load_progress(conn, &run_id)
        })
        .await
    }

    async fn save_progress(
        &self,
        fence: &RunFence,
        checkpoint: &Checkpoint,
        counts: Option<&Counts>,
    ) -> Result<(), StoreError> {
        check_checkpoint(checkpoint)?;
        if let Some(counts) = counts {
            check_counts(counts)?;
        }
        let (fence, checkpoint, counts) = (fence.clone(), checkpoint.clone(), counts.copied());
        self.write("save progress", fence.sync, move |conn, now| {
            leases::check_fence(conn, &fence)?;
            if let Some(counts) = &counts {
                runs::save_counts(conn, &fence.run_id, counts, now)?;
            }
            let position = Position {
                lease: fence.token,
                tick: crate::store::tick(),
            };
            runs::save_checkpoint(conn, &fence.run_id, &checkpoint, position, now)
        })
        .await
    }

    async fn save_counts(&self, fence: &RunFence, counts: &Counts) -> Result<(), StoreError> {
        check_counts(counts)?;
        let (fence, counts) = (fence.clone(), *counts);
        self.write("save counts", fence.sync, move |conn, now| {
            leases::check_fence(conn, &fence)?;
            runs::save_counts(conn, &fence.run_id, &counts, now)
        })
        .await
    }

    async fn start_instance(
        &self,
        fence: &RunFence,
        counts: &Counts,
        recycled: Option<&str>,
    ) -> Result<(), StoreError> {
        check_counts(counts)?;
        let (fence, counts) = (fence.clone(), *counts);
        let recycled = recycled.map(str::to_owned);
        self.write("start an instance", fence.sync, move |conn, now| {
            leases::start_instance(conn, &fence, &counts, recycled.as_deref(), now)
        })
        .await
    }

    async fn record_usage(&self, record: &UsageRecord<'_>) -> Result<Recorded, StoreError> {
        check_usage(record)?;
        let fence = record.fence.clone();
        let (key, model, tokens) = (
            record.key.to_owned(),
            record.model.to_owned(),
            record.tokens,
        );
        self.write(
            "record a model call's usage",
            fence.sync,
            move |conn, now| {
                let record = UsageRecord {
                    fence: &fence,
                    key: &key,
                    model: &model,
                    tokens,
                };
                usage::record(conn, &record, now)
            },
        )
        .await
    }

    async fn append_log(
        &self,
        fence: &RunFence,
        bytes: &[u8],
        keep: usize,
    ) -> Result<(), StoreError> {
        let (fence, bytes) = (fence.clone(), bytes.to_vec());
        let sealer = self.sealer();
        self.write("append to a run's log", fence.sync, move |conn, _| {
            leases::check_fence(conn, &fence)?;
            logs::append(
                conn,
                &fence.run_id,
                &bytes,
                keep,
                Payloads(sealer.as_deref()),
            )
        })
        .await
    }

    async fn append_live(
        &self,
        fence: &RunFence,
        chunks: &[LiveText],
        keep: usize,
    ) -> Result<(), StoreError> {
        let (fence, chunks) = (fence.clone(), chunks.to_vec());
        let sealer = self.sealer();
        // Not durable by design (store/live.rs): never a sync of its own.
        self.write(
            "append to a run's live stream",
            SyncMode::Normal,
            move |conn, _| {
                leases::check_fence(conn, &fence)?;
                live::append(
                    conn,
                    &fence.run_id,
                    &chunks,
                    keep,
                    Payloads(sealer.as_deref()),
                )
            },
        )
        .await
    }

    async fn wait(&self, req: &WaitRequest<'_>) -> Result<WaitState, StoreError> {
        let (fence, key) = (req.fence.clone(), req.key.to_owned());
        let kind = OwnedWaitKind::new(&req.kind);
        let sync = crate::store::rules::wait_sync(&req.kind, fence.sync);
        self.write("record a wait", sync, move |conn, now| {
            waits::wait(conn, &fence, &key, &kind.borrow(), now)
        })
        .await
    }

    async fn spawn_many(&self, batch: &SpawnBatch<'_>) -> Result<SpawnAnswers, StoreError> {
        let batch = OwnedSpawnBatch::new(batch);
        self.write("spawn child runs", batch.sync(), move |conn, now| {
            let children = batch.children();
            children::spawn_many(conn, &batch.borrow(&children), now)
        })
        .await
    }

    async fn join(&self, req: &JoinRequest<'_>) -> Result<WaitState, StoreError> {
        let req = OwnedJoin::new(req);
        self.write("join children", req.sync(), move |conn, now| {
            children::join(conn, &req.borrow(), now)
        })
        .await
    }
}

#[async_trait::async_trait]
impl WorkerStore for SqliteStore {
    async fn now(&self) -> Result<Millis, StoreError> {
        Ok(self.clock.now())
    }

    async fn next_due(&self, after: Millis) -> Result<Option<Millis>, StoreError> {
        self.read("find the next due run", move |conn| {
            let run = leases::next_due(conn, after)?;
            let tick = schedules::next_tick(conn, after)?;
            Ok(run.into_iter().chain(tick).min())
        })
        .await
    }

    async fn acquire_runs(
        &self,
        worker: &str,
        max: usize,
        lease: Duration,
        skip: &[String],
    ) -> Result<Vec<LeasedRun>, StoreError> {
        let (worker, skip, floor) = (worker.to_owned(), skip.to_vec(), self.token_floor);
        self.write("acquire runs", self.sync, move |conn, now| {
            leases::acquire_runs(conn, &worker, max, lease, &skip, now, floor)
        })
        .await
    }

    async fn acquire_run(
        &self,
        run_id: &str,
        worker: &str,
        lease: Duration,
    ) -> Result<Acquired, StoreError> {
        let (run_id, worker, floor) = (run_id.to_owned(), worker.to_owned(), self.token_floor);
        self.write("acquire a run", self.sync, move |conn, now| {
            leases::acquire_run(conn, &run_id, &worker, lease, now, floor)
        })
        .await
    }

    async fn renew_runs(
        &self,
        fences: &[RunFence],
        lease: Duration,
    ) -> Result<Vec<LeaseState>, StoreError> {
        if fences.is_empty() {
            return Ok(Vec::new());
        }
        let sync = strongest(fences.iter().map(|f| f.sync));
        let fences = fences.to_vec();
        self.write("renew run leases", sync, move |conn, now| {
            leases::renew_runs(conn, &fences, lease_expiry(now, lease))
        })
        .await
    }

    async fn release_run(
        &self,
        fence: &RunFence,
        counts: &Counts,
        note: Option<&str>,
    ) -> Result<(), StoreError> {
        check_counts(counts)?;
        let (fence, counts, note) = (fence.clone(), *counts, note.map(str::to_owned));
        self.write("release a run", fence.sync, move |conn, now| {
            leases::release_run(conn, &fence, &counts, note.as_deref(), now)
        })
        .await
    }

    async fn suspend_run(
        &self,
        fence: &RunFence,
        counts: &Counts,
        suspension: &Suspension<'_>,
    ) -> Result<(), StoreError> {
        check_counts(counts)?;
        let (fence, counts) = (fence.clone(), *counts);
        let (due, signal) = (suspension.due, suspension.signal.map(str::to_owned));
        let join = suspension.join.map(str::to_owned);
        self.write("suspend a run", fence.sync, move |conn, now| {
            let suspension = Suspension {
                due,
                signal: signal.as_deref(),
                join: join.as_deref(),
            };
            waits::suspend_run(conn, &fence, &counts, &suspension, now)
        })
        .await
    }

    async fn finish_run(
        &self,
        fence: &RunFence,
        end: RunEnd<'_>,
        counts: &Counts,
    ) -> Result<(), StoreError> {
        check_counts(counts)?;
        let (fence, counts, end) = (fence.clone(), *counts, OwnedEnd::new(end));
        self.write("finish a run", fence.sync, move |conn, now| {
            leases::finish_run(conn, &fence, end.borrow(), &counts, now)
        })
        .await
    }

    async fn be_present(&self, holder: &str) -> Result<Presence, StoreError> {
        presence::be_present(&presence::folder(&self.path), holder)
    }

    async fn is_gone(&self, holder: &str) -> Result<bool, StoreError> {
        presence::is_gone(&presence::folder(&self.path), holder)
    }

    async fn gone_holders(&self) -> Result<Vec<String>, StoreError> {
        presence::gone_holders(&presence::folder(&self.path))
    }

    async fn end_leases_of_gone(&self, holder: &str) -> Result<u64, StoreError> {
        if !self.is_gone(holder).await? {
            return Ok(0);
        }
        let holder = holder.to_owned();
        self.write("end a gone holder's leases", self.sync, move |conn, now| {
            leases::end_leases_of(conn, &holder, now)
        })
        .await
    }

    async fn fire_schedules(&self, max: usize) -> Result<Vec<Tick>, StoreError> {
        let now = self.clock.now();
        let due = self
            .read("look for due schedules", move |conn| {
                schedules::any_due(conn, now)
            })
            .await?;
        if !due || max == 0 {
            return Ok(Vec::new());
        }
        let sealer = self.sealer();
        self.write("fire schedules", self.sync, move |conn, now| {
            schedules::fire(conn, max, now, Payloads(sealer.as_deref()))
        })
        .await
    }
}

#[async_trait::async_trait]
impl CatalogStore for SqliteStore {
    async fn put_component(&self, digest: &str, bytes: &[u8]) -> Result<bool, StoreError> {
        // Most runs start with a component the store already holds: looking first spares
        // copying its bytes (19 MB for a Python agent) into a write that does nothing.
        if self.has_component(digest).await? {
            return Ok(false);
        }
        let large = bytes.len() >= components::CHECKPOINT_AFTER_BYTES;
        let (digest, bytes) = (digest.to_owned(), bytes.to_vec());
        let inserted = self
            .write("store a component", self.sync, move |conn, now| {
                components::put_component(conn, &digest, &bytes, now)
            })
            .await?;
        if inserted && large {
            self.read("checkpoint after storing a component", |conn| {
                components::checkpoint(conn)
            })
            .await
            .unwrap_or_else(
                |e| tracing::debug!(error = %e, "no checkpoint after storing a component"),
            );
        }
        Ok(inserted)
    }

    async fn has_component(&self, digest: &str) -> Result<bool, StoreError> {
        let digest = digest.to_owned();
        self.read("look up a component", move |conn| {
            components::known(conn, &digest)
        })
        .await
    }

    async fn component(&self, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let digest = digest.to_owned();
        self.read("read a component", move |conn| {
            components::component(conn, &digest)
        })
        .await
    }

    async fn put_blob(&self, digest: &BlobDigest, bytes: &[u8]) -> Result<(), StoreError> {
        let (digest, bytes) = (*digest, bytes.to_vec());
        self.write("store a large value", self.sync, move |conn, now| {
            blobs::put(conn, &digest, &bytes, now)
        })
        .await
    }

    async fn blob(&self, digest: &BlobDigest) -> Result<Option<Vec<u8>>, StoreError> {
        let digest = *digest;
        self.read("read a large value", move |conn| blobs::get(conn, &digest))
            .await
    }

    async fn deploy_version(
        &self,
        deployment: &Deployment<'_>,
        rollout: &Rollout<'_>,
    ) -> Result<Deployed, StoreError> {
        let (name, digest) = (deployment.name.to_owned(), deployment.digest.to_owned());
        let (authority, admission) = (deployment.authority.to_vec(), deployment.admission);
        let source = deployment.source.map(str::to_owned);
        let (in_flight, exports) = (rollout.in_flight, rollout.exports.map(str::to_owned));
        self.write("deploy a component", self.sync, move |conn, now| {
            let deployment = Deployment {
                name: &name,
                digest: &digest,
                authority: &authority,
                admission,
                source: source.as_deref(),
            };
            let rollout = Rollout {
                in_flight,
                exports: exports.as_deref(),
            };
            components::deploy(conn, &deployment, &rollout, now)
        })
        .await
    }

    async fn versions(&self, name: &str) -> Result<Vec<VersionRecord>, StoreError> {
        let name = name.to_owned();
        self.read("list a deployment's versions", move |conn| {
            versions::versions(conn, &name)
        })
        .await
    }

    async fn move_runs(&self, request: &MoveRuns<'_>) -> Result<Vec<RunMove>, StoreError> {
        let (name, to, runs) = (request.name.to_owned(), request.to, request.runs.to_vec());
        self.write(
            "move runs to another version",
            self.sync,
            move |conn, now| {
                let request = MoveRuns {
                    name: &name,
                    to,
                    runs: &runs,
                };
                versions::move_runs(conn, &request, now)
            },
        )
        .await
    }

    async fn run_moves(&self, run_id: &str) -> Result<Vec<RunMove>, StoreError> {
        let run_id = run_id.to_owned();
        self.read("read a run's moves", move |conn| {
            versions::run_moves(conn, &run_id)
        })
        .await
    }

    async fn deployment(&self, name: &str) -> Result<Option<DeploymentRecord>, StoreError> {
        let name = name.to_owned();
        self.read("read a deployment", move |conn| {
            components::deployment(conn, &name)
        })
        .await
    }

    async fn deployments(&self) -> Result<Vec<DeploymentRecord>, StoreError> {
        self.read("list deployments", components::deployments).await
    }

    async fn admitted(&self, namespace: &str, digest: &str) -> Result<Option<bool>, StoreError> {
        let (namespace, digest) = (namespace.to_owned(), digest.to_owned());
        self.read("read a namespace's members", move |conn| {
            components::admitted(conn, &namespace, &digest)
        })
        .await
    }

    async fn set_flow(&self, setting: &FlowSetting<'_>) -> Result<FlowLimits, StoreError> {
        let deployment = setting.deployment.to_owned();
        let key = setting.key.map(str::to_owned);
        let (max_running, per_key) = (setting.max_running, setting.per_key);
        let sealer = self.sealer();
        self.write("set a deployment's limits", self.sync, move |conn, now| {
            let setting = FlowSetting {
                deployment: &deployment,
                max_running,
                key: key.as_deref(),
                per_key,
            };
            flow::set_flow(conn, &setting, now, Payloads(sealer.as_deref()))
        })
        .await
    }

    async fn clear_flow(&self, deployment: &str) -> Result<bool, StoreError> {
        let deployment = deployment.to_owned();
        self.write(
            "clear a deployment's limits",
            self.sync,
            move |conn, _now| flow::clear_flow(conn, &deployment),
        )
        .await
    }

    async fn flows(&self) -> Result<Vec<FlowLimits>, StoreError> {
        self.read("list limits", flow::flows).await
    }

    async fn set_rate(&self, setting: &RateSetting<'_>) -> Result<RateLimit, StoreError> {
        let class = setting.class.to_owned();
        let (limit, period, burst) = (setting.limit, setting.period, setting.burst);
        self.write("set a rate limit", self.sync, move |conn, now| {
            let setting = RateSetting {
                class: &class,
                limit,
                period,
                burst,
            };
            rates::set_rate(conn, &setting, now)
        })
        .await
    }

    async fn clear_rate(&self, class: &str) -> Result<bool, StoreError> {
        let class = class.to_owned();
        self.write("clear a rate limit", self.sync, move |conn, _now| {
            rates::clear_rate(conn, &class)
        })
        .await
    }

    async fn rates(&self) -> Result<Vec<RateLimit>, StoreError> {
        let now = self.clock.now();
        self.read("list rate limits", move |conn| rates::rates(conn, now))
            .await
    }

    async fn upgrade_run(&self, run_id: &str, from: &str, to: &str) -> Result<(), StoreError> {
        let (run_id, from, to) = (run_id.to_owned(), from.to_owned(), to.to_owned());
        self.write("upgrade a run", self.sync, move |conn, now| {
            versions::upgrade_run(conn, &run_id, &from, &to, now)
        })
        .await
    }

    async fn data_keys(&self) -> Result<Vec<DataKeyRecord>, StoreError> {
        self.read("read the data keys", sealing::data_keys).await
    }

    async fn put_data_key(&self, record: &DataKeyRecord) -> Result<(), StoreError> {
        let record = record.clone();
        self.write("record a data key", SyncMode::Full, move |conn, _| {
            sealing::put_first(conn, &record)
        })
        .await
    }

    async fn rewrap_data_keys(
        &self,
        old_key_id: &str,
        records: &[DataKeyRecord],
    ) -> Result<(), StoreError> {
        let (old_key_id, records) = (old_key_id.to_owned(), records.to_vec());
        self.write("rewrap the data keys", SyncMode::Full, move |conn, _| {
            sealing::rewrap(conn, &old_key_id, &records)
        })
        .await
    }

    fn use_sealer(&self, sealer: Arc<Sealer>) {
        // Set once, by whoever seals the store; a second call brings the same keys.
        let _ = self.sealer.set(sealer);
    }
}

#[async_trait::async_trait]
impl OperatorStore for SqliteStore {
    async fn submit(&self, submission: &Submission<'_>) -> Result<Submitted, StoreError> {
        let owned = OwnedSubmission::new(submission);
        let sealer = self.sealer();
        self.write("submit a run", self.sync, move |conn, now| {
            runs::submit(conn, &owned.borrow(), now, Payloads(sealer.as_deref()))
        })
        .await
    }

    async fn submit_many(
        &self,
        submissions: &[Submission<'_>],
    ) -> Result<Vec<Result<Submitted, StoreError>>, StoreError> {
        let owned: Vec<OwnedSubmission> = submissions.iter().map(OwnedSubmission::new).collect();
        let sealer = self.sealer();
        self.write("submit runs", self.sync, move |conn, now| {
            let payloads = Payloads(sealer.as_deref());
            let mut answers = Vec::with_capacity(owned.len());
            for submission in &owned {
                answers.push(
                    match runs::submit(conn, &submission.borrow(), now, payloads) {
                        // Every refusal comes before the submission's first write.
                        Err(TxError::Store(e)) if e.is_refusal() => Err(e),
                        Err(e) => return Err(e),
                        Ok(submitted) => Ok(submitted),
                    },
                );
            }
            Ok(answers)
        })
        .await
    }

    async fn run(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        let run_id = run_id.to_owned();
        self.read("read a run", move |conn| runs::run(conn, &run_id))
            .await
    }

    async fn run_authority(&self, run_id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let run_id = run_id.to_owned();
        self.read("read a run's authority", move |conn| {
            runs::authority(conn, &run_id)
        })
        .await
    }

    async fn run_input(&self, run_id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let run_id = run_id.to_owned();
        self.read("read a run's input", move |conn| runs::input(conn, &run_id))
            .await
    }

    async fn runs(&self, filter: &RunFilter<'_>) -> Result<Vec<RunRecord>, StoreError> {
        let filter = runs::OwnedFilter::from(filter);
        self.read("list runs", move |conn| runs::runs(conn, &filter))
            .await
    }

    async fn cancel_run(&self, run_id: &str) -> Result<Cancelled, StoreError> {
        let run_id = run_id.to_owned();
        self.write("cancel a run", self.sync, move |conn, now| {
            runs::cancel_run(conn, &run_id, now)
        })
        .await
    }

    async fn pause_run(&self, run_id: &str) -> Result<Paused, StoreError> {
        let run_id = run_id.to_owned();
        self.write("pause a run", self.sync, move |conn, now| {
            pause::pause_run(conn, &run_id, now)
        })
        .await
    }

    async fn resume_run(&self, run_id: &str) -> Result<Resumed, StoreError> {
        let run_id = run_id.to_owned();
        self.write("resume a run", self.sync, move |conn, now| {
            pause::resume_run(conn, &run_id, now)
        })
        .await
    }

    async fn pause_deployment(&self, name: &str) -> Result<DeploymentPaused, StoreError> {
        let name = name.to_owned();
        self.write("pause a deployment", self.sync, move |conn, now| {
            pause::pause_deployment(conn, &name, now)
        })
        .await
    }

    async fn resume_deployment(&self, name: &str) -> Result<DeploymentPaused, StoreError> {
        let name = name.to_owned();
        self.write("resume a deployment", self.sync, move |conn, now| {
            pause::resume_deployment(conn, &name, now)
        })
        .await
    }

    async fn paused_deployments(&self) -> Result<Vec<PausedDeployment>, StoreError> {
        self.read("list paused deployments", pause::paused_deployments)
            .await
    }

    async fn resolve(
        &self,
        run_id: &str,
        key: &str,
        resolution: Resolution<'_>,
    ) -> Result<(), StoreError> {
        let (run_id, key) = (run_id.to_owned(), key.to_owned());
        let result = match resolution {
            Resolution::Commit(result) => Some(result.to_vec()),
            Resolution::Retry => None,
        };
        self.write("resolve an in-doubt key", self.sync, move |conn, now| {
            let resolution = match &result {
                Some(result) => Resolution::Commit(result),
                None => Resolution::Retry,
            };
            claims::resolve(conn, &run_id, &key, resolution, now)
        })
        .await
    }

    async fn send_signal(
        &self,
        run_id: &str,
        name: &str,
        payload: &[u8],
        max_payload: usize,
    ) -> Result<SignalSent, StoreError> {
        let (run_id, name, payload) = (run_id.to_owned(), name.to_owned(), payload.to_vec());
        self.write("send a signal", self.sync, move |conn, now| {
            waits::send_signal(conn, &run_id, &name, &payload, max_payload, now)
        })
        .await
    }

    async fn open_claims(&self, run_id: Option<&str>) -> Result<Vec<OpenClaim>, StoreError> {
        let run_id = run_id.map(str::to_owned);
        self.read("list open claims", move |conn| {
            claims::open_claims(conn, run_id.as_deref())
        })
        .await
    }

    async fn steps(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        let run_id = run_id.to_owned();
        self.read("list a run's steps", move |conn| {
            claims::steps(conn, &run_id)
        })
        .await
    }

    async fn waits(&self, run_id: &str) -> Result<Vec<WaitRecord>, StoreError> {
        let run_id = run_id.to_owned();
        self.read("read a run's waits", move |conn| {
            waits::waits(conn, &run_id)
        })
        .await
    }

    async fn events(&self, run_id: &str) -> Result<Option<Timeline>, StoreError> {
        let run_id = run_id.to_owned();
        self.read("read a run's timeline", move |conn| {
            events::read(conn, &run_id)
        })
        .await
    }

    async fn history(&self, run_id: &str) -> Result<Option<RunHistory>, StoreError> {
        let run_id = run_id.to_owned();
        self.read("read a run's history", move |conn| {
            history::history(conn, &run_id)
        })
        .await
    }

    async fn checkpoint_before(
        &self,
        run_id: &str,
        before: Option<Position>,
    ) -> Result<Option<SavedCheckpoint>, StoreError> {
        let run_id = run_id.to_owned();
        self.read("read a run's checkpoint", move |conn| {
            history::checkpoint_before(conn, &run_id, before)
        })
        .await
    }

    async fn fork(&self, req: &ForkRequest<'_>) -> Result<Forked, StoreError> {
        let owned = OwnedFork::new(req);
        let sealer = self.sealer();
        self.write("fork a run", self.sync, move |conn, now| {
            history::fork(conn, &owned.borrow(), now, Payloads(sealer.as_deref()))
        })
        .await
    }

    async fn logs(&self, run_id: &str) -> Result<Vec<u8>, StoreError> {
        let run_id = run_id.to_owned();
        let sealer = self.sealer();
        self.read("read a run's log", move |conn| {
            logs::read(conn, &run_id, Payloads(sealer.as_deref()))
        })
        .await
    }

    async fn live(
        &self,
        run_id: &str,
        after: Option<u64>,
        limit: usize,
    ) -> Result<Vec<LiveChunk>, StoreError> {
        let run_id = run_id.to_owned();
        let sealer = self.sealer();
        self.read("read a run's live stream", move |conn| {
            live::read(conn, &run_id, after, limit, Payloads(sealer.as_deref()))
        })
        .await
    }

    async fn create_schedule(&self, def: &ScheduleDef<'_>) -> Result<ScheduleRecord, StoreError> {
        let (name, deployment) = (def.name.to_owned(), def.deployment.to_owned());
        let (spec, input) = (def.spec.clone(), def.input.to_vec());
        let (catch_up, overlap) = (def.catch_up, def.overlap);
        self.write("create a schedule", self.sync, move |conn, now| {
            let def = ScheduleDef {
                name: &name,
                deployment: &deployment,
                spec: &spec,
                input: &input,
                catch_up,
                overlap,
            };
            schedules::create(conn, &def, now)
        })
        .await
    }

    async fn schedules(&self) -> Result<Vec<ScheduleRecord>, StoreError> {
        self.read("list schedules", schedules::list).await
    }

    async fn schedule(&self, name: &str) -> Result<Option<ScheduleRecord>, StoreError> {
        let name = name.to_owned();
        self.read("read a schedule", move |conn| schedules::get(conn, &name))
            .await
    }

    async fn pause_schedule(&self, name: &str, paused: bool) -> Result<ScheduleRecord, StoreError> {
        let name = name.to_owned();
        let op = if paused {
            "pause a schedule"
        } else {
            "resume a schedule"
        };
        self.write(op, self.sync, move |conn, now| {
            schedules::pause(conn, &name, paused, now)
        })
        .await
    }

    async fn delete_schedule(&self, name: &str) -> Result<(), StoreError> {
        let name = name.to_owned();
        self.write("delete a schedule", self.sync, move |conn, _| {
            schedules::delete(conn, &name)
        })
        .await
    }

    async fn run_schedule(&self, run_id: &str) -> Result<Option<ScheduledBy>, StoreError> {
        let run_id = run_id.to_owned();
        self.read("read a run's schedule", move |conn| {
            schedules::run_schedule(conn, &run_id)
        })
        .await
    }

    async fn usage(&self, filter: &UsageFilter<'_>) -> Result<Vec<UsageTotal>, StoreError> {
        let run_id = filter.run_id.map(str::to_owned);
        let deployment = filter.deployment.map(str::to_owned);
        self.read("sum model calls' usage", move |conn| {
            let filter = UsageFilter {
                run_id: run_id.as_deref(),
                deployment: deployment.as_deref(),
            };
            usage::totals(conn, &filter)
        })
        .await
    }

    async fn gc(&self, req: &GcRequest) -> Result<GcReport, StoreError> {
        const OP: &str = "collect garbage";
        let now = self.clock.now();
        let cut = gc::Cut::new(now, req);
        let mut report = cut.report();
        // Keys first: a chunk is read, and written only if something in it goes.
        let mut after = String::new();
        loop {
            let (c, a) = (cut.clone(), after.clone());
            let chunk = self
                .read(OP, move |conn| gc::scan_steps(conn, &c, &a))
                .await?;
            let Some(chunk) = chunk else { break };
            if req.dry_run {
                report.results += chunk.results;
                report.claims += chunk.claims;
            } else if chunk.results + chunk.claims > 0 {
                let (c, a, last) = (cut.clone(), after.clone(), chunk.last.clone());
                let (results, claims) = self
                    .write(OP, self.sync, move |conn, _| {
                        gc::delete_steps(conn, &c, &a, &last)
                    })
                    .await?;
                report.results += results;
                report.claims += claims;
            }
            after = chunk.last;
        }
        // Then the runs, a batch at a time, with what hangs off them.
        let mut after = 0;
        loop {
            let c = cut.clone();
            let batch = self
                .read(OP, move |conn| gc::collected_runs(conn, &c, after))
                .await?;
            let Some(&(last, _)) = batch.last() else {
                break;
            };
            after = last;
            let ids: Vec<String> = batch.into_iter().map(|(_, id)| id).collect();
            let (c, dry_run) = (cut.clone(), req.dry_run);
            let mut part = GcReport::default();
            part = if dry_run {
                self.read(OP, move |conn| {
                    gc::collect_runs(conn, &c, &ids, true, &mut part).map(|()| part)
                })
                .await?
            } else {
                self.write(OP, self.sync, move |conn, _| {
                    gc::collect_runs(conn, &c, &ids, false, &mut part).map(|()| part)
                })
                .await?
            };
            report.add(&part);
        }
        // Then the step history of finished runs that stay, if asked.
        if let Some(before) = cut.history_before {
            let mut after = 0;
            loop {
                let c = cut.clone();
                let batch = self
                    .read(OP, move |conn| gc::history_runs(conn, &c, before, after))
                    .await?;
                let Some(&(last, ..)) = batch.last() else {
                    break;
                };
                after = last;
                let ids = report.histories_to_collect(batch, req.dry_run);
                if req.dry_run || ids.is_empty() {
                    continue;
                }
                let c = cut.clone();
                report.checkpoints += self
                    .write(OP, self.sync, move |conn, _| {
                        gc::collect_history(conn, &c, before, &ids)
                    })
                    .await?;
            }
        }
        // Last the components no run or deployment uses any more.
        if req.dry_run {
            let c = cut.clone();
            report.components = self
                .read(OP, move |conn| gc::count_components(conn, &c))
                .await?;
        } else {
            loop {
                let c = cut.clone();
                let deleted = self
                    .write(OP, self.sync, move |conn, _| {
                        gc::delete_components(conn, &c)
                    })
                    .await?;
                if deleted == 0 {
                    break;
                }
                report.components += deleted;
            }
        }
        // And the blobs no row refers to any more.
        let before = blobs::cut(now, report.runs_before);
        if req.dry_run {
            report.blobs = self
                .read(OP, move |conn| blobs::count(conn, before))
                .await?;
        } else {
            loop {
                let deleted = self
                    .write(OP, self.sync, move |conn, _| blobs::delete(conn, before))
                    .await?;
                if deleted == 0 {
                    break;
                }
                report.blobs += deleted;
            }
        }
        Ok(report)
    }
}

/// [`SyncMode::Full`] if any of the writes asks for it.
fn strongest(modes: impl IntoIterator<Item = SyncMode>) -> SyncMode {
    if modes.into_iter().any(|mode| mode == SyncMode::Full) {
        SyncMode::Full
    } else {
        SyncMode::Normal
    }
}

impl SqliteStore {
    /// Claims `req`'s key, or takes over its claim at `stale_token`.
    async fn claim_key(
        &self,
        op: &'static str,
        req: &ClaimRequest<'_>,
        stale_token: Option<u64>,
    ) -> Result<ClaimOutcome, StoreError> {
        let floor = self.token_floor;
        let write = |conn: &_, now| claims::claim(conn, req, stale_token, now, floor);
        self.write_or(op, req.sync(), write, |_| {
            let req = OwnedRequest::new(req);
            move |conn, now| claims::claim(conn, &req.borrow(), stale_token, now, floor)
        })
        .await
    }
}

/// [`InstanceStore::claim_rated`] in the caller's transaction: the token's wait, then
/// the claim if the token is the step's now.
fn rated(
    conn: &rusqlite::Connection,
    req: &ClaimRequest<'_>,
    token: &WaitRequest<'_>,
    now: Millis,
    floor: u64,
) -> Result<Rated, TxError> {
    match waits::wait(conn, token.fence, token.key, &token.kind, now)? {
        WaitState::Pending { due } => Ok(Rated::Due(due)),
        _ => claims::claim(conn, req, None, now, floor).map(Rated::Claimed),
    }
}
