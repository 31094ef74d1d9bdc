//! Power loss, simulated with a SQLite VFS that keeps only what was synced
//! (`idem_test_artifacts::power_loss`): first that the VFS itself is honest, then real
//! runs of the `steps` agent cut at every sync (and at seeded writes), rebooted,
//! resumed on a fresh host, and checked against what README promises per sync mode
//! and in-doubt policy. The agent's effects land in a log file written outside the
//! store (and outside the VFS), so they survive the cut as a downstream would.

mod recorder;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem::runtime::{Authority, DirGrant, FaultPlan, Host, RunOptions, RunReport};
use idem::store::{
    Clock, InstanceStore, OpenOptions, OperatorStore, Resolution, RunStatus, SqliteStore,
    StepRecord, Store, SyncMode,
};
use idem_test_artifacts::STEPS;
use idem_test_artifacts::power_loss::{CutAt, PowerLossVfs};
use rusqlite::{Connection, OpenFlags};
use serde_json::json;

use crate::util::{LogLine, agent, block_on, host, read_log};
use recorder::{Record, Recorder};

// ---------------------------------------------------------------------------------------
// The VFS, on plain SQLite

/// A plain connection through `vfs`, in WAL mode, with a table `t`.
fn plain(vfs: &PowerLossVfs, path: &Path) -> Connection {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE;
    let conn = Connection::open_with_flags_and_vfs(path, flags, vfs.name()).unwrap();
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    conn.execute_batch("PRAGMA synchronous = FULL; CREATE TABLE IF NOT EXISTS t (v INTEGER)")
        .unwrap();
    conn
}

fn rows(path: &Path) -> Vec<i64> {
    let conn = Connection::open(path).unwrap();
    let mut stmt = conn.prepare("SELECT v FROM t ORDER BY v").unwrap();
    stmt.query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn insert(conn: &Connection, v: i64) -> rusqlite::Result<usize> {
    conn.execute("INSERT INTO t (v) VALUES (?1)", [v])
}

/// Transactions committed with `synchronous = FULL` survive the cut; those committed
/// after them with `OFF` (acknowledged, never synced) do not, and once the power is
/// gone every write fails.
#[test]
fn the_vfs_keeps_exactly_the_synced_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let vfs = PowerLossVfs::register();
    let conn = plain(&vfs, &path);
    for v in 1..=3 {
        insert(&conn, v).unwrap();
    }
    conn.pragma_update(None, "synchronous", "OFF").unwrap();
    for v in 4..=6 {
        insert(&conn, v).unwrap();
    }
    vfs.cut_now();
    let err = insert(&conn, 7).unwrap_err();
    assert_eq!(
        err.sqlite_error_code(),
        Some(rusqlite::ErrorCode::SystemIoFailure),
        "{err}"
    );
    drop(conn);
    vfs.reboot().unwrap();
    assert_eq!(rows(&path), [1, 2, 3]);

    // After the reboot the disk is whole again: unsynced writes, then one synced
    // commit, which makes the whole WAL before it durable too.
    let conn = plain(&vfs, &path);
    conn.pragma_update(None, "synchronous", "OFF").unwrap();
    insert(&conn, 10).unwrap();
    conn.pragma_update(None, "synchronous", "FULL").unwrap();
    insert(&conn, 11).unwrap();
    vfs.cut_now();
    drop(conn);
    vfs.reboot().unwrap();
    assert_eq!(rows(&path), [1, 2, 3, 10, 11]);
}

/// A cut armed at the n-th sync lets exactly the first n synced commits through: the
/// n-th was acknowledged (its sync completed), the next fails.
#[test]
fn the_vfs_cuts_after_the_armed_sync() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let vfs = PowerLossVfs::register();
    let conn = plain(&vfs, &path);
    vfs.arm(CutAt::Sync(3));
    for v in 1..=3 {
        insert(&conn, v).unwrap();
    }
    assert!(vfs.is_cut());
    insert(&conn, 4).unwrap_err();
    drop(conn);
    vfs.reboot().unwrap();
    assert_eq!(rows(&path), [1, 2, 3]);
}

/// A database created and never synced is gone after the cut (the strict model).
#[test]
fn the_vfs_loses_a_file_never_synced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let vfs = PowerLossVfs::register();
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE;
    let conn = Connection::open_with_flags_and_vfs(&path, flags, vfs.name()).unwrap();
    conn.execute_batch("PRAGMA synchronous = OFF; CREATE TABLE t (v INTEGER)")
        .unwrap();
    insert(&conn, 1).unwrap();
    assert!(path.exists());
    vfs.cut_now();
    drop(conn);
    vfs.reboot().unwrap();
    assert!(!path.exists());
}

// ---------------------------------------------------------------------------------------
// Real runs, cut

const STEPS_N: u64 = 4;
const RUN_ID: &str = "power";
/// Every token granted in the epoch after one reboot is at least this.
const EPOCH_1: u64 = 1 << 32;

/// One policy of the `steps` agent under one sync mode.
#[derive(Clone, Copy)]
struct Case {
    sync: SyncMode,
    policy: &'static str,
}

/// A temp dir with the store (through its own power-loss VFS) and the agent's `/data`.
struct Machine {
    dir: tempfile::TempDir,
    vfs: PowerLossVfs,
    clock: Clock,
}

impl Machine {
    fn new() -> Machine {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        Machine {
            dir,
            vfs: PowerLossVfs::register(),
            clock: Clock::manual(1_000_000),
        }
    }

    fn db(&self) -> PathBuf {
        self.dir.path().join("idem.db")
    }

    fn log(&self) -> Vec<LogLine> {
        read_log(&self.dir.path().join("data/log.txt"))
    }

    /// Opens the store through the VFS, as booted `boot`.
    fn open(&self, case: Case, boot: &str) -> Arc<SqliteStore> {
        let options = OpenOptions {
            sync: case.sync,
            clock: self.clock.clone(),
            vfs: Some(self.vfs.name().to_owned()),
            boot_id: Some(boot.to_owned()),
            ..OpenOptions::default()
        };
        Arc::new(SqliteStore::open_with(&self.db(), &options).unwrap())
    }

    fn options(&self, case: Case) -> RunOptions {
        let input = json!({ "steps": STEPS_N, "log": "/data/log.txt", "policy": case.policy });
        RunOptions {
            run_id: RUN_ID.to_string(),
            input: serde_json::to_vec(&input).unwrap(),
            authority: Authority {
                dirs: vec![DirGrant {
                    host: self.dir.path().join("data"),
                    guest: "/data".to_string(),
                }],
                sync: case.sync,
                ..Authority::default()
            },
            faults: FaultPlan::default(),
            ..RunOptions::default()
        }
    }

    /// Runs the agent on a fresh host over `store`; the run's result and what the store
    /// acknowledged meanwhile.
    fn run(
        &self,
        case: Case,
        store: Arc<SqliteStore>,
    ) -> (Result<RunReport, String>, Record, Arc<Recorder>) {
        let (recorder, recorded) = Recorder::over(store);
        let host: Host = host(recorded);
        let result = block_on(host.run(&agent(STEPS), &self.options(case)));
        drop(host);
        let record = recorder.record();
        (result.map_err(|e| format!("{e:#}")), record, recorder)
    }

    /// Waits until every file the store had open through the VFS is closed: the dead
    /// host's tasks may still hold the store for a moment.
    fn wait_closed(&self, recorder: Arc<Recorder>) {
        drop(recorder);
        let began = Instant::now();
        while self.vfs.open_files() != 0 {
            assert!(
                began.elapsed() < Duration::from_secs(10),
                "the store of the dead host stays open"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// The recovered state of one key, read before anything resumes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Recovered {
    Committed(Vec<u8>),
    /// Claimed (its grant durable), not committed: retaken in doubt on resume.
    Claimed {
        token: u64,
        attempt: u32,
    },
    Absent,
}

/// How the clean run went: its outcome, how many syncs and writes it made, and the
/// first write of its steps (before it, the run is set up: component, run, lease).
struct Clean {
    outcome: Vec<u8>,
    namespace: String,
    syncs: u64,
    writes: u64,
    steps_from: u64,
}

fn clean_run(case: Case) -> Clean {
    let (report, namespace, syncs, writes) = uncut(case, STEPS_N);
    // A run of no steps writes what a run writes around its steps; its end (a few
    // writes) comes after the steps, so the steps begin a little before its count.
    let (_, _, _, around) = uncut(case, 0);
    Clean {
        outcome: report.outcome,
        namespace,
        syncs,
        writes,
        steps_from: around.saturating_sub(8).max(1),
    }
}

/// A run of `steps` steps, never cut: its report, namespace, syncs and writes.
fn uncut(case: Case, steps: u64) -> (RunReport, String, u64, u64) {
    let m = Machine::new();
    let store = m.open(case, "boot-0");
    m.vfs.arm(CutAt::Sync(u64::MAX));
    let mut options = m.options(case);
    options.input = serde_json::to_vec(
        &json!({ "steps": steps, "log": "/data/log.txt", "policy": case.policy }),
    )
    .unwrap();
    let (recorder, recorded) = Recorder::over(Arc::clone(&store) as Arc<dyn Store>);
    let host: Host = host(recorded);
    let report = block_on(host.run(&agent(STEPS), &options)).unwrap();
    drop(host);
    assert_eq!(report.status, RunStatus::Completed);
    let (syncs, writes) = m.vfs.since_armed();
    let namespace = block_on(store.run(RUN_ID)).unwrap().unwrap().namespace;
    drop(store);
    m.wait_closed(recorder);
    assert_eq!(m.log().len(), steps as usize);
    (report, namespace, syncs, writes)
}

/// Cuts a run of `case` at `cut`, reboots, resumes it to its end, and checks it.
fn cut_and_resume(case: Case, clean: &Clean, cut: CutAt) {
    let ctx = format!("sync {} policy {} cut {cut:?}", case.sync, case.policy);
    let m = Machine::new();
    let store = m.open(case, "boot-0");
    m.vfs.arm(cut);
    let (result, before, recorder) = m.run(case, store);
    if !m.vfs.is_cut() {
        // Past the run's last sync or write: the power goes after it ended.
        assert!(result.is_ok(), "{ctx}: {result:?}");
        m.vfs.cut_now();
    }
    m.wait_closed(recorder);
    let (synced, _) = m.vfs.since_armed();
    let pre = m.log();
    m.vfs.reboot().unwrap();

    // The machine comes back later: every lease of the old boot has run out.
    m.clock.advance(Duration::from_secs(3600));
    let store = m.open(case, "boot-1");
    let ns = format!("{}:", clean.namespace);
    let recovered: BTreeMap<String, Recovered> = block_on(store.steps(RUN_ID))
        .unwrap()
        .into_iter()
        .map(|step: StepRecord| {
            let state = if step.committed_at.is_some() {
                let result = block_on(store.committed(&step.key)).unwrap().unwrap();
                Recovered::Committed(result)
            } else {
                Recovered::Claimed {
                    token: step.token,
                    attempt: step.attempt,
                }
            };
            (step.key, state)
        })
        .collect();
    let recovered_of = |key: &str| recovered.get(key).cloned().unwrap_or(Recovered::Absent);

    // Nothing acknowledged is lost under `full`; under `normal` what is lost is the
    // last transactions: the commits that survive are the first ones acknowledged.
    let survived: Vec<&str> = before
        .acked
        .iter()
        .filter(|a| matches!(recovered_of(&a.key), Recovered::Committed(_)))
        .map(|a| a.key.as_str())
        .collect();
    for (i, acked) in before.acked.iter().enumerate() {
        match case.sync {
            SyncMode::Full => assert_eq!(
                recovered_of(&acked.key),
                Recovered::Committed(acked.result.clone()),
                "{ctx}: acknowledged commit of {} lost",
                acked.key
            ),
            SyncMode::Normal => {
                if i < survived.len() {
                    assert_eq!(survived[i], acked.key, "{ctx}: not the first commits");
                    assert_eq!(
                        recovered_of(&acked.key),
                        Recovered::Committed(acked.result.clone())
                    );
                }
            }
        }
    }

    if synced == 0 {
        // No sync since the run began (under `normal`, a run this short never
        // checkpoints): none of it survives, so it starts over.
        assert!(recovered.is_empty(), "{ctx}: {recovered:?}");
    }

    // Checkpoints too: under `full` the recovered one is the last acknowledged; under
    // `normal` it may be older, never newer.
    let last_saved = before.saved.iter().max().copied();
    let recovered_step = block_on(store.load_progress(RUN_ID))
        .unwrap()
        .map(|c| c.step);
    match case.sync {
        SyncMode::Full => assert_eq!(recovered_step, last_saved, "{ctx}: checkpoint"),
        SyncMode::Normal => assert!(recovered_step <= last_saved, "{ctx}: checkpoint"),
    }

    // Resume on a fresh host; a run stopped in doubt is settled by an operator's retry.
    let (result, mut after, recorder) = m.run(case, Arc::clone(&store));
    let mut report = result.unwrap_or_else(|e| panic!("{ctx}: resume failed: {e}"));
    let mut parked = Vec::new();
    if report.status == RunStatus::InDoubt {
        let open = block_on(store.open_claims(Some(RUN_ID))).unwrap();
        parked = open
            .into_iter()
            .filter(|c| c.parked.is_some())
            .map(|c| c.key)
            .collect();
        assert_eq!(parked.len(), 1, "{ctx}: {parked:?}");
        block_on(store.resolve(RUN_ID, &parked[0], Resolution::Retry)).unwrap();
        let (result, again, recorder2) = m.run(case, Arc::clone(&store));
        report = result.unwrap_or_else(|e| panic!("{ctx}: after resolve: {e}"));
        after.grants.extend(again.grants);
        after.acked.extend(again.acked);
        drop(recorder2);
    }
    drop(recorder);
    assert_eq!(report.status, RunStatus::Completed, "{ctx}");
    assert_eq!(
        report.outcome, clean.outcome,
        "{ctx}: not the uncut run's outcome"
    );

    // Fencing tokens never repeat: before the reboot, epoch 0; after, epoch 1.
    assert!(before.grants.iter().all(|g| g.token < EPOCH_1), "{ctx}");
    assert!(after.grants.iter().all(|g| g.token >= EPOCH_1), "{ctx}");

    let all = m.log();
    assert!(all.starts_with(&pre), "{ctx}: the log lost lines");
    let post = &all[pre.len()..];
    let count = |lines: &[LogLine], key: &str| lines.iter().filter(|l| l.key == key).count();
    let line_of = |lines: &'_ [LogLine], key: &str| -> LogLine {
        lines.iter().find(|l| l.key == key).cloned().unwrap()
    };
    let keys: Vec<String> = {
        let mut keys: Vec<String> = Vec::new();
        for line in &all {
            if !keys.contains(&line.key) {
                keys.push(line.key.clone());
            }
        }
        keys
    };
    assert_eq!(keys.len(), STEPS_N as usize, "{ctx}: every step ran");
    for key in &keys {
        let store_key = format!("{ns}{key}");
        let (pre_n, post_n) = (count(&pre, key), count(post, key));
        assert!(pre_n <= 1, "{ctx}: {key} ran {pre_n} times before the cut");
        let kctx = format!("{ctx}, key {key}: ran {pre_n} before, {post_n} after");
        // A token a downstream saw before the cut is never seen again for the key.
        for line in post.iter().filter(|l| &l.key == key) {
            assert!(line.token() >= EPOCH_1, "{kctx}");
            assert!(
                pre.iter()
                    .all(|p| &p.key != key || p.token() != line.token()),
                "{kctx}"
            );
        }
        let durable_claim = case.sync == SyncMode::Full && case.policy != "retry";
        match recovered_of(&store_key) {
            Recovered::Committed(_) => assert_eq!(post_n, 0, "{kctx}: a committed step ran again"),
            Recovered::Absent => {
                // Never claimed durably: under `full`, a `fail` or `probe` step's claim
                // is synced before its effect, so the effect cannot have run.
                if durable_claim {
                    assert_eq!(pre_n, 0, "{kctx}: ran without a durable claim");
                }
                assert_eq!(post_n, 1, "{kctx}");
                let line = line_of(post, key);
                assert_eq!(line.attempt(), 1, "{kctx}: {line:?}");
                assert!(!line.flag("in_doubt"), "{kctx}: {line:?}");
                assert_eq!(line.token(), EPOCH_1, "{kctx}: {line:?}");
            }
            Recovered::Claimed { token, attempt } => {
                assert!(token < EPOCH_1, "{kctx}");
                match case.policy {
                    "retry" => {
                        assert_eq!(post_n, 1, "{kctx}");
                        let line = line_of(post, key);
                        assert_eq!(line.attempt(), attempt + 1, "{kctx}: {line:?}");
                        assert!(line.flag("in_doubt"), "{kctx}: {line:?}");
                        assert_eq!(line.token(), EPOCH_1, "{kctx}: {line:?}");
                    }
                    "probe" => {
                        // The probe finds an applied effect in the log; otherwise the
                        // step runs, flagged in doubt. Either way, once in all.
                        assert_eq!(pre_n + post_n, 1, "{kctx}");
                        if post_n == 1 {
                            assert!(line_of(post, key).flag("in_doubt"), "{kctx}");
                        }
                    }
                    "fail" => {
                        // Stopped in doubt, then retried by the operator.
                        assert_eq!(parked, std::slice::from_ref(&store_key), "{kctx}");
                        assert_eq!(post_n, 1, "{kctx}");
                        let line = line_of(post, key);
                        assert_eq!(line.attempt(), attempt + 2, "{kctx}: {line:?}");
                        assert!(!line.flag("in_doubt"), "{kctx}: {line:?}");
                    }
                    other => panic!("no policy {other}"),
                }
            }
        }
        // Under `full`, a `fail` or `probe` effect that ran twice was flagged in doubt
        // in between: parked for the operator, or retaken in doubt and probed.
        if durable_claim && pre_n + post_n == 2 {
            assert!(
                parked.contains(&store_key)
                    || after
                        .grants
                        .iter()
                        .any(|g| g.key == store_key && g.in_doubt),
                "{kctx}: ran twice unflagged"
            );
        }
    }
    drop(store);
    let began = Instant::now();
    while m.vfs.open_files() != 0 && began.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Where the power goes in a sweep, besides every sync of the run and once after it.
enum Writes {
    /// After every write of the steps.
    Every,
    /// After this many writes of the steps, picked by a seeded generator.
    Seeded(usize),
}

fn sweep(case: Case, writes: Writes) {
    let clean = clean_run(case);
    assert!(clean.steps_from < clean.writes);
    let mut cuts: Vec<CutAt> = (1..=clean.syncs + 1).map(CutAt::Sync).collect();
    let steps = clean.steps_from..=clean.writes;
    match writes {
        Writes::Every => cuts.extend(steps.map(CutAt::Write)),
        Writes::Seeded(n) => {
            let mut rng = fastrand::Rng::with_seed(0x1d3a);
            cuts.extend((0..n).map(|_| CutAt::Write(rng.u64(steps.clone()))));
        }
    }
    for cut in cuts {
        cut_and_resume(case, &clean, cut);
    }
}

#[test]
fn power_loss_under_sync_full_retry() {
    sweep(
        Case {
            sync: SyncMode::Full,
            policy: "retry",
        },
        Writes::Seeded(6),
    );
}

#[test]
fn power_loss_under_sync_full_fail() {
    sweep(
        Case {
            sync: SyncMode::Full,
            policy: "fail",
        },
        Writes::Seeded(6),
    );
}

#[test]
fn power_loss_under_sync_full_probe() {
    sweep(
        Case {
            sync: SyncMode::Full,
            policy: "probe",
        },
        Writes::Seeded(6),
    );
}

#[test]
fn power_loss_under_sync_normal() {
    for policy in ["retry", "fail", "probe"] {
        sweep(
            Case {
                sync: SyncMode::Normal,
                policy,
            },
            Writes::Every,
        );
    }
}

/// The store writes each WAL frame in one write: its VFS joins the frame's header,
/// which SQLite writes on its own, to the page after it. Over a whole run (no
/// checkpoint falls in it), every write is a frame but the WAL's own header.
#[test]
fn the_store_writes_each_wal_frame_at_once() {
    for sync in [SyncMode::Normal, SyncMode::Full] {
        let m = Machine::new();
        let case = Case {
            sync,
            policy: "retry",
        };
        let store = m.open(case, "boot-0");
        m.vfs.take_counts();
        let (result, _, recorder) = m.run(case, Arc::clone(&store));
        assert_eq!(result.unwrap().status, RunStatus::Completed);
        let counts = m.vfs.take_counts();
        drop(store);
        m.wait_closed(recorder);
        assert!(counts.wal_frames >= 2 * STEPS_N, "{sync}: {counts:?}");
        assert!(
            counts.writes <= counts.wal_frames + 1,
            "{sync}: {} writes for {} frames",
            counts.writes,
            counts.wal_frames
        );
    }
}
