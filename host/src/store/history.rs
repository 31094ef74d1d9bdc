//! A run's step history and its forks: where each step the run committed and each
//! checkpoint it saved stands in the run ([`Position`]), what an operator reads of them
//! ([`RunHistory`]), and what a fork asks for and gets ([`ForkRequest`], [`Forked`]).
//!
//! A fork is a new run that starts from the checkpoint a run had saved before one of
//! its steps: the results the run committed before that step are copied into the
//! fork's own namespace (so a fork that replays them finds them), and every step from
//! there on runs under the fork's keys, never the original run's.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{Millis, RunRecord};

/// Where a committed step or a saved checkpoint stands in its run: the run lease it
/// was written under (a run's leases only grow), then a tick of the writing process's
/// clock (microseconds, strictly increasing in the process). Steps committed before
/// the store kept positions stand at lease 0, ordered by their commit time; the steps
/// a fork copied stand at lease 0 in their original order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct Position {
    /// The run lease's token.
    pub lease: u64,
    /// The writer's tick within it.
    pub tick: u64,
}

/// The checkpoints a run keeps: the last this many it saved. Older ones are collected
/// as new ones come (a run's history says so: [`RunHistory::collected`]).
pub const HISTORY_KEEP: u64 = 1000;

/// Of a run's large checkpoints (states kept as blobs, 128 KiB or more), the last this
/// many keep their state in its history; older ones keep their place with the state
/// collected ([`HistoryCheckpoint::kept`]). A conversation checkpointed at every step
/// would otherwise be kept a thousand times over.
pub const HISTORY_KEEP_LARGE: u64 = 4;

/// Whether a checkpoint's save also collects the run's checkpoints past
/// [`HISTORY_KEEP`]: one save in [`TRIM_EVERY`], drawn from the clock's microseconds,
/// so whatever a run's pattern of leases and saves, collecting costs a save little on
/// average and its history stays near its bound.
#[cfg(feature = "postgres")]
pub(crate) fn trim_due() -> bool {
    tick().is_multiple_of(TRIM_EVERY)
}

/// See [`trim_due`].
#[cfg(feature = "postgres")]
const TRIM_EVERY: u64 = 32;

/// Ticks handed out by this process, so that two never repeat or go back.
static LAST_TICK: AtomicU64 = AtomicU64::new(0);

/// Microseconds since the Unix epoch, strictly greater than every tick this process
/// handed out before, even when the wall clock steps back: within one run lease (one
/// process), the order of ticks is the order of writes.
pub(crate) fn tick() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
        .unwrap_or(0)
        // Kept within what a store's signed column holds.
        .min(i64::MAX as u64 - 1);
    let mut last = LAST_TICK.load(Ordering::Relaxed);
    loop {
        let next = now.max(last.saturating_add(1)).min(i64::MAX as u64);
        match LAST_TICK.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(seen) => last = seen,
        }
    }
}

/// A step a run committed, in its history.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HistoryStep {
    /// Its number in the run, from 1, in the order the run committed its steps: what
    /// `idem fork --at` takes.
    pub n: u64,
    /// The key (qualified: `namespace:key`).
    pub key: String,
    /// The token and attempt it was committed under.
    pub token: u64,
    /// See [`token`](Self::token).
    pub attempt: u32,
    /// When it was committed.
    pub committed_at: Millis,
    /// Where it stands in the run.
    pub position: Position,
}

/// A checkpoint a run saved, in its history.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HistoryCheckpoint {
    /// The step number the agent saved it at (its own count, not [`HistoryStep::n`]).
    pub step: u64,
    /// How many of the run's steps were committed when it was saved: a fork at step
    /// `after + 1` starts from it (if no later one comes before that step).
    pub after: u64,
    /// The state's size as the store keeps it (sealed, or a blob's reference); 0 once
    /// collected.
    pub bytes: u64,
    /// Whether its state is kept: a fork can start from it. A large state goes once
    /// [`HISTORY_KEEP_LARGE`] later large ones were saved.
    pub kept: bool,
    /// When it was saved.
    pub saved_at: Millis,
    /// Where it stands in the run.
    pub position: Position,
}

/// A run's step history: its committed steps and the checkpoints it kept, each in
/// order.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RunHistory {
    /// The steps the run committed itself (keys it found committed by another run are
    /// not among them).
    pub steps: Vec<HistoryStep>,
    /// The checkpoints it keeps.
    pub checkpoints: Vec<HistoryCheckpoint>,
    /// Older checkpoints were collected (past [`HISTORY_KEEP`], or by
    /// `idem gc --history-before`): a fork from before the first one kept is refused.
    pub collected: bool,
    /// The run this one was forked from, and the step, if it is a fork.
    pub forked_from: Option<(String, u64)>,
}

/// A checkpoint read back from a run's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedCheckpoint {
    /// Where it stands in the run.
    pub position: Position,
    /// The checkpoint.
    pub checkpoint: super::Checkpoint,
    /// When it was saved.
    pub saved_at: Millis,
}

/// A fork of a run (`idem fork`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForkRequest<'a> {
    /// The run to fork.
    pub run_id: &'a str,
    /// The step to fork at ([`HistoryStep::n`]): the fork starts from the checkpoint
    /// saved before it and reuses the results committed before it.
    pub at: u64,
    /// The new run's id; refused if a run has it.
    pub new_run_id: &'a str,
    /// The new run's input; the original's when `None`.
    pub input: Option<&'a [u8]>,
    /// The version of the run's deployment the fork runs; the original's when `None`.
    pub version: Option<u64>,
}

/// Why a fork was refused. Nothing was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForkRefusal {
    /// Steps are numbered from 1.
    #[error("steps are numbered from 1")]
    AtZero,
    /// The run committed fewer steps than that.
    #[error("the run committed {steps} steps, so there is no step {at} to fork at")]
    PastEnd {
        /// The step asked for.
        at: u64,
        /// The steps the run committed.
        steps: u64,
    },
    /// The checkpoint before that step was collected.
    #[error(
        "the checkpoint before step {at} was collected (a run keeps its last {keep}, the \
         state of its last {} large ones, and after `idem gc --history-before` only its \
         last)",
        HISTORY_KEEP_LARGE
    )]
    HistoryCollected {
        /// The step asked for.
        at: u64,
        /// [`HISTORY_KEEP`].
        keep: u64,
    },
    /// A run has the new run's id.
    #[error("a run with id {} exists", crate::text::quoted(new_run_id))]
    RunExists {
        /// The id asked for.
        new_run_id: String,
    },
    /// Keys of an earlier run with the new run's id are still kept (gc keeps a deleted
    /// run's keys for its dedupe window), and a fork under that id would find them.
    #[error(
        "keys of an earlier run with id {} are still kept (for gc's dedupe window): \
         choose another id",
        crate::text::quoted(new_run_id)
    )]
    KeysRemain {
        /// The id asked for.
        new_run_id: String,
    },
}

/// What [`OperatorStore::fork`](super::OperatorStore::fork) made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forked {
    /// The new run, queued.
    pub record: RunRecord,
    /// The namespace its keys live in: its own.
    pub namespace: String,
    /// Results copied from the original run (its steps before the fork's).
    pub reused: u64,
    /// The step number of the checkpoint it starts from; `None` when the original had
    /// saved none before that step (the fork starts from the beginning, its first steps
    /// finding their results copied).
    pub checkpoint: Option<u64>,
}

/// The namespace a fork's keys live in: the original's name, shortened, and a hash of
/// the fork's id, so that no two forks (and no deployment) share it. Valid as a
/// namespace: letters, digits, `.`, `_`, `-`, at most 64 bytes.
pub fn fork_namespace(namespace: &str, new_run_id: &str) -> String {
    use sha2::{Digest, Sha256};
    let hash = Sha256::digest(new_run_id.as_bytes());
    let hex: String = hash[..8].iter().map(|b| format!("{b:02x}")).collect();
    let head: String = namespace.chars().take(40).collect();
    format!("{head}.fork-{hex}")
}

/// The key a fork keeps a result under that the original run committed as `key`
/// (qualified, in `from_ns`): the fork's namespace, and, for a key the run made for
/// itself (`Key::for_run`: it begins with the run's id and a `/`), the fork's id in the
/// run's place, as the fork's agent derives it. `None` for a key of another namespace.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn fork_key(
    key: &str,
    from_ns: &str,
    to_ns: &str,
    from_run: &str,
    to_run: &str,
) -> Option<String> {
    let rest = key.strip_prefix(from_ns)?.strip_prefix(':')?;
    let rest = match rest
        .strip_prefix(from_run)
        .and_then(|r| r.strip_prefix('/'))
    {
        Some(tail) => format!("{to_run}/{tail}"),
        None => rest.to_owned(),
    };
    Some(super::qualified_key(to_ns, &rest))
}

/// How a fork at step `at` is made from a run's history (positions in order).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ForkPlan {
    /// How many of the run's first steps are copied.
    pub reused: usize,
    /// The checkpoint it starts from, with how many steps came before it.
    pub checkpoint: Option<(Position, u64)>,
}

/// Plans a fork at step `at` of a run whose committed steps stand at `steps` and whose
/// checkpoints stand at `checkpoints` (both in order; each with whether its state is
/// kept), `collected` if older checkpoints were collected.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn plan_fork(
    at: u64,
    steps: &[Position],
    checkpoints: &[(Position, bool)],
    collected: bool,
) -> Result<ForkPlan, ForkRefusal> {
    let total = steps.len() as u64;
    if at == 0 {
        return Err(ForkRefusal::AtZero);
    }
    if at > total {
        return Err(ForkRefusal::PastEnd { at, steps: total });
    }
    let reused = usize::try_from(at - 1).unwrap_or(usize::MAX);
    let cut = steps[reused];
    // The last checkpoint strictly before the step: one saved with the step's own
    // commit stands at its position and already reflects it.
    let before = checkpoints.partition_point(|(p, _)| *p < cut);
    let checkpoint = match before.checked_sub(1) {
        Some(i) if !checkpoints[i].1 => {
            return Err(ForkRefusal::HistoryCollected {
                at,
                keep: HISTORY_KEEP,
            });
        }
        Some(i) => {
            let position = checkpoints[i].0;
            Some((position, steps_before(steps, position)))
        }
        // Collected ones all stood before every kept one: the one wanted may be gone.
        None if collected => {
            return Err(ForkRefusal::HistoryCollected {
                at,
                keep: HISTORY_KEEP,
            });
        }
        None => None,
    };
    Ok(ForkPlan { reused, checkpoint })
}

/// Refuses a fork of run `run_id` (a run of deployment `agent`, on `from` — its version,
/// or its component's digest when it has none — whose exports are `from_exports`) onto
/// version `to`, whose exports are `to_exports`, when the two export different things.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn check_fork_exports(
    run_id: &str,
    agent: &str,
    from: String,
    from_exports: Option<&str>,
    to: u64,
    to_exports: Option<&str>,
) -> Result<(), super::StoreError> {
    match (from_exports, to_exports) {
        (Some(a), Some(b)) if a != b => Err(super::StoreError::ExportsDiffer {
            run_id: run_id.to_owned(),
            name: agent.to_owned(),
            from,
            to,
        }),
        _ => Ok(()),
    }
}

/// The events a fork records: on the original run (`into`, `at`) and on the fork
/// (`from`, `at`, `reused`, `checkpoint`), in that order.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn fork_events(
    req: &ForkRequest<'_>,
    reused: u64,
    checkpoint: Option<u64>,
) -> [super::events::NewEvent; 2] {
    use super::events::NewEvent;
    [
        NewEvent::new(
            super::EventKind::Forked,
            serde_json::json!({ "into": req.new_run_id, "at": req.at }),
        ),
        NewEvent::new(
            super::EventKind::Forked,
            serde_json::json!({
                "from": req.run_id, "at": req.at, "reused": reused, "checkpoint": checkpoint,
            }),
        ),
    ]
}

/// How many of the run's steps (their positions, in order) were committed when the
/// checkpoint at `checkpoint` was saved.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn steps_before(steps: &[Position], checkpoint: Position) -> u64 {
    steps.partition_point(|s| *s <= checkpoint) as u64
}

#[cfg(all(test, any(feature = "sqlite", feature = "postgres")))]
mod tests {
    use super::*;

    fn at(lease: u64, tick: u64) -> Position {
        Position { lease, tick }
    }

    #[test]
    fn ticks_only_grow() {
        let mut last = 0;
        for _ in 0..10_000 {
            let t = tick();
            assert!(t > last);
            last = t;
        }
    }

    #[test]
    fn a_fork_starts_from_the_last_checkpoint_before_its_step() {
        let steps = [at(1, 10), at(1, 20), at(2, 5), at(2, 9), at(2, 30)];
        // Saved with steps 1, 2 and 4's commits, and once alone after step 3.
        let checkpoints = [at(1, 10), at(1, 20), at(2, 7), at(2, 9)].map(|p| (p, true));
        let plan = plan_fork(3, &steps, &checkpoints, false).unwrap();
        assert_eq!(plan.reused, 2);
        assert_eq!(plan.checkpoint, Some((at(1, 20), 2)));
        let plan = plan_fork(4, &steps, &checkpoints, false).unwrap();
        assert_eq!(plan.checkpoint, Some((at(2, 7), 3)));
        let plan = plan_fork(1, &steps, &checkpoints, false).unwrap();
        assert_eq!((plan.reused, plan.checkpoint), (0, None));
        assert_eq!(
            plan_fork(6, &steps, &checkpoints, false),
            Err(ForkRefusal::PastEnd { at: 6, steps: 5 })
        );
        assert_eq!(
            plan_fork(0, &steps, &checkpoints, false),
            Err(ForkRefusal::AtZero)
        );
        // Only the last two kept: step 2's checkpoint is gone.
        assert!(matches!(
            plan_fork(2, &steps, &checkpoints[2..], true),
            Err(ForkRefusal::HistoryCollected { at: 2, .. })
        ));
        assert_eq!(
            plan_fork(5, &steps, &checkpoints[2..], true)
                .unwrap()
                .checkpoint,
            Some((at(2, 9), 4))
        );
        // A large state collected: refused where it is the one to start from, not
        // elsewhere.
        let mut dropped = checkpoints;
        dropped[1].1 = false;
        assert!(matches!(
            plan_fork(3, &steps, &dropped, false),
            Err(ForkRefusal::HistoryCollected { at: 3, .. })
        ));
        assert!(plan_fork(4, &steps, &dropped, false).is_ok());
    }

    #[test]
    fn a_forks_keys_are_its_own() {
        let key = |k| fork_key(k, "ledger", "ledger.fork-1", "r1", "f1");
        assert_eq!(
            key("ledger:r1/pay/ab").as_deref(),
            Some("ledger.fork-1:f1/pay/ab")
        );
        assert_eq!(
            key("ledger:pay/ab").as_deref(),
            Some("ledger.fork-1:pay/ab")
        );
        // Only a whole run id at the start is the run's.
        assert_eq!(
            key("ledger:r10/pay").as_deref(),
            Some("ledger.fork-1:r10/pay")
        );
        assert_eq!(key("other:r1/pay"), None);
        let ns = fork_namespace(&"n".repeat(64), "some-run");
        assert!(ns.len() <= 64, "{ns}");
        assert!(
            ns.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        );
        assert_ne!(ns, fork_namespace(&"n".repeat(64), "other-run"));
    }
}
