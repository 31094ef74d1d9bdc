//! A `--dir` grant must not hand the agent idem's own files: one that contains the
//! store or the component cache (or lies inside the cache) is refused before anything
//! runs, symbolic links resolved, and the store is left as it was.

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
