//! Limits per kind that hold across every worker process: at most so many
//! jobs of a kind running at once ([`KindLimits::max_running`]), and at
//! most so many started per second, with a burst
//! ([`KindLimits::per_second`], [`KindLimits::burst`]). The store keeps
//! them and enforces them in its claims, so that every process claiming
//! from it is held by the same limits
//! ([`Admin::set_limits`](crate::Admin::set_limits)).
//!
//! A job of a kind with a concurrency limit holds its slot while it is
//! processing: a worker that dies holds its jobs' slots until the resetter
//! moves them back (the stalled age), never longer.
//!
//! ```
//! use queue_core::KindLimits;
//! let gentle = KindLimits::default().max_running(4).per_second(50.0, Some(10));
//! assert!(gentle.check().is_ok());
//! assert_eq!(gentle.bucket(), Some((50.0, 10.0)));
//! ```

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::StoreError;

/// The most jobs per second a rate limit takes.
pub const MAX_PER_SECOND: f64 = 1_000_000.0;

/// The fewest jobs per second a rate limit takes: one every 1,000 s.
pub const MIN_PER_SECOND: f64 = 0.001;

/// The largest concurrency limit or burst taken.
pub const MAX_COUNT: u32 = 1_000_000;

/// A kind's limits; `None` for no limit of that sort.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct KindLimits {
    /// At most this many jobs of the kind run at once, in every process
    /// together.
    pub max_running: Option<u32>,
    /// At most this many jobs of the kind start per second, on average.
    pub per_second: Option<f64>,
    /// How many may start at once after a quiet spell (the size of the
    /// token bucket); by default one second's worth (at least 1).
    pub burst: Option<u32>,
}

impl KindLimits {
    /// At most `n` running at once.
    pub fn max_running(mut self, n: u32) -> Self {
        self.max_running = Some(n);
        self
    }

    /// At most `rate` started per second, `burst` at once.
    pub fn per_second(mut self, rate: f64, burst: Option<u32>) -> Self {
        self.per_second = Some(rate);
        self.burst = burst;
        self
    }

    /// The limits in words: `4 at once, 50 a second (bursts of 10)`, or
    /// `no limit`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(n) = self.max_running {
            parts.push(format!("{n} at once"));
        }
        if let Some((rate, size)) = self.bucket() {
            parts.push(format!("{rate} a second (bursts of {size})"));
        }
        if parts.is_empty() {
            "no limit".to_owned()
        } else {
            parts.join(", ")
        }
    }

    /// Whether any limit is set.
    pub fn any(&self) -> bool {
        self.max_running.is_some() || self.per_second.is_some()
    }

    /// The token bucket of the rate limit, if there is one: its rate per
    /// second and its size.
    pub fn bucket(&self) -> Option<(f64, f64)> {
        let rate = self.per_second?;
        let size = match self.burst {
            Some(burst) => f64::from(burst),
            None => rate.ceil().max(1.0),
        };
        Some((rate, size))
    }

    /// What the stores check before they set `kind`'s limits on behalf of
    /// `by`: the kind and the name as [`crate::check_pause`] reads them,
    /// then the limits themselves ([`KindLimits::check`]).
    pub fn check_for(&self, kind: &str, by: &str) -> Result<(), StoreError> {
        crate::check_pause(kind, by)?;
        self.check()
    }

    /// Refuses limits no store could hold ([`StoreError::Refused`]): a
    /// concurrency of 0 (pause the kind instead) or over [`MAX_COUNT`], a
    /// rate that is not a number from [`MIN_PER_SECOND`] to
    /// [`MAX_PER_SECOND`], a burst of 0, over [`MAX_COUNT`] or without a
    /// rate.
    pub fn check(&self) -> Result<(), StoreError> {
        if self.max_running == Some(0) {
            return Err(StoreError::Refused(
                "a concurrency limit of 0 runs nothing: pause the kind instead".into(),
            ));
        }
        if let Some(n) = self.max_running.filter(|n| *n > MAX_COUNT) {
            return Err(StoreError::Refused(format!(
                "a concurrency limit of {n}: the largest taken is {MAX_COUNT}"
            )));
        }
        if let Some(rate) = self.per_second {
            if !(rate.is_finite() && (MIN_PER_SECOND..=MAX_PER_SECOND).contains(&rate)) {
                return Err(StoreError::Refused(format!(
                    "a rate of {rate} jobs per second: give a positive number from {MIN_PER_SECOND} to {MAX_PER_SECOND}"
                )));
            }
        }
        match (self.burst, self.per_second) {
            (Some(0), _) => Err(StoreError::Refused(
                "a burst of 0 starts nothing: give at least 1".into(),
            )),
            (Some(n), _) if n > MAX_COUNT => Err(StoreError::Refused(format!(
                "a burst of {n}: the largest taken is {MAX_COUNT}"
            ))),
            (Some(_), None) => Err(StoreError::Refused(
                "a burst belongs to a rate limit: give the rate too".into(),
            )),
            _ => Ok(()),
        }
    }
}

/// A kind's limits as the store keeps them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct KindLimit {
    /// The kind.
    pub kind: String,
    /// Its limits.
    pub limits: KindLimits,
    /// When they were set, by the store's clock.
    pub set_at: DateTime<Utc>,
    /// Who set them.
    pub set_by: String,
}

impl KindLimit {
    /// `kind`'s `limits`, set by `by` at `at`.
    pub fn new(
        kind: impl Into<String>,
        limits: KindLimits,
        at: DateTime<Utc>,
        by: impl Into<String>,
    ) -> Self {
        KindLimit {
            kind: kind.into(),
            limits,
            set_at: at,
            set_by: by.into(),
        }
    }
}

/// A token bucket's state: how many starts it holds, as of when.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tokens {
    /// Starts available (fractions accrue).
    pub available: f64,
    /// As of this time.
    pub at: DateTime<Utc>,
}

/// How many jobs of a kind with `limits` a claim may take at `now`, with
/// `running` of them running and its bucket at `tokens` (`None`: full);
/// and the bucket after it took that many. Every store counts the same.
pub fn budget(
    limits: &KindLimits,
    running: u64,
    tokens: Option<Tokens>,
    now: DateTime<Utc>,
) -> (u64, Option<Tokens>) {
    let room = match limits.max_running {
        Some(max) => u64::from(max).saturating_sub(running),
        None => u64::MAX,
    };
    let Some((rate, size)) = limits.bucket() else {
        return (room, None);
    };
    let available = match tokens {
        None => size,
        Some(t) => {
            let seconds = (now - t.at).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6;
            (t.available + rate * seconds.max(0.0)).min(size)
        }
    };
    let whole = available.floor().max(0.0) as u64;
    (room.min(whole), Some(Tokens { available, at: now }))
}

/// The bucket after `taken` jobs started from it.
pub fn spend(tokens: Option<Tokens>, taken: u64) -> Option<Tokens> {
    tokens.map(|t| Tokens {
        available: t.available - taken as f64,
        at: t.at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> DateTime<Utc> {
        DateTime::UNIX_EPOCH + chrono::TimeDelta::milliseconds(ms)
    }

    #[test]
    fn a_bucket_starts_full_refills_at_its_rate_and_never_past_its_size() {
        let limits = KindLimits::default().per_second(2.0, Some(3));
        let (n, bucket) = budget(&limits, 0, None, at(0));
        assert_eq!(n, 3, "a full bucket: the burst");
        let bucket = spend(bucket, 3);
        let (n, _) = budget(&limits, 0, bucket, at(0));
        assert_eq!(n, 0, "spent");
        let (n, _) = budget(&limits, 0, bucket, at(1_250));
        assert_eq!(
            n, 2,
            "2.5 tokens a second and a quarter later: 2 whole ones"
        );
        let (n, _) = budget(&limits, 0, bucket, at(60_000));
        assert_eq!(n, 3, "never more than the burst");
    }

    #[test]
    fn the_tighter_of_the_two_limits_holds() {
        let limits = KindLimits::default().max_running(4).per_second(50.0, None);
        assert_eq!(budget(&limits, 3, None, at(0)).0, 1, "one slot left");
        assert_eq!(
            budget(&limits, 0, None, at(0)).0,
            4,
            "four slots, 50 tokens"
        );
        let only_slots = KindLimits::default().max_running(2);
        assert_eq!(budget(&only_slots, 5, None, at(0)), (0, None));
    }

    #[test]
    fn limits_no_store_could_hold_are_refused_saying_why() {
        assert!(KindLimits::default().max_running(4).check().is_ok());
        for (limits, says) in [
            (KindLimits::default().max_running(0), "pause the kind"),
            (KindLimits::default().max_running(MAX_COUNT + 1), "largest"),
            (
                KindLimits::default().per_second(0.0, None),
                "positive number",
            ),
            (KindLimits::default().per_second(5e-324, None), "from 0.001"),
            (
                KindLimits::default().per_second(f64::INFINITY, None),
                "positive",
            ),
            (KindLimits::default().per_second(5.0, Some(0)), "burst of 0"),
            (
                KindLimits::default().per_second(5.0, Some(MAX_COUNT + 1)),
                "largest",
            ),
            (
                KindLimits {
                    burst: Some(3),
                    ..KindLimits::default()
                },
                "give the rate",
            ),
        ] {
            let error = limits.check().expect_err("refused").to_string();
            assert!(error.contains(says), "{limits:?}: {error}");
        }
        assert_eq!(
            KindLimits::default()
                .max_running(4)
                .per_second(0.5, None)
                .describe(),
            "4 at once, 0.5 a second (bursts of 1)"
        );
    }
}
