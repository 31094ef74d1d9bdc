//! Test agent: `release-renamed`, a version 2 of `release` (see there) that renamed its
//! step's key (`item` became `entry`): resumed on a run of version 1, it would run
//! every committed step again.

const STEP: &str = "entry";
const VERSION: u32 = 2;

include!("../../release/src/agent.rs");
