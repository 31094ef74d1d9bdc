//! `idem run`'s progress line on a terminal: a spinner, the time taken, and the run's
//! counts as the store has them (executed, skipped, awaited, instances), redrawn four
//! times a second. Nothing is drawn when stderr is not a terminal.

use std::io::Write as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idem::runtime::Echo;
use idem::store::Store;
use indicatif::{ProgressBar, ProgressStyle};
use tokio::task::JoinHandle;

use super::display;

/// The progress line, while it is drawn.
pub struct Progress {
    bar: ProgressBar,
    poller: JoinHandle<()>,
    /// What the agent wrote after its last newline: held until the line is whole, so
    /// that redrawing the progress line never wipes half a line of it.
    partial: Arc<Mutex<String>>,
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
        Progress {
            bar,
            poller,
            partial: Arc::default(),
        }
    }

    /// Where the agent's output goes while the line is drawn: whole lines, printed
    /// above it.
    pub fn echo(&self) -> Echo {
        let bar = self.bar.clone();
        let partial = Arc::clone(&self.partial);
        Echo::To(Arc::new(move |text: &str| {
            let mut held = partial.lock().unwrap_or_else(PoisonError::into_inner);
            held.push_str(text);
            if let Some(end) = held.rfind('\n') {
                let lines: String = held.drain(..=end).collect();
                bar.suspend(|| {
                    let _ = std::io::stderr().write_all(lines.as_bytes());
                });
            }
        }))
    }

    /// Stops drawing and clears the line: the run's report follows.
    pub fn finish(self) {
        self.poller.abort();
        self.bar.finish_and_clear();
        let rest =
            std::mem::take(&mut *self.partial.lock().unwrap_or_else(PoisonError::into_inner));
        if !rest.is_empty() {
            let _ = std::io::stderr().write_all(rest.as_bytes());
        }
    }
}
