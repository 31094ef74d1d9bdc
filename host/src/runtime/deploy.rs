//! Putting a foreground run in the store: the agent's component (once per host), its
//! deployment under the run's namespace, the run pinned to its component (or upgraded,
//! when asked or when it is a rebuild of the same local file), and the run submitted.
//!
//! **The dev loop.** A person edits an agent, builds it and runs the file again: each
//! build is another component, which a namespace would refuse. A run of a local file
//! records where the file is ([`local_source`]: this machine and the file's canonical
//! path, for a file that only its owner can change); a later build from that same
//! source, into a name whose current deployment came from it, is taken as a rebuild —
//! admitted to the namespace ([`Admission::Rebuild`]) and the run it resumes upgraded,
//! both recorded and reported ([`Rebuilt`]). Any other component is still refused: it
//! would have to be written at that very path, by whoever can write it.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, PoisonError};

use super::engine::LoadedAgent;
use super::error::HostError;
use super::host::Host;
use super::names::namespace_of;
use super::options::RunOptions;
use super::report::Rebuilt;
use crate::store::{
    Admission, Deployment, DeploymentRecord, InFlight, Rollout, RunRecord, Store, StoreError,
    Submission,
};
use crate::text;

impl Host {
    /// Deploys the agent under the run's namespace (upgrading the run to it if asked,
    /// or if it is a rebuild) and submits the run; returns the run as it stands, and
    /// what a rebuild changed.
    pub(super) async fn submit_foreground(
        &self,
        agent: &LoadedAgent,
        opts: &RunOptions,
    ) -> Result<(RunRecord, Option<Rebuilt>), HostError> {
        let existing = self.store.run(&opts.run_id).await?;
        let name = namespace_for(agent, opts, existing.as_ref())?;
        let current = self.store.deployment(&name).await?;
        let rebuild = is_rebuild(current.as_ref(), opts);
        let upgrade_from = upgrade_from(agent, opts, existing.as_ref(), rebuild)?;
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
            source: opts.source.as_deref(),
        };
        self.deploy(agent, &deployment).await?;
        if let Some(from) = &upgrade_from {
            self.store
                .upgrade_run(&opts.run_id, from, &agent.digest)
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
                priority: 0,
            })
            .await?;
        let previous = current.map(|c| c.digest).filter(|d| *d != agent.digest);
        let rebuilt =
            (rebuild && (previous.is_some() || upgrade_from.is_some())).then_some(Rebuilt {
                namespace: name,
                previous,
                run_upgraded_from: upgrade_from,
            });
        Ok((submitted.record, rebuilt))
    }

    /// Deploys the agent, its component put in the store first.
    async fn deploy(
        &self,
        agent: &LoadedAgent,
        deployment: &Deployment<'_>,
    ) -> Result<(), HostError> {
        self.store_component(agent).await?;
        // Recorded with the deployment, so that a later upgrade of its runs can tell a
        // build of another agent (`idem upgrade`).
        let exports = agent.exports();
        let rollout = Rollout {
            in_flight: InFlight::Pin,
            exports: Some(&exports),
        };
        match self.store.deploy_version(deployment, &rollout).await {
            // Removed from the store since this host put it there: put it back.
            Err(StoreError::UnknownComponent { .. }) => {
                self.forget_component(agent);
                self.store_component(agent).await?;
                self.store.deploy_version(deployment, &rollout).await?;
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

    /// The component `digest` as the store holds it, checked and compiled (or loaded
    /// from the cache): what a worker runs a leased run with, and a foreground run
    /// whose version an operator changed. `name` is the agent's, for messages.
    pub(crate) async fn load_stored(
        &self,
        digest: &str,
        name: &str,
    ) -> Result<LoadedAgent, HostError> {
        load_stored(self.runtime(), self.store().as_ref(), digest, name).await
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

/// Whether this run is of a new build of the local file the name's current deployment
/// came from (by a first use or a rebuild, never by an operator's deployment): then it
/// may take the name's namespace and resume runs without `upgrade`.
fn is_rebuild(current: Option<&DeploymentRecord>, opts: &RunOptions) -> bool {
    !opts.upgrade
        && opts.source.is_some()
        && current.is_some_and(|current| {
            matches!(current.admission, Admission::FirstUse | Admission::Rebuild)
                && current.source == opts.source
        })
}

/// The component the run is upgraded from, if it started with another one. A run is
/// pinned to the component it started with (another one could read its checkpoint and
/// results differently), unless the upgrade is asked for or the component is a rebuild
/// of the same local file.
fn upgrade_from(
    agent: &LoadedAgent,
    opts: &RunOptions,
    existing: Option<&RunRecord>,
    rebuild: bool,
) -> Result<Option<String>, HostError> {
    match existing {
        Some(existing) if existing.digest != agent.digest => {
            if !opts.upgrade && !rebuild {
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

/// Where an agent file comes from, for [`RunOptions::source`]: this machine's id and
/// the file's canonical path. `None` — no rebuild will follow it implicitly — when the
/// path cannot be resolved, or when the file or its folder is not the user's own or
/// others may write to it: whoever can put a file there could otherwise slip another
/// component into the namespace as a "rebuild".
///
/// ```no_run
/// let source = idem::runtime::local_source(std::path::Path::new("target/mailer.wasm"));
/// ```
pub fn local_source(path: &Path) -> Option<String> {
    let path = std::fs::canonicalize(path).ok()?;
    let user = rustix::process::geteuid().as_raw();
    let private = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|meta| meta.uid() == user && meta.mode() & 0o022 == 0)
    };
    if !private(&path) || !private(path.parent()?) {
        return None;
    }
    Some(format!("{}:{}", machine_id(), path.to_str()?))
}

/// This machine, as the store names the sources of local files: a PostgreSQL store is
/// shared by machines, and one path on two of them is two files.
fn machine_id() -> String {
    [
        "/etc/machine-id",
        "/var/lib/dbus/machine-id",
        "/proc/sys/kernel/hostname",
    ]
    .iter()
    .find_map(|file| {
        let id = std::fs::read_to_string(file).ok()?;
        let id = id.trim();
        (!id.is_empty()).then(|| id.to_string())
    })
    .unwrap_or_else(|| "this-machine".to_string())
}

/// The component `digest` as `store` holds it, checked against its digest and compiled
/// (or loaded from the cache) off the executor's threads: [`Host::load_stored`], and an
/// upgrade's rehearsal, which has a runtime and a store but no host.
pub(crate) async fn load_stored(
    runtime: &Arc<super::Runtime>,
    store: &dyn Store,
    digest: &str,
    name: &str,
) -> Result<LoadedAgent, HostError> {
    let bytes = store
        .component(digest)
        .await?
        .ok_or_else(|| StoreError::UnknownComponent {
            digest: digest.to_string(),
        })?;
    let runtime = Arc::clone(runtime);
    let (digest_owned, name) = (digest.to_string(), name.to_string());
    // Compiling takes a core for a while: off the executor's threads.
    let agent = tokio::task::spawn_blocking(move || {
        let path = std::path::PathBuf::from(format!("component {digest_owned}"));
        runtime.load_owned(&path, &name, bytes)
    })
    .await
    .map_err(|e| HostError::Engine(format!("compiling a component failed: {e}")))??;
    if agent.digest() != digest {
        // The store handed back other bytes than the digest names: refuse them.
        return Err(HostError::Engine(format!(
            "the store's component {digest} hashes to {}",
            agent.digest()
        )));
    }
    Ok(agent)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// A file only its owner can change has a source; one that others could replace
    /// (itself or through its folder) has none, so no rebuild follows it implicitly.
    #[test]
    fn only_a_file_its_owner_alone_can_change_has_a_source() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("agent.wasm");
        std::fs::write(&file, b"\0asm").unwrap();
        let mode = |path: &Path, mode: u32| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        mode(dir.path(), 0o755);
        mode(&file, 0o644);
        let source = local_source(&file).expect("a private file has a source");
        let canonical = std::fs::canonicalize(&file).unwrap();
        assert!(
            source.ends_with(&format!(":{}", canonical.display())),
            "{source}"
        );
        // The same file reached another way is the same source.
        let dotted = dir.path().join(".").join("agent.wasm");
        assert_eq!(local_source(&dotted).as_deref(), Some(source.as_str()));

        mode(&file, 0o664);
        assert_eq!(local_source(&file), None, "a file the group can write");
        mode(&file, 0o644);
        mode(dir.path(), 0o777);
        assert_eq!(local_source(&file), None, "a folder anyone can write");
        mode(dir.path(), 0o755);
        assert_eq!(local_source(&dir.path().join("missing.wasm")), None);
    }
}
