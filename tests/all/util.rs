//! The test harness: a temp dir with a store and a granted data dir, a shared runtime,
//! the `idem` binary, and readers for the guests' side-effect logs. `proxy`: a fault
//! proxy between idem and PostgreSQL.

pub mod proxy;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::{Arc, OnceLock};

use idem::runtime::{
    Authority, DirGrant, FaultPlan, Host, HostError, Limits, LoadedAgent, RunOptions, RunReport,
    Runtime,
};
use idem::store::{Acquired, OpenOptions, RunFence, SqliteStore, Store, Submission, SyncMode};

/// One tokio runtime for the whole test binary, as in a real process: hosts renew
/// their leases on it, and tests wait on it with [`block_on`].
pub fn tokio() -> &'static tokio::runtime::Runtime {
    static TOKIO: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    TOKIO.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("tokio starts")
    })
}

/// Runs a future to its end on the test runtime.
pub fn block_on<F: Future>(future: F) -> F::Output {
    tokio().block_on(future)
}

/// One engine and component cache for the whole test binary, as in a real process.
pub fn runtime() -> Arc<Runtime> {
    static RUNTIME: OnceLock<Arc<Runtime>> = OnceLock::new();
    Arc::clone(RUNTIME.get_or_init(|| Arc::new(Runtime::new(None).expect("engine builds"))))
}

/// Loads (compiles) a guest once per test binary.
pub fn agent(path: &str) -> LoadedAgent {
    static AGENTS: OnceLock<std::sync::Mutex<BTreeMap<String, LoadedAgent>>> = OnceLock::new();
    let agents = AGENTS.get_or_init(Default::default);
    let mut agents = agents.lock().unwrap();
    agents
        .entry(path.to_string())
        .or_insert_with(|| runtime().load(Path::new(path)).expect("test guest loads"))
        .clone()
}

/// A host over `store`, started on the test runtime.
pub fn host(store: Arc<dyn Store>) -> Host {
    let _inside = tokio().enter();
    Host::new(runtime(), store).expect("host starts")
}

/// Opens a SQLite store with `options`.
pub fn open_store(path: &Path, options: &OpenOptions) -> Arc<dyn Store> {
    Arc::new(SqliteStore::open_with(path, options).expect("store opens"))
}

/// Opens an existing SQLite store for reading, as `idem ls` does.
pub fn open_store_read_only(path: &Path) -> Arc<dyn Store> {
    Arc::new(SqliteStore::open_read_only(path).expect("store opens"))
}

/// A temp dir holding a store (`idem.db`) and a directory granted to guests as `/data`.
pub struct TestHost {
    pub dir: tempfile::TempDir,
    pub host: Host,
    pub limits: Limits,
}

impl TestHost {
    pub fn new() -> TestHost {
        Self::with_limits(Limits::default())
    }

    pub fn with_limits(limits: Limits) -> TestHost {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        let store = open_store(&dir.path().join("idem.db"), &OpenOptions::default());
        TestHost {
            dir,
            host: host(store),
            limits,
        }
    }

    pub fn db(&self) -> PathBuf {
        self.dir.path().join("idem.db")
    }

    pub fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        self.host.store()
    }

    pub fn options(&self, run_id: &str, input: serde_json::Value, faults: FaultPlan) -> RunOptions {
        RunOptions {
            run_id: run_id.to_string(),
            input: serde_json::to_vec(&input).unwrap(),
            authority: Authority {
                dirs: vec![DirGrant {
                    host: self.data(),
                    guest: "/data".to_string(),
                }],
                limits: self.limits.clone(),
                sync: SyncMode::Normal,
                ..Authority::default()
            },
            faults,
            ..RunOptions::default()
        }
    }

    /// Drives a run with these options on this host.
    pub fn run_with(&self, agent: &LoadedAgent, opts: &RunOptions) -> Result<RunReport, HostError> {
        block_on(self.host.run(agent, opts))
    }

    pub fn run(
        &self,
        agent: &LoadedAgent,
        run_id: &str,
        input: serde_json::Value,
        faults: FaultPlan,
    ) -> RunReport {
        self.run_with(agent, &self.options(run_id, input, faults))
            .unwrap_or_else(|e| panic!("run {run_id}: {e:#}"))
    }

    /// The lines of a side-effect log in the data dir.
    pub fn log(&self, name: &str) -> Vec<LogLine> {
        read_log(&self.data().join(name))
    }
}

/// Creates run `run_id` of `agent` straight in the store and leases it, as another
/// process driving it would: its fence, for writes made by hand.
pub fn lease_by_hand(
    store: &dyn Store,
    agent: &LoadedAgent,
    run_id: &str,
    namespace: &str,
) -> RunFence {
    let digest = agent.digest();
    block_on(async {
        store
            .put_component(digest, agent.bytes().unwrap())
            .await
            .unwrap();
        store
            .submit(&Submission {
                run_id,
                agent: namespace,
                digest,
                namespace,
                input: b"null",
                authority: &Authority::default().encode(),
                replace_authority: false,
                priority: 0,
            })
            .await
            .unwrap();
        match store
            .acquire_run(run_id, "elsewhere", std::time::Duration::from_secs(600))
            .await
            .unwrap()
        {
            Acquired::Leased(leased) => RunFence {
                run_id: run_id.to_string(),
                token: leased.token,
                sync: SyncMode::Normal,
            },
            other => panic!("expected a lease, got {other:?}"),
        }
    })
}

/// One side effect, as a guest logged it: `KEY attempt=N token=T ...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    pub key: String,
    pub fields: BTreeMap<String, String>,
}

impl LogLine {
    pub fn attempt(&self) -> u32 {
        self.fields["attempt"].parse().unwrap()
    }

    pub fn token(&self) -> u64 {
        self.fields["token"].parse().unwrap()
    }

    pub fn flag(&self, name: &str) -> bool {
        self.fields[name] == "true"
    }
}

pub fn read_log(path: &Path) -> Vec<LogLine> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|line| {
            let mut parts = line.split(' ');
            let key = parts.next().unwrap().to_string();
            let fields = parts
                .map(|kv| {
                    let (k, v) = kv
                        .split_once('=')
                        .unwrap_or_else(|| panic!("bad log field {kv:?} in {line:?}"));
                    (k.to_string(), v.to_string())
                })
                .collect();
            LogLine { key, fields }
        })
        .collect()
}

/// How many times each key appears in a log.
pub fn key_counts(lines: &[LogLine]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for line in lines {
        *counts.entry(line.key.clone()).or_insert(0) += 1;
    }
    counts
}

/// Runs the real `idem` binary.
pub fn run_cli(args: &[&str]) -> Output {
    // Compiled agents are cached for the whole suite, never in the user's cache.
    run_cli_env(
        args,
        &[("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR").as_ref())],
    )
}

/// Runs the real `idem` binary with these environment variables (set over the suite's).
pub fn run_cli_env(args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_idem"));
    cmd.args(args)
        .env("IDEM_LOG", "warn")
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"));
    for (name, value) in env {
        cmd.env(name, value);
    }
    cmd.output().expect("idem starts")
}

/// A child's stderr, read line by line on a thread, so that a test can wait for what
/// the child says before it acts (a second signal after the first was heard).
pub struct StderrLines(std::sync::mpsc::Receiver<String>);

impl StderrLines {
    /// Takes `child`'s piped stderr.
    pub fn of(child: &mut std::process::Child) -> StderrLines {
        use std::io::BufRead;
        let stderr = child.stderr.take().expect("stderr is piped");
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        StderrLines(lines)
    }

    /// Waits for a line holding `needle`; panics with what was read after `limit`.
    pub fn wait_for(&self, needle: &str, limit: std::time::Duration) {
        let deadline = std::time::Instant::now() + limit;
        let mut read = String::new();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.0.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return,
                Ok(line) => read.push_str(&(line + "\n")),
                Err(_) => panic!("no line with {needle:?} within {limit:?}; read:\n{read}"),
            }
        }
    }

    /// Every line not read yet, once the child has exited.
    pub fn rest(self) -> String {
        self.0.iter().map(|line| line + "\n").collect()
    }
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Opens a store file read-only with plain rusqlite, to check it from outside idem.
pub fn raw_db(path: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap()
}

pub fn integrity_ok(path: &Path) {
    let conn = raw_db(path);
    let result: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(result, "ok");
}

/// A temp dir for runs through the binary: a store (`idem.db`) and a `data` dir granted
/// to the agent as `/data`.
pub struct CliDir {
    pub dir: tempfile::TempDir,
}

impl CliDir {
    pub fn new() -> CliDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        CliDir { dir }
    }

    pub fn db(&self) -> String {
        self.dir
            .path()
            .join("idem.db")
            .to_str()
            .unwrap()
            .to_string()
    }

    pub fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// `idem run AGENT --db .. --dir DATA::/data --run-id RUN_ID --input INPUT EXTRA..`.
    pub fn run(&self, agent: &str, run_id: &str, input: &str, extra: &[&str]) -> Output {
        let grant = format!("{}::/data", self.data().display());
        let db = self.db();
        let mut args = vec![
            "run", agent, "--db", &db, "--dir", &grant, "--run-id", run_id,
        ];
        args.extend_from_slice(&["--input", input]);
        args.extend_from_slice(extra);
        run_cli(&args)
    }
}
