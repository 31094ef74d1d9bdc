//! Test agent: a parent that spawns one child run per item, joins them, and reports
//! what its children answered; or, with `recurse`, an agent that spawns itself.
//!
//! Input (all optional but `deployment`):
//!
//! ```json
//! {"deployment": "fetcher", "children": 5, "url": "http://127.0.0.1:PORT",
//!  "pause_ms": 0, "mode": "all", "timeout_ms": null, "detached": false,
//!  "join_also": null, "recurse": null, "depth": 0, "checkpoint": true, "batch": 0}
//! ```
//!
//! - child `i` is spawned under key `item-{i}` with input
//!   `{"steps": 1, "url": URL, "pause_ms": P, "pause_after": true}` (the `fetcher`
//!   agent's), or `{"fail": true}` for the items listed in `fail`;
//! - `child_input`: the input of every child instead (for children of another agent);
//! - `batch`: spawn the children `batch` at a time with `spawn_many` (0: one by one
//!   with `spawn`);
//! - `mode`: `all` joins every child (`join_all`), `any` the first to end;
//! - `join_also`: a run id joined with the children (to see a join refused);
//! - `checkpoint`: save the children's ids once all are spawned, so a resumed
//!   instance joins them without spawning again (the spawns would find them anyway);
//! - `recurse`: `{"key": K, "vary": bool}`: spawn `deployment` (this agent) under key
//!   `K` (or `K-{depth}` with `vary`) with this input one deeper, join it, and return
//!   what it answered: a cycle or the depth limit ends the chain.
//!
//! Output: `{"spawned": N, "completed": C, "failed": F, "cancelled": X, "bodies": [..],
//! "first": I}` (`first` for `any`), or for `recurse` `{"depth": D, "child": ...}`.

use std::time::Duration;

use idem_sdk::{
    Agent, Child, ChildOutcome, ChildSpec, Error, join, join_all, join_any, load, save, spawn,
    spawn_many,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

#[derive(Deserialize, Serialize, Clone)]
struct Input {
    deployment: String,
    #[serde(default)]
    children: u32,
    #[serde(default)]
    url: String,
    #[serde(default)]
    pause_ms: u64,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    timeout_ms: Option<u64>,
    #[serde(default)]
    fail: Vec<u32>,
    #[serde(default)]
    child_input: Option<Value>,
    #[serde(default)]
    join_also: Option<String>,
    #[serde(default)]
    recurse: Option<Recurse>,
    #[serde(default)]
    depth: u32,
    #[serde(default = "yes")]
    checkpoint: bool,
    #[serde(default)]
    batch: usize,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize, Serialize, Clone)]
struct Recurse {
    key: String,
    #[serde(default)]
    vary: bool,
}

struct Fanout;

impl Agent for Fanout {
    type Input = Input;
    type Output = Value;

    fn run(input: Input) -> Result<Value, Error> {
        if let Some(recurse) = &input.recurse {
            return recurse_once(&input, recurse);
        }
        let kids = children(&input)?;
        let timeout = input.timeout_ms.map(Duration::from_millis);
        let mut ids: Vec<Child> = kids.clone();
        if let Some(other) = &input.join_also {
            ids.push(Child::from_run_id(other.clone()));
        }
        if input.mode.as_deref() == Some("any") {
            let (first, outcome) = join_any::<Value>("first", &ids, timeout)?;
            let mut out = tally(&[outcome]);
            out["spawned"] = json!(kids.len());
            out["first"] = json!(first);
            return Ok(out);
        }
        let outcomes = join_all::<Value>("all", &ids, timeout)?;
        let mut out = tally(&outcomes);
        out["spawned"] = json!(kids.len());
        Ok(out)
    }
}

/// Spawns the children, or finds them in the checkpoint.
fn children(input: &Input) -> Result<Vec<Child>, Error> {
    if input.checkpoint
        && let Some(saved) = load::<Vec<Child>>()?
    {
        return Ok(saved.state);
    }
    let child_input = |i: u32| {
        if let Some(given) = &input.child_input {
            given.clone()
        } else if input.fail.contains(&i) {
            json!({ "fail": true })
        } else {
            json!({ "steps": 1, "url": input.url, "pause_ms": input.pause_ms, "pause_after": true })
        }
    };
    let mut kids = Vec::new();
    if input.batch == 0 {
        for i in 0..input.children {
            kids.push(spawn(
                &format!("item-{i}"),
                &input.deployment,
                &child_input(i),
            )?);
        }
    } else {
        let specs = (0..input.children)
            .map(|i| ChildSpec::new(format!("item-{i}"), &input.deployment, &child_input(i)))
            .collect::<Result<Vec<_>, _>>()?;
        for chunk in specs.chunks(input.batch) {
            for answer in spawn_many(chunk) {
                kids.push(answer?);
            }
        }
    }
    if input.checkpoint {
        save(1, &kids)?;
    }
    Ok(kids)
}

fn tally(outcomes: &[ChildOutcome<Value>]) -> Value {
    let (mut completed, mut failed, mut cancelled) = (0, 0, 0);
    let mut bodies = Vec::new();
    for outcome in outcomes {
        match outcome {
            ChildOutcome::Completed(out) => {
                completed += 1;
                for reply in out["replies"].as_array().into_iter().flatten() {
                    bodies.push(reply["body"].clone());
                }
            }
            ChildOutcome::Failed(error) => {
                failed += 1;
                bodies.push(json!(format!("failed: {error}")));
            }
            ChildOutcome::Cancelled => cancelled += 1,
        }
    }
    json!({ "completed": completed, "failed": failed, "cancelled": cancelled, "bodies": bodies })
}

fn recurse_once(input: &Input, recurse: &Recurse) -> Result<Value, Error> {
    let key = if recurse.vary {
        format!("{}-{}", recurse.key, input.depth)
    } else {
        recurse.key.clone()
    };
    let deeper = Input {
        depth: input.depth + 1,
        ..input.clone()
    };
    let child = match spawn(&key, &input.deployment, &deeper) {
        Ok(child) => child,
        // The end of the chain: its reason is this run's answer.
        Err(Error::Spawn(refused)) => {
            return Ok(
                json!({ "depth": input.depth, "refused": Error::Spawn(refused).to_string() }),
            );
        }
        Err(e) => return Err(e),
    };
    let answer = match join::<Value>(&child)? {
        ChildOutcome::Completed(value) => value,
        ChildOutcome::Failed(error) => json!({ "failed": error }),
        ChildOutcome::Cancelled => json!("cancelled"),
    };
    Ok(json!({ "depth": input.depth, "child": answer }))
}

idem_sdk::export_agent!(Fanout);
