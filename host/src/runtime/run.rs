//! Driving a run to its end: open it in the store, then create instances, call `run`,
//! and replace each instance the host drops, until the agent returns.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use wasmtime::Store as WasmStore;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

use super::Host;
use super::engine::LoadedAgent;
use super::error::HostError;
use super::faults::{FaultPlan, Faults, Recycle};
use super::http::{HttpPolicy, HttpState};
use super::state::{HostCallFailure, InstanceState, RunCtx};
use crate::store::{Counts, RunEnd, RunSpec, RunStatus, now_millis};

/// A host directory the agent may use, and the path it sees it under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirGrant {
    /// The directory on the host.
    pub host: PathBuf,
    /// The path the guest opens it by.
    pub guest: String,
}

/// How to drive one run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// The run's id: the same id resumes the same run.
    pub run_id: String,
    /// The input handed to `run` on every instance.
    pub input: Vec<u8>,
    /// Directories granted to the agent (nothing else of the host's file system is).
    pub dirs: Vec<DirGrant>,
    /// Environment variables granted to the agent (none by default).
    pub env: Vec<(String, String)>,
    /// Planned instance drops.
    pub faults: FaultPlan,
    /// Outbound HTTP the agent is granted (none by default).
    pub http: HttpPolicy,
}

/// How a run ended, and what it took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunReport {
    /// The run's id.
    pub run_id: String,
    /// `Completed` or `Failed`.
    pub status: RunStatus,
    /// The output bytes when completed; the error text when failed.
    pub outcome: Vec<u8>,
    /// What the run did over all its instances, including earlier invocations.
    pub counts: Counts,
    /// Instances created by this invocation.
    pub instances_now: u64,
    /// The run had ended before this invocation: nothing was executed now.
    pub already_finished: bool,
}

impl RunOptions {
    /// Checks the options without touching any store: the run id, and that every
    /// granted directory can be opened. [`Host::run`] does it too; calling it first lets
    /// a caller refuse bad options before it opens (and so writes to) a store.
    pub fn check(&self) -> Result<(), HostError> {
        check_run_id(&self.run_id)?;
        wasi_ctx(self).map(drop)
    }
}

/// The longest run id accepted.
const MAX_RUN_ID_BYTES: usize = 256;

fn check_run_id(run_id: &str) -> Result<(), HostError> {
    let reason = if run_id.is_empty() {
        Some("it is empty".to_string())
    } else if run_id.len() > MAX_RUN_ID_BYTES {
        Some(format!("it is over {MAX_RUN_ID_BYTES} bytes"))
    } else if run_id.chars().any(|c| c.is_control() || c == '/') {
        Some("it holds '/' or a control character".to_string())
    } else {
        None
    };
    match reason {
        Some(reason) => Err(HostError::InvalidRunId {
            run_id: run_id.to_string(),
            reason,
        }),
        None => Ok(()),
    }
}

impl Host {
    /// Drives run `opts.run_id` of `agent` to its end, resuming it from the store if it
    /// was started before. A run that already ended is reported as it ended.
    pub fn run(&self, agent: &LoadedAgent, opts: &RunOptions) -> Result<RunReport, HostError> {
        opts.check()?;
        let record = self.store.open_run(&RunSpec {
            run_id: &opts.run_id,
            agent: &agent.name,
            digest: &agent.digest,
            input: &opts.input,
            now: now_millis(),
        })?;
        if record.status == RunStatus::Completed {
            return Ok(RunReport {
                run_id: record.run_id,
                status: record.status,
                outcome: record.outcome.unwrap_or_default(),
                counts: record.counts,
                instances_now: 0,
                already_finished: true,
            });
        }

        let mut run = RunCtx {
            run_id: opts.run_id.clone(),
            store: Arc::clone(&self.store),
            limits: self.limits.clone(),
            live: Arc::clone(&self.live),
            counts: record.counts,
            faults: Faults::new(&opts.faults),
            ordinals: HashMap::new(),
            last_committed: 0,
        };
        let first_instance = run.counts.instances;
        loop {
            let instances_now = run.counts.instances - first_instance;
            if instances_now >= self.limits.max_instances {
                return Err(HostError::TooManyInstances {
                    run_id: opts.run_id.clone(),
                    instances: instances_now,
                });
            }
            let (result, back) = self.instance(agent, opts, run)?;
            run = back;
            let ended = match result {
                Ok(Ok(output)) => Some((RunStatus::Completed, output)),
                Ok(Err(message)) => Some((RunStatus::Failed, message.into_bytes())),
                Err(ref trap) if let Some(drop) = trap.downcast_ref::<Recycle>() => {
                    tracing::debug!(run_id = %opts.run_id, reason = %drop.reason, "instance dropped");
                    None
                }
                Err(trap) if is_fuel_exhausted(&trap) && run.faults.chaos() => {
                    tracing::debug!(run_id = %opts.run_id, reason = "chaos fuel budget ran out", "instance dropped");
                    None
                }
                Err(trap) => match trap.downcast::<HostCallFailure>() {
                    Ok(HostCallFailure::Store(e)) => return Err(HostError::Store(e)),
                    // A trap the guest caused (panic, unreachable, stack overflow) is
                    // the agent's error, not the host's.
                    Err(trap) => Some((
                        RunStatus::Failed,
                        format!("agent trapped: {trap:#}").into_bytes(),
                    )),
                },
            };
            let now = now_millis();
            match ended {
                None => {
                    self.store.save_counts(&opts.run_id, &run.counts, now)?;
                }
                Some((status, outcome)) => {
                    let end = match status {
                        RunStatus::Completed => RunEnd::Completed(&outcome),
                        _ => RunEnd::Failed(std::str::from_utf8(&outcome).unwrap_or("")),
                    };
                    self.store.finish_run(&opts.run_id, end, &run.counts, now)?;
                    return Ok(RunReport {
                        run_id: opts.run_id.clone(),
                        status,
                        outcome,
                        counts: run.counts,
                        instances_now: run.counts.instances - first_instance,
                        already_finished: false,
                    });
                }
            }
        }
    }

    /// Creates one instance for `run`, calls `run` on it, and drops it. Returns the
    /// call's result and the run context, taken back out of the dropped store.
    #[allow(clippy::type_complexity)]
    fn instance(
        &self,
        agent: &LoadedAgent,
        opts: &RunOptions,
        mut run: RunCtx,
    ) -> Result<(wasmtime::Result<Result<Vec<u8>, String>>, RunCtx), HostError> {
        let generation = run.counts.instances;
        run.counts.instances += 1;
        let holder = self.live.holder(&opts.run_id, generation);
        let fuel = run.faults.fuel_budget().unwrap_or(u64::MAX);
        let state = InstanceState {
            wasi: wasi_ctx(opts)?,
            table: ResourceTable::new(),
            run,
            generation,
            holder: holder.clone(),
            grants: 0,
            http: HttpState::new(&opts.run_id, &opts.http),
        };
        let mut store = WasmStore::new(self.runtime.engine(), state);
        store
            .set_fuel(fuel)
            .map_err(|e| HostError::Engine(format!("{e:#}")))?;
        self.live.enter(&holder);
        let result = agent
            .pre
            .instantiate(&mut store)
            .and_then(|instance| instance.call_run(&mut store, &opts.input));
        self.live.leave(&holder);
        // The store (and with it the instance and every claim handle it held) is gone
        // here; only the run's own context goes on.
        let state = store.into_data();
        Ok((result, state.run))
    }
}

fn is_fuel_exhausted(trap: &wasmtime::Error) -> bool {
    trap.downcast_ref::<wasmtime::Trap>() == Some(&wasmtime::Trap::OutOfFuel)
}

/// WASI for one instance: no ambient authority — only the granted directories and
/// environment, no network, no stdin; the agent's stderr goes to the host's stderr.
fn wasi_ctx(opts: &RunOptions) -> Result<wasmtime_wasi::WasiCtx, HostError> {
    let mut builder = WasiCtxBuilder::new();
    builder.inherit_stderr();
    for (k, v) in &opts.env {
        builder.env(k, v);
    }
    for dir in &opts.dirs {
        builder
            .preopened_dir(&dir.host, &dir.guest, FsPerms::ReadWrite)
            .map_err(|e| HostError::Grant {
                host: dir.host.clone(),
                guest: dir.guest.clone(),
                reason: format!("{e:#}"),
            })?;
    }
    Ok(builder.build())
}
