//! Bounds on what a guest may hand the host: key shape and payload sizes.

use std::time::Duration;

/// Sizes and durations the host enforces on every run.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Longest key, in bytes.
    pub max_key_bytes: usize,
    /// Largest committed result, in bytes.
    pub max_result_bytes: usize,
    /// Largest checkpoint state, in bytes.
    pub max_state_bytes: usize,
    /// How long a claim is the holder's before another holder may take it over.
    pub lease: Duration,
    /// How long `run-once` waits for another live holder's commit before it gives up
    /// with `await-timeout`.
    pub await_timeout: Duration,
    /// How many instances a run may use before the host gives up on it: a guard against
    /// a fault plan (or a bug) that never lets the run progress.
    pub max_instances: u64,
    /// Largest linear memory an instance may grow to, in bytes.
    pub max_memory_bytes: usize,
    /// Most elements a table of an instance may hold.
    pub max_table_elements: usize,
    /// Longest an instance may run between two calls to idem's imports: ends a guest
    /// stuck in a loop.
    pub max_compute: Duration,
    /// Fuel (roughly, wasm instructions) one invocation of a run may burn over all its
    /// instances; `None` for no limit.
    pub max_fuel: Option<u64>,
    /// Longest a side effect may run, from its claim to its commit or release.
    pub effect_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_key_bytes: 512,
            max_result_bytes: 1 << 20,
            max_state_bytes: 1 << 20,
            lease: Duration::from_secs(30),
            await_timeout: Duration::from_secs(60),
            max_instances: 100_000,
            max_memory_bytes: 256 << 20,
            max_table_elements: 100_000,
            max_compute: Duration::from_secs(60),
            max_fuel: None,
            effect_timeout: Duration::from_secs(300),
        }
    }
}

impl Limits {
    /// Checks that `key` can be stored and shown: non-empty, within the length limit,
    /// no control characters (they break logs, headers and terminals).
    pub fn check_key(&self, key: &str) -> Result<(), String> {
        if key.is_empty() {
            return Err("key is empty".to_string());
        }
        if key.len() > self.max_key_bytes {
            return Err(format!(
                "key is {} bytes, over the limit of {} bytes",
                key.len(),
                self.max_key_bytes
            ));
        }
        if let Some(c) = key.chars().find(|c| c.is_control()) {
            return Err(format!("key {key:?} holds the control character {c:?}"));
        }
        Ok(())
    }
}

/// A limit an instance ran into: the trap that ends it, and the run's error text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimitExceeded {
    /// Linear memory would grow past `max_memory_bytes`.
    #[error(
        "memory limit exceeded: the agent asked for {desired} bytes of linear memory, \
         over the limit of {limit} bytes (--max-memory)"
    )]
    Memory {
        /// The size asked for.
        desired: usize,
        /// The limit.
        limit: usize,
    },
    /// A table would grow past `max_table_elements`.
    #[error(
        "table limit exceeded: the agent asked for {desired} table elements, over the \
         limit of {limit} (--max-table-elements)"
    )]
    Table {
        /// The size asked for.
        desired: usize,
        /// The limit.
        limit: usize,
    },
    /// The instance ran past `max_compute` without calling idem.
    #[error(
        "compute limit exceeded: the agent ran for more than {}ms without calling idem \
         (--max-compute)",
        limit.as_millis()
    )]
    Compute {
        /// The limit.
        limit: Duration,
    },
    /// The run burnt its `max_fuel`.
    #[error("fuel limit exceeded: the run burnt all {limit} units of its fuel (--max-fuel)")]
    Fuel {
        /// The limit.
        limit: u64,
    },
    /// A side effect ran past `effect_timeout`.
    #[error(
        "side-effect time limit exceeded: the side effect of key {key:?} ran for more \
         than {}ms (--effect-timeout)",
        limit.as_millis()
    )]
    Effect {
        /// The key.
        key: String,
        /// The limit.
        limit: Duration,
    },
}

impl Limits {
    /// Checks an input fingerprint: short printable text, like a hex digest.
    pub fn check_fingerprint(&self, fingerprint: &str) -> Result<(), String> {
        if fingerprint.is_empty() || fingerprint.len() > MAX_FINGERPRINT_BYTES {
            return Err(format!(
                "fingerprint must be 1 to {MAX_FINGERPRINT_BYTES} bytes, not {}",
                fingerprint.len()
            ));
        }
        if fingerprint.chars().any(|c| c.is_control()) {
            return Err("fingerprint holds a control character".to_string());
        }
        Ok(())
    }
}

/// Longest input fingerprint: room for any hex digest with an algorithm prefix.
const MAX_FINGERPRINT_BYTES: usize = 256;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_checked() {
        let limits = Limits::default();
        assert!(limits.check_key("run-1/step/abc").is_ok());
        assert!(limits.check_key("ünïcode/ok").is_ok());
        assert_eq!(limits.check_key("").unwrap_err(), "key is empty");
        let long = "k".repeat(513);
        assert_eq!(
            limits.check_key(&long).unwrap_err(),
            "key is 513 bytes, over the limit of 512 bytes"
        );
        assert!(limits.check_key(&"k".repeat(512)).is_ok());
        assert!(limits.check_key("a\nb").unwrap_err().contains("control"));
    }
}
