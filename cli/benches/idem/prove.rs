//! The proof row: the wall time of `idem prove` (the real binary) on the ledger example,
//! every phase at each of its first ten steps — 51 scenarios, each a fresh scratch store
//! and a copy of the granted directory.

use std::process::Command;
use std::time::Instant;

use anyhow::ensure;
use idem_test_artifacts::LEDGER;
use serde_json::json;

use super::report::{Table, millis};
use super::{Bed, Plan, repeat};

pub(crate) fn prove(bed: &Bed, plan: &Plan, table: &mut Table) -> anyhow::Result<()> {
    let data = bed.dir.join("prove-data");
    std::fs::create_dir_all(&data)?;
    let scratch = bed.dir.join("prove-scratch");
    let items: Vec<String> = (0..10).map(|i| format!("item-{i}")).collect();
    let input = json!({ "items": items, "log": "/data/ledger.log" }).to_string();
    let grant = format!("{}::/data", data.display());
    let mut samples = Vec::new();
    repeat(plan.prove, || {
        let began = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(["prove", LEDGER, "--input", &input, "--dir", &grant])
            .args(["--phases", "all", "--steps", "10", "--scratch"])
            .arg(&scratch)
            .env("XDG_CACHE_HOME", bed.dir.join("cache"))
            .output()?;
        samples.push(millis(began.elapsed()));
        ensure!(
            out.status.success(),
            "idem prove failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    })?;
    table.row(
        "`idem prove` ledger, 5 phases × 10 steps (51 scenarios), wall",
        "ms",
        samples,
    );
    Ok(())
}
