//! The on-disk cache of precompiled components, so that a second start does not
//! recompile.
//!
//! An entry is keyed by the component's digest and by the engine's compatibility hash
//! (wasmtime version, target and every config knob that changes code, fuel included): a
//! `.cwasm` loads only into an engine configured as the one that wrote it. Each entry has
//! a `.sha256` sidecar so a truncated or damaged file is detected and recompiled rather
//! than handed to `Component::deserialize`.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// A directory of precompiled components for one engine configuration.
#[derive(Debug, Clone)]
pub(crate) struct ComponentCache {
    dir: PathBuf,
    engine_key: String,
}

impl ComponentCache {
    pub(crate) fn new(dir: PathBuf, engine: &Engine) -> Self {
        // DefaultHasher::new() is keyed with constants, so the value is stable for one
        // build of idem; a different build may pick other names, which only costs a
        // recompile.
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        env!("CARGO_PKG_VERSION").hash(&mut hasher);
        ComponentCache {
            dir,
            engine_key: format!("{:016x}", hasher.finish()),
        }
    }

    fn entry(&self, digest: &str) -> (PathBuf, PathBuf) {
        let stem = format!("{digest}-{}", self.engine_key);
        (
            self.dir.join(format!("{stem}.cwasm")),
            self.dir.join(format!("{stem}.sha256")),
        )
    }

    /// The cached component for `digest`, if there is a sound entry.
    pub(crate) fn load(&self, engine: &Engine, digest: &str) -> Option<Component> {
        let (artifact, sidecar) = self.entry(digest);
        let bytes = std::fs::read(&artifact).ok()?;
        let expected = std::fs::read_to_string(&sidecar).ok()?;
        if hex(&Sha256::digest(&bytes)) != expected.trim() {
            tracing::warn!(path = %artifact.display(), "cached component is damaged; recompiling");
            return None;
        }
        // SAFETY: the bytes were written by `store` below from `Component::serialize` of
        // an engine with the same compatibility hash, and the sidecar digest shows they
        // are unchanged since. The cache directory must be writable only by the user
        // running idem (like any cache of native code).
        #[allow(unsafe_code)]
        let loaded = unsafe { Component::deserialize(engine, &bytes) };
        match loaded {
            Ok(component) => Some(component),
            Err(e) => {
                tracing::warn!(path = %artifact.display(), error = %e, "cached component unusable; recompiling");
                None
            }
        }
    }

    /// Writes `component` to the cache. Failures are logged, never fatal: the cache is
    /// an optimisation.
    pub(crate) fn store(&self, digest: &str, component: &Component) {
        if let Err(e) = self.try_store(digest, component) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "cannot cache the compiled component");
        }
    }

    fn try_store(&self, digest: &str, component: &Component) -> Result<(), String> {
        let bytes = component.serialize().map_err(|e| e.to_string())?;
        std::fs::create_dir_all(&self.dir).map_err(|e| e.to_string())?;
        let (artifact, sidecar) = self.entry(digest);
        write_atomically(&artifact, &bytes)?;
        write_atomically(&sidecar, hex(&Sha256::digest(&bytes)).as_bytes())
    }
}

/// Writes through a temporary file and a rename, so that a concurrent reader sees the
/// old entry or the new one, never half of one.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
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
