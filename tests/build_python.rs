//! The Python guests: each app folder is built with `componentize-py` against the
//! Python SDK (`guest-sdk-python/src/idem`, staged with a real copy of `wit/`, since
//! componentize-py reads a package's WIT only from inside the package).
//!
//! componentize-py comes from the venv `scripts/test` makes (`IDEM_PYTHON_VENV`, by
//! default `target/py`). Without it each constant is empty and the Python tests print
//! `SKIPPED: Python ...`; with `IDEM_TEST_PYTHON=required` a missing venv fails the build.

use std::path::{Path, PathBuf};
use std::process::Command;

/// (app folder from the repo root, output name, constant suffix)
const APPS: &[(&str, &str, &str)] = &[
    ("tests/guests-python/steps", "py-steps", "PY_STEPS"),
    ("tests/guests-python/waiter", "py-waiter", "PY_WAITER"),
    ("examples/python-ledger", "py-ledger", "PY_LEDGER"),
];

pub fn watched(root: &Path) -> Vec<PathBuf> {
    let mut paths = vec![root.join("guest-sdk-python/src")];
    paths.extend(APPS.iter().map(|(dir, _, _)| root.join(dir)));
    println!("cargo:rerun-if-env-changed=IDEM_PYTHON_VENV");
    println!("cargo:rerun-if-env-changed=IDEM_TEST_PYTHON");
    paths
}

fn venv(root: &Path) -> PathBuf {
    std::env::var_os("IDEM_PYTHON_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/py"))
}

/// Builds every app, or none when componentize-py is missing. Returns the constants.
pub fn build_all(root: &Path, out_dir: &Path) -> Result<Vec<(String, String)>, String> {
    let venv = venv(root);
    let tool = venv.join("bin/componentize-py");
    let required = std::env::var("IDEM_TEST_PYTHON").is_ok_and(|v| v == "required");
    if !tool.is_file() {
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
        return Ok(APPS
            .iter()
            .map(|(_, _, c)| ((*c).to_owned(), String::new()))
            .collect());
    }
    let sdk = out_dir.join("python-sdk");
    stage_sdk(root, &sdk)?;
    let mut built = Vec::new();
    for (dir, name, constant) in APPS {
        let output = out_dir.join(format!("{name}.wasm"));
        let status = Command::new(&tool)
            .arg("--quiet")
            .arg("componentize")
            .arg("app")
            .arg("-p")
            .arg(root.join(dir))
            .arg("-p")
            .arg(&sdk)
            .arg("-o")
            .arg(&output)
            // The venv's own site-packages would shadow the staged SDK with an
            // installed copy: only the staged one is on the path.
            .env_remove("VIRTUAL_ENV")
            .stdout(std::io::stderr())
            .status()
            .map_err(|err| format!("cannot run {}: {err}", tool.display()))?;
        if !status.success() {
            return Err(format!("componentize-py failed on {dir}/ ({status})"));
        }
        let path = output
            .to_str()
            .ok_or_else(|| format!("{} is not UTF-8", output.display()))?;
        built.push(((*constant).to_owned(), path.to_owned()));
    }
    Ok(built)
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
