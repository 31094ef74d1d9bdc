//! The idem benchmark: one run measures what a durable step costs, the floor under it,
//! and how it scales, and prints one markdown table (`cargo bench -p idem-host --bench
//! idem`, `-- --quick` for a short check that it works).
//!
//! Everything goes through idem's public API and the real `idem` binary, on a temp dir
//! under cargo's target dir: a real disk, so that an fsync costs what it costs there.
//! BENCHMARKS.md says how each row is measured and reads the numbers.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail, ensure};
use idem::runtime::{FaultPlan, Host, Limits, LoadedAgent, RunOptions, RunReport, Runtime};
use idem::store::{RunStatus, SqliteStore, SyncMode};
use idem_test_artifacts::BENCH;
use rusqlite::{Connection, params};
use serde_json::json;

/// How many times each thing is measured. `--quick` shrinks everything to check that the
/// bench works; the full plan aims at stable medians and a p99 backed by 100+ samples
/// wherever a sample is cheap, in a few minutes on two cores.
struct Plan {
    /// Empty and one-row transactions per floor row under `synchronous = NORMAL`.
    floor_txs: usize,
    /// fsync'd operations per floor row (`synchronous = FULL`, `sync_data`).
    floor_syncs: usize,
    /// Runs × steps per run for the durable step, sync normal and full.
    steps_normal: (usize, u64),
    steps_full: (usize, u64),
    /// Runs × calls per run for the host-call round trip.
    calls: (usize, u64),
    /// Pairs of runs (with and without recycling) × steps per run.
    resume: (usize, u64),
    /// `idem run` invocations with and without the cache; `Runtime::load` compiles.
    cold_cached: usize,
    cold_uncached: usize,
    compiles: usize,
    /// Repetitions × steps per run for throughput, sync normal and full.
    throughput_normal: (usize, u64),
    throughput_full: (usize, u64),
    /// Committed rows in the store before each scaling row, and runs × steps per row.
    fills: &'static [u64],
    scale: (usize, u64),
}

const FULL_PLAN: Plan = Plan {
    floor_txs: 20_000,
    floor_syncs: 5_000,
    steps_normal: (40, 500),
    steps_full: (20, 250),
    calls: (100, 200_000),
    resume: (300, 50),
    cold_cached: 200,
    cold_uncached: 30,
    compiles: 30,
    throughput_normal: (20, 300),
    throughput_full: (10, 100),
    fills: &[10_000, 100_000, 1_000_000],
    scale: (20, 300),
};

const QUICK_PLAN: Plan = Plan {
    floor_txs: 1_000,
    floor_syncs: 100,
    steps_normal: (2, 100),
    steps_full: (2, 30),
    calls: (3, 20_000),
    resume: (5, 20),
    cold_cached: 4,
    cold_uncached: 2,
    compiles: 2,
    throughput_normal: (1, 50),
    throughput_full: (1, 10),
    fills: &[1_000, 10_000],
    scale: (2, 100),
};

/// Concurrent runs in one host for the throughput rows.
const CONCURRENCY: [usize; 3] = [1, 8, 64];

fn main() -> anyhow::Result<()> {
    let quick = std::env::args().any(|a| a == "--quick");
    let plan = if quick { &QUICK_PLAN } else { &FULL_PLAN };
    let began = Instant::now();

    // CARGO_TARGET_TMPDIR is under the target dir, so on the repo's disk: /tmp may be a
    // tmpfs, where fsync costs nothing and the floor would be a fiction.
    let dir = tempfile::Builder::new()
        .prefix("idem-bench-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))?;
    print_machine(dir.path(), quick)?;

    let runtime = Arc::new(Runtime::new(None)?);
    let agent = runtime.load(Path::new(BENCH))?;
    let bed = Bed {
        dir: dir.path().to_path_buf(),
        runtime,
        agent,
    };
    let mut table = Table::default();

    // Sections to run, by name (`cargo bench --bench idem -- steps resume`): all when
    // none is named. The durable-step ratio needs the floor, so it always runs.
    let only: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wanted = |name: &str| only.is_empty() || only.iter().any(|o| o == name);

    progress("floor: SQLite transactions and fdatasync");
    let floor_normal = floor(&bed, plan, &mut table)?;
    if wanted("steps") {
        progress("durable steps");
        durable_steps(&bed, plan, &floor_normal, &mut table)?;
    }
    if wanted("calls") {
        progress("host-call round trip");
        host_calls(&bed, plan, &mut table)?;
    }
    if wanted("resume") {
        progress("resume after recycle");
        resume(&bed, plan, &mut table)?;
    }
    if wanted("cold") {
        progress("cold start (the idem binary) and compile");
        cold_start(&bed, plan, &mut table)?;
    }
    if wanted("throughput") {
        progress("throughput");
        throughput(&bed, plan, &mut table)?;
    }
    if wanted("scaling") {
        progress("scaling with committed rows");
        scaling(&bed, plan, &mut table)?;
    }

    table.print();
    println!();
    println!(
        "Bench run time: {:.0} s ({} plan).",
        began.elapsed().as_secs_f64(),
        if quick { "quick" } else { "full" }
    );
    Ok(())
}

/// What every measurement shares: the temp dir, the engine, the compiled bench agent.
struct Bed {
    dir: PathBuf,
    runtime: Arc<Runtime>,
    agent: LoadedAgent,
}

/// The floors under `synchronous` NORMAL and FULL, for the durable-step ratio.
struct Floors {
    normal: f64,
    full: f64,
}

impl Bed {
    fn host(&self, db: &Path, sync: SyncMode) -> anyhow::Result<Host> {
        let store = SqliteStore::open(db, sync)?;
        Ok(Host::new(
            Arc::clone(&self.runtime),
            Arc::new(store),
            Limits::default(),
        ))
    }

    /// Runs the bench agent to completion on a fresh run id and returns its report and
    /// its decoded output.
    fn run(
        &self,
        host: &Host,
        input: serde_json::Value,
        faults: FaultPlan,
    ) -> anyhow::Result<(RunReport, GuestOutput)> {
        let opts = RunOptions {
            run_id: fresh_run_id(),
            input: serde_json::to_vec(&input)?,
            faults,
            ..RunOptions::default()
        };
        let report = host.run(&self.agent, &opts)?;
        ensure!(
            report.status == RunStatus::Completed,
            "run {} ended {:?}: {}",
            opts.run_id,
            report.status,
            String::from_utf8_lossy(&report.outcome)
        );
        let output = serde_json::from_slice(&report.outcome)
            .with_context(|| format!("run {}: bench agent output", opts.run_id))?;
        Ok((report, output))
    }

    /// Runs `runs` runs of `n` timed steps and returns every step's duration in µs.
    /// Timed steps; `fold` saves each checkpoint in its commit's transaction.
    fn timed_steps_with(
        &self,
        host: &Host,
        runs: usize,
        n: u64,
        fold: bool,
    ) -> anyhow::Result<Vec<f64>> {
        // One untimed run first: statement cache, page cache and WAL are warm for all.
        self.steps(host, n.min(50))?;
        let mut samples = Vec::new();
        for _ in 0..runs {
            samples.extend(self.timed_run(host, n, fold)?);
        }
        Ok(samples)
    }

    /// One run of `n` timed steps: each step's duration in µs.
    fn timed_run(&self, host: &Host, n: u64, fold: bool) -> anyhow::Result<Vec<f64>> {
        let input = json!({ "mode": "steps", "n": n, "timed": true, "fold": fold });
        let (report, output) = self.run(host, input, FaultPlan::default())?;
        ensure!(
            report.counts.executed == n && output.step_ns.len() as u64 == n,
            "a timed run must execute every one of its {n} steps: {:?}",
            report.counts
        );
        Ok(output.step_ns.iter().map(|&ns| ns as f64 / 1e3).collect())
    }

    /// Runs `n` untimed steps on a fresh run.
    fn steps(&self, host: &Host, n: u64) -> anyhow::Result<RunReport> {
        let input = json!({ "mode": "steps", "n": n });
        Ok(self.run(host, input, FaultPlan::default())?.0)
    }
}

/// The bench agent's output (`tests/guests/bench`).
#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct GuestOutput {
    step_ns: Vec<u64>,
    first_step_done_unix_ns: Option<u64>,
    calls_ns: Option<u64>,
}

fn fresh_run_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("bench-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

// ---------------------------------------------------------------------------------------
// The floor

fn floor(bed: &Bed, plan: &Plan, table: &mut Table) -> anyhow::Result<Floors> {
    let db = bed.dir.join("floor.db");
    let mut one_row = [0.0; 2];
    for (i, sync) in [SyncMode::Normal, SyncMode::Full].into_iter().enumerate() {
        let iters = match sync {
            SyncMode::Normal => plan.floor_txs,
            SyncMode::Full => plan.floor_syncs,
        };
        let empty = sqlite_floor(&db, sync, false, plan.floor_txs)?;
        table.row(
            format!("floor: empty `BEGIN IMMEDIATE; COMMIT`, WAL, sync {sync}"),
            "µs",
            empty,
        );
        let written = sqlite_floor(&db, sync, true, iters)?;
        one_row[i] = median(&sorted(written.clone()));
        table.row(
            format!("floor: one-row UPDATE transaction, WAL, sync {sync}"),
            "µs",
            written,
        );
    }
    table.row(
        "floor: 4 KiB pwrite + fdatasync (`File::sync_data`)",
        "µs",
        fdatasync_floor(&bed.dir.join("fdatasync.bin"), plan.floor_syncs)?,
    );
    Ok(Floors {
        normal: one_row[0],
        full: one_row[1],
    })
}

/// Times `iters` transactions on plain rusqlite with prepared statements: the least a
/// `BEGIN IMMEDIATE` transaction costs. With `write`, each updates one row; without, it
/// is empty, and SQLite then writes no WAL frame, so it has nothing to sync either.
fn sqlite_floor(db: &Path, sync: SyncMode, write: bool, iters: usize) -> anyhow::Result<Vec<f64>> {
    let conn = Connection::open(db)?;
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    ensure!(mode.eq_ignore_ascii_case("wal"), "journal mode is {mode}");
    conn.pragma_update(None, "synchronous", sync_pragma(sync))?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS floor (id INTEGER PRIMARY KEY, v INTEGER NOT NULL);
         INSERT OR IGNORE INTO floor (id, v) VALUES (0, 0);",
    )?;
    let mut begin = conn.prepare("BEGIN IMMEDIATE")?;
    let mut update = conn.prepare("UPDATE floor SET v = v + 1 WHERE id = 0")?;
    let mut commit = conn.prepare("COMMIT")?;
    let mut once = || -> rusqlite::Result<Duration> {
        let t = Instant::now();
        begin.execute([])?;
        if write {
            update.execute([])?;
        }
        commit.execute([])?;
        Ok(t.elapsed())
    };
    for _ in 0..iters.min(100) {
        once()?;
    }
    (0..iters)
        .map(|_| Ok(micros(once()?)))
        .collect::<anyhow::Result<_>>()
}

/// Times `iters` overwrites of one 4 KiB block (about one WAL frame) of a preallocated
/// file, each followed by `fdatasync`: the cost of making one small write durable.
/// Overwriting keeps the file's size, so no metadata needs syncing, as in a WAL that is
/// being reused after a checkpoint.
fn fdatasync_floor(path: &Path, iters: usize) -> anyhow::Result<Vec<f64>> {
    const BLOCK: usize = 4096;
    const BLOCKS: u64 = 256;
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(path)?;
    file.write_all_at(&vec![0; BLOCK * BLOCKS as usize], 0)?;
    file.sync_all()?;
    let block = [0x5a_u8; BLOCK];
    let once = |i: usize| -> std::io::Result<Duration> {
        let t = Instant::now();
        file.write_all_at(&block, (i as u64 % BLOCKS) * BLOCK as u64)?;
        file.sync_data()?;
        Ok(t.elapsed())
    };
    for i in 0..iters.min(20) {
        once(i)?;
    }
    (0..iters)
        .map(|i| Ok(micros(once(i)?)))
        .collect::<anyhow::Result<_>>()
}

fn sync_pragma(sync: SyncMode) -> &'static str {
    match sync {
        SyncMode::Normal => "NORMAL",
        SyncMode::Full => "FULL",
    }
}

// ---------------------------------------------------------------------------------------
// Steps and host calls through the real guest

fn durable_steps(bed: &Bed, plan: &Plan, floors: &Floors, table: &mut Table) -> anyhow::Result<()> {
    for (sync, (runs, n), floor) in [
        (SyncMode::Normal, plan.steps_normal, floors.normal),
        (SyncMode::Full, plan.steps_full, floors.full),
    ] {
        let host = bed.host(&bed.dir.join(format!("steps-{sync}.db")), sync)?;
        for (fold, how) in [
            (true, "save folded into commit: 2 tx"),
            (false, "separate save: 3 tx"),
        ] {
            let samples = bed.timed_steps_with(&host, runs, n, fold)?;
            let ratio = median(&sorted(samples.clone())) / floor;
            table.row_with_ratio(
                format!("durable step (claim + commit + save, no-op effect; {how}), sync {sync}"),
                "µs",
                samples,
                format!("{ratio:.1}× one-row tx"),
            );
        }
    }
    Ok(())
}

fn host_calls(bed: &Bed, plan: &Plan, table: &mut Table) -> anyhow::Result<()> {
    let host = bed.host(&bed.dir.join("calls.db"), SyncMode::Normal)?;
    let (runs, n) = plan.calls;
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..=runs {
        let (_, output) = bed.run(
            &host,
            json!({ "mode": "calls", "n": n }),
            FaultPlan::default(),
        )?;
        let ns = output.calls_ns.context("calls mode reports calls_ns")?;
        samples.push(ns as f64 / n as f64);
    }
    // The first run warmed caches up; it is not a sample.
    samples.remove(0);
    table.row(
        format!("host-call round trip (`generation()`, per call, {n} per sample)"),
        "ns",
        samples,
    );
    Ok(())
}

/// What a drop costs the run: a run of `n` steps recycled after every claim (`n`
/// instances) against the same run without recycling (one instance), back to back; the
/// difference divided by the extra instances is one sample. It spans the trap and the
/// drop of the old instance, the counts written for it and the new one, instantiating,
/// the guest decoding its input and loading its checkpoint, and the doomed `run-once`
/// entry that the drop interrupted.
fn resume(bed: &Bed, plan: &Plan, table: &mut Table) -> anyhow::Result<()> {
    let host = bed.host(&bed.dir.join("resume.db"), SyncMode::Normal)?;
    let (pairs, n) = plan.resume;
    let recycle = FaultPlan {
        recycle_every: Some(1),
        ..FaultPlan::default()
    };
    let input = json!({ "mode": "steps", "n": n });
    let timed = |faults: FaultPlan| -> anyhow::Result<(Duration, u64)> {
        let t = Instant::now();
        let (report, _) = bed.run(&host, input.clone(), faults)?;
        Ok((t.elapsed(), report.instances_now))
    };
    timed(recycle.clone())?;
    let mut samples = Vec::with_capacity(pairs);
    for _ in 0..pairs {
        let (plain, one) = timed(FaultPlan::default())?;
        let (recycled, many) = timed(recycle.clone())?;
        ensure!(
            one == 1 && many == n,
            "expected 1 and {n} instances, got {one} and {many}"
        );
        let extra = recycled.as_secs_f64() - plain.as_secs_f64();
        samples.push(extra * 1e6 / (many - one) as f64);
    }
    table.row(
        "resume after recycle (drop → next step running, per drop, sync normal)",
        "µs",
        samples,
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Cold start

fn cold_start(bed: &Bed, plan: &Plan, table: &mut Table) -> anyhow::Result<()> {
    let db = bed.dir.join("cold.db");
    // The store exists before the first start, as it does for any run but a first one.
    drop(SqliteStore::open(&db, SyncMode::Normal)?);
    let cache = bed.dir.join("cache");
    // Fills the cache; not a sample.
    idem_run(&db, Some(&cache))?;
    for (cached, count) in [(true, plan.cold_cached), (false, plan.cold_uncached)] {
        let mut first_step = Vec::with_capacity(count);
        let mut exit = Vec::with_capacity(count);
        for _ in 0..count {
            let (to_step, to_exit) = idem_run(&db, cached.then_some(cache.as_path()))?;
            first_step.push(to_step);
            exit.push(to_exit);
        }
        let how = if cached {
            "--cache-dir, cached"
        } else {
            "--no-cache"
        };
        table.row(
            format!("cold start: `idem run` process start → first step done ({how})"),
            "ms",
            first_step,
        );
        table.row(
            format!("cold start: `idem run` process start → exit ({how})"),
            "ms",
            exit,
        );
    }

    let mut compiles = Vec::with_capacity(plan.compiles);
    for _ in 0..plan.compiles {
        let runtime = Runtime::new(None)?;
        let t = Instant::now();
        let agent = runtime.load(Path::new(BENCH))?;
        compiles.push(millis(t.elapsed()));
        ensure!(!agent.from_cache(), "a runtime without cache compiles");
    }
    table.row("compile: `Runtime::load` without cache", "ms", compiles);
    Ok(())
}

/// Starts `idem run` on a one-step timed run and returns the milliseconds from just
/// before the spawn to the step being done (the guest's wall clock, which is the host's)
/// and to the process's exit.
fn idem_run(db: &Path, cache: Option<&Path>) -> anyhow::Result<(f64, f64)> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_idem"));
    cmd.arg("run")
        .arg(BENCH)
        .arg("--db")
        .arg(db)
        .args(["--run-id", &fresh_run_id(), "--json"])
        .args(["--input", r#"{"mode":"steps","n":1,"timed":true}"#])
        .env_remove("IDEM_LOG");
    match cache {
        Some(dir) => cmd.arg("--cache-dir").arg(dir),
        None => cmd.arg("--no-cache"),
    };
    let spawned_at = SystemTime::now().duration_since(UNIX_EPOCH)?;
    let t = Instant::now();
    let out = cmd.output()?;
    let to_exit = millis(t.elapsed());
    if !out.status.success() {
        bail!(
            "idem run failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let done = doc["output"]["first_step_done_unix_ns"]
        .as_u64()
        .context("the timed bench agent reports first_step_done_unix_ns")?;
    let to_step = (done as f64 - spawned_at.as_nanos() as f64) / 1e6;
    Ok((to_step, to_exit))
}

// ---------------------------------------------------------------------------------------
// Throughput and scaling

/// Steps per second of `runs` runs going at once in one host, one thread each.
fn throughput(bed: &Bed, plan: &Plan, table: &mut Table) -> anyhow::Result<()> {
    for (sync, (reps, n)) in [
        (SyncMode::Normal, plan.throughput_normal),
        (SyncMode::Full, plan.throughput_full),
    ] {
        let host = bed.host(&bed.dir.join(format!("throughput-{sync}.db")), sync)?;
        bed.steps(&host, n)?;
        let mut one_run = None;
        for runs in CONCURRENCY {
            let mut samples = Vec::with_capacity(reps);
            for _ in 0..reps {
                samples.push(concurrent_runs(bed, &host, runs, n)?);
            }
            let med = median(&sorted(samples.clone()));
            let what = match runs {
                1 => format!("throughput: 1 run × {n} steps, sync {sync}"),
                _ => format!("throughput: {runs} concurrent runs × {n} steps, sync {sync}"),
            };
            match one_run {
                None => {
                    one_run = Some(med);
                    table.rate_row(what, samples, None);
                }
                Some(base) => {
                    table.rate_row(what, samples, Some(format!("{:.1}× 1 run", med / base)));
                }
            }
        }
    }
    Ok(())
}

fn concurrent_runs(bed: &Bed, host: &Host, runs: usize, n: u64) -> anyhow::Result<f64> {
    let start = Barrier::new(runs + 1);
    let elapsed = std::thread::scope(|s| -> anyhow::Result<Duration> {
        let threads: Vec<_> = (0..runs)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    bed.steps(host, n)
                })
            })
            .collect();
        start.wait();
        let t = Instant::now();
        for thread in threads {
            let report = thread
                .join()
                .map_err(|_| anyhow::anyhow!("a run thread panicked"))??;
            ensure!(report.counts.executed == n, "{:?}", report.counts);
        }
        Ok(t.elapsed())
    })?;
    Ok((runs as u64 * n) as f64 / elapsed.as_secs_f64())
}

/// The durable step (sync normal) on stores already holding more and more committed
/// results. One store per size, measured in turns (a run on each, then again), so that
/// drift in the machine (other tenants, the disk) falls on every size alike.
fn scaling(bed: &Bed, plan: &Plan, table: &mut Table) -> anyhow::Result<()> {
    let (runs, n) = plan.scale;
    let mut stores = Vec::with_capacity(plan.fills.len());
    for &rows in plan.fills {
        let db = bed.dir.join(format!("scale-{rows}.db"));
        // Creates the schema; the rows are then written under it directly.
        drop(SqliteStore::open(&db, SyncMode::Normal)?);
        let filling = Instant::now();
        prefill(&db, rows)?;
        progress(&format!(
            "  {rows} rows committed in {:.1} s",
            filling.elapsed().as_secs_f64()
        ));
        let host = bed.host(&db, SyncMode::Normal)?;
        bed.steps(&host, n.min(50))?;
        stores.push((rows, host, Vec::new()));
    }
    for _ in 0..runs {
        for (_, host, samples) in &mut stores {
            samples.extend(bed.timed_run(host, n, true)?);
        }
    }
    let mut first = None;
    for (rows, _, samples) in stores {
        let med = median(&sorted(samples.clone()));
        let what = format!("durable step, sync normal, {} committed rows", count(rows));
        match first {
            None => {
                first = Some((med, rows));
                table.row(what, "µs", samples);
            }
            Some((base, base_rows)) => table.row_with_ratio(
                what,
                "µs",
                samples,
                format!("{:.2}× {} rows", med / base, count(base_rows)),
            ),
        }
    }
    Ok(())
}

/// Tops the `results` table up to `target` rows in one transaction, with keys shaped like
/// the SDK's (`{run}/{step}/{32 hex}`) spread over a thousand runs, inserted in random
/// key order as real runs would. This writes idem's schema directly (see
/// `host/src/store/migrations/sqlite/`): committing a million keys through the `Store`
/// API would take minutes, and the point is only the size of the table.
fn prefill(db: &Path, target: u64) -> anyhow::Result<()> {
    let mut conn = Connection::open(db)?;
    conn.pragma_update(None, "synchronous", "OFF")?;
    // 256 MiB of page cache, so that a million random inserts do not thrash.
    conn.pragma_update(None, "cache_size", -262_144)?;
    let target = i64::try_from(target)?;
    let have: i64 = conn.query_row("SELECT count(*) FROM steps", [], |r| r.get(0))?;
    if have < target {
        let tx = conn.transaction()?;
        tx.execute(
            "WITH RECURSIVE n(i) AS (SELECT ?1 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?2)
             INSERT INTO steps
                 (key, run_id, token, attempt, lease_expires, result, committed_at)
             SELECT 'fill-' || (i % 1000) || '/s/' || lower(hex(randomblob(16))),
                    'fill-' || (i % 1000), 1, 1, 0, CAST('null' AS BLOB), 0
             FROM n",
            params![have, target],
        )?;
        tx.commit()?;
    }
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Statistics and the table

#[derive(Default)]
struct Table {
    rows: Vec<Row>,
}

struct Row {
    what: String,
    unit: &'static str,
    sorted: Vec<f64>,
    /// For rates, the tail worth showing is the slow one: the 1st percentile.
    higher_is_better: bool,
    ratio: Option<String>,
}

impl Table {
    fn row(&mut self, what: impl Into<String>, unit: &'static str, samples: Vec<f64>) {
        self.push(what.into(), unit, samples, false, None);
    }

    fn row_with_ratio(&mut self, what: String, unit: &'static str, samples: Vec<f64>, r: String) {
        self.push(what, unit, samples, false, Some(r));
    }

    fn rate_row(&mut self, what: String, samples: Vec<f64>, ratio: Option<String>) {
        self.push(what, "steps/s", samples, true, ratio);
    }

    fn push(
        &mut self,
        what: String,
        unit: &'static str,
        samples: Vec<f64>,
        higher_is_better: bool,
        ratio: Option<String>,
    ) {
        let row = Row {
            what,
            unit,
            sorted: sorted(samples),
            higher_is_better,
            ratio,
        };
        progress(&format!(
            "  {}: median {} {}",
            row.what,
            fmt(median(&row.sorted)),
            row.unit
        ));
        self.rows.push(row);
    }

    fn print(&self) {
        println!("| what | unit | median | p99 | n | ratio |");
        println!("|---|---|--:|--:|--:|---|");
        for row in &self.rows {
            let tail = if row.higher_is_better { 0.01 } else { 0.99 };
            println!(
                "| {} | {} | {} | {} | {} | {} |",
                row.what,
                row.unit,
                fmt(median(&row.sorted)),
                fmt(percentile(&row.sorted, tail)),
                row.sorted.len(),
                row.ratio.as_deref().unwrap_or("")
            );
        }
        println!();
        println!(
            "p99 is the nearest-rank 99th percentile (for steps/s, the 1st: the slow tail); \
             with fewer than 100 samples it is the worst one."
        );
    }
}

fn sorted(mut samples: Vec<f64>) -> Vec<f64> {
    samples.sort_by(f64::total_cmp);
    samples
}

fn median(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// Nearest-rank percentile: the smallest sample with at least `p` of them at or below.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn fmt(v: f64) -> String {
    match v.abs() {
        a if a >= 1000.0 => format!("{v:.0}"),
        a if a >= 100.0 => format!("{v:.1}"),
        _ => format!("{v:.2}"),
    }
}

fn count(rows: u64) -> String {
    match rows {
        r if r >= 1_000_000 && r % 1_000_000 == 0 => format!("{} M", r / 1_000_000),
        r if r >= 1_000 && r % 1_000 == 0 => format!("{} k", r / 1_000),
        r => r.to_string(),
    }
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Progress goes to stderr, so that stdout is the report alone.
fn progress(message: &str) {
    eprintln!("{message}");
}

// ---------------------------------------------------------------------------------------
// The machine

fn print_machine(dir: &Path, quick: bool) -> anyhow::Result<()> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown", |(_, model)| model.trim());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let (fs, device) = filesystem(dir)?;
    println!("# idem bench{}", if quick { " (--quick)" } else { "" });
    println!();
    println!("- commit: {}", git_commit());
    println!("- CPU: {cpu}, {cores} cores available");
    println!("- store files: {} ({fs} on {device})", dir.display());
    if matches!(fs.as_str(), "tmpfs" | "ramfs") {
        println!("- WARNING: {fs} does not sync to a disk; the fsync rows mean nothing here");
    }
    println!();
    Ok(())
}

/// The type and device of the mount holding `dir`: the longest mount point that is a
/// prefix of its canonical path.
fn filesystem(dir: &Path) -> anyhow::Result<(String, String)> {
    let dir = dir.canonicalize()?;
    let mounts = std::fs::read_to_string("/proc/mounts")?;
    let best = mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (device, point, fs) = (fields.next()?, fields.next()?, fields.next()?);
            dir.starts_with(point).then_some((point.len(), fs, device))
        })
        .max_by_key(|(len, _, _)| *len);
    Ok(
        best.map_or(("unknown".into(), "unknown".into()), |(_, fs, dev)| {
            (fs.to_string(), dev.to_string())
        }),
    )
}

/// `git rev-parse HEAD` of the checkout the bench was built from, with `+dirty` when
/// tracked files differ from it.
fn git_commit() -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "HEAD"]) {
        Some(commit) => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            format!("{commit}{}", if dirty { "+dirty" } else { "" })
        }
        None => "unknown (no git)".to_string(),
    }
}
