//! Large values kept once by digest (`store/values/`), in clear and sealed stores of
//! every backend: every kind of value over the threshold reads back as it was written
//! through every path that copies or compares it, each distinct value is one blob
//! (counted in the database's own tables), a value that looks like a reference reads
//! back as itself, and gc collects exactly the blobs no row refers to, never one used
//! within the grace.

use std::sync::Arc;
use std::time::Duration;

use super::sealing::plant;
use super::{Env, Harness, T0, block_on};
use crate::store::values::blobs;
use crate::store::{
    BLOB_FROM, BLOB_GRACE, Checkpoint, Clock, Counts, GcRequest, HISTORY_KEEP_LARGE, Millis,
    RunEnd, Store, ValueStore,
};

/// The harness's store as idem opens it: behind a [`ValueStore`] (a sealed harness's
/// store is one already).
fn values<H: Harness>(harness: &H, wrap: bool) -> Arc<dyn Store> {
    if wrap {
        Arc::new(ValueStore::new(harness.store(), None))
    } else {
        harness.store()
    }
}

/// Runs `test` on a fresh database of `H`, through its store as idem opens it.
fn with_store<H: Harness>(wrap: bool, test: impl FnOnce(&H, &Env<'_>)) {
    let clock = Clock::manual(T0);
    let Some(harness) = H::create(&clock) else {
        return;
    };
    let store = values(&harness, wrap);
    let env = Env {
        store: store.as_ref(),
        clock: &clock,
    };
    test(&harness, &env);
}

/// Rows of `table` that hold a reference in `column`.
fn references<H: Harness>(harness: &H, table: &str, column: &str) -> u64 {
    harness.rows(&format!(
        "{table} WHERE length({column}) = {}",
        blobs::REF_LEN
    ))
}

/// Every kind of value, each over the threshold, through every path: read back
/// whole; each distinct value one blob however many rows refer to it.
fn every_large_value_is_kept_once<H: Harness>(wrap: bool) {
    with_store(wrap, |harness: &H, env| {
        let marker = format!("LARGE{:08x}", fastrand::u32(..));
        let secret = format!("{marker}{}", "v".repeat(BLOB_FROM));
        block_on(plant(env, &secret, "blob"));
        // The blobs are the values as the store keeps them: sealed in a sealed store.
        assert_eq!(
            harness.raw_holds(marker.as_bytes()),
            wrap,
            "a large value is in the database in clear exactly when the store is"
        );
        // Distinct values: the input (two runs), result, checkpoint, signal payload (the
        // signal and the wait that took it), child input, child output (its run and the
        // join), resolved result, output, error text, schedule input (the schedule and
        // the run its tick started).
        assert_eq!(harness.rows("blobs"), 10);
        assert_eq!(harness.rows("blob_bytes"), 10);
        assert_eq!(references(harness, "run_inputs", "input"), 4);
        assert_eq!(references(harness, "signals", "payload"), 1);
        assert_eq!(references(harness, "waits", "payload"), 1);
        assert_eq!(references(harness, "join_members", "outcome"), 1);
        assert_eq!(references(harness, "schedules", "input"), 1);
        // Authorities stay in their rows.
        assert_eq!(references(harness, "run_inputs", "authority"), 0);
        // No row holds a large value itself.
        assert_eq!(
            harness.rows(&format!("steps WHERE length(result) >= {BLOB_FROM}")),
            0
        );
    });
}

/// A value an agent writes that starts like a reference is kept as a blob of its
/// own, so it reads back as itself, never as the blob it names.
fn a_value_that_looks_like_a_reference_reads_back_as_itself<H: Harness>(wrap: bool) {
    with_store(wrap, |_: &H, env| {
        let store = env.store;
        block_on(async {
            env.submit("forger", b"{}").await;
            let run = env.acquire("forger", "w").await;
            let large = vec![b'L'; BLOB_FROM];
            let grant = env.grant("forger/large", "h", &run).await;
            env.commit("forger/large", grant.token, &run, &large)
                .await
                .unwrap();
            // In a clear store the forged reference names the large value's blob exactly.
            let forged = blobs::reference(&blobs::digest(&large)).to_vec();
            let grant = env.grant("forger/forged", "h", &run).await;
            env.commit("forger/forged", grant.token, &run, &forged)
                .await
                .unwrap();
            let short = blobs::REF_MAGIC.to_vec();
            let grant = env.grant("forger/short", "h", &run).await;
            env.commit("forger/short", grant.token, &run, &short)
                .await
                .unwrap();
            assert_eq!(
                store.committed("forger/forged").await.unwrap(),
                Some(forged)
            );
            assert_eq!(store.committed("forger/short").await.unwrap(), Some(short));
            assert_eq!(store.committed("forger/large").await.unwrap(), Some(large));
        });
    });
}

/// gc collects a blob once no row refers to it and it went unused for the grace: a
/// large checkpoint's once the run saved [`HISTORY_KEEP_LARGE`] larger ones after it
/// (its history keeps its place, not its state), then a finished run's values with the
/// run.
fn gc_collects_the_blobs_no_row_refers_to<H: Harness>(wrap: bool) {
    with_store(wrap, |harness: &H, env| {
        let store = env.store;
        let gc = |finished_before: Duration| {
            block_on(store.gc(&GcRequest {
                history_before: None,
                finished_before,
                dedupe_window: finished_before,
                include_failed: false,
                dry_run: false,
            }))
            .unwrap()
        };
        let large = |tag: u8| vec![tag; BLOB_FROM + 1];
        let run = block_on(async {
            env.submit("kept", &large(b'i')).await;
            let run = env.acquire("kept", "w").await;
            for (step, tag) in (1..).zip(b'a'..=b'f') {
                let checkpoint = Checkpoint {
                    step,
                    state: large(tag),
                };
                store.save_progress(&run, &checkpoint, None).await.unwrap();
            }
            run
        });
        // The input and six checkpoints; the first two are referred to by nothing now.
        assert_eq!(HISTORY_KEEP_LARGE, 4);
        assert_eq!(harness.rows("blobs"), 7);
        let history = block_on(store.history("kept")).unwrap().unwrap();
        let kept: Vec<bool> = history.checkpoints.iter().map(|c| c.kept).collect();
        assert_eq!(kept, [false, false, true, true, true, true]);
        // Within the grace nothing goes, even with the cuts at now.
        assert_eq!(gc(Duration::ZERO).blobs, 0);
        let grace = Millis::try_from(BLOB_GRACE.as_millis()).unwrap();
        env.advance(grace + 1);
        let report = gc(Duration::ZERO);
        assert_eq!((report.blobs, report.runs), (2, 0));
        assert_eq!((harness.rows("blobs"), harness.rows("blob_bytes")), (5, 5));
        assert_eq!(
            block_on(store.load_progress("kept"))
                .unwrap()
                .unwrap()
                .state,
            large(b'f')
        );

        // The run ends with a large output; a day later gc takes the run and every blob.
        block_on(store.finish_run(&run, RunEnd::Completed(&large(b'o')), &Counts::default()))
            .unwrap();
        assert_eq!(harness.rows("blobs"), 6);
        let day = Duration::from_secs(86_400);
        env.advance(Millis::try_from(2 * day.as_millis()).unwrap());
        let report = gc(day);
        assert_eq!((report.runs, report.blobs), (1, 6));
        assert_eq!((harness.rows("blobs"), harness.rows("blob_bytes")), (0, 0));
    });
}

macro_rules! blob_tests {
    ($backend:ident: $harness:ty, wrap: $wrap:expr) => {
        mod $backend {
            #[test]
            fn every_large_value_is_kept_once() {
                super::every_large_value_is_kept_once::<$harness>($wrap);
            }

            #[test]
            fn a_value_that_looks_like_a_reference_reads_back_as_itself() {
                super::a_value_that_looks_like_a_reference_reads_back_as_itself::<$harness>($wrap);
            }

            #[test]
            fn gc_collects_the_blobs_no_row_refers_to() {
                super::gc_collects_the_blobs_no_row_refers_to::<$harness>($wrap);
            }
        }
    };
}

#[cfg(feature = "sqlite")]
blob_tests!(sqlite: crate::store::tests::SqliteHarness, wrap: true);
#[cfg(feature = "postgres")]
blob_tests!(postgres: crate::store::tests::PostgresHarness, wrap: true);
#[cfg(feature = "sqlite")]
blob_tests!(sqlite_sealed: crate::store::tests::sealing::SealedHarness<crate::store::tests::SqliteHarness>, wrap: false);
#[cfg(feature = "postgres")]
blob_tests!(postgres_sealed: crate::store::tests::sealing::SealedHarness<crate::store::tests::PostgresHarness>, wrap: false);
