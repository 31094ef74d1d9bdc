//! The invariants of child runs: a replay spawns the same children as the clean run —
//! the same keys, so the same child run ids — and stops in the same join. Children are
//! read from the store the scenario left, not from what the agent says: a spawn under
//! a key that changes between instances leaves one more child per replay.

use super::{Baseline, Ended, Findings, Observation};
use crate::prove::report::ViolationKind;

/// The most spawn violations reported per scenario: a key from the clock multiplies
/// every child, and the first few name the mistake.
const SHOWN: usize = 4;

const HINT: &str = "derive a spawn's key from the input and committed results (as a \
                    run_once key is), never from the generation, the time, randomness or a \
                    count of instances: a changed key spawns another child on every replay";

/// Children the clean run did not spawn, and the clean run's children this run did not.
pub(super) fn spawns(obs: &Observation, clean: &Baseline, f: &mut Findings) {
    let extra: Vec<&(String, String)> = obs
        .children
        .iter()
        .filter(|c| !clean.children.contains(c))
        .collect();
    let missing: Vec<&(String, String)> = clean
        .children
        .iter()
        .filter(|c| !obs.children.contains(c))
        .collect();
    let counts = format!(
        "{} children here against {} in the clean run",
        obs.children.len(),
        clean.children.len()
    );
    for (key, child) in extra.iter().take(SHOWN) {
        f.add(
            ViolationKind::UnstableSpawnKey,
            None,
            Some(key),
            format!(
                "spawned child {} under key {} that the clean run never spawned: {counts}",
                crate::text::quoted(child),
                crate::text::quoted(key),
            ),
        );
        f.hint(HINT);
    }
    for (key, child) in missing.iter().take(SHOWN.saturating_sub(extra.len())) {
        f.add(
            ViolationKind::UnstableSpawnKey,
            None,
            Some(key),
            format!(
                "never spawned the clean run's child {} under key {}: {counts}",
                crate::text::quoted(child),
                crate::text::quoted(key),
            ),
        );
        f.hint(HINT);
    }
}

/// A run that stopped in a join where the clean run did not (or in another one).
pub(super) fn join(obs: &Observation, clean: &Baseline, f: &mut Findings) {
    let here = match &obs.ended {
        Ended::AwaitingChildren(key) => Some(key),
        _ => None,
    };
    if here == clean.awaits.as_ref() {
        return;
    }
    let say = |key: Option<&String>| match key {
        Some(key) => format!("waited in join {}", crate::text::quoted(key)),
        None => "did not wait in a join".to_string(),
    };
    f.add(
        ViolationKind::OutputDiffers,
        None,
        here.map(String::as_str),
        format!(
            "the run {} where the clean run {}",
            say(here),
            say(clean.awaits.as_ref())
        ),
    );
}
