//! Putting a foreground run in the store: the agent's component (once per host), its
//! deployment under the run's namespace, the run pinned to its component (or upgraded,
//! when asked), and the run submitted.

use std::collections::HashSet;
use std::sync::PoisonError;

use super::engine::LoadedAgent;
use super::error::HostError;
use super::host::Host;
use super::names::namespace_of;
use super::options::RunOptions;
use crate::store::{Admission, Deployment, RunRecord, StoreError, Submission};
use crate::text;

impl Host {
    /// Deploys the agent under the run's namespace (upgrading the run to it if asked)
    /// and submits the run; returns the run as it stands.
    pub(super) async fn submit_foreground(
        &self,
        agent: &LoadedAgent,
        opts: &RunOptions,
    ) -> Result<RunRecord, HostError> {
        let existing = self.store.run(&opts.run_id).await?;
        let name = namespace_for(agent, opts, existing.as_ref())?;
        let upgrade_from = upgrade_from(agent, opts, existing.as_ref())?;
        let authority = opts.authority.encode();
        let deployment = Deployment {
            name: &name,
            digest: &agent.digest,
            authority: &authority,
            admission: if opts.upgrade {
                Admission::Explicit
            } else {
                Admission::FirstUse
            },
        };
        self.deploy(agent, &deployment).await?;
        if let Some(from) = upgrade_from {
            self.store
                .upgrade_run(&opts.run_id, &from, &agent.digest)
                .await?;
            tracing::info!(run_id = %text::escape(&opts.run_id, false), %from, to = %agent.digest, "run upgraded");
        }
        let submitted = self
            .store
            .submit(&Submission {
                run_id: &opts.run_id,
                agent: &name,
                digest: &agent.digest,
                namespace: &name,
                input: &opts.input,
                authority: &authority,
                replace_authority: true,
            })
            .await?;
        Ok(submitted.record)
    }

    /// Deploys the agent, its component put in the store first.
    async fn deploy(
        &self,
        agent: &LoadedAgent,
        deployment: &Deployment<'_>,
    ) -> Result<(), HostError> {
        self.store_component(agent).await?;
        match self.store.deploy(deployment).await {
            // Removed from the store since this host put it there: put it back.
            Err(StoreError::UnknownComponent { .. }) => {
                self.forget_component(agent);
                self.store_component(agent).await?;
                self.store.deploy(deployment).await?;
            }
            other => drop(other?),
        }
        Ok(())
    }

    /// Puts the agent's component in the store unless this host already did or the
    /// store holds it; only then are the agent's bytes read (the cache may have loaded
    /// the agent without reading its file).
    async fn store_component(&self, agent: &LoadedAgent) -> Result<(), HostError> {
        let known = |stored: &HashSet<String>| stored.contains(&agent.digest);
        if known(&self.stored.lock().unwrap_or_else(PoisonError::into_inner)) {
            return Ok(());
        }
        if !self.store.has_component(&agent.digest).await? {
            self.store
                .put_component(&agent.digest, agent.bytes.get()?)
                .await?;
        }
        self.stored
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(agent.digest.clone());
        Ok(())
    }

    fn forget_component(&self, agent: &LoadedAgent) {
        self.stored
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&agent.digest);
    }
}

/// The namespace the run's keys live in: a run keeps the one it started in; a new one
/// takes the one asked for, or the agent's name.
fn namespace_for(
    agent: &LoadedAgent,
    opts: &RunOptions,
    existing: Option<&RunRecord>,
) -> Result<String, HostError> {
    Ok(match (&opts.namespace, existing) {
        (Some(namespace), Some(existing)) if *namespace != existing.namespace => {
            return Err(HostError::NamespaceMismatch {
                run_id: opts.run_id.clone(),
                pinned: existing.namespace.clone(),
                given: namespace.clone(),
            });
        }
        (Some(namespace), _) => namespace.clone(),
        (None, Some(existing)) => existing.namespace.clone(),
        (None, None) => namespace_of(&agent.name),
    })
}

/// The component the run is upgraded from, if it started with another one. A run is
/// pinned to the component it started with (another one could read its checkpoint and
/// results differently), unless the upgrade is asked for.
fn upgrade_from(
    agent: &LoadedAgent,
    opts: &RunOptions,
    existing: Option<&RunRecord>,
) -> Result<Option<String>, HostError> {
    match existing {
        Some(existing) if existing.digest != agent.digest => {
            if !opts.upgrade {
                return Err(HostError::Pinned {
                    run_id: opts.run_id.clone(),
                    pinned: existing.digest.clone(),
                    given: agent.digest.clone(),
                });
            }
            Ok(Some(existing.digest.clone()))
        }
        _ => Ok(None),
    }
}
