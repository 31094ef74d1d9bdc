//! The `idem` binary end to end: the demo's recycling run, `--json`, `status`, resuming
//! a finished run, exit codes, and what is generated from its clap definitions (the
//! committed CLI reference, shell completions, man pages).

use idem_test_artifacts::{LEDGER, STEPS};

use crate::util::{key_counts, read_log, run_cli, stderr, stdout};

#[test]
fn ledger_with_recycling_through_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("idem.db");
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let items: Vec<String> = (0..10).map(|i| format!("item-{i}")).collect();
    let input = serde_json::json!({ "items": items, "log": "/data/ledger.log" }).to_string();
    let grant = format!("{}::/data", data.display());
    let args = [
        "run",
        LEDGER,
        "--db",
        db.to_str().unwrap(),
        "--dir",
        &grant,
        "--input",
        &input,
        "--recycle-every",
        "3",
        "--json",
    ];
    let out = run_cli(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(doc["status"], "completed");
    assert_eq!(doc["counts"]["executed"], 10);
    assert_eq!(doc["counts"]["skipped"], 0);
    assert_eq!(doc["counts"]["instances"], 4);
    assert_eq!(doc["output"]["processed"], 10);
    let lines = read_log(&data.join("ledger.log"));
    assert_eq!(lines.len(), 10);
    assert!(key_counts(&lines).values().all(|&c| c == 1));

    // The same command again: the run is found finished; nothing runs again.
    let again = run_cli(&args);
    assert!(again.status.success(), "{}", stderr(&again));
    let doc2: serde_json::Value = serde_json::from_str(&stdout(&again)).unwrap();
    assert_eq!(doc2["already_finished"], true);
    assert_eq!(doc2["output"], doc["output"]);
    assert_eq!(read_log(&data.join("ledger.log")).len(), 10);

    let status = run_cli(&["status", "--db", db.to_str().unwrap()]);
    let text = stdout(&status);
    assert!(status.status.success(), "{}", stderr(&status));
    assert!(
        text.contains("completed") && text.contains("ledger"),
        "{text}"
    );
    assert!(text.contains("no open claims"), "{text}");
}

#[test]
fn an_agent_error_exits_1_and_the_run_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("idem.db");
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let grant = format!("{}::/data", data.display());
    let input = r#"{"steps":5,"log":"/data/log.txt","fail_at":2}"#;
    let args = [
        "run",
        STEPS,
        "--db",
        db.to_str().unwrap(),
        "--dir",
        &grant,
        "--input",
        input,
        "--run-id",
        "flaky",
    ];
    let out = run_cli(&args);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stdout(&out).contains("failed"), "{}", stdout(&out));
    assert_eq!(
        read_log(&data.join("log.txt")).len(),
        2,
        "steps 0 and 1 ran; step 2 failed before its effect"
    );

    let status = run_cli(&["status", "--db", db.to_str().unwrap(), "flaky", "--json"]);
    let doc: serde_json::Value = serde_json::from_str(&stdout(&status)).unwrap();
    assert_eq!(doc["runs"][0]["status"], "failed");
    assert_eq!(doc["runs"][0]["step"], 2);
    // The run's error, as `idem run` printed it: in the list, its first line under the
    // run's row; for the run asked for, whole.
    let printed = stdout(&out);
    let error = printed
        .lines()
        .find_map(|l| l.strip_prefix("error: "))
        .unwrap_or_else(|| panic!("no error line: {printed}"));
    for args in [vec!["status"], vec!["status", "flaky"]] {
        let mut args = args;
        args.extend(["--db", db.to_str().unwrap()]);
        let status = run_cli(&args);
        assert!(status.status.success(), "{}", stderr(&status));
        let text = stdout(&status);
        assert!(
            text.contains(&format!("\n  error: {error}")),
            "{args:?}: {text}"
        );
    }

    // Running it again resumes: steps 0-1 are not redone, step 2 is retried (attempt 2).
    let out = run_cli(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    let lines = read_log(&data.join("log.txt"));
    assert_eq!(lines.len(), 5);
    assert!(key_counts(&lines).values().all(|&c| c == 1));
    assert_eq!(lines[2].attempt(), 2);
}

#[test]
fn status_of_a_missing_store_is_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("none.db");
    let out = run_cli(&["status", "--db", db.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("no store at"));
    assert!(!db.exists());
}

/// docs/reference/cli.md is what the binary generates from its clap definitions: a flag
/// added, renamed or documented anew without regenerating it fails here.
#[test]
fn the_committed_cli_reference_is_current() {
    const REGENERATE: &str = "cargo run -p idem-cli -- cli-reference > docs/reference/cli.md";
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/reference/cli.md");
    let out = run_cli(&["cli-reference"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let generated = stdout(&out);
    assert!(generated.contains("## `idem run`"), "{generated}");
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/reference/cli.md is stale: regenerate it from the repository's root with\n    \
         {REGENERATE}"
    );
}

#[test]
fn completions_and_man_pages_name_the_commands() {
    let bash = run_cli(&["completions", "bash"]);
    assert!(bash.status.success(), "{}", stderr(&bash));
    let script = stdout(&bash);
    assert!(script.contains("complete -F _idem"), "{script}");
    for word in ["submit", "worker", "--run-id"] {
        assert!(script.contains(word), "{word}: {script}");
    }
    let zsh = stdout(&run_cli(&["completions", "zsh"]));
    assert!(zsh.starts_with("#compdef idem"), "{zsh}");
    let refused = run_cli(&["completions", "tcsh"]);
    assert_eq!(refused.status.code(), Some(2));

    let man = run_cli(&["man"]);
    assert!(man.status.success(), "{}", stderr(&man));
    let page = stdout(&man);
    assert!(page.contains(".TH idem 1"), "{page}");
    assert!(page.contains("idem \\- "), "{page}");
    assert!(page.contains("submit"), "{page}");

    let dir = tempfile::tempdir().unwrap();
    let pages = dir.path().join("man1");
    let out = run_cli(&["man", "--out-dir", pages.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let run = std::fs::read_to_string(pages.join("idem-run.1")).unwrap();
    assert!(run.contains(".TH idem-run 1"), "{run}");
    assert!(run.contains("\\-\\-run\\-id"), "{run}");
    for page in ["idem.1", "idem-worker.1", "idem-serve.1"] {
        assert!(pages.join(page).exists(), "{page}");
    }
    assert!(
        !pages.join("idem-cli-reference.1").exists(),
        "a hidden command has no page"
    );
}

#[test]
fn output_into_a_closed_pipe_ends_quietly_not_with_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("idem.db");
    let db = db.to_str().unwrap();
    // A store with enough runs that `ls` writes past what the pipe holds.
    let out = crate::util::run_cli(&[
        "deploy",
        idem_test_artifacts::STEPS,
        "--name",
        "s",
        "--db",
        db,
    ]);
    assert!(out.status.success(), "{}", crate::util::stderr(&out));
    for i in 0..400 {
        let id = format!("run-with-a-long-name-to-fill-the-pipe-{i:04}");
        let out =
            crate::util::run_cli(&["submit", "s", "--run-id", &id, "--input", "{}", "--db", db]);
        assert!(out.status.success(), "{}", crate::util::stderr(&out));
    }
    let mut ls = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["ls", "--db", db, "--limit", "400"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Read one line and close the pipe, as `| head -1` does.
    let mut stdout = ls.stdout.take().unwrap();
    let mut first = [0u8; 16];
    std::io::Read::read_exact(&mut stdout, &mut first).unwrap();
    drop(stdout);
    let out = ls.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        matches!(out.status.code(), Some(0 | 141)),
        "{:?}",
        out.status
    );
}
