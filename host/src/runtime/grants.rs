//! Directory grants that would hand an agent idem's own files are refused: the store
//! whose records make side effects happen once, and the cache of native code idem runs.
//!
//! A grant is read-write, so an agent given a directory that contains the store could
//! rewrite its records (commit keys, change runs' pins), and one given the component
//! cache could read its key and plant sealed native code for the next run. Both are
//! checked on the paths the kernel would use: the grant and the protected paths with
//! symbolic links resolved.

use std::path::{Path, PathBuf};

use super::authority::DirGrant;
use super::error::{Exposes, GrantError, HostError};

/// A path idem keeps for itself, which no directory grant may expose.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Protected {
    /// The store's database file; SQLite keeps its `-wal` and `-shm` files beside it,
    /// so a grant that contains the file contains them too. It need not exist yet.
    Store(PathBuf),
    /// A component cache directory: its key and its entries. A grant may neither
    /// contain it nor lie inside it. It need not exist yet.
    Cache(PathBuf),
    /// The key file of a store encrypted at rest.
    Key(PathBuf),
}

/// Refuses any grant whose directory, symbolic links resolved, contains a protected path
/// or lies inside a protected cache. Call it before opening the store, so that a refused
/// run changes nothing; a grant that cannot be resolved is [`HostError::Grant`].
///
/// ```
/// use idem::runtime::{DirGrant, HostError, Protected, check_grants};
///
/// let dir = tempfile::tempdir()?;
/// let data = dir.path().join("data");
/// std::fs::create_dir(&data)?;
/// let protected = [
///     Protected::Store(dir.path().join("idem.db")),
///     Protected::Cache(dir.path().join("cache")),
/// ];
/// let grant = |host: &std::path::Path| DirGrant { host: host.to_path_buf(), guest: "/data".into() };
///
/// check_grants(&[grant(&data)], &protected)?;
/// let refused = check_grants(&[grant(dir.path())], &protected);
/// assert!(matches!(refused, Err(HostError::GrantRefused(_))));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn check_grants(grants: &[DirGrant], protected: &[Protected]) -> Result<(), HostError> {
    // Resolved as far as they exist: a deployment may name a directory that only its
    // workers have.
    let all: Vec<PathBuf> = grants.iter().map(|g| resolve(&g.host)).collect();
    for (i, (grant, resolved)) in grants.iter().zip(&all).enumerate() {
        // A grant inside another can be swapped, through the outer one, for a link to
        // anywhere, which the next instance would follow when it opens the inner grant
        // by its path: nested grants are refused.
        if let Some((outer, _)) = grants
            .iter()
            .zip(&all)
            .enumerate()
            .find(|(j, (_, other))| *j != i && resolved.starts_with(other))
            .map(|(_, pair)| pair)
        {
            return Err(HostError::Grant {
                host: grant.host.clone(),
                guest: grant.guest.clone(),
                reason: format!(
                    "it lies inside another granted directory, {}; grant one or the other \
                     (an agent could replace a nested grant through the outer one)",
                    outer.host.display()
                ),
            });
        }
        let resolved = resolved.clone();
        for path in protected {
            if let Some(exposes) = exposure(&resolved, path) {
                return Err(HostError::GrantRefused(GrantError {
                    host: grant.host.clone(),
                    guest: grant.guest.clone(),
                    resolved,
                    exposes,
                }));
            }
        }
    }
    Ok(())
}

/// What granting `grant` (resolved) would expose of `protected`, if anything.
fn exposure(grant: &Path, protected: &Protected) -> Option<Exposes> {
    // Named in full in the error, as the user's `cd` does not show in it.
    let shown = |path: &Path| std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    match protected {
        Protected::Store(db) | Protected::Key(db) => {
            // Both where the name is and, when it is a link, where the file is: the
            // link can be replaced through its directory, and the file written through
            // the target's.
            let lexical = db
                .parent()
                .map(|parent| resolve(parent).join(db.file_name().unwrap_or_default()))
                .unwrap_or_else(|| resolve(db));
            [lexical, resolve(db)]
                .iter()
                .any(|db| db.starts_with(grant))
                .then(|| match protected {
                    Protected::Key(_) => Exposes::Key(shown(db)),
                    _ => Exposes::Store(shown(db)),
                })
        }
        Protected::Cache(dir) => {
            let cache = resolve(dir);
            if cache.starts_with(grant) {
                Some(Exposes::ContainsCache(shown(dir)))
            } else if grant.starts_with(&cache) {
                Some(Exposes::InsideCache(shown(dir)))
            } else {
                None
            }
        }
    }
}

/// `path` made absolute with symbolic links resolved as far as it exists, dangling ones
/// included; the missing rest is appended as written, which is where it would be
/// created.
fn resolve(path: &Path) -> PathBuf {
    resolve_within(path, 0)
}

/// As many links as the kernel follows before `ELOOP`.
const MAX_LINKS: usize = 40;

fn resolve_within(path: &Path, links: usize) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut existing = absolute.as_path();
    let mut missing = Vec::new();
    loop {
        if let Ok(real) = std::fs::canonicalize(existing) {
            return missing
                .iter()
                .rev()
                .fold(real, |path, name| path.join(name));
        }
        let (Some(parent), Some(name)) = (existing.parent(), existing.file_name()) else {
            // A path ending in `..` below a missing directory: nothing of it exists to
            // resolve.
            return absolute;
        };
        // A dangling link: what is created through it lands at its target.
        if links < MAX_LINKS
            && let Ok(target) = std::fs::read_link(existing)
        {
            let through = missing
                .iter()
                .rev()
                .fold(parent.join(target), |path, name| path.join(name));
            return resolve_within(&through, links + 1);
        }
        missing.push(name);
        existing = parent;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(host: &Path) -> DirGrant {
        DirGrant {
            host: host.to_path_buf(),
            guest: "/g".to_string(),
        }
    }

    fn refused(grant_path: &Path, protected: &[Protected]) -> Option<Exposes> {
        match check_grants(&[grant(grant_path)], protected) {
            Ok(()) => None,
            Err(HostError::GrantRefused(e)) => Some(e.exposes),
            Err(e) => panic!("unexpected error: {e}"),
        }
    }

    #[test]
    fn grants_are_checked_with_links_resolved() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for sub in ["state", "cache/inside", "data", "real"] {
            std::fs::create_dir_all(root.join(sub)).unwrap();
        }
        let db = root.join("state/idem.db");
        let cache = root.join("cache");
        let protected = [
            Protected::Store(db.clone()),
            Protected::Cache(cache.clone()),
        ];
        std::os::unix::fs::symlink(root.join("state"), root.join("to-state")).unwrap();
        std::os::unix::fs::symlink("cache/inside", root.join("to-inside")).unwrap();

        assert_eq!(refused(&root.join("data"), &protected), None);
        assert_eq!(
            refused(&root.join("state"), &protected),
            Some(Exposes::Store(db.clone()))
        );
        assert_eq!(
            refused(&root.join("to-state"), &protected),
            Some(Exposes::Store(db.clone()))
        );
        assert_eq!(
            refused(&root.join("data/../state"), &protected),
            Some(Exposes::Store(db.clone()))
        );
        assert_eq!(refused(root, &protected), Some(Exposes::Store(db.clone())));
        assert_eq!(
            refused(&cache, &protected),
            Some(Exposes::ContainsCache(cache.clone()))
        );
        assert_eq!(
            refused(&root.join("to-inside"), &protected),
            Some(Exposes::InsideCache(cache.clone()))
        );

        // A store reached through a link is protected where the link is and where the
        // file is.
        let linked = root.join("data/linked.db");
        std::os::unix::fs::symlink(root.join("real/idem.db"), &linked).unwrap();
        let protected = [Protected::Store(linked.clone())];
        assert_eq!(
            refused(&root.join("real"), &protected),
            Some(Exposes::Store(linked.clone()))
        );
        assert_eq!(
            refused(&root.join("data"), &protected),
            Some(Exposes::Store(linked.clone()))
        );
        assert_eq!(refused(&root.join("state"), &protected), None);

        // A protected path that does not exist yet is protected where it would be.
        let protected = [Protected::Cache(root.join("data/new/cache"))];
        assert!(matches!(
            refused(&root.join("data"), &protected),
            Some(Exposes::ContainsCache(_))
        ));

        // A directory this machine lacks is checked where it would be (a deployment
        // may name one that only its workers have); opening it is the run's business.
        assert!(check_grants(&[grant(&root.join("missing"))], &[]).is_ok());
        let missing = [Protected::Store(db.clone())];
        assert_eq!(refused(&root.join("state/new"), &missing), None);

        // Nested grants are refused: the inner one could be swapped, through the outer
        // one, for a link to anywhere.
        let nested = check_grants(&[grant(&root.join("data")), grant(root)], &[]);
        assert!(
            matches!(&nested, Err(HostError::Grant { reason, .. }) if reason.contains("inside another")),
            "{nested:?}"
        );
        let twice = check_grants(&[grant(&root.join("data")), grant(&root.join("data"))], &[]);
        assert!(twice.is_err(), "the same directory granted twice nests too");
    }
}
