//! `idem deploy`: store an agent in the store under a name, with the most its runs may
//! reach. Workers anywhere load it from the store; deploying the same bytes again
//! changes nothing; the name points at its latest component, and older ones stay for
//! the runs pinned to them. Deploying is the explicit act by which a component joins a
//! name's namespace.

use std::path::PathBuf;

use clap::Parser;
use idem::ops;
use idem::runtime::{check_namespace, default_cache_dir};

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
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
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
        let deployed = ops::deploy(store.as_ref(), &agent, &name, &authority)
            .await
            .map_err(op_error)?;
        let (record, new) = (deployed.record, deployed.new_component);
        if self.json {
            let doc = serde_json::json!({
                "name": record.name,
                "digest": record.digest,
                "new_component": new,
                "deployed_at": record.deployed_at,
            });
            println!("{}", display::json(&doc));
        } else {
            println!(
                "deployed {} as {} ({})",
                self.agent.display(),
                display::name(&record.name),
                if new {
                    "new component"
                } else {
                    "component already stored"
                }
            );
            println!("digest: {}", record.digest);
        }
        Ok(Exit::Done)
    }
}
