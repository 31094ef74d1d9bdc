//! The store's errors, in no backend's words: a backend names its own details (SQLite's
//! `-wal` file, PostgreSQL's SQLSTATE) in [`StoreError::Database::detail`].

use std::time::Duration;

/// Errors from a store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The claim the caller presented is no longer the key's claim.
    #[error(
        "claim on key {} was lost: token {token} no longer holds it",
        crate::text::quoted(key)
    )]
    ClaimLost {
        /// The key.
        key: String,
        /// The stale token.
        token: u64,
    },
    /// The run lease the caller presented is no longer the run's: another worker (or
    /// an operator) took the run over. Nothing was written.
    #[error(
        "run {} is no longer leased with token {token}: another holder took it over",
        crate::text::quoted(run_id)
    )]
    LeaseLost {
        /// The run.
        run_id: String,
        /// The stale lease token.
        token: u64,
    },
    /// The run exists with other input bytes.
    #[error("run {} exists with a different input", crate::text::quoted(run_id))]
    InputMismatch {
        /// The run.
        run_id: String,
    },
    /// `resolve` named a key that is not parked for that run.
    #[error(
        "key {} is not parked in doubt by run {}; nothing to resolve",
        crate::text::quoted(key),
        crate::text::quoted(run_id)
    )]
    NotInDoubt {
        /// The run.
        run_id: String,
        /// The key.
        key: String,
    },
    /// The run does not exist.
    #[error("run {} does not exist", crate::text::quoted(run_id))]
    UnknownRun {
        /// The run.
        run_id: String,
    },
    /// The run has no step under this key (it never claimed it, or gc collected it).
    #[error(
        "run {} has no step {}",
        crate::text::quoted(run_id),
        crate::text::quoted(key)
    )]
    UnknownStep {
        /// The run.
        run_id: String,
        /// The key, as asked.
        key: String,
    },
    /// No deployment has this name.
    #[error("no deployment is named {}", crate::text::quoted(name))]
    UnknownDeployment {
        /// The name.
        name: String,
    },
    /// The deployment has no such version.
    #[error("deployment {} has no version {version}", crate::text::quoted(name))]
    UnknownVersion {
        /// The deployment.
        name: String,
        /// The version asked for.
        version: u64,
    },
    /// The run is not a run of that deployment.
    #[error(
        "run {} is a run of {}, not of {}",
        crate::text::quoted(run_id),
        crate::text::quoted(agent),
        crate::text::quoted(name)
    )]
    NotOfDeployment {
        /// The run.
        run_id: String,
        /// The deployment it is a run of.
        agent: String,
        /// The deployment named.
        name: String,
    },
    /// The run never moved between versions, so it has none to go back to.
    #[error(
        "run {} has never moved to another version; there is nothing to roll back",
        crate::text::quoted(run_id)
    )]
    NeverMoved {
        /// The run.
        run_id: String,
    },
    /// The run's component and the one it would move to export different things: they
    /// are not builds of one agent, and its next instance could not resume it.
    #[error(
        "run {} cannot move from {from} to version {to} of {}: the two components export \
         different things (the other is not a build of the same agent)",
        crate::text::quoted(run_id),
        crate::text::quoted(name)
    )]
    ExportsDiffer {
        /// The run.
        run_id: String,
        /// The deployment.
        name: String,
        /// Where the run is: `version N`, or its component's digest.
        from: String,
        /// The version it would move to.
        to: u64,
    },
    /// The run has finished, so it cannot be changed this way.
    #[error("run {} is already {status}", crate::text::quoted(run_id))]
    RunFinished {
        /// The run.
        run_id: String,
        /// How it finished.
        status: super::RunStatus,
    },
    /// A wait the run asked for cannot be kept: its time is absurd, or its key was
    /// used by another kind of wait. Nothing was written.
    #[error(
        "wait {} of run {} refused: {reason}",
        crate::text::quoted(key),
        crate::text::quoted(run_id)
    )]
    WaitRefused {
        /// The run.
        run_id: String,
        /// The wait's key.
        key: String,
        /// Why.
        reason: String,
    },
    /// A spawn was refused ([`SpawnRefusal`](super::SpawnRefusal)). Nothing was written.
    #[error(
        "spawn {} of run {} refused: {refusal}",
        crate::text::quoted(key),
        crate::text::quoted(run_id)
    )]
    SpawnRefused {
        /// The parent run.
        run_id: String,
        /// The spawn's key.
        key: String,
        /// Why.
        refusal: super::SpawnRefusal,
    },
    /// A fork was refused ([`ForkRefusal`](super::ForkRefusal)). Nothing was written.
    #[error("fork of run {} refused: {refusal}", crate::text::quoted(run_id))]
    ForkRefused {
        /// The run to fork.
        run_id: String,
        /// Why.
        refusal: super::ForkRefusal,
    },
    /// A model call's usage was refused ([`UsageRefusal`](super::UsageRefusal)). Nothing
    /// was written.
    #[error(
        "usage of key {} of run {} refused: {refusal}",
        crate::text::quoted(key),
        crate::text::quoted(run_id)
    )]
    UsageRefused {
        /// The run.
        run_id: String,
        /// The step's key.
        key: String,
        /// Why.
        refusal: super::UsageRefusal,
    },
    /// A join was refused ([`JoinRefusal`](super::JoinRefusal)). Nothing was written.
    #[error(
        "join {} of run {} refused: {refusal}",
        crate::text::quoted(key),
        crate::text::quoted(run_id)
    )]
    JoinRefused {
        /// The parent run.
        run_id: String,
        /// The join's key.
        key: String,
        /// Why.
        refusal: super::JoinRefusal,
    },
    /// A signal cannot be sent: its name or payload is not one a run can receive.
    /// Nothing was written.
    #[error("signal to run {} refused: {reason}", crate::text::quoted(run_id))]
    SignalRefused {
        /// The run.
        run_id: String,
        /// Why.
        reason: String,
    },
    /// A schedule cannot be created as asked: its name is taken, its spec or catch-up
    /// is out of range, or its deployment does not exist. Nothing was written.
    #[error("schedule {} refused: {reason}", crate::text::quoted(name))]
    ScheduleRefused {
        /// The schedule.
        name: String,
        /// Why.
        reason: String,
    },
    /// The schedule does not exist.
    #[error("schedule {} does not exist", crate::text::quoted(name))]
    UnknownSchedule {
        /// The schedule.
        name: String,
    },
    /// Limits on a deployment's runs were refused ([`FlowRefusal`](super::FlowRefusal)).
    /// Nothing was written.
    #[error(
        "limits on deployment {} refused: {refusal}",
        crate::text::quoted(deployment)
    )]
    FlowRefused {
        /// The deployment.
        deployment: String,
        /// Why.
        refusal: super::FlowRefusal,
    },
    /// A rate limit on a class of steps was refused ([`RateRefusal`](super::RateRefusal)).
    /// Nothing was written.
    #[error(
        "rate limit on class {} refused: {refusal}",
        crate::text::quoted(class)
    )]
    RateRefused {
        /// The class.
        class: String,
        /// Why.
        refusal: super::RateRefusal,
    },
    /// The run's deployment reads a concurrency key from its input, and the input has
    /// nothing there. Nothing was written.
    #[error(
        "run {} has no concurrency key: its input has nothing at {} (deployment {} reads its key there)",
        crate::text::quoted(run_id),
        crate::text::quoted(pointer),
        crate::text::quoted(deployment)
    )]
    FlowKeyMissing {
        /// The run.
        run_id: String,
        /// The deployment.
        deployment: String,
        /// The JSON pointer.
        pointer: String,
    },
    /// A priority beyond [`MAX_PRIORITY`](super::MAX_PRIORITY). Nothing was written.
    #[error("priority {priority} is beyond the highest ({})", super::MAX_PRIORITY)]
    PriorityRefused {
        /// The priority given.
        priority: u32,
    },
    /// A row refers to a large value the blob tables do not hold, or hold with other
    /// bytes: the store was changed outside idem (or a blob removed by hand).
    #[error("the value kept as blob {digest} cannot be read: {reason}")]
    BadBlob {
        /// The blob's digest, in hex.
        digest: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No component with this digest is in the store.
    #[error("no component with digest {digest} is in the store")]
    UnknownComponent {
        /// The digest asked for.
        digest: String,
    },
    /// The namespace belongs to other components, and this one was not admitted to it
    /// by an explicit act.
    #[error(
        "namespace {namespace:?} belongs to other components (latest {owner}); component \
         {digest} was never deployed there"
    )]
    NamespaceTaken {
        /// The namespace.
        namespace: String,
        /// The component latest deployed there.
        owner: String,
        /// The component that asked to join.
        digest: String,
    },
    /// A value passed in is beyond what a store keeps: stores keep integers signed, so a
    /// checkpoint step or a count goes up to `i64::MAX` ([`MAX_STEP`](super::MAX_STEP)).
    /// Nothing was written.
    #[error("{what} {value} is beyond what a store keeps (at most {max})")]
    OutOfRange {
        /// What the value is: `checkpoint step`, `count executed`, ...
        what: &'static str,
        /// The value given.
        value: u64,
        /// The largest value a store keeps.
        max: u64,
    },
    /// The store could not be opened or prepared.
    #[error("cannot open store {location}: {reason}")]
    Open {
        /// The database path or URL.
        location: String,
        /// What went wrong, in words.
        reason: String,
    },
    /// The location names a backend this build of idem was compiled without (its cargo
    /// feature is off): [`open`](super::open) refuses it rather than guess.
    #[error(
        "cannot open store {location}: this build of idem has no {backend} backend (the \
         `{feature}` cargo feature is off)"
    )]
    BackendNotBuilt {
        /// The database path or URL (without a password).
        location: String,
        /// The backend: `SQLite` or `PostgreSQL`.
        backend: &'static str,
        /// The cargo feature of `idem-host` that builds it.
        feature: &'static str,
    },
    /// The store was written by a newer idem.
    #[error(
        "store {location} has schema version {found}, newer than this idem supports \
         ({supported}); upgrade idem"
    )]
    SchemaTooNew {
        /// The database path or URL.
        location: String,
        /// The version found in the store.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// The database refused an operation for a cause outside idem, named by `fault`.
    /// The refused operation left nothing behind: results committed before it are
    /// unchanged, and the run can resume once the cause is gone.
    #[error("store {location} cannot {op}: {fault} ({detail})")]
    Database {
        /// The database path or URL.
        location: String,
        /// What the store was doing.
        op: &'static str,
        /// The cause.
        fault: DatabaseFault,
        /// The backend's own words for it, and what to do in its terms.
        detail: String,
    },
    /// The store's encryption at rest could not be set up, or a sealed value not be
    /// read ([`SealError`](super::SealError) says which).
    #[error(transparent)]
    Sealing(#[from] super::SealError),
    /// A backend operation failed.
    #[error("store failed to {op}")]
    Backend {
        /// What the store was doing.
        op: &'static str,
        /// The backend's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Why a database refused an operation, when the cause lies outside idem: each is fixed
/// by whoever runs idem, after which the same run resumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DatabaseFault {
    /// Another connection (another process, most likely) kept a lock for longer than
    /// this handle waits.
    Locked {
        /// How long the write waited.
        busy_timeout: Duration,
    },
    /// The database cannot be written.
    ReadOnly,
    /// The disk is full, or the database reached the size it was capped at.
    Full,
    /// The database is damaged.
    Corrupt,
    /// The operating system failed to read or write the database.
    Io,
    /// The database server cannot be reached, or dropped the connection.
    Unreachable,
}

impl std::fmt::Display for DatabaseFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DatabaseFault::Locked { busy_timeout } => write!(
                f,
                "the database is locked: another connection kept its write lock for longer \
                 than the busy timeout ({}); try again once it lets go",
                human_duration(*busy_timeout)
            ),
            DatabaseFault::ReadOnly => f.write_str("the database is read-only"),
            DatabaseFault::Full => f.write_str(
                "the disk is full or the database reached its size limit; free space (or raise \
                 the limit) and try again",
            ),
            DatabaseFault::Corrupt => f.write_str(
                "the database is corrupt; restore it from a backup (idem does not repair it)",
            ),
            DatabaseFault::Io => f.write_str(
                "the operating system failed to read or write the database (a disk or file \
                 system error)",
            ),
            DatabaseFault::Unreachable => {
                f.write_str("the database server cannot be reached or dropped the connection")
            }
        }
    }
}

impl StoreError {
    /// Whether this is the store refusing what it was asked (bad input, a rule of the
    /// store) rather than failing to do it: a refusal wrote nothing and asking again the
    /// same way is refused again.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            StoreError::InputMismatch { .. }
                | StoreError::NotInDoubt { .. }
                | StoreError::UnknownComponent { .. }
                | StoreError::UnknownDeployment { .. }
                | StoreError::UnknownVersion { .. }
                | StoreError::NotOfDeployment { .. }
                | StoreError::NeverMoved { .. }
                | StoreError::ExportsDiffer { .. }
                | StoreError::UnknownRun { .. }
                | StoreError::UnknownStep { .. }
                | StoreError::RunFinished { .. }
                | StoreError::NamespaceTaken { .. }
                | StoreError::PriorityRefused { .. }
                | StoreError::FlowKeyMissing { .. }
                | StoreError::FlowRefused { .. }
                | StoreError::RateRefused { .. }
                | StoreError::WaitRefused { .. }
                | StoreError::SignalRefused { .. }
                | StoreError::UsageRefused { .. }
                | StoreError::ScheduleRefused { .. }
                | StoreError::UnknownSchedule { .. }
                | StoreError::ForkRefused { .. }
        )
    }
}

/// `5s`, `200ms`: how a person would write the duration.
pub(crate) fn human_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// A database URL with anything between `:` and `@` (a password) hidden: what errors name.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{scheme}://{user}@{host}")
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn a_password_is_never_named() {
        assert_eq!(
            redact("postgres://idem:s3cret@db/idem"),
            "postgres://idem@db/idem"
        );
        assert_eq!(redact("postgres://db/idem"), "postgres://db/idem");
        assert_eq!(redact("idem.db"), "idem.db");
    }
}
