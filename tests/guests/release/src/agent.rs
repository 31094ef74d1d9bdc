// The `release` agent's code, shared by its versions (each crate sets `STEP` and
// `VERSION` and includes this file), so that the versions differ only where a test
// means them to.

use std::fs::OpenOptions;
use std::io::Write;
use std::time::Duration;

use idem_sdk::{Agent, Error, Key, run_once, sleep};
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
struct Input {
    items: u64,
    /// Where each step's effect appends its line; no effect but the commit without.
    #[serde(default)]
    log: Option<String>,
    #[serde(default)]
    pause_at: Option<u64>,
    #[serde(default)]
    pause_ms: u64,
}

#[derive(Serialize)]
struct Output {
    items: u64,
    version: u32,
}

struct Release;

impl Agent for Release {
    type Input = Input;
    type Output = Output;

    fn run(input: Input) -> Result<Output, Error> {
        // No checkpoint: a resumed instance replays every step, so a version that
        // derives a step's key another way would run a committed step again.
        for i in 0..input.items {
            let key = Key::for_run(STEP, &i)?;
            run_once(&key, |step| append(input.log.as_deref(), step))?;
            if input.pause_at == Some(i + 1) {
                sleep("pause", Duration::from_millis(input.pause_ms))?;
            }
        }
        Ok(Output {
            items: input.items,
            version: VERSION,
        })
    }
}

idem_sdk::export_agent!(Release);

fn append(log: Option<&str>, step: &idem_sdk::Step) -> Result<(), Error> {
    let Some(log) = log else {
        return Ok(());
    };
    let line = format!(
        "{} attempt={} token={} version={VERSION}\n",
        step.key(),
        step.attempt(),
        step.token()
    );
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .and_then(|mut file| file.write_all(line.as_bytes()))
        .map_err(|err| Error::Agent(format!("{log}: {err}")))
}
