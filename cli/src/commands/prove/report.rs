//! How `idem prove` shows what it found: a progress bar while it runs (on a terminal),
//! then a summary table and each violation with the command that reproduces it; or one
//! JSON object; and a JUnit XML file with a test case per scenario.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use idem::prove::{Progress, ProveReport, Scenario, ScenarioReport};
use indicatif::{ProgressBar, ProgressStyle};

use crate::commands::display;

/// Violations shown per scenario, and scenarios shown with theirs, before the rest is
/// left to `--json`.
const SHOWN_PER_SCENARIO: usize = 3;
const SHOWN_SCENARIOS: usize = 8;

/// The progress bar: drawn on stderr when it is a terminal, nothing otherwise.
pub struct Bar(Option<ProgressBar>);

impl Bar {
    pub fn new(terminal: bool) -> Bar {
        Bar(terminal.then(|| {
            let bar = ProgressBar::new(1);
            if let Ok(style) =
                ProgressStyle::with_template("{spinner} [{bar:30}] {pos}/{len} {wide_msg}")
            {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_message("the clean run");
            bar.enable_steady_tick(std::time::Duration::from_millis(120));
            bar
        }))
    }

    pub fn update(&self, progress: Progress<'_>) {
        let Some(bar) = &self.0 else { return };
        match progress {
            Progress::Planned { scenarios } => bar.set_length(scenarios as u64),
            Progress::Finished(done) => {
                bar.inc(1);
                let mark = if done.passed() { "ok" } else { "VIOLATED" };
                bar.set_message(format!("{} {mark}", done.scenario));
            }
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

/// The group a scenario is counted under in the table.
fn group(scenario: &Scenario) -> String {
    match scenario {
        Scenario::Clean => "clean".into(),
        Scenario::Crash { point } => point.phase.to_string(),
        Scenario::Chaos { .. } => "chaos".into(),
        Scenario::Kills { .. } => "kills".into(),
    }
}

#[derive(Default)]
struct Row {
    scenarios: u64,
    not_reached: u64,
    effects: u64,
    in_doubt: u64,
    violations: u64,
}

impl Row {
    fn add(&mut self, s: &ScenarioReport) {
        self.scenarios += 1;
        self.not_reached += u64::from(!s.reached);
        self.effects += s.effects;
        self.in_doubt += s.duplicates_in_doubt;
        self.violations += s.violations.len() as u64;
    }
}

/// The text report on stdout.
pub fn print(agent: &Path, found: &ProveReport, reproduce: &dyn Fn(&Scenario) -> String) {
    let steps = found.clean.keys.len();
    println!(
        "idem prove {}: {steps} steps, {} scenarios",
        display::name(&agent.to_string_lossy()),
        found.summary.scenarios
    );
    let total = table(found);
    println!();
    if total.not_reached > 0 {
        println!(
            "not reached: the crash point lies at a boundary the run never passes (a save the \
             agent does not make, say), so that scenario ran uninterrupted"
        );
    }
    if total.in_doubt > 0 {
        println!(
            "in doubt: effects repeated under a claim retaken in doubt after a crash inside \
             the effect (same key, higher token): allowed, and flagged to the agent"
        );
    }
    if let Some(note) = no_effect_note(found) {
        println!("{note}");
    }
    for note in &found.notes {
        println!("{note}");
    }
    if found.passed() {
        println!(
            "verdict: PASSED — every key committed once, no unexplained repeat, the same \
             output in every scenario"
        );
        return;
    }
    violations(found, reproduce);
}

/// What to say when the clean run made steps but no effect idem prove can see: its
/// PASSED then rests on the keys alone, and the agent's author should know it.
fn no_effect_note(found: &ProveReport) -> Option<String> {
    let clean = found.scenarios.first()?;
    if clean.effects > 0 || found.clean.keys.is_empty() {
        return None;
    }
    Some(format!(
        "observed no side effect: idem prove sees only HTTP requests the agent sends and \
         lines added to files under its --dir grants, and the clean run's {} steps made \
         neither; an effect made any other way (a value only computed, a write outside the \
         grants) is checked through its key alone (each committed once, none unstable)",
        found.clean.keys.len()
    ))
}

/// The table of scenarios by group, and its total row, which it returns.
fn table(found: &ProveReport) -> Row {
    let mut order: Vec<String> = vec!["clean".into()];
    order.extend(super::every_phase().map(|p| p.to_string()));
    order.extend(["chaos".into(), "kills".into()]);
    let mut rows: BTreeMap<String, Row> = BTreeMap::new();
    for s in &found.scenarios {
        rows.entry(group(&s.scenario)).or_default().add(s);
    }
    println!();
    println!(
        "{:<14} {:>9} {:>11} {:>8} {:>9} {:>10}",
        "scenario", "runs", "not reached", "effects", "in doubt", "violations"
    );
    let mut total = Row::default();
    for name in &order {
        let Some(row) = rows.get(name) else { continue };
        println!(
            "{:<14} {:>9} {:>11} {:>8} {:>9} {:>10}",
            name, row.scenarios, row.not_reached, row.effects, row.in_doubt, row.violations
        );
        total.scenarios += row.scenarios;
        total.not_reached += row.not_reached;
        total.effects += row.effects;
        total.in_doubt += row.in_doubt;
        total.violations += row.violations;
    }
    println!(
        "{:<14} {:>9} {:>11} {:>8} {:>9} {:>10}",
        "total",
        total.scenarios,
        total.not_reached,
        total.effects,
        total.in_doubt,
        total.violations
    );
    total
}

/// What failed: the verdict's counts, then each failed scenario with its first
/// violations and the command that reproduces it.
fn violations(found: &ProveReport, reproduce: &dyn Fn(&Scenario) -> String) {
    let failed: Vec<&ScenarioReport> = found.scenarios.iter().filter(|s| !s.passed()).collect();
    let kinds: Vec<String> = found
        .summary
        .by_kind
        .iter()
        .map(|(kind, n)| format!("{n} {kind}"))
        .collect();
    println!(
        "verdict: FAILED — {} violations in {} of {} scenarios ({})",
        found.summary.violations,
        failed.len(),
        found.summary.scenarios,
        kinds.join(", ")
    );
    for s in failed.iter().take(SHOWN_SCENARIOS) {
        println!();
        println!("{}:", s.scenario);
        let mut hinted = Vec::new();
        for v in s.violations.iter().take(SHOWN_PER_SCENARIO) {
            println!("  {}: {}", v.kind, display::name(&v.detail));
            if let Some(hint) = v.hint.as_ref().filter(|h| !hinted.contains(h)) {
                println!("    hint: {hint}");
                hinted.push(hint);
            }
        }
        if s.violations.len() > SHOWN_PER_SCENARIO {
            println!(
                "  … and {} more (--json lists them all)",
                s.violations.len() - SHOWN_PER_SCENARIO
            );
        }
        println!("  reproduce: {}", reproduce(&s.scenario));
    }
    if failed.len() > SHOWN_SCENARIOS {
        println!();
        println!(
            "… and {} more scenarios with violations (--json lists them all)",
            failed.len() - SHOWN_SCENARIOS
        );
    }
}

/// The report as JSON, each scenario with the command that reproduces it.
pub fn json(found: &ProveReport, reproduce: &dyn Fn(&Scenario) -> String) -> serde_json::Value {
    let mut doc = serde_json::to_value(found).unwrap_or_default();
    doc["passed"] = found.passed().into();
    doc["no_effect_observed"] = no_effect_note(found).is_some().into();
    if let Some(note) = no_effect_note(found) {
        doc["note"] = note.into();
    }
    if let Some(list) = doc["scenarios"].as_array_mut() {
        for (value, s) in list.iter_mut().zip(&found.scenarios) {
            value["name"] = s.scenario.to_string().into();
            value["passed"] = s.passed().into();
            value["reproduce"] = reproduce(&s.scenario).into();
        }
    }
    doc
}

/// The report as JUnit XML: a test suite of one test case per scenario; a violated one
/// fails, with its violations and the command that reproduces it; one whose fault was
/// never reached is skipped.
pub fn junit(agent: &Path, found: &ProveReport, reproduce: &dyn Fn(&Scenario) -> String) -> String {
    let seconds = |ms: u64| format!("{:.3}", ms as f64 / 1000.0);
    let total_ms: u64 = found.scenarios.iter().map(|s| s.millis).sum();
    let failures = found.scenarios.iter().filter(|s| !s.passed()).count();
    let skipped = found
        .scenarios
        .iter()
        .filter(|s| s.passed() && !s.reached)
        .count();
    let suite = format!("idem prove {}", agent.to_string_lossy());
    let mut xml = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        xml,
        "<testsuites name=\"idem prove\" tests=\"{}\" failures=\"{failures}\" time=\"{}\">",
        found.scenarios.len(),
        seconds(total_ms)
    );
    let _ = writeln!(
        xml,
        "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failures}\" skipped=\"{skipped}\" \
         time=\"{}\">",
        xml_escape(&suite),
        found.scenarios.len(),
        seconds(total_ms)
    );
    for s in &found.scenarios {
        let _ = write!(
            xml,
            "    <testcase classname=\"idem.prove.{}\" name=\"{}\" time=\"{}\"",
            xml_escape(&group(&s.scenario)),
            xml_escape(&s.scenario.to_string()),
            seconds(s.millis)
        );
        if s.passed() && s.reached {
            xml.push_str("/>\n");
            continue;
        }
        xml.push_str(">\n");
        if s.passed() {
            xml.push_str(
                "      <skipped message=\"the fault was never reached: the run went \
                 uninterrupted\"/>\n",
            );
        } else {
            let kinds: Vec<&str> = s.violations.iter().map(|v| v.kind.name()).collect();
            let mut body = String::new();
            for v in &s.violations {
                let _ = writeln!(body, "{}: {}", v.kind, v.detail);
                if let Some(hint) = &v.hint {
                    let _ = writeln!(body, "  hint: {hint}");
                }
            }
            let _ = writeln!(body, "reproduce: {}", reproduce(&s.scenario));
            let _ = writeln!(
                xml,
                "      <failure type=\"{}\" message=\"{} violations\">{}</failure>",
                xml_escape(&kinds.join(",")),
                s.violations.len(),
                xml_escape(&body)
            );
        }
        xml.push_str("    </testcase>\n");
    }
    xml.push_str("  </testsuite>\n</testsuites>\n");
    xml
}

/// Text made safe for XML attributes and content; characters XML 1.0 cannot hold at
/// all (most C0 controls) are written as `\u{XX}`.
pub(crate) fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' | '\t' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{fffe}' || c == '\u{ffff}' => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_escapes_markup_and_controls() {
        assert_eq!(xml_escape("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
        assert_eq!(xml_escape("x\u{1b}y"), "x\\u{1b}y");
    }
}
