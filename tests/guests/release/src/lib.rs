//! Test agent: `release`, version 1 of an agent whose versions test upgrades. Each of
//! `items` steps (key `item` of its index) appends `{key} attempt={a} token={t}
//! version={v}` to `log` (if given); after step `pause_at` (from 1) it sleeps `pause_ms`, so a
//! run can be left in flight between two steps. No checkpoint: a resumed instance
//! replays every committed step. Output: `{"items": N, "version": V}`.
//!
//! Input: `{"items": 4, "log": "/data/release.log", "pause_at": 2, "pause_ms": 60000}`
//!
//! `release-v2` is the same code as version 2 (only its output and log lines say so);
//! `release-renamed` is version 2 with the step's key renamed (`entry`), the mistake an
//! upgrade rehearsal must catch.

const STEP: &str = "item";
const VERSION: u32 = 1;

include!("agent.rs");
