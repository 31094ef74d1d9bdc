//! What the operator reads: text an agent controls (its output, its error, its stdout
//! and stderr, a park reason, its file name) reaches `idem run`, `idem status` and
//! `idem resolve` escaped, never as bytes a terminal would obey or hide; keys, run ids
//! and namespaces holding bidi or invisible characters are refused, naming the
//! character; `idem resolve` takes the key as the agent sees it; and a file outside the
//! grants gets a hint.

use std::process::Output;

use idem_test_artifacts::{HOSTILE, STEPS};
use serde_json::{Value, json};

use crate::util::{CliDir, run_cli, stderr, stdout};

/// Everything a terminal would act on or not show: CSI and OSC escape sequences, BEL,
/// the 8-bit CSI (U+009B), a carriage return, DEL, bidi overrides and isolates,
/// zero-width characters, a BOM, a tag character, a line separator, a soft hyphen.
const HOSTILE_TEXT: &str = "esc\u{1b}[31mred\u{1b}]0;title\u{7} csi\u{9b}2J \
    bidi\u{202e}txt.exe\u{2066}x\u{2069} zw\u{200b}\u{200d}\u{feff} tag\u{e0041} \
    sep\u{2028} shy\u{ad} cr\roverwrite del\u{7f}";

/// The non-control characters of [`HOSTILE_TEXT`] and their kin that must not appear
/// raw. (Controls are found by `char::is_control`, independently of idem's table.)
const HIDDEN: &[char] = &[
    '\u{202e}',
    '\u{2066}',
    '\u{2069}',
    '\u{200b}',
    '\u{200d}',
    '\u{feff}',
    '\u{e0041}',
    '\u{2028}',
    '\u{ad}',
    '\u{200e}',
    '\u{200f}',
    '\u{61c}',
];

/// Asserts that `bytes` are UTF-8 holding no control character but newline and tab,
/// and none of [`HIDDEN`].
fn assert_clean(bytes: &[u8], what: &str) {
    let text = std::str::from_utf8(bytes)
        .unwrap_or_else(|e| panic!("{what} is not UTF-8 ({e}): {bytes:?}"));
    for (at, c) in text.char_indices() {
        let raw = (c.is_control() && c != '\n' && c != '\t') || HIDDEN.contains(&c);
        assert!(
            !raw,
            "{what}: raw U+{:04X} at byte {at} in {text:?}",
            c as u32
        );
    }
}

fn assert_all_clean(out: &Output, what: &str) {
    assert_clean(&out.stdout, &format!("{what} (stdout)"));
    assert_clean(&out.stderr, &format!("{what} (stderr)"));
}

fn hostile(cli: &CliDir, run_id: &str, input: Value, extra: &[&str]) -> Output {
    cli.run(HOSTILE, run_id, &input.to_string(), extra)
}

#[test]
fn run_shows_the_agents_output_stdout_and_stderr_escaped() {
    let cli = CliDir::new();
    let input = json!({ "mode": "say", "text": HOSTILE_TEXT });
    let out = hostile(&cli, "say", input.clone(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_all_clean(&out, "idem run");
    // Stdout and stderr (the latter one byte per write) arrive as whole escaped lines
    // on idem's stderr; the output is printed as JSON with the same characters escaped.
    let err = stderr(&out);
    assert_eq!(
        err.matches(r"esc\u001b[31mred\u001b]0;title\u0007").count(),
        2,
        "{err}"
    );
    assert!(
        err.contains(r"bidi\u202etxt.exe\u2066x\u2069 zw\u200b\u200d\ufeff tag\udb40\udc41"),
        "{err}"
    );
    assert!(err.contains(r"csi\u009b2J"), "{err}");
    let printed = stdout(&out);
    assert!(printed.contains(r"esc\u001b[31mred"), "{printed}");
    assert!(
        printed.contains(r"bidi\u202etxt.exe\u2066x\u2069"),
        "{printed}"
    );

    // `--json` escapes them too, and still decodes to exactly what the agent returned.
    let out = hostile(&cli, "say", input, &["--json"]);
    assert_all_clean(&out, "idem run --json");
    let doc: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(doc["output"], HOSTILE_TEXT);
}

#[test]
fn run_shows_the_agents_error_escaped() {
    let cli = CliDir::new();
    let out = hostile(
        &cli,
        "fail",
        json!({ "mode": "fail-with", "text": HOSTILE_TEXT }),
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_all_clean(&out, "idem run");
    assert!(stdout(&out).contains(r"error: "), "{}", stdout(&out));
    assert!(stdout(&out).contains(r"bidi\u202e"), "{}", stdout(&out));
}

#[test]
fn a_park_reason_is_shown_escaped_and_resolve_takes_the_agents_key() {
    let cli = CliDir::new();
    let db = cli.db();
    let input = json!({ "mode": "park", "key": "wire/7", "text": HOSTILE_TEXT });
    let out = hostile(&cli, "park", input.clone(), &[]);
    assert_eq!(
        out.status.code(),
        Some(5),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert_all_clean(&out, "idem run (parked)");

    let status = run_cli(&["status", "--db", &db]);
    assert!(status.status.success(), "{}", stderr(&status));
    assert_all_clean(&status, "idem status");
    let text = stdout(&status);
    assert!(
        text.contains(r"(parked in doubt: esc\u001b[31mred"),
        "{text}"
    );
    assert!(text.contains("hostile:wire/7"), "{text}");

    let status = run_cli(&["status", "--db", &db, "park", "--json"]);
    assert_all_clean(&status, "idem status --json");
    let doc: Value = serde_json::from_str(&stdout(&status)).unwrap();
    assert_eq!(doc["open_claims"][0]["parked"], HOSTILE_TEXT);

    // Running it again names the parked key and how to settle it, escaped.
    let again = hostile(&cli, "park", input.clone(), &[]);
    assert_eq!(again.status.code(), Some(5));
    assert_all_clean(&again, "idem run (in doubt)");

    // A key that is not parked: refused, naming the keys that are, as the agent sees
    // them; a look-alike key is told apart by the code point it hides.
    let wrong = run_cli(&["resolve", "park", "wire/8", "--retry", "--db", &db]);
    assert_eq!(wrong.status.code(), Some(2), "{}", stderr(&wrong));
    assert_all_clean(&wrong, "idem resolve (not parked)");
    let err = stderr(&wrong);
    assert!(
        err.contains("not parked") && err.contains(r#""wire/7""#),
        "{err}"
    );
    let spoof = run_cli(&["resolve", "park", "wire/\u{200b}7", "--retry", "--db", &db]);
    assert_eq!(spoof.status.code(), Some(2), "{}", stderr(&spoof));
    assert_all_clean(&spoof, "idem resolve (look-alike key)");
    assert!(
        stderr(&spoof).contains("U+200B ZERO WIDTH SPACE"),
        "{}",
        stderr(&spoof)
    );

    // The key as the agent sees it (and wrote it in its log, or its error) resolves it.
    let out = run_cli(&[
        "resolve", "park", "wire/7", "--result", "\"sent\"", "--db", &db,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_all_clean(&out, "idem resolve");
    assert!(
        stdout(&out).contains("run status: running"),
        "{}",
        stdout(&out)
    );
    let out = hostile(&cli, "park", input, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("already committed"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn resolve_takes_either_form_of_a_key_that_looks_qualified() {
    let cli = CliDir::new();
    let db = cli.db();
    // The agent's key is `hostile:k`; the store keeps it as `hostile:hostile:k`.
    let input = json!({ "mode": "park", "key": "hostile:k", "text": "checked by hand" });
    let out = hostile(&cli, "q", input.clone(), &[]);
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    let out = run_cli(&["resolve", "q", "hostile:k", "--retry", "--db", &db]);
    assert!(out.status.success(), "{}", stderr(&out));

    // Released, claimed again and parked again: the stored form resolves it too.
    let out = hostile(&cli, "q", input, &[]);
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    let out = run_cli(&["resolve", "q", "hostile:hostile:k", "--retry", "--db", &db]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn an_agent_file_name_with_escapes_is_shown_escaped() {
    let cli = CliDir::new();
    let evil = cli.dir.path().join("evil\u{1b}[2J\u{202e}gpj.wasm");
    std::fs::copy(HOSTILE, &evil).unwrap();
    let grant = format!("{}::/data", cli.data().display());
    let input = json!({ "mode": "say", "text": "hi" }).to_string();
    let db = cli.db();
    let evil = evil.to_str().unwrap();
    // No --run-id: the default one is made from the agent's name, without its escapes.
    let out = run_cli(&["run", evil, "--db", &db, "--dir", &grant, "--input", &input]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_all_clean(&out, "idem run (evil name)");
    let status = run_cli(&["status", "--db", &db]);
    assert_all_clean(&status, "idem status (evil name)");
    // The agent runs under a name made from its file's, with anything a namespace may
    // not hold replaced.
    assert!(
        stdout(&status).contains("evil--2J-gpj"),
        "{}",
        stdout(&status)
    );

    // An error that quotes the name (here: no such file) is escaped too.
    let missing = cli.dir.path().join("gone\u{1b}[2J\u{202e}.wasm");
    let out = run_cli(&["run", missing.to_str().unwrap(), "--db", &db]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_all_clean(&out, "idem run (missing evil name)");
    assert!(
        stderr(&out).contains(r"gone\u001b[2J\u202e.wasm"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn keys_with_control_bidi_or_invisible_characters_are_refused() {
    let cli = CliDir::new();
    let cases = [
        (
            "a\u{1b}[2Jb",
            "U+001B C0 CONTROL, a control character, at byte 1",
        ),
        (
            "pay\u{202e}exe",
            "U+202E RIGHT-TO-LEFT OVERRIDE, a bidi control, at byte 3",
        ),
        (
            "a\u{2066}b",
            "U+2066 LEFT-TO-RIGHT ISOLATE, a bidi control, at byte 1",
        ),
        (
            "wire\u{200b}/7",
            "U+200B ZERO WIDTH SPACE, an invisible character, at byte 4",
        ),
        (
            "\u{feff}k",
            "U+FEFF ZERO WIDTH NO-BREAK SPACE, an invisible character, at byte 0",
        ),
        (
            "k\u{e0041}",
            "U+E0041 TAG CHARACTER, an invisible character, at byte 1",
        ),
    ];
    for (i, (key, named)) in cases.iter().enumerate() {
        let out = hostile(
            &cli,
            &format!("key-{i}"),
            json!({ "mode": "key", "text": key }),
            &[],
        );
        assert_eq!(out.status.code(), Some(1), "{key:?}: {}", stdout(&out));
        assert_all_clean(&out, "idem run (bad key)");
        let printed = stdout(&out);
        assert!(
            printed.contains("invalid key") && printed.contains(named),
            "{printed}"
        );
    }
}

#[test]
fn run_ids_and_namespaces_with_bidi_or_invisible_characters_are_refused() {
    let cli = CliDir::new();
    let input = json!({ "mode": "say", "text": "hi" });
    let out = hostile(&cli, "run\u{202e}1", input.clone(), &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_all_clean(&out, "idem run (bad run id)");
    let err = stderr(&out);
    assert!(err.contains("invalid run id"), "{err}");
    assert!(
        err.contains("U+202E RIGHT-TO-LEFT OVERRIDE, a bidi control, at byte 3"),
        "{err}"
    );

    let out = hostile(&cli, "r\u{200b}", input.clone(), &[]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("U+200B ZERO WIDTH SPACE"),
        "{}",
        stderr(&out)
    );

    let out = hostile(&cli, "ns", input, &["--namespace", "billing\u{200b}"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_all_clean(&out, "idem run (bad namespace)");
    let err = stderr(&out);
    assert!(err.contains("invalid namespace"), "{err}");
    assert!(
        err.contains("U+200B ZERO WIDTH SPACE, an invisible character, at byte 7"),
        "{err}"
    );
    assert!(
        !cli.dir.path().join("idem.db").exists(),
        "nothing was written"
    );
}

#[test]
fn a_file_outside_the_grants_gets_a_hint() {
    let cli = CliDir::new();
    let input = json!({ "steps": 1, "log": "/elsewhere/log.txt" }).to_string();
    let out = cli.run(STEPS, "outside", &input, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let printed = stdout(&out);
    assert!(printed.contains("(os error 44)"), "{printed}");
    assert!(
        printed.contains("hint: os error 44 is ENOENT") && printed.contains("--dir HOST::GUEST"),
        "{printed}"
    );
}
