//! `idem --version` names the commit it was built from (cli/build.rs), and only the
//! version where it was built outside a git checkout.

use std::process::Command;

use crate::util::{run_cli, stderr, stdout};

#[test]
fn version_names_the_commit_it_was_built_from() {
    let out = run_cli(&["--version"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let head = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .map(|out| String::from_utf8(out.stdout).unwrap().trim().to_owned());
    let version = env!("CARGO_PKG_VERSION");
    let expected = match head {
        Some(commit) => format!("idem {version} ({commit})\n"),
        // Built from a source package: no checkout, no commit, and no stray text.
        None => format!("idem {version}\n"),
    };
    assert_eq!(stdout(&out), expected);
}
