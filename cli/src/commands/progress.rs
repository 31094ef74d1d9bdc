//! `idem run`'s progress line on a terminal: a spinner, the time taken, and the run's
//! counts as the store has them (executed, skipped, awaited, instances), redrawn four
//! times a second. Nothing is drawn when stderr is not a terminal.

use std::sync::Arc;
use std::time::Duration;

use idem::store::Store;
use indicatif::{ProgressBar, ProgressStyle};
use tokio::task::JoinHandle;

use super::display;

/// The progress line, while it is drawn.
pub struct Progress {
    bar: ProgressBar,
    poller: JoinHandle<()>,
}

impl Progress {
    /// Starts drawing the progress of run `run_id`, read from `store`.
    pub fn start(store: Arc<dyn Store>, run_id: &str) -> Progress {
        let bar = ProgressBar::new_spinner();
        if let Ok(style) =
            ProgressStyle::with_template("{spinner} {elapsed:>4} {prefix} {wide_msg}")
        {
            bar.set_style(style);
        }
        bar.set_prefix(format!("run {}", display::name(run_id)));
        bar.set_message("starting");
        bar.enable_steady_tick(Duration::from_millis(120));
        let poller = tokio::spawn({
            let bar = bar.clone();
            let run_id = run_id.to_string();
            async move {
                loop {
                    // The counts are what the run's host last wrote (a few times a
                    // second); a store that cannot answer leaves the line as it was.
                    if let Ok(Some(run)) = store.run(&run_id).await {
                        let c = run.counts;
                        bar.set_message(format!(
                            "executed {}  skipped {}  awaited {}  instances {}",
                            c.executed, c.skipped, c.awaited, c.instances
                        ));
                    }
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
        });
        Progress { bar, poller }
    }

    /// Stops drawing and clears the line: the run's report follows.
    pub fn finish(self) {
        self.poller.abort();
        self.bar.finish_and_clear();
    }
}
