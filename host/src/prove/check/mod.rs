//! The invariants: what one scenario did, held against what the clean run did. Every
//! check reads observations only — the store's log of the run (`observe.rs`), the
//! store's final state, the capture's requests and the granted directories — never
//! what the agent says about itself.
//!
//! `observation.rs`: what is checked; `keys.rs`: the invariants of the store's log;
//! `effects.rs`: the invariants of the side effects downstream; `children.rs`: the
//! spawns and the join.

mod children;
mod effects;
mod keys;
mod observation;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;

pub(crate) use observation::{Baseline, Ended, Files, Observation};

use super::report::{Violation, ViolationKind};
use effects::{added_lines, files, http_effects, outside_claims};
use keys::{keys, progress};

/// What the checks of one scenario found.
#[derive(Debug, Default)]
pub(crate) struct Findings {
    pub(crate) violations: Vec<Violation>,
    pub(crate) effects: u64,
    pub(crate) duplicates_in_doubt: u64,
}

impl Findings {
    pub(super) fn add(
        &mut self,
        kind: ViolationKind,
        step: Option<u32>,
        key: Option<&str>,
        detail: String,
    ) {
        self.violations.push(Violation {
            kind,
            step,
            key: key.map(str::to_string),
            detail,
            hint: None,
        });
    }

    pub(super) fn hint(&mut self, hint: &str) {
        if let Some(last) = self.violations.last_mut() {
            last.hint = Some(hint.to_string());
        }
    }
}

/// The 1-based step number of the clean run's key at `index`.
pub(super) fn step_no(index: usize) -> Option<u32> {
    u32::try_from(index + 1).ok()
}

/// Checks every invariant of one scenario against the clean run. `clean` is `None`
/// for the clean run itself, which is checked only for what needs no comparison.
/// `before` is what the granted directories held before any run.
pub(crate) fn check(obs: &Observation, clean: Option<&Baseline>, before: &Files) -> Findings {
    let mut f = Findings {
        effects: obs.captured.exchanges.len() as u64 + added_lines(&obs.files, Some(before)),
        ..Findings::default()
    };
    match &obs.ended {
        Ended::Completed(output) => {
            if let Some(clean) = clean
                && *output != clean.output
            {
                f.add(
                    ViolationKind::OutputDiffers,
                    None,
                    None,
                    output_difference(&clean.output, output),
                );
                f.hint(
                    "compute the output only from committed results and the input (never \
                     from the generation, the time, or counts of what this instance ran)",
                );
            }
        }
        // Children are not run by a proof: a run that waits for them is checked up to
        // its join (against the clean run's join, below).
        Ended::AwaitingChildren(_) => {}
        Ended::Not(why) => f.add(
            ViolationKind::NotCompleted,
            None,
            None,
            format!(
                "the run did not complete: {}",
                crate::runtime::cut(why, 400)
            ),
        ),
    }
    outside_claims(obs, &mut f);
    for claim in &obs.open {
        let key = obs.guest_key(&claim.key);
        f.add(
            ViolationKind::OpenClaims,
            None,
            Some(key),
            format!(
                "key {key_q} is still claimed (attempt {}, token {}) after the run ended",
                claim.attempt,
                claim.token,
                key_q = crate::text::quoted(key)
            ),
        );
    }
    let Some(clean) = clean else {
        return f;
    };
    let stable = keys(obs, clean, &mut f);
    children::spawns(obs, clean, &mut f);
    if matches!(obs.ended, Ended::AwaitingChildren(_)) || clean.awaits.is_some() {
        children::join(obs, clean, &mut f);
    }
    http_effects(obs, clean, &mut f);
    // Against keys that changed, the clean run's checkpoints say nothing: the steps
    // they cover were committed under other keys.
    if stable {
        progress(obs, clean, &mut f);
    }
    files(obs, clean, &mut f);
    // The cause first: a changed key explains the keys left uncommitted, and so on.
    f.violations.sort_by_key(|v| rank(v.kind));
    f
}

fn rank(kind: ViolationKind) -> u8 {
    match kind {
        ViolationKind::UnstableKey | ViolationKind::UnstableSpawnKey => 0,
        ViolationKind::EffectOutsideClaim => 1,
        ViolationKind::DuplicateEffect => 2,
        ViolationKind::OutputDiffers => 3,
        ViolationKind::ProgressAhead => 4,
        ViolationKind::NotCompleted => 5,
        ViolationKind::KeyNotCommitted => 6,
        ViolationKind::OpenClaims => 7,
        _ => 8,
    }
}

/// The difference between two outputs, in a line: the JSON fields that differ when both
/// are JSON objects, else both texts, cut.
fn output_difference(clean: &[u8], here: &[u8]) -> String {
    use serde_json::Value;
    if let (Ok(Value::Object(a)), Ok(Value::Object(b))) = (
        serde_json::from_slice::<Value>(clean),
        serde_json::from_slice::<Value>(here),
    ) {
        let fields: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
        let diffs: Vec<String> = fields
            .into_iter()
            .filter(|k| a.get(*k) != b.get(*k))
            .take(4)
            .map(|k| {
                let show = |v: Option<&Value>| v.map_or("(missing)".to_string(), Value::to_string);
                format!(
                    "{k}: {} in the clean run, {} here",
                    crate::runtime::cut(&show(a.get(k)), 80),
                    crate::runtime::cut(&show(b.get(k)), 80)
                )
            })
            .collect();
        return format!("output differs from the clean run's: {}", diffs.join("; "));
    }
    format!(
        "output differs from the clean run's: {} in the clean run, {} here",
        crate::runtime::cut(&String::from_utf8_lossy(clean), 200),
        crate::runtime::cut(&String::from_utf8_lossy(here), 200)
    )
}
