//! The JSON handlers: each parses its request strictly (a malformed one is a 4xx with
//! the reason) and calls what the `idem` commands call — [`crate::ops`] or the store.

use std::collections::HashMap;
use std::path::Path as FsPath;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::ServeState;
use super::error::ApiError;
use crate::ops::{self, BatchRun, RunView, ScheduleRequest, ScheduleView, SubmitRequest};
use crate::runtime::Authority;
use crate::store::{
    Cancelled, GcRequest, Overlap, Paused, Resolution, Resumed, RunFilter, RunStatus, ScheduleSpec,
};

type Answer = Result<(StatusCode, Json<Value>), ApiError>;

fn ok(value: Value) -> Answer {
    Ok((StatusCode::OK, Json(value)))
}

/// The body, if it came whole and within the limit.
fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new("body_too_large", e.body_text())
        } else {
            ApiError::new("bad_request", e.body_text())
        }
    })
}

/// Whether the request says its body is of `expected` content type (parameters aside).
fn content_type_is(headers: &HeaderMap, expected: &[&str]) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .is_some_and(|v| expected.contains(&v.as_str()))
}

/// A JSON body of type `T`: `application/json`, within the limit, the right shape.
fn json_body<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let bytes = body_bytes(body)?;
    if !content_type_is(headers, &["application/json"]) {
        return Err(ApiError::new(
            "unsupported_media_type",
            "the body must be JSON, sent with `Content-Type: application/json`",
        ));
    }
    serde_json::from_slice(&bytes).map_err(|e| ApiError::new("malformed_json", e.to_string()))
}

/// `GET /api/runs` query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    status: Option<String>,
    agent: Option<String>,
    parent: Option<String>,
    limit: Option<usize>,
    offset: Option<usize>,
}

const MAX_PAGE: usize = 1000;
/// Paging reads the runs before the page too: past this, filter instead.
const MAX_OFFSET: usize = 1_000_000;

pub(super) async fn list_runs(
    State(state): State<ServeState>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Answer {
    let Query(q) = query.map_err(|e| ApiError::new("bad_request", e.body_text()))?;
    let status = q
        .status
        .as_deref()
        .filter(|s| !s.is_empty())
        .map(str::parse::<RunStatus>)
        .transpose()
        .map_err(|e| ApiError::new("bad_request", e))?;
    let limit = q.limit.unwrap_or(100);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::new(
            "bad_request",
            format!("limit must be 1 to {MAX_PAGE}, not {limit}"),
        ));
    }
    let offset = q.offset.unwrap_or(0);
    if offset > MAX_OFFSET {
        return Err(ApiError::new(
            "bad_request",
            format!("offset must be at most {MAX_OFFSET}, not {offset}"),
        ));
    }
    // The store lists newest first with a limit: a page is the tail of the first
    // offset + limit + 1 runs (the one past the page says whether another follows).
    let want = offset + limit + 1;
    let mut runs = state
        .store
        .runs(&RunFilter {
            status,
            agent: q.agent.as_deref().filter(|a| !a.is_empty()),
            parent: q.parent.as_deref().filter(|p| !p.is_empty()),
            limit: Some(want),
        })
        .await?;
    let more = runs.len() > offset + limit;
    runs.truncate(offset + limit);
    let page: Vec<_> = runs.into_iter().skip(offset).collect();
    let now = state.store.now().await?;
    ok(json!({
        "runs": page,
        "next_offset": more.then_some(offset + limit),
        "now": now,
    }))
}

pub(super) async fn show_run(
    State(state): State<ServeState>,
    Path(run_id): Path<String>,
) -> Answer {
    let mut view = RunView::of(state.store.as_ref(), &run_id).await?;
    if let Some(prices) = &state.prices {
        view = view.priced(prices);
    }
    let log = state.store.logs(&run_id).await?;
    let mut doc =
        serde_json::to_value(&view).map_err(|e| ApiError::new("internal", e.to_string()))?;
    doc["log"] = Value::String(String::from_utf8_lossy(&log).into_owned());
    ok(doc)
}

pub(super) async fn run_events(
    State(state): State<ServeState>,
    Path(run_id): Path<String>,
) -> Answer {
    let timeline = crate::ops::timeline(state.store.as_ref(), &run_id).await?;
    let mut doc =
        serde_json::to_value(&timeline).map_err(|e| ApiError::new("internal", e.to_string()))?;
    // Each event also in words, as `idem show --events` prints it: the page shows the
    // same account as the terminal.
    if let Some(events) = doc["events"].as_array_mut() {
        for (value, event) in events.iter_mut().zip(&timeline.events) {
            value["summary"] = Value::String(event.summary());
        }
    }
    ok(doc)
}

pub(super) async fn run_history(
    State(state): State<ServeState>,
    Path(run_id): Path<String>,
) -> Answer {
    let history = ops::history(state.store.as_ref(), &run_id).await?;
    ok(serde_json::to_value(&history).map_err(|e| ApiError::new("internal", e.to_string()))?)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ForkBody {
    at: u64,
    input: Option<Value>,
    version: Option<u64>,
    run_id: Option<String>,
}

pub(super) async fn fork_run(
    State(state): State<ServeState>,
    Path(run_id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let b: ForkBody = json_body(&headers, body)?;
    let input = b
        .input
        .as_ref()
        .map(serde_json::to_vec)
        .transpose()
        .map_err(|e| ApiError::new("internal", e.to_string()))?;
    let forked = ops::fork(
        state.store.as_ref(),
        &ops::ForkSpec {
            run_id: &run_id,
            at: b.at,
            input: input.as_deref(),
            version: b.version,
            new_run_id: b.run_id.as_deref(),
        },
    )
    .await?;
    let r = &forked.record;
    Ok((
        StatusCode::CREATED,
        Json(json!({
            "run_id": r.run_id,
            "forked_from": run_id,
            "at": b.at,
            "status": r.status,
            "version": r.version,
            "namespace": forked.namespace,
            "reused": forked.reused,
            "checkpoint": forked.checkpoint,
        })),
    ))
}

pub(super) async fn show_step(
    State(state): State<ServeState>,
    Path((run_id, key)): Path<(String, String)>,
) -> Answer {
    let step = crate::ops::step_view(state.store.as_ref(), &run_id, &key).await?;
    let mut doc =
        serde_json::to_value(&step).map_err(|e| ApiError::new("internal", e.to_string()))?;
    if let Some(event) = &step.claimed_in {
        doc["claimed_in"]["summary"] = Value::String(event.summary());
    }
    ok(doc)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SubmitBody {
    agent: String,
    #[serde(default)]
    input: Value,
    run_id: Option<String>,
    namespace: Option<String>,
    #[serde(default)]
    priority: u32,
}

pub(super) async fn submit_run(
    State(state): State<ServeState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let b: SubmitBody = json_body(&headers, body)?;
    let input =
        serde_json::to_vec(&b.input).map_err(|e| ApiError::new("internal", e.to_string()))?;
    let submitted = ops::submit(
        state.store.as_ref(),
        &SubmitRequest {
            agent: &b.agent,
            input: &input,
            run_id: b.run_id.as_deref(),
            namespace: b.namespace.as_deref(),
            priority: b.priority,
        },
        Authority::clone,
    )
    .await?;
    let r = &submitted.record;
    let status = if submitted.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((
        status,
        Json(json!({
            "run_id": r.run_id,
            "status": r.status,
            "created": submitted.created,
            "agent": r.agent,
            "digest": r.digest,
        })),
    ))
}

/// The most runs one batch may queue: a bound on the one transaction it takes.
const MAX_BATCH: usize = 10_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SubmitRunsBody {
    agent: String,
    namespace: Option<String>,
    runs: Vec<BatchRunBody>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BatchRunBody {
    #[serde(default)]
    input: Value,
    run_id: Option<String>,
    #[serde(default)]
    priority: u32,
}

pub(super) async fn submit_runs(
    State(state): State<ServeState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let b: SubmitRunsBody = json_body(&headers, body)?;
    if b.runs.is_empty() || b.runs.len() > MAX_BATCH {
        return Err(ApiError::new(
            "bad_request",
            format!("a batch holds 1 to {MAX_BATCH} runs, not {}", b.runs.len()),
        ));
    }
    let inputs = b
        .runs
        .iter()
        .map(|run| serde_json::to_vec(&run.input))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| ApiError::new("internal", e.to_string()))?;
    let runs: Vec<BatchRun<'_>> = b
        .runs
        .iter()
        .zip(&inputs)
        .map(|(run, input)| BatchRun {
            input,
            run_id: run.run_id.as_deref(),
            priority: run.priority,
        })
        .collect();
    let answers = ops::submit_many(
        state.store.as_ref(),
        &b.agent,
        b.namespace.as_deref(),
        &runs,
        Authority::clone,
    )
    .await?;
    let docs: Vec<Value> = answers
        .into_iter()
        .map(|answer| match answer {
            Ok(submitted) => {
                let r = &submitted.record;
                json!({
                    "run_id": r.run_id,
                    "status": r.status,
                    "created": submitted.created,
                })
            }
            Err(e) => {
                let e = ApiError::from(e);
                json!({ "error": { "code": e.code, "message": e.message } })
            }
        })
        .collect();
    ok(json!({ "runs": docs }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SignalBody {
    name: String,
    #[serde(default)]
    payload: Value,
}

pub(super) async fn signal_run(
    State(state): State<ServeState>,
    Path(run_id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let b: SignalBody = json_body(&headers, body)?;
    let payload =
        serde_json::to_vec(&b.payload).map_err(|e| ApiError::new("internal", e.to_string()))?;
    // Held to the run's own state limit, as `idem signal` holds it.
    let sent =
        crate::runtime::send_signal(state.store.as_ref(), &run_id, &b.name, &payload).await?;
    ok(json!({ "woke": sent.woke }))
}

pub(super) async fn resolve_key(
    State(state): State<ServeState>,
    Path(run_id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    // Read as a map, not a struct: `"result": null` (the effect returned null) is a
    // result, unlike a missing `result`.
    let b: HashMap<String, Value> = json_body(&headers, body)?;
    if let Some(other) = b
        .keys()
        .find(|k| !["key", "result", "retry"].contains(&k.as_str()))
    {
        return Err(ApiError::new(
            "malformed_json",
            format!("unknown field `{other}`, expected `key`, `result` or `retry`"),
        ));
    }
    let key = b
        .get("key")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::new("malformed_json", "`key` must be given, as a string"))?;
    let retry = match b.get("retry") {
        None => false,
        Some(Value::Bool(retry)) => *retry,
        Some(_) => return Err(ApiError::new("malformed_json", "`retry` must be a boolean")),
    };
    let result = match (b.get("result"), retry) {
        (Some(result), false) => {
            Some(serde_json::to_vec(result).map_err(|e| ApiError::new("internal", e.to_string()))?)
        }
        (None, true) => None,
        _ => {
            return Err(ApiError::new(
                "bad_request",
                "give exactly one of `result` (the effect happened) and `\"retry\": true`",
            ));
        }
    };
    let resolution = match &result {
        Some(bytes) => Resolution::Commit(bytes),
        None => Resolution::Retry,
    };
    let resolved = ops::resolve(state.store.as_ref(), &run_id, key, resolution).await?;
    ok(json!({ "key": resolved.key, "status": resolved.status }))
}

pub(super) async fn cancel_run(
    State(state): State<ServeState>,
    Path(run_id): Path<String>,
) -> Answer {
    let report = ops::cancel(state.store.as_ref(), &run_id).await?;
    let descendants: Vec<_> = report
        .descendants
        .iter()
        .map(|d| json!({ "run_id": d.run_id, "status": d.status, "cancel_requested": d.cancel_requested }))
        .collect();
    match report.run {
        Cancelled::Now => ok(json!({ "cancelled": "now", "descendants": descendants })),
        Cancelled::Requested { lease } => ok(json!({
            "cancelled": "requested",
            "worker": lease.worker,
            "descendants": descendants,
        })),
    }
}

/// `POST /api/gc` body: every field optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GcBody {
    finished_before: Option<String>,
    dedupe_window: Option<String>,
    history_before: Option<String>,
    #[serde(default)]
    include_failed: bool,
    #[serde(default)]
    dry_run: bool,
}

pub(super) async fn gc(
    State(state): State<ServeState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let b: GcBody = json_body(&headers, body)?;
    let age = |what, given: Option<String>, default| match given {
        Some(text) => ops::parse_age(what, &text),
        None => Ok(default),
    };
    let req = GcRequest {
        finished_before: age(
            "finished_before",
            b.finished_before,
            ops::DEFAULT_FINISHED_BEFORE,
        )?,
        dedupe_window: age("dedupe_window", b.dedupe_window, ops::DEFAULT_DEDUPE_WINDOW)?,
        include_failed: b.include_failed,
        history_before: b
            .history_before
            .map(|text| ops::parse_age("history_before", &text))
            .transpose()?,
        dry_run: b.dry_run,
    };
    let report = ops::gc(state.store.as_ref(), &req).await?;
    ok(json!({ "dry_run": req.dry_run, "report": report }))
}

pub(super) async fn list_flow(State(state): State<ServeState>) -> Answer {
    let limits = state.store.flows().await?;
    ok(json!({ "limits": limits }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SetFlowBody {
    deployment: String,
    max_running: Option<u32>,
    key: Option<String>,
    per_key: Option<u32>,
}

pub(super) async fn set_flow(
    State(state): State<ServeState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let b: SetFlowBody = json_body(&headers, body)?;
    let limits = state
        .store
        .set_flow(&crate::store::FlowSetting {
            deployment: &b.deployment,
            max_running: b.max_running,
            key: b.key.as_deref(),
            per_key: b.per_key,
        })
        .await?;
    ok(json!({ "limits": limits }))
}

pub(super) async fn clear_flow(
    State(state): State<ServeState>,
    Path(deployment): Path<String>,
) -> Answer {
    let cleared = state.store.clear_flow(&deployment).await?;
    ok(json!({ "deployment": deployment, "cleared": cleared }))
}

pub(super) async fn list_rates(State(state): State<ServeState>) -> Answer {
    let limits = state.store.rates().await?;
    ok(json!({ "limits": limits }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SetRateBody {
    class: String,
    limit: u32,
    #[serde(default = "a_minute")]
    period_ms: u64,
    #[serde(default = "one")]
    burst: u32,
}

fn a_minute() -> u64 {
    60_000
}

fn one() -> u32 {
    1
}

pub(super) async fn set_rate(
    State(state): State<ServeState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let b: SetRateBody = json_body(&headers, body)?;
    let limit = state
        .store
        .set_rate(&crate::store::RateSetting {
            class: &b.class,
            limit: b.limit,
            period: std::time::Duration::from_millis(b.period_ms),
            burst: b.burst,
        })
        .await?;
    ok(json!({ "limit": limit }))
}

pub(super) async fn clear_rate(
    State(state): State<ServeState>,
    Path(class): Path<String>,
) -> Answer {
    let cleared = state.store.clear_rate(&class).await?;
    ok(json!({ "class": class, "cleared": cleared }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct UsageQuery {
    deployment: Option<String>,
    run: Option<String>,
}

pub(super) async fn usage(
    State(state): State<ServeState>,
    query: Result<Query<UsageQuery>, axum::extract::rejection::QueryRejection>,
) -> Answer {
    let Query(q) = query.map_err(|e| ApiError::new("bad_request", e.body_text()))?;
    let filter = crate::store::UsageFilter {
        run_id: q.run.as_deref(),
        deployment: q.deployment.as_deref(),
    };
    let totals = state.store.usage(&filter).await?;
    let usage = crate::ops::PricedUsage::of(totals, state.prices.as_deref());
    ok(json!({ "usage": usage }))
}

pub(super) async fn list_deployments(State(state): State<ServeState>) -> Answer {
    let deployments = state.store.deployments().await?;
    let paused = state.store.paused_deployments().await?;
    ok(json!({ "deployments": deployments, "paused": paused }))
}

pub(super) async fn list_versions(
    State(state): State<ServeState>,
    Path(name): Path<String>,
) -> Answer {
    let versions = ops::versions(state.store.as_ref(), &name).await?;
    ok(json!({ "deployment": name, "versions": versions }))
}

/// `POST /api/deployments/{name}/upgrade` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct UpgradeBody {
    to: u64,
    #[serde(default)]
    runs: Vec<String>,
}

pub(super) async fn upgrade_runs(
    State(state): State<ServeState>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let body: UpgradeBody = json_body(&headers, body)?;
    let moved = ops::upgrade(state.store.as_ref(), &name, body.to, &body.runs).await?;
    ok(json!({ "deployment": name, "moved": moved }))
}

pub(super) async fn rehearse_upgrade(
    State(state): State<ServeState>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let body: UpgradeBody = json_body(&headers, body)?;
    let report = ops::rehearse(
        &state.store,
        &state.runtime,
        &name,
        body.to,
        &body.runs,
        &std::env::temp_dir(),
    )
    .await?;
    ok(json!({
        "deployment": name,
        "to_version": body.to,
        "safe": report.is_safe(),
        "report": report,
    }))
}

/// `POST /api/deployments/{name}/rollback` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RollbackBody {
    #[serde(default)]
    runs: Vec<String>,
}

pub(super) async fn rollback_runs(
    State(state): State<ServeState>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let body: RollbackBody = json_body(&headers, body)?;
    let moved = ops::rollback(state.store.as_ref(), &name, &body.runs).await?;
    ok(json!({ "deployment": name, "moved": moved }))
}

pub(super) async fn pause_run(
    State(state): State<ServeState>,
    Path(run_id): Path<String>,
) -> Answer {
    match ops::pause(state.store.as_ref(), &run_id).await? {
        Paused::Now => ok(json!({ "paused": "now" })),
        Paused::Requested { lease } => ok(json!({ "paused": "requested", "worker": lease.worker })),
        Paused::Already => ok(json!({ "paused": "already" })),
    }
}

pub(super) async fn resume_run(
    State(state): State<ServeState>,
    Path(run_id): Path<String>,
) -> Answer {
    let resumed = ops::resume(state.store.as_ref(), &run_id).await?;
    ok(json!({ "resumed": resumed == Resumed::Now }))
}

pub(super) async fn pause_deployment(
    State(state): State<ServeState>,
    Path(name): Path<String>,
) -> Answer {
    let (name, paused) = ops::pause_deployment(state.store.as_ref(), &name).await?;
    ok(
        json!({ "deployment": name, "was_paused": paused.was_paused, "runs": paused.runs, "held": paused.held }),
    )
}

pub(super) async fn resume_deployment(
    State(state): State<ServeState>,
    Path(name): Path<String>,
) -> Answer {
    let (name, resumed) = ops::resume_deployment(state.store.as_ref(), &name).await?;
    ok(
        json!({ "deployment": name, "was_paused": resumed.was_paused, "runs": resumed.runs, "held": 0 }),
    )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DeployQuery {
    name: String,
    in_flight: Option<crate::store::InFlight>,
}

pub(super) async fn deploy(
    State(state): State<ServeState>,
    query: Result<Query<DeployQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let Query(q) = query.map_err(|e| ApiError::new("bad_request", e.body_text()))?;
    let bytes = body_bytes(body)?;
    if !content_type_is(&headers, &["application/wasm", "application/octet-stream"]) {
        return Err(ApiError::new(
            "unsupported_media_type",
            "the body must be the component, sent as `application/wasm`",
        ));
    }
    crate::runtime::check_namespace(&q.name)?;
    // Checking and compiling a component takes a core for a while: off the executor.
    let runtime = std::sync::Arc::clone(&state.runtime);
    let name = q.name.clone();
    let agent = tokio::task::spawn_blocking(move || {
        runtime.load_bytes(FsPath::new("the request body"), &name, &bytes)
    })
    .await
    .map_err(|e| ApiError::new("internal", e.to_string()))??;
    // What an upload may grant is the default: no directories, variables or hosts.
    // Wider grants name this machine's files, so they are deployed from this machine.
    let in_flight = q.in_flight.unwrap_or_default();
    let deployed = ops::deploy(
        state.store.as_ref(),
        &agent,
        &q.name,
        &Authority::default(),
        in_flight,
    )
    .await?;
    ok(json!({
        "name": deployed.record.name,
        "digest": deployed.record.digest,
        "version": deployed.record.version,
        "new_component": deployed.new_component,
        "deployed_at": deployed.record.deployed_at,
        "in_flight": in_flight,
        "moved": deployed.moved,
        "kept": deployed.kept,
    }))
}

pub(super) async fn list_schedules(State(state): State<ServeState>) -> Answer {
    let schedules = state.store.schedules().await?;
    let now = state.store.now().await?;
    ok(json!({ "schedules": schedules, "now": now }))
}

/// `POST /api/schedules` body: exactly one of `cron` and `every`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CreateScheduleBody {
    name: String,
    deployment: String,
    cron: Option<String>,
    tz: Option<String>,
    every: Option<String>,
    #[serde(default)]
    input: Value,
    #[serde(default)]
    catch_up: u32,
    #[serde(default)]
    overlap: Overlap,
}

pub(super) async fn create_schedule(
    State(state): State<ServeState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let b: CreateScheduleBody = json_body(&headers, body)?;
    let spec = match (b.cron, b.every, b.tz) {
        (Some(expr), None, tz) => ScheduleSpec::Cron {
            expr,
            tz: tz.unwrap_or_else(|| "UTC".to_owned()),
        },
        (None, Some(every), None) => ScheduleSpec::Every {
            every_ms: ops::parse_every(&every)?,
        },
        _ => {
            return Err(ApiError::new(
                "bad_request",
                "give exactly one of `cron` (with `tz`, UTC by default) and `every`",
            ));
        }
    };
    let input =
        serde_json::to_vec(&b.input).map_err(|e| ApiError::new("internal", e.to_string()))?;
    let record = ops::create_schedule(
        state.store.as_ref(),
        &ScheduleRequest {
            name: &b.name,
            deployment: &b.deployment,
            spec,
            input: &input,
            catch_up: b.catch_up,
            overlap: b.overlap,
        },
    )
    .await?;
    let view = ScheduleView::of(state.store.as_ref(), &record.name).await?;
    let doc = serde_json::to_value(&view).map_err(|e| ApiError::new("internal", e.to_string()))?;
    Ok((StatusCode::CREATED, Json(doc)))
}

pub(super) async fn show_schedule(
    State(state): State<ServeState>,
    Path(name): Path<String>,
) -> Answer {
    let view = ScheduleView::of(state.store.as_ref(), &name).await?;
    ok(serde_json::to_value(&view).map_err(|e| ApiError::new("internal", e.to_string()))?)
}

pub(super) async fn delete_schedule(
    State(state): State<ServeState>,
    Path(name): Path<String>,
) -> Answer {
    state.store.delete_schedule(&name).await?;
    ok(json!({ "deleted": name }))
}

pub(super) async fn pause_schedule(
    State(state): State<ServeState>,
    Path(name): Path<String>,
) -> Answer {
    let schedule = state.store.pause_schedule(&name, true).await?;
    ok(json!({ "schedule": schedule }))
}

pub(super) async fn resume_schedule(
    State(state): State<ServeState>,
    Path(name): Path<String>,
) -> Answer {
    let schedule = state.store.pause_schedule(&name, false).await?;
    ok(json!({ "schedule": schedule }))
}
