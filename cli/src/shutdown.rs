//! One way to stop, for the commands that run until told to (`idem run`, `idem worker`,
//! `idem serve`): the first SIGTERM or SIGINT asks for a drain, a second ends the
//! process at once with exit code 130.
//!
//! The signals are wired here, once, and the request is handed down as a future that
//! the library's loops take as their `shutdown` (as mini-redis's `Shutdown` and
//! wasmtime's `serve` do): what a drain means — no new work, side effects in flight
//! end at their commit, leases given back — is the library's to say, and nothing is
//! killed by surprise. A second signal is the operator's word that waiting is over:
//! the process exits where it stands, and what it held is taken over after its leases.

use std::future::Future;

use idem::runtime::StopSignal;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::exit::Exit;

/// A stop that signals ask for, listened for while it lives.
pub struct Shutdown {
    requested: watch::Receiver<bool>,
    listener: JoinHandle<()>,
}

impl Shutdown {
    /// Listens for SIGTERM and SIGINT from now on. The first prints `COMMAND: DRAINING`
    /// on stderr (`command` as in `idem worker`, `draining` saying what happens now and
    /// that a second signal exits) and asks for the stop; a second prints `COMMAND:
    /// exiting at once` and exits with 130.
    ///
    /// Until this is called a signal ends the process as it would any other: `idem
    /// worker` calls it first of all, so that a stop asked while it starts is a drain
    /// of nothing (exit 0), not a death by signal.
    pub fn on_signals(command: &'static str, draining: &'static str) -> std::io::Result<Shutdown> {
        let signals = Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        };
        Ok(Shutdown::listen(
            signals,
            move || eprintln!("{command}: {draining}"),
            move || {
                eprintln!("{command}: exiting at once");
                std::process::exit(Exit::Interrupted as i32);
            },
        ))
    }

    /// Listens to `requests`: the first calls `draining` and asks for the stop, the
    /// second calls `at_once`.
    fn listen(
        mut requests: impl Requests,
        draining: impl FnOnce() + Send + 'static,
        at_once: impl FnOnce() + Send + 'static,
    ) -> Shutdown {
        let (ask, requested) = watch::channel(false);
        let listener = tokio::spawn(async move {
            requests.next().await;
            draining();
            ask.send_replace(true);
            requests.next().await;
            at_once();
        });
        Shutdown {
            requested,
            listener,
        }
    }

    /// Resolves once the stop was asked for (at once if it already was): what a run, a
    /// worker or a server takes as its `shutdown`. Each call is a future of its own, so
    /// that all of them hear the one request.
    pub fn requested(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut requested = self.requested.clone();
        async move {
            // The sender goes only with the listener: once nothing listens for signals,
            // no stop will ever be asked.
            if requested.wait_for(|asked| *asked).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

impl Shutdown {
    /// The request as the library's [`StopSignal`], for a run's options: raised when
    /// the stop is asked for.
    pub fn stop_signal(&self) -> StopSignal {
        let stop = StopSignal::new();
        let raise = stop.clone();
        let requested = self.requested();
        tokio::spawn(async move {
            requested.await;
            raise.stop();
        });
        stop
    }
}

impl Drop for Shutdown {
    /// The command is over: a signal from now on changes nothing it could still stop.
    fn drop(&mut self) {
        self.listener.abort();
    }
}

/// Where stop requests come from: each `next` resolves at one.
trait Requests: Send + 'static {
    fn next(&mut self) -> impl Future<Output = ()> + Send;
}

/// SIGTERM (what service managers and `kill` send) and SIGINT (Ctrl-C) alike.
struct Signals {
    term: Signal,
    int: Signal,
}

impl Requests for Signals {
    async fn next(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::sync::{mpsc, oneshot};

    use super::*;

    impl Requests for mpsc::UnboundedReceiver<()> {
        async fn next(&mut self) {
            if self.recv().await.is_none() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Long enough for the listener to act on a request it was sent, were it going to.
    const SETTLE: Duration = Duration::from_millis(100);

    #[tokio::test]
    async fn the_first_request_asks_for_a_drain_and_the_second_ends_at_once() {
        let (send, requests) = mpsc::unbounded_channel();
        let (drained, mut draining) = oneshot::channel();
        let (ended, mut at_once) = oneshot::channel();
        let shutdown = Shutdown::listen(
            requests,
            move || drained.send(()).unwrap(),
            move || ended.send(()).unwrap(),
        );
        let early = shutdown.requested();
        assert!(
            tokio::time::timeout(SETTLE, shutdown.requested())
                .await
                .is_err(),
            "no stop before a request"
        );
        send.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), early)
            .await
            .expect("a future taken before the request hears it");
        tokio::time::timeout(Duration::from_secs(10), shutdown.requested())
            .await
            .expect("one taken after it resolves at once");
        assert_eq!(draining.try_recv(), Ok(()));
        tokio::time::sleep(SETTLE).await;
        assert!(at_once.try_recv().is_err(), "one request only drains");
        send.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), at_once)
            .await
            .expect("the second request ends at once")
            .unwrap();
    }

    #[tokio::test]
    async fn no_stop_is_asked_once_nothing_listens() {
        let (send, requests) = mpsc::unbounded_channel();
        let shutdown = Shutdown::listen(requests, || {}, || {});
        let stop = shutdown.requested();
        drop(shutdown);
        let _ = send.send(());
        assert!(tokio::time::timeout(SETTLE, stop).await.is_err());
    }
}
