//! `idem serve`: the JSON HTTP API, the web page of runs and `/metrics` over a store
//! (`idem::serve`); with `--worker`, a worker drives runs in the same process. Stops on
//! SIGTERM or SIGINT: no new requests, the worker drains, then exit 0; a second signal
//! exits at once.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use idem::runtime::{DEFAULT_INSTANCES, Runtime};
use idem::serve::{ServeOptions, Server};
use idem::worker::WorkerOptions;

use super::args::{CacheArgs, DbArgs, PricesArgs, duration, protected, size};
use super::worker::WorkerSetup;
use crate::exit::{BadInput, Exit};
use crate::shutdown::Shutdown;

#[derive(Debug, Parser)]
pub struct ServeCommand {
    #[command(flatten)]
    db: DbArgs,
    /// Where to listen. Anything but loopback needs --token-file.
    #[arg(long, default_value = "127.0.0.1:8089", value_name = "ADDR:PORT")]
    listen: SocketAddr,
    /// A file holding the bearer token that mutating requests (and, off loopback, all
    /// requests for data) must carry.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Take mutating requests without a token. Loopback only.
    #[arg(long, conflicts_with = "token_file")]
    no_auth: bool,
    /// Largest JSON request body.
    #[arg(long, default_value = "2MiB", value_parser = size, value_name = "SIZE")]
    max_body: usize,
    /// Largest component a deploy may upload.
    #[arg(long, default_value = "64MiB", value_parser = size, value_name = "SIZE")]
    max_component: usize,
    /// Close a connection whose client has not sent a request's headers within this
    /// long, so that slow or silent clients cannot hold connections.
    #[arg(long, default_value = "10s", value_parser = duration, value_name = "DURATION")]
    header_read_timeout: Duration,
    /// Also drive runs in this process, as `idem worker` does.
    #[arg(long)]
    worker: bool,
    /// With --worker: most runs driven at once; each running one holds an instance, and
    /// the process holds at most 8,192 (runs past that wait for one).
    #[arg(long, default_value = "16", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    concurrency: u32,
    /// With --worker: the worker's name (a unique suffix is added).
    #[arg(long, default_value = "serve")]
    name: String,
    /// With --worker: how often an idle worker looks for runs.
    #[arg(long, default_value = "200ms", value_parser = duration)]
    poll: Duration,
    #[command(flatten)]
    cache: CacheArgs,
    #[command(flatten)]
    prices: PricesArgs,
}

impl ServeCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        let options = ServeOptions {
            listen: self.listen,
            token: self.token()?,
            no_auth: self.no_auth,
            max_body_bytes: self.max_body,
            max_component_bytes: self.max_component,
            header_read_timeout: self.header_read_timeout,
            prices: self.prices.load()?,
        };
        check_exposure(&options)?;
        let worker = WorkerSetup::new(
            "idem serve: worker",
            &self.name,
            WorkerOptions {
                concurrency: self.concurrency as usize,
                poll: self.poll,
                ..WorkerOptions::default()
            },
        )?;
        let store = self.db.open().await?;
        let cache = self.cache.dir();
        let protected = protected(
            self.db.path(),
            self.db.key_file.as_deref(),
            cache.as_deref(),
        );
        let instances = if self.worker {
            worker.instances()
        } else {
            DEFAULT_INSTANCES
        };
        let runtime = Arc::new(Runtime::with_instances(cache, instances)?);
        let server = Server::bind(Arc::clone(&store), Arc::clone(&runtime), options)
            .await
            .map_err(|e| BadInput(e.to_string()))?;
        let shutdown = Shutdown::on_signals(
            "idem serve",
            "stopping (send the signal again to exit at once)",
        )?;
        let worker = if self.worker {
            let worker = worker.build(runtime, store, protected)?;
            Some(tokio::spawn(worker.run(shutdown.requested())))
        } else {
            None
        };
        // Tests and scripts read the address from this line (with port 0 the OS picks).
        eprintln!("idem serve: listening on http://{}", server.local_addr());
        server.run(shutdown.requested()).await?;
        if let Some(worker) = worker {
            worker.await.context("the worker task failed")??;
        }
        Ok(Exit::Done)
    }

    /// The bearer token `--token-file` holds, if given.
    fn token(&self) -> anyhow::Result<Option<String>> {
        let Some(path) = &self.token_file else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| BadInput(format!("cannot read --token-file {}: {e}", path.display())))?;
        if text.trim().is_empty() {
            return Err(BadInput(format!("--token-file {} is empty", path.display())).into());
        }
        Ok(Some(text.trim().to_string()))
    }
}

/// Refuses to serve beyond loopback without a token, or anywhere but loopback without
/// authentication.
fn check_exposure(options: &ServeOptions) -> Result<(), BadInput> {
    let loopback = options.listen.ip().is_loopback();
    if !loopback && options.token.is_none() {
        return Err(BadInput(format!(
            "--listen {} is not loopback: give --token-file",
            options.listen
        )));
    }
    if options.no_auth && !loopback {
        return Err(BadInput("--no-auth is allowed on loopback only".into()));
    }
    Ok(())
}
