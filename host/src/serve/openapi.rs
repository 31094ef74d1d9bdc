//! The OpenAPI 3.1 document, written from the route table ([`super::ROUTES`]) and the
//! error codes ([`super::CODES`]): every route the router answers is in it, and
//! nothing else.

use axum::Json;
use serde_json::{Map, Value, json};

use super::error::CODES;
use super::routes::{Access, Body, ROUTES};

/// The document.
pub fn document() -> Value {
    let mut paths = Map::new();
    for route in ROUTES {
        let entry = paths
            .entry(route.path.to_string())
            .or_insert_with(|| json!({}));
        let mut parameters: Vec<Value> = path_parameters(route.path)
            .map(|name| {
                json!({ "name": name, "in": "path", "required": true, "schema": { "type": "string" } })
            })
            .collect();
        parameters.extend(route.query.iter().map(|(name, description)| {
            json!({
                "name": name,
                "in": "query",
                "required": route.id == "deploy",
                "description": description,
                "schema": { "type": "string" },
            })
        }));
        if route.id == "stream_run" {
            parameters.push(json!({
                "name": "Last-Event-ID",
                "in": "header",
                "required": false,
                "description": "resume after the event with this id (a chunk's sequence number); \
                                a browser's EventSource sends it when it reconnects",
                "schema": { "type": "string" },
            }));
        }
        let mut op = json!({
            "operationId": route.id,
            "summary": route.summary,
            "parameters": parameters,
            "responses": {
                "200": {
                    "description": "done",
                    "content": { route.responds: {} },
                },
                "default": {
                    "description": "refused: see the error's code",
                    "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } },
                },
            },
        });
        // These answers say what was done: their shapes are documented.
        let answer = match route.id {
            "cancel_run" => Some("Cancelled"),
            "pause_run" => Some("Paused"),
            "resume_run" => Some("Resumed"),
            "pause_deployment" | "resume_deployment" => Some("DeploymentPaused"),
            "run_events" => Some("Timeline"),
            _ => None,
        };
        if route.id == "stream_run" {
            // Server-sent events: each event's data is JSON of the schema its name says.
            op["responses"]["200"]["x-idem-events"] = json!({
                "message": { "$ref": "#/components/schemas/LiveChunk" },
                "end": { "$ref": "#/components/schemas/StreamEnd" },
                "failure": { "$ref": "#/components/schemas/StreamFailure" },
            });
        }
        if let Some(schema) = answer {
            op["responses"]["200"]["content"][route.responds] =
                json!({ "schema": { "$ref": format!("#/components/schemas/{schema}") } });
        }
        match route.access {
            Access::Page => op["security"] = json!([]),
            Access::Read => op["x-idem-access"] = json!("read"),
            Access::Mutate => op["x-idem-access"] = json!("mutate"),
        }
        match route.body {
            Body::Empty => {}
            Body::Json(schema) => {
                op["requestBody"] = json!({
                    "required": true,
                    "content": { "application/json": { "schema": { "$ref": format!("#/components/schemas/{schema}") } } },
                });
            }
            Body::Component => {
                op["requestBody"] = json!({
                    "required": true,
                    "content": { "application/wasm": { "schema": { "type": "string", "format": "binary" } } },
                });
            }
        }
        entry[route.method.to_ascii_lowercase()] = op;
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "idem",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Runs, their steps and parked keys, over one idem store. Reads are \
                            open on loopback; mutating requests need the bearer token.",
        },
        "paths": paths,
        "security": [{ "bearer": [] }],
        "components": {
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
            "schemas": schemas(),
        },
    })
}

/// The `{name}` parameters of a path, in order.
pub(crate) fn path_parameters(path: &str) -> impl Iterator<Item = &str> {
    path.split('/')
        .filter_map(|part| part.strip_prefix('{').and_then(|p| p.strip_suffix('}')))
}

fn schemas() -> Value {
    let codes: Vec<&str> = CODES.iter().map(|(code, _, _)| *code).collect();
    json!({
        "LiveChunk": {
            "type": "object",
            "required": ["seq", "key", "text"],
            "properties": {
                "seq": { "type": "integer", "minimum": 0, "description": "the chunk's sequence number in its run (the event's id)" },
                "key": { "type": "string", "description": "the step that published it" },
                "text": { "type": "string", "description": "the text, control characters escaped" },
            },
        },
        "Timeline": {
            "type": "object",
            "required": ["events", "dropped"],
            "properties": {
                "events": { "type": "array", "items": {
                    "type": "object",
                    "required": ["seq", "at", "kind", "holder", "token", "detail", "summary"],
                    "properties": {
                        "seq": { "type": "integer", "minimum": 1, "description": "the event's place in its run's timeline" },
                        "at": { "type": "integer", "description": "when, in ms since the epoch on the store's clock" },
                        "kind": { "type": "string", "enum": ["started", "took_over", "recycled", "waiting", "released", "finished", "signal", "paused", "resumed", "cancelled", "upgraded"] },
                        "holder": { "type": ["string", "null"], "description": "the worker whose lease it happened under" },
                        "token": { "type": ["integer", "null"], "description": "the run lease token it happened under" },
                        "detail": { "type": "object", "description": "the kind's facts: instance; from_holder, from_token, expired_at; reason; due, signal, join; note, paused; status; name, woke; from, to" },
                        "summary": { "type": "string", "description": "the event in words, as idem show --events prints it" },
                    },
                } },
                "dropped": { "type": "integer", "minimum": 0, "description": "events between the first and the last kept, dropped to bound the timeline" },
            },
        },
        "StreamEnd": {
            "type": "object",
            "required": ["status"],
            "properties": {
                "status": { "type": ["string", "null"], "description": "the run's status as it ended (null: the run was collected meanwhile)" },
            },
        },
        "StreamFailure": {
            "type": "object",
            "required": ["message"],
            "properties": { "message": { "type": "string", "description": "why the stream stopped (the store failed); reconnect to resume" } },
        },
        "Error": {
            "type": "object",
            "required": ["error"],
            "properties": { "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {
                    "code": { "type": "string", "enum": codes },
                    "message": { "type": "string" },
                },
            } },
        },
        "SubmitRun": {
            "type": "object",
            "required": ["agent"],
            "additionalProperties": false,
            "properties": {
                "agent": { "type": "string", "description": "deployment name or component digest" },
                "input": { "description": "the run's input (any JSON; null when absent)" },
                "run_id": { "type": "string" },
                "namespace": { "type": "string" },
                "priority": {
                    "type": "integer", "minimum": 0, "maximum": 1000,
                    "description": "workers lease due runs of higher priority first (default 0)",
                },
            },
        },
        "SubmitRuns": {
            "type": "object",
            "required": ["agent", "runs"],
            "additionalProperties": false,
            "properties": {
                "agent": { "type": "string", "description": "deployment name or component digest" },
                "namespace": { "type": "string" },
                "runs": {
                    "type": "array",
                    "maxItems": 10000,
                    "items": {
                        "type": "object",
                        "additionalProperties": false,
                        "properties": {
                            "input": { "description": "the run's input (any JSON; null when absent)" },
                            "run_id": { "type": "string" },
                            "priority": { "type": "integer", "minimum": 0, "maximum": 1000 },
                        },
                    },
                },
            },
        },
        "Fork": {
            "type": "object",
            "required": ["at"],
            "additionalProperties": false,
            "properties": {
                "at": { "type": "integer", "minimum": 1, "description": "the step to fork at, numbered as the run's history numbers its committed steps" },
                "input": { "description": "the fork's input (default: the run's)" },
                "version": { "type": "integer", "minimum": 1, "description": "the version of the run's deployment to run (default: the run's)" },
                "run_id": { "type": "string", "description": "the fork's run id (default: the run's id, -fork- and eight hex digits)" },
            },
        },
        "Upgrade": {
            "type": "object",
            "required": ["to"],
            "additionalProperties": false,
            "properties": {
                "to": { "type": "integer", "minimum": 1, "description": "the version to move the runs to" },
                "runs": {
                    "type": "array",
                    "items": { "type": "string" },
                    "description": "the runs to move (default: every run of the deployment that has not ended)",
                },
            },
        },
        "Rollback": {
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "runs": {
                    "type": "array",
                    "items": { "type": "string" },
                    "description": "the runs to move back (default: every run of the deployment that has not ended and has moved before)",
                },
            },
        },
        "SetFlow": {
            "type": "object",
            "required": ["deployment"],
            "additionalProperties": false,
            "description": "at least one limit; key and per_key together",
            "properties": {
                "deployment": { "type": "string" },
                "max_running": { "type": "integer", "minimum": 1, "maximum": 1000000 },
                "key": { "type": "string", "description": "a JSON pointer into each run's input" },
                "per_key": { "type": "integer", "minimum": 1, "maximum": 1000000 },
            },
        },
        "SetRate": {
            "type": "object",
            "required": ["class", "limit"],
            "additionalProperties": false,
            "properties": {
                "class": { "type": "string", "description": "the class agents name on their steps" },
                "limit": { "type": "integer", "minimum": 1, "maximum": 1000000,
                           "description": "steps of the class that start per period, spaced evenly" },
                "period_ms": { "type": "integer", "minimum": 1, "maximum": 86400000,
                               "description": "the period, in milliseconds (default a minute)" },
                "burst": { "type": "integer", "minimum": 1, "maximum": 1000000,
                           "description": "steps that may start at once after the class was idle (default 1)" },
            },
        },
        "Signal": {
            "type": "object",
            "required": ["name"],
            "additionalProperties": false,
            "properties": {
                "name": { "type": "string" },
                "payload": { "description": "any JSON; null when absent" },
            },
        },
        "Resolve": {
            "type": "object",
            "required": ["key"],
            "additionalProperties": false,
            "description": "exactly one of result and retry",
            "properties": {
                "key": { "type": "string", "description": "the agent's key or namespace:key" },
                "result": { "description": "the effect happened: its result (any JSON)" },
                "retry": { "type": "boolean", "const": true },
            },
        },
        "Cancelled": {
            "type": "object",
            "required": ["cancelled", "descendants"],
            "properties": {
                "cancelled": { "type": "string", "enum": ["now", "requested"], "description": "now: no worker held the run; requested: its worker stops it at its next host call" },
                "worker": { "type": "string", "description": "the worker asked to stop it (requested only)" },
                "descendants": {
                    "type": "array",
                    "description": "the run's descendants the cancel reached (not detached, not ended before), as they stand after it",
                    "items": {
                        "type": "object",
                        "required": ["run_id", "status", "cancel_requested"],
                        "properties": {
                            "run_id": { "type": "string" },
                            "status": { "type": "string" },
                            "cancel_requested": { "type": "boolean", "description": "still running, the cancel asked of its worker" },
                        },
                    },
                },
            },
        },
        "CreateSchedule": {
            "type": "object",
            "required": ["name", "deployment"],
            "additionalProperties": false,
            "description": "exactly one of cron and every",
            "properties": {
                "name": { "type": "string", "description": "unique in the store; no '/' or '@' (runs are named <name>@<tick>)" },
                "deployment": { "type": "string", "description": "the deployment each tick starts a run of" },
                "cron": { "type": "string", "description": "5 fields, or 6 with seconds first" },
                "tz": { "type": "string", "description": "the IANA zone the cron expression is read in (default UTC)" },
                "every": { "type": "string", "description": "an interval aligned to the Unix epoch, as 500ms, 30s, 5m, 1h or 1d (100ms to 366d)" },
                "input": { "description": "every run's input (any JSON; null when absent)" },
                "catch_up": { "type": "integer", "minimum": 0, "maximum": 1000, "description": "missed ticks started when late, before the latest (default 0: only the latest)" },
                "overlap": { "type": "string", "enum": ["skip", "allow", "cancel-previous"], "description": "what a tick does while the previous run is queued or running (default skip)" },
            },
        },
        "Paused": {
            "type": "object",
            "required": ["paused"],
            "properties": {
                "paused": { "type": "string", "enum": ["now", "requested", "already"], "description": "now: no worker held the run; requested: its worker stops it at its next host call and gives it back; already: it was paused, nothing changed" },
                "worker": { "type": "string", "description": "the worker asked to stop it (requested only)" },
            },
        },
        "Resumed": {
            "type": "object",
            "required": ["resumed"],
            "properties": {
                "resumed": { "type": "boolean", "description": "false: the run was not paused, nothing changed" },
            },
        },
        "DeploymentPaused": {
            "type": "object",
            "required": ["deployment", "was_paused", "runs", "held"],
            "properties": {
                "deployment": { "type": "string", "description": "the deployment's name" },
                "was_paused": { "type": "boolean", "description": "whether it was paused before the call" },
                "runs": { "type": "integer", "description": "runs the call paused (or resumed)" },
                "held": { "type": "integer", "description": "of the runs paused, those a worker held: each stops at its next host call" },
            },
        },
        "Gc": {
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "finished_before": { "type": "string", "description": "runs finished this long ago go, as 30d, 12h, 90m or 30s (default 30d)" },
                "dedupe_window": { "type": "string", "description": "keys committed within this stay (default 7d)" },
                "include_failed": { "type": "boolean", "description": "failed runs count as finished (default false)" },
                "history_before": { "type": "string", "description": "finished runs that stay keep only their last checkpoint once they finished this long ago (default: kept)" },
                "dry_run": { "type": "boolean", "description": "count only (default false)" },
            },
        },
    })
}

pub(super) async fn serve() -> Json<Value> {
    Json(document())
}
