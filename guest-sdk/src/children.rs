//! Child runs: [`spawn`] starts a run of a deployed agent exactly once ([`spawn_many`]
//! and [`spawn_all`] many in one write), and [`join`],
//! [`join_all`] and [`join_any`] wait for children's ends durably. A join that is not
//! over ends the instance; the run holds nothing until its children have ended, when
//! the host resumes it on a fresh instance, which replays its way back here: its
//! spawns find the children they started, and its join finds them ended.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::Error;
use crate::bindings::idem::agent::children::{self, ChildStatus};

/// A child run this run spawned: its run id, stable across instances. It serializes
/// as the id, so a checkpoint can keep the children spawned so far.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Child {
    run_id: String,
}

impl Child {
    /// The child with this run id, as [`spawn`] returned it before (a join of a run
    /// that is not this run's child is refused).
    pub fn from_run_id(run_id: String) -> Child {
        Child { run_id }
    }

    /// The child's run id (`idem show` it, or `idem ls --parent` this run).
    pub fn run_id(&self) -> &str {
        &self.run_id
    }
}

/// How a joined child ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChildOutcome<T> {
    /// It returned this output.
    Completed(T),
    /// It failed with this error text. The parent goes on: a child's failure is
    /// the parent's to handle.
    Failed(String),
    /// It was cancelled.
    Cancelled,
}

impl<T> ChildOutcome<T> {
    /// The output, or the failure as an [`Error::Agent`] naming the child.
    pub fn into_result(self, child: &Child) -> Result<T, Error> {
        match self {
            ChildOutcome::Completed(output) => Ok(output),
            ChildOutcome::Failed(error) => Err(Error::Agent(format!(
                "child {} failed: {error}",
                child.run_id
            ))),
            ChildOutcome::Cancelled => Err(Error::Agent(format!(
                "child {} was cancelled",
                child.run_id
            ))),
        }
    }
}

/// Starts a run of the deployment `deployment` with `input` (as JSON), as a child of
/// this run, exactly once: the child's id is derived from this run and `key`, so a
/// resumed instance spawning again under the same key gets the same child and starts
/// nothing. The child runs with its deployment's grants, and is cancelled when this
/// run is (see [`spawn_detached`]).
///
/// `key` names the child among this run's spawns: derive it from what the child does
/// (`"summarize-doc-17"`), never from the time or a counter of instances.
///
/// Fails with [`Error::Spawn`] for an invalid key, an unknown deployment, a key
/// spawned before with another deployment or input, a limit (depth, children), or an
/// agent that would spawn itself for ever.
///
/// ```no_run
/// let child = idem_sdk::spawn("summarize-doc-17", "summarizer", &serde_json::json!({"doc": 17}))?;
/// let summary: String = idem_sdk::join(&child)?.into_result(&child)?;
/// # Ok::<(), idem_sdk::Error>(())
/// ```
pub fn spawn<I: Serialize + ?Sized>(
    key: &str,
    deployment: &str,
    input: &I,
) -> Result<Child, Error> {
    spawn_with(key, deployment, input, false)
}

/// [`spawn`], for a child that outlives this run if this run is cancelled.
pub fn spawn_detached<I: Serialize + ?Sized>(
    key: &str,
    deployment: &str,
    input: &I,
) -> Result<Child, Error> {
    spawn_with(key, deployment, input, true)
}

fn spawn_with<I: Serialize + ?Sized>(
    key: &str,
    deployment: &str,
    input: &I,
    detached: bool,
) -> Result<Child, Error> {
    let input = serde_json::to_vec(input).map_err(|err| Error::codec("child input", err))?;
    let run_id = children::spawn(key, deployment, &input, detached)?;
    Ok(Child { run_id })
}

/// A child for [`spawn_many`]: its key, its deployment and its input (as JSON).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildSpec {
    key: String,
    deployment: String,
    input: Vec<u8>,
    detached: bool,
}

impl ChildSpec {
    /// A child of `deployment` under `key` with `input` (as JSON), cancelled with this
    /// run. Fails only if `input` cannot be written as JSON.
    pub fn new<I: Serialize + ?Sized>(
        key: impl Into<String>,
        deployment: impl Into<String>,
        input: &I,
    ) -> Result<ChildSpec, Error> {
        Ok(ChildSpec {
            key: key.into(),
            deployment: deployment.into(),
            input: serde_json::to_vec(input).map_err(|err| Error::codec("child input", err))?,
            detached: false,
        })
    }

    /// The same child, outliving this run if this run is cancelled.
    pub fn detached(mut self) -> ChildSpec {
        self.detached = true;
        self
    }
}

/// [`spawn`] of each child, in order, in one write to the store: a fan-out over many
/// items costs about one spawn, not one per child. Each child gets its own answer, as
/// if each had been spawned on its own in this order (a refused one starts nothing,
/// the others still start). At most the run's children limit in one call.
///
/// ```no_run
/// use idem_sdk::ChildSpec;
/// let specs = (0..100)
///     .map(|doc| ChildSpec::new(format!("summarize-doc-{doc}"), "summarizer", &doc))
///     .collect::<Result<Vec<_>, _>>()?;
/// let children = idem_sdk::spawn_many(&specs)
///     .into_iter()
///     .collect::<Result<Vec<_>, _>>()?;
/// let summaries: Vec<idem_sdk::ChildOutcome<String>> = idem_sdk::join_all("summaries", &children, None)?;
/// # Ok::<(), idem_sdk::Error>(())
/// ```
pub fn spawn_many(children: &[ChildSpec]) -> Vec<Result<Child, Error>> {
    let requests: Vec<children::SpawnRequest> = children
        .iter()
        .map(|c| children::SpawnRequest {
            key: c.key.clone(),
            deployment: c.deployment.clone(),
            input: c.input.clone(),
            detached: c.detached,
        })
        .collect();
    children::spawn_many(&requests)
        .into_iter()
        .map(|answer| answer.map(|run_id| Child { run_id }).map_err(Error::from))
        .collect()
}

/// [`spawn_many`] of one child of `deployment` per `(key, input)`, failing with the
/// first refusal (the children before and after it that were not refused are started
/// all the same: spawning again with the same keys finds them).
pub fn spawn_all<K: AsRef<str>, I: Serialize>(
    deployment: &str,
    children: impl IntoIterator<Item = (K, I)>,
) -> Result<Vec<Child>, Error> {
    let specs = children
        .into_iter()
        .map(|(key, input)| ChildSpec::new(key.as_ref(), deployment, &input))
        .collect::<Result<Vec<_>, _>>()?;
    spawn_many(&specs).into_iter().collect()
}

/// Waits for `child` to end and returns how it ended, its output decoded from JSON as
/// `T`. The join is recorded under the key `join-<child's run id>`.
pub fn join<T: DeserializeOwned>(child: &Child) -> Result<ChildOutcome<T>, Error> {
    let key = format!("join-{}", child.run_id);
    let mut ends = join_all(&key, std::slice::from_ref(child), None)?;
    Ok(ends.remove(0))
}

/// Waits until every one of `children` has ended, for at most `timeout` (`None`: for
/// ever), holding no instance meanwhile, and returns their ends in the order given.
/// The run is woken once, when the last one ends. Recorded under `key` among the run's
/// waits: reached again, it answers the same. Fails with [`Error::JoinTimedOut`] when the
/// timeout passed first (recorded too), and [`Error::Join`] for a list that is empty,
/// too long, repeats a child or names a run that is not this run's child, or a key
/// used by another wait.
pub fn join_all<T: DeserializeOwned>(
    key: &str,
    children: &[Child],
    timeout: Option<Duration>,
) -> Result<Vec<ChildOutcome<T>>, Error> {
    let ids: Vec<String> = children.iter().map(|c| c.run_id.clone()).collect();
    let timeout_ms = timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX));
    match children::join_all(key, &ids, timeout_ms)? {
        Some(ends) => ends.into_iter().map(outcome).collect(),
        None => Err(Error::JoinTimedOut(key.to_owned())),
    }
}

/// Waits until the first of `children` ends, as [`join_all`] does, and returns its
/// place in `children` with how it ended.
pub fn join_any<T: DeserializeOwned>(
    key: &str,
    children: &[Child],
    timeout: Option<Duration>,
) -> Result<(usize, ChildOutcome<T>), Error> {
    let ids: Vec<String> = children.iter().map(|c| c.run_id.clone()).collect();
    let timeout_ms = timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX));
    match children::join_any(key, &ids, timeout_ms)? {
        Some(end) => {
            let index = usize::try_from(end.index).unwrap_or(usize::MAX);
            Ok((index, outcome(end)?))
        }
        None => Err(Error::JoinTimedOut(key.to_owned())),
    }
}

fn outcome<T: DeserializeOwned>(end: children::ChildEnd) -> Result<ChildOutcome<T>, Error> {
    Ok(match end.status {
        ChildStatus::Completed => ChildOutcome::Completed(
            serde_json::from_slice(&end.output).map_err(|err| Error::codec("child output", err))?,
        ),
        ChildStatus::Failed => {
            ChildOutcome::Failed(String::from_utf8_lossy(&end.output).into_owned())
        }
        ChildStatus::Cancelled => ChildOutcome::Cancelled,
    })
}
