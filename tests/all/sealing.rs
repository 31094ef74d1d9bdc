//! Encryption at rest through the `idem` binary: a store made with a key keeps a run's
//! input, grants, log and output sealed on disk (SQLite) and in its rows (PostgreSQL);
//! every command needs the key; a missing or wrong key is refused by name and changes
//! nothing; `idem rekey` rotates it and the runs stay readable; a grant over the key
//! file is refused. Each payload kind's sealing, WAL included, is covered at the store's
//! level (`host/src/store/tests/sealing.rs`).

use std::path::Path;

use idem_test_artifacts::HOSTILE;

use crate::postgres::{Schema, sql};
use crate::util::{CliDir, run_cli_env, stderr, stdout};

/// The agent's environment grant, its input, its log and its output all carry the
/// marker; the run id and the agent's name carry the control, which stays in clear.
struct Planted {
    secret: String,
    control: String,
}

impl Planted {
    fn new() -> Planted {
        let tag = format!("{:08x}", fastrand::u32(..));
        Planted {
            secret: format!("SECRET{tag}"),
            control: format!("control{tag}"),
        }
    }

    fn run_id(&self) -> String {
        format!("run-{}", self.control)
    }
}

fn key_file(dir: &Path, name: &str, byte: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, format!("{}\n", byte.repeat(32))).unwrap();
    path.to_str().unwrap().to_owned()
}

/// `idem ARGS --db DB` with the key file (if any) given as `IDEM_STORE_KEY_FILE`.
fn idem(db: &str, key: Option<&str>, args: &[&str]) -> std::process::Output {
    let mut all: Vec<&str> = args.to_vec();
    all.extend_from_slice(&["--db", db]);
    let cache = env!("CARGO_TARGET_TMPDIR");
    let mut env: Vec<(&str, &std::ffi::OsStr)> = vec![("XDG_CACHE_HOME", cache.as_ref())];
    if let Some(key) = key {
        env.push(("IDEM_STORE_KEY_FILE", key.as_ref()));
    }
    run_cli_env(&all, &env)
}

/// Runs the planted run on `db` with `key`, then checks what every command sees with
/// the key, without it, with a wrong one, and after a rotation.
fn a_sealed_store_through_the_cli(db: &str, dir: &Path, raw_holds: &dyn Fn(&str) -> bool) {
    let planted = Planted::new();
    let key = key_file(dir, "idem.key", "4b");
    let wrong = key_file(dir, "wrong.key", "77");
    let input = format!(
        "{{\"mode\":\"say\",\"text\":\"{}-said\",\"note\":\"{}-input\"}}",
        planted.secret, planted.secret
    );
    let env = format!("TOKEN={}-env", planted.secret);
    let run_id = planted.run_id();
    let out = idem(
        db,
        Some(&key),
        &[
            "run", HOSTILE, "--run-id", &run_id, "--input", &input, "--env", &env,
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains(&format!("{}-said", planted.secret)));

    // With the key, everything reads back.
    let logs = idem(db, Some(&key), &["logs", &run_id]);
    assert!(logs.status.success(), "{}", stderr(&logs));
    assert!(stdout(&logs).contains(&format!("{}-said", planted.secret)));
    let show = idem(db, Some(&key), &["show", &run_id, "--json"]);
    assert!(show.status.success(), "{}", stderr(&show));
    assert!(stdout(&show).contains("completed"), "{}", stdout(&show));

    assert!(
        raw_holds(&planted.control),
        "the search finds what is in clear"
    );
    assert!(
        !raw_holds(&planted.secret),
        "a sealed payload is in the store in clear"
    );

    // No key, or another: refused by name, exit 2, and nothing changes.
    let out = idem(db, None, &["ls"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("this store is encrypted at rest"),
        "{}",
        stderr(&out)
    );
    let out = idem(db, Some(&wrong), &["logs", &run_id]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("is not this store's"),
        "{}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("--key-file"),
        "a hint: {}",
        stderr(&out)
    );
    let out = idem(db, Some(&wrong), &["rekey", "--new-key-file", &wrong]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    // Rotation: the old key no longer opens it, the new one reads every run.
    let new = key_file(dir, "new.key", "c0");
    let out = idem(db, Some(&key), &["rekey", "--new-key-file", &new]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("rekeyed: 1 data key"),
        "{}",
        stdout(&out)
    );
    let out = idem(db, Some(&key), &["ls"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let logs = idem(db, Some(&new), &["logs", &run_id]);
    assert!(logs.status.success(), "{}", stderr(&logs));
    assert!(stdout(&logs).contains(&format!("{}-said", planted.secret)));

    // A grant over the directory of the key file is refused, naming it.
    let grant = format!("{}::/data", dir.display());
    let out = idem(
        db,
        Some(&new),
        &[
            "run",
            HOSTILE,
            "--run-id",
            "grant",
            "--input",
            r#"{"mode":"spin","n":1}"#,
            "--dir",
            &grant,
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("key file"),
        "the refusal names the key file: {}",
        stderr(&out)
    );
}

#[test]
fn a_sealed_sqlite_store_keeps_nothing_in_clear() {
    let bed = CliDir::new();
    let keys = tempfile::tempdir().unwrap();
    let dir = bed.dir.path().to_owned();
    let raw_holds = |needle: &str| {
        std::fs::read_dir(&dir).unwrap().flatten().any(|entry| {
            let bytes = std::fs::read(entry.path()).unwrap_or_default();
            bytes
                .windows(needle.len())
                .any(|window| window == needle.as_bytes())
        })
    };
    a_sealed_store_through_the_cli(&bed.db(), keys.path(), &raw_holds);

    // A store in clear that holds a run refuses a key.
    let clear = CliDir::new();
    let out = idem(
        &clear.db(),
        None,
        &[
            "run",
            HOSTILE,
            "--run-id",
            "clear",
            "--input",
            r#"{"mode":"spin","n":1}"#,
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let key = key_file(keys.path(), "late.key", "19");
    let out = idem(&clear.db(), Some(&key), &["ls"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not encrypted at rest and already holds runs"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_sealed_postgres_store_keeps_nothing_in_clear() {
    let Some(schema) = Schema::create("sealing") else {
        return;
    };
    let keys = tempfile::tempdir().unwrap();
    let url = schema.url();
    let raw_holds = |needle: &str| {
        let hex: String = needle.bytes().map(|b| format!("{b:02x}")).collect();
        let tables = sql(
            &url,
            "SELECT table_name::text FROM information_schema.tables
             WHERE table_schema = current_schema()",
        );
        tables.iter().any(|row| {
            let table = row[0].as_deref().unwrap();
            let text = sql(
                &url,
                &format!("SELECT coalesce(string_agg(t::text, ' '), '') FROM {table} t"),
            );
            let text = text[0][0].as_deref().unwrap_or_default();
            text.contains(needle) || text.contains(&hex)
        })
    };
    a_sealed_store_through_the_cli(&url, keys.path(), &raw_holds);
}
