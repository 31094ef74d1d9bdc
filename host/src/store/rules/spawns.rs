//! The rules of spawning: what each child of a batch gets, given what the store holds.
//! A backend reads the facts in a few statements for the whole batch (the children
//! already there, the deployments named, the parent's depth, children and ancestors)
//! and writes the children this plan creates, so a batch of a thousand costs a handful
//! of statements and both backends answer each child the same way.

use std::collections::HashMap;

use crate::store::{SpawnBatch, SpawnRefusal, Spawned};

/// A child of the batch the store already holds under its id.
#[derive(Debug, Clone)]
pub(crate) struct Found {
    /// The run that spawned it.
    pub(crate) parent: Option<String>,
    /// Its deployment.
    pub(crate) agent: String,
    /// Whether its input is the one this child of the batch asks for.
    pub(crate) same_input: bool,
}

/// What the store holds that a batch's answers depend on, read in the batch's
/// transaction.
#[derive(Debug, Default)]
pub(crate) struct SpawnFacts {
    /// Per child of the batch, in its order: the run already under its id, if any.
    pub(crate) found: Vec<Option<Found>>,
    /// The deployments the batch names that exist: name → (digest, authority).
    pub(crate) deployments: HashMap<String, (String, Vec<u8>)>,
    /// The parent's depth.
    pub(crate) depth: i64,
    /// How many children the parent has.
    pub(crate) children: i64,
    /// The parent and its ancestors, as (deployment, spawn key) → run id, for those
    /// that were spawned.
    pub(crate) ancestors: HashMap<(String, String), String>,
}

/// A child the plan creates.
#[derive(Debug, Clone)]
pub(crate) struct Create {
    /// Its index in the batch.
    pub(crate) at: usize,
    /// Its deployment's component now.
    pub(crate) digest: String,
    /// Its deployment's authority now.
    pub(crate) authority: Vec<u8>,
}

/// The batch's answers, and the children to create for them.
#[derive(Debug)]
pub(crate) struct SpawnPlan {
    /// Per child, in order: spawned (created by this batch or found) or refused.
    pub(crate) answers: Vec<Result<Spawned, SpawnRefusal>>,
    /// The children to insert, in order.
    pub(crate) create: Vec<Create>,
    /// Their depth (all of them: the parent's plus one).
    pub(crate) depth: i64,
}

/// What differs when a spawn finds its child id taken: `None` if the child found is the
/// one asked for (spawned by `parent` as `deployment` with the same input), else what is
/// not (`another parent`, `another deployment`, `other input`).
fn spawned_differently(
    parent: &str,
    deployment: &str,
    found_parent: Option<&str>,
    found_agent: &str,
    same_input: bool,
) -> Option<&'static str> {
    if found_parent != Some(parent) {
        Some("another parent")
    } else if found_agent != deployment {
        Some("another deployment")
    } else if !same_input {
        Some("other input")
    } else {
        None
    }
}

/// Answers each child of `batch`, in order, as a spawn of it alone would be answered
/// after the ones before it: a child found (in the store, or created earlier in the
/// batch) is returned if it is the one asked for and refused as a key reused if not;
/// then an unknown deployment, the depth limit, the children limit and a cycle refuse
/// it, in that order.
pub(crate) fn plan_spawns(batch: &SpawnBatch<'_>, facts: &SpawnFacts) -> SpawnPlan {
    let parent = batch.fence.run_id.as_str();
    let depth = facts.depth.saturating_add(1);
    let mut children = facts.children;
    // Children created earlier in this batch, by id: their index.
    let mut created: HashMap<&str, usize> = HashMap::new();
    let mut answers = Vec::with_capacity(batch.children.len());
    let mut create = Vec::new();
    for (at, child) in batch.children.iter().enumerate() {
        let spawned = |created| Spawned {
            run_id: child.child_id.to_owned(),
            created,
        };
        let found = match created.get(child.child_id) {
            Some(&first) => {
                let earlier = &batch.children[first];
                Some(Found {
                    parent: Some(parent.to_owned()),
                    agent: earlier.deployment.to_owned(),
                    same_input: earlier.input == child.input,
                })
            }
            None => facts.found.get(at).cloned().flatten(),
        };
        if let Some(found) = found {
            let answer = match spawned_differently(
                parent,
                child.deployment,
                found.parent.as_deref(),
                &found.agent,
                found.same_input,
            ) {
                None => Ok(spawned(false)),
                Some(what) => Err(SpawnRefusal::KeyReused {
                    key: child.key.to_owned(),
                    what,
                }),
            };
            answers.push(answer);
            continue;
        }
        let Some((digest, authority)) = facts.deployments.get(child.deployment) else {
            answers.push(Err(SpawnRefusal::UnknownDeployment(
                child.deployment.to_owned(),
            )));
            continue;
        };
        let refusal = if depth > i64::from(batch.limits.max_depth) {
            Some(SpawnRefusal::TooDeep {
                depth: u32::try_from(depth).unwrap_or(u32::MAX),
                max: batch.limits.max_depth,
            })
        } else if children >= i64::from(batch.limits.max_children) {
            Some(SpawnRefusal::TooMany {
                count: batch.limits.max_children,
            })
        } else {
            facts
                .ancestors
                .get(&(child.deployment.to_owned(), child.key.to_owned()))
                .map(|ancestor| SpawnRefusal::Cycle {
                    ancestor: ancestor.clone(),
                    deployment: child.deployment.to_owned(),
                    key: child.key.to_owned(),
                })
        };
        if let Some(refusal) = refusal {
            answers.push(Err(refusal));
            continue;
        }
        children += 1;
        created.insert(child.child_id, at);
        create.push(Create {
            at,
            digest: digest.clone(),
            authority: authority.clone(),
        });
        answers.push(Ok(spawned(true)));
    }
    SpawnPlan {
        answers,
        create,
        depth,
    }
}
