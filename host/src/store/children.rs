//! The values of child runs: spawning them exactly once ([`InstanceStore::spawn`],
//! [`InstanceStore::spawn_many`]) and joining children in a durable wait
//! ([`WaitKind::Join`]).

use sha2::{Digest, Sha256};

#[cfg(doc)]
use super::{InstanceStore, WaitKind};
use super::{RunFence, RunStatus};

/// How many bytes of the parent's id a child's id keeps, before its hash: enough to
/// see whose child it is, short enough that a child of a child of ... stays a valid
/// run id.
const PARENT_SHOWN: usize = 160;

/// The run id of the child `parent` spawns under `key`: the parent's id (up to 160
/// bytes of it), `~`, and 20 hex digits of SHA-256 over both. The same parent and key
/// always name the same child, so a parent that crashed after spawning finds the same
/// child when it spawns again.
///
/// ```
/// let a = idem::store::child_run_id("planner", "doc-1");
/// assert_eq!(a, idem::store::child_run_id("planner", "doc-1"));
/// assert_ne!(a, idem::store::child_run_id("planner", "doc-2"));
/// assert!(a.starts_with("planner~"));
/// ```
pub fn child_run_id(parent: &str, key: &str) -> String {
    let mut hash = Sha256::new();
    hash.update(b"idem child\0");
    hash.update(parent.as_bytes());
    hash.update([0]);
    hash.update(key.as_bytes());
    let digest = hash.finalize();
    let hex: String = digest[..10].iter().map(|b| format!("{b:02x}")).collect();
    let mut end = parent.len().min(PARENT_SHOWN);
    while !parent.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}~{hex}", &parent[..end])
}

/// How far spawning may go: [`SpawnRequest::limits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpawnLimits {
    /// The deepest a run may be: a top-level run is at depth 0, its children at 1.
    pub max_depth: u32,
    /// The most children one run may spawn.
    pub max_children: u32,
}

/// A child run to start exactly once: [`InstanceStore::spawn`].
#[derive(Debug, Clone)]
pub struct SpawnRequest<'a> {
    /// The parent run and its lease.
    pub fence: &'a RunFence,
    /// The key the parent spawns under, unique among its spawns.
    pub key: &'a str,
    /// The child's run id ([`child_run_id`] of the parent and the key).
    pub child_id: &'a str,
    /// The deployment the child runs: its component, authority and namespace now.
    pub deployment: &'a str,
    /// The child's input.
    pub input: &'a [u8],
    /// The child outlives a cancelled parent.
    pub detached: bool,
    /// Refused past these.
    pub limits: SpawnLimits,
}

/// One child of a [`SpawnBatch`].
#[derive(Debug, Clone)]
pub struct ChildSpec<'a> {
    /// The key the parent spawns under, unique among its spawns.
    pub key: &'a str,
    /// The child's run id ([`child_run_id`] of the parent and the key).
    pub child_id: &'a str,
    /// The deployment the child runs: its component, authority and namespace now.
    pub deployment: &'a str,
    /// The child's input.
    pub input: &'a [u8],
    /// The child outlives a cancelled parent.
    pub detached: bool,
}

impl<'a> ChildSpec<'a> {
    /// The child `req` asks for.
    pub fn of(req: &SpawnRequest<'a>) -> ChildSpec<'a> {
        ChildSpec {
            key: req.key,
            child_id: req.child_id,
            deployment: req.deployment,
            input: req.input,
            detached: req.detached,
        }
    }
}

/// Children to start exactly once in one write: [`InstanceStore::spawn_many`]. Each is
/// answered as if it had been spawned on its own, in the order given.
#[derive(Debug, Clone)]
pub struct SpawnBatch<'a> {
    /// The parent run and its lease.
    pub fence: &'a RunFence,
    /// The children, in order.
    pub children: &'a [ChildSpec<'a>],
    /// Refused past these.
    pub limits: SpawnLimits,
}

/// What [`InstanceStore::spawn_many`] says of each child, in the batch's order.
pub type SpawnAnswers = Vec<Result<Spawned, SpawnRefusal>>;

/// What [`InstanceStore::spawn`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spawned {
    /// The child's run id.
    pub run_id: String,
    /// Whether this call created it (false: it was spawned before, by this parent).
    pub created: bool,
}

/// Why a spawn was refused. Nothing was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpawnRefusal {
    /// No deployment has this name.
    #[error("no deployment is called {}", crate::text::quoted(.0))]
    UnknownDeployment(String),
    /// The key was spawned before with another deployment or input.
    #[error(
        "key {} was spawned before with {what}; give each child its own key",
        crate::text::quoted(key)
    )]
    KeyReused {
        /// The key.
        key: String,
        /// What differs: `another deployment` or `other input`.
        what: &'static str,
    },
    /// The child would be deeper than the limit.
    #[error("a child here would be at depth {depth}, past the limit of {max}")]
    TooDeep {
        /// The child's depth.
        depth: u32,
        /// The limit.
        max: u32,
    },
    /// The parent has spawned as many children as it may.
    #[error("this run has spawned {count} children, the limit")]
    TooMany {
        /// The limit, reached.
        count: u32,
    },
    /// An ancestor of the parent was spawned with the same deployment and key: the
    /// agent would spawn itself for ever.
    #[error(
        "ancestor {} was spawned as deployment {} under key {}: spawning it again here \
         would repeat for ever",
        crate::text::quoted(ancestor),
        crate::text::quoted(deployment),
        crate::text::quoted(key)
    )]
    Cycle {
        /// The ancestor's run id.
        ancestor: String,
        /// The deployment.
        deployment: String,
        /// The key.
        key: String,
    },
}

/// Whether a join waits for all its children or the first to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JoinMode {
    /// Every child has ended.
    All,
    /// One child has ended (the earliest to end; among children that ended at one
    /// time, the first listed).
    Any,
}

impl JoinMode {
    /// The mode as the store spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            JoinMode::All => "all",
            JoinMode::Any => "any",
        }
    }
}

/// How a joined child ended, as the join saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildEnd {
    /// Where the child stands among the children the join listed.
    pub index: u32,
    /// The child's run id.
    pub run_id: String,
    /// `Completed`, `Failed` or `Cancelled`.
    pub status: RunStatus,
    /// Its output (completed) or error text (failed); empty when cancelled.
    pub outcome: Vec<u8>,
}

/// Whether a child in `status` has ended for a join: completed, failed or cancelled.
/// A child in doubt has not: an operator settles it, and it goes on.
pub fn child_ended(status: RunStatus) -> bool {
    matches!(
        status,
        RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled
    )
}

/// A child as an operator sees it under its parent.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ChildRecord {
    /// The child's run id.
    pub run_id: String,
    /// The key its parent spawned it under.
    pub key: String,
    /// The deployment it runs.
    pub agent: String,
    /// Where it stands.
    pub status: RunStatus,
}
