//! `idem logs`: what a run's agent wrote to stderr and stdout (the last 64 KiB, kept
//! in the store, escaped when it was written); with `--follow`, then what it writes
//! and publishes to its live stream as it comes, until the run ends.

use std::io::Write;

use clap::Parser;
use idem::ops::{FOLLOW_POLL, Follow, Followed};
use idem::store::{Store, StoreError};

use super::args::DbArgs;
use crate::exit::Exit;

#[derive(Debug, Parser)]
pub struct LogsCommand {
    /// The run.
    run_id: String,
    /// Keep printing until the run ends: what its agent writes to stderr and stdout,
    /// and the text its steps publish to the run's live stream (a model's tokens as
    /// they arrive), each step's text under a `[key]` line. The live stream is not
    /// durable: text published just before a crash may never show; the run's committed
    /// results are the truth.
    #[arg(short = 'f', long)]
    follow: bool,
    #[command(flatten)]
    db: DbArgs,
}

impl LogsCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        let store = self.db.open_read_only().await?;
        if store.run(&self.run_id).await?.is_none() {
            return Err(StoreError::UnknownRun {
                run_id: self.run_id.clone(),
            }
            .into());
        }
        let log = store.logs(&self.run_id).await?;
        print(&String::from_utf8_lossy(&log))?;
        if self.follow {
            follow(store.as_ref(), &self.run_id, log).await?;
        }
        Ok(Exit::Done)
    }
}

/// Escaped again on the way out: the store file may not be what idem wrote.
fn print(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(idem::text::escape(text, true).as_bytes())?;
    out.flush()
}

/// Prints the run's live stream and the rest of its log as they reach the store, until
/// the run ends. The log is looked at whenever the stream is idle for a poll.
async fn follow(store: &dyn Store, run_id: &str, mut log: Vec<u8>) -> anyhow::Result<()> {
    let mut follow = Follow::new(run_id, None);
    let mut key: Option<String> = None;
    let mut log_checked = tokio::time::Instant::now();
    loop {
        let next = tokio::select! {
            next = follow.next(store) => next?,
            () = tokio::time::sleep_until(log_checked + FOLLOW_POLL * 5) => {
                log_checked = tokio::time::Instant::now();
                let now = store.logs(run_id).await?;
                print(&String::from_utf8_lossy(log_tail(&log, &now)))?;
                log = now;
                continue;
            }
        };
        match next {
            Followed::Chunks(chunks) => {
                for chunk in chunks {
                    if key.as_deref() != Some(chunk.key.as_str()) {
                        print(&format!("\n[{}]\n", chunk.key))?;
                        key = Some(chunk.key);
                    }
                    print(&chunk.text)?;
                }
            }
            Followed::Ended(_) => {
                // The run's last words: its log is written before its end.
                let now = store.logs(run_id).await?;
                print(&String::from_utf8_lossy(log_tail(&log, &now)))?;
                if key.is_some() {
                    print("\n")?;
                }
                return Ok(());
            }
        }
    }
}

/// What `now` (the log as the store keeps it now) adds to `seen` (as it was read
/// before). The store keeps the log's last bytes only, so `now` may have lost the start
/// of `seen`: the new bytes follow the longest end of `seen` that `now` starts with.
fn log_tail<'a>(seen: &[u8], now: &'a [u8]) -> &'a [u8] {
    if now.starts_with(seen) {
        return &now[seen.len()..];
    }
    for cut in 1..seen.len() {
        if now.starts_with(&seen[cut..]) {
            return &now[seen.len() - cut..];
        }
    }
    now
}

#[cfg(test)]
mod tests {
    use super::log_tail;

    #[test]
    fn the_log_tail_is_what_was_added_even_after_a_trim() {
        assert_eq!(log_tail(b"", b"abc"), b"abc");
        assert_eq!(log_tail(b"abc", b"abcde"), b"de");
        assert_eq!(log_tail(b"abc", b"abc"), b"");
        // The store dropped "a" and "b" from the front while "de" came.
        assert_eq!(log_tail(b"abc", b"cde"), b"de");
        // Nothing in common: all of it is new.
        assert_eq!(log_tail(b"abc", b"xyz"), b"xyz");
    }
}
