//! How to drive one run in the foreground ([`RunOptions`]): which run, with what input
//! and authority, and how this process watches it (where its output shows, what stops
//! it).

use std::sync::Arc;

use super::authority::Authority;
use super::capture::HttpCapture;
use super::error::HostError;
use super::faults::FaultPlan;
use super::names::{check_namespace, check_run_id};
use super::output::{Echo, LogSink};
use super::stop::StopSignal;

/// How to drive one run in the foreground with [`Host::run`](super::Host::run).
///
/// ```
/// use idem::runtime::{Echo, RunOptions, StopSignal};
///
/// let stop = StopSignal::new();
/// let opts = RunOptions {
///     run_id: "order-42".into(),
///     input: br#"{"order":42}"#.to_vec(),
///     echo: Echo::Off,
///     stop: Some(stop.clone()),
///     ..RunOptions::default()
/// };
/// opts.check()?;
/// // Elsewhere, when the process is told to shut down: the run ends at its next host
/// // call outside a side effect, and gives its lease back.
/// stop.stop();
/// # Ok::<(), idem::runtime::HostError>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// The run's id: the same id resumes the same run.
    pub run_id: String,
    /// The input handed to `run` on every instance.
    pub input: Vec<u8>,
    /// What the run may reach.
    pub authority: Authority,
    /// Planned instance drops.
    pub faults: FaultPlan,
    /// Resume a run started with another component, or run a component under a name
    /// other components use: an explicit act, recorded.
    pub upgrade: bool,
    /// The name the agent is deployed under, which is the namespace its keys live in;
    /// `None` keeps a resumed run's, and takes the agent's file name for a new run.
    /// Another component may use a name only once deployed there explicitly (or with
    /// `upgrade`): runs of one agent share keys, and other agents cannot reach them.
    pub namespace: Option<String>,
    /// Answers the run's outbound HTTP in place of the network, and hears of the
    /// requests the gate refused. `None` sends granted requests out.
    pub capture: Option<Arc<dyn HttpCapture>>,
    /// Where the agent's stderr and stdout are shown besides the run's log, which
    /// keeps them either way: idem's own stderr by default.
    pub echo: Echo,
    /// Stops the run the way a worker drains once raised; `None` drives it to its end.
    pub stop: Option<StopSignal>,
    /// Where the agent was loaded from, when a person runs a local file
    /// ([`local_source`](super::local_source)). A new build from the source the name's
    /// current deployment came from joins its namespace and resumes the run without
    /// `upgrade`, both recorded (the dev loop; [`RunReport::rebuilt`](super::RunReport)
    /// says so). `None`: a new build needs `upgrade`.
    pub source: Option<String>,
}

impl RunOptions {
    /// Checks the options without touching any store: the run id, the namespace, the
    /// limits, and that every granted directory can be opened. [`Host::run`] does it
    /// too; calling it first lets a caller refuse bad options before it opens (and so
    /// writes to) a store.
    ///
    /// [`Host::run`]: super::Host::run
    pub fn check(&self) -> Result<(), HostError> {
        check_run_id(&self.run_id)?;
        if let Some(namespace) = &self.namespace {
            check_namespace(namespace)?;
        }
        self.authority.check()?;
        super::instance::wasi_ctx(&self.authority, &LogSink::default()).map(drop)
    }
}
