//! The one table of routes: the router is built from it and the OpenAPI document is
//! written from it, so the two cannot disagree.

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The page's HTML, script and style: hold no data, open to all.
    Page,
    /// Reads the store: open on loopback, the token anywhere else.
    Read,
    /// Changes the store: the token, unless the server runs without auth on loopback.
    Mutate,
}

/// What a route's request body is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// None.
    Empty,
    /// A JSON object; the name is its schema in the OpenAPI document.
    Json(&'static str),
    /// A WebAssembly component's bytes.
    Component,
}

/// One route.
#[derive(Debug, Clone, Copy)]
pub struct Route {
    /// `GET`, `POST` or `DELETE`.
    pub method: &'static str,
    /// The path, with `{name}` for a path parameter (axum and OpenAPI spell them alike).
    pub path: &'static str,
    /// The operation's id, which also picks its handler.
    pub id: &'static str,
    /// What it does.
    pub summary: &'static str,
    /// Who may call it.
    pub access: Access,
    /// Its request body.
    pub body: Body,
    /// Its query parameters: name and what it means.
    pub query: &'static [(&'static str, &'static str)],
    /// The content type it answers with on success.
    pub responds: &'static str,
}

const JSON: &str = "application/json";

/// Every route the server answers.
pub const ROUTES: &[Route] = &[
    Route {
        method: "GET",
        path: "/",
        id: "page_runs",
        summary: "The web page: the runs list",
        access: Access::Page,
        body: Body::Empty,
        query: &[],
        responds: "text/html",
    },
    Route {
        method: "GET",
        path: "/runs/{run_id}",
        id: "page_run",
        summary: "The web page: one run",
        access: Access::Page,
        body: Body::Empty,
        query: &[],
        responds: "text/html",
    },
    Route {
        method: "GET",
        path: "/deployments",
        id: "page_deployments",
        summary: "The web page: each deployment's versions with the runs on each, and a \
                  dry run of moving its runs in flight to one of them",
        access: Access::Page,
        body: Body::Empty,
        query: &[],
        responds: "text/html",
    },
    Route {
        method: "GET",
        path: "/assets/app.js",
        id: "page_script",
        summary: "The page's script",
        access: Access::Page,
        body: Body::Empty,
        query: &[],
        responds: "text/javascript",
    },
    Route {
        method: "GET",
        path: "/assets/app.css",
        id: "page_style",
        summary: "The page's style sheet",
        access: Access::Page,
        body: Body::Empty,
        query: &[],
        responds: "text/css",
    },
    Route {
        method: "GET",
        path: "/openapi.json",
        id: "openapi",
        summary: "This document",
        access: Access::Read,
        body: Body::Empty,
        query: &[],
        responds: JSON,
    },
    Route {
        method: "GET",
        path: "/metrics",
        id: "metrics",
        summary: "Metrics in the Prometheus text format",
        access: Access::Read,
        body: Body::Empty,
        query: &[],
        responds: "application/openmetrics-text",
    },
    Route {
        method: "GET",
        path: "/api/runs",
        id: "list_runs",
        summary: "Runs, newest first, filtered and paged",
        access: Access::Read,
        body: Body::Empty,
        query: &[
            (
                "status",
                "only runs with this status (queued, running, completed, failed, in-doubt, cancelled)",
            ),
            ("agent", "only runs of this agent (deployment name)"),
            ("parent", "only the child runs this run spawned"),
            ("limit", "at most this many runs (1 to 1000, default 100)"),
            ("offset", "skip this many runs first (default 0)"),
        ],
        responds: JSON,
    },
    Route {
        method: "POST",
        path: "/api/runs",
        id: "submit_run",
        summary: "Queue a run of a deployed agent (idempotent per run id and input)",
        access: Access::Mutate,
        body: Body::Json("SubmitRun"),
        query: &[],
        responds: JSON,
    },
    Route {
        method: "POST",
        path: "/api/runs/batch",
        id: "submit_runs",
        summary: "Queue many runs of one deployed agent in one transaction, each answered \
                  as a lone submit of it would be (a refused run does not stop the others)",
        access: Access::Mutate,
        body: Body::Json("SubmitRuns"),
        query: &[],
        responds: JSON,
    },
    Route {
        method: "GET",
        path: "/api/runs/{run_id}",
        id: "show_run",
        summary: "One run: its record (with its parent), steps, waits and joins, open claims, \
                  children (a count per status and the first 100), lease and log",
        access: Access::Read,
        body: Body::Empty,
        query: &[],
        responds: JSON,
    },
    Route {
        method: "GET",
        path: "/api/runs/{run_id}/stream",
        id: "stream_run",
        summary: "The run's live stream as server-sent events: the chunks kept, then each \
                  new one (`id` its sequence number, data `{seq, key, text}`; \
                  `Last-Event-ID` resumes after one), then an `end` event with the run's \
                  status. Not durable: the committed results are the truth",
        access: Access::Read,
        body: Body::Empty,
        query: &[],
        responds: "text/event-stream",
    },
    Route {
        method: "GET",
        path: "/api/runs/{run_id}/events",
        id: "run_events",
        summary: "The run's timeline, oldest first: each instance started (by which worker, \
                  under which lease token) and how it ended (recycled, waiting, released, \
                  finished), takeovers of leases that expired with the old and new tokens, \
                  signals, pauses, cancels and upgrades; its first 100 and last 900 events \
                  kept, `dropped` counting those between",
        access: Access::Read,
        body: Body::Empty,
        query: &[],
        responds: JSON,
    },
    Route {
        method: "GET",
        path: "/api/runs/{run_id}/steps/{key}",
        id: "show_step",
        summary: "One step of the run, opened (the key percent-encoded, as the run lists it \
                  or as the agent named it): its record, committed result, whether its claim \
                  was retaken, the instance that claimed it, and the run's checkpoint",
        access: Access::Read,
        body: Body::Empty,
        query: &[],
        responds: JSON,
    },
    Route {
        method: "GET",
        path: "/api/runs/{run_id}/history",
        id: "run_history",
        summary: "The run's step history: its committed steps in order, numbered as a fork \
                  takes them, and the checkpoints it keeps, each with how many steps came \
                  before it; `collected` when older checkpoints were collected",
        access: Access::Read,
        body: Body::Empty,
        query: &[],
        responds: JSON,
    },
    Route {
        method: "POST",
        path: "/api/runs/{run_id}/fork",
        id: "fork_run",
        summary: "Start a new run (queued) from the checkpoint the run saved before step \
                  `at`, reusing the results committed before it; later steps run again \
                  under the fork's own keys. Refused, creating nothing, for a step past \
                  the run's last, a collected history, an unknown version or one exporting \
                  something else, or a run id taken",
        access: Access::Mutate,
        body: Body::Json("Fork"),
        query: &[],
        responds: JSON,
    },
    Route {
        method: "POST",
        path: "/api/runs/{run_id}/signal",
        id: "signal_run",
        summary: "Send a signal to a run",
        access: Access::Mutate,
        body: Body::Json("Signal"),
        query: &[],
        responds: JSON,
    },
    Route {
        method: "POST",
        path: "/api/runs/{run_id}/resolve",
        id: "resolve_key",
        summary: "Settle a key the run parked in doubt: commit a result, or retry it",
        access: Access::Mutate,
        body: Body::Json("Resolve"),
        query: &[],
        responds: JSON,
    },
    Route {
        method: "POST",
        path: "/api/runs/{run_id}/cancel",
        id: "cancel_run",
        summary: "Cancel a run and its descendants that are not detached; the answer lists \
                  the descendants it reached",
        access: Access::Mutate,
        body: Body::Empty,
        query: &[],
        responds: JSON,
    },
    Route {
        method: "POST",
        path: "/api/runs/{run_id}/pause",
        id: "pause_run",
        summary: "Pause a run: no worker takes it until it is resumed; a worker holding it \
                  stops it at its next host call outside a side effect",
        access: Access::Mutate,
        body: Body::Empty,
        query: &[],
        responds: JSON,
    },
    Route {
        method: "POST",
        path: "/api/runs/{run_id}/resume",
        id: "resume_run",
        summary: "Resume a paused run: it goes on where it stopped",
        access: Access::Mutate,
        body: Body::Empty,
        query: &[],
        responds: JSON,
    },
    Route {
        method: "POST",
        path: "/api/deployments/{name}/pause",
        id: "pause_deployment",
        summary: "Pause a deployment: its unfinished runs, and every run started under its \
                  name until it is resumed",
        access: Access::Mutate,
        body: Body::Empty,
        query: &[],
        responds: JSON,
    },
    Route {
        method: "POST",
        path: "/api/deployments/{name}/resume",
        id: "resume_deployment",
        summary: "Resume a deployment and the runs paused with it (runs paused one by one \
                  stay paused)",
        access: Access::Mutate,
        body: Body::Empty,
        query: &[],
        responds: JSON,
    },
    Route {
        method: "GET",
        path: "/api/usage",
        id: "usage",
        summary: "Token usage of model calls per deployment and model: spent once per call, \
                  saved by replays, priced when the server has a price table",
        access: Access::Read,
        body: Body::Empty,
        query: &[
            ("deployment", "only the calls of this deployment's runs"),
            ("run", "only the calls of this run"),
        ],
        responds: JSON,
    },
    Route {
        method: "GET",
        path: "/api/deployments",
        id: "list_deployments",
        summary: "Every deployment name and the component it points at",
        access: Access::Read,
        body: Body::Empty,
        query: &[],
        responds: JSON,
    },
    Route {
        method: "GET",
        path: "/api/deployments/{name}/versions",
        id: "list_versions",
        summary: "Every version of a deployment, oldest first, with how many of its runs are \
                  on each (in flight and in all) and which is current",
        access: Access::Read,
        body: Body::Empty,
        query: &[],
        responds: JSON,
    },
    Route {
        method: "POST",
        path: "/api/deployments/{name}/upgrade",
        id: "upgrade_runs",
        summary: "Move runs of a deployment that have not ended (the ones listed, or all) to \
                  one of its versions, at their next instance; refused, moving nothing, for \
                  an unknown version or run, an ended run, or a component that exports \
                  something else",
        access: Access::Mutate,
        body: Body::Json("Upgrade"),
        query: &[],
        responds: JSON,
    },
    Route {
        method: "POST",
        path: "/api/deployments/{name}/rehearse",
        id: "rehearse_upgrade",
        summary: "Rehearse moving runs of a deployment that have not ended (the ones listed, \
                  or all) to one of its versions, changing nothing: each run resumed on its \
                  version and on that one in scratch stores, from its real checkpoint, and \
                  the two compared (`safe`, and per run a verdict: `compatible`, \
                  `repeats` with the committed steps that would run again, `diverges`, \
                  `breaks`, ...). Needs the token as writes do: it compiles and runs \
                  components",
        access: Access::Mutate,
        body: Body::Json("Upgrade"),
        query: &[],
        responds: JSON,
    },
    Route {
        method: "POST",
        path: "/api/deployments/{name}/rollback",
        id: "rollback_runs",
        summary: "Move runs of a deployment (the ones listed, or all that moved before) back \
                  to the version each was on before its last move",
        access: Access::Mutate,
        body: Body::Json("Rollback"),
        query: &[],
        responds: JSON,
    },
    Route {
        method: "POST",
        path: "/api/deployments",
        id: "deploy",
        summary: "Deploy a component (the body) under a name, granting its runs nothing \
                  beyond the default limits",
        access: Access::Mutate,
        body: Body::Component,
        query: &[
            ("name", "the deployment's name (required)"),
            (
                "in_flight",
                "what the name's runs that have not ended do: `pin` (the default: finish on \
                 their version) or `upgrade` (move to this one at their next instance)",
            ),
        ],
        responds: JSON,
    },
    Route {
        method: "GET",
        path: "/api/schedules",
        id: "list_schedules",
        summary: "Every schedule, by name: its spec, policies, state, next tick and tick \
                  counts",
        access: Access::Read,
        body: Body::Empty,
        query: &[],
        responds: JSON,
    },
    Route {
        method: "POST",
        path: "/api/schedules",
        id: "create_schedule",
        summary: "Create a schedule: each tick (a cron expression in a time zone, or an \
                  interval) starts one run of a deployment",
        access: Access::Mutate,
        body: Body::Json("CreateSchedule"),
        query: &[],
        responds: JSON,
    },
    Route {
        method: "GET",
        path: "/api/schedules/{name}",
        id: "show_schedule",
        summary: "One schedule: its record, input, next ticks and the run of its latest \
                  started tick",
        access: Access::Read,
        body: Body::Empty,
        query: &[],
        responds: JSON,
    },
    Route {
        method: "DELETE",
        path: "/api/schedules/{name}",
        id: "delete_schedule",
        summary: "Delete a schedule; the runs it started stay",
        access: Access::Mutate,
        body: Body::Empty,
        query: &[],
        responds: JSON,
    },
    Route {
        method: "POST",
        path: "/api/schedules/{name}/pause",
        id: "pause_schedule",
        summary: "Pause a schedule: no tick fires until it is resumed",
        access: Access::Mutate,
        body: Body::Empty,
        query: &[],
        responds: JSON,
    },
    Route {
        method: "POST",
        path: "/api/schedules/{name}/resume",
        id: "resume_schedule",
        summary: "Resume a schedule from now (ticks that fell while it was paused are not \
                  run)",
        access: Access::Mutate,
        body: Body::Empty,
        query: &[],
        responds: JSON,
    },
    Route {
        method: "GET",
        path: "/api/flow",
        id: "list_flow",
        summary: "Every deployment's limits on its running runs",
        access: Access::Read,
        body: Body::Empty,
        query: &[],
        responds: JSON,
    },
    Route {
        method: "POST",
        path: "/api/flow",
        id: "set_flow",
        summary: "Put limits on a deployment's running runs (in all and per concurrency key), \
                  replacing any it had",
        access: Access::Mutate,
        body: Body::Json("SetFlow"),
        query: &[],
        responds: JSON,
    },
    Route {
        method: "POST",
        path: "/api/flow/{deployment}/clear",
        id: "clear_flow",
        summary: "Remove a deployment's limits",
        access: Access::Mutate,
        body: Body::Empty,
        query: &[],
        responds: JSON,
    },
    Route {
        method: "GET",
        path: "/api/rates",
        id: "list_rates",
        summary: "Every class of steps' rate limit, and when its next token is free",
        access: Access::Read,
        body: Body::Empty,
        query: &[],
        responds: JSON,
    },
    Route {
        method: "POST",
        path: "/api/rates",
        id: "set_rate",
        summary: "Limit a class of steps to a rate shared by every worker and run, replacing \
                  the limit it had",
        access: Access::Mutate,
        body: Body::Json("SetRate"),
        query: &[],
        responds: JSON,
    },
    Route {
        method: "POST",
        path: "/api/rates/{class}/clear",
        id: "clear_rate",
        summary: "Remove a class's rate limit: its steps start at once",
        access: Access::Mutate,
        body: Body::Empty,
        query: &[],
        responds: JSON,
    },
    Route {
        method: "POST",
        path: "/api/gc",
        id: "gc",
        summary: "Delete finished runs and the keys, logs and components only they used \
                  (or, with dry_run, count them)",
        access: Access::Mutate,
        body: Body::Json("Gc"),
        query: &[],
        responds: JSON,
    },
];
