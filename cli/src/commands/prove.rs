//! `idem prove`: crash-tests an agent at every crash point (and in chaos, and under real
//! kills) in scratch stores, and says what broke, each finding with the one command
//! that reproduces it. The proof itself is the library's (`idem::prove`); this file
//! turns flags into its options and its report into text, JSON and JUnit.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use idem::prove::{ChildRun, Kills, Progress, ProveOptions, Scenario, Upstream, prove};
use idem::runtime::{Authority, Phase, Runtime, check_grants};

use idem::ops;

use super::args::{AuthorityArgs, CacheArgs, DbArgs, json_or_file, protected};
use super::display;
use super::run::default_run_id;
use crate::exit::{BadInput, Exit, op_error};

mod report;

pub(crate) use report::xml_escape;

/// The seed of the kill moments: fixed, so that the same command kills at the same
/// moments (as far as the machine's speed lets it).
const KILL_SEED: u64 = 1;

#[derive(Debug, Parser)]
pub struct ProveCommand {
    /// The agent: a WebAssembly component of the idem:agent world.
    agent: PathBuf,
    /// The input, as JSON, or `@FILE` to read it from a file (`@-`: from stdin).
    // A negative number is JSON too: without `allow_negative_numbers`, clap takes the
    // value of `--input -1` for a flag.
    #[arg(long, default_value = "null", allow_negative_numbers = true)]
    input: String,
    /// The run id every scenario uses. Defaults to what `idem run` would use.
    #[arg(long)]
    run_id: Option<String>,
    /// The namespace the agent's keys live in. Defaults to the agent's file name.
    #[arg(long)]
    namespace: Option<String>,
    #[command(flatten)]
    authority: AuthorityArgs,
    /// The phases to crash at: `all`, `none`, or a comma-separated list of
    /// before-claim, after-claim, in-effect, after-commit, after-save, before-spawn,
    /// after-spawn, before-join, after-join (a spawn's phases at each spawn of the
    /// clean run, a join's at each join).
    #[arg(long, default_value = "all", value_name = "all|none|LIST", value_parser = phases)]
    phases: PhaseList,
    /// The steps to crash at: `all`, or N for steps 1 to N.
    #[arg(long, default_value = "all", value_name = "all|N", value_parser = steps)]
    steps: StepCount,
    /// Seeded chaos runs: a count N (seeds 1 to N) or a comma-separated list of seeds
    /// (one seed alone as `42,`).
    #[arg(long, value_name = "N|SEEDS", value_parser = seeds)]
    chaos: Option<SeedList>,
    /// Real kills: run the agent in child `idem run` processes, SIGKILL N of them at
    /// random moments, each resumed by the next, all on one scratch store.
    #[arg(long, value_name = "N")]
    kills: Option<u32>,
    /// Send the clean run's HTTP requests to this server (`http://HOST:PORT`) instead
    /// of their real destinations. Every other scenario is answered from what the
    /// clean run got, whatever this says.
    #[arg(long, value_name = "URL")]
    stub: Option<String>,
    /// Print the whole report as one JSON object.
    #[arg(long)]
    json: bool,
    /// Also write a JUnit XML report to FILE: one test case per scenario.
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    /// Where the scratch stores go (each removed after its scenario). Defaults to the
    /// system's temp dir.
    #[arg(long, value_name = "DIR")]
    scratch: Option<PathBuf>,
    /// Instead of crash-testing the agent, check it as a new version of a deployment
    /// against that deployment's runs in flight in this store (a SQLite file or a
    /// PostgreSQL URL), read-only, as `idem upgrade --dry-run` checks a deployed
    /// version: each run resumed in scratch stores on the version it is on and on this
    /// build, nothing sent. Exits 7 when any run would run a committed step again,
    /// take another next step, or break. The gate a CI job runs before a deploy.
    #[arg(long, value_name = "PATH|URL")]
    against_store: Option<String>,
    /// With --against-store: the deployment whose runs are checked. Defaults to the
    /// agent's name (its file name), as `idem deploy` names it.
    #[arg(long, value_name = "NAME", requires = "against_store")]
    deployment: Option<String>,
    /// With --against-store: the key of a store encrypted at rest (a file of 64 hex
    /// digits; IDEM_STORE_KEY may hold the digits instead).
    #[arg(long, value_name = "PATH", requires = "against_store")]
    key_file: Option<PathBuf>,
    #[command(flatten)]
    cache: CacheArgs,
}

/// `--phases`.
#[derive(Debug, Clone)]
pub struct PhaseList(Vec<Phase>);

fn phases(s: &str) -> Result<PhaseList, String> {
    match s {
        "all" => return Ok(PhaseList(every_phase().collect())),
        "none" => return Ok(PhaseList(Vec::new())),
        _ => {}
    }
    s.split(',')
        .map(|name| {
            every_phase()
                .find(|p| p.name() == name.trim())
                .ok_or_else(|| {
                    format!(
                        "unknown phase {name:?}: expected all, none, or a list of before-claim, \
                         after-claim, in-effect, after-commit, after-save, before-spawn, \
                         after-spawn, before-join, after-join"
                    )
                })
        })
        .collect::<Result<_, _>>()
        .map(PhaseList)
}

/// A step's phases, then a spawn's and a join's.
pub(crate) fn every_phase() -> impl Iterator<Item = Phase> {
    Phase::ALL.into_iter().chain(Phase::CHILDREN)
}

/// `--steps`.
#[derive(Debug, Clone, Copy)]
pub struct StepCount(Option<u32>);

fn steps(s: &str) -> Result<StepCount, String> {
    if s == "all" {
        return Ok(StepCount(None));
    }
    match s.parse::<u32>() {
        Ok(n) if n > 0 => Ok(StepCount(Some(n))),
        _ => Err(format!("expected all or a number from 1, got {s:?}")),
    }
}

/// `--chaos`.
#[derive(Debug, Clone)]
pub struct SeedList(Vec<u64>);

fn seeds(s: &str) -> Result<SeedList, String> {
    let err = || format!("expected a count or a comma-separated list of seeds, got {s:?}");
    if !s.contains(',') {
        let n: u64 = s.parse().map_err(|_| err())?;
        return Ok(SeedList((1..=n).collect()));
    }
    s.split(',')
        .filter(|seed| !seed.trim().is_empty())
        .map(|seed| seed.trim().parse::<u64>().map_err(|_| err()))
        .collect::<Result<_, _>>()
        .map(SeedList)
}

impl ProveCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        if let Some(db) = &self.against_store {
            return self.against_store(db).await;
        }
        let input = json_or_file("--input", &self.input)?;
        let authority = self.authority.authority()?;
        let upstream = match &self.stub {
            Some(url) => Upstream::stub(url).map_err(|e| BadInput(format!("--stub: {e}")))?,
            None => Upstream::Network,
        };
        let cache = self.cache.dir();
        let scratch = self.scratch.clone().unwrap_or_else(std::env::temp_dir);
        check_grants(
            &authority.dirs,
            &protected(Some(&scratch), None, cache.as_deref()),
        )?;
        let runtime = Arc::new(Runtime::new(cache.clone())?);
        let agent = runtime.load(&self.agent)?;
        let run_id = match &self.run_id {
            Some(id) => id.clone(),
            None => default_run_id(agent.name(), &input),
        };
        let kills = self.kills.map(|count| Kills {
            count,
            seed: KILL_SEED,
            command: Arc::new(child_command(self.agent.clone(), cache.clone())),
        });
        let opts = ProveOptions {
            run_id,
            input,
            authority,
            namespace: self.namespace.clone(),
            phases: self.phases.0.clone(),
            steps: self.steps.0,
            chaos: self.chaos.clone().map(|s| s.0).unwrap_or_default(),
            kills,
            upstream,
            scratch,
        };
        let bar = report::Bar::new(std::io::stderr().is_terminal());
        let mut on_progress = |p: Progress<'_>| bar.update(p);
        let found = prove(&runtime, &agent, &opts, &mut on_progress).await?;
        bar.finish();
        let commands = |s: &Scenario| self.reproduce(s);
        if let Some(path) = &self.junit {
            let xml = report::junit(&self.agent, &found, &commands);
            std::fs::write(path, xml).map_err(|e| {
                BadInput(format!("cannot write --junit file {}: {e}", path.display()))
            })?;
        }
        if self.json {
            println!("{}", display::json(&report::json(&found, &commands)));
        } else {
            report::print(&self.agent, &found, &commands);
        }
        Ok(if found.passed() {
            Exit::Done
        } else {
            Exit::Violations
        })
    }

    /// `--against-store`: this build rehearsed on the deployment's runs in flight.
    async fn against_store(&self, db: &str) -> anyhow::Result<Exit> {
        let store = DbArgs {
            db: db.to_owned(),
            db_pool: 4,
            db_timeout: std::time::Duration::from_secs(10),
            key_file: self.key_file.clone(),
        }
        .open_read_only()
        .await?;
        let runtime = Arc::new(Runtime::new(self.cache.dir())?);
        let agent = runtime.load(&self.agent)?;
        let name = self
            .deployment
            .clone()
            .unwrap_or_else(|| agent.name().to_owned());
        let scratch = self.scratch.clone().unwrap_or_else(std::env::temp_dir);
        let report = ops::rehearse_build(&store, &runtime, &name, &agent, &[], &scratch)
            .await
            .map_err(op_error)?;
        let target = format!("this build ({})", self.agent.display());
        super::versions::report_rehearsal(&name, &target, &report, self.json, self.junit.as_deref())
    }

    /// The one command that reproduces a scenario: `idem run` with the same input and
    /// grants and the same fault, on a fresh store (so that it runs, rather than finding
    /// the run done). It runs the agent for real: granted directories and destinations
    /// are the real ones.
    fn reproduce(&self, scenario: &Scenario) -> String {
        let mut words: Vec<String> = vec!["idem".into()];
        if let Scenario::Kills { kills, .. } = scenario {
            words.extend(["prove".into(), quote(&self.agent.to_string_lossy())]);
            self.common_flags(&mut words, false);
            words.extend(["--phases".into(), "none".into()]);
            words.extend(["--kills".into(), kills.to_string()]);
            return words.join(" ");
        }
        words.extend(["run".into(), quote(&self.agent.to_string_lossy())]);
        // Evaluated by the shell: a new store each time the command is run.
        words.extend(["--db".into(), "\"$(mktemp -d)/idem.db\"".into()]);
        self.common_flags(&mut words, true);
        match scenario {
            Scenario::Crash { point } => words.extend(["--crash-at".into(), point.to_string()]),
            Scenario::Chaos { seed } => words.extend(["--chaos".into(), seed.to_string()]),
            Scenario::Clean | Scenario::Kills { .. } => {}
        }
        words.join(" ")
    }

    fn common_flags(&self, words: &mut Vec<String>, run: bool) {
        if self.input != "null" {
            words.extend(["--input".into(), quote(&self.input)]);
        }
        if let Some(id) = &self.run_id {
            words.extend(["--run-id".into(), quote(id)]);
        }
        if let Some(ns) = &self.namespace {
            words.extend(["--namespace".into(), quote(ns)]);
        }
        let a = &self.authority;
        for dir in &a.dirs {
            let grant = format!("{}::{}", dir.host.display(), dir.guest);
            words.extend(["--dir".into(), quote(&grant)]);
        }
        for (k, v) in &a.env {
            words.extend(["--env".into(), quote(&format!("{k}={v}"))]);
        }
        for dest in &a.allow_http {
            words.extend(["--allow-http".into(), quote(&dest.to_string())]);
        }
        if a.allow_http_outside_claims {
            words.push("--allow-http-outside-claims".into());
        }
        if !run && let Some(url) = &self.stub {
            words.extend(["--stub".into(), quote(url)]);
        }
    }
}

/// A word for a POSIX shell: as it is when nothing in it is special, else in single
/// quotes.
fn quote(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./:=@,+%".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        return word.to_string();
    }
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The command of one killed process: this very binary, `idem run` on the scratch
/// store, with the proof's capture.
fn child_command(
    agent: PathBuf,
    cache: Option<PathBuf>,
) -> impl Fn(&ChildRun<'_>) -> std::process::Command + Send + Sync {
    move |child: &ChildRun<'_>| {
        // The running binary; should it be gone (replaced on disk), `idem` on the PATH.
        let program = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("idem"));
        let mut cmd = std::process::Command::new(program);
        cmd.arg("run").arg(&agent).arg("--db").arg(child.db);
        cmd.args(["--run-id", child.run_id]);
        cmd.arg("--input")
            .arg(String::from_utf8_lossy(child.input).into_owned());
        if let Some(ns) = child.namespace {
            cmd.args(["--namespace", ns]);
        }
        authority_args(&mut cmd, child.authority);
        cmd.arg("--prove-capture").arg(child.capture);
        match &cache {
            Some(dir) => cmd.arg("--cache-dir").arg(dir),
            None => cmd.arg("--no-cache"),
        };
        cmd.env("IDEM_LOG", "error");
        cmd
    }
}

/// The flags that give a child process `authority`: what `AuthorityArgs` parses back.
fn authority_args(cmd: &mut std::process::Command, a: &Authority) {
    for dir in &a.dirs {
        cmd.arg("--dir")
            .arg(format!("{}::{}", dir.host.display(), dir.guest));
    }
    for (k, v) in &a.env {
        cmd.arg("--env").arg(format!("{k}={v}"));
    }
    for dest in &a.http.allow {
        cmd.arg("--allow-http").arg(dest.to_string());
    }
    if a.http.outside_claims {
        cmd.arg("--allow-http-outside-claims");
    }
    cmd.args(["--sync", a.sync.as_str()]);
    let l = &a.limits;
    let ms = |d: std::time::Duration| format!("{}ms", d.as_millis());
    cmd.args(["--lease", &ms(l.lease)]);
    cmd.args(["--await-timeout", &ms(l.await_timeout)]);
    cmd.args(["--max-compute", &ms(l.max_compute)]);
    cmd.args(["--effect-timeout", &ms(l.effect_timeout)]);
    for (flag, n) in [
        ("--max-key-bytes", l.max_key_bytes),
        ("--max-result-bytes", l.max_result_bytes),
        ("--max-state-bytes", l.max_state_bytes),
        ("--max-output-bytes", l.max_output_bytes),
        ("--max-memory", l.max_memory_bytes),
        ("--max-handles", l.max_handles),
        ("--max-claims", l.max_claims),
        ("--max-children", l.max_children),
        ("--max-depth", l.max_depth),
        ("--max-table-elements", l.max_table_elements),
    ] {
        cmd.arg(flag).arg(n.to_string());
    }
    if let Some(fuel) = l.max_fuel {
        cmd.arg("--max-fuel").arg(fuel.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_phases_steps_and_seeds() {
        assert_eq!(phases("all").unwrap().0.len(), 9);
        assert_eq!(phases("after-spawn").unwrap().0, [Phase::AfterSpawn]);
        assert!(phases("none").unwrap().0.is_empty());
        assert_eq!(
            phases("in-effect,after-save").unwrap().0,
            [Phase::InEffect, Phase::AfterSave]
        );
        assert!(phases("nowhere").is_err());
        assert_eq!(steps("all").unwrap().0, None);
        assert_eq!(steps("10").unwrap().0, Some(10));
        assert!(steps("0").is_err());
        assert_eq!(seeds("3").unwrap().0, [1, 2, 3]);
        assert_eq!(seeds("42,").unwrap().0, [42]);
        assert_eq!(seeds("7, 9").unwrap().0, [7, 9]);
        assert!(seeds("x").is_err());
    }

    #[test]
    fn quotes_for_the_shell() {
        assert_eq!(quote("in-effect:7"), "in-effect:7");
        assert_eq!(quote(r#"{"a":1}"#), r#"'{"a":1}'"#);
        assert_eq!(quote("it's"), r"'it'\''s'");
    }
}
