//! The invariants the side effects show downstream: HTTP requests and the lines of
//! files in granted directories repeated no more than retakes in doubt explain, and no
//! request made outside a claim.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{Baseline, Files, Findings, Observation, step_no};
use crate::prove::report::ViolationKind;
use crate::runtime::DenialKind;

/// Each key's HTTP requests against the clean run's: repeats only under rising tokens
/// that retakes in doubt explain, and none outside a claim.
pub(super) fn http_effects(obs: &Observation, clean: &Baseline, f: &mut Findings) {
    let mut by_key: BTreeMap<Option<&str>, Vec<Option<u64>>> = BTreeMap::new();
    for e in &obs.captured.exchanges {
        by_key.entry(e.key.as_deref()).or_default().push(e.token);
    }
    let in_doubt = obs.in_doubt_grants();
    let attempts: HashMap<&str, u32> = obs
        .steps
        .iter()
        .map(|s| (obs.guest_key(&s.key), s.attempt))
        .collect();
    for (key, tokens) in by_key {
        let clean_n = clean
            .requests
            .get(&key.map(str::to_string))
            .copied()
            .unwrap_or(0);
        let n = tokens.len() as u64;
        if n <= clean_n {
            continue;
        }
        let extra = n - clean_n;
        let Some(key) = key else {
            f.add(
                ViolationKind::EffectOutsideClaim,
                None,
                None,
                format!(
                    "{n} requests made outside any claim, {clean_n} in the clean run: they \
                     ran again on replay, with no key for a downstream to dedupe them"
                ),
            );
            f.hint("make side effects inside run_once, where they carry the step's key");
            continue;
        };
        // Without the store's log (other processes ran it), a retake in doubt shows as
        // a later attempt; every grant after a key's first is one, or a release.
        let retakes = if obs.events.is_empty() {
            u64::from(attempts.get(key).copied().unwrap_or(1).saturating_sub(1))
        } else {
            in_doubt.get(key).copied().unwrap_or(0)
        };
        let rising = tokens.windows(2).all(|w| w[0] <= w[1]) && tokens.first() < tokens.last();
        if rising && extra <= retakes * clean_n.max(1) {
            f.duplicates_in_doubt += extra;
        } else {
            let step = clean.keys.iter().position(|k| k == key).and_then(step_no);
            f.add(
                ViolationKind::DuplicateEffect,
                step,
                Some(key),
                format!(
                    "{n} requests under key {key_q} (tokens {}), {clean_n} in the clean run, \
                     with {retakes} retakes in doubt to explain repeats",
                    tokens
                        .iter()
                        .map(|t| t.map_or("-".to_string(), |t| t.to_string()))
                        .collect::<Vec<_>>()
                        .join(", "),
                    key_q = crate::text::quoted(key)
                ),
            );
        }
    }
}

/// Requests the gate refused because they were made outside any claim: one finding
/// per request, however many instances made it again.
pub(super) fn outside_claims(obs: &Observation, f: &mut Findings) {
    // One finding per request, however many instances made it again.
    let mut refused: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    for denial in &obs.captured.denials {
        if denial.kind == DenialKind::OutsideClaim {
            *refused
                .entry((denial.method.as_str(), denial.url.as_str()))
                .or_insert(0) += 1;
        }
    }
    for ((method, url), times) in refused {
        let times = match times {
            1 => "once".to_string(),
            n => format!("{n} times"),
        };
        f.add(
            ViolationKind::EffectOutsideClaim,
            None,
            None,
            format!(
                "{method} {url} was made outside any run-once claim ({times}); the host refused \
                 it (without the gate it would have gone out, unkeyed, on every replay)"
            ),
        );
        f.hint(
            "make the request inside run_once's closure, where it carries the step's \
             idempotency key and fencing token",
        );
    }
}

/// Lines in `files` beyond those in `before` (every line of a file `before` lacks).
pub(super) fn added_lines(files: &Files, before: Option<&Files>) -> u64 {
    files
        .iter()
        .map(|(path, bytes)| {
            let old = before.and_then(|b| b.get(path)).map_or(0, |b| lines(b));
            lines(bytes).saturating_sub(old)
        })
        .sum()
}

fn lines(bytes: &[u8]) -> u64 {
    bytes
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .count() as u64
}

/// The granted directories against the clean run's: the same files, and no more lines
/// in any than retakes in doubt explain. Content may differ (an agent may log tokens).
pub(super) fn files(obs: &Observation, clean: &Baseline, f: &mut Findings) {
    let retakes = if obs.events.is_empty() {
        obs.reclaimed
    } else {
        obs.in_doubt_grants().values().sum()
    };
    let paths: BTreeSet<&String> = obs.files.keys().chain(clean.files.keys()).collect();
    for path in paths {
        match (clean.files.get(path), obs.files.get(path)) {
            (Some(_), None) => f.add(
                ViolationKind::FilesDiffer,
                None,
                None,
                format!("{path}, which the clean run wrote, is missing"),
            ),
            (None, Some(_)) => f.add(
                ViolationKind::FilesDiffer,
                None,
                None,
                format!("{path} was written here, not in the clean run"),
            ),
            (Some(before), Some(now)) => {
                let (was, is) = (lines(before), lines(now));
                if is < was {
                    f.add(
                        ViolationKind::FilesDiffer,
                        None,
                        None,
                        format!("{path} has {is} lines, {was} after the clean run"),
                    );
                } else if is - was <= retakes {
                    f.duplicates_in_doubt += is - was;
                } else {
                    f.add(
                        ViolationKind::DuplicateEffect,
                        None,
                        None,
                        format!(
                            "{path} has {is} lines, {was} after the clean run; {retakes} \
                             retakes in doubt explain at most {retakes} repeated writes"
                        ),
                    );
                }
            }
            (None, None) => {}
        }
    }
}
