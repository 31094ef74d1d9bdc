//! Encryption at rest: the payloads a store keeps, sealed with a key only idem's
//! processes hold, so that the database's files, rows, backups and WAL hold none of
//! them in clear.
//!
//! # What is sealed
//! Every value an agent or a user supplies: runs' inputs and authorities (grants,
//! environment values among them), deployments' authorities, step results, checkpoints,
//! outputs and error texts, signal payloads, schedules' inputs, and agents' logs. Left
//! in clear so that an operator (or a DBA) can still see what runs: keys, run ids,
//! names, digests, statuses, counts, tokens, times, the reasons the host itself writes
//! (a parked key's reason, a worker's note) and the components' code.
//!
//! # How
//! Envelope encryption, as KMS-backed stores do it: a random **data key** seals the
//! values; the operator's **store key** (32 bytes, [`StoreKey`]) only wraps the data
//! key, which the store keeps wrapped ([`DataKeyRecord`]). Rotating the store key
//! (`idem rekey`, [`rewrap`]) rewraps the data key and rewrites no value: committed
//! results never change once written (the PostgreSQL backend's triggers say so), and a
//! rotation should not rewrite a whole store.
//!
//! Values are sealed with AES-SIV (RFC 5297, `aes-siv`), a deterministic AEAD: equal
//! values sealed under one data key are equal, which is what lets the store keep
//! comparing inputs (an idempotent resubmit, a replayed spawn) and authorities in SQL.
//! It leaks exactly that equality and each value's length, nothing else. A sealed value
//! is [`MAGIC`], the data key's id (4 bytes, big-endian), then SIV's 16-byte tag and
//! the ciphertext; the first 8 bytes are authenticated with it. Values the store itself
//! writes in clear never start with [`MAGIC`]'s zero byte, and no value a guest writes
//! reaches the database unsealed, so "sealed" is read off the value.
//!
//! # Not protected
//! A thief of the database alone learns nothing of the sealed values. Someone who can
//! write to the database can still delete rows, or move a sealed value from one row
//! to another of the same store (a value is not bound to its row); someone with the
//! store key and the database reads everything; a running idem holds the data key in
//! memory. The key file is the operator's to guard.

use std::borrow::Cow;
use std::sync::Arc;

use aes_siv::siv::Aes256Siv;
use aes_siv::{Key, KeyInit};
use sha2::{Digest, Sha256, Sha512};

use super::{Millis, Store, StoreError, ValueStore};

/// The first bytes of every sealed value: a zero byte (no JSON, text or reason the
/// store writes starts with one), `IS`, and the format's version.
pub const MAGIC: [u8; 4] = [0x00, b'I', b'S', 0x01];

/// Bytes a sealed value has beyond its clear one: the header and SIV's tag.
pub const OVERHEAD: usize = HEADER + 16;

const HEADER: usize = MAGIC.len() + 4;

/// The store key: 32 bytes that wrap the store's data key. Written as 64 hex digits
/// (`openssl rand -hex 32`), in a key file or an environment variable.
#[derive(Clone)]
pub struct StoreKey {
    bytes: [u8; 32],
}

impl std::fmt::Debug for StoreKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StoreKey({})", self.id())
    }
}

impl StoreKey {
    /// The key written as 64 hex digits; whitespace around them (a key file's newline)
    /// is ignored.
    ///
    /// ```
    /// use idem::store::StoreKey;
    ///
    /// let key = StoreKey::from_hex(&"ab".repeat(32)).unwrap();
    /// assert_eq!(key.id().len(), 16);
    /// assert!(StoreKey::from_hex("abc").is_err());
    /// ```
    pub fn from_hex(text: &str) -> Result<StoreKey, SealError> {
        let text = text.trim();
        let bad = |reason: &str| SealError::BadKey {
            reason: reason.to_owned(),
        };
        if text.len() != 64 {
            return Err(bad(&format!(
                "a store key is 64 hex digits (32 bytes, `openssl rand -hex 32`); this one \
                 has {} characters",
                text.chars().count()
            )));
        }
        let mut bytes = [0u8; 32];
        for (i, byte) in bytes.iter_mut().enumerate() {
            let pair = text
                .get(2 * i..2 * i + 2)
                .ok_or_else(|| bad("a store key is 64 hex digits, with no other characters"))?;
            *byte = u8::from_str_radix(pair, 16)
                .map_err(|_| bad("a store key is 64 hex digits (0-9, a-f), with no others"))?;
        }
        Ok(StoreKey { bytes })
    }

    /// A new random key.
    pub fn generate() -> Result<StoreKey, SealError> {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).map_err(|e| SealError::Random(e.to_string()))?;
        Ok(StoreKey { bytes })
    }

    /// The key as 64 hex digits.
    pub fn to_hex(&self) -> String {
        self.bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The key's id: 16 hex digits of a hash of it, kept with the data key it wraps so
    /// that a wrong key is named as such. It tells nothing of the key.
    pub fn id(&self) -> String {
        let hash = Sha256::new()
            .chain_update(b"idem store key id\0")
            .chain_update(self.bytes)
            .finalize();
        hash[..8].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The SIV key that wraps data keys, derived from the store key (SIV takes 64 bytes).
    fn wrapping(&self) -> Aes256Siv {
        let derived = Sha512::new()
            .chain_update(b"idem store key wrap\0")
            .chain_update(self.bytes)
            .finalize();
        // SHA-512's 64 bytes are exactly AES-256-SIV's key.
        Aes256Siv::new(&derived)
    }
}

/// A data key as the store keeps it: wrapped by a store key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataKeyRecord {
    /// Its id, written into every value it seals.
    pub id: u32,
    /// The id ([`StoreKey::id`]) of the store key that wraps it.
    pub key_id: String,
    /// The data key, sealed by that store key.
    pub wrapped: Vec<u8>,
    /// When it was made.
    pub created: Millis,
}

/// Why a store's sealing could not be set up, or a sealed value not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SealError {
    /// The key text is not a store key.
    #[error("not a store key: {reason}")]
    BadKey {
        /// What is wrong with it.
        reason: String,
    },
    /// The store is sealed by another key.
    #[error(
        "the store key given (id {given}) is not this store's (id {store}); nothing was \
         read or changed"
    )]
    WrongKey {
        /// The id of the key given.
        given: String,
        /// The id of the key that wraps the store's data key.
        store: String,
    },
    /// The store is sealed and no key was given.
    #[error(
        "this store is encrypted at rest (store key id {store}): give its key \
         (`--key-file`, or IDEM_STORE_KEY)"
    )]
    NoKey {
        /// The id of the key that wraps the store's data key.
        store: String,
    },
    /// A key was given for a store that is not sealed and cannot become so.
    #[error(
        "this store is not encrypted at rest and already holds {holds}: encryption is \
         chosen when a store is created (use a new store, or give no key)"
    )]
    NotEmpty {
        /// What it holds, in words.
        holds: String,
    },
    /// A key was given for a store that is not sealed, opened for reading only.
    #[error("this store is not encrypted at rest, and a key was given (opened read-only)")]
    NotSealed,
    /// A wrapped data key or a sealed value does not open: damaged, or not of this
    /// store.
    #[error("a sealed {what} does not open with this store's keys (damaged, or not this store's)")]
    Unreadable {
        /// What it is: `data key`, `value`.
        what: &'static str,
    },
    /// A sealed value names a data key the store does not have.
    #[error("a sealed value names data key {id}, which this store does not have")]
    UnknownDataKey {
        /// The id it names.
        id: u32,
    },
    /// The store key changed while a rotation read it (another `idem rekey`).
    #[error("the store key was rotated by another process meanwhile; nothing was changed")]
    Rotated,
    /// The operating system gave no random bytes.
    #[error("no random bytes for a new key: {0}")]
    Random(String),
    /// The cipher refused to seal a value (it refuses only what idem never asks).
    #[error("the cipher refused to seal a {what}")]
    Cipher {
        /// What it is: `data key`, `value`.
        what: &'static str,
    },
}

/// Seals and opens values with the store's data keys; shared by the
/// [`ValueStore`](crate::store::ValueStore) and the backends (which read inputs' concurrency keys and seal logs'
/// chunks themselves).
pub struct Sealer {
    /// The data key that seals new values, and its id.
    current: (u32, DataKey),
    /// Every data key, by id (a store has one today; ids are there so that a new one
    /// can come without rewriting values).
    keys: Vec<(u32, DataKey)>,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer")
            .field("current", &self.current.0)
            .finish_non_exhaustive()
    }
}

impl Sealer {
    /// The data keys `records` hold, unwrapped by `key`.
    pub fn unwrap(key: &StoreKey, records: &[DataKeyRecord]) -> Result<Sealer, SealError> {
        let given = key.id();
        let mut keys = Vec::with_capacity(records.len());
        for record in records {
            if record.key_id != given {
                return Err(SealError::WrongKey {
                    given,
                    store: record.key_id.clone(),
                });
            }
            let opened = key
                .wrapping()
                .decrypt(wrap_headers(record.id), &record.wrapped)
                .map_err(|_| SealError::Unreadable { what: "data key" })?;
            if opened.len() != DATA_KEY_LEN {
                return Err(SealError::Unreadable { what: "data key" });
            }
            keys.push((record.id, DataKey::clone_from_slice(&opened)));
        }
        let current = keys
            .iter()
            .max_by_key(|(id, _)| *id)
            .cloned()
            .ok_or(SealError::Unreadable { what: "data key" })?;
        Ok(Sealer { current, keys })
    }

    /// A new data key with id `id`, and its record wrapped by `key`.
    pub fn generate(
        key: &StoreKey,
        id: u32,
        now: Millis,
    ) -> Result<(Sealer, DataKeyRecord), SealError> {
        let mut dek = DataKey::default();
        getrandom::fill(dek.as_mut_slice()).map_err(|e| SealError::Random(e.to_string()))?;
        let record = wrap(key, id, &dek, now)?;
        let sealer = Sealer {
            current: (id, dek),
            keys: vec![(id, dek)],
        };
        Ok((sealer, record))
    }

    /// The data keys wrapped by `key` instead (a rotation of the store key).
    pub fn rewrap(&self, key: &StoreKey, now: Millis) -> Result<Vec<DataKeyRecord>, SealError> {
        self.keys
            .iter()
            .map(|(id, dek)| wrap(key, *id, dek, now))
            .collect()
    }

    /// `value` sealed with the current data key.
    pub fn seal(&self, value: &[u8]) -> Result<Vec<u8>, SealError> {
        let (id, dek) = &self.current;
        let mut header = [0u8; HEADER];
        header[..MAGIC.len()].copy_from_slice(&MAGIC);
        header[MAGIC.len()..].copy_from_slice(&id.to_be_bytes());
        let sealed = Aes256Siv::new(dek)
            .encrypt([&header[..]], value)
            .map_err(|_| SealError::Cipher { what: "value" })?;
        let mut out = Vec::with_capacity(HEADER + sealed.len());
        out.extend_from_slice(&header);
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    /// `stored` opened: the value it seals, or `stored` itself when it is not sealed
    /// (what the store writes in clear: a parked key's reason, say).
    pub fn open<'a>(&self, stored: &'a [u8]) -> Result<Cow<'a, [u8]>, SealError> {
        if !is_sealed(stored) {
            return Ok(Cow::Borrowed(stored));
        }
        let (header, sealed) = stored.split_at(HEADER);
        let id = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
        let dek = self.dek(id).ok_or(SealError::UnknownDataKey { id })?;
        Aes256Siv::new(dek)
            .decrypt([header], sealed)
            .map(Cow::Owned)
            .map_err(|_| SealError::Unreadable { what: "value" })
    }

    /// [`Sealer::open`] into an owned value.
    pub fn open_vec(&self, stored: Vec<u8>) -> Result<Vec<u8>, SealError> {
        if !is_sealed(&stored) {
            return Ok(stored);
        }
        self.open(&stored).map(Cow::into_owned)
    }

    fn dek(&self, id: u32) -> Option<&DataKey> {
        self.keys.iter().find(|(k, _)| *k == id).map(|(_, dek)| dek)
    }
}

/// Whether `stored` is a sealed value (starts with [`MAGIC`] and is long enough).
pub fn is_sealed(stored: &[u8]) -> bool {
    stored.len() >= OVERHEAD && stored.starts_with(&MAGIC)
}

/// How a backend keeps the payloads it handles itself (logs' chunks, and inputs it
/// reads a concurrency key from): sealed with the store's [`Sealer`], or as they are
/// in a store that is not sealed.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Payloads<'a>(pub(crate) Option<&'a Sealer>);

impl Payloads<'_> {
    /// `stored` opened.
    pub(crate) fn open<'v>(&self, stored: &'v [u8]) -> Result<Cow<'v, [u8]>, StoreError> {
        match self.0 {
            Some(sealer) => Ok(sealer.open(stored)?),
            None => Ok(Cow::Borrowed(stored)),
        }
    }

    /// `value` as the store keeps it.
    pub(crate) fn seal<'v>(&self, value: &'v [u8]) -> Result<Cow<'v, [u8]>, StoreError> {
        match self.0 {
            Some(sealer) => Ok(Cow::Owned(sealer.seal(value)?)),
            None => Ok(Cow::Borrowed(value)),
        }
    }

    /// Bytes a kept value has beyond the value.
    pub(crate) fn overhead(&self) -> usize {
        if self.0.is_some() { OVERHEAD } else { 0 }
    }
}

/// A data key: AES-256-SIV's 64 bytes.
type DataKey = Key<Aes256Siv>;

const DATA_KEY_LEN: usize = 64;

fn wrap_headers(id: u32) -> [Vec<u8>; 2] {
    [b"idem data key".to_vec(), id.to_be_bytes().to_vec()]
}

fn wrap(key: &StoreKey, id: u32, dek: &DataKey, now: Millis) -> Result<DataKeyRecord, SealError> {
    let wrapped = key
        .wrapping()
        .encrypt(wrap_headers(id), dek)
        .map_err(|_| SealError::Cipher { what: "data key" })?;
    Ok(DataKeyRecord {
        id,
        key_id: key.id(),
        wrapped,
        created: now,
    })
}

/// The store at hand as its callers should see it: `store` wrapped in a
/// [`ValueStore`](crate::store::ValueStore), which seals its values when it is sealed
/// (or becomes so: a key given for a new, empty store makes its data key).
/// `read_only` stores are never changed.
pub(crate) async fn seal_store(
    store: Arc<dyn Store>,
    key: Option<&StoreKey>,
    read_only: bool,
) -> Result<Arc<dyn Store>, StoreError> {
    let records = store.data_keys().await?;
    let sealer = match (key, records.first()) {
        (None, None) => return Ok(Arc::new(ValueStore::new(store, None))),
        (None, Some(record)) => {
            return Err(SealError::NoKey {
                store: record.key_id.clone(),
            }
            .into());
        }
        (Some(key), Some(_)) => Sealer::unwrap(key, &records)?,
        (Some(key), None) => {
            if let Some(holds) = holdings(store.as_ref()).await? {
                return Err(SealError::NotEmpty { holds }.into());
            }
            if read_only {
                return Err(SealError::NotSealed.into());
            }
            let now = store.now().await?;
            let (_, record) = Sealer::generate(key, 1, now)?;
            // Two processes may make a new store's key at once: one record wins, and
            // both seal with it.
            store.put_data_key(&record).await?;
            Sealer::unwrap(key, &store.data_keys().await?)?
        }
    };
    let sealer = Arc::new(sealer);
    store.use_sealer(Arc::clone(&sealer));
    Ok(Arc::new(ValueStore::new(store, Some(sealer))))
}

/// What a clear store holds that sealing would leave in clear, if anything.
async fn holdings(store: &dyn Store) -> Result<Option<String>, StoreError> {
    let runs = store
        .runs(&super::RunFilter {
            limit: Some(1),
            ..super::RunFilter::default()
        })
        .await?;
    if !runs.is_empty() {
        return Ok(Some("runs".to_owned()));
    }
    if !store.deployments().await?.is_empty() {
        return Ok(Some("deployments".to_owned()));
    }
    if !store.schedules().await?.is_empty() {
        return Ok(Some("schedules".to_owned()));
    }
    Ok(None)
}

/// Rotates the store key of the store at hand from `old` to `new`: its data keys
/// rewrapped, in one transaction that fails with [`SealError::Rotated`] if another
/// rotation came first. Values are not rewritten; processes already running keep
/// their data keys, and new ones need `new`.
pub async fn rewrap(
    store: &dyn Store,
    old: &StoreKey,
    new: &StoreKey,
) -> Result<RekeyReport, StoreError> {
    let records = store.data_keys().await?;
    if records.is_empty() {
        return Err(SealError::NotSealed.into());
    }
    let sealer = Sealer::unwrap(old, &records)?;
    let now = store.now().await?;
    let rewrapped = sealer.rewrap(new, now)?;
    store.rewrap_data_keys(&old.id(), &rewrapped).await?;
    Ok(RekeyReport {
        from: old.id(),
        to: new.id(),
        data_keys: rewrapped.len(),
    })
}

/// What [`rewrap`] did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RekeyReport {
    /// The id of the store key before.
    pub from: String,
    /// The id of the store key now.
    pub to: String,
    /// How many data keys were rewrapped.
    pub data_keys: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> StoreKey {
        StoreKey { bytes: [byte; 32] }
    }

    #[test]
    fn sealed_values_open_and_are_deterministic() {
        let (sealer, record) = Sealer::generate(&key(1), 1, 0).unwrap();
        for value in [&b""[..], b"x", b"{\"marker\":\"secret\"}", &[0u8; 5000]] {
            let sealed = sealer.seal(value).unwrap();
            assert!(is_sealed(&sealed));
            assert_eq!(sealed.len(), value.len() + OVERHEAD);
            assert_eq!(
                sealer.seal(value).unwrap(),
                sealed,
                "equal values seal equal"
            );
            assert_eq!(&*sealer.open(&sealed).unwrap(), value);
            if value.len() > 4 {
                assert!(!sealed.windows(value.len()).any(|w| w == value));
            }
        }
        // The same data key unwrapped again opens what the first sealed.
        let again = Sealer::unwrap(&key(1), &[record]).unwrap();
        assert_eq!(&*again.open(&sealer.seal(b"abc").unwrap()).unwrap(), b"abc");
    }

    #[test]
    fn clear_values_pass_and_damaged_ones_do_not_open() {
        let (sealer, _) = Sealer::generate(&key(1), 1, 0).unwrap();
        assert_eq!(&*sealer.open(b"parked: reason").unwrap(), b"parked: reason");
        let mut sealed = sealer.seal(b"value").unwrap();
        let last = sealed.len() - 1;
        sealed[last] ^= 1;
        assert_eq!(
            sealer.open(&sealed),
            Err(SealError::Unreadable { what: "value" })
        );
        let mut other_id = sealer.seal(b"value").unwrap();
        other_id[MAGIC.len() + 3] = 9;
        assert_eq!(
            sealer.open(&other_id),
            Err(SealError::UnknownDataKey { id: 9 })
        );
        let (stranger, _) = Sealer::generate(&key(2), 1, 0).unwrap();
        assert_eq!(
            stranger.open(&sealer.seal(b"value").unwrap()),
            Err(SealError::Unreadable { what: "value" })
        );
    }

    #[test]
    fn a_wrong_key_is_named_and_a_rewrapped_key_opens() {
        let (sealer, record) = Sealer::generate(&key(1), 1, 0).unwrap();
        let err = Sealer::unwrap(&key(2), std::slice::from_ref(&record)).unwrap_err();
        assert!(matches!(err, SealError::WrongKey { .. }), "{err}");
        let rewrapped = sealer.rewrap(&key(2), 5).unwrap();
        let opened = Sealer::unwrap(&key(2), &rewrapped).unwrap();
        assert_eq!(
            &*opened.open(&sealer.seal(b"kept").unwrap()).unwrap(),
            b"kept"
        );
        assert!(Sealer::unwrap(&key(1), &rewrapped).is_err());
        // A record claiming the right key id but damaged does not open.
        let mut damaged = record.clone();
        damaged.wrapped[3] ^= 1;
        assert_eq!(
            Sealer::unwrap(&key(1), &[damaged]).unwrap_err(),
            SealError::Unreadable { what: "data key" }
        );
    }

    #[test]
    fn key_text_is_checked() {
        let text = StoreKey::generate().unwrap().to_hex();
        assert_eq!(
            StoreKey::from_hex(&format!("{text}\n")).unwrap().to_hex(),
            text
        );
        for bad in ["", "zz", &"g".repeat(64), &"é".repeat(32)] {
            assert!(StoreKey::from_hex(bad).is_err(), "{bad}");
        }
    }
}
