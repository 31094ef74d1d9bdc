//! {{name}}: an idem agent. For each item of its input it appends one line to
//! `/data/{{name}}.log` (a folder granted with `--dir HOST::/data`), exactly once per
//! item, and resumes from its checkpoint after any crash.
//!
//! Input: `{"items": ["a", "b"]}`. Output: `{"written": 2}`.

use std::fs::OpenOptions;
use std::io::Write;

use idem_sdk::{Agent, Checkpoint, Error, Key, Once, export_agent, load};
use serde::{Deserialize, Serialize};

const LOG: &str = "/data/{{name}}.log";

#[derive(Deserialize)]
struct Input {
    items: Vec<String>,
}

#[derive(Serialize)]
struct Output {
    written: usize,
}

struct App;

impl Agent for App {
    type Input = Input;
    type Output = Output;

    fn run(input: Input) -> Result<Output, Error> {
        // The checkpoint's step is the index of the next item: a resumed run skips the
        // items it finished.
        let start = load::<()>()?.map_or(0, |checkpoint| checkpoint.step);
        let start = usize::try_from(start).unwrap_or(usize::MAX);
        for (i, item) in input.items.iter().enumerate().skip(start) {
            // The key comes from what the step processes (its position, its item), never
            // from the time or an attempt: a resumed instance computes the same key.
            let key = Key::for_run("write", &(i, item))?;
            // The side effect, then its result and the next checkpoint committed in one
            // transaction. `step.token()` is a fencing token for a downstream.
            Once::new(&key).run_and_save(
                |step| {
                    let line = format!("{} token={} item={item}\n", step.key(), step.token());
                    append(&line)
                },
                |_: &()| Checkpoint {
                    step: i as u64 + 1,
                    state: (),
                },
            )?;
        }
        Ok(Output {
            written: input.items.len(),
        })
    }
}

export_agent!(App);

/// Appends `line` in one write, durable before the step commits.
fn append(line: &str) -> Result<(), String> {
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(LOG)
        .map_err(|err| format!("{LOG}: {err}"))?;
    file.write_all(line.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|err| format!("{LOG}: {err}"))
}
