//! `idem:agent/once.run-once-many`: several keys claimed together, so that one instance
//! holds their claims at once and runs their side effects concurrently.
//!
//! The call is all or nothing: every key is checked before any is asked for, the
//! instance's limit of claims held at once is checked against all of them, and a key
//! refused (or a planned drop) part-way gives back the claims taken so far, which the
//! guest never saw — so no side effect began under them and they are not in doubt.
//! Each claim handed out is then the guest's to settle on its own.

use crate::runtime::bindings::Outcome;
use crate::runtime::bindings::StepError;
use crate::runtime::bindings::idem::agent::once::{Durability, StepRequest};
use crate::runtime::faults::Phase;
use crate::runtime::view::IdemCtxView;
use crate::text;

use super::StepFailure;
use super::once::{Acquired, StepSpan, step_span};

/// One key of the call, checked.
struct Asked {
    /// The key as the store names it.
    stored: String,
    ordinal: u32,
    span: StepSpan,
}

impl IdemCtxView<'_> {
    pub(super) async fn claim_many(
        &mut self,
        steps: Vec<StepRequest>,
    ) -> Result<Vec<Outcome>, StepFailure> {
        let asked = self.check_many(&steps)?;
        // Awaited in the order of the keys' text: two instances asking for keys that
        // overlap wait in one order and never for each other.
        let mut order: Vec<usize> = (0..steps.len()).collect();
        order.sort_by(|&a, &b| asked[a].stored.cmp(&asked[b].stored));
        // What the store said for each key, as (its index in `steps`, the answer).
        let mut got: Vec<(usize, Acquired)> = Vec::with_capacity(steps.len());
        for i in order {
            let step = &steps[i];
            let answer = match self.ctx.fault(Phase::BeforeClaim, asked[i].ordinal) {
                Err(drop) => Err(StepFailure::from(drop)),
                Ok(()) => {
                    let durable = matches!(step.durability, Durability::BeforeEffect);
                    let a = &asked[i];
                    self.acquire(
                        &a.stored,
                        &step.key,
                        step.fingerprint.as_deref(),
                        durable,
                        None,
                        &a.span,
                    )
                    .await
                }
            };
            match answer {
                Ok(answer) => got.push((i, answer)),
                Err(refused) => {
                    self.give_back(&asked, &got).await?;
                    return Err(refused);
                }
            }
        }
        got.sort_by_key(|(i, _)| *i);
        // No claim reaches the guest before every one has passed its after-claim point:
        // a drop here gives them all back, as it does for one.
        for (i, answer) in &got {
            if matches!(answer, Acquired::Granted { .. })
                && let Err(drop) = self.ctx.fault(Phase::AfterClaim, asked[*i].ordinal)
            {
                self.give_back(&asked, &got).await?;
                return Err(drop.into());
            }
        }
        let mut outcomes = Vec::with_capacity(steps.len());
        for ((step, a), (_, answer)) in steps.into_iter().zip(asked).zip(got) {
            outcomes.push(match answer {
                Acquired::Committed(outcome) => outcome,
                Acquired::Granted { grant, asked } => Outcome::Claimed(
                    self.grant(a.stored, step.key, a.ordinal, grant, asked, a.span)?,
                ),
            });
        }
        Ok(outcomes)
    }

    /// Checks every key before any is asked for: each valid, not held, asked for once,
    /// and all of them within the instance's limit of claims held at once.
    fn check_many(&mut self, steps: &[StepRequest]) -> Result<Vec<Asked>, StepFailure> {
        let mut asked: Vec<Asked> = Vec::with_capacity(steps.len());
        for step in steps {
            let stored = self.claimable(&step.key, step.fingerprint.as_deref())?;
            if asked.iter().any(|a| a.stored == stored) {
                return Err(StepError::InvalidKey(format!(
                    "key {} is asked for twice in one run-once-many",
                    text::quoted(&step.key)
                ))
                .into());
            }
            asked.push(Asked {
                span: step_span(&stored),
                stored,
                ordinal: 0,
            });
        }
        self.within_claim_limit(steps.len())?;
        // Numbered only once the call is accepted, in the order the agent gave them.
        for (a, step) in asked.iter_mut().zip(steps) {
            a.ordinal = self.ctx.run.ordinal(&step.key);
        }
        Ok(asked)
    }

    /// Gives back the claims this call took, which the guest never saw.
    async fn give_back(
        &mut self,
        asked: &[Asked],
        got: &[(usize, Acquired)],
    ) -> Result<(), StepFailure> {
        for (i, answer) in got {
            if let Acquired::Granted { grant, .. } = answer {
                self.drop_ungranted(&asked[*i].stored, grant).await?;
            }
        }
        Ok(())
    }
}
