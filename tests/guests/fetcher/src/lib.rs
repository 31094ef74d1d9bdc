//! Test agent: `steps` checkpointed steps, each one `run_once` that POSTs to a URL
//! through `wasi:http`, so that tests can see on a real server what the host stamped
//! on every request.
//!
//! Input (all but `steps` and `url` optional):
//!
//! ```json
//! {"steps": 3, "url": "http://127.0.0.1:PORT", "outside": false,
//!  "key_header": null, "token_header": null}
//! ```
//!
//! - step `i` (0-based) runs `run_once(Key::for_run("post", &i))`, whose side effect is
//!   `POST {url}/step/{i}` with body `{i}`; its committed result is the response's
//!   status and body (as text);
//! - `outside`: first `GET {url}/outside`, outside any claim; if the host refuses it,
//!   the run fails with the refusal's text;
//! - `key_header`, `token_header`: rename the stamped headers (a missing one keeps its
//!   default);
//! - `pause_ms`, `pause_at`: sleep this long inside the side effect, before the request,
//!   of step `pause_at` (of every step when `pause_at` is null), so that tests can kill
//!   or pause the host while it holds the claim; with `pause_after`, the sleep comes
//!   after the response instead (the request was made, the commit not yet).
//!
//! Output: `{"steps": N, "replies": [{"status": 200, "body": "..."}, ...]}`, one reply per
//! step, the committed ones included after a resume.

use idem_sdk::http::{self, Request};
use idem_sdk::{Agent, Error, Key, load, run_once, save};
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
struct Input {
    steps: u64,
    url: String,
    #[serde(default)]
    outside: bool,
    #[serde(default)]
    key_header: Option<String>,
    #[serde(default)]
    token_header: Option<String>,
    #[serde(default)]
    pause_ms: u64,
    #[serde(default)]
    pause_at: Option<u64>,
    #[serde(default)]
    pause_after: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Reply {
    status: u16,
    body: String,
}

#[derive(Serialize)]
struct Output {
    steps: u64,
    replies: Vec<Reply>,
}

struct Fetcher;

impl Agent for Fetcher {
    type Input = Input;
    type Output = Output;

    fn run(input: Input) -> Result<Output, Error> {
        if input.key_header.is_some() || input.token_header.is_some() {
            http::set_header_names(
                input.key_header.as_deref().unwrap_or("Idempotency-Key"),
                input.token_header.as_deref().unwrap_or("Idempotency-Token"),
            )?;
        }
        if input.outside {
            Request::get(&format!("{}/outside", input.url))
                .send()
                .map_err(|err| Error::Agent(err.to_string()))?;
        }

        let (start, mut replies) = match load::<Vec<Reply>>()? {
            Some(checkpoint) => (checkpoint.step, checkpoint.state),
            None => (0, Vec::new()),
        };
        for i in start..input.steps {
            let (reply, _outcome) = run_once(&Key::for_run("post", &i)?, |_step| {
                let pause = || {
                    if input.pause_at.is_none_or(|at| at == i) {
                        std::thread::sleep(std::time::Duration::from_millis(input.pause_ms));
                    }
                };
                if !input.pause_after {
                    pause();
                }
                let response = Request::post(&format!("{}/step/{i}", input.url))
                    .header("content-type", "text/plain")
                    .body(i.to_string())
                    .send()?;
                if input.pause_after {
                    pause();
                }
                Ok::<_, Error>(Reply {
                    status: response.status,
                    body: String::from_utf8_lossy(&response.body).into_owned(),
                })
            })?;
            replies.push(reply);
            save(i + 1, &replies)?;
        }
        Ok(Output {
            steps: input.steps,
            replies,
        })
    }
}

idem_sdk::export_agent!(Fetcher);
