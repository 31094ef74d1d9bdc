//! Paths of the guest components idem's tests run, built by `build.rs` whenever their
//! sources (or an SDK, or the WIT) change: one constant per guest, and [`ALL`].
//!
//! ```
//! for (name, path) in idem_test_artifacts::ALL {
//!     let bytes = std::fs::read(path)?;
//!     assert_eq!(&bytes[..8], b"\0asm\x0d\0\x01\0", "{name} is not a component");
//! }
//! assert!(idem_test_artifacts::STEPS.ends_with("steps.wasm"));
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! # Adding a guest
//!
//! Guests are found, not listed: add the guest in one place and its constant appears.
//! - A Rust guest: a package folder in `guests/` (every folder there is a member;
//!   constant: its name in upper case, `-` as `_`); cargo then records it in
//!   `guests/Cargo.lock` (`cargo update --workspace --offline --manifest-path
//!   tests/guests/Cargo.toml`: the nested build is `--locked`).
//! - A Python guest: a folder `guests-python/NAME/` holding `app.py` (constant
//!   `PY_NAME`; empty, and its tests SKIPPED, where componentize-py is not set up).
//! - A WAT guest (a core module a compiler would not emit): `guests-wat/NAME.wat`.
//!
//! The first paragraph of the guest's own doc comment (`//!`, the docstring, `;;`)
//! documents its constant, so it must have one; the rest of it says its input and
//! output. Then write its test: `every_guest_is_used` fails for a guest no test uses.
//!
//! # Layout
//!
//! - `build.rs`: finds the guests (`cargo metadata` on `examples/` and `guests/`, the
//!   folders `guests-wat/` and `guests-python/`), runs a nested `cargo build --release
//!   --target wasm32-wasip2` over the Rust workspaces with one target dir under
//!   `OUT_DIR`, makes each WAT module a component with `wat` and `wit-component`, and
//!   writes `OUT_DIR/guests.rs`; `build_python.rs` builds the Python guests.
//! - `src/lib.rs`: includes `guests.rs`.
//! - `src/power_loss.rs`: a SQLite VFS that simulates power loss (and counts WAL
//!   frames), for the power-loss tests and the bench; test code, never in `idem`.
//! - `guests/`: the Rust test guests' own workspace; `guests-python/`: the Python test
//!   guests; `guests-wat/`: the WAT ones.

pub mod power_loss;

// The constants and `ALL`, written by build.rs from the guests it found and built.
include!(concat!(env!("OUT_DIR"), "/guests.rs"));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_guest_is_a_component() -> std::io::Result<()> {
        for (name, path) in ALL {
            let bytes = std::fs::read(path)?;
            assert!(
                bytes.starts_with(b"\0asm\x0d\0\x01\0"),
                "{name} ({path}) is not a component"
            );
        }
        Ok(())
    }

    /// Every guest has a test (or, for the bench guest, the bench): its constant is
    /// named in `tests/all/` or `cli/benches/`. A guest found but used nowhere is a
    /// guest whose test was forgotten.
    #[test]
    fn every_guest_is_used() -> std::io::Result<()> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut sources = String::new();
        for dir in [root.join("all"), root.join("../cli/benches")] {
            for entry in std::fs::read_dir(dir)? {
                let path = entry?.path();
                if path.extension().is_some_and(|ext| ext == "rs") {
                    sources.push_str(&std::fs::read_to_string(path)?);
                }
            }
        }
        let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
        for constant in CONSTANTS {
            let used = sources.match_indices(constant).any(|(at, _)| {
                let before = sources[..at].chars().next_back();
                let after = sources[at + constant.len()..].chars().next();
                !before.is_some_and(word) && !after.is_some_and(word)
            });
            assert!(
                used,
                "no test in tests/all/ uses the guest constant {constant}"
            );
        }
        Ok(())
    }
}
