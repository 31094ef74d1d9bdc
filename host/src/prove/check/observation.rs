//! What a scenario is checked on: everything observed of its run ([`Observation`]),
//! and the clean run in the shape the checks compare with ([`Baseline`]).

use std::collections::{BTreeMap, HashMap};

use crate::prove::capture::Captured;
use crate::prove::observe::{Answer, Event};
use crate::store::{OpenClaim, StepRecord};

/// Files in the granted directories, by grant and path, with their bytes.
pub(crate) type Files = BTreeMap<String, Vec<u8>>;

/// How a scenario's run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ended {
    /// With this output.
    Completed(Vec<u8>),
    /// Otherwise: failed, in doubt, an error of the host; in words.
    Not(String),
    /// Suspended in the join under this key, for children a proof does not run.
    AwaitingChildren(String),
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
    /// The child runs in the store: the key each was spawned under, and its run id.
    pub(crate) children: Vec<(String, String)>,
    pub(crate) captured: Captured,
    pub(crate) files: Files,
    pub(crate) instances: u64,
    pub(crate) reclaimed: u64,
    /// Kills that landed on a live process, in the kill scenario.
    pub(crate) kills: Option<u32>,
}

impl Observation {
    pub(super) fn guest_key<'a>(&self, key: &'a str) -> &'a str {
        key.strip_prefix(&self.namespace)
            .and_then(|k| k.strip_prefix(':'))
            .unwrap_or(key)
    }

    /// Keys in the order the run's `run-once` calls asked for them, one list per
    /// instance, each with the checkpoint step the instance last loaded before it.
    pub(super) fn instances(&self) -> Vec<(Option<u64>, Vec<String>)> {
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
    pub(super) fn in_doubt_grants(&self) -> HashMap<String, u64> {
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
    pub(super) calls: Vec<String>,
    /// Per checkpoint step first saved: how many calls had been made.
    pub(super) next_call: BTreeMap<u64, usize>,
    /// Per checkpoint step first saved: the keys committed by then.
    pub(super) committed_by: BTreeMap<u64, usize>,
    /// Keys in the order they were committed.
    pub(super) commit_order: Vec<String>,
    /// HTTP requests per key (`None`: made outside any claim).
    pub(super) requests: HashMap<Option<String>, u64>,
    pub(crate) files: Files,
    /// Spawn keys in the order first spawned.
    pub(crate) spawns: Vec<String>,
    /// Join keys in the order first reached.
    pub(crate) joins: Vec<String>,
    /// The child runs the clean run left: spawn key and run id.
    pub(crate) children: Vec<(String, String)>,
    /// The join the clean run stopped in, for children a proof does not run.
    pub(crate) awaits: Option<String>,
}

impl Baseline {
    pub(crate) fn new(clean: &Observation, output: Vec<u8>) -> Baseline {
        let mut keys: Vec<String> = Vec::new();
        let mut calls = Vec::new();
        let mut next_call = BTreeMap::new();
        let mut committed_by = BTreeMap::new();
        let mut commit_order = Vec::new();
        let (mut spawns, mut joins) = (Vec::new(), Vec::new());
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
                Event::Spawn { key, .. } => {
                    if !spawns.contains(key) {
                        spawns.push(key.clone());
                    }
                }
                Event::Join { key, .. } => {
                    if !joins.contains(key) {
                        joins.push(key.clone());
                    }
                }
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
            spawns,
            joins,
            children: clean.children.clone(),
            awaits: match &clean.ended {
                Ended::AwaitingChildren(key) => Some(key.clone()),
                _ => None,
            },
        }
    }
}
