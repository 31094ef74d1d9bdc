//! Bounds on what a guest may hand the host or make it hold: key shape, payload sizes,
//! memory (linear and host-held), time. Messages name the limit, never a flag: the
//! CLI maps a [`LimitExceeded`] to the flag that raises it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::text;

/// Sizes and durations the host enforces on a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Limits {
    /// Longest key, in bytes.
    pub max_key_bytes: usize,
    /// Largest committed result, in bytes.
    pub max_result_bytes: usize,
    /// Largest checkpoint state, in bytes.
    pub max_state_bytes: usize,
    /// Largest output the agent may return, in bytes.
    pub max_output_bytes: usize,
    /// How long a claim is the holder's before another holder may take it over.
    pub lease: Duration,
    /// How long `run-once` waits for another live holder's commit before it gives up
    /// with `await-timeout`.
    pub await_timeout: Duration,
    /// How many instances a run may use in one drive before the host gives up on it: a
    /// guard against a fault plan (or a bug) that never lets the run progress.
    pub max_instances: u64,
    /// Most memory an instance may make the host hold: its linear memories, summed,
    /// plus [`Limits::HANDLE_BYTES`] for each live resource handle.
    pub max_memory_bytes: usize,
    /// Most live resource handles (HTTP fields, bodies, streams, claims, ...) an
    /// instance may hold, whatever memory is left.
    pub max_handles: usize,
    /// Most elements the tables of an instance may hold, summed.
    pub max_table_elements: usize,
    /// Longest an instance holding no claim may go between two calls into idem,
    /// computing or waiting in WASI: ends a guest stuck in a loop or a sleep.
    pub max_compute: Duration,
    /// Fuel (roughly, wasm instructions) one drive of a run may burn over all its
    /// instances; `None` for no limit.
    pub max_fuel: Option<u64>,
    /// Longest a side effect may run, from its claim to its commit or release,
    /// computing or waiting in WASI.
    pub effect_timeout: Duration,
    /// Most claims one instance may hold at once (its side effects in flight
    /// together): a `run-once` or `run-once-many` that would pass it is refused with
    /// `too-large`, taking nothing.
    pub max_claims: usize,
    /// Most child runs one run may spawn, and children one join may list.
    pub max_children: usize,
    /// Deepest a run may be spawned: a run started from outside is at depth 0, its
    /// children at 1.
    pub max_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_key_bytes: 512,
            // Values this large are kept once by digest, out of their rows
            // (`store/values/`): a 64 MiB checkpoint does not rewrite its run's row.
            max_result_bytes: 64 << 20,
            max_state_bytes: 64 << 20,
            max_output_bytes: 64 << 20,
            lease: Duration::from_secs(30),
            await_timeout: Duration::from_secs(60),
            max_instances: 100_000,
            max_memory_bytes: 256 << 20,
            max_handles: 10_000,
            max_table_elements: 100_000,
            max_compute: Duration::from_secs(60),
            max_fuel: None,
            effect_timeout: Duration::from_secs(300),
            max_claims: 64,
            max_children: 10_000,
            max_depth: 8,
        }
    }
}

/// A limit that cannot be used, named by its field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("limit {name} is {given}, outside what idem accepts ({accepted})")]
pub struct InvalidLimit {
    /// The field of [`Limits`].
    pub name: &'static str,
    /// The value given.
    pub given: String,
    /// The range accepted.
    pub accepted: &'static str,
}

/// The longest duration any limit may be: beyond it, deadlines stop being numbers
/// every clock can add.
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

impl Limits {
    /// What one resource handle is charged against `max_memory_bytes`: the most any
    /// handle makes the host hold (a request body's two buffered 64 KiB chunks; a
    /// header set is capped at [`Limits::FIELD_BYTES`]).
    pub const HANDLE_BYTES: usize = 128 << 10;
    /// The largest header set (`wasi:http` fields) a guest may build.
    pub const FIELD_BYTES: usize = 64 << 10;
    /// The largest chunk of a request body the host buffers.
    pub const BODY_CHUNK_BYTES: usize = 64 << 10;
    /// Longest reason a run may park a key with; a longer one is cut.
    pub const MAX_REASON_BYTES: usize = 4 << 10;
    /// Longest error text a run keeps; a longer one is cut.
    pub const MAX_ERROR_BYTES: usize = 64 << 10;

    /// Checks that every limit is one idem can enforce: no zero lease (two holders
    /// would both believe they hold a key), no duration past a year, no size of zero.
    pub fn check(&self) -> Result<(), InvalidLimit> {
        let ms = Duration::from_millis;
        // (field, value, least accepted, what is accepted); the most is MAX_DURATION.
        // Kept one rule a line, as a table.
        #[rustfmt::skip]
        let durations = [
            ("lease", self.lease, ms(100), "100ms to 365 days"),
            ("await_timeout", self.await_timeout, Duration::ZERO, "up to 365 days"),
            ("max_compute", self.max_compute, ms(10), "10ms to 365 days"),
            ("effect_timeout", self.effect_timeout, ms(10), "10ms to 365 days"),
        ];
        for (name, d, min, accepted) in durations {
            if d < min || d > MAX_DURATION {
                return Err(InvalidLimit {
                    name,
                    given: format!("{}ms", d.as_millis()),
                    accepted,
                });
            }
        }
        // (field, value, least, most, what is accepted).
        #[rustfmt::skip]
        let sizes = [
            ("max_key_bytes", self.max_key_bytes, 1, 1 << 16, "1 to 65536 bytes"),
            ("max_result_bytes", self.max_result_bytes, 1, 1 << 30, "1 byte to 1 GiB"),
            ("max_state_bytes", self.max_state_bytes, 1, 1 << 30, "1 byte to 1 GiB"),
            ("max_output_bytes", self.max_output_bytes, 1, 1 << 30, "1 byte to 1 GiB"),
            ("max_memory_bytes", self.max_memory_bytes, 1 << 20, usize::MAX, "at least 1 MiB"),
            ("max_handles", self.max_handles, 16, 1 << 20, "16 to 1048576"),
            ("max_claims", self.max_claims, 1, 1 << 16, "1 to 65536"),
            ("max_children", self.max_children, 1, 1 << 20, "1 to 1048576"),
            ("max_depth", self.max_depth, 1, 64, "1 to 64"),
            ("max_table_elements", self.max_table_elements, 1, usize::MAX, "at least 1"),
        ];
        for (name, n, min, max, accepted) in sizes {
            if n < min || n > max {
                return Err(InvalidLimit {
                    name,
                    given: n.to_string(),
                    accepted,
                });
            }
        }
        if self.max_instances == 0 {
            return Err(InvalidLimit {
                name: "max_instances",
                given: "0".into(),
                accepted: "at least 1",
            });
        }
        Ok(())
    }

    /// Checks that `key` can be stored and shown: non-empty, within the length limit,
    /// no control, bidi or invisible characters (they break logs and headers, and can
    /// make one key look like another on an operator's screen).
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
        text::check_visible(key).map_err(|hidden| {
            format!(
                "key {} holds {hidden}; keys must be visible text",
                text::quoted(key)
            )
        })
    }

    /// Checks an input fingerprint: short visible text, like a hex digest.
    pub fn check_fingerprint(&self, fingerprint: &str) -> Result<(), String> {
        if fingerprint.is_empty() || fingerprint.len() > MAX_FINGERPRINT_BYTES {
            return Err(format!(
                "fingerprint must be 1 to {MAX_FINGERPRINT_BYTES} bytes, not {}",
                fingerprint.len()
            ));
        }
        text::check_visible(fingerprint).map_err(|hidden| format!("fingerprint holds {hidden}"))
    }
}

/// Longest input fingerprint: room for any hex digest with an algorithm prefix.
const MAX_FINGERPRINT_BYTES: usize = 256;

/// A limit an instance ran into: the trap that ends it, and the run's error text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimitExceeded {
    /// Linear memory plus host-held handles would grow past `max_memory_bytes`.
    #[error(
        "memory limit exceeded: the agent's linear memory and host resources would take \
         {desired} bytes, over the limit of {limit} bytes"
    )]
    Memory {
        /// The size asked for.
        desired: usize,
        /// The limit.
        limit: usize,
    },
    /// Tables would grow past `max_table_elements`.
    #[error(
        "table limit exceeded: the agent asked for {desired} table elements, over the \
         limit of {limit}"
    )]
    Table {
        /// The size asked for.
        desired: usize,
        /// The limit.
        limit: usize,
    },
    /// The instance went past `max_compute` without calling idem.
    #[error(
        "compute limit exceeded: the agent ran or waited for more than {}ms without calling \
         idem",
        limit.as_millis()
    )]
    Compute {
        /// The limit.
        limit: Duration,
    },
    /// The run burnt its `max_fuel`.
    #[error("fuel limit exceeded: the run burnt all {limit} units of its fuel")]
    Fuel {
        /// The limit.
        limit: u64,
    },
    /// A side effect ran past `effect_timeout`.
    #[error(
        "side-effect time limit exceeded: the side effect of key {} ran for more than {}ms",
        text::quoted(key),
        limit.as_millis()
    )]
    Effect {
        /// The key.
        key: String,
        /// The limit.
        limit: Duration,
    },
    /// The instance's resource table is full: it holds as many handles as what is left
    /// of `max_memory_bytes` allows (each charged `HANDLE_BYTES`), or `max_handles`.
    #[error(
        "memory limit exceeded: the agent holds as many host resources (HTTP fields, bodies, \
         streams) as its memory limit allows, each counted as {} KiB",
        Limits::HANDLE_BYTES >> 10
    )]
    Handles,
    /// The agent returned more output than `max_output_bytes`.
    #[error("output limit exceeded: the agent returned {size} bytes, over the limit of {limit}")]
    Output {
        /// The output's size.
        size: usize,
        /// The limit.
        limit: usize,
    },
}

impl LimitExceeded {
    /// The field of [`Limits`] that bounds this.
    pub fn limit_name(&self) -> &'static str {
        match self {
            LimitExceeded::Memory { .. } | LimitExceeded::Handles => "max_memory_bytes",
            LimitExceeded::Table { .. } => "max_table_elements",
            LimitExceeded::Compute { .. } => "max_compute",
            LimitExceeded::Fuel { .. } => "max_fuel",
            LimitExceeded::Effect { .. } => "effect_timeout",
            LimitExceeded::Output { .. } => "max_output_bytes",
        }
    }
}

/// `text` cut to at most `max` bytes on a character boundary, saying how much was cut.
pub(crate) fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes cut)", &text[..end], text.len() - end)
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
        assert!(limits.check_key("a\nb").unwrap_err().contains("U+000A"));
        assert!(
            limits
                .check_key("pay\u{202e}yap")
                .unwrap_err()
                .contains("U+202E")
        );
        assert!(limits.check_key("a\u{200b}b").is_err());
    }

    #[test]
    fn limits_are_checked() {
        assert!(Limits::default().check().is_ok());
        let zero_lease = Limits {
            lease: Duration::ZERO,
            ..Limits::default()
        };
        assert_eq!(zero_lease.check().unwrap_err().name, "lease");
        let forever = Limits {
            await_timeout: Duration::from_secs(u64::MAX),
            ..Limits::default()
        };
        assert_eq!(forever.check().unwrap_err().name, "await_timeout");
        let tiny = Limits {
            max_memory_bytes: 10,
            ..Limits::default()
        };
        assert_eq!(tiny.check().unwrap_err().name, "max_memory_bytes");
    }

    #[test]
    fn cut_keeps_characters_whole() {
        assert_eq!(cut("abc", 5), "abc");
        assert_eq!(cut("ééé", 3), "é… (4 bytes cut)");
    }
}
