//! Builds every guest the tests run and writes `OUT_DIR/guests.rs`, which `src/lib.rs`
//! includes: one constant per guest holding its component's path, and `ALL`.
//!
//! Guests are found, not listed (as wasmtime's `crates/test-programs/artifacts/build.rs`
//! finds its test programs), so adding one touches one place:
//! - Rust: every member of the `examples/` and `tests/guests/` workspaces, found with
//!   `cargo metadata`, built for `wasm32-wasip2` into a target dir under `OUT_DIR`;
//! - WAT: every `tests/guests-wat/NAME.wat`, a core module this script makes a component
//!   of the `idem:agent` world, or of the world `NAME` in a `NAME.wit` beside it (for
//!   guests no Rust compiler would emit);
//! - Python: every `tests/guests-python/NAME/` app, and the Python examples, built with
//!   componentize-py when it is set up (`build_python.rs`).
//!
//! A guest's constant is its name in upper case with `_` for `-` (`steps` → `STEPS`,
//! `py-steps` → `PY_STEPS`); its documentation is the first paragraph of the guest's own
//! doc comment (`//!`, `;;` or the module docstring), which every guest must have.

use std::collections::BTreeSet;
use std::env;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

#[path = "build_python.rs"]
mod python;

const TARGET: &str = "wasm32-wasip2";

/// The first 8 bytes of a component binary: the `\0asm` magic, version 0x0d, layer 1.
/// A core module has layer 0, so this also catches a guest built without the component
/// linker.
const COMPONENT_HEADER: [u8; 8] = *b"\0asm\x0d\0\x01\0";

/// The Rust guest workspaces, from the repo root. Their members are the guests.
const WORKSPACES: [&str; 2] = ["examples", "tests/guests"];

/// The folder of the WAT guests, from the repo root.
const WAT_DIR: &str = "tests/guests-wat";

/// One guest, as the generated code names it.
pub struct Guest {
    /// Its name in `ALL`: the package's, the WAT file's stem, or `py-` and the app's.
    pub name: String,
    /// Where it comes from, from the repo root (a folder or a file).
    pub source: String,
    /// The first paragraph of its doc comment.
    pub summary: String,
    /// The component, or `None` for a Python guest left unbuilt (no componentize-py).
    pub path: Option<PathBuf>,
}

impl Guest {
    fn constant(&self) -> String {
        self.name.to_uppercase().replace('-', "_")
    }
}

/// A member of a guest workspace, as `cargo metadata` describes it.
struct Member {
    package: String,
    manifest: PathBuf,
    /// The file name (without `.wasm`) of the artifact its cdylib or bin target makes.
    artifact: String,
    /// The target's root source file, whose `//!` documents the guest.
    src: PathBuf,
}

fn main() -> ExitCode {
    match build() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn build() -> Result<(), String> {
    let manifest_dir = var("CARGO_MANIFEST_DIR")?;
    let root = Path::new(&manifest_dir)
        .parent()
        .ok_or("tests/ has no parent folder")?
        .to_path_buf();
    let out_dir = PathBuf::from(var("OUT_DIR")?);
    let cargo = var("CARGO")?;

    watch_shared(&root);
    check_target_installed()?;

    let mut guests = build_rust(&root, &out_dir, &cargo)?;
    guests.extend(build_wat(&root, &out_dir)?);
    guests.extend(python::build_all(&root, &out_dir)?);

    let code = generate(&guests)?;
    let file = out_dir.join("guests.rs");
    std::fs::write(&file, code).map_err(|e| format!("{}: {e}", file.display()))
}

/// Builds both Rust workspaces (one target dir: they share the SDK and its
/// dependencies) and returns their members, each checked to be a component.
fn build_rust(root: &Path, out_dir: &Path, cargo: &OsString) -> Result<Vec<Guest>, String> {
    let target_dir = out_dir.join("guests");
    let release = target_dir.join(TARGET).join("release");
    let mut guests = Vec::new();
    for workspace in WORKSPACES {
        let dir = root.join(workspace);
        let members = members(cargo, &dir)?;
        let mut cmd = clean_command(cargo);
        cmd.current_dir(&dir)
            .args(["build", "--release", "--locked", "--target", TARGET])
            .arg("--manifest-path")
            .arg(dir.join("Cargo.toml"))
            .arg("--target-dir")
            .arg(&target_dir)
            // Our stdout is read by cargo for `cargo:` directives; the nested build's
            // chatter belongs on stderr, which cargo shows if we fail.
            .stdout(std::io::stderr());
        eprintln!("running: {cmd:?}");
        let status = cmd
            .status()
            .map_err(|err| format!("cannot run {}: {err}", cargo.to_string_lossy()))?;
        if !status.success() {
            return Err(format!(
                "building the guests in {workspace}/ for {TARGET} failed ({status}); \
                 the nested cargo's output is above (after adding a guest, record it in \
                 the lock file: cargo update --workspace --offline --manifest-path \
                 {workspace}/Cargo.toml)"
            ));
        }
        for member in members {
            let path = release.join(format!("{}.wasm", member.artifact));
            check_component(&path, &member.package)?;
            println!("cargo:rerun-if-changed={}", member.manifest.display());
            watch_dep_info(&path.with_extension("d"))?;
            let source = member
                .manifest
                .parent()
                .and_then(|dir| dir.strip_prefix(root).ok())
                .map_or_else(|| member.package.clone(), |dir| dir.display().to_string());
            guests.push(Guest {
                summary: summary(&member.src, "//!")?,
                name: member.package,
                source,
                path: Some(path),
            });
        }
    }
    Ok(guests)
}

/// The members of the workspace in `dir`, in the order its manifest lists them.
fn members(cargo: &OsString, dir: &Path) -> Result<Vec<Member>, String> {
    let manifest = dir.join("Cargo.toml");
    let output = clean_command(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--offline",
            "--format-version",
            "1",
        ])
        .arg("--manifest-path")
        .arg(&manifest)
        .output()
        .map_err(|err| format!("cannot run {}: {err}", cargo.to_string_lossy()))?;
    if !output.status.success() {
        return Err(format!(
            "cargo metadata on {} failed ({}): {}",
            manifest.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let meta: serde_json::Value = serde_json::from_slice(&output.stdout)
        .map_err(|err| format!("cargo metadata on {}: {err}", manifest.display()))?;
    let text = |value: &serde_json::Value| value.as_str().unwrap_or_default().to_owned();
    let mut members = Vec::new();
    for package in meta["packages"].as_array().into_iter().flatten() {
        let name = text(&package["name"]);
        // A component comes from a cdylib (an agent) or a bin (a command).
        let target = package["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|target| {
                let kinds = target["kind"].as_array()?;
                let is = |kind: &str| kinds.iter().any(|k| k == kind);
                let artifact = text(&target["name"]);
                if is("cdylib") {
                    Some((artifact.replace('-', "_"), target))
                } else if is("bin") {
                    Some((artifact, target))
                } else {
                    None
                }
            });
        let Some((artifact, target)) = target else {
            return Err(format!(
                "guest {name} ({}) has no cdylib or bin target: it makes no component",
                manifest.display()
            ));
        };
        members.push(Member {
            package: name,
            manifest: PathBuf::from(text(&package["manifest_path"])),
            artifact,
            src: PathBuf::from(text(&target["src_path"])),
        });
    }
    Ok(members)
}

/// Makes each `tests/guests-wat/NAME.wat`, a core module, a component of the
/// `idem:agent` world, the way `cargo component` would a Rust one: the world goes in as
/// a custom section, and wit-component wraps the module, lifting `run` and lowering
/// what it imports.
fn build_wat(root: &Path, out_dir: &Path) -> Result<Vec<Guest>, String> {
    let dir = root.join(WAT_DIR);
    let mut sources = Vec::new();
    for entry in std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let path = entry.map_err(|e| format!("{}: {e}", dir.display()))?.path();
        if path.extension().is_some_and(|ext| ext == "wat") {
            sources.push(path);
        }
    }
    sources.sort();
    let mut resolve = wit_parser::Resolve::default();
    let (package, _) = resolve
        .push_dir(root.join("wit"))
        .map_err(|e| format!("reading wit/: {e:#}"))?;
    let world = resolve
        .select_world(&[package], Some("agent"))
        .map_err(|e| format!("wit/ has no world `agent`: {e:#}"))?;
    let mut guests = Vec::new();
    for source in sources {
        let name = source
            .file_stem()
            .and_then(|stem| stem.to_str())
            .ok_or_else(|| format!("{} has no UTF-8 name", source.display()))?
            .to_owned();
        let mut module =
            wat::parse_file(&source).map_err(|e| format!("{}: {e}", source.display()))?;
        // A `NAME.wit` beside the module gives it a world of its own (one that includes
        // the agent's), named as the file is.
        let own = source.with_extension("wit");
        let world = if own.exists() {
            let package = resolve
                .push_file(&own)
                .map_err(|e| format!("{}: {e:#}", own.display()))?;
            resolve
                .select_world(&[package], Some(&name))
                .map_err(|e| format!("{} has no world `{name}`: {e:#}", own.display()))?
        } else {
            world
        };
        wit_component::embed_component_metadata(
            &mut module,
            &resolve,
            world,
            wit_component::StringEncoding::UTF8,
        )
        .map_err(|e| format!("embedding the world in {}: {e:#}", source.display()))?;
        let component = wit_component::ComponentEncoder::default()
            .validate(true)
            .module(&module)
            .and_then(|encoder| encoder.encode())
            .map_err(|e| format!("making {} a component: {e:#}", source.display()))?;
        let path = out_dir.join(format!("{name}.wasm"));
        std::fs::write(&path, component).map_err(|e| format!("{}: {e}", path.display()))?;
        guests.push(Guest {
            summary: summary(&source, ";;")?,
            source: format!("{WAT_DIR}/{name}.wat"),
            name,
            path: Some(path),
        });
    }
    Ok(guests)
}

/// The first paragraph of the comment that opens `file`, its lines starting with
/// `marker`, joined into one line.
pub fn summary(file: &Path, marker: &str) -> Result<String, String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let lines: Vec<&str> = text
        .lines()
        .map_while(|line| line.strip_prefix(marker))
        .map(str::trim)
        .take_while(|line| !line.is_empty())
        .collect();
    paragraph(file, &lines)
}

/// `lines` as one paragraph, or an error saying that `file` must document its guest.
pub fn paragraph(file: &Path, lines: &[&str]) -> Result<String, String> {
    if lines.is_empty() {
        return Err(format!(
            "{} does not open with a doc comment saying what the guest does; \
             its first paragraph documents the guest's constant",
            file.display()
        ));
    }
    Ok(lines.join(" "))
}

/// The code `src/lib.rs` includes: a documented constant per guest, and `ALL` with
/// the guests that were built.
fn generate(guests: &[Guest]) -> Result<String, String> {
    let mut code = String::from("// Generated by tests/build.rs: one constant per guest.\n");
    let mut constants = BTreeSet::new();
    for guest in guests {
        let constant = guest.constant();
        let valid = constant
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
            && constant.starts_with(|c: char| c.is_ascii_uppercase());
        if !valid {
            return Err(format!(
                "guest {:?} ({}) makes no Rust constant name: name it with letters, digits \
                 and `-`, starting with a letter",
                guest.name, guest.source
            ));
        }
        if !constants.insert(constant.clone()) {
            return Err(format!(
                "two guests are named {:?} (one is {}): rename one",
                guest.name, guest.source
            ));
        }
        let path = match &guest.path {
            Some(path) => path
                .to_str()
                .ok_or_else(|| format!("{} is not UTF-8", path.display()))?,
            None => "",
        };
        let built_from = match guest.path {
            Some(_) => format!("Built from `{}`.", guest.source),
            None => format!(
                "Built from `{}`; empty: componentize-py was not found when the tests were \
                 built, and the tests of this guest are SKIPPED.",
                guest.source
            ),
        };
        let _ = writeln!(
            code,
            "\n#[doc = {:?}]\n#[doc = \"\"]\n#[doc = {built_from:?}]\npub const {constant}: &str = {path:?};",
            guest.summary,
        );
    }
    code.push_str(
        "\n/// Every guest that was built, as `(name, path)`, for tests that go over them all: \
         the Python guests only when componentize-py was found.\npub const ALL: &[(&str, &str)] = &[\n",
    );
    for guest in guests.iter().filter(|guest| guest.path.is_some()) {
        let _ = writeln!(code, "    ({:?}, {}),", guest.name, guest.constant());
    }
    code.push_str(
        "];\n\n/// Every constant, built or not.\n#[cfg(test)]\nconst CONSTANTS: &[&str] = &[\n",
    );
    for constant in &constants {
        let _ = writeln!(code, "    {constant:?},");
    }
    code.push_str("];\n");
    Ok(code)
}

/// Names what every guest is built from, so that cargo reruns this script (and the
/// nested builds) when one of them changed. A guest workspace's folder is not watched
/// as a whole: a `target/` left there by a manual build must not trigger rebuilds. Each
/// Rust guest's own sources come from its dep-info ([`watch_dep_info`]).
fn watch_shared(root: &Path) {
    let mut paths = vec![
        root.join("wit"),
        root.join("guest-sdk/Cargo.toml"),
        // The SDK takes its dependency versions from the root workspace.
        root.join("Cargo.toml"),
        // A new WAT guest changes the folder.
        root.join(WAT_DIR),
    ];
    for workspace in WORKSPACES {
        // A new member changes the workspace's manifest.
        paths.push(root.join(workspace).join("Cargo.toml"));
        paths.push(root.join(workspace).join("Cargo.lock"));
    }
    paths.extend(python::watched(root));
    for path in paths {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

/// Watches every file the dep-info `file` (makefile syntax, written by cargo next to an
/// artifact) says the artifact was built from: its sources, the SDK's, its
/// dependencies'.
fn watch_dep_info(file: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let mut seen = BTreeSet::new();
    for line in text.lines() {
        let Some((_, deps)) = line.split_once(": ") else {
            continue;
        };
        let mut parts = deps.split_whitespace();
        while let Some(part) = parts.next() {
            // A space in a path is escaped with a backslash.
            let mut path = part.to_owned();
            while path.ends_with('\\') {
                path.pop();
                path.push(' ');
                path.push_str(parts.next().unwrap_or_default());
            }
            if seen.insert(path.clone()) {
                println!("cargo:rerun-if-changed={path}");
            }
        }
    }
    Ok(())
}

/// Fails early, and says what to do, when the standard library for the guests' target
/// is missing: the nested build would otherwise bury it in `can't find crate for std`.
fn check_target_installed() -> Result<(), String> {
    let rustc = env::var_os("RUSTC").unwrap_or_else(|| OsString::from("rustc"));
    let output = Command::new(&rustc)
        .args(["--print", "target-libdir", "--target", TARGET])
        .output()
        .map_err(|err| format!("cannot run {}: {err}", rustc.to_string_lossy()))?;
    let libdir = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    if output.status.success() && !libdir.is_empty() && Path::new(&libdir).is_dir() {
        return Ok(());
    }
    Err(format!(
        "the {TARGET} target is not installed for {}; \
         install it with: rustup target add {TARGET}",
        rustc.to_string_lossy()
    ))
}

fn check_component(path: &Path, package: &str) -> Result<(), String> {
    let mut header = [0_u8; 8];
    File::open(path)
        .and_then(|mut file| file.read_exact(&mut header))
        .map_err(|err| format!("guest {package} did not produce {}: {err}", path.display()))?;
    if header != COMPONENT_HEADER {
        return Err(format!(
            "{} is not a WebAssembly component (header {header:02x?})",
            path.display()
        ));
    }
    Ok(())
}

/// A command for the nested cargo, without the variables the outer build sets for
/// this script or inherited from its caller: they would point the nested build at the
/// outer target dir, apply the host's flags and profile to the guests, run clippy on
/// them, or make it wait on the outer build's jobserver.
fn clean_command(cargo: &OsString) -> Command {
    const NAMES: [&str; 12] = [
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_BUILD_TARGET_DIR",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_MAKEFLAGS",
        "MAKEFLAGS",
        "MFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_MANIFEST_DIR",
    ];
    const PREFIXES: [&str; 7] = [
        "CARGO_PROFILE_",
        "CARGO_CFG_",
        "CARGO_FEATURE_",
        "CARGO_PKG_",
        // Per-target settings such as `CARGO_TARGET_<TRIPLE>_RUSTFLAGS`.
        "CARGO_TARGET_",
        "DEP_",
        // Cargo's internal handshakes (`cargo fix` and the like).
        "__CARGO_",
    ];
    let mut cmd = Command::new(cargo);
    for (key, _) in env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        if NAMES.contains(&key) || PREFIXES.iter().any(|prefix| key.starts_with(prefix)) {
            cmd.env_remove(key);
        }
    }
    cmd
}

fn var(name: &str) -> Result<OsString, String> {
    env::var_os(name).ok_or_else(|| format!("cargo did not set {name} for the build script"))
}
