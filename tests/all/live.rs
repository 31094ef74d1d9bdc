//! Live streaming out of a step: the `llm` guest streams a model's answer from the
//! stand-in server of `llm.rs`, which holds the stream midway, so the step cannot
//! commit while the test reads what was published so far: over server-sent events
//! (`GET /api/runs/{id}/stream`, read with an HTTP client of its own here, chunked
//! transfer and all) and with `idem logs -f`, on SQLite and on PostgreSQL. Then the rest
//! comes, the `end` event says the run completed, `Last-Event-ID` resumes where a
//! reader left off, and each model call reached the server once. The Python guest
//! (`idem.llm`) streams the same way.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Duration;

use idem_test_artifacts::{LLM, PY_LLM};
use serde_json::{Value, json};

use crate::llm::{Hold, ModelServer};
use crate::serve::{Served, wait_for};
use crate::workers::Service;

/// One server-sent event.
#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub(crate) id: Option<String>,
    pub(crate) name: String,
    pub(crate) data: Value,
}

/// A response of server-sent events, read as it comes: HTTP/1.1, chunked or not.
pub(crate) struct EventStream {
    reader: BufReader<TcpStream>,
    chunked: bool,
    /// Decoded bytes not yet a whole event.
    text: String,
    ended: bool,
}

impl EventStream {
    /// `GET path` on `addr`, resuming after `last` if given: the status and, for a 200,
    /// the stream (else the body).
    pub(crate) fn open(
        addr: SocketAddr,
        path: &str,
        last: Option<u64>,
    ) -> Result<EventStream, (u16, String)> {
        let mut socket = TcpStream::connect(addr).unwrap();
        // A guard against a hang, not a timed assertion: every read gets this long.
        socket
            .set_read_timeout(Some(Duration::from_secs(120)))
            .unwrap();
        let resume = last.map_or(String::new(), |id| format!("Last-Event-ID: {id}\r\n"));
        write!(
            socket,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/event-stream\r\n{resume}\r\n"
        )
        .unwrap();
        let mut reader = BufReader::new(socket);
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let status: u16 = line.split(' ').nth(1).unwrap().parse().unwrap();
        let (mut chunked, mut length, mut content_type) = (false, None, String::new());
        loop {
            line.clear();
            reader.read_line(&mut line).unwrap();
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            let (name, value) = header.split_once(':').unwrap();
            match name.to_ascii_lowercase().as_str() {
                "transfer-encoding" => chunked = value.trim().eq_ignore_ascii_case("chunked"),
                "content-length" => length = value.trim().parse::<usize>().ok(),
                "content-type" => content_type = value.trim().to_owned(),
                _ => {}
            }
        }
        let mut stream = EventStream {
            reader,
            chunked,
            text: String::new(),
            ended: false,
        };
        if status != 200 {
            let body = match length {
                Some(n) => {
                    let mut body = vec![0; n];
                    stream.reader.read_exact(&mut body).unwrap();
                    String::from_utf8_lossy(&body).into_owned()
                }
                None => {
                    let mut all = String::new();
                    while let Some(piece) = stream.piece() {
                        all.push_str(&piece);
                    }
                    all
                }
            };
            return Err((status, body));
        }
        assert!(
            content_type.starts_with("text/event-stream"),
            "{content_type}"
        );
        Ok(stream)
    }

    /// The next piece of the body, `None` at its end.
    fn piece(&mut self) -> Option<String> {
        if self.ended {
            return None;
        }
        let mut bytes = Vec::new();
        if self.chunked {
            let mut size = String::new();
            self.reader.read_line(&mut size).unwrap();
            let size = usize::from_str_radix(size.trim(), 16).unwrap();
            if size == 0 {
                self.ended = true;
                return None;
            }
            bytes.resize(size, 0);
            self.reader.read_exact(&mut bytes).unwrap();
            let mut crlf = [0; 2];
            self.reader.read_exact(&mut crlf).unwrap();
        } else {
            bytes.resize(4096, 0);
            let n = self.reader.read(&mut bytes).unwrap();
            if n == 0 {
                self.ended = true;
                return None;
            }
            bytes.truncate(n);
        }
        Some(String::from_utf8(bytes).unwrap())
    }

    /// The next event (keep-alive comments skipped), `None` once the response ended.
    pub(crate) fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(end) = self.text.find("\n\n") {
                let raw: String = self.text.drain(..end + 2).collect();
                let (mut id, mut name, mut data) = (None, "message".to_owned(), String::new());
                for line in raw.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        id = Some(v.trim().to_owned());
                    } else if let Some(v) = line.strip_prefix("event:") {
                        name = v.trim().to_owned();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.strip_prefix(' ').unwrap_or(v));
                    }
                }
                if data.is_empty() {
                    continue;
                }
                let data = serde_json::from_str(&data).unwrap();
                return Some(Event { id, name, data });
            }
            let piece = self.piece()?;
            self.text.push_str(&piece);
        }
    }
}

/// Deploys the `llm` guest as `chat`, granted the model server and a data directory.
pub(crate) fn deploy_chat(service: &Service, server: &ModelServer, data: &std::path::Path) {
    deploy_guest(service, LLM, server, data);
}

/// Deploys `guest` (an `llm` guest, Rust or Python) as `chat`.
fn deploy_guest(service: &Service, guest: &str, server: &ModelServer, data: &std::path::Path) {
    let grant = format!("127.0.0.1:{}", server.addr.port());
    let base = format!("OPENAI_BASE_URL={}/v1", server.url());
    let anthropic = format!("ANTHROPIC_BASE_URL={}", server.url());
    let dir = format!("{}::/data", data.display());
    service.ok(&[
        "deploy",
        guest,
        "--name",
        "chat",
        "--allow-http",
        &grant,
        "--env",
        &base,
        "--env",
        "OPENAI_API_KEY=sk-test",
        "--env",
        &anthropic,
        "--env",
        "ANTHROPIC_API_KEY=sk-test",
        "--dir",
        &dir,
    ]);
}

/// The input of a run that streams a tool-using conversation with `provider`.
pub(crate) fn streaming_input(server: &ModelServer, provider: &str) -> Value {
    json!({
        "provider": provider,
        "prompt": "look idem up and note hello",
        "tool_url": server.url(),
        "stream": true,
    })
}

/// Holds the server's first answer in text after every `every` pieces of it: each send
/// lets the next pieces go; dropping the sender lets the rest go at once.
pub(crate) fn hold(server: &ModelServer, every: usize) -> Sender<()> {
    let (go, wait): (Sender<()>, Receiver<()>) = channel();
    server.with(|r| r.hold = Some(Hold { every, go: wait }));
    go
}

/// The answer of the conversation's second turn, which is streamed as text.
pub(crate) const ANSWER: &str = "answer: found idem, noted";

/// Whether the run's step whose key ends with `suffix` is committed (per the API).
pub(crate) fn committed(served: &Served, run_id: &str, suffix: &str) -> bool {
    let run = served.get(&format!("/api/runs/{run_id}")).json();
    let step = run["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["key"].as_str().unwrap().ends_with(suffix))
        .unwrap_or_else(|| panic!("no step {suffix}: {run}"))
        .clone();
    !step["committed_at"].is_null()
}

fn streamed_over_sse_and_logs_follow(service: &Service, guest: &str, provider: &str) {
    let server = ModelServer::start();
    let go = hold(&server, 3);
    let data = tempfile::tempdir().unwrap();
    deploy_guest(service, guest, &server, data.path());
    let served = Served::start(
        &service.db(),
        &["--no-auth", "--no-cache", "--worker", "--poll", "50ms"],
    );
    let run_id = "live-1";
    let submitted = served.post_json(
        "/api/runs",
        None,
        &json!({"agent": "chat", "input": streaming_input(&server, provider), "run_id": run_id}),
    );
    assert_eq!(submitted.status, 201, "{}", submitted.text());
    let path = format!("/api/runs/{run_id}/stream");
    let mut events = EventStream::open(served.addr, &path, None).unwrap();
    let db = service.db();
    let mut follow = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["logs", "-f", run_id, "--db", &db])
        .env("IDEM_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (followed, reader) = read_as_it_comes(follow.stdout.take().unwrap());

    // The first chunk arrives while the model is still answering: the step that
    // publishes it is not committed.
    let turn = format!("{run_id}/llm/c1/2");
    let first = events.next().unwrap();
    assert_eq!(first.name, "message", "{first:?}");
    assert_eq!(first.data["key"], turn.as_str());
    let first_seq = first.data["seq"].as_u64().unwrap();
    assert_eq!(first.id.as_deref(), Some(first_seq.to_string().as_str()));
    let mut text = first.data["text"].as_str().unwrap().to_owned();
    assert!(ANSWER.starts_with(&text) && !text.is_empty(), "{text:?}");
    assert!(!committed(&served, run_id, "/llm/c1/2"));
    // `idem logs -f` shows it too, under the step's key, before the commit.
    let shown = wait_for(Duration::from_secs(60), || {
        let out = followed.lock().unwrap().clone();
        out.contains(&text).then_some(out)
    });
    assert!(shown.contains(&format!("[{turn}]")), "{shown}");
    assert!(!committed(&served, run_id, "/llm/c1/2"));

    // The rest comes, then the end.
    drop(go);
    let mut seqs = vec![first_seq];
    let end = loop {
        let event = events.next().expect("the stream ends with an end event");
        if event.name == "end" {
            break event;
        }
        assert_eq!(event.name, "message", "{event:?}");
        assert_eq!(event.data["key"], turn.as_str());
        seqs.push(event.data["seq"].as_u64().unwrap());
        text.push_str(event.data["text"].as_str().unwrap());
    };
    assert_eq!(end.data["status"], "completed");
    assert!(
        events.next().is_none(),
        "the response ends after the end event"
    );
    assert_eq!(text, ANSWER);
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    assert!(committed(&served, run_id, "/llm/c1/2"));
    let run = served.get(&format!("/api/runs/{run_id}")).json();
    assert_eq!(run["outcome"]["answer"], ANSWER, "{run}");

    // `idem logs -f` ends with the run, having shown the whole answer.
    let status = follow.wait().unwrap();
    assert!(status.success(), "idem logs -f: {status}");
    // The process is gone, but its last output may still be in the pipe: read to the end.
    reader.join().unwrap();
    let shown = followed.lock().unwrap().clone();
    assert!(shown.contains(ANSWER), "{shown}");

    // Each model call reached the server once, the streamed ones included.
    let calls = server.model_calls();
    assert_eq!(calls.len(), 2);
    assert!(calls.iter().all(|(_, exchanges)| exchanges.len() == 1));

    // A reader resuming after the first chunk gets the others, then the end at once.
    let mut again = EventStream::open(served.addr, &path, Some(first_seq)).unwrap();
    let mut resumed = Vec::new();
    let end = loop {
        let event = again.next().unwrap();
        if event.name == "end" {
            break event;
        }
        resumed.push(event.data["seq"].as_u64().unwrap());
    };
    assert_eq!(resumed, seqs[1..]);
    assert_eq!(end.data["status"], "completed");

    // An unknown run is refused like everywhere else in the API.
    let (status, body) = match EventStream::open(served.addr, "/api/runs/ghost/stream", None) {
        Ok(_) => panic!("a stream of an unknown run"),
        Err(refused) => refused,
    };
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("unknown_run"), "{body}");
}

/// A child's stdout as it comes, gathered on a thread.
/// What `out` writes, as it comes, and the thread reading it, which ends at its end.
fn read_as_it_comes(
    mut out: impl Read + Send + 'static,
) -> (
    std::sync::Arc<std::sync::Mutex<String>>,
    std::thread::JoinHandle<()>,
) {
    let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = std::sync::Arc::clone(&text);
    let reader = std::thread::spawn(move || {
        let mut buf = [0; 1024];
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    (text, reader)
}

#[test]
fn a_streamed_answer_is_read_over_sse_and_logs_follow_before_its_step_commits() {
    streamed_over_sse_and_logs_follow(&Service::new(), LLM, "openai");
}

#[test]
fn a_python_guest_streams_its_answer_the_same_way() {
    let Some(guest) = crate::python::built(PY_LLM, "live streams") else {
        return;
    };
    streamed_over_sse_and_logs_follow(&Service::new(), guest, "anthropic");
}

#[test]
fn a_streamed_anthropic_answer_is_read_the_same_way_on_postgres() {
    let Some(schema) = crate::postgres::Schema::create("live streams") else {
        return;
    };
    streamed_over_sse_and_logs_follow(&Service::on_postgres(schema.url()), LLM, "anthropic");
}

/// `idem run` in the foreground shows a step's published text on its terminal as it
/// comes, under the step's key, as `idem logs -f` prints it; the answer is committed
/// as ever.
#[test]
fn a_foreground_run_shows_the_streamed_text_under_its_key() {
    let server = ModelServer::start();
    let data = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("idem.db");
    let input = streaming_input(&server, "openai").to_string();
    let out = crate::util::run_cli(&[
        "run",
        LLM,
        "--db",
        db.to_str().unwrap(),
        "--run-id",
        "fg",
        "--input",
        &input,
        "--allow-http",
        &format!("127.0.0.1:{}", server.addr.port()),
        "--env",
        &format!("OPENAI_BASE_URL={}/v1", server.url()),
        "--env",
        "OPENAI_API_KEY=sk-test",
        "--dir",
        &format!("{}::/data", data.path().display()),
        "--json",
    ]);
    let err = crate::util::stderr(&out);
    assert!(out.status.success(), "{err}");
    let doc: Value = serde_json::from_str(&crate::util::stdout(&out)).unwrap();
    assert_eq!(doc["output"]["answer"], ANSWER, "{doc}");
    // The second turn's text, streamed, under its step's key.
    let at = err
        .find(ANSWER)
        .unwrap_or_else(|| panic!("the streamed answer is not on stderr: {err}"));
    let header = err[..at].rfind("\n[").expect("a key line before the text");
    assert!(err[header..at].contains("llm/"), "{err}");
}
