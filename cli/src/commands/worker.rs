//! `idem worker`: lease runs from the store and drive them until SIGTERM or SIGINT;
//! then drain (no new runs, side effects in flight end, leases given back) and exit 0.
//! A second signal exits at once; the runs are then taken over after their leases.
//! [`WorkerSetup`] makes the worker, for `idem serve --worker` too.

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use idem::runtime::{DEFAULT_INSTANCES, Host, Protected, Runtime, check_namespace};
use idem::store::{DatabaseFault, Store, StoreError};
use idem::worker::{Worker, WorkerOptions, WorkerReport};

use super::args::{CacheArgs, DbArgs, duration, protected};
use crate::exit::Exit;
use crate::shutdown::Shutdown;

#[derive(Debug, Parser)]
pub struct WorkerCommand {
    #[command(flatten)]
    db: DbArgs,
    /// Most runs driven at once; each running one holds an instance, and the process
    /// holds at most 8,192 (runs past that wait for one).
    #[arg(long, default_value = "64", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    concurrency: u32,
    /// This worker's name, shown on the runs it holds (a unique suffix is added).
    #[arg(long, default_value = "worker")]
    name: String,
    /// The lease runs are taken with; each run's own lease applies once it runs.
    #[arg(long, default_value = "30s", value_parser = duration)]
    lease: Duration,
    /// How long a shutdown waits for side effects in flight before ending them.
    #[arg(long, default_value = "30s", value_parser = duration)]
    drain_timeout: Duration,
    /// How often an idle worker looks for runs.
    #[arg(long, default_value = "200ms", value_parser = duration)]
    poll: Duration,
    #[command(flatten)]
    cache: CacheArgs,
}

impl WorkerCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        let setup = WorkerSetup::new(
            "idem worker",
            &self.name,
            WorkerOptions {
                concurrency: self.concurrency as usize,
                lease: self.lease,
                poll: self.poll,
                drain_timeout: self.drain_timeout,
                ..WorkerOptions::default()
            },
        )?;
        // Listened for before anything else: a worker asked to stop while it starts (or
        // while it waits for its database) exits 0 holding nothing, as a drained one
        // does, whenever the signal comes, rather than dying of it.
        let shutdown = Shutdown::on_signals(
            "idem worker",
            "draining (send the signal again to exit at once)",
        )?;
        let store = tokio::select! {
            store = open_when_reachable(&self.db) => store?,
            () = shutdown.requested() => return Ok(Exit::Done),
        };
        let cache = self.cache.dir();
        let protected = protected(
            self.db.path(),
            self.db.key_file.as_deref(),
            cache.as_deref(),
        );
        let runtime = Arc::new(Runtime::with_instances(cache, setup.instances())?);
        let worker = setup.build(runtime, store, protected)?;
        worker.run(shutdown.requested()).await?;
        Ok(Exit::Done)
    }
}

/// A worker as `idem worker` and `idem serve --worker` make it, so that the two cannot
/// drift: its name checked before anything is opened, the store and the cache kept out
/// of every run's directory grants, and what it says on stderr when it starts and stops.
pub struct WorkerSetup {
    /// What it calls itself on stderr: `idem worker`, `idem serve: worker`.
    says: &'static str,
    name: String,
    options: WorkerOptions,
}

impl WorkerSetup {
    /// The instances its process must be able to hold at once: one for each run it
    /// drives, and never fewer than a process holds by default.
    pub fn instances(&self) -> usize {
        self.options.concurrency.max(DEFAULT_INSTANCES)
    }

    /// A worker named `name` (a unique suffix is added when it is built) that works as
    /// `options` say; the paths it protects are given to [`WorkerSetup::build`].
    pub fn new(
        says: &'static str,
        name: &str,
        options: WorkerOptions,
    ) -> anyhow::Result<WorkerSetup> {
        check_namespace(name)?;
        Ok(WorkerSetup {
            says,
            name: name.to_string(),
            options,
        })
    }

    /// The worker, driving the runs of `store` on `runtime`; no run's directory grant
    /// may expose `protected`.
    pub fn build(
        self,
        runtime: Arc<Runtime>,
        store: Arc<dyn Store>,
        protected: Vec<Protected>,
    ) -> anyhow::Result<BuiltWorker> {
        let host = Host::named(runtime, store, &self.name)?;
        let id = host.id().to_string();
        let options = WorkerOptions {
            protected,
            ..self.options
        };
        Ok(BuiltWorker {
            says: self.says,
            id,
            worker: Arc::new(Worker::new(Arc::new(host), options)),
        })
    }
}

/// A worker ready to run.
pub struct BuiltWorker {
    says: &'static str,
    id: String,
    worker: Arc<Worker>,
}

impl BuiltWorker {
    /// Works until `shutdown` resolves, then drains and returns what it did; says on
    /// stderr when it started and how it stopped.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> anyhow::Result<WorkerReport> {
        eprintln!("{} {} started", self.says, self.id);
        let report = self.worker.run(shutdown).await?;
        eprintln!(
            "{} {} stopped: {} runs finished, {} given back, {} lost",
            self.says, self.id, report.finished, report.released, report.lost
        );
        Ok(report)
    }
}

/// Opens the store. While its server cannot be reached, says so once and tries again
/// with backoff: a worker started with its database (or during a restart of it) waits
/// for it, as a running worker does. Every other failure (a refused password, a
/// missing database or store, a newer schema) ends the worker at once: waiting would
/// not mend it. A signal meanwhile ends the process; it holds nothing yet.
async fn open_when_reachable(db: &DbArgs) -> anyhow::Result<Arc<dyn Store>> {
    const MOST: Duration = Duration::from_secs(5);
    let mut backoff = Duration::from_millis(200);
    let mut told = false;
    loop {
        match db.open_existing().await {
            Ok(store) => return Ok(store),
            Err(e) if unreachable(&e) => {
                if !told {
                    eprintln!("idem worker: {e:#}; trying again until it answers");
                    told = true;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MOST);
            }
            Err(e) => return Err(e),
        }
    }
}

fn unreachable(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<StoreError>(),
            Some(StoreError::Database {
                fault: DatabaseFault::Unreachable,
                ..
            })
        )
    })
}
