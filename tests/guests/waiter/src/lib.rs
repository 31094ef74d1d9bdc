//! Test agent: `waiter` runs a list of durable waits, each followed by a logged
//! `run_once` step, so tests can count what ran before and after each wait.
//!
//! Input:
//!
//! ```json
//! {"log": "/data/waiter.log",
//!  "waits": [{"sleep_ms": 3600000}, {"until_ms": 1700000000000},
//!            {"signal": "approval", "timeout_ms": 60000}]}
//! ```
//!
//! A wait may instead be `{"retry": {"fail": 2, "permanent": false, "max_attempts": 3,
//! "initial_ms": 1000, "jitter": false}}`: a `run_once_retry` step (key `flaky/{i}`)
//! whose first `fail` attempts fail, each attempt appending `try {i} attempt={n}
//! gen={generation}`; its `what` is `ok-{attempt}` or `error: {message}`.
//!
//! A wait may instead be `{"rate": "llm"}`: a step (key `rated/{i}`) of that rate class,
//! which takes a token of it first and appends `rated {i} gen={generation}`; its `what`
//! is `rated`.
//!
//! Wait `i` has the key `wait-{i}`. The agent first appends `start gen={generation}`
//! (once, under a key), then per wait, after it is over, appends
//! `after {i} {what} gen={generation}` where `what` is `slept`, `timed-out`, or the
//! signal's payload as JSON. A refused wait fails the run with the SDK's error text.
//! Output: `{"results": [what, ...]}`.

use std::fs::OpenOptions;
use std::io::Write;
use std::time::{Duration, UNIX_EPOCH};

use idem_sdk::{
    Agent, Error, Failure, Key, Once, RetryPolicy, generation, run_once, run_once_retry,
};
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
struct Input {
    log: String,
    waits: Vec<Wait>,
}

#[derive(Deserialize)]
struct Wait {
    #[serde(default)]
    sleep_ms: Option<u64>,
    #[serde(default)]
    until_ms: Option<i64>,
    #[serde(default)]
    signal: Option<String>,
    #[serde(default)]
    timeout_ms: Option<u64>,
    #[serde(default)]
    retry: Option<Retry>,
    #[serde(default)]
    rate: Option<String>,
}

/// A step run with `run_once_retry` whose first `fail` attempts fail.
#[derive(Deserialize)]
struct Retry {
    fail: u32,
    #[serde(default)]
    permanent: bool,
    max_attempts: u32,
    initial_ms: u64,
    #[serde(default)]
    jitter: bool,
}

#[derive(Serialize)]
struct Output {
    results: Vec<String>,
}

struct Waiter;

fn append(log: &str, line: &str) -> Result<(), String> {
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| e.to_string())?;
    // One write per line: runs appending at once never interleave their lines.
    file.write_all(format!("{line}\n").as_bytes())
        .map_err(|e| e.to_string())
}

impl Agent for Waiter {
    type Input = Input;
    type Output = Output;

    fn run(input: Input) -> Result<Output, Error> {
        let log = input.log.as_str();
        run_once(&Key::for_run("start", &())?, |_| {
            append(log, &format!("start gen={}", generation()))
        })?;
        let mut results = Vec::new();
        for (i, wait) in input.waits.iter().enumerate() {
            let key = format!("wait-{i}");
            let what = if let Some(retry) = &wait.retry {
                let policy = RetryPolicy {
                    max_attempts: retry.max_attempts,
                    initial_delay: Duration::from_millis(retry.initial_ms),
                    jitter: retry.jitter,
                    ..RetryPolicy::default()
                };
                let result = run_once_retry(&Key::for_run("flaky", &i)?, &policy, |step| {
                    let attempt = step.attempt();
                    append(
                        log,
                        &format!("try {i} attempt={attempt} gen={}", generation()),
                    )
                    .map_err(Failure::Transient)?;
                    match (attempt <= retry.fail, retry.permanent) {
                        (false, _) => Ok(attempt),
                        (true, false) => Err(Failure::Transient(format!("flaky {attempt}"))),
                        (true, true) => Err(Failure::Permanent(format!("refused {attempt}"))),
                    }
                });
                match result {
                    Ok((attempt, _)) => format!("ok-{attempt}"),
                    Err(Error::Effect(message)) => format!("error: {message}"),
                    Err(e) => return Err(e),
                }
            } else if let Some(class) = &wait.rate {
                Once::new(&Key::for_run("rated", &i)?)
                    .rate(class)
                    .run(|_| append(log, &format!("rated {i} gen={}", generation())))?;
                "rated".to_string()
            } else if let Some(name) = &wait.signal {
                let timeout = wait.timeout_ms.map(Duration::from_millis);
                match idem_sdk::wait_for_signal::<serde_json::Value>(&key, name, timeout) {
                    Ok(payload) => payload.to_string(),
                    Err(Error::TimedOut(_)) => "timed-out".to_string(),
                    Err(e) => return Err(e),
                }
            } else if let Some(at) = wait.until_ms {
                let at = if at >= 0 {
                    UNIX_EPOCH + Duration::from_millis(at.unsigned_abs())
                } else {
                    UNIX_EPOCH - Duration::from_millis(at.unsigned_abs())
                };
                idem_sdk::sleep_until(&key, at)?;
                "slept".to_string()
            } else {
                idem_sdk::sleep(&key, Duration::from_millis(wait.sleep_ms.unwrap_or(0)))?;
                "slept".to_string()
            };
            run_once(&Key::for_run("after", &i)?, |_| {
                append(log, &format!("after {i} {what} gen={}", generation()))
            })?;
            results.push(what);
        }
        Ok(Output { results })
    }
}

idem_sdk::export_agent!(Waiter);
