//! The on-disk cache of precompiled components, so that a second start does not
//! recompile — without ever running native code that idem did not seal itself.
//!
//! A cache entry is native code that idem maps executable, so it is trusted only when it
//! proves where it came from. Each entry is one file: the code, then a trailer naming
//! the component's SHA-256 and the engine (wasmtime's compatibility hash and idem's
//! version) with a keyed BLAKE3 MAC over the trailer's fields and the code
//! ([`entry`]). The key is 32 random bytes in the cache directory, readable by the user
//! alone. An entry that names another component or engine, or whose MAC fails, is never
//! deserialized: idem warns, recompiles, and rewrites it.
//!
//! A verified entry is not read into memory: the MAC is computed over the open file,
//! mapped, and wasmtime maps that same open file (through `/proc/self/fd`, so the same inode
//! whatever happens to the name meanwhile). Its contents cannot change in between
//! either: only the user can write the file or the directory (checked below), and whoever
//! runs as the user can read the key anyway.
//!
//! The MAC only helps while nobody else can read the key or replace the directory, so
//! that is enforced rather than assumed ([`ComponentCache::open`]): the directory is
//! created 0700, must be a real directory owned by the user and writable by nobody
//! else, and every directory above it must be owned by root or the user and not
//! writable by others unless sticky (as ssh's `StrictModes` checks `~/.ssh`). Entry
//! files are opened without following symbolic links and must be the user's own
//! regular files.
//!
//! The cache is bounded: after each entry it writes, entries beyond
//! [`DEFAULT_MAX_BYTES`] in all are deleted, least recently used first (a hit refreshes
//! its entry's modification time, at most once an hour).

use std::fs::{File, OpenOptions};
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use rustix::fs::{Mode, OFlags};
use wasmtime::Engine;
use wasmtime::component::Component;

use entry::Seal;
use mapped::Mapped;
use private_dir::{Walk, check_private_dir};

mod digests;
mod entry;
mod evict;
mod mapped;
mod private_dir;
#[cfg(test)]
mod tests;

/// Larger entries are not read: no component idem compiles comes near, and a file that
/// large in the cache was not written by idem.
const MAX_ENTRY_BYTES: u64 = 1 << 30;
/// The MAC key's file in the cache directory.
const KEY_FILE: &str = "key";
/// The entries a cache keeps in all before it evicts the least recently used: a few
/// dozen Python agents (about 40 MB of code each), thousands of Rust ones.
pub(crate) const DEFAULT_MAX_BYTES: u64 = 2 << 30;
/// A hit refreshes its entry's modification time (the eviction order) when it is older
/// than this: often enough for an order by use, rarely enough not to write the file's
/// metadata at every start.
const TOUCH_AFTER: Duration = Duration::from_secs(3600);

/// Why the component cache cannot be used. Returned by [`Runtime::new`] when it is given
/// a cache directory: a cache that others could write to is refused, not ignored.
///
/// [`Runtime::new`]: super::Runtime::new
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CacheError {
    /// Someone other than the user could change what the cache holds.
    #[error("component cache {dir} is not safe to use: {problem}")]
    Unsafe {
        /// The cache directory.
        dir: PathBuf,
        /// What is wrong, and where.
        problem: UnsafeDir,
    },
    /// The directory or its key could not be created or read.
    #[error("component cache {dir}: cannot {action} {}", path.display())]
    Io {
        /// The cache directory.
        dir: PathBuf,
        /// What idem was doing.
        action: &'static str,
        /// The file or directory it was doing it to.
        path: PathBuf,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
}

/// What makes a cache directory unsafe: each lets another user (or an agent running as
/// this one) put native code where idem would run it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UnsafeDir {
    /// The cache directory is a symbolic link, which whoever can write its parent could
    /// point elsewhere.
    #[error("{} is a symbolic link; use the directory it points to", path.display())]
    SymbolicLink {
        /// The link.
        path: PathBuf,
    },
    /// A component of the path is not a directory.
    #[error("{} is not a directory", path.display())]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// The cache directory belongs to someone else.
    #[error("{} is owned by uid {owner}, not by this user (uid {user})", path.display())]
    Owner {
        /// The directory.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// The effective user running idem.
        user: u32,
    },
    /// A directory above the cache belongs to someone other than root or the user, who
    /// could replace what is below it.
    #[error(
        "{} (above the cache) is owned by uid {owner}, neither root nor this user (uid \
         {user}), who could replace the cache directory",
        path.display()
    )]
    AncestorOwner {
        /// The directory.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// The effective user running idem.
        user: u32,
    },
    /// The cache directory is writable by its group or by everyone.
    #[error(
        "{} is writable by other users (mode {mode:04o}), who could plant code in it",
        path.display()
    )]
    Writable {
        /// The directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A directory above the cache is writable by others and not sticky.
    #[error(
        "{} (above the cache) is writable by other users (mode {mode:04o}) and not \
         sticky, so they could replace the cache directory",
        path.display()
    )]
    AncestorWritable {
        /// The directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The path goes through too many symbolic links to be followed.
    #[error("{} goes through more than {} symbolic links", path.display(), private_dir::MAX_LINKS)]
    TooManyLinks {
        /// Where the walk gave up.
        path: PathBuf,
    },
}

/// A directory of precompiled components for one engine configuration.
pub(crate) struct ComponentCache {
    dir: PathBuf,
    /// Binds entries to the engine that can load them; also names their files.
    engine_key: [u8; 32],
    mac_key: [u8; 32],
    user: u32,
    /// Entries beyond this many bytes in all are evicted after a store.
    max_bytes: u64,
    /// How old a component file's times must be for its digest to be remembered.
    settled_after: Duration,
}

impl std::fmt::Debug for ComponentCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the MAC key: whoever sees it can forge entries.
        f.debug_struct("ComponentCache")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// Feeds `Hash` implementations into BLAKE3, so the engine key does not depend on the
/// std hasher's algorithm.
struct Blake3Hasher(blake3::Hasher);

impl Hasher for Blake3Hasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    fn finish(&self) -> u64 {
        let hash = self.0.finalize();
        let mut first = [0; 8];
        first.copy_from_slice(&hash.as_bytes()[..8]);
        u64::from_le_bytes(first)
    }
}

/// Why an entry on disk was not used.
#[derive(Debug)]
enum Rejected {
    NotRegular,
    OwnedBy(u32),
    WritableByOthers(u32),
    TooLarge(u64),
    NotAnEntry,
    Format(u32),
    OtherComponent,
    OtherEngine,
    Length,
    Mac,
    Io(std::io::Error),
}

impl std::fmt::Display for Rejected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rejected::NotRegular => write!(f, "not a regular file (a symbolic link?)"),
            Rejected::OwnedBy(uid) => write!(f, "owned by uid {uid}, not this user"),
            Rejected::WritableByOthers(mode) => {
                write!(f, "writable by other users (mode {mode:04o})")
            }
            Rejected::TooLarge(len) => write!(f, "{len} bytes, too large to be an entry"),
            Rejected::NotAnEntry => write!(f, "not an idem cache entry"),
            Rejected::Format(v) => write!(f, "entry format {v}, not {}", entry::FORMAT),
            Rejected::OtherComponent => write!(f, "it holds another component's code"),
            Rejected::OtherEngine => write!(f, "it was compiled for another engine"),
            Rejected::Length => write!(f, "its length does not match its header"),
            Rejected::Mac => write!(f, "its MAC does not verify (forged or damaged)"),
            Rejected::Io(e) => write!(f, "{e}"),
        }
    }
}

impl ComponentCache {
    /// Opens (creating it if needed) the cache in `dir` for `engine`, after checking that
    /// no one but the user can change it, and reads (or creates) its key.
    pub(crate) fn open(dir: PathBuf, engine: &Engine) -> Result<ComponentCache, CacheError> {
        let user = rustix::process::geteuid().as_raw();
        let io = |action, path: &Path| {
            let dir = dir.clone();
            let path = path.to_path_buf();
            move |source| CacheError::Io {
                dir,
                action,
                path,
                source,
            }
        };
        let absolute = std::path::absolute(&dir).map_err(io("resolve", &dir))?;
        // Check what exists before creating anything, so that a refused cache is left
        // as it was; what idem creates is private from the start.
        match check_private_dir(&absolute, user) {
            Ok(()) => {}
            Err(Walk::Missing) => {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&absolute)
                    .map_err(io("create", &absolute))?;
                check_private_dir(&absolute, user).map_err(|walk| walk.into_error(&dir))?;
            }
            Err(walk) => return Err(walk.into_error(&dir)),
        }
        let mac_key = load_or_create_key(&absolute.join(KEY_FILE), user).map_err(
            |(action, path, source)| CacheError::Io {
                dir: dir.clone(),
                action,
                path,
                source,
            },
        )?;

        let mut hasher = Blake3Hasher(blake3::Hasher::new());
        engine.precompile_compatibility_hash().hash(&mut hasher);
        env!("CARGO_PKG_VERSION").hash(&mut hasher);
        Ok(ComponentCache {
            dir: absolute,
            engine_key: *hasher.0.finalize().as_bytes(),
            mac_key,
            user,
            max_bytes: DEFAULT_MAX_BYTES,
            settled_after: digests::SETTLED,
        })
    }

    fn entry_path(&self, digest: &[u8; 32]) -> PathBuf {
        self.dir.join(format!(
            "{}-{}.cwasm",
            hex(digest),
            hex(&self.engine_key[..8])
        ))
    }

    fn seal(&self) -> Seal<'_> {
        Seal {
            mac_key: &self.mac_key,
            engine_key: &self.engine_key,
        }
    }

    /// The cached component for `digest` (the component's SHA-256), if there is an entry
    /// that idem sealed for it and this engine.
    pub(crate) fn load(&self, engine: &Engine, digest: &[u8; 32]) -> Option<Component> {
        let path = self.entry_path(digest);
        let started = Instant::now();
        let untrusted = |why: Rejected| {
            tracing::warn!(path = %path.display(), reason = %why, "cached component not trusted; recompiling");
        };
        let file = match self.open_entry(&path) {
            Ok(Some(file)) => file,
            Ok(None) => return None,
            Err(why) => {
                untrusted(why);
                return None;
            }
        };
        let (loaded, code_len, verified) = match self.deserialize_verified(engine, &file, digest) {
            Ok(loaded) => loaded,
            Err(why) => {
                untrusted(why);
                return None;
            }
        };
        tracing::debug!(
            path = %path.display(),
            bytes = code_len,
            verify_us = verified.as_micros() as u64,
            deserialize_us = (started.elapsed() - verified).as_micros() as u64,
            "cached component loaded"
        );
        match loaded {
            Ok(component) => {
                touch(&file);
                Some(component)
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cached component unusable; recompiling");
                None
            }
        }
    }

    /// Verifies the entry open as `file` and deserializes the code it verified: mapped
    /// from that same open file where `/proc/self/fd` reaches it, else from the one copy
    /// read into memory. Also returns the code's length and the time spent verifying.
    fn deserialize_verified(
        &self,
        engine: &Engine,
        file: &File,
        digest: &[u8; 32],
    ) -> Result<(wasmtime::Result<Component>, usize, Duration), Rejected> {
        let started = Instant::now();
        if let Some(fd_path) = fd_path(file) {
            let mapped = Mapped::new(file).map_err(Rejected::Io)?;
            let code_len = self.seal().verify(mapped.bytes(), digest)?;
            drop(mapped);
            let verified = started.elapsed();
            // SAFETY: `fd_path` reopens the very file whose MAC was just verified, under
            // a key only this user can read, over a trailer naming this component and
            // this engine: `Component::serialize` of this engine wrote the code
            // (`store` below), and wasmtime reads only the ELF object at its start.
            // Nobody but the user can change the file, which idem never rewrites in
            // place (`write_new_private` renames a new file over it).
            #[allow(unsafe_code)]
            let loaded = unsafe { Component::deserialize_file(engine, &fd_path) };
            return Ok((loaded, code_len, verified));
        }
        let mut bytes = Vec::new();
        file.take(MAX_ENTRY_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(Rejected::Io)?;
        let code_len = self.seal().verify(&bytes, digest)?;
        let verified = started.elapsed();
        // SAFETY: as above, and the code is the very bytes whose MAC was verified.
        #[allow(unsafe_code)]
        let loaded = unsafe { Component::deserialize(engine, &bytes[..code_len]) };
        Ok((loaded, code_len, verified))
    }

    /// The entry file, opened through a descriptor that did not follow a symbolic link,
    /// if it is the user's own regular file; `None` when there is no entry.
    fn open_entry(&self, path: &Path) -> Result<Option<File>, Rejected> {
        // NONBLOCK: a FIFO planted under the entry's name must not hang the open.
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let file = match rustix::fs::open(path, flags, Mode::empty()) {
            Ok(fd) => File::from(fd),
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(rustix::io::Errno::LOOP) => return Err(Rejected::NotRegular),
            Err(e) => return Err(Rejected::Io(e.into())),
        };
        let meta = file.metadata().map_err(Rejected::Io)?;
        if !meta.file_type().is_file() {
            return Err(Rejected::NotRegular);
        }
        if meta.uid() != self.user {
            return Err(Rejected::OwnedBy(meta.uid()));
        }
        if meta.mode() & 0o022 != 0 {
            return Err(Rejected::WritableByOthers(meta.mode() & 0o7777));
        }
        if meta.len() > MAX_ENTRY_BYTES {
            return Err(Rejected::TooLarge(meta.len()));
        }
        Ok(Some(file))
    }

    /// Writes `component` to the cache, sealed, then evicts what exceeds the cache's
    /// bound. Failures are logged, never fatal: the cache is an optimisation.
    pub(crate) fn store(&self, digest: &[u8; 32], component: &Component) {
        if let Err(e) = self.try_store(digest, component) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "cannot cache the compiled component");
            return;
        }
        evict::evict(
            &self.dir,
            self.user,
            self.max_bytes,
            &self.entry_path(digest),
        );
    }

    fn try_store(&self, digest: &[u8; 32], component: &Component) -> Result<(), String> {
        let code = component.serialize().map_err(|e| e.to_string())?;
        let trailer = self.seal().trailer(digest, &code);
        let path = self.entry_path(digest);
        write_new_private(&path, &[&code, &trailer], true)
            .map_err(|e| format!("{}: {e}", path.display()))
    }
}

/// A path that opens the very file `file` is, wherever its name now points: Linux's
/// `/proc/self/fd/N`. `None` where there is no such directory.
fn fd_path(file: &File) -> Option<PathBuf> {
    use std::os::fd::AsRawFd;
    let dir = Path::new("/proc/self/fd");
    dir.is_dir().then(|| dir.join(file.as_raw_fd().to_string()))
}

/// Marks a hit as recent for eviction, unless it already is.
fn touch(file: &File) {
    let stale = file
        .metadata()
        .and_then(|m| m.modified())
        .ok()
        .and_then(|modified| SystemTime::now().duration_since(modified).ok())
        .is_some_and(|age| age > TOUCH_AFTER);
    if stale && let Err(e) = file.set_modified(SystemTime::now()) {
        tracing::debug!(error = %e, "cannot mark the cache entry as used");
    }
}

/// Writes `parts` to a fresh 0600 file beside `path`, then renames it over `path`
/// (`replace`) or links it there only if nothing is (`!replace`), so that a reader sees
/// a whole file or none, and never one that anyone else could have opened first.
fn write_new_private(path: &Path, parts: &[&[u8]], replace: bool) -> std::io::Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(
        ".{name}.{}-{:016x}.tmp",
        std::process::id(),
        fastrand::u64(..)
    ));
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        for part in parts {
            file.write_all(part)?;
        }
        if replace {
            std::fs::rename(&tmp, path)
        } else {
            std::fs::hard_link(&tmp, path)
        }
    })();
    // After a rename this finds nothing; after a link (or a failure) it drops the name
    // only idem knew.
    let _ = std::fs::remove_file(&tmp);
    written
}

/// The MAC key in `path`, created if missing; a key that others could have read, or
/// that is not the user's 32 bytes, is replaced by a fresh one.
fn load_or_create_key(
    path: &Path,
    user: u32,
) -> Result<[u8; 32], (&'static str, PathBuf, std::io::Error)> {
    let fail = |action| move |e| (action, path.to_path_buf(), e);
    // Two idem processes starting on an empty cache race here: one links its key in,
    // the other finds the name taken and reads the winner's on the next pass.
    for _ in 0..3 {
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let problem = match rustix::fs::open(path, flags, Mode::empty()) {
            Err(rustix::io::Errno::NOENT) => None,
            Err(rustix::io::Errno::LOOP) => Some("is a symbolic link".to_string()),
            Err(e) => return Err(fail("read")(e.into())),
            Ok(fd) => {
                let mut file = File::from(fd);
                let meta = file.metadata().map_err(fail("read"))?;
                let mut key = [0; 32];
                if !meta.file_type().is_file() {
                    Some("is not a regular file".to_string())
                } else if meta.uid() != user {
                    Some(format!("is owned by uid {}", meta.uid()))
                } else if meta.mode() & 0o077 != 0 {
                    Some(format!(
                        "was readable by other users (mode {:04o})",
                        meta.mode() & 0o7777
                    ))
                } else if meta.len() != 32 {
                    Some(format!("holds {} bytes, not 32", meta.len()))
                } else {
                    file.read_exact(&mut key).map_err(fail("read"))?;
                    return Ok(key);
                }
            }
        };
        let key = random_key().map_err(fail("create"))?;
        match problem {
            None => match write_new_private(path, &[&key], false) {
                Ok(()) => return Ok(key),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(fail("create")(e)),
            },
            Some(problem) => {
                // Entries sealed with the old key are recompiled as they are met.
                tracing::warn!(path = %path.display(), %problem, "cache key not trusted; replacing it");
                write_new_private(path, &[&key], true).map_err(fail("replace"))?;
                return Ok(key);
            }
        }
    }
    Err(fail("create")(std::io::Error::other(
        "it kept changing while idem read it",
    )))
}

fn random_key() -> std::io::Result<[u8; 32]> {
    let mut key = [0; 32];
    let mut filled = 0;
    while filled < key.len() {
        match rustix::rand::getrandom(&mut key[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(key)
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// The default cache directory: `$XDG_CACHE_HOME/idem`, else `$HOME/.cache/idem`.
pub fn default_cache_dir() -> Option<PathBuf> {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .map(|base| base.join("idem"))
}
