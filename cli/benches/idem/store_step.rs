//! The store's own share of a durable step: a claim and a commit (with the run's
//! checkpoint folded in) made straight through `SqliteStore`, one after the other as one
//! run makes them, with no wasm, no host and no effect. The row bounds from below what
//! any change above the store can make of a durable step: a step target under it needs a
//! cheaper store protocol, not a faster host.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use idem::store::{
    Acquired, CatalogStore, Checkpoint, ClaimOutcome, ClaimRef, ClaimRequest, Commit,
    InstanceStore, OperatorStore, RunFence, SqliteStore, Submission, SyncMode, WorkerStore,
};

/// A digest the store takes as a component's name; the row runs nothing from it.
const DIGEST: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// One leased run on its own store, ready to claim and commit keys.
pub struct StoreStep {
    store: SqliteStore,
    fence: RunFence,
    next: u64,
}

impl StoreStep {
    pub async fn open(path: &Path, sync: SyncMode) -> anyhow::Result<StoreStep> {
        let store = SqliteStore::open(path, sync)
            .with_context(|| format!("opening the store-alone row's store {}", path.display()))?;
        store.put_component(DIGEST, b"\0asm").await?;
        let run_id = "store-step";
        store
            .submit(&Submission {
                run_id,
                agent: "bench",
                digest: DIGEST,
                namespace: "bench",
                input: b"{}",
                authority: b"",
                replace_authority: false,
                priority: 0,
            })
            .await?;
        let token = match store
            .acquire_run(run_id, "bench", Duration::from_secs(3600))
            .await?
        {
            Acquired::Leased(run) => run.token,
            other => bail!("the bench's own run was not leased: {other:?}"),
        };
        let fence = RunFence {
            run_id: run_id.to_owned(),
            token,
            sync,
        };
        Ok(StoreStep {
            store,
            fence,
            next: 0,
        })
    }

    /// `n` steps, each a claim as the bench agent's `run_once` makes it (in-doubt policy
    /// `Retry`: durable with its commit) and a commit carrying the next checkpoint: µs
    /// per step.
    pub async fn steps(&mut self, n: usize) -> anyhow::Result<Vec<f64>> {
        let mut samples = Vec::with_capacity(n);
        for _ in 0..n {
            self.next += 1;
            // The shape of a key the SDK's `Key::for_run` makes, qualified by namespace.
            let key = format!(
                "bench:{}/s/{:032x}",
                self.fence.run_id,
                self.next.wrapping_mul(0x9e37_79b9_7f4a_7c15)
            );
            let checkpoint = Checkpoint {
                step: self.next,
                state: b"null".to_vec(),
            };
            let t = Instant::now();
            let outcome = self
                .store
                .claim(&ClaimRequest {
                    key: &key,
                    fence: &self.fence,
                    holder: "bench-instance",
                    fingerprint: None,
                    lease: Duration::from_secs(60),
                    durable: false,
                })
                .await?;
            let ClaimOutcome::Granted(grant) = outcome else {
                bail!("key {key} was not granted: {outcome:?}");
            };
            self.store
                .commit(&Commit {
                    claim: ClaimRef {
                        key: &key,
                        token: grant.token,
                        fence: &self.fence,
                    },
                    result: b"null",
                    checkpoint: Some(&checkpoint),
                    counts: None,
                })
                .await?;
            samples.push(t.elapsed().as_secs_f64() * 1e6);
        }
        Ok(samples)
    }
}
