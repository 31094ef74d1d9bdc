//! Test agent that tries to get around the host's limits and claims, so that tests can
//! check each one holds.
//!
//! Input: `{"mode": "...", "n": 0, "url": "http://127.0.0.1:PORT"}` with `mode` one of
//! - `sleep`: sleep `n` ms in WASI outside any claim, then succeed;
//! - `sleep-in-effect`: sleep `n` ms in WASI inside a side effect;
//! - `two-claims`: claim `a` and `b`, commit `a`, then sleep `n` ms holding `b`;
//! - `return-holding`: claim `held` and return without settling it;
//! - `rerun-held`: claim `k`, then `run_once` `k` again while holding it; returns the
//!   error it got;
//! - `huge-step`: save a checkpoint at step `u64::MAX`; returns the error it got;
//! - `big-output`: return `n` bytes;
//! - `fields`: build `n` header sets of 60 KiB each and keep them all;
//! - `stream-after-commit`: under a claim, POST to `url` with a streamed body, send
//!   `before-commit`, commit, then send `after-commit` and finish the body.

use std::time::Duration;

use idem_sdk::bindings::idem::agent::once::{self as raw, Claim, Outcome as RawOutcome};
use idem_sdk::{Agent, Error, Key, run_once, save};
use serde::Deserialize;
use wasi::http::outgoing_handler;
use wasi::http::types::{Fields, Method, OutgoingBody, OutgoingRequest, Scheme};

#[derive(Deserialize)]
struct Input {
    mode: String,
    #[serde(default)]
    n: u64,
    #[serde(default)]
    url: String,
}

struct Rogue;

impl Agent for Rogue {
    type Input = Input;
    type Output = String;

    fn run(input: Input) -> Result<String, Error> {
        let n = input.n;
        match input.mode.as_str() {
            "sleep" => {
                std::thread::sleep(Duration::from_millis(n));
                Ok("woke up".into())
            }
            "sleep-in-effect" => {
                let (value, _) = run_once(&Key::for_run("sleepy", &n)?, |_| {
                    std::thread::sleep(Duration::from_millis(n));
                    Ok::<_, String>("slept".to_string())
                })?;
                Ok(value)
            }
            "two-claims" => {
                let a = claim("a")?;
                let b = claim("b")?;
                Claim::commit(a, b"\"a\"", None).map_err(Error::from)?;
                std::thread::sleep(Duration::from_millis(n));
                Claim::commit(b, b"\"b\"", None).map_err(Error::from)?;
                Ok("both committed".into())
            }
            "return-holding" => {
                let held = claim("held")?;
                // Neither committed nor released: the guest returns with it open.
                std::mem::forget(held);
                Ok("returned".into())
            }
            "rerun-held" => {
                let _held = claim("k")?;
                match raw::run_once("k", None) {
                    Ok(_) => Ok("granted twice".into()),
                    Err(e) => Ok(format!("{e:?}")),
                }
            }
            "huge-step" => match save(u64::MAX, &"state") {
                Ok(()) => Ok("saved".into()),
                Err(e) => Ok(format!("{e}")),
            },
            "big-output" => Ok("x".repeat(n as usize)),
            "fields" => {
                let value = vec![b'v'; 60 << 10];
                let mut kept = Vec::new();
                for _ in 0..n {
                    let fields = Fields::new();
                    fields
                        .append("x-hoard", &value)
                        .map_err(|e| Error::Agent(format!("append: {e:?}")))?;
                    kept.push(fields);
                }
                Ok(format!("kept {} header sets", kept.len()))
            }
            "stream-after-commit" => stream_after_commit(&input.url),
            other => Err(Error::Agent(format!("unknown mode {other:?}"))),
        }
    }
}

idem_sdk::export_agent!(Rogue);

/// Claims `key` through the raw bindings, which leave settling it to the caller.
fn claim(key: &str) -> Result<Claim, Error> {
    match raw::run_once(key, None).map_err(Error::from)? {
        RawOutcome::Claimed(claim) => Ok(claim),
        RawOutcome::Committed(_) => Err(Error::Agent(format!("{key} was committed already"))),
    }
}

fn stream_after_commit(url: &str) -> Result<String, Error> {
    let authority = url
        .strip_prefix("http://")
        .ok_or_else(|| Error::Agent(format!("not an http URL: {url}")))?;
    let claim = claim("streamed")?;
    let request = OutgoingRequest::new(Fields::new());
    let fail = |what: &str| Error::Agent(format!("{what} refused"));
    request
        .set_method(&Method::Post)
        .map_err(|()| fail("method"))?;
    request
        .set_scheme(Some(&Scheme::Http))
        .map_err(|()| fail("scheme"))?;
    request
        .set_authority(Some(authority))
        .map_err(|()| fail("authority"))?;
    request
        .set_path_with_query(Some("/streamed"))
        .map_err(|()| fail("path"))?;
    let body = request.body().map_err(|()| fail("body"))?;
    let stream = body.write().map_err(|()| fail("stream"))?;
    let response = outgoing_handler::handle(request, None)
        .map_err(|e| Error::Agent(format!("handle: {e:?}")))?;
    stream
        .blocking_write_and_flush(b"before-commit;")
        .map_err(|e| Error::Agent(format!("first write: {e:?}")))?;
    // Let the host send the first chunk before the claim ends.
    std::thread::sleep(Duration::from_millis(200));
    Claim::commit(claim, b"\"streamed\"", None).map_err(Error::from)?;
    let late = stream.blocking_write_and_flush(b"after-commit");
    drop(stream);
    let finished = OutgoingBody::finish(body, None);
    response.subscribe().block();
    let answer = response.get();
    Ok(format!(
        "late write: {late:?}; finish: {finished:?}; response: {}",
        match answer {
            Some(Ok(Ok(r))) => format!("status {}", r.status()),
            Some(Ok(Err(e))) => format!("error {e:?}"),
            other => format!("{other:?}"),
        }
    ))
}
