//! Faults of the store under real runs: a read-only file, a lock held past the busy
//! timeout, a corrupt file, a full disk (the store's size cap; real file systems that
//! fill up or turn read-only are `disk_faults.rs`), a newer schema. Each must stop the run with an
//! error naming the file and the cause, leave every committed row as it was and the
//! database intact, and let the same run resume, each side effect once, when the cause
//! is gone.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use idem::runtime::{FaultPlan, Host, HostError, Limits};
use idem::store::{DatabaseFault, OpenOptions, StoreError};
use idem_test_artifacts::STEPS;

use crate::util::{
    TestHost, agent, block_on, host, integrity_ok, key_counts, open_store, raw_db, read_log,
    run_cli, stderr, stdout,
};

/// A committed row, every column of it.
pub(crate) type Row = (String, String, Vec<u8>, i64, i64, i64);

/// Every committed row of the store, read from outside idem.
fn committed_rows(conn: &rusqlite::Connection) -> Vec<Row> {
    let mut stmt = conn
        .prepare(
            "SELECT key, run_id, result, token, attempt, committed_at FROM steps WHERE result IS NOT NULL ORDER BY key",
        )
        .unwrap();
    stmt.query_map([], |r| {
        Ok((
            r.get(0)?,
            r.get(1)?,
            r.get(2)?,
            r.get(3)?,
            r.get(4)?,
            r.get(5)?,
        ))
    })
    .unwrap()
    .collect::<rusqlite::Result<_>>()
    .unwrap()
}

pub(crate) fn rows(db: &Path) -> Vec<Row> {
    committed_rows(&raw_db(db))
}

/// Every row committed before the fault is still there, unchanged.
pub(crate) fn assert_kept(before: &[Row], db: &Path) {
    let after = rows(db);
    for row in before {
        assert!(after.contains(row), "lost or changed: {row:?}");
    }
}

/// Each of the `steps` keys ran its side effect exactly once.
pub(crate) fn assert_each_effect_once(log: &Path, steps: usize) {
    let lines = read_log(log);
    let counts = key_counts(&lines);
    assert_eq!(counts.len(), steps, "{lines:?}");
    assert!(counts.values().all(|&n| n == 1), "{counts:?}");
}

/// A temp dir with a store path and a data dir granted to the guest as `/data`.
pub(crate) struct Work {
    pub(crate) dir: tempfile::TempDir,
}

impl Work {
    pub(crate) fn new() -> Work {
        Work::with_dir(tempfile::tempdir().unwrap())
    }

    fn with_dir(dir: tempfile::TempDir) -> Work {
        std::fs::create_dir(dir.path().join("data")).unwrap();
        Work { dir }
    }

    pub(crate) fn db(&self) -> PathBuf {
        self.dir.path().join("idem.db")
    }

    pub(crate) fn log(&self) -> PathBuf {
        self.dir.path().join("data").join("log.txt")
    }

    /// `idem run` of the steps guest as run `run_id`.
    pub(crate) fn args(
        &self,
        run_id: &str,
        input: &serde_json::Value,
        extra: &[&str],
    ) -> Vec<String> {
        let mut args: Vec<String> = [
            "run",
            STEPS,
            "--db",
            self.db().to_str().unwrap(),
            "--run-id",
            run_id,
            "--dir",
            &format!("{}::/data", self.dir.path().join("data").display()),
            "--input",
            &input.to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    }

    fn run(&self, run_id: &str, input: &serde_json::Value, extra: &[&str]) -> Output {
        let args = self.args(run_id, input, extra);
        run_cli(&args.iter().map(String::as_str).collect::<Vec<_>>())
    }

    fn status(&self) -> Output {
        run_cli(&["status", "--db", self.db().to_str().unwrap()])
    }

    /// A run that committed steps 0-2 of 6 and failed at step 3: committed work for a
    /// fault to threaten, and a run to resume.
    fn partial_run(&self, run_id: &str) -> (serde_json::Value, Vec<Row>) {
        let input = serde_json::json!({"steps": 6, "log": "/data/log.txt", "fail_at": 3});
        let out = self.run(run_id, &input, &[]);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let before = rows(&self.db());
        assert_eq!(before.len(), 3);
        (input, before)
    }
}

/// Asserts that `out` failed with the store's exit code and an error that names `db`
/// and contains `cause`, and returns the error text.
pub(crate) fn store_failure(out: &Output, db: &Path, cause: &str) -> String {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains(&db.display().to_string()), "{err}");
    assert!(err.contains(cause), "expected {cause:?} in {err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

fn set_schema_version(db: &Path, version: i64) {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.pragma_update(None, "user_version", version).unwrap();
}

fn schema_version(db: &Path) -> i64 {
    raw_db(db)
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap()
}

#[test]
fn newer_schema_is_refused_with_exit_3_and_the_run_resumes_after_an_upgrade() {
    let w = Work::new();
    let db = w.db();
    let (input, before) = w.partial_run("schema");
    let ours = schema_version(&db);
    set_schema_version(&db, ours + 1);

    let out = w.run("schema", &input, &[]);
    let err = store_failure(&out, &db, "upgrade idem");
    assert!(
        err.contains(&format!(
            "has schema version {}, newer than this idem supports ({ours})",
            ours + 1
        )),
        "{err}"
    );
    store_failure(&w.status(), &db, "upgrade idem");
    assert_eq!(schema_version(&db), ours + 1, "the schema was downgraded");
    assert_eq!(rows(&db), before);
    integrity_ok(&db);

    // What an upgraded idem would do: it knows the version, and resumes the run.
    set_schema_version(&db, ours);
    let out = w.run("schema", &input, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_each_effect_once(&w.log(), 6);
    assert_kept(&before, &db);
    integrity_ok(&db);
}

/// Whether this process ignores permission bits (root does).
fn permission_bits_bind(dir: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let probe = dir.join("probe");
    std::fs::write(&probe, b"").unwrap();
    std::fs::set_permissions(&probe, std::fs::Permissions::from_mode(0o444)).unwrap();
    let binds = std::fs::OpenOptions::new()
        .write(true)
        .open(&probe)
        .is_err();
    std::fs::remove_file(&probe).unwrap();
    binds
}

/// What the user `nobody` (uid 65534) runs when root tests a read-only store: for it a
/// root-owned 0644 store is read-only, as root ignores permission bits but the
/// processes it starts as another user do not. The suite may live where nobody cannot
/// go (a clone in root's home or in a 0700 temp dir), so the `idem` binary and the
/// guest are copied into a fresh 0755 dir under /tmp, and the store is made there too.
#[cfg(unix)]
struct NobodyStage {
    dir: tempfile::TempDir,
}

#[cfg(unix)]
impl NobodyStage {
    const NOBODY: u32 = 65534;

    /// The stage, or `None` (after a loud note) if nobody cannot run idem from it.
    fn new() -> Option<NobodyStage> {
        use std::os::unix::fs::PermissionsExt;
        let mode = |path: &Path, mode| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
        };
        let dir = tempfile::Builder::new()
            .prefix("idem-nobody-")
            .tempdir_in("/tmp")
            .unwrap();
        mode(dir.path(), 0o755);
        let stage = NobodyStage { dir };
        std::fs::copy(env!("CARGO_BIN_EXE_idem"), stage.idem()).unwrap();
        mode(&stage.idem(), 0o755);
        std::fs::copy(STEPS, stage.guest()).unwrap();
        mode(&stage.guest(), 0o644);
        let probe = stage.command(&["--version"]).output();
        match probe {
            Ok(out) if out.status.success() => Some(stage),
            other => {
                eprintln!(
                    "NOTE: read_only_store_is_refused_and_the_run_resumes_once_writable is \
                     SKIPPED: running as root, and user nobody (uid {}) cannot run idem \
                     staged in {}: {other:?}",
                    Self::NOBODY,
                    stage.dir.path().display()
                );
                None
            }
        }
    }

    fn idem(&self) -> PathBuf {
        self.dir.path().join("idem")
    }

    fn guest(&self) -> PathBuf {
        self.dir.path().join("steps.wasm")
    }

    /// A fresh dir for a store and its data dir, which nobody may enter and read.
    fn work_dir(&self) -> tempfile::TempDir {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir_in(self.dir.path()).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        dir
    }

    fn command(&self, args: &[&str]) -> Command {
        use std::os::unix::process::CommandExt;
        let mut command = Command::new(self.idem());
        command
            .args(args)
            .current_dir(self.dir.path())
            .env("IDEM_LOG", "warn")
            .uid(Self::NOBODY)
            .gid(Self::NOBODY);
        command
    }

    /// `idem run ARGS` as nobody.
    fn run_as_nobody(&self, args: &[String]) -> Output {
        let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
        // Nobody may write the suite's compile cache: compile afresh.
        args.push("--no-cache");
        self.command(&args).output().expect("idem starts as nobody")
    }
}

#[cfg(unix)]
#[test]
fn read_only_store_is_refused_and_the_run_resumes_once_writable() {
    use std::os::unix::fs::PermissionsExt;
    // Root ignores permission bits: the store stays root's, and idem runs as a user
    // who may only read it, from a stage that user can reach.
    let stage = if permission_bits_bind(tempfile::tempdir().unwrap().path()) {
        None
    } else {
        match NobodyStage::new() {
            Some(stage) => Some(stage),
            None => return,
        }
    };
    let w = match &stage {
        Some(stage) => Work::with_dir(stage.work_dir()),
        None => Work::new(),
    };
    let db = w.db();
    let (input, before) = w.partial_run("ro");
    let mut args = w.args("ro", &input, &[]);

    let out = match &stage {
        None => {
            std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o444)).unwrap();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = run_cli(&args);
            std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).unwrap();
            out
        }
        Some(stage) => {
            assert_eq!(args[1], STEPS);
            args[1] = stage.guest().to_str().unwrap().to_string();
            stage.run_as_nobody(&args)
        }
    };
    let err = store_failure(&out, &db, "write-protected; idem needs to write to it");
    assert!(
        read_log(&w.log()).len() == 3,
        "a step ran on a read-only store: {err}"
    );
    assert_eq!(rows(&db), before);
    integrity_ok(&db);

    // Writable (or run by its owner) again: the run resumes where it stopped.
    let out = w.run("ro", &input, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_each_effect_once(&w.log(), 6);
    assert_kept(&before, &db);
    integrity_ok(&db);
}

/// Waits for `child`, failing the test (and killing it) past `limit`.
pub(crate) fn wait_for(mut child: std::process::Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("idem did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Waits until the log holds `n` lines: the run is under way.
pub(crate) fn wait_for_lines(log: &Path, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while read_log(log).len() < n {
        assert!(Instant::now() < deadline, "the run never got going");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Another process holds the write lock past idem's 5 s busy timeout while a run is
/// under way: the run stops, naming the lock; once the lock is gone it resumes, and the
/// step cut off between its effect and its commit is found applied (probe), not redone.
#[test]
fn store_locked_past_the_busy_timeout_stops_the_run_and_it_resumes() {
    let w = Work::new();
    let db = w.db();
    let input = serde_json::json!({
        "steps": 12, "log": "/data/log.txt", "pause_ms": 200, "policy": "probe"
    });
    // A short lease, so that the resumed run need not wait 30 s for the claim the
    // stopped process left behind.
    let args = w.args("locked", &input, &["--lease", "1s"]);
    let child = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(&args)
        .env("IDEM_LOG", "warn")
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_lines(&w.log(), 2);

    let lock = rusqlite::Connection::open(&db).unwrap();
    lock.busy_timeout(Duration::from_secs(30)).unwrap();
    lock.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let before = committed_rows(&lock);
    let out = wait_for(child, Duration::from_secs(60));
    let err = store_failure(&out, &db, "the database is locked");
    assert!(err.contains("longer than the busy timeout (5s)"), "{err}");
    assert_eq!(
        committed_rows(&lock),
        before,
        "written under another's lock"
    );
    lock.execute_batch("ROLLBACK").unwrap();
    drop(lock);
    integrity_ok(&db);
    assert!(read_log(&w.log()).len() < 12, "the run was not cut short");

    let out = w.run("locked", &input, &["--lease", "1s"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_each_effect_once(&w.log(), 12);
    assert_kept(&before, &db);
    integrity_ok(&db);
}

/// A host whose store was opened with `options`, for faults the CLI has no flag for.
fn host_with(dir: &Path, options: &OpenOptions) -> Host {
    host(open_store(&dir.join("idem.db"), options))
}

/// The same lock, in-process with a 200 ms busy timeout: the host reports the typed
/// fault, and the same host resumes the run once the lock is gone.
#[test]
fn lock_past_a_short_busy_timeout_stops_the_host_and_the_same_host_resumes() {
    let th = TestHost::new();
    let db = th.db();
    let timeout = Duration::from_millis(200);
    let host = host_with(
        th.dir.path(),
        &OpenOptions {
            busy_timeout: timeout,
            ..OpenOptions::default()
        },
    );
    let steps = agent(STEPS);
    let input = serde_json::json!({
        "steps": 12, "log": "/data/log.txt", "pause_ms": 100, "policy": "probe"
    });
    let opts = th.options("locked-host", input, FaultPlan::default());

    let lock = rusqlite::Connection::open(&db).unwrap();
    lock.busy_timeout(Duration::from_secs(30)).unwrap();
    let (result, before) = std::thread::scope(|s| {
        let run = s.spawn(|| block_on(host.run(&steps, &opts)));
        wait_for_lines(&th.data().join("log.txt"), 2);
        lock.execute_batch("BEGIN EXCLUSIVE").unwrap();
        let before = committed_rows(&lock);
        (run.join().unwrap(), before)
    });
    let err = result.unwrap_err();
    let text = err.to_string();
    match &err {
        HostError::Store(StoreError::Database {
            fault: DatabaseFault::Locked { busy_timeout },
            location,
            ..
        }) => {
            assert_eq!(*busy_timeout, timeout);
            assert_eq!(location, &db.display().to_string());
        }
        other => panic!("expected a lock fault, got {other:?}"),
    }
    assert!(text.contains("(200ms)"), "{text}");
    assert_eq!(committed_rows(&lock), before);
    lock.execute_batch("ROLLBACK").unwrap();
    drop(lock);
    integrity_ok(&db);

    let report = block_on(host.run(&steps, &opts)).unwrap();
    assert_eq!(report.status, idem::store::RunStatus::Completed);
    assert_each_effect_once(&th.data().join("log.txt"), 12);
    assert_kept(&before, &db);
    integrity_ok(&db);
}

/// The store reaches its size cap (a full disk, as SQLite reports it) in the middle of
/// a run: the run stops naming the cause; with room again, a new host resumes it, and
/// the step whose commit did not fit is found applied by its probe, not redone.
#[test]
fn full_disk_stops_the_run_midway_and_it_resumes_with_room() {
    let th = TestHost::with_limits(Limits {
        lease: Duration::from_millis(300),
        ..Limits::default()
    });
    let db = th.db();
    let steps = agent(STEPS);
    // The agent is stored with its first run; a short one first, so that the cap
    // below falls on the steps of the long run, not on the component.
    th.run(
        &steps,
        "warm-up",
        serde_json::json!({ "steps": 1, "log": "/data/warm.log" }),
        FaultPlan::default(),
    );
    let (page, pages): (u64, u64) = {
        let conn = raw_db(&db);
        let page: i64 = conn
            .query_row("PRAGMA page_size", [], |r| r.get(0))
            .unwrap();
        let pages: i64 = conn
            .query_row("PRAGMA page_count", [], |r| r.get(0))
            .unwrap();
        (page as u64, pages as u64)
    };
    let size = page * pages;
    let steps_total = 600;
    let input = serde_json::json!({
        "steps": steps_total, "log": "/data/log.txt", "policy": "probe", "fold": true
    });
    let opts = th.options("full", input, FaultPlan::default());

    let capped = host_with(
        th.dir.path(),
        &OpenOptions {
            max_size: Some(size + 6 * page),
            ..OpenOptions::default()
        },
    );
    let err = block_on(capped.run(&steps, &opts)).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(
            &err,
            HostError::Store(StoreError::Database {
                fault: DatabaseFault::Full,
                ..
            })
        ),
        "{err:?}"
    );
    assert!(text.contains("the disk is full"), "{text}");
    assert!(text.contains("database or disk is full"), "{text}");
    assert!(text.contains(&db.display().to_string()), "{text}");
    drop(capped);
    let before = rows(&db);
    assert!(
        !before.is_empty() && before.len() < steps_total,
        "{} of {steps_total} steps committed: the fault was not mid-run",
        before.len()
    );
    integrity_ok(&db);

    // Room again (the cap lifted, as if space were freed): a new process resumes.
    let host = host_with(th.dir.path(), &OpenOptions::default());
    let report = block_on(host.run(&steps, &opts)).unwrap();
    assert_eq!(report.status, idem::store::RunStatus::Completed);
    assert_each_effect_once(&th.data().join("log.txt"), steps_total);
    assert_kept(&before, &db);
    // The long run's steps and the warm-up's one.
    assert_eq!(rows(&db).len(), steps_total + 1);
    integrity_ok(&db);
}

/// The page numbers of the root pages of `tables`.
fn root_pages(db: &Path, tables: &[&str]) -> Vec<u64> {
    let conn = raw_db(db);
    tables
        .iter()
        .map(|t| {
            conn.query_row(
                "SELECT rootpage FROM sqlite_schema WHERE type = 'table' AND name = ?1",
                [t],
                |r| r.get::<_, i64>(0),
            )
            .unwrap() as u64
        })
        .collect()
}

fn integrity(db: &Path) -> Vec<String> {
    // On a badly damaged file SQLite may fail the check itself rather than list
    // problems: that failure is the damage report then.
    let conn = raw_db(db);
    let report = conn.prepare("PRAGMA integrity_check").and_then(|mut stmt| {
        stmt.query_map([], |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<String>>>()
    });
    report.unwrap_or_else(|e| vec![format!("check failed: {e}")])
}

fn checkpoint(db: &Path) {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
}

#[test]
fn corrupt_store_is_named_not_made_worse_and_a_restored_backup_resumes() {
    use std::io::{Seek, SeekFrom, Write};
    let w = Work::new();
    let db = w.db();
    let input = serde_json::json!({"steps": 40, "log": "/data/log.txt"});
    let out = w.run("corrupt", &input, &["--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let finished: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    checkpoint(&db);
    let backup = w.dir.path().join("backup.db");
    std::fs::copy(&db, &backup).unwrap();

    // Wreck the root pages of the runs and results tables, mid-file.
    let page: u64 = raw_db(&db)
        .pragma_query_value(None, "page_size", |r| r.get::<_, i64>(0))
        .unwrap() as u64;
    {
        let mut file = std::fs::OpenOptions::new().write(true).open(&db).unwrap();
        for root in root_pages(&db, &["runs", "steps"]) {
            file.seek(SeekFrom::Start((root - 1) * page)).unwrap();
            let garbage: Vec<u8> = (0..page).map(|i| (i * 13 + 0x42) as u8).collect();
            file.write_all(&garbage).unwrap();
        }
    }
    let damage = integrity(&db);
    assert_ne!(damage, ["ok"]);
    let bytes = std::fs::read(&db).unwrap();

    let out = w.run("corrupt", &input, &[]);
    store_failure(&out, &db, "the database file is corrupt");
    store_failure(&w.status(), &db, "the database file is corrupt");

    // Not made worse: beyond the header page not a byte changed, and SQLite finds the
    // same damage as before.
    checkpoint(&db);
    let after = std::fs::read(&db).unwrap();
    let page = page as usize;
    assert_eq!(after.len(), bytes.len());
    assert!(
        after[page..] == bytes[page..],
        "idem wrote to a corrupt store"
    );
    assert_eq!(integrity(&db), damage);

    // Restored from the backup, the store has the run, finished, and nothing reruns.
    std::fs::copy(&backup, &db).unwrap();
    let out = w.run("corrupt", &input, &["--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let again: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(again["already_finished"], true);
    assert_eq!(again["output"], finished["output"]);
    assert_each_effect_once(&w.log(), 40);
    integrity_ok(&db);
}
