//! Tracing spans: one `idem.run` span per drive of a run (its id, agent and worker) and
//! one `idem.step` span per durable step inside it (key, outcome, token, duration),
//! captured by a subscriber the test installs.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use idem::runtime::FaultPlan;
use idem_test_artifacts::STEPS;
use serde_json::json;
use tracing::field::{Field, Visit};
use tracing::instrument::WithSubscriber;
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

use crate::util::{TestHost, agent, block_on};

/// A span as the test saw it: its name, its parent's name and its fields.
#[derive(Debug, Clone, Default)]
struct Seen {
    name: String,
    parent: Option<String>,
    fields: BTreeMap<String, String>,
}

/// Every span, in the order they were opened, and which one each live id names (the
/// registry reuses the id of a closed span).
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Spans>>);

#[derive(Default)]
struct Spans {
    opened: Vec<Seen>,
    live: BTreeMap<u64, usize>,
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
}

impl<S> Layer<S> for Capture
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut seen = Seen {
            name: attrs.metadata().name().to_string(),
            parent: ctx
                .span(id)
                .and_then(|span| span.parent())
                .map(|parent| parent.name().to_string()),
            ..Seen::default()
        };
        attrs.record(&mut Fields(&mut seen.fields));
        let mut all = self.0.lock().unwrap();
        let index = all.opened.len();
        all.opened.push(seen);
        all.live.insert(id.into_u64(), index);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _ctx: Context<'_, S>) {
        let mut all = self.0.lock().unwrap();
        if let Some(&index) = all.live.get(&id.into_u64()) {
            values.record(&mut Fields(&mut all.opened[index].fields));
        }
    }
}

#[test]
fn runs_and_durable_steps_have_spans_with_their_outcomes() {
    let t = TestHost::new();
    let steps = agent(STEPS);
    let capture = Capture::default();
    let subscriber = tracing_subscriber::registry().with(capture.clone());
    let dispatch = tracing::Dispatch::new(subscriber);
    // Other tests in this process register callsites on their threads while this
    // dispatcher is made; one registered in that window can keep an interest computed
    // without it (tracing-core caches interest per callsite). Computed again now, every
    // callsite counts this dispatcher.
    tracing::callsite::rebuild_interest_cache();
    // Shared keys: the second run finds the first run's results committed.
    for run_id in ["first", "second"] {
        let input = json!({ "steps": 3, "log": "/data/log.txt", "shared": true });
        let opts = t.options(run_id, input, FaultPlan::default());
        let report = block_on(t.host.run(&steps, &opts).with_subscriber(dispatch.clone()));
        assert_eq!(report.unwrap().status.as_str(), "completed");
    }
    let seen: Vec<Seen> = capture.0.lock().unwrap().opened.clone();
    let runs: Vec<&Seen> = seen.iter().filter(|s| s.name == "idem.run").collect();
    assert_eq!(runs.len(), 2, "{seen:#?}");
    for (span, id) in runs.iter().zip(["first", "second"]) {
        assert_eq!(span.fields["run_id"], id);
        assert_eq!(span.fields["agent"], "steps");
        assert_eq!(span.fields["status"], "completed");
        assert!(!span.fields["worker"].is_empty(), "{span:?}");
    }
    let steps: Vec<&Seen> = seen.iter().filter(|s| s.name == "idem.step").collect();
    assert_eq!(steps.len(), 6, "{seen:#?}");
    for (i, step) in steps.iter().enumerate() {
        assert_eq!(step.parent.as_deref(), Some("idem.run"), "{step:?}");
        let outcome = if i < 3 { "executed" } else { "skipped" };
        assert_eq!(step.fields["outcome"], outcome, "{step:?}");
        assert!(step.fields["key"].starts_with("steps:"), "{step:?}");
        assert!(step.fields.contains_key("duration_ms"), "{step:?}");
        assert_eq!(step.fields.contains_key("token"), i < 3, "{step:?}");
    }
}
