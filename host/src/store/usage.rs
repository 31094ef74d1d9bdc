//! Token usage of model calls, kept with their steps: what an instance records after
//! each call ([`InstanceStore::record_usage`](crate::store::InstanceStore::record_usage))
//! and what an operator sums ([`OperatorStore::usage`](crate::store::OperatorStore::usage)).
//!
//! A step's usage is one row, keyed by the step's key and inserted only if absent:
//! the first recording counts the tokens as spent, every later one (a replay, which
//! made no call) adds one to the row's replays, which count them as saved. So a key is
//! spent once however many instances replay it, and whether or not the instance that
//! committed it lived to record it (the next one's replay records it).

use std::fmt;

use super::RunFence;

/// The longest model name a store keeps, in bytes.
pub const MAX_MODEL_BYTES: usize = 200;

/// The most tokens of one kind one call may record: far above any model's context, and
/// small enough that sums over a store's calls stay exact in 64 bits.
pub const MAX_CALL_TOKENS: u64 = 1_000_000_000;

/// Tokens by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Tokens {
    /// Prompt tokens.
    pub input: u64,
    /// Generated tokens.
    pub output: u64,
    /// Prompt tokens served from the provider's cache.
    pub cached: u64,
}

impl Tokens {
    /// Each kind `times` over (saturating).
    pub fn times(self, times: u64) -> Tokens {
        Tokens {
            input: self.input.saturating_mul(times),
            output: self.output.saturating_mul(times),
            cached: self.cached.saturating_mul(times),
        }
    }

    /// The kinds by name, as `/metrics` labels them.
    pub fn kinds(self) -> [(&'static str, u64); 3] {
        [
            ("input", self.input),
            ("output", self.output),
            ("cached", self.cached),
        ]
    }
}

impl std::ops::AddAssign for Tokens {
    fn add_assign(&mut self, other: Tokens) {
        self.input = self.input.saturating_add(other.input);
        self.output = self.output.saturating_add(other.output);
        self.cached = self.cached.saturating_add(other.cached);
    }
}

/// A model call's usage, as a running instance records it.
#[derive(Debug, Clone, Copy)]
pub struct UsageRecord<'a> {
    /// The run's fence: the write is refused once another lease of the run was granted.
    pub fence: &'a RunFence,
    /// The step's key (qualified): a key the fenced run committed.
    pub key: &'a str,
    /// The model the call asked for.
    pub model: &'a str,
    /// What its response reported.
    pub tokens: Tokens,
}

/// How a recording counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// The key's first recording: its tokens are spent.
    Spent,
    /// The key was recorded before (a replay): its tokens are saved, once more.
    Saved,
}

/// Why a recording was refused. Nothing was written.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum UsageRefusal {
    /// The key is not a step the run committed: unknown, only claimed, or another run's.
    UnknownStep,
    /// The model name is empty, too long or holds control characters. Carries why.
    BadModel(String),
    /// A count is over [`MAX_CALL_TOKENS`]. Carries which.
    TooMany(String),
}

impl fmt::Display for UsageRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UsageRefusal::UnknownStep => f.write_str("the key is not a step this run committed"),
            UsageRefusal::BadModel(why) | UsageRefusal::TooMany(why) => f.write_str(why),
        }
    }
}

/// Refuses what a store would not keep: checked before anything is sent.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn check_usage(record: &UsageRecord<'_>) -> Result<(), super::StoreError> {
    let refuse = |refusal| super::StoreError::UsageRefused {
        run_id: record.fence.run_id.clone(),
        key: record.key.to_owned(),
        refusal,
    };
    let model = record.model;
    if model.is_empty() {
        return Err(refuse(UsageRefusal::BadModel(
            "the model name is empty".into(),
        )));
    }
    if model.len() > MAX_MODEL_BYTES {
        return Err(refuse(UsageRefusal::BadModel(format!(
            "the model name is {} bytes, over the limit of {MAX_MODEL_BYTES}",
            model.len()
        ))));
    }
    if let Err(hidden) = crate::text::check_visible(model) {
        return Err(refuse(UsageRefusal::BadModel(format!(
            "the model name {} holds {hidden}",
            crate::text::quoted(model)
        ))));
    }
    for (kind, n) in record.tokens.kinds() {
        if n > MAX_CALL_TOKENS {
            return Err(refuse(UsageRefusal::TooMany(format!(
                "{n} {kind} tokens is over the limit of {MAX_CALL_TOKENS} per call"
            ))));
        }
    }
    Ok(())
}

/// The usage of one deployment's calls to one model, summed: over a run or the store.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct UsageTotal {
    /// The deployment (the runs' agent).
    pub deployment: String,
    /// The model.
    pub model: String,
    /// Model calls recorded (steps), each spent once.
    pub calls: u64,
    /// Their tokens: what was paid for.
    pub spent: Tokens,
    /// Replays of those calls that made no request.
    pub replays: u64,
    /// The tokens the replays would have cost.
    pub saved: Tokens,
}

impl UsageTotal {
    /// A total from the sums both backends select after the deployment and the model:
    /// calls, spent input, output and cached tokens, replays, saved input, output and
    /// cached tokens.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    pub(crate) fn from_sums(deployment: String, model: String, n: [u64; 8]) -> UsageTotal {
        let tokens = |at: usize| Tokens {
            input: n[at],
            output: n[at + 1],
            cached: n[at + 2],
        };
        UsageTotal {
            deployment,
            model,
            calls: n[0],
            spent: tokens(1),
            replays: n[4],
            saved: tokens(5),
        }
    }
}

/// Which usage [`OperatorStore::usage`](crate::store::OperatorStore::usage) sums.
#[derive(Debug, Clone, Copy, Default)]
pub struct UsageFilter<'a> {
    /// Only this run's calls.
    pub run_id: Option<&'a str>,
    /// Only the calls of this deployment's runs.
    pub deployment: Option<&'a str>,
}

#[cfg(test)]
#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod tests {
    use super::*;
    use crate::store::{StoreError, SyncMode};

    fn refusal(model: &str, tokens: Tokens) -> Option<UsageRefusal> {
        let fence = RunFence {
            run_id: "r".into(),
            token: 1,
            sync: SyncMode::Normal,
        };
        let record = UsageRecord {
            fence: &fence,
            key: "k",
            model,
            tokens,
        };
        match check_usage(&record) {
            Ok(()) => None,
            Err(StoreError::UsageRefused { refusal, .. }) => Some(refusal),
            Err(other) => panic!("{other}"),
        }
    }

    #[test]
    fn names_and_counts_are_bounded() {
        let fine = Tokens {
            input: MAX_CALL_TOKENS,
            output: 0,
            cached: 0,
        };
        assert_eq!(refusal("gpt-4o-mini", fine), None);
        assert!(matches!(refusal("", fine), Some(UsageRefusal::BadModel(_))));
        let long = "m".repeat(MAX_MODEL_BYTES + 1);
        assert!(matches!(
            refusal(&long, fine),
            Some(UsageRefusal::BadModel(_))
        ));
        assert!(matches!(
            refusal("a\u{1b}[2Jb", fine),
            Some(UsageRefusal::BadModel(_))
        ));
        let huge = Tokens {
            cached: MAX_CALL_TOKENS + 1,
            ..fine
        };
        let Some(UsageRefusal::TooMany(why)) = refusal("m", huge) else {
            panic!("absurd counts pass");
        };
        assert!(why.contains("cached"), "{why}");
    }
}
