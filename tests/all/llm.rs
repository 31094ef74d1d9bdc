//! Model calls as steps (`idem_sdk::llm`, `idem.llm`): the `llm` guests hold a
//! tool-using conversation with a stand-in model server on 127.0.0.1 (OpenAI-compatible
//! and Anthropic, counting every request by its idempotency key), whose first answer
//! calls two tools (`lookup`, a request to the same server, and `note`, a line in a
//! granted file) and whose second answers with their results. Under every crash point
//! each model call and each tool call reaches its side effect once per key (twice only
//! when retaken in doubt, same key, greater token); a replayed call returns the body
//! the server sent, byte for byte; a 429 with `Retry-After` is waited as a durable
//! sleep; and a 429 storm, a malformed, truncated or too large response and a missing
//! key grant each end the run with their typed error, earlier steps kept.
//!
//! Streaming: a request with `"stream": true` is answered with server-sent events (as
//! OpenAI and Anthropic send them), a few bytes of text per event with pauses between
//! them, and can be held midway until the test lets it go (`Hold`); `tests/all/live.rs`
//! reads what the guest publishes while it is held.
//!
//! Token usage: the store holds each model call's tokens exactly once as spent, under
//! every crash point (a commit whose instance died before recording it is recorded by
//! the replay), and each replay's as saved; on SQLite and on PostgreSQL.

use std::collections::VecDeque;
use std::io::Write as _;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use idem::runtime::{
    Authority, CrashPoint, DirGrant, FaultPlan, HttpPolicy, Limits, LoadedAgent, Phase, RunOptions,
    RunReport,
};
use idem::store::{
    PostgresOptions, PostgresStore, RunStatus, SyncMode, Tokens, UsageFilter, UsageTotal,
};
use idem_test_artifacts::{LLM, PY_LLM};
use serde_json::{Value, json};

use crate::http::{Seen, read_request};
use crate::postgres::Schema;
use crate::util::{TestHost, agent, block_on};

const KEY: &str = "idempotency-key";
const TOKEN: &str = "idempotency-token";
const API_KEY: &str = "sk-test";

/// A reply the server gives instead of its usual answer.
#[derive(Clone)]
struct Canned {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Canned {
    fn new(status: u16, headers: &[(&str, &str)], body: impl Into<Vec<u8>>) -> Canned {
        Canned {
            status,
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            body: body.into(),
        }
    }
}

/// One request as the server saw it, with what it answered and when (for a stream,
/// the body it would have answered without streaming).
#[derive(Clone)]
pub(crate) struct Exchange {
    seen: Seen,
    at: Instant,
    status: u16,
    answer: Vec<u8>,
}

impl Exchange {
    fn key(&self) -> &str {
        self.seen.header(KEY)
    }

    fn token(&self) -> u64 {
        self.seen.token(TOKEN)
    }
}

#[derive(Default)]
pub(crate) struct Record {
    exchanges: Vec<Exchange>,
    /// Canned replies for the model's first turn (no tool results yet) and its second.
    first: VecDeque<Canned>,
    second: VecDeque<Canned>,
    /// Taken by the first stream that has text: where it stops.
    pub(crate) hold: Option<Hold>,
}

/// Where a streamed answer stops: after every `every` pieces of text, until the test
/// sends on the channel (or drops its end, which lets the rest go at once).
pub(crate) struct Hold {
    pub(crate) every: usize,
    pub(crate) go: Receiver<()>,
}

/// The stand-in model: `POST /v1/chat/completions` (OpenAI) and `POST /v1/messages`
/// (Anthropic), and the `lookup` tool at `POST /tool/lookup`.
pub(crate) struct ModelServer {
    pub(crate) addr: SocketAddr,
    record: Arc<Mutex<Record>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ModelServer {
    pub(crate) fn start() -> ModelServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let record = Arc::new(Mutex::new(Record::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (record, stop) = (Arc::clone(&record), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let record = Arc::clone(&record);
                            std::thread::spawn(move || answer(stream, &record));
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        Err(e) => panic!("model server accept: {e}"),
                    }
                }
            })
        };
        ModelServer {
            addr,
            record,
            stop,
            thread: Some(thread),
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut Record) -> T) -> T {
        f(&mut self.record.lock().unwrap())
    }

    /// Every exchange whose path starts with `prefix`, in arrival order.
    fn exchanges(&self, prefix: &str) -> Vec<Exchange> {
        self.with(|r| {
            r.exchanges
                .iter()
                .filter(|e| e.seen.path.starts_with(prefix))
                .cloned()
                .collect()
        })
    }

    /// The model's exchanges grouped by key, in the order of their first request.
    pub(crate) fn model_calls(&self) -> Vec<(String, Vec<Exchange>)> {
        let mut by_key: Vec<(String, Vec<Exchange>)> = Vec::new();
        for e in self.exchanges("/v1/") {
            match by_key.iter_mut().find(|(k, _)| k == e.key()) {
                Some((_, list)) => list.push(e),
                None => by_key.push((e.key().to_owned(), vec![e])),
            }
        }
        by_key
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn answer(stream: TcpStream, record: &Mutex<Record>) {
    let Some(seen) = read_request(&stream) else {
        return;
    };
    let anthropic = seen.path == "/v1/messages";
    let (status, headers, body) = if seen.path == "/tool/lookup" {
        let args: Value = serde_json::from_slice(&seen.body).unwrap_or(Value::Null);
        let q = args["q"].as_str().unwrap_or("?").to_owned();
        (200, Vec::new(), format!("found {q}").into_bytes())
    } else if !authorized(&seen, anthropic) {
        (401, Vec::new(), b"{\"error\":\"bad key\"}".to_vec())
    } else {
        let request: Value = serde_json::from_slice(&seen.body).unwrap_or(Value::Null);
        let results = tool_results(&request, anthropic);
        // Tools are called when offered, once: a request carrying results is answered.
        let calls = results.is_empty() && request["tools"].is_array();
        let mut r = record.lock().unwrap();
        let serial = r.exchanges.len() + 1;
        let canned = if results.is_empty() {
            r.first.pop_front()
        } else {
            r.second.pop_front()
        };
        match canned {
            Some(c) => (c.status, c.headers, c.body),
            None => (
                200,
                Vec::new(),
                model_answer(anthropic, serial, calls, &results),
            ),
        }
    };
    let streamed = status == 200
        && seen.path.starts_with("/v1/")
        && serde_json::from_slice::<Value>(&seen.body).is_ok_and(|r| r["stream"] == true);
    if streamed {
        let events = sse_events(anthropic, &body);
        let hold = {
            let mut r = record.lock().unwrap();
            r.exchanges.push(Exchange {
                seen,
                at: Instant::now(),
                status,
                answer: body,
            });
            // The turn that answers in text is the one held.
            if events.iter().any(|e| e.1) {
                r.hold.take()
            } else {
                None
            }
        };
        stream_events(stream, &events, hold);
        return;
    }
    let mut stream = stream;
    let mut head = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n",
        body.len()
    );
    for (k, v) in &headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    record.lock().unwrap().exchanges.push(Exchange {
        seen,
        at: Instant::now(),
        status,
        answer: body.clone(),
    });
    // The client may be gone (an instance dropped): nothing to tell it then.
    let _ = stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(&body))
        .and_then(|()| stream.flush());
}

/// Writes a stream of server-sent `events` (each with whether it carries text), with a
/// pause between events and, with `hold`, a stop after every `hold.every` of those with
/// text until the test says go. The body ends when the connection closes.
fn stream_events(mut stream: TcpStream, events: &[(String, bool)], hold: Option<Hold>) {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\
                connection: close\r\n\r\n";
    if stream.write_all(head.as_bytes()).is_err() {
        return;
    }
    let mut holding = hold;
    let mut texts = 0;
    for (event, text) in events {
        // The client may be gone (an instance dropped): nothing to tell it then.
        if stream
            .write_all(event.as_bytes())
            .and_then(|()| stream.flush())
            .is_err()
        {
            return;
        }
        if *text {
            texts += 1;
            if let Some(hold) = &holding
                && texts % hold.every == 0
                && hold.go.recv().is_err()
            {
                holding = None;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `body`, a plain answer of `model_answer`, as the events of a stream, each with
/// whether it carries text: the content three characters at a time, each tool call's
/// arguments in two pieces, then the stop reason and the usage.
fn sse_events(anthropic: bool, body: &[u8]) -> Vec<(String, bool)> {
    let v: Value = serde_json::from_slice(body).unwrap();
    let pieces = |text: &str| -> Vec<String> {
        let chars: Vec<char> = text.chars().collect();
        chars.chunks(3).map(|c| c.iter().collect()).collect()
    };
    let halves = |text: &str| -> [String; 2] {
        let mid = text
            .char_indices()
            .nth(text.chars().count() / 2)
            .map_or(0, |(i, _)| i);
        [text[..mid].to_owned(), text[mid..].to_owned()]
    };
    let mut events = Vec::new();
    if anthropic {
        let event = |name: &str, data: Value| (format!("event: {name}\ndata: {data}\n\n"), false);
        let mut usage = v["usage"].clone();
        let output = usage["output_tokens"].take();
        usage["output_tokens"] = json!(1);
        let mut start = v.clone();
        start["content"] = json!([]);
        start["stop_reason"] = Value::Null;
        start["usage"] = usage;
        events.push(event(
            "message_start",
            json!({"type": "message_start", "message": start}),
        ));
        for (i, block) in v["content"].as_array().unwrap().iter().enumerate() {
            if block["type"] == "text" {
                let open = json!({"type": "text", "text": ""});
                events.push(event(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": i, "content_block": open}),
                ));
                for piece in pieces(block["text"].as_str().unwrap()) {
                    let delta = json!({"type": "text_delta", "text": piece});
                    let data = json!({"type": "content_block_delta", "index": i, "delta": delta});
                    events.push((
                        format!("event: content_block_delta\ndata: {data}\n\n"),
                        true,
                    ));
                }
            } else {
                let mut open = block.clone();
                open["input"] = json!({});
                events.push(event(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": i, "content_block": open}),
                ));
                for half in halves(&block["input"].to_string()) {
                    let delta = json!({"type": "input_json_delta", "partial_json": half});
                    events.push(event(
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": i, "delta": delta}),
                    ));
                }
            }
            events.push(event(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": i}),
            ));
        }
        events.push(event("ping", json!({"type": "ping"})));
        events.push(event(
            "message_delta",
            json!({"type": "message_delta",
            "delta": {"stop_reason": v["stop_reason"], "stop_sequence": null},
            "usage": {"output_tokens": output}}),
        ));
        events.push(event("message_stop", json!({"type": "message_stop"})));
    } else {
        let data = |delta: Value, finish: Value| {
            json!({"id": v["id"], "object": "chat.completion.chunk", "model": "stand-in",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        };
        let line = |value: Value| (format!("data: {value}\n\n"), false);
        let choice = &v["choices"][0];
        let message = &choice["message"];
        events.push(line(data(
            json!({"role": "assistant", "content": ""}),
            Value::Null,
        )));
        for piece in pieces(message["content"].as_str().unwrap_or_default()) {
            let value = data(json!({"content": piece}), Value::Null);
            events.push((format!("data: {value}\n\n"), true));
        }
        for (i, call) in message["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let [first, second] = halves(call["function"]["arguments"].as_str().unwrap());
            events.push(line(data(
                json!({"tool_calls": [{"index": i, "id": call["id"],
                "type": "function", "function": {"name": call["function"]["name"],
                "arguments": first}}]}),
                Value::Null,
            )));
            events.push(line(data(
                json!({"tool_calls": [{"index": i,
                "function": {"arguments": second}}]}),
                Value::Null,
            )));
        }
        events.push(line(data(json!({}), choice["finish_reason"].clone())));
        events.push(line(
            json!({"id": v["id"], "object": "chat.completion.chunk",
            "choices": [], "usage": v["usage"]}),
        ));
        events.push(("data: [DONE]\n\n".to_owned(), false));
    }
    events
}

fn authorized(seen: &Seen, anthropic: bool) -> bool {
    let (name, want) = if anthropic {
        ("x-api-key", API_KEY.to_owned())
    } else {
        ("authorization", format!("Bearer {API_KEY}"))
    };
    seen.headers.get(name).is_some_and(|v| v == &[want])
}

/// The tool results a request carries, in order.
fn tool_results(request: &Value, anthropic: bool) -> Vec<String> {
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    if anthropic {
        messages
            .iter()
            .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
            .filter(|b| b["type"] == "tool_result")
            .map(|b| b["content"].as_str().unwrap_or_default().to_owned())
            .collect()
    } else {
        messages
            .iter()
            .filter(|m| m["role"] == "tool")
            .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
            .collect()
    }
}

/// With `calls`, a turn calling both tools; else an answer naming the tool results.
/// Each body carries the request's serial number, so that a call made twice answers
/// differently.
fn model_answer(anthropic: bool, serial: usize, calls: bool, results: &[String]) -> Vec<u8> {
    let body = match (anthropic, calls) {
        (false, true) => json!({
            "id": format!("chatcmpl-{serial}"), "object": "chat.completion",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_lookup", "type": "function",
                     "function": {"name": "lookup", "arguments": "{\"q\":\"idem\"}"}},
                    {"id": "call_note", "type": "function",
                     "function": {"name": "note", "arguments": "{\"text\":\"hello\"}"}}]}}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 20,
                      "prompt_tokens_details": {"cached_tokens": 50}}}),
        (false, false) => json!({
            "id": format!("chatcmpl-{serial}"), "object": "chat.completion",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {
                "role": "assistant", "content": format!("answer: {}", results.join(", "))}}],
            "usage": {"prompt_tokens": 150, "completion_tokens": 10}}),
        (true, true) => json!({
            "id": format!("msg_{serial}"), "type": "message", "role": "assistant",
            "stop_reason": "tool_use", "content": [
                {"type": "tool_use", "id": "call_lookup", "name": "lookup", "input": {"q": "idem"}},
                {"type": "tool_use", "id": "call_note", "name": "note", "input": {"text": "hello"}}],
            "usage": {"input_tokens": 100, "output_tokens": 20, "cache_read_input_tokens": 50}}),
        (true, false) => json!({
            "id": format!("msg_{serial}"), "type": "message", "role": "assistant",
            "stop_reason": "end_turn",
            "content": [{"type": "text", "text": format!("answer: {}", results.join(", "))}],
            "usage": {"input_tokens": 150, "output_tokens": 10}}),
    };
    body.to_string().into_bytes()
}

/// The store a [`Bed`] runs on.
#[derive(Clone, Copy, Debug)]
enum Backend {
    Sqlite,
    /// A schema of its own per bed on the test server (`IDEM_TEST_POSTGRES`).
    Postgres,
}

/// A run of an `llm` guest against `server`, the endpoint and key granted as `env`.
struct Bed {
    host: TestHost,
    server: ModelServer,
    agent: LoadedAgent,
    _schema: Option<Schema>,
}

impl Bed {
    fn new(guest: &str) -> Bed {
        Bed {
            host: TestHost::new(),
            server: ModelServer::start(),
            agent: agent(guest),
            _schema: None,
        }
    }

    /// A bed on `backend`; `None` (the test says it skipped) without a PostgreSQL
    /// server to use.
    fn on(backend: Backend, guest: &str) -> Option<Bed> {
        match backend {
            Backend::Sqlite => Some(Bed::new(guest)),
            Backend::Postgres => {
                let schema = Schema::create("model calls' usage")?;
                let options = PostgresOptions::default();
                let store = block_on(PostgresStore::connect_with(&schema.url(), &options)).unwrap();
                let dir = tempfile::tempdir().unwrap();
                std::fs::create_dir(dir.path().join("data")).unwrap();
                Some(Bed {
                    host: TestHost {
                        dir,
                        host: crate::util::host(Arc::new(store)),
                        limits: Limits::default(),
                    },
                    server: ModelServer::start(),
                    agent: agent(guest),
                    _schema: Some(schema),
                })
            }
        }
    }

    /// The run's usage in the store, per model.
    fn usage(&self, run_id: &str) -> Vec<UsageTotal> {
        let filter = UsageFilter {
            run_id: Some(run_id),
            ..UsageFilter::default()
        };
        block_on(self.host.store().usage(&filter)).unwrap()
    }

    fn env(&self, provider: &str) -> Vec<(String, String)> {
        let (base, key, url) = match provider {
            "anthropic" => ("ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", self.server.url()),
            _ => (
                "OPENAI_BASE_URL",
                "OPENAI_API_KEY",
                format!("{}/v1", self.server.url()),
            ),
        };
        vec![(base.into(), url), (key.into(), API_KEY.into())]
    }

    fn input(&self, extra: Value) -> Value {
        let mut input = json!({
            "prompt": "look idem up and note hello",
            "tool_url": self.server.url(),
            "retry": {"max_attempts": 3, "initial_ms": 50, "max_ms": 5000},
        });
        for (k, v) in extra.as_object().cloned().unwrap_or_default() {
            input[k] = v;
        }
        input
    }

    fn run(
        &self,
        run_id: &str,
        input: Value,
        env: Vec<(String, String)>,
        faults: FaultPlan,
    ) -> RunReport {
        let opts = RunOptions {
            run_id: run_id.to_string(),
            input: serde_json::to_vec(&input).unwrap(),
            authority: Authority {
                dirs: vec![DirGrant {
                    host: self.host.data(),
                    guest: "/data".to_string(),
                }],
                env,
                http: HttpPolicy {
                    allow: vec![
                        format!("127.0.0.1:{}", self.server.addr.port())
                            .parse()
                            .unwrap(),
                    ],
                    outside_claims: false,
                },
                limits: self.host.limits.clone(),
                sync: SyncMode::Normal,
            },
            faults,
            ..RunOptions::default()
        };
        self.host
            .run_with(&self.agent, &opts)
            .unwrap_or_else(|e| panic!("run {run_id}: {e:#}"))
    }

    /// The lines of `notes.log`: who wrote each.
    fn notes(&self) -> Vec<Note> {
        std::fs::read_to_string(self.host.data().join("notes.log"))
            .unwrap_or_default()
            .lines()
            .map(|line| {
                let mut parts = line.split(' ');
                Note {
                    key: parts.next().unwrap().to_owned(),
                    token: parts.next().unwrap().parse().unwrap(),
                    in_doubt: parts.next().unwrap() == "in-doubt",
                }
            })
            .collect()
    }
}

/// A line of `notes.log`: the step that wrote it.
struct Note {
    key: String,
    token: u64,
    in_doubt: bool,
}

fn completed(report: &RunReport) -> Value {
    assert_eq!(
        report.status,
        RunStatus::Completed,
        "{}",
        String::from_utf8_lossy(&report.outcome)
    );
    serde_json::from_slice(&report.outcome).unwrap()
}

fn failed(report: &RunReport) -> String {
    assert_eq!(report.status, RunStatus::Failed, "{report:?}");
    String::from_utf8_lossy(&report.outcome).into_owned()
}

/// The conversation's keys: the two model turns and the two tool calls of the first.
fn keys(run_id: &str) -> [String; 4] {
    let turn = |n: u32| format!("{run_id}/llm/c1/{n}");
    [
        turn(1),
        format!("{}/tool/call_lookup", turn(1)),
        format!("{}/tool/call_note", turn(1)),
        turn(2),
    ]
}

/// How often each key of [`keys`] reaches its side effect when the run is dropped at
/// `point`: once, or twice for the keys whose effect ran and whose claim was then
/// retaken in doubt. Steps count claims: 1 the first turn, 2 and 3 the tools (claimed
/// together, their effects run before either commits), 4 the second turn.
fn expected(point: Option<CrashPoint>) -> [usize; 4] {
    let mut times = [1; 4];
    let in_doubt: &[usize] = match point.map(|p| (p.phase, p.step)) {
        Some((Phase::InEffect, 1)) => &[0],
        // The batch's first commit: both tools ran.
        Some((Phase::InEffect, 2)) => &[1, 2],
        // The lookup committed, the note ran and did not.
        Some((Phase::InEffect, 3) | (Phase::AfterCommit, 2)) => &[2],
        Some((Phase::InEffect, 4)) => &[3],
        _ => &[],
    };
    for &i in in_doubt {
        times[i] = 2;
    }
    times
}

/// Each key's side effect happened as often as [`expected`] says, a repeat under a
/// greater token (and, for the note, flagged in doubt).
fn once_per_key(bed: &Bed, run_id: &str, point: Option<CrashPoint>) {
    let what = point.map_or_else(|| "clean".to_owned(), |p| p.to_string());
    let keys = keys(run_id);
    let model = bed.server.model_calls();
    assert_eq!(
        model.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
        [&keys[0], &keys[3]],
        "{what}: one model key per turn"
    );
    let lookups = bed.server.exchanges("/tool/lookup");
    assert!(lookups.iter().all(|e| e.key() == keys[1]), "{what}");
    let notes = bed.notes();
    assert!(notes.iter().all(|n| n.key == keys[2]), "{what}");
    let tokens: [Vec<u64>; 4] = [
        model[0].1.iter().map(Exchange::token).collect(),
        lookups.iter().map(Exchange::token).collect(),
        notes.iter().map(|n| n.token).collect(),
        model[1].1.iter().map(Exchange::token).collect(),
    ];
    for ((key, tokens), times) in keys.iter().zip(&tokens).zip(expected(point)) {
        assert_eq!(tokens.len(), times, "{what}: {key} reached {tokens:?}");
        assert!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "{what}: {key}'s repeat under a greater token: {tokens:?}"
        );
    }
    let doubts: Vec<bool> = notes.iter().map(|n| n.in_doubt).collect();
    assert_eq!(
        doubts,
        (0..notes.len()).map(|i| i > 0).collect::<Vec<_>>(),
        "{what}: only the repeat of the note is in doubt"
    );
}

/// What the stand-in's two answers report: the first turn's tokens, the second's.
const TURN1: Tokens = Tokens {
    input: 100,
    output: 20,
    cached: 50,
};
const TURN2: Tokens = Tokens {
    input: 150,
    output: 10,
    cached: 0,
};

/// The run's usage in the store: its two model calls spent once each, whatever
/// instances did, and `replays` replays of the first turn saved.
fn usage_is_exact(bed: &Bed, run_id: &str, replays: u64, what: &str) {
    let usage = bed.usage(run_id);
    assert_eq!(usage.len(), 1, "{what}: one model: {usage:?}");
    let u = &usage[0];
    let mut spent = TURN1;
    spent += TURN2;
    assert_eq!(
        (u.model.as_str(), u.calls, u.spent, u.replays, u.saved),
        ("stand-in", 2, spent, replays, TURN1.times(replays)),
        "{what}"
    );
}

fn tool_loop(backend: Backend, guest: &str, provider: &str) {
    let Some(bed) = Bed::on(backend, guest) else {
        return;
    };
    let report = bed.run(
        "loop",
        bed.input(json!({"provider": provider})),
        bed.env(provider),
        FaultPlan::default(),
    );
    let out = completed(&report);
    assert_eq!(out["answer"], "answer: found idem, noted", "{provider}");
    assert_eq!(out["usage"], json!([250, 30, 50]), "{provider}");
    once_per_key(&bed, "loop", None);
    usage_is_exact(&bed, "loop", 0, provider);
    // The endpoint came from the grant, and so did the key.
    let first = &bed.server.model_calls()[0].1[0];
    let path = if provider == "anthropic" {
        "/v1/messages"
    } else {
        "/v1/chat/completions"
    };
    assert_eq!(first.seen.path, path);
    // The second turn sent the first turn's calls and both results back.
    let second: Value =
        serde_json::from_slice(&bed.server.model_calls()[1].1[0].seen.body).unwrap();
    assert_eq!(
        tool_results(&second, provider == "anthropic"),
        ["found idem", "noted"]
    );
}

#[test]
fn the_tool_loop_calls_each_turn_and_each_tool_once() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        tool_loop(backend, LLM, "openai");
        tool_loop(backend, LLM, "anthropic");
    }
}

/// Where the usage is shown: `idem show` (text and JSON), `idem usage`, the API, the
/// web page's document and `/metrics`, priced by a table; a bad table is refused naming
/// its entry. The run crashed after its second step, so its first turn was replayed.
#[test]
fn usage_is_shown_by_show_usage_the_api_and_metrics_priced() {
    use crate::serve::{Served, scrape};
    use crate::util::{run_cli, stderr, stdout};

    let bed = Bed::new(LLM);
    let point = CrashPoint {
        phase: Phase::AfterCommit,
        step: 2,
    };
    let report = bed.run(
        "shown",
        bed.input(json!({})),
        bed.env("openai"),
        FaultPlan {
            crash_at: vec![point],
            ..FaultPlan::default()
        },
    );
    completed(&report);
    usage_is_exact(&bed, "shown", 1, "shown");
    let deployment = block_on(bed.host.store().run("shown"))
        .unwrap()
        .unwrap()
        .agent;
    let db = bed.host.db();
    let db = db.to_str().unwrap();
    let prices = bed.host.dir.path().join("prices.json");
    std::fs::write(
        &prices,
        r#"{"stand-in": {"input": 2.0, "output": 10.0, "cached": -1.0}}"#,
    )
    .unwrap();
    let prices = prices.to_str().unwrap();
    // (250 × 2 + 30 × 10 − 50) / 10⁶ spent; (100 × 2 + 20 × 10 − 50) / 10⁶ saved.
    let (spent_cost, saved_cost) = (0.000750, 0.000350);
    let close = |v: &Value, want: f64| (v.as_f64().unwrap() - want).abs() < 1e-12;

    let out = run_cli(&["show", "shown", "--db", db, "--prices", prices, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let u = &doc["usage"][0];
    assert_eq!(
        (&u["model"], &u["calls"], &u["replays"]),
        (&json!("stand-in"), &json!(2), &json!(1)),
        "{doc}"
    );
    assert_eq!(
        u["spent"],
        json!({"input": 250, "output": 30, "cached": 50})
    );
    assert_eq!(
        u["saved"],
        json!({"input": 100, "output": 20, "cached": 50})
    );
    assert!(close(&u["spent_cost"], spent_cost), "{u}");
    assert!(close(&u["saved_cost"], saved_cost), "{u}");

    let out = run_cli(&["show", "shown", "--db", db]);
    let text = stdout(&out);
    assert!(
        text.contains(
            "model usage:\n  stand-in  calls 2  spent in 250 out 30 cached 50  replays 1  \
             saved in 100 out 20 cached 50\n"
        ),
        "{text}"
    );

    let out = run_cli(&["usage", "--db", db, "--deployment", &deployment, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(doc["usage"][0]["deployment"], deployment.as_str(), "{doc}");
    assert_eq!(doc["usage"][0]["spent"]["input"], 250, "{doc}");
    assert!(
        doc["usage"][0].get("spent_cost").is_none(),
        "no table, no cost"
    );
    let out = run_cli(&["usage", "--db", db, "--deployment", "nobody", "--json"]);
    assert_eq!(stdout(&out).trim(), r#"{"usage":[]}"#);

    let bad = bed.host.dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"stand-in": {"input": 2.0, "output": -1}}"#).unwrap();
    let out = run_cli(&["usage", "--db", db, "--prices", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "bad input");
    let err = stderr(&out);
    assert!(
        err.contains("entry for model \"stand-in\"") && err.contains("negative"),
        "{err}"
    );

    let served = Served::start(db, &["--prices", prices]);
    let doc = served.get("/api/usage?run=shown").json();
    assert!(close(&doc["usage"][0]["spent_cost"], spent_cost), "{doc}");
    let doc = served.get("/api/runs/shown").json();
    assert_eq!(doc["usage"][0]["replays"], 1, "{doc}");
    assert!(close(&doc["usage"][0]["saved_cost"], saved_cost), "{doc}");
    let metrics = scrape(&served);
    let who = format!("deployment=\"{deployment}\",model=\"stand-in\"");
    for (name, want) in [
        (format!("idem_model_calls_total{{{who}}}"), 2.0),
        (format!("idem_model_replays_total{{{who}}}"), 1.0),
        (
            format!("idem_model_tokens_spent_total{{{who},kind=\"input\"}}"),
            250.0,
        ),
        (
            format!("idem_model_tokens_spent_total{{{who},kind=\"output\"}}"),
            30.0,
        ),
        (
            format!("idem_model_tokens_spent_total{{{who},kind=\"cached\"}}"),
            50.0,
        ),
        (
            format!("idem_model_tokens_saved_total{{{who},kind=\"input\"}}"),
            100.0,
        ),
        (
            format!("idem_model_tokens_saved_total{{{who},kind=\"cached\"}}"),
            50.0,
        ),
        (format!("idem_model_cost_spent_total{{{who}}}"), spent_cost),
        (format!("idem_model_cost_saved_total{{{who}}}"), saved_cost),
    ] {
        let got = metrics.get(&name).copied();
        assert!(
            got.is_some_and(|g| (g - want).abs() < 1e-12),
            "{name}: {got:?} in {metrics:?}"
        );
    }
}

/// A conversation of three turns without tools: one key per turn, one request each,
/// the usage summed.
fn chat_turns(guest: &str) {
    let bed = Bed::new(guest);
    let report = bed.run(
        "chat",
        bed.input(json!({"chat": 3})),
        bed.env("openai"),
        FaultPlan::default(),
    );
    let out = completed(&report);
    assert_eq!(out["usage"], json!([450, 30, 0]));
    let calls = bed.server.model_calls();
    let keys: Vec<&str> = calls.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["chat/llm/c1/1", "chat/llm/c1/2", "chat/llm/c1/3"]);
    assert!(calls.iter().all(|(_, list)| list.len() == 1));
    // Each turn sent the whole conversation so far: the third, seven messages.
    let third: Value = serde_json::from_slice(&calls[2].1[0].seen.body).unwrap();
    assert_eq!(third["messages"].as_array().unwrap().len(), 7, "{third}");
}

#[test]
fn a_conversation_without_tools_is_one_step_per_turn() {
    chat_turns(LLM);
}

/// Every crash point of the conversation's steps (two model calls, a batch of two
/// tools): the run completes with the same answer, each key reached once, or twice in
/// doubt under a greater token.
///
/// The usage in the store is exact: each model call spent once, a commit whose instance
/// died before recording its usage (after the commit of step 1) recorded by the
/// replay as spent, and the first turn saved once when an instance that had recorded
/// it died after it (any crash past step 1).
fn crash_sweep(backend: Backend, guest: &str, phases: &[Phase]) {
    for &phase in phases {
        for step in 1..=4 {
            let point = CrashPoint { phase, step };
            let Some(bed) = Bed::on(backend, guest) else {
                return;
            };
            let report = bed.run(
                "sweep",
                bed.input(json!({})),
                bed.env("openai"),
                FaultPlan {
                    crash_at: vec![point],
                    ..FaultPlan::default()
                },
            );
            let out = completed(&report);
            assert_eq!(out["answer"], "answer: found idem, noted", "{point}");
            assert_eq!(out["usage"], json!([250, 30, 50]), "{point}");
            once_per_key(&bed, "sweep", Some(point));
            let crashed = report.counts.instances > 1;
            let replays = u64::from(crashed && step > 1);
            usage_is_exact(&bed, "sweep", replays, &format!("{backend:?} {point}"));
        }
    }
}

#[test]
fn under_every_crash_point_each_call_reaches_the_server_once_per_key() {
    crash_sweep(Backend::Sqlite, LLM, &Phase::ALL);
}

#[test]
fn under_every_crash_point_usage_is_exact_on_postgres() {
    crash_sweep(Backend::Postgres, LLM, &Phase::ALL);
}

/// Usage recorded by the agent itself: its own committed turn again (a replay: saved),
/// and refused typed, with nothing written, for another run's key, a key never
/// committed, an absurd count and an empty model name.
fn usage_probes(backend: Backend, guest: &str) {
    let Some(bed) = Bed::on(backend, guest) else {
        return;
    };
    completed(&bed.run(
        "other",
        bed.input(json!({})),
        bed.env("openai"),
        FaultPlan::default(),
    ));
    let probe = |key: &str, model: &str, tokens: [u64; 3]| json!({"key": key, "model": model, "tokens": tokens});
    let probes = json!([
        probe("probe/llm/c1/1", "stand-in", [100, 20, 50]),
        probe("other/llm/c1/1", "stand-in", [1, 1, 1]),
        probe("probe/llm/c1/9", "stand-in", [1, 1, 1]),
        probe("probe/llm/c1/2", "stand-in", [2_000_000_000, 0, 0]),
        probe("probe/llm/c1/2", "", [1, 1, 1]),
    ]);
    let report = bed.run(
        "probe",
        bed.input(json!({ "probe": probes })),
        bed.env("openai"),
        FaultPlan::default(),
    );
    let out = completed(&report);
    let recorded: Vec<&str> = out["recorded"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    assert_eq!(recorded[0], "saved", "{out}");
    for (i, says) in [
        (1, "is not a step this run committed"),
        (2, "is not a step this run committed"),
        (3, "over the limit"),
        (4, "model name is empty"),
    ] {
        assert!(
            recorded[i].starts_with("usage refused: ") && recorded[i].contains(says),
            "{i}: {}",
            recorded[i]
        );
    }
    // The probe's own replay is saved; nothing else changed, here or in the other run.
    usage_is_exact(&bed, "probe", 1, "probe");
    usage_is_exact(&bed, "other", 0, "the other run");
}

#[test]
fn usage_a_guest_records_is_checked_and_typed() {
    for backend in [Backend::Sqlite, Backend::Postgres] {
        usage_probes(backend, LLM);
    }
}

/// A crash after each commit: the replayed turns come back from the store, their bodies
/// byte for byte what the server sent, without a request.
fn replay_is_byte_identical(guest: &str) {
    for step in 1..=4 {
        let point = CrashPoint {
            phase: Phase::AfterCommit,
            step,
        };
        let bed = Bed::new(guest);
        let report = bed.run(
            "replay",
            bed.input(json!({"manual": true})),
            bed.env("openai"),
            FaultPlan {
                crash_at: vec![point],
                ..FaultPlan::default()
            },
        );
        let out = completed(&report);
        once_per_key(&bed, "replay", Some(point));
        let replays = u64::from(report.counts.instances > 1 && step > 1);
        usage_is_exact(&bed, "replay", replays, &point.to_string());
        let calls = bed.server.model_calls();
        let turns = out["turns"].as_array().unwrap();
        assert_eq!(turns.len(), 2, "{point}");
        for (turn, (key, sent)) in turns.iter().zip(&calls) {
            assert_eq!(turn["key"], key.as_str(), "{point}");
            assert_eq!(
                turn["body"].as_str().unwrap().as_bytes(),
                sent[0].answer.as_slice(),
                "{point}: the body the server sent, byte for byte"
            );
        }
        // Replayed turns cost nothing: the first turn, committed before the crash, was
        // read back by the next instance.
        if report.counts.instances > 1 {
            assert_eq!(turns[0]["outcome"], "skipped", "{point}: {out}");
        }
    }
}

#[test]
fn a_replayed_call_returns_the_same_bytes_without_a_request() {
    replay_is_byte_identical(LLM);
}

/// A 429 with `Retry-After: 1`: the call's claim is released and the run sleeps
/// durably (the instance ends; the store records the wait), then the same key is
/// claimed again and its request sent a second later with a greater token.
fn rate_limited(guest: &str) {
    let bed = Bed::new(guest);
    bed.server.with(|r| {
        r.first
            .push_back(Canned::new(429, &[("retry-after", "1")], "slow down"))
    });
    let report = bed.run(
        "slow",
        bed.input(json!({})),
        bed.env("openai"),
        FaultPlan::default(),
    );
    let out = completed(&report);
    assert_eq!(out["answer"], "answer: found idem, noted");
    let calls = bed.server.model_calls();
    let first = &calls[0].1;
    assert_eq!(first.len(), 2, "the 429, then the call that got through");
    assert_eq!(first[0].status, 429);
    assert!(first[0].token() < first[1].token());
    let gap = first[1].at - first[0].at;
    assert!(gap >= Duration::from_millis(950), "waited {gap:?}");
    assert!(
        report.counts.instances >= 2,
        "the sleep ended the instance: {:?}",
        report.counts
    );
    let waits = block_on(bed.host.store().waits("slow")).unwrap();
    assert_eq!(waits.len(), 1, "one durable sleep");
    assert!(waits[0].key.starts_with("retry-"), "{}", waits[0].key);
    assert_eq!(waits[0].due.unwrap() - waits[0].created, 1000);
}

#[test]
fn a_429_with_retry_after_is_waited_durably() {
    rate_limited(LLM);
}

/// Bad answers from the model at its second turn: each ends the run with its typed
/// error, having sent the turn's request as often as the policy says; the first turn
/// and its tools stay committed, each reached once.
fn bad_answers(guest: &str) {
    let huge = format!(
        r#"{{"choices":[{{"index":0,"message":{{"role":"assistant","content":"{}"}},"finish_reason":"stop"}}]}}"#,
        "x".repeat(2 << 20)
    );
    let cases: Vec<(&str, Vec<Canned>, usize, &str)> = vec![
        (
            "storm",
            vec![Canned::new(429, &[("retry-after", "0")], "busy"); 5],
            3,
            "gave up after 3 attempts; the last: status 429",
        ),
        (
            "truncated",
            vec![Canned::new(
                200,
                &[],
                r#"{"choices":[{"index":0,"message":{"content":"answ"#,
            )],
            1,
            "malformed model response to",
        ),
        (
            "malformed",
            vec![Canned::new(200, &[], "<html>bad gateway</html>")],
            1,
            "malformed model response to",
        ),
        (
            "refused",
            vec![Canned::new(400, &[], r#"{"error":"context too long"}"#)],
            1,
            "refused the request with status 400: {\"error\":\"context too long\"}",
        ),
        (
            "huge",
            vec![Canned::new(200, &[], huge)],
            1,
            "is too large: 2097244 bytes, over the client's limit of 1048576 bytes",
        ),
    ];
    for (name, canned, requests, error) in cases {
        let bed = Bed::new(guest);
        bed.server.with(|r| r.second.extend(canned));
        let report = bed.run(
            name,
            bed.input(json!({})),
            bed.env("openai"),
            FaultPlan::default(),
        );
        let text = failed(&report);
        assert!(text.contains(error), "{name}: {text}");
        let [turn1, lookup, note, turn2] = keys(name);
        let calls = bed.server.model_calls();
        assert_eq!(calls.len(), 2, "{name}");
        assert_eq!(calls[0].1.len(), 1, "{name}");
        assert_eq!(calls[1].1.len(), requests, "{name}: {text}");
        assert_eq!(bed.server.exchanges("/tool/lookup").len(), 1, "{name}");
        assert_eq!(bed.notes().len(), 1, "{name}");
        // Nothing lost: the first turn and its tools are committed; the failed turn is
        // not, and holds no claim.
        let steps = block_on(bed.host.store().steps(name)).unwrap();
        // The store qualifies keys with the agent's namespace: `NAMESPACE:KEY`.
        let step = |key: &str| {
            steps
                .iter()
                .find(|s| s.key.split_once(':').is_some_and(|(_, k)| k == key))
                .unwrap_or_else(|| panic!("{name}: no step {key}: {steps:?}"))
        };
        let committed = |key: &str| step(key).committed_at.is_some();
        for key in [&turn1, &lookup, &note] {
            assert!(committed(key), "{name}: {key} committed: {steps:?}");
        }
        let failed_turn = step(&turn2);
        assert!(failed_turn.committed_at.is_none(), "{name}");
        assert!(failed_turn.holder.is_none(), "{name}");
    }
}

#[test]
fn a_429_storm_and_malformed_refused_or_huge_answers_fail_typed_keeping_earlier_steps() {
    bad_answers(LLM);
}

/// Without the key's grant the client refuses before any request, naming the variable.
fn missing_key(guest: &str) {
    let bed = Bed::new(guest);
    let env = vec![(
        "OPENAI_BASE_URL".to_owned(),
        format!("{}/v1", bed.server.url()),
    )];
    let report = bed.run("nokey", bed.input(json!({})), env, FaultPlan::default());
    let text = failed(&report);
    assert!(
        text.contains("environment variable OPENAI_API_KEY is not granted to the run"),
        "{text}"
    );
    assert!(bed.server.with(|r| r.exchanges.is_empty()), "nothing sent");
}

#[test]
fn a_missing_key_grant_is_a_typed_error_and_sends_nothing() {
    missing_key(LLM);
}

/// The same from the Python SDK (`idem.llm`).
#[test]
fn python_model_calls_are_steps_too() {
    let Some(guest) = crate::python::built(PY_LLM, "model calls") else {
        return;
    };
    tool_loop(Backend::Sqlite, guest, "openai");
    tool_loop(Backend::Sqlite, guest, "anthropic");
    tool_loop(Backend::Postgres, guest, "openai");
    chat_turns(guest);
    crash_sweep(
        Backend::Sqlite,
        guest,
        &[Phase::AfterClaim, Phase::InEffect, Phase::AfterCommit],
    );
    crash_sweep(Backend::Postgres, guest, &[Phase::AfterCommit]);
    usage_probes(Backend::Sqlite, guest);
    replay_is_byte_identical(guest);
    rate_limited(guest);
    bad_answers(guest);
    missing_key(guest);
}

/// `idem prove` on an `llm-agent` example, the stand-in model granted by `--env` and
/// `--allow-http`: a clean verdict over every crash point, chaos and kills, the model
/// reached only by the clean run (every other scenario is answered from its capture).
fn proven(example: &str) {
    let server = ModelServer::start();
    let dir = crate::util::CliDir::new();
    let grant = format!("{}::/data", dir.data().display());
    let input = json!({
        "conversation": "ticket-17",
        "question": "What is idem? Note it down.",
        "api": server.url(),
        "notes": "/data/notes.log",
    })
    .to_string();
    let base = format!("OPENAI_BASE_URL={}/v1", server.url());
    let key = format!("OPENAI_API_KEY={API_KEY}");
    let allow = format!("127.0.0.1:{}", server.addr.port());
    let scratch = dir.dir.path().join("scratch");
    let out = crate::util::run_cli(&[
        "prove",
        example,
        "--input",
        &input,
        "--dir",
        &grant,
        "--env",
        &base,
        "--env",
        &key,
        "--allow-http",
        &allow,
        "--chaos",
        "2",
        "--kills",
        "1",
        "--json",
        "--scratch",
        scratch.to_str().unwrap(),
    ]);
    let doc: Value = serde_json::from_str(&crate::util::stdout(&out)).unwrap_or_else(|e| {
        panic!(
            "prove printed no JSON ({e}): {}\n{}",
            crate::util::stdout(&out),
            crate::util::stderr(&out)
        )
    });
    assert_eq!(
        out.status.code(),
        Some(0),
        "{doc:#}\n{}",
        crate::util::stderr(&out)
    );
    assert_eq!(doc["passed"], true);
    // Two model turns and two tool calls, each its own key.
    assert_eq!(doc["clean"]["keys"].as_array().unwrap().len(), 4, "{doc:#}");
    let output: Value = serde_json::from_str(doc["clean"]["output"].as_str().unwrap()).unwrap();
    assert_eq!(
        output,
        json!({"answer": "answer: found idem, noted", "turns": 2,
               "usage": {"input": 250, "output": 30, "cached": 50}}),
        "{doc:#}"
    );
    assert_eq!(
        doc["clean"]["requests"], 3,
        "two model turns and one lookup"
    );
    // The clean run alone reached the model: two turns, one request each.
    let calls = server.model_calls();
    assert_eq!(calls.len(), 2, "{doc:#}");
    assert!(calls.iter().all(|(_, list)| list.len() == 1));
    assert!(
        !dir.data().join("notes.log").exists(),
        "the grant is copied"
    );
}

#[test]
fn the_llm_agent_example_is_proven_clean() {
    proven(idem_test_artifacts::LLM_AGENT);
}

#[test]
fn the_python_llm_agent_example_is_proven_clean() {
    let Some(guest) = crate::python::built(idem_test_artifacts::PY_LLM_AGENT, "llm example") else {
        return;
    };
    proven(guest);
}
