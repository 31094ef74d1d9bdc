//! Large values kept once by digest: what decides that a value goes to the blob
//! tables, the reference a row holds in its place, and the rows that may hold one.
//!
//! A reference is [`REF_MAGIC`] then the SHA-256 of the bytes it stands for (the value
//! as the backend would have kept it: sealed, in a store encrypted at rest). Values the
//! store writes itself never start with a zero byte, sealed values start with
//! `00 49 53 01`, and a value an agent or a user supplies that happens to start with
//! [`REF_MAGIC`] is kept as a blob whatever its size ([`offloaded`]): so a kept value
//! that starts with it is always a reference, and no one can forge one.

use sha2::{Digest, Sha256};

/// The first bytes of a reference: a zero byte, `IB`, the format's version.
pub const REF_MAGIC: [u8; 4] = [0x00, b'I', b'B', 0x01];

/// The length of a reference: [`REF_MAGIC`] and a SHA-256.
pub const REF_LEN: usize = REF_MAGIC.len() + 32;

/// Values at least this large (as the backend keeps them) are kept as blobs. Below
/// it, the extra write a blob costs is more than what it spares: a row a few pages
/// long rewritten with its run.
pub const BLOB_FROM: usize = 128 << 10;

/// The rows that may hold a reference, as `(table, column)`: gc keeps a blob any of
/// them refers to. Each has a partial index on its references (migrations `*_blobs`).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) const REFERRERS: &[(&str, &str)] = &[
    ("run_inputs", "input"),
    ("run_outcomes", "outcome"),
    ("progress", "state"),
    ("steps", "result"),
    ("waits", "payload"),
    ("signals", "payload"),
    ("join_members", "outcome"),
    ("schedules", "input"),
];

/// A blob's digest: the SHA-256 of its bytes.
pub type BlobDigest = [u8; 32];

/// Whether a value (as the backend would keep it) is kept as a blob.
pub fn offloaded(value: &[u8]) -> bool {
    value.len() >= BLOB_FROM || value.starts_with(&REF_MAGIC)
}

/// The digest of a blob's bytes.
pub fn digest(bytes: &[u8]) -> BlobDigest {
    Sha256::digest(bytes).into()
}

/// The reference a row keeps for the blob `digest`.
pub fn reference(digest: &BlobDigest) -> [u8; REF_LEN] {
    let mut reference = [0u8; REF_LEN];
    reference[..REF_MAGIC.len()].copy_from_slice(&REF_MAGIC);
    reference[REF_MAGIC.len()..].copy_from_slice(digest);
    reference
}

/// The digest a kept value refers to, if it is a reference.
pub fn referred(kept: &[u8]) -> Option<BlobDigest> {
    if kept.len() != REF_LEN || !kept.starts_with(&REF_MAGIC) {
        return None;
    }
    kept[REF_MAGIC.len()..].try_into().ok()
}

/// A digest as 64 hex digits, for messages.
pub fn hex(digest: &BlobDigest) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// How gc tells that no row refers to blob `b` (its `id` column holds the reference),
/// with `prefix` the backend's literal for [`REF_MAGIC`] and `also` the backend's own
/// tables that refer to blobs beside [`REFERRERS`]: each clause the same expression as
/// its partial index's predicate, so the planner uses the index.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn unreferenced(prefix: &str, also: &[(&str, &str)]) -> String {
    REFERRERS
        .iter()
        .chain(also)
        .map(|(table, column)| {
            format!(
                "NOT EXISTS (SELECT 1 FROM {table} WHERE substr({column}, 1, 4) = {prefix} \
                 AND {column} = b.id)"
            )
        })
        .collect::<Vec<_>>()
        .join(" AND ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_names_its_digest_and_nothing_else_reads_as_one() {
        let d = digest(b"hello");
        let r = reference(&d);
        assert_eq!(referred(&r), Some(d));
        assert_eq!(referred(&r[..REF_LEN - 1]), None);
        let mut longer = r.to_vec();
        longer.push(0);
        assert_eq!(referred(&longer), None);
        assert_eq!(referred(b"{\"json\": true}"), None);
        assert_eq!(
            hex(&d),
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
    }

    #[test]
    fn large_values_and_values_that_look_like_references_are_offloaded() {
        assert!(!offloaded(b"small"));
        assert!(!offloaded(&vec![7u8; BLOB_FROM - 1]));
        assert!(offloaded(&vec![7u8; BLOB_FROM]));
        // A value that starts like a reference never reaches a row as it is.
        assert!(offloaded(&reference(&digest(b"x"))));
        assert!(offloaded(&REF_MAGIC));
    }
}
