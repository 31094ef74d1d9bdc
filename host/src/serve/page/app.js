// idem's web page: reads the JSON API and redraws once a second; a run's live stream
// (text its steps publish as they run) is read as it comes. Every string from the
// store is set with textContent, never parsed as HTML.
"use strict";

const POLL_MS = 1000;
const PAGE = 50;
let timer = null;
let state = { status: "", agent: "", offset: 0 };

function token() { return sessionStorage.getItem("idem-token") || ""; }

async function api(method, path, body) {
  const headers = {};
  if (token()) headers["Authorization"] = "Bearer " + token();
  const init = { method, headers };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const res = await fetch(path, init);
  const doc = await res.json().catch(() => ({}));
  if (!res.ok) {
    const e = doc.error || { code: "http_" + res.status, message: res.statusText };
    throw new Error(e.code + ": " + e.message);
  }
  return doc;
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "text") node.textContent = v;
    else if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function say(text, ok) {
  const m = document.getElementById("message");
  m.textContent = text;
  m.className = ok ? "ok" : "";
  m.hidden = !text;
}

function age(now, at) {
  const s = Math.max(0, Math.floor((now - at) / 1000));
  if (s < 120) return s + "s";
  if (s < 7200) return Math.floor(s / 60) + "m";
  if (s < 172800) return Math.floor(s / 3600) + "h";
  return Math.floor(s / 86400) + "d";
}

function until(now, at) { return at >= now ? "in " + age(at, now) : age(now, at) + " ago"; }

function utc(ms) { return new Date(ms).toISOString().replace(/\.\d+Z$/, "Z"); }

function duration(ms) { return ms < 1000 ? ms + " ms" : (ms / 1000).toFixed(2) + " s"; }

// What a run shows as its status: a suspended run says what kind of wait it is in.
function shownStatus(run, now) {
  const live = run.lease && run.lease.expires > now;
  if (!["queued", "running"].includes(run.status) || live || run.wake_at == null) return run.status;
  if (run.joining != null) return "joining";
  return run.waiting_for != null ? "waiting" : "sleeping";
}

function runLink(runId, attrs) {
  return el("a", Object.assign({ class: "run-link mono", href: "/runs/" + encodeURIComponent(runId), text: runId }, attrs || {}));
}

function badge(text, cls) { return el("span", { class: "badge " + (cls || "s-" + text), text }); }

function schedule(fn) {
  clearTimeout(timer);
  timer = setTimeout(fn, POLL_MS);
}

// ----- the runs list -----

function runsPage() {
  const params = new URLSearchParams(location.search);
  state.status = params.get("status") || "";
  state.agent = params.get("agent") || "";
  state.offset = Number(params.get("offset") || 0);
  const main = document.getElementById("main");
  const status = el("select", { id: "filter-status" },
    ...["", "queued", "running", "paused", "completed", "failed", "in-doubt", "cancelled"].map(s =>
      el("option", { value: s, text: s || "any", selected: s === state.status })));
  const agent = el("input", { id: "filter-agent", value: state.agent, placeholder: "any" });
  const apply = () => {
    const q = new URLSearchParams();
    if (status.value) q.set("status", status.value);
    if (agent.value) q.set("agent", agent.value);
    history.replaceState(null, "", "/" + (q.toString() ? "?" + q : ""));
    state.status = status.value; state.agent = agent.value; state.offset = 0;
    refreshRuns();
  };
  status.addEventListener("change", apply);
  agent.addEventListener("change", apply);
  main.replaceChildren(
    el("section", { id: "schedules-section", hidden: true },
      el("h1", { text: "Schedules" }),
      el("table", { id: "schedules" },
        el("thead", {}, el("tr", {},
          ...["schedule", "deployment", "when", "state", "next tick", "started", "skipped", "missed", "failed", "last run", ""]
            .map((h, i) => el("th", { class: i >= 5 && i <= 8 ? "num" : null, text: h })))),
        el("tbody"))),
    el("section", { id: "limits-section", hidden: true },
      el("h1", { text: "Limits" }),
      el("table", { id: "flow" },
        el("thead", {}, el("tr", {},
          ...["deployment", "running at most", "concurrency key", "per key"].map(h => el("th", { text: h })))),
        el("tbody")),
      el("table", { id: "rates" },
        el("thead", {}, el("tr", {},
          ...["rate class", "limit", "burst", "next token"].map(h => el("th", { text: h })))),
        el("tbody"))),
    el("h1", { text: "Runs" }),
    el("div", { class: "filters" },
      el("label", {}, "status", status),
      el("label", {}, "agent", agent)),
    el("table", { id: "runs" },
      el("thead", {}, el("tr", {},
        ...["run", "status", "step", "executed", "skipped", "awaited", "reclaimed", "instances", "agent", "age"]
          .map((h, i) => el("th", { class: i >= 2 && i <= 7 ? "num" : null, text: h })))),
      el("tbody")),
    el("div", { class: "pager" },
      el("button", { id: "prev", text: "‹ newer", onclick: () => { state.offset = Math.max(0, state.offset - PAGE); refreshRuns(); } }),
      el("span", { id: "page-info", class: "muted" }),
      el("button", { id: "next", text: "older ›", onclick: () => { state.offset += PAGE; refreshRuns(); } })));
  refreshRuns();
}

async function refreshRuns() {
  const q = new URLSearchParams({ limit: PAGE, offset: state.offset });
  if (state.status) q.set("status", state.status);
  if (state.agent) q.set("agent", state.agent);
  try {
    const doc = await api("GET", "/api/runs?" + q);
    const rows = doc.runs.map(run => {
      const c = run.counts;
      const shown = shownStatus(run, doc.now);
      return el("tr", { "data-run": run.run_id, "data-status": run.status },
        el("td", {}, el("a", { class: "run-link mono", href: "/runs/" + encodeURIComponent(run.run_id), text: run.run_id })),
        el("td", {}, badge(shown)),
        el("td", { class: "num", text: run.step ?? "-" }),
        el("td", { class: "num", text: c.executed }),
        el("td", { class: "num", text: c.skipped }),
        el("td", { class: "num", text: c.awaited }),
        el("td", { class: "num", text: c.reclaimed }),
        el("td", { class: "num", text: c.instances }),
        el("td", { text: run.agent }),
        el("td", { text: age(doc.now, run.created) }));
    });
    document.querySelector("#runs tbody").replaceChildren(...rows);
    await refreshSchedules(doc.now);
    await refreshLimits(doc.now);
    document.getElementById("prev").disabled = state.offset === 0;
    document.getElementById("next").disabled = doc.next_offset == null;
    document.getElementById("page-info").textContent =
      doc.runs.length ? `runs ${state.offset + 1}–${state.offset + doc.runs.length}` : "no runs";
    document.getElementById("clock").textContent = "store time " + utc(doc.now);
    if (document.getElementById("message").className !== "ok") say("");
  } catch (e) {
    say(String(e.message || e));
  }
  schedule(refreshRuns);
}

// The operator's standing limits: deployments' (`idem flow`) and rate classes'
// (`idem rate`); the section shows only when there is one.
async function refreshLimits(now) {
  const [flow, rates] = await Promise.all([api("GET", "/api/flow"), api("GET", "/api/rates")]);
  document.getElementById("limits-section").hidden = flow.limits.length + rates.limits.length === 0;
  document.getElementById("flow").hidden = flow.limits.length === 0;
  document.getElementById("rates").hidden = rates.limits.length === 0;
  document.querySelector("#flow tbody").replaceChildren(...flow.limits.map(l =>
    el("tr", { "data-deployment": l.deployment },
      el("td", { text: l.deployment }),
      el("td", { class: "num", text: l.max_running ?? "-" }),
      el("td", { class: "mono", text: l.key ?? "-" }),
      el("td", { class: "num", text: l.per_key ?? "-" }))));
  document.querySelector("#rates tbody").replaceChildren(...rates.limits.map(l =>
    el("tr", { "data-class": l.class },
      el("td", { class: "mono", text: l.class }),
      el("td", { text: l.limit + " per " + duration(l.period_ms) }),
      el("td", { class: "num", text: l.burst }),
      el("td", { text: l.next_free == null ? "free now" : "reserved until " + utc(l.next_free) + " (" + until(now, l.next_free) + ")" }))));
}

function when(spec) {
  if (spec.kind === "every") return "every " + duration(spec.every_ms);
  return "cron " + spec.expr + " (" + spec.tz + ")";
}

async function refreshSchedules(now) {
  const doc = await api("GET", "/api/schedules");
  document.getElementById("schedules-section").hidden = doc.schedules.length === 0;
  const rows = doc.schedules.map(s => el("tr", { "data-schedule": s.name },
    el("td", { class: "mono", text: s.name }),
    el("td", { text: s.deployment }),
    el("td", { class: "mono", text: when(s.spec) }),
    el("td", {}, badge(s.paused ? "paused" : "active", s.paused ? "s-cancelled" : "s-running")),
    el("td", { text: s.paused || s.next_tick == null ? "-" : utc(s.next_tick) + " (" + until(now, s.next_tick) + ")" }),
    el("td", { class: "num", text: s.ticks.started }),
    el("td", { class: "num", text: s.ticks.skipped }),
    el("td", { class: "num", text: s.ticks.missed }),
    el("td", { class: "num", text: s.ticks.failed }),
    el("td", {}, s.last_run ? runLink(s.last_run) : "-"),
    el("td", {}, s.paused
      ? el("button", { class: "schedule-resume", "data-schedule": s.name, text: "Resume",
          onclick: () => pauseSchedule(s.name, "resume") })
      : el("button", { class: "schedule-pause", "data-schedule": s.name, text: "Pause",
          onclick: () => pauseSchedule(s.name, "pause") }))));
  document.querySelector("#schedules tbody").replaceChildren(...rows);
}

// The row's button says what the schedule's state allows; the store answers the
// schedule as it now is, so the message is what it became, not what was asked.
async function pauseSchedule(name, act) {
  try {
    const doc = await api("POST", `/api/schedules/${encodeURIComponent(name)}/${act}`);
    say(`schedule ${name} is ${doc.schedule.paused ? "paused" : "active"}`, true);
  } catch (e) { say(String(e.message || e)); }
  refreshRuns();
}

// ----- the deployments -----

// Each deployment's versions with the runs on each, redrawn every second; under them a
// dry run of moving its runs in flight to one version. A deployment's section is made
// once and kept across redraws, so the version chosen and a report drawn stay put.
function deploymentsPage() {
  document.getElementById("main").replaceChildren(
    el("h1", { text: "Deployments" }),
    el("p", { class: "muted", text: "Each version of a deployment and the runs on it; the current " +
      "one is what new runs take. A dry run resumes each run in flight on its version and on " +
      "the one chosen, in scratch stores from its real checkpoint, and compares the two: it " +
      "moves nothing and sends nothing. Runs move with idem upgrade." }),
    el("p", { id: "no-deployments", class: "muted", text: "Nothing is deployed.", hidden: true }),
    el("div", { id: "deployments" }));
  refreshDeployments();
}

async function refreshDeployments() {
  try {
    const doc = await api("GET", "/api/deployments");
    const names = doc.deployments.map(d => d.name);
    const paused = new Set(doc.paused.map(p => p.name));
    const lists = await Promise.all(names.map(n =>
      api("GET", "/api/deployments/" + encodeURIComponent(n) + "/versions")));
    const box = document.getElementById("deployments");
    const kept = new Map([...box.children].map(s => [s.dataset.deployment, s]));
    const sections = names.map((n, i) => {
      const section = kept.get(n) || deploymentSection(n);
      drawVersions(section, lists[i].versions, paused.has(n));
      return section;
    });
    // Re-inserting a section would close a version list a person has open.
    if (names.join("\n") !== [...kept.keys()].join("\n")) box.replaceChildren(...sections);
    document.getElementById("no-deployments").hidden = names.length > 0;
    if (document.getElementById("message").className !== "ok") say("");
  } catch (e) {
    say(String(e.message || e));
  }
  schedule(refreshDeployments);
}

function deploymentSection(name) {
  const select = el("select", { class: "dry-run-to", "data-deployment": name });
  const report = el("div", { class: "dry-run-report", hidden: true });
  const button = el("button", { class: "dry-run-button primary", "data-deployment": name, text: "Dry run" });
  button.addEventListener("click", () => dryRun(name, select, button, report));
  return el("section", { class: "deployment", "data-deployment": name },
    el("h2", {}, el("span", { class: "mono", text: name }), el("span", { class: "paused-mark" })),
    el("table", { class: "versions" },
      el("thead", {}, el("tr", {},
        ...["version", "digest", "in-flight policy", "deployed", "runs in flight", "finished", "in all"]
          .map((h, i) => el("th", { class: i >= 4 ? "num" : null, text: h })))),
      el("tbody")),
    el("div", { class: "dry-run" },
      el("label", {}, "Dry run: move the runs in flight to ", select),
      button),
    report);
}

// The digest's first 12 hex digits, as `idem deployments` shows it; the whole on hover.
function shortDigest(digest) { return digest.slice(0, 12); }

function drawVersions(section, versions, paused) {
  const mark = section.querySelector(".paused-mark");
  if (mark.textContent !== (paused ? "paused" : "")) mark.replaceChildren(...(paused ? [badge("paused")] : []));
  section.querySelector(".versions tbody").replaceChildren(...versions.map(v =>
    el("tr", { "data-version": v.version, class: v.current ? "current" : null },
      el("td", { text: v.version + (v.current ? " (current)" : "") }),
      el("td", { class: "mono", title: v.digest, text: shortDigest(v.digest) }),
      el("td", { text: v.in_flight }),
      el("td", { text: utc(v.deployed_at) }),
      el("td", { class: "num in-flight", text: v.runs_in_flight }),
      el("td", { class: "num finished", text: v.runs - v.runs_in_flight }),
      el("td", { class: "num all", text: v.runs }))));
  // The choices change only when a version is deployed: the one chosen stays chosen.
  const select = section.querySelector(".dry-run-to");
  const sig = versions.map(v => v.version + (v.current ? "*" : "")).join(",");
  if (select.getAttribute("data-sig") === sig) return;
  const chosen = select.value;
  select.setAttribute("data-sig", sig);
  select.replaceChildren(...versions.map(v =>
    el("option", { value: v.version, text: "version " + v.version + (v.current ? " (current)" : "") })));
  const current = versions.find(v => v.current);
  if (versions.some(v => String(v.version) === chosen)) select.value = chosen;
  else if (current) select.value = String(current.version);
}

// The verdicts `Verdict::is_safe` lets through; only to colour each run's verdict (the
// report's `safe` is the server's word on the whole).
const SAFE_VERDICTS = ["compatible", "already-on", "output-differs"];

async function dryRun(name, select, button, report) {
  const to = Number(select.value);
  button.disabled = true;
  report.hidden = false;
  report.removeAttribute("data-to");
  report.replaceChildren(el("p", { class: "muted", text: `rehearsing the move to version ${to}…` }));
  try {
    // Rehearsing compiles and runs components, so it is a mutating call: the token goes.
    const doc = await api("POST", `/api/deployments/${encodeURIComponent(name)}/rehearse`, { to });
    report.replaceChildren(...drawRehearsal(doc));
    report.setAttribute("data-to", String(to));
    say(`dry run of ${name} to version ${to}: ` + (doc.safe ? "safe" : "not safe"), true);
  } catch (e) {
    const text = String(e.message || e);
    report.replaceChildren(el("p", { class: "dry-run-error", text: "dry run refused: " + text }));
    say(text);
  }
  button.disabled = false;
}

function drawRehearsal(doc) {
  const runs = doc.report.runs;
  const counts = new Map();
  for (const r of runs) counts.set(r.verdict, (counts.get(r.verdict) || 0) + 1);
  const perVerdict = [...counts].map(([v, n]) => `${n} ${v}`).join(", ");
  const summary = runs.length === 0
    ? `version ${doc.to_version}: no run in flight to move`
    : `version ${doc.to_version}: ` +
      (doc.safe ? "safe, nothing would run again" : "NOT SAFE, nothing was moved") +
      ` (${runs.length} run${runs.length === 1 ? "" : "s"}: ${perVerdict})`;
  return [
    el("p", { class: "dry-run-summary", "data-safe": String(doc.safe), text: summary }),
    el("table", { class: "dry-run-runs", hidden: runs.length === 0 },
      el("thead", {}, el("tr", {}, ...["run", "status", "verdict", "what it would do"].map(h => el("th", { text: h })))),
      el("tbody", {}, ...runs.map(r =>
        el("tr", { "data-run": r.run_id, "data-verdict": r.verdict },
          el("td", {}, runLink(r.run_id)),
          el("td", {}, badge(r.status)),
          el("td", {}, badge(r.verdict, SAFE_VERDICTS.includes(r.verdict) ? "s-completed" : "s-failed")),
          el("td", { class: "detail" }, ...verdictDetail(r))))))];
}

// Where a walk stopped, as `idem upgrade --dry-run` words it.
function nextText(next) {
  switch (next.kind) {
    case "step": return "runs step " + next.key;
    case "wait": return "waits for signal " + next.key;
    case "spawn": return "spawns child " + next.key;
    case "join": return "joins " + next.key;
    case "completed": return "completes";
    case "failed": return "fails: " + next.error;
    default: return next.kind;
  }
}

// A run's verdict in words, each key in its own element. The report flattens the
// verdict into the run: `old` and `new` are the verdict's, `old_walk` and `new_walk`
// the walks.
function verdictDetail(r) {
  switch (r.verdict) {
    case "compatible":
      return [`replays its ${r.new_walk ? r.new_walk.replayed.length : 0} committed steps, ` +
        "then " + (r.new_walk ? nextText(r.new_walk.next) : "") + " as before"];
    case "already-on": return ["already on this version"];
    case "output-differs": return ["completes with another output: ", el("code", { text: r.new }),
      " instead of ", el("code", { text: r.old })];
    case "repeats":
      return ["would run again ",
        ...r.steps.flatMap((s, i) => [i ? ", " : "", `step ${s.step} (`,
          el("code", { class: "repeated-key", text: s.key }), ")"]),
        ": the new version never asks for their keys; it first " + nextText(r.instead)];
    case "diverges":
      return ["next, the version it is on " + nextText(r.old) + ", the new one " + nextText(r.new)];
    case "breaks": return ["breaks: " + r.error];
    case "exports-differ":
      return ["the new component exports another agent's interface: ", el("code", { text: r.new })];
    case "unchecked": return ["unchecked: " + r.why];
    default: return [r.verdict];
  }
}

// ----- one run -----

function runPage(runId) {
  const main = document.getElementById("main");
  main.replaceChildren(
    el("p", {}, el("a", { href: "/", text: "‹ all runs" })),
    el("h1", { class: "mono", text: runId }),
    el("dl", { id: "summary", class: "grid" }),
    el("section", { id: "parked-section" }),
    el("section", { id: "children-section", hidden: true },
      el("h2", { text: "Children" }),
      el("p", { id: "children-count", class: "muted" }),
      el("table", { id: "children" },
        el("thead", {}, el("tr", {}, ...["key", "status", "run", "agent"].map(h => el("th", { text: h })))),
        el("tbody"))),
    el("section", { id: "usage-section", hidden: true },
      el("h2", { text: "Model usage" }),
      el("table", { id: "usage" },
        el("thead", {}, el("tr", {}, ...["model", "calls", "spent (in · out · cached)", "cost",
          "replays", "saved (in · out · cached)", "saved cost"].map(h => el("th", { text: h })))),
        el("tbody"))),
    el("section", { id: "live-section", hidden: true },
      el("h2", { text: "Live" }),
      el("p", { class: "muted", text: "Text the steps publish as they run. Not durable: " +
        "each step's committed result is the truth." }),
      el("div", { id: "live" })),
    el("h2", { text: "Steps" }),
    el("p", { class: "muted", text: "Open a step to see its committed result, its attempts and the checkpoint saved with it." }),
    el("table", { id: "steps" },
      el("thead", {}, el("tr", {},
        ...["#", "key", "outcome", "attempt", "token", "duration", "claimed"].map(h => el("th", { text: h })))),
      el("tbody")),
    el("section", { id: "step-detail", hidden: true }),
    el("h2", { text: "Step history" }),
    el("p", { id: "history-note", class: "muted" }),
    el("table", { id: "history" },
      el("thead", {}, el("tr", {},
        ...["#", "key", "committed", "checkpoint saved with it", ""].map(h => el("th", { text: h })))),
      el("tbody")),
    el("p", { id: "fork-result" }),
    el("h2", { text: "Timeline" }),
    el("p", { id: "timeline-note", class: "muted" }),
    el("table", { id: "timeline" },
      el("thead", {}, el("tr", {}, ...["#", "at", "kind", "worker", "token", "what"].map(h => el("th", { text: h })))),
      el("tbody")),
    el("h2", { text: "Open claims" }),
    el("table", { id: "claims" },
      el("thead", {}, el("tr", {}, ...["key", "holder", "attempt", "token", "lease"].map(h => el("th", { text: h })))),
      el("tbody")),
    el("h2", { text: "Sleeps, signals and joins" }),
    el("table", { id: "waits" },
      el("thead", {}, el("tr", {}, ...["key", "kind", "due", "state"].map(h => el("th", { text: h })))),
      el("tbody")),
    el("h2", { text: "Log" }),
    el("pre", { id: "log" }),
    el("h2", { text: "Operate" }),
    el("div", { class: "parked" },
      el("div", { class: "actions" },
        el("input", { id: "signal-name", placeholder: "signal name" }),
        el("input", { id: "signal-payload", placeholder: "payload JSON (null)" }),
        el("button", { id: "signal", text: "Send signal", onclick: () => signal(runId) }),
        el("button", { id: "pause", text: "Pause", onclick: () => pause(runId, "pause") }),
        el("button", { id: "resume", text: "Resume", onclick: () => pause(runId, "resume") }),
        el("button", { id: "cancel", class: "danger", text: "Cancel run", onclick: () => cancel(runId) }))));
  refreshRun(runId);
  followLive(runId);
}

// ----- the live stream -----

// Read with fetch rather than EventSource: EventSource cannot send the bearer token the
// API asks for off loopback. The same events, the same resumption (Last-Event-ID).
let live = null;

function followLive(runId) {
  if (live) live.abort.abort();
  const state = { runId, abort: new AbortController(), last: null, ended: false, steps: {} };
  live = state;
  (async () => {
    while (!state.ended && !state.abort.signal.aborted) {
      try {
        const headers = { Accept: "text/event-stream" };
        if (token()) headers["Authorization"] = "Bearer " + token();
        if (state.last != null) headers["Last-Event-ID"] = String(state.last);
        const res = await fetch("/api/runs/" + encodeURIComponent(runId) + "/stream",
          { headers, signal: state.abort.signal });
        if (!res.ok) return;
        const reader = res.body.getReader();
        const decoder = new TextDecoder();
        let buf = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
          let cut;
          while ((cut = buf.indexOf("\n\n")) >= 0) {
            liveEvent(state, buf.slice(0, cut));
            buf = buf.slice(cut + 2);
          }
        }
      } catch (e) {
        if (state.abort.signal.aborted) return;
      }
      // Cut off before the run ended (a restart, a proxy): resume after the last chunk.
      if (!state.ended) await new Promise(r => setTimeout(r, POLL_MS));
    }
  })();
}

function liveEvent(state, raw) {
  let name = "message", data = "";
  for (const line of raw.split("\n")) {
    if (line.startsWith("event:")) name = line.slice(6).trim();
    else if (line.startsWith("data:")) data += line.slice(5).replace(/^ /, "");
  }
  if (!data || live !== state) return;
  const doc = JSON.parse(data);
  if (name === "end") { state.ended = true; return; }
  if (name !== "message") return;
  state.last = doc.seq;
  let block = state.steps[doc.key];
  if (!block) {
    block = el("div", { class: "live-step", "data-key": doc.key },
      el("div", {}, el("code", { text: doc.key }), " ", el("span", { class: "live-state" })),
      el("pre", { class: "live-text" }));
    state.steps[doc.key] = block;
    document.getElementById("live").append(block);
    document.getElementById("live-section").hidden = false;
  }
  block.querySelector("pre").append(doc.text);
}

// Each live block says whether its step is still running or committed.
function drawLiveStates(run, steps) {
  for (const block of document.querySelectorAll("#live .live-step")) {
    const step = steps.find(s => s.key === run.namespace + ":" + block.dataset.key);
    const committed = step != null && step.committed_at != null;
    const mark = block.querySelector(".live-state");
    const want = committed ? "committed" : "streaming";
    if (mark.textContent !== want) mark.replaceChildren(badge(want, committed ? "s-completed" : "s-running"));
    block.setAttribute("data-state", want);
  }
}

async function refreshRun(runId) {
  try {
    const [doc, timeline, history] = await Promise.all([
      api("GET", "/api/runs/" + encodeURIComponent(runId)),
      api("GET", "/api/runs/" + encodeURIComponent(runId) + "/events"),
      api("GET", "/api/runs/" + encodeURIComponent(runId) + "/history"),
    ]);
    drawRun(runId, doc);
    drawTimeline(doc.run, timeline);
    drawHistory(runId, history);
    if (document.getElementById("message").className !== "ok") say("");
  } catch (e) {
    say(String(e.message || e));
  }
  schedule(() => refreshRun(runId));
}

function drawRun(runId, doc) {
  const run = doc.run, now = doc.now, c = run.counts;
  document.getElementById("clock").textContent = "store time " + utc(now);
  const lease = run.lease
    ? (run.lease.expires > now
        ? `worker ${run.lease.worker}, token ${run.lease.token}, expires ${until(now, run.lease.expires)}`
        : `none live (worker ${run.lease.worker} expired ${until(now, run.lease.expires)})`)
    : "none";
  const rows = [
    ["status", badge(shownStatus(run, now), "s-" + shownStatus(run, now))],
    ["agent", run.agent],
    ["digest", el("span", { class: "mono", text: run.digest })],
    ["namespace", run.namespace],
    ...(run.parent != null ? [["parent", el("span", {}, runLink(run.parent, { id: "parent-link" }),
      ` (spawned under key ${run.spawn_key ?? ""}${run.detached ? ", detached" : ""})`)]] : []),
    ["created", `${utc(run.created)} (${age(now, run.created)} ago)`],
    ["lease", lease],
    ["counts", `executed ${c.executed} · skipped ${c.skipped} · awaited ${c.awaited} · reclaimed ${c.reclaimed} · instances ${c.instances}`],
  ];
  if (run.wake_at != null && !run.lease)
    rows.push(["waiting", (run.joining != null ? "in join " + run.joining
      : run.waiting_for != null ? "for signal " + run.waiting_for : "sleeping") +
      (run.wake_at < 9e15 ? " until " + utc(run.wake_at) : "")]);
  if (run.cancel_requested) rows.push(["cancel", "requested"]);
  if (run.paused_by) rows.push(["paused", (run.paused_by === "deployment" ? "with its deployment" : "by an operator") +
    (run.lease && run.lease.expires > now ? "; its worker stops it at its next host call" : "")]);
  if (run.note) rows.push(["note", run.note]);
  if (doc.outcome != null)
    rows.push([run.status === "completed" ? "output" : "reason",
      el("code", { text: typeof doc.outcome === "string" ? doc.outcome : JSON.stringify(doc.outcome) })]);
  const summary = document.getElementById("summary");
  summary.setAttribute("data-status", run.status);
  summary.replaceChildren(...rows.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", {}, v)]));

  // The parked keys, each with its two ways out. Redrawn only when the set changes, so
  // a result being typed is not wiped by the next poll.
  const parked = doc.open_claims.filter(cl => cl.parked != null);
  const section = document.getElementById("parked-section");
  const sig = JSON.stringify(parked.map(p => [p.key, p.token]));
  if (section.getAttribute("data-sig") !== sig) {
    section.setAttribute("data-sig", sig);
    section.replaceChildren(...(parked.length ? [el("h2", { text: `Parked in doubt (${parked.length})` })] : []),
      ...parked.map(p => {
        const input = el("input", { class: "result-input", placeholder: "result JSON, e.g. {\"ok\":true}" });
        return el("div", { class: "parked", "data-key": p.key },
          el("div", {}, badge("in doubt", "doubt"), " ", el("code", { text: p.key })),
          el("div", { class: "muted", text: "why: " + p.parked + ` (attempt ${p.attempt}, token ${p.token})` }),
          el("div", { class: "actions" },
            input,
            el("button", { class: "resolve primary", "data-key": p.key, text: "Resolve with result",
              onclick: () => resolve(runId, p.key, input.value) }),
            el("button", { class: "retry", "data-key": p.key, text: "Retry",
              onclick: () => resolve(runId, p.key, null) })));
      }));
  }

  // The children: a count per status, then the first ones the API lists, each a link.
  const counts = doc.children_count || { total: 0, by_status: {} };
  document.getElementById("children-section").hidden = counts.total === 0;
  const perStatus = Object.entries(counts.by_status).map(([st, n]) => `${n} ${st}`).join(", ");
  const more = counts.total - doc.children.length;
  document.getElementById("children-count").textContent = `${counts.total} in all: ${perStatus}` +
    (more > 0 ? ` (the first ${doc.children.length} shown; /api/runs?parent=${runId} lists all)` : "");
  document.querySelector("#children tbody").replaceChildren(...doc.children.map(ch =>
    el("tr", { "data-run": ch.run_id, "data-status": ch.status },
      el("td", {}, el("code", { text: ch.key })),
      el("td", {}, badge(ch.status)),
      el("td", {}, runLink(ch.run_id)),
      el("td", { text: ch.agent }))));

  // Token usage per model: spent once per call, saved by replays; cost if priced.
  const usage = doc.usage || [];
  document.getElementById("usage-section").hidden = usage.length === 0;
  const tokens = t => `${t.input} · ${t.output} · ${t.cached}`;
  const cost = c => c == null ? "—" : c.toFixed(6);
  document.querySelector("#usage tbody").replaceChildren(...usage.map(u =>
    el("tr", { "data-model": u.model },
      el("td", {}, el("code", { text: u.model })),
      el("td", { class: "num", text: u.calls }),
      el("td", { class: "num spent", text: tokens(u.spent) }),
      el("td", { class: "num", text: cost(u.spent_cost) }),
      el("td", { class: "num", text: u.replays }),
      el("td", { class: "num saved", text: tokens(u.saved) }),
      el("td", { class: "num", text: cost(u.saved_cost) }))));

  document.querySelector("#steps tbody").replaceChildren(...doc.steps.map((s, i) => {
    let outcome;
    if (s.committed_at != null) outcome = badge("committed", "s-completed");
    else if (s.parked != null) outcome = badge("in doubt", "doubt");
    else if (s.holder != null) outcome = badge("claimed", "s-running");
    else outcome = badge("released", "");
    const marks = [];
    if (s.attempt > 1) marks.push(" ", badge("retaken", "retaken"));
    const took = s.committed_at != null ? duration(Math.max(0, s.committed_at - s.claimed_at))
      : s.holder != null && s.parked == null ? "running " + duration(Math.max(0, now - s.claimed_at))
      : "—";
    return el("tr", { "data-key": s.key },
      el("td", { class: "num", text: i + 1 }),
      el("td", {}, el("button", { class: "open-step link", "data-key": s.key, title: "open this step",
        onclick: () => openStep(runId, s.key) }, el("code", { text: s.key }))),
      el("td", {}, outcome),
      el("td", {}, String(s.attempt), ...marks),
      el("td", { class: "num", text: s.token }),
      el("td", { class: "num", text: took }),
      el("td", { text: utc(s.claimed_at) }));
  }));

  document.querySelector("#claims tbody").replaceChildren(...doc.open_claims.map(cl =>
    el("tr", {},
      el("td", {}, el("code", { text: cl.key })),
      el("td", { text: cl.parked != null ? "parked in doubt" : (cl.holder ?? "released") }),
      el("td", { class: "num", text: cl.attempt }),
      el("td", { class: "num", text: cl.token }),
      el("td", { text: "expires " + until(now, cl.lease_expires) }))));

  document.querySelector("#waits tbody").replaceChildren(...doc.waits.map(w => {
    const isJoin = w.join != null && w.signal == null;
    // A join that got its children is stored as received.
    const outcome = isJoin && w.outcome === "received" ? "joined" : w.outcome;
    const state = w.outcome != null && w.settled != null ? `${outcome} at ${utc(w.settled)}`
      : (w.signal == null && !isJoin && w.due != null && w.due <= now ? (w.rate != null ? "taken" : "elapsed") : "pending");
    const kind = w.signal != null ? "signal " + w.signal
      : isJoin ? `join ${w.join} of ${w.join_children} children`
      : w.rate != null ? "token of rate class " + w.rate : "sleep";
    return el("tr", { "data-key": w.key },
      el("td", {}, el("code", { text: w.key })),
      el("td", { text: kind }),
      el("td", { text: w.due != null ? utc(w.due) : "no timeout" }),
      el("td", { text: state }));
  }));

  drawLiveStates(run, doc.steps);

  const log = document.getElementById("log");
  if (log.textContent !== doc.log) log.textContent = doc.log || "(nothing written)";
}

// The run's timeline: each instance, the worker and lease token it ran under, how it
// ended, takeovers, waits and signals, oldest first.
function drawTimeline(run, timeline) {
  const events = timeline.events || [];
  const starts = events.filter(e => e.kind === "started").length;
  const takeovers = events.filter(e => e.kind === "took_over").length;
  document.getElementById("timeline-note").textContent =
    `${events.length} events: ${starts} instance starts, ${takeovers} takeovers` +
    (timeline.dropped > 0 ? `; ${timeline.dropped} dropped between the first and the last kept` : "");
  document.querySelector("#timeline tbody").replaceChildren(...events.map(e =>
    el("tr", { "data-kind": e.kind, "data-seq": e.seq },
      el("td", { class: "num", text: e.seq }),
      el("td", { class: "num", text: "+" + ((e.at - run.created) / 1000).toFixed(3) + " s" }),
      el("td", {}, badge(e.kind, "k-" + e.kind)),
      el("td", { text: e.holder ?? "—" }),
      el("td", { class: "num", text: e.token ?? "—" }),
      el("td", { text: e.summary }))));
}

// The run's committed steps in order, numbered as a fork takes them, each with the
// checkpoints saved after it; each row forks the run from that step.
function drawHistory(runId, history) {
  const from = history.forked_from ? `forked from ${history.forked_from[0]} at step ${history.forked_from[1]}; ` : "";
  document.getElementById("history-note").textContent = from +
    `${history.steps.length} steps committed, ${history.checkpoints.length} checkpoints kept` +
    (history.collected ? " (older checkpoints collected)" : "") +
    ". Fork from a step: a new run from the checkpoint before it, reusing the steps before it.";
  const saved = n => history.checkpoints.filter(c => c.after === n)
    .map(c => `step ${c.step} (${c.bytes} bytes)`).join(", ");
  document.querySelector("#history tbody").replaceChildren(...history.steps.map(s =>
    el("tr", { "data-n": s.n, "data-key": s.key },
      el("td", { class: "num", text: s.n }),
      el("td", {}, el("button", { class: "open-step link", title: "open this step",
        onclick: () => openStep(runId, s.key) }, el("code", { text: s.key }))),
      el("td", { text: utc(s.committed_at) }),
      el("td", { class: "saved", text: saved(s.n) || "—" }),
      el("td", {}, el("button", { class: "fork", "data-n": s.n, text: "Fork from here",
        onclick: () => fork(runId, s.n) })))));
}

async function fork(runId, at) {
  try {
    const doc = await api("POST", `/api/runs/${encodeURIComponent(runId)}/fork`, { at });
    say(`forked at step ${at} into ${doc.run_id}: reuses ${doc.reused} steps`, true);
    document.getElementById("fork-result").replaceChildren(
      `Forked at step ${at}: `, runLink(doc.run_id, { id: "forked-run" }),
      ` (queued; reuses ${doc.reused} steps` +
      (doc.checkpoint != null ? `, starts from the checkpoint at step ${doc.checkpoint})` : ")"));
  } catch (e) { say(String(e.message || e)); }
}

// One step opened: fetched once when asked (not redrawn by the poll), until closed.
async function openStep(runId, key) {
  const section = document.getElementById("step-detail");
  try {
    const v = await api("GET", "/api/runs/" + encodeURIComponent(runId) + "/steps/" + encodeURIComponent(key));
    const s = v.step;
    const show = x => typeof x === "string" ? x : JSON.stringify(x);
    const rows = [
      ["key", el("code", { text: s.key })],
      ["attempt", String(s.attempt) + (v.retaken ? " (retaken from a holder that never committed it)" : "")],
      ["token", String(s.token)],
      ["claimed", utc(s.claimed_at) + (v.claimed_in ? " in " + v.claimed_in.summary : "")],
      ["committed", s.committed_at != null ? utc(s.committed_at) : (s.parked != null ? "parked in doubt: " + s.parked : "not committed")],
      ["result", v.result != null ? el("code", { id: "step-result", text: show(v.result) }) : "none"],
      ["number", v.n != null ? String(v.n) : "not committed"],
      ["checkpoint saved with it", v.checkpoint != null
        ? el("code", { id: "step-checkpoint", text: `step ${v.checkpoint.step}: ` + show(v.checkpoint.state) }) : "none"],
    ];
    section.replaceChildren(
      el("h3", {}, "Step ", el("code", { text: s.key }), " ",
        el("button", { id: "close-step", text: "Close", onclick: () => { section.hidden = true; } })),
      el("dl", { class: "grid", "data-key": s.key }, ...rows.flatMap(([k, val]) => [el("dt", { text: k }), el("dd", {}, val)])));
    section.hidden = false;
  } catch (e) {
    say(String(e.message || e));
  }
}

async function resolve(runId, key, resultText) {
  let body = { key };
  if (resultText === null) body.retry = true;
  else {
    try { body.result = JSON.parse(resultText); }
    catch (e) { say("the result must be JSON: " + e.message); return; }
  }
  try {
    const doc = await api("POST", `/api/runs/${encodeURIComponent(runId)}/resolve`, body);
    say(`resolved ${doc.key}; run is ${doc.status}`, true);
    document.getElementById("parked-section").removeAttribute("data-sig");
  } catch (e) { say(String(e.message || e)); }
  refreshRun(runId);
}

async function signal(runId) {
  const name = document.getElementById("signal-name").value;
  const text = document.getElementById("signal-payload").value;
  let payload = null;
  try { if (text) payload = JSON.parse(text); } catch (e) { say("the payload must be JSON: " + e.message); return; }
  try {
    const doc = await api("POST", `/api/runs/${encodeURIComponent(runId)}/signal`, { name, payload });
    say(doc.woke ? `signal ${name} sent: the run is due now` : `signal ${name} kept for the run`, true);
  } catch (e) { say(String(e.message || e)); }
}

async function pause(runId, act) {
  try {
    const doc = await api("POST", `/api/runs/${encodeURIComponent(runId)}/${act}`);
    say(act === "resume" ? (doc.resumed ? "resumed" : "the run was not paused")
      : doc.paused === "requested" ? "pause requested from worker " + doc.worker
      : doc.paused === "already" ? "the run was paused already" : "paused", true);
  } catch (e) { say(String(e.message || e)); }
  refreshRun(runId);
}

async function cancel(runId) {
  if (!confirm("Cancel run " + runId + "?")) return;
  try {
    const doc = await api("POST", `/api/runs/${encodeURIComponent(runId)}/cancel`);
    say(doc.cancelled === "now" ? "cancelled" : "cancel requested from worker " + doc.worker, true);
  } catch (e) { say(String(e.message || e)); }
  refreshRun(runId);
}

document.addEventListener("DOMContentLoaded", () => {
  const input = document.getElementById("token");
  input.value = token();
  document.getElementById("token-form").addEventListener("submit", ev => {
    ev.preventDefault();
    sessionStorage.setItem("idem-token", input.value.trim());
    say("token set", true);
  });
  const m = location.pathname.match(/^\/runs\/(.+)$/);
  if (m) runPage(decodeURIComponent(m[1]));
  else if (location.pathname === "/deployments") deploymentsPage();
  else runsPage();
});
