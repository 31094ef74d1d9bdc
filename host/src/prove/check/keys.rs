//! The invariants the store's log shows: every clean key committed, and once; no key
//! the clean run did not use (keys computed the same on every instance); progress
//! never saved ahead of the commits it covers.

use std::collections::{BTreeSet, HashMap};

use super::{Baseline, Findings, Observation, step_no};
use crate::prove::observe::Event;
use crate::prove::report::ViolationKind;
use crate::store::StepRecord;

/// What a hint says about keys that change between instances.
const UNSTABLE_HINT: &str = "derive each key from what its step processes (the input, \
    the item, its position); never from the time, an attempt or retry counter, the \
    instance's generation, or randomness: a resumed instance must compute the same key";

/// Checks the keys; returns whether every key the run claimed is one the clean run
/// claimed too.
pub(super) fn keys(obs: &Observation, clean: &Baseline, f: &mut Findings) -> bool {
    let committed: HashMap<&str, &StepRecord> = obs
        .steps
        .iter()
        .map(|s| (obs.guest_key(&s.key), s))
        .collect();
    for (i, key) in clean.keys.iter().enumerate() {
        if committed
            .get(key.as_str())
            .is_none_or(|s| s.committed_at.is_none())
        {
            f.add(
                ViolationKind::KeyNotCommitted,
                step_no(i),
                Some(key),
                format!(
                    "step {}'s key {key_q} was never committed",
                    i + 1,
                    key_q = crate::text::quoted(key)
                ),
            );
        }
    }
    let mut commits: HashMap<&str, u64> = HashMap::new();
    for event in &obs.events {
        if let Event::Commit { key, .. } = event {
            *commits.entry(obs.guest_key(key)).or_insert(0) += 1;
        }
    }
    for (key, n) in commits.into_iter().filter(|(_, n)| *n > 1) {
        f.add(
            ViolationKind::KeyNotCommitted,
            None,
            Some(key),
            format!(
                "key {key_q} was committed {n} times",
                key_q = crate::text::quoted(key)
            ),
        );
    }

    let known: BTreeSet<&str> = clean.keys.iter().map(String::as_str).collect();
    let named = unstable_steps(obs, clean);
    let mut seen = BTreeSet::new();
    let claimed = obs.steps.iter().map(|s| obs.guest_key(&s.key));
    for key in claimed.filter(|k| !known.contains(k)) {
        if !seen.insert(key) {
            continue;
        }
        let (step, detail) = match named.get(key) {
            Some((i, Some(was))) => (
                step_no(*i),
                format!(
                    "step {}'s key changed: {was_q} in the clean run, {key_q} here",
                    i + 1,
                    was_q = crate::text::quoted(was),
                    key_q = crate::text::quoted(key)
                ),
            ),
            Some((i, None)) => (
                step_no(*i),
                format!(
                    "step {} claimed key {key_q}, a step the clean run never reached",
                    i + 1,
                    key_q = crate::text::quoted(key)
                ),
            ),
            None => (
                None,
                format!(
                    "key {key_q} was never claimed by the clean run",
                    key_q = crate::text::quoted(key)
                ),
            ),
        };
        f.add(ViolationKind::UnstableKey, step, Some(key), detail);
        f.hint(UNSTABLE_HINT);
    }
    seen.is_empty()
}

/// For each key the clean run never used, the clean step (0-based) whose place it took,
/// and that step's clean key: each instance's calls are lined up with the clean run's,
/// from a key both share or else from the checkpoint the instance loaded.
fn unstable_steps(obs: &Observation, clean: &Baseline) -> HashMap<String, (usize, Option<String>)> {
    let mut named = HashMap::new();
    for (loaded, calls) in obs.instances() {
        let shared = calls.iter().enumerate().find_map(|(j, key)| {
            let i = clean.calls.iter().position(|c| c == key)?;
            i.checked_sub(j)
        });
        let base = shared
            .or_else(|| loaded.and_then(|step| clean.next_call.get(&step).copied()))
            .unwrap_or(0);
        for (j, key) in calls.iter().enumerate() {
            if clean.calls.contains(key) || named.contains_key(key) {
                continue;
            }
            let i = base + j;
            named.insert(key.clone(), (i, clean.calls.get(i).cloned()));
        }
    }
    named
}

/// Progress is never ahead of commits: whenever the run saved checkpoint step `v`, the
/// keys the clean run had committed by its own save of `v` are committed already.
pub(super) fn progress(obs: &Observation, clean: &Baseline, f: &mut Findings) {
    let mut committed: BTreeSet<&str> = BTreeSet::new();
    let mut reported = false;
    for event in &obs.events {
        let step = match event {
            Event::Commit { key, checkpoint } => {
                committed.insert(obs.guest_key(key));
                *checkpoint
            }
            Event::Save { step } => Some(*step),
            _ => None,
        };
        let Some(step) = step else { continue };
        let Some(n) = clean.committed_by.get(&step) else {
            continue;
        };
        let missing = clean.commit_order[..*n]
            .iter()
            .find(|k| !committed.contains(k.as_str()));
        if let (Some(key), false) = (missing, reported) {
            reported = true;
            let i = clean.keys.iter().position(|k| k == key);
            f.add(
                ViolationKind::ProgressAhead,
                i.and_then(step_no),
                Some(key),
                format!(
                    "checkpoint step {step} was saved before key {key_q} was committed (the \
                     clean run had committed it by then)",
                    key_q = crate::text::quoted(key)
                ),
            );
            f.hint("save progress only after the steps it covers are committed");
        }
    }
}
