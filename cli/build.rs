//! Stamps `idem --version` with the commit: `IDEM_VERSION` is the package's version and,
//! built in a git checkout, its short commit (`0.1.0 (ab704e0)`); elsewhere (a source
//! package, the wheel's sdist) the version alone.

#[path = "src/commit.rs"]
#[allow(dead_code)]
mod commit;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/commit.rs");
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    let dir = std::env::var_os("CARGO_MANIFEST_DIR").map(std::path::PathBuf::from);
    match dir.and_then(|dir| commit::of("git", &dir)) {
        Some(commit) => {
            for path in &commit.watch {
                println!("cargo:rerun-if-changed={}", path.display());
            }
            println!("cargo:rustc-env=IDEM_VERSION={version} ({})", commit.short);
        }
        None => println!("cargo:rustc-env=IDEM_VERSION={version}"),
    }
}
