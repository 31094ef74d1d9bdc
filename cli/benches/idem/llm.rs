//! The `llm` section: what the model client adds to an HTTP step. The `llm` guest
//! (`tests/guests/llm`, `"chat": N`) makes N model calls through `idem_sdk::llm`, each
//! its own step keyed by the conversation and its turn, with the response body as its
//! committed result; the `fetcher` guest makes N plain `run_once` steps, each one
//! `http::Request` (and a checkpoint save). Both against one loopback server that
//! answers at once, so that the rows are idem's and the client's cost, not a model's.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::ensure;
use idem::runtime::{Authority, FaultPlan, HttpPolicy, LoadedAgent, RunOptions};
use idem::store::{RunStatus, SyncMode};
use idem_test_artifacts::{FETCHER, LLM};
use serde_json::{Value, json};

use super::report::{Table, median, micros, sorted};
use super::{Bed, BenchHost, Plan, fresh_run_id, repeat};

/// The stand-in model's one answer: a short final reply, as an OpenAI server sends it.
const COMPLETION: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","model":"stand-in","choices":[{"index":0,"message":{"role":"assistant","content":"It is a durable runtime for agents."},"finish_reason":"stop"}],"usage":{"prompt_tokens":42,"completion_tokens":9,"prompt_tokens_details":{"cached_tokens":0}}}"#;

pub(crate) fn llm(bed: &Bed, plan: &Plan, table: &mut Table) -> anyhow::Result<()> {
    let server = ModelServer::start()?;
    let llm = bed.runtime.load(Path::new(LLM))?;
    let fetcher = bed.runtime.load(Path::new(FETCHER))?;
    let host = bed.host(&bed.dir.join("llm.db"), SyncMode::Normal)?;
    let n = plan.llm.n;
    let url = server.url();
    let env = vec![
        ("OPENAI_BASE_URL".to_owned(), format!("{url}/v1")),
        ("OPENAI_API_KEY".to_owned(), "sk-bench".to_owned()),
    ];
    let model_input = json!({"chat": n, "prompt": "What is idem?", "tool_url": url});
    let http_input = json!({"steps": n, "url": url});
    // The first instance of each agent, not a sample.
    run(bed, &host, &llm, &server, &model_input, &env, n)?;
    run(bed, &host, &fetcher, &server, &http_input, &[], n)?;
    let (mut model, mut http) = (Vec::new(), Vec::new());
    repeat(plan.llm, || {
        model.push(run(bed, &host, &llm, &server, &model_input, &env, n)?);
        http.push(run(bed, &host, &fetcher, &server, &http_input, &[], n)?);
        Ok(())
    })?;
    let ratio = median(&sorted(model.clone())) / median(&sorted(http.clone()));
    table.row(
        format!("an HTTP step (`run_once` + `http::Request` + save), per step of a run of {n}"),
        "µs",
        http,
    );
    table.row_with_ratio(
        format!(
            "a model call through `llm::Client` (its own step, the body committed), per call \
             of a run of {n}"
        ),
        "µs",
        model,
        format!("{ratio:.2}× an HTTP step"),
    );
    Ok(())
}

/// One run of `agent`: its wall per step, in µs.
fn run(
    bed: &Bed,
    host: &BenchHost,
    agent: &LoadedAgent,
    server: &ModelServer,
    input: &Value,
    env: &[(String, String)],
    n: u64,
) -> anyhow::Result<f64> {
    let opts = RunOptions {
        run_id: fresh_run_id(),
        input: serde_json::to_vec(input)?,
        authority: Authority {
            env: env.to_vec(),
            http: HttpPolicy {
                allow: vec![format!("127.0.0.1:{}", server.port).parse()?],
                outside_claims: false,
            },
            sync: host.sync,
            ..Authority::default()
        },
        faults: FaultPlan::default(),
        ..RunOptions::default()
    };
    let t = Instant::now();
    let report = bed.tokio.block_on(host.host.run(agent, &opts))?;
    let wall = micros(t.elapsed());
    ensure!(
        report.status == RunStatus::Completed && report.counts.executed == n,
        "run {} ended {:?} ({:?}): {}",
        opts.run_id,
        report.status,
        report.counts,
        String::from_utf8_lossy(&report.outcome)
    );
    Ok(wall / n as f64)
}

/// A loopback HTTP/1.1 server answering every request at once: [`COMPLETION`] to a
/// chat completion, `ok` to anything else.
struct ModelServer {
    port: u16,
    stop: Arc<AtomicBool>,
}

impl ModelServer {
    fn start() -> anyhow::Result<ModelServer> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        // A client gone mid-way is no concern of the bench.
                        Ok((stream, _)) => {
                            std::thread::spawn(move || answer(stream));
                        }
                        Err(_) => std::thread::sleep(Duration::from_micros(100)),
                    }
                }
            });
        }
        Ok(ModelServer { port, stop })
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for ModelServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn answer(stream: TcpStream) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut first = String::new();
    reader.read_line(&mut first)?;
    let mut length = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let line = line.trim_end().to_ascii_lowercase();
        if line.is_empty() {
            break;
        }
        if let Some(v) = line.strip_prefix("content-length:") {
            length = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    let reply = if first.contains("/chat/completions") {
        COMPLETION
    } else {
        "ok"
    };
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{reply}",
        reply.len()
    )?;
    stream.flush()
}
