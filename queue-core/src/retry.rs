//! The retry policy: how many times a failed job is tried again, and when.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// How long to wait before the next attempt.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Backoff {
    /// The same delay before every retry.
    Fixed(Duration),
    /// `base * 2^(attempt - 1)`, capped at `max`, then spread by `jitter`
    /// (a fraction: 0.2 means ±20 %) so that jobs failing together do not
    /// retry together.
    Exponential {
        /// Delay before the first retry.
        base: Duration,
        /// Longest delay.
        max: Duration,
        /// Relative spread, from 0.0 to 1.0.
        jitter: f64,
    },
}

impl Default for Backoff {
    /// 30 s doubling per attempt, capped at 1 h, ±20 % jitter.
    fn default() -> Self {
        Backoff::Exponential {
            base: Duration::from_secs(30),
            max: Duration::from_secs(3600),
            jitter: 0.2,
        }
    }
}

impl Backoff {
    /// The delay after failed attempt `attempt` (from 1). `unit` is a random
    /// sample in `[0, 1)` that drives the jitter, passed in so that callers
    /// (and tests) control randomness.
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        match *self {
            Backoff::Fixed(delay) => delay,
            Backoff::Exponential { base, max, jitter } => {
                let doublings = attempt.saturating_sub(1).min(31);
                let raw = base.saturating_mul(1u32 << doublings).min(max);
                let jitter = jitter.clamp(0.0, 1.0);
                let factor = 1.0 + jitter * (2.0 * unit.clamp(0.0, 1.0) - 1.0);
                raw.mul_f64(factor)
            }
        }
    }
}

/// What to do after a retryable failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryDecision {
    /// Move the job to errored, claimable again at this time.
    RetryAt(DateTime<Utc>),
    /// No retries remain: fail the job.
    Exhausted,
}

/// Max retries plus a [`Backoff`].
///
/// ```
/// use std::time::Duration;
/// use queue_core::{RetryDecision, RetryPolicy};
///
/// let policy = RetryPolicy::fixed(2, Duration::from_secs(10));
/// let now = chrono::Utc::now();
/// assert_eq!(policy.decide(1, None, now, 0.5), RetryDecision::RetryAt(now + Duration::from_secs(10)));
/// assert_eq!(policy.decide(3, None, now, 0.5), RetryDecision::Exhausted);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// How many attempts may follow the first: `max_retries = 5` allows
    /// six attempts in all ([`RetryPolicy::max_attempts`]); 0 disables
    /// retries. A job's own `max_attempts` counts attempts, not retries.
    pub max_retries: u32,
    /// The delay between attempts.
    pub backoff: Backoff,
}

impl Default for RetryPolicy {
    /// Five retries with the default exponential backoff.
    fn default() -> Self {
        RetryPolicy {
            max_retries: 5,
            backoff: Backoff::default(),
        }
    }
}

impl RetryPolicy {
    /// How many attempts a job gets in all: `max_retries + 1`.
    pub fn max_attempts(&self) -> u32 {
        self.max_retries.saturating_add(1)
    }

    /// No retries: the first failure fails the job.
    pub fn never() -> Self {
        RetryPolicy {
            max_retries: 0,
            backoff: Backoff::default(),
        }
    }

    /// `max_retries` retries, each after `delay`.
    pub fn fixed(max_retries: u32, delay: Duration) -> Self {
        RetryPolicy {
            max_retries,
            backoff: Backoff::Fixed(delay),
        }
    }

    /// `max_retries` retries with the default exponential backoff.
    pub fn exponential(max_retries: u32) -> Self {
        RetryPolicy {
            max_retries,
            backoff: Backoff::default(),
        }
    }

    /// Decides what follows the retryable failure of attempt `attempt`
    /// (from 1). `delay_override` replaces the backoff (a handler asked for
    /// a specific delay); `unit` is a random sample in `[0, 1)` for jitter.
    pub fn decide(
        &self,
        attempt: u32,
        delay_override: Option<Duration>,
        now: DateTime<Utc>,
        unit: f64,
    ) -> RetryDecision {
        if attempt > self.max_retries {
            return RetryDecision::Exhausted;
        }
        let delay = delay_override.unwrap_or_else(|| self.backoff.delay(attempt, unit));
        let delay = chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::MAX);
        RetryDecision::RetryAt(
            now.checked_add_signed(delay)
                .unwrap_or(DateTime::<Utc>::MAX_UTC),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_backoff_doubles_from_30s_and_caps_at_an_hour() {
        let b = Backoff::default();
        // unit 0.5 means no jitter.
        assert_eq!(b.delay(1, 0.5), Duration::from_secs(30));
        assert_eq!(b.delay(2, 0.5), Duration::from_secs(60));
        assert_eq!(b.delay(5, 0.5), Duration::from_secs(480));
        assert_eq!(b.delay(8, 0.5), Duration::from_secs(3600));
        assert_eq!(b.delay(1000, 0.5), Duration::from_secs(3600));
    }

    #[test]
    fn jitter_stays_within_twenty_percent() {
        let b = Backoff::default();
        assert_eq!(b.delay(1, 0.0), Duration::from_secs(24));
        assert_eq!(b.delay(1, 1.0), Duration::from_secs(36));
        for i in 0..100 {
            let d = b.delay(3, i as f64 / 100.0);
            assert!(d >= Duration::from_secs(96) && d <= Duration::from_secs(144));
        }
    }

    #[test]
    fn attempts_beyond_max_retries_are_exhausted() {
        let p = RetryPolicy::exponential(2);
        let now = DateTime::<Utc>::UNIX_EPOCH;
        assert!(matches!(
            p.decide(1, None, now, 0.5),
            RetryDecision::RetryAt(_)
        ));
        assert!(matches!(
            p.decide(2, None, now, 0.5),
            RetryDecision::RetryAt(_)
        ));
        assert_eq!(p.decide(3, None, now, 0.5), RetryDecision::Exhausted);
        assert_eq!(
            RetryPolicy::never().decide(1, None, now, 0.5),
            RetryDecision::Exhausted
        );
    }

    #[test]
    fn handler_delay_overrides_the_backoff() {
        let p = RetryPolicy::exponential(3);
        let now = DateTime::<Utc>::UNIX_EPOCH;
        assert_eq!(
            p.decide(1, Some(Duration::from_secs(5)), now, 0.5),
            RetryDecision::RetryAt(now + Duration::from_secs(5))
        );
    }
}
