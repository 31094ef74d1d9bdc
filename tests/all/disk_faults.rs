//! The disk under a SQLite store, on real file systems the test mounts: a tmpfs too
//! small for the run, one that another file fills mid-run, and an ext4 file system
//! that turns read-only mid-run. Each must stop the run with exit code 3 and an error
//! naming the store and the cause, keep every committed row, and let the run resume,
//! each side effect once, when the cause is gone.
//!
//! A file system cannot be remounted read-only while a file on it is open for writing
//! (`mount -o remount,ro` says "mount point is busy"), so a store in use never sees a
//! remount. What does turn a file system read-only under a writer is the kernel after
//! an I/O error, with `errors=remount-ro` (ext4's default on many distributions): the
//! test makes one on a loop file and triggers it with ext4's `trigger_fs_error`, then
//! repairs it as an operator would (unmount, `e2fsck`, mount).
//!
//! Mounting needs root (CAP_SYS_ADMIN). Where the test cannot mount it prints
//! `SKIPPED: ...` and passes, unless `IDEM_TEST_DISK_FAULTS=required` (as CI sets),
//! which makes it fail. Every mount is undone by a drop guard, test failed or not.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::store_faults::{
    Work, assert_each_effect_once, assert_kept, rows, store_failure, wait_for, wait_for_lines,
};
use crate::util::{integrity_ok, read_log, run_cli, stderr};

/// `None`, after saying why the test is skipped, or a panic when disk fault tests are
/// required.
fn cannot<T>(test: &str, why: &str) -> Option<T> {
    if std::env::var("IDEM_TEST_DISK_FAULTS").as_deref() == Ok("required") {
        panic!("IDEM_TEST_DISK_FAULTS=required, but disk fault test {test} cannot run: {why}");
    }
    eprintln!(
        "SKIPPED: disk fault test {test}: {why} (it needs root to mount a file system; \
         IDEM_TEST_DISK_FAULTS=required makes this a failure)"
    );
    None
}

/// Runs a command, its output if it succeeded, else why not.
fn try_run(program: &str, args: &[&str]) -> Result<Output, String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn run(program: &str, args: &[&str]) -> Output {
    try_run(program, args).unwrap_or_else(|e| panic!("{e}"))
}

/// A file system mounted for one test; unmounted when dropped.
struct Mount {
    dir: PathBuf,
    /// The image file of an ext4 file system on a loop device.
    image: Option<PathBuf>,
}

impl Mount {
    /// A tmpfs of `size` (`mount(8)` syntax) at `dir`.
    fn tmpfs(test: &str, dir: &Path, size: &str) -> Option<Mount> {
        std::fs::create_dir_all(dir).unwrap();
        let dir_text = dir.to_str().unwrap();
        match try_run(
            "mount",
            &[
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size}"),
                "tmpfs",
                dir_text,
            ],
        ) {
            Ok(_) => Some(Mount {
                dir: dir.to_owned(),
                image: None,
            }),
            Err(why) => cannot(test, &why),
        }
    }

    /// An ext4 file system of `mib` MiB in an image file beside `dir`, mounted at `dir`
    /// with `errors=remount-ro`.
    fn ext4(test: &str, dir: &Path, mib: u64) -> Option<Mount> {
        std::fs::create_dir_all(dir).unwrap();
        let image = dir.with_extension("img");
        let file = std::fs::File::create(&image).unwrap();
        file.set_len(mib << 20).unwrap();
        drop(file);
        if let Err(why) = try_run("mkfs.ext4", &["-q", image.to_str().unwrap()]) {
            return cannot(test, &why);
        }
        let mount = Mount {
            dir: dir.to_owned(),
            image: Some(image),
        };
        match mount.mount_image() {
            Ok(()) => Some(mount),
            Err(why) => {
                // Not mounted: nothing for the guard to undo.
                std::mem::forget(mount);
                cannot(test, &why)
            }
        }
    }

    fn mount_image(&self) -> Result<(), String> {
        let image = self.image.as_ref().unwrap();
        try_run(
            "mount",
            &[
                "-o",
                "loop,errors=remount-ro",
                image.to_str().unwrap(),
                self.dir.to_str().unwrap(),
            ],
        )
        .map(drop)
    }

    /// Grows a tmpfs: the disk is no longer full.
    fn resize(&self, size: &str) {
        run(
            "mount",
            &[
                "-o",
                &format!("remount,size={size}"),
                self.dir.to_str().unwrap(),
            ],
        );
    }

    /// What the kernel does to an ext4 file system mounted `errors=remount-ro` when it
    /// meets an error: it turns read-only at once, under every writer.
    fn fail_read_only(&self) {
        let out = run("findmnt", &["-no", "SOURCE", self.dir.to_str().unwrap()]);
        let source = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let device = Path::new(&source).file_name().unwrap().to_str().unwrap();
        std::fs::write(
            format!("/sys/fs/ext4/{device}/trigger_fs_error"),
            b"idem test: the file system turns read-only",
        )
        .unwrap();
    }

    /// The operator's repair: unmount, check, mount again.
    fn repair(&self) {
        run("umount", &[self.dir.to_str().unwrap()]);
        let image = self.image.as_ref().unwrap().to_str().unwrap();
        // 1: errors were corrected, which is the point of running it.
        let status = Command::new("e2fsck")
            .args(["-fy", image])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(matches!(status.code(), Some(0 | 1)), "e2fsck: {status:?}");
        self.mount_image().unwrap();
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(&self.dir)
            .stderr(Stdio::null())
            .status();
    }
}

/// `idem run` of the steps guest as run `run_id` with its store at `db`.
fn args_on(
    w: &Work,
    db: &Path,
    run_id: &str,
    input: &serde_json::Value,
    extra: &[&str],
) -> Vec<String> {
    let mut args = w.args(run_id, input, extra);
    let at = args.iter().position(|a| a == "--db").unwrap() + 1;
    args[at] = db.to_str().unwrap().to_string();
    args
}

fn run_args(args: &[String]) -> Output {
    run_cli(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

fn spawn(args: &[String]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .env("IDEM_LOG", "warn")
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The store on a tmpfs too small for the run: the run stops naming the full disk; the
/// tmpfs grown (`mount -o remount,size=`), it resumes.
#[test]
fn a_full_tmpfs_stops_the_binary_and_the_run_resumes_once_it_is_grown() {
    let w = Work::new();
    let mnt = w.dir.path().join("mnt");
    let Some(fs) = Mount::tmpfs("a full tmpfs", &mnt, "640k") else {
        return;
    };
    let db = mnt.join("idem.db");
    let steps = 3000;
    let input = serde_json::json!({
        "steps": steps, "log": "/data/log.txt", "policy": "probe", "fold": true
    });
    let args = args_on(&w, &db, "disk", &input, &["--lease", "1s"]);

    let out = run_args(&args);
    let err = store_failure(&out, &db, "the disk is full");
    assert!(err.contains("(SQLite: database or disk is full)"), "{err}");
    let before = rows(&db);
    assert!(
        !before.is_empty() && before.len() < steps,
        "{} of {steps} steps committed: the disk did not fill mid-run",
        before.len()
    );
    integrity_ok(&db);

    fs.resize("64m");
    let out = run_args(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_each_effect_once(&w.log(), steps);
    assert_kept(&before, &db);
    integrity_ok(&db);
}

/// Another file fills the disk while the run is under way: the run stops naming the
/// full disk, every row committed before is kept, and once the file is deleted the
/// run resumes where it stopped.
#[test]
fn a_disk_filled_by_another_file_mid_run_stops_the_run_until_the_file_is_deleted() {
    let w = Work::new();
    let mnt = w.dir.path().join("mnt");
    let Some(_fs) = Mount::tmpfs("a disk filled mid-run", &mnt, "64m") else {
        return;
    };
    let db = mnt.join("idem.db");
    let steps = 3000;
    let input = serde_json::json!({
        "steps": steps, "log": "/data/log.txt", "policy": "probe", "fold": true
    });
    let args = args_on(&w, &db, "filled", &input, &["--lease", "1s"]);
    let child = spawn(&args);
    wait_for_lines(&w.log(), 50);

    // Fill every byte that is left.
    let filler = mnt.join("filler");
    let mut file = std::fs::File::create(&filler).unwrap();
    let chunk = vec![0x5a_u8; 64 << 10];
    let full = loop {
        if let Err(e) = file.write_all(&chunk) {
            break e;
        }
    };
    assert_eq!(full.raw_os_error(), Some(28), "ENOSPC: {full}");
    drop(file);

    let out = wait_for(child, Duration::from_secs(120));
    let err = store_failure(&out, &db, "the disk is full");
    assert!(err.contains("database or disk is full"), "{err}");
    let before = rows(&db);
    let logged = read_log(&w.log()).len();
    assert!(
        before.len() < steps && logged < steps,
        "the run was not stopped: {} rows, {logged} effects",
        before.len()
    );
    // At most the step in flight ran its effect without its commit.
    assert!(
        logged <= before.len() + 1,
        "{logged} effects, {} commits",
        before.len()
    );
    integrity_ok(&db);

    std::fs::remove_file(&filler).unwrap();
    let out = run_args(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_each_effect_once(&w.log(), steps);
    assert_kept(&before, &db);
    integrity_ok(&db);
}

/// The store's file system turns read-only under the run (the kernel's
/// `errors=remount-ro`): the run stops with an error that says the file system is
/// read-only; a new run on it is refused the same way; after the operator's repair
/// every row committed before the fault is there (`--sync full`: each commit was on
/// disk when it returned), and the run resumes, each effect once.
#[test]
fn a_file_system_turning_read_only_mid_run_stops_the_run_and_it_resumes_after_repair() {
    let w = Work::new();
    let mnt = w.dir.path().join("mnt");
    let Some(fs) = Mount::ext4("a file system turning read-only", &mnt, 32) else {
        return;
    };
    let db = mnt.join("idem.db");
    let steps = 2000;
    let input = serde_json::json!({
        "steps": steps, "log": "/data/log.txt", "policy": "probe", "fold": true, "pause_ms": 2
    });
    let args = args_on(&w, &db, "ro", &input, &["--lease", "1s", "--sync", "full"]);
    let child = spawn(&args);
    wait_for_lines(&w.log(), 30);
    let before = rows(&db);
    fs.fail_read_only();

    let out = wait_for(child, Duration::from_secs(120));
    let err = store_failure(&out, &db, "read-only");
    assert!(
        read_log(&w.log()).len() < steps,
        "the run was not stopped: {err}"
    );
    // Refused the same way by a new process, and by a look.
    let again = run_args(&args);
    store_failure(&again, &db, "read-only");

    fs.repair();
    let after = rows(&db);
    assert_kept(&before, &db);
    integrity_ok(&db);
    let out = run_args(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_each_effect_once(&w.log(), steps);
    assert_kept(&after, &db);
    integrity_ok(&db);
}
