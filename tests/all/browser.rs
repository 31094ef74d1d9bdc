//! The web page in a real headless Chromium, driven over WebDriver by Debian's
//! `chromedriver`: the runs list, a run parked in doubt, its **Retry** button, and the
//! run completing once the worker in `idem serve --worker` resumes it; a parent run
//! with its children, each a link, and a child's link back to its parent; a running
//! run paused and resumed with its page's buttons; a schedule paused and resumed from
//! the schedules table; a model's streamed answer growing on its run's page while its
//! step has not committed; a deployment's versions with the runs on each, and dry runs
//! of an upgrade, one refused and one safe. Screenshots go to `target/browser/`.
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
use std::time::{Duration, Instant};

use base64::Engine as _;
use idem::store::child_run_id;
use idem_test_artifacts::STEPS;
use serde_json::{Value, json};

use crate::http::{TestServer, post_key};
use crate::serve::{Served, park_a_run, request, submit_parent, until_completed, wait_for};
use crate::util::{CliDir, block_on, read_log, run_cli, stderr};
use crate::workers::{Service, by_key, deploy_fetcher};

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

    /// Types `text` into the input `css` selects.
    fn type_into(&self, css: &str, text: &str) {
        self.on_element(css, "POST", "/value", Some(json!({ "text": text })));
    }

    /// Clicks the button `css` selects and returns what the page's message line then
    /// says: the line is cleared first, and set when the button's request is answered,
    /// which may be after the click returns.
    fn press(&self, css: &str) -> String {
        self.call(
            "POST",
            "/execute/sync",
            Some(json!({
                "script": "const m = document.getElementById('message'); \
                           m.textContent = ''; m.className = ''; m.hidden = true;",
                "args": [],
            })),
        );
        self.click(css);
        wait_for(Duration::from_secs(30), || {
            let text = self.text("#message");
            (!text.is_empty()).then_some(text)
        })
    }

    /// Waits until the text of `css` satisfies `ok` (the page redraws every second),
    /// and returns it.
    fn text_until(&self, css: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = self.text(css);
            if ok(&text) {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "{css} never as expected; it says {text:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// How many elements `css` selects now.
    fn count(&self, css: &str) -> usize {
        let found = self.call(
            "POST",
            "/elements",
            Some(json!({ "using": "css selector", "value": css })),
        );
        found.as_array().unwrap().len()
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

    // The step opened from its row: its committed result, as the API has it, and its
    // second attempt; the run's timeline below, ending with its end.
    session.click(&format!("{step} button.open-step"));
    let result = session.text("#step-result");
    let api_step = served
        .get(&format!(
            "/api/runs/wire/steps/{}",
            crate::serve::percent_encoded(&key)
        ))
        .json();
    let expected = match &api_step["result"] {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    };
    assert_eq!(result, expected);
    let detail = session.text("#step-detail");
    assert!(detail.contains("retaken"), "{detail}");
    assert!(detail.contains("checkpoint"), "{detail}");
    let timeline = session.text_until("#timeline tbody", |t| t.contains("run ended completed"));
    assert!(timeline.contains("instance 1 started"), "{timeline}");
    session.screenshot("run-step-opened.png");

    // Its step history, numbered as a fork takes it; forked from step 2 on the page,
    // the new run (the page's worker drives it) runs steps 2 on again under its own
    // keys, once each, and nothing of the original again.
    let history = served.get("/api/runs/wire/history").json();
    let steps = history["steps"].as_array().unwrap().len();
    assert!(steps >= 2, "{history}");
    session.find(&format!("#history tr[data-n=\"{steps}\"]"));
    assert!(
        session
            .text("#history tr[data-n=\"1\"] td.saved")
            .contains("step 1")
    );
    session.click("#history tr[data-n=\"2\"] button.fork");
    session.find("#forked-run");
    let fork = session.text("#forked-run");
    assert!(fork.starts_with("wire-fork-"), "{fork}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while served.get(&format!("/api/runs/{fork}")).json()["run"]["status"] != "completed" {
        assert!(Instant::now() < deadline, "the fork did not complete");
        std::thread::sleep(Duration::from_millis(50));
    }
    let lines = read_log(&cli.data().join("log.txt"));
    let forked = lines
        .iter()
        .filter(|l| l.key.starts_with(&format!("{fork}/")))
        .count();
    assert_eq!(
        forked,
        steps - 1,
        "steps 2 to {steps}, under the fork's keys"
    );
    assert_eq!(lines.len(), 6 + steps - 1);
    session.screenshot("run-forked.png");
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

/// The requests the loopback server saw for run `run_id`'s keys, by key.
fn requests_of(server: &TestServer, run_id: &str) -> usize {
    let prefix = format!("{run_id}/");
    by_key(&server.seen())
        .iter()
        .filter(|(key, _)| key.starts_with(&prefix))
        .map(|(_, tokens)| tokens.len())
        .sum()
}

#[test]
fn pause_and_resume_a_running_run_from_its_page() {
    if !browser_available() {
        return;
    }
    // Four steps of 1.5 s each (the sleep inside the effect, before its request): the
    // run is mid-step when Pause is pressed, and has steps left after it.
    const STEPS: u64 = 4;
    let server = TestServer::start();
    let service = Service::new();
    deploy_fetcher(&service, &server, &[]);
    let served = Served::start(
        &service.db(),
        &["--no-auth", "--no-cache", "--worker", "--poll", "50ms"],
    );
    let base = format!("http://{}", served.addr);
    let driver = Driver::start();
    let session = driver.session();
    // The page is open before the run exists (it polls until it does), so that the
    // browser's start does not eat into the run's six seconds.
    session.open(&format!("{base}/runs/report-42"));
    session.find("#pause");
    let input = json!({ "steps": STEPS, "url": server.url(), "pause_ms": 1500 });
    let r = served.post_json(
        "/api/runs",
        None,
        &json!({ "agent": "fetcher", "input": input, "run_id": "report-42" }),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    session.find("#summary[data-status=\"running\"]");
    // Its first step claimed: the run is inside a side effect.
    session.text_until("#steps tbody", |t| t.contains("claimed"));

    // Pause: the worker holds the run inside a step, so it is asked to stop it.
    let said = session.press("#pause");
    assert!(said.starts_with("pause requested from worker "), "{said}");
    let run = served.get("/api/runs/report-42").json();
    assert_eq!(run["run"]["status"], "paused", "{run}");
    assert_eq!(run["run"]["paused_by"], "run", "{run}");

    // The worker finishes the step it is in, stops the run at its next host call and
    // gives it back: the store shows it paused holding nothing, and so does the page.
    let parked = wait_for(Duration::from_secs(30), || {
        let doc = served.get("/api/runs/report-42").json();
        doc["run"]["lease"].is_null().then_some(doc)
    });
    assert_eq!(parked["run"]["status"], "paused", "{parked}");
    assert_eq!(parked["open_claims"], json!([]), "{parked}");
    session.find("#summary[data-status=\"paused\"]");
    let summary = session.text_until("#summary", |t| !t.contains("next host call"));
    assert!(summary.contains("by an operator"), "{summary}");
    let committed = parked["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| !s["committed_at"].is_null())
        .count();
    let sent = requests_of(&server, "report-42");
    assert!(
        (1..STEPS as usize).contains(&sent),
        "{sent} requests: the pause landed mid-run"
    );
    assert_eq!(
        committed, sent,
        "the step in flight committed; none was cut"
    );
    session.screenshot("run-paused.png");
    // Paused, it sends nothing: longer than a step later, still no request.
    std::thread::sleep(Duration::from_millis(2000));
    assert_eq!(requests_of(&server, "report-42"), sent);
    assert_eq!(
        served.get("/api/runs/report-42").json()["run"]["status"],
        "paused"
    );

    // Resume: the worker takes it again and it goes on from its checkpoint.
    assert_eq!(session.press("#resume"), "resumed");
    session.find("#summary[data-status=\"completed\"]");
    let done = served.get("/api/runs/report-42").json();
    assert!(done["run"]["paused_by"].is_null(), "{done}");
    let counts = &done["run"]["counts"];
    assert_eq!(counts["executed"], STEPS, "{done}");
    assert_eq!(counts["reclaimed"], 0, "{done}");
    assert!(
        counts["instances"].as_u64().unwrap() >= 2,
        "a new instance after the resume: {done}"
    );
    // Each step's request reached the server exactly once, the ones before the pause
    // not repeated.
    let keys = by_key(&server.seen());
    for i in 0..STEPS {
        assert_eq!(
            keys.get(&post_key("report-42", i)).map(Vec::len),
            Some(1),
            "step {i}: {keys:?}"
        );
    }
    assert_eq!(keys.len(), STEPS as usize, "{keys:?}");
    session.screenshot("run-resumed.png");
}

#[test]
fn pause_and_resume_a_schedule_from_the_page() {
    if !browser_available() {
        return;
    }
    let server = TestServer::start();
    let service = Service::new();
    deploy_fetcher(&service, &server, &[]);
    let input = json!({ "steps": 1, "url": server.url() }).to_string();
    for (name, every) in [("fast", "200ms"), ("nightly", "24h")] {
        service.ok(&[
            "schedule",
            "create",
            name,
            "--deployment",
            "fetcher",
            "--every",
            every,
            "--overlap",
            "allow",
            "--input",
            &input,
        ]);
    }
    let schedule = |name: &str| block_on(service.store().schedule(name)).unwrap().unwrap();
    let served = Served::start(
        &service.db(),
        &["--no-auth", "--no-cache", "--worker", "--poll", "50ms"],
    );
    let base = format!("http://{}", served.addr);
    let driver = Driver::start();
    let session = driver.session();
    session.open(&format!("{base}/"));
    let fast = "#schedules tr[data-schedule=\"fast\"]";
    let nightly = "#schedules tr[data-schedule=\"nightly\"]";
    assert_eq!(session.text(&format!("{fast} td:nth-child(4)")), "active");
    assert_eq!(session.text(&format!("{fast} button")), "Pause");
    wait_for(Duration::from_secs(30), || {
        (schedule("fast").ticks.started >= 2).then_some(())
    });

    // Pause: the store has it paused, the page says so and offers Resume; the other
    // schedule is untouched.
    assert_eq!(
        session.press(&format!("{fast} button.schedule-pause")),
        "schedule fast is paused"
    );
    assert!(schedule("fast").paused);
    assert!(!schedule("nightly").paused);
    session.text_until(&format!("{fast} td:nth-child(4)"), |t| t == "paused");
    assert_eq!(session.text(&format!("{fast} td:nth-child(5)")), "-");
    assert_eq!(session.text(&format!("{fast} button")), "Resume");
    assert_eq!(
        session.text(&format!("{nightly} td:nth-child(4)")),
        "active"
    );
    assert_eq!(session.text(&format!("{nightly} button")), "Pause");
    session.screenshot("schedule-paused.png");
    // Paused, it fires nothing: a second is five of its ticks.
    let before = schedule("fast").ticks;
    std::thread::sleep(Duration::from_secs(1));
    let paused = schedule("fast");
    assert_eq!(paused.ticks, before, "a paused schedule fired");
    let last_tick = paused.last_tick.unwrap();
    let resumed_from = served.get("/api/schedules").json()["now"].as_i64().unwrap();

    // Resume: it fires again, from now; the ticks that fell while it was paused are
    // not run.
    assert_eq!(
        session.press(&format!("{fast} button.schedule-resume")),
        "schedule fast is active"
    );
    assert!(!schedule("fast").paused);
    session.text_until(&format!("{fast} td:nth-child(4)"), |t| t == "active");
    assert_eq!(session.text(&format!("{fast} button")), "Pause");
    let started = before.started + 2;
    wait_for(Duration::from_secs(30), || {
        (schedule("fast").ticks.started >= started).then_some(())
    });
    assert_eq!(
        session.press(&format!("{fast} button.schedule-pause")),
        "schedule fast is paused"
    );
    assert!(schedule("fast").paused);
    service.wait_all_finished(Duration::from_secs(30), || {});
    let store = service.store();
    let ticks: Vec<i64> = service
        .runs()
        .iter()
        .filter_map(|run| block_on(store.run_schedule(&run.run_id)).unwrap())
        .map(|by| by.tick)
        .collect();
    assert!(
        ticks.iter().all(|&t| t <= last_tick || t > resumed_from),
        "a tick from while it was paused ran: last {last_tick}, resumed after \
         {resumed_from}: {ticks:?}"
    );
    // Each run's one request reached the server once.
    let keys = by_key(&server.seen());
    assert_eq!(keys.len(), ticks.len(), "{keys:?}");
    assert!(keys.values().all(|tokens| tokens.len() == 1), "{keys:?}");
    assert_eq!(schedule("nightly").ticks.started, 0);
}

#[test]
fn a_run_paused_from_its_page_keeps_its_signal_until_resumed() {
    if !browser_available() {
        return;
    }
    let cli = CliDir::new();
    let grant = format!("{}::/data", cli.data().display());
    let db = cli.db();
    let deployed = crate::util::run_cli(&[
        "deploy",
        idem_test_artifacts::WAITER,
        "--name",
        "waiter",
        "--db",
        &db,
        "--dir",
        &grant,
    ]);
    assert!(deployed.status.success(), "{}", stderr(&deployed));
    let served = Served::start(
        &db,
        &["--no-auth", "--no-cache", "--worker", "--poll", "50ms"],
    );
    let input = json!({ "log": "/data/waiter.log", "waits": [{ "signal": "approval" }] });
    let r = served.post_json(
        "/api/runs",
        None,
        &json!({ "agent": "waiter", "input": input, "run_id": "refund-9" }),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let log = || std::fs::read_to_string(cli.data().join("waiter.log")).unwrap_or_default();
    let base = format!("http://{}", served.addr);
    let driver = Driver::start();
    let session = driver.session();
    session.open(&format!("{base}/runs/refund-9"));
    session.text_until("#summary", |t| t.contains("for signal approval"));

    // Pause while it waits: no worker holds it, so it is paused at once.
    assert_eq!(session.press("#pause"), "paused");
    session.find("#summary[data-status=\"paused\"]");
    let run = served.get("/api/runs/refund-9").json();
    assert_eq!(
        (&run["run"]["status"], &run["run"]["paused_by"]),
        (&json!("paused"), &json!("run")),
        "{run}"
    );

    // The signal it waits for, sent from the page while it is paused: kept, and the run
    // does not go on.
    session.type_into("#signal-name", "approval");
    session.type_into("#signal-payload", r#"{"by":"ops"}"#);
    let said = session.press("#signal");
    assert!(said.starts_with("signal approval "), "{said}");
    std::thread::sleep(Duration::from_millis(1500));
    let run = served.get("/api/runs/refund-9").json();
    assert_eq!(run["run"]["status"], "paused", "{run}");
    assert_eq!(
        log().lines().count(),
        1,
        "only the step before the wait: {}",
        log()
    );
    session.screenshot("run-paused-waiting.png");

    // Resumed, it is due at once: its signal came while it was paused.
    assert_eq!(session.press("#resume"), "resumed");
    session.find("#summary[data-status=\"completed\"]");
    let lines: Vec<String> = log().lines().map(str::to_string).collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines[0].starts_with("start "), "{lines:?}");
    assert!(
        lines[1].starts_with(r#"after 0 {"by":"ops"} "#),
        "{lines:?}"
    );
    let done = served.get("/api/runs/refund-9").json();
    assert_eq!(done["run"]["counts"]["executed"], 2, "{done}");
    assert_eq!(done["run"]["counts"]["reclaimed"], 0, "{done}");
}

#[test]
fn the_page_lists_flow_and_rate_limits() {
    if !browser_available() {
        return;
    }
    let cli = CliDir::new();
    let db = cli.db();
    let idem = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend_from_slice(&["--db", &db]);
        let out = run_cli(&all);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    };
    idem(&["deploy", STEPS, "--name", "steps"]);
    let served = Served::start(&db, &["--no-auth", "--no-cache"]);
    let base = format!("http://{}", served.addr);
    let driver = Driver::start();
    let session = driver.session();

    // No limit set: the section is hidden.
    session.open(&format!("{base}/"));
    session.find("#runs");
    let hidden = session.on_element("#limits-section", "GET", "/property/hidden", None);
    assert_eq!(hidden, json!(true));

    idem(&["flow", "set", "steps", "--max-running", "3"]);
    idem(&[
        "rate", "set", "llm", "--limit", "60", "--per", "1m", "--burst", "4",
    ]);
    let rate = "#rates tr[data-class=\"llm\"]";
    let row = session.text_until(rate, |t| t.contains("60 per"));
    assert!(
        row.contains("60.00 s") && row.contains('4') && row.contains("free now"),
        "{row}"
    );
    let flow = session.text("#flow tr[data-deployment=\"steps\"]");
    assert!(flow.contains('3'), "{flow}");
    session.screenshot("limits.png");

    // Cleared, the rows go.
    idem(&["rate", "clear", "llm"]);
    session.text_until("#rates tbody", str::is_empty);
}

#[test]
fn a_running_steps_text_grows_on_its_page_before_it_commits() {
    if !browser_available() {
        return;
    }
    use crate::live::{ANSWER, committed, deploy_chat, hold, streaming_input};
    // The model's text answer stops after every 3 pieces until the test lets it go: the
    // page is looked at twice while the step cannot commit.
    let server = crate::llm::ModelServer::start();
    let go = hold(&server, 3);
    let service = Service::new();
    let data = tempfile::tempdir().unwrap();
    deploy_chat(&service, &server, data.path());
    let served = Served::start(
        &service.db(),
        &["--no-auth", "--no-cache", "--worker", "--poll", "50ms"],
    );
    let base = format!("http://{}", served.addr);
    let driver = Driver::start();
    let session = driver.session();
    let run_id = "live-page";
    let r = served.post_json(
        "/api/runs",
        None,
        &json!({"agent": "chat", "input": streaming_input(&server, "openai"), "run_id": run_id}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    session.open(&format!("{base}/runs/{run_id}"));
    let block = format!("#live .live-step[data-key=\"{run_id}/llm/c1/2\"]");
    let text = format!("{block} pre");

    // The first three pieces ("answer: f"), shown while the step streams.
    let first = session.text_until(&text, |t| t == &ANSWER[..9]);
    session.find(&format!("{block}[data-state=\"streaming\"]"));
    assert!(!committed(&served, run_id, "/llm/c1/2"));
    // Three more: the same text, grown, the step still not committed.
    go.send(()).unwrap();
    let second = session.text_until(&text, |t| t == &ANSWER[..18]);
    assert!(second.starts_with(&first) && second.len() > first.len());
    assert!(!committed(&served, run_id, "/llm/c1/2"));
    session.screenshot("run-live.png");

    // The rest: the whole answer, its step committed, the run completed.
    drop(go);
    session.text_until(&text, |t| t == ANSWER);
    session.find("#summary[data-status=\"completed\"]");
    session.find(&format!("{block}[data-state=\"committed\"]"));
    assert!(committed(&served, run_id, "/llm/c1/2"));
}

/// The deployments page against a store where `release` has three versions: 1 with a
/// run completed and the rehearsal's run left in flight (`crate::rehearse`), 2 the one
/// that renamed its step's key, 3 the compatible one, current, with a run queued on it
/// (no worker takes it). The versions list counts the runs on each; a dry run without
/// the token is refused; with the token typed into the page, the dry run to version 2
/// is refused naming the run and each committed step it would run again (the keys the
/// API's own report names), and the one to version 3 is safe. Nothing moves.
#[test]
fn the_page_shows_versions_and_rehearses_an_upgrade() {
    use crate::rehearse::{RUN, leave_in_flight};
    use idem_test_artifacts::{RELEASE, RELEASE_RENAMED, RELEASE_V2};
    if !browser_available() {
        return;
    }
    let cli = CliDir::new();
    let db = cli.db();
    // Granted what the run left in flight is, so that both are on version 1.
    let done = cli.run(RELEASE, "done-1", r#"{"items": 1}"#, &[]);
    assert!(done.status.success(), "{}", stderr(&done));
    leave_in_flight(&db, &cli.data());
    for agent in [RELEASE_RENAMED, RELEASE_V2] {
        let out = run_cli(&["deploy", agent, "--name", "release", "--db", &db]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let token = "page-tok-51c2";
    let token_file = cli.dir.path().join("token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    let served = Served::start(&db, &["--token-file", token_file.to_str().unwrap()]);
    let r = served.post_json(
        "/api/runs",
        Some(token),
        &json!({ "agent": "release", "input": { "items": 1 }, "run_id": "fresh-3" }),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let versions = served.get("/api/deployments/release/versions").json();
    let digest = |v: usize| {
        versions["versions"][v - 1]["digest"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let before = served.get(&format!("/api/runs/{RUN}")).json();
    assert_eq!(before["run"]["digest"], digest(1).as_str(), "{before}");

    let base = format!("http://{}", served.addr);
    let driver = Driver::start();
    let session = driver.session();
    session.open(&format!("{base}/deployments"));
    let section = "section.deployment[data-deployment=\"release\"]";
    let row = |v: usize| format!("{section} .versions tr[data-version=\"{v}\"]");
    session.find(&row(3));
    assert_eq!(session.count("section.deployment"), 1);
    assert_eq!(session.count(&format!("{section} .versions tbody tr")), 3);
    // Version, digest, in-flight policy, then runs in flight, finished and in all.
    for (v, label, in_flight, finished, all) in [
        (1, "1", "1", "1", "2"),
        (2, "2", "0", "0", "0"),
        (3, "3 (current)", "1", "0", "1"),
    ] {
        let cell = |n: usize| session.text(&format!("{} td:nth-child({n})", row(v)));
        assert_eq!(cell(1), label);
        assert_eq!(cell(2), digest(v)[..12]);
        assert_eq!(cell(3), "pin");
        assert_eq!(
            (cell(5), cell(6), cell(7)),
            (in_flight.into(), finished.into(), all.into()),
            "version {v}"
        );
    }
    // The dry run's choices: each version, the current one chosen.
    let select = format!("{section} select.dry-run-to");
    assert_eq!(session.count(&format!("{select} option")), 3);
    assert_eq!(
        session.on_element(&select, "GET", "/property/value", None),
        json!("3")
    );
    session.screenshot("deployments.png");

    let report = format!("{section} .dry-run-report");
    let button = format!("{section} button.dry-run-button");
    let choose = |v: usize| {
        session.click(&format!(
            "{section} select.dry-run-to option[value=\"{v}\"]"
        ));
    };
    // Without the token: the rehearsal is a mutating call, refused.
    choose(2);
    session.click(&button);
    let refused = session.text_until(&report, |t| t.starts_with("dry run refused"));
    assert!(refused.contains("unauthorized"), "{refused}");

    // With it, typed into the page: version 2 renamed the step's key, so the run in
    // flight would run its committed steps again; the run queued on version 3 would
    // take another first step. The keys are the ones the API's report names.
    session.type_into("#token", token);
    session.click("#token-form button");
    let api = served.post_json(
        "/api/deployments/release/rehearse",
        Some(token),
        &json!({ "to": 2 }),
    );
    assert_eq!(api.status, 200, "{}", api.text());
    let api = api.json();
    let keys: Vec<String> = api["report"]["runs"][0]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["key"].as_str().unwrap().to_string())
        .collect();
    assert!(
        !keys.is_empty() && keys.iter().all(|k| k.starts_with("rel/item/")),
        "{api}"
    );
    assert_eq!(
        session.press(&button),
        "dry run of release to version 2: not safe"
    );
    let summary = format!("{report} .dry-run-summary");
    assert_eq!(
        session.text(&summary),
        "version 2: NOT SAFE, nothing was moved (2 runs: 1 repeats, 1 diverges)"
    );
    session.find(&format!("{summary}[data-safe=\"false\"]"));
    assert_eq!(
        session.count(&format!("{report} .dry-run-runs tbody tr")),
        2
    );
    let rel = format!("{report} tr[data-run=\"{RUN}\"]");
    assert_eq!(session.text(&format!("{rel} td:nth-child(1)")), RUN);
    assert_eq!(session.text(&format!("{rel} td:nth-child(3)")), "repeats");
    let shown: Vec<String> = (1..=keys.len())
        .map(|i| session.text(&format!("{rel} code.repeated-key:nth-of-type({i})")))
        .collect();
    assert_eq!(shown, keys);
    assert_eq!(
        session.count(&format!("{rel} code.repeated-key")),
        keys.len()
    );
    let detail = session.text(&format!("{rel} td.detail"));
    assert!(
        detail.starts_with(&format!("would run again step 1 ({})", keys[0]))
            && detail.contains("it first runs step rel/entry/"),
        "{detail}"
    );
    let fresh = format!("{report} tr[data-run=\"fresh-3\"]");
    assert_eq!(
        session.text(&format!("{fresh} td:nth-child(3)")),
        "diverges"
    );
    session.screenshot("dry-run-refused.png");

    // Version 3 keeps the key: the run in flight replays its steps and goes on as
    // before; the queued run is on it already.
    choose(3);
    assert_eq!(
        session.press(&button),
        "dry run of release to version 3: safe"
    );
    assert_eq!(
        session.text(&summary),
        "version 3: safe, nothing would run again (2 runs: 1 compatible, 1 already-on)"
    );
    session.find(&format!("{summary}[data-safe=\"true\"]"));
    assert_eq!(
        session.count(&format!("{report} .dry-run-runs tbody tr")),
        2
    );
    assert_eq!(
        session.text(&format!("{rel} td:nth-child(3)")),
        "compatible"
    );
    let detail = session.text(&format!("{rel} td.detail"));
    assert!(
        detail.starts_with(&format!(
            "replays its {} committed steps, then runs step rel/item/",
            keys.len()
        )) && detail.ends_with(" as before"),
        "{detail}"
    );
    assert_eq!(
        session.text(&format!("{fresh} td:nth-child(3)")),
        "already-on"
    );
    session.screenshot("dry-run-safe.png");

    // Nothing moved: the run is on version 1 still, the counts as they were.
    let after = served.get(&format!("/api/runs/{RUN}")).json();
    assert_eq!(after["run"]["digest"], before["run"]["digest"], "{after}");
    assert_eq!(session.text(&format!("{} td:nth-child(5)", row(1))), "1");
}
