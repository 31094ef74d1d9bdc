//! Child runs: the `fanout` guest spawns one `fetcher` child per item (each child POSTs
//! once to a real server on loopback, under a key of its own run) and joins them.
//! Every crash point around a spawn and a join, seeded SIGKILLs of three workers during
//! a fan-out of 1,000 children (SQLite and PostgreSQL), and the cancel of a parent with
//! running children leave each child run once, each child's effect applied once (a
//! repeat only as a retake in doubt, under a greater token), and the parent's joined
//! answer exact. Bad spawns and joins fail with their reason and write nothing. The
//! Python twin of `fanout` (`tests/guests-python/fanout`, on the Python SDK) fans out to
//! the same children, through a worker and through a crash point, with the same answer.

use std::process::Child as Process;
use std::time::{Duration, Instant};

use idem::ops::RunView;
use idem::store::{RunFilter, RunStatus, child_run_id};
use idem_test_artifacts::{FANOUT, FANOUT_DIGEST, PY_FANOUT};
use serde_json::{Value, json};

use crate::http::TestServer;
use crate::util::{block_on, integrity_ok, stderr, stdout};
use crate::workers::{Service, assert_effects_fenced, by_key, deploy_fetcher, signal};

/// What a command printed, on both streams.
fn said(out: &std::process::Output) -> String {
    format!("{}{}", stdout(out), stderr(out))
}

/// Deploys `fetcher` (the children, granted the server) and `fanout` (the parent).
pub(crate) fn deploy(service: &Service, server: &TestServer, extra: &[&str]) {
    deploy_fetcher(service, server, extra);
    let mut fanout = vec!["deploy", FANOUT, "--name", "fanout"];
    fanout.extend_from_slice(extra);
    service.ok(&fanout);
}

fn workers(service: &Service, n: usize, extra: &[&str]) -> Vec<Process> {
    (0..n)
        .map(|w| service.worker(&format!("w{w}"), extra))
        .collect()
}

fn drain(mut workers: Vec<Process>) {
    for worker in &mut workers {
        signal(worker, "TERM");
        let status = worker.wait().unwrap();
        assert!(status.success(), "a drained worker exits 0: {status:?}");
    }
}

fn output(service: &Service, run_id: &str) -> Value {
    let run = block_on(service.store().run(run_id)).unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Completed, "{run_id}: {run:?}");
    serde_json::from_slice(run.outcome.as_deref().unwrap()).unwrap()
}

fn children_of(service: &Service, parent: &str) -> Vec<idem::store::RunRecord> {
    block_on(service.store().runs(&RunFilter {
        parent: Some(parent),
        ..RunFilter::default()
    }))
    .unwrap()
}

/// Checks the parent joined `n` children, each of whose one request reached the
/// server exactly once with its own key, with the right replies.
fn assert_joined_once(service: &Service, server: &TestServer, parent: &str, n: usize) {
    let out = output(service, parent);
    assert_eq!(out["spawned"], n, "{out}");
    assert_eq!(out["completed"], n, "{out}");
    let bodies = out["bodies"].as_array().unwrap();
    assert_eq!(bodies.len(), n);
    assert!(bodies.iter().all(|b| b == "POST /step/0 ok"), "{out}");
    let kids = children_of(service, parent);
    assert_eq!(
        kids.len(),
        n,
        "one child per item, however often it was spawned"
    );
    for i in 0..n {
        let id = child_run_id(parent, &format!("item-{i}"));
        assert!(kids.iter().any(|k| k.run_id == id), "child {i}: {id}");
    }
    let keys = by_key(&server.seen());
    assert_eq!(keys.len(), n, "one key per child reached the server");
    assert_effects_fenced(service, server);
}

#[test]
fn spawn_and_join_keep_each_child_once_under_every_crash_point() {
    let server = TestServer::start();
    let service = Service::new();
    deploy(&service, &server, &[]);
    let mut workers = workers(&service, 1, &[]);
    let points = [
        "before-spawn:1",
        "after-spawn:1",
        "before-spawn:2",
        "after-spawn:3",
        "before-join:1",
        "after-join:1",
    ];
    // One spawn at a time, then `spawn_many` of two and one: a crash point of a batch
    // is before (or after) the whole batch's one write.
    let cases: Vec<(usize, &str)> = [0, 2]
        .into_iter()
        .flat_map(|batch| points.iter().map(move |p| (batch, *p)))
        .collect();
    for (i, (batch, point)) in cases.iter().enumerate() {
        let run_id = format!("p{i}");
        let input = json!({ "deployment": "fetcher", "children": 3, "url": server.url(),
                            "checkpoint": false, "batch": batch });
        let out = service.cli(&[
            "run",
            FANOUT,
            "--run-id",
            &run_id,
            "--crash-at",
            point,
            "--input",
            &input.to_string(),
        ]);
        assert!(out.status.success(), "{batch} {point}: {}", stderr(&out));
        let _ = stdout(&out);
        let out = output(&service, &run_id);
        assert_eq!(out["completed"], 3, "{batch} {point}: {out}");
        assert_eq!(children_of(&service, &run_id).len(), 3, "{batch} {point}");
    }
    // Every child's key reached the server once: no crash point in a parent repeats a
    // child's effect.
    let keys = by_key(&server.seen());
    assert_eq!(keys.len(), 3 * cases.len());
    assert!(keys.values().all(|tokens| tokens.len() == 1), "{keys:?}");
    workers.iter_mut().for_each(|w| w.kill().unwrap());
    for w in &mut workers {
        w.wait().unwrap();
    }
    integrity_ok(&service.path());
}

#[test]
fn idem_run_of_a_parent_drives_its_children_itself_with_no_worker() {
    let server = TestServer::start();
    let service = Service::new();
    deploy(&service, &server, &[]);
    let input = json!({ "deployment": "fetcher", "children": 5, "url": server.url() });
    let out = service.cli(&[
        "run",
        FANOUT,
        "--run-id",
        "alone",
        "--input",
        &input.to_string(),
    ]);
    assert!(out.status.success(), "{}", said(&out));
    assert_joined_once(&service, &server, "alone", 5);
}

#[test]
fn three_workers_fan_out_1000_children_through_kills() {
    let service = Service::new();
    fan_out_through_kills(&service, 1000, 10, 0x0031_1000, 0);
    integrity_ok(&service.path());
}

#[test]
fn three_workers_fan_out_1000_children_through_kills_on_postgres() {
    let Some(schema) = crate::postgres::Schema::create("fan-out") else {
        return;
    };
    let service = Service::on_postgres(schema.url());
    fan_out_through_kills(&service, 1000, 10, 0x0031_2000, 250);
}

/// A parent fanning out to `n` children (spawned `batch` at a time with `spawn_many`,
/// or one by one with 0) through three workers, at least `min_kills` SIGKILLs of a
/// random worker (restarted at once) at seeded moments.
fn fan_out_through_kills(service: &Service, n: usize, min_kills: u32, seed: u64, batch: usize) {
    let server = TestServer::start();
    deploy(service, &server, &["--lease", "1s"]);
    let input = json!({ "deployment": "fetcher", "children": n, "url": server.url(),
                        "batch": batch });
    service.ok(&[
        "submit",
        "fanout",
        "--run-id",
        "parent",
        "--input",
        &input.to_string(),
    ]);
    let flags = ["--lease", "1s", "--concurrency", "16"];
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut workers = workers(service, 3, &flags);
    let mut kills = 0;
    let mut next_kill = Instant::now() + Duration::from_millis(rng.u64(50..300));
    let started = Instant::now();
    service.wait_all_finished(Duration::from_secs(900), || {
        if kills < min_kills && Instant::now() >= next_kill {
            let w = rng.usize(0..workers.len());
            workers[w].kill().unwrap();
            workers[w].wait().unwrap();
            kills += 1;
            workers[w] = service.worker(&format!("w{w}"), &flags);
            next_kill = Instant::now() + Duration::from_millis(rng.u64(50..300));
        }
    });
    eprintln!(
        "{n} children through {kills} kills in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    drain(workers);
    assert_joined_once(service, &server, "parent", n);
    let parent = block_on(service.store().run("parent")).unwrap().unwrap();
    assert!(
        parent.counts.instances < 40,
        "the parent is woken once per join, not per child: {} instances",
        parent.counts.instances
    );
}

#[test]
fn cancelling_a_parent_cancels_its_running_children_and_says_so() {
    let server = TestServer::start();
    let service = Service::new();
    deploy(&service, &server, &[]);
    // Each child holds its claim for 30 s after its request: still running when the
    // parent is cancelled.
    let input = json!({ "deployment": "fetcher", "children": 4, "url": server.url(),
                        "pause_ms": 30_000 });
    service.ok(&[
        "submit",
        "fanout",
        "--run-id",
        "parent",
        "--input",
        &input.to_string(),
    ]);
    let workers = workers(&service, 1, &["--concurrency", "8"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while server.seen().len() < 4 {
        assert!(Instant::now() < deadline, "children never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let said = service.ok(&["cancel", "parent"]);
    assert!(said.contains("4 children"), "{said}");
    service.wait_all_finished(Duration::from_secs(60), || {});
    drain(workers);
    let parent = block_on(service.store().run("parent")).unwrap().unwrap();
    assert_eq!(parent.status, RunStatus::Cancelled);
    let kids = children_of(&service, "parent");
    assert_eq!(kids.len(), 4);
    assert!(
        kids.iter().all(|k| k.status == RunStatus::Cancelled),
        "{:?}",
        kids.iter().map(|k| k.status).collect::<Vec<_>>()
    );
    assert_eq!(server.seen().len(), 4, "nothing was sent again");
}

#[test]
fn a_join_of_any_answers_with_the_first_child_to_end() {
    let server = TestServer::start();
    let service = Service::new();
    deploy(&service, &server, &[]);
    let workers = workers(&service, 1, &[]);
    let input =
        json!({ "deployment": "fetcher", "children": 3, "url": server.url(), "mode": "any" });
    service.ok(&[
        "submit",
        "fanout",
        "--run-id",
        "parent",
        "--input",
        &input.to_string(),
    ]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let parent = block_on(service.store().run("parent")).unwrap().unwrap();
        if parent.status.is_finished() {
            break;
        }
        assert!(Instant::now() < deadline, "the parent never ended");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = output(&service, "parent");
    assert_eq!(out["completed"], 1, "{out}");
    assert!(out["first"].as_u64().unwrap() < 3, "{out}");
    drain(workers);
}

#[test]
fn bad_spawns_and_joins_fail_with_their_reason_and_write_nothing() {
    let server = TestServer::start();
    let service = Service::new();
    deploy(&service, &server, &[]);
    let run = |run_id: &str, input: Value, extra: &[&str]| {
        let mut args = vec!["run", FANOUT, "--run-id", run_id, "--input"];
        let input = input.to_string();
        args.push(&input);
        args.extend_from_slice(extra);
        service.cli(&args)
    };
    // An unknown deployment: the run fails naming it, and no child exists.
    let out = run(
        "unknown",
        json!({ "deployment": "nobody", "children": 2 }),
        &[],
    );
    assert!(!out.status.success());
    assert!(
        said(&out).contains("no deployment is called \"nobody\""),
        "{}",
        said(&out)
    );
    assert!(children_of(&service, "unknown").is_empty());
    // A join of a run that is not this run's child.
    let out = run(
        "stranger",
        json!({ "deployment": "fetcher", "children": 0, "join_also": "unknown" }),
        &[],
    );
    assert!(!out.status.success());
    assert!(
        said(&out).contains("\"unknown\" is not a child of this run"),
        "{}",
        said(&out)
    );
    // Past the children limit: the first three were spawned, the fourth refused.
    let out = run(
        "many",
        json!({ "deployment": "fetcher", "children": 5, "url": server.url() }),
        &["--max-children", "3"],
    );
    assert!(!out.status.success());
    assert!(
        said(&out).contains("has spawned 3 children, the limit"),
        "{}",
        said(&out)
    );
    assert_eq!(children_of(&service, "many").len(), 3);
    // An agent spawning itself under one key: the first child's spawn is a cycle.
    let mut workers = workers(&service, 1, &[]);
    let out = run(
        "cycle",
        json!({ "deployment": "fanout", "recurse": { "key": "again" } }),
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let answer = output(&service, "cycle");
    assert!(
        answer["child"]["refused"]
            .as_str()
            .unwrap()
            .contains("would repeat for ever"),
        "{answer}"
    );
    // Under varying keys, the chain ends at the depth limit.
    let out = run(
        "deep",
        json!({ "deployment": "fanout", "recurse": { "key": "level", "vary": true } }),
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let mut answer = output(&service, "deep");
    let mut depth = 0;
    while answer.get("child").is_some() {
        answer = answer["child"].clone();
        depth += 1;
    }
    assert_eq!(depth, 8, "the default depth limit is 8: {answer}");
    assert!(
        answer["refused"]
            .as_str()
            .unwrap()
            .contains("past the limit of 8"),
        "{answer}"
    );
    workers.iter_mut().for_each(|w| w.kill().unwrap());
    for w in &mut workers {
        w.wait().unwrap();
    }
}

#[test]
fn show_lists_a_parents_children_with_their_states_and_its_join() {
    let server = TestServer::start();
    let service = Service::new();
    deploy(&service, &server, &[]);
    // More children than a view lists: the rest are counted, not listed.
    let n = RunView::CHILDREN_SHOWN + 5;
    let input = json!({ "deployment": "fetcher", "children": n, "url": server.url() });
    service.ok(&[
        "submit",
        "fanout",
        "--run-id",
        "parent",
        "--input",
        &input.to_string(),
    ]);
    let workers = workers(&service, 1, &["--concurrency", "16"]);
    service.wait_all_finished(Duration::from_secs(300), || {});
    drain(workers);
    assert_joined_once(&service, &server, "parent", n);

    let text = service.ok(&["show", "parent"]);
    assert!(
        text.contains(&format!("children ({n}): {n} completed\n")),
        "{text}"
    );
    let listed: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_start().starts_with("item-"))
        .collect();
    assert_eq!(listed.len(), RunView::CHILDREN_SHOWN, "{text}");
    let first = child_run_id("parent", "item-0");
    assert_eq!(
        listed[0],
        format!("  item-0  completed  {first}  fetcher"),
        "oldest first, with key, state, id and agent"
    );
    assert!(
        text.contains("  ... and 5 more: idem ls --parent parent\n"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("  all  join all of 105 children  no timeout  joined at ")),
        "{text}"
    );
    assert!(
        !text.contains("\nparent "),
        "a top-level run has no parent: {text}"
    );

    let doc: Value = serde_json::from_str(&service.ok(&["show", "parent", "--json"])).unwrap();
    assert_eq!(doc["children_count"]["total"], n);
    assert_eq!(
        doc["children_count"]["by_status"],
        json!({ "completed": n })
    );
    let children = doc["children"].as_array().unwrap();
    assert_eq!(children.len(), RunView::CHILDREN_SHOWN);
    assert_eq!(
        children[0],
        json!({ "run_id": first, "key": "item-0", "agent": "fetcher", "status": "completed" })
    );
    assert_eq!(doc["waits"][0]["join"], "all");
    assert_eq!(doc["waits"][0]["join_children"], n);

    // A child names its parent and its key.
    let child = child_run_id("parent", "item-3");
    let text = service.ok(&["show", &child]);
    assert!(
        text.contains("\nparent    parent (spawned under key item-3)\n"),
        "{text}"
    );
    assert!(
        !text.contains("children ("),
        "a child without children: {text}"
    );
    let doc: Value = serde_json::from_str(&service.ok(&["show", &child, "--json"])).unwrap();
    assert_eq!(doc["run"]["parent"], "parent");
    assert_eq!(doc["run"]["spawn_key"], "item-3");
    assert_eq!(
        doc["children_count"],
        json!({ "total": 0, "by_status": {} })
    );
}

/// The Python parent spawns Rust `fetcher` children through a worker: each child's
/// effect reaches the server once, and the joined answer is exact. Then, under `idem
/// run --crash-at after-spawn:2` (the parent dies after its second spawn and resumes),
/// it spawns nothing twice and answers as the Rust `fanout` does on the same input, a
/// failing child included.
#[test]
fn a_python_parent_fans_out_and_joins_exactly_once() {
    let Some(py_fanout) = crate::python::built(PY_FANOUT, "child runs") else {
        return;
    };
    let server = TestServer::start();
    let service = Service::new();
    deploy_fetcher(&service, &server, &[]);
    service.ok(&["deploy", py_fanout, "--name", "py-fanout"]);
    let input = json!({ "deployment": "fetcher", "children": 5, "url": server.url() });
    service.ok(&[
        "submit",
        "py-fanout",
        "--run-id",
        "parent",
        "--input",
        &input.to_string(),
    ]);
    let workers = workers(&service, 1, &["--concurrency", "4"]);
    service.wait_all_finished(Duration::from_secs(120), || {});
    assert_joined_once(&service, &server, "parent", 5);
    let parent = block_on(service.store().run("parent")).unwrap().unwrap();
    assert!(
        parent.counts.instances <= 3,
        "spawned, suspended in the join, woken once: {} instances",
        parent.counts.instances
    );

    // Spawned two at a time with `spawn_many`: the crash after the second spawn is
    // after the first batch's write.
    let input = json!({ "deployment": "fetcher", "children": 3, "url": server.url(),
                        "fail": [1], "checkpoint": false, "batch": 2 });
    let mut answers = Vec::new();
    for (guest, run_id) in [(py_fanout, "py-crashed"), (FANOUT, "rust")] {
        let out = service.cli(&[
            "run",
            guest,
            "--run-id",
            run_id,
            "--crash-at",
            "after-spawn:2",
            "--input",
            &input.to_string(),
        ]);
        assert!(out.status.success(), "{run_id}: {}", said(&out));
        let spawns = children_of(&service, run_id);
        assert_eq!(spawns.len(), 3, "{run_id}: one child per item");
        for i in 0..3 {
            let id = child_run_id(run_id, &format!("item-{i}"));
            assert!(spawns.iter().any(|k| k.run_id == id), "{run_id}: child {i}");
        }
        answers.push(output(&service, run_id));
    }
    let py = &answers[0];
    assert_eq!(
        (&py["spawned"], &py["completed"], &py["failed"]),
        (&json!(3), &json!(2), &json!(1)),
        "{py}"
    );
    assert_eq!(py["bodies"][0], "POST /step/0 ok", "{py}");
    assert!(
        py["bodies"][1].as_str().unwrap().starts_with("failed: "),
        "{py}"
    );
    assert_eq!(
        answers[0], answers[1],
        "the Python parent answers as the Rust one"
    );
    // 5 + 2 + 2 children reached the server, each key once.
    let keys = by_key(&server.seen());
    assert_eq!(keys.len(), 9, "{keys:?}");
    assert!(keys.values().all(|tokens| tokens.len() == 1), "{keys:?}");
    assert_effects_fenced(&service, &server);
    drain(workers);
    integrity_ok(&service.path());
}

/// The Python parent's refused spawns and joins reach it as the SDK's typed exceptions,
/// with the host's reason, and write nothing: an unknown deployment and a stranger
/// joined fail the run naming them, a cycle is the answer of the chain's last link.
#[test]
fn a_python_parents_bad_spawns_and_joins_are_typed_and_write_nothing() {
    let Some(py_fanout) = crate::python::built(PY_FANOUT, "bad child runs") else {
        return;
    };
    let server = TestServer::start();
    let service = Service::new();
    deploy(&service, &server, &[]);
    service.ok(&["deploy", py_fanout, "--name", "py-fanout"]);
    let run = |run_id: &str, input: Value| {
        service.cli(&[
            "run",
            py_fanout,
            "--run-id",
            run_id,
            "--input",
            &input.to_string(),
        ])
    };
    let out = run("unknown", json!({ "deployment": "nobody", "children": 2 }));
    assert!(!out.status.success());
    assert!(
        said(&out).contains("UnknownDeployment: spawn refused: no deployment is called \"nobody\""),
        "{}",
        said(&out)
    );
    assert!(children_of(&service, "unknown").is_empty());
    let out = run(
        "stranger",
        json!({ "deployment": "fetcher", "children": 0, "join_also": "unknown" }),
    );
    assert!(!out.status.success());
    assert!(
        said(&out).contains("NotAChild: join refused: run \"unknown\" is not a child of this run"),
        "{}",
        said(&out)
    );
    let out = run(
        "cycle",
        json!({ "deployment": "py-fanout", "recurse": { "key": "again" } }),
    );
    assert!(out.status.success(), "{}", said(&out));
    let answer = output(&service, "cycle");
    let refused = answer["child"]["refused"].as_str().unwrap();
    assert!(
        refused.starts_with("spawn refused: ") && refused.contains("would repeat for ever"),
        "{answer}"
    );
    assert_eq!(children_of(&service, "cycle").len(), 1, "{answer}");
    assert_eq!(server.seen().len(), 0);
}

/// `examples/fanout`: one child per document, a join, two tools asked at once, a digest
/// published once. Run by `idem run` with no worker; each model call reaches the
/// loopback stand-in once per key, and the digest's line is written once, also when the
/// run is asked again.
#[test]
fn the_fanout_example_digests_through_children_each_call_once() {
    let server = TestServer::start();
    let service = Service::new();
    let data = tempfile::tempdir().unwrap();
    let grant = format!("127.0.0.1:{}", server.port());
    let dir = format!("{}::/data", data.path().display());
    service.ok(&[
        "deploy",
        FANOUT_DIGEST,
        "--name",
        "summarize",
        "--allow-http",
        &grant,
    ]);
    let docs: Vec<String> = (0..3)
        .map(|i| format!("document {i} about shipping"))
        .collect();
    let input = json!({ "docs": docs, "model": server.url(), "child": "summarize",
                        "log": "/data/digest.log" });
    for _ in 0..2 {
        let out = service.cli(&[
            "run",
            FANOUT_DIGEST,
            "--run-id",
            "digest-1",
            "--allow-http",
            &grant,
            "--dir",
            &dir,
            "--input",
            &input.to_string(),
        ]);
        assert!(out.status.success(), "{}", said(&out));
    }
    let out = output(&service, "digest-1");
    assert_eq!(out["summaries"].as_array().unwrap().len(), 3, "{out}");
    assert_eq!(out["title"], "POST /title ok", "{out}");
    assert_eq!(out["tags"], "POST /tags ok", "{out}");
    let keys = by_key(&server.seen());
    assert_eq!(keys.len(), 5, "three summaries, a title and tags: {keys:?}");
    assert!(keys.values().all(|tokens| tokens.len() == 1), "{keys:?}");
    let log = std::fs::read_to_string(data.path().join("digest.log")).unwrap();
    assert_eq!(log, "POST /title ok [POST /tags ok]: 3 summaries\n");
}
