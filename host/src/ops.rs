//! What an operator does to a store — submit a run, settle a parked key, deploy a
//! component, look at a run — as one set of functions that both the `idem` commands and
//! the HTTP API (`serve`) call, so the two cannot drift apart.

use std::time::Duration;

mod follow;
mod forks;
mod prices;
mod schedules;
mod timeline;
mod versions;
pub use follow::{FOLLOW_POLL, Follow, Followed};
pub use forks::{ForkSpec, fork, fork_run_id, history};
pub use prices::{Price, PriceError, PricedUsage, Prices};
pub use schedules::{
    ScheduleRequest, ScheduleView, UPCOMING_SHOWN, create_schedule, every_text, parse_every,
    spec_text, upcoming,
};
pub use timeline::{CheckpointView, StepView, step_view, timeline};
#[cfg(feature = "prove")]
pub use versions::{rehearse, rehearse_build};
pub use versions::{rollback, upgrade, versions};

use sha2::{Digest, Sha256};

use crate::runtime::{Authority, HostError, LoadedAgent, check_namespace, check_run_id};
use crate::store::{
    Admission, Cancelled, ChildRecord, Deployment, DeploymentPaused, DeploymentRecord, GcReport,
    GcRequest, InFlight, Millis, OpenClaim, ParkedKeys, ParkedMatch, Paused, Resolution, Resumed,
    Rollout, RunFilter, RunMove, RunRecord, RunStatus, ScheduledBy, StepRecord, Store, StoreError,
    Submission, Submitted, UsageFilter, WaitRecord,
};
use crate::text::{check_visible, escape_for_terminal as shown, hidden_char};

/// Why an operation was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpError {
    /// The store refused or failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The host refused (an unknown deployment, an invalid name, a wider authority).
    #[error(transparent)]
    Host(#[from] HostError),
    /// A rehearsal could not be carried out (its scratch space, a component that does
    /// not compile); what it found is in its report, not here.
    /// Boxed: the proof's error is large, and every operation returns this type.
    #[cfg(feature = "prove")]
    #[error(transparent)]
    Prove(Box<crate::prove::ProveError>),
    /// A value that must be JSON is not.
    #[error("the {what} is not valid JSON: {reason}")]
    NotJson {
        /// Which value.
        what: &'static str,
        /// What the parser said.
        reason: String,
    },
    /// The key named is not parked in doubt by the run.
    #[error("{message}")]
    NotParked {
        /// What is wrong, and which keys are parked.
        message: String,
    },
    /// The key named matches two parked keys.
    #[error("{message}")]
    Ambiguous {
        /// Which two.
        message: String,
    },
    /// A length of time that is not a whole number and a unit.
    #[error(
        "{what} {given:?} is not a length of time: expected a whole number and a unit, \
         as in 30d, 12h, 90m or 30s"
    )]
    BadAge {
        /// Which value.
        what: &'static str,
        /// What was given.
        given: String,
    },
}

#[cfg(feature = "prove")]
impl From<crate::prove::ProveError> for OpError {
    fn from(e: crate::prove::ProveError) -> OpError {
        OpError::Prove(Box::new(e))
    }
}

/// Checks that `bytes` are JSON; `what` names them in the error.
pub fn check_json(what: &'static str, bytes: &[u8]) -> Result<(), OpError> {
    serde_json::from_slice::<serde_json::Value>(bytes)
        .map(|_| ())
        .map_err(|e| OpError::NotJson {
            what,
            reason: e.to_string(),
        })
}

/// `<agent>-<first 12 hex digits of SHA-256(input)>`: stable for the same agent and
/// input, so re-running a command resumes its run instead of starting another. A name
/// with characters a run id may not hold has them replaced by `-`.
///
/// ```
/// let id = idem::ops::default_run_id("orders", b"null");
/// assert_eq!(id, idem::ops::default_run_id("orders", b"null"));
/// assert!(id.starts_with("orders-"));
/// ```
pub fn default_run_id(agent: &str, input: &[u8]) -> String {
    let digest = Sha256::digest(input);
    let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    let agent: String = agent
        .chars()
        .map(|c| {
            if hidden_char(c).is_some() || c == '/' {
                '-'
            } else {
                c
            }
        })
        .collect();
    format!("{agent}-{hex}")
}

/// A run to queue for workers: [`submit`].
#[derive(Debug, Clone, Copy)]
pub struct SubmitRequest<'a> {
    /// The deployed agent: its name, or a component digest deployed under some name.
    pub agent: &'a str,
    /// The input (JSON).
    pub input: &'a [u8],
    /// The run's id; [`default_run_id`] when `None`.
    pub run_id: Option<&'a str>,
    /// The namespace of the run's keys; the deployment's name when `None`.
    pub namespace: Option<&'a str>,
    /// The run's priority: 0 (the default, lowest) to [`MAX_PRIORITY`](crate::store::MAX_PRIORITY);
    /// workers lease due runs of higher priority first.
    pub priority: u32,
}

/// Queues a run of a deployed agent, with the deployment's authority as `narrow` changes
/// it (it may only narrow it). Submitting the same run id with the same input again
/// finds the same run.
pub async fn submit(
    store: &dyn Store,
    req: &SubmitRequest<'_>,
    narrow: impl FnOnce(&Authority) -> Authority,
) -> Result<Submitted, OpError> {
    let run = BatchRun {
        input: req.input,
        run_id: req.run_id,
        priority: req.priority,
    };
    let mut answers = submit_many(store, req.agent, req.namespace, &[run], narrow).await?;
    let Some(answer) = answers.pop() else {
        unreachable!("one answer per run")
    };
    answer
}

/// One run of [`submit_many`]: its input (JSON), its id ([`default_run_id`] when
/// `None`) and its priority.
#[derive(Debug, Clone, Copy)]
pub struct BatchRun<'a> {
    /// The input (JSON).
    pub input: &'a [u8],
    /// The run's id.
    pub run_id: Option<&'a str>,
    /// The run's priority.
    pub priority: u32,
}

/// Queues runs of one deployed agent at once, in one transaction of the store, as
/// [`submit`] queues one: the deployment, its authority narrowed by `narrow` and the
/// namespace are checked once, then each run is answered in order as a lone submit of
/// it would be. A refused run (input that is not JSON, a bad run id, a run id taken by
/// other input, a priority over the highest, a missing concurrency key) is created
/// nothing for, and the others are queued. Fails as a whole, queueing nothing, when the
/// deployment or the authority is refused or the store fails.
pub async fn submit_many(
    store: &dyn Store,
    agent: &str,
    namespace: Option<&str>,
    runs: &[BatchRun<'_>],
    narrow: impl FnOnce(&Authority) -> Authority,
) -> Result<Vec<Result<Submitted, OpError>>, OpError> {
    let deployment = find_deployment(store, agent).await?;
    let base = Authority::decode(&deployment.authority).map_err(HostError::from)?;
    let authority = narrow(&base);
    authority.check().map_err(HostError::from)?;
    authority.fits_within(&base).map_err(HostError::from)?;
    let namespace = namespace.unwrap_or(&deployment.name).to_string();
    check_namespace(&namespace)?;
    if store.admitted(&namespace, &deployment.digest).await? != Some(true) {
        return Err(StoreError::NamespaceTaken {
            namespace,
            owner: "another component".into(),
            digest: deployment.digest.clone(),
        }
        .into());
    }
    let authority = authority.encode();
    // Each run checked on its own: the refused ones are answered here, the others asked
    // of the store together.
    let checked: Vec<Result<String, OpError>> = runs
        .iter()
        .map(|run| {
            check_json("input", run.input)?;
            let run_id = run
                .run_id
                .map(str::to_string)
                .unwrap_or_else(|| default_run_id(&deployment.name, run.input));
            check_run_id(&run_id)?;
            Ok(run_id)
        })
        .collect();
    let submissions: Vec<Submission<'_>> = checked
        .iter()
        .zip(runs)
        .filter_map(|(checked, run)| {
            let run_id = checked.as_ref().ok()?;
            Some(Submission {
                run_id,
                agent: &deployment.name,
                digest: &deployment.digest,
                namespace: &namespace,
                input: run.input,
                authority: &authority,
                replace_authority: false,
                priority: run.priority,
            })
        })
        .collect();
    let mut stored = store.submit_many(&submissions).await?.into_iter();
    Ok(checked
        .into_iter()
        .map(|checked| match checked {
            Ok(_) => stored
                .next()
                .unwrap_or_else(|| unreachable!("one answer per submission"))
                .map_err(OpError::from),
            Err(e) => Err(e),
        })
        .collect())
}

/// The deployment a submission names: by name, or by a digest deployed under a name.
pub async fn find_deployment(store: &dyn Store, agent: &str) -> Result<DeploymentRecord, OpError> {
    if let Some(deployment) = store.deployment(agent).await? {
        return Ok(deployment);
    }
    let is_digest = agent.len() == 64 && agent.bytes().all(|b| b.is_ascii_hexdigit());
    if is_digest {
        let digest = agent.to_ascii_lowercase();
        let by_digest = store
            .deployments()
            .await?
            .into_iter()
            .find(|d| d.digest == digest);
        if let Some(deployment) = by_digest {
            return Ok(deployment);
        }
    }
    Err(HostError::UnknownDeployment {
        name: agent.to_string(),
    }
    .into())
}

/// What [`deploy`] did.
#[derive(Debug, Clone)]
pub struct Deployed {
    /// The deployment as it now stands (its version among them).
    pub record: DeploymentRecord,
    /// Whether the component's bytes were new to the store.
    pub new_component: bool,
    /// The runs in flight that moved to it ([`InFlight::Upgrade`]).
    pub moved: Vec<RunMove>,
    /// The runs in flight left where they are because their component exports
    /// something else ([`InFlight::Upgrade`] moves only what can resume on it).
    pub kept: Vec<String>,
}

/// Stores a loaded (so checked) agent and points `name` at it with `authority`, as the
/// name's next version: the explicit act by which a component joins a name's
/// namespace. `in_flight` says what the name's runs in flight do: stay on their version
/// ([`InFlight::Pin`]) or move to this one at their next instance.
pub async fn deploy(
    store: &dyn Store,
    agent: &LoadedAgent,
    name: &str,
    authority: &Authority,
    in_flight: InFlight,
) -> Result<Deployed, OpError> {
    check_namespace(name)?;
    authority.check().map_err(HostError::from)?;
    let new_component = store.put_component(agent.digest(), agent.bytes()?).await?;
    let exports = agent.exports();
    let deployed = store
        .deploy_version(
            &Deployment {
                name,
                digest: agent.digest(),
                authority: &authority.encode(),
                admission: Admission::Explicit,
                source: None,
            },
            &Rollout {
                in_flight,
                exports: Some(&exports),
            },
        )
        .await?;
    Ok(Deployed {
        record: deployed.record,
        new_component,
        moved: deployed.moved,
        kept: deployed.kept,
    })
}

/// What [`resolve`] did.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The key, as the store keeps it.
    pub key: String,
    /// The run's status afterwards.
    pub status: Option<RunStatus>,
}

/// Settles a key that run `run_id` parked in doubt; `key` is the agent's key or the
/// store's (`namespace:key`). A committed result must be JSON.
pub async fn resolve(
    store: &dyn Store,
    run_id: &str,
    key: &str,
    resolution: Resolution<'_>,
) -> Result<Resolved, OpError> {
    if let Resolution::Commit(result) = resolution {
        check_json("result", result)?;
    }
    let parked = ParkedKeys::of(store, run_id)
        .await?
        .ok_or_else(|| StoreError::UnknownRun {
            run_id: run_id.to_string(),
        })?;
    let stored = match parked.find(key) {
        ParkedMatch::One(stored) => stored.to_string(),
        ParkedMatch::Both(a, b) => {
            return Err(OpError::Ambiguous {
                message: format!(
                    "key \"{}\" names two parked keys of run \"{}\": \"{}\" and \"{}\" \
                     (as the store keeps them); give the one you mean in that form",
                    shown(key),
                    shown(run_id),
                    shown(a),
                    shown(b)
                ),
            });
        }
        ParkedMatch::None => {
            return Err(OpError::NotParked {
                message: not_parked(key, &parked),
            });
        }
    };
    store.resolve(run_id, &stored, resolution).await?;
    let status = store.run(run_id).await?.map(|r| r.status);
    Ok(Resolved {
        key: stored,
        status,
    })
}

/// Why `key` cannot be resolved, and what can: the run's parked keys as the agent sees
/// them, escaped (a key that only looks like another is shown as different).
fn not_parked(key: &str, parked: &ParkedKeys) -> String {
    let mut message = format!(
        "key \"{}\" is not parked in doubt by run \"{}\"; nothing to resolve",
        shown(key),
        shown(&parked.run_id)
    );
    if let Err(hidden) = check_visible(key) {
        message += &format!(" (the key given holds {hidden})");
    }
    if parked.keys.is_empty() {
        message += "; the run has no parked keys";
    } else {
        let keys: Vec<String> = parked
            .keys
            .iter()
            .map(|k| format!("\"{}\"", shown(parked.agent_key(k))))
            .collect();
        message += &format!(
            "; its parked keys (as the agent sees them; `{}:KEY` works too): {}",
            shown(&parked.namespace),
            keys.join(", ")
        );
    }
    message
}

/// How long finished runs stay by default before [`gc`] deletes them.
pub const DEFAULT_FINISHED_BEFORE: Duration = Duration::from_secs(30 * 86_400);

/// How long committed keys stay by default ([`GcRequest::dedupe_window`]).
pub const DEFAULT_DEDUPE_WINDOW: Duration = Duration::from_secs(7 * 86_400);

/// Reads a length of time as an operator writes it: a whole number and one unit, `d`,
/// `h`, `m` or `s`; `what` names the value in the error.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(idem::ops::parse_age("age", "7d")?, Duration::from_secs(7 * 86_400));
/// assert_eq!(idem::ops::parse_age("age", "90m")?, Duration::from_secs(90 * 60));
/// assert!(idem::ops::parse_age("age", "7").is_err());
/// # Ok::<(), idem::ops::OpError>(())
/// ```
pub fn parse_age(what: &'static str, text: &str) -> Result<Duration, OpError> {
    let bad = || OpError::BadAge {
        what,
        given: text.to_owned(),
    };
    let split = text.len().checked_sub(1).ok_or_else(bad)?;
    let (number, unit) = text.split_at_checked(split).ok_or_else(bad)?;
    let seconds_per = match unit {
        "d" => 86_400,
        "h" => 3_600,
        "m" => 60,
        "s" => 1,
        _ => return Err(bad()),
    };
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = number.parse().map_err(|_| bad())?;
    n.checked_mul(seconds_per)
        .map(Duration::from_secs)
        .ok_or_else(bad)
}

/// Deletes finished runs and what only they used, as `req` says
/// ([`OperatorStore::gc`](crate::store::OperatorStore::gc)).
pub async fn gc(store: &dyn Store, req: &GcRequest) -> Result<GcReport, OpError> {
    Ok(store.gc(req).await?)
}

/// What [`cancel`] did: to the run, and to its descendants.
#[derive(Debug, Clone)]
pub struct CancelReport {
    /// The run: cancelled now, or asked of its worker.
    pub run: Cancelled,
    /// Its descendants the cancel reached (not detached, not ended before), as they
    /// stand after it: `cancelled`, or still running with the cancel asked of their
    /// worker.
    pub descendants: Vec<RunRecord>,
}

/// Cancels run `run_id` and, with it, its descendants that are not detached
/// ([`OperatorStore::cancel_run`](crate::store::OperatorStore::cancel_run)); reports
/// which.
pub async fn cancel(store: &dyn Store, run_id: &str) -> Result<CancelReport, OpError> {
    let run = store.cancel_run(run_id).await?;
    let mut descendants = Vec::new();
    let mut parents = vec![run_id.to_string()];
    while let Some(parent) = parents.pop() {
        let children = store
            .runs(&RunFilter {
                parent: Some(&parent),
                ..RunFilter::default()
            })
            .await?;
        for child in children.into_iter().rev() {
            if child.detached {
                continue;
            }
            parents.push(child.run_id.clone());
            if child.status == RunStatus::Cancelled || child.cancel_requested {
                descendants.push(child);
            }
        }
    }
    Ok(CancelReport { run, descendants })
}

/// Pauses run `run_id`
/// ([`OperatorStore::pause_run`](crate::store::OperatorStore::pause_run)): no worker
/// takes it until it is resumed, and a worker holding it stops it at its next host call
/// outside a side effect. Its children go on (pause their deployment to stop them too).
pub async fn pause(store: &dyn Store, run_id: &str) -> Result<Paused, OpError> {
    Ok(store.pause_run(run_id).await?)
}

/// Resumes run `run_id`: it goes on where it stopped, from its checkpoint and its
/// committed steps, as a recycled run does.
pub async fn resume(store: &dyn Store, run_id: &str) -> Result<Resumed, OpError> {
    Ok(store.resume_run(run_id).await?)
}

/// Pauses the deployment `agent` names (its name, or a digest deployed under a name):
/// its unfinished runs, and the runs started under its name until it is resumed.
/// Returns the deployment's name with what was done.
pub async fn pause_deployment(
    store: &dyn Store,
    agent: &str,
) -> Result<(String, DeploymentPaused), OpError> {
    let name = find_deployment(store, agent).await?.name;
    let paused = store.pause_deployment(&name).await?;
    Ok((name, paused))
}

/// Resumes the deployment `agent` names and the runs paused with it; runs paused one
/// by one stay paused.
pub async fn resume_deployment(
    store: &dyn Store,
    agent: &str,
) -> Result<(String, DeploymentPaused), OpError> {
    let name = find_deployment(store, agent).await?.name;
    let resumed = store.resume_deployment(&name).await?;
    Ok((name, resumed))
}

/// Everything the store knows of one run, as `idem show --json` and the API print it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RunView {
    /// The run.
    pub run: RunRecord,
    /// Its output (completed), error (failed) or reason (in doubt, cancelled), as JSON
    /// when it is JSON, else as text.
    pub outcome: Option<serde_json::Value>,
    /// The keys it claimed: those it committed in the order it committed them, then its
    /// open claims in the order they were granted.
    pub steps: Vec<StepRecord>,
    /// Its sleeps and signal waits, in the order first reached.
    pub waits: Vec<WaitRecord>,
    /// Its claims not committed yet (parked ones among them).
    pub open_claims: Vec<OpenClaim>,
    /// The child runs it spawned, oldest first: the first [`RunView::CHILDREN_SHOWN`]
    /// of them (`idem ls --parent` and the API's `?parent=` list them all).
    pub children: Vec<ChildRecord>,
    /// How many children it spawned, and how many stand in each status: the whole
    /// count, however many `children` lists.
    pub children_count: ChildCounts,
    /// The schedule and tick that started it, if a schedule did.
    pub schedule: Option<ScheduledBy>,
    /// Its moves between versions of its deployment, oldest first.
    pub moves: Vec<RunMove>,
    /// The token usage of its model calls, per model (spent once per call, saved per
    /// replay); with costs once [`RunView::priced`].
    pub usage: Vec<PricedUsage>,
    /// The store's clock when this was read: compare leases and due times with it.
    pub now: Millis,
}

/// How many children a run spawned, in all and per status.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct ChildCounts {
    /// Children in all.
    pub total: u64,
    /// Per status with at least one child (`queued`, `running`, `completed`, ...).
    pub by_status: std::collections::BTreeMap<RunStatus, u64>,
}

impl ChildCounts {
    /// The counts of `children`.
    pub fn of<'a>(children: impl IntoIterator<Item = &'a RunRecord>) -> ChildCounts {
        let mut counts = ChildCounts::default();
        for child in children {
            counts.total += 1;
            *counts.by_status.entry(child.status).or_insert(0) += 1;
        }
        counts
    }
}

impl RunView {
    /// The view with its usage priced by `prices`.
    pub fn priced(mut self, prices: &Prices) -> RunView {
        let totals = self.usage.into_iter().map(|u| u.total).collect();
        self.usage = PricedUsage::of(totals, Some(prices));
        self
    }

    /// The most children a view lists: a parent of 10,000 children stays a page a
    /// terminal and a browser can show, its counts still whole.
    pub const CHILDREN_SHOWN: usize = 100;

    /// Run `run_id` as the store has it; [`StoreError::UnknownRun`] if there is none.
    pub async fn of(store: &dyn Store, run_id: &str) -> Result<RunView, StoreError> {
        let run = store
            .run(run_id)
            .await?
            .ok_or_else(|| StoreError::UnknownRun {
                run_id: run_id.to_string(),
            })?;
        let steps = store.steps(run_id).await?;
        let waits = store.waits(run_id).await?;
        let open_claims = store.open_claims(Some(run_id)).await?;
        let mut all = store
            .runs(&RunFilter {
                parent: Some(run_id),
                ..RunFilter::default()
            })
            .await?;
        let children_count = ChildCounts::of(&all);
        // Newest first from the store: the oldest are at the end.
        all.reverse();
        all.truncate(Self::CHILDREN_SHOWN);
        let children: Vec<ChildRecord> = all
            .into_iter()
            .map(|child| ChildRecord {
                key: child.spawn_key.unwrap_or_default(),
                run_id: child.run_id,
                agent: child.agent,
                status: child.status,
            })
            .collect();
        let schedule = store.run_schedule(run_id).await?;
        let moves = store.run_moves(run_id).await?;
        let usage = store
            .usage(&UsageFilter {
                run_id: Some(run_id),
                ..UsageFilter::default()
            })
            .await?;
        let usage = PricedUsage::of(usage, None);
        let now = store.now().await?;
        Ok(RunView {
            usage,
            schedule,
            moves,
            children,
            children_count,
            outcome: run.outcome.as_deref().map(payload_value),
            run,
            steps,
            waits,
            open_claims,
            now,
        })
    }
}

/// Bytes an agent produced, as a JSON value: JSON as itself, anything else as text.
pub fn payload_value(bytes: &[u8]) -> serde_json::Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| String::from_utf8_lossy(bytes).into_owned().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_run_ids_hold_no_hidden_characters() {
        let id = default_run_id("evil\u{1b}[2J\u{202e}txt", b"null");
        assert!(id.starts_with("evil-[2J-txt-"), "{id}");
        assert!(check_visible(&id).is_ok());
    }

    #[test]
    fn json_is_checked() {
        assert!(check_json("input", b"{\"a\":1}").is_ok());
        let err = check_json("input", b"{").unwrap_err().to_string();
        assert!(err.starts_with("the input is not valid JSON"), "{err}");
    }
}
