//! The Python guests: every app folder under `tests/guests-python/` (guest
//! `py-NAME`, constant `PY_NAME`) and the Python examples, each built with
//! `componentize-py` against the Python SDK (`guest-sdk-python/src/idem`, staged with a
//! real copy of `wit/`, since componentize-py reads a package's WIT only from inside the
//! package). An app is a folder holding `app.py`, whose docstring documents the guest.
//!
//! componentize-py comes from the venv `scripts/test` makes (`IDEM_PYTHON_VENV`, by
//! default `target/py`). Without it each constant is empty and the Python tests print
//! `SKIPPED: Python ...`; with `IDEM_TEST_PYTHON=required` a missing venv fails the build.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::Guest;

/// The folder of the Python test guests, from the repo root: watched as a whole, so a
/// new app in it is found.
const TESTS_DIR: &str = "tests/guests-python";

/// The Python examples the tests run, as (folder from the repo root, guest name). Named
/// here rather than found: `examples/` also holds the target dir of a manual build, so
/// it cannot be watched as a whole.
const EXAMPLES: &[(&str, &str)] = &[
    ("examples/python-ledger", "py-ledger"),
    ("examples/python-llm-agent", "py-llm-agent"),
];

pub fn watched(root: &Path) -> Vec<PathBuf> {
    let mut paths = vec![root.join("guest-sdk-python/src"), root.join(TESTS_DIR)];
    paths.extend(EXAMPLES.iter().map(|(dir, _)| root.join(dir)));
    println!("cargo:rerun-if-env-changed=IDEM_PYTHON_VENV");
    println!("cargo:rerun-if-env-changed=IDEM_TEST_PYTHON");
    paths
}

fn venv(root: &Path) -> PathBuf {
    std::env::var_os("IDEM_PYTHON_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/py"))
}

/// The apps, as (folder from the repo root, guest name): the test guests in name order,
/// then the examples.
fn apps(root: &Path) -> Result<Vec<(String, String)>, String> {
    let dir = root.join(TESTS_DIR);
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
        if !path.join("app.py").is_file() {
            continue;
        }
        let name = path
            .file_name()
            .and_then(|name| name.to_str())
            .ok_or_else(|| format!("{} has no UTF-8 name", path.display()))?;
        names.push(name.to_owned());
    }
    names.sort();
    let mut apps: Vec<(String, String)> = names
        .into_iter()
        .map(|name| (format!("{TESTS_DIR}/{name}"), format!("py-{name}")))
        .collect();
    apps.extend(
        EXAMPLES
            .iter()
            .map(|(dir, name)| ((*dir).to_owned(), (*name).to_owned())),
    );
    Ok(apps)
}

/// The first paragraph of `app.py`'s module docstring.
fn docstring_summary(app: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(app).map_err(|e| format!("{}: {e}", app.display()))?;
    let body = text
        .strip_prefix("\"\"\"")
        .and_then(|rest| rest.split_once("\"\"\""))
        .map_or("", |(doc, _)| doc);
    let lines: Vec<&str> = body
        .lines()
        .map(str::trim)
        .take_while(|line| !line.is_empty())
        .collect();
    // reStructuredText's ``code`` is Markdown's `code`.
    super::paragraph(app, &lines).map(|text| text.replace("``", "`"))
}

/// Builds every app, or none (each with no path) when componentize-py is missing.
pub fn build_all(root: &Path, out_dir: &Path) -> Result<Vec<Guest>, String> {
    let apps = apps(root)?;
    let venv = venv(root);
    let tool = venv.join("bin/componentize-py");
    let required = std::env::var("IDEM_TEST_PYTHON").is_ok_and(|v| v == "required");
    let found = tool.is_file();
    if !found {
        if required {
            return Err(format!(
                "IDEM_TEST_PYTHON=required but {} is missing; scripts/test installs it",
                tool.display()
            ));
        }
        println!(
            "cargo:warning=componentize-py not found at {}: the Python guests are not built \
             and their tests will be SKIPPED (scripts/test installs it)",
            tool.display()
        );
    }
    let sdk = out_dir.join("python-sdk");
    if found {
        stage_sdk(root, &sdk)?;
    }
    let mut guests = Vec::new();
    for (dir, name) in apps {
        let summary = docstring_summary(&root.join(&dir).join("app.py"))?;
        let path = if found {
            // Built from a copy: componentize-py writes `__pycache__` next to the
            // sources it imports, which would touch the watched folders (and make cargo
            // run this script again) and litter the clone.
            let app = out_dir.join("python-apps").join(&name);
            let _ = std::fs::remove_dir_all(&app);
            copy_dir(&root.join(&dir), &app)?;
            Some(
                componentize(&tool, &app, &sdk, out_dir, &name)
                    .map_err(|e| format!("{dir}/: {e}"))?,
            )
        } else {
            None
        };
        guests.push(Guest {
            name,
            source: dir,
            summary,
            path,
        });
    }
    Ok(guests)
}

fn componentize(
    tool: &Path,
    app: &Path,
    sdk: &Path,
    out_dir: &Path,
    name: &str,
) -> Result<PathBuf, String> {
    let output = out_dir.join(format!("{name}.wasm"));
    let status = Command::new(tool)
        .arg("--quiet")
        .arg("componentize")
        .arg("app")
        .arg("-p")
        .arg(app)
        .arg("-p")
        .arg(sdk)
        .arg("-o")
        .arg(&output)
        // The venv's own site-packages would shadow the staged SDK with an
        // installed copy: only the staged one is on the path.
        .env_remove("VIRTUAL_ENV")
        .stdout(std::io::stderr())
        .status()
        .map_err(|err| format!("cannot run {}: {err}", tool.display()))?;
    if !status.success() {
        return Err(format!("componentize-py failed ({status})"));
    }
    Ok(output)
}

/// Copies the SDK package with `wit/` (a link in the repository) as real files.
fn stage_sdk(root: &Path, to: &Path) -> Result<(), String> {
    let _ = std::fs::remove_dir_all(to);
    let pkg = to.join("idem");
    copy_dir(&root.join("guest-sdk-python/src/idem"), &pkg)
}

fn copy_dir(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::create_dir_all(to).map_err(|e| format!("{}: {e}", to.display()))?;
    let entries = std::fs::read_dir(from).map_err(|e| format!("{}: {e}", from.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: {e}", from.display()))?;
        let name = entry.file_name();
        if name == "__pycache__" {
            continue;
        }
        let src = entry.path();
        // `metadata` follows the `wit` link.
        let meta = std::fs::metadata(&src).map_err(|e| format!("{}: {e}", src.display()))?;
        if meta.is_dir() {
            copy_dir(&src, &to.join(&name))?;
        } else {
            std::fs::copy(&src, to.join(&name)).map_err(|e| format!("{}: {e}", src.display()))?;
        }
    }
    Ok(())
}
