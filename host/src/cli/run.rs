//! `idem run`: load an agent, open the store, drive one run to its end, print the
//! output and the counts.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use idem::runtime::{
    CrashPoint, DirGrant, FaultPlan, Host, HttpDestination, HttpPolicy, Limits, RunOptions,
    RunReport, Runtime, default_cache_dir,
};
use idem::store::{RunStatus, SqliteStore, SyncMode};
use sha2::{Digest, Sha256};

use super::{BadInput, Exit, args};

#[derive(Debug, Parser)]
pub struct RunCommand {
    /// The agent: a component built with `cargo build --target wasm32-wasip2`.
    agent: PathBuf,
    /// The SQLite store.
    #[arg(long, default_value = "idem.db")]
    db: PathBuf,
    /// Durability: `normal` (fast; a power loss may undo the last commits) or `full`
    /// (every commit is fsync'd).
    #[arg(long, default_value = "normal", value_parser = args::sync_mode)]
    sync: SyncMode,
    /// The run's id. Defaults to the agent's name and a hash of the input, so that the
    /// same command resumes the same run.
    #[arg(long)]
    run_id: Option<String>,
    /// The input, as JSON, or `@FILE` to read it from a file.
    #[arg(long, default_value = "null")]
    input: String,
    /// Grant a host directory to the agent: `HOST::GUEST`. Repeatable.
    #[arg(long = "dir", value_parser = args::dir_grant)]
    dirs: Vec<DirGrant>,
    /// Grant an environment variable to the agent: `K=V`. Repeatable.
    #[arg(long = "env", value_parser = args::env_var)]
    env: Vec<(String, String)>,
    /// Let the agent send HTTP requests to HOST (any port) or HOST:PORT; IPv6 in
    /// brackets. Repeatable. Without it the agent reaches no network.
    #[arg(long = "allow-http", value_name = "HOST[:PORT]")]
    allow_http: Vec<HttpDestination>,
    /// Let granted HTTP requests through even when the agent holds no claim (by
    /// default such requests are refused: side effects belong inside run-once).
    #[arg(long)]
    allow_http_outside_claims: bool,
    /// Drop the instance and start a fresh one each time it has been granted N claims.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    recycle_every: Option<u32>,
    /// Drop the instance at PHASE of step STEP: before-claim, after-claim, in-effect,
    /// after-commit or after-save. Repeatable.
    #[arg(long, value_name = "PHASE:STEP")]
    crash_at: Vec<CrashPoint>,
    /// Drop instances at random host calls and mid-computation, from this seed.
    #[arg(long, value_name = "SEED")]
    chaos: Option<u64>,
    /// How long a claim is held before another holder may take it over.
    #[arg(long, default_value = "30s", value_parser = args::duration)]
    lease: Duration,
    /// How long to wait for another holder's commit before giving up.
    #[arg(long, default_value = "60s", value_parser = args::duration)]
    await_timeout: Duration,
    /// Longest idempotency key, in bytes.
    #[arg(long, default_value = "512", value_parser = args::size)]
    max_key_bytes: usize,
    /// Largest committed result.
    #[arg(long, default_value = "1MiB", value_parser = args::size)]
    max_result_bytes: usize,
    /// Largest checkpoint state.
    #[arg(long, default_value = "1MiB", value_parser = args::size)]
    max_state_bytes: usize,
    /// Largest linear memory of an instance.
    #[arg(long, default_value = "256MiB", value_parser = args::size)]
    max_memory: usize,
    /// Most elements of an instance's table.
    #[arg(long, default_value = "100000")]
    max_table_elements: usize,
    /// Longest an instance may compute between two calls into idem.
    #[arg(long, default_value = "60s", value_parser = args::duration)]
    max_compute: Duration,
    /// Fuel (about one unit per wasm instruction) one invocation may burn; no limit by
    /// default.
    #[arg(long, value_name = "UNITS")]
    max_fuel: Option<u64>,
    /// Longest a side effect may run, from its claim to its commit.
    #[arg(long, default_value = "5m", value_parser = args::duration)]
    effect_timeout: Duration,
    /// Where precompiled agents are kept. Defaults to $XDG_CACHE_HOME/idem.
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Compile the agent every time.
    #[arg(long, conflicts_with = "cache_dir")]
    no_cache: bool,
    /// The namespace the run's keys live in. Defaults to the agent's name: runs of one
    /// agent share keys, and no other agent can read or commit them.
    #[arg(long)]
    namespace: Option<String>,
    /// Resume a run that was started with another build of the agent (recorded).
    #[arg(long)]
    upgrade: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

impl RunCommand {
    pub fn execute(self) -> anyhow::Result<Exit> {
        let input = self.read_input()?;
        let cache = if self.no_cache {
            None
        } else {
            self.cache_dir.clone().or_else(default_cache_dir)
        };
        let runtime = Runtime::new(cache)?;
        // The agent is checked before the store is opened: a bad agent changes nothing.
        let agent = runtime.load(&self.agent)?;
        let run_id = match &self.run_id {
            Some(id) => id.clone(),
            None => default_run_id(agent.name(), &input),
        };
        let opts = RunOptions {
            run_id: run_id.clone(),
            input,
            dirs: self.dirs.clone(),
            env: self.env.clone(),
            faults: FaultPlan {
                crash_at: self.crash_at.clone(),
                recycle_every: self.recycle_every,
                chaos: self.chaos,
            },
            upgrade: self.upgrade,
            namespace: self.namespace.clone(),
            http: HttpPolicy {
                allow: self.allow_http.clone(),
                outside_claims: self.allow_http_outside_claims,
            },
        };
        opts.check()?;
        let store = SqliteStore::open(&self.db, self.sync)?;
        let limits = Limits {
            lease: self.lease,
            await_timeout: self.await_timeout,
            max_key_bytes: self.max_key_bytes,
            max_result_bytes: self.max_result_bytes,
            max_state_bytes: self.max_state_bytes,
            max_memory_bytes: self.max_memory,
            max_table_elements: self.max_table_elements,
            max_compute: self.max_compute,
            max_fuel: self.max_fuel,
            effect_timeout: self.effect_timeout,
            ..Limits::default()
        };
        let host = Host::new(Arc::new(runtime), Arc::new(store), limits);
        let report = host
            .run(&agent, &opts)
            .with_context(|| format!("run {run_id}"))?;
        self.print(&report)?;
        Ok(match report.status {
            RunStatus::Completed => Exit::Done,
            RunStatus::InDoubt => Exit::InDoubt,
            RunStatus::Failed | RunStatus::Running => Exit::AgentFailed,
        })
    }

    fn read_input(&self) -> anyhow::Result<Vec<u8>> {
        let bytes = match self.input.strip_prefix('@') {
            Some(path) => std::fs::read(path)
                .map_err(|e| BadInput(format!("cannot read --input file {path}: {e}")))?,
            None => self.input.clone().into_bytes(),
        };
        serde_json::from_slice::<serde_json::Value>(&bytes)
            .map_err(|e| BadInput(format!("--input is not valid JSON: {e}")))?;
        Ok(bytes)
    }

    fn print(&self, report: &RunReport) -> anyhow::Result<()> {
        let c = &report.counts;
        let output = serde_json::from_slice::<serde_json::Value>(&report.outcome)
            .unwrap_or_else(|_| String::from_utf8_lossy(&report.outcome).into_owned().into());
        if self.json {
            let (output, error) = match report.status {
                RunStatus::Completed => (output, serde_json::Value::Null),
                _ => (serde_json::Value::Null, output),
            };
            let doc = serde_json::json!({
                "run_id": report.run_id,
                "status": report.status,
                "output": output,
                "error": error,
                "already_finished": report.already_finished,
                "instances_now": report.instances_now,
                "counts": c,
            });
            println!("{doc}");
        } else {
            let status = match (report.status, report.already_finished) {
                (RunStatus::Completed, true) => "had already completed",
                (RunStatus::Completed, false) => "completed",
                (RunStatus::InDoubt, _) => "stopped in doubt (settle it with idem resolve)",
                _ => "failed",
            };
            println!("run {} {status}", report.run_id);
            match report.status {
                RunStatus::Completed => println!("output: {output}"),
                _ => println!("error: {output}"),
            }
            println!(
                "executed {}  skipped {}  awaited {}  reclaimed {}  instances {}",
                c.executed, c.skipped, c.awaited, c.reclaimed, c.instances
            );
        }
        Ok(())
    }
}

/// `<agent>-<first 12 hex digits of SHA-256(input)>`: stable for the same agent and
/// input, so re-running a command resumes its run instead of starting another.
fn default_run_id(agent: &str, input: &[u8]) -> String {
    let digest = Sha256::digest(input);
    let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("{agent}-{hex}")
}
