//! `idem new NAME --lang rust|python`: writes a ready agent project from the templates
//! under `cli/templates/` (compiled in, so an installed `idem` needs no clone for them):
//! the agent, its build file, `.gitignore`, an `input.json`, and `prove.sh`, which builds
//! the agent and crash-tests it with `idem prove`.
//!
//! A Rust project depends on the guest SDK by path, as the SDK is not on crates.io yet:
//! `--sdk-path`, or by default the `guest-sdk/` of the clone this `idem` was built from
//! while that folder is still there. A Python project needs nothing of the kind: the SDK
//! is installed with pip beside `idem` (the wheel) or from `guest-sdk-python/`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Parser, ValueEnum};

use crate::exit::{BadInput, Exit};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Lang {
    Rust,
    Python,
}

#[derive(Debug, Parser)]
pub struct NewCommand {
    /// The folder to create; its last component names the agent (letters, digits, `-`
    /// and `_`, starting with a letter). An existing folder must be empty.
    path: PathBuf,
    /// The language of the agent.
    #[arg(long, value_enum)]
    lang: Lang,
    /// Rust only: the `guest-sdk` folder of an idem clone, which the project's
    /// Cargo.toml depends on by path. Default: the one of the clone this idem was built
    /// from, while it exists.
    #[arg(long, value_name = "DIR")]
    sdk_path: Option<PathBuf>,
}

/// One file of a template: where it goes in the project, its text, and whether it is a
/// script to run.
struct File {
    path: &'static str,
    text: &'static str,
    executable: bool,
}

const INPUT: File = File {
    path: "input.json",
    text: include_str!("../../templates/input.json"),
    executable: false,
};

const RUST: [File; 5] = [
    File {
        path: "Cargo.toml",
        // Not `Cargo.toml` in the templates: `cargo package` (and so the wheel's sdist)
        // leaves out a folder holding one, as another package.
        text: include_str!("../../templates/rust/Cargo.toml.in"),
        executable: false,
    },
    File {
        path: "src/lib.rs",
        text: include_str!("../../templates/rust/lib.rs"),
        executable: false,
    },
    File {
        path: ".gitignore",
        text: include_str!("../../templates/rust/gitignore"),
        executable: false,
    },
    File {
        path: "prove.sh",
        text: include_str!("../../templates/rust/prove.sh"),
        executable: true,
    },
    INPUT,
];

const PYTHON: [File; 4] = [
    File {
        path: "app.py",
        text: include_str!("../../templates/python/app.py"),
        executable: false,
    },
    File {
        path: ".gitignore",
        text: include_str!("../../templates/python/gitignore"),
        executable: false,
    },
    File {
        path: "prove.sh",
        text: include_str!("../../templates/python/prove.sh"),
        executable: true,
    },
    INPUT,
];

/// The SDK of the clone this binary was built from (`cli/../guest-sdk`).
const BUILT_FROM_SDK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../guest-sdk");

impl NewCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        let name = agent_name(&self.path)?;
        let (files, sdk) = match self.lang {
            Lang::Rust => (&RUST[..], Some(sdk_path(self.sdk_path.as_deref())?)),
            Lang::Python => {
                if self.sdk_path.is_some() {
                    return Err(BadInput(
                        "--sdk-path is for --lang rust: a Python agent imports the SDK pip \
                         installed (the idem wheel, or ./guest-sdk-python)"
                            .into(),
                    )
                    .into());
                }
                (&PYTHON[..], None)
            }
        };
        check_empty(&self.path)?;
        let vars = Vars {
            name: &name,
            sdk: sdk.as_deref(),
        };
        for file in files {
            write(&self.path, file, &vars)?;
        }
        // The folder the agent is granted as /data, so that the first run needs no mkdir.
        let data = self.path.join("data");
        std::fs::create_dir_all(&data)
            .with_context(|| format!("cannot create {}", data.display()))?;
        print_next_steps(&self.path, &name, self.lang);
        Ok(Exit::Done)
    }
}

/// The agent's name: the folder's last component, checked to be a cargo package name
/// and a plain file name (it becomes `NAME.wasm` and `/data/NAME.log`).
fn agent_name(path: &Path) -> Result<String, BadInput> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| BadInput(format!("{} names no folder to create", path.display())))?;
    let mut chars = name.chars();
    let starts_with_letter = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    if !starts_with_letter || !chars.all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        return Err(BadInput(format!(
            "{name:?} cannot name an agent: use letters, digits, `-` and `_`, starting \
             with a letter"
        )));
    }
    // Names cargo refuses for a package, or that would shadow what the agent links.
    const RESERVED: [&str; 6] = ["std", "core", "alloc", "test", "proc_macro", "idem_sdk"];
    if RESERVED.contains(&name.replace('-', "_").as_str()) {
        return Err(BadInput(format!(
            "{name:?} cannot name an agent: it is the name of a crate every Rust agent \
             links; choose another"
        )));
    }
    Ok(name.to_owned())
}

/// The SDK folder a Rust project depends on, absolute: the project can be anywhere.
fn sdk_path(given: Option<&Path>) -> Result<String, BadInput> {
    let dir = given.unwrap_or(Path::new(BUILT_FROM_SDK));
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap_or_default();
    if !manifest.contains("name = \"idem-sdk\"") {
        return Err(BadInput(match given {
            Some(dir) => format!(
                "--sdk-path {}: no idem SDK there (no Cargo.toml of package idem-sdk); \
                 give the guest-sdk folder of an idem clone",
                dir.display()
            ),
            None => format!(
                "no idem SDK to depend on: {BUILT_FROM_SDK}, in the clone this idem was \
                 built from, is gone; pass --sdk-path with the guest-sdk folder of an idem \
                 clone"
            ),
        }));
    }
    let dir = std::fs::canonicalize(dir)
        .map_err(|e| BadInput(format!("--sdk-path {}: {e}", dir.display())))?;
    let text = dir.to_str().ok_or_else(|| {
        BadInput(format!(
            "the SDK's path {} is not UTF-8, so Cargo.toml cannot name it",
            dir.display()
        ))
    })?;
    if text.chars().any(char::is_control) {
        return Err(BadInput(format!(
            "the SDK's path {text:?} holds a control character; move the clone"
        )));
    }
    // A TOML basic string.
    Ok(text.replace('\\', "\\\\").replace('"', "\\\""))
}

/// Refuses a folder that exists with anything in it: nothing of the user's is
/// overwritten or mixed with the template.
fn check_empty(dir: &Path) -> Result<(), BadInput> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => match entries.next() {
            None => Ok(()),
            Some(_) => Err(BadInput(format!(
                "{} exists and is not empty: idem new writes a project only into a new or \
                 empty folder",
                dir.display()
            ))),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(BadInput(format!("{}: {e}", dir.display()))),
    }
}

/// What the templates' `{{...}}` stand for.
struct Vars<'a> {
    name: &'a str,
    sdk: Option<&'a str>,
}

impl Vars<'_> {
    fn fill(&self, text: &str) -> String {
        let filled = text
            .replace("{{name}}", self.name)
            .replace("{{crate}}", &self.name.replace('-', "_"));
        match self.sdk {
            Some(sdk) => filled.replace("{{sdk}}", sdk),
            None => filled,
        }
    }
}

fn write(root: &Path, file: &File, vars: &Vars<'_>) -> anyhow::Result<()> {
    let path = root.join(file.path);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    std::fs::write(&path, vars.fill(file.text))
        .with_context(|| format!("cannot write {}", path.display()))?;
    if file.executable {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
            .with_context(|| format!("cannot make {} executable", path.display()))?;
    }
    Ok(())
}

fn print_next_steps(dir: &Path, name: &str, lang: Lang) {
    let (build, wasm) = match lang {
        Lang::Rust => (
            "cargo build --release --target wasm32-wasip2".to_owned(),
            format!(
                "target/wasm32-wasip2/release/{}.wasm",
                name.replace('-', "_")
            ),
        ),
        Lang::Python => (
            format!("componentize-py componentize app -o {name}.wasm"),
            format!("{name}.wasm"),
        ),
    };
    println!(
        "created {}/, a {lang:?} agent named {name}; next:",
        dir.display()
    );
    println!("  cd {}", dir.display());
    println!("  {build}");
    println!("  idem run {wasm} --dir ./data::/data --input @input.json");
    println!("  ./prove.sh    # builds it and crash-tests it with idem prove");
}
