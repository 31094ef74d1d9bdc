//! Paths of the guest components idem's tests run, built by `build.rs` for
//! `wasm32-wasip2` whenever their sources (or the SDK, or the WIT) change.
//!
//! ```
//! for (name, path) in idem_test_artifacts::ALL {
//!     let bytes = std::fs::read(path)?;
//!     assert_eq!(&bytes[..8], b"\0asm\x0d\0\x01\0", "{name} is not a component");
//! }
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! # Layout
//!
//! - `build.rs`: runs a nested `cargo build --release --target wasm32-wasip2` over
//!   `examples/` and `tests/guests/`, with one target dir under `OUT_DIR`; turns
//!   `guests/multimem/agent.wat` into a component with `wat` and `wit-component`.
//! - `src/lib.rs`: one constant per guest, and [`ALL`].
//! - `src/power_loss.rs`: a SQLite VFS that simulates power loss (and counts WAL
//!   frames), for the power-loss tests and the bench; test code, never in `idem`.
//! - `guests/`: the test-only guests' own workspace (`steps`, `command`, `hostile`,
//!   `fetcher`, `bench`, `rogue`, `sloppy`, `rawabi`, `waiter`), and `multimem/agent.wat`, which
//!   `build.rs` makes a component itself.

pub mod power_loss;

/// `examples/ledger`: appends one log line per item, resuming from its checkpoint.
///
/// Input `{"items": [..], "log": "/data/ledger.log"}`; output
/// `{"processed": n, "total": t, "checksum": "<16 hex>"}`.
///
/// ```
/// assert!(idem_test_artifacts::LEDGER.ends_with("ledger.wasm"));
/// ```
pub const LEDGER: &str = env!("IDEM_GUEST_LEDGER");

/// `examples/dedupe`: charges each item once across runs, under shared keys.
///
/// Input `{"items": [..], "log": "/data/charges.log", "pause_ms": 0}`; output
/// `{"charged": n, "by_this_run": t, "by_other_runs": o}`, from the committed receipts.
///
/// ```
/// assert!(idem_test_artifacts::DEDUPE.ends_with("dedupe.wasm"));
/// ```
pub const DEDUPE: &str = env!("IDEM_GUEST_DEDUPE");

/// `examples/approval`: prepares a payment, waits for an `approval` signal (with a
/// timeout), then pays once.
///
/// Input `{"payment": {"id", "to", "cents"}, "log": "/data/payments.log",
/// "timeout_s": n}`; output `{"payment": id, "status": "paid" | "refused" |
/// "expired", "by": name}`.
///
/// ```
/// assert!(idem_test_artifacts::APPROVAL.ends_with("approval.wasm"));
/// ```
pub const APPROVAL: &str = env!("IDEM_GUEST_APPROVAL");

/// `tests/guests/steps`: N checkpointed, logged steps with knobs for faults.
///
/// Input `{"steps": n, "log": "/data/log.txt", "spin": 0, "fail_at": null,
/// "pause_ms": 0, "shared": false}`; output `{"steps": n, "checksum": "<16 hex>"}`.
///
/// ```
/// assert!(idem_test_artifacts::STEPS.ends_with("steps.wasm"));
/// ```
pub const STEPS: &str = env!("IDEM_GUEST_STEPS");

/// `tests/guests/command`: a `wasi:cli/command` component that prints `hello`; the host
/// must refuse it as not an `idem:agent/agent`.
///
/// ```
/// assert!(idem_test_artifacts::COMMAND.ends_with("command.wasm"));
/// ```
pub const COMMAND: &str = env!("IDEM_GUEST_COMMAND");

/// `tests/guests/hostile`: misbehaves on request — spins, allocates without end,
/// recurses, panics, hands the host oversized payloads or malformed keys, plants
/// forged files in granted directories, or puts escape sequences and invisible
/// characters in every text it hands the host — so the host's limits, its defences and
/// what it shows an operator can be tested.
///
/// ```
/// assert!(idem_test_artifacts::HOSTILE.ends_with("hostile.wasm"));
/// ```
pub const HOSTILE: &str = env!("IDEM_GUEST_HOSTILE");
/// `tests/guests/fetcher`: N checkpointed steps, each a `run_once` that POSTs
/// `{url}/step/{i}` through `wasi:http`.
///
/// Input `{"steps": n, "url": "http://127.0.0.1:PORT", "outside": false, "key_header":
/// null, "token_header": null}`; output `{"steps": n, "replies": [{"status": s, "body":
/// "..."}, ..]}`.
///
/// ```
/// assert!(idem_test_artifacts::FETCHER.ends_with("fetcher.wasm"));
/// ```
pub const FETCHER: &str = env!("IDEM_GUEST_FETCHER");

/// `tests/guests/bench`: N durable no-op steps or N bare host calls, timed in the guest;
/// what `host/benches/idem.rs` measures.
///
/// Input `{"mode": "steps" | "calls", "n": N, "timed": false}`; output `{"n": N}` plus
/// `step_ns` and `first_step_done_unix_ns` (timed steps) or `calls_ns` (calls).
///
/// ```
/// assert!(idem_test_artifacts::BENCH.ends_with("bench.wasm"));
/// ```
pub const BENCH: &str = env!("IDEM_GUEST_BENCH");

/// `tests/guests/rogue`: tries to get around the host's limits and claims — blocks in
/// WASI, holds claims past its return, streams a request body after its commit,
/// hoards header sets.
///
/// Input `{"mode": "...", "n": 0, "url": "http://127.0.0.1:PORT"}`.
///
/// ```
/// assert!(idem_test_artifacts::ROGUE.ends_with("rogue.wasm"));
/// ```
pub const ROGUE: &str = env!("IDEM_GUEST_ROGUE");

/// `tests/guests/sloppy`: an agent written to be wrong, one mistake per mode, for
/// `idem prove` to catch — keys from the clock (`clock`) or from an attempt counter
/// (`attempt`), a request outside `run_once` (`outside`), an output that depends on the
/// generation (`generation`); `ok` makes none.
///
/// Input `{"mode": "ok", "items": n, "log": "/data/sloppy.log", "url": null}`; output
/// `{"items": n}` (plus `"generation"` in that mode).
///
/// ```
/// assert!(idem_test_artifacts::SLOPPY.ends_with("sloppy.wasm"));
/// ```
pub const SLOPPY: &str = env!("IDEM_GUEST_SLOPPY");

/// `tests/guests/rawabi`: calls every idem import through hand-declared core imports,
/// with raw canonical-ABI arguments (pointers, lengths, handles, discriminants) taken
/// from a small program in its input, for the fuzz test of the host's boundary.
///
/// Input `{"ops": [{"op": "write" | "grow" | "call" | "dump" | "fail", ..}, ..]}`;
/// output a JSON array with what each call returned and each dump read.
///
/// ```
/// assert!(idem_test_artifacts::RAWABI.ends_with("rawabi.wasm"));
/// ```
pub const RAWABI: &str = env!("IDEM_GUEST_RAWABI");

/// `tests/guests/waiter`: durable sleeps and signal waits, each followed by a logged
/// step.
///
/// Input `{"log": "/data/waiter.log", "waits": [{"sleep_ms": n} | {"until_ms": t} |
/// {"signal": "name", "timeout_ms": n}, ..]}`; output `{"results": ["slept" |
/// "timed-out" | payload JSON, ..]}`.
///
/// ```
/// assert!(idem_test_artifacts::WAITER.ends_with("waiter.wasm"));
/// ```
pub const WAITER: &str = env!("IDEM_GUEST_WAITER");

/// `tests/guests/multimem/agent.wat`: an agent with two linear memories, made a
/// component by `build.rs` (no Rust guest has a second memory); it grows the exported
/// one and the one no import or export names, so a memory limit that does not sum all
/// of an instance's memories lets it through.
///
/// Input `[A, H]`: grow the exported memory by A MiB, the other by H MiB; output the
/// input.
///
/// ```
/// assert!(idem_test_artifacts::MULTIMEM.ends_with("multimem.wasm"));
/// ```
pub const MULTIMEM: &str = env!("IDEM_GUEST_MULTIMEM");

/// `tests/guests-python/steps`: the Python twin of [`STEPS`] (same input, log lines,
/// keys and output), built with componentize-py; empty when Python is not set up.
pub const PY_STEPS: &str = env!("IDEM_GUEST_PY_STEPS");

/// `examples/python-ledger`: the Python twin of [`LEDGER`]; empty when Python is not
/// set up.
pub const PY_LEDGER: &str = env!("IDEM_GUEST_PY_LEDGER");

/// `tests/guests-python/waiter`: the Python twin of [`WAITER`] (without its retry
/// waits); empty when Python is not set up.
pub const PY_WAITER: &str = env!("IDEM_GUEST_PY_WAITER");

/// Every guest as `(name, path)`, for tests that go over them all.
///
/// ```
/// let names: Vec<&str> = idem_test_artifacts::ALL.iter().map(|(name, _)| *name).collect();
/// assert_eq!(
///     names,
///     [
///         "ledger", "dedupe", "approval", "steps", "command", "hostile", "fetcher",
///         "bench", "rogue", "sloppy", "rawabi", "waiter", "multimem"
///     ]
/// );
/// ```
pub const ALL: &[(&str, &str)] = &[
    ("ledger", LEDGER),
    ("dedupe", DEDUPE),
    ("approval", APPROVAL),
    ("steps", STEPS),
    ("command", COMMAND),
    ("hostile", HOSTILE),
    ("fetcher", FETCHER),
    ("bench", BENCH),
    ("rogue", ROGUE),
    ("sloppy", SLOPPY),
    ("rawabi", RAWABI),
    ("waiter", WAITER),
    ("multimem", MULTIMEM),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_guest_is_a_component() -> std::io::Result<()> {
        for (name, path) in ALL {
            let bytes = std::fs::read(path)?;
            assert!(
                bytes.starts_with(b"\0asm\x0d\0\x01\0"),
                "{name} ({path}) is not a component"
            );
        }
        Ok(())
    }
}
