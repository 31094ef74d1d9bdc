//! The web page in a real headless Chromium, driven over WebDriver by Debian's
//! `chromedriver`: the runs list, a run parked in doubt, its **Retry** button, and the
//! run completing once the worker in `idem serve --worker` resumes it; a parent run
//! with its children, each a link, and a child's link back to its parent. Screenshots go to
//! `target/browser/`.
//!
//! Without `chromium` and `chromedriver` the test says so and passes, unless
//! `IDEM_TEST_BROWSER=required` (as `.ci/run` sets), when it fails.
//!
//! The WebDriver client is the few commands used here, over the same small HTTP client
//! as the API tests: a WebDriver crate would bring a second HTTP stack and TLS for a
//! browser that only ever listens on loopback.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use idem::store::child_run_id;
use idem_test_artifacts::STEPS;
use serde_json::{Value, json};

use crate::http::TestServer;
use crate::serve::{Served, park_a_run, request, submit_parent, until_completed, wait_for};
use crate::util::{CliDir, read_log, stderr};
use crate::workers::Service;

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// Whether the browser is here; if not, whether that fails the test.
fn browser_available() -> bool {
    let here = Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists();
    if !here {
        let required = std::env::var("IDEM_TEST_BROWSER").is_ok_and(|v| v == "required");
        assert!(
            !required,
            "IDEM_TEST_BROWSER=required but {CHROMIUM} or {CHROMEDRIVER} is missing \
             (apt-get install chromium chromium-driver)"
        );
        eprintln!(
            "SKIPPED: the browser test needs {CHROMIUM} and {CHROMEDRIVER} \
             (apt-get install chromium chromium-driver)"
        );
    }
    here
}

/// `chromedriver` on a port of its choosing, killed (by its pid) when dropped.
struct Driver {
    child: Child,
    addr: SocketAddr,
}

impl Driver {
    fn start() -> Driver {
        let mut child = Command::new(CHROMEDRIVER)
            .arg("--port=0")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let port: u16 = loop {
            let line = lines.next().expect("chromedriver says its port").unwrap();
            if let Some(rest) = line.split("started successfully on port ").nth(1) {
                break rest.trim_end_matches('.').parse().unwrap();
            }
        };
        std::thread::spawn(move || lines.for_each(drop));
        Driver {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        }
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let headers: &[(&str, &str)] = if body.is_empty() {
            &[]
        } else {
            &[("Content-Type", "application/json")]
        };
        let reply = request(self.addr, method, path, headers, body.as_bytes());
        let doc = reply.json();
        assert_eq!(reply.status, 200, "{method} {path}: {doc}");
        doc["value"].clone()
    }

    fn session(&self) -> Session<'_> {
        let caps = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                // Root in a container: no sandbox; no GPU; a fixed size for screenshots.
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,900"],
            },
        } } });
        let value = self.call("POST", "/session", Some(caps));
        Session {
            driver: self,
            id: value["sessionId"].as_str().unwrap().to_string(),
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Session<'a> {
    driver: &'a Driver,
    id: String,
}

impl Session<'_> {
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        self.driver
            .call(method, &format!("/session/{}{path}", self.id), body)
    }

    fn open(&self, url: &str) {
        self.call("POST", "/url", Some(json!({ "url": url })));
    }

    /// The element `css` selects, once it is on the page (the page draws after its
    /// first fetch).
    fn find(&self, css: &str) -> String {
        wait_for(Duration::from_secs(30), || {
            let reply = request(
                self.driver.addr,
                "POST",
                &format!("/session/{}/element", self.id),
                &[("Content-Type", "application/json")],
                json!({ "using": "css selector", "value": css })
                    .to_string()
                    .as_bytes(),
            );
            (reply.status == 200)
                .then(|| reply.json()["value"][ELEMENT].as_str().unwrap().to_string())
        })
    }

    /// Calls `path` on the element `css` selects; the page redraws every second, so an
    /// element found just before a redraw is found again.
    fn on_element(&self, css: &str, method: &str, path: &str, body: Option<Value>) -> Value {
        wait_for(Duration::from_secs(30), || {
            let id = self.find(css);
            let body = body.as_ref().map(|b| b.to_string()).unwrap_or_default();
            let headers: &[(&str, &str)] = if body.is_empty() {
                &[]
            } else {
                &[("Content-Type", "application/json")]
            };
            let reply = request(
                self.driver.addr,
                method,
                &format!("/session/{}/element/{id}{path}", self.id),
                headers,
                body.as_bytes(),
            );
            let doc = reply.json();
            if reply.status == 404 && doc["value"]["error"] == "stale element reference" {
                return None;
            }
            assert_eq!(reply.status, 200, "{method} {path}: {doc}");
            Some(doc["value"].clone())
        })
    }

    fn click(&self, css: &str) {
        self.on_element(css, "POST", "/click", Some(json!({})));
    }

    fn text(&self, css: &str) -> String {
        self.on_element(css, "GET", "/text", None)
            .as_str()
            .unwrap()
            .to_string()
    }

    fn screenshot(&self, name: &str) -> PathBuf {
        let b64 = self.call("GET", "/screenshot", None);
        let png = base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().unwrap())
            .unwrap();
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("../browser");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, png).unwrap();
        eprintln!("screenshot: {}", path.display());
        path
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        let _ = request(
            self.driver.addr,
            "DELETE",
            &format!("/session/{}", self.id),
            &[],
            b"",
        );
    }
}

#[test]
fn retry_a_parked_run_from_the_page() {
    if !browser_available() {
        return;
    }
    let cli = CliDir::new();
    // Neighbours in the list: two completed runs, one of them first parked and retried
    // from the command line.
    for id in ["nightly-import", "invoice-batch-7"] {
        let input = json!({ "steps": 3, "log": format!("/data/{id}.txt") }).to_string();
        let out = cli.run(STEPS, id, &input, &[]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let key = park_a_run(&cli, "wire");
    let served = Served::start(
        &cli.db(),
        &["--no-auth", "--no-cache", "--worker", "--poll", "50ms"],
    );
    let base = format!("http://{}", served.addr);
    let driver = Driver::start();
    let session = driver.session();

    // The runs list shows the run in doubt.
    session.open(&format!("{base}/"));
    let row = "#runs tr[data-run=\"wire\"]";
    assert_eq!(session.text(&format!("{row} td:nth-child(2)")), "in-doubt");
    session.find("#runs tr[data-run=\"nightly-import\"]");
    session.screenshot("runs.png");

    // Its page shows the parked key and the steps, the one in doubt marked.
    session.click(&format!("{row} a.run-link"));
    session.find("#summary[data-status=\"in-doubt\"]");
    let parked = session.text(".parked[data-key] code");
    assert_eq!(parked, key);
    let step = format!("#steps tr[data-key=\"{key}\"]");
    assert!(
        session.text(&step).contains("in doubt"),
        "{}",
        session.text(&step)
    );
    session.screenshot("run-in-doubt.png");
    assert_eq!(read_log(&cli.data().join("log.txt")).len(), 3);

    // Retry: the key is released, the worker takes the run and completes it.
    session.click("button.retry");
    session.find("#summary[data-status=\"completed\"]");
    assert!(
        session.text(&step).contains("committed"),
        "{}",
        session.text(&step)
    );
    assert!(
        session.text(&step).contains("retaken"),
        "{}",
        session.text(&step)
    );
    session.screenshot("run-completed.png");

    // The effect in doubt ran again, once; the others were not repeated.
    let lines = read_log(&cli.data().join("log.txt"));
    assert_eq!(lines.len(), 6, "five effects, the one in doubt twice");
    let run = served.get("/api/runs/wire").json();
    assert_eq!(run["run"]["status"], "completed");
    assert_eq!(run["open_claims"], json!([]));
}

#[test]
fn the_page_shows_a_parent_and_its_children() {
    if !browser_available() {
        return;
    }
    let server = TestServer::start();
    let service = Service::new();
    crate::children::deploy(&service, &server, &[]);
    let served = Served::start(
        &service.db(),
        &["--no-auth", "--no-cache", "--worker", "--poll", "50ms"],
    );
    submit_parent(&served, &server, 3, 0);
    until_completed(&served, "parent");
    let base = format!("http://{}", served.addr);
    let driver = Driver::start();
    let session = driver.session();

    // The parent's page: its children, each with its state and a link, and its join.
    session.open(&format!("{base}/runs/parent"));
    session.find("#summary[data-status=\"completed\"]");
    assert_eq!(session.text("#children-count"), "3 in all: 3 completed");
    for i in 0..3 {
        let child = child_run_id("parent", &format!("item-{i}"));
        let row = format!("#children tr[data-run=\"{child}\"]");
        assert_eq!(
            session.text(&format!("{row} td:nth-child(1)")),
            format!("item-{i}")
        );
        assert_eq!(session.text(&format!("{row} td:nth-child(2)")), "completed");
        assert_eq!(session.text(&format!("{row} a.run-link")), child);
    }
    assert_eq!(
        session.text("#waits tr[data-key=\"all\"] td:nth-child(2)"),
        "join all of 3 children"
    );
    assert!(
        session
            .text("#waits tr[data-key=\"all\"] td:nth-child(4)")
            .starts_with("joined at "),
        "{}",
        session.text("#waits tr[data-key=\"all\"]")
    );
    session.screenshot("run-parent.png");

    // A child's link leads to its page, which links back to its parent.
    let child = child_run_id("parent", "item-1");
    session.click(&format!("#children tr[data-run=\"{child}\"] a.run-link"));
    session.find("#summary[data-status=\"completed\"]");
    assert_eq!(session.text("h1"), child);
    assert_eq!(session.text("#parent-link"), "parent");
    assert!(
        session
            .text("#summary")
            .contains("spawned under key item-1"),
        "{}",
        session.text("#summary")
    );
    assert_eq!(
        session.on_element("#children-section", "GET", "/displayed", None),
        json!(false),
        "a child without children shows no children"
    );
    session.screenshot("run-child.png");
    session.click("#parent-link");
    session.find("#children tr[data-run]");
    assert_eq!(session.text("h1"), "parent");
    assert_eq!(server.seen().len(), 3, "each child's request once");
}
