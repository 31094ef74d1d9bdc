//! `idem new`: a project written for each language builds with the project's own
//! `prove.sh`, passes `idem prove`, and its agent, run by `idem run`, writes each item
//! exactly once (counted in its log file); a folder with anything in it, a name that
//! cannot name an agent and an SDK path without an SDK are refused, writing nothing.
//!
//! The Python project needs componentize-py (`IDEM_PYTHON_VENV`, as `scripts/test` sets
//! up): without it its test prints `SKIPPED: Python ...`, and fails under
//! `IDEM_TEST_PYTHON=required`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::util::{run_cli, stderr, stdout};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// PATH with the `idem` under test first, then `extra`, then the suite's own.
fn path_with(extra: Option<&Path>) -> OsString {
    let idem_dir = Path::new(env!("CARGO_BIN_EXE_idem")).parent().unwrap();
    let mut dirs = vec![idem_dir.to_path_buf()];
    dirs.extend(extra.map(Path::to_path_buf));
    dirs.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(dirs).unwrap()
}

/// `sh prove.sh` in `project`, with cargo's per-build settings of this test run removed
/// (a nested build must not inherit them, as tests/build.rs's own does not).
fn prove_sh(project: &Path, path: &OsString, env: &[(&str, &std::ffi::OsStr)]) -> Output {
    let mut cmd = Command::new("sh");
    cmd.arg("prove.sh")
        .current_dir(project)
        .env("PATH", path)
        .env("IDEM_LOG", "warn")
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"));
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if ["CARGO_", "RUSTFLAGS", "RUSTC_", "__CARGO"]
            .iter()
            .any(|prefix| name.starts_with(prefix))
            && name != "CARGO_HOME"
        {
            cmd.env_remove(&*name);
        }
    }
    for (name, value) in env {
        cmd.env(name, value);
    }
    cmd.output().unwrap()
}

/// Runs the built agent twice over the project's `input.json` into its `data/`, and
/// checks that its log holds each of the three items exactly once.
fn run_twice_counts_once(project: &Path, wasm: &Path, name: &str) {
    let db = project.join("idem.db");
    let grant = format!("{}::/data", project.join("data").display());
    let input = format!("@{}", project.join("input.json").display());
    for run_id in ["first", "first"] {
        let out = run_cli(&[
            "run",
            wasm.to_str().unwrap(),
            "--db",
            db.to_str().unwrap(),
            "--dir",
            &grant,
            "--input",
            &input,
            "--run-id",
            run_id,
        ]);
        assert!(out.status.success(), "idem run: {}", stderr(&out));
        assert!(stdout(&out).contains(r#""written":3"#), "{}", stdout(&out));
    }
    let log = std::fs::read_to_string(project.join("data").join(format!("{name}.log"))).unwrap();
    let items: Vec<&str> = log
        .lines()
        .map(|line| line.rsplit_once("item=").unwrap().1)
        .collect();
    assert_eq!(items, ["apples", "pears", "plums"], "{log}");
}

fn assert_proved(out: &Output) {
    let text = format!("{}{}", stdout(out), stderr(out));
    assert!(
        out.status.success(),
        "prove.sh failed ({}):\n{text}",
        out.status
    );
    assert!(text.contains("verdict: PASSED"), "{text}");
    // The clean run's row: 1 run, 0 not reached, 3 effects observed (one per item), 0
    // in doubt, 0 violations. A template whose effect prove cannot see would pass
    // with 0 here.
    let clean = text
        .lines()
        .find(|line| line.starts_with("clean "))
        .map(|line| line.split_whitespace().collect::<Vec<_>>());
    assert_eq!(
        clean,
        Some(vec!["clean", "1", "0", "3", "0", "0"]),
        "{text}"
    );
}

#[test]
fn new_rust_project_builds_and_proves() {
    let tmp = tempfile::tempdir().unwrap();
    let project = tmp.path().join("hello-agent");
    let out = run_cli(&["new", project.to_str().unwrap(), "--lang", "rust"]);
    assert!(out.status.success(), "{}", stderr(&out));
    for file in [
        "Cargo.toml",
        "src/lib.rs",
        ".gitignore",
        "prove.sh",
        "input.json",
    ] {
        assert!(project.join(file).is_file(), "{file} missing");
    }
    let manifest = std::fs::read_to_string(project.join("Cargo.toml")).unwrap();
    let sdk = std::fs::canonicalize(repo_root().join("guest-sdk")).unwrap();
    assert!(
        manifest.contains(&format!("idem-sdk = {{ path = \"{}\" }}", sdk.display())),
        "{manifest}"
    );
    // Written as `cargo fmt` would have it.
    let fmt = Command::new("cargo")
        .args(["fmt", "--check"])
        .current_dir(&project)
        .output()
        .unwrap();
    assert!(fmt.status.success(), "cargo fmt --check: {}", stdout(&fmt));
    // The versions the repository builds its own agents with (already fetched and
    // compiled), rather than whatever is newest on crates.io today.
    std::fs::copy(
        repo_root().join("examples/Cargo.lock"),
        project.join("Cargo.lock"),
    )
    .unwrap();
    // The target dir the test guests were built in (examples/ and the project share
    // the SDK's path, the lock file and the release profile): only the agent itself
    // compiles.
    let target = Path::new(idem_test_artifacts::LEDGER)
        .ancestors()
        .nth(3)
        .unwrap()
        .to_path_buf();
    let out = prove_sh(
        &project,
        &path_with(None),
        &[("CARGO_TARGET_DIR", target.as_os_str())],
    );
    assert_proved(&out);
    let wasm = target.join("wasm32-wasip2/release/hello_agent.wasm");
    run_twice_counts_once(&project, &wasm, "hello-agent");
}

#[test]
fn new_python_project_builds_and_proves() {
    let venv = std::env::var_os("IDEM_PYTHON_VENV")
        .map_or_else(|| repo_root().join("target/py"), PathBuf::from);
    let bin = venv.join("bin");
    if !bin.join("componentize-py").is_file() {
        assert!(
            std::env::var("IDEM_TEST_PYTHON").as_deref() != Ok("required"),
            "IDEM_TEST_PYTHON=required but {} has no componentize-py",
            venv.display()
        );
        eprintln!(
            "SKIPPED: Python: componentize-py is not in {}: idem new --lang python is not \
             built; run scripts/test, which installs it",
            venv.display()
        );
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let project = tmp.path().join("hello_py");
    let out = run_cli(&["new", project.to_str().unwrap(), "--lang", "python"]);
    assert!(out.status.success(), "{}", stderr(&out));
    for file in ["app.py", ".gitignore", "prove.sh", "input.json"] {
        assert!(project.join(file).is_file(), "{file} missing");
    }
    // As an activated venv: componentize-py finds the SDK (and its WIT) there.
    let out = prove_sh(
        &project,
        &path_with(Some(&bin)),
        &[("VIRTUAL_ENV", venv.as_os_str())],
    );
    assert_proved(&out);
    run_twice_counts_once(&project, &project.join("hello_py.wasm"), "hello_py");
}

#[test]
fn new_refuses_a_folder_with_anything_in_it() {
    let tmp = tempfile::tempdir().unwrap();
    let project = tmp.path().join("taken");
    std::fs::create_dir(&project).unwrap();
    std::fs::write(project.join("notes.txt"), "mine").unwrap();
    for lang in ["rust", "python"] {
        let out = run_cli(&["new", project.to_str().unwrap(), "--lang", lang]);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("exists and is not empty"),
            "{}",
            stderr(&out)
        );
    }
    let left: Vec<_> = std::fs::read_dir(&project).unwrap().collect();
    assert_eq!(left.len(), 1, "idem new wrote into a folder it refused");
    assert_eq!(
        std::fs::read_to_string(project.join("notes.txt")).unwrap(),
        "mine"
    );

    // An empty folder is taken.
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let out = run_cli(&["new", empty.to_str().unwrap(), "--lang", "python"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(empty.join("app.py").is_file());
}

#[test]
fn new_refuses_bad_names_and_sdk_paths() {
    let tmp = tempfile::tempdir().unwrap();
    let refused = |args: &[&str], says: &str| {
        let out = run_cli(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    };
    for name in ["1st", "has space", "dot.ted", "std"] {
        let dir = tmp.path().join(name);
        refused(
            &["new", dir.to_str().unwrap(), "--lang", "rust"],
            "cannot name an agent",
        );
        assert!(!dir.exists(), "{name}: written anyway");
    }
    let dir = tmp.path().join("agent");
    let not_sdk = tmp.path().to_str().unwrap().to_owned();
    refused(
        &[
            "new",
            dir.to_str().unwrap(),
            "--lang",
            "rust",
            "--sdk-path",
            &not_sdk,
        ],
        "no idem SDK there",
    );
    let sdk = repo_root().join("guest-sdk");
    refused(
        &[
            "new",
            dir.to_str().unwrap(),
            "--lang",
            "python",
            "--sdk-path",
            sdk.to_str().unwrap(),
        ],
        "--sdk-path is for --lang rust",
    );
    assert!(!dir.exists(), "written anyway");
}
