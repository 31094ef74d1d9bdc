//! The `python` section: a componentize-py agent beside its Rust twin
//! (`tests/guests-python/steps` and `tests/guests/steps`: the same input, keys, log
//! lines and output), row by row: component size, compile, cached cold start of the
//! real binary, a durable step, and recreating an instance.
//!
//! Each Python row has a Rust row measured the same way in the same turns, and its
//! ratio is Python over Rust. Without componentize-py (`scripts/test` installs it into
//! `target/py`) the section says so and measures nothing.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure};
use idem::runtime::{Authority, DirGrant, FaultPlan, Host, LoadedAgent, RunOptions, Runtime};
use idem::store::{OpenOptions as StoreOptions, RunStatus, SqliteStore, SyncMode};
use idem_test_artifacts::{PY_STEPS, STEPS};
use serde_json::json;

use super::report::{Table, median, millis, progress, sorted};
use super::{Bed, Plan, fresh_run_id, repeat};

/// The twins, Rust first.
const TWINS: [(&str, &str); 2] = [("Rust", STEPS), ("Python", PY_STEPS)];

pub(crate) fn python(bed: &Bed, plan: &Plan, table: &mut Table) -> anyhow::Result<()> {
    if PY_STEPS.is_empty() {
        progress(
            "  SKIPPED: the Python rows: componentize-py was not found when the guests were \
             built (scripts/test installs it into target/py; set IDEM_PYTHON_VENV)",
        );
        return Ok(());
    }
    let cache = bed.dir.join("py-cache");
    let data = bed.dir.join("py-data");
    std::fs::create_dir_all(&data)?;

    for (lang, path) in TWINS {
        let mb = std::fs::metadata(path)?.len() as f64 / 1e6;
        table.row(format!("{lang} `steps`: component size"), "MB", vec![mb]);
    }

    // Compiling: Rust in turns; Python once (about a minute of cranelift), into the
    // cache the other rows then load from.
    let mut rust = Vec::new();
    repeat(plan.compiles, || {
        let runtime = Runtime::new(None)?;
        let t = Instant::now();
        let agent = runtime.load(Path::new(STEPS))?;
        rust.push(millis(t.elapsed()));
        ensure!(!agent.from_cache(), "a runtime without cache compiles");
        Ok(())
    })?;
    let runtime = Arc::new(Runtime::new(Some(cache.clone()))?);
    let t = Instant::now();
    let py = runtime.load(Path::new(PY_STEPS))?;
    let py_compile = vec![millis(t.elapsed())];
    ensure!(
        !py.from_cache(),
        "the bench's fresh cache cannot hold the agent"
    );
    let rs = runtime.load(Path::new(STEPS))?;
    pair(
        table,
        "compile: `Runtime::load`, no cached code",
        "ms",
        rust,
        py_compile,
    );

    // The real binary, cached: Rust and Python in turns. The first start of each fills
    // the cache's record of the file's digest; it is not a sample.
    let db = bed.dir.join("py-cold.db");
    drop(SqliteStore::open_with(&db, &StoreOptions::default())?);
    for (_, path) in TWINS {
        idem_run(path, &db, &cache, &data)?;
    }
    let (mut rust, mut python) = (Vec::new(), Vec::new());
    repeat(plan.py_cold, || {
        rust.push(idem_run(STEPS, &db, &cache, &data)?);
        python.push(idem_run(PY_STEPS, &db, &cache, &data)?);
        Ok(())
    })?;
    pair(
        table,
        "cold start: `idem run`, 1 step, process start → exit (cached)",
        "ms",
        rust,
        python,
    );

    // In one process: a run of `n` steps against a run of one, and the same run
    // recycled after every claim against it unrecycled.
    let store = SqliteStore::open_with(&bed.dir.join("py-steps.db"), &StoreOptions::default())?;
    let host = {
        let _inside = bed.tokio.enter();
        Host::new(Arc::clone(&runtime), Arc::new(store))?
    };
    let n = plan.py_steps.n;
    let run = |agent: &LoadedAgent, steps: u64, recycle: bool| -> anyhow::Result<Duration> {
        let opts = options(&data, steps, recycle)?;
        let t = Instant::now();
        let report = bed.tokio.block_on(host.run(agent, &opts))?;
        let took = t.elapsed();
        ensure!(
            report.status == RunStatus::Completed,
            "run {} of {} ended {:?}: {}",
            opts.run_id,
            agent.name(),
            report.status,
            String::from_utf8_lossy(&report.outcome)
        );
        let instances = if recycle { steps } else { 1 };
        ensure!(
            report.counts.executed == steps && report.instances_now == instances,
            "expected {steps} steps in {instances} instances: {:?}, {} instances",
            report.counts,
            report.instances_now
        );
        Ok(took)
    };
    for agent in [&rs, &py] {
        run(agent, n, true)?;
    }
    let mut steps = [Vec::new(), Vec::new()];
    let mut instances = [Vec::new(), Vec::new()];
    repeat(plan.py_steps, || {
        for (i, agent) in [&rs, &py].into_iter().enumerate() {
            let one = run(agent, 1, false)?;
            let many = run(agent, n, false)?;
            let recycled = run(agent, n, true)?;
            let per = |d: Duration| d.as_secs_f64() * 1e6 / (n - 1) as f64;
            steps[i].push(per(many.saturating_sub(one)));
            instances[i].push(per(recycled.saturating_sub(many)));
        }
        Ok(())
    })?;
    let [rust, python] = steps;
    pair(
        table,
        &format!(
            "durable step in `steps` (({n}-step run − 1-step run) / {})",
            n - 1
        ),
        "µs",
        rust,
        python,
    );
    let [rust, python] = instances;
    pair(
        table,
        &format!("instance recreation (`recycle_every` 1 − plain, {n} steps, per extra instance)"),
        "µs",
        rust,
        python,
    );
    Ok(())
}

/// A Rust row and a Python row, the Python one with its ratio to the Rust median.
fn pair(table: &mut Table, what: &str, unit: &'static str, rust: Vec<f64>, python: Vec<f64>) {
    let ratio = median(&sorted(python.clone())) / median(&sorted(rust.clone()));
    table.row(format!("Rust `steps`: {what}"), unit, rust);
    table.row_with_ratio(
        format!("Python `steps`: {what}"),
        unit,
        python,
        format!("{ratio:.1}× Rust"),
    );
}

/// A fresh run of `steps` steps logging to `data`, recycled after every claim or not.
fn options(data: &Path, steps: u64, recycle: bool) -> anyhow::Result<RunOptions> {
    Ok(RunOptions {
        run_id: fresh_run_id(),
        input: serde_json::to_vec(&json!({ "steps": steps, "log": "/data/log.txt" }))?,
        authority: Authority {
            dirs: vec![DirGrant {
                host: data.to_path_buf(),
                guest: "/data".to_string(),
            }],
            sync: SyncMode::Normal,
            ..Authority::default()
        },
        faults: FaultPlan {
            recycle_every: recycle.then_some(1),
            ..FaultPlan::default()
        },
        ..RunOptions::default()
    })
}

/// `idem run AGENT` on a one-step run with the cache: milliseconds from just before the
/// spawn to the process's exit.
fn idem_run(agent: &str, db: &Path, cache: &Path, data: &Path) -> anyhow::Result<f64> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_idem"));
    cmd.arg("run")
        .arg(agent)
        .arg("--db")
        .arg(db)
        .arg("--cache-dir")
        .arg(cache)
        .arg("--dir")
        .arg(format!("{}::/data", data.display()))
        .args(["--run-id", &fresh_run_id(), "--json"])
        .args(["--input", r#"{"steps":1,"log":"/data/log.txt"}"#])
        .env_remove("IDEM_LOG");
    let t = Instant::now();
    let out = cmd.output()?;
    let took = millis(t.elapsed());
    if !out.status.success() {
        bail!(
            "idem run {agent} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(took)
}
