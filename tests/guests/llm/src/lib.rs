//! Test agent: a tool-using conversation through `idem_sdk::llm`, against the stand-in
//! model server of `tests/all/llm.rs` (endpoint and key from the granted environment:
//! `OPENAI_BASE_URL`, `OPENAI_API_KEY`, or the `ANTHROPIC_` pair).
//!
//! Input (all but `prompt` and `tool_url` optional):
//!
//! ```json
//! {"provider": "openai", "conversation": "c1", "prompt": "...",
//!  "tool_url": "http://127.0.0.1:PORT", "max_turns": 4, "manual": false,
//!  "retry": {"max_attempts": 3, "initial_ms": 100, "max_ms": 5000},
//!  "max_response_bytes": null, "stream": false}
//! ```
//!
//! With `stream`, the client streams each call (`Client::stream`): the text arrives
//! in pieces, each published on the run's live stream under the call's key.
//!
//! Two tools: `lookup` POSTs its arguments to `{tool_url}/tool/lookup` (tied to its
//! step) and answers the response's text; `note` appends the line `{key} {token}
//! {first|in-doubt} {arguments}` to `/data/notes.log` and answers `noted`. With `manual`, the loop is written out with
//! `Client::complete` and `run_once_all`, so that every turn's reply is in the output;
//! otherwise `Client::run_tools` runs it. With `"chat": N`, instead, N turns without
//! tools, a user message before each (the bench's model calls). With `"probe": [{"key",
//! "model", "tokens": [in, out, cached]}, ..]`, after the tool loop, each entry is
//! recorded with `llm::record_usage` and its answer (`spent`, `saved` or the error's
//! text) reported in `recorded`.
//!
//! Output: `{"answer": text, "usage": [in, out, cached], "turns": [{"turn", "key",
//! "body", "outcome"}, ..], "recorded": [..]}` (`turns` only with `manual`), or the
//! failure's text.

use std::io::Write as _;

use idem_sdk::http::Request;
use idem_sdk::llm::{Client, Conversation, Message, Recorded, Tool, ToolCall, Usage};
use idem_sdk::{Agent, Error, Key, Outcome, RetryPolicy, Step, run_once_all};
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Deserialize)]
struct Input {
    #[serde(default = "openai")]
    provider: String,
    #[serde(default = "c1")]
    conversation: String,
    prompt: String,
    tool_url: String,
    #[serde(default = "four")]
    max_turns: u32,
    #[serde(default)]
    manual: bool,
    #[serde(default)]
    retry: Option<Retry>,
    #[serde(default)]
    max_response_bytes: Option<usize>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    chat: u32,
    #[serde(default)]
    probe: Vec<Probe>,
}

/// A usage recording the agent makes itself.
#[derive(Deserialize)]
struct Probe {
    key: String,
    model: String,
    tokens: [u64; 3],
}

/// Records each probe; what the host answered.
fn probe(probes: &[Probe]) -> Vec<String> {
    probes
        .iter()
        .map(|p| {
            let usage = Usage {
                input_tokens: p.tokens[0],
                output_tokens: p.tokens[1],
                cached_tokens: p.tokens[2],
            };
            match idem_sdk::llm::record_usage(&p.key, &p.model, usage) {
                Ok(Recorded::Spent) => "spent".into(),
                Ok(Recorded::Saved) => "saved".into(),
                Err(e) => e.to_string(),
            }
        })
        .collect()
}

fn openai() -> String {
    "openai".into()
}
fn c1() -> String {
    "c1".into()
}
fn four() -> u32 {
    4
}

#[derive(Deserialize)]
struct Retry {
    max_attempts: u32,
    initial_ms: u64,
    max_ms: u64,
}

#[derive(Serialize)]
struct Turn {
    turn: u32,
    key: String,
    body: String,
    outcome: String,
}

#[derive(Serialize)]
struct Output {
    answer: String,
    usage: [u64; 3],
    turns: Vec<Turn>,
    recorded: Vec<String>,
}

fn outcome(o: Outcome) -> String {
    match o {
        Outcome::Executed => "executed".into(),
        Outcome::Reclaimed { .. } => "reclaimed".into(),
        Outcome::Skipped => "skipped".into(),
        Outcome::Awaited => "awaited".into(),
        other => format!("{other:?}"),
    }
}

fn tools() -> Vec<Tool> {
    vec![
        Tool::new(
            "lookup",
            "Looks a word up",
            json!({"type": "object", "properties": {"q": {"type": "string"}}}),
        ),
        Tool::new(
            "note",
            "Writes a note down",
            json!({"type": "object", "properties": {"text": {"type": "string"}}}),
        ),
    ]
}

/// Runs one tool call under `step`.
fn run_tool(tool_url: &str, call: &ToolCall, step: &Step) -> Result<String, Error> {
    match call.name.as_str() {
        "lookup" => {
            let response = Request::post(&format!("{tool_url}/tool/lookup"))
                .header("content-type", "application/json")
                .body(call.arguments.clone())
                .under(step)
                .send()?;
            Ok(String::from_utf8_lossy(&response.body).into_owned())
        }
        "note" => {
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open("/data/notes.log")?;
            let doubt = if step.in_doubt() { "in-doubt" } else { "first" };
            writeln!(
                file,
                "{} {} {doubt} {}",
                step.key(),
                step.token(),
                call.arguments
            )?;
            file.sync_all()?;
            Ok("noted".into())
        }
        other => Ok(format!("no tool called {other}")),
    }
}

struct Llm;

impl Agent for Llm {
    type Input = Input;
    type Output = Output;

    fn run(input: Input) -> Result<Output, Error> {
        let mut client = match input.provider.as_str() {
            "anthropic" => Client::anthropic("stand-in"),
            _ => Client::openai("stand-in"),
        }?;
        if let Some(r) = &input.retry {
            client = client.retry(RetryPolicy {
                max_attempts: r.max_attempts,
                initial_delay: std::time::Duration::from_millis(r.initial_ms),
                multiplier: 2,
                max_delay: std::time::Duration::from_millis(r.max_ms),
                jitter: false,
            });
        }
        if let Some(limit) = input.max_response_bytes {
            client = client.max_response_bytes(limit);
        }
        client = client.stream(input.stream);
        let mut chat = Conversation::new(input.conversation.as_str());
        chat.system("You are a test.");
        chat.user(input.prompt.as_str());
        let tools = tools();
        if input.chat > 0 {
            // `chat` turns without tools, a user message before each.
            let mut usage = [0; 3];
            let mut answer = String::new();
            for i in 0..input.chat {
                chat.user(format!("question {i}"));
                let reply = client.complete(&mut chat, &[])?;
                usage[0] += reply.usage.input_tokens;
                usage[1] += reply.usage.output_tokens;
                usage[2] += reply.usage.cached_tokens;
                answer = reply.message.content;
            }
            return Ok(Output {
                answer,
                usage,
                turns: Vec::new(),
                recorded: Vec::new(),
            });
        }
        if !input.manual {
            let reply = client.run_tools(&mut chat, &tools, input.max_turns, |call, step| {
                run_tool(&input.tool_url, call, step)
            })?;
            let u = reply.usage;
            return Ok(Output {
                answer: reply.message.content,
                usage: [u.input_tokens, u.output_tokens, u.cached_tokens],
                turns: Vec::new(),
                recorded: probe(&input.probe),
            });
        }
        // The same loop, written out: every turn's reply is reported.
        let mut turns = Vec::new();
        let mut usage = [0; 3];
        loop {
            let reply = client.complete(&mut chat, &tools)?;
            usage[0] += reply.usage.input_tokens;
            usage[1] += reply.usage.output_tokens;
            usage[2] += reply.usage.cached_tokens;
            turns.push(Turn {
                turn: reply.turn,
                key: reply.key.clone(),
                body: reply.body.clone(),
                outcome: outcome(reply.outcome),
            });
            let calls = reply.message.tool_calls;
            if calls.is_empty() {
                return Ok(Output {
                    answer: reply.message.content,
                    usage,
                    turns,
                    recorded: Vec::new(),
                });
            }
            if reply.turn >= input.max_turns {
                return Err(Error::Agent("turn limit".into()));
            }
            let keys: Vec<Key> = calls
                .iter()
                .map(|c| Key::new(format!("{}/tool/{}", reply.key, c.id)))
                .collect();
            let results = run_once_all(&keys, |steps| {
                steps
                    .iter()
                    .map(|step| {
                        let i = keys.iter().position(|k| k.as_str() == step.key());
                        let call = i.map(|i| &calls[i]).ok_or("unknown step")?;
                        run_tool(&input.tool_url, call, step)
                    })
                    .collect()
            })?;
            for (call, (result, _)) in calls.iter().zip(results) {
                chat.push(Message::tool(call.id.clone(), result));
            }
        }
    }
}

idem_sdk::export_agent!(Llm);
