//! The bench's report: statistics over samples, the one markdown table, and the machine
//! and commit it was measured on.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

#[derive(Default)]
pub(crate) struct Table {
    rows: Vec<Row>,
}

struct Row {
    what: String,
    unit: &'static str,
    sorted: Vec<f64>,
    /// For rates, the tail worth showing is the slow one: the 1st percentile.
    higher_is_better: bool,
    ratio: Option<String>,
}

impl Table {
    pub(crate) fn row(&mut self, what: impl Into<String>, unit: &'static str, samples: Vec<f64>) {
        self.push(what.into(), unit, samples, false, None);
    }

    pub(crate) fn row_with_ratio(
        &mut self,
        what: String,
        unit: &'static str,
        samples: Vec<f64>,
        r: String,
    ) {
        self.push(what, unit, samples, false, Some(r));
    }

    pub(crate) fn rate_row(&mut self, what: String, samples: Vec<f64>, ratio: Option<String>) {
        self.rate_row_in(what, "steps/s", samples, ratio);
    }

    pub(crate) fn rate_row_in(
        &mut self,
        what: String,
        unit: &'static str,
        samples: Vec<f64>,
        ratio: Option<String>,
    ) {
        self.push(what, unit, samples, true, ratio);
    }

    fn push(
        &mut self,
        what: String,
        unit: &'static str,
        samples: Vec<f64>,
        higher_is_better: bool,
        ratio: Option<String>,
    ) {
        let row = Row {
            what,
            unit,
            sorted: sorted(samples),
            higher_is_better,
            ratio,
        };
        progress(&format!(
            "  {}: median {} {}",
            row.what,
            fmt(median(&row.sorted)),
            row.unit
        ));
        self.rows.push(row);
    }

    pub(crate) fn print(&self) {
        println!("| what | unit | median | p99 | n | ratio |");
        println!("|---|---|--:|--:|--:|---|");
        for row in &self.rows {
            let tail = if row.higher_is_better { 0.01 } else { 0.99 };
            println!(
                "| {} | {} | {} | {} | {} | {} |",
                row.what,
                row.unit,
                fmt(median(&row.sorted)),
                fmt(percentile(&row.sorted, tail)),
                row.sorted.len(),
                row.ratio.as_deref().unwrap_or("")
            );
        }
        println!();
        println!(
            "p99 is the nearest-rank 99th percentile (for steps/s and runs/s, the 1st: the slow tail); \
             with fewer than 100 samples it is the worst one."
        );
    }
}

pub(crate) fn sorted(mut samples: Vec<f64>) -> Vec<f64> {
    samples.sort_by(f64::total_cmp);
    samples
}

pub(crate) fn median(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// Nearest-rank percentile: the smallest sample with at least `p` of them at or below.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn fmt(v: f64) -> String {
    match v.abs() {
        a if a >= 1000.0 => format!("{v:.0}"),
        a if a >= 100.0 => format!("{v:.1}"),
        _ => format!("{v:.2}"),
    }
}

pub(crate) fn count(rows: u64) -> String {
    match rows {
        r if r >= 1_000_000 && r % 1_000_000 == 0 => format!("{} M", r / 1_000_000),
        r if r >= 1_000 && r % 1_000 == 0 => format!("{} k", r / 1_000),
        r => r.to_string(),
    }
}

pub(crate) fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

pub(crate) fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Progress goes to stderr, so that stdout is the report alone.
pub(crate) fn progress(message: &str) {
    eprintln!("{message}");
}

pub(crate) fn print_machine(dir: &Path, quick: bool) -> anyhow::Result<()> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown", |(_, model)| model.trim());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let (fs, device) = filesystem(dir)?;
    println!("# idem bench{}", if quick { " (--quick)" } else { "" });
    println!();
    println!("- commit: {}", git_commit());
    println!("- CPU: {cpu}, {cores} cores available");
    println!("- store files: {} ({fs} on {device})", dir.display());
    if matches!(fs.as_str(), "tmpfs" | "ramfs") {
        println!("- WARNING: {fs} does not sync to a disk; the fsync rows mean nothing here");
    }
    println!();
    Ok(())
}

/// The type and device of the mount holding `dir`: the longest mount point that is a
/// prefix of its canonical path.
fn filesystem(dir: &Path) -> anyhow::Result<(String, String)> {
    let dir = dir.canonicalize()?;
    let mounts = std::fs::read_to_string("/proc/mounts")?;
    let best = mounts
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (device, point, fs) = (fields.next()?, fields.next()?, fields.next()?);
            dir.starts_with(point).then_some((point.len(), fs, device))
        })
        .max_by_key(|(len, _, _)| *len);
    Ok(
        best.map_or(("unknown".into(), "unknown".into()), |(_, fs, dev)| {
            (fs.to_string(), dev.to_string())
        }),
    )
}

/// `git rev-parse HEAD` of the checkout the bench was built from, with `+dirty` when
/// tracked files differ from it.
fn git_commit() -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match git(&["rev-parse", "HEAD"]) {
        Some(commit) => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            format!("{commit}{}", if dirty { "+dirty" } else { "" })
        }
        None => "unknown (no git)".to_string(),
    }
}
