//! Test agent that calls every idem import with raw canonical-ABI arguments: pointers,
//! lengths, resource handles and discriminants straight from its input, so that a fuzz
//! test can reach the host's side of the boundary with values no typed binding sends.
//!
//! The `generate!` below gives the component its `idem:agent` type information and its
//! `run` export; the calls go through core imports declared by hand under the same
//! names, with the flat signatures the canonical ABI gives each function.
//!
//! Input: `{"ops": [op, ..]}`, run in order, each op one of
//! - `{"op": "write", "at": n, "hex": "6b31"}`: writes bytes into the scratch buffer at
//!   offset `n` (clipped to the buffer);
//! - `{"op": "grow", "pages": n}`: grows linear memory by `n` pages (a refusal is fine);
//! - `{"op": "call", "fn": NAME, "args": [arg, ..]}`: calls the import `NAME` (see
//!   [`call`]) with the args, missing ones 0;
//! - `{"op": "dump", "at": n, "len": l}`: appends the scratch bytes `n..n+l` (clipped),
//!   hex, to the output;
//! - `{"op": "fail", "text": "..."}`: ends the run with that error.
//!
//! An arg is a number (an i64 or a u64, taken as its 64 bits), `{"scratch": n}` (the
//! scratch buffer's address plus `n`), `{"end": n}` (the size of linear memory minus
//! `n`: pointers near its end), or `{"load": n}` (the u32 at scratch offset `n`: a
//! handle the host wrote into a return area there). Anything else is 0.
//!
//! Output: a JSON array with one entry per call: the import's return value, or `null`
//! for imports that return through memory; then one hex string per `dump`.

use serde_json::Value;

wit_bindgen::generate!({
    path: "../../../wit",
    world: "agent",
    // The world's wasi:http import is bound too; this guest never calls it.
    generate_all,
});

/// Bytes the program can write into and point the host at.
const SCRATCH_BYTES: usize = 64 << 10;

#[link(wasm_import_module = "idem:agent/once@0.1.1")]
unsafe extern "C" {
    #[link_name = "run-once"]
    fn run_once(key: i32, key_len: i32, fp: i32, fp_ptr: i32, fp_len: i32, ret: i32);
    #[link_name = "[method]claim.key"]
    fn claim_key(claim: i32, ret: i32);
    #[link_name = "[method]claim.attempt"]
    fn claim_attempt(claim: i32) -> i32;
    #[link_name = "[method]claim.in-doubt"]
    fn claim_in_doubt(claim: i32) -> i32;
    #[link_name = "[method]claim.token"]
    fn claim_token(claim: i32) -> i64;
    #[link_name = "[static]claim.commit"]
    fn claim_commit(
        claim: i32,
        value: i32,
        value_len: i32,
        save: i32,
        step: i64,
        state: i32,
        state_len: i32,
        ret: i32,
    );
    #[link_name = "[static]claim.release"]
    fn claim_release(claim: i32);
    #[link_name = "[static]claim.stop"]
    fn claim_stop(claim: i32, reason: i32, reason_len: i32);
    #[link_name = "[resource-drop]claim"]
    fn claim_drop(claim: i32);
}

#[link(wasm_import_module = "idem:agent/progress@0.1.1")]
unsafe extern "C" {
    #[link_name = "load"]
    fn progress_load(ret: i32);
    #[link_name = "save"]
    fn progress_save(step: i64, state: i32, state_len: i32, ret: i32);
}

#[link(wasm_import_module = "idem:agent/run-info@0.1.1")]
unsafe extern "C" {
    #[link_name = "run-id"]
    fn run_id(ret: i32);
    #[link_name = "generation"]
    fn generation() -> i32;
}

#[link(wasm_import_module = "idem:agent/outbound@0.1.1")]
unsafe extern "C" {
    #[link_name = "set-header-names"]
    fn set_header_names(key: i32, key_len: i32, token: i32, token_len: i32, ret: i32);
}

struct RawAbi;

impl Guest for RawAbi {
    fn run(input: Vec<u8>) -> Result<Vec<u8>, String> {
        let program: Value = serde_json::from_slice(&input).map_err(|e| e.to_string())?;
        // Leaked: the host may write into it until the instance ends.
        let scratch: &'static mut [u8] = Vec::leak(vec![0_u8; SCRATCH_BYTES]);
        let base = scratch.as_mut_ptr();
        let mut out = Vec::new();
        let ops = program["ops"].as_array().cloned().unwrap_or_default();
        for op in &ops {
            let at = op["at"].as_u64().unwrap_or(0) as usize;
            match op["op"].as_str().unwrap_or_default() {
                "write" => {
                    let bytes = unhex(op["hex"].as_str().unwrap_or_default());
                    for (i, byte) in bytes.into_iter().enumerate() {
                        if let Some(slot) = at.checked_add(i).filter(|&i| i < SCRATCH_BYTES) {
                            // SAFETY: in bounds of the leaked buffer.
                            unsafe { base.add(slot).write_volatile(byte) };
                        }
                    }
                }
                "grow" => {
                    let pages = op["pages"].as_u64().unwrap_or(0) as usize;
                    core::arch::wasm32::memory_grow(0, pages);
                }
                "call" => {
                    let args: Vec<i64> = op["args"]
                        .as_array()
                        .map(|args| args.iter().map(|a| arg(a, base)).collect())
                        .unwrap_or_default();
                    out.push(call(op["fn"].as_str().unwrap_or_default(), &args));
                }
                "dump" => {
                    let len = op["len"].as_u64().unwrap_or(0) as usize;
                    let end = at.saturating_add(len).min(SCRATCH_BYTES);
                    let bytes: Vec<u8> = (at.min(end)..end)
                        // SAFETY: in bounds of the leaked buffer.
                        .map(|i| unsafe { base.add(i).read_volatile() })
                        .collect();
                    out.push(Value::String(hex(&bytes)));
                }
                "fail" => return Err(op["text"].as_str().unwrap_or_default().to_string()),
                _ => {}
            }
        }
        Ok(Value::Array(out).to_string().into_bytes())
    }
}

export!(RawAbi);

/// One argument's 64 bits.
fn arg(value: &Value, base: *mut u8) -> i64 {
    let memory = (core::arch::wasm32::memory_size(0) as u64).wrapping_mul(65536);
    if let Some(n) = value.as_i64() {
        n
    } else if let Some(n) = value.as_u64() {
        n as i64
    } else if let Some(n) = value["scratch"].as_u64() {
        (base as u64).wrapping_add(n) as i64
    } else if let Some(n) = value["end"].as_u64() {
        memory.wrapping_sub(n) as i64
    } else if let Some(n) = value["load"].as_u64().map(|n| n as usize) {
        if n.checked_add(4).is_some_and(|end| end <= SCRATCH_BYTES) {
            // SAFETY: in bounds of the leaked buffer; unaligned reads are fine.
            i64::from(unsafe { base.add(n).cast::<u32>().read_unaligned() })
        } else {
            0
        }
    } else {
        0
    }
}

/// Calls the import `name` with `args` (0 past their end), each cut to the width the
/// import takes; returns what the import returned, or null.
fn call(name: &str, args: &[i64]) -> Value {
    let a = |i: usize| args.get(i).copied().unwrap_or(0);
    let w = |i: usize| a(i) as i32;
    // SAFETY: none, on purpose: every argument is whatever the program said. The
    // canonical ABI makes the host check pointers, lengths, handles and
    // discriminants; a write through a return pointer lands in this instance's own
    // memory, which at worst corrupts this guest.
    unsafe {
        match name {
            "run-once" => run_once(w(0), w(1), w(2), w(3), w(4), w(5)),
            "claim.key" => claim_key(w(0), w(1)),
            "claim.attempt" => return Value::from(claim_attempt(w(0))),
            "claim.in-doubt" => return Value::from(claim_in_doubt(w(0))),
            "claim.token" => return Value::from(claim_token(w(0)) as u64),
            "claim.commit" => claim_commit(w(0), w(1), w(2), w(3), a(4), w(5), w(6), w(7)),
            "claim.release" => claim_release(w(0)),
            "claim.stop" => claim_stop(w(0), w(1), w(2)),
            "claim.drop" => claim_drop(w(0)),
            "progress.load" => progress_load(w(0)),
            "progress.save" => progress_save(a(0), w(1), w(2), w(3)),
            "run-info.run-id" => run_id(w(0)),
            "run-info.generation" => return Value::from(generation()),
            "outbound.set-header-names" => set_header_names(w(0), w(1), w(2), w(3), w(4)),
            _ => {}
        }
    }
    Value::Null
}

fn unhex(text: &str) -> Vec<u8> {
    text.as_bytes()
        .chunks(2)
        .filter_map(|pair| {
            let pair = std::str::from_utf8(pair).ok()?;
            u8::from_str_radix(pair, 16).ok()
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
