//! Where the text an agent publishes goes (`idem:agent/live`): escaped (a reader's
//! terminal must never be driven by a guest), gathered per run, and moved to the store
//! by the instance's watchdog a few times a second while it runs ([`LIVE_FLUSH`]) and
//! once more at its end. Not durable: what a crash catches here is lost, which the
//! stream's readers are told (the committed result is the truth). A run in the
//! foreground also shows it as it comes, where the run's log is echoed (`idem run`'s
//! terminal), each step's text under its key as `idem logs -f` prints it.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

use super::output::Echo;
use crate::store::{LIVE_KEEP, LiveText, MAX_LIVE_CHUNK_BYTES};
use crate::text;

/// How long published text waits before it is moved to the store: short enough that
/// a reader sees tokens arrive as a stream, long enough that a model's tokens are
/// written a few per row rather than one row each.
pub(crate) const LIVE_FLUSH: Duration = Duration::from_millis(150);

/// The run's live text not yet in the store: shared by the `live` import of each
/// instance and the watchdog that flushes it.
#[derive(Clone)]
pub(crate) struct LiveSink(Arc<LiveState>);

impl Default for LiveSink {
    /// A sink that shows nothing: the store only.
    fn default() -> Self {
        LiveSink::echoing(Echo::Off)
    }
}

struct LiveState {
    /// Where the text is shown as it comes, besides the store.
    echo: Echo,
    /// The step whose text was shown last: another step's starts under its key.
    shown_key: Mutex<Option<String>>,
    pending: Mutex<Pending>,
    /// Woken when text arrives with none pending: the watchdog's cue to flush soon.
    ready: Notify,
}

#[derive(Default)]
struct Pending {
    chunks: Vec<LiveText>,
    bytes: usize,
}

impl LiveSink {
    /// A sink that also shows the text where `echo` says (a foreground run's log).
    pub(crate) fn echoing(echo: Echo) -> LiveSink {
        LiveSink(Arc::new(LiveState {
            echo,
            shown_key: Mutex::default(),
            pending: Mutex::default(),
            ready: Notify::new(),
        }))
    }

    /// Shows `shown` (escaped) as the next text of step `key`.
    fn show(&self, key: &str, shown: &str) {
        if matches!(self.0.echo, Echo::Off) {
            return;
        }
        let mut last = self
            .0
            .shown_key
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let text = if last.as_deref() == Some(key) {
            shown.to_owned()
        } else {
            *last = Some(key.to_owned());
            format!("\n[{}]\n{shown}", text::escape(key, true))
        };
        self.0.echo.show(&text);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.0
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes `text` (checked by the caller) as the next chunk of step `key`: joined to
    /// the chunk before it when that is the same key's and the two fit one chunk, so
    /// that a model's tokens become a few rows per flush. Beyond what the store would
    /// keep of the run anyway, the oldest pending chunks are dropped.
    pub(crate) fn publish(&self, key: &str, text: &str) {
        let shown = text::escape(text, true);
        self.show(key, &shown);
        let len = shown.len();
        let mut pending = self.lock();
        let was_empty = pending.chunks.is_empty();
        match pending.chunks.last_mut() {
            Some(last)
                if last.key == key && last.text.len() + shown.len() <= MAX_LIVE_CHUNK_BYTES =>
            {
                last.text.push_str(&shown);
            }
            _ => pending.chunks.push(LiveText {
                key: key.to_owned(),
                text: shown.into_owned(),
            }),
        }
        pending.bytes += len;
        while pending.bytes > LIVE_KEEP && pending.chunks.len() > 1 {
            let dropped = pending.chunks.remove(0);
            pending.bytes -= dropped.text.len().min(pending.bytes);
        }
        drop(pending);
        if was_empty {
            self.0.ready.notify_one();
        }
    }

    /// What was published since the last call, to be appended to the run's stream.
    pub(crate) fn take(&self) -> Vec<LiveText> {
        let mut pending = self.lock();
        pending.bytes = 0;
        std::mem::take(&mut pending.chunks)
    }

    /// Resolves once text is pending (at once if some arrived since the last wait).
    pub(crate) async fn published(&self) {
        self.0.ready.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_of_a_key_are_joined_escaped_and_bounded() {
        let sink = LiveSink::default();
        sink.publish("a", "Hel");
        sink.publish("a", "lo\n\u{1b}[2J");
        sink.publish("b", "other");
        sink.publish("a", "again");
        let taken = sink.take();
        let pairs: Vec<(&str, &str)> = taken
            .iter()
            .map(|c| (c.key.as_str(), c.text.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [("a", "Hello\n\\u001b[2J"), ("b", "other"), ("a", "again")]
        );
        assert!(sink.take().is_empty());
        // A full chunk starts another.
        let big = "x".repeat(MAX_LIVE_CHUNK_BYTES);
        sink.publish("a", &big);
        sink.publish("a", "y");
        assert_eq!(sink.take().len(), 2);
        // Past what the store keeps, the oldest pending text goes.
        for _ in 0..(LIVE_KEEP / MAX_LIVE_CHUNK_BYTES + 4) {
            sink.publish("a", &big);
        }
        let kept = sink.take();
        assert!(kept.iter().map(|c| c.text.len()).sum::<usize>() <= LIVE_KEEP);
        assert_eq!(kept.len(), LIVE_KEEP / MAX_LIVE_CHUNK_BYTES);
    }

    #[test]
    fn a_foreground_run_shows_each_steps_text_under_its_key() {
        let shown = Arc::new(Mutex::new(String::new()));
        let sink = {
            let shown = Arc::clone(&shown);
            LiveSink::echoing(Echo::To(Arc::new(move |text: &str| {
                shown.lock().unwrap().push_str(text);
            })))
        };
        sink.publish("a", "Hel");
        sink.publish("a", "lo");
        sink.publish("b\u{1b}", "\u{1b}[2J");
        sink.publish("a", "!");
        assert_eq!(
            *shown.lock().unwrap(),
            "\n[a]\nHello\n[b\\u001b]\n\\u001b[2J\n[a]\n!"
        );
        // Shown or not, the text goes to the store.
        assert_eq!(sink.take().len(), 3);
        let quiet = LiveSink::default();
        quiet.publish("a", "x");
        assert_eq!(quiet.take().len(), 1);
    }

    #[test]
    fn the_first_pending_text_wakes_the_flusher() {
        let sink = LiveSink::default();
        sink.publish("a", "x");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        // The wake-up was kept for the waiter that comes later.
        runtime.block_on(sink.published());
    }
}
