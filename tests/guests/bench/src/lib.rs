//! Bench agent: the smallest durable work an agent can ask of idem, and the bare host-call
//! round trip, timed from inside the guest for `host/benches/idem.rs`.
//!
//! Input (`timed` optional):
//!
//! ```json
//! {"mode": "steps", "n": 1000, "timed": false, "fold": true}
//! ```
//!
//! - `"steps"`: steps `checkpoint..n`, each `run_once(Key::for_run("s", &i))` with a no-op
//!   side effect and the checkpoint `i + 1` saved in the commit's transaction
//!   (`Once::run_and_save`); with `"fold": false`, saved by a separate `save(i + 1, &())`. With `"timed": true` the output carries the
//!   duration of each step this instance ran (`step_ns`: monotonic clock, from before the
//!   key is built to after the save returned) and the wall-clock time at which its first
//!   step was done (`first_step_done_unix_ns`), so that a caller in another process can
//!   time a cold start up to the first durable step.
//!   With `"rate": "CLASS"`, each step names that rate class (`Once::rate`), so it takes
//!   a token of it before its claim (folded steps only). With `"result_bytes": N`, each
//!   step's effect returns a string of N bytes (its step number and `"seed"`, then
//!   padding), so the commit writes a result that size (folded steps only); a new seed
//!   makes results no earlier run wrote, so none is kept once for two.
//! - `"calls"`: `n` calls of `idem_sdk::generation()`, a host call that touches no store;
//!   the output carries the loop's duration (`calls_ns`).
//!
//! Timing happens in the guest because a host embedding idem sees only whole runs: the
//! per-step distribution (median, p99) is only visible from where the steps are made.

use std::hint::black_box;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use idem_sdk::{Agent, Checkpoint, Error, Key, Once, generation, load, run_once, save};
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum Mode {
    Steps,
    Calls,
}

#[derive(Deserialize)]
struct Input {
    mode: Mode,
    n: u64,
    #[serde(default)]
    timed: bool,
    #[serde(default = "yes")]
    fold: bool,
    #[serde(default)]
    rate: Option<String>,
    #[serde(default)]
    result_bytes: usize,
    #[serde(default)]
    seed: u64,
}

fn yes() -> bool {
    true
}

#[derive(Serialize, Default)]
struct Output {
    n: u64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    step_ns: Vec<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    first_step_done_unix_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    calls_ns: Option<u64>,
}

struct Bench;

impl Agent for Bench {
    type Input = Input;
    type Output = Output;

    fn run(input: Input) -> Result<Output, Error> {
        match input.mode {
            Mode::Steps => steps(&input),
            Mode::Calls => Ok(calls(input.n)),
        }
    }
}

idem_sdk::export_agent!(Bench);

fn steps(input: &Input) -> Result<Output, Error> {
    let (n, timed, fold, rate) = (input.n, input.timed, input.fold, input.rate.as_deref());
    let start = load::<()>()?.map_or(0, |c| c.step);
    let mut out = Output {
        n,
        ..Output::default()
    };
    if timed {
        // Reserved up front so that no step pays for the vector growing.
        out.step_ns
            .reserve_exact(usize::try_from(n.saturating_sub(start)).unwrap_or(0));
    }
    for i in start..n {
        let began = Instant::now();
        let key = Key::for_run("s", &i)?;
        if fold {
            if input.result_bytes > 0 {
                once(&key, rate).run_and_save(
                    |_| Ok::<_, String>(result(i, input.seed, input.result_bytes)),
                    |_| Checkpoint {
                        step: i + 1,
                        state: (),
                    },
                )?;
            } else {
                once(&key, rate).run_and_save(
                    |_| Ok::<_, String>(()),
                    |_| Checkpoint {
                        step: i + 1,
                        state: (),
                    },
                )?;
            }
        } else {
            run_once(&key, |_| Ok::<_, String>(()))?;
            save(i + 1, &())?;
        }
        if timed {
            out.step_ns.push(nanos(began.elapsed().as_nanos()));
            if out.first_step_done_unix_ns.is_none() {
                out.first_step_done_unix_ns = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .ok()
                    .map(|d| nanos(d.as_nanos()));
            }
        }
    }
    Ok(out)
}

/// The step under `key`, taking a token of `rate` first when it names a class.
fn once<'a, T: Serialize + serde::de::DeserializeOwned>(
    key: &'a Key,
    rate: Option<&'a str>,
) -> Once<'a, T> {
    let once = Once::new(key);
    match rate {
        Some(class) => once.rate(class),
        None => once,
    }
}

/// Step `i`'s result of `len` bytes: no two steps' (or seeds') alike.
fn result(i: u64, seed: u64, len: usize) -> String {
    let mut text = format!("{i:>20}{seed:>20}");
    // Copied in whole, not pushed a character at a time: the step times the store, not
    // the agent's loop.
    text.push_str(&"r".repeat(len.saturating_sub(text.len() + 2)));
    text
}

fn calls(n: u64) -> Output {
    let began = Instant::now();
    for _ in 0..n {
        black_box(generation());
    }
    Output {
        n,
        calls_ns: Some(nanos(began.elapsed().as_nanos())),
        ..Output::default()
    }
}

fn nanos(ns: u128) -> u64 {
    u64::try_from(ns).unwrap_or(u64::MAX)
}
