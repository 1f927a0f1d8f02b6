//! The [`Handler`] trait with its four hooks, and the contexts they receive.
//!
//! For each job the worker calls, in order: [`Handler::pre_dequeue`] (before
//! claiming), [`Handler::pre_handle`], [`Handler::handle`] and
//! [`Handler::post_handle`]. Only `handle` is required.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::error::{BoxError, JobError, StoreError};
use crate::job::LogEntry;
use crate::outcome::Outcome;
use crate::store::{Store, WriteResult};

/// What the PreDequeue hook decides.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Dequeue<C> {
    /// Do not claim now; the worker waits for its poll interval.
    NotNow,
    /// Claim, with optional extra conditions and an optional cap on how many
    /// jobs to claim at once.
    Go {
        /// Only jobs satisfying these are claimed.
        conditions: Option<C>,
        /// Claim at most this many (a budget claims one at a time, so each
        /// claim sees the headroom the previous one left).
        limit: Option<usize>,
    },
}

impl<C> Dequeue<C> {
    /// Claim without extra conditions.
    pub fn go() -> Self {
        Dequeue::Go {
            conditions: None,
            limit: None,
        }
    }

    /// Claim only jobs satisfying `conditions`.
    pub fn with_conditions(conditions: C) -> Self {
        Dequeue::Go {
            conditions: Some(conditions),
            limit: None,
        }
    }

    /// Caps the number of jobs claimed at once (no effect on `NotNow`).
    pub fn limit(self, max: usize) -> Self {
        match self {
            Dequeue::NotNow => Dequeue::NotNow,
            Dequeue::Go { conditions, .. } => Dequeue::Go {
                conditions,
                limit: Some(max),
            },
        }
    }
}

/// What the PreDequeue hook knows.
#[derive(Debug, Clone, Copy)]
pub struct DequeueContext<'a> {
    /// The worker's identity.
    pub worker: &'a str,
    /// How many more jobs the worker can run now.
    pub free_slots: usize,
    /// How many claims of this worker are still on their way (see
    /// `WorkerOptions::concurrent_claims` in queue-worker): their jobs are
    /// not through PreHandle yet. A hook whose answer depends on what
    /// PreHandle records (a budget) should say `NotNow` while this is not
    /// zero; it is asked again as soon as a claim comes back.
    pub claims_in_flight: usize,
}

/// Writes execution-log entries for the running job.
#[async_trait]
pub trait LogSink: Send + Sync {
    /// Appends `entry` to the running job's execution log.
    async fn append(&self, entry: LogEntry) -> Result<WriteResult, StoreError>;
}

/// What a handler knows about the job it runs: cancellation, attempt,
/// worker identity and deadline.
#[derive(Clone)]
pub struct JobContext {
    cancel: CancellationToken,
    attempt: u32,
    worker: Arc<str>,
    deadline: Option<Instant>,
    log: Option<Arc<dyn LogSink>>,
}

impl std::fmt::Debug for JobContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobContext")
            .field("attempt", &self.attempt)
            .field("worker", &self.worker)
            .field("deadline", &self.deadline)
            .field("cancelled", &self.cancel.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl JobContext {
    /// A context for attempt `attempt` run by `worker`.
    pub fn new(attempt: u32, worker: impl Into<Arc<str>>) -> Self {
        JobContext {
            cancel: CancellationToken::new(),
            attempt,
            worker: worker.into(),
            deadline: None,
            log: None,
        }
    }

    /// Sets the deadline after which the worker abandons the attempt.
    pub fn with_deadline(mut self, deadline: Instant) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Sets where [`JobContext::log`] writes.
    pub fn with_log_sink(mut self, sink: Arc<dyn LogSink>) -> Self {
        self.log = Some(sink);
        self
    }

    /// Uses `token` as the cancellation signal.
    pub fn with_cancellation(mut self, token: CancellationToken) -> Self {
        self.cancel = token;
        self
    }

    /// The attempt number, from 1.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The identity of the worker running the job.
    pub fn worker(&self) -> &str {
        &self.worker
    }

    /// When the worker abandons the attempt (its timeout), if it has one.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Whether the job has been asked to stop (cancelled, deleted, or the
    /// worker is shutting down). A handler that notices should return soon;
    /// one that does not is abandoned after a grace period.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Resolves when the job is asked to stop.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await
    }

    /// The cancellation token, to pass to libraries that accept one.
    pub fn cancellation_token(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Appends an entry to the job's execution log. Returns `Stale` when the
    /// job is no longer held by this attempt.
    pub async fn log(
        &self,
        key: &str,
        message: impl Into<String>,
    ) -> Result<WriteResult, StoreError> {
        match &self.log {
            Some(sink) => {
                sink.append(LogEntry::new(key, chrono::Utc::now(), message))
                    .await
            }
            None => Ok(WriteResult::Stale),
        }
    }
}

/// User code that processes jobs of a store `S`.
///
/// ```
/// use async_trait::async_trait;
/// use queue_core::{Handler, JobContext, JobError, Store};
///
/// struct Greeter;
///
/// #[async_trait]
/// impl<S: Store> Handler<S> for Greeter {
///     async fn handle(&self, ctx: &JobContext, _store: &mut S::JobStore, record: &S::Record) -> Result<(), JobError> {
///         if ctx.attempt() > 3 {
///             return Err(JobError::poison("gave up greeting"));
///         }
///         let _ = record;
///         Ok(())
///     }
/// }
/// ```
#[async_trait]
pub trait Handler<S: Store>: Send + Sync + 'static {
    /// The kinds this handler runs, as the worker registry shows them;
    /// empty (the default) for any.
    fn kinds(&self) -> Vec<String> {
        Vec::new()
    }

    /// Hook 1, before each claim: `NotNow` to wait, or `Go` with optional
    /// extra conditions (the basis of worker budgets). An error is logged and
    /// treated as `NotNow`.
    async fn pre_dequeue(
        &self,
        _ctx: &DequeueContext<'_>,
    ) -> Result<Dequeue<S::Conditions>, BoxError> {
        Ok(Dequeue::go())
    }

    /// Hook 2, after the claim and before `handle`; runs before the worker
    /// claims again, so it can take budget headroom safely.
    async fn pre_handle(&self, _ctx: &JobContext, _record: &S::Record) {}

    /// Hook 3: processes the record. `store` is the store refined to this
    /// job (in transactional mode, the transaction holding the row lock).
    /// Await rather than block: a runtime's worker may run several jobs in
    /// one task (queue-worker runs up to eight of a claim's jobs per task),
    /// so long computation without an await holds up the others; run it
    /// with `tokio::task::spawn_blocking`.
    async fn handle(
        &self,
        ctx: &JobContext,
        store: &mut S::JobStore,
        record: &S::Record,
    ) -> Result<(), JobError>;

    /// Hook 4, after the outcome was recorded (successful or not).
    async fn post_handle(&self, _ctx: &JobContext, _record: &S::Record, _outcome: &Outcome) {}
}

#[async_trait]
impl<S: Store, H: Handler<S> + ?Sized> Handler<S> for Arc<H> {
    fn kinds(&self) -> Vec<String> {
        (**self).kinds()
    }

    async fn pre_dequeue(
        &self,
        ctx: &DequeueContext<'_>,
    ) -> Result<Dequeue<S::Conditions>, BoxError> {
        (**self).pre_dequeue(ctx).await
    }

    async fn pre_handle(&self, ctx: &JobContext, record: &S::Record) {
        (**self).pre_handle(ctx, record).await
    }

    async fn handle(
        &self,
        ctx: &JobContext,
        store: &mut S::JobStore,
        record: &S::Record,
    ) -> Result<(), JobError> {
        (**self).handle(ctx, store, record).await
    }

    async fn post_handle(&self, ctx: &JobContext, record: &S::Record, outcome: &Outcome) {
        (**self).post_handle(ctx, record, outcome).await
    }
}
