//! The compiled-component cache holds native code, so idem trusts nothing in it that it
//! did not seal itself: a forged entry (another component's, or code bytes overwritten)
//! is never run, a guest cannot be granted the cache, and a cache directory that another
//! user could write to is refused.

use std::ffi::OsStr;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Output;

use idem_test_artifacts::{HOSTILE, STEPS};
use sha2::{Digest, Sha256};

use crate::util::{raw_db, run_cli, run_cli_env, stderr, stdout};

const STEPS_INPUT: &str = r#"{"steps":3,"log":"/data/log.txt"}"#;

/// A temp dir with a private cache (`cache/`), a granted `data/` dir, and stores.
struct Bed {
    dir: tempfile::TempDir,
}

impl Bed {
    fn new() -> Bed {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        Bed { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn cache(&self) -> PathBuf {
        self.path("cache")
    }

    /// `idem run AGENT --cache-dir cache --db DB --dir data::/data --run-id RUN ..`.
    fn run(&self, agent: &str, db: &str, input: &str, extra: &[&str]) -> Output {
        let cache = self.cache();
        let db = self.path(db);
        let grant = format!("{}::/data", self.path("data").display());
        let mut args = vec![
            "run",
            agent,
            "--cache-dir",
            cache.to_str().unwrap(),
            "--db",
            db.to_str().unwrap(),
            "--dir",
            &grant,
            "--run-id",
            "benign",
            "--input",
            input,
        ];
        args.extend_from_slice(extra);
        run_cli(&args)
    }

    /// Runs the benign `steps` agent on a fresh store `db` and returns its output line.
    fn run_steps(&self, db: &str) -> String {
        let out = self.run(STEPS, db, STEPS_INPUT, &[]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "the benign agent completes (no crash): {}",
            stderr(&out)
        );
        output_line(&out)
    }

    /// The digest the store `db` recorded for run `benign`.
    fn recorded_digest(&self, db: &str) -> String {
        raw_db(&self.path(db))
            .query_row("SELECT digest FROM runs WHERE run_id = 'benign'", [], |r| {
                r.get(0)
            })
            .unwrap()
    }
}

fn output_line(out: &Output) -> String {
    stdout(out)
        .lines()
        .find(|l| l.starts_with("output: "))
        .unwrap_or_else(|| panic!("no output line in {}", stdout(out)))
        .to_string()
}

fn digest_of(path: &str) -> String {
    let digest = Sha256::digest(std::fs::read(path).unwrap());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The files of the cache entry for component `digest`: every file named after it.
fn entry_files(cache: &Path, digest: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with(digest))
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "no cache entry for {digest} in {cache:?}"
    );
    files
}

/// Copies the entry of component `from` over the entry of component `to`, file by file,
/// as someone who can write the cache would.
fn copy_entry(cache: &Path, from: &str, to: &str) {
    for file in entry_files(cache, from) {
        let name = file
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .replace(from, to);
        std::fs::copy(&file, cache.join(name)).unwrap();
    }
}

/// What a forger does with an unkeyed checksum next to an entry: recomputes it.
fn reseal_unkeyed_checksums(cache: &Path) {
    for file in std::fs::read_dir(cache).unwrap().map(|e| e.unwrap().path()) {
        if file.extension() == Some(OsStr::new("sha256")) {
            let code = std::fs::read(file.with_extension("cwasm")).unwrap();
            let sum: String = Sha256::digest(code)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            std::fs::write(&file, sum).unwrap();
        }
    }
}

/// Overwrites the `.text` section of the ELF object inside a cache entry with `ud2`
/// (an illegal instruction): code that would kill idem with SIGILL if it ran.
fn overwrite_code(entry: &Path) {
    let mut bytes = std::fs::read(entry).unwrap();
    let elf = bytes
        .windows(4)
        .position(|w| w == b"\x7fELF")
        .expect("the entry holds an ELF object");
    let u16_at = |b: &[u8], at: usize| u16::from_le_bytes(b[at..at + 2].try_into().unwrap());
    let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    let u64_at =
        |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap()) as usize;
    let obj = &bytes[elf..];
    let (shoff, shentsize, shnum, shstrndx) = (
        u64_at(obj, 0x28),
        u16_at(obj, 0x3a) as usize,
        u16_at(obj, 0x3c) as usize,
        u16_at(obj, 0x3e) as usize,
    );
    let section = |i: usize| shoff + i * shentsize;
    let names = u64_at(obj, section(shstrndx) + 0x18);
    let text = (0..shnum)
        .find(|&i| {
            let name = names + u32_at(obj, section(i)) as usize;
            obj[name..].starts_with(b".text\0")
        })
        .expect("the ELF object has a .text section");
    let (offset, size) = (
        elf + u64_at(obj, section(text) + 0x18),
        u64_at(obj, section(text) + 0x20),
    );
    assert!(size > 0);
    for (i, byte) in bytes[offset..offset + size].iter_mut().enumerate() {
        *byte = if i % 2 == 0 { 0x0f } else { 0x0b };
    }
    std::fs::write(entry, bytes).unwrap();
}

/// Every file in `dir` with its bytes, to show that nothing was changed.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect();
    files.sort();
    files
}

#[test]
fn a_guest_granted_the_cache_is_refused_before_it_runs() {
    let bed = Bed::new();
    let reference = bed.run_steps("reference.db");
    let hostile = bed.run(HOSTILE, "hostile.db", r#"{"mode":"spin","n":1}"#, &[]);
    assert!(hostile.status.success(), "{}", stderr(&hostile));
    let (steps, hostile) = (digest_of(STEPS), digest_of(HOSTILE));

    // The plant: the hostile agent's entry under the benign agent's file names.
    let cache = bed.cache();
    let copy: Vec<(String, String)> = entry_files(&cache, &hostile)
        .into_iter()
        .map(|file| {
            let name = file.file_name().unwrap().to_str().unwrap().to_string();
            (
                format!("/cache/{name}"),
                format!("/cache/{}", name.replace(&hostile, &steps)),
            )
        })
        .collect();
    let plant = serde_json::json!({"mode": "plant", "copy": copy}).to_string();
    let before = snapshot(&cache);
    let grant = format!("{}::/cache", cache.display());
    let out = bed.run(HOSTILE, "plant.db", &plant, &["--dir", &grant]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "refused up front: {err}");
    assert!(
        err.contains(cache.to_str().unwrap()) && err.contains("cache"),
        "the error names the grant and the cache: {err}"
    );
    assert!(!bed.path("plant.db").exists(), "no store was created");
    assert_eq!(snapshot(&cache), before, "nothing was planted");
    assert_eq!(bed.run_steps("after.db"), reference);

    // The same agent granted a plain directory plants there: the refusal is the grant's.
    let data = bed.path("data");
    std::fs::write(data.join("from"), "bytes").unwrap();
    let plant = r#"{"mode":"plant","n":4,"copy":[["/data/from","/data/to"],["","/data/ud2"]]}"#;
    let out = bed.run(HOSTILE, "plant.db", plant, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(data.join("to")).unwrap(), b"bytes");
    assert_eq!(
        std::fs::read(data.join("ud2")).unwrap(),
        b"\x0f\x0b\x0f\x0b"
    );
}

#[test]
fn another_components_entry_under_the_benign_name_is_not_run() {
    let bed = Bed::new();
    let reference = bed.run_steps("reference.db");
    let hostile = bed.run(HOSTILE, "hostile.db", r#"{"mode":"spin","n":1}"#, &[]);
    assert!(hostile.status.success(), "{}", stderr(&hostile));
    let (steps, hostile) = (digest_of(STEPS), digest_of(HOSTILE));

    copy_entry(&bed.cache(), &hostile, &steps);
    reseal_unkeyed_checksums(&bed.cache());
    let out = bed.run(STEPS, "forged.db", STEPS_INPUT, &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert_eq!(
        output_line(&out),
        reference,
        "the benign agent's own code ran"
    );
    assert_eq!(bed.recorded_digest("forged.db"), steps);
    assert!(
        err.contains("WARN") && err.contains("recompiling"),
        "the forged entry is reported: {err}"
    );
    // On a pipe, in plain text: no colour codes for a log file to keep.
    assert!(
        !err.contains('\x1b'),
        "no ANSI colour off a terminal: {err:?}"
    );

    // The entry was rewritten: the next start loads it without a word.
    let out = bed.run(STEPS, "again.db", STEPS_INPUT, &[]);
    assert_eq!(output_line(&out), reference);
    assert!(!stderr(&out).contains("WARN"), "{}", stderr(&out));
}

#[test]
fn overwritten_code_bytes_are_never_run() {
    let bed = Bed::new();
    let reference = bed.run_steps("reference.db");
    let steps = digest_of(STEPS);
    let entry = entry_files(&bed.cache(), &steps)
        .into_iter()
        .find(|f| f.extension() == Some(OsStr::new("cwasm")))
        .expect("a .cwasm file");
    overwrite_code(&entry);
    reseal_unkeyed_checksums(&bed.cache());

    let out = bed.run(STEPS, "forged.db", STEPS_INPUT, &[]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "no crash: {out:?}");
    assert_eq!(output_line(&out), reference);
    assert_eq!(bed.recorded_digest("forged.db"), steps);
    assert!(err.contains("recompiling"), "{err}");
}

#[test]
fn a_new_cache_is_private() {
    let bed = Bed::new();
    bed.run_steps("one.db");
    let cache = bed.cache();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&cache), 0o700, "the cache directory");
    for file in std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
    {
        assert_eq!(mode(&file) & 0o077, 0, "{file:?} is for the user alone");
    }
}

/// Asserts `out` is the refusal of cache directory `dir`: exit 2, the directory named,
/// the reason, and the way out.
fn assert_refused(out: &Output, dir: &Path, reason: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(dir.to_str().unwrap()), "names {dir:?}: {err}");
    assert!(err.contains(reason), "says {reason:?}: {err}");
    assert!(err.contains("--no-cache"), "hints at --no-cache: {err}");
}

#[test]
fn a_cache_others_can_write_is_refused() {
    let bed = Bed::new();
    let cache = bed.cache();
    std::fs::create_dir(&cache).unwrap();
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = bed.run(STEPS, "idem.db", STEPS_INPUT, &[]);
    assert_refused(&out, &cache, "writable by other users");
    assert!(!bed.path("idem.db").exists(), "no store was created");
    assert_eq!(std::fs::read_dir(&cache).unwrap().count(), 0);

    // A symbolic link is not the directory it names.
    let real = bed.path("real");
    std::fs::create_dir(&real).unwrap();
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::remove_dir(&cache).unwrap();
    std::os::unix::fs::symlink(&real, &cache).unwrap();
    let out = bed.run(STEPS, "idem.db", STEPS_INPUT, &[]);
    assert_refused(&out, &cache, "symbolic link");

    // The default cache, under a parent anyone may rename it out of.
    let xdg = bed.path("xdg");
    std::fs::create_dir(&xdg).unwrap();
    std::fs::set_permissions(&xdg, std::fs::Permissions::from_mode(0o777)).unwrap();
    let db = bed.path("idem.db");
    let out = run_cli_env(
        &[
            "run",
            STEPS,
            "--db",
            db.to_str().unwrap(),
            "--input",
            "null",
        ],
        &[("XDG_CACHE_HOME", xdg.as_os_str())],
    );
    assert_refused(&out, &xdg, "writable by other users");
    assert!(!db.exists(), "no store was created");

    // A sticky parent (like /tmp) lets nobody else rename what is not theirs.
    std::fs::set_permissions(&xdg, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let out = run_cli_env(
        &[
            "run",
            HOSTILE,
            "--db",
            db.to_str().unwrap(),
            "--input",
            r#"{"mode":"spin"}"#,
        ],
        &[("XDG_CACHE_HOME", xdg.as_os_str())],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(xdg.join("idem").is_dir());
}

#[test]
fn a_cache_owned_by_another_user_is_refused() {
    let bed = Bed::new();
    let cache = bed.cache();
    std::fs::create_dir(&cache).unwrap();
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o700)).unwrap();
    let me = std::fs::metadata(bed.dir.path()).unwrap().uid();
    if me != 0 {
        println!("note: not root, so no directory can be given to another user; skipped");
        return;
    }
    // `nobody`.
    std::os::unix::fs::chown(&cache, Some(65534), Some(65534)).unwrap();
    let out = bed.run(STEPS, "idem.db", STEPS_INPUT, &[]);
    assert_refused(&out, &cache, "owned by uid 65534");
    assert!(!bed.path("idem.db").exists(), "no store was created");
}

#[test]
fn an_agent_file_changed_in_place_is_hashed_again() {
    let bed = Bed::new();
    let agent = bed.path("agent.wasm");
    std::fs::copy(STEPS, &agent).unwrap();
    // The cache remembers a file's digest only once its times are two seconds old.
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let agent = agent.to_str().unwrap();
    let reference = output_line(&bed.run(agent, "one.db", STEPS_INPUT, &[]));
    assert!(
        std::fs::read_dir(bed.cache())
            .unwrap()
            .any(|e| e.unwrap().path().extension() == Some(OsStr::new("digest"))),
        "the digest was remembered"
    );

    // Remembered: a fresh store still gets the component's own bytes.
    let out = bed.run(agent, "two.db", STEPS_INPUT, &[]);
    assert_eq!(output_line(&out), reference, "{}", stderr(&out));
    assert_eq!(bed.recorded_digest("two.db"), digest_of(STEPS));
    let stored: Vec<u8> = raw_db(&bed.path("two.db"))
        .query_row(
            "SELECT bytes FROM components WHERE digest = ?1",
            [digest_of(STEPS)],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(stored, std::fs::read(STEPS).unwrap());

    // Overwritten in place, same inode: the new bytes are what runs and is recorded.
    std::fs::write(agent, std::fs::read(HOSTILE).unwrap()).unwrap();
    let out = bed.run(agent, "three.db", r#"{"mode":"spin","n":1}"#, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(bed.recorded_digest("three.db"), digest_of(HOSTILE));
}
