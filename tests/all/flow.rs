//! Flow control across workers: three `idem worker` processes share a store (SQLite,
//! then PostgreSQL) and lease runs of a deployment with limits. A loopback server that
//! holds each request a while records how many were in flight at once, overall and per
//! concurrency key: the limits are never exceeded, and are reached.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use idem::store::RunStatus;
use idem_test_artifacts::FETCHER;
use serde_json::json;

use crate::postgres::Schema;
use crate::util::{block_on, stderr};
use crate::workers::{Service, signal};

/// How long the server holds each request: long enough that runs leased together
/// overlap at the server.
const HOLD: Duration = Duration::from_millis(150);

/// What the server saw: requests in flight now and at most, overall and by the first
/// segment of their path (the run's concurrency key), and every path.
#[derive(Debug, Default)]
struct InFlight {
    now: usize,
    most: usize,
    now_by: HashMap<String, usize>,
    most_by: HashMap<String, usize>,
    paths: Vec<String>,
}

/// An HTTP/1.1 server on 127.0.0.1 answering each connection in a thread of its own
/// after [`HOLD`], counting what is in flight.
struct HoldingServer {
    addr: SocketAddr,
    seen: Arc<Mutex<InFlight>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl HoldingServer {
    fn start() -> HoldingServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(InFlight::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (seen, stop) = (Arc::clone(&seen), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let seen = Arc::clone(&seen);
                            std::thread::spawn(move || hold(stream, &seen));
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(2));
                        }
                        Err(e) => panic!("test server accept: {e}"),
                    }
                }
            })
        };
        HoldingServer {
            addr,
            seen,
            stop,
            thread: Some(thread),
        }
    }

    fn url(&self, key: &str) -> String {
        format!("http://{}/{key}", self.addr)
    }

    fn grant(&self) -> String {
        format!("127.0.0.1:{}", self.addr.port())
    }
}

impl Drop for HoldingServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Reads one request, counts it in flight for [`HOLD`], and answers it.
fn hold(stream: TcpStream, seen: &Mutex<InFlight>) {
    stream.set_nonblocking(false).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let path = line.split(' ').nth(1).unwrap_or_default().to_string();
    let mut length = 0;
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).unwrap();
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().unwrap();
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    let key = path
        .trim_start_matches('/')
        .split('/')
        .next()
        .unwrap_or_default()
        .to_string();
    {
        let mut s = seen.lock().unwrap();
        s.now += 1;
        s.most = s.most.max(s.now);
        let now_by = {
            let n = s.now_by.entry(key.clone()).or_insert(0);
            *n += 1;
            *n
        };
        let most_by = s.most_by.entry(key.clone()).or_insert(0);
        *most_by = (*most_by).max(now_by);
        s.paths.push(path);
    }
    std::thread::sleep(HOLD);
    {
        let mut s = seen.lock().unwrap();
        s.now -= 1;
        *s.now_by.get_mut(&key).unwrap() -= 1;
    }
    let mut stream = stream;
    let _ =
        stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
}

fn workers(service: &Service) -> Vec<Child> {
    (0..3)
        .map(|w| service.worker(&format!("w{w}"), &["--concurrency", "4"]))
        .collect()
}

fn drain(workers: Vec<Child>) {
    for mut worker in workers {
        signal(&worker, "TERM");
        let status = worker.wait().unwrap();
        assert!(status.success(), "a drained worker exits 0: {status:?}");
    }
}

fn deploy(service: &Service, server: &HoldingServer) {
    service.ok(&[
        "deploy",
        FETCHER,
        "--name",
        "fetcher",
        "--allow-http",
        &server.grant(),
    ]);
}

fn submit(service: &Service, run_id: &str, input: &serde_json::Value) {
    service.ok(&[
        "submit",
        "fetcher",
        "--run-id",
        run_id,
        "--input",
        &input.to_string(),
    ]);
}

fn assert_all_completed(service: &Service, runs: usize) {
    let all = service.runs();
    assert_eq!(all.len(), runs);
    for run in &all {
        assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    }
}

/// Ten runs of two steps, a limit of 2 running runs, three workers of 4 slots each.
fn a_deployment_limit_is_never_exceeded(service: &Service) {
    const LIMIT: usize = 2;
    let server = HoldingServer::start();
    deploy(service, &server);
    let set = service.ok(&["flow", "set", "fetcher", "--max-running", "2"]);
    assert!(set.contains("at most 2 running"), "{set}");
    for i in 0..10 {
        submit(
            service,
            &format!("run-{i}"),
            &json!({"steps": 2, "url": server.url("all")}),
        );
    }
    let workers = workers(service);
    service.wait_all_finished(Duration::from_secs(120), || {});
    drain(workers);
    assert_all_completed(service, 10);
    let seen = server.seen.lock().unwrap();
    assert_eq!(seen.paths.len(), 20, "each step once: {:?}", seen.paths);
    assert_eq!(
        seen.most, LIMIT,
        "at most {LIMIT} runs ran at once, and {LIMIT} did"
    );
}

/// Three customers with four runs each, one run per customer at a time: each
/// customer's requests never overlap, while the customers' do.
fn a_concurrency_key_serialises_runs_per_key(service: &Service) {
    let server = HoldingServer::start();
    deploy(service, &server);
    service.ok(&[
        "flow",
        "set",
        "fetcher",
        "--key",
        "/customer",
        "--per-key",
        "1",
    ]);
    for i in 0..4 {
        for customer in ["a", "b", "c"] {
            let input = json!({"steps": 2, "url": server.url(customer), "customer": customer});
            submit(service, &format!("{customer}-{i}"), &input);
        }
    }
    let workers = workers(service);
    service.wait_all_finished(Duration::from_secs(120), || {});
    drain(workers);
    assert_all_completed(service, 12);
    let seen = server.seen.lock().unwrap();
    assert_eq!(seen.paths.len(), 24, "each step once: {:?}", seen.paths);
    for customer in ["a", "b", "c"] {
        assert_eq!(
            seen.most_by[customer], 1,
            "customer {customer} ran one at a time"
        );
    }
    assert!(
        seen.most >= 2,
        "other customers proceeded meanwhile: {}",
        seen.most
    );
}

/// What a bad setting or submission gets: a clear error, nothing changed.
fn bad_limits_are_refused_and_change_nothing(service: &Service) {
    let server = HoldingServer::start();
    deploy(service, &server);
    service.ok(&["flow", "set", "fetcher", "--max-running", "3"]);
    for (args, says) in [
        (
            vec!["flow", "set", "fetcher", "--max-running", "0"],
            "limit of 0",
        ),
        (
            vec!["flow", "set", "fetcher", "--max-running", "4000000000"],
            "beyond",
        ),
        (
            vec!["flow", "set", "nobody", "--max-running", "2"],
            "no deployment is named",
        ),
        (
            vec![
                "flow",
                "set",
                "fetcher",
                "--key",
                "customer",
                "--per-key",
                "1",
            ],
            "JSON pointer",
        ),
        (vec!["flow", "set", "fetcher"], "no limit given"),
    ] {
        let out = service.cli(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
        let ls = service.ok(&["flow", "ls", "--json"]);
        let ls: serde_json::Value = serde_json::from_str(&ls).unwrap();
        assert_eq!(ls.as_array().unwrap().len(), 1, "{ls}");
        assert_eq!(ls[0]["max_running"], 3, "{ls}");
    }
    service.ok(&[
        "flow",
        "set",
        "fetcher",
        "--key",
        "/customer",
        "--per-key",
        "1",
    ]);
    let out = service.cli(&[
        "submit",
        "fetcher",
        "--run-id",
        "no-key",
        "--input",
        r#"{"steps": 1, "url": "x"}"#,
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("has no concurrency key"),
        "{}",
        stderr(&out)
    );
    // Rate limits on classes of steps: refused with the reason, nothing changed.
    let set = service.ok(&["rate", "set", "llm", "--limit", "60", "--per", "1m"]);
    assert!(
        set.contains("llm") && set.contains("at most 60 per 1m"),
        "{set}"
    );
    for (args, says) in [
        (vec!["rate", "set", "llm", "--limit", "0"], "limit of 0"),
        (vec!["rate", "set", "llm", "--limit", "5000000"], "beyond"),
        (
            vec!["rate", "set", "llm", "--limit", "5", "--burst", "0"],
            "burst of 0",
        ),
        (
            vec!["rate", "set", "llm", "--limit", "5", "--per", "0ms"],
            "period of 0 ms",
        ),
        (
            vec!["rate", "set", "llm", "--limit", "5", "--per", "48h"],
            "outside",
        ),
        (vec!["rate", "set", "", "--limit", "5"], "must not be empty"),
        (
            vec!["rate", "set", "llm", "--limit", "5", "--per", "soon"],
            "expected a duration",
        ),
    ] {
        let out = service.cli(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
        let ls = service.ok(&["rate", "ls", "--json"]);
        let ls: serde_json::Value = serde_json::from_str(&ls).unwrap();
        assert_eq!(ls.as_array().unwrap().len(), 1, "{ls}");
        assert_eq!(
            (ls[0]["limit"].as_u64(), ls[0]["period_ms"].as_u64()),
            (Some(60), Some(60_000)),
            "{ls}"
        );
    }
    let cleared = service.ok(&["rate", "clear", "llm"]);
    assert!(cleared.contains("cleared the rate limit"), "{cleared}");
    assert_eq!(
        service.ok(&["rate", "ls"]).trim(),
        "no class has a rate limit"
    );
    let out = service.cli(&["submit", "fetcher", "--priority", "1001", "--input", "{}"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(block_on(service.store().run("no-key")).unwrap().is_none());
    assert!(service.try_runs().unwrap().is_empty());
}

#[test]
fn a_deployment_limit_is_never_exceeded_on_sqlite() {
    a_deployment_limit_is_never_exceeded(&Service::new());
}

#[test]
fn a_concurrency_key_serialises_runs_per_key_on_sqlite() {
    a_concurrency_key_serialises_runs_per_key(&Service::new());
}

#[test]
fn bad_limits_are_refused_and_change_nothing_on_sqlite() {
    bad_limits_are_refused_and_change_nothing(&Service::new());
}

#[test]
fn a_deployment_limit_is_never_exceeded_on_postgres() {
    let Some(schema) = Schema::create("flow limit") else {
        return;
    };
    a_deployment_limit_is_never_exceeded(&Service::on_postgres(schema.url()));
}

#[test]
fn a_concurrency_key_serialises_runs_per_key_on_postgres() {
    let Some(schema) = Schema::create("flow key") else {
        return;
    };
    a_concurrency_key_serialises_runs_per_key(&Service::on_postgres(schema.url()));
}

#[test]
fn bad_limits_are_refused_and_change_nothing_on_postgres() {
    let Some(schema) = Schema::create("flow refusals") else {
        return;
    };
    bad_limits_are_refused_and_change_nothing(&Service::on_postgres(schema.url()));
}
