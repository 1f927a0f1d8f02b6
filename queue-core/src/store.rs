//! The [`Store`] trait: where jobs live and how their state moves.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use crate::error::{DecodeError, StoreError};
use crate::job::{JobId, JobRecord, JobState, Lease, LogEntry};
use crate::resetter::{ResetParams, ResetReport};

/// What [`Store::claim`] needs.
#[derive(Debug)]
pub struct ClaimParams<'a, C> {
    /// Claim at most this many jobs.
    pub limit: usize,
    /// Identity of the claiming worker, recorded on the job
    /// (`worker_hostname`).
    pub worker: &'a str,
    /// Extra conditions from the PreDequeue hook; only jobs that satisfy
    /// them are claimed.
    pub conditions: Option<&'a C>,
    /// The current time: jobs whose `process_after` is later are skipped.
    pub now: DateTime<Utc>,
}

/// One job claimed by [`Store::claim`].
pub struct Claimed<S: Store + ?Sized> {
    /// Proof of the claim; every later write for this attempt presents it.
    pub lease: Lease<S::Id>,
    /// The record, or why it could not be decoded. The worker fails an
    /// undecodable job with the error's message.
    pub record: Result<S::Record, DecodeError>,
    /// The store refined to this job, handed to the handler: for a
    /// transactional database store, bound to the transaction that row-locks
    /// the record, so the handler's writes commit with the job's final state.
    pub job_store: S::JobStore,
}

impl<S: Store + ?Sized> std::fmt::Debug for Claimed<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claimed")
            .field("lease", &self.lease)
            .field("decoded", &self.record.is_ok())
            .finish_non_exhaustive()
    }
}

/// How a worker ends its hold on a claimed job. Every transition expects the
/// job to be [`JobState::Processing`] under the presented lease; if it is not
/// (reset, reclaimed, deleted, already finished) the write is a no-op that
/// reports [`WriteResult::Stale`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Transition {
    /// The handler succeeded: completed.
    Complete,
    /// A retryable failure: errored, claimable again from `retry_at`;
    /// `num_failures` is incremented. The worker reports it as
    /// [`Outcome::Retried`](crate::Outcome::Retried).
    Retry {
        /// Stored in `failure_message`.
        message: String,
        /// Stored in `process_after`.
        retry_at: DateTime<Utc>,
    },
    /// A permanent failure: failed; `num_failures` is incremented.
    Fail {
        /// Stored in `failure_message`.
        message: String,
    },
    /// Cancelled while running: canceled.
    Cancel {
        /// Stored in `failure_message`.
        message: String,
    },
    /// Handed back unfinished (graceful shutdown): queued again, counting
    /// neither a failure nor a reset.
    Release,
}

impl Transition {
    /// The state every transition expects the job to be in.
    pub const EXPECTED: JobState = JobState::Processing;

    /// The state the job moves to.
    pub fn target(&self) -> JobState {
        match self {
            Transition::Complete => JobState::Completed,
            Transition::Retry { .. } => JobState::Errored,
            Transition::Fail { .. } => JobState::Failed,
            Transition::Cancel { .. } => JobState::Canceled,
            Transition::Release => JobState::Queued,
        }
    }
}

/// Whether a guarded write changed anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
#[non_exhaustive]
pub enum WriteResult {
    /// The job was in the expected state under the presented lease and was
    /// updated.
    Applied,
    /// The job had moved on (or vanished): nothing was written.
    Stale,
    /// The store has nowhere to keep this write (an execution log entry on
    /// a table without a log column): nothing was written, though the job
    /// is still held by the attempt.
    NotKept,
}

impl WriteResult {
    /// Whether the write was applied.
    pub fn is_applied(self) -> bool {
        self == WriteResult::Applied
    }
}

/// What [`Store::heartbeat`] learned about the running jobs it was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatReport<Id> {
    /// Jobs still held whose `cancel` flag is set: their handlers should stop
    /// and the jobs end as canceled.
    pub cancel_requested: Vec<Id>,
    /// Jobs no longer held under the presented lease (deleted, reset, or
    /// reclaimed by another attempt): their handlers should stop and nothing
    /// more may be written for them.
    pub gone: Vec<Id>,
}

impl<Id> Default for HeartbeatReport<Id> {
    fn default() -> Self {
        HeartbeatReport {
            cancel_requested: Vec::new(),
            gone: Vec::new(),
        }
    }
}

/// Where jobs are persisted, and the only way their state changes.
///
/// A store claims eligible jobs and locks them from other consumers, records
/// how each attempt ended, keeps running jobs alive through heartbeats, and
/// resets stalled ones. All writes for a claimed job present its [`Lease`]
/// and are guarded: a stale write never regresses a job.
///
/// Enqueueing is not part of this trait: for an existing table the
/// application inserts rows itself; stores offer their own enqueue API for
/// their default tables.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// The key type of the jobs.
    type Id: JobId;
    /// The record handed to handlers.
    type Record: JobRecord<Id = Self::Id>;
    /// Extra dequeue conditions a PreDequeue hook may return (for Postgres:
    /// SQL fragments with bound parameters; for memory: predicates).
    type Conditions: Send + Sync + 'static;
    /// The store refined to one claimed job, handed to its handler (see
    /// [`Claimed::job_store`]).
    type JobStore: Send + 'static;

    /// Claims up to `params.limit` eligible jobs: queued, or errored with
    /// `process_after` passed, not scheduled for later, satisfying the extra
    /// conditions, in the store's order. Each moves to processing with a new
    /// fencing token, `started_at` and `last_heartbeat_at` set to `now` and
    /// the worker recorded. Concurrent claims never return the same job.
    async fn claim(
        &self,
        params: ClaimParams<'_, Self::Conditions>,
    ) -> Result<Vec<Claimed<Self>>, StoreError>;

    /// Ends the attempt held by `lease` with `transition` (guarded: see
    /// [`Transition`]). Consumes the job store: a transactional store commits
    /// the handler's writes together with the new state.
    async fn finish(
        &self,
        job_store: Self::JobStore,
        lease: &Lease<Self::Id>,
        transition: Transition,
        now: DateTime<Utc>,
    ) -> Result<WriteResult, StoreError>;

    /// Records `transition` for the attempt held by `lease` once more, after
    /// [`Store::finish`] failed with a retryable error (see
    /// [`StoreError::is_retryable`]); guarded like it. The job store that
    /// finish consumed is gone, and with it any transaction of the
    /// handler's (rolled back, or lost with its connection), so this writes
    /// outside any job transaction. The worker retries a failed finish this
    /// way for a few seconds before it leaves the job to the resetter; a
    /// finish of [`Transition::Complete`] whose transaction the handler
    /// wrote in is retried as [`Transition::Release`], since completing it
    /// now would complete it without the handler's writes.
    async fn finish_again(
        &self,
        lease: &Lease<Self::Id>,
        transition: Transition,
        now: DateTime<Utc>,
    ) -> Result<WriteResult, StoreError>;

    /// After an attempt whose handler returned an error: whether the store
    /// cut the attempt off, so that the error is the store's and not the
    /// handler's (`Some`: why). A store that can tell ends the attempt's
    /// store-side work here: the transactional Postgres store rolls the
    /// job's transaction back, and a connection found dead, or a
    /// transaction that could not be opened for want of one, means the
    /// attempt was cut off. The worker then hands the job back
    /// ([`Outcome::Interrupted`](crate::Outcome::Interrupted)), counting
    /// neither a failure nor a reset. (The worker also treats a handler's
    /// error that carries a [`StoreError::Unavailable`] as cut off.) The
    /// default says the error is the handler's.
    async fn attempt_cut_off(&self, job_store: &mut Self::JobStore) -> Option<String> {
        let _ = job_store;
        None
    }

    /// A claimed job is about to wait for a free handler (the worker calls
    /// this for each job that finds every handler busy, in the order the
    /// handlers will take them). A
    /// store may get ready for it: the transactional Postgres store hands
    /// the job's row lock to the next commit of another job, so that the
    /// lock is taken in that commit's round trip. The default does nothing.
    fn job_waiting(&self, job_store: &mut Self::JobStore) {
        let _ = job_store;
    }

    /// Whether finishing the attempt in `job_store` ends a transaction the
    /// handler wrote in (the transactional Postgres store once the handler
    /// opened it). The worker then keeps the handler's slot until
    /// [`Store::finish`] returns, so that no more job transactions are open
    /// at once than there are handlers; otherwise the slot takes the next
    /// job while the outcome is recorded (which a batching store may hold
    /// for a few milliseconds). The default says no.
    fn finish_ends_transaction(&self, job_store: &Self::JobStore) -> bool {
        let _ = job_store;
        false
    }

    /// Whether the store counts the resets of each job, so that
    /// [`ResetParams::max_resets`] bounds them. A store that cannot (a table
    /// without a reset counter) re-queues a stalled job however often it
    /// stalled; the resetter refuses to run at-least-once over it. The
    /// default says yes.
    fn counts_resets(&self) -> bool {
        true
    }

    /// Whether the store counts the failed attempts of each job, which
    /// bounds retries. A store that cannot (a table without a failure
    /// counter) fails a job on a retryable error instead, and the worker
    /// reports it as failed. The default says yes.
    fn counts_failures(&self) -> bool {
        true
    }

    /// Sets `last_heartbeat_at = now` on every job still held under the given
    /// leases, and reports which were cancelled or are gone.
    async fn heartbeat(
        &self,
        leases: &[Lease<Self::Id>],
        now: DateTime<Utc>,
    ) -> Result<HeartbeatReport<Self::Id>, StoreError>;

    /// Appends an entry to the execution log of the job held by `lease`.
    /// [`WriteResult::NotKept`] when the store has no log to append to.
    async fn append_log(
        &self,
        lease: &Lease<Self::Id>,
        entry: LogEntry,
    ) -> Result<WriteResult, StoreError>;

    /// Ends jobs that expired before they started
    /// ([`NewJob::expires_at`](crate::NewJob::expires_at)): up to `limit`
    /// queued or errored jobs whose expiry is at or before `now` become
    /// failed with [`EXPIRED_MESSAGE`](crate::EXPIRED_MESSAGE). Returns
    /// their keys; call again while it returns `limit`. Claims skip expired
    /// jobs already, so this only records their end. A store that keeps no
    /// expiry has none to end: the default returns none.
    async fn expire(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<Self::Id>, StoreError> {
        let _ = (now, limit);
        Ok(Vec::new())
    }

    /// Resets stalled jobs: processing, not held by a live attempt, heartbeat
    /// older than `params.stalled_before`. See
    /// [`resetter`](crate::resetter) for the contract.
    async fn reset_stalled(&self, params: ResetParams)
        -> Result<ResetReport<Self::Id>, StoreError>;

    /// Records `beat` in the registry of live workers (see
    /// [`Admin::workers`](crate::Admin::workers)); a worker beats once per
    /// heartbeat interval. A store without a registry keeps nothing: the
    /// default.
    async fn beat(&self, beat: &crate::WorkerBeat) -> Result<(), StoreError> {
        let _ = beat;
        Ok(())
    }

    /// Removes the worker `name` from the registry: it stopped on purpose,
    /// so an operator sees it gone at once instead of after the stalled
    /// age. A store without a registry has nothing to remove: the default.
    async fn leave(&self, name: &str) -> Result<(), StoreError> {
        let _ = name;
        Ok(())
    }

    /// Waits until jobs may have become available (a notification) or
    /// `max_wait` has passed, whichever comes first. Stores without
    /// notifications simply sleep. A store that notifies ends the wait at
    /// once for a notification that came after the worker's last claim
    /// was sent (that claim may not have seen its jobs), so none is lost
    /// between a claim and the wait.
    async fn wait_for_jobs(&self, max_wait: Duration);

    /// The earliest time after `after` at which a waiting job comes due
    /// (its `process_after`: scheduled, or errored and waiting for its
    /// retry), if any. An idle worker sleeps no longer than until then, so
    /// a scheduled job starts on time without a notification at that
    /// moment. The default knows of none (the worker then relies on
    /// notifications and its poll interval).
    async fn next_due(&self, after: DateTime<Utc>) -> Result<Option<DateTime<Utc>>, StoreError> {
        let _ = after;
        Ok(None)
    }
}
