//! Test agent: `steps` checkpointed steps, each one `run_once` that appends a log line,
//! with knobs that let tests put crashes, kills and failures where they want them.
//!
//! Input (all but `steps` and `log` optional):
//!
//! ```json
//! {"steps": 5, "log": "/data/log.txt", "spin": 0, "fail_at": null, "pause_ms": 0, "shared": false}
//! ```
//!
//! - `spin`: iterations of a busy loop before each step, so that fuel and epoch kills
//!   land mid-computation, away from any host call;
//! - `fail_at`: the step whose first attempt fails (the claim is released and the run
//!   fails with `side effect failed: ...`); run it again and attempt 2 succeeds;
//! - `pause_ms`: a sleep inside each side effect, so that runs overlap;
//! - `stall_at`: the step whose first attempt, once its log line is durable, sleeps ten
//!   minutes before returning: a window in which to kill the process after the effect
//!   landed and before the step is recorded (the bench's crash scenario);
//! - `shared`: keys without the run id (`step/{hash}`), shared by every run;
//! - `fold`: save each checkpoint in its step's commit transaction
//!   (`Once::run_and_save`) instead of with a separate `save`;
//! - `policy`: what to do with a claim in doubt: `"retry"` (default), `"fail"` (stop
//!   the run in doubt), or `"probe"` (look for the key in the log: found means the
//!   effect was applied, so its value is committed without appending again);
//! - `ballast`: bytes of history carried in every checkpoint besides the checksum (a
//!   conversation that grows large), each step's its own; a resumed run checks that
//!   the history it loads is the one its step saved.
//!
//! Each executed step appends
//! `{key} attempt={attempt} token={token} in_doubt={in_doubt} gen={generation}`; a failing
//! attempt appends nothing. Output: `{"steps": N, "checksum": "<16 hex digits>"}`, the
//! same however often the run was killed and resumed.

use std::fs::OpenOptions;
use std::hint::black_box;
use std::io::Write;
use std::thread;
use std::time::Duration;

use idem_sdk::{Agent, Checkpoint, Error, InDoubt, Key, Once, generation, load, save};
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
struct Input {
    steps: u64,
    log: String,
    #[serde(default)]
    spin: u64,
    #[serde(default)]
    fail_at: Option<u64>,
    #[serde(default)]
    pause_ms: u64,
    #[serde(default)]
    stall_at: Option<u64>,
    #[serde(default)]
    shared: bool,
    #[serde(default)]
    policy: Policy,
    #[serde(default)]
    fold: bool,
    #[serde(default)]
    ballast: usize,
}

/// A checkpoint with history: the checksum so far and `ballast` bytes of the step's.
#[derive(Serialize, Deserialize)]
struct Ballasted {
    checksum: u64,
    history: String,
}

/// The history checkpointed before step `step`: `len` bytes no other step has.
fn history(step: u64, len: usize) -> String {
    format!("{step:>8}|").chars().cycle().take(len).collect()
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(rename_all = "lowercase")]
enum Policy {
    #[default]
    Retry,
    Fail,
    Probe,
}

#[derive(Serialize)]
struct Output {
    steps: u64,
    checksum: String,
}

struct Steps;

impl Agent for Steps {
    type Input = Input;
    type Output = Output;

    fn run(input: Input) -> Result<Output, Error> {
        // `step` is the next step to run; the state is the checksum so far.
        let (start, mut checksum) = if input.ballast > 0 {
            match load::<Ballasted>()? {
                Some(checkpoint) => {
                    if checkpoint.state.history != history(checkpoint.step, input.ballast) {
                        return Err(Error::Agent(format!(
                            "the history loaded for step {} is not the one saved",
                            checkpoint.step
                        )));
                    }
                    (checkpoint.step, checkpoint.state.checksum)
                }
                None => (0, 0),
            }
        } else {
            match load::<u64>()? {
                Some(checkpoint) => (checkpoint.step, checkpoint.state),
                None => (0, 0),
            }
        };

        for i in start..input.steps {
            checksum = mix(checksum, spin(i, input.spin));

            let key = if input.shared {
                Key::shared("step", &i)?
            } else {
                Key::for_run("step", &i)?
            };
            // The log is the downstream: a line with the key means the effect landed.
            let probe = |step: &idem_sdk::Step| -> Result<Option<u64>, String> {
                let log = std::fs::read_to_string(&input.log).unwrap_or_default();
                let prefix = format!("{} ", step.key());
                Ok(log
                    .lines()
                    .any(|line| line.starts_with(&prefix))
                    .then(|| mix(i, 0x5eed)))
            };
            let policy = match input.policy {
                Policy::Retry => InDoubt::Retry,
                Policy::Fail => InDoubt::Fail,
                Policy::Probe => InDoubt::Probe(&probe),
            };
            let effect = |step: &idem_sdk::Step| {
                if input.fail_at == Some(i) && step.attempt() == 1 {
                    return Err(format!("step {i} fails on its first attempt"));
                }
                thread::sleep(Duration::from_millis(input.pause_ms));
                let line = format!(
                    "{} attempt={} token={} in_doubt={} gen={}\n",
                    step.key(),
                    step.attempt(),
                    step.token(),
                    step.in_doubt(),
                    generation()
                );
                append(&input.log, &line)?;
                if input.stall_at == Some(i) && step.attempt() == 1 {
                    thread::sleep(Duration::from_secs(600));
                }
                Ok(mix(i, 0x5eed))
            };
            let once = Once::new(&key).in_doubt(policy);
            let (value, _outcome) = if input.fold {
                once.run_and_save(effect, |value: &u64| Checkpoint {
                    step: i + 1,
                    state: mix(checksum, *value),
                })?
            } else {
                let done = once.run(effect)?;
                let state = mix(checksum, done.0);
                if input.ballast > 0 {
                    let history = history(i + 1, input.ballast);
                    save(
                        i + 1,
                        &Ballasted {
                            checksum: state,
                            history,
                        },
                    )?;
                } else {
                    save(i + 1, &state)?;
                }
                done
            };
            checksum = mix(checksum, value);
        }

        Ok(Output {
            steps: input.steps,
            checksum: format!("{checksum:016x}"),
        })
    }
}

idem_sdk::export_agent!(Steps);

/// A deterministic busy loop (xorshift64) that the optimiser cannot remove or shorten.
fn spin(seed: u64, iterations: u64) -> u64 {
    // Zero is a fixed point of xorshift: forcing the seed odd keeps the loop moving.
    let mut x = mix(seed, 0x9e37_79b9_7f4a_7c15) | 1;
    for _ in 0..iterations {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x = black_box(x);
    }
    x
}

/// Order-dependent mixing of two words (FNV-1a style).
fn mix(acc: u64, word: u64) -> u64 {
    (acc ^ word)
        .wrapping_mul(0x0000_0100_0000_01b3)
        .rotate_left(29)
}

/// Appends `line` in one write and makes it durable before the step commits.
fn append(path: &str, line: &str) -> Result<(), String> {
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|err| format!("{path}: {err}"))?;
    file.write_all(line.as_bytes())
        .and_then(|()| file.flush())
        .and_then(|()| file.sync_all())
        .map_err(|err| format!("{path}: {err}"))
}
