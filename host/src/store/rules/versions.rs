//! Moving runs between versions of a deployment: which runs move where, and what is
//! refused. A backend reads the facts (the name's versions, the runs concerned and the
//! last move of each), asks [`plan_moves`], and applies the moves it returns, or
//! writes nothing when it returns an error.

use crate::store::{MoveTo, RunStatus, StoreError};

/// A version of a deployment, as moving runs needs it.
#[derive(Debug, Clone)]
pub(crate) struct VersionFacts {
    pub version: u64,
    pub digest: String,
    pub exports: Option<String>,
}

/// A run that may move, as moving it needs it.
#[derive(Debug, Clone)]
pub(crate) struct RunFacts {
    pub run_id: String,
    /// Its deployment's name.
    pub agent: String,
    /// Its status column (not `paused`: a paused run is queued or running underneath).
    pub status: RunStatus,
    pub version: Option<u64>,
    pub digest: String,
    /// Where its last move came from (version, component), if it ever moved.
    pub back: Option<(Option<u64>, String)>,
}

/// What to do with a run whose component and the target's export different things.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnMismatch {
    /// Refuse the whole request: an operator named the version.
    Refuse,
    /// Leave the run where it is: a deployment's rollout moves what it safely can.
    Keep,
}

/// One move to make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Planned {
    pub run_id: String,
    pub from_version: Option<u64>,
    pub from_digest: String,
    pub to_version: Option<u64>,
    pub to_digest: String,
}

/// The moves of `runs` (those named in `named`, fetched by id, in that order; or, when
/// `named` is empty, every run of `name` in flight, as fetched) to `to`, and the runs
/// left where they are because their exports differ (only with [`OnMismatch::Keep`]).
/// `versions` are all of `name`'s.
pub(crate) fn plan_moves(
    name: &str,
    to: MoveTo,
    named: &[String],
    versions: &[VersionFacts],
    runs: &[RunFacts],
    on_mismatch: OnMismatch,
) -> Result<(Vec<Planned>, Vec<String>), StoreError> {
    if versions.is_empty() {
        return Err(StoreError::UnknownDeployment {
            name: name.to_owned(),
        });
    }
    let version = |v: u64| versions.iter().find(|f| f.version == v);
    if let MoveTo::Version(v) = to
        && version(v).is_none()
    {
        return Err(StoreError::UnknownVersion {
            name: name.to_owned(),
            version: v,
        });
    }
    let mut seen = std::collections::HashSet::new();
    let (mut planned, mut kept) = (Vec::new(), Vec::new());
    let listed = !named.is_empty();
    let order: Vec<&RunFacts> = if listed {
        let mut order = Vec::with_capacity(named.len());
        for id in named {
            if !seen.insert(id.as_str()) {
                continue;
            }
            let run = runs
                .iter()
                .find(|r| r.run_id == *id)
                .ok_or_else(|| StoreError::UnknownRun { run_id: id.clone() })?;
            order.push(run);
        }
        order
    } else {
        runs.iter().collect()
    };
    for run in order {
        if run.agent != name {
            if !listed {
                continue;
            }
            return Err(StoreError::NotOfDeployment {
                run_id: run.run_id.clone(),
                agent: run.agent.clone(),
                name: name.to_owned(),
            });
        }
        if !in_flight(run.status) {
            if !listed {
                continue;
            }
            return Err(StoreError::RunFinished {
                run_id: run.run_id.clone(),
                status: run.status,
            });
        }
        let (to_version, to_digest) = match to {
            MoveTo::Version(v) => match version(v) {
                Some(target) => (Some(v), target.digest.clone()),
                None => {
                    return Err(StoreError::UnknownVersion {
                        name: name.to_owned(),
                        version: v,
                    });
                }
            },
            MoveTo::Back => match &run.back {
                Some((from_version, from_digest)) => {
                    // A move recorded before versions were names only components: the
                    // latest version with that component.
                    let v = from_version.or_else(|| {
                        versions
                            .iter()
                            .filter(|f| f.digest == *from_digest)
                            .map(|f| f.version)
                            .max()
                    });
                    (v, from_digest.clone())
                }
                None if listed => {
                    return Err(StoreError::NeverMoved {
                        run_id: run.run_id.clone(),
                    });
                }
                None => continue,
            },
        };
        if run.digest == to_digest && run.version == to_version {
            continue;
        }
        let exports = |v: Option<u64>| v.and_then(version).and_then(|f| f.exports.as_deref());
        if let (Some(from), Some(target)) = (exports(run.version), exports(to_version))
            && from != target
        {
            match on_mismatch {
                OnMismatch::Keep => {
                    kept.push(run.run_id.clone());
                    continue;
                }
                OnMismatch::Refuse => {
                    return Err(StoreError::ExportsDiffer {
                        run_id: run.run_id.clone(),
                        name: name.to_owned(),
                        from: match run.version {
                            Some(v) => format!("version {v}"),
                            None => format!("component {}", run.digest),
                        },
                        to: to_version.unwrap_or_default(),
                    });
                }
            }
        }
        planned.push(Planned {
            run_id: run.run_id.clone(),
            from_version: run.version,
            from_digest: run.digest.clone(),
            to_version,
            to_digest,
        });
    }
    Ok((planned, kept))
}

/// Whether a run with this status (its status column) has not ended: a worker will
/// drive it again, possibly after an operator settles a key it left in doubt.
pub(crate) fn in_flight(status: RunStatus) -> bool {
    matches!(
        status,
        RunStatus::Queued | RunStatus::Running | RunStatus::Paused | RunStatus::InDoubt
    )
}

/// The statuses [`in_flight`] takes, as SQL text for `status IN (…)`.
pub(crate) const IN_FLIGHT_SQL: &str = "('queued', 'running', 'in-doubt')";

#[cfg(test)]
mod tests {
    use super::*;

    fn versions() -> Vec<VersionFacts> {
        vec![
            VersionFacts {
                version: 1,
                digest: "a".into(),
                exports: Some("run".into()),
            },
            VersionFacts {
                version: 2,
                digest: "b".into(),
                exports: Some("run".into()),
            },
            VersionFacts {
                version: 3,
                digest: "c".into(),
                exports: Some("run; extra".into()),
            },
        ]
    }

    fn run(id: &str, status: RunStatus, version: u64, back: Option<u64>) -> RunFacts {
        let digest = |v: u64| ["a", "b", "c"][v as usize - 1].to_owned();
        RunFacts {
            run_id: id.into(),
            agent: "mailer".into(),
            status,
            version: Some(version),
            digest: digest(version),
            back: back.map(|v| (Some(v), digest(v))),
        }
    }

    #[test]
    fn every_run_in_flight_moves_and_ended_or_present_ones_do_not() {
        let runs = [
            run("r1", RunStatus::Running, 1, None),
            run("r2", RunStatus::Completed, 1, None),
            run("r3", RunStatus::Queued, 2, None),
            run("r4", RunStatus::InDoubt, 1, None),
        ];
        let (moves, kept) = plan_moves(
            "mailer",
            MoveTo::Version(2),
            &[],
            &versions(),
            &runs,
            OnMismatch::Refuse,
        )
        .unwrap();
        let ids: Vec<&str> = moves.iter().map(|m| m.run_id.as_str()).collect();
        assert_eq!(ids, ["r1", "r4"]);
        assert!(kept.is_empty());
        assert_eq!(moves[0].to_digest, "b");
    }

    #[test]
    fn a_named_run_that_cannot_move_refuses_the_whole_request() {
        let runs = [
            run("r1", RunStatus::Running, 1, None),
            run("r2", RunStatus::Completed, 1, None),
        ];
        let named = ["r1".to_owned(), "r2".to_owned()];
        let plan = |to, named: &[String]| {
            plan_moves("mailer", to, named, &versions(), &runs, OnMismatch::Refuse)
        };
        assert!(matches!(
            plan(MoveTo::Version(2), &named),
            Err(StoreError::RunFinished { run_id, .. }) if run_id == "r2"
        ));
        assert!(matches!(
            plan(MoveTo::Version(9), &named[..1]),
            Err(StoreError::UnknownVersion { version: 9, .. })
        ));
        assert!(matches!(
            plan(MoveTo::Back, &named[..1]),
            Err(StoreError::NeverMoved { run_id }) if run_id == "r1"
        ));
        assert!(matches!(
            plan(MoveTo::Version(3), &named[..1]),
            Err(StoreError::ExportsDiffer { to: 3, .. })
        ));
        assert!(matches!(
            plan(MoveTo::Version(2), &["ghost".to_owned()]),
            Err(StoreError::UnknownRun { .. })
        ));
        let mut other = run("r9", RunStatus::Running, 1, None);
        other.agent = "billing".into();
        assert!(matches!(
            plan_moves("mailer", MoveTo::Version(2), &["r9".to_owned()], &versions(),
                       &[other], OnMismatch::Refuse),
            Err(StoreError::NotOfDeployment { agent, .. }) if agent == "billing"
        ));
        assert!(matches!(
            plan_moves(
                "nobody",
                MoveTo::Version(1),
                &[],
                &[],
                &[],
                OnMismatch::Refuse
            ),
            Err(StoreError::UnknownDeployment { .. })
        ));
    }

    #[test]
    fn back_goes_to_where_the_last_move_came_from_and_a_rollout_keeps_mismatches() {
        let runs = [
            run("r1", RunStatus::Running, 2, Some(1)),
            run("r2", RunStatus::Running, 1, None),
        ];
        let (moves, _) = plan_moves(
            "mailer",
            MoveTo::Back,
            &[],
            &versions(),
            &runs,
            OnMismatch::Refuse,
        )
        .unwrap();
        assert_eq!(moves.len(), 1, "a run that never moved is not moved back");
        assert_eq!(
            (moves[0].to_version, moves[0].to_digest.as_str()),
            (Some(1), "a")
        );

        let (moves, kept) = plan_moves(
            "mailer",
            MoveTo::Version(3),
            &[],
            &versions(),
            &runs,
            OnMismatch::Keep,
        )
        .unwrap();
        assert!(moves.is_empty());
        assert_eq!(kept, ["r1", "r2"]);
    }
}
