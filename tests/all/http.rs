//! Outbound HTTP end to end: the `fetcher` guest POSTs through `wasi:http` to a real
//! server on 127.0.0.1, which records what reached it. Each step's request arrives
//! once, stamped with the key and token the store committed; what is not granted never
//! leaves the host.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use idem::runtime::{CrashPoint, FaultPlan, HttpPolicy, Phase, RunReport};
use idem::store::RunStatus;
use idem_test_artifacts::FETCHER;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::util::{TestHost, agent, raw_db, run_cli, stderr, stdout};

/// One request as the server read it. Header names are lower-case.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) headers: BTreeMap<String, Vec<String>>,
    pub(crate) body: Vec<u8>,
}

impl Seen {
    /// The one value of header `name`; panics if it is missing or repeated.
    pub(crate) fn header(&self, name: &str) -> &str {
        match self.headers.get(name).map(Vec::as_slice) {
            Some([value]) => value,
            other => panic!("{} {}: header {name}: {other:?}", self.method, self.path),
        }
    }

    pub(crate) fn token(&self, name: &str) -> u64 {
        self.header(name).parse().unwrap()
    }
}

/// A small HTTP/1.1 server on 127.0.0.1 in a thread: it records every request and
/// answers `200` with `{METHOD} {PATH} ok`, one request per connection. Dropping it
/// stops the thread and waits for it.
pub(crate) struct TestServer {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TestServer {
    pub(crate) fn start() -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (seen, stop) = (Arc::clone(&seen), Arc::clone(&stop));
            std::thread::spawn(move || serve(&listener, &seen, &stop))
        };
        TestServer {
            addr,
            seen,
            stop,
            thread: Some(thread),
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub(crate) fn port(&self) -> u16 {
        self.addr.port()
    }

    /// A grant of exactly this server.
    fn policy(&self) -> HttpPolicy {
        HttpPolicy {
            allow: vec![format!("127.0.0.1:{}", self.port()).parse().unwrap()],
            outside_claims: false,
        }
    }

    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// The requests for `/step/{i}`, in arrival order, by step.
    pub(crate) fn steps(&self) -> BTreeMap<u64, Vec<Seen>> {
        let mut steps: BTreeMap<u64, Vec<Seen>> = BTreeMap::new();
        for s in self.seen() {
            if let Some(i) = s.path.strip_prefix("/step/") {
                steps.entry(i.parse().unwrap()).or_default().push(s);
            }
        }
        steps
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            // Not unwrap: a panic here during a failing test's unwind would abort.
            let _ = thread.join();
        }
    }
}

fn serve(listener: &TcpListener, seen: &Mutex<Vec<Seen>>, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => handle(stream, seen),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => panic!("test server accept: {e}"),
        }
    }
}

/// Reads one request, records it, and answers it. The record comes first: once the
/// client has its answer, the test may look.
fn handle(stream: TcpStream, seen: &Mutex<Vec<Seen>>) {
    let Some(request) = read_request(&stream) else {
        return;
    };
    let reply = format!("{} {} ok", request.method, request.path);
    seen.lock().unwrap().push(request);
    let mut stream = stream;
    // The client may be gone already (a dropped instance): nothing to tell it then.
    let _ = write!(
        stream,
        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{reply}",
        reply.len()
    )
    .and_then(|()| stream.flush());
}

/// `None` when the client sent no full request.
pub(crate) fn read_request(stream: &TcpStream) -> Option<Seen> {
    stream.set_nonblocking(false).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next()?.to_string(), parts.next()?.to_string());
    let mut headers: BTreeMap<String, Vec<String>> = BTreeMap::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':')?;
        headers
            .entry(name.trim().to_ascii_lowercase())
            .or_default()
            .push(value.trim().to_string());
    }
    let body = read_body(&mut reader, &headers)?;
    Some(Seen {
        method,
        path,
        headers,
        body,
    })
}

fn read_body(
    reader: &mut BufReader<TcpStream>,
    headers: &BTreeMap<String, Vec<String>>,
) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    if headers
        .get("transfer-encoding")
        .is_some_and(|v| v.iter().any(|v| v.eq_ignore_ascii_case("chunked")))
    {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).ok()?;
            let size = usize::from_str_radix(size.trim(), 16).ok()?;
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).ok()?;
            if size == 0 {
                return Some(body);
            }
            body.extend_from_slice(&chunk[..size]);
        }
    }
    let length = match headers.get("content-length") {
        Some(v) => v.first()?.parse().ok()?,
        None => 0,
    };
    body.resize(length, 0);
    reader.read_exact(&mut body).ok()?;
    Some(body)
}

/// The key the SDK derives for step `i` of run `run_id` (`Key::for_run("post", &i)`).
pub(crate) fn post_key(run_id: &str, i: u64) -> String {
    let digest = Sha256::digest(serde_json::to_vec(&i).unwrap());
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("{run_id}/post/{hex}")
}

/// The committed `(key, token)` of each of the run's results.
/// The run's committed keys (as the agent names them, without the store's namespace
/// prefix) and their fencing tokens.
pub(crate) fn committed(db: &std::path::Path, run_id: &str) -> BTreeMap<String, u64> {
    let conn = raw_db(db);
    let mut stmt = conn
        .prepare("SELECT key, token FROM steps WHERE run_id = ?1 AND result IS NOT NULL")
        .unwrap();
    stmt.query_map([run_id], |r| Ok((r.get(0)?, r.get::<_, i64>(1)?)))
        .unwrap()
        .map(|row| {
            let (key, token): (String, i64) = row.unwrap();
            let key = key
                .strip_prefix("fetcher:")
                .expect("namespaced key")
                .to_string();
            (key, u64::try_from(token).unwrap())
        })
        .collect()
}

fn run_fetcher(
    t: &TestHost,
    run_id: &str,
    input: serde_json::Value,
    faults: FaultPlan,
    http: HttpPolicy,
) -> RunReport {
    let mut opts = t.options(run_id, input, faults);
    opts.authority.http = http;
    t.run_with(&agent(FETCHER), &opts)
        .unwrap_or_else(|e| panic!("run {run_id}: {e:#}"))
}

fn outcome(report: &RunReport) -> String {
    String::from_utf8_lossy(&report.outcome).into_owned()
}

fn error_text(report: &RunReport) -> String {
    assert_eq!(report.status, RunStatus::Failed, "{}", outcome(report));
    outcome(report)
}

/// Each of the run's `steps` steps reached the server exactly once, as `POST` with
/// body `i`, carrying the committed key and token under `key_header`/`token_header`.
fn assert_each_step_once(
    server: &TestServer,
    db: &std::path::Path,
    run_id: &str,
    steps: u64,
    (key_header, token_header): (&str, &str),
) {
    let by_step = server.steps();
    assert_eq!(by_step.len() as u64, steps, "{by_step:#?}");
    let committed = committed(db, run_id);
    assert_eq!(committed.len() as u64, steps);
    for (i, seen) in by_step {
        assert_eq!(
            seen.len(),
            1,
            "step {i} reached the server {} times",
            seen.len()
        );
        let seen = &seen[0];
        assert_eq!(seen.method, "POST");
        assert_eq!(seen.body, i.to_string().into_bytes());
        let key = post_key(run_id, i);
        assert_eq!(seen.header(key_header), key, "step {i}");
        assert_eq!(seen.token(token_header), committed[&key], "step {i}");
    }
}

#[test]
fn each_step_reaches_the_server_once_with_its_key_and_token() {
    let server = TestServer::start();
    let t = TestHost::new();
    let input = json!({ "steps": 4, "url": server.url() });
    let report = run_fetcher(&t, "fetch", input, FaultPlan::default(), server.policy());
    assert_eq!(report.status, RunStatus::Completed, "{}", outcome(&report));
    assert_eq!(report.counts.executed, 4);

    assert_eq!(server.seen().len(), 4);
    assert_each_step_once(
        &server,
        &t.db(),
        "fetch",
        4,
        ("idempotency-key", "idempotency-token"),
    );
    let output: serde_json::Value = serde_json::from_slice(&report.outcome).unwrap();
    for i in 0..4 {
        assert_eq!(output["replies"][i]["status"], 200);
        assert_eq!(output["replies"][i]["body"], format!("POST /step/{i} ok"));
    }
}

#[test]
fn the_agent_may_rename_the_headers() {
    let server = TestServer::start();
    let t = TestHost::new();
    let input = json!({
        "steps": 2,
        "url": server.url(),
        "key_header": "X-Step-Key",
        "token_header": "X-Fence",
    });
    let report = run_fetcher(&t, "renamed", input, FaultPlan::default(), server.policy());
    assert_eq!(report.status, RunStatus::Completed, "{}", outcome(&report));
    assert_each_step_once(&server, &t.db(), "renamed", 2, ("x-step-key", "x-fence"));
    for seen in server.seen() {
        assert!(!seen.headers.contains_key("idempotency-key"), "{seen:?}");
        assert!(!seen.headers.contains_key("idempotency-token"), "{seen:?}");
    }

    // Names the host must refuse: the run fails with the reason, before any request.
    let input = json!({
        "steps": 1,
        "url": server.url(),
        "key_header": "Content-Length",
    });
    let report = run_fetcher(
        &t,
        "bad-names",
        input,
        FaultPlan::default(),
        server.policy(),
    );
    let error = error_text(&report);
    assert!(
        error.contains("header names refused") && error.contains("Content-Length"),
        "{error}"
    );
    assert_eq!(server.seen().len(), 2);
}

#[test]
fn a_destination_not_granted_is_refused_and_nothing_reaches_it() {
    let server = TestServer::start();
    let t = TestHost::new();
    let destination = format!("127.0.0.1:{}", server.port());
    let grants = [
        HttpPolicy::default(),
        HttpPolicy {
            // The right host on another port, and another host on every port.
            allow: vec![
                format!("127.0.0.1:{}", server.port().wrapping_add(1).max(1))
                    .parse()
                    .unwrap(),
                "localhost".parse().unwrap(),
            ],
            outside_claims: true,
        },
    ];
    for (n, http) in grants.into_iter().enumerate() {
        let run_id = format!("denied-{n}");
        let input = json!({ "steps": 2, "url": server.url() });
        let report = run_fetcher(&t, &run_id, input, FaultPlan::default(), http);
        let error = error_text(&report);
        // The agent's error names the one cause, as the host gave it (`last-denial`).
        assert!(
            error.contains(&format!(
                "HTTP request to {destination} denied: the destination is not granted to \
                 the run"
            )) && !error.contains("outside"),
            "{error}"
        );
        // The refused effect released its claim: nothing committed, retry possible.
        assert!(committed(&t.db(), &run_id).is_empty());
    }
    assert!(server.seen().is_empty(), "{:?}", server.seen());
}

#[test]
fn a_request_outside_a_claim_is_refused_unless_the_operator_allows_it() {
    let server = TestServer::start();
    let t = TestHost::new();
    let input = json!({ "steps": 2, "url": server.url(), "outside": true });

    let report = run_fetcher(
        &t,
        "outside",
        input.clone(),
        FaultPlan::default(),
        server.policy(),
    );
    let error = error_text(&report);
    let destination = format!("127.0.0.1:{}", server.port());
    assert!(
        error.contains(&format!(
            "HTTP request to {destination} denied: it was made outside any run-once claim"
        )) && !error.contains("not granted"),
        "{error}"
    );
    assert!(server.seen().is_empty(), "{:?}", server.seen());
    assert_eq!(report.counts.executed, 0);

    let allowed = HttpPolicy {
        outside_claims: true,
        ..server.policy()
    };
    let report = run_fetcher(&t, "outside-ok", input, FaultPlan::default(), allowed);
    assert_eq!(report.status, RunStatus::Completed, "{}", outcome(&report));
    let outside: Vec<Seen> = server
        .seen()
        .into_iter()
        .filter(|s| s.path == "/outside")
        .collect();
    assert_eq!(outside.len(), 1);
    // No claim, nothing to stamp.
    assert!(!outside[0].headers.contains_key("idempotency-key"));
    assert!(!outside[0].headers.contains_key("idempotency-token"));
    assert_each_step_once(
        &server,
        &t.db(),
        "outside-ok",
        2,
        ("idempotency-key", "idempotency-token"),
    );
}

#[test]
fn a_crash_in_the_effect_resends_the_step_with_the_same_key_and_a_higher_token() {
    let server = TestServer::start();
    let t = TestHost::new();
    let faults = FaultPlan {
        crash_at: vec![CrashPoint {
            phase: Phase::InEffect,
            step: 2,
        }],
        ..FaultPlan::default()
    };
    let input = json!({ "steps": 3, "url": server.url() });
    let report = run_fetcher(&t, "in-effect", input, faults, server.policy());
    assert_eq!(report.status, RunStatus::Completed, "{}", outcome(&report));
    assert_eq!(report.counts.reclaimed, 1);
    assert_eq!(report.counts.instances, 2);

    let by_step = server.steps();
    let committed = committed(&t.db(), "in-effect");
    assert_eq!(server.seen().len(), 4);
    for (i, seen) in &by_step {
        let key = post_key("in-effect", *i);
        let expected = if *i == 1 { 2 } else { 1 };
        assert_eq!(seen.len(), expected, "step {i}");
        for s in seen {
            assert_eq!(s.header("idempotency-key"), key, "step {i}");
        }
        let last = seen.last().unwrap();
        assert_eq!(last.token("idempotency-token"), committed[&key], "step {i}");
    }
    let retried = &by_step[&1];
    assert!(
        retried[1].token("idempotency-token") > retried[0].token("idempotency-token"),
        "{retried:#?}"
    );
}

#[test]
fn the_binary_grants_http_and_each_step_is_sent_once_across_recycles() {
    let server = TestServer::start();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("idem.db");
    let input = json!({ "steps": 5, "url": server.url() }).to_string();
    let grant = format!("127.0.0.1:{}", server.port());
    let out = run_cli(&[
        "run",
        FETCHER,
        "--db",
        db.to_str().unwrap(),
        "--run-id",
        "cli-fetch",
        "--input",
        &input,
        "--allow-http",
        "example.com:443",
        "--allow-http",
        &grant,
        "--recycle-every",
        "2",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(doc["status"], "completed");
    assert_eq!(doc["counts"]["executed"], 5);
    assert_eq!(doc["counts"]["instances"], 3);
    assert_eq!(server.seen().len(), 5);
    assert_each_step_once(
        &server,
        &db,
        "cli-fetch",
        5,
        ("idempotency-key", "idempotency-token"),
    );

    // Without the grant, the same agent reaches nothing, and says where it tried.
    let out = run_cli(&[
        "run",
        FETCHER,
        "--db",
        db.to_str().unwrap(),
        "--run-id",
        "cli-denied",
        "--input",
        &input,
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stdout(&out).contains(&grant), "{}", stdout(&out));
    assert!(stderr(&out).contains("not granted"), "{}", stderr(&out));
    assert_eq!(server.seen().len(), 5);
}

#[test]
fn the_binary_refuses_a_bad_destination() {
    for bad in ["http://127.0.0.1:80", "127.0.0.1:0", "::1", ""] {
        let out = run_cli(&["run", FETCHER, "--allow-http", bad]);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains("--allow-http") && err.contains("HOST[:PORT]"),
            "{err}"
        );
    }
}
