//! What to type next: the library's typed errors, named in its own terms (the run, the
//! key, the limit), turned into the flags and commands of `idem` that mend them.

use idem::runtime::{AuthorityError, HostError};
use idem::store::{ForkRefusal, SealError, StoreError};

/// What to type next, for an error the library names in its own terms.
pub fn for_error(err: &anyhow::Error) -> Option<String> {
    for cause in err.chain() {
        if let Some(e) = cause.downcast_ref::<HostError>() {
            return match e {
                HostError::Pinned { .. } => {
                    Some("pass --upgrade to resume the run with this component".into())
                }
                HostError::NamespaceMismatch { run_id, pinned, .. } => Some(format!(
                    "resume it with --namespace {} (or leave --namespace out)",
                    idem::text::escape(pinned, false)
                ))
                .filter(|_| !run_id.is_empty()),
                HostError::InDoubt { run_id, .. } => Some(format!(
                    "settle each key with `idem resolve {} KEY --result JSON` (the effect \
                     happened) or `--retry` (it did not), then run it again",
                    idem::text::escape(run_id, false)
                )),
                HostError::Authority(AuthorityError::Wider { .. }) => Some(
                    "a submission may only narrow what its deployment allows; deploy the \
                     agent again with the wider grant first"
                        .into(),
                ),
                HostError::Store(e) => for_store(e),
                HostError::Cache(_) => Some(
                    "run with --no-cache, or make the directory private: yours, mode 700, below \
                     directories that only you or root can write to (or sticky ones, like /tmp)"
                        .into(),
                ),
                _ => None,
            };
        }
        if let Some(e) = cause.downcast_ref::<StoreError>() {
            return for_store(e);
        }
    }
    None
}

fn for_store(e: &StoreError) -> Option<String> {
    match e {
        StoreError::InputMismatch { .. } => {
            Some("a run id names one input: use another --run-id for other input".into())
        }
        StoreError::NamespaceTaken { namespace, .. } => Some(format!(
            "if this is a new build of that agent, deploy it there explicitly (`idem deploy \
             AGENT.wasm --name {ns}`) or pass --upgrade; otherwise pick another --namespace",
            ns = idem::text::escape(namespace, false)
        )),
        StoreError::FlowKeyMissing { .. } => Some(
            "give the run an input with its key there, or change the deployment's key with \
             `idem flow set`"
                .into(),
        ),
        StoreError::FlowRefused { .. } => {
            Some("`idem flow ls` lists the limits; `idem flow clear NAME` removes them".into())
        }
        StoreError::RateRefused { .. } => Some(
            "a limit is `--limit N --per DURATION` with N from 1 to 1000000 and a period of 1ms \
             to 24h; `idem rate ls` lists the limits"
                .into(),
        ),
        StoreError::UnknownVersion { name, .. } => Some(format!(
            "`idem deployments {}` lists its versions",
            idem::text::escape(name, false)
        )),
        StoreError::NotOfDeployment { agent, .. } => Some(format!(
            "name the run's own deployment ({}), or leave the run out",
            idem::text::escape(agent, false)
        )),
        StoreError::NeverMoved { .. } => Some(
            "only a run that moved (by `idem upgrade`, a deployment with --in-flight upgrade, \
             or `idem run --upgrade`) has a version to go back to; `idem show RUN` lists its \
             moves"
                .into(),
        ),
        StoreError::ExportsDiffer { .. } => Some(
            "deploy a build of the same agent as a new version, or start new runs of the \
             other agent under a name of its own"
                .into(),
        ),
        StoreError::ForkRefused {
            run_id,
            refusal:
                ForkRefusal::PastEnd { .. } | ForkRefusal::AtZero | ForkRefusal::HistoryCollected { .. },
        } => Some(format!(
            "`idem show {} --steps` numbers its committed steps and the checkpoints it keeps",
            idem::text::escape(run_id, false)
        )),
        StoreError::ForkRefused { .. } => {
            Some("pass --run-id with an id no run (and no recent run) had".into())
        }
        StoreError::LeaseLost { .. } => {
            Some("another worker drives the run now; `idem show RUN` says which".into())
        }
        StoreError::Sealing(SealError::NoKey { .. } | SealError::WrongKey { .. }) => Some(
            "give the key the store was created or last rekeyed with: --key-file PATH (or \
             IDEM_STORE_KEY_FILE, or the digits in IDEM_STORE_KEY)"
                .into(),
        ),
        StoreError::Sealing(SealError::NotEmpty { .. } | SealError::NotSealed) => Some(
            "a store is encrypted from its creation: give a new --db with the key, or unset \
             the key for this one"
                .into(),
        ),
        _ => None,
    }
}
