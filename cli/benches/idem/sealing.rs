//! The encryption-at-rest rows: a durable step on a store whose payloads are sealed
//! (its result and checkpoint sealed on the way in), against the same step on a store
//! in clear, in the same turns, for each durability.

use std::sync::Arc;

use idem::runtime::Host;
use idem::store::{self, StoreKey, StoreOptions, SyncMode};

use super::report::{Table, median, sorted};
use super::{Bed, BenchHost, Plan, repeat};

pub(crate) fn sealing(bed: &Bed, plan: &Plan, table: &mut Table) -> anyhow::Result<()> {
    let key = StoreKey::generate()?;
    for sync in [SyncMode::Normal, SyncMode::Full] {
        let plain = bed.host(&bed.dir.join(format!("clear-{sync}.db")), sync)?;
        let path = bed.dir.join(format!("sealed-{sync}.db"));
        let options = StoreOptions {
            sync,
            key: Some(key.clone()),
            ..StoreOptions::default()
        };
        let sealed_store = bed
            .tokio
            .block_on(store::open(path.to_str().unwrap_or_default(), &options))?;
        let sealed = {
            let _inside = bed.tokio.enter();
            BenchHost {
                host: Arc::new(Host::new(Arc::clone(&bed.runtime), sealed_store)?),
                sync,
                sqlite: None,
            }
        };
        let n = plan.sealing.n;
        bed.steps(&plain, n.min(50))?;
        bed.steps(&sealed, n.min(50))?;
        let (mut clear, mut sealed_steps) = (Vec::new(), Vec::new());
        repeat(plan.sealing, || {
            clear.extend(bed.timed_run(&plain, n, true)?);
            sealed_steps.extend(bed.timed_run(&sealed, n, true)?);
            Ok(())
        })?;
        let (clear_median, sealed_median) = (
            median(&sorted(clear.clone())),
            median(&sorted(sealed_steps.clone())),
        );
        table.row(
            format!("sealing: a durable step, store in clear, SQLite sync {sync}"),
            "µs",
            clear,
        );
        table.row_with_ratio(
            format!("sealing: the same step, store encrypted at rest, SQLite sync {sync}"),
            "µs",
            sealed_steps,
            format!("{:.2}× the step in clear", sealed_median / clear_median),
        );
    }
    Ok(())
}
