//! The commit `idem` was built from, for `idem --version`: read by `build.rs` (which
//! includes this file) with `git`, and `None` wherever there is no git or no checkout
//! (a source package such as the wheel's sdist), where the version stands alone.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A checkout's commit, and the files whose change means another commit.
pub struct Commit {
    /// `git rev-parse --short HEAD`.
    pub short: String,
    /// `HEAD`, the branch's ref file and `packed-refs`, those that exist: cargo reruns
    /// the build script when one changes (a missing one would make it rerun always).
    pub watch: Vec<PathBuf>,
}

/// The commit checked out at `dir`, asking the `git` program; `None` when `git` is
/// missing, fails, or `dir` is in no checkout.
pub fn of(git: &str, dir: &Path) -> Option<Commit> {
    let ask = |args: &[&str]| -> Option<String> {
        let out = Command::new(git)
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        let text = text.trim();
        (out.status.success() && !text.is_empty()).then(|| text.to_owned())
    };
    let short = ask(&["rev-parse", "--short", "HEAD"])?;
    if !short.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let absolute = |path: String| {
        let path = PathBuf::from(path);
        if path.is_absolute() {
            path
        } else {
            dir.join(path)
        }
    };
    let git_dir = absolute(ask(&["rev-parse", "--git-dir"])?);
    let common = absolute(ask(&["rev-parse", "--git-common-dir"])?);
    let mut watch = vec![git_dir.join("HEAD"), common.join("packed-refs")];
    // Detached, there is no branch: HEAD itself holds the commit.
    if let Some(branch) = ask(&["symbolic-ref", "-q", "HEAD"]) {
        watch.push(common.join(branch));
    }
    watch.retain(|path| path.is_file());
    Some(Commit { short, watch })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_checkout_or_no_git_gives_none() {
        let outside = tempfile::tempdir().unwrap();
        assert!(
            of("git", outside.path()).is_none(),
            "a temp dir is no checkout"
        );
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        assert!(of("/nonexistent/git", here).is_none());
    }

    #[test]
    fn a_checkout_gives_its_short_commit_and_files_to_watch() {
        let repo = tempfile::tempdir().unwrap();
        let git = |args: &[&str]| {
            let out = Command::new("git")
                .arg("-C")
                .arg(repo.path())
                .args(["-c", "user.name=t", "-c", "user.email=t@t"])
                .args(args)
                .output()
                .expect("git runs");
            assert!(out.status.success(), "git {args:?}: {out:?}");
            String::from_utf8(out.stdout).unwrap().trim().to_owned()
        };
        git(&["init", "-q", "-b", "main"]);
        git(&["commit", "-q", "--allow-empty", "-m", "one"]);
        let commit = of("git", repo.path()).expect("a checkout");
        assert_eq!(commit.short, git(&["rev-parse", "--short", "HEAD"]));
        let head = repo.path().join(".git/HEAD");
        let branch = repo.path().join(".git/refs/heads/main");
        assert_eq!(commit.watch, [head, branch]);
    }
}
