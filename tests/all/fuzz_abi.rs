//! Arbitrary values at the host's boundary never break the host. Generated programs
//! make the `rawabi` guest call every idem import with raw canonical-ABI arguments
//! (pointers near and past the end of memory, huge lengths, forged and reused
//! handles, out-of-range discriminants, invalid UTF-8, boundary integers), and
//! arbitrary bytes are given to a normal agent as `--input`. Every case runs the real
//! `idem` binary and must end within a time limit, with one of idem's documented exit
//! codes, no panic, and a store that `idem status` reads and a good run still uses.
//!
//! Each test runs [`CASES`] cases; `PROPTEST_CASES=N` runs N instead (see README,
//! "Running tests").

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use idem_test_artifacts::{LEDGER, RAWABI};
use proptest::prelude::*;
use proptest::test_runner::Config;
use serde_json::{Value, json};

use crate::util::integrity_ok;

/// Cases per test in the suite: under 10 s for both tests on two busy cores.
const CASES: u32 = 48;

/// Longest one `idem` command may take before the case fails as a hang; the limits
/// passed below end any guest long before.
const HANG: Duration = Duration::from_secs(20);

/// Where `rawabi` programs put return areas, in its scratch buffer: a call's result
/// at 64 (for `run-once`, a claim's handle at 72), other results at 128 and 200.
const RET: u64 = 64;
const HANDLE: u64 = 72;

/// What one `idem` command did.
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `idem ARGS` with its output in files (a pipe could fill and look like a hang),
/// killing it and failing the case past [`HANG`].
fn idem(dir: &Path, args: &[&str]) -> Result<Ran, TestCaseError> {
    let (out, err) = (dir.join("stdout"), dir.join("stderr"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .env("IDEM_LOG", "warn")
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("idem starts");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > HANG {
            child.kill().unwrap();
            child.wait().unwrap();
            return Err(TestCaseError::fail(format!(
                "idem {args:?} still running after {HANG:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let ran = Ran {
        code: status.code(),
        stdout: std::fs::read_to_string(out).unwrap_or_default(),
        stderr: String::from_utf8_lossy(&std::fs::read(err).unwrap()).into_owned(),
    };
    prop_assert!(
        !ran.stderr.contains("panicked") && !ran.stderr.contains("RUST_BACKTRACE"),
        "idem {args:?} panicked: {}",
        ran.stderr
    );
    Ok(ran)
}

/// After whatever a case did to the store: it passes SQLite's integrity check, `idem
/// status` reads it, and a good run of `rawabi` claims and commits a key on it.
fn store_still_works(dir: &Path, db: &str) -> Result<(), TestCaseError> {
    integrity_ok(Path::new(db));
    let status = idem(dir, &["status", "--db", db, "--json"])?;
    prop_assert_eq!(status.code, Some(0), "idem status: {}", status.stderr);
    serde_json::from_str::<Value>(&status.stdout)
        .map_err(|e| TestCaseError::fail(format!("idem status --json: {e}")))?;

    let program = json!({"ops": [
        write(0, b"after-the-fuzz"),
        call("run-once", [scratch(0), json!(14), json!(0), json!(0), json!(0), scratch(RET)]),
        call("claim.commit", [load(HANDLE), scratch(0), json!(3), json!(0), json!(0), json!(0), json!(0), scratch(128)]),
        {"op": "dump", "at": RET, "len": 8},
        {"op": "dump", "at": 128, "len": 1},
    ]});
    let input = dir.join("good.json");
    std::fs::write(&input, program.to_string()).unwrap();
    let input = format!("@{}", input.display());
    let good = idem(
        dir,
        &[
            "run", RAWABI, "--db", db, "--run-id", "good", "--input", &input, "--json",
        ],
    )?;
    prop_assert_eq!(good.code, Some(0), "the good run: {}", good.stderr);
    let doc: Value = serde_json::from_str(&good.stdout).unwrap();
    // `run-once` answered `ok(claimed(..))`; the commit answered `ok`.
    prop_assert_eq!(
        &doc["output"],
        &json!([null, null, "0000000001000000", "00"])
    );
    prop_assert_eq!(&doc["counts"]["executed"], &json!(1));
    Ok(())
}

fn write(at: u64, bytes: &[u8]) -> Value {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    json!({"op": "write", "at": at, "hex": hex})
}

fn call<const N: usize>(name: &str, args: [Value; N]) -> Value {
    json!({"op": "call", "fn": name, "args": args.to_vec()})
}

fn scratch(offset: u64) -> Value {
    json!({ "scratch": offset })
}

fn load(offset: u64) -> Value {
    json!({ "load": offset })
}

/// Every import `rawabi` can call.
const IMPORTS: [&str; 14] = [
    "run-once",
    "claim.key",
    "claim.attempt",
    "claim.in-doubt",
    "claim.token",
    "claim.commit",
    "claim.release",
    "claim.stop",
    "claim.drop",
    "progress.load",
    "progress.save",
    "run-info.run-id",
    "run-info.generation",
    "outbound.set-header-names",
];

/// One raw argument, biased toward the values that break code at a boundary.
fn arg() -> impl Strategy<Value = Value> {
    let boundary = prop::sample::select(vec![
        json!(0),
        json!(1),
        json!(-1),
        json!(i32::MAX),
        json!(i32::MIN),
        json!(u32::MAX),
        json!(i64::MAX),
        json!(i64::MIN),
        json!(u64::MAX),
        json!(1_u64 << 32),
        json!(65536),
        json!(0x7fff_fff0),
    ]);
    prop_oneof![
        4 => boundary,
        2 => any::<i64>().prop_map(Value::from),
        // Handles: 0 is never one; the first few are the guest's own.
        3 => (0_i64..6).prop_map(Value::from),
        // Small lengths, so a pointer argument's string is read.
        2 => (0_i64..40).prop_map(Value::from),
        4 => (0_u64..512).prop_map(scratch),
        2 => (0_u64..16).prop_map(|n| json!({ "end": n })),
        3 => prop::sample::select(vec![HANDLE, RET, RET + 4, 128, 200]).prop_map(load),
    ]
}

/// Bytes a program may write into its scratch buffer: keys good and bad.
fn bytes() -> impl Strategy<Value = Vec<u8>> {
    let samples: Vec<Vec<u8>> = vec![
        b"k1".to_vec(),
        b"k2".to_vec(),
        Vec::new(),
        vec![0xff, 0xfe],
        vec![0xc3],
        b"\x1b[2J\x07".to_vec(),
        "\u{202e}kyek\u{200b}".as_bytes().to_vec(),
        vec![b'k'; 600],
        b"key\0with-nul".to_vec(),
    ];
    prop_oneof![
        2 => prop::sample::select(samples),
        1 => prop::collection::vec(any::<u8>(), 0..24),
    ]
}

/// Where programs write the payloads (values, states, reasons, header names) that
/// well-formed calls point at; keys go at 0.
const PAYLOAD: u64 = 256;
const PAYLOAD2: u64 = 320;

/// The arguments a correct caller would pass `name`, on the claim whose handle
/// `run-once` left at [`HANDLE`], with payloads of `len` and `len2` bytes and `step`.
fn well_formed(name: &str, len: i64, len2: i64, step: Value) -> Vec<Value> {
    let (len, len2) = (json!(len), json!(len2));
    match name {
        "run-once" => vec![
            scratch(0),
            json!(2),
            json!(0),
            json!(0),
            json!(0),
            scratch(RET),
        ],
        "claim.key" | "run-info.run-id" => {
            let ret = scratch(128);
            if name == "claim.key" {
                vec![load(HANDLE), ret]
            } else {
                vec![ret]
            }
        }
        "claim.commit" => vec![
            load(HANDLE),
            scratch(PAYLOAD),
            len,
            json!(1),
            step,
            scratch(PAYLOAD2),
            len2,
            scratch(128),
        ],
        "claim.stop" => vec![load(HANDLE), scratch(PAYLOAD), len],
        "progress.load" => vec![scratch(200)],
        "progress.save" => vec![step, scratch(PAYLOAD), len, scratch(128)],
        "run-info.generation" => vec![],
        "outbound.set-header-names" => {
            vec![scratch(PAYLOAD), len, scratch(PAYLOAD2), len2, scratch(128)]
        }
        // attempt, in-doubt, token, release, drop.
        _ => vec![load(HANDLE)],
    }
}

/// One step of a program: one or two `rawabi` ops.
fn op() -> impl Strategy<Value = Vec<Value>> {
    let step = prop::sample::select(vec![
        json!(0),
        json!(1),
        json!(i64::MAX),
        json!(1_u64 << 63),
        json!(u64::MAX),
    ]);
    prop_oneof![
        // A claim on a key written first, often well-formed, so that the later calls
        // meet live claims.
        4 => (key(), prop::sample::select(vec![0_i64, 0, 1, 2, -1]), arg()).prop_map(
            |(key, fingerprint, fp_len)| {
                let len = json!(key.len());
                vec![
                    write(0, &key),
                    call(
                        "run-once",
                        [scratch(0), len, json!(fingerprint), scratch(0), fp_len, scratch(RET)],
                    ),
                ]
            }
        ),
        2 => (prop::sample::select(vec![PAYLOAD, PAYLOAD2, 0, 7]), bytes())
            .prop_map(|(at, bytes)| vec![write(at, &bytes)]),
        // A well-formed call with up to two arguments replaced: most reach the host's
        // code past the canonical ABI's checks.
        8 => (
            prop::sample::select(IMPORTS.to_vec()),
            0_i64..24,
            0_i64..24,
            step,
            prop::collection::vec((0_usize..8, arg()), 0..3),
        )
            .prop_map(|(name, len, len2, step, changes)| {
                let mut args = well_formed(name, len, len2, step);
                for (at, value) in changes {
                    if let Some(slot) = args.get_mut(at) {
                        *slot = value;
                    }
                }
                vec![json!({"op": "call", "fn": name, "args": args})]
            }),
        2 => (prop::sample::select(IMPORTS.to_vec()), prop::collection::vec(arg(), 0..9))
            .prop_map(|(name, args)| vec![json!({"op": "call", "fn": name, "args": args})]),
        1 => prop::sample::select(vec![0_u64, 1, 16, 1 << 16, u32::MAX.into()])
            .prop_map(|pages| vec![json!({"op": "grow", "pages": pages})]),
        1 => "[ -~]{0,40}".prop_map(|text| vec![json!({"op": "fail", "text": text})]),
    ]
}

/// A key for `run-once`: mostly good ones, so that a claim is held.
fn key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => prop::sample::select(vec![b"k1".to_vec(), b"k2".to_vec(), b"k3".to_vec()]),
        1 => bytes(),
    ]
}

/// Most programs start by claiming a key, so that their calls meet a live claim.
fn program() -> impl Strategy<Value = Value> {
    let claim = vec![
        write(0, b"k0"),
        call(
            "run-once",
            [
                scratch(0),
                json!(2),
                json!(0),
                json!(0),
                json!(0),
                scratch(RET),
            ],
        ),
    ];
    (
        prop::bool::weighted(0.8),
        prop::collection::vec(op(), 1..10),
    )
        .prop_map(move |(claim_first, steps)| {
            let start = if claim_first {
                claim.clone()
            } else {
                Vec::new()
            };
            let ops: Vec<Value> = start
                .into_iter()
                .chain(steps.into_iter().flatten())
                .collect();
            json!({ "ops": ops })
        })
}

/// Arbitrary bytes, arbitrary text, and valid ledger inputs with a byte changed.
fn input() -> impl Strategy<Value = Vec<u8>> {
    let valid = json!({"items": ["a", "b"], "log": "/data/ledger.log"}).to_string();
    let valid_len = valid.len();
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256),
        "\\PC{0,64}".prop_map(String::into_bytes),
        (0..valid_len, any::<u8>()).prop_map(move |(at, byte)| {
            let mut bytes = valid.clone().into_bytes();
            bytes[at] = byte;
            bytes
        }),
        prop::sample::select(vec![
            b"null".to_vec(),
            b"{\"items\": [1e999999], \"log\": \"/data/l\"}".to_vec(),
            b"{\"items\": [\"\\ud800\"], \"log\": \"/data/l\"}".to_vec(),
            format!("{}1{}", "[".repeat(4096), "]".repeat(4096)).into_bytes(),
            b"{\"items\": [], \"log\": \"/etc/passwd\"}".to_vec(),
            b"{\"items\": [\"a\"], \"log\": \"/data/../../x\"}".to_vec(),
        ]),
    ]
}

fn config() -> Config {
    let mut config = Config {
        // The regressions worth keeping are written out as tests below.
        failure_persistence: None,
        ..Config::default()
    };
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = CASES;
    }
    config
}

/// Runs one `rawabi` program to its end in a fresh store and checks what it left.
fn run_program(program: &Value) -> Result<Value, TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("idem.db").to_str().unwrap().to_string();
    let input = dir.path().join("program.json");
    std::fs::write(&input, program.to_string()).unwrap();
    let input = format!("@{}", input.display());
    let ran = idem(
        dir.path(),
        &[
            "run",
            RAWABI,
            "--db",
            &db,
            "--run-id",
            "fuzz",
            "--input",
            &input,
            "--json",
            // A program that corrupts the guest's own memory may loop: these end it.
            "--max-compute",
            "2s",
            "--effect-timeout",
            "2s",
            "--await-timeout",
            "1s",
            "--max-memory",
            "64MiB",
        ],
    )?;
    let doc: Value = serde_json::from_str(&ran.stdout)
        .map_err(|e| TestCaseError::fail(format!("{e}: {} {}", ran.stdout, ran.stderr)))?;
    let status = doc["status"].as_str().unwrap_or_default();
    // Completed, failed (a trap, an error the agent returned, a limit), or stopped in
    // doubt by `claim.stop`: never a store or host failure, never a crash.
    match ran.code {
        Some(0) => prop_assert_eq!(status, "completed"),
        Some(1) => prop_assert_eq!(status, "failed"),
        Some(5) => prop_assert_eq!(status, "in-doubt"),
        code => prop_assert!(false, "exit {:?}: {} {}", code, ran.stdout, ran.stderr),
    }
    store_still_works(dir.path(), &db)?;
    Ok(doc)
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn raw_abi_calls_to_every_import_never_break_the_host(program in program()) {
        run_program(&program)?;
    }

    #[test]
    fn arbitrary_input_is_a_clear_error_or_a_run(input in input()) {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        let grant = format!("{}::/data", data.display());
        let db = dir.path().join("idem.db").to_str().unwrap().to_string();
        let file = dir.path().join("input");
        std::fs::write(&file, &input).unwrap();
        // Text goes on the command line as it is (after `=`, so that text starting with
        // `-` is not taken for a flag); bytes that cannot, from a file.
        let input_arg = match std::str::from_utf8(&input) {
            Ok(text) if !text.contains('\0') && !text.starts_with('@') => format!("--input={text}"),
            _ => format!("--input=@{}", file.display()),
        };
        let ran = idem(
            dir.path(),
            &["run", LEDGER, "--db", &db, "--dir", &grant, &input_arg, "--json"],
        )?;
        match ran.code {
            // Not JSON: refused before anything runs, with a message.
            Some(2) => prop_assert!(ran.stderr.contains("--input"), "{}", ran.stderr),
            // JSON the agent refused, or ran.
            Some(0 | 1) => {
                let doc: Value = serde_json::from_str(&ran.stdout).unwrap();
                prop_assert!(doc["status"] == "completed" || doc["status"] == "failed");
            }
            code => prop_assert!(false, "exit {:?}: {} {}", code, ran.stdout, ran.stderr),
        }
        if Path::new(&db).exists() {
            store_still_works(dir.path(), &db)?;
        }
    }
}

/// The program the fuzz test's good run uses, by hand: each call's answer is exact.
#[test]
fn a_claim_made_through_raw_calls_answers_like_the_typed_api() {
    let program = json!({"ops": [
        write(0, b"k1"),
        call("run-once", [scratch(0), json!(2), json!(0), json!(0), json!(0), scratch(RET)]),
        {"op": "dump", "at": RET, "len": 8},
        call("claim.attempt", [load(HANDLE)]),
        call("claim.in-doubt", [load(HANDLE)]),
        call("claim.token", [load(HANDLE)]),
        call("claim.commit", [load(HANDLE), scratch(0), json!(2), json!(1), json!(7), scratch(0), json!(1), scratch(128)]),
        {"op": "dump", "at": 128, "len": 1},
        call("progress.load", [scratch(200)]),
        {"op": "dump", "at": 200, "len": 1},
        {"op": "dump", "at": 208, "len": 8},
        call("run-info.generation", []),
    ]});
    let doc = run_program(&program).unwrap();
    assert_eq!(
        doc["output"],
        json!([
            null,
            // ok (0), claimed (1), then the handle.
            "0000000001000000",
            1,
            0,
            1,
            null,
            "00",
            null,
            // some(checkpoint { step: 7, .. }), saved in the commit's transaction.
            "01",
            "0700000000000000",
            0,
        ])
    );
    assert_eq!(doc["counts"]["executed"], 1);
}

/// Found by the input fuzz: clap took `--input -1`, valid JSON, for an unknown flag.
#[test]
fn a_negative_number_is_an_input() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("idem.db").to_str().unwrap().to_string();
    for input in ["-1", "-2.5e3"] {
        let ran = idem(
            dir.path(),
            &["run", RAWABI, "--db", &db, "--input", input, "--json"],
        )
        .unwrap();
        assert_eq!(ran.code, Some(0), "--input {input}: {}", ran.stderr);
        let doc: Value = serde_json::from_str(&ran.stdout).unwrap();
        // A number has no ops: the program is empty.
        assert_eq!(doc["output"], json!([]));
    }
}
