//! Example agent: appends one line per item to a ledger file, exactly once per item,
//! resuming from its checkpoint after any crash.
//!
//! Input: `{"items": ["apples", "pears"], "log": "/data/ledger.log"}`, where `/data` is
//! a folder the host grants (`--dir HOST::/data`). Output:
//! `{"processed": 2, "total": 11, "checksum": "<16 hex digits>"}`, computed only from
//! committed results, so a run crashed and resumed any number of times prints exactly
//! what an uncrashed run prints.
//!
//! Each append writes `{key} attempt={attempt} token={token} item={item}` to the log.

use std::fs::OpenOptions;
use std::io::Write;

use idem_sdk::{Agent, Checkpoint, Error, Key, Once, load};
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
struct Input {
    items: Vec<String>,
    log: String,
}

#[derive(Serialize)]
struct Output {
    processed: u64,
    total: u64,
    checksum: String,
}

/// What one append commits. It is derived from the item alone, so whichever instance
/// ran the append, every later instance reads back the same value.
#[derive(Serialize, Deserialize)]
struct Entry {
    bytes: u64,
    hash: u64,
}

/// The running totals, carried across instances in the checkpoint.
#[derive(Serialize, Deserialize, Default, Clone, Copy)]
struct Totals {
    total: u64,
    checksum: u64,
}

impl Totals {
    fn add(self, entry: &Entry) -> Totals {
        Totals {
            total: self.total + entry.bytes,
            checksum: (self.checksum ^ entry.hash).wrapping_mul(FNV_PRIME),
        }
    }
}

struct Ledger;

impl Agent for Ledger {
    type Input = Input;
    type Output = Output;

    fn run(input: Input) -> Result<Output, Error> {
        // The checkpoint's `step` is the index of the next item to append.
        let (start, mut totals) = match load::<Totals>()? {
            Some(checkpoint) => (checkpoint.step, checkpoint.state),
            None => (0, Totals::default()),
        };
        let start = usize::try_from(start).unwrap_or(usize::MAX);

        for (i, item) in input.items.iter().enumerate().skip(start) {
            // Named by what it does (this position, this item), never by time or
            // attempt: a resumed instance computes the same key, and an append
            // committed before the crash is skipped instead of written twice.
            let key = Key::for_run("append", &(i, item))?;
            // The append's result and the next checkpoint are committed in ONE store
            // transaction: the map (checkpoint) never lags the cargo (appends) here.
            let (entry, _outcome) = Once::new(&key).run_and_save(
                |step| {
                    let line = format!(
                        "{} attempt={} token={} item={item}\n",
                        step.key(),
                        step.attempt(),
                        step.token()
                    );
                    append(&input.log, &line)?;
                    Ok::<_, String>(Entry::of(item))
                },
                // Fold the committed entry, not a recomputed one: that is what keeps
                // the output identical however often the run was resumed.
                |entry: &Entry| Checkpoint {
                    step: i as u64 + 1,
                    state: totals.add(entry),
                },
            )?;
            totals = totals.add(&entry);
        }

        Ok(Output {
            processed: input.items.len() as u64,
            total: totals.total,
            checksum: format!("{:016x}", totals.checksum),
        })
    }
}

idem_sdk::export_agent!(Ledger);

/// Appends `line` in one write and makes it durable before `run_once` commits: a
/// committed step must never refer to a line the disk could still lose.
fn append(path: &str, line: &str) -> Result<(), String> {
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|err| format!("{path}: {err}"))?;
    file.write_all(line.as_bytes())
        .and_then(|()| file.flush())
        .and_then(|()| file.sync_all())
        .map_err(|err| format!("{path}: {err}"))
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

impl Entry {
    fn of(item: &str) -> Entry {
        // FNV-1a: a tiny deterministic hash, enough for a checksum.
        let hash = item.bytes().fold(FNV_OFFSET, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(FNV_PRIME)
        });
        Entry {
            bytes: item.len() as u64,
            hash,
        }
    }
}
