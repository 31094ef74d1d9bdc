//! Test agent that misbehaves on request, so that tests can check that every limit of
//! the host holds and is named in the error.
//!
//! Input: `{"mode": "...", "n": 0, "log": "/data/log.txt"}` with `mode` one of
//! - `spin`: compute for `n` iterations without any host call, then succeed;
//! - `alloc`: allocate 1 MiB blocks without end;
//! - `recurse`: recurse without end (stack overflow);
//! - `panic`: panic;
//! - `big-result`: commit a result of `n` bytes;
//! - `big-state`: save a checkpoint state of `n` bytes;
//! - `long-key`: use a key of `n` bytes;
//! - `slow-effect`: compute for `n` iterations inside a side effect (holding a claim);
//! - `bound-key`: run the hand-named key `bound` bound to input `n` (reusing it with
//!   another `n` must be refused).
//!
//! Steps that succeed append `{key} attempt={attempt} token={token}` to `log`.

use std::fs::OpenOptions;
use std::hint::black_box;
use std::io::Write;

use idem_sdk::{Agent, Error, Key, run_once, save};
use serde::Deserialize;

#[derive(Deserialize)]
struct Input {
    mode: String,
    #[serde(default)]
    n: u64,
    #[serde(default = "default_log")]
    log: String,
}

fn default_log() -> String {
    "/data/log.txt".to_string()
}

struct Hostile;

impl Agent for Hostile {
    type Input = Input;
    type Output = String;

    fn run(input: Input) -> Result<String, Error> {
        match input.mode.as_str() {
            "spin" => Ok(format!("{:x}", spin(input.n))),
            "alloc" => {
                let mut blocks: Vec<Vec<u8>> = Vec::new();
                loop {
                    blocks.push(black_box(vec![1; 1 << 20]));
                }
            }
            "recurse" => Ok(format!("{}", recurse(black_box(1)))),
            "panic" => panic!("the hostile agent panics on purpose"),
            "big-result" => {
                let n = input.n as usize;
                let (value, _) = run_once(&Key::for_run("big", &n)?, |_| {
                    Ok::<_, String>("x".repeat(n))
                })?;
                Ok(format!("{} bytes", value.len()))
            }
            "big-state" => {
                save(1, &"x".repeat(input.n as usize))?;
                Ok("saved".to_string())
            }
            "long-key" => {
                let key = Key::new("k".repeat(input.n as usize));
                run_once(&key, |_| Ok::<_, String>(()))?;
                Ok("done".to_string())
            }
            "slow-effect" => {
                let (value, _) = run_once(&Key::for_run("slow", &input.n)?, |step| {
                    let value = spin(input.n);
                    append(
                        &input.log,
                        &format!(
                            "{} attempt={} token={}\n",
                            step.key(),
                            step.attempt(),
                            step.token()
                        ),
                    )?;
                    Ok::<_, String>(value)
                })?;
                Ok(format!("{value:x}"))
            }
            "bound-key" => {
                let key = Key::new("bound").with_input(&input.n)?;
                let (value, _) = run_once(&key, |_| Ok::<_, String>(input.n))?;
                Ok(format!("{value}"))
            }
            other => Err(Error::Agent(format!("unknown mode {other:?}"))),
        }
    }
}

idem_sdk::export_agent!(Hostile);

/// A busy loop the optimiser cannot remove (xorshift64).
fn spin(iterations: u64) -> u64 {
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    for _ in 0..iterations {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x = black_box(x);
    }
    x
}

/// Recursion the optimiser cannot turn into a loop: each frame keeps a live array.
#[allow(unconditional_recursion, reason = "overflowing the stack is the point")]
fn recurse(depth: u64) -> u64 {
    let frame = black_box([depth; 64]);
    frame[(depth % 64) as usize] + recurse(black_box(depth + 1))
}

fn append(path: &str, line: &str) -> Result<(), String> {
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|err| format!("{path}: {err}"))?;
    file.write_all(line.as_bytes())
        .map_err(|err| format!("{path}: {err}"))
}
