//! `idem serve`: the real binary serving a real store on loopback, called over real
//! HTTP — every endpoint, who may call it, what it refuses, the OpenAPI document against
//! the routes, and `/metrics` against the store while a worker drives runs.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use idem_test_artifacts::{FETCHER, STEPS};
use serde_json::{Value, json};

use crate::http::TestServer;
use crate::util::{CliDir, StderrLines, run_cli, stderr, stdout};

/// A running `idem serve`, stopped (SIGKILL, by its pid) when dropped.
pub struct Served {
    child: Child,
    pub addr: SocketAddr,
}

impl Served {
    /// `idem serve --db DB --listen 127.0.0.1:0 ARGS..`, once it listens.
    pub fn start(db: &str, args: &[&str]) -> Served {
        Served::start_on(db, "127.0.0.1:0", args)
    }

    pub fn start_on(db: &str, listen: &str, args: &[&str]) -> Served {
        let mut child = Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(["serve", "--db", db, "--listen", listen])
            .args(args)
            .env("IDEM_LOG", "warn")
            .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("idem starts");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let mut seen = String::new();
        let addr = loop {
            let Some(Ok(line)) = lines.next() else {
                let _ = child.kill();
                panic!("idem serve exited before listening: {seen}");
            };
            seen += &line;
            seen += "\n";
            if let Some(addr) = line.strip_prefix("idem serve: listening on http://") {
                break addr.parse().unwrap();
            }
        };
        // Keep reading, so that the server never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Served { child, addr }
    }

    pub fn get(&self, path: &str) -> Reply {
        request(self.addr, "GET", path, &[], b"")
    }

    pub fn post_json(&self, path: &str, token: Option<&str>, body: &Value) -> Reply {
        let auth = token.map(|t| format!("Bearer {t}"));
        let mut headers = vec![("Content-Type", "application/json")];
        if let Some(auth) = &auth {
            headers.push(("Authorization", auth));
        }
        request(
            self.addr,
            "POST",
            path,
            &headers,
            body.to_string().as_bytes(),
        )
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP response.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub content_type: String,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The error code of a refusal.
    pub fn code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or_else(|| panic!("no error code: {}", self.text()))
            .to_string()
    }
}

/// One HTTP/1.1 request on its own connection (`Connection: close`), read to the end.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Reply {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head += &format!("{name}: {value}\r\n");
    }
    head += "\r\n";
    stream.write_all(head.as_bytes()).unwrap();
    // A server may answer (413) and close before it has read a large body.
    let _ = stream.write_all(body);
    // Read until the response is whole: some servers (chromedriver) keep the
    // connection open whatever the request said.
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
        }
        if response_complete(&raw) {
            break;
        }
    }
    parse_response(&raw)
}

/// Whether `raw` holds a whole response: its headers and the body they announce.
fn response_complete(raw: &[u8]) -> bool {
    let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let body = &raw[split + 4..];
    for line in head.lines() {
        if let Some(n) = line.strip_prefix("content-length:") {
            return n.trim().parse::<usize>().is_ok_and(|n| body.len() >= n);
        }
        if line.starts_with("transfer-encoding:") && line.contains("chunked") {
            return body.ends_with(b"0\r\n\r\n");
        }
    }
    false
}

fn parse_response(raw: &[u8]) -> Reply {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end: {}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut body = raw[split + 4..].to_vec();
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let mut content_type = String::new();
    let mut chunked = false;
    for line in lines {
        let (name, value) = line.split_once(':').unwrap();
        match name.to_ascii_lowercase().as_str() {
            "content-type" => content_type = value.trim().to_string(),
            "transfer-encoding" => chunked = value.trim().eq_ignore_ascii_case("chunked"),
            _ => {}
        }
    }
    if chunked {
        body = dechunk(&body);
    }
    Reply {
        status,
        content_type,
        body,
    }
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = raw.windows(2).position(|w| w == b"\r\n").unwrap();
        let size = usize::from_str_radix(
            std::str::from_utf8(&raw[..line_end])
                .unwrap()
                .split(';')
                .next()
                .unwrap()
                .trim(),
            16,
        )
        .unwrap();
        raw = &raw[line_end + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&raw[..size]);
        raw = &raw[size + 2..];
    }
}

/// Polls `f` until it returns `Some`, for at most `limit`.
pub fn wait_for<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < limit, "gave up after {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Deploys the `steps` guest as `steps`, granted the dir's `data` folder as `/data`.
fn deploy_steps(cli: &CliDir) {
    let grant = format!("{}::/data", cli.data().display());
    let out = run_cli(&[
        "deploy",
        STEPS,
        "--name",
        "steps",
        "--db",
        &cli.db(),
        "--dir",
        &grant,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
}

/// A run of `steps` stopped in doubt in the foreground: policy `fail`, a crash inside
/// step 2's effect. Returns the parked key as the store keeps it.
pub fn park_a_run(cli: &CliDir, run_id: &str) -> String {
    let input = json!({ "steps": 5, "log": "/data/log.txt", "policy": "fail" }).to_string();
    let out = cli.run(STEPS, run_id, &input, &["--crash-at", "in-effect:3"]);
    assert_eq!(
        out.status.code(),
        Some(5),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let status = run_cli(&["status", "--db", &cli.db(), run_id, "--json"]);
    let doc: Value = serde_json::from_slice(&status.stdout).unwrap();
    doc["open_claims"][0]["key"].as_str().unwrap().to_string()
}

fn token_file(cli: &CliDir, token: &str) -> String {
    let path = cli.dir.path().join("token");
    std::fs::write(&path, format!("{token}\n")).unwrap();
    path.to_str().unwrap().to_string()
}

/// The path with each `{param}` filled with `x`.
fn filled(path: &str) -> String {
    path.split('/')
        .map(|p| if p.starts_with('{') { "x" } else { p })
        .collect::<Vec<_>>()
        .join("/")
}

#[test]
fn openapi_document_matches_the_routes() {
    let cli = CliDir::new();
    let served = Served::start(&cli.db(), &["--no-auth", "--no-cache"]);
    let doc = served.get("/openapi.json").json();
    assert_eq!(doc["openapi"], "3.1.0");
    let documented: BTreeSet<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, ops)| {
            ops.as_object()
                .unwrap()
                .keys()
                .map(move |m| (m.to_ascii_uppercase(), path.clone()))
        })
        .collect();
    let table: BTreeSet<(String, String)> = idem::serve::ROUTES
        .iter()
        .map(|r| (r.method.to_string(), r.path.to_string()))
        .collect();
    assert_eq!(documented, table);
    // Every documented route is answered by a handler of its own (never the router's
    // "no such route" or "method not allowed"), and a path that is not documented is not.
    for (method, path) in &documented {
        let reply = request(
            served.addr,
            method,
            &filled(path),
            &[("Content-Type", "application/json")],
            b"{}",
        );
        if reply.content_type.starts_with("application/json") && reply.status >= 400 {
            let code = reply.code();
            // `internal` is also what a route in the table without a handler answers.
            assert!(
                code != "not_found" && code != "method_not_allowed" && code != "internal",
                "{method} {path}: {}",
                reply.text()
            );
        }
    }
    assert_eq!(served.get("/api/nothing").code(), "not_found");
    let wrong_method = request(served.addr, "DELETE", "/api/runs", &[], b"");
    assert_eq!(wrong_method.status, 405);
    assert_eq!(wrong_method.code(), "method_not_allowed");
    // Every error code the API answers with is in the document.
    let codes = doc["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]
        ["enum"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(codes, idem::serve::CODES.len());
    // Child runs: the list's filter and the cancel's answer.
    let list = &doc["paths"]["/api/runs"]["get"]["parameters"];
    assert!(
        list.as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "parent"),
        "{list}"
    );
    let cancel = &doc["paths"]["/api/runs/{run_id}/cancel"]["post"]["responses"]["200"];
    assert_eq!(
        cancel["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/Cancelled"
    );
    let answer = &doc["components"]["schemas"]["Cancelled"];
    assert_eq!(answer["required"], json!(["cancelled", "descendants"]));
}

#[test]
fn api_runs_submit_list_show_signal_cancel() {
    let cli = CliDir::new();
    deploy_steps(&cli);
    let token = "tok-3f9a";
    let served = Served::start(
        &cli.db(),
        &["--token-file", &token_file(&cli, token), "--no-cache"],
    );
    let submit = |body: Value, token: Option<&str>| served.post_json("/api/runs", token, &body);
    let input = json!({ "steps": 2, "log": "/data/log.txt" });

    // Mutating without the token, or with a wrong one, is refused and changes nothing.
    let none = submit(
        json!({ "agent": "steps", "input": input, "run_id": "a" }),
        None,
    );
    assert_eq!((none.status, none.code().as_str()), (401, "unauthorized"));
    let wrong = submit(
        json!({ "agent": "steps", "input": input, "run_id": "a" }),
        Some("tok-3f9b"),
    );
    assert_eq!((wrong.status, wrong.code().as_str()), (401, "unauthorized"));
    assert_eq!(served.get("/api/runs").json()["runs"], json!([]));

    // Submitting is idempotent: the same id and input is the same run.
    let made = submit(
        json!({ "agent": "steps", "input": input, "run_id": "a" }),
        Some(token),
    );
    assert_eq!(made.status, 201, "{}", made.text());
    assert_eq!(made.json()["status"], "queued");
    let again = submit(
        json!({ "agent": "steps", "input": input, "run_id": "a" }),
        Some(token),
    );
    assert_eq!(again.status, 200);
    assert_eq!(again.json()["created"], false);
    let other = submit(
        json!({ "agent": "steps", "input": {"steps": 3}, "run_id": "a" }),
        Some(token),
    );
    assert_eq!(
        (other.status, other.code().as_str()),
        (409, "input_mismatch")
    );
    for id in ["b", "c"] {
        let r = submit(
            json!({ "agent": "steps", "input": input, "run_id": id }),
            Some(token),
        );
        assert_eq!(r.status, 201);
    }
    let unknown = submit(json!({ "agent": "nobody", "run_id": "d" }), Some(token));
    assert_eq!(
        (unknown.status, unknown.code().as_str()),
        (404, "unknown_deployment")
    );
    let bad_id = submit(json!({ "agent": "steps", "run_id": "" }), Some(token));
    assert_eq!(
        (bad_id.status, bad_id.code().as_str()),
        (400, "invalid_name")
    );

    // Listed newest first, filtered, paged.
    let all = served.get("/api/runs").json();
    let ids: Vec<&str> = all["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 3);
    let page1 = served.get("/api/runs?limit=2").json();
    assert_eq!(page1["runs"].as_array().unwrap().len(), 2);
    assert_eq!(page1["next_offset"], 2);
    let page2 = served.get("/api/runs?limit=2&offset=2").json();
    assert_eq!(page2["runs"].as_array().unwrap().len(), 1);
    assert_eq!(page2["next_offset"], Value::Null);
    assert_eq!(page2["runs"][0]["run_id"], ids[2]);
    assert_eq!(
        served.get("/api/runs?status=queued&agent=steps").json()["runs"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    assert_eq!(
        served.get("/api/runs?status=completed").json()["runs"],
        json!([])
    );
    assert_eq!(
        served.get("/api/runs?agent=other").json()["runs"],
        json!([])
    );
    assert_eq!(
        served.get("/api/runs?status=sideways").code(),
        "bad_request"
    );
    assert_eq!(served.get("/api/runs?limit=0").code(), "bad_request");
    assert_eq!(served.get("/api/runs?limit=x").code(), "bad_request");
    assert_eq!(
        served.get("/api/runs?offset=18446744073709551615").code(),
        "bad_request"
    );
    assert_eq!(served.get("/api/runs?colour=red").code(), "bad_request");

    // One run, as `idem show --json` has it, with its log.
    let shown = served.get("/api/runs/a").json();
    let cli_show = run_cli(&["show", "a", "--db", &cli.db(), "--json"]);
    let cli_doc: Value = serde_json::from_slice(&cli_show.stdout).unwrap();
    assert_eq!(shown["run"], cli_doc["run"]);
    assert_eq!(shown["steps"], json!([]));
    assert_eq!(shown["log"], "");
    let missing = served.get("/api/runs/nope");
    assert_eq!(
        (missing.status, missing.code().as_str()),
        (404, "unknown_run")
    );

    // Signals: kept for a run that does not wait yet; refused for an unknown run or a
    // bad name; the token is needed.
    let sig = served.post_json(
        "/api/runs/a/signal",
        Some(token),
        &json!({ "name": "go", "payload": {"n": 1} }),
    );
    assert_eq!(sig.status, 200, "{}", sig.text());
    assert_eq!(sig.json()["woke"], false);
    let sig = served.post_json(
        "/api/runs/nope/signal",
        Some(token),
        &json!({ "name": "go" }),
    );
    assert_eq!((sig.status, sig.code().as_str()), (404, "unknown_run"));
    let sig = served.post_json("/api/runs/a/signal", Some(token), &json!({ "name": "" }));
    assert_eq!((sig.status, sig.code().as_str()), (400, "signal_refused"));
    let sig = served.post_json("/api/runs/a/signal", None, &json!({ "name": "go" }));
    assert_eq!(sig.status, 401);

    // Cancel: at once (no worker holds it); a second time, the run is finished.
    let cancel = served.post_json("/api/runs/b/cancel", None, &json!({}));
    assert_eq!(cancel.status, 401);
    let cancel = served.post_json("/api/runs/b/cancel", Some(token), &json!({}));
    assert_eq!(
        cancel.json(),
        json!({ "cancelled": "now", "descendants": [] })
    );
    assert_eq!(
        served.get("/api/runs/b").json()["run"]["status"],
        "cancelled"
    );
    let cancel = served.post_json("/api/runs/b/cancel", Some(token), &json!({}));
    assert_eq!(
        (cancel.status, cancel.code().as_str()),
        (409, "run_finished")
    );
    let cancel = served.post_json("/api/runs/nope/cancel", Some(token), &json!({}));
    assert_eq!(
        (cancel.status, cancel.code().as_str()),
        (404, "unknown_run")
    );
    let status = run_cli(&["show", "b", "--db", &cli.db(), "--json"]);
    let doc: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(doc["run"]["status"], "cancelled", "the store has it too");

    // Retention: the token is needed; bad ages and fields are refused; a dry run counts
    // the cancelled run and deletes nothing; gc deletes it and only it.
    std::thread::sleep(Duration::from_millis(5));
    let now = json!({ "finished_before": "0s", "dedupe_window": "0s" });
    let gc = served.post_json("/api/gc", None, &now);
    assert_eq!(gc.status, 401);
    let gc = served.post_json("/api/gc", Some(token), &json!({ "finished_before": "7" }));
    assert_eq!((gc.status, gc.code().as_str()), (400, "bad_request"));
    assert!(gc.text().contains("not a length of time"), "{}", gc.text());
    let gc = served.post_json("/api/gc", Some(token), &json!({ "older": "7d" }));
    assert_eq!((gc.status, gc.code().as_str()), (400, "malformed_json"));
    let mut dry = now.clone();
    dry["dry_run"] = json!(true);
    let dry = served.post_json("/api/gc", Some(token), &dry);
    assert_eq!(dry.status, 200, "{}", dry.text());
    assert_eq!(dry.json()["dry_run"], true);
    assert_eq!(dry.json()["report"]["runs"], 1);
    assert_eq!(served.get("/api/runs/b").status, 200);
    let done = served.post_json("/api/gc", Some(token), &now);
    assert_eq!(done.status, 200, "{}", done.text());
    for field in [
        "runs",
        "results",
        "claims",
        "checkpoints",
        "log_chunks",
        "components",
    ] {
        assert_eq!(
            done.json()["report"][field],
            dry.json()["report"][field],
            "{field}"
        );
    }
    assert_eq!(served.get("/api/runs/b").status, 404);
    assert_eq!(served.get("/api/runs/a").status, 200, "a queued run stays");
}

#[test]
fn api_refuses_malformed_oversized_and_cross_site_requests() {
    let cli = CliDir::new();
    let served = Served::start(
        &cli.db(),
        &["--no-auth", "--no-cache", "--max-body", "1KiB"],
    );
    let post = |path: &str, headers: &[(&str, &str)], body: &[u8]| {
        request(served.addr, "POST", path, headers, body)
    };
    let json_ct = [("Content-Type", "application/json")];
    for path in ["/api/runs", "/api/runs/a/signal", "/api/runs/a/resolve"] {
        let r = post(path, &json_ct, b"{");
        assert_eq!(
            (r.status, r.code().as_str()),
            (400, "malformed_json"),
            "{path}"
        );
        assert!(
            r.json()["error"]["message"]
                .as_str()
                .unwrap()
                .contains("EOF"),
            "{}",
            r.text()
        );
        let r = post(path, &json_ct, b"[1,2]");
        assert_eq!(
            (r.status, r.code().as_str()),
            (400, "malformed_json"),
            "{path}"
        );
        let r = post(path, &[("Content-Type", "text/plain")], b"{}");
        assert_eq!(
            (r.status, r.code().as_str()),
            (415, "unsupported_media_type"),
            "{path}"
        );
        let big = format!("{{\"agent\":\"{}\"}}", "x".repeat(2000));
        let r = post(path, &json_ct, big.as_bytes());
        assert_eq!(
            (r.status, r.code().as_str()),
            (413, "body_too_large"),
            "{path}"
        );
    }
    let r = post("/api/runs", &json_ct, b"{\"agent\":\"x\",\"colour\":1}");
    assert_eq!(r.code(), "malformed_json");
    assert!(r.text().contains("colour"), "{}", r.text());
    let r = post("/api/runs", &json_ct, b"{\"agent\":\"x\",\"input\":1}");
    assert_eq!((r.status, r.code().as_str()), (404, "unknown_deployment"));

    // A browser posting from another site is refused even without auth.
    let cross = [
        ("Content-Type", "application/json"),
        ("Origin", "http://evil.example"),
    ];
    let r = post("/api/runs/a/cancel", &cross, b"{}");
    assert_eq!((r.status, r.code().as_str()), (403, "forbidden"));
    let r = post(
        "/api/runs/a/cancel",
        &[("Sec-Fetch-Site", "cross-site")],
        b"",
    );
    assert_eq!((r.status, r.code().as_str()), (403, "forbidden"));
    let r = post("/api/runs/a/cancel", &[], b"");
    assert_eq!((r.status, r.code().as_str()), (404, "unknown_run"));
}

#[test]
fn api_deploys_components_from_the_body() {
    let cli = CliDir::new();
    let token = "deploy-tok";
    let served = Served::start(
        &cli.db(),
        &["--token-file", &token_file(&cli, token), "--no-cache"],
    );
    let wasm = std::fs::read(STEPS).unwrap();
    let auth = format!("Bearer {token}");
    let deploy = |path: &str, headers: &[(&str, &str)], body: &[u8]| {
        request(served.addr, "POST", path, headers, body)
    };
    let good = [
        ("Content-Type", "application/wasm"),
        ("Authorization", auth.as_str()),
    ];
    let r = deploy(
        "/api/deployments?name=steps",
        &[("Content-Type", "application/wasm")],
        &wasm,
    );
    assert_eq!((r.status, r.code().as_str()), (401, "unauthorized"));
    let r = deploy("/api/deployments?name=steps", &good, &wasm);
    assert_eq!(r.status, 200, "{}", r.text());
    let doc = r.json();
    assert_eq!(doc["new_component"], true);
    assert_eq!(doc["name"], "steps");
    let r = deploy("/api/deployments?name=steps-again", &good, &wasm);
    assert_eq!(r.json()["new_component"], false);
    assert_eq!(r.json()["digest"], doc["digest"]);
    let listed = served.get("/api/deployments").json();
    assert_eq!(listed["deployments"].as_array().unwrap().len(), 2);
    // The store has them as `idem deploy` would have made them: submit works on them.
    let out = run_cli(&[
        "submit",
        "steps-again",
        "--db",
        &cli.db(),
        "--run-id",
        "r1",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));

    let r = deploy("/api/deployments", &good, &wasm);
    assert_eq!((r.status, r.code().as_str()), (400, "bad_request"));
    let r = deploy("/api/deployments?name=bad/name", &good, &wasm);
    assert_eq!((r.status, r.code().as_str()), (400, "invalid_name"));
    let r = deploy("/api/deployments?name=junk", &good, b"not wasm at all");
    assert_eq!((r.status, r.code().as_str()), (400, "invalid_component"));
    let json_ct = [
        ("Content-Type", "application/json"),
        ("Authorization", auth.as_str()),
    ];
    let r = deploy("/api/deployments?name=junk", &json_ct, &wasm);
    assert_eq!(
        (r.status, r.code().as_str()),
        (415, "unsupported_media_type")
    );
    assert_eq!(
        served.get("/api/deployments").json()["deployments"]
            .as_array()
            .unwrap()
            .len(),
        2,
        "nothing refused was deployed"
    );
}

#[test]
fn api_resolves_parked_keys() {
    let cli = CliDir::new();
    let key = park_a_run(&cli, "wire");
    let token = "res-tok";
    let served = Served::start(
        &cli.db(),
        &["--token-file", &token_file(&cli, token), "--no-cache"],
    );
    let shown = served.get("/api/runs/wire").json();
    assert_eq!(shown["run"]["status"], "in-doubt");
    let parked: Vec<&Value> = shown["open_claims"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["parked"].is_string())
        .collect();
    assert_eq!(parked.len(), 1);
    assert_eq!(parked[0]["key"], key.as_str());

    let resolve =
        |body: Value, token: Option<&str>| served.post_json("/api/runs/wire/resolve", token, &body);
    let r = resolve(json!({ "key": key, "retry": true }), None);
    assert_eq!((r.status, r.code().as_str()), (401, "unauthorized"));
    let r = resolve(
        json!({ "key": key, "retry": true, "result": 1 }),
        Some(token),
    );
    assert_eq!((r.status, r.code().as_str()), (400, "bad_request"));
    let r = resolve(json!({ "key": key }), Some(token));
    assert_eq!((r.status, r.code().as_str()), (400, "bad_request"));
    let r = resolve(
        json!({ "key": "steps:elsewhere", "retry": true }),
        Some(token),
    );
    assert_eq!((r.status, r.code().as_str()), (409, "not_parked"));
    assert!(r.text().contains("its parked keys"), "{}", r.text());
    let r = served.post_json(
        "/api/runs/nope/resolve",
        Some(token),
        &json!({ "key": key, "retry": true }),
    );
    assert_eq!((r.status, r.code().as_str()), (404, "unknown_run"));
    assert_eq!(
        served.get("/api/runs/wire").json()["run"]["status"],
        "in-doubt"
    );

    // The agent's own name for the key works too (without the namespace).
    let agent_key = key.split_once(':').unwrap().1;
    let r = resolve(json!({ "key": agent_key, "retry": true }), Some(token));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({ "key": key, "status": "running" }));
    let r = resolve(json!({ "key": key, "retry": true }), Some(token));
    assert_eq!(r.code(), "not_parked", "settled once");
    // Resumed in the foreground, the run completes: the retried effect ran again.
    let input = json!({ "steps": 5, "log": "/data/log.txt", "policy": "fail" }).to_string();
    let out = cli.run(STEPS, "wire", &input, &[]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let lines = crate::util::read_log(&cli.data().join("log.txt"));
    assert_eq!(lines.len(), 6, "five effects, the one in doubt twice");

    // Its timeline: one start per instance the run counts, each under a lease token
    // and a holder; the end last.
    let run = served.get("/api/runs/wire").json()["run"].clone();
    let timeline = served.get("/api/runs/wire/events").json();
    let events = timeline["events"].as_array().unwrap();
    let starts: Vec<&Value> = events.iter().filter(|e| e["kind"] == "started").collect();
    assert_eq!(
        starts.len() as u64,
        run["counts"]["instances"].as_u64().unwrap(),
        "{timeline}"
    );
    assert!(
        starts
            .iter()
            .all(|e| e["holder"].is_string() && e["token"].is_u64()),
        "{timeline}"
    );
    let last = events.last().unwrap();
    assert_eq!(last["kind"], "finished", "{timeline}");
    assert_eq!(last["detail"]["status"], "completed");
    assert!(last["summary"].as_str().unwrap().contains("completed"));
    // The retried step, opened: its result, its second attempt, the run's checkpoint;
    // by either name of its key (the store's, percent-encoded).
    for name in [percent_encoded(agent_key), percent_encoded(&key)] {
        let step = served.get(&format!("/api/runs/wire/steps/{name}"));
        assert_eq!(step.status, 200, "{}", step.text());
        let step = step.json();
        assert_eq!(step["step"]["key"], key.as_str());
        assert!(step["step"]["attempt"].as_u64().unwrap() >= 2, "{step}");
        assert_eq!(step["retaken"], true);
        assert!(step["result_bytes"].as_u64().unwrap() > 0, "{step}");
        assert!(step["claimed_in"]["kind"] == "started", "{step}");
        assert!(step["checkpoint"]["step"].as_u64().unwrap() >= 1, "{step}");
    }
    // Bad input: typed refusals.
    let r = served.get("/api/runs/nope/events");
    assert_eq!((r.status, r.code().as_str()), (404, "unknown_run"));
    let r = served.get("/api/runs/nope/steps/x");
    assert_eq!((r.status, r.code().as_str()), (404, "unknown_run"));
    let r = served.get("/api/runs/wire/steps/no-such-step");
    assert_eq!((r.status, r.code().as_str()), (404, "unknown_step"));
    assert!(r.text().contains("has no step"), "{}", r.text());
}

/// `text` with everything but unreserved characters percent-encoded, as a browser's
/// `encodeURIComponent` sends a path segment.
pub(crate) fn percent_encoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn serve_refuses_unsafe_setups() {
    let cli = CliDir::new();
    let out = run_cli(&["serve", "--db", &cli.db(), "--listen", "0.0.0.0:0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--token-file"), "{}", stderr(&out));
    let tf = token_file(&cli, "t0k");
    let out = run_cli(&[
        "serve",
        "--db",
        &cli.db(),
        "--listen",
        "0.0.0.0:0",
        "--no-auth",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let empty = cli.dir.path().join("empty");
    std::fs::write(&empty, "\n").unwrap();
    let out = run_cli(&[
        "serve",
        "--db",
        &cli.db(),
        "--token-file",
        empty.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("empty"), "{}", stderr(&out));

    // Off loopback with a token: every request for data needs it (called over
    // loopback here); the page's own files do not.
    let served = Served::start_on(&cli.db(), "0.0.0.0:0", &["--token-file", &tf, "--no-cache"]);
    let addr = SocketAddr::from(([127, 0, 0, 1], served.addr.port()));
    for path in [
        "/api/runs",
        "/api/runs/x",
        "/api/runs/x/stream",
        "/metrics",
        "/openapi.json",
        "/api/deployments",
    ] {
        let r = request(addr, "GET", path, &[], b"");
        assert_eq!(
            (r.status, r.code().as_str()),
            (401, "unauthorized"),
            "{path}"
        );
        let r = request(addr, "GET", path, &[("Authorization", "Bearer t0k")], b"");
        assert_ne!(r.status, 401, "{path}");
    }
    assert_eq!(request(addr, "GET", "/", &[], b"").status, 200);
    assert_eq!(request(addr, "GET", "/assets/app.js", &[], b"").status, 200);

    // Loopback without a token and without --no-auth: reads only.
    let local = Served::start(&cli.db(), &["--no-cache"]);
    assert_eq!(local.get("/api/runs").status, 200);
    let r = local.post_json("/api/runs/x/cancel", Some("anything"), &json!({}));
    assert_eq!((r.status, r.code().as_str()), (403, "forbidden"));
}

/// The metrics' counters, by name (labels included), from the text format.
pub(crate) fn scrape(served: &Served) -> std::collections::BTreeMap<String, f64> {
    let r = served.get("/metrics");
    assert_eq!(r.status, 200);
    assert!(
        r.content_type.starts_with("application/openmetrics-text"),
        "{}",
        r.content_type
    );
    let text = r.text();
    assert!(text.ends_with("# EOF\n"), "{text}");
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let (name, value) = l.rsplit_once(' ').unwrap();
            (name.to_string(), value.parse().unwrap())
        })
        .collect()
}

#[test]
fn metrics_agree_with_the_store_during_and_after_runs() {
    let cli = CliDir::new();
    deploy_steps(&cli);
    let served = Served::start(
        &cli.db(),
        &["--no-auth", "--no-cache", "--worker", "--poll", "50ms"],
    );
    // Three runs whose effects each sleep 150 ms: leased while the scrape happens.
    for id in ["m1", "m2", "m3"] {
        let input = json!({ "steps": 4, "log": format!("/data/{id}.txt"), "pause_ms": 150 });
        let r = served.post_json(
            "/api/runs",
            None,
            &json!({ "agent": "steps", "input": input, "run_id": id }),
        );
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let during = wait_for(Duration::from_secs(60), || {
        let m = scrape(&served);
        (m["idem_leases_held"] >= 1.0 && m["idem_steps_executed_total"] >= 1.0).then_some(m)
    });
    let running = during["idem_runs{status=\"running\"}"];
    assert!(running >= 1.0, "{during:?}");
    assert_eq!(
        during["idem_runs{status=\"queued\"}"]
            + running
            + during["idem_runs{status=\"completed\"}"],
        3.0
    );
    wait_for(Duration::from_secs(60), || {
        let runs = served.get("/api/runs?status=completed").json();
        (runs["runs"].as_array().unwrap().len() == 3).then_some(())
    });
    let after = scrape(&served);
    // Against the store, read by `idem status` (not by the server).
    let status = run_cli(&["status", "--db", &cli.db(), "--json"]);
    let doc: Value = serde_json::from_slice(&status.stdout).unwrap();
    let runs = doc["runs"].as_array().unwrap();
    let sum = |field: &str| {
        runs.iter()
            .map(|r| r["counts"][field].as_u64().unwrap())
            .sum::<u64>() as f64
    };
    assert_eq!(after["idem_steps_executed_total"], sum("executed"));
    assert_eq!(
        after["idem_steps_executed_total"], 12.0,
        "four effects in each of three runs"
    );
    assert_eq!(after["idem_steps_skipped_total"], sum("skipped"));
    assert_eq!(after["idem_steps_awaited_total"], sum("awaited"));
    assert_eq!(after["idem_steps_reclaimed_total"], sum("reclaimed"));
    assert_eq!(after["idem_instances_created_total"], sum("instances"));
    assert_eq!(after["idem_runs{status=\"completed\"}"], 3.0);
    assert_eq!(after["idem_leases_held"], 0.0);
    assert_eq!(after["idem_worker_queue_depth"], 0.0);
    assert_eq!(after["idem_in_doubt_keys"], 0.0);
    // One latency per committed step, each at least the effect's 150 ms sleep.
    assert_eq!(after["idem_durable_step_seconds_count"], 12.0);
    assert_eq!(after["idem_durable_step_seconds_bucket{le=\"0.128\"}"], 0.0);
    assert_eq!(after["idem_durable_step_seconds_bucket{le=\"+Inf\"}"], 12.0);
    assert!(after["idem_durable_step_seconds_sum"] >= 12.0 * 0.15);
    // Each effect ran once: four lines in each run's log.
    for id in ["m1", "m2", "m3"] {
        let lines = crate::util::read_log(&cli.data().join(format!("{id}.txt")));
        assert_eq!(lines.len(), 4, "{id}");
    }
    assert_eq!(after["idem_instances_recycled_total"], 0.0);

    // A run the host recycles: each instance it dropped and replaced is counted in the
    // store, and the server reports the store's sum.
    let input = json!({ "steps": 4, "log": "/data/rec.txt" }).to_string();
    let out = cli.run(STEPS, "rec", &input, &["--recycle-every", "2", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let recycled = doc["counts"]["recycled"].as_u64().unwrap();
    assert!(recycled >= 1, "{doc}");
    assert_eq!(recycled + 1, doc["counts"]["instances"].as_u64().unwrap());
    let m = scrape(&served);
    let status = run_cli(&["status", "--db", &cli.db(), "--json"]);
    let doc: Value = serde_json::from_slice(&status.stdout).unwrap();
    let in_store: u64 = doc["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["counts"]["recycled"].as_u64().unwrap())
        .sum();
    assert_eq!(in_store, recycled);
    assert_eq!(m["idem_instances_recycled_total"], recycled as f64);
    assert_eq!(
        m["idem_instances_created_total"],
        after["idem_instances_created_total"] + (recycled + 1) as f64
    );

    // A parked key shows as in doubt.
    let parked = CliDir::new();
    park_a_run(&parked, "wire");
    let served = Served::start(&parked.db(), &["--no-auth", "--no-cache"]);
    let m = scrape(&served);
    assert_eq!(m["idem_in_doubt_keys"], 1.0);
    assert_eq!(m["idem_runs{status=\"in-doubt\"}"], 1.0);
}

/// Submits a `fanout` parent of `n` children (each pausing `pause_ms` in its claim)
/// through the API of `served`, whose worker drives it.
pub(crate) fn submit_parent(served: &Served, server: &TestServer, n: u32, pause_ms: u64) {
    let input = json!({ "deployment": "fetcher", "children": n, "url": server.url(),
                        "pause_ms": pause_ms });
    let r = served.post_json(
        "/api/runs",
        None,
        &json!({ "agent": "fanout", "input": input, "run_id": "parent" }),
    );
    assert_eq!(r.status, 201, "{}", r.text());
}

/// Waits until the API says run `run_id` completed.
pub(crate) fn until_completed(served: &Served, run_id: &str) -> Value {
    wait_for(Duration::from_secs(120), || {
        let doc = served.get(&format!("/api/runs/{run_id}")).json();
        let status = doc["run"]["status"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            matches!(status.as_str(), "queued" | "running" | "completed"),
            "{doc}"
        );
        (status == "completed").then_some(doc)
    })
}

#[test]
fn metrics_count_spawns_and_joins() {
    let server = TestServer::start();
    let service = crate::workers::Service::new();
    crate::children::deploy(&service, &server, &[]);
    let served = Served::start(
        &service.db(),
        &["--no-auth", "--no-cache", "--worker", "--poll", "50ms"],
    );
    let before = scrape(&served);
    assert_eq!(before["idem_spawns_total"], 0.0);
    assert_eq!(before["idem_joins_waiting"], 0.0);
    // Each child holds its claim 2 s after its request: the parent waits in its join
    // meanwhile.
    submit_parent(&served, &server, 3, 2_000);
    let during = wait_for(Duration::from_secs(60), || {
        let m = scrape(&served);
        (m["idem_joins_waiting"] == 1.0).then_some(m)
    });
    assert_eq!(during["idem_spawns_total"], 3.0, "{during:?}");
    let children: f64 = STATUSES
        .iter()
        .map(|s| during[&format!("idem_child_runs{{status=\"{s}\"}}")])
        .sum();
    assert_eq!(children, 3.0, "{during:?}");
    assert!(
        during["idem_child_runs{status=\"completed\"}"] < 3.0,
        "the parent waits while a child has not ended: {during:?}"
    );
    assert_eq!(during["idem_joins_ended_total{outcome=\"joined\"}"], 0.0);

    until_completed(&served, "parent");
    let after = scrape(&served);
    assert_eq!(
        after["idem_spawns_total"], 3.0,
        "spawned once each: {after:?}"
    );
    assert_eq!(after["idem_child_runs{status=\"completed\"}"], 3.0);
    assert_eq!(after["idem_child_runs{status=\"running\"}"], 0.0);
    assert_eq!(
        after["idem_runs{status=\"completed\"}"], 4.0,
        "three children and the parent"
    );
    assert_eq!(after["idem_joins_waiting"], 0.0);
    assert_eq!(after["idem_joins_ended_total{outcome=\"joined\"}"], 1.0);
    assert_eq!(after["idem_joins_ended_total{outcome=\"timed-out\"}"], 0.0);
    assert_eq!(server.seen().len(), 3, "each child's request once");
}

const STATUSES: [&str; 6] = [
    "queued",
    "running",
    "completed",
    "failed",
    "in-doubt",
    "cancelled",
];

#[test]
fn the_api_alone_deploys_submits_and_sees_a_run_complete_on_postgres() {
    let Some(schema) = crate::postgres::Schema::create("serve") else {
        return;
    };
    let url = schema.url();
    let served = Served::start(
        &url,
        &["--no-auth", "--no-cache", "--worker", "--poll", "50ms"],
    );
    let wasm = std::fs::read(idem_test_artifacts::HOSTILE).unwrap();
    let r = request(
        served.addr,
        "POST",
        "/api/deployments?name=talker",
        &[("Content-Type", "application/wasm")],
        &wasm,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let input = json!({ "mode": "say", "text": "hi from postgres" });
    let r = served.post_json(
        "/api/runs",
        None,
        &json!({ "agent": "talker", "input": input, "run_id": "pg-1" }),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let run = wait_for(Duration::from_secs(60), || {
        let run = served.get("/api/runs/pg-1").json();
        (run["run"]["status"] == "completed").then_some(run)
    });
    assert_eq!(run["outcome"], "hi from postgres");
    assert!(
        run["log"].as_str().unwrap().contains("hi from postgres"),
        "{run}"
    );
    // What the database holds, read by a client other than idem.
    assert_eq!(
        crate::postgres::count(&url, "SELECT count(*) FROM runs WHERE status = 'completed'"),
        1
    );
    assert_eq!(scrape(&served)["idem_runs{status=\"completed\"}"], 1.0);
}

#[test]
fn a_client_slow_to_send_its_headers_is_cut_off() {
    let cli = CliDir::new();
    let served = Served::start(
        &cli.db(),
        &["--no-auth", "--no-cache", "--header-read-timeout", "1s"],
    );
    let started = Instant::now();
    // Half a request line, then nothing; and a connection that sends nothing at all.
    let mut slow = TcpStream::connect(served.addr).unwrap();
    slow.write_all(b"GET /api/ru").unwrap();
    let mut silent = TcpStream::connect(served.addr).unwrap();
    // Meanwhile a whole request on another connection is answered.
    assert_eq!(served.get("/api/runs").status, 200);
    for (name, conn) in [("slow", &mut slow), ("silent", &mut silent)] {
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut answer = Vec::new();
        match conn.read_to_end(&mut answer) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("{name}: the connection was not closed: {e}"),
        }
        let text = String::from_utf8_lossy(&answer);
        assert!(!text.contains("200 OK"), "{name}: {text}");
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "closed after {took:?}, the bound is 1 s"
    );
    assert_eq!(served.get("/api/runs").status, 200, "the server serves on");
}

/// `idem serve --worker` as a child whose stderr the test reads.
fn spawn_serve(db: &str) -> (Child, StderrLines) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["serve", "--db", db, "--listen", "127.0.0.1:0", "--worker"])
        .args(["--poll", "20ms"])
        .env("IDEM_LOG", "error")
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("idem starts");
    let said = StderrLines::of(&mut child);
    said.wait_for("idem serve: listening on", Duration::from_secs(60));
    (child, said)
}

fn sigterm(child: &Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// SIGTERM stops the server, its worker drained, and exits 0; a second one, while the
/// worker waits for a side effect in flight, exits at once with 130.
#[test]
fn sigterm_stops_serve_and_a_second_exits_at_once() {
    let cli = CliDir::new();
    let (idle, said) = spawn_serve(&cli.db());
    sigterm(&idle);
    let status = wait_exit(idle, Duration::from_secs(60));
    let rest = said.rest();
    assert_eq!(status.code(), Some(0), "{rest}");
    assert!(rest.contains("idem serve: stopping"), "{rest}");
    assert!(rest.contains("stopped: 0 runs finished"), "{rest}");

    let server = TestServer::start();
    let grant = format!("127.0.0.1:{}", server.port());
    let db = cli.db();
    let deploy = run_cli(&[
        "deploy",
        FETCHER,
        "--name",
        "fetcher",
        "--allow-http",
        &grant,
        "--db",
        &db,
    ]);
    assert!(deploy.status.success(), "{}", stderr(&deploy));
    // A minute inside the effect, after its request: a drain would wait for it.
    let input = json!({ "steps": 1, "url": server.url(), "pause_ms": 60_000, "pause_after": true });
    let input = input.to_string();
    let submit = run_cli(&["submit", "fetcher", "--input", &input, "--db", &db]);
    assert!(submit.status.success(), "{}", stderr(&submit));
    let (busy, said) = spawn_serve(&db);
    wait_for(Duration::from_secs(60), || {
        (!server.seen().is_empty()).then_some(())
    });
    sigterm(&busy);
    said.wait_for("idem serve: stopping", Duration::from_secs(30));
    sigterm(&busy);
    let status = wait_exit(busy, Duration::from_secs(30));
    let rest = said.rest();
    assert_eq!(status.code(), Some(130), "{rest}");
    assert!(rest.contains("idem serve: exiting at once"), "{rest}");
}

/// Waits for `child` to exit; kills it and panics after `limit`.
fn wait_exit(mut child: Child, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn api_runs_batch_queues_many_and_answers_each() {
    let cli = CliDir::new();
    deploy_steps(&cli);
    let token = "tok-batch";
    let served = Served::start(&cli.db(), &["--token-file", &token_file(&cli, token)]);
    let input = json!({ "steps": 1, "log": "/data/log.txt" });
    served.post_json(
        "/api/runs",
        Some(token),
        &json!({ "agent": "steps", "input": input, "run_id": "taken" }),
    );
    let runs = json!([
        { "input": input, "run_id": "b1" },
        { "input": input, "run_id": "taken" },
        { "input": {"steps": 9}, "run_id": "taken" },
        { "input": input, "run_id": "" },
        { "input": input, "run_id": "b2", "priority": 3 },
    ]);
    let r = served.post_json(
        "/api/runs/batch",
        Some(token),
        &json!({ "agent": "steps", "runs": runs }),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let answers = r.json()["runs"].as_array().unwrap().clone();
    assert_eq!(answers.len(), 5);
    assert_eq!(
        (
            answers[0]["run_id"].as_str(),
            answers[0]["created"].as_bool()
        ),
        (Some("b1"), Some(true))
    );
    assert_eq!(answers[1]["created"], false);
    assert_eq!(answers[2]["error"]["code"], "input_mismatch");
    assert_eq!(answers[3]["error"]["code"], "invalid_name");
    assert_eq!(answers[4]["status"], "queued");
    let listed = served.get("/api/runs").json();
    assert_eq!(listed["runs"].as_array().unwrap().len(), 3, "taken, b1, b2");

    // The batch as a whole: refused with nothing queued.
    for (body, code) in [
        (json!({ "agent": "steps", "runs": [] }), "bad_request"),
        (
            json!({ "agent": "nobody", "runs": [{ "input": 1 }] }),
            "unknown_deployment",
        ),
        (
            json!({ "agent": "steps", "runs": [{ "input": 1, "colour": 2 }] }),
            "malformed_json",
        ),
    ] {
        let r = served.post_json("/api/runs/batch", Some(token), &body);
        assert_eq!(r.code(), code, "{body}: {}", r.text());
    }
    let none = served.post_json(
        "/api/runs/batch",
        None,
        &json!({ "agent": "steps", "runs": [{ "input": 1 }] }),
    );
    assert_eq!(none.status, 401);
    assert_eq!(
        served.get("/api/runs").json()["runs"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
}

#[test]
fn api_and_metrics_cover_rate_limits() {
    let cli = CliDir::new();
    deploy_steps(&cli);
    let token = "tok-rates";
    let served = Served::start(&cli.db(), &["--token-file", &token_file(&cli, token)]);
    assert_eq!(served.get("/api/rates").json()["limits"], json!([]));
    let set = |body: Value| served.post_json("/api/rates", Some(token), &body);
    let r = set(json!({ "class": "llm", "limit": 120 }));
    assert_eq!(r.status, 200, "{}", r.text());
    let limit = &r.json()["limit"];
    assert_eq!(
        (
            &limit["class"],
            &limit["limit"],
            &limit["period_ms"],
            &limit["burst"]
        ),
        (&json!("llm"), &json!(120), &json!(60_000), &json!(1))
    );
    let r = set(json!({ "class": "search", "limit": 5, "period_ms": 1000, "burst": 5 }));
    assert_eq!(r.status, 200, "{}", r.text());
    // Refused, and nothing changed.
    for body in [
        json!({ "class": "llm", "limit": 0 }),
        json!({ "class": "llm", "limit": 5, "period_ms": 0 }),
        json!({ "class": "", "limit": 5 }),
    ] {
        let r = set(body.clone());
        assert_eq!(
            (r.status, r.code().as_str()),
            (400, "rate_refused"),
            "{body}"
        );
    }
    let none = served.post_json("/api/rates", None, &json!({ "class": "x", "limit": 1 }));
    assert_eq!(none.status, 401);
    let listed = served.get("/api/rates").json();
    let classes: Vec<&str> = listed["limits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["class"].as_str().unwrap())
        .collect();
    assert_eq!(classes, ["llm", "search"]);
    assert_eq!(listed["limits"][0]["limit"], 120);

    let metrics = scrape(&served);
    assert_eq!(metrics["idem_rate_limit_per_second{class=\"llm\"}"], 2.0);
    assert_eq!(metrics["idem_rate_limit_per_second{class=\"search\"}"], 5.0);
    assert_eq!(
        metrics["idem_rate_reserved_ahead_seconds{class=\"llm\"}"],
        0.0
    );

    let r = served.post_json("/api/rates/search/clear", Some(token), &json!({}));
    assert_eq!(r.json()["cleared"], true);
    let r = served.post_json("/api/rates/search/clear", Some(token), &json!({}));
    assert_eq!(r.json()["cleared"], false);
    assert_eq!(
        served.get("/api/rates").json()["limits"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert!(!scrape(&served).contains_key("idem_rate_limit_per_second{class=\"search\"}"));
}
