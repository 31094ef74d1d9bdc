//! Bad input through the real CLI: a clear error naming the problem, a non-zero exit,
//! and no change to a store that already holds committed work.

use std::path::Path;

use idem_test_artifacts::{COMMAND, LEDGER};
use sha2::{Digest, Sha256};

use crate::util::{run_cli, stderr, stdout};

/// A store with one completed ledger run, and the digest of its file.
fn store_with_work(dir: &Path) -> (String, Vec<u8>) {
    let db = dir.join("idem.db");
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let out = run_cli(&[
        "run",
        LEDGER,
        "--db",
        db.to_str().unwrap(),
        "--run-id",
        "kept",
        "--dir",
        &format!("{}::/data", data.display()),
        "--input",
        r#"{"items":["a","b","c"],"log":"/data/ledger.log"}"#,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Fold the WAL into the main file so its bytes are the whole store.
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    drop(conn);
    let bytes = std::fs::read(&db).unwrap();
    (
        db.to_str().unwrap().to_string(),
        Sha256::digest(bytes).to_vec(),
    )
}

fn assert_store_unchanged(db: &str, digest: &[u8]) {
    let bytes = std::fs::read(db).unwrap();
    assert_eq!(Sha256::digest(bytes).to_vec(), digest, "the store changed");
    let status = run_cli(&["status", "--db", db, "kept"]);
    assert!(stdout(&status).contains("completed"), "{}", stdout(&status));
}

#[test]
fn bad_agents_are_refused_by_name_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (db, digest) = store_with_work(dir.path());

    let not_wasm = dir.path().join("notes.wasm");
    std::fs::write(&not_wasm, "this is not wasm").unwrap();
    let core = dir.path().join("core.wasm");
    // The smallest valid core module: magic and version 1, no sections.
    std::fs::write(&core, b"\0asm\x01\0\0\0").unwrap();
    let truncated = dir.path().join("truncated.wasm");
    let ledger = std::fs::read(LEDGER).unwrap();
    std::fs::write(&truncated, &ledger[..ledger.len() / 2]).unwrap();
    let missing = dir.path().join("missing.wasm");

    let cases: [(&Path, &str); 5] = [
        (&not_wasm, "is not a WebAssembly file"),
        (&core, "is a core WebAssembly module, not a component"),
        (&truncated, "is not a valid WebAssembly component"),
        (Path::new(COMMAND), "is not an idem agent"),
        (&missing, "cannot read agent"),
    ];
    for (agent, expected) in cases {
        let out = run_cli(&["run", agent.to_str().unwrap(), "--db", &db, "--no-cache"]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{agent:?}: {err}");
        assert!(
            err.contains(expected),
            "{agent:?}: expected {expected:?} in {err}"
        );
        assert!(
            err.contains(agent.to_str().unwrap()),
            "{agent:?}: the error names the file: {err}"
        );
        assert_store_unchanged(&db, &digest);
    }
}

#[test]
fn bad_arguments_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (db, digest) = store_with_work(dir.path());
    let cases: [(&[&str], &str); 4] = [
        (&["--input", "{not json"], "--input is not valid JSON"),
        (&["--crash-at", "sideways:3"], "invalid crash point"),
        (&["--recycle-every", "0"], "--recycle-every"),
        (
            &["--dir", "/nowhere/at/all::/data"],
            "cannot grant directory /nowhere/at/all",
        ),
    ];
    for (args, expected) in cases {
        let mut all = vec!["run", LEDGER, "--db", &db, "--run-id", "other"];
        all.extend_from_slice(args);
        let out = run_cli(&all);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(expected),
            "{args:?}: expected {expected:?} in {err}"
        );
    }
    assert_store_unchanged(&db, &digest);
}

#[test]
fn an_unusable_db_path_is_named_in_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    // A path below a regular file can never be created, even by root.
    let db = file.join("idem.db");
    let out = run_cli(&["run", LEDGER, "--db", db.to_str().unwrap(), "--input", "{}"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains(db.to_str().unwrap()), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), b"x");

    // A file that is not a database is refused and left byte-identical.
    let out = run_cli(&[
        "run",
        LEDGER,
        "--db",
        file.to_str().unwrap(),
        "--input",
        "{}",
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains(file.to_str().unwrap()), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
}

/// A FIFO given as the store used to hang `idem`; a `file:` name was read by SQLite as
/// a URI with options. Both are names of files: the FIFO is refused at once, and the
/// `file:` name is a file of that name in the directory.
#[test]
fn odd_store_paths_are_files_or_refused_never_hangs_or_uris() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo.db");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let out = run_cli(&[
        "run",
        LEDGER,
        "--db",
        fifo.to_str().unwrap(),
        "--input",
        "{}",
    ]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("fifo.db") && err.contains("named pipe (FIFO)"),
        "{err}"
    );

    // Run from inside the directory, so that a relative `file:` name lands there.
    std::fs::create_dir(dir.path().join("data")).unwrap();
    let grant = format!("{}::/data", dir.path().join("data").display());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .current_dir(dir.path())
        .args([
            "run",
            LEDGER,
            "--db",
            "file:odd.db?vfs=memdb",
            "--dir",
            &grant,
        ])
        .args(["--input", r#"{"items":["x"],"log":"/data/l.log"}"#])
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        dir.path().join("file:odd.db?vfs=memdb").is_file(),
        "the store is the file of that name, not an in-memory database"
    );
}

/// `--db :memory:` reads as SQLite's in-memory database, but every store path is a file:
/// it used to leave a durable store named `:memory:` in the working directory. It is
/// refused before anything is created; `./:memory:` is a file of that name.
#[test]
fn memory_store_name_is_refused_not_made_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let idem = |db: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
            .current_dir(dir.path())
            .args(["run", LEDGER, "--db", db, "--input", r#"{"items":[]}"#])
            .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
            .output()
            .unwrap()
    };
    let out = idem(":memory:");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.contains("in-memory") && err.contains("./:memory:"),
        "{err}"
    );
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "nothing is created: {left:?}");

    // The agent fails on this input (it has no log to write), after the store opened.
    let out = idem("./:memory:");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(dir.path().join(":memory:").is_file());
}

/// `idem` with `args`, in `dir`, given `stdin`; `None` if it was still running after
/// 30 s (then killed): what used to happen to a FIFO with no writer.
fn idem_within(dir: &Path, args: &[&str], stdin: &[u8]) -> Option<std::process::Output> {
    use std::io::Write;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .current_dir(dir)
        .args(args)
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Some(child.wait_with_output().unwrap())
}

/// A FIFO with no writer as `--input @FILE` or as the agent used to hang `idem` in
/// `open` forever: both are refused at once, naming what the file is; a regular file
/// and `@-` (stdin) still give the input.
#[test]
fn fifo_inputs_and_agents_are_refused_never_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    std::fs::create_dir(dir.path().join("data")).unwrap();
    let grant = format!("{}::/data", dir.path().join("data").display());
    let input = r#"{"items":["x"],"log":"/data/l.log"}"#;
    std::fs::write(dir.path().join("input.json"), input).unwrap();
    let run = |agent: &str, input: &str, stdin: &str| {
        let args = [
            "run", agent, "--db", "idem.db", "--dir", &grant, "--input", input,
        ];
        idem_within(dir.path(), &args, stdin.as_bytes())
            .unwrap_or_else(|| panic!("idem {args:?} hung"))
    };

    let out = run(LEDGER, "@fifo", "");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("cannot read --input file fifo: it is a named pipe (FIFO)")
            && err.contains("@-"),
        "{err}"
    );
    let out = run("fifo", input, "");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("cannot read agent fifo") && err.contains("named pipe (FIFO)"),
        "{err}"
    );
    assert!(!dir.path().join("idem.db").exists(), "nothing was opened");

    let out = run(LEDGER, "@input.json", "");
    assert!(out.status.success(), "{}", stderr(&out));
    let out = run(LEDGER, "@-", r#"{"items":["y"],"log":"/data/l.log"}"#);
    assert!(out.status.success(), "{}", stderr(&out));
    let log = std::fs::read_to_string(dir.path().join("data/l.log")).unwrap();
    assert!(log.contains("item=x") && log.contains("item=y"), "{log}");
}
