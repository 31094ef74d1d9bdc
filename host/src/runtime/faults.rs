//! Planned instance drops: crash points, `--recycle-every`, and seeded chaos.
//!
//! A drop is a trap raised from a host call (or fuel running out mid-computation). The
//! host throws the instance and its resource table away without running any guest code,
//! so everything the guest held is left in the store as a real crash would leave it.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

/// A host-call boundary at which the host can drop the instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// On entry to `run-once`, before the claim transaction.
    BeforeClaim,
    /// The claim is in the store; the guest has not seen it, so no side effect began.
    AfterClaim,
    /// The guest holds the claim and called `commit`: the side effect ran (or began),
    /// nothing is committed. The next instance retakes the claim in doubt.
    InEffect,
    /// The result is committed; the guest has not saved its progress yet.
    AfterCommit,
    /// The progress save that followed the step's commit is durable.
    AfterSave,
    /// On entry to `spawn`, before the transaction that records the child.
    BeforeSpawn,
    /// The child is recorded (and queued); the guest has not seen its id.
    AfterSpawn,
    /// On entry to a join, before the transaction that records it.
    BeforeJoin,
    /// The join's answer is recorded; the guest has not seen it.
    AfterJoin,
}

impl Phase {
    /// Every phase, in the order a step passes them.
    pub const ALL: [Phase; 5] = [
        Phase::BeforeClaim,
        Phase::AfterClaim,
        Phase::InEffect,
        Phase::AfterCommit,
        Phase::AfterSave,
    ];

    /// The phases of a spawn and of a join, in order. A spawn's or a join's step is its
    /// key's place among the keys the run used first (claims, spawns and joins apart
    /// from each other).
    pub const CHILDREN: [Phase; 4] = [
        Phase::BeforeSpawn,
        Phase::AfterSpawn,
        Phase::BeforeJoin,
        Phase::AfterJoin,
    ];

    /// The phase's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Phase::BeforeSpawn => "before-spawn",
            Phase::AfterSpawn => "after-spawn",
            Phase::BeforeJoin => "before-join",
            Phase::AfterJoin => "after-join",
            Phase::BeforeClaim => "before-claim",
            Phase::AfterClaim => "after-claim",
            Phase::InEffect => "in-effect",
            Phase::AfterCommit => "after-commit",
            Phase::AfterSave => "after-save",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A crash point: drop the instance when step `step` (1-based, in the order the run
/// first uses its keys) reaches `phase`. Each point fires once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CrashPoint {
    /// Where in the step.
    pub phase: Phase,
    /// Which step.
    pub step: u32,
}

/// A crash point that could not be parsed.
#[derive(Debug, thiserror::Error)]
#[error(
    "invalid crash point {0:?}: expected PHASE:STEP with PHASE one of before-claim, \
     after-claim, in-effect, after-commit, after-save, before-spawn, after-spawn, \
     before-join, after-join and STEP a number from 1"
)]
pub struct CrashPointError(String);

impl FromStr for CrashPoint {
    type Err = CrashPointError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || CrashPointError(s.to_string());
        let (phase, step) = s.split_once(':').ok_or_else(err)?;
        let phase = Phase::ALL
            .into_iter()
            .chain(Phase::CHILDREN)
            .find(|p| p.name() == phase)
            .ok_or_else(err)?;
        let step: u32 = step.parse().map_err(|_| err())?;
        if step == 0 {
            return Err(err());
        }
        Ok(CrashPoint { phase, step })
    }
}

impl fmt::Display for CrashPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.phase, self.step)
    }
}

/// Which drops to make during a run.
#[derive(Debug, Clone, Default)]
pub struct FaultPlan {
    /// Crash points still to fire.
    pub crash_at: Vec<CrashPoint>,
    /// Drop each instance once it has been granted this many claims (at its next
    /// `run-once`). Counting claims, not calls, guarantees progress even for an agent
    /// that never saves a checkpoint.
    pub recycle_every: Option<u32>,
    /// Seed for random drops at host-call boundaries and random fuel budgets that end
    /// instances mid-computation. The same seed gives the same drops for the same agent.
    pub chaos: Option<u64>,
}

/// Why the host dropped an instance: the payload of the trap that ends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recycle {
    /// What triggered the drop.
    pub reason: String,
}

impl fmt::Display for Recycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "instance dropped by the host: {}", self.reason)
    }
}

impl std::error::Error for Recycle {}

/// One drop in ten at each boundary: enough to hit every phase in a 20-step run, few
/// enough that runs finish in a handful of instances.
const CHAOS_DROP_ONE_IN: u32 = 10;
/// Fuel budgets for chaos instances: from a few loop iterations to a whole short run.
const CHAOS_FUEL: std::ops::Range<u64> = 20_000..20_000_000;

/// The live state of a [`FaultPlan`] over a run: kept across the drives of one
/// foreground call, so that each crash point fires once however often the run
/// suspends and is driven again. The default plans nothing.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    pending: Vec<CrashPoint>,
    recycle_every: Option<u32>,
    chaos: Option<fastrand::Rng>,
    /// Each key's step number: its place in the order the run first used keys of its
    /// kind (1-based): claims, spawns and joins are numbered apart. Kept only while a
    /// crash point is pending or chaos is on, the only things that name steps, so that
    /// a long run's memory does not grow with its keys.
    steps: HashMap<String, u32>,
    /// Keys numbered so far, per kind: claims, spawns, joins.
    numbered: [u32; 3],
}

/// Which count a key is numbered in: the imports name a spawn's key `\0spawn\0KEY` and
/// a join's `\0join\0KEY` ("\0" never begins an agent's key).
fn kind_of(key: &str) -> usize {
    if key.starts_with("\0spawn\0") {
        1
    } else if key.starts_with("\0join\0") {
        2
    } else {
        0
    }
}

impl Faults {
    pub(crate) fn new(plan: &FaultPlan) -> Self {
        Faults {
            pending: plan.crash_at.clone(),
            recycle_every: plan.recycle_every,
            chaos: plan.chaos.map(fastrand::Rng::with_seed),
            steps: HashMap::new(),
            numbered: [0; 3],
        }
    }

    /// Whether anything still names steps.
    fn numbers_steps(&self) -> bool {
        !self.pending.is_empty() || self.chaos.is_some()
    }

    /// The step number of `key` (1-based, in the order the run first used its keys), or
    /// 0 once nothing names steps any more.
    pub(crate) fn step_of(&mut self, key: &str) -> u32 {
        if !self.numbers_steps() {
            return 0;
        }
        if let Some(&step) = self.steps.get(key) {
            return step;
        }
        let count = &mut self.numbered[kind_of(key)];
        *count = count.saturating_add(1);
        let next = *count;
        self.steps.insert(key.to_owned(), next);
        next
    }

    /// Decides whether to drop the instance at `phase` of step `step`, given how many
    /// claims the instance was granted so far.
    pub(crate) fn check(&mut self, phase: Phase, step: u32, grants: u32) -> Result<(), Recycle> {
        if let Some(i) = self
            .pending
            .iter()
            .position(|p| p.phase == phase && p.step == step)
        {
            let point = self.pending.swap_remove(i);
            if !self.numbers_steps() {
                self.steps = HashMap::new();
                self.numbered = [0; 3];
            }
            return Err(Recycle {
                reason: format!("crash point {point}"),
            });
        }
        if phase == Phase::BeforeClaim
            && let Some(n) = self.recycle_every
            && grants >= n
        {
            return Err(Recycle {
                reason: format!("recycle after {n} claims"),
            });
        }
        if let Some(rng) = &mut self.chaos
            && rng.u32(..CHAOS_DROP_ONE_IN) == 0
        {
            return Err(Recycle {
                reason: format!("chaos at {phase}:{step}"),
            });
        }
        Ok(())
    }

    /// The fuel budget of the next instance: `None` means unlimited.
    pub(crate) fn fuel_budget(&mut self) -> Option<u64> {
        let rng = self.chaos.as_mut()?;
        rng.bool().then(|| rng.u64(CHAOS_FUEL))
    }

    /// Whether fuel running out means a planned drop rather than a runaway guest.
    pub(crate) fn chaos(&self) -> bool {
        self.chaos.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_points_parse_and_print() {
        for phase in Phase::ALL.into_iter().chain(Phase::CHILDREN) {
            let text = format!("{phase}:7");
            let point: CrashPoint = text.parse().unwrap();
            assert_eq!(point, CrashPoint { phase, step: 7 });
            assert_eq!(point.to_string(), text);
        }
        for bad in [
            "",
            "after-claim",
            "after-claim:0",
            "nowhere:3",
            "in-effect:x",
        ] {
            let err = bad.parse::<CrashPoint>().unwrap_err();
            assert!(err.to_string().contains("invalid crash point"), "{err}");
        }
    }

    #[test]
    fn a_crash_point_fires_once() {
        let mut faults = Faults::new(&FaultPlan {
            crash_at: vec!["in-effect:2".parse().unwrap()],
            ..FaultPlan::default()
        });
        assert!(faults.check(Phase::InEffect, 1, 0).is_ok());
        assert!(faults.check(Phase::InEffect, 2, 0).is_err());
        assert!(faults.check(Phase::InEffect, 2, 0).is_ok());
    }

    #[test]
    fn steps_are_numbered_only_while_something_names_them() {
        let mut faults = Faults::new(&FaultPlan {
            crash_at: vec!["after-claim:2".parse().unwrap()],
            ..FaultPlan::default()
        });
        assert_eq!(faults.step_of("a"), 1);
        assert_eq!(faults.step_of("b"), 2);
        assert_eq!(faults.step_of("a"), 1, "a key keeps its number");
        // Spawns and joins are numbered apart from claims, and from each other.
        assert_eq!(faults.step_of("\0spawn\0a"), 1);
        assert_eq!(faults.step_of("\0join\0all"), 1);
        assert_eq!(faults.step_of("\0spawn\0b"), 2);
        assert_eq!(faults.step_of("c"), 3);
        assert!(faults.check(Phase::AfterClaim, 2, 0).is_err());
        // The last point fired: nothing names steps, and nothing is kept for them.
        assert_eq!(faults.step_of("d"), 0);
        assert!(faults.steps.is_empty());

        let mut quiet = Faults::new(&FaultPlan {
            recycle_every: Some(5),
            ..FaultPlan::default()
        });
        for i in 0..1000 {
            assert_eq!(quiet.step_of(&format!("k{i}")), 0);
        }
        assert!(quiet.steps.is_empty());

        let mut chaos = Faults::new(&FaultPlan {
            chaos: Some(1),
            ..FaultPlan::default()
        });
        assert_eq!((chaos.step_of("x"), chaos.step_of("y")), (1, 2));
    }

    #[test]
    fn recycle_every_counts_claims_at_claim_time() {
        let mut faults = Faults::new(&FaultPlan {
            recycle_every: Some(3),
            ..FaultPlan::default()
        });
        assert!(faults.check(Phase::BeforeClaim, 1, 2).is_ok());
        assert!(faults.check(Phase::AfterSave, 1, 3).is_ok());
        assert!(faults.check(Phase::BeforeClaim, 4, 3).is_err());
    }

    #[test]
    fn chaos_is_deterministic_per_seed() {
        let run = |seed| {
            let mut faults = Faults::new(&FaultPlan {
                chaos: Some(seed),
                ..FaultPlan::default()
            });
            (0..200)
                .map(|i| faults.check(Phase::ALL[i % 5], i as u32, 0).is_err())
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        assert!(run(7).iter().any(|d| *d));
    }
}
