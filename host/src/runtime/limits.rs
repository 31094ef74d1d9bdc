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
