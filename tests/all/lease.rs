//! Leases and fencing end to end: a claim left by another process is taken over only
//! once its lease expires, and the old holder's late commit is refused.

use std::time::{Duration, Instant};

use idem::runtime::{FaultPlan, Limits};
use idem::store::{ClaimOutcome, ClaimRequest, StoreError, now_millis};
use idem_test_artifacts::STEPS;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::util::{TestHost, agent, integrity_ok};

/// The key the SDK derives for step `i` of run `run_id` (`Key::for_run("step", &i)`).
fn step_key(run_id: &str, i: u64) -> String {
    let digest = Sha256::digest(serde_json::to_vec(&i).unwrap());
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    format!("{run_id}/step/{hex}")
}

#[test]
fn a_stale_claim_is_taken_over_after_its_lease_and_fenced() {
    let t = TestHost::with_limits(Limits {
        await_timeout: Duration::from_secs(30),
        ..Limits::default()
    });
    let store = t.host.store();
    // The store keeps keys in the agent's namespace (its name, by default).
    let key = format!("steps:{}", step_key("leased", 2));
    // Another process (a holder name this host never made) claims step 2 with a short
    // lease, then goes silent.
    let lease = Duration::from_millis(800);
    let zombie = match store
        .claim(&ClaimRequest {
            key: &key,
            run_id: "leased",
            holder: "elsewhere/leased/0",
            fingerprint: None,
            lease,
            now: now_millis(),
        })
        .unwrap()
    {
        ClaimOutcome::Granted(grant) => grant,
        other => panic!("expected a grant, got {other:?}"),
    };

    let started = Instant::now();
    let report = t.run(
        &agent(STEPS),
        "leased",
        json!({ "steps": 4, "log": "/data/leased.log" }),
        FaultPlan::default(),
    );
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "the live lease was respected"
    );
    assert_eq!(report.counts.reclaimed, 1);
    assert_eq!(report.counts.executed, 4);
    let lines = t.log("leased.log");
    assert_eq!(lines.len(), 4);
    let taken = lines
        .iter()
        .find(|l| format!("steps:{}", l.key) == key)
        .unwrap();
    assert_eq!(taken.attempt(), 2);
    assert!(taken.flag("in_doubt"));
    assert!(taken.token() > zombie.token);

    // The zombie wakes up and tries to commit: refused, and the result stays the
    // taker's.
    let before = store.committed(&key).unwrap().unwrap();
    match store.commit(&key, zombie.token, "leased", b"\"zombie\"") {
        Err(StoreError::ClaimLost { key: k, token }) => {
            assert_eq!((k, token), (key.clone(), zombie.token))
        }
        other => panic!("zombie commit must be refused, got {other:?}"),
    }
    assert_eq!(store.committed(&key).unwrap().unwrap(), before);
    integrity_ok(&t.db());
}
