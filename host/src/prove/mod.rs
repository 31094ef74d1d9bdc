//! Proving an agent: run it once cleanly, then crashed at every crash point (and in
//! seeded chaos, and under real `SIGKILL`s), each time in a fresh scratch store, and
//! check after each that its side effects happened as often as the clean run's — once,
//! or again only under a claim retaken in doubt — under the same keys, with the same
//! output.
//!
//! Side effects are observed, not inferred from what the agent says: outbound HTTP is
//! answered by a capture (`capture.rs`; the clean run's requests go out once and the
//! answers are replayed to every other scenario), the directories granted to the agent
//! are fresh copies per scenario, compared with the clean run's afterwards, and the
//! store's log of the run (`observe.rs`) shows every claim, commit and checkpoint,
//! spawn and join.
//!
//! Child runs are recorded, not run: a spawn writes its child to the scratch store as
//! it would to a real one (so a replay that spawns under another key leaves another
//! child, which the checks catch), and nothing drives the child. A join waiting for
//! children ends the scenario there: each scenario is checked up to that join, and
//! the report says so.
//!
//! # Layout
//! - `mod.rs`: [`ProveOptions`], [`prove`], [`ProveError`].
//! - `scenario.rs`: a scratch store and copied grants; one scenario in this process.
//! - `kills.rs`: the scenario of killed processes.
//! - `capture.rs`: the HTTP capture; `file_capture.rs`: the same across processes.
//! - `observe.rs`: the store wrapper that logs what a run did.
//! - `rehearse.rs`: an upgrade rehearsed against the runs in flight of a real store.
//! - `check/`: the invariants. `report.rs`: what a proof found.

mod capture;
mod check;
mod file_capture;
mod kills;
mod observe;
mod rehearse;
mod report;
mod scenario;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

pub use capture::{StubError, Upstream};
pub use file_capture::FileCapture;
pub use kills::{ChildCommand, ChildRun, Kills};
pub use rehearse::{
    Next, RepeatedStep, RunRehearsal, UpgradeRehearsal, UpgradeReport, Verdict, Walk,
    rehearse_upgrade,
};
pub use report::{
    CleanRun, ProveReport, Scenario, ScenarioReport, Summary, Violation, ViolationKind,
};

use crate::runtime::{Authority, CrashPoint, FaultPlan, HostError, LoadedAgent, Phase, Runtime};
use crate::store::StoreError;
use capture::{Answers, Recorder};
use check::{Baseline, Ended, Files, Observation, check};
use scenario::{InProcess, Scratch};

/// What to prove and how hard.
#[derive(Debug, Clone)]
pub struct ProveOptions {
    /// The run id every scenario uses: keys derived from it are the same in each.
    pub run_id: String,
    /// The run's input.
    pub input: Vec<u8>,
    /// What the agent may reach. Each scenario gets a fresh copy of every granted
    /// directory; the originals are never written.
    pub authority: Authority,
    /// The namespace, if not the agent's name.
    pub namespace: Option<String>,
    /// The phases to crash at.
    pub phases: Vec<Phase>,
    /// Crash at steps 1 to this (all the clean run's steps if `None`).
    pub steps: Option<u32>,
    /// Seeds of chaos scenarios.
    pub chaos: Vec<u64>,
    /// Real kills of child processes, if any.
    pub kills: Option<Kills>,
    /// Where the clean run's HTTP requests go.
    pub upstream: Upstream,
    /// Where scratch directories are made (each removed when its scenario is done).
    pub scratch: PathBuf,
}

/// Why a proof could not be carried out (a broken invariant is not one: it is in the
/// report).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProveError {
    /// Scratch space could not be made, filled or read.
    #[error("cannot use scratch space {}: {source}", path.display())]
    Scratch {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The host failed.
    #[error(transparent)]
    Host(#[from] HostError),
    /// A scratch store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A process of the kill scenario could not be started or waited for.
    #[error("cannot run a process of the kill scenario: {0}")]
    Process(String),
}

/// How far a proof got: reported to the caller as it goes.
#[derive(Debug, Clone, Copy)]
pub enum Progress<'a> {
    /// The clean run is done, and this many scenarios (it included) will run.
    Planned {
        /// Scenarios in all.
        scenarios: usize,
    },
    /// A scenario is done.
    Finished(&'a ScenarioReport),
}

/// Proves `agent` as `opts` says, telling `progress` as it goes.
pub async fn prove(
    runtime: &Arc<Runtime>,
    agent: &LoadedAgent,
    opts: &ProveOptions,
    progress: &mut (dyn FnMut(Progress<'_>) + Send),
) -> Result<ProveReport, ProveError> {
    let ctx = InProcess {
        runtime,
        agent,
        run_id: &opts.run_id,
        input: &opts.input,
        namespace: opts.namespace.as_deref(),
    };
    std::fs::create_dir_all(&opts.scratch).map_err(|source| ProveError::Scratch {
        path: opts.scratch.clone(),
        source,
    })?;
    let started = Instant::now();
    let scratch = Scratch::new(&opts.scratch, &opts.authority)?;
    let before = scratch.files()?;
    let recorder = Arc::new(Recorder::forward(opts.upstream.clone()));
    let clean = ctx.run(&scratch, FaultPlan::default(), recorder).await?;
    drop(scratch);
    let clean_report = report(Scenario::Clean, &clean, None, &before, started);
    let output = match &clean.ended {
        Ended::Completed(output) => output.clone(),
        Ended::AwaitingChildren(_) => Vec::new(),
        Ended::Not(_) => {
            // Nothing to compare with: the clean run's failure is the finding.
            progress(Progress::Planned { scenarios: 1 });
            progress(Progress::Finished(&clean_report));
            let clean_run = clean_run(&clean, &[]);
            return Ok(ProveReport::new(
                opts.run_id.clone(),
                clean_run,
                vec![clean_report],
                Vec::new(),
            ));
        }
    };
    let baseline = Baseline::new(&clean, output);
    let answers = Arc::new(Answers::new(clean.captured.exchanges.clone()));
    let (plan, notes) = plan(opts, &baseline);
    progress(Progress::Planned {
        scenarios: plan.len() + 1,
    });
    progress(Progress::Finished(&clean_report));

    let mut reports = vec![clean_report];
    for scenario in plan {
        let started = Instant::now();
        let scratch = Scratch::new(&opts.scratch, &opts.authority)?;
        let Some(observed) = observe(&ctx, opts, scenario, &scratch, &answers).await? else {
            continue;
        };
        let report = report(scenario, &observed, Some(&baseline), &before, started);
        progress(Progress::Finished(&report));
        reports.push(report);
    }
    let mut clean_run = clean_run(&clean, &baseline.keys);
    clean_run.spawns.clone_from(&baseline.spawns);
    Ok(ProveReport::new(
        opts.run_id.clone(),
        clean_run,
        reports,
        notes,
    ))
}

/// The scenarios after the clean run: a crash at each phase of each of the clean run's
/// steps (up to `opts.steps`; a spawn's phases at each of its spawns, a join's at each
/// of its joins), each chaos seed, and the kills if asked for; and what was left out.
fn plan(opts: &ProveOptions, baseline: &Baseline) -> (Vec<Scenario>, Vec<String>) {
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    let mut plan = Vec::new();
    let mut notes = Vec::new();
    for &phase in &opts.phases {
        let steps = match phase {
            Phase::BeforeSpawn | Phase::AfterSpawn => count(baseline.spawns.len()),
            Phase::BeforeJoin | Phase::AfterJoin => count(baseline.joins.len()),
            _ => count(baseline.keys.len()),
        };
        let upto = opts.steps.map_or(steps, |n| n.min(steps));
        for step in 1..=upto {
            plan.push(Scenario::Crash {
                point: CrashPoint { phase, step },
            });
        }
    }
    plan.extend(opts.chaos.iter().map(|&seed| Scenario::Chaos { seed }));
    if let Some(key) = &baseline.awaits {
        notes.push(format!(
            "children not run: the run spawned {} children and waits for them in join {}; \
             idem prove records each spawn in its scratch store but runs no child, so every \
             scenario was checked up to that join (the same children spawned, once each, \
             under the same keys) and after-join crash points are never reached",
            baseline.children.len(),
            crate::text::quoted(key)
        ));
    }
    if let Some(kills) = &opts.kills {
        if baseline.spawns.is_empty() {
            plan.push(Scenario::Kills {
                kills: kills.count,
                seed: kills.seed,
            });
        } else {
            notes.push(
                "kills not run: the agent spawns children, whose deployments the scratch \
                 store of the killed processes does not hold"
                    .to_string(),
            );
        }
    }
    (plan, notes)
}

/// Runs one scenario after the clean run in `scratch`, its HTTP answered from the clean
/// run's `answers`; `None` for a scenario that is not run here.
async fn observe(
    ctx: &InProcess<'_>,
    opts: &ProveOptions,
    scenario: Scenario,
    scratch: &Scratch,
    answers: &Arc<Answers>,
) -> Result<Option<Observation>, ProveError> {
    let faults = match scenario {
        Scenario::Crash { point } => FaultPlan {
            crash_at: vec![point],
            ..FaultPlan::default()
        },
        Scenario::Chaos { seed } => FaultPlan {
            chaos: Some(seed),
            ..FaultPlan::default()
        },
        Scenario::Kills { .. } => {
            return match &opts.kills {
                Some(kills) => Ok(Some(
                    kills.run(&opts.scratch, scratch, opts, answers).await?,
                )),
                None => Ok(None),
            };
        }
        Scenario::Clean => return Ok(None),
    };
    let capture = Arc::new(Recorder::replay(Arc::clone(answers)));
    Ok(Some(ctx.run(scratch, faults, capture).await?))
}

fn clean_run(clean: &Observation, keys: &[String]) -> CleanRun {
    CleanRun {
        keys: keys.to_vec(),
        output: match &clean.ended {
            Ended::Completed(output) => String::from_utf8_lossy(output).into_owned(),
            Ended::Not(why) => why.clone(),
            Ended::AwaitingChildren(key) => {
                format!("(none: waits in join {})", crate::text::quoted(key))
            }
        },
        requests: clean.captured.exchanges.len() as u64,
        spawns: Vec::new(),
        awaits: match &clean.ended {
            Ended::AwaitingChildren(key) => Some(key.clone()),
            _ => None,
        },
    }
}

fn report(
    scenario: Scenario,
    observed: &Observation,
    baseline: Option<&Baseline>,
    before: &Files,
    started: Instant,
) -> ScenarioReport {
    let found = check(observed, baseline, before);
    ScenarioReport {
        scenario,
        reached: match scenario {
            Scenario::Clean => true,
            Scenario::Kills { .. } => observed.kills.is_some_and(|k| k > 0),
            Scenario::Crash { .. } | Scenario::Chaos { .. } => observed.instances > 1,
        },
        kills: observed.kills,
        instances: observed.instances,
        effects: found.effects,
        duplicates_in_doubt: found.duplicates_in_doubt,
        violations: found.violations,
        millis: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    }
}
