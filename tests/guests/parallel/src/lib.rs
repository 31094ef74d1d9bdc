//! Test agent: batches of steps whose side effects are in flight together. Each batch
//! is one `run_once_all`; its side effects are one `POST` per step, sent at once with
//! `http::send_all`, each request tied to its own step's claim.
//!
//! Input (all but `url` and `batches` optional):
//!
//! ```json
//! {"url": "http://127.0.0.1:PORT", "batches": [3, 2], "fail": ["b1-0"],
//!  "refuse_over": null}
//! ```
//!
//! - step `i` of batch `b` is named `b{b}-{i}`, keyed `Key::for_run("call", name)`;
//!   its side effect is `POST {url}/call/{name}` with the name as body, and its
//!   committed result the response's body;
//! - `fail`: names whose side effect fails (after its request) instead: the batch's
//!   call then fails, and so does the run;
//! - `refuse_over`: first ask for this many keys in one `run_once_all` (more than the
//!   host's limit of claims, in tests): the run fails unless the host refuses them with
//!   `too-large`; the refusal's text goes in the output;
//! - `plain`: leave the outcomes out of the output, which then depends only on the
//!   committed results (as `idem prove` wants of an agent's output);
//! - `stale`: last, commit one step with `run_once_all`, then, inside another step,
//!   send `POST {url}/stale` tied to the first (committed) step: the host must refuse
//!   it; the error's text goes in the output.
//!
//! Output: `{"replies": [[body, ..], ..], "outcomes": [["executed" | "reclaimed:N" |
//! "skipped" | "awaited", ..], ..], "refused": text | null, "stale": text | null}`, by
//! batch and step.

use idem_sdk::http::{Request, send_all};
use idem_sdk::{Agent, Error, Key, Outcome, StepError, run_once, run_once_all};
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
struct Input {
    url: String,
    batches: Vec<u32>,
    #[serde(default)]
    fail: Vec<String>,
    #[serde(default)]
    refuse_over: Option<u32>,
    #[serde(default)]
    plain: bool,
    #[serde(default)]
    stale: bool,
}

#[derive(Serialize)]
struct Output {
    replies: Vec<Vec<String>>,
    outcomes: Vec<Vec<String>>,
    refused: Option<String>,
    stale: Option<String>,
}

fn outcome(o: Outcome) -> String {
    match o {
        Outcome::Executed => "executed".into(),
        Outcome::Reclaimed { attempt } => format!("reclaimed:{attempt}"),
        Outcome::Probed => "probed".into(),
        Outcome::Skipped => "skipped".into(),
        Outcome::Awaited => "awaited".into(),
    }
}

/// Asks for `n` keys at once and expects the host to refuse them all.
fn refuse_over(n: u32) -> Result<String, Error> {
    let keys = (0..n)
        .map(|i| Key::for_run("over", &i))
        .collect::<Result<Vec<_>, _>>()?;
    match run_once_all(&keys, |steps| {
        steps.iter().map(|_| Ok::<_, Error>(0_u32)).collect()
    }) {
        Err(Error::Step(StepError::TooLarge(text))) => Ok(text),
        Err(other) => Err(Error::Agent(format!("not refused as too large: {other}"))),
        Ok(_) => Err(Error::Agent(format!("{n} claims at once were granted"))),
    }
}

struct Parallel;

impl Agent for Parallel {
    type Input = Input;
    type Output = Output;

    fn run(input: Input) -> Result<Output, Error> {
        let refused = input.refuse_over.map(refuse_over).transpose()?;
        let mut output = Output {
            replies: Vec::new(),
            outcomes: Vec::new(),
            refused,
            stale: None,
        };
        for (b, &n) in input.batches.iter().enumerate() {
            let names: Vec<String> = (0..n).map(|i| format!("b{b}-{i}")).collect();
            let keys = names
                .iter()
                .map(|name| Key::for_run("call", name))
                .collect::<Result<Vec<_>, _>>()?;
            let done = run_once_all(&keys, |steps| {
                // The step's name is the last part of its key's text, which ends in the
                // hash of the name: find it by position instead.
                let named: Vec<&String> = steps
                    .iter()
                    .map(|step| {
                        let i = keys
                            .iter()
                            .position(|k| k.as_str() == step.key())
                            .unwrap_or_default();
                        &names[i]
                    })
                    .collect();
                let requests = steps.iter().zip(&named).map(|(step, name)| {
                    Request::post(&format!("{}/call/{name}", input.url))
                        .header("content-type", "text/plain")
                        .body(name.as_str())
                        .under(step)
                });
                send_all(requests)
                    .into_iter()
                    .zip(&named)
                    .map(|(response, name)| {
                        let response = response?;
                        if input.fail.contains(name) {
                            return Err(Error::Agent(format!("{name} failed as asked")));
                        }
                        Ok(String::from_utf8_lossy(&response.body).into_owned())
                    })
                    .collect()
            })?;
            let (replies, outcomes) = done.into_iter().map(|(r, o)| (r, outcome(o))).unzip();
            output.replies.push(replies);
            if !input.plain {
                output.outcomes.push(outcomes);
            }
        }
        if input.stale {
            output.stale = stale(&input.url)?;
        }
        Ok(output)
    }
}

/// Sends a request tied to a step whose claim was committed: the host's refusal, as
/// text (`None` if the request went out).
fn stale(url: &str) -> Result<Option<String>, Error> {
    let mut settled = None;
    run_once_all(&[Key::for_run("stale", &0)?], |steps| {
        settled = steps.first().cloned();
        steps.iter().map(|_| Ok::<_, Error>(0_u32)).collect()
    })?;
    let (refusal, _) = run_once(&Key::for_run("stale", &1)?, |_step| {
        let Some(settled) = &settled else {
            // Committed before this instance: the refusal was recorded with it.
            return Err(Error::Agent("the first stale step ran elsewhere".into()));
        };
        let sent = Request::post(&format!("{url}/stale")).under(settled).send();
        Ok::<_, Error>(sent.err().map(|err| err.to_string()))
    })?;
    Ok(refusal)
}

idem_sdk::export_agent!(Parallel);
