//! Model calls as durable steps: a small client for OpenAI-compatible chat completions
//! and Anthropic Messages, over [`http`](crate::http).
//!
//! Each call of [`Client::complete`] is one step keyed by the conversation's id and its
//! turn (`{run_id}/llm/{conversation}/{turn}`, bound to the request's content): the
//! whole response body is the step's committed result, so an instance that replays its
//! way back to the call gets the same bytes back without reaching the model, and the
//! model is paid once per turn. [`Client::run_tools`] is the tool-call loop: model,
//! then the tools it asked for (each its own step, claimed together with
//! [`run_once_all`](crate::run_once_all)), then the model again, until it stops asking
//! or a turn limit is reached.
//!
//! The endpoint and the API key come from the run's grants (`idem run --env
//! OPENAI_API_KEY=... --allow-http api.openai.com`), never from the component. A 429 or
//! a 5xx is retried under the client's [`RetryPolicy`], waiting as `Retry-After` says
//! (a durable [`sleep`](crate::sleep): the run holds no instance meanwhile).
//!
//! With [`Client::stream`], a call asks for a stream and publishes each piece of text
//! on the run's live stream under the call's key as it arrives ([`publish`]: `idem logs
//! -f`, `GET /api/runs/{id}/stream` and the web page show it growing); the step still
//! commits the response the same call would have answered without streaming, so a
//! replay returns it byte for byte and publishes nothing.
//!
//! [`publish`]: crate::publish
//!
//! ```no_run
//! use idem_sdk::llm::{Client, Conversation, Tool};
//! use serde_json::json;
//!
//! let client = Client::openai("gpt-4o-mini")?;
//! let mut chat = Conversation::new("ticket-4711");
//! chat.system("You answer support tickets.");
//! chat.user("Where is my parcel 12345?");
//! let track = Tool::new("track", "Where a parcel is",
//!     json!({"type": "object", "properties": {"parcel": {"type": "string"}}}));
//! let reply = client.run_tools(&mut chat, &[track], 8, |call, _step| {
//!     // A real tool calls its API here, with `.under(step)` on the request.
//!     Ok::<_, String>(format!("parcel {} is in Oslo", call.arguments))
//! })?;
//! println!("{} ({} tokens in, {} out)", reply.message.content,
//!     reply.usage.input_tokens, reply.usage.output_tokens);
//! # Ok::<(), idem_sdk::Error>(())
//! ```

mod error;
mod stream;
mod wire;

use std::fmt::Display;
use std::time::Duration;

use serde::de::DeserializeOwned;

pub use crate::bindings::idem::agent::usage::UsageError;
pub use error::LlmError;

use crate::bindings::idem::agent::once::{self, Claim};
use crate::bindings::idem::agent::usage;
use crate::http::Request;
use crate::{Error, Key, Outcome, RetryPolicy, Step, StepError};

/// Which API the endpoint speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    /// OpenAI's chat completions (`POST {base}/chat/completions`), also spoken by
    /// most other vendors and local servers.
    OpenAi,
    /// Anthropic's Messages API (`POST {base}/v1/messages`).
    Anthropic,
}

/// Who wrote a [`Message`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Instructions for the model.
    System,
    /// The user's turn.
    User,
    /// The model's turn.
    Assistant,
    /// A tool's result, answering one [`ToolCall`].
    Tool,
}

impl Role {
    /// The role's name on the wire (OpenAI's spelling).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// One message of a [`Conversation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Who wrote it.
    pub role: Role,
    /// Its text (empty for an assistant turn that only calls tools).
    pub content: String,
    /// The tools an assistant turn asks for.
    pub tool_calls: Vec<ToolCall>,
    /// For a [`Role::Tool`] message: the id of the call it answers.
    pub tool_call_id: Option<String>,
}

impl Message {
    fn new(role: Role, content: impl Into<String>) -> Message {
        Message {
            role,
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Message {
        Message::new(Role::System, content)
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Message {
        Message::new(Role::User, content)
    }

    /// An assistant message (a turn of the model given by hand).
    pub fn assistant(content: impl Into<String>) -> Message {
        Message::new(Role::Assistant, content)
    }

    /// A tool's result for call `call_id`.
    pub fn tool(call_id: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            tool_call_id: Some(call_id.into()),
            ..Message::new(Role::Tool, content)
        }
    }
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    /// Its name, as the model calls it.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// The JSON Schema of its arguments.
    pub parameters: serde_json::Value,
}

impl Tool {
    /// A tool called `name`, taking arguments of the JSON Schema `parameters`.
    pub fn new(name: &str, description: &str, parameters: serde_json::Value) -> Tool {
        Tool {
            name: name.to_owned(),
            description: description.to_owned(),
            parameters,
        }
    }
}

/// A call of a [`Tool`] the model asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The call's id, which its result names.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// Its arguments as the model wrote them: JSON text, not checked.
    pub arguments: String,
}

impl ToolCall {
    /// The arguments decoded as `T`; fails with [`Error::Codec`] when the model wrote
    /// something else.
    ///
    /// ```
    /// let call = idem_sdk::llm::ToolCall {
    ///     id: "c1".into(), name: "weather".into(), arguments: r#"{"city":"Oslo"}"#.into(),
    /// };
    /// #[derive(serde::Deserialize)]
    /// struct Args { city: String }
    /// assert_eq!(call.args::<Args>()?.city, "Oslo");
    /// # Ok::<(), idem_sdk::Error>(())
    /// ```
    pub fn args<T: DeserializeOwned>(&self) -> Result<T, Error> {
        serde_json::from_str(&self.arguments)
            .map_err(|err| Error::codec(&format!("arguments of tool call {}", self.id), err))
    }
}

/// The tokens one response reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens (OpenAI `prompt_tokens`, Anthropic `input_tokens`).
    pub input_tokens: u64,
    /// Generated tokens (`completion_tokens`, `output_tokens`).
    pub output_tokens: u64,
    /// Prompt tokens served from the provider's cache (`cached_tokens`,
    /// `cache_read_input_tokens`).
    pub cached_tokens: u64,
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, other: Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cached_tokens += other.cached_tokens;
    }
}

/// How [`record_usage`] counted a call's tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// The step's first recording: its tokens count as spent.
    Spent,
    /// The step was recorded before (this call was a replay, which made no request):
    /// its tokens count as saved.
    Saved,
}

/// Records `usage`, what the response committed under `key` (a step of this run)
/// reported for `model`, with the step in the store: `idem show`, the web page and
/// `/metrics` sum it per run, deployment and model. The first recording of a key counts
/// as spent, every later one (a replay) as saved, so the tokens are spent once however
/// many instances replay the call, and whether or not the instance that committed it
/// lived to record it. [`Client::complete`] calls it after every call, fresh or
/// replayed; an agent calls it for model calls it makes itself.
///
/// Fails with [`Error::Usage`] for a key this run did not commit, an empty or overlong
/// model name, or a count over the host's bound; nothing is recorded then.
pub fn record_usage(key: &str, model: &str, usage: Usage) -> Result<Recorded, Error> {
    let tokens = usage::Tokens {
        input: usage.input_tokens,
        output: usage.output_tokens,
        cached: usage.cached_tokens,
    };
    match usage::record_usage(key, model, tokens)? {
        usage::Recorded::Spent => Ok(Recorded::Spent),
        usage::Recorded::Saved => Ok(Recorded::Saved),
    }
}

/// A conversation: its id (which names its steps) and its messages so far. Build it
/// the same way on every instance: its turns are counted from the start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conversation {
    id: String,
    messages: Vec<Message>,
    turn: u32,
}

impl Conversation {
    /// An empty conversation called `id`: unique within the run, stable across its
    /// instances (`"ticket-4711"`, never a time or a counter of attempts).
    pub fn new(id: impl Into<String>) -> Conversation {
        Conversation {
            id: id.into(),
            messages: Vec::new(),
            turn: 0,
        }
    }

    /// Adds a system message.
    pub fn system(&mut self, content: impl Into<String>) -> &mut Self {
        self.push(Message::system(content))
    }

    /// Adds a user message.
    pub fn user(&mut self, content: impl Into<String>) -> &mut Self {
        self.push(Message::user(content))
    }

    /// Adds any message.
    pub fn push(&mut self, message: Message) -> &mut Self {
        self.messages.push(message);
        self
    }

    /// The conversation's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The messages so far, the model's replies and tool results included.
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// Model calls made so far: the next call is turn `turn() + 1`.
    pub fn turn(&self) -> u32 {
        self.turn
    }
}

/// The model's answer to one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The assistant message (also appended to the conversation).
    pub message: Message,
    /// Why the model stopped, in the provider's words (`stop`, `tool_calls`,
    /// `end_turn`, `max_tokens`, ...).
    pub stop_reason: String,
    /// The tokens this response reports (for [`Client::run_tools`], summed over its
    /// model calls).
    pub usage: Usage,
    /// The response body, byte for byte as the model sent it the one time it was
    /// called (for a [streamed](Client::stream) call, the plain response its events
    /// were assembled into, byte for byte as committed).
    pub body: String,
    /// How the step got it: [`Outcome::Skipped`] for a replay, which cost nothing.
    pub outcome: Outcome,
    /// The call's turn in its conversation (1 for the first).
    pub turn: u32,
    /// The call's key.
    pub key: String,
}

/// A model endpoint: provider, URL, key, model and the call's policies. Its `Debug`
/// form leaves the key out.
#[derive(Clone)]
pub struct Client {
    provider: Provider,
    base_url: String,
    api_key: String,
    model: String,
    max_tokens: u32,
    retry: RetryPolicy,
    max_response_bytes: usize,
    timeout: Option<Duration>,
    stream: bool,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("provider", &self.provider)
            .field("base_url", &self.base_url)
            .field("api_key", &"<granted>")
            .field("model", &self.model)
            .field("max_tokens", &self.max_tokens)
            .field("retry", &self.retry)
            .field("max_response_bytes", &self.max_response_bytes)
            .field("timeout", &self.timeout)
            .field("stream", &self.stream)
            .finish()
    }
}

/// The default of [`Client::max_response_bytes`]: far over any model's answer, and
/// far under the host's limit on a step's result (64 MiB by default).
pub const MAX_RESPONSE_BYTES: usize = 1 << 20;

impl Client {
    /// An OpenAI-compatible endpoint: the key from the granted environment variable
    /// `OPENAI_API_KEY`, the base URL from `OPENAI_BASE_URL` (default
    /// `https://api.openai.com/v1`).
    pub fn openai(model: &str) -> Result<Client, Error> {
        Client::from_env(Provider::OpenAi, model, "OPENAI_BASE_URL", "OPENAI_API_KEY")
    }

    /// Anthropic's API: the key from `ANTHROPIC_API_KEY`, the base URL from
    /// `ANTHROPIC_BASE_URL` (default `https://api.anthropic.com`).
    pub fn anthropic(model: &str) -> Result<Client, Error> {
        Client::from_env(
            Provider::Anthropic,
            model,
            "ANTHROPIC_BASE_URL",
            "ANTHROPIC_API_KEY",
        )
    }

    /// A client whose base URL and key are in the granted environment variables
    /// `base_url_var` (the provider's public endpoint when unset) and `api_key_var`.
    ///
    /// Fails with [`LlmError::MissingKey`] when the key is not granted and
    /// [`LlmError::BadEndpoint`] when the URL is not `http://` or `https://`.
    pub fn from_env(
        provider: Provider,
        model: &str,
        base_url_var: &str,
        api_key_var: &str,
    ) -> Result<Client, Error> {
        let api_key = std::env::var(api_key_var)
            .ok()
            .filter(|k| !k.is_empty())
            .ok_or_else(|| LlmError::MissingKey {
                var: api_key_var.to_owned(),
            })?;
        let base_url = match std::env::var(base_url_var) {
            Ok(url) if !url.is_empty() => url,
            _ => match provider {
                Provider::OpenAi => "https://api.openai.com/v1".to_owned(),
                Provider::Anthropic => "https://api.anthropic.com".to_owned(),
            },
        };
        let lower = base_url.to_ascii_lowercase();
        if !(lower.starts_with("http://") || lower.starts_with("https://")) {
            return Err(LlmError::BadEndpoint {
                var: base_url_var.to_owned(),
                value: base_url,
            }
            .into());
        }
        Ok(Client {
            provider,
            base_url: base_url.trim_end_matches('/').to_owned(),
            api_key,
            model: model.to_owned(),
            max_tokens: 1024,
            retry: RetryPolicy::default(),
            max_response_bytes: MAX_RESPONSE_BYTES,
            timeout: None,
            stream: false,
        })
    }

    /// The most tokens one response may generate (default 1024).
    pub fn max_tokens(mut self, max_tokens: u32) -> Client {
        self.max_tokens = max_tokens;
        self
    }

    /// How 429s, 5xx and failed exchanges are retried (default [`RetryPolicy::default`]).
    /// A `Retry-After` (or `retry-after-ms`) of the response replaces the policy's
    /// wait, up to its `max_delay`.
    pub fn retry(mut self, policy: RetryPolicy) -> Client {
        self.retry = policy;
        self
    }

    /// The largest response body accepted (default [`MAX_RESPONSE_BYTES`]); a larger
    /// one fails with [`LlmError::TooLarge`]. Raise the host's result limit with it.
    pub fn max_response_bytes(mut self, bytes: usize) -> Client {
        self.max_response_bytes = bytes;
        self
    }

    /// Bounds each request's wait for the connection and the response's bytes.
    pub fn timeout(mut self, timeout: Duration) -> Client {
        self.timeout = Some(timeout);
        self
    }

    /// Streams each call's response (default off): the request asks for server-sent
    /// events (OpenAI's `stream` with `stream_options.include_usage`, Anthropic's
    /// `stream`), and each piece of text is published on the run's live stream under
    /// the call's key as it arrives ([`publish`](crate::publish)). What the step
    /// commits is the response assembled from the events, in the shape the same call
    /// answers without streaming (message, tool calls, stop reason, usage): a replay
    /// decodes it alike, returns it byte for byte and publishes nothing (the text was
    /// shown when the call was made). The call's key is bound to the request without
    /// the stream fields, so turning streaming on or off does not change it. An attempt
    /// that fails midway and is retried publishes its text again.
    pub fn stream(mut self, stream: bool) -> Client {
        self.stream = stream;
        self
    }

    /// The endpoint's API.
    pub fn provider(&self) -> Provider {
        self.provider
    }

    /// The URL requests go to.
    pub fn url(&self) -> String {
        match self.provider {
            Provider::OpenAi => format!("{}/chat/completions", self.base_url),
            Provider::Anthropic => format!("{}/v1/messages", self.base_url),
        }
    }

    /// Asks the model for the next turn of `chat`, offering `tools`, as one step: the
    /// reply's message is appended to `chat`, and its tool calls (if any) are the
    /// caller's to run. Reached again on a later instance, the call returns the
    /// committed response without a request.
    ///
    /// Fails with [`Error::Llm`] (the claim released, nothing recorded) for an error
    /// status, retries spent, or a malformed or too large response; with
    /// [`Error::Step`] when the host refuses the key (a replay that sends other
    /// messages for a committed turn is [`StepError::KeyReused`]).
    pub fn complete(&self, chat: &mut Conversation, tools: &[Tool]) -> Result<Reply, Error> {
        let turn = chat.turn + 1;
        let body = wire::request(
            self.provider,
            &self.model,
            self.max_tokens,
            &chat.messages,
            tools,
        );
        let key =
            Key::new(format!("{}/llm/{}/{turn}", crate::run_id(), chat.id)).with_input(&body)?;
        let sent = if self.stream {
            stream::request(self.provider, &body)
        } else {
            body
        };
        let (raw, outcome) = self.call(&key, &sent)?;
        let parsed =
            wire::parse(self.provider, raw.as_bytes()).map_err(|detail| LlmError::Malformed {
                key: key.to_string(),
                detail,
            })?;
        // Fresh or replayed: the host counts the first recording of the key as spent
        // and any later one as saved.
        record_usage(key.as_str(), &self.model, parsed.usage)?;
        chat.turn = turn;
        chat.messages.push(parsed.message.clone());
        Ok(Reply {
            message: parsed.message,
            stop_reason: parsed.stop_reason,
            usage: parsed.usage,
            body: raw,
            outcome,
            turn,
            key: key.to_string(),
        })
    }

    /// The tool-call loop: asks the model, runs the tools it calls with `tool` (each
    /// call its own step, keyed `{call key}/tool/{call id}`, claimed together with the
    /// turn's other calls), appends their results and asks again, until a reply calls
    /// no tool. Returns that reply, its `usage` summed over the loop's model calls.
    ///
    /// `tool` is called once per call not yet committed; its `Ok` text is the tool's
    /// result for the model (return an error *as text* to let the model see it). An
    /// `Err` fails the loop with [`Error::Effect`], the other calls of the turn
    /// committed. More than `max_turns` model calls fail with [`LlmError::TurnLimit`].
    pub fn run_tools<E, F>(
        &self,
        chat: &mut Conversation,
        tools: &[Tool],
        max_turns: u32,
        mut tool: F,
    ) -> Result<Reply, Error>
    where
        E: Display,
        F: FnMut(&ToolCall, &Step) -> Result<String, E>,
    {
        self.run_tools_all(chat, tools, max_turns, |calls| {
            calls.iter().map(|(call, step)| tool(call, step)).collect()
        })
    }

    /// [`Client::run_tools`] with the turn's tool calls handed over together, so that
    /// their effects can be in flight at once (with [`http::send_all`], each request
    /// `.under(step)`): `tools_fn` gets the calls not yet committed with their steps
    /// and returns one result per call, in their order.
    ///
    /// [`http::send_all`]: crate::http::send_all
    pub fn run_tools_all<E, F>(
        &self,
        chat: &mut Conversation,
        tools: &[Tool],
        max_turns: u32,
        mut tools_fn: F,
    ) -> Result<Reply, Error>
    where
        E: Display,
        F: FnMut(&[(ToolCall, Step)]) -> Vec<Result<String, E>>,
    {
        let mut usage = Usage::default();
        for _ in 0..max_turns {
            let mut reply = self.complete(chat, tools)?;
            usage += reply.usage;
            let calls = reply.message.tool_calls.clone();
            if calls.is_empty() {
                reply.usage = usage;
                return Ok(reply);
            }
            let keys: Vec<Key> = calls
                .iter()
                .map(|c| Key::new(format!("{}/tool/{}", reply.key, c.id)))
                .collect();
            let results = crate::run_once_all(&keys, |steps| {
                // The steps still to run, in the order of `keys`.
                let pending: Vec<(ToolCall, Step)> = steps
                    .iter()
                    .filter_map(|step| {
                        let i = keys.iter().position(|k| k.as_str() == step.key())?;
                        Some((calls[i].clone(), step.clone()))
                    })
                    .collect();
                tools_fn(&pending)
            })?;
            for (call, (result, _)) in calls.iter().zip(results) {
                chat.push(Message::tool(call.id.clone(), result));
            }
        }
        Err(LlmError::TurnLimit {
            conversation: chat.id.clone(),
            turns: max_turns,
        }
        .into())
    }

    /// The step of one model call: the committed body, or the body of the request
    /// that got through, committed.
    fn call(&self, key: &Key, body: &str) -> Result<(String, Outcome), Error> {
        loop {
            let claim = match once::run_once(key.as_str(), key.fingerprint())? {
                once::Outcome::Committed(committed) => {
                    let outcome = crate::once::obtained(committed.obtained);
                    let raw =
                        String::from_utf8(committed.value).map_err(|_| LlmError::Malformed {
                            key: key.to_string(),
                            detail: "the committed response is not UTF-8".into(),
                        })?;
                    return Ok((raw, outcome));
                }
                once::Outcome::Claimed(claim) => claim,
            };
            let step = crate::once::step_of(&claim);
            let raw = match self.attempt(key, &step, body) {
                Ok(raw) => raw,
                Err(Attempt::Fatal(err)) => {
                    Claim::release(claim);
                    return Err(err.into());
                }
                Err(Attempt::Again { why, after }) => {
                    Claim::release(claim);
                    if step.attempt() >= self.retry.max_attempts.max(1) {
                        return Err(LlmError::GaveUp {
                            key: key.to_string(),
                            attempts: step.attempt(),
                            last: why,
                        }
                        .into());
                    }
                    let delay = after
                        .map(|after| after.min(self.retry.max_delay))
                        .unwrap_or_else(|| {
                            self.retry.delay(step.attempt(), crate::retry::random())
                        });
                    // Kept in the run's log (`idem logs`): why the call is waiting.
                    eprintln!(
                        "attempt {} of {key} failed: {why}; retrying in {} ms",
                        step.attempt(),
                        delay.as_millis()
                    );
                    crate::sleep(&crate::retry::backoff_key(key, step.attempt()), delay)?;
                    continue;
                }
            };
            let outcome = if step.in_doubt() {
                Outcome::Reclaimed {
                    attempt: step.attempt(),
                }
            } else {
                Outcome::Executed
            };
            return match Claim::commit(claim, raw.as_bytes(), None) {
                Ok(()) => Ok((raw, outcome)),
                // Taken over while the request ran: the taker's commit is the answer.
                Err(StepError::ClaimLost(_)) => continue,
                Err(StepError::TooLarge(detail)) => Err(LlmError::TooLarge {
                    key: key.to_string(),
                    detail: format!("the host refused it as a step's result: {detail}"),
                }
                .into()),
                Err(err) => Err(Error::Step(err)),
            };
        }
    }

    /// One request under `step`: the body to commit, or why not.
    fn attempt(&self, key: &Key, step: &Step, body: &str) -> Result<String, Attempt> {
        let url = self.url();
        let mut request = Request::post(&url)
            .header("content-type", "application/json")
            .body(body.as_bytes().to_vec())
            .under(step);
        request = match self.provider {
            Provider::OpenAi => {
                request.header("authorization", &format!("Bearer {}", self.api_key))
            }
            Provider::Anthropic => request
                .header("x-api-key", &self.api_key)
                .header("anthropic-version", "2023-06-01"),
        };
        if let Some(timeout) = self.timeout {
            request = request.timeout(timeout);
        }
        let mut assembler = self.stream.then(|| stream::Assembler::new(self.provider));
        let sent = match assembler.as_mut() {
            Some(assembler) => request.send_streaming(|status, piece| {
                if (200..300).contains(&status) {
                    for delta in assembler.feed(piece) {
                        publish_text(key.as_str(), &delta);
                    }
                }
            }),
            None => request.send(),
        };
        let response = match sent {
            Ok(response) => response,
            Err(err) => {
                return Err(Attempt::Again {
                    why: err.to_string(),
                    after: None,
                });
            }
        };
        if response.status == 429 || response.status >= 500 {
            return Err(Attempt::Again {
                why: format!("status {}", response.status),
                after: retry_after(&response),
            });
        }
        if !response.is_success() {
            let text = String::from_utf8_lossy(&response.body);
            return Err(Attempt::Fatal(LlmError::Status {
                url,
                status: response.status,
                body: text.chars().take(500).collect(),
            }));
        }
        let bad = |detail: String| {
            Attempt::Fatal(LlmError::Malformed {
                key: key.to_string(),
                detail,
            })
        };
        let body = match assembler {
            // What the step commits: the events assembled into the plain response.
            Some(assembler) => assembler
                .finish()
                .map_err(|detail| bad(format!("the stream: {detail}")))?
                .into_bytes(),
            None => response.body,
        };
        if body.len() > self.max_response_bytes {
            return Err(Attempt::Fatal(LlmError::TooLarge {
                key: key.to_string(),
                detail: format!(
                    "{} bytes, over the client's limit of {} bytes",
                    body.len(),
                    self.max_response_bytes
                ),
            }));
        }
        // Checked before the commit: a body that does not decode is never recorded.
        wire::parse(self.provider, &body).map_err(bad)?;
        String::from_utf8(body).map_err(|_| bad("the body is not UTF-8".into()))
    }
}

/// Publishes a streamed call's `text` under its `key`, in pieces within the host's
/// bound. A refusal is dropped: the live stream is a view of the call, and must not fail
/// it (the key was checked when it was claimed; pieces are within the bound).
fn publish_text(key: &str, text: &str) {
    let mut rest = text;
    while !rest.is_empty() {
        let mut cut = rest.len().min(crate::MAX_CHUNK_BYTES);
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        let _ = crate::publish(key, &rest[..cut]);
        rest = &rest[cut..];
    }
}

/// Why one attempt of a model call did not give a body to commit.
enum Attempt {
    /// Worth another attempt (429, 5xx, the exchange failed), after `after` if the
    /// response said.
    Again {
        why: String,
        after: Option<Duration>,
    },
    /// Not worth another.
    Fatal(LlmError),
}

/// The wait a 429 or 503 asks for: `retry-after-ms` (OpenAI's) or `Retry-After` in
/// seconds. An HTTP date is not read: the policy's wait applies.
fn retry_after(response: &crate::http::Response) -> Option<Duration> {
    let seconds = |v: &str, scale: f64| {
        v.trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(|s| Duration::from_secs_f64((s / scale).min(1e9)))
    };
    response
        .header("retry-after-ms")
        .and_then(|v| seconds(v, 1000.0))
        .or_else(|| response.header("retry-after").and_then(|v| seconds(v, 1.0)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::Response;

    fn with(headers: &[(&str, &str)]) -> Response {
        Response {
            status: 429,
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
                .collect(),
            body: Vec::new(),
        }
    }

    #[test]
    fn retry_after_reads_seconds_and_milliseconds() {
        assert_eq!(
            retry_after(&with(&[("retry-after", "2")])),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            retry_after(&with(&[("retry-after", "2"), ("retry-after-ms", "150")])),
            Some(Duration::from_millis(150))
        );
        for bad in ["-1", "soon", "Wed, 21 Oct 2015 07:28:00 GMT", "NaN"] {
            assert_eq!(retry_after(&with(&[("retry-after", bad)])), None, "{bad}");
        }
        assert_eq!(retry_after(&with(&[])), None);
    }

    #[test]
    fn the_debug_form_leaves_the_key_out() {
        let client = Client {
            provider: Provider::OpenAi,
            base_url: "http://h".into(),
            api_key: "sk-secret".into(),
            model: "m".into(),
            max_tokens: 1,
            retry: RetryPolicy::default(),
            max_response_bytes: 1,
            timeout: None,
            stream: false,
        };
        let debug = format!("{client:?}");
        assert!(
            !debug.contains("sk-secret") && debug.contains("<granted>"),
            "{debug}"
        );
    }

    #[test]
    fn usage_adds_up() {
        let mut total = Usage::default();
        total += Usage {
            input_tokens: 1,
            output_tokens: 2,
            cached_tokens: 3,
        };
        total += Usage {
            input_tokens: 10,
            output_tokens: 20,
            cached_tokens: 30,
        };
        assert_eq!(
            total,
            Usage {
                input_tokens: 11,
                output_tokens: 22,
                cached_tokens: 33
            }
        );
    }
}
