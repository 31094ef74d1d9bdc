//! Token usage of model calls: spent once per key however often it is recorded, each
//! later recording a replay whose tokens are saved; summed per deployment and model;
//! refused (nothing written) for a key the run did not commit, a stale fence, a bad
//! model name or an absurd count.

use super::{DIGEST, Env};
use crate::store::{
    MAX_CALL_TOKENS, MAX_MODEL_BYTES, Recorded, RunFence, StoreError, Submission, Tokens,
    UsageFilter, UsageRecord, UsageRefusal, UsageTotal,
};

const TURN: Tokens = Tokens {
    input: 100,
    output: 20,
    cached: 50,
};

async fn record(
    env: &Env<'_>,
    fence: &RunFence,
    key: &str,
    model: &str,
    tokens: Tokens,
) -> Result<Recorded, StoreError> {
    env.store
        .record_usage(&UsageRecord {
            fence,
            key,
            model,
            tokens,
        })
        .await
}

/// Claims and commits `key` for the fence's run.
async fn committed(env: &Env<'_>, key: &str, fence: &RunFence) {
    let grant = env.grant(key, "h", fence).await;
    env.commit(key, grant.token, fence, b"{}").await.unwrap();
}

async fn totals(env: &Env<'_>, filter: UsageFilter<'_>) -> Vec<UsageTotal> {
    env.store.usage(&filter).await.unwrap()
}

pub(super) async fn usage_is_spent_once_per_key_and_replays_are_saved(env: &Env<'_>) {
    let r1 = env.lease("r1").await;
    committed(env, "billing:r1/llm/c/1", &r1).await;
    committed(env, "billing:r1/llm/c/2", &r1).await;
    committed(env, "billing:r1/llm/d/1", &r1).await;
    let spent = record(env, &r1, "billing:r1/llm/c/1", "gpt", TURN).await;
    assert_eq!(spent.unwrap(), Recorded::Spent);
    // A replay reads the same response; even a replay that claims other counts is
    // counted with the first recording's.
    for _ in 0..2 {
        let other = Tokens { input: 7, ..TURN };
        let saved = record(env, &r1, "billing:r1/llm/c/1", "gpt", other).await;
        assert_eq!(saved.unwrap(), Recorded::Saved);
    }
    let second = Tokens {
        input: 150,
        output: 10,
        cached: 0,
    };
    let spent = record(env, &r1, "billing:r1/llm/c/2", "gpt", second).await;
    assert_eq!(spent.unwrap(), Recorded::Spent);
    let spent = record(env, &r1, "billing:r1/llm/d/1", "claude", TURN).await;
    assert_eq!(spent.unwrap(), Recorded::Spent);

    // Another run, of another deployment, after a new lease of it (the fence moved).
    env.store.put_component(DIGEST, b"\0asm").await.unwrap();
    env.store
        .submit(&Submission {
            run_id: "r2",
            agent: "support",
            digest: DIGEST,
            namespace: "support",
            input: b"in",
            authority: b"authority",
            replace_authority: false,
            priority: 0,
        })
        .await
        .unwrap();
    let r2 = env.acquire("r2", "w").await;
    committed(env, "support:r2/llm/c/1", &r2).await;
    let spent = record(env, &r2, "support:r2/llm/c/1", "gpt", TURN).await;
    assert_eq!(spent.unwrap(), Recorded::Spent);

    let r1_totals = totals(
        env,
        UsageFilter {
            run_id: Some("r1"),
            ..UsageFilter::default()
        },
    )
    .await;
    let gpt = UsageTotal {
        deployment: "billing".into(),
        model: "gpt".into(),
        calls: 2,
        spent: Tokens {
            input: 250,
            output: 30,
            cached: 50,
        },
        replays: 2,
        saved: TURN.times(2),
    };
    let claude = UsageTotal {
        deployment: "billing".into(),
        model: "claude".into(),
        calls: 1,
        spent: TURN,
        replays: 0,
        saved: Tokens::default(),
    };
    assert_eq!(r1_totals, [claude.clone(), gpt.clone()]);
    let support = UsageTotal {
        deployment: "support".into(),
        model: "gpt".into(),
        calls: 1,
        spent: TURN,
        replays: 0,
        saved: Tokens::default(),
    };
    let all = totals(env, UsageFilter::default()).await;
    assert_eq!(all, [claude, gpt, support.clone()]);
    let by_deployment = UsageFilter {
        deployment: Some("support"),
        ..UsageFilter::default()
    };
    assert_eq!(totals(env, by_deployment).await, [support]);
}

pub(super) async fn usage_of_a_step_the_run_did_not_commit_is_refused(env: &Env<'_>) {
    let r1 = env.lease("r1").await;
    let r2 = env.lease("r2").await;
    committed(env, "billing:mine", &r1).await;
    committed(env, "billing:theirs", &r2).await;
    let open = env.grant("billing:open", "h", &r1).await;
    for key in ["billing:unknown", "billing:theirs", "billing:open"] {
        match record(env, &r1, key, "gpt", TURN).await {
            Err(StoreError::UsageRefused {
                refusal: UsageRefusal::UnknownStep,
                key: refused,
                run_id,
            }) => assert_eq!((refused.as_str(), run_id.as_str()), (key, "r1")),
            other => panic!("{key}: {other:?}"),
        }
    }
    let long = "m".repeat(MAX_MODEL_BYTES + 1);
    for model in ["", long.as_str(), "gpt\u{7}"] {
        let got = record(env, &r1, "billing:mine", model, TURN).await;
        assert!(
            matches!(
                got,
                Err(StoreError::UsageRefused {
                    refusal: UsageRefusal::BadModel(_),
                    ..
                })
            ),
            "{model:?}: {got:?}"
        );
    }
    let absurd = Tokens {
        output: MAX_CALL_TOKENS + 1,
        ..TURN
    };
    let got = record(env, &r1, "billing:mine", "gpt", absurd).await;
    assert!(
        matches!(
            got,
            Err(StoreError::UsageRefused {
                refusal: UsageRefusal::TooMany(_),
                ..
            })
        ),
        "{got:?}"
    );
    // A stale fence: the run was leased again.
    let stale = RunFence {
        token: r1.token + 1000,
        ..r1.clone()
    };
    let got = record(env, &stale, "billing:mine", "gpt", TURN).await;
    assert!(matches!(got, Err(StoreError::LeaseLost { .. })), "{got:?}");
    assert_eq!(
        totals(env, UsageFilter::default()).await,
        [],
        "nothing written"
    );
    // The open claim, once committed, may be recorded.
    env.commit("billing:open", open.token, &r1, b"{}")
        .await
        .unwrap();
    let spent = record(env, &r1, "billing:open", "gpt", TURN).await;
    assert_eq!(spent.unwrap(), Recorded::Spent);
}
