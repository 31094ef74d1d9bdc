//! The `peers` section: idem beside the peers a user would pick instead, the same
//! workloads in one run on one machine, each peer installed at a pinned version from
//! the package index (pip, nothing else) into a venv under cargo's target dir:
//!
//! - the seed's reference class: the classic durable step on Python's sqlite3 (WAL;
//!   claim, result and progress: three commits a step), with `synchronous` NORMAL and
//!   FULL;
//! - DBOS Transact for Python on SQLite (its own settings: rollback journal,
//!   `synchronous` FULL) and on PostgreSQL (`synchronous_commit` on);
//! - LangGraph's functional API with its SQLite checkpointer (WAL, `synchronous` FULL,
//!   `durability="sync"`), the agent-framework reference.
//!
//! The workloads: (a) a workflow of N durable steps each recording its result, the
//! run's wall time over N; (b) one-step workflows one after another, per second; (c) the
//! crash: a workflow of N steps, each appending a synced line to a file, its process
//! SIGKILLed inside step K after that step's line is written and before the step is
//! recorded; then a fresh process resumes it: the time from its start to its exit, and
//! the steps whose line was written twice (the file's lines, counted). Each peer's row
//! carries the ratio idem / peer against the idem row of the same durability.
//!
//! The peers' scripts are `cli/benches/idem/peers/*.py`. Where python3 is missing or the
//! install fails, the section says so and measures nothing; under `--quick` it runs
//! small, and only if the venv is already installed (a quick run downloads nothing).

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use idem::store::SyncMode;
use idem_test_artifacts::STEPS;
use serde_json::{Value, json};

use super::report::{Table, median, micros, millis, progress, sorted};
use super::{Bed, BenchHost, Plan, fresh_run_id, postgres};

/// How much each workload runs.
pub(crate) struct PeersPlan {
    /// Steps in a workflow, for the step cost and the crash.
    pub(crate) n: u64,
    /// The step (1-based) inside which the crash kills the process.
    pub(crate) kill_at: u64,
    /// One-step workflows in a turn.
    pub(crate) short: u64,
    /// Turns of the step and short workloads per row.
    pub(crate) turns: usize,
    /// Crashes per row (a crash of a peer on a synced SQLite takes tens of seconds).
    pub(crate) crash_turns: usize,
    /// Whether this is `--quick`: no install, only an installed venv is used.
    pub(crate) quick: bool,
}

const SCRIPTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/idem/peers");
const REQUIREMENTS: &str = include_str!("peers/requirements.txt");
const DEFAULT_POSTGRES: &str = "postgres://root@127.0.0.1:5432/test";
/// The signal a peer's crash run must end by (Linux's number).
const SIGKILL: i32 = 9;

/// The idem rows a peer's row is compared with: the same store and durability.
#[derive(Clone, Copy, PartialEq)]
enum Idem {
    SqliteNormal,
    SqliteFull,
    PostgresFull,
}

impl Idem {
    fn label(self) -> &'static str {
        match self {
            Idem::SqliteNormal => "idem, SQLite, sync normal",
            Idem::SqliteFull => "idem, SQLite, sync full",
            Idem::PostgresFull => "idem, PostgreSQL, sync full",
        }
    }
}

struct Peer {
    name: &'static str,
    /// Its files' names in the bench's temp dir.
    slug: &'static str,
    script: &'static str,
    /// Extra arguments for every invocation.
    args: &'static [&'static str],
    postgres: bool,
    idem: Idem,
}

const PEERS: [Peer; 5] = [
    Peer {
        name: "seed's reference (Python sqlite3, WAL, 3 commits a step), synchronous NORMAL",
        slug: "seed-normal",
        script: "seed_reference.py",
        args: &["--sync", "normal"],
        postgres: false,
        idem: Idem::SqliteNormal,
    },
    Peer {
        name: "seed's reference, synchronous FULL",
        slug: "seed-full",
        script: "seed_reference.py",
        args: &["--sync", "full"],
        postgres: false,
        idem: Idem::SqliteFull,
    },
    Peer {
        name: "DBOS Transact 3.4.0, SQLite",
        slug: "dbos-sqlite",
        script: "dbos_peer.py",
        args: &[],
        postgres: false,
        idem: Idem::SqliteFull,
    },
    Peer {
        name: "DBOS Transact 3.4.0, PostgreSQL",
        slug: "dbos-postgres",
        script: "dbos_peer.py",
        args: &[],
        postgres: true,
        idem: Idem::PostgresFull,
    },
    Peer {
        name: "LangGraph 1.2.24 + SqliteSaver, durability sync",
        slug: "langgraph",
        script: "langgraph_peer.py",
        args: &[],
        postgres: false,
        idem: Idem::SqliteFull,
    },
];

pub(crate) fn peers(bed: &Bed, plan: &Plan, table: &mut Table) -> anyhow::Result<()> {
    let plan = &plan.peers;
    let Some(python) = venv(plan)? else {
        return Ok(());
    };
    let server = std::env::var("IDEM_BENCH_POSTGRES").unwrap_or_else(|_| DEFAULT_POSTGRES.into());
    let tag = std::process::id();
    let schema = format!("idem_bench_peers_{tag}");
    let admin = match bed.tokio.block_on(postgres::client(&server)) {
        Ok(admin) => Some(admin),
        Err(err) => {
            progress(&format!(
                "  SKIPPED: the PostgreSQL rows: no server at {server} (IDEM_BENCH_POSTGRES): {err}"
            ));
            None
        }
    };
    let pg = match &admin {
        Some(admin) => {
            bed.tokio
                .block_on(admin.batch_execute(&format!("CREATE SCHEMA {schema}")))?;
            Some(Postgres {
                idem: format!("{server}?options=-csearch_path%3D{schema}"),
                dbos: database_url(&server, &format!("idem_bench_dbos_{tag}"))?,
            })
        }
        None => None,
    };
    let result = measure(bed, plan, table, &python, pg.as_ref());
    if let Some(admin) = admin {
        bed.tokio
            .block_on(admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")))?;
    }
    if let Some(pg) = &pg {
        // The database DBOS made for itself, with the pending workflow of a failed turn.
        run_python(
            &python,
            "dbos_peer.py",
            &["reset", "--db", &pg.dbos],
            &bed.dir,
        )?;
    }
    result
}

/// Where the PostgreSQL rows keep their data: a schema of the bench's own for idem, and
/// a database of the bench's own for DBOS (which makes it at launch; dropped at the end).
struct Postgres {
    idem: String,
    dbos: String,
}

/// `server` with its database replaced by `name`, as a `postgresql://` URL (DBOS's).
fn database_url(server: &str, name: &str) -> anyhow::Result<String> {
    let rest = server
        .strip_prefix("postgres://")
        .or_else(|| server.strip_prefix("postgresql://"))
        .with_context(|| format!("IDEM_BENCH_POSTGRES {server:?} is not a postgres:// URL"))?;
    let (authority, _) = rest.split_once('/').unwrap_or((rest, ""));
    Ok(format!("postgresql://{authority}/{name}"))
}

/// The venv's python, the peers installed in it: `None` (and a note) where python3 is
/// missing, the install failed, or a quick run finds nothing installed.
fn venv(plan: &PeersPlan) -> anyhow::Result<Option<PathBuf>> {
    // CARGO_TARGET_TMPDIR is `<target>/tmp`.
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .context("CARGO_TARGET_TMPDIR has no parent")?;
    let venv = target.join("peers-py");
    let python = venv.join("bin/python");
    let stamp = venv.join("idem-peers-requirements.txt");
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == REQUIREMENTS) {
        return Ok(Some(python));
    }
    if plan.quick {
        progress(&format!(
            "  SKIPPED: the peers (--quick installs nothing; `cargo bench -p idem-cli --bench \
             idem -- peers` installs them into {})",
            venv.display()
        ));
        return Ok(None);
    }
    if Command::new("python3")
        .arg("--version")
        .output()
        .map_or(true, |out| !out.status.success())
    {
        progress("  SKIPPED: the peers: python3 is missing");
        return Ok(None);
    }
    progress(&format!(
        "  installing the peers (cli/benches/idem/peers/requirements.txt) into {}",
        venv.display()
    ));
    let mut make = Command::new("python3");
    make.args(["-m", "venv", "--clear"]).arg(&venv);
    let mut install = Command::new(venv.join("bin/pip"));
    install
        .args([
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-input",
            "-r",
        ])
        .arg(format!("{SCRIPTS}/requirements.txt"));
    for mut cmd in [make, install] {
        let failed = match cmd.output() {
            Ok(out) if out.status.success() => None,
            Ok(out) => Some(format!(
                "{}: {}",
                out.status,
                tail(&String::from_utf8_lossy(&out.stderr))
            )),
            Err(err) => Some(err.to_string()),
        };
        if let Some(why) = failed {
            progress(&format!("  SKIPPED: the peers: {cmd:?} failed: {why}"));
            return Ok(None);
        }
    }
    std::fs::write(&stamp, REQUIREMENTS)?;
    Ok(Some(python))
}

/// The last lines of a tool's error output, for a one-line note.
fn tail(text: &str) -> String {
    let lines: Vec<_> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
}

fn python_command(python: &Path, script: &str, args: &[&str], cwd: &Path) -> Command {
    let mut cmd = Command::new(python);
    cmd.arg(format!("{SCRIPTS}/{script}"))
        .args(args)
        .current_dir(cwd)
        // Nothing written into the checkout.
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null());
    cmd
}

/// Runs a peer script to its end; its last line of output, as JSON (null if none).
fn run_python(python: &Path, script: &str, args: &[&str], cwd: &Path) -> anyhow::Result<Value> {
    let out = python_command(python, script, args, cwd).output()?;
    if !out.status.success() {
        bail!(
            "{script} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.lines().rev().find(|l| !l.trim().is_empty()) {
        Some(line) => serde_json::from_str(line)
            .with_context(|| format!("{script} {}: output {line:?}", args.join(" "))),
        None => Ok(Value::Null),
    }
}

fn samples(report: &Value, field: &str) -> anyhow::Result<Vec<f64>> {
    report[field]
        .as_array()
        .with_context(|| format!("no {field} in {report}"))?
        .iter()
        .map(|v| {
            v.as_f64()
                .with_context(|| format!("{field}: {v} is not a number"))
        })
        .collect()
}

/// The durability a peer's connection reported, for its row.
fn mode(report: &Value) -> String {
    let m = &report["mode"];
    if let Some(sc) = m["synchronous_commit"].as_str() {
        return format!("synchronous_commit {sc}");
    }
    let sync = match m["synchronous"].as_i64() {
        Some(0) => "OFF",
        Some(1) => "NORMAL",
        Some(2) => "FULL",
        Some(3) => "EXTRA",
        _ => "?",
    };
    format!(
        "journal {}, synchronous {sync}",
        m["journal_mode"].as_str().unwrap_or("?")
    )
}

fn measure(
    bed: &Bed,
    plan: &PeersPlan,
    table: &mut Table,
    python: &Path,
    pg: Option<&Postgres>,
) -> anyhow::Result<()> {
    let dir = bed.dir.join("peers");
    std::fs::create_dir_all(&dir)?;
    let (n, turns) = (plan.n, plan.turns);
    let n_arg = n.to_string();
    let turns_arg = turns.to_string();
    let peers: Vec<&Peer> = PEERS
        .iter()
        .filter(|p| !p.postgres || pg.is_some())
        .collect();
    let peer_db = |peer: &Peer, what: &str| -> String {
        match (peer.postgres, pg) {
            (true, Some(pg)) => pg.dbos.clone(),
            _ => dir
                .join(format!("{}-{what}.db", peer.slug))
                .display()
                .to_string(),
        }
    };

    // idem's hosts: the bench agent, its steps with a no-op effect, the checkpoint
    // folded into each step's commit.
    let mut hosts: Vec<(Idem, BenchHost)> = vec![
        (
            Idem::SqliteNormal,
            bed.host(&dir.join("idem-normal.db"), SyncMode::Normal)?,
        ),
        (
            Idem::SqliteFull,
            bed.host(&dir.join("idem-full.db"), SyncMode::Full)?,
        ),
    ];
    if let Some(pg) = pg {
        hosts.push((
            Idem::PostgresFull,
            postgres::host(bed, &pg.idem, SyncMode::Full)?,
        ));
    }

    // (a) The step: a run of n steps, its wall time over n.
    let mut idem_step = Vec::new();
    for (which, host) in &hosts {
        progress(&format!("  {}: {n} steps", which.label()));
        bed.steps(host, 10)?;
        let mut us = Vec::new();
        for _ in 0..turns {
            let t = Instant::now();
            bed.steps(host, n)?;
            us.push(micros(t.elapsed()) / n as f64);
        }
        let us = sorted(us);
        idem_step.push((*which, median(&us)));
        table.row(
            format!(
                "peers: {}: durable step, run of {n} (wall / {n})",
                which.label()
            ),
            "µs",
            us,
        );
    }
    let idem_of = |v: &[(Idem, f64)], which: Idem| {
        v.iter()
            .find(|(w, _)| *w == which)
            .map_or(f64::NAN, |(_, m)| *m)
    };
    for peer in &peers {
        progress(&format!("  {}: {n} steps", peer.name));
        if peer.postgres {
            run_python(
                python,
                peer.script,
                &["reset", "--db", &peer_db(peer, "")],
                &dir,
            )?;
        }
        let db = peer_db(peer, "steps");
        let mut args = vec!["steps", "--db", &db, "--n", &n_arg, "--turns", &turns_arg];
        args.extend(peer.args);
        let report = run_python(python, peer.script, &args, &dir)?;
        let us = sorted(samples(&report, "per_step_us")?);
        let ratio = idem_of(&idem_step, peer.idem) / median(&us);
        table.row_with_ratio(
            format!(
                "peers: {} ({}): durable step, run of {n} (wall / {n})",
                peer.name,
                mode(&report)
            ),
            "µs",
            us,
            format!("idem {ratio:.3}×"),
        );
    }

    // (b) One-step workflows, one after another.
    let short = plan.short;
    let short_arg = short.to_string();
    let mut idem_short = Vec::new();
    for (which, host) in &hosts {
        progress(&format!("  {}: {short} one-step runs", which.label()));
        let mut rates = Vec::new();
        for _ in 0..turns {
            let t = Instant::now();
            for _ in 0..short {
                bed.steps(host, 1)?;
            }
            rates.push(short as f64 / t.elapsed().as_secs_f64());
        }
        let rates = sorted(rates);
        idem_short.push((*which, median(&rates)));
        table.rate_row_in(
            format!("peers: {}: one-step runs, one after another", which.label()),
            "runs/s",
            rates,
            None,
        );
    }
    for peer in &peers {
        progress(&format!("  {}: {short} one-step workflows", peer.name));
        let db = peer_db(peer, "short");
        let mut args = vec![
            "short", "--db", &db, "--n", &short_arg, "--turns", &turns_arg,
        ];
        args.extend(peer.args);
        let report = run_python(python, peer.script, &args, &dir)?;
        let rates = sorted(samples(&report, "per_second")?);
        let ratio = idem_of(&idem_short, peer.idem) / median(&rates);
        table.rate_row_in(
            format!(
                "peers: {}: one-step workflows, one after another",
                peer.name
            ),
            "runs/s",
            rates,
            Some(format!("idem {ratio:.2}×")),
        );
    }

    // (c) The crash inside step kill_at, then the resume.
    let kill_at = plan.kill_at;
    let crash_what =
        format!("SIGKILL inside step {kill_at} of {n} → resumed, process start → done");
    let mut idem_crash = Vec::new();
    for policy in ["retry", "probe"] {
        progress(&format!(
            "  idem: crash and resume, in-doubt policy {policy}"
        ));
        // The resumed process starts warm: the killed one compiled the agent into the
        // cache, as a machine that ran the agent before a crash has it.
        let (mut ms, mut repeated) = (Vec::new(), Vec::new());
        for turn in 0..plan.crash_turns {
            let (took, again) = idem_crash_turn(bed, &dir, n, kill_at, policy, turn)?;
            ms.push(took);
            repeated.push(again as f64);
        }
        let ms = sorted(ms);
        idem_crash.push((policy, median(&ms)));
        let label = format!("idem, SQLite, sync full, in-doubt `{policy}`");
        table.row(format!("peers: {label}: {crash_what}"), "ms", ms);
        table.row(
            format!("peers: {label}: steps run twice"),
            "steps",
            repeated,
        );
    }
    let idem_retry = idem_crash[0].1;
    for peer in &peers {
        progress(&format!("  {}: crash and resume", peer.name));
        let (mut ms, mut repeated) = (Vec::new(), Vec::new());
        for turn in 0..plan.crash_turns {
            let (took, again) = peer_crash_turn(python, peer, &dir, pg, n, kill_at, turn)?;
            ms.push(took);
            repeated.push(again as f64);
        }
        let ms = sorted(ms);
        let ratio = idem_retry / median(&ms);
        let base = if peer.postgres {
            " (idem on SQLite: on PostgreSQL idem waits out a dead holder's lease)"
        } else {
            ""
        };
        table.row_with_ratio(
            format!("peers: {}: {crash_what}", peer.name),
            "ms",
            ms,
            format!("idem `retry` {ratio:.2}×{base}"),
        );
        table.row(
            format!("peers: {}: steps run twice", peer.name),
            "steps",
            repeated,
        );
    }
    Ok(())
}

/// The lines of the crash's side-effect file: how many, and how many distinct steps
/// (a line's first word names its step).
fn count_lines(log: &Path) -> anyhow::Result<(u64, u64)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut steps: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let total = steps.len() as u64;
    steps.sort_unstable();
    steps.dedup();
    Ok((total, steps.len() as u64))
}

/// After a resumed crash: every step's line is there; returns the steps run twice.
fn repeated(log: &Path, n: u64, who: &str) -> anyhow::Result<u64> {
    let (total, distinct) = count_lines(log)?;
    ensure!(
        distinct == n,
        "{who}: {distinct} distinct steps in {} after the resume, expected {n}",
        log.display()
    );
    Ok(total - n)
}

/// One crash of `idem run` inside step `kill_at`, and its resume by a fresh `idem run`:
/// the resume's milliseconds and the steps run twice.
fn idem_crash_turn(
    bed: &Bed,
    dir: &Path,
    n: u64,
    kill_at: u64,
    policy: &str,
    turn: usize,
) -> anyhow::Result<(f64, u64)> {
    let turn_dir = dir.join(format!("idem-crash-{policy}-{turn}"));
    let data = turn_dir.join("data");
    std::fs::create_dir_all(&data)?;
    let db = turn_dir.join("idem.db");
    let log = data.join("log");
    let run_id = fresh_run_id();
    let input = json!({
        "steps": n, "log": "/data/log", "fold": true, "policy": policy,
        "stall_at": kill_at - 1,
    })
    .to_string();
    let spawn = || -> anyhow::Result<Child> {
        Ok(Command::new(env!("CARGO_BIN_EXE_idem"))
            .arg("run")
            .arg(STEPS)
            .arg("--db")
            .arg(&db)
            .args([
                "--run-id", &run_id, "--input", &input, "--sync", "full", "--json",
            ])
            .arg("--dir")
            .arg(format!("{}::/data", data.display()))
            .env("XDG_CACHE_HOME", bed.dir.join("cache"))
            .env("IDEM_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?)
    };
    let mut first = spawn()?;
    // The agent stalls inside step kill_at once its line is synced: kill it there.
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        if count_lines(&log)?.0 >= kill_at {
            break;
        }
        if let Some(status) = first.try_wait()? {
            bail!("idem run ended ({status}) before step {kill_at}");
        }
        ensure!(
            Instant::now() < deadline,
            "idem run never reached step {kill_at}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    first.kill()?;
    first.wait()?;
    let (lines, _) = count_lines(&log)?;
    ensure!(
        lines == kill_at,
        "{lines} lines at the kill, expected {kill_at}"
    );

    let t = Instant::now();
    let out = spawn()?.wait_with_output()?;
    let took = millis(t.elapsed());
    ensure!(
        out.status.success(),
        "the resuming idem run failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((took, repeated(&log, n, "idem")?))
}

/// One crash of a peer's process inside step `kill_at` (the script kills itself once
/// the step's line is synced), and its resume by a fresh process.
fn peer_crash_turn(
    python: &Path,
    peer: &Peer,
    dir: &Path,
    pg: Option<&Postgres>,
    n: u64,
    kill_at: u64,
    turn: usize,
) -> anyhow::Result<(f64, u64)> {
    let turn_dir = dir.join(format!("{}-crash-{turn}", peer.slug));
    std::fs::create_dir_all(&turn_dir)?;
    let log = turn_dir.join("log").display().to_string();
    let db = match (peer.postgres, pg) {
        (true, Some(pg)) => {
            run_python(python, peer.script, &["reset", "--db", &pg.dbos], &turn_dir)?;
            pg.dbos.clone()
        }
        _ => turn_dir.join("peer.db").display().to_string(),
    };
    let (n_arg, kill_arg) = (n.to_string(), kill_at.to_string());
    let id = format!("crash-{turn}");
    let mut args = vec!["--db", &db, "--n", &n_arg, "--id", &id, "--log", &log];
    args.extend(peer.args);

    let mut crash = vec!["crash", "--kill-at", &kill_arg];
    crash.extend(&args);
    let out = python_command(python, peer.script, &crash, &turn_dir).output()?;
    ensure!(
        out.status.signal() == Some(SIGKILL),
        "{}: the crash run ended {} instead of by SIGKILL: {}",
        peer.name,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let (lines, _) = count_lines(Path::new(&log))?;
    ensure!(
        lines == kill_at,
        "{}: {lines} lines at the kill, expected {kill_at}",
        peer.name
    );

    let mut resume = vec!["resume"];
    resume.extend(&args);
    let t = Instant::now();
    let report = run_python(python, peer.script, &resume, &turn_dir)?;
    let took = millis(t.elapsed());
    ensure!(
        report["done"].as_u64() == Some(n),
        "{}: the resume reported {report}",
        peer.name
    );
    Ok((took, repeated(Path::new(&log), n, peer.name)?))
}
