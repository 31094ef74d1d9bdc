//! `idem run`'s progress line: drawn on a terminal (a real pseudo-terminal, made by
//! util-linux's `script`), not with `--quiet`, and never when stderr is not a terminal.

use std::process::Command;

use idem_test_artifacts::{HOSTILE, STEPS};
use serde_json::json;

use crate::util::{CliDir, stderr};

/// `idem run` of `steps` (effects that sleep 300 ms) on a pseudo-terminal: what the
/// terminal showed.
fn on_terminal(cli: &CliDir, run_id: &str, extra: &str) -> String {
    let input = json!({ "steps": 4, "log": "/data/log.txt", "pause_ms": 300 }).to_string();
    agent_on_terminal(cli, STEPS, run_id, &input, extra)
}

/// `idem run AGENT` with `input` on a pseudo-terminal: what the terminal showed.
fn agent_on_terminal(cli: &CliDir, agent: &str, run_id: &str, input: &str, extra: &str) -> String {
    let command = format!(
        "{idem} run {agent} --db {db} --dir {data}::/data --run-id {run_id} --input '{input}' {extra}",
        idem = env!("CARGO_BIN_EXE_idem"),
        db = cli.db(),
        data = cli.data().display(),
    );
    let out = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .output()
        .expect("script (util-linux) runs");
    assert!(out.status.success(), "{}", stderr(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn run_draws_progress_only_on_a_terminal() {
    let cli = CliDir::new();
    let shown = on_terminal(&cli, "bar", "");
    assert!(shown.contains("run bar completed"), "{shown}");
    // The line redraws with the counts the store has as the run goes (which of them a
    // redraw catches depends on timing; some count between start and end does).
    assert!(
        (1..=3).any(|n| shown.contains(&format!("run bar executed {n}  skipped 0"))),
        "no count shown while running: {shown}"
    );
    let quiet = on_terminal(&cli, "quiet", "--quiet");
    assert!(quiet.contains("run quiet completed"), "{quiet}");
    assert!(!quiet.contains("run quiet executed"), "{quiet}");

    // Not a terminal: nothing but the agent's own output and errors on stderr.
    let input = json!({ "steps": 4, "log": "/data/log2.txt", "pause_ms": 300 }).to_string();
    let out = cli.run(STEPS, "piped", &input, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        !stderr(&out).contains("run piped executed"),
        "{}",
        stderr(&out)
    );
    assert!(!stderr(&out).contains('\u{1b}'), "{}", stderr(&out));
}

#[test]
fn the_agents_output_is_shown_whole_above_the_progress_line() {
    let cli = CliDir::new();
    // The agent writes its text one byte at a time; the terminal shows it as whole
    // lines (once from its stdout, once from its stderr), never cut by a redraw.
    let input = json!({ "mode": "say", "text": "hello from the agent\nsecond line\n" }).to_string();
    let shown = agent_on_terminal(&cli, HOSTILE, "say", &input, "");
    assert!(shown.contains("run say completed"), "{shown}");
    for line in ["hello from the agent\r\n", "second line\r\n"] {
        let at: Vec<usize> = shown.match_indices(line).map(|(i, _)| i).collect();
        assert_eq!(at.len(), 2, "{shown:?}");
        // Each starts a line of its own: after a newline or a cleared line, never
        // appended to the progress line's text.
        for i in at {
            let before = &shown[..i];
            assert!(
                before.ends_with('\n') || before.ends_with("\u{1b}[2K"),
                "{line:?} was not on a line of its own: {shown:?}"
            );
        }
    }
    // And the progress line was drawn around them.
    assert!(shown.contains("run say starting"), "{shown:?}");
}
