//! Jobs: their states, the records a store hands out, and the lease that
//! proves who holds a claimed job.

use std::fmt;
use std::hash::Hash;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::error::JobError;

/// The state of a job. Transitions only move forward (see
/// `docs/job-lifecycle.md`); every write guards the state it expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum JobState {
    /// Waiting to be claimed. Entered on enqueue, or when the resetter moves a
    /// stalled job back, or when a worker hands an unfinished job back at
    /// shutdown. Left when a worker claims it, or when it is cancelled.
    Queued,
    /// Claimed by a worker and being handled. Left when that worker finishes
    /// it (completed, errored, failed, canceled), hands it back (queued), or
    /// when the resetter finds it stalled (queued, or failed).
    Processing,
    /// Handled successfully. Terminal.
    Completed,
    /// The last attempt failed with a retryable error and the job waits to
    /// be retried: claimable again once `process_after` has passed. Entered
    /// by [`Transition::Retry`](crate::Transition::Retry), which the worker
    /// reports as [`Outcome::Retried`](crate::Outcome::Retried) (metric label
    /// `retried`). Left like `Queued`.
    Errored,
    /// Failed for good: a poison error, retries or resets exhausted, or an
    /// undecodable record. Terminal.
    Failed,
    /// Cancelled by an operator, before or while it ran. Terminal.
    Canceled,
}

impl JobState {
    /// All states, in lifecycle order.
    pub const ALL: [JobState; 6] = [
        JobState::Queued,
        JobState::Processing,
        JobState::Completed,
        JobState::Errored,
        JobState::Failed,
        JobState::Canceled,
    ];

    /// Whether an operator's retry ([`Admin::retry`](crate::Admin::retry))
    /// moves a job out of this state: failed, errored and canceled. The one
    /// definition; [`Admin::retryable_states`](crate::Admin::retryable_states)
    /// narrows it to the states a store can tell apart.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            JobState::Failed | JobState::Errored | JobState::Canceled
        )
    }

    /// Whether no worker or resetter ever moves a job out of this state
    /// (only an operator's retry does).
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Completed | JobState::Failed | JobState::Canceled
        )
    }

    /// Whether a job's finish time and due time agree with this state, as
    /// every store keeps them:
    ///
    /// - a job that is ready to run or running has neither;
    /// - a job that waits for a time (scheduled, or errored and waiting for
    ///   its retry) has a due time, and may keep its last attempt's finish;
    /// - a finished job has a finish time and no due time.
    ///
    /// A claim clears both times, and every write that finishes a job
    /// clears the due time. The times alone then tell the three apart (the
    /// two empty: ready or running; a due time: waiting for it; only a
    /// finish time: finished), so that an index can leave finished jobs
    /// out without naming the state, which every claim changes.
    ///
    /// ```
    /// # use queue_core::JobState;
    /// let now = chrono::Utc::now();
    /// assert!(JobState::Processing.times_agree(None, None));
    /// assert!(JobState::Errored.times_agree(Some(now), Some(now)));
    /// assert!(!JobState::Completed.times_agree(Some(now), Some(now)));
    /// ```
    pub fn times_agree(
        self,
        finished_at: Option<DateTime<Utc>>,
        process_after: Option<DateTime<Utc>>,
    ) -> bool {
        match self {
            JobState::Processing => finished_at.is_none() && process_after.is_none(),
            JobState::Queued | JobState::Errored => {
                finished_at.is_none() || process_after.is_some()
            }
            JobState::Completed | JobState::Failed | JobState::Canceled => {
                finished_at.is_some() && process_after.is_none()
            }
        }
    }

    /// The canonical name of the state, as stored in the default table.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Processing => "processing",
            JobState::Completed => "completed",
            JobState::Errored => "errored",
            JobState::Failed => "failed",
            JobState::Canceled => "canceled",
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Failure message of a job an operator canceled while it was queued or
/// errored, so it never ran again.
pub const CANCELED_BEFORE_RUN_MESSAGE: &str = "canceled by an operator before it ran";

/// What a job key must support: integer, uuid and text keys all qualify.
pub trait JobId: Clone + Eq + Hash + fmt::Debug + fmt::Display + Send + Sync + 'static {}

impl<T> JobId for T where T: Clone + Eq + Hash + fmt::Debug + fmt::Display + Send + Sync + 'static {}

/// A record a store hands to handlers: anything with a key and a kind.
pub trait JobRecord: Send + Sync + 'static {
    /// The key type.
    type Id: JobId;

    /// The job's key.
    fn id(&self) -> &Self::Id;

    /// The job's kind, which a router dispatches on. Tables without a kind
    /// column can return a constant.
    fn kind(&self) -> &str;
}

/// Proof that a worker holds a claimed job: the key plus a fencing token.
///
/// Each claim of a job gets a fresh token, so a writer holding the lease of an
/// earlier attempt (reset and claimed again since, even on the same host) can
/// never complete, fail or heartbeat the current attempt.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Lease<Id> {
    /// The job's key.
    pub id: Id,
    /// The fencing token of this claim.
    pub token: i64,
    /// The attempt this claim is, from 1: failed attempts so far plus one.
    pub attempt: u32,
    /// What the job asks of its attempts (the store reads it at claim).
    pub limits: JobLimits,
}

/// What a job asks of its own attempts, beyond the worker's policy (set
/// at enqueue: [`NewJob::max_attempts`], [`NewJob::at_most_once`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct JobLimits {
    /// At most this many attempts in all, in place of the retry policy's
    /// count.
    pub max_attempts: Option<u32>,
    /// Never started twice: a failure is not retried, a stalled attempt
    /// fails instead of being queued again, and a worker shutting down
    /// fails it instead of handing it back.
    pub at_most_once: bool,
}

/// The failure message of a job that expired before it started.
pub const EXPIRED_MESSAGE: &str = "expired: not started before its expires_at";

/// One entry of a job's execution log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    /// A short key naming the step, such as `"fetch"` or `"attempt"`.
    pub key: String,
    /// When the entry was written.
    pub at: DateTime<Utc>,
    /// Free text.
    pub message: String,
}

impl LogEntry {
    /// An entry stamped `at`.
    pub fn new(key: impl Into<String>, at: DateTime<Utc>, message: impl Into<String>) -> Self {
        LogEntry {
            key: key.into(),
            at,
            message: message.into(),
        }
    }
}

/// The record of the default jobs table (and of the memory store).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// Key.
    pub id: i64,
    /// Kind, used by the router.
    pub kind: String,
    /// Arguments for the handler.
    pub payload: serde_json::Value,
    /// Higher runs first.
    pub priority: i32,
    /// Current state.
    pub state: JobState,
    /// Message of the last failure.
    pub failure_message: Option<String>,
    /// When the job was enqueued.
    pub queued_at: DateTime<Utc>,
    /// When the current or last attempt was claimed.
    pub started_at: Option<DateTime<Utc>>,
    /// When the job reached a terminal state or errored.
    pub finished_at: Option<DateTime<Utc>>,
    /// Not claimable before this time.
    pub process_after: Option<DateTime<Utc>>,
    /// How often the resetter moved it back to queued.
    pub num_resets: i32,
    /// How many attempts failed.
    pub num_failures: i32,
    /// Last sign of life of the worker handling it.
    pub last_heartbeat_at: Option<DateTime<Utc>>,
    /// Log entries appended while handling it.
    pub execution_logs: Vec<LogEntry>,
    /// Host of the worker that claimed it last.
    pub worker_hostname: Option<String>,
    /// Set by an operator to cancel the job.
    pub cancel: bool,
    /// Fencing token of the latest claim (see [`Lease`]).
    pub claim_token: i64,
}

impl Job {
    /// Decodes the payload into `T`. A payload of the wrong shape is a poison
    /// error: retrying cannot fix it, so the job fails at once with a message
    /// naming the kind and the decoding problem.
    ///
    /// ```
    /// # use queue_core::{Job, JobState};
    /// # let mut job = queue_core::Job::example(1, "email", serde_json::json!({"to": "a@b.c"}));
    /// #[derive(serde::Deserialize)]
    /// struct Email { to: String }
    /// let email: Email = job.payload_as().unwrap();
    /// assert_eq!(email.to, "a@b.c");
    /// ```
    pub fn payload_as<T: serde::de::DeserializeOwned>(&self) -> Result<T, JobError> {
        T::deserialize(&self.payload).map_err(|e| {
            JobError::poison(format!(
                "payload of {} job {} does not decode as {}: {e}",
                self.kind,
                self.id,
                std::any::type_name::<T>()
            ))
        })
    }

    /// A queued job with default fields, for examples and tests.
    pub fn example(id: i64, kind: &str, payload: serde_json::Value) -> Job {
        Job {
            id,
            kind: kind.to_owned(),
            payload,
            priority: 0,
            state: JobState::Queued,
            failure_message: None,
            queued_at: DateTime::<Utc>::UNIX_EPOCH,
            started_at: None,
            finished_at: None,
            process_after: None,
            num_resets: 0,
            num_failures: 0,
            last_heartbeat_at: None,
            execution_logs: Vec::new(),
            worker_hostname: None,
            cancel: false,
            claim_token: 0,
        }
    }
}

impl JobRecord for Job {
    type Id = i64;

    fn id(&self) -> &i64 {
        &self.id
    }

    fn kind(&self) -> &str {
        &self.kind
    }
}

/// How long a job's [unique key](NewJob::unique) keeps other jobs with
/// the same key out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum UniqueScope {
    /// While the job waits or runs (queued, errored or processing); once it
    /// has finished, a new job with the key may be enqueued.
    #[default]
    Active,
    /// As long as the job exists, finished or not (until it is deleted or
    /// purged).
    Forever,
}

/// A key that no two jobs in [scope](UniqueScope) share: enqueueing a job
/// whose key is taken adds nothing and reports the job that holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UniqueKey {
    /// The key, chosen by the application (`"invoice:42"`).
    pub key: String,
    /// How long it holds.
    #[serde(default)]
    pub scope: UniqueScope,
}

/// A job to enqueue into the default table (or the memory store). Build it
/// with [`NewJob::new`] and the setters; fields may be added.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct NewJob {
    /// Kind, used by the router.
    pub kind: String,
    /// Arguments for the handler.
    pub payload: serde_json::Value,
    /// Higher runs first.
    pub priority: i32,
    /// Not claimable before this time; `None` means now.
    pub process_after: Option<DateTime<Utc>>,
    /// A key no other job in its scope may hold ([`NewJob::unique`]).
    #[serde(default)]
    pub unique: Option<UniqueKey>,
    /// What the job asks of its attempts ([`NewJob::max_attempts`],
    /// [`NewJob::at_most_once`]).
    #[serde(default)]
    pub limits: JobLimits,
    /// Not started after this time ([`NewJob::expires_at`]).
    #[serde(default)]
    pub expires_at: Option<DateTime<Utc>>,
}

/// What an enqueue did with one job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Enqueued<Id> {
    /// The job's key: the new job's, or, when its unique key was taken, the
    /// key of the job that holds it.
    pub id: Id,
    /// Whether a new job was added (false: the unique key was taken).
    pub inserted: bool,
}

impl NewJob {
    /// A job of `kind` with `payload`, priority 0, runnable now.
    pub fn new(kind: impl Into<String>, payload: serde_json::Value) -> Self {
        NewJob {
            kind: kind.into(),
            payload,
            priority: 0,
            process_after: None,
            unique: None,
            limits: JobLimits::default(),
            expires_at: None,
        }
    }

    /// Gives the job at most `attempts` attempts in all (1: no retries),
    /// whatever the worker's retry policy allows.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.limits.max_attempts = Some(attempts);
        self
    }

    /// Makes the job at-most-once: it is never started twice. A failure is
    /// not retried; if its worker dies mid-run the resetter fails it rather
    /// than queue it again; a worker shutting down fails it rather than
    /// hand it back. Other jobs of the same table keep at-least-once
    /// delivery.
    pub fn at_most_once(mut self) -> Self {
        self.limits.at_most_once = true;
        self
    }

    /// A job not started by `at` is never run: it ends failed with
    /// [`EXPIRED_MESSAGE`] (the resetter's sweep), and claims skip it
    /// meanwhile.
    pub fn expires_at(mut self, at: DateTime<Utc>) -> Self {
        self.expires_at = Some(at);
        self
    }

    /// Gives the job a unique key: while a job with the same key is in
    /// `scope`, enqueueing this one adds nothing and reports that job
    /// ([`Enqueued::inserted`] false), so a client may retry an enqueue
    /// safely.
    pub fn unique(mut self, key: impl Into<String>, scope: UniqueScope) -> Self {
        self.unique = Some(UniqueKey {
            key: key.into(),
            scope,
        });
        self
    }

    /// Sets the priority (higher runs first).
    pub fn priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// Schedules the job for later.
    pub fn process_after(mut self, at: DateTime<Utc>) -> Self {
        self.process_after = Some(at);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_completed_failed_and_canceled_are_terminal() {
        let terminal: Vec<_> = JobState::ALL
            .into_iter()
            .filter(|s| s.is_terminal())
            .collect();
        assert_eq!(
            terminal,
            [JobState::Completed, JobState::Failed, JobState::Canceled]
        );
    }

    #[test]
    fn undecodable_payload_is_poison_naming_kind_and_id() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Args {
            n: u32,
        }
        let job = Job::example(7, "resize", serde_json::json!({"n": "x"}));
        let err = job.payload_as::<Args>().unwrap_err();
        assert!(err.is_poison());
        let msg = err.to_string();
        assert!(msg.contains("resize job 7"), "{msg}");
        assert!(msg.contains("invalid type"), "{msg}");
    }
}
