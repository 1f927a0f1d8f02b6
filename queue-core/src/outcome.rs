//! Outcomes: how an attempt ended, and the transition that records it.
//!
//! | attempt ended with                | job becomes                       | outcome label |
//! |-----------------------------------|-----------------------------------|---------------|
//! | `Ok(())`                          | completed                         | `ok`          |
//! | retryable error, or a timeout     | errored (failed when exhausted)   | `retry` / `failed` |
//! | poison error, undecodable record  | failed at once                    | `poison`      |
//! | panic, unclassified error         | per [`UnclassifiedPolicy`]        | as above      |
//! | cancellation                      | canceled                          | `canceled`    |
//! | worker shutting down              | queued again                      | `released`    |
//! | cut off by the store (connection lost) | queued again, nothing counted | `interrupted` |
//! | job deleted or reclaimed meanwhile| nothing is written                | `lost`        |

use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::error::{DecodeError, ErrorClass, JobError};
use crate::job::JobLimits;
use crate::retry::{RetryDecision, RetryPolicy};
use crate::store::Transition;

/// How an attempt ended, before the policy classifies it.
#[derive(Debug)]
pub enum AttemptEnd {
    /// The handler returned `Ok(())`.
    Succeeded,
    /// The handler returned an error.
    Errored(JobError),
    /// The handler panicked; the panic message.
    Panicked(String),
    /// The handler ran past its timeout.
    TimedOut(Duration),
    /// The job was cancelled while running (by an operator).
    Canceled(String),
    /// The record could not be decoded.
    Undecodable(DecodeError),
    /// The worker is shutting down and hands the job back.
    Released,
    /// The store cut the attempt off (see [`Store::attempt_cut_off`]): the
    /// handler's error was the store's; why.
    ///
    /// [`Store::attempt_cut_off`]: crate::Store::attempt_cut_off
    Interrupted(String),
    /// The job was deleted or reclaimed while running.
    Lost,
}

/// What to do with errors a handler did not classify, and with panics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UnclassifiedPolicy {
    /// Retry them like retryable errors.
    #[default]
    Retry,
    /// Fail the job at once, like poison.
    Fail,
}

/// The recorded result of an attempt; `label()` is the metrics label.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// Completed.
    Completed,
    /// Errored; runs again at `retry_at`.
    Retried {
        /// When the job becomes claimable again.
        retry_at: DateTime<Utc>,
        /// The failure message.
        message: String,
    },
    /// Failed after exhausting its retries.
    Failed {
        /// The failure message.
        message: String,
    },
    /// Failed at once: poison error or undecodable record.
    Poisoned {
        /// The failure message.
        message: String,
    },
    /// Canceled.
    Canceled {
        /// Why.
        message: String,
    },
    /// Handed back to the queue unfinished.
    Released,
    /// Cut off by the store (the job's connection to the database failed)
    /// and handed back to the queue, counting neither a failure nor a
    /// reset: the attempt's writes were rolled back, and the job runs again.
    Interrupted {
        /// What cut it off.
        message: String,
    },
    /// Deleted or reclaimed while running; nothing was written.
    Lost,
}

impl Outcome {
    /// The `outcome` label of `queue_jobs_processed_total`: the variant's
    /// name in lower case.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::Retried { .. } => "retried",
            Outcome::Failed { .. } => "failed",
            Outcome::Poisoned { .. } => "poisoned",
            Outcome::Canceled { .. } => "canceled",
            Outcome::Released => "released",
            Outcome::Interrupted { .. } => "interrupted",
            Outcome::Lost => "lost",
        }
    }

    /// The transition that records this outcome; `None` for [`Outcome::Lost`].
    pub fn transition(&self) -> Option<Transition> {
        Some(match self {
            Outcome::Completed => Transition::Complete,
            Outcome::Retried { retry_at, message } => Transition::Retry {
                message: message.clone(),
                retry_at: *retry_at,
            },
            Outcome::Failed { message } | Outcome::Poisoned { message } => Transition::Fail {
                message: message.clone(),
            },
            Outcome::Canceled { message } => Transition::Cancel {
                message: message.clone(),
            },
            Outcome::Released | Outcome::Interrupted { .. } => Transition::Release,
            Outcome::Lost => return None,
        })
    }
}

/// Classifies attempt ends: the retry policy plus the default for
/// unclassified errors and panics.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct OutcomePolicy {
    /// Max retries and backoff.
    pub retry: RetryPolicy,
    /// What unclassified errors and panics become.
    pub unclassified: UnclassifiedPolicy,
}

impl OutcomePolicy {
    /// Decides the outcome of attempt `attempt` (from 1) that ended with
    /// `end`. `unit` is a random sample in `[0, 1)` for backoff jitter.
    ///
    /// ```
    /// use queue_core::{AttemptEnd, JobError, Outcome, OutcomePolicy};
    ///
    /// let policy = OutcomePolicy::default();
    /// let now = chrono::Utc::now();
    /// let poisoned = policy.decide(AttemptEnd::Errored(JobError::poison("bad input")), 1, now, 0.5);
    /// assert_eq!(poisoned, Outcome::Poisoned { message: "bad input".into() });
    /// ```
    pub fn decide(&self, end: AttemptEnd, attempt: u32, now: DateTime<Utc>, unit: f64) -> Outcome {
        self.decide_for(end, attempt, JobLimits::default(), now, unit)
    }

    /// [`OutcomePolicy::decide`] for a job with limits of its own
    /// ([`Lease::limits`](crate::Lease::limits)): its `max_attempts`
    /// replaces the retry policy's count (the backoff stays), and an
    /// at-most-once job is never retried.
    ///
    /// ```
    /// use queue_core::{AttemptEnd, JobError, JobLimits, Outcome, OutcomePolicy};
    ///
    /// let policy = OutcomePolicy::default(); // five retries: six attempts
    /// let now = chrono::Utc::now();
    /// let two = JobLimits { max_attempts: Some(2), ..JobLimits::default() };
    /// let end = || AttemptEnd::Errored(JobError::retry("busy"));
    /// assert!(matches!(policy.decide_for(end(), 1, two, now, 0.5), Outcome::Retried { .. }));
    /// assert!(matches!(policy.decide_for(end(), 2, two, now, 0.5), Outcome::Failed { .. }));
    /// ```
    pub fn decide_for(
        &self,
        end: AttemptEnd,
        attempt: u32,
        limits: JobLimits,
        now: DateTime<Utc>,
        unit: f64,
    ) -> Outcome {
        let retry = match limits.max_attempts {
            Some(attempts) => RetryPolicy {
                max_retries: attempts.saturating_sub(1),
                ..self.retry
            },
            None => self.retry,
        };
        let retryable = |message: String, after: Option<Duration>| {
            if limits.at_most_once {
                return Outcome::Failed {
                    message: format!("{message} (an at-most-once job is never retried)"),
                };
            }
            match retry.decide(attempt, after, now, unit) {
                RetryDecision::RetryAt(retry_at) => Outcome::Retried { retry_at, message },
                RetryDecision::Exhausted => Outcome::Failed {
                    message: format!(
                        "{message} (attempt {attempt} of at most {}: no retries left)",
                        retry.max_attempts()
                    ),
                },
            }
        };
        let unclassified = |message: String| match self.unclassified {
            UnclassifiedPolicy::Retry => retryable(message, None),
            UnclassifiedPolicy::Fail => Outcome::Poisoned { message },
        };
        match end {
            AttemptEnd::Succeeded => Outcome::Completed,
            AttemptEnd::Errored(error) => {
                let message = error.message();
                match error.class() {
                    ErrorClass::Retry { after } => retryable(message, after),
                    ErrorClass::Poison => Outcome::Poisoned { message },
                    ErrorClass::Cancel => Outcome::Canceled { message },
                    ErrorClass::Unclassified => unclassified(message),
                }
            }
            AttemptEnd::Panicked(panic) => unclassified(format!("handler panicked: {panic}")),
            AttemptEnd::TimedOut(limit) => {
                retryable(format!("handler timed out after {limit:?}"), None)
            }
            AttemptEnd::Canceled(message) => Outcome::Canceled { message },
            AttemptEnd::Undecodable(error) => Outcome::Poisoned {
                message: error.to_string(),
            },
            AttemptEnd::Released => Outcome::Released,
            // Started: handing it back would start it again.
            AttemptEnd::Interrupted(why) if limits.at_most_once => Outcome::Failed {
                message: format!("{why} (an at-most-once job is never started twice)"),
            },
            AttemptEnd::Interrupted(message) => Outcome::Interrupted { message },
            AttemptEnd::Lost => Outcome::Lost,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        DateTime::<Utc>::UNIX_EPOCH
    }

    #[test]
    fn retryable_errors_retry_until_exhausted_then_fail() {
        let policy = OutcomePolicy {
            retry: RetryPolicy::fixed(1, Duration::from_secs(10)),
            ..Default::default()
        };
        let first = policy.decide(AttemptEnd::Errored(JobError::retry("flaky")), 1, now(), 0.5);
        assert_eq!(
            first,
            Outcome::Retried {
                retry_at: now() + Duration::from_secs(10),
                message: "flaky".into()
            }
        );
        let second = policy.decide(AttemptEnd::Errored(JobError::retry("flaky")), 2, now(), 0.5);
        assert_eq!(second.label(), "failed");
        assert!(
            matches!(second, Outcome::Failed { message } if message.contains("attempt 2 of at most 2"))
        );
    }

    #[test]
    fn panics_follow_the_unclassified_policy() {
        let retry = OutcomePolicy::default();
        let out = retry.decide(AttemptEnd::Panicked("boom".into()), 1, now(), 0.5);
        assert!(
            matches!(out, Outcome::Retried { ref message, .. } if message == "handler panicked: boom")
        );
        let fail = OutcomePolicy {
            unclassified: UnclassifiedPolicy::Fail,
            ..Default::default()
        };
        let out = fail.decide(AttemptEnd::Panicked("boom".into()), 1, now(), 0.5);
        assert_eq!(out.label(), "poisoned");
    }

    #[test]
    fn timeouts_are_retryable_and_undecodable_records_fail_at_once() {
        let policy = OutcomePolicy::default();
        let out = policy.decide(AttemptEnd::TimedOut(Duration::from_secs(2)), 1, now(), 0.5);
        assert_eq!(out.label(), "retried");
        let out = policy.decide(
            AttemptEnd::Undecodable(DecodeError {
                id: "9".into(),
                message: "column \"payload\": expected jsonb".into(),
            }),
            1,
            now(),
            0.5,
        );
        assert_eq!(
            out,
            Outcome::Poisoned {
                message: "job 9 could not be decoded: column \"payload\": expected jsonb".into()
            }
        );
    }

    #[test]
    fn lost_jobs_write_nothing_and_released_jobs_requeue() {
        assert_eq!(Outcome::Lost.transition(), None);
        assert_eq!(Outcome::Released.transition(), Some(Transition::Release));
    }

    #[test]
    fn an_attempt_cut_off_by_the_store_is_handed_back_uncounted_unless_at_most_once() {
        let policy = OutcomePolicy::default();
        let why = || AttemptEnd::Interrupted("the job's connection failed".into());
        let out = policy.decide(why(), 6, now(), 0.5);
        assert_eq!(
            out,
            Outcome::Interrupted {
                message: "the job's connection failed".into()
            },
            "even on the last attempt: the store's fault costs the job nothing"
        );
        assert_eq!(out.transition(), Some(Transition::Release));
        assert_eq!(out.label(), "interrupted");
        let once = JobLimits {
            at_most_once: true,
            ..JobLimits::default()
        };
        let out = policy.decide_for(why(), 1, once, now(), 0.5);
        assert!(
            matches!(&out, Outcome::Failed { message } if message.contains("never started twice")),
            "{out:?}"
        );
    }
}
