//! The layout of a cache entry: sealing one, and verifying one.
//!
//! An entry is the code `Component::serialize` wrote (an ELF object), then a trailer:
//! magic, format, the component's SHA-256, the engine key, the code's length, and a
//! keyed BLAKE3 MAC over those fields and the code. The code comes first so that the
//! verified file itself can be handed to wasmtime to map: its ELF starts at offset 0 and
//! wasmtime reads sections by their offsets, ignoring the trailer. Mapped, the code is
//! not copied, and a linear memory's initial image (12.7 MB of a componentize-py
//! agent's interpreter heap) is mapped copy-on-write from the file instead of being written into
//! a fresh memfd at every start.

use super::{MAX_ENTRY_BYTES, Rejected};

/// The first bytes of the trailer (and of every entry of format 1, whose header came
/// first).
pub(super) const MAGIC: [u8; 8] = *b"idem-cw\0";
/// The layout below; another number is a miss, never a parse attempt.
pub(super) const FORMAT: u32 = 2;
/// magic, format, component digest, engine key, code length.
pub(super) const FIELDS_LEN: usize = 8 + 4 + 32 + 32 + 8;
pub(super) const MAC_LEN: usize = 32;
pub(super) const TRAILER_LEN: usize = FIELDS_LEN + MAC_LEN;
/// Code at least this long is hashed on all cores: BLAKE3 is a tree, and a Python
/// agent's 40 MB of code took ~10 ms on one.
const PARALLEL_FROM: usize = 1 << 20;

/// The keys an entry is sealed with and checked against.
pub(super) struct Seal<'a> {
    pub(super) mac_key: &'a [u8; 32],
    pub(super) engine_key: &'a [u8; 32],
}

impl Seal<'_> {
    fn fields(&self, digest: &[u8; 32], code_len: u64) -> [u8; FIELDS_LEN] {
        let mut fields = [0; FIELDS_LEN];
        let parts: [&[u8]; 5] = [
            &MAGIC,
            &FORMAT.to_le_bytes(),
            digest,
            self.engine_key,
            &code_len.to_le_bytes(),
        ];
        let mut at = 0;
        for part in parts {
            fields[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        fields
    }

    /// The trailer that seals `code` as component `digest`'s for this engine.
    pub(super) fn trailer(&self, digest: &[u8; 32], code: &[u8]) -> [u8; TRAILER_LEN] {
        let fields = self.fields(digest, code.len() as u64);
        let mut mac = blake3::Hasher::new_keyed(self.mac_key);
        mac.update(&fields);
        mac.update(code);
        let mut trailer = [0; TRAILER_LEN];
        trailer[..FIELDS_LEN].copy_from_slice(&fields);
        trailer[FIELDS_LEN..].copy_from_slice(mac.finalize().as_bytes());
        trailer
    }

    /// The length of the code at the start of `entry`, if its trailer names `digest`
    /// and this engine and its MAC verifies.
    pub(super) fn verify(&self, entry: &[u8], digest: &[u8; 32]) -> Result<usize, Rejected> {
        let len = entry.len() as u64;
        if len > MAX_ENTRY_BYTES {
            return Err(Rejected::TooLarge(len));
        }
        let code_len = entry
            .len()
            .checked_sub(TRAILER_LEN)
            .ok_or(Rejected::NotAnEntry)?;
        let (code, trailer) = entry.split_at(code_len);
        let (fields, mac) = trailer.split_at(FIELDS_LEN);
        let (magic, rest) = fields.split_at(MAGIC.len());
        if magic != MAGIC {
            return Err(older_format(entry).unwrap_or(Rejected::NotAnEntry));
        }
        let (format, rest) = rest.split_at(4);
        let format = u32::from_le_bytes([format[0], format[1], format[2], format[3]]);
        if format != FORMAT {
            return Err(Rejected::Format(format));
        }

        // The MAC first: fields of an unauthenticated trailer say nothing.
        let mut hasher = blake3::Hasher::new_keyed(self.mac_key);
        hasher.update(fields);
        if code.len() >= PARALLEL_FROM {
            hasher.update_rayon(code);
        } else {
            hasher.update(code);
        }
        let mut expected = [0; MAC_LEN];
        expected.copy_from_slice(mac);
        // `Hash`'s `==` compares in constant time.
        if hasher.finalize() != expected {
            return Err(Rejected::Mac);
        }

        let (named, rest) = rest.split_at(32);
        if named != digest {
            return Err(Rejected::OtherComponent);
        }
        let (engine, length) = rest.split_at(32);
        if engine != self.engine_key {
            return Err(Rejected::OtherEngine);
        }
        let mut sealed_len = [0; 8];
        sealed_len.copy_from_slice(length);
        if u64::from_le_bytes(sealed_len) != code_len as u64 {
            return Err(Rejected::Length);
        }
        Ok(code_len)
    }
}

/// The format of an entry written before the trailer moved to the end (format 1 had
/// the same magic, then its format, at the start), so that an upgrade says why it
/// recompiles instead of calling the old entry foreign.
fn older_format(entry: &[u8]) -> Option<Rejected> {
    let head = entry.get(..12)?;
    (head[..8] == MAGIC)
        .then(|| Rejected::Format(u32::from_le_bytes([head[8], head[9], head[10], head[11]])))
}
