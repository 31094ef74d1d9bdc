//! Example agent: charges each item at most once across every run that names it.
//!
//! Keys are [`Key::shared`]: they hold no run id, so two runs over overlapping items
//! share one execution per item. One charges; the other skips it, or waits for the
//! first to commit if both reach the item at the same time.
//!
//! Input: `{"items": ["order-1", "order-2"], "log": "/data/charges.log", "pause_ms": 0}`,
//! where `/data` is a folder the host grants (`--dir HOST::/data`) and `pause_ms`
//! (optional) makes each charge take that long, so that runs overlap. Output:
//! `{"charged": 2, "by_this_run": 1, "by_other_runs": 1}`.
//!
//! The output is read off the committed receipts (which run charged each item), never
//! off what this instance happened to execute or skip: a run dropped and resumed any
//! number of times returns what an uninterrupted one returns (`idem prove` checks it).
//! Each charge appends `{key} run={run_id} attempt={attempt} token={token}` to the log.

use std::fs::OpenOptions;
use std::io::Write;
use std::thread;
use std::time::Duration;

use idem_sdk::{Agent, Error, Key, run_id, run_once};
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
struct Input {
    items: Vec<String>,
    log: String,
    #[serde(default)]
    pause_ms: u64,
}

#[derive(Serialize, Default)]
struct Output {
    charged: u64,
    by_this_run: u64,
    by_other_runs: u64,
}

/// What a charge commits: every run sharing the key reads back the same receipt.
#[derive(Serialize, Deserialize)]
struct Receipt {
    charged_by: String,
    token: u64,
}

struct Dedupe;

impl Agent for Dedupe {
    type Input = Input;
    type Output = Output;

    fn run(input: Input) -> Result<Output, Error> {
        let run = run_id();
        let mut output = Output::default();

        // No checkpoint: the shared keys alone make a replayed item harmless.
        for item in &input.items {
            let key = Key::shared("charge", item)?;
            let (receipt, _outcome) = run_once(&key, |step| {
                // Stands in for a slow payment API.
                thread::sleep(Duration::from_millis(input.pause_ms));
                let line = format!(
                    "{} run={run} attempt={} token={}\n",
                    step.key(),
                    step.attempt(),
                    step.token()
                );
                append(&input.log, &line)?;
                Ok::<_, String>(Receipt {
                    charged_by: run.clone(),
                    token: step.token(),
                })
            })?;

            output.charged += 1;
            if receipt.charged_by == run {
                output.by_this_run += 1;
            } else {
                output.by_other_runs += 1;
            }
        }
        Ok(output)
    }
}

idem_sdk::export_agent!(Dedupe);

/// Appends `line` in one write, so that concurrent runs never interleave inside a
/// line, and makes it durable before the charge is committed.
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
