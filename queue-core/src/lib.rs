#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

mod admin;
mod args;
mod audit;
mod clock;
mod error;
mod handler;
mod job;
pub mod limits;
pub mod operations;
mod outcome;
mod pause;
pub mod resetter;
pub mod retention;
mod retry;
mod store;
#[cfg(feature = "testkit")]
pub mod testkit;
mod workers;

pub use crate::admin::{
    distinct_retryable_states, json_contains, ActionReport, Admin, FinishedBucket, JobFilter,
    JobPage, JobView, ListOrder, ListParams, PurgeParams, PurgeReport, QueueStats, RetryParams,
    SkipReason, Skipped, StateCount, StatsParams, Targets, TimelineParams,
};
pub use crate::args::{decode_args, ArgsHandler, JobArgs, JobHandler, WithPayload};
pub use crate::audit::{AuditEntry, AuditParams, NewAuditEntry, MAX_AUDIT_PAGE};
pub use crate::clock::{Clock, SystemClock};
pub use crate::error::{BoxError, DecodeError, ErrorClass, JobError, StoreError};
pub use crate::handler::{Dequeue, DequeueContext, Handler, JobContext, LogSink};
pub use crate::job::{
    Enqueued, Job, JobId, JobLimits, JobRecord, JobState, Lease, LogEntry, NewJob, UniqueKey,
    UniqueScope, CANCELED_BEFORE_RUN_MESSAGE, EXPIRED_MESSAGE,
};
pub use crate::limits::{KindLimit, KindLimits};
pub use crate::operations::{
    purge_params, run_operation, AbortOutcome, NewOperation, Operation, OperationAction,
    OperationParams, OperationState, OperationStep, RunOptions, StopAs, TakeOperation,
    BACKGROUND_PACE, BACKGROUND_YIELD, DEFAULT_OPERATION_BATCH, DEFAULT_PURGE_BATCH,
    MAX_OPERATION_BATCH, MAX_OPERATION_PAGE, OPERATION_SILENT_AFTER,
};
pub use crate::outcome::{AttemptEnd, Outcome, OutcomePolicy, UnclassifiedPolicy};
pub use crate::pause::{check_kind, check_pause, PausedKind, MAX_KIND_LEN};
pub use crate::resetter::{Delivery, ResetParams, ResetReport};
pub use crate::retention::{prune, PruneReport, Retention};
pub use crate::retry::{Backoff, RetryDecision, RetryPolicy};
pub use crate::store::{ClaimParams, Claimed, HeartbeatReport, Store, Transition, WriteResult};
pub use crate::workers::{WorkerBeat, WorkerInfo};

/// Re-exported so handlers can name the cancellation token type.
pub use tokio_util::sync::CancellationToken;
