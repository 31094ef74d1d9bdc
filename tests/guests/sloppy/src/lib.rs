//! Test agent: written to be wrong, in one of the ways agent code goes wrong that no
//! host can prevent but `idem prove` must catch. Each mode makes one mistake; `ok` makes
//! none.
//!
//! Input (all but `mode` and `items` optional):
//!
//! ```json
//! {"mode": "ok", "items": 4, "log": "/data/sloppy.log", "url": null}
//! ```
//!
//! Each of `items` steps runs one `run_once` whose side effect POSTs `{url}/step/{i}`
//! (body `{i}`) when `url` is given, else appends `{key} attempt={a} token={t}` to
//! `log`; after each, the checkpoint (the next item, and the attempt counter) is saved.
//! The modes:
//!
//! - `ok`: keys from the item's position; nothing wrong.
//! - `clock`: keys carry the time (nanoseconds since the epoch): a resumed instance
//!   computes new keys and runs committed steps again.
//! - `attempt`: keys carry an attempt counter, kept in the checkpoint and raised by
//!   every instance that starts: the same mistake through a retry count.
//! - `outside`: before its steps it POSTs `{url}/notify` outside any `run_once` (and
//!   ignores the refusal), a side effect no key protects.
//! - `generation`: the output carries the instance's generation, so an interrupted run
//!   returns something an uninterrupted one does not.
//! - `spawn-unstable`: after its steps it spawns a child run (of the `sloppy`
//!   deployment, mode `ok`, no items) under a key that carries the instance's
//!   generation: a resumed instance spawns another child instead of finding the first.
//!
//! Output: `{"items": N}`, plus `"generation": G` in `generation` mode.

use std::fs::OpenOptions;
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use idem_sdk::http::Request;
use idem_sdk::{Agent, Error, Key, load, run_once, save, spawn};
use serde::{Deserialize, Serialize};

#[derive(Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Mode {
    Ok,
    Clock,
    Attempt,
    Outside,
    Generation,
    #[serde(rename = "spawn-unstable")]
    SpawnUnstable,
}

#[derive(Deserialize)]
struct Input {
    mode: Mode,
    items: u64,
    #[serde(default)]
    log: Option<String>,
    #[serde(default)]
    url: Option<String>,
}

#[derive(Serialize)]
struct Output {
    items: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    generation: Option<u32>,
}

/// The input of the child `spawn-unstable` spawns.
#[derive(Serialize)]
struct ChildInput {
    mode: &'static str,
    items: u64,
}

/// The checkpoint's state: how many instances have started, counting this one.
#[derive(Serialize, Deserialize, Default)]
struct Attempts {
    attempt: u64,
}

struct Sloppy;

impl Agent for Sloppy {
    type Input = Input;
    type Output = Output;

    fn run(input: Input) -> Result<Output, Error> {
        let (start, attempts) = match load::<Attempts>()? {
            Some(checkpoint) => (checkpoint.step, checkpoint.state),
            None => (0, Attempts::default()),
        };
        let attempt = attempts.attempt + 1;
        if input.mode == Mode::Attempt {
            // The mistake's bookkeeping: a retry counter that survives instances.
            save(start, &Attempts { attempt })?;
        }
        if input.mode == Mode::Outside
            && let Some(url) = &input.url
        {
            // The mistake: a side effect outside run_once. The host refuses it; the
            // agent shrugs and goes on, as such code usually does.
            let _refused = Request::post(&format!("{url}/notify")).body("hello").send();
        }
        for i in start..input.items {
            let key = match input.mode {
                Mode::Clock => Key::for_run("send", &(i, now_nanos()))?,
                Mode::Attempt => Key::for_run("send", &(i, attempt))?,
                _ => Key::for_run("send", &i)?,
            };
            run_once(&key, |step| effect(&input, i, step))?;
            save(i + 1, &Attempts { attempt })?;
        }
        if input.mode == Mode::SpawnUnstable {
            // The mistake: the child's key changes with every instance.
            let key = format!("child-{}", idem_sdk::generation());
            let child = ChildInput {
                mode: "ok",
                items: 0,
            };
            spawn(&key, "sloppy", &child)?;
        }
        Ok(Output {
            items: input.items,
            generation: (input.mode == Mode::Generation).then(idem_sdk::generation),
        })
    }
}

idem_sdk::export_agent!(Sloppy);

fn effect(input: &Input, i: u64, step: &idem_sdk::Step) -> Result<(), Error> {
    if let Some(url) = &input.url {
        Request::post(&format!("{url}/step/{i}"))
            .body(i.to_string())
            .send()?;
        return Ok(());
    }
    let Some(log) = &input.log else {
        return Ok(());
    };
    let line = format!(
        "{} attempt={} token={}\n",
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

fn now_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}
