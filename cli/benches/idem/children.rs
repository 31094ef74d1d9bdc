//! The child-run rows: a parent (the `fanout` test agent) spawning `n` one-step
//! children of the bench agent and joining them all, driven by two workers each on its
//! own store handle (as two processes would be), on SQLite and on PostgreSQL:
//! children per second from the parent's submission to its joined answer. And the
//! memory of a process holding a parent that waits on 10,000 children, against one
//! waiting on 10.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use idem::runtime::{Authority, Host, Runtime};
use idem::store::{
    OpenOptions as StoreOptions, PostgresStore, RunStatus, SqliteStore, Store, Submission, SyncMode,
};
use idem_test_artifacts::FANOUT;
use serde_json::json;

use super::report::{Table, progress};
use super::service::{bench_worker, deploy};
use super::{Bed, Plan};

const DEFAULT_URL: &str = "postgres://root@127.0.0.1:5432/test";

pub(crate) fn children(bed: &Bed, plan: &Plan, table: &mut Table) -> anyhow::Result<()> {
    let turns = plan.children;
    let n = turns.n as usize;
    progress(&format!("  fan-out of {n} children, two workers, SQLite"));
    let mut samples = Vec::new();
    for turn in 0..turns.max {
        let db = bed.dir.join(format!("fanout-{turn}.db"));
        let open = || -> anyhow::Result<Arc<dyn Store>> {
            Ok(Arc::new(SqliteStore::open_with(
                &db,
                &StoreOptions::default(),
            )?))
        };
        let rate = fan_out(bed, n, open)?;
        progress(&format!("    turn {}: {rate:.0} children/s", turn + 1));
        samples.push(rate);
    }
    table.row_with_ratio(
        format!(
            "children: fan-out and join of {n} one-step children through 2 workers, \
             SQLite sync normal (parent submitted → joined; spawns included)"
        ),
        "children/s",
        samples.clone(),
        "target ≥ 2000/s".into(),
    );

    let server = std::env::var("IDEM_BENCH_POSTGRES").unwrap_or_else(|_| DEFAULT_URL.into());
    progress(&format!(
        "  fan-out of {n} children, two workers, PostgreSQL"
    ));
    let mut samples = Vec::new();
    for turn in 0..turns.max {
        let schema = format!("idem_bench_fanout_{}_{turn}", std::process::id());
        let url = format!("{server}?options=-csearch_path%3D{schema}");
        let admin = bed.tokio.block_on(admin(&server)).with_context(|| {
            format!(
                "the children section needs a PostgreSQL server at {server} (IDEM_BENCH_POSTGRES)"
            )
        })?;
        bed.tokio
            .block_on(admin.batch_execute(&format!("CREATE SCHEMA {schema}")))?;
        let open = || -> anyhow::Result<Arc<dyn Store>> {
            let store = bed
                .tokio
                .block_on(PostgresStore::connect(&url, SyncMode::Normal))?;
            Ok(Arc::new(store))
        };
        let result = fan_out(bed, n, open);
        bed.tokio
            .block_on(admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")))?;
        let rate = result?;
        progress(&format!("    turn {}: {rate:.0} children/s", turn + 1));
        samples.push(rate);
    }
    table.row_with_ratio(
        format!(
            "children: fan-out and join of {n} one-step children through 2 workers, \
             PostgreSQL synchronous_commit off"
        ),
        "children/s",
        samples,
        "target ≥ 1000/s".into(),
    );

    let (few, many) = (10, plan.children_waiting);
    progress(&format!(
        "  a parent waiting on {few} and on {many} children"
    ));
    // The first process compiles the agent into the cache; the two measured load it.
    waiting_parent(bed, few, "warm-up")?;
    let few_rss = waiting_parent(bed, few, "few")?;
    let many_rss = waiting_parent(bed, many, "many")?;
    table.row_with_ratio(
        format!(
            "children: resident memory of an `idem run` process holding a parent that waits \
             on {many} children (the parent spawned them, suspended, holds no instance)"
        ),
        "KiB",
        vec![many_rss / 1024.0],
        format!(
            "{:.3}× the same process on a parent waiting on {few} ({:.0} KiB)",
            many_rss / few_rss.max(1.0),
            few_rss / 1024.0
        ),
    );
    Ok(())
}

async fn admin(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// Deploys the bench agent (the children) and `fanout` (the parent) into the store
/// `open` opens, submits a parent of `n` children, and drives it with two workers,
/// each on a store handle of its own: children per second.
fn fan_out(
    bed: &Bed,
    n: usize,
    open: impl Fn() -> anyhow::Result<Arc<dyn Store>>,
) -> anyhow::Result<f64> {
    // The workers share a component cache, as workers on one machine do: each compiles
    // both agents once (in the warm-up below), or loads what the other compiled. With
    // the compile of one of them left inside the measured fan-out, a child's CPU was
    // 1.4 ms instead of a few hundred µs, depending on which worker the warm-up's few
    // children had reached.
    let runtime = Arc::new(Runtime::new(Some(bed.dir.join("children-cache")))?);
    let fanout = runtime.load(Path::new(FANOUT))?;
    let store = open()?;
    let handles = [open()?, open()?];
    bed.tokio.block_on(async {
        deploy(store.as_ref(), &bed.agent, "bench", &Authority::default()).await?;
        let authority = deploy(store.as_ref(), &fanout, "fanout", &Authority::default()).await?;
        let submit = |run_id: &'static str, n: usize| {
            let store = Arc::clone(&store);
            let (digest, authority) = (fanout.digest().to_string(), authority.clone());
            async move {
                // Spawned in one `spawn_many`, as a fan-out is written.
                let input = json!({ "deployment": "bench", "children": n, "batch": n,
                                    "child_input": { "mode": "steps", "n": 1 } });
                store
                    .submit(&Submission {
                        run_id,
                        agent: "fanout",
                        digest: &digest,
                        namespace: "fanout",
                        input: &serde_json::to_vec(&input)?,
                        authority: &authority,
                        replace_authority: false,
                        priority: 0,
                    })
                    .await?;
                Ok::<_, anyhow::Error>(())
            }
        };
        let mut stops = Vec::new();
        let mut working = Vec::new();
        for handle in &handles {
            let host = Arc::new(Host::new(Arc::clone(&runtime), Arc::clone(handle))?);
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            stops.push(stop);
            working.push(tokio::spawn(bench_worker(host).run(async move {
                let _ = stopped.await;
            })));
        }
        // A fan-out first, wider than one worker takes at once, so that both workers
        // have loaded both agents: the rows measure children, not compiles.
        submit("warm-up", 160).await?;
        finished(store.as_ref(), "warm-up").await?;
        let cpu = (cpu_seconds("self"), server_cpu_seconds());
        submit("parent", n).await?;
        let wall = finished(store.as_ref(), "parent").await?;
        progress(&format!(
            "      CPU per child: {:.0} µs in the workers, {:.0} µs in PostgreSQL's processes",
            (cpu_seconds("self") - cpu.0) * 1e6 / n as f64,
            (server_cpu_seconds() - cpu.1) * 1e6 / n as f64
        ));
        for stop in stops {
            let _ = stop.send(());
        }
        for w in working {
            w.await??;
        }
        let parent = store.run("parent").await?.context("the parent run")?;
        let out: serde_json::Value =
            serde_json::from_slice(parent.outcome.as_deref().unwrap_or_default())?;
        ensure!(out["completed"] == n, "the parent joined {out}");
        Ok(n as f64 / wall.as_secs_f64())
    })
}

/// Waits until run `run_id` completed: the time from its submission to its end, as the
/// store's clock recorded them (to the millisecond). Looked at every 50 ms: the bench
/// reads the run's record, and a read every few milliseconds took a share of the CPU
/// the fan-out is measured on (on PostgreSQL, one query for every child).
async fn finished(store: &dyn Store, run_id: &str) -> anyhow::Result<Duration> {
    let started = Instant::now();
    loop {
        let run = store.run(run_id).await?.context("the parent run")?;
        if run.status.is_finished() {
            ensure!(
                run.status == RunStatus::Completed,
                "{run_id} ended {}: {}",
                run.status,
                String::from_utf8_lossy(run.outcome.as_deref().unwrap_or_default())
            );
            let ms = u64::try_from(run.updated.saturating_sub(run.created)).unwrap_or(0);
            return Ok(Duration::from_millis(ms.max(1)));
        }
        ensure!(
            started.elapsed() < Duration::from_secs(600),
            "{run_id} did not finish"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The resident memory of an `idem run` process of its own holding a parent that
/// spawned `n` children and waits on them (none of them driven: they are paused), read
/// once the parent is suspended in its join with no instance, in a process that took
/// the waiting parent over (not the one that spawned the children). A process per size, so
/// that what one measurement allocated is not in the other's (in one process the
/// allocator's reuse hid a small fan-out under its noise).
fn waiting_parent(bed: &Bed, n: usize, name: &str) -> anyhow::Result<f64> {
    let db = bed.dir.join(format!("waiting-parent-{name}.db"));
    let run_id = format!("waiting-{n}");
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_with(&db, &StoreOptions::default())?);
    bed.tokio.block_on(async {
        deploy(store.as_ref(), &bed.agent, "bench", &Authority::default()).await?;
        // `idem run` drives a parent's children itself; children of a paused
        // deployment are paused, so the parent waits on all of them, as it would on
        // children queued for busy workers.
        store.pause_deployment("bench").await?;
        anyhow::Ok(())
    })?;
    let input = json!({ "deployment": "bench", "children": n,
                        "child_input": { "mode": "steps", "n": 1 } });
    let start = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
            .arg("run")
            .arg(FANOUT)
            .arg("--db")
            .arg(&db)
            .arg("--run-id")
            .arg(&run_id)
            .arg("--input")
            .arg(input.to_string())
            .arg("--cache-dir")
            .arg(bed.dir.join("cache"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("starting `idem run` of the waiting parent")
    };
    // Waits until the parent is suspended in its join (no lease, so no instance), and
    // has been for `settle`; then the resident memory of `process`.
    let waiting = |process: &std::process::Child, settle: Duration| -> anyhow::Result<u64> {
        let started = Instant::now();
        loop {
            let parent = bed.tokio.block_on(store.run(&run_id))?;
            if parent.is_some_and(|p| p.joining.is_some() && p.lease.is_none()) {
                break;
            }
            ensure!(
                started.elapsed() < Duration::from_secs(300),
                "the parent never suspended"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(settle);
        rss_of(process.id())
    };
    // The first process spawns the children and suspends the parent; what it freed
    // stays in its resident memory. The process measured is the next one: it takes
    // the waiting parent over from the store, as any process resuming it would, and
    // holds it while it waits.
    let mut spawner = start()?;
    let spawned = waiting(&spawner, Duration::ZERO);
    let _ = spawner.kill();
    let _ = spawner.wait();
    spawned?;
    let mut holder = start()?;
    let measured = waiting(&holder, Duration::from_secs(1));
    let _ = holder.kill();
    let _ = holder.wait();
    Ok(measured? as f64)
}

fn rss_of(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .map(|kib| kib * 1024)
        .context("VmRSS in /proc/self/status")
}

/// User and system CPU seconds of process `pid` (`self` for this one) and its waited-for
/// children, from `/proc/PID/stat`; 0 if it cannot be read.
fn cpu_seconds(pid: &str) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // The fields after the command's name, which is in parentheses.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    let ticks: u64 = (11..15)
        .filter_map(|i| fields.get(i).and_then(|f| f.parse::<u64>().ok()))
        .sum();
    ticks as f64 / 100.0
}

/// CPU seconds of every process named `postgres` on this machine (a local server's).
fn server_cpu_seconds() -> f64 {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    procs
        .filter_map(Result::ok)
        .filter_map(|p| p.file_name().into_string().ok())
        .filter(|pid| pid.bytes().all(|b| b.is_ascii_digit()))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim_end() == "postgres")
        })
        .map(|pid| cpu_seconds(&pid))
        .sum()
}
