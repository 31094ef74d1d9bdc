//! Builds the guest workspaces (`examples/` and `tests/guests/`) for `wasm32-wasip2` into
//! a target dir under `OUT_DIR`, checks that each output is a component, and hands the
//! paths to `src/lib.rs` as `IDEM_GUEST_*` variables; and makes the one guest that is
//! not Rust, `tests/guests/multimem/agent.wat`, a component of the `idem:agent` world.

use std::env;
use std::ffi::OsString;
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

/// One guest: the workspace it is built in (from the repo root), its package name
/// (which is also its artifact's name), and the constant that exports its path.
struct Guest {
    workspace: &'static str,
    package: &'static str,
    constant: &'static str,
}

const WORKSPACES: [&str; 2] = ["examples", "tests/guests"];

const GUESTS: &[Guest] = &[
    Guest {
        workspace: "examples",
        package: "ledger",
        constant: "LEDGER",
    },
    Guest {
        workspace: "examples",
        package: "dedupe",
        constant: "DEDUPE",
    },
    Guest {
        workspace: "examples",
        package: "approval",
        constant: "APPROVAL",
    },
    Guest {
        workspace: "tests/guests",
        package: "steps",
        constant: "STEPS",
    },
    Guest {
        workspace: "tests/guests",
        package: "command",
        constant: "COMMAND",
    },
    Guest {
        workspace: "tests/guests",
        package: "hostile",
        constant: "HOSTILE",
    },
    Guest {
        workspace: "tests/guests",
        package: "fetcher",
        constant: "FETCHER",
    },
    Guest {
        workspace: "tests/guests",
        package: "bench",
        constant: "BENCH",
    },
    Guest {
        workspace: "tests/guests",
        package: "rogue",
        constant: "ROGUE",
    },
    Guest {
        workspace: "tests/guests",
        package: "sloppy",
        constant: "SLOPPY",
    },
    Guest {
        workspace: "tests/guests",
        package: "rawabi",
        constant: "RAWABI",
    },
    Guest {
        workspace: "tests/guests",
        package: "waiter",
        constant: "WAITER",
    },
];

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
    // One target dir for both workspaces: they share the SDK and its dependencies.
    let target_dir = PathBuf::from(var("OUT_DIR")?).join("guests");

    watch(&root);
    check_target_installed()?;

    let cargo = var("CARGO")?;
    for workspace in WORKSPACES {
        let dir = root.join(workspace);
        let mut cmd = clean_command(&cargo);
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
                 the nested cargo's output is above"
            ));
        }
    }

    let multimem = build_multimem(&root, &PathBuf::from(var("OUT_DIR")?))?;
    println!("cargo:rustc-env=IDEM_GUEST_MULTIMEM={multimem}");

    let python = python::build_all(&root, &PathBuf::from(var("OUT_DIR")?))?;
    for (constant, path) in python {
        println!("cargo:rustc-env=IDEM_GUEST_{constant}={path}");
    }

    let release = target_dir.join(TARGET).join("release");
    for guest in GUESTS {
        let path = release.join(format!("{}.wasm", guest.package));
        check_component(&path, guest)?;
        let path = path
            .to_str()
            .ok_or_else(|| format!("{} is not UTF-8", path.display()))?;
        println!("cargo:rustc-env=IDEM_GUEST_{}={path}", guest.constant);
    }
    Ok(())
}

/// Makes `tests/guests/multimem/agent.wat`, a core module with two memories, a
/// component of the `idem:agent` world, the way `cargo component` would a Rust one:
/// the world goes in as a custom section, and wit-component wraps the module, lifting
/// `run` and lowering nothing (it imports nothing). Returns the component's path.
fn build_multimem(root: &Path, out_dir: &Path) -> Result<String, String> {
    let source = root.join("tests/guests/multimem/agent.wat");
    let mut module = wat::parse_file(&source).map_err(|e| format!("{}: {e}", source.display()))?;
    let mut resolve = wit_parser::Resolve::default();
    let (package, _) = resolve
        .push_dir(root.join("wit"))
        .map_err(|e| format!("reading wit/: {e:#}"))?;
    let world = resolve
        .select_world(&[package], Some("agent"))
        .map_err(|e| format!("wit/ has no world `agent`: {e:#}"))?;
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
    let path = out_dir.join("multimem.wasm");
    std::fs::write(&path, component).map_err(|e| format!("{}: {e}", path.display()))?;
    path.to_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("{} is not UTF-8", path.display()))
}

/// Names what the guests are built from, so that cargo reruns this script (and the
/// nested builds) only when one of them changed. Guest packages are watched one by one
/// rather than through their workspace folder: a `target/` left there by a manual
/// build must not trigger rebuilds.
fn watch(root: &Path) {
    let mut paths = vec![
        root.join("wit"),
        root.join("guest-sdk/Cargo.toml"),
        root.join("guest-sdk/src"),
        // The SDK takes its dependency versions from the root workspace.
        root.join("Cargo.toml"),
    ];
    for workspace in WORKSPACES {
        paths.push(root.join(workspace).join("Cargo.toml"));
        paths.push(root.join(workspace).join("Cargo.lock"));
    }
    for guest in GUESTS {
        paths.push(root.join(guest.workspace).join(guest.package));
    }
    paths.push(root.join("tests/guests/multimem"));
    paths.extend(python::watched(root));
    for path in paths {
        println!("cargo:rerun-if-changed={}", path.display());
    }
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

fn check_component(path: &Path, guest: &Guest) -> Result<(), String> {
    let mut header = [0_u8; 8];
    File::open(path)
        .and_then(|mut file| file.read_exact(&mut header))
        .map_err(|err| {
            format!(
                "guest {} ({}/) did not produce {}: {err}",
                guest.package,
                guest.workspace,
                path.display()
            )
        })?;
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
