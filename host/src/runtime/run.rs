//! Driving a run to its end: open it in the store, then create instances, call `run`,
//! and replace each instance the host drops, until the agent returns.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::Store as WasmStore;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

use super::Host;
use super::engine::LoadedAgent;
use super::error::HostError;
use super::faults::{FaultPlan, Faults, Recycle};
use super::http::{HttpPolicy, HttpState};
use super::limits::LimitExceeded;
use super::state::{HostCallFailure, InstanceState, RunCtx, StoppedInDoubt};
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
    /// Resume a run started with another component (the upgrade is recorded); without
    /// it, such a resume is refused.
    pub upgrade: bool,
    /// The namespace the run's keys live in; `None` keeps a resumed run's, and derives
    /// a new run's from the agent's name, so that runs of one agent share keys and
    /// other agents cannot reach them.
    pub namespace: Option<String>,
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

/// The default namespace of an agent: its name, with anything but letters, digits,
/// `.`, `_` and `-` replaced by `-`.
fn namespace_of(agent: &str) -> String {
    let namespace: String = agent
        .chars()
        .take(MAX_NAMESPACE_BYTES)
        .map(|c| if namespace_char(c) { c } else { '-' })
        .collect();
    if namespace.is_empty() {
        "agent".to_string()
    } else {
        namespace
    }
}

fn namespace_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// The longest namespace accepted.
const MAX_NAMESPACE_BYTES: usize = 64;

impl RunOptions {
    /// Checks the options without touching any store: the run id, and that every
    /// granted directory can be opened. [`Host::run`] does it too; calling it first lets
    /// a caller refuse bad options before it opens (and so writes to) a store.
    pub fn check(&self) -> Result<(), HostError> {
        check_run_id(&self.run_id)?;
        if let Some(namespace) = &self.namespace
            && (namespace.is_empty()
                || namespace.len() > MAX_NAMESPACE_BYTES
                || !namespace.chars().all(namespace_char))
        {
            return Err(HostError::InvalidNamespace {
                namespace: namespace.clone(),
            });
        }
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
        let existing = self.store.run(&opts.run_id)?;
        // A run keeps the namespace it started in; a new one takes the one asked for, or
        // the agent's name.
        let namespace = match (&opts.namespace, &existing) {
            (Some(namespace), _) => namespace.clone(),
            (None, Some(existing)) => existing.namespace.clone(),
            (None, None) => namespace_of(&agent.name),
        };
        // A run is pinned to the component it started with: another one could read its
        // checkpoint and results differently.
        if let Some(existing) = &existing
            && existing.namespace != namespace
        {
            return Err(HostError::NamespaceMismatch {
                run_id: opts.run_id.clone(),
                pinned: existing.namespace.clone(),
                given: namespace,
            });
        }
        if let Some(existing) = existing
            && existing.digest != agent.digest
        {
            if !opts.upgrade {
                return Err(HostError::Pinned {
                    run_id: opts.run_id.clone(),
                    pinned: existing.digest,
                    given: agent.digest.clone(),
                });
            }
            self.store
                .upgrade_run(&opts.run_id, &existing.digest, &agent.digest, now_millis())?;
            tracing::info!(run_id = %opts.run_id, from = %existing.digest, to = %agent.digest, "run upgraded");
        }
        let record = self.store.open_run(&RunSpec {
            run_id: &opts.run_id,
            agent: &agent.name,
            digest: &agent.digest,
            namespace: &namespace,
            input: &opts.input,
            now: now_millis(),
        })?;
        if record.status == RunStatus::InDoubt {
            let keys = self
                .store
                .open_claims(Some(&opts.run_id))?
                .into_iter()
                .filter(|c| c.parked.is_some())
                .map(|c| c.key)
                .collect();
            return Err(HostError::InDoubt {
                run_id: opts.run_id.clone(),
                keys,
            });
        }
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
            namespace,
            store: Arc::clone(&self.store),
            limits: self.limits.clone(),
            live: Arc::clone(&self.live),
            heartbeat: Arc::clone(&self.heartbeat),
            counts: record.counts,
            faults: Faults::new(&opts.faults),
            ordinals: HashMap::new(),
            last_committed: 0,
            fuel_left: self.limits.max_fuel,
            counts_flushed: std::time::Instant::now(),
        };
        let first_instance = run.counts.instances;
        loop {
            let instances_now = run.counts.instances - first_instance;
            if instances_now >= self.limits.max_instances {
                // A dropped instance's counts are otherwise written as the next one
                // starts; there is no next one.
                if instances_now > 0 {
                    self.store
                        .save_counts(&opts.run_id, &run.counts, now_millis())?;
                }
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
                Err(trap) if is_fuel_exhausted(&trap) && run.fuel_left == Some(0) => {
                    let limit = self.limits.max_fuel.unwrap_or(0);
                    Some((
                        RunStatus::Failed,
                        LimitExceeded::Fuel { limit }.to_string().into_bytes(),
                    ))
                }
                Err(trap) if is_fuel_exhausted(&trap) && run.faults.chaos() => {
                    tracing::debug!(run_id = %opts.run_id, reason = "chaos fuel budget ran out", "instance dropped");
                    None
                }
                Err(ref trap) if let Some(limit) = trap.downcast_ref::<LimitExceeded>() => {
                    // The run stops, resumable: committed steps stay, and running it again
                    // (with a larger limit, if the agent needs one) goes on from there.
                    Some((RunStatus::Failed, limit.to_string().into_bytes()))
                }
                Err(ref trap) if let Some(stopped) = trap.downcast_ref::<StoppedInDoubt>() => {
                    // The store already holds the run's in-doubt status and reason.
                    self.store
                        .save_counts(&opts.run_id, &run.counts, now_millis())?;
                    let reason = self
                        .store
                        .run(&opts.run_id)?
                        .and_then(|r| r.outcome)
                        .unwrap_or_else(|| format!("in doubt at key {}", stopped.key).into_bytes());
                    return Ok(RunReport {
                        run_id: opts.run_id.clone(),
                        status: RunStatus::InDoubt,
                        outcome: reason,
                        counts: run.counts,
                        instances_now: run.counts.instances - first_instance,
                        already_finished: false,
                    });
                }
                Err(trap) => match trap.downcast::<HostCallFailure>() {
                    Ok(HostCallFailure::Store(e)) => return Err(HostError::Store(e)),
                    // A trap the guest caused (panic, unreachable, stack overflow) is
                    // the agent's error, not the host's.
                    Err(trap) => Some((RunStatus::Failed, trap_message(&trap).into_bytes())),
                },
            };
            // A dropped instance (`None`) needs no write here: the next instance writes
            // the counts as it starts, in the one transaction a recycle needs for them.
            if let Some((status, outcome)) = ended {
                let end = match status {
                    RunStatus::Completed => RunEnd::Completed(&outcome),
                    _ => RunEnd::Failed(std::str::from_utf8(&outcome).unwrap_or("")),
                };
                self.store
                    .finish_run(&opts.run_id, end, &run.counts, now_millis())?;
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
        // Durable before the instance runs: its claims' counts are written with them,
        // a process killed now still shows the instance it had started, and the
        // counts of the instance dropped before it (if any) are written too.
        self.store
            .save_counts(&opts.run_id, &run.counts, now_millis())?;
        let holder = self.live.holder(&opts.run_id, generation);
        let chaos_fuel = run.faults.fuel_budget().unwrap_or(u64::MAX);
        let fuel = chaos_fuel.min(run.fuel_left.unwrap_or(u64::MAX));
        let state = InstanceState {
            wasi: wasi_ctx(opts)?,
            table: ResourceTable::new(),
            run,
            generation,
            holder: holder.clone(),
            grants: 0,
            last_call: Instant::now(),
            effect: None,
            http: HttpState::new(&opts.run_id, &opts.http),
        };
        let mut store = WasmStore::new(self.runtime.engine(), state);
        store.limiter(|state| state as &mut dyn wasmtime::ResourceLimiter);
        store
            .set_fuel(fuel)
            .map_err(|e| HostError::Engine(format!("{e:#}")))?;
        // Every epoch tick while wasm runs, check the wall-clock limits.
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|ctx| match ctx.data().check_time() {
            Ok(()) => Ok(wasmtime::UpdateDeadline::Continue(1)),
            Err(limit) => Err(wasmtime::Error::new(limit)),
        });
        self.live.enter(&holder);
        let result = agent
            .pre
            .instantiate(&mut store)
            .and_then(|instance| instance.call_run(&mut store, &opts.input));
        self.live.leave(&holder);
        // The host knows these claims' holder is gone: end their leases now, so that
        // whoever runs next (this process or another) retakes them without waiting.
        // They stay claims: whether their effects ran is still in doubt.
        for (key, token) in self.heartbeat.forget(&holder) {
            if let Err(e) = self.store.renew(&key, token, Duration::ZERO, now_millis()) {
                tracing::warn!(%key, error = %e, "cannot end the lease of a dropped instance's claim");
            }
        }
        let burnt = fuel.saturating_sub(store.get_fuel().unwrap_or(0));
        // The store (and with it the instance and every claim handle it held) is gone
        // here; only the run's own context goes on.
        let mut state = store.into_data();
        if let Some(left) = &mut state.run.fuel_left {
            *left = left.saturating_sub(burnt);
        }
        Ok((result, state.run))
    }
}

/// The run's error text for a trap the guest caused: the trap's cause and what it
/// usually means, without the wasm backtrace (logged at debug level instead).
fn trap_message(trap: &wasmtime::Error) -> String {
    tracing::debug!(trap = format!("{trap:?}"), "agent trapped");
    let Some(code) = trap.downcast_ref::<wasmtime::Trap>() else {
        return format!("agent trapped: {}", trap.root_cause());
    };
    let hint = match code {
        wasmtime::Trap::UnreachableCodeReached => {
            " (a Rust agent panicked: its message is on stderr)"
        }
        wasmtime::Trap::MemoryOutOfBounds => {
            " (in a Rust agent, often a stack overflow: its stack lives in linear memory)"
        }
        wasmtime::Trap::StackOverflow => " (stack overflow: the call stack is exhausted)",
        _ => "",
    };
    format!("agent trapped: {code}{hint}")
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
