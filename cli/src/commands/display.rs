//! How the commands show what the store and agents wrote: every string escaped before
//! it reaches a terminal (JSON included), times as ages, runs as one table.

use idem::ops::PricedUsage;
use idem::store::{Millis, RunRecord, RunStatus, Tokens};
use idem::text::{escape, json_for_terminal};

/// One line of JSON with every hidden character (controls, bidi, invisible) written as
/// a JSON `\u` escape: still the same JSON to a parser, harmless in a terminal.
pub fn json(value: &serde_json::Value) -> String {
    json_for_terminal(value)
}

/// A name from the store, safe to print on one line.
pub fn name(text: &str) -> String {
    escape(text, false).into_owned()
}

/// Bytes an agent produced, as text safe to print: JSON as compact JSON, anything else
/// as lossy UTF-8, escaped.
pub fn payload(bytes: &[u8]) -> String {
    match serde_json::from_slice::<serde_json::Value>(bytes) {
        Ok(value) => json(&value),
        Err(_) => escape(&String::from_utf8_lossy(bytes), true).into_owned(),
    }
}

/// The error a failed run ended with (its outcome), as text safe to print as lines;
/// `None` for a run that did not fail or left no error.
pub fn run_error(run: &RunRecord) -> Option<String> {
    if run.status != RunStatus::Failed {
        return None;
    }
    let outcome = run.outcome.as_deref().filter(|o| !o.is_empty())?;
    Some(match serde_json::from_slice::<serde_json::Value>(outcome) {
        // An error the agent returned as a JSON string is its text.
        Ok(serde_json::Value::String(text)) => escape(&text, true).into_owned(),
        Ok(value) => json(&value),
        Err(_) => escape(&String::from_utf8_lossy(outcome), true).into_owned(),
    })
}

/// The first line of `text`, cut at `max` characters (`…` marks a cut).
pub fn first_line(text: &str, max: usize) -> String {
    let line = text.lines().next().unwrap_or_default();
    match line.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None if text.trim_end().contains('\n') => format!("{line} …"),
        None => line.to_string(),
    }
}

/// Bytes an agent produced, as a JSON value for `--json` output.
pub use idem::ops::payload_value;

/// How long ago `at` was, from `now`: `5s`, `3m`, `2h`, `4d`.
pub fn age(now: Millis, at: Millis) -> String {
    let secs = now.saturating_sub(at).max(0) / 1000;
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// When `at` comes, from `now`: `in 12s`, or `12s ago`.
pub fn until(now: Millis, at: Millis) -> String {
    if at >= now {
        format!("in {}", age(at, now))
    } else {
        format!("{} ago", age(now, at))
    }
}

/// A time on the store's clock as UTC, to the second: `2026-12-03T22:00:00Z`.
pub fn utc(at: Millis) -> String {
    let secs = at.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil-from-days: the proleptic Gregorian date of a day number.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// What a suspended run waits for: `sleeping until T (in 59m)`, `waiting for NAME`
/// (`until T` if it times out); `None` for a run that is not suspended.
pub fn waiting(run: &RunRecord, now: Millis) -> Option<String> {
    if run.status.is_finished() || run.lease.is_some() {
        return None;
    }
    let wake = run.wake_at?;
    let when = (wake != Millis::MAX).then(|| format!("{} ({})", utc(wake), until(now, wake)));
    Some(match (&run.waiting_for, when) {
        (Some(signal), Some(when)) => format!("waiting for {} until {when}", name(signal)),
        (Some(signal), None) => format!("waiting for {}", name(signal)),
        (None, Some(when)) => format!("sleeping until {when}"),
        (None, None) => "sleeping".to_string(),
    })
}

/// The header of the runs table.
pub fn runs_header() -> String {
    format!(
        "{:<32} {:<10} {:>6} {:>8} {:>8} {:>8} {:>9} {:>9}  {:<20} {:>7} {:>5}",
        "RUN",
        "STATUS",
        "STEP",
        "EXECUTED",
        "SKIPPED",
        "AWAITED",
        "RECLAIMED",
        "INSTANCES",
        "AGENT",
        "VERSION",
        "AGE"
    )
}

/// One run as a row of the runs table.
pub fn run_row(run: &RunRecord, now: Millis) -> String {
    let step = run
        .step
        .map(|s| s.to_string())
        .unwrap_or_else(|| "-".into());
    let c = &run.counts;
    // The table's column is narrow: a suspended run shows what kind of wait it is in;
    // `idem show` says until when.
    let status = match waiting(run, now) {
        Some(_) if run.waiting_for.is_some() => "waiting",
        Some(_) => "sleeping",
        None => run.status.as_str(),
    };
    format!(
        "{:<32} {:<10} {:>6} {:>8} {:>8} {:>8} {:>9} {:>9}  {:<20} {:>7} {:>5}",
        name(&run.run_id),
        status,
        step,
        c.executed,
        c.skipped,
        c.awaited,
        c.reclaimed,
        c.instances,
        name(&run.agent),
        // The deployment's version the run is on; `-` for a run from before versions.
        run.version
            .map_or_else(|| "-".to_string(), |v| v.to_string()),
        age(now, run.created)
    )
}

/// One line per usage total: the model (after the deployment, with `deployment`), its
/// calls and spent tokens, its replays and saved tokens, and their costs when priced.
pub fn usage_lines(usage: &[PricedUsage], deployment: bool) -> Vec<String> {
    let tokens = |t: &Tokens| format!("in {} out {} cached {}", t.input, t.output, t.cached);
    let cost = |c: Option<f64>| c.map_or_else(String::new, |c| format!(" (cost {c:.6})"));
    usage
        .iter()
        .map(|u| {
            let t = &u.total;
            let who = if deployment {
                format!("{}  {}", name(&t.deployment), name(&t.model))
            } else {
                name(&t.model)
            };
            format!(
                "{who}  calls {}  spent {}{}  replays {}  saved {}{}",
                t.calls,
                tokens(&t.spent),
                cost(u.spent_cost),
                t.replays,
                tokens(&t.saved),
                cost(u.saved_cost)
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_names_the_civil_date() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_796_342_400_000 + 3_723_000), "2026-12-04T01:02:03Z");
    }

    #[test]
    fn json_escapes_hidden_characters_and_stays_json() {
        let value = serde_json::json!({"k": "a\u{1b}[2J\u{202e}b\u{e0041}"});
        let line = json(&value);
        assert!(
            !line.chars().any(|c| idem::text::hidden_char(c).is_some()),
            "{line}"
        );
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&line).unwrap(),
            value
        );
    }

    #[test]
    fn a_list_shows_an_errors_first_line() {
        assert_eq!(
            first_line("ValueError: no\n\nTraceback", 100),
            "ValueError: no …"
        );
        assert_eq!(first_line("short", 100), "short");
        assert_eq!(first_line("abcdef", 3), "abc…");
    }

    #[test]
    fn ages_read_as_people_write_them() {
        assert_eq!(age(10_000, 5_000), "5s");
        assert_eq!(age(600_000, 0), "10m");
        assert_eq!(until(0, 12_000), "in 12s");
        assert_eq!(until(12_000, 0), "12s ago");
    }
}
