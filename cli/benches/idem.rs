//! The idem benchmark: one run measures what a durable step costs, the floor under it,
//! and how it scales, and prints one markdown table (`cargo bench -p idem-host --bench
//! idem`, `-- --quick` for a short check that it works; name sections to run only
//! those: `-- steps calls resume cold throughput scaling workers sleepers prove
//! takeover python parallel children llm schedules postgres peers flow rates sealing values
//! rehearse`).
//!
//! Everything goes through idem's public API and the real `idem` binary, on a temp dir
//! under cargo's target dir: a real disk, so that an fsync costs what it costs there.
//! BENCHMARKS.md says how each row is measured and reads the numbers.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail, ensure};
use idem::runtime::{Authority, FaultPlan, Host, LoadedAgent, RunOptions, RunReport, Runtime};
use idem::store::{OpenOptions as StoreOptions, RunStatus, SqliteStore, Store, SyncMode};
use idem_test_artifacts::BENCH;
use idem_test_artifacts::power_loss::PowerLossVfs;
use rusqlite::{Connection, params};
use serde_json::json;

// The report lives in a folder of its own: a file next to this one would be taken by
// cargo for another bench target.
#[path = "idem/children.rs"]
mod children;
#[path = "idem/flow.rs"]
mod flow;
#[path = "idem/llm.rs"]
mod llm;
#[path = "idem/parallel.rs"]
mod parallel;
#[path = "idem/peers.rs"]
mod peers;
#[path = "idem/postgres.rs"]
mod postgres;
#[path = "idem/prove.rs"]
mod prove;
#[path = "idem/python.rs"]
mod python;
#[path = "idem/rates.rs"]
mod rates;
#[path = "idem/rehearse.rs"]
mod rehearse;
#[path = "idem/report.rs"]
mod report;
#[path = "idem/schedules.rs"]
mod schedules;
#[path = "idem/sealing.rs"]
mod sealing;
#[path = "idem/service.rs"]
mod service;
#[path = "idem/sleepers.rs"]
mod sleepers;
#[path = "idem/store_step.rs"]
mod store_step;
#[path = "idem/takeover.rs"]
mod takeover;
#[path = "idem/values.rs"]
mod values;

use report::{Table, count, median, micros, millis, print_machine, progress, sorted};
use store_step::StoreStep;

/// How long each thing is measured: turns of work, each adding samples, until `max`
/// turns or until `budget` is spent (after at least [`MIN_TURNS`]). The budgets keep the
/// bench within minutes when a neighbour makes fsync a hundred times slower; the table's
/// `n` shows what each row got.
#[derive(Clone, Copy)]
struct Turns {
    max: usize,
    /// Steps or calls per run, where a turn runs the agent.
    n: u64,
    budget: Duration,
}

const MIN_TURNS: usize = 3;

/// Everything a bench run measures, and how long. `--quick` shrinks it all to check that
/// the bench works.
struct Plan {
    /// Empty transactions per sync mode (a few µs each: no budget needed).
    empty_txs: usize,
    /// Per turn: `n` one-row transactions (and, sync full, `n` fdatasyncs) on the floor
    /// database, then a run of `n` timed steps with the checkpoint folded into the
    /// commit and one with a separate save: floor and steps sampled side by side.
    steps_normal: Turns,
    steps_full: Turns,
    /// Per turn: a run of `n` host calls.
    calls: Turns,
    /// Per turn: a run of `n` steps, then the same recycled at every claim.
    resume: Turns,
    /// Per turn: one `idem run` process (with and without the cache), one compile.
    cold_cached: Turns,
    cold_uncached: Turns,
    compiles: Turns,
    /// Per turn: 1, 8 and 64 concurrent runs of `n` steps each.
    throughput_normal: Turns,
    throughput_full: Turns,
    /// Committed rows in the scaling stores; per turn, a run of `n` timed steps on each.
    fills: &'static [u64],
    scale: Turns,
    /// The worker rows.
    service: service::ServicePlan,
    /// The sleepers rows.
    sleepers: sleepers::SleepersPlan,
    /// Per turn: one `idem prove` of the ledger over 5 phases × 10 steps.
    prove: Turns,
    /// Per turn: `idem run` killed inside a side effect, then taken over.
    takeover: Turns,
    /// Per turn: a cached `idem run` of the Rust and the Python `steps` agent.
    py_cold: Turns,
    /// Per turn, for each twin: runs of 1 and `n` steps, and of `n` steps recycled.
    py_steps: Turns,
    /// Per turn: a run of one 200 ms HTTP effect and a run of five in parallel.
    parallel: Turns,
    /// The child-run rows: turns of a fan-out of `n` children on SQLite and on
    /// PostgreSQL.
    children: Turns,
    /// Children a waiting parent holds, for its memory against a parent of 10.
    children_waiting: usize,
    /// Per turn: a run of `n` model calls and a run of `n` HTTP steps.
    llm: Turns,
    /// The PostgreSQL rows: per turn, a run of `n` timed steps per sync mode, and 1, 8
    /// and 64 concurrent runs of `n / 2` steps; `4 n` floor samples.
    postgres: Turns,
    /// The peers rows.
    peers: peers::PeersPlan,
    /// Schedules ticking at once in the schedules rows.
    schedules: usize,
    /// The flow-control rows: turns of 20 polls of each setup, over `n` queued runs.
    flow: Turns,
    /// The rate-limit rows: per turn, a run of `n` timed steps with no rate class and
    /// one of `n` whose class has tokens to spare.
    rates: Turns,
    /// Per turn: a run of `n` timed steps on a store in clear, then on a sealed one.
    sealing: Turns,
    /// Runs per result size (each size runs its own number of steps).
    values: Turns,
    /// In-flight runs rehearsed on a new version in one call.
    rehearse: usize,
}

const fn turns(max: usize, n: u64, budget_secs: u64) -> Turns {
    Turns {
        max,
        n,
        budget: Duration::from_secs(budget_secs),
    }
}

const FULL_PLAN: Plan = Plan {
    empty_txs: 20_000,
    steps_normal: turns(40, 500, 20),
    steps_full: turns(40, 200, 30),
    calls: turns(100, 200_000, 10),
    resume: turns(300, 50, 20),
    cold_cached: turns(200, 1, 15),
    cold_uncached: turns(30, 1, 15),
    compiles: turns(30, 0, 10),
    throughput_normal: turns(10, 300, 30),
    throughput_full: turns(10, 100, 45),
    fills: &[10_000, 100_000, 1_000_000],
    scale: turns(20, 300, 30),
    service: service::ServicePlan {
        waiting: 1_000,
        wait: Duration::from_secs(2),
        waiting_turns: 3,
        waiting_many: 10_000,
        short_runs: 1_000,
        short_turns: 5,
        takeover_runs: 20,
    },
    sleepers: sleepers::SleepersPlan {
        sleepers: 10_000,
        samples: 100,
    },
    prove: turns(5, 0, 60),
    takeover: turns(10, 1, 30),
    py_cold: turns(40, 1, 20),
    py_steps: turns(10, 50, 30),
    parallel: turns(10, 0, 10),
    children: turns(3, 1000, 0),
    children_waiting: 10_000,
    llm: turns(20, 20, 10),
    postgres: turns(10, 200, 20),
    peers: peers::PeersPlan {
        n: 1_000,
        kill_at: 620,
        short: 200,
        turns: 3,
        crash_turns: 1,
        quick: false,
    },
    schedules: 1_000,
    flow: turns(30, 2_000, 10),
    rates: turns(20, 500, 40),
    sealing: turns(20, 500, 40),
    values: turns(5, 0, 60),
    rehearse: 1_000,
};

const QUICK_PLAN: Plan = Plan {
    empty_txs: 1_000,
    steps_normal: turns(3, 100, 1),
    steps_full: turns(3, 30, 2),
    calls: turns(3, 20_000, 1),
    resume: turns(5, 20, 1),
    cold_cached: turns(4, 1, 1),
    cold_uncached: turns(2, 1, 1),
    compiles: turns(2, 0, 1),
    throughput_normal: turns(1, 50, 1),
    throughput_full: turns(1, 10, 1),
    fills: &[1_000, 10_000],
    scale: turns(2, 100, 1),
    service: service::ServicePlan {
        waiting: 50,
        wait: Duration::from_millis(500),
        waiting_turns: 1,
        waiting_many: 200,
        short_runs: 50,
        short_turns: 1,
        takeover_runs: 4,
    },
    sleepers: sleepers::SleepersPlan {
        sleepers: 200,
        samples: 10,
    },
    prove: turns(1, 0, 1),
    takeover: turns(2, 1, 1),
    py_cold: turns(3, 1, 1),
    py_steps: turns(3, 10, 1),
    parallel: turns(3, 0, 1),
    children: turns(1, 50, 0),
    children_waiting: 100,
    llm: turns(3, 5, 1),
    postgres: turns(1, 20, 1),
    peers: peers::PeersPlan {
        n: 100,
        kill_at: 62,
        short: 20,
        turns: 1,
        crash_turns: 1,
        quick: true,
    },
    schedules: 100,
    flow: turns(3, 200, 1),
    rates: turns(3, 50, 1),
    sealing: turns(3, 50, 1),
    values: turns(1, 0, 1),
    rehearse: 20,
};

/// A part of the bench: its name on the command line, its heading, and what it runs.
type Section = (
    &'static str,
    &'static str,
    fn(&Bed, &Plan, &mut Table) -> anyhow::Result<()>,
);

/// Every section, in the order of the table.
const SECTIONS: [Section; 23] = [
    ("steps", "floor and durable steps", floor_and_steps),
    ("calls", "host-call round trip", host_calls),
    ("resume", "resume after recycle", resume),
    (
        "cold",
        "cold start (the idem binary) and compile",
        cold_start,
    ),
    ("throughput", "throughput", throughput),
    ("scaling", "scaling with committed rows", scaling),
    ("workers", "the service: workers", service::service),
    (
        "short",
        "short runs through one worker",
        service::short_runs,
    ),
    (
        "sleepers",
        "durable sleeps: wake-ups and memory",
        sleepers::sleepers,
    ),
    ("prove", "idem prove", prove::prove),
    (
        "takeover",
        "a dead process's run taken over",
        takeover::takeover,
    ),
    (
        "python",
        "a Python agent beside its Rust twin",
        python::python,
    ),
    (
        "parallel",
        "parallel effects in one step",
        parallel::parallel,
    ),
    (
        "children",
        "child runs: fan-out and join",
        children::children,
    ),
    ("llm", "model calls as steps", llm::llm),
    (
        "schedules",
        "schedules: tick to start",
        schedules::schedules,
    ),
    ("postgres", "PostgreSQL", postgres::postgres),
    (
        "flow",
        "flow control: the lease query under limits",
        flow::flow,
    ),
    ("rates", "rate limits: the price of a token", rates::rates),
    (
        "sealing",
        "encryption at rest: the price of a sealed step",
        sealing::sealing,
    ),
    (
        "values",
        "large values: results kept by digest",
        values::values,
    ),
    (
        "rehearse",
        "upgrades rehearsed against the runs in flight",
        rehearse::rehearse,
    ),
    (
        "peers",
        "peers side by side: the seed's reference, DBOS, LangGraph",
        peers::peers,
    ),
];

/// Concurrent runs in one host for the throughput rows.
const CONCURRENCY: [usize; 3] = [1, 8, 64];

fn main() -> anyhow::Result<()> {
    let names: Vec<_> = SECTIONS.iter().map(|s| s.0).collect();
    let usage = format!(
        "usage: cargo bench -p idem-cli --bench idem -- [--quick] [SECTION...]; sections: {}",
        names.join(", ")
    );
    // Sections to run, by name (`cargo bench --bench idem -- steps resume`): all when
    // none is named. Checked before anything is set up, so that a typo costs nothing.
    // cargo itself passes `--bench`.
    let (mut quick, mut only) = (false, Vec::new());
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--quick" => quick = true,
            "--bench" => {}
            "--help" | "-h" => {
                println!("{usage}");
                return Ok(());
            }
            flag if flag.starts_with('-') => bail!("unknown option {flag:?}; {usage}"),
            name if names.contains(&name) => only.push(arg),
            name => bail!("no bench section {name:?}; {usage}"),
        }
    }
    let plan = if quick { &QUICK_PLAN } else { &FULL_PLAN };
    let began = Instant::now();

    // CARGO_TARGET_TMPDIR is under the target dir, so on the repo's disk: /tmp may be a
    // tmpfs, where fsync costs nothing and the floor would be a fiction.
    let dir = tempfile::Builder::new()
        .prefix("idem-bench-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))?;
    print_machine(dir.path(), quick)?;

    let runtime = Arc::new(Runtime::new(None)?);
    let agent = Arc::new(runtime.load(Path::new(BENCH))?);
    let bed = Bed {
        dir: dir.path().to_path_buf(),
        runtime,
        agent,
        tokio: tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?,
    };
    let mut table = Table::default();

    for (name, what, section) in SECTIONS {
        if only.is_empty() || only.iter().any(|o| o == name) {
            progress(what);
            section(&bed, plan, &mut table)?;
        }
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

/// Runs `turn` until `plan.max` turns or, after at least [`MIN_TURNS`], until
/// `plan.budget` is spent.
fn repeat(plan: Turns, mut turn: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<()> {
    let began = Instant::now();
    for i in 0..plan.max {
        if i >= MIN_TURNS && began.elapsed() >= plan.budget {
            break;
        }
        turn()?;
    }
    Ok(())
}

/// What every measurement shares: the temp dir, the engine, the compiled bench agent,
/// the async runtime runs are driven on.
struct Bed {
    dir: PathBuf,
    runtime: Arc<Runtime>,
    agent: Arc<LoadedAgent>,
    tokio: tokio::runtime::Runtime,
}

/// A host and the durability its runs ask for.
struct BenchHost {
    host: Arc<Host>,
    sync: SyncMode,
    /// Its store, where it is SQLite: how long its connection was held.
    sqlite: Option<Arc<SqliteStore>>,
}

impl Bed {
    fn host(&self, db: &Path, sync: SyncMode) -> anyhow::Result<BenchHost> {
        let store = Arc::new(SqliteStore::open_with(db, &StoreOptions::default())?);
        let _inside = self.tokio.enter();
        Ok(BenchHost {
            host: Arc::new(Host::new(
                Arc::clone(&self.runtime),
                Arc::clone(&store) as Arc<dyn Store>,
            )?),
            sync,
            sqlite: Some(store),
        })
    }

    /// Runs the bench agent to completion on a fresh run id and returns its report and
    /// its decoded output.
    fn run(
        &self,
        host: &BenchHost,
        input: serde_json::Value,
        faults: FaultPlan,
    ) -> anyhow::Result<(RunReport, GuestOutput)> {
        let opts = options(host.sync, &input, faults)?;
        let report = self.tokio.block_on(host.host.run(&self.agent, &opts))?;
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

    /// One run of `n` timed steps: each step's duration in µs. `fold` saves each
    /// checkpoint in its commit's transaction; otherwise a separate `save` follows.
    fn timed_run(&self, host: &BenchHost, n: u64, fold: bool) -> anyhow::Result<Vec<f64>> {
        let input = json!({ "mode": "steps", "n": n, "timed": true, "fold": fold });
        let (report, output) = self.run(host, input, FaultPlan::default())?;
        ensure!(
            report.counts.executed == n && output.step_ns.len() as u64 == n,
            "a timed run must execute every one of its {n} steps: {:?}",
            report.counts
        );
        Ok(output.step_ns.iter().map(|&ns| ns as f64 / 1e3).collect())
    }

    /// Runs `n` untimed steps (checkpoint folded into the commit) on a fresh run.
    fn steps(&self, host: &BenchHost, n: u64) -> anyhow::Result<RunReport> {
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

/// A fresh run of the bench agent with this input and durability.
fn options(
    sync: SyncMode,
    input: &serde_json::Value,
    faults: FaultPlan,
) -> anyhow::Result<RunOptions> {
    Ok(RunOptions {
        run_id: fresh_run_id(),
        input: serde_json::to_vec(input)?,
        authority: Authority {
            sync,
            ..Authority::default()
        },
        faults,
        ..RunOptions::default()
    })
}

fn fresh_run_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("bench-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

// ---------------------------------------------------------------------------------------
// The floor and the durable step

/// The floor rows and the durable step, per sync mode. The one-row transactions (and
/// the fdatasyncs) are sampled in the same turns as the steps, so that the ratio of the
/// two compares like with like even when the disk's speed drifts.
fn floor_and_steps(bed: &Bed, plan: &Plan, table: &mut Table) -> anyhow::Result<()> {
    let mut floors = Vec::new();
    let mut steps = Vec::new();
    let (mut fdatasync, mut fdatasync_4) = (Vec::new(), Vec::new());
    for (sync, turns) in [
        (SyncMode::Normal, plan.steps_normal),
        (SyncMode::Full, plan.steps_full),
    ] {
        let floor = SqliteFloor::open(&bed.dir.join(format!("floor-{sync}.db")), sync)?;
        let mut textbook = Textbook::open(&bed.dir.join(format!("textbook-{sync}.db")), sync)?;
        let mut bare = BareProtocol::open(&bed.dir.join(format!("bare-{sync}.db")), sync)?;
        let mut sync_files = (sync == SyncMode::Full)
            .then(|| -> anyhow::Result<_> {
                Ok((
                    SyncFloor::create(&bed.dir.join("fdatasync.bin"), 1)?,
                    SyncFloor::create(&bed.dir.join("fdatasync-4.bin"), 4)?,
                ))
            })
            .transpose()?;
        let host = bed.host(&bed.dir.join(format!("steps-{sync}.db")), sync)?;
        let mut store_alone = bed.tokio.block_on(StoreStep::open(
            &bed.dir.join(format!("store-step-{sync}.db")),
            sync,
        ))?;
        let empty = floor.batch(false, plan.empty_txs)?;
        // Warm-ups: statement caches, page cache, WAL.
        floor.batch(true, 100)?;
        textbook.steps(100)?;
        bare.steps(100)?;
        bed.tokio.block_on(store_alone.steps(100))?;
        bed.steps(&host, turns.n.min(50))?;
        let (mut one_row, mut folded, mut separate) = (Vec::new(), Vec::new(), Vec::new());
        let (mut reference, mut protocol, mut store) = (Vec::new(), Vec::new(), Vec::new());
        repeat(turns, || {
            one_row.extend(floor.batch(true, turns.n as usize)?);
            reference.extend(textbook.steps(turns.n as usize)?);
            protocol.extend(bare.steps(turns.n as usize)?);
            store.extend(bed.tokio.block_on(store_alone.steps(turns.n as usize))?);
            if let Some((one, four)) = &mut sync_files {
                fdatasync.extend(one.batch(turns.n as usize)?);
                fdatasync_4.extend(four.batch(turns.n as usize)?);
            }
            folded.extend(bed.timed_run(&host, turns.n, true)?);
            separate.extend(bed.timed_run(&host, turns.n, false)?);
            Ok(())
        })?;
        floors.push((sync, empty, one_row, reference, protocol));
        steps.push((sync, folded, separate, store));
    }
    let mut floor_medians = Vec::new();
    for (sync, empty, one_row, reference, protocol) in floors {
        table.row(
            format!("floor: empty `BEGIN IMMEDIATE; COMMIT`, WAL, sync {sync}"),
            "µs",
            empty,
        );
        let floor = median(&sorted(one_row.clone()));
        table.row(
            format!("floor: one-row UPDATE transaction, WAL, sync {sync}"),
            "µs",
            one_row,
        );
        let textbook = median(&sorted(reference.clone()));
        table.row_with_ratio(
            format!(
                "reference: textbook step on rusqlite (claim; result + claim delete; \
                 progress upsert: 3 tx, no wasm), sync {sync}"
            ),
            "µs",
            reference,
            format!("{:.1}× one-row tx", textbook / floor),
        );
        let bare = median(&sorted(protocol.clone()));
        table.row_with_ratio(
            format!(
                "reference: idem's protocol bare on rusqlite (claim tx, unsynced; result + \
                 checkpoint tx, synced under full: 2 tx, no fence, no wasm), sync {sync}"
            ),
            "µs",
            protocol,
            format!("{:.2}× one-row tx", bare / floor),
        );
        floor_medians.push((floor, textbook, bare));
    }
    let sync_one = median(&sorted(fdatasync.clone()));
    table.row(
        "floor: 4 KiB pwrite + fdatasync (`File::sync_data`)",
        "µs",
        fdatasync,
    );
    let sync_four = median(&sorted(fdatasync_4.clone()));
    table.row_with_ratio(
        "floor: 16 KiB pwrite + fdatasync (a step's ~3.6 WAL frames, synced once)".to_owned(),
        "µs",
        fdatasync_4,
        format!("{:.2}× the 4 KiB one", sync_four / sync_one),
    );
    for ((sync, folded, separate, store), (floor, textbook, bare)) in
        steps.into_iter().zip(floor_medians)
    {
        let folded_step = median(&sorted(folded.clone()));
        for (samples, how) in [
            (folded, "save folded into commit: 2 tx"),
            (separate, "separate save: 3 tx"),
        ] {
            let step = median(&sorted(samples.clone()));
            // Under `full`, the step's one sync covers its ~3.6 frames: the 16 KiB
            // floor bounds it from below.
            let synced = match sync {
                SyncMode::Full => format!(", {:.2}× the 16 KiB sync", step / sync_four),
                SyncMode::Normal => String::new(),
            };
            table.row_with_ratio(
                format!("durable step (claim + commit + save, no-op effect; {how}), sync {sync}"),
                "µs",
                samples,
                format!(
                    "{:.2}× one-row tx, {:.2}× textbook{synced}",
                    step / floor,
                    step / textbook
                ),
            );
        }
        let alone = median(&sorted(store.clone()));
        table.row_with_ratio(
            format!(
                "store alone: claim + commit with checkpoint straight on `SqliteStore` \
                 (2 tx, no wasm, no host), sync {sync}"
            ),
            "µs",
            store,
            format!(
                "{:.2}× one-row tx, {:.2}× the bare protocol, {:.2}× the folded durable step",
                alone / floor,
                alone / bare,
                alone / folded_step
            ),
        );
    }
    frames_per_step(bed, plan, table)
}

/// WAL frames (pages) an executed durable step writes, per sync mode, counted by the
/// test-only VFS (`idem_test_artifacts::power_loss`) under runs of the bench agent with
/// folded saves. A sample is the difference between a run of `2n` steps and one of `n`,
/// divided by `n`: what a step adds, without what a run writes around its steps (its
/// submission, lease, instance and end), which the ratio column quotes per run with
/// the syncs and writes per step (the same difference; a write per frame: the store
/// joins each frame's header to its page) and how the transactions of every run
/// split by frames (frames × transactions). A claim writes its key's `steps` row; a
/// commit the same row and the run's checkpoint, and the run's counts when they are due
/// (at most every 250 ms); an insert that splits a leaf writes its neighbours and parent.
fn frames_per_step(bed: &Bed, plan: &Plan, table: &mut Table) -> anyhow::Result<()> {
    for (sync, turns) in [
        (SyncMode::Normal, plan.steps_normal),
        (SyncMode::Full, plan.steps_full),
    ] {
        let vfs = PowerLossVfs::counting();
        let options = StoreOptions {
            vfs: Some(vfs.name().to_owned()),
            ..StoreOptions::default()
        };
        let store = SqliteStore::open_with(&bed.dir.join(format!("frames-{sync}.db")), &options)?;
        let host = {
            let _inside = bed.tokio.enter();
            BenchHost {
                host: Arc::new(Host::new(Arc::clone(&bed.runtime), Arc::new(store))?),
                sync,
                sqlite: None,
            }
        };
        // Warm-up: the component and the first run's rows.
        bed.steps(&host, 10)?;
        let n = turns.n;
        let mut by_size = Vec::<u64>::new();
        let mut run = |steps: u64| -> anyhow::Result<(f64, f64, f64)> {
            vfs.take_counts();
            bed.steps(&host, steps)?;
            let counts = vfs.take_counts();
            for frames in counts.transactions {
                let frames = frames as usize;
                if by_size.len() <= frames {
                    by_size.resize(frames + 1, 0);
                }
                by_size[frames] += 1;
            }
            Ok((
                counts.wal_frames as f64,
                counts.syncs as f64,
                counts.writes as f64,
            ))
        };
        let (mut samples, mut around, mut syncs, mut writes) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..MIN_TURNS {
            let (frames_n, syncs_n, writes_n) = run(n)?;
            let (frames_2n, syncs_2n, writes_2n) = run(2 * n)?;
            let per_step = (frames_2n - frames_n) / n as f64;
            samples.push(per_step);
            around.push(frames_n - per_step * n as f64);
            syncs.push((syncs_2n - syncs_n) / n as f64);
            writes.push((writes_2n - writes_n) / n as f64);
        }
        let split: Vec<String> = by_size
            .iter()
            .enumerate()
            .filter(|&(_, &txs)| txs > 0)
            .map(|(frames, txs)| format!("{frames}×{txs}"))
            .collect();
        table.row_with_ratio(
            format!(
                "WAL frames per executed step (claim + commit with folded save; runs of \
                 {} and {n} steps, the difference over {n}), sync {sync}",
                2 * n
            ),
            "frames",
            samples,
            format!(
                "{:.0} frames per run beside its steps; {:.2} syncs/step; {:.2} writes/step; \
                 tx by frames: {}",
                median(&sorted(around)),
                median(&sorted(syncs)),
                median(&sorted(writes)),
                split.join(", "),
            ),
        );
    }
    Ok(())
}

/// Plain rusqlite on its own WAL database with prepared statements: the least a
/// `BEGIN IMMEDIATE` transaction costs.
struct SqliteFloor {
    conn: Connection,
}

impl SqliteFloor {
    fn open(db: &Path, sync: SyncMode) -> anyhow::Result<SqliteFloor> {
        let conn = Connection::open(db)?;
        let mode: String =
            conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
        ensure!(mode.eq_ignore_ascii_case("wal"), "journal mode is {mode}");
        let synchronous = match sync {
            SyncMode::Normal => "NORMAL",
            SyncMode::Full => "FULL",
        };
        conn.pragma_update(None, "synchronous", synchronous)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS floor (id INTEGER PRIMARY KEY, v INTEGER NOT NULL);
             INSERT OR IGNORE INTO floor (id, v) VALUES (0, 0);",
        )?;
        Ok(SqliteFloor { conn })
    }

    /// Times `n` transactions, in µs. With `write`, each updates one row; without, it
    /// is empty, and SQLite then writes no WAL frame, so it has nothing to sync either.
    fn batch(&self, write: bool, n: usize) -> anyhow::Result<Vec<f64>> {
        let mut begin = self.conn.prepare_cached("BEGIN IMMEDIATE")?;
        let mut update = self
            .conn
            .prepare_cached("UPDATE floor SET v = v + 1 WHERE id = 0")?;
        let mut commit = self.conn.prepare_cached("COMMIT")?;
        let mut samples = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            begin.execute([])?;
            if write {
                update.execute([])?;
            }
            commit.execute([])?;
            samples.push(micros(t.elapsed()));
        }
        Ok(samples)
    }
}

/// A reference design's database: the floor's connection (WAL, `sync`) with `schema`.
fn reference_db(db: &Path, sync: SyncMode, schema: &str) -> anyhow::Result<Connection> {
    let floor = SqliteFloor::open(db, sync)?;
    floor.conn.execute_batch(schema)?;
    Ok(floor.conn)
}

/// The textbook durable step, straight on rusqlite, as a reference for idem's: claim
/// the key (one transaction), write the result and delete the claim (a second), upsert
/// the run's progress (a third); prepared statements, WAL, no wasm.
struct Textbook {
    conn: Connection,
    next: i64,
}

impl Textbook {
    fn open(db: &Path, sync: SyncMode) -> anyhow::Result<Textbook> {
        let conn = reference_db(
            db,
            sync,
            "CREATE TABLE IF NOT EXISTS claims (key TEXT PRIMARY KEY, holder TEXT NOT NULL,
                                                token INTEGER NOT NULL) WITHOUT ROWID;
             CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, value BLOB NOT NULL)
                 WITHOUT ROWID;
             CREATE TABLE IF NOT EXISTS progress (run TEXT PRIMARY KEY, step INTEGER NOT NULL,
                                                  state BLOB NOT NULL) WITHOUT ROWID;",
        )?;
        Ok(Textbook { conn, next: 0 })
    }

    /// Times `n` steps on fresh keys, in µs.
    fn steps(&mut self, n: usize) -> anyhow::Result<Vec<f64>> {
        let conn = &self.conn;
        let mut begin = conn.prepare_cached("BEGIN IMMEDIATE")?;
        let mut commit = conn.prepare_cached("COMMIT")?;
        let mut claim = conn.prepare_cached(
            "INSERT INTO claims (key, holder, token) VALUES (?1, 'holder-0123456789abcdef', 1)",
        )?;
        let mut result = conn.prepare_cached("INSERT INTO results (key, value) VALUES (?1, ?2)")?;
        let mut unclaim = conn.prepare_cached("DELETE FROM claims WHERE key = ?1")?;
        let mut save = conn.prepare_cached(
            "INSERT INTO progress (run, step, state) VALUES ('run-1', ?1, ?2)
             ON CONFLICT (run) DO UPDATE SET step = excluded.step, state = excluded.state",
        )?;
        let mut samples = Vec::with_capacity(n);
        for _ in 0..n {
            self.next += 1;
            let key = format!("textbook/run-1/step/{:016x}", self.next);
            let t = Instant::now();
            begin.execute([])?;
            claim.execute([&key])?;
            commit.execute([])?;
            begin.execute([])?;
            result.execute(params![key, b"\"ok\"".as_slice()])?;
            unclaim.execute([&key])?;
            commit.execute([])?;
            begin.execute([])?;
            save.execute(params![self.next, b"null".as_slice()])?;
            commit.execute([])?;
            samples.push(micros(t.elapsed()));
        }
        Ok(samples)
    }
}

/// idem's step protocol with nothing else, straight on rusqlite: the claim inserts the
/// key's row in a transaction of its own that is not synced (a `Retry` claim: durable
/// with its commit), then the commit fills the result in and upserts the run's
/// checkpoint in a second, synced under `full`. No fence, no token floor, no counts, no
/// wasm: what any store keeping a step's claim apart from its commit pays at least.
struct BareProtocol {
    conn: Connection,
    sync: SyncMode,
    next: i64,
}

impl BareProtocol {
    fn open(db: &Path, sync: SyncMode) -> anyhow::Result<BareProtocol> {
        let conn = reference_db(
            db,
            sync,
            "CREATE TABLE IF NOT EXISTS steps (key TEXT PRIMARY KEY, holder TEXT,
                                               token INTEGER NOT NULL, result BLOB)
                 WITHOUT ROWID;
             CREATE TABLE IF NOT EXISTS checkpoints (run TEXT PRIMARY KEY,
                                                     step INTEGER NOT NULL,
                                                     state BLOB NOT NULL) WITHOUT ROWID;",
        )?;
        Ok(BareProtocol {
            conn,
            sync,
            next: 0,
        })
    }

    /// Times `n` steps on fresh keys, in µs, keyed as the store keys the bench agent's.
    fn steps(&mut self, n: usize) -> anyhow::Result<Vec<f64>> {
        let conn = &self.conn;
        // Switched as the store switches it: prepared afresh each time, since SQLite
        // applies a pragma as it prepares it (`schema.rs`, `set_durability`).
        let full = self.sync == SyncMode::Full;
        let mut begin = conn.prepare_cached("BEGIN IMMEDIATE")?;
        let mut commit = conn.prepare_cached("COMMIT")?;
        let mut claim = conn.prepare_cached(
            "INSERT INTO steps (key, holder, token) VALUES (?1, 'holder-0123456789abcdef', ?2)",
        )?;
        let mut result =
            conn.prepare_cached("UPDATE steps SET result = ?2, holder = NULL WHERE key = ?1")?;
        let mut save = conn.prepare_cached(
            "INSERT INTO checkpoints (run, step, state) VALUES ('bare', ?1, ?2)
             ON CONFLICT (run) DO UPDATE SET step = excluded.step, state = excluded.state",
        )?;
        let mut samples = Vec::with_capacity(n);
        for _ in 0..n {
            self.next += 1;
            let key = format!(
                "bench:bare/s/{:032x}",
                (self.next as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
            );
            let t = Instant::now();
            if full {
                conn.execute_batch("PRAGMA synchronous = NORMAL")?;
            }
            begin.execute([])?;
            claim.execute(params![key, self.next])?;
            commit.execute([])?;
            if full {
                conn.execute_batch("PRAGMA synchronous = FULL")?;
            }
            begin.execute([])?;
            result.execute(params![key, b"\"ok\"".as_slice()])?;
            save.execute(params![self.next, b"null".as_slice()])?;
            commit.execute([])?;
            samples.push(micros(t.elapsed()));
        }
        Ok(samples)
    }
}

/// Overwrites of `blocks` consecutive 4 KiB blocks (one block: about one WAL frame) of a
/// preallocated file, each followed by `fdatasync`: the cost of making one small write
/// durable. Overwriting keeps the file's size, so no metadata needs syncing, as in a WAL
/// being reused after a checkpoint. Four blocks are what a durable step's commit makes
/// durable (its ~3.6 WAL frames): the floor under a step's one sync.
struct SyncFloor {
    file: std::fs::File,
    next: u64,
    blocks: usize,
}

impl SyncFloor {
    const BLOCK: usize = 4096;
    const BLOCKS: u64 = 256;

    fn create(path: &Path, blocks: usize) -> anyhow::Result<SyncFloor> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(path)?;
        file.write_all_at(&vec![0; Self::BLOCK * Self::BLOCKS as usize], 0)?;
        file.sync_all()?;
        Ok(SyncFloor {
            file,
            next: 0,
            blocks,
        })
    }

    /// Times `n` write + fdatasync pairs, in µs.
    fn batch(&mut self, n: usize) -> anyhow::Result<Vec<f64>> {
        let block = vec![0x5a_u8; Self::BLOCK * self.blocks];
        let mut samples = Vec::with_capacity(n);
        for _ in 0..n {
            let offset = (self.next % (Self::BLOCKS - self.blocks as u64)) * Self::BLOCK as u64;
            self.next += self.blocks as u64;
            let t = Instant::now();
            self.file.write_all_at(&block, offset)?;
            self.file.sync_data()?;
            samples.push(micros(t.elapsed()));
        }
        Ok(samples)
    }
}

// ---------------------------------------------------------------------------------------
// Host calls and resuming

fn host_calls(bed: &Bed, plan: &Plan, table: &mut Table) -> anyhow::Result<()> {
    let host = bed.host(&bed.dir.join("calls.db"), SyncMode::Normal)?;
    let n = plan.calls.n;
    let calls = || -> anyhow::Result<f64> {
        let input = json!({ "mode": "calls", "n": n });
        let (_, output) = bed.run(&host, input, FaultPlan::default())?;
        let ns = output.calls_ns.context("calls mode reports calls_ns")?;
        Ok(ns as f64 / n as f64)
    };
    calls()?;
    let mut samples = Vec::new();
    repeat(plan.calls, || {
        samples.push(calls()?);
        Ok(())
    })?;
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
    let n = plan.resume.n;
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
    let mut samples = Vec::new();
    repeat(plan.resume, || {
        let (plain, one) = timed(FaultPlan::default())?;
        let (recycled, many) = timed(recycle.clone())?;
        ensure!(
            one == 1 && many == n,
            "expected 1 and {n} instances, got {one} and {many}"
        );
        let extra = recycled.as_secs_f64() - plain.as_secs_f64();
        samples.push(extra * 1e6 / (many - one) as f64);
        Ok(())
    })?;
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
    drop(SqliteStore::open_with(&db, &StoreOptions::default())?);
    let cache = bed.dir.join("cache");
    // Fills the cache; not a sample.
    idem_run(&db, Some(&cache))?;
    for (cached, turns) in [(true, plan.cold_cached), (false, plan.cold_uncached)] {
        let (mut first_step, mut exit) = (Vec::new(), Vec::new());
        repeat(turns, || {
            let (to_step, to_exit) = idem_run(&db, cached.then_some(cache.as_path()))?;
            first_step.push(to_step);
            exit.push(to_exit);
            Ok(())
        })?;
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

    let mut compiles = Vec::new();
    repeat(plan.compiles, || {
        let runtime = Runtime::new(None)?;
        let t = Instant::now();
        let agent = runtime.load(Path::new(BENCH))?;
        compiles.push(millis(t.elapsed()));
        ensure!(!agent.from_cache(), "a runtime without cache compiles");
        Ok(())
    })?;
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
    let mut doc: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let output: GuestOutput = serde_json::from_value(doc["output"].take())?;
    let done = output
        .first_step_done_unix_ns
        .context("the timed bench agent reports first_step_done_unix_ns")?;
    let to_step = (done as f64 - spawned_at.as_nanos() as f64) / 1e6;
    Ok((to_step, to_exit))
}

// ---------------------------------------------------------------------------------------
// Throughput and scaling

/// Steps per second of 1, 8 and 64 runs going at once in one host, one thread each. The
/// three are measured in turns, so that drift in the disk's speed falls on all alike.
fn throughput(bed: &Bed, plan: &Plan, table: &mut Table) -> anyhow::Result<()> {
    for (sync, turns) in [
        (SyncMode::Normal, plan.throughput_normal),
        (SyncMode::Full, plan.throughput_full),
    ] {
        let n = turns.n;
        let host = bed.host(&bed.dir.join(format!("throughput-{sync}.db")), sync)?;
        bed.steps(&host, n)?;
        let mut samples = vec![Vec::new(); CONCURRENCY.len()];
        let mut loads = vec![Vec::new(); CONCURRENCY.len()];
        repeat(turns, || {
            for ((runs, rates), load) in CONCURRENCY.iter().zip(&mut samples).zip(&mut loads) {
                let spent = concurrent_runs(bed, &host, *runs, n)?;
                rates.push(spent.rate);
                load.push(spent);
            }
            Ok(())
        })?;
        let one_run = median(&sorted(samples[0].clone()));
        for ((runs, rates), load) in CONCURRENCY.into_iter().zip(samples).zip(loads) {
            let rate = median(&sorted(rates.clone()));
            let ratio = rate / one_run;
            let (what, ratio) = match runs {
                1 => (format!("throughput: 1 run × {n} steps, sync {sync}"), None),
                _ => (
                    format!("throughput: {runs} concurrent runs × {n} steps, sync {sync}"),
                    Some(format!("{ratio:.1}× 1 run")),
                ),
            };
            table.rate_row(what, rates, ratio);
            load_rows(
                table,
                &format!("{runs} run(s) × {n} steps, sync {sync}"),
                &load,
                one_run,
            );
        }
    }
    Ok(())
}

/// What a turn of concurrent runs kept busy, each over its wall time: the process's
/// threads (their time on a CPU, in cores) and the store's one connection (the time it
/// was held, a share of the wall); and its steps per second.
#[derive(Clone, Copy)]
struct Spent {
    rate: f64,
    cpu: f64,
    connection: f64,
}

/// What bounds a throughput row: the time a step takes of the process's CPUs and of the
/// store's one connection, and the steps per second each allows when fully busy (every
/// core; the connection all the time), as a multiple of one run.
fn load_rows(table: &mut Table, what: &str, load: &[Spent], one_run: f64) {
    let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
    // A resource: its name, the unit of its share, how much of it there is, and its
    // share of a turn's wall.
    type Resource = (&'static str, &'static str, f64, fn(&Spent) -> f64);
    let resources: [Resource; 2] = [
        (
            "the process's CPU a step (all threads)",
            "cores",
            cores,
            |s| s.cpu,
        ),
        (
            "the store's connection held a step",
            "of the wall",
            1.0,
            |s| s.connection,
        ),
    ];
    for (name, unit, capacity, busy) in resources {
        let samples: Vec<f64> = load.iter().map(|s| busy(s) * 1e6 / s.rate).collect();
        let us = median(&sorted(samples.clone()));
        let share = median(&sorted(load.iter().map(busy).collect()));
        table.row_with_ratio(
            format!("throughput: {what}: {name}"),
            "µs",
            samples,
            format!(
                "busy {share:.2} {unit} (of {capacity}); at {capacity}: {:.0} steps/s, \
                 {:.1}× 1 run",
                capacity * 1e6 / us,
                capacity * 1e6 / us / one_run
            ),
        );
    }
}

/// `runs` runs of `n` steps started at once as tasks of one host: steps per second, and
/// what the turn kept busy.
fn concurrent_runs(bed: &Bed, host: &BenchHost, runs: usize, n: u64) -> anyhow::Result<Spent> {
    let input = json!({ "mode": "steps", "n": n });
    let all: Vec<RunOptions> = (0..runs)
        .map(|_| options(host.sync, &input, FaultPlan::default()))
        .collect::<anyhow::Result<_>>()?;
    let held = || {
        host.sqlite
            .as_ref()
            .map_or(Duration::ZERO, |s| s.connection_busy())
    };
    let (elapsed, cpu, connection) = bed.tokio.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        let (cpu, connection) = (on_cpu()?, held());
        let t = Instant::now();
        for opts in all {
            let (host, agent) = (Arc::clone(&host.host), Arc::clone(&bed.agent));
            tasks.spawn(async move { host.run(&agent, &opts).await });
        }
        while let Some(done) = tasks.join_next().await {
            let report = done??;
            ensure!(report.counts.executed == n, "{:?}", report.counts);
        }
        Ok::<_, anyhow::Error>((
            t.elapsed(),
            on_cpu()?.saturating_sub(cpu),
            held().saturating_sub(connection),
        ))
    })?;
    let wall = elapsed.as_secs_f64();
    Ok(Spent {
        rate: (runs as u64 * n) as f64 / wall,
        cpu: cpu.as_secs_f64() / wall,
        connection: connection.as_secs_f64() / wall,
    })
}

/// The time this process's threads have spent on a CPU, from each one's
/// `/proc/self/task/*/schedstat` (nanoseconds; the threads of a bench live as long as
/// its runtime, so none is lost between two readings).
fn on_cpu() -> anyhow::Result<Duration> {
    let mut ns = 0u64;
    for task in std::fs::read_dir("/proc/self/task")? {
        let path = task?.path().join("schedstat");
        // A thread that ended since the listing has no file left: nothing to add.
        let Ok(stat) = std::fs::read_to_string(&path) else {
            continue;
        };
        ns += stat
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .with_context(|| format!("{} holds no time", path.display()))?;
    }
    Ok(Duration::from_nanos(ns))
}

/// The durable step (sync normal) on stores already holding more and more committed
/// results. One store per size, measured in turns (a run on each, then again), so that
/// drift in the machine falls on every size alike.
fn scaling(bed: &Bed, plan: &Plan, table: &mut Table) -> anyhow::Result<()> {
    let n = plan.scale.n;
    let mut stores = Vec::with_capacity(plan.fills.len());
    for &rows in plan.fills {
        let db = bed.dir.join(format!("scale-{rows}.db"));
        // Creates the schema; the rows are then written under it directly.
        drop(SqliteStore::open_with(&db, &StoreOptions::default())?);
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
    repeat(plan.scale, || {
        for (_, host, samples) in &mut stores {
            samples.extend(bed.timed_run(host, n, true)?);
        }
        Ok(())
    })?;
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

/// Tops the `steps` table up to `target` committed keys in one transaction, with keys
/// shaped like the SDK's (`{run}/{step}/{32 hex}`) spread over a thousand runs, inserted
/// in random key order as real runs would. This writes idem's schema directly (see
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
                 (key, run_id, token, attempt, claimed_at, lease_expires, result, committed_at)
             SELECT 'fill-' || (i % 1000) || '/s/' || lower(hex(randomblob(16))),
                    'fill-' || (i % 1000), 1, 1, 0, 0, CAST('null' AS BLOB), 0
             FROM n",
            params![have, target],
        )?;
        tx.commit()?;
    }
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    Ok(())
}
