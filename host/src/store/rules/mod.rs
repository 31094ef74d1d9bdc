//! The decisions every backend makes the same way, in one place: what a claim of a key
//! gets given the key's row, which token a grant takes, whether a run's lease may be
//! granted, when a lease runs out, how a component joins a namespace, which values a
//! store refuses to keep, what gc collects, the rules of waits (`waits.rs`), of
//! schedules (`schedules.rs`), of spawns (`spawns.rs`) and of moving runs between
//! versions (`versions.rs`). A backend reads the row (locking it
//! as its database needs), asks here, and writes what the answer says; so the two
//! backends cannot drift apart on a rule, and the store suite, which runs on both,
//! checks one implementation. The backends never import each other: what they share
//! is here.

mod schedules;
mod spawns;
mod versions;
mod waits;

pub(crate) use schedules::{TickAction, check_def, tick_action};
pub(crate) use spawns::{Found, SpawnFacts, SpawnPlan, plan_spawns};
pub(crate) use versions::{IN_FLIGHT_SQL, OnMismatch, Planned, RunFacts, VersionFacts, plan_moves};
pub(crate) use waits::{
    Recorded, WaitRow, asked, join_asked, join_mode, join_reused, sleep_state, wait_sync,
};

use std::time::Duration;

use super::{
    Admission, Checkpoint, ClaimOutcome, Counts, Deployment, DeploymentRecord, GcReport, GcRequest,
    Grant, HeldClaim, MAX_STEP, Millis, RunLeaseInfo, RunStatus, StoreError,
};

/// How `deployment` joins its name's namespace, which has `members` components, one of
/// them `deployment`'s if `is_member`, given what the name points at now (`current`);
/// `None` when it may not join ([`StoreError::NamespaceTaken`]).
///
/// An operator's act joins whoever is there. A first use joins an empty namespace or
/// one it is in. A first use from the local file (`source`) that the name's current
/// first use or rebuild was run from joins as a rebuild: the dev loop, edit → build →
/// run. Any other component is refused, so one saved under an agent's file name
/// elsewhere cannot reach that agent's keys, and a name an operator deployed (no
/// source) is followed by no rebuild.
pub(crate) fn admit(
    deployment: &Deployment<'_>,
    current: Option<&DeploymentRecord>,
    (members, is_member): (i64, bool),
) -> Option<Admission> {
    if deployment.admission != Admission::FirstUse || members == 0 || is_member {
        return Some(deployment.admission);
    }
    let rebuild = current.is_some_and(|current| {
        matches!(current.admission, Admission::FirstUse | Admission::Rebuild)
            && deployment.source.is_some()
            && current.source.as_deref() == deployment.source
    });
    rebuild.then_some(Admission::Rebuild)
}

/// How a component that joined by `admission` is kept as a namespace member: a rebuild
/// is an upgrade of the component the file built before.
pub(crate) fn member_how(admission: Admission) -> &'static str {
    match admission {
        Admission::Rebuild => "upgrade",
        other => other.as_str(),
    }
}

/// The largest token, count or step a store keeps: both backends store them as signed
/// 64-bit integers.
pub(crate) const SQL_MAX: u64 = i64::MAX as u64;

/// When a lease of `lease` taken at `now` runs out. Saturates: an absurdly long lease
/// simply never expires.
pub(crate) fn lease_expiry(now: Millis, lease: Duration) -> Millis {
    let lease = Millis::try_from(lease.as_millis()).unwrap_or(Millis::MAX);
    now.saturating_add(lease)
}

/// The grant of a key nobody claimed before, with tokens at least `floor` (the store's
/// epoch: tokens after a reboot start above every token before it).
pub(crate) fn first_grant(floor: u64) -> Grant {
    Grant {
        token: floor.max(1),
        attempt: 1,
        in_doubt: false,
    }
}

/// A key's row as it stands, as the claim rules need it.
pub(crate) struct KeyRow {
    /// The run that last claimed (or parked) the key.
    pub run_id: String,
    /// The live claim's holder; `None` when released, parked or committed.
    pub holder: Option<String>,
    /// The token of the key's latest grant.
    pub token: u64,
    /// The number of the key's latest grant.
    pub attempt: u32,
    /// When the latest grant's lease runs out, on the store's clock.
    pub lease_expires: Millis,
    /// Why the key is parked in doubt, if it is.
    pub parked: Option<String>,
    /// The fingerprint the key is bound to, if any.
    pub fingerprint: Option<String>,
    /// The committed result, once there is one.
    pub result: Option<Vec<u8>>,
}

/// What a claim of a key that has a row gets.
#[derive(Debug)]
pub(crate) enum ClaimDecision {
    /// Answer the claimant with this and write nothing.
    Answer(ClaimOutcome),
    /// Grant the key: write this grant (token, attempt) to the key's row, and count a
    /// retake in doubt in the run's record when it is one.
    Grant(Grant),
}

/// Decides a claim of a key whose row is `row`, asked with fingerprint `asked`, at
/// `now`; `stale_token` names a live claim the claimant may take over
/// (`InstanceStore::take_over`). A grant's token is at least `floor` ([`first_grant`]).
///
/// In order: another fingerprint is a conflict; a committed result is handed back; a
/// parked key stays parked; a released claim is granted afresh; a claim whose holder
/// vanished (lease expired, or the stale token) is retaken in doubt, since its side
/// effect may have begun; a live claim is held.
pub(crate) fn decide_claim(
    row: KeyRow,
    asked: Option<&str>,
    stale_token: Option<u64>,
    now: Millis,
    floor: u64,
) -> Result<ClaimDecision, StoreError> {
    // A side without a fingerprint binds nothing: the agent did not say what the step
    // does.
    if let (Some(bound), Some(asked)) = (&row.fingerprint, asked)
        && bound != asked
    {
        return Ok(ClaimDecision::Answer(ClaimOutcome::Conflict {
            fingerprint: row.fingerprint.unwrap_or_default(),
        }));
    }
    if let Some(result) = row.result {
        return Ok(ClaimDecision::Answer(ClaimOutcome::Committed(result)));
    }
    if let Some(reason) = row.parked {
        return Ok(ClaimDecision::Answer(ClaimOutcome::Parked {
            run_id: row.run_id,
            reason,
        }));
    }
    let in_doubt = match row.holder {
        // Released: the holder gave up before starting, or knows it did not finish.
        None => false,
        Some(_) if row.lease_expires <= now || stale_token == Some(row.token) => true,
        Some(holder) => {
            return Ok(ClaimDecision::Answer(ClaimOutcome::Held(HeldClaim {
                holder,
                token: row.token,
                lease_expires: row.lease_expires,
            })));
        }
    };
    Ok(ClaimDecision::Grant(Grant {
        token: next_token("fencing token", row.token)?.max(floor),
        attempt: row.attempt.saturating_add(1),
        in_doubt,
    }))
}

/// The token after `last` (of a key, or of a run's lease). Tokens only fence the
/// holders of one key (or one run) against each other, so per-key order is all they
/// need; one past what a store keeps is refused rather than wrapped.
pub(crate) fn next_token(what: &'static str, last: u64) -> Result<u64, StoreError> {
    last.checked_add(1)
        .filter(|&next| next <= SQL_MAX)
        .ok_or(StoreError::OutOfRange {
            what,
            value: last.saturating_add(1),
            max: SQL_MAX,
        })
}

/// The error for a commit, release or park by a token that no longer holds the key.
pub(crate) fn claim_lost(key: &str, token: u64) -> StoreError {
    StoreError::ClaimLost {
        key: key.to_owned(),
        token,
    }
}

/// What a request for one run's lease gets.
#[derive(Debug)]
pub(crate) enum LeaseDecision {
    /// The run has ended: answer with its record.
    Finished,
    /// Another worker's lease is live.
    Held(RunLeaseInfo),
    /// Grant the lease under `token`. `taken_over`: a lease was still recorded, so its
    /// holder died or stopped without giving it back, and counts it had not written
    /// are lost.
    Grant { token: u64, taken_over: bool },
}

/// The token of a run lease granted after one of token `last`: the next, and at least
/// `floor`, the store's epoch (a lease granted without a sync may be lost with the
/// power or a database crash, and its token must not be handed out again).
pub(crate) fn run_lease_token(last: u64, floor: u64) -> Result<u64, StoreError> {
    Ok(next_token("run lease token", last)?.max(floor))
}

/// Decides a request by `worker` for the lease of a run in `status`, whose recorded
/// lease is `lease` and latest lease token `last`, at `now`, with the store's token
/// floor `floor` ([`run_lease_token`]). A lease the same worker holds is granted again:
/// the worker knows it is not driving the run (a host keeps that to itself), so it may
/// take it back at once.
pub(crate) fn decide_run_lease(
    status: RunStatus,
    lease: Option<RunLeaseInfo>,
    last: u64,
    floor: u64,
    worker: &str,
    now: Millis,
) -> Result<LeaseDecision, StoreError> {
    if status.is_finished() {
        return Ok(LeaseDecision::Finished);
    }
    let taken_over = lease.is_some();
    if let Some(held) = lease.filter(|held| held.expires > now && held.worker != worker) {
        return Ok(LeaseDecision::Held(held));
    }
    Ok(LeaseDecision::Grant {
        token: run_lease_token(last, floor)?,
        taken_over,
    })
}

/// Refuses a value beyond `max`, naming it as `what`.
fn check_range(what: &'static str, value: u64, max: u64) -> Result<(), StoreError> {
    if value <= max {
        Ok(())
    } else {
        Err(StoreError::OutOfRange { what, value, max })
    }
}

/// Refuses counts a store cannot keep, before anything is written.
pub(crate) fn check_counts(counts: &Counts) -> Result<(), StoreError> {
    check_range("count executed", counts.executed, SQL_MAX)?;
    check_range("count skipped", counts.skipped, SQL_MAX)?;
    check_range("count awaited", counts.awaited, SQL_MAX)?;
    check_range("count reclaimed", counts.reclaimed, SQL_MAX)?;
    check_range("count instances", counts.instances, SQL_MAX)?;
    check_range("count recycled", counts.recycled, SQL_MAX)
}

/// Refuses a checkpoint a store cannot keep, before anything is written.
pub(crate) fn check_checkpoint(checkpoint: &Checkpoint) -> Result<(), StoreError> {
    check_range("checkpoint step", checkpoint.step, MAX_STEP)
}

/// Rows `OperatorStore::gc` deletes per transaction: small enough that the writers it shares
/// the store with (a worker's steps) wait a few milliseconds at most.
pub(crate) const GC_BATCH: usize = 256;

/// When gc collects: runs that finished before the first time, keys committed before
/// the second, both measured back from `now` on the store's clock.
pub(crate) fn gc_cutoffs(now: Millis, req: &GcRequest) -> (Millis, Millis) {
    let before = |age: std::time::Duration| {
        now.saturating_sub(Millis::try_from(age.as_millis()).unwrap_or(Millis::MAX))
    };
    (before(req.finished_before), before(req.dedupe_window))
}

/// When gc collects finished runs' step history ([`GcRequest::history_before`]), if
/// it does: measured back from `now` on the store's clock.
pub(crate) fn history_cutoff(now: Millis, req: &GcRequest) -> Option<Millis> {
    req.history_before
        .map(|age| now.saturating_sub(Millis::try_from(age.as_millis()).unwrap_or(Millis::MAX)))
}

/// The most chunks a run's live stream keeps, whatever their size: an agent that
/// publishes a byte at a time under changing keys cannot make trimming read thousands
/// of rows per flush.
pub(crate) const LIVE_ROWS: i64 = 2048;

/// A count in a [`GcReport`].
pub(crate) type ReportField = fn(&mut GcReport) -> &mut u64;

/// The tables that hang off a run (beyond its input and outcome), each with the
/// report's count for it: what gc deletes with the run.
pub(crate) const GC_RUN_TABLES: &[(&str, ReportField)] = &[
    ("progress", |r| &mut r.checkpoints),
    ("run_logs", |r| &mut r.log_chunks),
    ("waits", |r| &mut r.waits),
    ("signals", |r| &mut r.signals),
    ("run_upgrades", |r| &mut r.upgrades),
    ("step_usage", |r| &mut r.usage),
    ("run_live", |r| &mut r.live_chunks),
    ("run_events", |r| &mut r.events),
];

/// The statuses gc counts as finished: completed and cancelled runs never run again;
/// failed ones are resumable, so only when asked.
pub(crate) fn gc_statuses(req: &GcRequest) -> &'static [RunStatus] {
    if req.include_failed {
        &[
            RunStatus::Completed,
            RunStatus::Cancelled,
            RunStatus::Failed,
        ]
    } else {
        &[RunStatus::Completed, RunStatus::Cancelled]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> KeyRow {
        KeyRow {
            run_id: "r".into(),
            holder: Some("h".into()),
            token: 4,
            attempt: 2,
            lease_expires: 100,
            parked: None,
            fingerprint: Some("f".into()),
            result: None,
        }
    }

    fn granted(d: ClaimDecision) -> Grant {
        match d {
            ClaimDecision::Grant(g) => g,
            other => panic!("expected a grant, got {other:?}"),
        }
    }

    #[test]
    fn a_live_claim_is_held_until_its_lease_ends_then_retaken_in_doubt() {
        let held = decide_claim(row(), Some("f"), None, 99, 0).unwrap();
        assert!(matches!(
            held,
            ClaimDecision::Answer(ClaimOutcome::Held(HeldClaim { token: 4, .. }))
        ));
        let g = granted(decide_claim(row(), Some("f"), None, 100, 0).unwrap());
        assert_eq!((g.token, g.attempt, g.in_doubt), (5, 3, true));
        let g = granted(decide_claim(row(), None, Some(4), 0, 0).unwrap());
        assert!(g.in_doubt, "the stale token's claim is taken over in doubt");
    }

    #[test]
    fn a_released_claim_is_granted_afresh_and_a_result_wins_over_everything_but_a_conflict() {
        let released = KeyRow {
            holder: None,
            ..row()
        };
        let g = granted(decide_claim(released, Some("f"), None, 0, 0).unwrap());
        assert_eq!((g.token, g.in_doubt), (5, false));
        let committed = KeyRow {
            holder: None,
            result: Some(b"r".to_vec()),
            parked: Some("p".into()),
            ..row()
        };
        assert!(matches!(
            decide_claim(committed, None, None, 0, 0).unwrap(),
            ClaimDecision::Answer(ClaimOutcome::Committed(r)) if r == b"r"
        ));
        let other = decide_claim(row(), Some("g"), None, 1_000, 0).unwrap();
        assert!(matches!(
            other,
            ClaimDecision::Answer(ClaimOutcome::Conflict { fingerprint }) if fingerprint == "f"
        ));
    }

    #[test]
    fn grants_take_at_least_the_epochs_floor() {
        let floor = 3 << 32;
        assert_eq!(first_grant(0).token, 1);
        assert_eq!(first_grant(floor).token, floor);
        let released = KeyRow {
            holder: None,
            ..row()
        };
        let g = granted(decide_claim(released, None, None, 0, floor).unwrap());
        assert_eq!((g.token, g.attempt), (floor, 3));
        // Past the floor, a key's tokens count on from its row.
        let above = KeyRow {
            holder: None,
            token: floor + 7,
            ..row()
        };
        let g = granted(decide_claim(above, None, None, 0, floor).unwrap());
        assert_eq!(g.token, floor + 8);
    }

    #[test]
    fn tokens_stop_at_what_a_store_keeps() {
        assert_eq!(next_token("t", SQL_MAX - 1).unwrap(), SQL_MAX);
        assert!(matches!(
            next_token("t", SQL_MAX),
            Err(StoreError::OutOfRange { value, .. }) if value == SQL_MAX + 1
        ));
        assert!(next_token("t", u64::MAX).is_err());
    }

    #[test]
    fn a_run_lease_is_refused_only_while_another_workers_lease_lives() {
        let lease = |worker: &str, expires| {
            Some(RunLeaseInfo {
                worker: worker.into(),
                token: 7,
                expires,
            })
        };
        assert!(matches!(
            decide_run_lease(RunStatus::Running, lease("a", 10), 7, 0, "b", 9).unwrap(),
            LeaseDecision::Held(_)
        ));
        assert!(matches!(
            decide_run_lease(RunStatus::Running, lease("a", 10), 7, 0, "a", 9).unwrap(),
            LeaseDecision::Grant {
                token: 8,
                taken_over: true
            }
        ));
        assert!(matches!(
            decide_run_lease(RunStatus::Queued, None, 0, 0, "b", 9).unwrap(),
            LeaseDecision::Grant {
                token: 1,
                taken_over: false
            }
        ));
        assert!(matches!(
            decide_run_lease(RunStatus::Completed, lease("a", 10), 7, 0, "b", 9).unwrap(),
            LeaseDecision::Finished
        ));
        // Above the floor the count goes on; below it, the floor is the token.
        assert!(matches!(
            decide_run_lease(RunStatus::Queued, None, 7, 1 << 32, "b", 9).unwrap(),
            LeaseDecision::Grant {
                token: 0x1_0000_0000,
                taken_over: false
            }
        ));
        assert_eq!(
            run_lease_token((1 << 32) + 4, 1 << 32).unwrap(),
            (1 << 32) + 5
        );
    }
}
