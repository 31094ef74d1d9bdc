//! Where an agent's stderr and stdout go: escaped (a guest must never drive the
//! operator's terminal), kept as the run's log (its last [`LOG_KEEP`] bytes, written to
//! the store), and echoed to idem's own stderr when a person runs the agent in the
//! foreground.

use std::io::Write as _;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};

use crate::text;

/// How much of a run's log the store keeps: its last bytes.
pub const LOG_KEEP: usize = 64 << 10;

/// Where a foreground run shows what its agent writes, besides the run's log.
#[derive(Clone, Default)]
pub enum Echo {
    /// On idem's own stderr.
    #[default]
    Stderr,
    /// Nowhere: the log only.
    Off,
    /// Handed to this function, escaped (a terminal's progress line steps aside for
    /// it, say). It may get part of a line.
    To(Arc<dyn Fn(&str) + Send + Sync>),
}

impl Echo {
    /// Shows `text` (escaped already) where this says.
    pub(crate) fn show(&self, text: &str) {
        match self {
            Echo::Stderr => {
                let _ = std::io::stderr().write_all(text.as_bytes());
            }
            Echo::To(show) => show(text),
            Echo::Off => {}
        }
    }
}

impl std::fmt::Debug for Echo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Echo::Stderr => "Stderr",
            Echo::Off => "Off",
            Echo::To(_) => "To(..)",
        })
    }
}

/// The run's log as it is being written: shared by the guest's output streams (one
/// per instance) and the run's driver, which moves it to the store.
#[derive(Clone, Default)]
pub(crate) struct LogSink(Arc<Mutex<LogState>>);

#[derive(Default)]
struct LogState {
    /// Where the text is shown besides the log.
    echo: Echo,
    /// Escaped text not yet written to the store (its last `LOG_KEEP` bytes).
    pending: Vec<u8>,
    /// The start of a UTF-8 character split across two writes.
    split: Vec<u8>,
}

impl LogSink {
    /// A log that echoes to idem's stderr too (`echo`), or only goes to the store.
    pub(crate) fn new(echo: bool) -> LogSink {
        LogSink::echoing(if echo { Echo::Stderr } else { Echo::Off })
    }

    /// A log that shows what is written where `echo` says.
    pub(crate) fn echoing(echo: Echo) -> LogSink {
        LogSink(Arc::new(Mutex::new(LogState {
            echo,
            ..LogState::default()
        })))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LogState> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes what the guest wrote: escapes it, keeps it, echoes it.
    pub(crate) fn write(&self, bytes: &[u8]) {
        let mut state = self.lock();
        let mut data = std::mem::take(&mut state.split);
        data.extend_from_slice(bytes);
        // Keep an incomplete character for the next write rather than escape its half.
        let complete = match std::str::from_utf8(&data) {
            Ok(_) => data.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => data.len(),
        };
        state.split = data.split_off(complete);
        let shown = text::escape(&String::from_utf8_lossy(&data), true).into_owned();
        state.echo.show(&shown);
        state.pending.extend_from_slice(shown.as_bytes());
        if state.pending.len() > LOG_KEEP {
            let cut = state.pending.len() - LOG_KEEP;
            state.pending.drain(..cut);
        }
    }

    /// Where this log is shown besides the store.
    pub(crate) fn echo(&self) -> Echo {
        self.lock().echo.clone()
    }

    /// What was written since the last call, to be appended to the run's log.
    pub(crate) fn take(&self) -> Vec<u8> {
        std::mem::take(&mut self.lock().pending)
    }
}

/// The guest's stderr or stdout: a WASI output stream that writes into a [`LogSink`].
pub(crate) struct GuestOutput(pub(crate) LogSink);

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(SinkWriter(self.0.clone()))
    }
}

struct SinkWriter(LogSink);

impl AsyncWrite for SinkWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.0.write(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_escaped_kept_and_bounded() {
        let log = LogSink::new(false);
        log.write(b"line 1\n\x1b[2J evil\n");
        // "é" split across two writes is kept whole.
        log.write(&[b'a', 0xC3]);
        log.write(&[0xA9, b'\n']);
        let text = String::from_utf8(log.take()).unwrap();
        assert_eq!(text, "line 1\n\\u001b[2J evil\naé\n");
        assert!(log.take().is_empty());
        log.write(&vec![b'x'; LOG_KEEP + 10]);
        assert_eq!(log.take().len(), LOG_KEEP);
    }
}
