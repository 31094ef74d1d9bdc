//! `idem submit`: queue a run of a deployed agent and return at once; workers drive
//! it. Submitting is idempotent: the same run id with the same input is the same run.

use clap::Parser;
use idem::runtime::{Authority, HostError, check_namespace, check_run_id};
use idem::store::{Store, Submission};

use super::args::{AuthorityArgs, DbArgs, json_or_file};
use super::run::default_run_id;
use super::{Exit, display};

#[derive(Debug, Parser)]
pub struct SubmitCommand {
    /// The deployed agent: its name, or a component digest (64 hex digits) deployed
    /// under some name.
    agent: String,
    #[command(flatten)]
    db: DbArgs,
    /// The input, as JSON, or `@FILE` to read it from a file.
    // A negative number is JSON too: without `allow_negative_numbers`, clap takes the
    // value of `--input -1` for a flag.
    #[arg(long, default_value = "null", allow_negative_numbers = true)]
    input: String,
    /// The run's id. Defaults to the agent's name and a hash of the input.
    #[arg(long)]
    run_id: Option<String>,
    /// The namespace the run's keys live in; the component must be deployed under that
    /// name. Defaults to the deployment's name.
    #[arg(long)]
    namespace: Option<String>,
    /// Narrow what the run may reach (the deployment's grants when not given).
    #[command(flatten)]
    authority: AuthorityArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

impl SubmitCommand {
    pub async fn execute(self) -> anyhow::Result<Exit> {
        let input = json_or_file("--input", &self.input)?;
        let store = self.db.open_existing().await?;
        let deployment = find_deployment(store.as_ref(), &self.agent).await?;
        let base = Authority::decode(&deployment.authority).map_err(HostError::from)?;
        let authority = self.authority.apply(&base);
        authority.check().map_err(HostError::from)?;
        authority.fits_within(&base).map_err(HostError::from)?;
        let namespace = self.namespace.clone().unwrap_or(deployment.name.clone());
        check_namespace(&namespace)?;
        if store.admitted(&namespace, &deployment.digest).await? != Some(true) {
            return Err(idem::store::StoreError::NamespaceTaken {
                namespace: namespace.clone(),
                owner: "another component".into(),
                digest: deployment.digest.clone(),
            }
            .into());
        }
        let run_id = self
            .run_id
            .clone()
            .unwrap_or_else(|| default_run_id(&deployment.name, &input));
        check_run_id(&run_id)?;
        let submitted = store
            .submit(&Submission {
                run_id: &run_id,
                agent: &deployment.name,
                digest: &deployment.digest,
                namespace: &namespace,
                input: &input,
                authority: &authority.encode(),
                replace_authority: false,
            })
            .await?;
        let record = &submitted.record;
        if self.json {
            let doc = serde_json::json!({
                "run_id": record.run_id,
                "status": record.status,
                "created": submitted.created,
                "agent": record.agent,
                "digest": record.digest,
            });
            println!("{}", display::json(&doc));
        } else if submitted.created {
            println!(
                "submitted run {} ({})",
                display::name(&record.run_id),
                record.status
            );
        } else {
            println!(
                "run {} exists with this input ({})",
                display::name(&record.run_id),
                record.status
            );
        }
        Ok(Exit::Done)
    }
}

/// The deployment a submission names: by name, or by a digest deployed under a name.
async fn find_deployment(
    store: &dyn Store,
    agent: &str,
) -> anyhow::Result<idem::store::DeploymentRecord> {
    if let Some(deployment) = store.deployment(agent).await? {
        return Ok(deployment);
    }
    let is_digest = agent.len() == 64 && agent.bytes().all(|b| b.is_ascii_hexdigit());
    if is_digest {
        let digest = agent.to_ascii_lowercase();
        let by_digest = store
            .deployments()
            .await?
            .into_iter()
            .find(|d| d.digest == digest);
        if let Some(deployment) = by_digest {
            return Ok(deployment);
        }
    }
    Err(HostError::UnknownDeployment {
        name: agent.to_string(),
    }
    .into())
}
