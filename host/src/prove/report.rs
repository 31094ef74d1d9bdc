//! What a proof found: one report per scenario, each violation with its kind, the step
//! and key it concerns, and the totals a CI reads.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use crate::runtime::CrashPoint;

/// One way the agent was run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Scenario {
    /// The uninterrupted run every other scenario is compared with.
    Clean,
    /// Dropped once at a crash point, resumed to the end.
    Crash {
        /// Where.
        #[serde(serialize_with = "display")]
        point: CrashPoint,
    },
    /// Dropped at random host calls and mid-computation, from a seed.
    Chaos {
        /// The seed.
        seed: u64,
    },
    /// Processes killed with SIGKILL at random moments, each resumed by a new one.
    Kills {
        /// How many kills were asked for.
        kills: u32,
        /// The seed of the moments.
        seed: u64,
    },
}

fn display<S: serde::Serializer>(value: &impl fmt::Display, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(value)
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scenario::Clean => f.write_str("clean"),
            Scenario::Crash { point } => write!(f, "{point}"),
            Scenario::Chaos { seed } => write!(f, "chaos {seed}"),
            Scenario::Kills { kills, seed } => write!(f, "{kills} kills (seed {seed})"),
        }
    }
}

/// The kinds of violation, one per invariant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum ViolationKind {
    /// The run did not complete (an error, a trap, a limit, in doubt).
    NotCompleted,
    /// A key of the clean run was not committed (or committed more than once).
    KeyNotCommitted,
    /// A side effect ran again under its key without a retake in doubt to explain it.
    DuplicateEffect,
    /// A key the clean run never used: derived from something that changes between
    /// instances (time, an attempt counter, the generation, randomness).
    UnstableKey,
    /// A side effect made while no claim was held: refused by the host, or repeated
    /// with no key to dedupe it.
    EffectOutsideClaim,
    /// The output differs from the clean run's.
    OutputDiffers,
    /// A checkpoint was saved before the steps it follows were committed.
    ProgressAhead,
    /// Claims still open when the run ended.
    OpenClaims,
    /// The granted directories do not hold what the clean run left in them.
    FilesDiffer,
    /// A child the clean run never spawned (or one of its children never spawned): the
    /// spawn's key changes between instances, so children multiply on replay.
    UnstableSpawnKey,
}

impl ViolationKind {
    /// Every kind, in report order.
    pub const ALL: [ViolationKind; 10] = [
        ViolationKind::NotCompleted,
        ViolationKind::KeyNotCommitted,
        ViolationKind::DuplicateEffect,
        ViolationKind::UnstableKey,
        ViolationKind::EffectOutsideClaim,
        ViolationKind::OutputDiffers,
        ViolationKind::ProgressAhead,
        ViolationKind::OpenClaims,
        ViolationKind::FilesDiffer,
        ViolationKind::UnstableSpawnKey,
    ];

    /// The kind's name, as reports spell it.
    pub fn name(self) -> &'static str {
        match self {
            ViolationKind::NotCompleted => "not-completed",
            ViolationKind::KeyNotCommitted => "key-not-committed",
            ViolationKind::DuplicateEffect => "duplicate-effect",
            ViolationKind::UnstableKey => "unstable-key",
            ViolationKind::EffectOutsideClaim => "effect-outside-claim",
            ViolationKind::OutputDiffers => "output-differs",
            ViolationKind::ProgressAhead => "progress-ahead",
            ViolationKind::OpenClaims => "open-claims",
            ViolationKind::FilesDiffer => "files-differ",
            ViolationKind::UnstableSpawnKey => "unstable-spawn-key",
        }
    }
}

impl fmt::Display for ViolationKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// Which invariant.
    pub kind: ViolationKind,
    /// The step it concerns (1-based, in the clean run's order), if one.
    pub step: Option<u32>,
    /// The key it concerns, as the agent wrote it, if one.
    pub key: Option<String>,
    /// What was seen.
    pub detail: String,
    /// What usually causes it.
    pub hint: Option<String>,
}

/// What one scenario did and broke.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScenarioReport {
    /// How the agent was run.
    pub scenario: Scenario,
    /// Whether the planned fault happened: a crash point past the run's last step, or
    /// at a save the agent never makes, leaves an uninterrupted run.
    pub reached: bool,
    /// Instances created.
    pub instances: u64,
    /// In the kill scenario: the kills that landed on a live process (one that had not
    /// finished the run yet).
    pub kills: Option<u32>,
    /// Side effects observed: HTTP requests captured, and lines added to granted files.
    pub effects: u64,
    /// Effects repeated under a claim retaken in doubt (same key, higher token): the
    /// in-doubt window, flagged to the agent and allowed.
    pub duplicates_in_doubt: u64,
    /// What broke.
    pub violations: Vec<Violation>,
    /// Wall time, in milliseconds.
    pub millis: u64,
}

impl ScenarioReport {
    /// Whether nothing broke.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

/// What the clean run showed of the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CleanRun {
    /// The keys the run claimed, in the order it first claimed them (as the agent wrote
    /// them): step N is the N-th.
    pub keys: Vec<String>,
    /// The output, as text (lossy).
    pub output: String,
    /// HTTP requests it made.
    pub requests: u64,
    /// The keys it spawned children under, in the order first spawned.
    pub spawns: Vec<String>,
    /// The join it stopped in, if it did: a proof spawns children (recorded in the
    /// scratch store, as a run would) but never runs them, so a join waiting for them
    /// ends each scenario there, and everything up to it is checked.
    pub awaits: Option<String>,
}

/// Totals over every scenario.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Scenarios run, the clean one included.
    pub scenarios: u64,
    /// Scenarios with no violation.
    pub passed: u64,
    /// Side effects observed.
    pub effects: u64,
    /// Effects repeated under a retake in doubt.
    pub duplicates_in_doubt: u64,
    /// Violations, all kinds.
    pub violations: u64,
    /// Violations per kind.
    pub by_kind: BTreeMap<ViolationKind, u64>,
}

/// Everything a proof found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProveReport {
    /// The run id every scenario used.
    pub run_id: String,
    /// The clean run.
    pub clean: CleanRun,
    /// Every scenario, the clean one first.
    pub scenarios: Vec<ScenarioReport>,
    /// What the proof left out, and why.
    pub notes: Vec<String>,
    /// The totals.
    pub summary: Summary,
}

impl ProveReport {
    pub(crate) fn new(
        run_id: String,
        clean: CleanRun,
        scenarios: Vec<ScenarioReport>,
        notes: Vec<String>,
    ) -> Self {
        let mut summary = Summary::default();
        for s in &scenarios {
            summary.scenarios += 1;
            summary.passed += u64::from(s.passed());
            summary.effects += s.effects;
            summary.duplicates_in_doubt += s.duplicates_in_doubt;
            summary.violations += s.violations.len() as u64;
            for v in &s.violations {
                *summary.by_kind.entry(v.kind).or_insert(0) += 1;
            }
        }
        ProveReport {
            run_id,
            clean,
            scenarios,
            notes,
            summary,
        }
    }

    /// Whether no invariant broke anywhere.
    pub fn passed(&self) -> bool {
        self.summary.violations == 0
    }
}
