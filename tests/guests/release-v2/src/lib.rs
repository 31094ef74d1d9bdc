//! Test agent: `release-v2`, version 2 of `release` (see there): the same steps under
//! the same keys, a new version number in its output and log lines.

const STEP: &str = "item";
const VERSION: u32 = 2;

include!("../../release/src/agent.rs");
