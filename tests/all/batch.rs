//! Bulk submission: `idem submit --batch` and `POST /api/runs/batch` queue many runs in
//! one command, one call and one transaction of the store, each answered as a lone
//! submit of it would be; workers then run each once, counted at a loopback server.

use std::io::Write;

use serde_json::{Value, json};

use crate::http::TestServer;
use crate::postgres::Schema;
use crate::util::stderr;
use crate::workers::{Service, assert_all_completed, deploy_fetcher};

const RUNS: usize = 300;

/// Writes `lines` to a file in the service's dir; its `@PATH` for `--batch`.
fn batch_file(service: &Service, name: &str, lines: &[String]) -> String {
    let path = service.path().with_file_name(name);
    let mut file = std::fs::File::create(&path).unwrap();
    for line in lines {
        writeln!(file, "{line}").unwrap();
    }
    format!("@{}", path.display())
}

fn a_batch_is_queued_at_once_and_each_run_runs_once(service: &Service) {
    let server = TestServer::start();
    deploy_fetcher(service, &server, &[]);
    let run = |i: usize| {
        json!({"input": {"steps": 1, "url": server.url()}, "run_id": format!("b{i:03}")})
            .to_string()
    };
    let mut lines: Vec<String> = (0..RUNS).map(run).collect();
    // A refused run among them: the others are queued, the command exits 2.
    lines.insert(
        7,
        json!({"input": {"steps": 1}, "run_id": "too-urgent", "priority": 5000}).to_string(),
    );
    lines.push(String::new());
    let all = batch_file(service, "runs.jsonl", &lines);
    let out = service.cli(&["submit", "fetcher", "--batch", &all]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("line 8: refused: priority 5000"), "{said}");
    assert!(
        said.contains(&format!(
            "{RUNS} submitted, 0 existed with their input, 1 refused"
        )),
        "{said}"
    );
    assert_eq!(service.runs().len(), RUNS);

    // Again, as JSON: every run exists with its input; nothing new.
    let again: Vec<String> = (0..RUNS).map(run).collect();
    let again = batch_file(service, "again.jsonl", &again);
    let doc: Value =
        serde_json::from_str(&service.ok(&["submit", "fetcher", "--batch", &again, "--json"]))
            .unwrap();
    let docs = doc.as_array().unwrap();
    assert_eq!(docs.len(), RUNS);
    assert!(
        docs.iter()
            .all(|d| d["created"] == false && d["status"] == "queued")
    );

    // A bad line anywhere: nothing is queued, and the line is named.
    let mut bad: Vec<String> = (0..3)
        .map(|i| json!({"input": i, "run_id": format!("late-{i}")}).to_string())
        .collect();
    bad.insert(2, "{\"input\": 1, \"run\": 2}".to_string());
    let bad = batch_file(service, "bad.jsonl", &bad);
    let out = service.cli(&["submit", "fetcher", "--batch", &bad]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--batch line 3"), "{}", stderr(&out));
    assert_eq!(
        service.runs().len(),
        RUNS,
        "nothing of a bad batch is queued"
    );
    let out = service.cli(&["submit", "fetcher", "--batch", "--input", "1"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    let mut workers = [service.worker("w1", &[]), service.worker("w2", &[])];
    service.wait_all_finished(std::time::Duration::from_secs(300), || {});
    for worker in &mut workers {
        let _ = worker.kill();
        let _ = worker.wait();
    }
    assert_all_completed(service, &server, RUNS, 1);
    assert_eq!(
        server.seen().len(),
        RUNS,
        "each run's effect reached the server once"
    );
}

#[test]
fn a_batch_of_runs_is_queued_in_one_command_on_sqlite() {
    a_batch_is_queued_at_once_and_each_run_runs_once(&Service::new());
}

#[test]
fn a_batch_of_runs_is_queued_in_one_command_on_postgres() {
    let Some(schema) = Schema::create("batch") else {
        return;
    };
    a_batch_is_queued_at_once_and_each_run_runs_once(&Service::on_postgres(schema.url()));
}
