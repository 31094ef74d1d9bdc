//! The invariants: what one scenario did, held against what the clean run did. Every
//! check reads observations only — the store's log of the run (`observe.rs`), the
//! store's final state, the capture's requests and the granted directories — never
//! what the agent says about itself.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::capture::Captured;
use super::observe::{Answer, Event};
use super::report::{Violation, ViolationKind};
use crate::runtime::DenialKind;
use crate::store::{OpenClaim, StepRecord};

/// What a hint says about keys that change between instances.
const UNSTABLE_HINT: &str = "derive each key from what its step processes (the input, \
    the item, its position); never from the time, an attempt or retry counter, the \
    instance's generation, or randomness: a resumed instance must compute the same key";

/// Files in the granted directories, by grant and path, with their bytes.
pub(crate) type Files = BTreeMap<String, Vec<u8>>;

/// How a scenario's run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ended {
    /// With this output.
    Completed(Vec<u8>),
    /// Otherwise: failed, in doubt, an error of the host; in words.
    Not(String),
}

/// Everything observed of one scenario.
#[derive(Debug, Clone)]
pub(crate) struct Observation {
    pub(crate) ended: Ended,
    /// The namespace the run's keys live in (`ns` of `ns:key`).
    pub(crate) namespace: String,
    /// The store's log of the run; empty when it ran in other processes.
    pub(crate) events: Vec<Event>,
    pub(crate) steps: Vec<StepRecord>,
    pub(crate) open: Vec<OpenClaim>,
    pub(crate) captured: Captured,
    pub(crate) files: Files,
    pub(crate) instances: u64,
    pub(crate) reclaimed: u64,
    /// Kills that landed on a live process, in the kill scenario.
    pub(crate) kills: Option<u32>,
}

impl Observation {
    fn guest_key<'a>(&self, key: &'a str) -> &'a str {
        key.strip_prefix(&self.namespace)
            .and_then(|k| k.strip_prefix(':'))
            .unwrap_or(key)
    }

    /// Keys in the order the run's `run-once` calls asked for them, one list per
    /// instance, each with the checkpoint step the instance last loaded before it.
    fn instances(&self) -> Vec<(Option<u64>, Vec<String>)> {
        let mut out: Vec<(Option<u64>, Vec<String>)> = Vec::new();
        let mut holder: Option<&str> = None;
        let mut loaded = None;
        for event in &self.events {
            match event {
                Event::Load { step } => loaded = *step,
                Event::Call { key, holder: h, .. } => {
                    if holder != Some(h.as_str()) {
                        holder = Some(h);
                        out.push((loaded, Vec::new()));
                    }
                    if let Some((_, calls)) = out.last_mut() {
                        calls.push(self.guest_key(key).to_string());
                    }
                }
                _ => {}
            }
        }
        out
    }

    /// Grants made in doubt, per key.
    fn in_doubt_grants(&self) -> HashMap<String, u64> {
        let mut grants = HashMap::new();
        for event in &self.events {
            if let Event::Call {
                key,
                answer: Answer::Granted { in_doubt: true, .. },
                ..
            } = event
            {
                *grants.entry(self.guest_key(key).to_string()).or_insert(0) += 1;
            }
        }
        grants
    }
}

/// The clean run, in the shape the checks compare with.
#[derive(Debug, Clone)]
pub(crate) struct Baseline {
    pub(crate) output: Vec<u8>,
    /// Keys in the order first claimed (guest form).
    pub(crate) keys: Vec<String>,
    /// Every `run-once` call's key, in order.
    calls: Vec<String>,
    /// Per checkpoint step first saved: how many calls had been made.
    next_call: BTreeMap<u64, usize>,
    /// Per checkpoint step first saved: the keys committed by then.
    committed_by: BTreeMap<u64, usize>,
    /// Keys in the order they were committed.
    commit_order: Vec<String>,
    /// HTTP requests per key (`None`: made outside any claim).
    requests: HashMap<Option<String>, u64>,
    pub(crate) files: Files,
}

impl Baseline {
    pub(crate) fn new(clean: &Observation, output: Vec<u8>) -> Baseline {
        let mut keys: Vec<String> = Vec::new();
        let mut calls = Vec::new();
        let mut next_call = BTreeMap::new();
        let mut committed_by = BTreeMap::new();
        let mut commit_order = Vec::new();
        for event in &clean.events {
            match event {
                Event::Call { key, answer, .. } => {
                    let key = clean.guest_key(key).to_string();
                    if matches!(answer, Answer::Granted { .. }) && !keys.contains(&key) {
                        keys.push(key.clone());
                    }
                    calls.push(key);
                }
                Event::Commit { key, checkpoint } => {
                    commit_order.push(clean.guest_key(key).to_string());
                    if let Some(step) = checkpoint {
                        next_call.entry(*step).or_insert(calls.len());
                        committed_by.entry(*step).or_insert(commit_order.len());
                    }
                }
                Event::Save { step } => {
                    next_call.entry(*step).or_insert(calls.len());
                    committed_by.entry(*step).or_insert(commit_order.len());
                }
                Event::Load { .. } => {}
            }
        }
        let mut requests = HashMap::new();
        for e in &clean.captured.exchanges {
            *requests.entry(e.key.clone()).or_insert(0) += 1;
        }
        Baseline {
            output,
            keys,
            calls,
            next_call,
            committed_by,
            commit_order,
            requests,
            files: clean.files.clone(),
        }
    }
}

/// What the checks of one scenario found.
#[derive(Debug, Default)]
pub(crate) struct Findings {
    pub(crate) violations: Vec<Violation>,
    pub(crate) effects: u64,
    pub(crate) duplicates_in_doubt: u64,
}

impl Findings {
    fn add(&mut self, kind: ViolationKind, step: Option<u32>, key: Option<&str>, detail: String) {
        self.violations.push(Violation {
            kind,
            step,
            key: key.map(str::to_string),
            detail,
            hint: None,
        });
    }

    fn hint(&mut self, hint: &str) {
        if let Some(last) = self.violations.last_mut() {
            last.hint = Some(hint.to_string());
        }
    }
}

fn step_no(index: usize) -> Option<u32> {
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
                "key {key:?} is still claimed (attempt {}, token {}) after the run ended",
                claim.attempt, claim.token
            ),
        );
    }
    let Some(clean) = clean else {
        return f;
    };
    let stable = keys(obs, clean, &mut f);
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
        ViolationKind::UnstableKey => 0,
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

/// Checks the keys; returns whether every key the run claimed is one the clean run
/// claimed too.
fn keys(obs: &Observation, clean: &Baseline, f: &mut Findings) -> bool {
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
                format!("step {}'s key {key:?} was never committed", i + 1),
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
            format!("key {key:?} was committed {n} times"),
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
                    "step {}'s key changed: {was:?} in the clean run, {key:?} here",
                    i + 1
                ),
            ),
            Some((i, None)) => (
                step_no(*i),
                format!(
                    "step {} claimed key {key:?}, a step the clean run never reached",
                    i + 1
                ),
            ),
            None => (
                None,
                format!("key {key:?} was never claimed by the clean run"),
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

fn http_effects(obs: &Observation, clean: &Baseline, f: &mut Findings) {
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
                    "{n} requests under key {key:?} (tokens {}), {clean_n} in the clean run, \
                     with {retakes} retakes in doubt to explain repeats",
                    tokens
                        .iter()
                        .map(|t| t.map_or("-".to_string(), |t| t.to_string()))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
        }
    }
}

fn outside_claims(obs: &Observation, f: &mut Findings) {
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

/// Progress is never ahead of commits: whenever the run saved checkpoint step `v`, the
/// keys the clean run had committed by its own save of `v` are committed already.
fn progress(obs: &Observation, clean: &Baseline, f: &mut Findings) {
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
                    "checkpoint step {step} was saved before key {key:?} was committed (the \
                     clean run had committed it by then)"
                ),
            );
            f.hint("save progress only after the steps it covers are committed");
        }
    }
}

/// Lines in `files` beyond those in `before` (every line of a file `before` lacks).
fn added_lines(files: &Files, before: Option<&Files>) -> u64 {
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
fn files(obs: &Observation, clean: &Baseline, f: &mut Findings) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn call(key: &str, holder: &str, in_doubt: bool) -> Event {
        Event::Call {
            key: format!("ns:{key}"),
            holder: holder.into(),
            answer: Answer::Granted { token: 1, in_doubt },
        }
    }

    fn commit(key: &str, step: u64) -> Event {
        Event::Commit {
            key: format!("ns:{key}"),
            checkpoint: Some(step),
        }
    }

    fn step(key: &str) -> StepRecord {
        StepRecord {
            key: format!("ns:{key}"),
            token: 1,
            attempt: 1,
            claimed_at: 0,
            committed_at: Some(1),
            holder: None,
            parked: None,
        }
    }

    fn observation(events: Vec<Event>, keys: &[&str], output: &str) -> Observation {
        Observation {
            ended: Ended::Completed(output.as_bytes().to_vec()),
            namespace: "ns".into(),
            events,
            steps: keys.iter().map(|k| step(k)).collect(),
            open: Vec::new(),
            captured: Captured::default(),
            files: Files::new(),
            instances: 1,
            reclaimed: 0,
            kills: None,
        }
    }

    fn clean() -> Baseline {
        let events = vec![
            Event::Load { step: None },
            call("a", "h/0", false),
            commit("a", 1),
            call("b", "h/0", false),
            commit("b", 2),
            call("c", "h/0", false),
            commit("c", 3),
        ];
        Baseline::new(&observation(events, &["a", "b", "c"], "{}"), b"{}".to_vec())
    }

    #[test]
    fn a_faithful_replay_passes() {
        let events = vec![
            Event::Load { step: None },
            call("a", "h/0", false),
            commit("a", 1),
            call("b", "h/0", false),
            Event::Load { step: Some(1) },
            call("b", "h/1", true),
            commit("b", 2),
            call("c", "h/1", false),
            commit("c", 3),
        ];
        let found = check(
            &observation(events, &["a", "b", "c"], "{}"),
            Some(&clean()),
            &Files::new(),
        );
        assert_eq!(found.violations, Vec::new());
    }

    #[test]
    fn a_key_that_changes_names_its_step() {
        let events = vec![
            Event::Load { step: None },
            call("a", "h/0", false),
            commit("a", 1),
            call("b", "h/0", false),
            Event::Load { step: Some(1) },
            call("b2", "h/1", false),
            commit("b2", 2),
            call("c2", "h/1", false),
            commit("c2", 3),
        ];
        let obs = observation(events, &["a", "b", "b2", "c2"], "{}");
        let found = check(&obs, Some(&clean()), &Files::new());
        let unstable: Vec<_> = found
            .violations
            .iter()
            .filter(|v| v.kind == ViolationKind::UnstableKey)
            .map(|v| (v.step, v.key.clone().unwrap()))
            .collect();
        assert_eq!(
            unstable,
            [(Some(2), "b2".to_string()), (Some(3), "c2".to_string())]
        );
        assert!(
            found
                .violations
                .iter()
                .any(|v| v.kind == ViolationKind::KeyNotCommitted && v.step == Some(3))
        );
    }

    #[test]
    fn progress_saved_before_its_commits_is_ahead() {
        let events = vec![
            Event::Load { step: None },
            call("a", "h/0", false),
            Event::Save { step: 2 },
            commit("a", 1),
        ];
        let found = check(
            &observation(events, &["a"], "{}"),
            Some(&clean()),
            &Files::new(),
        );
        assert!(
            found
                .violations
                .iter()
                .any(|v| v.kind == ViolationKind::ProgressAhead && v.key.as_deref() == Some("a")),
            "{:?}",
            found.violations
        );
    }

    #[test]
    fn outputs_are_compared_field_by_field() {
        let text = output_difference(br#"{"n":1,"g":0}"#, br#"{"n":1,"g":1}"#);
        assert!(text.contains("g: 0 in the clean run, 1 here"), "{text}");
        assert!(!text.contains("n:"), "{text}");
    }

    #[test]
    fn repeated_file_lines_need_retakes_in_doubt() {
        let mut base = clean();
        base.files.insert("/data/log".into(), b"a\nb\n".to_vec());
        let mut obs = observation(Vec::new(), &["a", "b", "c"], "{}");
        obs.files.insert("/data/log".into(), b"a\nb\nb\n".to_vec());
        let found = check(&obs, Some(&base), &Files::new());
        assert!(
            found
                .violations
                .iter()
                .any(|v| v.kind == ViolationKind::DuplicateEffect)
        );
        obs.reclaimed = 1;
        let found = check(&obs, Some(&base), &Files::new());
        assert_eq!(found.duplicates_in_doubt, 1);
        assert!(found.violations.is_empty(), "{:?}", found.violations);
    }
}
