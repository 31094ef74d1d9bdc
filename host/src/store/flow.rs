//! Flow control: the limits a deployment's runs are leased under, shared by every
//! worker because the store applies them as it leases ([`WorkerStore::acquire_runs`]),
//! and a queued run's priority.

use super::Millis;
#[cfg(doc)]
use super::{CatalogStore, StoreError, WorkerStore};

/// The most a limit may be: beyond it a limit limits nothing a store could hold.
pub const MAX_FLOW_LIMIT: u32 = 1_000_000;

/// The highest priority a run may have; 0 (the default) is the lowest.
pub const MAX_PRIORITY: u32 = 1_000;

/// The limits to put on a deployment's runs: [`CatalogStore::set_flow`].
#[derive(Debug, Clone, Copy, Default)]
pub struct FlowSetting<'a> {
    /// The deployment (name) whose runs are limited.
    pub deployment: &'a str,
    /// At most this many of its runs hold a live lease at once.
    pub max_running: Option<u32>,
    /// Where in a run's input (a JSON pointer, RFC 6901) its concurrency key is.
    pub key: Option<&'a str>,
    /// At most this many runs with the same key hold a live lease at once.
    pub per_key: Option<u32>,
}

/// A deployment's limits, as the store keeps them.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FlowLimits {
    /// The deployment.
    pub deployment: String,
    /// At most this many of its runs hold a live lease at once.
    pub max_running: Option<u32>,
    /// The JSON pointer its runs' concurrency keys are read at.
    pub key: Option<String>,
    /// At most this many runs with the same key hold a live lease at once.
    pub per_key: Option<u32>,
    /// When they were set, on the store's clock.
    pub updated: Millis,
}

/// Why a [`FlowSetting`] was refused ([`StoreError::FlowRefused`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FlowRefusal {
    /// No deployment has the name.
    #[error("no deployment is named {}", crate::text::quoted(.0))]
    UnknownDeployment(String),
    /// A limit of zero would hold every run back forever.
    #[error("a limit of 0 runs would never run anything; clear the limit instead")]
    Zero,
    /// A limit beyond [`MAX_FLOW_LIMIT`].
    #[error("a limit of {0} is beyond the most a store keeps ({MAX_FLOW_LIMIT})")]
    Absurd(u64),
    /// The key is not a JSON pointer.
    #[error("{} is not a JSON pointer: it must be empty or start with '/'", crate::text::quoted(.0))]
    BadPointer(String),
    /// A per-key limit without a key, or a key without a per-key limit.
    #[error("a concurrency key and a per-key limit go together: give both or neither")]
    KeyWithoutLimit,
    /// Nothing to set: every limit is absent.
    #[error("no limit given; clear the deployment's limits instead")]
    Empty,
}

/// Checks a setting's values (the deployment's existence is the store's to check).
pub(crate) fn check_setting(setting: &FlowSetting<'_>) -> Result<(), FlowRefusal> {
    for limit in [setting.max_running, setting.per_key].into_iter().flatten() {
        if limit == 0 {
            return Err(FlowRefusal::Zero);
        }
        if limit > MAX_FLOW_LIMIT {
            return Err(FlowRefusal::Absurd(u64::from(limit)));
        }
    }
    if let Some(key) = setting.key
        && !(key.is_empty() || key.starts_with('/'))
    {
        return Err(FlowRefusal::BadPointer(key.to_string()));
    }
    if setting.key.is_some() != setting.per_key.is_some() {
        return Err(FlowRefusal::KeyWithoutLimit);
    }
    if setting.max_running.is_none() && setting.per_key.is_none() {
        return Err(FlowRefusal::Empty);
    }
    Ok(())
}

/// The concurrency key `pointer` finds in a run's input (JSON) as the store keeps it,
/// opened first in a store encrypted at rest (so no caller reads a sealed input): a
/// string as it is, any other value as its compact JSON text (so `42` and `"42"` are
/// one key). `None` when the input is not JSON or the pointer finds nothing.
pub(crate) fn key_of(
    pointer: &str,
    stored_input: &[u8],
    payloads: super::Payloads<'_>,
) -> Result<Option<String>, super::StoreError> {
    let input = payloads.open(stored_input)?;
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(&input) else {
        return Ok(None);
    };
    Ok(match value.pointer(pointer) {
        None => None,
        Some(serde_json::Value::String(text)) => Some(text.clone()),
        Some(other) => Some(other.to_string()),
    })
}

/// A deployment's limits as the lease queries apply them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limit {
    pub(crate) max_running: Option<u64>,
    pub(crate) per_key: Option<u64>,
}

/// What the lease queries count while they choose runs under limits: the live leases
/// of each limited deployment and of each of its keys, with the runs chosen so far.
#[derive(Debug, Default)]
pub(crate) struct FlowCounts {
    pub(crate) limits: std::collections::HashMap<String, Limit>,
    pub(crate) running: std::collections::HashMap<String, u64>,
    pub(crate) by_key: std::collections::HashMap<(String, String), u64>,
}

impl FlowCounts {
    /// Whether one more run of `agent` with `key` fits; if so, counts it.
    pub(crate) fn admit(&mut self, agent: &str, key: Option<&str>) -> bool {
        if self.saturated(agent, key) {
            return false;
        }
        self.count(agent, key);
        true
    }

    /// Counts a run of a limited `agent` holding a lease, over its limits or not.
    pub(crate) fn count(&mut self, agent: &str, key: Option<&str>) {
        let Some(limit) = self.limits.get(agent) else {
            return;
        };
        let keyed = limit.per_key.is_some();
        *self.running.entry(agent.to_string()).or_insert(0) += 1;
        if let (true, Some(key)) = (keyed, key) {
            *self
                .by_key
                .entry((agent.to_string(), key.to_string()))
                .or_insert(0) += 1;
        }
    }

    /// Whether `agent`, or its `key`, is at its limit: its runs are passed over.
    pub(crate) fn saturated(&self, agent: &str, key: Option<&str>) -> bool {
        let Some(limit) = self.limits.get(agent) else {
            return false;
        };
        let running = self.running.get(agent).copied().unwrap_or(0);
        if limit.max_running.is_some_and(|max| running >= max) {
            return true;
        }
        match (limit.per_key, key) {
            (Some(per_key), Some(key)) => {
                self.by_key
                    .get(&(agent.to_string(), key.to_string()))
                    .copied()
                    .unwrap_or(0)
                    >= per_key
            }
            _ => false,
        }
    }
}
