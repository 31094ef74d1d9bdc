//! Leases and fencing end to end: a claim left by another process is taken over only
//! once its lease expires, and the old holder's late commit is refused.

use std::time::{Duration, Instant};

use idem::runtime::{FaultPlan, Limits};
use idem::store::{ClaimOutcome, ClaimRef, ClaimRequest, Commit, StoreError};
use idem_test_artifacts::STEPS;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::util::{TestHost, agent, block_on, integrity_ok, lease_by_hand};

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
    let store = t.store();
    // The store keeps keys in the agent's namespace (its name, by default).
    let key = format!("steps:{}", step_key("leased", 2));
    // Another process (a holder name this host never made), driving another run of the
    // same namespace, claims step 2 with a short lease, then goes silent.
    let other = lease_by_hand(store.as_ref(), &agent(STEPS), "elsewhere", "steps");
    let lease = Duration::from_millis(800);
    let zombie = match block_on(store.claim(&ClaimRequest {
        key: &key,
        fence: &other,
        holder: "elsewhere/elsewhere/0",
        fingerprint: None,
        lease,
        durable: true,
    }))
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
    let before = block_on(store.committed(&key)).unwrap().unwrap();
    let late = Commit {
        claim: ClaimRef {
            key: &key,
            token: zombie.token,
            fence: &other,
        },
        result: b"\"zombie\"",
        checkpoint: None,
        counts: None,
    };
    match block_on(store.commit(&late)) {
        Err(StoreError::ClaimLost { key: k, token }) => {
            assert_eq!((k, token), (key.clone(), zombie.token))
        }
        other => panic!("zombie commit must be refused, got {other:?}"),
    }
    assert_eq!(block_on(store.committed(&key)).unwrap().unwrap(), before);
    integrity_ok(&t.db());
}
