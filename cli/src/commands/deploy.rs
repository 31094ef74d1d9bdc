//! `idem deploy`: store an agent in the store under a name, with the most its runs may
//! reach. Workers anywhere load it from the store; deploying the same bytes again
//! changes nothing; the name points at its latest component, and older ones stay for
//! the runs pinned to them. Deploying is the explicit act by which a component joins a
//! name's namespace. Each deployment is the name's next version; `--in-flight` says
//! whether the runs that have not ended stay on theirs or move to it.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use idem::ops;
use idem::runtime::{check_namespace, default_cache_dir};
use idem::store::InFlight;

use super::args::{AuthorityArgs, DbArgs, load_agent, say_storing};
use super::display;
use crate::exit::{Exit, op_error};

#[derive(Debug, Parser)]
pub struct DeployCommand {
    /// The agent: a WebAssembly component of the idem:agent world.
    agent: PathBuf,
    /// The name to deploy it under (its runs' namespace). Defaults to the file name.
    #[arg(long)]
    name: Option<String>,
    #[command(flatten)]
    db: DbArgs,
    /// The most a run of this deployment may reach; a submission may narrow it.
    #[command(flatten)]
    authority: AuthorityArgs,
    /// Where precompiled agents are kept. Defaults to $XDG_CACHE_HOME/idem.
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// What the name's runs that have not ended do: `pin` (finish on the version they
    /// are on) or `upgrade` (move to this version, at their next instance; runs whose
    /// component exports something else stay).
    #[arg(long, value_enum, default_value = "pin", value_name = "POLICY")]
    in_flight: InFlightArg,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum InFlightArg {
    Pin,
    Upgrade,
}

impl From<InFlightArg> for InFlight {
    fn from(arg: InFlightArg) -> InFlight {
        match arg {
            InFlightArg::Pin => InFlight::Pin,
            InFlightArg::Upgrade => InFlight::Upgrade,
        }
    }
}

impl DeployCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        let authority = self.authority.authority()?;
        let cache = self.cache_dir.clone().or_else(default_cache_dir);
        // A deployment that would hand its runs this store or this cache is refused
        // here (every worker checks again against its own); the agent is checked, and
        // compiled into this machine's cache, before the store is touched.
        let (_runtime, agent) = load_agent(&self.agent, &authority, &self.db, cache)?;
        let name = match &self.name {
            Some(name) => name.clone(),
            None => agent.name().to_string(),
        };
        check_namespace(&name)?;
        let store = self.db.open().await?;
        say_storing(store.as_ref(), &agent, &self.agent).await?;
        let in_flight = self.in_flight.into();
        let deployed = ops::deploy(store.as_ref(), &agent, &name, &authority, in_flight)
            .await
            .map_err(op_error)?;
        let (record, new) = (&deployed.record, deployed.new_component);
        if self.json {
            let doc = serde_json::json!({
                "name": record.name,
                "digest": record.digest,
                "version": record.version,
                "new_component": new,
                "deployed_at": record.deployed_at,
                "in_flight": in_flight,
                "moved": deployed.moved,
                "kept": deployed.kept,
            });
            println!("{}", display::json(&doc));
        } else {
            println!(
                "deployed {} as {} version {} ({})",
                self.agent.display(),
                display::name(&record.name),
                record.version,
                if new {
                    "new component"
                } else {
                    "component already stored"
                }
            );
            println!("digest: {}", record.digest);
            for m in &deployed.moved {
                println!(
                    "moved run {}: {}",
                    display::name(&m.run_id),
                    super::versions::move_line(m)
                );
            }
            for run_id in &deployed.kept {
                println!(
                    "kept run {} where it is: its component exports something else",
                    display::name(run_id)
                );
            }
        }
        Ok(Exit::Done)
    }
}
