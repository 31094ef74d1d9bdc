//! Whether a cache directory is private: reachable only through directories that no one
//! but the user and root can change, and writable by the user alone.

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Component as PathComponent, Path, PathBuf};

use super::{CacheError, UnsafeDir};

/// How many symbolic links a cache path may go through, as the kernel's `ELOOP` limit.
pub(super) const MAX_LINKS: usize = 40;

/// How a walk over a cache path ended, short of success.
pub(super) enum Walk {
    /// A component does not exist (yet).
    Missing,
    Unsafe(UnsafeDir),
    Io(PathBuf, std::io::Error),
}

impl Walk {
    pub(super) fn into_error(self, dir: &Path) -> CacheError {
        let dir = dir.to_path_buf();
        match self {
            Walk::Unsafe(problem) => CacheError::Unsafe { dir, problem },
            Walk::Io(path, source) => CacheError::Io {
                dir,
                action: "inspect",
                path,
                source,
            },
            Walk::Missing => CacheError::Io {
                source: std::io::ErrorKind::NotFound.into(),
                action: "find",
                path: dir.clone(),
                dir,
            },
        }
    }
}

/// Checks that only `user` (and root) can change `dir` or anything in it: every directory
/// the kernel goes through to reach it, symbolic links followed by hand so that the
/// directories they lead through are checked too.
pub(super) fn check_private_dir(dir: &Path, user: u32) -> Result<(), Walk> {
    let mut resolved = PathBuf::from("/");
    check_ancestor(&resolved, user)?;
    // A stack: the next component is at the end.
    let mut pending = parts(dir);
    let mut links = 0;
    while let Some(part) = pending.pop() {
        let name = match part {
            Part::Root => {
                resolved = PathBuf::from("/");
                continue;
            }
            Part::Parent => {
                // `resolved` holds no links, so its parent is the real `..`.
                resolved.pop();
                continue;
            }
            Part::Name(name) => name,
        };
        let next = resolved.join(&name);
        let meta = match std::fs::symlink_metadata(&next) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Walk::Missing),
            Err(e) => return Err(Walk::Io(next, e)),
        };
        if meta.file_type().is_symlink() {
            if pending.is_empty() {
                return Err(Walk::Unsafe(UnsafeDir::SymbolicLink { path: next }));
            }
            links += 1;
            if links > MAX_LINKS {
                return Err(Walk::Unsafe(UnsafeDir::TooManyLinks { path: next }));
            }
            // The link itself can only be replaced through its directory, `resolved`,
            // which is checked already; the walk goes on through its target.
            let target = std::fs::read_link(&next).map_err(|e| Walk::Io(next.clone(), e))?;
            pending.extend(parts(&target));
            continue;
        }
        if !meta.is_dir() {
            return Err(Walk::Unsafe(UnsafeDir::NotADirectory { path: next }));
        }
        resolved = next;
        if pending.is_empty() {
            break;
        }
        check_ancestor(&resolved, user)?;
    }
    // `resolved` is now the cache directory itself (or an ancestor, for a path ending
    // in `..`, which is checked as strictly).
    check_own(&resolved, user)
}

/// One component of a path, as the walk follows it.
enum Part {
    Root,
    Parent,
    Name(OsString),
}

/// The components of `path` as a stack: the first component last.
fn parts(path: &Path) -> Vec<Part> {
    path.components()
        .filter_map(|c| match c {
            PathComponent::RootDir => Some(Part::Root),
            PathComponent::ParentDir => Some(Part::Parent),
            PathComponent::Normal(name) => Some(Part::Name(name.to_os_string())),
            PathComponent::CurDir | PathComponent::Prefix(_) => None,
        })
        .rev()
        .collect()
}

/// The cache directory itself: owned by `user`, and writable by no one else.
fn check_own(dir: &Path, user: u32) -> Result<(), Walk> {
    let meta = std::fs::symlink_metadata(dir).map_err(|e| Walk::Io(dir.to_path_buf(), e))?;
    if meta.uid() != user {
        return Err(Walk::Unsafe(UnsafeDir::Owner {
            path: dir.to_path_buf(),
            owner: meta.uid(),
            user,
        }));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(Walk::Unsafe(UnsafeDir::Writable {
            path: dir.to_path_buf(),
            mode: meta.mode() & 0o7777,
        }));
    }
    Ok(())
}

/// A directory above the cache: owned by root or `user`, and not writable by others
/// unless sticky (then others can add names but not rename or remove this user's).
fn check_ancestor(path: &Path, user: u32) -> Result<(), Walk> {
    let meta = std::fs::metadata(path).map_err(|e| Walk::Io(path.to_path_buf(), e))?;
    if meta.uid() != 0 && meta.uid() != user {
        return Err(Walk::Unsafe(UnsafeDir::AncestorOwner {
            path: path.to_path_buf(),
            owner: meta.uid(),
            user,
        }));
    }
    const STICKY: u32 = 0o1000;
    if meta.mode() & 0o022 != 0 && meta.mode() & STICKY == 0 {
        return Err(Walk::Unsafe(UnsafeDir::AncestorWritable {
            path: path.to_path_buf(),
            mode: meta.mode() & 0o7777,
        }));
    }
    Ok(())
}
