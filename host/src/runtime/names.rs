//! The rules for the names a run is known by: its id, and the namespace its keys live
//! in (which is also a deployment's name).

use super::error::HostError;
use crate::text;

/// The default namespace of an agent: its name, with anything but letters, digits,
/// `.`, `_` and `-` replaced by `-`.
pub(crate) fn namespace_of(agent: &str) -> String {
    let namespace: String = agent
        .chars()
        .take(MAX_NAMESPACE_BYTES)
        .map(|c| if namespace_char(c) { c } else { '-' })
        .collect();
    if namespace.is_empty() {
        "agent".to_string()
    } else {
        namespace
    }
}

fn namespace_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// The longest namespace accepted.
const MAX_NAMESPACE_BYTES: usize = 64;

/// Checks a namespace (which is also a deployment name).
pub fn check_namespace(namespace: &str) -> Result<(), HostError> {
    const RULE: &str = "use 1 to 64 letters, digits, '.', '_' or '-'";
    if !namespace.is_empty()
        && namespace.len() <= MAX_NAMESPACE_BYTES
        && namespace.chars().all(namespace_char)
    {
        return Ok(());
    }
    let reason = match text::check_visible(namespace) {
        Err(hidden) => format!("it holds {hidden}; {RULE}"),
        Ok(()) => RULE.to_string(),
    };
    Err(HostError::InvalidNamespace {
        namespace: namespace.to_string(),
        reason,
    })
}

/// The longest run id accepted.
const MAX_RUN_ID_BYTES: usize = 256;

/// Checks a run id: 1 to 256 bytes, no `/`, nothing invisible.
pub fn check_run_id(run_id: &str) -> Result<(), HostError> {
    let reason = if run_id.is_empty() {
        Some("it is empty".to_string())
    } else if run_id.len() > MAX_RUN_ID_BYTES {
        Some(format!("it is over {MAX_RUN_ID_BYTES} bytes"))
    } else if let Err(hidden) = text::check_visible(run_id) {
        Some(format!("it holds {hidden}; run ids must be visible text"))
    } else if run_id.contains('/') {
        Some("it holds '/'".to_string())
    } else {
        None
    };
    match reason {
        Some(reason) => Err(HostError::InvalidRunId {
            run_id: run_id.to_string(),
            reason,
        }),
        None => Ok(()),
    }
}
