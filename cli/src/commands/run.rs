//! `idem run`: the foreground form — load an agent, deploy it, submit the run and drive
//! it to its end in this process, then print the output and the counts.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use idem::prove::FileCapture;
use idem::runtime::{
    CrashPoint, Echo, FaultPlan, Host, HttpCapture, Rebuilt, RunFailure, RunOptions, RunReport,
    local_source,
};
use idem::store::{Counts, RunStatus};

use super::args::{
    AuthorityArgs, CacheArgs, DbArgs, json_or_file, limit_flag, load_agent, say_storing,
};
use super::display;
use super::progress::Progress;
use crate::exit::{BadInput, Exit};
use crate::shutdown::Shutdown;

#[derive(Debug, Parser)]
pub struct RunCommand {
    /// The agent: a WebAssembly component of the idem:agent world.
    agent: PathBuf,
    #[command(flatten)]
    db: DbArgs,
    /// The run's id. Defaults to the agent's name and a hash of the input, so that the
    /// same command resumes the same run.
    #[arg(long)]
    run_id: Option<String>,
    /// The input, as JSON, or `@FILE` to read it from a file (`@-`: from stdin).
    // A negative number is JSON too: without `allow_negative_numbers`, clap takes the
    // value of `--input -1` for a flag.
    #[arg(long, default_value = "null", allow_negative_numbers = true)]
    input: String,
    #[command(flatten)]
    authority: AuthorityArgs,
    /// Drop the instance and start a fresh one each time it has been granted N claims.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    recycle_every: Option<u32>,
    /// Drop the instance at PHASE of step STEP: before-claim, after-claim, in-effect,
    /// after-commit or after-save. Repeatable.
    #[arg(long, value_name = "PHASE:STEP")]
    crash_at: Vec<CrashPoint>,
    /// Drop instances at random host calls and mid-computation, from this seed.
    #[arg(long, value_name = "SEED")]
    chaos: Option<u64>,
    #[command(flatten)]
    cache: CacheArgs,
    /// The name the agent runs under, which is the namespace its keys live in.
    /// Defaults to the agent's file name. A name other components use needs `idem
    /// deploy --name` first, or --upgrade; a new build of the file the name was last run
    /// from is taken without either (the dev loop), and recorded.
    #[arg(long)]
    namespace: Option<String>,
    /// Resume a run that was started with another build of the agent, or run this
    /// component under a name other components use (both are recorded).
    #[arg(long)]
    upgrade: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Draw no progress line (it is drawn on stderr only when stderr is a terminal).
    #[arg(long, short)]
    quiet: bool,
    /// Answer the agent's HTTP from what `idem prove` recorded in DIR, and log its
    /// requests there, instead of sending them: how `idem prove --kills` runs its
    /// processes. Not for other use.
    #[arg(long, hide = true, value_name = "DIR")]
    prove_capture: Option<PathBuf>,
}

impl RunCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        let input = json_or_file("--input", &self.input)?;
        let authority = self.authority.authority()?;
        let cache = self.cache.dir();
        // Grants and the agent are checked before the store is opened: a refused grant
        // or a bad agent changes nothing.
        let (runtime, agent) = load_agent(&self.agent, &authority, &self.db, cache)?;
        let run_id = match &self.run_id {
            Some(id) => id.clone(),
            None => default_run_id(agent.name(), &input),
        };
        let opts = RunOptions {
            run_id: run_id.clone(),
            input,
            authority,
            faults: FaultPlan {
                crash_at: self.crash_at.clone(),
                recycle_every: self.recycle_every,
                chaos: self.chaos,
            },
            upgrade: self.upgrade,
            namespace: self.namespace.clone(),
            // A local file: a rebuild of it is taken without --upgrade (the dev loop).
            source: local_source(&self.agent),
            capture: match &self.prove_capture {
                Some(dir) => Some(Arc::new(FileCapture::open(dir).map_err(|e| {
                    BadInput(format!(
                        "cannot open the proof's capture in {}: {e}",
                        dir.display()
                    ))
                })?) as Arc<dyn HttpCapture>),
                None => None,
            },
            ..RunOptions::default()
        };
        opts.check()?;
        let store = self.db.open().await?;
        say_storing(store.as_ref(), &agent, &self.agent).await?;
        let host = Host::new(Arc::new(runtime), Arc::clone(&store))?;
        // Ctrl-C (or SIGTERM) stops the run the way a worker drains: side effects in
        // flight end at their commit, and the lease is given back, so the next `idem
        // run` (or a worker) resumes at once instead of waiting for the lease.
        let shutdown = Shutdown::on_signals(
            "idem run",
            "stopping at the next step (interrupt again to exit at once)",
        )?;
        let progress = (!self.quiet && !self.json && std::io::stderr().is_terminal())
            .then(|| Progress::start(Arc::clone(&store), &run_id));
        let echo = progress.as_ref().map_or(Echo::Stderr, Progress::echo);
        let opts = RunOptions {
            echo,
            stop: Some(shutdown.stop_signal()),
            ..opts
        };
        let report = host
            .run(&agent, &opts)
            .await
            .with_context(|| format!("run {}", display::name(&run_id)));
        drop(shutdown);
        if let Some(progress) = progress {
            progress.finish();
        }
        let report = report?;
        if let Some(rebuilt) = &report.rebuilt {
            say_rebuilt(&self.agent, &report.run_id, rebuilt);
        }
        self.print(&report);
        Ok(match report.status {
            RunStatus::Completed => Exit::Done,
            RunStatus::InDoubt => Exit::InDoubt,
            RunStatus::Cancelled => Exit::Cancelled,
            RunStatus::Running | RunStatus::Queued | RunStatus::Paused => Exit::Interrupted,
            RunStatus::Failed => Exit::AgentFailed,
        })
    }

    fn print(&self, report: &RunReport) {
        let c = &report.counts;
        if self.json {
            let (output, error) = match report.status {
                RunStatus::Completed => (
                    display::payload_value(&report.outcome),
                    serde_json::Value::Null,
                ),
                _ => (
                    serde_json::Value::Null,
                    display::payload_value(&report.outcome),
                ),
            };
            let doc = serde_json::json!({
                "run_id": report.run_id,
                "status": report.status,
                "output": output,
                "error": error,
                "already_finished": report.already_finished,
                "instances_now": report.instances_now,
                "counts": c,
                "counts_now": report.counts_now,
                "counts_exact": report.counts_exact,
                "hint": failure_hint(report),
            });
            println!("{}", display::json(&doc));
            return;
        }
        let status = match (report.status, report.already_finished) {
            (RunStatus::Completed, true) => "had already completed",
            (RunStatus::Completed, false) => "completed",
            (RunStatus::Cancelled, _) => "was cancelled",
            (RunStatus::Running | RunStatus::Queued, _) => {
                "was interrupted; its lease was given back: the same command resumes it"
            }
            (RunStatus::InDoubt, _) => "stopped in doubt (settle it with idem resolve)",
            (RunStatus::Paused, _) => {
                "is paused; it holds nothing: idem resume continues it (a worker, or the same \
                 command, drives it then)"
            }
            _ => "failed",
        };
        println!("run {} {status}", display::name(&report.run_id));
        match report.status {
            RunStatus::Completed => println!("output: {}", display::payload(&report.outcome)),
            RunStatus::Running | RunStatus::Queued | RunStatus::Paused => {}
            _ => println!("error: {}", display::payload(&report.outcome)),
        }
        print_counts(report);
        if !report.counts_exact {
            println!(
                "(an earlier process of this run was killed before it wrote its last counts; \
                 reclaimed is exact)"
            );
        }
        if let Some(hint) = failure_hint(report) {
            println!("hint: {hint}");
        }
    }
}

/// What the dev loop did, on stderr: a new build of the same file was taken in place of
/// the earlier one, without --upgrade, and recorded.
fn say_rebuilt(agent: &std::path::Path, run_id: &str, rebuilt: &Rebuilt) {
    let short = |digest: &str| digest.get(..12).unwrap_or(digest).to_string();
    let mut line = format!(
        "idem: {} is a new build of the same file: namespace {} runs it now",
        display::name(&agent.to_string_lossy()),
        idem::text::quoted(&rebuilt.namespace)
    );
    if let Some(previous) = &rebuilt.previous {
        line.push_str(&format!(" (was {})", short(previous)));
    }
    if let Some(from) = &rebuilt.run_upgraded_from {
        line.push_str(&format!(
            "; run {} resumes on it, upgraded from {}",
            idem::text::quoted(run_id),
            short(from)
        ));
    }
    eprintln!(
        "{line} (recorded as a rebuild; a different file would need idem deploy or --upgrade)"
    );
}

/// The counts: one line when this process did all the run did; else what this process
/// did, then the run's totals, each labelled (another process drove the run before, or
/// with this one, and its work is not this one's).
fn print_counts(report: &RunReport) {
    let line = |c: &Counts| {
        format!(
            "executed {}  skipped {}  awaited {}  reclaimed {}  instances {}",
            c.executed, c.skipped, c.awaited, c.reclaimed, c.instances
        )
    };
    // Counts an earlier, killed holder had not written yet are missing: say so rather
    // than print them as exact.
    let at_least = if report.counts_exact { "" } else { "at least " };
    if report.counts_now == report.counts && report.counts_exact {
        println!("{}", line(&report.counts));
    } else {
        println!("this process: {}", line(&report.counts_now));
        println!("run totals: {at_least}{}", line(&report.counts));
    }
}

/// What to do about a failed run, in flags.
fn failure_hint(report: &RunReport) -> Option<String> {
    match &report.failure {
        Some(RunFailure::Limit(limit)) => Some(format!(
            "raise the limit with {} and run the same command again: committed steps are kept",
            limit_flag(limit.limit_name())
        )),
        Some(RunFailure::AgentError | RunFailure::Trapped) => {
            wasi_errno_hint(&String::from_utf8_lossy(&report.outcome))
        }
        _ => None,
    }
}

/// The WASI errnos that usually mean a path outside the grants, with what to say of
/// each. Agents number errnos as WASI does, not as the host's OS: WASI's ENOENT is 44
/// (ECHRNG on Linux), so neither the number nor the text is what the operator expects.
const WASI_ERRNOS: &[(u32, &str)] = &[
    (
        44,
        "ENOENT (no such file or directory) in WASI's numbering: the agent sees no file \
         outside the directories granted with --dir HOST::GUEST, and sees those under their \
         GUEST paths",
    ),
    (
        76,
        "ENOTCAPABLE in WASI's numbering: the agent tried to reach outside the directories \
         granted with --dir HOST::GUEST",
    ),
    (
        2,
        "EACCES (permission denied) in WASI's numbering: the host refused the access; \
         check the --dir grant and the host directory's permissions",
    ),
    (
        63,
        "EPERM (operation not permitted) in WASI's numbering: the sandbox does not allow \
         it (no subprocesses, sockets or paths outside the --dir grants)",
    ),
];

/// A hint for an agent error that shows a WASI errno as Rust prints one (`(os error
/// 44)`) or Python does (`[Errno 44]`), for the errnos of [`WASI_ERRNOS`].
fn wasi_errno_hint(error: &str) -> Option<String> {
    WASI_ERRNOS.iter().find_map(|(errno, meaning)| {
        let said = if error.contains(&format!("(os error {errno})")) {
            format!("os error {errno}")
        } else if error.contains(&format!("[Errno {errno}]")) {
            format!("[Errno {errno}]")
        } else {
            return None;
        };
        Some(format!("{said} is {meaning}"))
    })
}

pub use idem::ops::default_run_id;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wasi_errnos_get_a_hint_and_only_those() {
        let missing = "side effect failed: /etc/x: No such file or directory (os error 44)";
        assert!(wasi_errno_hint(missing).is_some_and(|h| h.contains("--dir")));
        assert!(wasi_errno_hint("Capabilities insufficient (os error 76)").is_some());
        assert_eq!(wasi_errno_hint("(os error 440)"), None);
        assert_eq!(wasi_errno_hint("os error 44 without parentheses"), None);
        // Python's OSError text, from inside the sandbox.
        let python = "FileNotFoundError: [Errno 44] No such file or directory: '/etc/x'";
        assert!(
            wasi_errno_hint(python).is_some_and(|h| h.starts_with("[Errno 44] is ENOENT")),
            "{python}"
        );
        assert!(wasi_errno_hint("PermissionError: [Errno 63] not permitted").is_some());
        assert_eq!(wasi_errno_hint("[Errno 444]"), None);
    }
}
