//! `idem resolve`: an operator settles a key that a run parked in doubt — the side
//! effect happened (commit the result it had) or it did not (retry it). The key may be
//! given as the agent sees it or as the store keeps it (`namespace:key`).

use clap::Parser;
use idem::store::{ParkedKeys, ParkedMatch, Resolution, StoreError};
use idem::text::{check_visible, escape_for_terminal as shown};

use super::args::DbArgs;
use super::{BadInput, Exit};

#[derive(Debug, Parser)]
#[command(group(clap::ArgGroup::new("how").required(true).args(["result", "retry"])))]
pub struct ResolveCommand {
    /// The run that parked the key.
    run_id: String,
    /// The parked key: as the agent sees it, or as `idem status` shows it
    /// (`namespace:key`).
    key: String,
    /// The side effect happened: commit this JSON as the key's result.
    #[arg(long, value_name = "JSON")]
    result: Option<String>,
    /// The side effect did not happen: release the key so the run executes it again.
    #[arg(long)]
    retry: bool,
    #[command(flatten)]
    db: DbArgs,
}

impl ResolveCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        if let Some(result) = &self.result {
            serde_json::from_str::<serde_json::Value>(result)
                .map_err(|e| BadInput(format!("--result is not valid JSON: {e}")))?;
        }
        let store = self.db.open_existing().await?;
        let parked = ParkedKeys::of(store.as_ref(), &self.run_id)
            .await?
            .ok_or_else(|| StoreError::UnknownRun {
                run_id: self.run_id.clone(),
            })?;
        let key = match parked.find(&self.key) {
            ParkedMatch::One(key) => key.to_string(),
            ParkedMatch::Both(a, b) => {
                return Err(BadInput(format!(
                    "key \"{}\" names two parked keys of run \"{}\": \"{}\" and \"{}\" \
                     (as the store keeps them); give the one you mean in that form",
                    shown(&self.key),
                    shown(&self.run_id),
                    shown(a),
                    shown(b)
                ))
                .into());
            }
            ParkedMatch::None => return Err(BadInput(not_parked(&self.key, &parked)).into()),
        };
        let resolution = match &self.result {
            Some(result) => Resolution::Commit(result.as_bytes()),
            None => Resolution::Retry,
        };
        store.resolve(&self.run_id, &key, resolution).await?;
        let status = store
            .run(&self.run_id)
            .await?
            .map(|r| r.status.as_str())
            .unwrap_or("unknown");
        println!(
            "resolved {} of run {} ({}); run status: {status}",
            shown(&key),
            shown(&self.run_id),
            if self.retry { "retry" } else { "committed" },
        );
        Ok(Exit::Done)
    }
}

/// Why `key` cannot be resolved, and what can: the run's parked keys as the agent sees
/// them, escaped (a key that only looks like another is shown as different).
fn not_parked(key: &str, parked: &ParkedKeys) -> String {
    let mut message = format!(
        "key \"{}\" is not parked in doubt by run \"{}\"; nothing to resolve",
        shown(key),
        shown(&parked.run_id)
    );
    if let Err(hidden) = check_visible(key) {
        message += &format!(" (the key given holds {hidden})");
    }
    if parked.keys.is_empty() {
        message += "; the run has no parked keys";
    } else {
        let keys: Vec<String> = parked
            .keys
            .iter()
            .map(|k| format!("\"{}\"", shown(parked.agent_key(k))))
            .collect();
        message += &format!(
            "; its parked keys (as the agent sees them; `{}:KEY` works too): {}",
            shown(&parked.namespace),
            keys.join(", ")
        );
    }
    message
}
