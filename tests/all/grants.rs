//! A `--dir` grant must not hand the agent idem's own files: one that contains the
//! store or the component cache (or lies inside the cache) is refused before anything
//! runs, symbolic links resolved, and the store is left as it was; nor may two grants
//! share one guest path.

use std::path::{Path, PathBuf};

use idem_test_artifacts::HOSTILE;
use sha2::{Digest, Sha256};

use crate::util::{run_cli_env, stderr};

const INPUT: &str = r#"{"mode":"spin","n":1}"#;

/// `root/` holding `state/idem.db`, `cache/` (the `--cache-dir`), `xdg/` (the
/// default cache's home), `data/` and `links/`.
struct Bed {
    dir: tempfile::TempDir,
}

impl Bed {
    fn new() -> Bed {
        let dir = tempfile::tempdir().unwrap();
        for sub in ["state", "data", "links", "xdg"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
        }
        Bed { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `idem run hostile --db DB --dir GRANT::/data --cache-dir cache`, with the default
    /// cache under `xdg/`.
    fn run(&self, db: &Path, grant: &Path) -> std::process::Output {
        let grant = format!("{}::/data", grant.display());
        let cache = self.path("cache");
        let args = vec![
            "run",
            HOSTILE,
            "--db",
            db.to_str().unwrap(),
            "--dir",
            &grant,
            "--input",
            INPUT,
            "--cache-dir",
            cache.to_str().unwrap(),
        ];
        run_cli_env(&args, &[("XDG_CACHE_HOME", self.path("xdg").as_os_str())])
    }
}

/// The digest of the store's bytes, its WAL folded in first.
fn store_digest(db: &Path) -> Vec<u8> {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    drop(conn);
    Sha256::digest(std::fs::read(db).unwrap()).to_vec()
}

#[test]
fn grants_over_the_store_or_the_cache_are_refused() {
    let bed = Bed::new();
    let db = bed.path("state/idem.db");
    let ok = bed.run(&db, &bed.path("data"));
    assert!(ok.status.success(), "a plain grant runs: {}", stderr(&ok));
    let digest = store_digest(&db);
    std::fs::create_dir(bed.path("cache/inside")).unwrap();
    std::os::unix::fs::symlink("../state", bed.path("links/to-state")).unwrap();
    std::os::unix::fs::symlink(bed.path("cache"), bed.path("links/to-cache")).unwrap();

    let cases = [
        ("state", "store"),
        ("", "store"),
        ("links/to-state", "store"),
        ("cache", "cache"),
        ("cache/inside", "cache"),
        ("links/to-cache", "cache"),
    ];
    for (grant, exposed) in cases {
        let grant = bed.path(grant);
        let out = bed.run(&db, &grant);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{grant:?}: {err}");
        assert!(
            err.contains(grant.to_str().unwrap()) && err.contains(exposed),
            "{grant:?}: the error names the grant and the {exposed}: {err}"
        );
        assert_eq!(store_digest(&db), digest, "{grant:?}: the store changed");

        // A store that does not exist yet is not created.
        let fresh = bed.path("state/fresh.db");
        let out = bed.run(&fresh, &grant);
        assert_eq!(out.status.code(), Some(2), "{grant:?}: {}", stderr(&out));
        assert!(!fresh.exists(), "{grant:?}: a store was created");
    }

    // The default cache holds the key that seals every entry: it is protected even in a
    // run that does not use it.
    let xdg = bed.path("xdg");
    let grant = format!("{}::/data", xdg.display());
    for extra in [&[][..], &["--no-cache"][..]] {
        let mut args = vec![
            "run",
            HOSTILE,
            "--db",
            db.to_str().unwrap(),
            "--input",
            INPUT,
        ];
        args.extend_from_slice(&["--dir", &grant]);
        args.extend_from_slice(extra);
        let out = run_cli_env(&args, &[("XDG_CACHE_HOME", xdg.as_os_str())]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert!(
            err.contains(xdg.to_str().unwrap()) && err.contains("cache"),
            "{extra:?}: {err}"
        );
        assert_eq!(store_digest(&db), digest, "{extra:?}: the store changed");
    }
}

/// Two directories granted under one guest path used to be accepted, the agent seeing
/// only one of them: `idem run`, `idem deploy` and `idem submit` refuse them, however
/// the guest path is spelled, before anything is written.
#[test]
fn two_grants_onto_one_guest_path_are_refused() {
    let bed = Bed::new();
    for sub in ["shared/a", "shared/b"] {
        std::fs::create_dir_all(bed.path(sub)).unwrap();
    }
    let db = bed.path("state/idem.db");
    let db = db.to_str().unwrap();
    let grant = |dir: &str, guest: &str| format!("{}::{guest}", bed.path(dir).display());
    let (a, b) = (grant("shared/a", "/data"), grant("shared/b", "data/"));
    let idem =
        |args: &[&str]| run_cli_env(args, &[("XDG_CACHE_HOME", bed.path("xdg").as_os_str())]);
    let refused = |out: std::process::Output| {
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains("guest path \"data/\"")
                && err.contains(bed.path("shared/a").to_str().unwrap())
                && err.contains(bed.path("shared/b").to_str().unwrap()),
            "the error names the guest path and both directories: {err}"
        );
    };

    let run = ["run", HOSTILE, "--db", db, "--input", INPUT];
    refused(idem(&[&run[..], &["--dir", &a, "--dir", &b]].concat()));
    let deploy = ["deploy", HOSTILE, "--db", db, "--name", "hostile"];
    refused(idem(&[&deploy[..], &["--dir", &a, "--dir", &b]].concat()));
    assert!(!bed.path("state/idem.db").exists(), "nothing was written");

    let whole = grant("shared", "/data");
    let deployed = idem(&[&deploy[..], &["--dir", &whole]].concat());
    assert!(deployed.status.success(), "{}", stderr(&deployed));
    let submit = ["submit", "hostile", "--db", db, "--input", INPUT];
    refused(idem(&[&submit[..], &["--dir", &a, "--dir", &b]].concat()));
    let status = idem(&["ls", "--db", db]);
    assert!(
        !crate::util::stdout(&status).contains("hostile-"),
        "no run was submitted: {}",
        crate::util::stdout(&status)
    );
    let one = idem(&[&submit[..], &["--dir", &a]].concat());
    assert!(
        one.status.success(),
        "one narrower grant fits: {}",
        stderr(&one)
    );
    let listed = crate::util::stdout(&idem(&["ls", "--db", db]));
    assert!(listed.contains("hostile-"), "{listed}");
}

/// A guest could leave a symbolic link on the host's disk that points outside its grant
/// (wasmtime refuses only absolute targets): nothing of the guest's own follows it, but
/// a host program that does goes where the guest chose. A target with a `..` component
/// is refused, so every link a guest makes resolves below the directory it sits in,
/// wherever it or its directories are later moved within the grant.
#[test]
fn guest_symlinks_stay_inside_their_grant() {
    let bed = Bed::new();
    let data = bed.path("data");
    let db = bed.path("state/idem.db");
    let grant = format!("{}::/data", data.display());
    let links = serde_json::json!({
        "mode": "symlink",
        "copy": [
            ["../state/idem.db", "up"],
            ["/etc/passwd", "absolute"],
            ["sub/../../state", "sneaky"],
            ["..", "parent"],
            ["inside.txt", "in"],
            ["sub/./deeper", "down"],
            [".", "self"],
        ],
    })
    .to_string();
    let out = run_cli_env(
        &[
            "run",
            HOSTILE,
            "--db",
            db.to_str().unwrap(),
            "--dir",
            &grant,
            "--input",
            &links,
            "--json",
        ],
        &[("XDG_CACHE_HOME", bed.path("xdg").as_os_str())],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        doc["output"], "not-permitted,not-permitted,not-permitted,not-permitted,ok,ok,ok",
        "{doc}"
    );
    for refused in ["up", "absolute", "sneaky", "parent"] {
        assert!(
            std::fs::symlink_metadata(data.join(refused)).is_err(),
            "{refused} was made"
        );
    }
    assert_eq!(
        std::fs::read_link(data.join("in")).unwrap(),
        Path::new("inside.txt")
    );
}
