//! Example idem agent: a tool-using model conversation, each model turn and each tool
//! call a step, so that a crash, a recycle or a resume on another worker never pays
//! for a turn twice nor runs a tool twice (but for a retake in doubt).
//!
//! Input: `{"conversation": "ticket-17", "question": "...", "api":
//! "https://lookup.example.com", "notes": "/data/notes.log", "model": "gpt-4o-mini"}`
//! (`model` optional). The model (OpenAI-compatible; its base URL and key are the
//! granted `OPENAI_BASE_URL` and `OPENAI_API_KEY`) may call two tools: `lookup`, which
//! POSTs its arguments to `{api}/tool/lookup` and answers the response's text, and
//! `note`, which appends its text to the `notes` file. Output: `{"answer": "...",
//! "turns": 2, "usage": {"input": 250, "output": 30, "cached": 50}}`.
//!
//! ```sh
//! idem run llm_agent.wasm --input @question.json --dir ./data::/data \
//!   --env OPENAI_API_KEY="$OPENAI_API_KEY" --allow-http api.openai.com \
//!   --allow-http lookup.example.com
//! ```

use std::io::Write as _;

use idem_sdk::http::Request;
use idem_sdk::llm::{Client, Conversation, Tool, ToolCall};
use idem_sdk::{Agent, Error, Step};
use serde::{Deserialize, Serialize};
use serde_json::json;

#[derive(Deserialize)]
struct Input {
    conversation: String,
    question: String,
    api: String,
    notes: String,
    #[serde(default = "default_model")]
    model: String,
}

fn default_model() -> String {
    "gpt-4o-mini".to_owned()
}

#[derive(Serialize)]
struct Usage {
    input: u64,
    output: u64,
    cached: u64,
}

#[derive(Serialize)]
struct Output {
    answer: String,
    turns: u32,
    usage: Usage,
}

#[derive(Deserialize)]
struct NoteArgs {
    text: String,
}

/// Runs one tool call inside its step: what it returns is committed as the call's
/// result and handed to the model.
fn run_tool(input: &Input, call: &ToolCall, step: &Step) -> Result<String, Error> {
    match call.name.as_str() {
        "lookup" => {
            // `.under(step)`: the request carries this call's key and token.
            let response = Request::post(&format!("{}/tool/lookup", input.api))
                .header("content-type", "application/json")
                .body(call.arguments.clone())
                .under(step)
                .send()?;
            if !response.is_success() {
                // Told to the model as the tool's answer, not a failure of the run.
                return Ok(format!("lookup failed with status {}", response.status));
            }
            Ok(String::from_utf8_lossy(&response.body).into_owned())
        }
        "note" => {
            let args: NoteArgs = call.args()?;
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&input.notes)?;
            writeln!(file, "{}", args.text)?;
            // Durable before the step commits: a commit never outlives its effect.
            file.sync_all()?;
            Ok("noted".to_owned())
        }
        other => Ok(format!("there is no tool called {other}")),
    }
}

struct LlmAgent;

impl Agent for LlmAgent {
    type Input = Input;
    type Output = Output;

    fn run(input: Input) -> Result<Output, Error> {
        let client = Client::openai(&input.model)?;
        let tools = [
            Tool::new(
                "lookup",
                "Looks a term up in the company's knowledge base",
                json!({"type": "object", "properties": {"q": {"type": "string"}},
                       "required": ["q"]}),
            ),
            Tool::new(
                "note",
                "Writes a note for the support team",
                json!({"type": "object", "properties": {"text": {"type": "string"}},
                       "required": ["text"]}),
            ),
        ];
        // Rebuilt the same way on every instance: the turns replay from the store.
        let mut chat = Conversation::new(input.conversation.as_str());
        chat.system("You answer support questions. Use the tools when they help.");
        chat.user(input.question.as_str());
        let reply = client.run_tools(&mut chat, &tools, 8, |call, step| {
            run_tool(&input, call, step)
        })?;
        Ok(Output {
            answer: reply.message.content,
            turns: reply.turn,
            usage: Usage {
                input: reply.usage.input_tokens,
                output: reply.usage.output_tokens,
                cached: reply.usage.cached_tokens,
            },
        })
    }
}

idem_sdk::export_agent!(LlmAgent);
