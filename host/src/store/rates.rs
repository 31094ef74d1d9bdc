//! Rate limits on classes of steps: a token bucket per class kept in the store, so every
//! worker and every run that names the class draws on one rate
//! ([`CatalogStore::set_rate`]). A step of a limited class takes its token through a
//! durable wait ([`WaitKind::Rate`]): a step over the limit waits holding no instance,
//! as a sleep does, until its token is due.
//!
//! The bucket is kept as a generic cell rate algorithm (GCRA, as Inngest's throttle
//! and redis-cell keep theirs): one time per class, the theoretical arrival time of the
//! next token, moved on by one emission interval (`period / limit`) per token handed
//! out. A token asked for when none is free is not refused and asked for again later:
//! it is *reserved* at the first free slot, and the wait is due at that slot. So
//! waiting steps never race for a token when they wake (no thundering herd), they are
//! served in the order they asked, and the rate is used fully while steps wait.

use std::time::Duration;

#[cfg(doc)]
use super::{CatalogStore, WaitKind};
use super::{Millis, StoreError};

/// The most tokens a limit may hand out per period, and the largest burst.
pub const MAX_RATE: u32 = 1_000_000;

/// The longest period a limit may count over: a day.
pub const MAX_RATE_PERIOD: Duration = Duration::from_secs(24 * 3600);

/// The longest class name accepted.
pub const MAX_CLASS_NAME_BYTES: usize = 128;

/// A rate limit to set on a class of steps: [`CatalogStore::set_rate`].
#[derive(Debug, Clone, Copy)]
pub struct RateSetting<'a> {
    /// The class the SDKs name on a step (`llm`, `search`...).
    pub class: &'a str,
    /// At most this many steps of the class start per `period`, spaced evenly.
    pub limit: u32,
    /// The period `limit` counts over.
    pub period: Duration,
    /// How many may start at once after the class was idle (1: none at once; every
    /// start is `period / limit` after the one before).
    pub burst: u32,
}

/// A class's rate limit, as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RateLimit {
    /// The class.
    pub class: String,
    /// Tokens per period.
    pub limit: u32,
    /// The period, in milliseconds.
    pub period_ms: u64,
    /// Tokens that may be taken at once after the class was idle.
    pub burst: u32,
    /// When the next token is free on the store's clock, if it is in the future: the
    /// steps of the class have reserved every token before it.
    pub next_free: Option<Millis>,
    /// When the limit was set, on the store's clock.
    pub updated: Millis,
}

/// Why a [`RateSetting`] was refused ([`StoreError::RateRefused`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RateRefusal {
    /// The class's name is empty, too long or holds control characters.
    #[error("{0}")]
    BadClass(String),
    /// A limit or burst of zero would never let a step start.
    #[error("a {0} of 0 would never let a step start; clear the limit instead")]
    Zero(&'static str),
    /// A limit or burst beyond [`MAX_RATE`].
    #[error("a {what} of {value} is beyond the most a store keeps ({MAX_RATE})")]
    Absurd {
        /// `limit` or `burst`.
        what: &'static str,
        /// What was asked for.
        value: u64,
    },
    /// A period of zero, under a millisecond, or beyond [`MAX_RATE_PERIOD`].
    #[error("a period of {0} ms is outside what a store keeps (1 ms to 1 day)")]
    Period(u64),
}

/// Checks a class's name: one a step may name and a limit may be set on.
pub fn check_class_name(class: &str) -> Result<(), String> {
    if class.is_empty() {
        return Err("a rate class name must not be empty".into());
    }
    if class.len() > MAX_CLASS_NAME_BYTES {
        return Err(format!(
            "rate class name is {} bytes, over the limit of {MAX_CLASS_NAME_BYTES}",
            class.len()
        ));
    }
    crate::text::check_visible(class)
        .map_err(|hidden| format!("rate class name holds {hidden}; use visible text"))
}

/// Checks a setting's values; on success, its period in milliseconds.
pub(crate) fn check_rate(setting: &RateSetting<'_>) -> Result<i64, StoreError> {
    refusal(setting).map_err(|refusal| StoreError::RateRefused {
        class: setting.class.to_string(),
        refusal,
    })
}

/// Why a setting is refused, if it is.
fn refusal(setting: &RateSetting<'_>) -> Result<i64, RateRefusal> {
    check_class_name(setting.class).map_err(RateRefusal::BadClass)?;
    for (what, value) in [("limit", setting.limit), ("burst", setting.burst)] {
        if value == 0 {
            return Err(RateRefusal::Zero(what));
        }
        if value > MAX_RATE {
            return Err(RateRefusal::Absurd {
                what,
                value: u64::from(value),
            });
        }
    }
    let ms = u64::try_from(setting.period.as_millis()).unwrap_or(u64::MAX);
    if ms == 0
        || setting.period > MAX_RATE_PERIOD
        || !setting.period.subsec_nanos().is_multiple_of(1_000_000)
    {
        return Err(RateRefusal::Period(ms));
    }
    Ok(i64::try_from(ms).unwrap_or(i64::MAX))
}

/// A class's bucket as a backend reads it: the limit, and the theoretical arrival
/// time of its next token counted in `1 / limit` of a millisecond, so that an
/// emission interval of `period / limit` is a whole number (`period`) and no rounding
/// ever adds or loses a token. With a limit of at most [`MAX_RATE`] and times of this
/// millennium, the scaled time fits an `i64` many times over.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bucket {
    pub(crate) limit: i64,
    pub(crate) period_ms: i64,
    pub(crate) burst: i64,
    pub(crate) tat: i64,
}

impl Bucket {
    /// Reserves the next token at `now`: when it is free (`now` itself when one is free
    /// now), and the bucket's new theoretical arrival time.
    pub(crate) fn reserve(&self, now: Millis) -> (Millis, i64) {
        let scaled_now = now.saturating_mul(self.limit);
        // Up to `burst` tokens may be taken ahead of their even spacing.
        let tolerance = (self.burst - 1).saturating_mul(self.period_ms);
        let slot = scaled_now.max(self.tat.saturating_sub(tolerance));
        let tat = self.tat.max(scaled_now).saturating_add(self.period_ms);
        // The first whole millisecond at or after the slot: never early.
        let at = slot.div_euclid(self.limit) + Millis::from(slot.rem_euclid(self.limit) != 0);
        (at, tat)
    }

    /// The theoretical arrival time this bucket keeps, counted in `1 / tokens` of a
    /// millisecond: what a new limit of `tokens` starts from.
    pub(crate) fn rescaled(&self, tokens: i64) -> i64 {
        let scaled = i128::from(self.tat) * i128::from(tokens) / i128::from(self.limit);
        i64::try_from(scaled).unwrap_or(i64::MAX)
    }

    /// The bucket as [`RateLimit`] shows it at `now`.
    pub(crate) fn shown(&self, class: String, updated: Millis, now: Millis) -> RateLimit {
        let (at, _) = self.reserve(now);
        RateLimit {
            class,
            limit: u32::try_from(self.limit).unwrap_or(u32::MAX),
            period_ms: self.period_ms.unsigned_abs(),
            burst: u32::try_from(self.burst).unwrap_or(u32::MAX),
            next_free: (at > now).then_some(at),
            updated,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(limit: i64, period_ms: i64, burst: i64) -> Bucket {
        Bucket {
            limit,
            period_ms,
            burst,
            tat: 0,
        }
    }

    /// Reserves `n` tokens all asked for at `now`; their times.
    fn reserve_all(b: &mut Bucket, now: Millis, n: usize) -> Vec<Millis> {
        (0..n)
            .map(|_| {
                let (at, tat) = b.reserve(now);
                b.tat = tat;
                at
            })
            .collect()
    }

    #[test]
    fn sixty_a_minute_spaces_tokens_a_second_apart() {
        let mut b = bucket(60, 60_000, 1);
        let times = reserve_all(&mut b, 1_000_000, 5);
        assert_eq!(
            times,
            [1_000_000, 1_001_000, 1_002_000, 1_003_000, 1_004_000]
        );
    }

    #[test]
    fn a_burst_is_taken_at_once_then_tokens_are_spaced() {
        let mut b = bucket(60, 60_000, 3);
        let times = reserve_all(&mut b, 0, 6);
        assert_eq!(times, [0, 0, 0, 1_000, 2_000, 3_000]);
        // Idle long enough, the burst is whole again, and no more.
        let later = reserve_all(&mut b, 100_000, 4);
        assert_eq!(later, [100_000, 100_000, 100_000, 101_000]);
    }

    #[test]
    fn uneven_intervals_round_up_and_never_drift() {
        // 7 a second: 142.857... ms apart; after 7 tokens exactly one second passed.
        let mut b = bucket(7, 1_000, 1);
        let times = reserve_all(&mut b, 0, 8);
        assert_eq!(times, [0, 143, 286, 429, 572, 715, 858, 1_000]);
    }

    #[test]
    fn no_window_of_a_period_holds_more_than_limit_plus_burst_less_one() {
        for (limit, period, burst) in [(60, 60_000, 1), (5, 1_000, 2), (1_000, 60_000, 10)] {
            let mut b = bucket(limit, period, burst);
            let mut times = Vec::new();
            // Steps asking at irregular times, more than the rate allows.
            for i in 0..(3 * limit) {
                let now = i * period / (2 * limit) + (i % 3);
                let (at, tat) = b.reserve(now);
                b.tat = tat;
                times.push(at);
            }
            times.sort_unstable();
            let most = usize::try_from(limit + burst - 1).unwrap();
            for (i, t) in times.iter().enumerate() {
                let in_window = times[i..].iter().take_while(|u| **u < t + period).count();
                assert!(in_window <= most, "{in_window} > {most} from {t}");
            }
        }
    }

    #[test]
    fn bad_settings_are_refused() {
        let ok = RateSetting {
            class: "llm",
            limit: 60,
            period: Duration::from_secs(60),
            burst: 1,
        };
        assert_eq!(refusal(&ok), Ok(60_000));
        let refused = |s: RateSetting<'_>| refusal(&s).unwrap_err().to_string();
        assert!(refused(RateSetting { limit: 0, ..ok }).contains("limit of 0"));
        assert!(refused(RateSetting { burst: 0, ..ok }).contains("burst of 0"));
        assert!(
            refused(RateSetting {
                limit: 2_000_000,
                ..ok
            })
            .contains("beyond")
        );
        let period = |period| RateSetting { period, ..ok };
        assert!(refused(period(Duration::ZERO)).contains("period"));
        assert!(refused(period(Duration::from_micros(1_500))).contains("period"));
        assert!(refused(period(Duration::from_secs(90_000))).contains("period"));
        assert!(refused(RateSetting { class: "", ..ok }).contains("empty"));
        assert!(
            refused(RateSetting {
                class: "a\nb",
                ..ok
            })
            .contains("visible")
        );
    }
}
