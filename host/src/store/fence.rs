//! What every write made for a run presents: the run's lease token ([`RunFence`]) and
//! how durable the write must be ([`SyncMode`]).

use std::fmt;
use std::str::FromStr;

#[cfg(doc)]
use super::{LeasedRun, StoreError};

/// How durable a run's writes must be before they return (`sync` in a run's authority).
///
/// Both modes survive the process that wrote crashing or being killed at any point. They
/// differ when the machine loses power or its OS crashes:
/// - [`SyncMode::Normal`]: the last transactions before the crash may be lost (the
///   store stays consistent: a lost commit turns back into the claim it came from,
///   which is taken over in doubt);
/// - [`SyncMode::Full`]: a write that returned survives power loss.
///
/// ```
/// use idem::store::SyncMode;
///
/// let mode: SyncMode = "full".parse()?;
/// assert_eq!(mode, SyncMode::Full);
/// assert_eq!(mode.to_string(), "full");
/// # Ok::<(), idem::store::ParseSyncModeError>(())
/// ```
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum SyncMode {
    /// Fast; on power loss the last commits may be lost.
    #[default]
    Normal,
    /// Every write is on disk before it returns.
    Full,
}

impl SyncMode {
    /// The mode's name.
    pub fn as_str(self) -> &'static str {
        match self {
            SyncMode::Normal => "normal",
            SyncMode::Full => "full",
        }
    }
}

impl fmt::Display for SyncMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SyncMode {
    type Err = ParseSyncModeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("normal") {
            Ok(SyncMode::Normal)
        } else if s.eq_ignore_ascii_case("full") {
            Ok(SyncMode::Full)
        } else {
            Err(ParseSyncModeError {
                given: s.to_owned(),
            })
        }
    }
}

/// A sync mode that is neither `normal` nor `full`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown sync mode {given:?}: expected \"normal\" or \"full\"")]
pub struct ParseSyncModeError {
    /// What was given.
    pub given: String,
}

/// What every write made for a run presents: the run, the token of the lease its
/// writer holds, and how durable the write must be. A write whose token is not the
/// run's current lease token is refused with [`StoreError::LeaseLost`] and changes
/// nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunFence {
    /// The run.
    pub run_id: String,
    /// The token of the run lease the writer holds ([`LeasedRun::token`]).
    pub token: u64,
    /// How durable the run's writes must be.
    pub sync: SyncMode,
}
