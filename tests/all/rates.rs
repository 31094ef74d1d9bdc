//! Rate limits on classes of steps: a class's limit, set in the store, holds across
//! three workers and every run, on SQLite and PostgreSQL. Time moves on the store's
//! manual clock, driven by the test (two and a half minutes of it, no real waiting);
//! the rate-limited side effects are counted in the waiter's log file, each attributed
//! to the store time at which it ran.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use idem::store::{RateLimit, RateRefusal, RateSetting, RunStatus, StoreError};
use idem::worker::{Worker, WorkerOptions};
use serde_json::json;

use crate::util::{block_on, host, tokio};
use crate::waits::{T0, Waits, suspended, wait_until};

const MINUTE: Duration = Duration::from_secs(60);

fn set_rate(w: &Waits, limit: u32, burst: u32) -> RateLimit {
    block_on(w.store().set_rate(&RateSetting {
        class: "llm",
        limit,
        period: MINUTE,
        burst,
    }))
    .unwrap()
}

/// Starts a worker on a host of its own over the waits' store: one of several workers
/// sharing the store, as processes on many machines would.
fn start_worker(
    w: &Waits,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let worker = Arc::new(Worker::new(
        Arc::new(host(Arc::clone(w.store()))),
        WorkerOptions {
            concurrency: 16,
            poll: Duration::from_millis(5),
            ..WorkerOptions::default()
        },
    ));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio().spawn(async move {
        worker
            .run(async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    (stop, handle)
}

/// The lines the rate-limited step wrote (`rated 0 gen=N`), one per execution.
fn rated(w: &Waits, log: &str) -> usize {
    w.log(log)
        .iter()
        .filter(|l| l.starts_with("rated "))
        .count()
}

/// 150 runs of one `llm` step each, more than 60 a minute can serve in two minutes,
/// all submitted at once to three workers: the steps start exactly a second apart on
/// the store's clock — never more than 60 in any minute, and 60 in every minute while
/// steps wait (the limit used fully) — and each effect runs exactly once.
fn sixty_a_minute_across_three_workers(w: &Waits) {
    const RUNS: usize = 150;
    let limit = set_rate(w, 60, 1);
    assert_eq!((limit.limit, limit.period_ms, limit.burst), (60, 60_000, 1));
    let runs: Vec<(String, serde_json::Value)> = (0..RUNS)
        .map(|i| {
            let input = json!({"log": "/data/rated.log", "waits": [{"rate": "llm"}]});
            (format!("r{i:03}"), input)
        })
        .collect();
    w.submit(&runs);
    let workers: Vec<_> = (0..3).map(|_| start_worker(w)).collect();

    // Store time -> the rate-limited effects that ran at it. The clock moves only once
    // every run is finished or suspended until a later time, so each effect is
    // attributed to the exact time it ran.
    let mut started: BTreeMap<i64, usize> = BTreeMap::new();
    let mut seen = 0;
    loop {
        let now = w.clock.now();
        wait_until(
            "every run is finished or waits for a later time",
            Duration::from_secs(120),
            || {
                w.runs().iter().all(|r| {
                    r.status == RunStatus::Completed
                        || (suspended(r) && r.wake_at.is_some_and(|at| at > now))
                })
            },
        );
        let count = rated(w, "rated.log");
        if count > seen {
            started.insert(now, count - seen);
            seen = count;
        }
        let next = w
            .runs()
            .iter()
            .filter(|r| r.status != RunStatus::Completed)
            .filter_map(|r| r.wake_at)
            .min();
        match next {
            Some(at) => w.clock.set(at),
            None => break,
        }
    }
    for (stop, handle) in workers {
        let _ = stop.send(());
        block_on(handle).unwrap();
    }

    assert_eq!(seen, RUNS, "each rate-limited effect ran exactly once");
    assert!(
        w.runs().iter().all(|r| r.status == RunStatus::Completed),
        "every run completed"
    );
    let times: Vec<i64> = started
        .iter()
        .flat_map(|(at, n)| std::iter::repeat_n(*at, *n))
        .collect();
    assert!(
        *times.last().unwrap() - T0 >= 120_000,
        "the test covers two minutes of the store's clock"
    );
    // Never exceeded: no minute-long window holds a 61st start.
    for (i, at) in times.iter().enumerate().skip(60) {
        assert!(
            at - times[i - 60] >= 60_000,
            "61 starts within a minute: {} and {at}",
            times[i - 60]
        );
    }
    // Used fully: while steps waited, every minute started 60 of them.
    for minute in 0..2 {
        let from = T0 + minute * 60_000;
        let n = times
            .iter()
            .filter(|t| (from..from + 60_000).contains(*t))
            .count();
        assert_eq!(n, 60, "minute {minute} started {n}, not 60");
    }
    assert_eq!(
        times,
        (0..RUNS as i64).map(|i| T0 + i * 1000).collect::<Vec<_>>(),
        "one start each second"
    );
    // Every token was handed out; the class's next is free after the last.
    let rates = block_on(w.store().rates()).unwrap();
    assert_eq!(rates.len(), 1);
    assert_eq!(rates[0].next_free, Some(T0 + RUNS as i64 * 1000));
}

#[test]
fn a_rate_limit_of_60_a_minute_holds_across_three_workers_and_is_used_fully() {
    Waits::both("rate_sixty_a_minute", |w| {
        sixty_a_minute_across_three_workers(&w)
    });
}

/// A run dropped right before its rate-limited step's claim, or right after it (the
/// token and the claim are one transaction), finds its token when it resumes: the step
/// runs once and the class lent one token, not two.
fn a_replay_takes_no_other_token(w: &Waits) {
    set_rate(w, 60, 1);
    // Claim 1 is the agent's `start` step, claim 2 the rate-limited one. Each run's
    // token is the next second's: the clock moves a second after each.
    for (i, (run, point)) in [("before", "before-claim:2"), ("after", "after-claim:2")]
        .into_iter()
        .enumerate()
    {
        let log = format!("/data/{run}.log");
        let mut opts = w.options(run, json!({"log": log, "waits": [{"rate": "llm"}]}));
        opts.faults.crash_at = vec![point.parse().unwrap()];
        let report = block_on(w.spawn_with(opts)).unwrap();
        assert_eq!(report.status, RunStatus::Completed, "{point}");
        assert!(report.counts.instances >= 2, "{point}: {:?}", report.counts);
        assert_eq!(rated(w, &format!("{run}.log")), 1, "{point}");
        let waits = block_on(w.store().waits(run)).unwrap();
        assert_eq!(waits.len(), 1, "{point}: {waits:?}");
        assert_eq!(waits[0].rate.as_deref(), Some("llm"));
        assert_eq!(waits[0].due, Some(T0 + 1000 * i as i64), "{point}");
        // One token lent to the run, not two: the next is free a second after its.
        let rates = block_on(w.store().rates()).unwrap();
        assert_eq!(
            rates[0].next_free,
            Some(T0 + 1000 * (i as i64 + 1)),
            "{point}"
        );
        w.clock.advance(Duration::from_secs(1));
    }

    // Two runs asking at once: the second's step waits a second for its token,
    // holding no instance.
    let input = json!({"log": "/data/c.log", "waits": [{"rate": "llm"}]});
    assert_eq!(
        block_on(w.spawn_run("first", input.clone()))
            .unwrap()
            .status,
        RunStatus::Completed
    );
    let next = w.spawn_run("next", input);
    wait_until(
        "the next run waits for its token",
        Duration::from_secs(30),
        || w.suspended("next"),
    );
    assert_eq!(w.record("next").wake_at, Some(T0 + 3000));
    assert_eq!(w.host.live_instances(), 0);
    assert_eq!(rated(w, "c.log"), 1);
    w.clock.advance(Duration::from_secs(1));
    assert_eq!(block_on(next).unwrap().status, RunStatus::Completed);
    assert_eq!(rated(w, "c.log"), 2);
}

#[test]
fn a_step_resumed_after_a_crash_takes_no_other_token() {
    Waits::both("rate_replay", |w| a_replay_takes_no_other_token(&w));
}

/// A burst lets that many steps start at once after the class was idle; a class with
/// no limit hands its tokens out at once; clearing a limit frees the class.
fn bursts_and_unlimited_classes(w: &Waits) {
    set_rate(w, 60, 3);
    let input = |class: &str| json!({"log": "/data/b.log", "waits": [{"rate": class}]});
    let mut waiting = Vec::new();
    for i in 0..5 {
        let report = w.spawn_run(&format!("b{i}"), input("llm"));
        if i < 3 {
            assert_eq!(block_on(report).unwrap().status, RunStatus::Completed);
        } else {
            wait_until("the run waits", Duration::from_secs(30), || {
                w.suspended(&format!("b{i}"))
            });
            // Tokens 4 and 5 are a second and two after the burst.
            let due = T0 + (i as i64 - 2) * 1000;
            assert_eq!(w.record(&format!("b{i}")).wake_at, Some(due));
            waiting.push(report);
        }
    }
    assert_eq!(rated(w, "b.log"), 3);
    for i in 0..4 {
        let report = block_on(w.spawn_run(&format!("u{i}"), input("search"))).unwrap();
        assert_eq!(report.status, RunStatus::Completed, "an unlimited class");
    }
    assert_eq!(rated(w, "b.log"), 7);
    assert!(block_on(w.store().clear_rate("llm")).unwrap());
    assert!(!block_on(w.store().clear_rate("llm")).unwrap());
    assert!(block_on(w.store().rates()).unwrap().is_empty());
    // The waiting runs keep the slots they reserved: cleared, the limit lends no more.
    let later = block_on(w.spawn_run("after-clear", input("llm"))).unwrap();
    assert_eq!(later.status, RunStatus::Completed);
    assert_eq!(rated(w, "b.log"), 8);
    w.clock.advance(Duration::from_secs(2));
    for report in waiting {
        assert_eq!(block_on(report).unwrap().status, RunStatus::Completed);
    }
    assert_eq!(rated(w, "b.log"), 10);
}

#[test]
fn a_burst_starts_at_once_and_an_unlimited_class_never_waits() {
    Waits::both("rate_burst", |w| bursts_and_unlimited_classes(&w));
}

/// Absurd limits are refused with the reason, and change nothing.
fn bad_rates_are_refused(w: &Waits) {
    set_rate(w, 60, 1);
    let ok = RateSetting {
        class: "llm",
        limit: 60,
        period: MINUTE,
        burst: 1,
    };
    for (bad, expected) in [
        (RateSetting { limit: 0, ..ok }, RateRefusal::Zero("limit")),
        (RateSetting { burst: 0, ..ok }, RateRefusal::Zero("burst")),
        (
            RateSetting {
                limit: 5_000_000,
                ..ok
            },
            RateRefusal::Absurd {
                what: "limit",
                value: 5_000_000,
            },
        ),
        (
            RateSetting {
                period: Duration::ZERO,
                ..ok
            },
            RateRefusal::Period(0),
        ),
        (
            RateSetting {
                period: Duration::from_secs(2 * 86_400),
                ..ok
            },
            RateRefusal::Period(172_800_000),
        ),
    ] {
        match block_on(w.store().set_rate(&bad)) {
            Err(StoreError::RateRefused { refusal, class }) => {
                assert_eq!((refusal, class.as_str()), (expected, "llm"));
            }
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    let class = "a\u{7}b";
    assert!(matches!(
        block_on(w.store().set_rate(&RateSetting { class, ..ok })),
        Err(StoreError::RateRefused {
            refusal: RateRefusal::BadClass(_),
            ..
        })
    ));
    let rates = block_on(w.store().rates()).unwrap();
    assert_eq!(rates.len(), 1);
    assert_eq!((rates[0].limit, rates[0].period_ms), (60, 60_000));

    // An agent naming an invalid class gets the SDK's error, and nothing is recorded.
    let bad = block_on(w.spawn_run(
        "bad-class",
        json!({"log": "/data/x.log", "waits": [{"rate": ""}]}),
    ))
    .unwrap();
    assert_eq!(bad.status, RunStatus::Failed);
    assert!(
        String::from_utf8_lossy(&bad.outcome).contains("rate class name must not be empty"),
        "{}",
        String::from_utf8_lossy(&bad.outcome)
    );
    assert_eq!(rated(w, "x.log"), 0);
    assert!(block_on(w.store().waits("bad-class")).unwrap().is_empty());
}

#[test]
fn bad_rate_limits_are_refused_and_change_nothing() {
    Waits::both("rate_bad", |w| bad_rates_are_refused(&w));
}

/// The waiter's Python twin names the class with `idem.run_once(..., rate=...)`.
#[test]
fn a_python_agent_takes_its_tokens_and_takes_no_other_on_replay() {
    if idem_test_artifacts::PY_WAITER.is_empty() {
        eprintln!(
            "SKIPPED: Python agents were not built (no componentize-py): rates; \
             run scripts/test, which installs it"
        );
        return;
    }
    let python = || Waits {
        agent: idem_test_artifacts::PY_WAITER,
        ..Waits::sqlite()
    };
    a_replay_takes_no_other_token(&python());
    bursts_and_unlimited_classes(&python());
}
