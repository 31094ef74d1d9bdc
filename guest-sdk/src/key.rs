//! Idempotency keys: the names under which `run-once` records a side effect.

use std::fmt;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::Error;

/// The idempotency key of one side effect.
///
/// A key must name the effect by *what* it does, never by when or how often it was
/// tried: a resumed run recomputes the same key and finds the committed result. Keys
/// built from content ([`Key::for_run`], [`Key::shared`]) end in a hash of the content's
/// JSON encoding, so the content must encode deterministically (use `BTreeMap`, not
/// `HashMap`).
///
/// ```
/// use idem_sdk::Key;
///
/// let key = Key::shared("charge", &("alice", 300))?;
/// assert!(key.as_str().starts_with("charge/"));
/// // The same content gives the same key, in any run.
/// assert_eq!(key, Key::shared("charge", &("alice", 300))?);
/// # Ok::<(), idem_sdk::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    key: String,
    /// What the step is asked to do, for keys chosen by hand ([`Key::with_input`]).
    fingerprint: Option<String>,
}

impl Key {
    /// A key taken as written. The host checks it when it is used: empty keys, keys
    /// over its length limit and keys holding control, bidi or invisible characters
    /// (a zero-width space, say) are refused with
    /// [`StepError::InvalidKey`](crate::StepError::InvalidKey).
    ///
    /// ```
    /// let key = idem_sdk::Key::new("invoice-2024-0042/send");
    /// assert_eq!(key.as_str(), "invoice-2024-0042/send");
    /// ```
    pub fn new(key: impl Into<String>) -> Key {
        Key {
            key: key.into(),
            fingerprint: None,
        }
    }

    /// Binds the key to `input`: the host remembers a hash of it with the committed
    /// result, and a later `run_once` of the same key with *other* input is refused
    /// with [`StepError::KeyReused`](crate::StepError::KeyReused) instead of returning a
    /// result computed for something else (as a payment API answers a reused
    /// idempotency key with different parameters). Keys made by [`Key::for_run`] and
    /// [`Key::shared`] already contain their content's hash and need no binding.
    ///
    /// Fails with [`Error::Codec`] if `input` cannot be encoded to JSON.
    ///
    /// ```
    /// let key = idem_sdk::Key::new("order-17/charge").with_input(&("alice", 300))?;
    /// assert_eq!(key.as_str(), "order-17/charge");
    /// # Ok::<(), idem_sdk::Error>(())
    /// ```
    pub fn with_input(mut self, input: &impl Serialize) -> Result<Key, Error> {
        self.fingerprint = Some(format!("sha256:{}", content_hash(input)?));
        Ok(self)
    }

    /// The input fingerprint the key is bound to, if any.
    pub fn fingerprint(&self) -> Option<&str> {
        self.fingerprint.as_deref()
    }

    /// A key private to this run: `"{run_id}/{step}/{hash}"`. Another run doing the same
    /// step on the same content executes it again.
    ///
    /// Fails with [`Error::Codec`] if `content` cannot be encoded to JSON.
    ///
    /// ```no_run
    /// // `no_run`: the run id comes from the host, so this only works inside an agent.
    /// let key = idem_sdk::Key::for_run("append", &(0, "apples"))?;
    /// assert!(key.as_str().starts_with(&idem_sdk::run_id()));
    /// # Ok::<(), idem_sdk::Error>(())
    /// ```
    pub fn for_run(step: &str, content: &impl Serialize) -> Result<Key, Error> {
        let hash = content_hash(content)?;
        Ok(Key::new(format!("{}/{step}/{hash}", crate::run_id())))
    }

    /// A key shared by every run: `"{step}/{hash}"`. Two runs doing the same step on
    /// the same content share one execution: the first executes, the others get its
    /// committed result.
    ///
    /// Fails with [`Error::Codec`] if `content` cannot be encoded to JSON.
    ///
    /// ```
    /// let key = idem_sdk::Key::shared("charge", &"order-17")?;
    /// assert_eq!(key.as_str(), "charge/dce02a7b0ea5eefdb57dbe5cae1a5dec");
    /// # Ok::<(), idem_sdk::Error>(())
    /// ```
    pub fn shared(step: &str, content: &impl Serialize) -> Result<Key, Error> {
        let hash = content_hash(content)?;
        Ok(Key::new(format!("{step}/{hash}")))
    }

    /// The key's text, as the host sees it.
    ///
    /// ```
    /// assert_eq!(idem_sdk::Key::new("k").as_str(), "k");
    /// ```
    pub fn as_str(&self) -> &str {
        &self.key
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key)
    }
}

/// The first 16 bytes of the SHA-256 of `content`'s JSON, in lower hex: 128 bits keep
/// collisions out of reach while the key stays short enough to read in a log.
fn content_hash(content: &impl Serialize) -> Result<String, Error> {
    let json = serde_json::to_vec(content).map_err(|err| Error::codec("key content", err))?;
    let digest = Sha256::digest(&json);
    Ok(digest[..16].iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn shared_keys_hash_the_json_of_the_content() -> Result<(), Error> {
        // Pinned: keys are stored, so changing the hash would orphan every committed
        // result. This is the first half of sha256(`[1,"a"]`).
        let key = Key::shared("step", &(1, "a"))?;
        assert_eq!(key.as_str(), "step/2010945388e2de98f5651051478912aa");
        Ok(())
    }

    /// The shared vectors of `wit/keys.md`, which every SDK's tests check: the Python
    /// SDK's too, so that agents in either language compute the same keys.
    #[test]
    fn the_shared_key_vectors_hold() -> Result<(), Error> {
        let vectors: serde_json::Value =
            serde_json::from_str(include_str!("../wit/key-vectors.json"))
                .map_err(|err| Error::codec("key-vectors.json", err))?;
        let run_id = vectors["run_id"].as_str().unwrap_or_default();
        let vectors = vectors["vectors"].as_array().cloned().unwrap_or_default();
        assert!(vectors.len() >= 10, "the vectors file lost its vectors");
        for v in &vectors {
            let (step, content, note) = (
                v["step"].as_str().unwrap_or_default(),
                &v["content"],
                &v["note"],
            );
            assert_eq!(
                serde_json::to_string(content).ok().as_ref(),
                v["json"].as_str().map(str::to_owned).as_ref(),
                "{note}"
            );
            let shared = Key::shared(step, content)?;
            assert_eq!(Some(shared.as_str()), v["shared"].as_str(), "{note}");
            assert_eq!(
                Some(format!("{run_id}/{shared}").as_str()),
                v["for_run"].as_str(),
                "{note}"
            );
            let bound = Key::new("k").with_input(content)?;
            assert_eq!(bound.fingerprint(), v["fingerprint"].as_str(), "{note}");
        }
        Ok(())
    }

    #[test]
    fn different_content_gives_different_keys() -> Result<(), Error> {
        assert_ne!(Key::shared("s", &1)?, Key::shared("s", &2)?);
        assert_ne!(Key::shared("s", &1)?, Key::shared("t", &1)?);
        Ok(())
    }

    #[test]
    fn unencodable_content_is_a_codec_error() {
        // JSON object keys must be strings.
        let content: HashMap<(u8, u8), u8> = HashMap::from([((1, 2), 3)]);
        assert!(matches!(Key::shared("s", &content), Err(Error::Codec(_))));
    }

    #[test]
    fn display_is_the_raw_text() {
        assert_eq!(Key::new("a/b").to_string(), "a/b");
    }
}
