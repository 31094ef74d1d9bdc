//! With the `otlp` feature, `idem run` exports its spans over OTLP/HTTP to the
//! collector `OTEL_EXPORTER_OTLP_ENDPOINT` names: a loopback server stands in for it
//! and finds the run's and the steps' spans, and the run id, in what it received.

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::routing::post;
use idem_test_artifacts::STEPS;
use serde_json::json;

use crate::util::{CliDir, run_cli_env, stderr, tokio};

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

#[test]
fn idem_run_exports_its_spans_over_otlp() {
    let received: Arc<Mutex<Vec<u8>>> = Arc::default();
    let sink = Arc::clone(&received);
    let app = axum::Router::new().route(
        "/v1/traces",
        post(move |body: Bytes| {
            let sink = Arc::clone(&sink);
            async move {
                sink.lock().unwrap().extend_from_slice(&body);
                ""
            }
        }),
    );
    let listener = tokio()
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    tokio().spawn(async move { axum::serve(listener, app).await });

    let dir = CliDir::new();
    let input = json!({ "steps": 3, "log": "/data/log.txt" }).to_string();
    let grant = format!("{}::/data", dir.data().display());
    let db = dir.db();
    let endpoint = format!("http://{addr}");
    let out = run_cli_env(
        &[
            "run",
            STEPS,
            "--db",
            &db,
            "--dir",
            &grant,
            "--run-id",
            "traced-run-7",
            "--input",
            &input,
        ],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_ref())],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    // Flushed before the process exited.
    let body = received.lock().unwrap().clone();
    assert!(!body.is_empty(), "no spans were exported");
    for needle in ["idem.run", "idem.step", "traced-run-7", "executed"] {
        assert!(contains(&body, needle), "{needle} not in the export");
    }
}
