//! The large-values rows: a durable step (claim, effect, commit with its checkpoint)
//! whose result is 1 KiB, 1 MiB and 16 MiB, on SQLite and PostgreSQL, through the store
//! idem opens (so results of 128 KiB and more are kept once by digest, in the blob
//! tables): µs per step, timed in the guest, and the bytes written per step. SQLite's
//! bytes are what the bench's process wrote (`wchar` of `/proc/self/io`: the WAL and
//! the checkpoints of the database thread); PostgreSQL's are the server's WAL (its
//! insert position), where its rows, their TOAST and their full pages go first. Each
//! turn's results are new (a seed of its own): none is found kept already.

use std::sync::Arc;

use anyhow::{Context, ensure};
use idem::runtime::{FaultPlan, Host};
use idem::store::{self, StoreOptions, SyncMode};
use serde_json::json;

use super::postgres::client;
use super::report::{Table, progress};
use super::{Bed, BenchHost, Plan, repeat};

/// Result sizes and the steps each turn runs.
const SIZES: [(usize, &str, u64); 3] = [
    (1 << 10, "1 KiB", 200),
    (1 << 20, "1 MiB", 20),
    (16 << 20, "16 MiB", 4),
];

pub(crate) fn values(bed: &Bed, plan: &Plan, table: &mut Table) -> anyhow::Result<()> {
    let path = bed.dir.join("values.db");
    let sqlite = host(bed, path.to_str().unwrap_or_default())?;
    measure(bed, plan, table, &sqlite, "SQLite", &|| {
        Ok(process_written())
    })?;

    let server = std::env::var("IDEM_BENCH_POSTGRES")
        .unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/test".into());
    let schema = format!("idem_bench_values_{}", std::process::id());
    let admin = bed.tokio.block_on(client(&server)).with_context(|| {
        format!("the values section needs a PostgreSQL server at {server} (IDEM_BENCH_POSTGRES)")
    })?;
    bed.tokio
        .block_on(admin.batch_execute(&format!("CREATE SCHEMA {schema}")))?;
    let url = format!("{server}?options=-csearch_path%3D{schema}");
    let result = host(bed, &url).and_then(|postgres| {
        let wal = || -> anyhow::Result<u64> {
            let row = bed.tokio.block_on(admin.query_one(
                "SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::int8",
                &[],
            ))?;
            Ok(u64::try_from(row.try_get::<_, i64>(0)?)?)
        };
        measure(bed, plan, table, &postgres, "PostgreSQL", &wal)
    });
    bed.tokio
        .block_on(admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")))?;
    result
}

/// A host on the store at `location`, opened as idem opens it, sync normal.
fn host(bed: &Bed, location: &str) -> anyhow::Result<BenchHost> {
    let options = StoreOptions {
        sync: SyncMode::Normal,
        ..StoreOptions::default()
    };
    let store = bed.tokio.block_on(store::open(location, &options))?;
    let _inside = bed.tokio.enter();
    Ok(BenchHost {
        host: Arc::new(Host::new(Arc::clone(&bed.runtime), store)?),
        sync: SyncMode::Normal,
        sqlite: None,
    })
}

fn measure(
    bed: &Bed,
    plan: &Plan,
    table: &mut Table,
    host: &BenchHost,
    backend: &str,
    written: &dyn Fn() -> anyhow::Result<u64>,
) -> anyhow::Result<()> {
    for (size, name, n) in SIZES {
        progress(&format!("  a {name} result on {backend}"));
        let (mut steps, mut bytes, mut seed) = (Vec::new(), Vec::new(), 0u64);
        repeat(plan.values, || {
            seed += 1;
            let input = json!({
                "mode": "steps", "n": n, "timed": true, "result_bytes": size, "seed": seed,
            });
            let before = written()?;
            let (report, output) = bed.run(host, input, FaultPlan::default())?;
            let after = written()?;
            ensure!(
                report.counts.executed == n && output.step_ns.len() as u64 == n,
                "every step of the turn runs: {:?}",
                report.counts
            );
            steps.extend(output.step_ns.iter().map(|&ns| ns as f64 / 1e3));
            bytes.push(after.saturating_sub(before) as f64 / n as f64 / 1024.0);
            Ok(())
        })?;
        table.row(
            format!("values: a durable step with a {name} result, {backend} sync normal"),
            "µs",
            steps,
        );
        table.row(
            format!("values: bytes written per step with a {name} result, {backend}"),
            "KiB",
            bytes,
        );
    }
    Ok(())
}

/// Bytes this process has written so far (`wchar`: every write call, to any file).
fn process_written() -> u64 {
    std::fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|io| {
            io.lines()
                .find_map(|line| line.strip_prefix("wchar: "))
                .and_then(|n| n.trim().parse().ok())
        })
        .unwrap_or(0)
}
