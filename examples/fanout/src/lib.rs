//! Example agent: a digest of documents, made by child runs.
//!
//! One component, deployed under two names: the **parent** (input with `docs`) spawns
//! one child run per document, each a run of the deployment named `child` (this same
//! component) that summarizes its document with one model call; it joins them all,
//! holding nothing while they run, then asks two tools in parallel (a title and tags
//! for the digest, two requests in flight at once, each under its own key), and
//! publishes the digest exactly once, as one line appended to `log`.
//!
//! Parent input: `{"docs": ["text", ...], "model": "http://127.0.0.1:PORT",
//! "child": "summarize", "log": "/data/digest.log"}`. Child input: `{"doc": "text",
//! "model": URL}`. The model is any HTTP endpoint answering `POST {model}/summarize`
//! (and `/title`, `/tags`) with text; requests carry `Idempotency-Key` and
//! `Idempotency-Token`, so a real endpoint can dedupe a retake in doubt.
//!
//! Output (parent): `{"title": ..., "tags": ..., "summaries": [...], "failed": N}`;
//! (child): the summary, as a JSON string.

use std::fs::OpenOptions;
use std::io::Write;

use idem_sdk::http::{Request, Response, send_all};
use idem_sdk::{Agent, ChildOutcome, Error, Key, join_all, run_once, run_once_all, spawn};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

#[derive(Deserialize)]
#[serde(untagged)]
enum Input {
    Parent {
        docs: Vec<String>,
        model: String,
        #[serde(default = "summarize")]
        child: String,
        log: String,
    },
    Child {
        doc: String,
        model: String,
    },
}

fn summarize() -> String {
    "summarize".into()
}

#[derive(Serialize)]
struct ChildInput<'a> {
    doc: &'a str,
    model: &'a str,
}

struct Fanout;

impl Agent for Fanout {
    type Input = Input;
    type Output = Value;

    fn run(input: Input) -> Result<Value, Error> {
        match input {
            Input::Child { doc, model } => Ok(json!(ask(&model, "summarize", &doc)?)),
            Input::Parent {
                docs,
                model,
                child,
                log,
            } => digest(&docs, &model, &child, &log),
        }
    }
}

/// One model call as a step: keyed by what it asks, so a resumed instance skips it.
fn ask(model: &str, tool: &str, prompt: &str) -> Result<String, Error> {
    let key = Key::for_run(tool, &prompt)?;
    let (answer, _) = run_once(&key, |step| {
        Request::post(&format!("{model}/{tool}"))
            .body(prompt.as_bytes().to_vec())
            .under(step)
            .send()
            .and_then(text)
    })?;
    Ok(answer)
}

/// A 2xx response's body as text; any other status is the step's failure (its claim
/// is released, and the step runs again when the agent does).
fn text(response: Response) -> Result<String, Error> {
    if !response.is_success() {
        return Err(Error::Http(format!(
            "the model answered {}",
            response.status
        )));
    }
    Ok(String::from_utf8_lossy(&response.body).into_owned())
}

fn digest(docs: &[String], model: &str, child: &str, log: &str) -> Result<Value, Error> {
    // One child per document, keyed by the document: spawned again after a crash,
    // each finds the child it started.
    let children = docs
        .iter()
        .enumerate()
        .map(|(i, doc)| spawn(&format!("doc-{i}"), child, &ChildInput { doc, model }))
        .collect::<Result<Vec<_>, _>>()?;
    let ends = join_all::<String>("summaries", &children, None)?;
    let mut summaries = Vec::new();
    let mut failed = 0;
    for end in ends {
        match end {
            ChildOutcome::Completed(summary) => summaries.push(summary),
            ChildOutcome::Failed(_) | ChildOutcome::Cancelled => failed += 1,
        }
    }
    let joined = summaries.join("\n");
    // Two tools asked at once, each under its own claim and key.
    let keys = [
        Key::for_run("title", &joined)?,
        Key::for_run("tags", &joined)?,
    ];
    let answers = run_once_all(&keys, |steps| {
        let requests = steps.iter().map(|step| {
            let tool = if step.key() == keys[0].as_str() {
                "title"
            } else {
                "tags"
            };
            Request::post(&format!("{model}/{tool}"))
                .body(joined.as_bytes().to_vec())
                .under(step)
        });
        send_all(requests)
            .into_iter()
            .map(|r| r.and_then(text))
            .collect()
    })?;
    let (title, tags) = (answers[0].0.clone(), answers[1].0.clone());
    // Published once: the line is the step's side effect.
    let line = format!("{title} [{tags}]: {} summaries", summaries.len());
    run_once(&Key::for_run("publish", &line)?, |_step| {
        let mut file = OpenOptions::new().create(true).append(true).open(log)?;
        file.write_all(format!("{line}\n").as_bytes())
    })?;
    Ok(json!({ "title": title, "tags": tags, "summaries": summaries, "failed": failed }))
}

idem_sdk::export_agent!(Fanout);
