//! The takeover rows: `idem run` (the real binary) SIGKILLed while its agent is inside a
//! side effect, and the time until the next `idem run` of the run holds that effect's
//! claim again — the dead process's 30 s lease not waited out (on SQLite a dead process
//! is known by the lock it held). Beside it, the same process start up to a fresh run's
//! first claim: what any resume costs, dead holder or not.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure};
use idem_test_artifacts::STEPS;
use rusqlite::{Connection, OpenFlags, OptionalExtension};
use serde_json::json;

use super::report::{Table, millis};
use super::{Bed, Plan, repeat};

fn spawn(bed: &Bed, db: &Path, run_id: &str, data: &Path) -> anyhow::Result<Child> {
    // A side effect that would last ten minutes: only a takeover ends the wait.
    let input = json!({ "steps": 1, "log": "/data/log", "pause_ms": 600_000 }).to_string();
    let child = Command::new(env!("CARGO_BIN_EXE_idem"))
        .arg("run")
        .arg(STEPS)
        .arg("--db")
        .arg(db)
        .args(["--run-id", run_id, "--input", &input, "--lease", "30s"])
        .arg("--dir")
        .arg(format!("{}::/data", data.display()))
        .env("XDG_CACHE_HOME", bed.dir.join("cache"))
        .env("IDEM_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    Ok(child)
}

/// Waits until a claim of `run_id` with a token above `above` is held; returns its token.
fn held_claim(db: &Path, run_id: &str, above: i64) -> anyhow::Result<i64> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        ensure!(Instant::now() < deadline, "no claim of {run_id} was taken");
        if db.exists() {
            let conn = Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
            let token: Option<i64> = conn
                .query_row(
                    "SELECT token FROM steps WHERE run_id = ?1 AND holder IS NOT NULL \
                     AND token > ?2",
                    rusqlite::params![run_id, above],
                    |row| row.get(0),
                )
                .optional()
                .or_else(|e| match e {
                    // The schema is not there yet: the first process is still starting.
                    rusqlite::Error::SqliteFailure(..) => Ok(None),
                    e => Err(e),
                })?;
            if let Some(token) = token {
                return Ok(token);
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn kill(mut child: Child) -> anyhow::Result<()> {
    child.kill()?;
    child.wait()?;
    Ok(())
}

pub(crate) fn takeover(bed: &Bed, plan: &Plan, table: &mut Table) -> anyhow::Result<()> {
    let (mut starts, mut takeovers) = (Vec::new(), Vec::new());
    let mut turn = 0;
    repeat(plan.takeover, || {
        turn += 1;
        let dir = bed.dir.join(format!("takeover-{turn}"));
        let data = dir.join("data");
        std::fs::create_dir_all(&data)?;
        // Beside the granted folder, not in it: idem refuses to grant the store.
        let db = dir.join("idem.db");
        let began = Instant::now();
        let first = spawn(bed, &db, "t", &data)?;
        let token = held_claim(&db, "t", 0)?;
        // The first turn compiles the agent into the cache; the others start warm.
        if turn > 1 {
            starts.push(millis(began.elapsed()));
        }
        kill(first)?;
        let killed = Instant::now();
        let second = spawn(bed, &db, "t", &data)?;
        let retaken = held_claim(&db, "t", token)?;
        takeovers.push(millis(killed.elapsed()));
        kill(second)?;
        if retaken <= token {
            bail!("the retaken claim's token {retaken} is not above {token}");
        }
        Ok(())
    })?;
    table.row(
        "`idem run` start to a fresh run's first claim (agent cached)",
        "ms",
        starts,
    );
    table.row(
        "SIGKILL of `idem run` inside a side effect to the next `idem run` holding its claim (lease 30 s)",
        "ms",
        takeovers,
    );
    Ok(())
}
