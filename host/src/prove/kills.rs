//! The kill scenario: the run driven by child processes on one scratch store, each
//! `SIGKILL`ed at a random moment and the run resumed by the next, until one is left to
//! finish it. What a process is (the `idem` binary, say) is the caller's: the proof
//! only starts, kills and waits for them, then reads what they left in the store, the
//! granted directories and the capture's log.

use std::fmt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::capture::Answers;
use super::check::{Ended, Observation};
use super::scenario::Scratch;
use super::{ProveError, ProveOptions, file_capture};
use crate::runtime::Authority;
use crate::store::{OpenOptions, OperatorStore, RunStatus, SqliteStore};

/// The lease the killed processes' runs and claims get: a killed holder's lease must run
/// out before the next process may go on, so it is short (the test suite's kill soak
/// uses 300 ms).
const KILL_LEASE: Duration = Duration::from_millis(500);

/// The longest the scenario may take before it gives up.
const KILL_DEADLINE: Duration = Duration::from_secs(600);

/// What a child process is asked to do: drive run `run_id` on the store at `db` to its
/// end, with this authority, its HTTP answered by a [`FileCapture`](super::FileCapture)
/// opened on `capture`.
#[derive(Debug)]
pub struct ChildRun<'a> {
    /// The store.
    pub db: &'a Path,
    /// The run.
    pub run_id: &'a str,
    /// Its input.
    pub input: &'a [u8],
    /// Its namespace, if not the agent's name.
    pub namespace: Option<&'a str>,
    /// What it may reach: the scratch copies of the grants, and a short lease.
    pub authority: &'a Authority,
    /// The capture's directory.
    pub capture: &'a Path,
}

/// Makes the command of one child process.
pub type ChildCommand = dyn Fn(&ChildRun<'_>) -> Command + Send + Sync;

/// Real kills: `count` child processes killed at moments drawn from `seed`.
#[derive(Clone)]
pub struct Kills {
    /// How many processes to kill.
    pub count: u32,
    /// The seed of the moments.
    pub seed: u64,
    /// Makes each child's command.
    pub command: Arc<ChildCommand>,
}

impl fmt::Debug for Kills {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kills")
            .field("count", &self.count)
            .field("seed", &self.seed)
            .finish_non_exhaustive()
    }
}

impl Kills {
    /// Runs the scenario in `scratch`. `root` is where a throwaway scratch directory
    /// for the calibration run goes.
    pub(crate) async fn run(
        &self,
        root: &Path,
        scratch: &Scratch,
        opts: &ProveOptions,
        answers: &Answers,
    ) -> Result<Observation, ProveError> {
        // How long one process takes to drive the whole run, start-up included: kills
        // land within that, so that they hit the run rather than miss it at its end.
        let trial = Scratch::new(root, &opts.authority)?;
        let began = Instant::now();
        self.drive(&trial, opts, answers, 0, Duration::ZERO).await?;
        let window = began.elapsed();
        drop(trial);
        let (last_words, landed) = self
            .drive(scratch, opts, answers, self.count, window)
            .await?;
        self.observe(scratch, opts, &last_words, landed).await
    }

    /// Drives the run in `scratch` with child processes, killing `count` of them at
    /// moments within `window` of their start. Returns what the last one wrote to
    /// stderr, and how many kills landed on a live process.
    async fn drive(
        &self,
        scratch: &Scratch,
        opts: &ProveOptions,
        answers: &Answers,
        count: u32,
        window: Duration,
    ) -> Result<(String, u32), ProveError> {
        let capture = scratch.dir.path().join("capture");
        file_capture::prepare(&capture, answers).map_err(|source| ProveError::Scratch {
            path: capture.clone(),
            source,
        })?;
        let mut authority = scratch.authority.clone();
        authority.limits.lease = KILL_LEASE;
        let db = scratch.db();
        let child = ChildRun {
            db: &db,
            run_id: &opts.run_id,
            input: &opts.input,
            namespace: opts.namespace.as_deref(),
            authority: &authority,
            capture: &capture,
        };
        let mut rng = fastrand::Rng::with_seed(self.seed);
        let window_ms = u64::try_from(window.as_millis())
            .unwrap_or(u64::MAX)
            .max(20);
        let deadline = Instant::now() + KILL_DEADLINE;
        let mut kills = 0;
        let last_words = loop {
            if Instant::now() > deadline {
                return Err(ProveError::Process(format!(
                    "the run did not finish within {}s ({kills} kills)",
                    KILL_DEADLINE.as_secs()
                )));
            }
            let doomed = kills < count;
            // Only the last process's words are read; a doomed one's would fill a pipe
            // nobody empties.
            let mut process = (self.command)(&child)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(if doomed {
                    Stdio::null()
                } else {
                    Stdio::piped()
                })
                .spawn()
                .map_err(|e| ProveError::Process(e.to_string()))?;
            if doomed {
                // Past the first quarter (a process's first moments are its own
                // start-up, where a kill tests nothing of the run) and before the last
                // (a resumed run has less left to do than the whole one timed).
                let moment = Duration::from_millis(rng.u64(window_ms / 4..=window_ms * 3 / 4));
                tokio::time::sleep(moment).await;
                if process
                    .try_wait()
                    .map_err(|e| ProveError::Process(e.to_string()))?
                    .is_none()
                {
                    // SIGKILL: nothing of the process runs after it.
                    process
                        .kill()
                        .map_err(|e| ProveError::Process(e.to_string()))?;
                    let _ = process.wait();
                    kills += 1;
                    continue;
                }
            }
            let waited = tokio::task::spawn_blocking(move || process.wait_with_output())
                .await
                .map_err(|e| ProveError::Process(e.to_string()))?
                .map_err(|e| ProveError::Process(e.to_string()))?;
            break String::from_utf8_lossy(&waited.stderr).into_owned();
        };
        Ok((last_words, kills))
    }

    /// What the processes left: the store, the capture's log, the granted copies.
    async fn observe(
        &self,
        scratch: &Scratch,
        opts: &ProveOptions,
        last_words: &str,
        landed: u32,
    ) -> Result<Observation, ProveError> {
        let capture = scratch.dir.path().join("capture");
        let db = scratch.db();
        let store = SqliteStore::open_with(&db, &OpenOptions::default())?;
        let record = store.run(&opts.run_id).await?;
        let (ended, namespace, instances, reclaimed) = match record {
            Some(r) => {
                let ended = match (r.status, r.outcome) {
                    (RunStatus::Completed, Some(output)) => Ended::Completed(output),
                    (status, outcome) => Ended::Not(format!(
                        "{status}: {}{}",
                        String::from_utf8_lossy(&outcome.unwrap_or_default()),
                        last(last_words)
                    )),
                };
                (ended, r.namespace, r.counts.instances, r.counts.reclaimed)
            }
            None => (
                Ended::Not(format!("the run was never started{}", last(last_words))),
                String::new(),
                0,
                0,
            ),
        };
        Ok(Observation {
            ended,
            namespace,
            events: Vec::new(),
            steps: store.steps(&opts.run_id).await?,
            open: store.open_claims(Some(&opts.run_id)).await?,
            children: super::scenario::children(&store, &opts.run_id).await?,
            captured: file_capture::read(&capture, &opts.run_id).map_err(|source| {
                ProveError::Scratch {
                    path: capture.clone(),
                    source,
                }
            })?,
            files: scratch.files()?,
            instances,
            reclaimed,
            kills: Some(landed),
        })
    }
}

/// The last line a process wrote to stderr, to show with a failure.
fn last(stderr: &str) -> String {
    match stderr.lines().rev().find(|l| !l.trim().is_empty()) {
        Some(line) => format!(
            " (the last process said: {})",
            crate::runtime::cut(line, 300)
        ),
        None => String::new(),
    }
}
