//! A loaded agent's component bytes, for the store. Read when the agent was loaded, or,
//! when the component cache knew the file's digest and held its compiled code, read
//! from the open file only if asked: a start on a store that already holds the
//! component never asks, and so never reads the file (19 MB for a Python agent).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use super::cache::hex;
use super::error::HostError;

pub(crate) struct AgentBytes {
    /// Where the bytes are read from if they were not at load: the file the digest was
    /// known for, open since, so that it is the same file whatever its name now is.
    unread: Option<(File, PathBuf)>,
    digest: [u8; 32],
    bytes: OnceLock<Vec<u8>>,
}

impl AgentBytes {
    /// Bytes already read, whose SHA-256 is `digest`.
    pub(crate) fn read(bytes: Vec<u8>, digest: [u8; 32]) -> AgentBytes {
        AgentBytes {
            unread: None,
            digest,
            bytes: OnceLock::from(bytes),
        }
    }

    /// The bytes of `file` (found at `path`), known to hash to `digest`, not read yet.
    pub(crate) fn unread(file: File, path: PathBuf, digest: [u8; 32]) -> AgentBytes {
        AgentBytes {
            unread: Some((file, path)),
            digest,
            bytes: OnceLock::new(),
        }
    }

    /// The SHA-256 of the bytes.
    pub(crate) fn digest(&self) -> [u8; 32] {
        self.digest
    }

    /// The bytes, read now if they were not; an error if the file no longer hashes to
    /// the digest the agent was loaded as.
    pub(crate) fn get(&self) -> Result<&[u8], HostError> {
        if let Some(bytes) = self.bytes.get() {
            return Ok(bytes);
        }
        let Some((file, path)) = &self.unread else {
            // `read` sets the bytes; `unread` sets the file.
            return Err(HostError::Engine("agent bytes with no source".into()));
        };
        let failed = |source| HostError::ReadAgent {
            path: path.clone(),
            source,
        };
        let len = file.metadata().map_err(failed)?.len();
        let mut bytes = vec![
            0;
            usize::try_from(len)
                .map_err(std::io::Error::other)
                .map_err(failed)?
        ];
        // At an offset: no shared file position for two callers to race on.
        file.read_exact_at(&mut bytes, 0).map_err(failed)?;
        let digest: [u8; 32] = Sha256::digest(&bytes).into();
        if digest != self.digest {
            return Err(HostError::AgentChanged {
                path: path.clone(),
                digest: hex(&self.digest),
            });
        }
        Ok(self.bytes.get_or_init(|| bytes))
    }
}
