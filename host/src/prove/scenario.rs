//! One scenario in this process: a scratch directory with a fresh store and a fresh
//! copy of every granted directory, the run driven there to its end (the host resumes
//! the instances it drops by itself), and what it left observed.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::ProveError;
use super::capture::Recorder;
use super::check::{Ended, Files, Observation};
use super::observe::{Event, ObservedInstance, StandIn};
use crate::runtime::{
    Authority, DirGrant, Echo, FaultPlan, Host, LoadedAgent, RunOptions, Runtime, StopSignal,
};
use crate::store::{OpenOptions, Overlay, RunFilter, RunStatus, SqliteStore, Store, StoreError};

/// The child runs `run_id` left in `store`: the key each was spawned under, and its id,
/// oldest first.
pub(crate) async fn children(
    store: &dyn Store,
    run_id: &str,
) -> Result<Vec<(String, String)>, StoreError> {
    let mut kids: Vec<(String, String)> = store
        .runs(&RunFilter {
            parent: Some(run_id),
            ..RunFilter::default()
        })
        .await?
        .into_iter()
        .map(|r| (r.spawn_key.unwrap_or_default(), r.run_id))
        .collect();
    kids.reverse();
    Ok(kids)
}

/// A scratch directory: the store at `idem.db`, each grant's copy under `grants/N`.
pub(crate) struct Scratch {
    pub(crate) dir: tempfile::TempDir,
    /// The run's authority, its directories replaced by the copies.
    pub(crate) authority: Authority,
}

impl Scratch {
    /// A new scratch directory under `root`, with a copy of each directory `authority`
    /// grants.
    pub(crate) fn new(root: &Path, authority: &Authority) -> Result<Scratch, ProveError> {
        let dir = tempfile::Builder::new()
            .prefix("idem-prove-")
            .tempdir_in(root)
            .map_err(|source| ProveError::Scratch {
                path: root.to_path_buf(),
                source,
            })?;
        let mut authority = authority.clone();
        for (i, grant) in authority.dirs.iter_mut().enumerate() {
            let copy = dir.path().join("grants").join(i.to_string());
            copy_dir(&grant.host, &copy)?;
            grant.host = copy;
        }
        Ok(Scratch { dir, authority })
    }

    pub(crate) fn db(&self) -> PathBuf {
        self.dir.path().join("idem.db")
    }

    /// Every file in the granted copies, by the path the agent sees.
    pub(crate) fn files(&self) -> Result<Files, ProveError> {
        let mut files = Files::new();
        for grant in &self.authority.dirs {
            snapshot(grant, &grant.host, &mut files)?;
        }
        Ok(files)
    }
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> ProveError + '_ {
    move |source| ProveError::Scratch {
        path: path.to_path_buf(),
        source,
    }
}

/// Copies a directory tree. Symbolic links are not followed (an agent sees none the
/// host would follow), and are left out.
fn copy_dir(from: &Path, to: &Path) -> Result<(), ProveError> {
    std::fs::create_dir_all(to).map_err(io_error(to))?;
    for entry in std::fs::read_dir(from).map_err(io_error(from))? {
        let entry = entry.map_err(io_error(from))?;
        let kind = entry.file_type().map_err(io_error(from))?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target).map_err(io_error(&target))?;
        }
    }
    Ok(())
}

fn snapshot(grant: &DirGrant, dir: &Path, files: &mut Files) -> Result<(), ProveError> {
    for entry in std::fs::read_dir(dir).map_err(io_error(dir))? {
        let entry = entry.map_err(io_error(dir))?;
        let kind = entry.file_type().map_err(io_error(dir))?;
        let path = entry.path();
        if kind.is_dir() {
            snapshot(grant, &path, files)?;
        } else if kind.is_file() {
            let bytes = std::fs::read(&path).map_err(io_error(&path))?;
            let rel = path.strip_prefix(&grant.host).unwrap_or(&path);
            let shown = format!(
                "{}/{}",
                grant.guest.trim_end_matches('/'),
                rel.to_string_lossy()
            );
            files.insert(shown, bytes);
        }
    }
    Ok(())
}

/// What a scenario run in this process needs.
pub(crate) struct InProcess<'a> {
    pub(crate) runtime: &'a Arc<Runtime>,
    pub(crate) agent: &'a LoadedAgent,
    pub(crate) run_id: &'a str,
    pub(crate) input: &'a [u8],
    pub(crate) namespace: Option<&'a str>,
}

impl InProcess<'_> {
    /// Runs the agent once in `scratch` with `faults`, its HTTP answered by `capture`.
    pub(crate) async fn run(
        &self,
        scratch: &Scratch,
        faults: FaultPlan,
        capture: Arc<Recorder>,
    ) -> Result<Observation, ProveError> {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open_with(
            &scratch.db(),
            &OpenOptions::default(),
        )?);
        let stop = StopSignal::new();
        let stand_in = StandIn {
            store: Arc::clone(&store),
            digest: self.agent.digest().to_string(),
            bytes: Arc::new(self.agent.bytes()?.to_vec()),
        };
        let observed = Arc::new(ObservedInstance::new(
            Arc::clone(&store) as _,
            stand_in,
            stop.clone(),
        ));
        let host = Host::new(
            Arc::clone(self.runtime),
            Arc::new(Overlay::new(Arc::clone(&store)).with_instance(Arc::clone(&observed) as _)),
        )?;
        let opts = RunOptions {
            run_id: self.run_id.to_string(),
            input: self.input.to_vec(),
            authority: scratch.authority.clone(),
            faults,
            upgrade: false,
            namespace: self.namespace.map(str::to_string),
            capture: Some(Arc::clone(&capture) as _),
            echo: Echo::Off,
            stop: Some(stop),
            source: None,
        };
        let result = host.run(self.agent, &opts).await;
        let events = observed.events();
        // The join the run stopped in, if its last join was not over.
        let awaiting = events.iter().rev().find_map(|e| match e {
            Event::Join { key, pending } => Some((key.clone(), *pending)),
            _ => None,
        });
        let (ended, instances, reclaimed) = match result {
            Ok(report) => {
                let ended = match (report.status, awaiting) {
                    (RunStatus::Completed, _) => Ended::Completed(report.outcome),
                    (_, Some((key, true))) if report.waiting.is_some() => {
                        Ended::AwaitingChildren(key)
                    }
                    (status, _) => Ended::Not(format!(
                        "{status}: {}",
                        String::from_utf8_lossy(&report.outcome)
                    )),
                };
                (ended, report.counts.instances, report.counts.reclaimed)
            }
            Err(e) => (Ended::Not(e.to_string()), 0, 0),
        };
        let record = store.run(self.run_id).await?;
        let namespace = record
            .as_ref()
            .map(|r| r.namespace.clone())
            .unwrap_or_default();
        Ok(Observation {
            ended,
            namespace,
            events,
            steps: store.steps(self.run_id).await?,
            open: store.open_claims(Some(self.run_id)).await?,
            children: children(store.as_ref(), self.run_id).await?,
            captured: capture.captured(),
            files: scratch.files()?,
            instances,
            reclaimed,
            kills: None,
        })
    }
}
