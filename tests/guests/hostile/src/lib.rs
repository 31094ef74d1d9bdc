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
//!   another `n` must be refused);
//! - `plant`: for each `[from, to]` in `copy`, write the bytes of `from` over `to` (or
//!   `n` bytes of `0x0f 0x0b`, x86's `ud2`, when `from` is empty), the way an agent
//!   granted idem's component cache would forge entries in it;
//! - `symlink`: for each `[target, link]` in `copy`, make `link` (relative to the
//!   directory granted as `/data`) a symbolic link to `target`, through WASI's
//!   `symlink-at`; the output is each outcome, `ok` or WASI's error code, joined by `,`.
//!
//! Modes that hand the host `text` (escape sequences, bidi and zero-width characters in
//! the tests) wherever a string can go:
//! - `say`: write `text` to stdout and stderr one byte at a time (stderr is unbuffered,
//!   so there escape and UTF-8 sequences reach the host split over writes; Rust's
//!   stdout buffers the line), then return it as the output;
//! - `fail-with`: write `text` to stderr, then fail with it as the error;
//! - `park`: claim the key `key` and stop the run in doubt with `text` as the reason;
//! - `key`: run a step under the key `text`.
//!
//! Steps that succeed append `{key} attempt={attempt} token={token}` to `log`.

use std::fs::OpenOptions;
use std::hint::black_box;
use std::io::Write;

use idem_sdk::bindings::idem::agent::once;
use idem_sdk::{Agent, Error, Key, run_once, save};
use serde::Deserialize;

#[derive(Deserialize)]
struct Input {
    mode: String,
    #[serde(default)]
    n: u64,
    #[serde(default = "default_log")]
    log: String,
    #[serde(default)]
    copy: Vec<(String, String)>,
    #[serde(default)]
    text: String,
    #[serde(default)]
    key: String,
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
            "plant" => {
                let mut planted = 0;
                for (from, to) in &input.copy {
                    let bytes = if from.is_empty() {
                        [0x0f, 0x0b].repeat(input.n as usize / 2)
                    } else {
                        std::fs::read(from).map_err(|err| Error::Agent(format!("{from}: {err}")))?
                    };
                    std::fs::write(to, &bytes)
                        .map_err(|err| Error::Agent(format!("{to}: {err}")))?;
                    planted += bytes.len();
                }
                Ok(format!("planted {planted} bytes"))
            }
            "symlink" => symlinks(&input.copy),
            "say" => {
                byte_by_byte(&mut std::io::stdout(), &input.text);
                byte_by_byte(&mut std::io::stderr(), &input.text);
                Ok(input.text)
            }
            "fail-with" => {
                byte_by_byte(&mut std::io::stderr(), &input.text);
                Err(Error::Agent(input.text))
            }
            "park" => match once::run_once(&input.key, None)? {
                // The raw binding: the SDK stops only claims in doubt, with its own text.
                once::Outcome::Claimed(claim) => {
                    once::Claim::stop(claim, &input.text);
                    Err(Error::Agent("the host did not stop the run".to_string()))
                }
                once::Outcome::Committed(_) => Ok("already committed".to_string()),
            },
            "key" => {
                run_once(&Key::new(input.text), |_| Ok::<_, String>(()))?;
                Ok("done".to_string())
            }
            other => Err(Error::Agent(format!("unknown mode {other:?}"))),
        }
    }
}

idem_sdk::export_agent!(Hostile);

/// Makes each `[target, link]` a symbolic link in the directory granted as `/data`,
/// through the WASI call itself (Rust's std has no stable symlink for WASI).
fn symlinks(links: &[(String, String)]) -> Result<String, Error> {
    let Some((data, _)) = wasi::filesystem::preopens::get_directories()
        .into_iter()
        .find(|(_, name)| name == "/data")
    else {
        return Err(Error::Agent("no directory is granted as /data".to_string()));
    };
    let outcomes: Vec<String> = links
        .iter()
        .map(|(target, link)| match data.symlink_at(target, link) {
            Ok(()) => "ok".to_string(),
            Err(code) => code.name().to_string(),
        })
        .collect();
    Ok(outcomes.join(","))
}

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

/// Writes `text` one byte per call, then a newline.
fn byte_by_byte(out: &mut dyn Write, text: &str) {
    for byte in text.as_bytes() {
        // Nowhere to report a failed write of the agent's own output.
        let _ = out.write_all(&[*byte]);
    }
    let _ = out.write_all(b"\n");
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
