//! `idem submit`: queue runs of a deployed agent and return at once; workers drive
//! them. Submitting is idempotent: the same run id with the same input is the same run.
//! `--batch` queues many runs in one command and one transaction of the store.

use clap::Parser;
use idem::ops::{self, BatchRun, OpError};
use idem::store::Submitted;
use serde::Deserialize;

use super::args::{AuthorityArgs, DbArgs, json_or_file, text_or_file};
use super::display;
use crate::exit::{BadInput, Exit, op_error};

#[derive(Debug, Parser)]
pub struct SubmitCommand {
    /// The deployed agent: its name, or a component digest (64 hex digits) deployed
    /// under some name.
    agent: String,
    #[command(flatten)]
    db: DbArgs,
    /// The input, as JSON, or `@FILE` to read it from a file (`@-`: from stdin).
    // A negative number is JSON too: without `allow_negative_numbers`, clap takes the
    // value of `--input -1` for a flag.
    #[arg(long, default_value = "null", allow_negative_numbers = true)]
    input: String,
    /// The run's id. Defaults to the agent's name and a hash of the input.
    #[arg(long)]
    run_id: Option<String>,
    /// The namespace the run's keys live in; the component must be deployed under that
    /// name. Defaults to the deployment's name.
    #[arg(long)]
    namespace: Option<String>,
    /// The run's priority, 0 (the lowest) to 1000: workers lease due runs of higher
    /// priority first, then the oldest.
    #[arg(long, default_value_t = 0)]
    priority: u32,
    /// Queue many runs at once: `@FILE` (`@-`: stdin) of JSON Lines, one run per line,
    /// `{"input": ..., "run_id": "...", "priority": N}` (all optional). Every line is
    /// read before anything is queued; each run is then answered as a lone submit of it
    /// would be, and a refused one does not stop the others (exit 2 if any was).
    #[arg(long, value_name = "@FILE", conflicts_with_all = ["input", "run_id", "priority"])]
    batch: Option<String>,
    /// Narrow what the run may reach (the deployment's grants when not given).
    #[command(flatten)]
    authority: AuthorityArgs,
    /// Print one JSON object (an array with `--batch`) instead of text.
    #[arg(long)]
    json: bool,
}

/// A run to queue, as read from the flags or a line of `--batch`.
struct Queued {
    input: Vec<u8>,
    run_id: Option<String>,
    priority: u32,
}

/// A line of `--batch`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    #[serde(default)]
    input: serde_json::Value,
    run_id: Option<String>,
    #[serde(default)]
    priority: u32,
}

impl SubmitCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        let runs: Vec<Queued> = match &self.batch {
            Some(batch) => lines(&text_or_file("--batch", batch)?)?,
            None => vec![Queued {
                input: json_or_file("--input", &self.input)?,
                run_id: self.run_id.clone(),
                priority: self.priority,
            }],
        };
        let batch: Vec<BatchRun<'_>> = runs
            .iter()
            .map(|run| BatchRun {
                input: &run.input,
                run_id: run.run_id.as_deref(),
                priority: run.priority,
            })
            .collect();
        let store = self.db.open_existing().await?;
        let answers = ops::submit_many(
            store.as_ref(),
            &self.agent,
            self.namespace.as_deref(),
            &batch,
            |base| self.authority.apply(base),
        )
        .await
        .map_err(op_error)?;
        if self.batch.is_none() {
            let Some(answer) = answers.into_iter().next() else {
                unreachable!("one answer per run")
            };
            let submitted = answer.map_err(op_error)?;
            if self.json {
                println!("{}", display::json(&doc(&submitted)));
            } else {
                println!("{}", said(&submitted));
            }
            return Ok(Exit::Done);
        }
        let refused = answers.iter().filter(|a| a.is_err()).count();
        if self.json {
            let docs: Vec<serde_json::Value> = answers
                .iter()
                .zip(&batch)
                .map(|(answer, run)| match answer {
                    Ok(submitted) => doc(submitted),
                    Err(e) => refusal(run, e),
                })
                .collect();
            println!("{}", display::json(&serde_json::Value::Array(docs)));
        } else {
            for (i, answer) in answers.iter().enumerate() {
                match answer {
                    Ok(submitted) => println!("{}", said(submitted)),
                    Err(e) => println!("line {}: refused: {e}", i + 1),
                }
            }
            let created = answers
                .iter()
                .filter(|a| a.as_ref().is_ok_and(|s| s.created))
                .count();
            println!(
                "{created} submitted, {} existed with their input, {refused} refused",
                answers.len() - created - refused
            );
        }
        Ok(if refused > 0 {
            Exit::BadInput
        } else {
            Exit::Done
        })
    }
}

/// Every run of a `--batch` file, or the first bad line's error (nothing is queued).
fn lines(text: &[u8]) -> anyhow::Result<Vec<Queued>> {
    let text = std::str::from_utf8(text)
        .map_err(|e| BadInput(format!("--batch is not UTF-8 text: {e}")))?;
    let mut runs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let line: Line = serde_json::from_str(line).map_err(|e| {
            BadInput(format!(
                "--batch line {}: {e}; each line is a JSON object such as \
                 {{\"input\": {{...}}, \"run_id\": \"r1\", \"priority\": 0}}",
                i + 1
            ))
        })?;
        runs.push(Queued {
            input: serde_json::to_vec(&line.input)?,
            run_id: line.run_id,
            priority: line.priority,
        });
    }
    if runs.is_empty() {
        return Err(BadInput("--batch holds no run".into()).into());
    }
    Ok(runs)
}

fn doc(submitted: &Submitted) -> serde_json::Value {
    let record = &submitted.record;
    serde_json::json!({
        "run_id": record.run_id,
        "status": record.status,
        "created": submitted.created,
        "agent": record.agent,
        "digest": record.digest,
    })
}

fn refusal(run: &BatchRun<'_>, e: &OpError) -> serde_json::Value {
    serde_json::json!({ "run_id": run.run_id, "error": e.to_string() })
}

fn said(submitted: &Submitted) -> String {
    let record = &submitted.record;
    if submitted.created {
        format!(
            "submitted run {} ({})",
            display::name(&record.run_id),
            record.status
        )
    } else {
        format!(
            "run {} exists with this input ({})",
            display::name(&record.run_id),
            record.status
        )
    }
}
