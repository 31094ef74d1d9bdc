//! The rate-limit rows: what naming a rate class costs a durable step when the class
//! has tokens to spare (the token's wait is recorded, in a transaction of its own,
//! before the claim), against the same step with no class, in the same turns.

use std::time::Duration;

use anyhow::ensure;
use idem::runtime::FaultPlan;
use idem::store::{RateSetting, SyncMode};
use serde_json::json;

use super::report::{Table, median, sorted};
use super::{Bed, Plan, repeat};

pub(crate) fn rates(bed: &Bed, plan: &Plan, table: &mut Table) -> anyhow::Result<()> {
    for sync in [SyncMode::Normal, SyncMode::Full] {
        let host = bed.host(&bed.dir.join(format!("rates-{sync}.db")), sync)?;
        // A limit no step of the bench reaches: a million a second, a burst of a million.
        bed.tokio
            .block_on(host.host.store().set_rate(&RateSetting {
                class: "llm",
                limit: 1_000_000,
                period: Duration::from_secs(1),
                burst: 1_000_000,
            }))?;
        let n = plan.rates.n;
        let (mut plain, mut rated) = (Vec::new(), Vec::new());
        repeat(plan.rates, || {
            plain.extend(bed.timed_run(&host, n, true)?);
            let input = json!({ "mode": "steps", "n": n, "timed": true, "rate": "llm" });
            let (report, output) = bed.run(&host, input, FaultPlan::default())?;
            ensure!(
                report.counts.executed == n && report.counts.instances == 1,
                "a rate-limited run with tokens to spare never waits: {:?}",
                report.counts
            );
            rated.extend(output.step_ns.iter().map(|&ns| ns as f64 / 1e3));
            Ok(())
        })?;
        let (plain_median, rated_median) = (
            median(&sorted(plain.clone())),
            median(&sorted(rated.clone())),
        );
        table.row(
            format!("rates: a durable step, no rate class, sync {sync}"),
            "µs",
            plain,
        );
        table.row_with_ratio(
            format!(
                "rates: a durable step of a rate-limited class with tokens to spare, sync {sync}"
            ),
            "µs",
            rated,
            format!("{:.2}× the step with no class", rated_median / plain_median),
        );
    }
    Ok(())
}
