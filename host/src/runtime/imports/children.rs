//! `idem:agent/children`: spawning child runs exactly once (one at a time, or many in
//! one write), and joining them in a durable wait. A join that is not over ends the
//! instance with a [`Suspend`] trap, as a wait does; the run holds nothing until its
//! children's ends make it due.

use std::time::Duration;

use tracing::Instrument;

use crate::runtime::bindings::idem::agent::children::{
    ChildEnd, ChildStatus, Host, JoinError, SpawnError, SpawnRequest as WitSpawnRequest,
};
use crate::runtime::end::{Suspend, trap_store};
use crate::runtime::faults::Phase;
use crate::runtime::view::IdemCtxView;
use crate::store::{
    ChildSpec, JoinMode, JoinRefusal, JoinRequest, RunStatus, SpawnBatch, SpawnLimits,
    SpawnRefusal, SpawnRequest, StoreError, WaitState, child_run_id,
};
use crate::text;

impl Host for IdemCtxView<'_> {
    async fn spawn(
        &mut self,
        key: String,
        deployment: String,
        input: Vec<u8>,
        detached: bool,
    ) -> wasmtime::Result<Result<String, SpawnError>> {
        self.ctx.enter()?;
        let limits = &self.ctx.run.limits;
        if let Err(reason) = limits.check_key(&key) {
            return Ok(Err(SpawnError::InvalidKey(reason)));
        }
        if input.len() > limits.max_state_bytes {
            return Ok(Err(SpawnError::TooLarge(format!(
                "the child's input is {} bytes, over the limit of {} bytes",
                input.len(),
                limits.max_state_bytes
            ))));
        }
        let spawn_limits = SpawnLimits {
            max_depth: u32::try_from(limits.max_depth).unwrap_or(u32::MAX),
            max_children: u32::try_from(limits.max_children).unwrap_or(u32::MAX),
        };
        // Spawns are numbered apart from claims: "\0" never begins an agent's key.
        let ordinal = self.ctx.run.ordinal(&format!("\0spawn\0{key}"));
        self.ctx.fault(Phase::BeforeSpawn, ordinal)?;
        let run = &self.ctx.run;
        let child_id = child_run_id(run.run_id(), &key);
        let req = SpawnRequest {
            fence: &run.fence,
            key: &key,
            child_id: &child_id,
            deployment: &deployment,
            input: &input,
            detached,
            limits: spawn_limits,
        };
        let span = tracing::debug_span!(
            "idem.spawn",
            key = %text::escape(&key, false),
            child = %text::escape(&child_id, false),
        );
        let _entered = span.enter();
        match run.store.spawn(&req).await {
            Ok(spawned) => {
                tracing::debug!(created = spawned.created, "spawned");
                self.ctx.fault(Phase::AfterSpawn, ordinal)?;
                Ok(Ok(spawned.run_id))
            }
            Err(StoreError::SpawnRefused { refusal, .. }) => Ok(Err(spawn_error(refusal))),
            Err(e) => Err(trap_store(e)),
        }
    }

    async fn spawn_many(
        &mut self,
        requests: Vec<WitSpawnRequest>,
    ) -> wasmtime::Result<Vec<Result<String, SpawnError>>> {
        self.ctx.enter()?;
        let limits = self.ctx.run.limits.clone();
        let spawn_limits = SpawnLimits {
            max_depth: u32::try_from(limits.max_depth).unwrap_or(u32::MAX),
            max_children: u32::try_from(limits.max_children).unwrap_or(u32::MAX),
        };
        if requests.len() > limits.max_children {
            // More than the run may ever spawn: refused whole, before any is recorded.
            let refusal = SpawnRefusal::TooMany {
                count: spawn_limits.max_children,
            };
            return Ok(requests
                .iter()
                .map(|_| Err(spawn_error(refusal.clone())))
                .collect());
        }
        // The answers in order; a request the host refuses itself is answered here and
        // not sent to the store.
        let mut answers: Vec<Option<Result<String, SpawnError>>> = Vec::new();
        let mut asked = Vec::new();
        for request in &requests {
            let refused = if let Err(reason) = limits.check_key(&request.key) {
                Some(SpawnError::InvalidKey(reason))
            } else if request.input.len() > limits.max_state_bytes {
                Some(SpawnError::TooLarge(format!(
                    "the child's input is {} bytes, over the limit of {} bytes",
                    request.input.len(),
                    limits.max_state_bytes
                )))
            } else {
                None
            };
            match refused {
                Some(refused) => answers.push(Some(Err(refused))),
                None => {
                    answers.push(None);
                    let ordinal = self.ctx.run.ordinal(&format!("\0spawn\0{}", request.key));
                    asked.push((
                        answers.len() - 1,
                        ordinal,
                        child_run_id(self.ctx.run.run_id(), &request.key),
                    ));
                }
            }
        }
        for &(_, ordinal, _) in &asked {
            self.ctx.fault(Phase::BeforeSpawn, ordinal)?;
        }
        let run = &self.ctx.run;
        let children: Vec<ChildSpec<'_>> = asked
            .iter()
            .map(|(at, _, child_id)| {
                let request = &requests[*at];
                ChildSpec {
                    key: &request.key,
                    child_id,
                    deployment: &request.deployment,
                    input: &request.input,
                    detached: request.detached,
                }
            })
            .collect();
        let batch = SpawnBatch {
            fence: &run.fence,
            children: &children,
            limits: spawn_limits,
        };
        let span = tracing::debug_span!("idem.spawn_many", children = children.len());
        let stored = async {
            if children.is_empty() {
                return Ok(Vec::new());
            }
            run.store.spawn_many(&batch).await
        }
        .instrument(span)
        .await
        .map_err(trap_store)?;
        if stored.len() != asked.len() {
            return Err(trap_store(StoreError::Backend {
                op: "spawn child runs",
                source: format!(
                    "the store answered {} of {} spawns",
                    stored.len(),
                    asked.len()
                )
                .into(),
            }));
        }
        let created = stored
            .iter()
            .filter(|a| a.as_ref().is_ok_and(|s| s.created))
            .count();
        tracing::debug!(asked = asked.len(), created, "spawned");
        for ((at, ordinal, _), answer) in asked.iter().zip(stored) {
            if answer.is_ok() {
                self.ctx.fault(Phase::AfterSpawn, *ordinal)?;
            }
            answers[*at] = Some(answer.map(|s| s.run_id).map_err(spawn_error));
        }
        Ok(answers.into_iter().flatten().collect())
    }

    async fn join_all(
        &mut self,
        key: String,
        children: Vec<String>,
        timeout_ms: Option<u64>,
    ) -> wasmtime::Result<Result<Option<Vec<ChildEnd>>, JoinError>> {
        Ok(self
            .join(key, children, timeout_ms, JoinMode::All)
            .await?
            .map(|ends| ends.map(|ends| ends.into_iter().map(child_end).collect())))
    }

    async fn join_any(
        &mut self,
        key: String,
        children: Vec<String>,
        timeout_ms: Option<u64>,
    ) -> wasmtime::Result<Result<Option<ChildEnd>, JoinError>> {
        Ok(self
            .join(key, children, timeout_ms, JoinMode::Any)
            .await?
            .map(|ends| ends.and_then(|ends| ends.into_iter().next().map(child_end))))
    }
}

impl IdemCtxView<'_> {
    /// A join of `mode`: the children's ends once it is over (`None` if it timed out),
    /// or a refusal; a trap that suspends the run while it is not over.
    async fn join(
        &mut self,
        key: String,
        children: Vec<String>,
        timeout_ms: Option<u64>,
        mode: JoinMode,
    ) -> wasmtime::Result<Result<Option<Vec<crate::store::ChildEnd>>, JoinError>> {
        self.ctx.enter()?;
        if let Err(reason) = self.ctx.run.limits.check_key(&key) {
            return Ok(Err(JoinError::InvalidKey(reason)));
        }
        if !self.ctx.held.is_empty() {
            let keys: Vec<String> = self.ctx.held.iter().map(|(k, _)| text::quoted(k)).collect();
            return Ok(Err(JoinError::ClaimsHeld(format!(
                "this instance holds claims on {}: commit or release them before joining",
                keys.join(", ")
            ))));
        }
        let ordinal = self.ctx.run.ordinal(&format!("\0join\0{key}"));
        self.ctx.fault(Phase::BeforeJoin, ordinal)?;
        let run = &self.ctx.run;
        let req = JoinRequest {
            fence: &run.fence,
            key: &key,
            children: &children,
            mode,
            timeout: timeout_ms.map(Duration::from_millis),
            max_children: u32::try_from(run.limits.max_children).unwrap_or(u32::MAX),
        };
        match run.store.join(&req).await {
            Ok(WaitState::Joined(ends)) => {
                self.ctx.fault(Phase::AfterJoin, ordinal)?;
                Ok(Ok(Some(ends)))
            }
            Ok(WaitState::Pending { due }) => Err(wasmtime::Error::new(Suspend {
                due,
                signal: None,
                join: Some(key),
            })),
            // A join is never a sleep nor a signal: anything else is its timeout.
            Ok(WaitState::TimedOut | WaitState::Elapsed | WaitState::Received(_)) => Ok(Ok(None)),
            Err(StoreError::JoinRefused { refusal, .. }) => Ok(Err(join_error(refusal))),
            Err(e) => Err(trap_store(e)),
        }
    }
}

fn spawn_error(refusal: SpawnRefusal) -> SpawnError {
    let text = refusal.to_string();
    match refusal {
        SpawnRefusal::UnknownDeployment(_) => SpawnError::UnknownDeployment(text),
        SpawnRefusal::KeyReused { .. } => SpawnError::KeyReused(text),
        SpawnRefusal::TooDeep { .. } | SpawnRefusal::TooMany { .. } => SpawnError::Limit(text),
        SpawnRefusal::Cycle { .. } => SpawnError::Cycle(text),
    }
}

fn join_error(refusal: JoinRefusal) -> JoinError {
    let text = refusal.to_string();
    match refusal {
        JoinRefusal::NoChildren | JoinRefusal::TooMany { .. } | JoinRefusal::Repeated(_) => {
            JoinError::InvalidChildren(text)
        }
        JoinRefusal::NotAChild(child) => JoinError::NotAChild(child),
        JoinRefusal::KeyReused(_) => JoinError::KeyReused(text),
        JoinRefusal::InvalidTime(_) => JoinError::InvalidTime(text),
    }
}

fn child_end(end: crate::store::ChildEnd) -> ChildEnd {
    ChildEnd {
        index: end.index,
        run_id: end.run_id,
        status: match end.status {
            RunStatus::Completed => ChildStatus::Completed,
            RunStatus::Cancelled => ChildStatus::Cancelled,
            _ => ChildStatus::Failed,
        },
        output: end.outcome,
    }
}
