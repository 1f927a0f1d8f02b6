//! One claimed job, from its PreHandle hook to its recorded outcome:
//! the handle to stop it, its log sink, the handler call under its
//! timeout and cancellation, and the outcome written back.

use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::FutureExt;
use queue_core::{
    AttemptEnd, CancellationToken, Claimed, Handler, JobContext, JobRecord, Lease, LogEntry,
    LogSink, Outcome, Store, StoreError, Transition, WriteResult,
};
use tokio::sync::OwnedSemaphorePermit;
use tracing::Instrument;

use crate::metrics;

use super::{panic_message, Shared, AT_MOST_ONCE_SHUTDOWN_MESSAGE};

/// Why a running job is asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StopReason {
    /// An operator cancelled it.
    Canceled,
    /// It was deleted or reclaimed.
    Lost,
    /// The worker is shutting down.
    Shutdown,
}

/// The worker's handle on one running job.
pub(super) struct JobControl {
    pub(super) token: CancellationToken,
    pub(super) reason: Mutex<Option<StopReason>>,
    /// Whether the handler has a slot (a prefetched job waits for one).
    pub(super) started: std::sync::atomic::AtomicBool,
    /// Whether the handler is done and the outcome on its way to the
    /// store: heartbeats leave the job out. Nothing of it runs any more,
    /// and on the Postgres store a heartbeat locks the rows it bumps,
    /// which held up the writes of those very outcomes (a heartbeat of
    /// 146,000 such jobs took 12 s, and the completions waited for it).
    pub(super) handled: std::sync::atomic::AtomicBool,
}

impl JobControl {
    pub(super) fn stop(&self, reason: StopReason) {
        let mut current = self.reason.lock().unwrap_or_else(PoisonError::into_inner);
        if current.is_none() {
            *current = Some(reason);
        }
        drop(current);
        self.token.cancel();
    }

    pub(super) fn reason(&self) -> Option<StopReason> {
        *self.reason.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Running jobs by key: the lease to heartbeat and the handle to stop them.
pub(super) type RunningJobs<Id> = HashMap<Id, (Lease<Id>, Arc<JobControl>)>;

/// Writes a job's execution log through the store under its lease.
pub(super) struct StoreLogSink<S: Store> {
    store: Arc<S>,
    lease: Lease<S::Id>,
}

#[async_trait]
impl<S: Store> LogSink for StoreLogSink<S> {
    async fn append(&self, entry: LogEntry) -> Result<WriteResult, StoreError> {
        self.store.append_log(&self.lease, entry).await
    }
}

/// The rest of a started job, from the wait for a handler on: run in a task
/// with other jobs of its claim.
pub(super) type JobFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs PreHandle (before the next claim, so a budget sees the headroom it
/// took) and returns the rest of the job, or `None` if it ended already (an
/// undecodable record).
pub(super) async fn start_job<S: Store, H: Handler<S>>(
    shared: &Arc<Shared<S, H>>,
    job: Claimed<S>,
    permit: OwnedSemaphorePermit,
) -> Option<JobFuture> {
    let options = &shared.options;
    let Claimed {
        lease,
        record,
        job_store,
    } = job;
    let record = match record {
        Ok(record) => record,
        Err(error) => {
            let outcome = options.outcome_policy.decide(
                AttemptEnd::Undecodable(error),
                lease.attempt,
                options.clock.now(),
                fastrand::f64(),
            );
            tracing::error!(id = %lease.id, outcome = outcome.label(), "claimed record could not be decoded");
            // The handler never ran: no transaction of its to lose.
            let outcome = record_outcome(shared, job_store, &lease, outcome, false).await;
            metrics::undecodable(&outcome);
            shared.count(&outcome);
            return None;
        }
    };
    let control = Arc::new(JobControl {
        token: CancellationToken::new(),
        reason: Mutex::new(None),
        started: std::sync::atomic::AtomicBool::new(false),
        handled: std::sync::atomic::AtomicBool::new(false),
    });
    let mut ctx = JobContext::new(lease.attempt, shared.name.clone())
        .with_cancellation(control.token.clone())
        .with_log_sink(Arc::new(StoreLogSink {
            store: shared.store.clone(),
            lease: lease.clone(),
        }));
    if let Some(timeout) = options.job_timeout {
        ctx = ctx.with_deadline(Instant::now() + timeout);
    }
    shared
        .running()
        .insert(lease.id.clone(), (lease.clone(), control.clone()));
    let span =
        tracing::info_span!("job", id = %lease.id, kind = record.kind(), attempt = lease.attempt);
    let pre_handle = AssertUnwindSafe(shared.handler.pre_handle(&ctx, &record))
        .catch_unwind()
        .instrument(span.clone())
        .await
        .err()
        .map(|panic| panic_message(&panic));
    shared.waiting.fetch_add(1, Ordering::AcqRel);
    let job = JobRun {
        ctx,
        control,
        lease,
        record,
        job_store,
        pre_handle_panic: pre_handle,
        claim_slot: permit,
    };
    // The job is built before the future and moved into it once, and the
    // future reads it in place (see `run_job`): an async block that
    // captured its parts and built it inside, and a `run_job` that took
    // them apart again, kept three copies of it, and each job's future
    // took 2,696 bytes to allocate and copy, against 2,096 now.
    Some(Box::pin(run_job(shared.clone(), job).instrument(span)))
}

/// A claimed job on its way through the worker.
pub(super) struct JobRun<S: Store> {
    ctx: JobContext,
    control: Arc<JobControl>,
    lease: Lease<S::Id>,
    record: S::Record,
    job_store: S::JobStore,
    pre_handle_panic: Option<String>,
    /// Held from the claim until the handler is done.
    claim_slot: OwnedSemaphorePermit,
}

/// Waits for a handler slot, then Handle, record the outcome, PostHandle.
///
/// The job's parts are read where they are, never moved out into locals of
/// their own: each such local is one more copy of it in the future's
/// state, which is allocated and copied for every job.
pub(super) async fn run_job<S: Store, H: Handler<S>>(
    shared: Arc<Shared<S, H>>,
    mut job: JobRun<S>,
) {
    let shared = &*shared;
    let options = &shared.options;
    let metrics = shared.metrics.of(job.record.kind());
    // A prefetched job waits here for a handler; a stop request (shutdown,
    // cancel, deletion) ends the wait. The store hears of a wait in the
    // same poll that queues it, so in the order the slots are handed out.
    if shared.run_slots.available_permits() == 0 {
        shared.store.job_waiting(&mut job.job_store);
    }
    let run_slot = tokio::select! {
        biased;
        slot = shared.run_slots.clone().acquire_owned() => slot.ok(),
        _ = job.control.token.cancelled() => None,
    };
    shared.waiting.fetch_sub(1, Ordering::AcqRel);
    metrics.started();
    let started = Instant::now();
    let end = match (run_slot.is_some(), job.pre_handle_panic.take()) {
        (false, _) => stopped(job.control.reason()),
        (true, Some(panic)) => AttemptEnd::Panicked(format!("in PreHandle: {panic}")),
        (true, None) => {
            job.control.started.store(true, Ordering::Release);
            let JobRun {
                ctx,
                control,
                record,
                job_store,
                ..
            } = &mut job;
            match handle(shared, ctx, control, job_store, record).await {
                // Started: handing it back would start it again.
                AttemptEnd::Released if job.lease.limits.at_most_once => {
                    AttemptEnd::Errored(queue_core::JobError::poison(AT_MOST_ONCE_SHUTDOWN_MESSAGE))
                }
                // The store's fault, not the handler's: not charged.
                AttemptEnd::Errored(error) => {
                    let cut_off = match shared.store.attempt_cut_off(&mut job.job_store).await {
                        Some(why) => Some(why),
                        None => store_unavailable(&error),
                    };
                    match cut_off {
                        Some(why) => {
                            tracing::warn!(id = %job.lease.id, handler_error = %error, "{why}; the job is handed back without counting a failure");
                            AttemptEnd::Interrupted(why)
                        }
                        None => AttemptEnd::Errored(error),
                    }
                }
                end => end,
            }
        }
    };
    let duration = started.elapsed();
    // The handler is done: its slots can take the next job while the
    // outcome is recorded (which a batching store may hold briefly), unless
    // recording it commits the handler's transaction, which is still the
    // handler's work.
    let ends_transaction = shared.store.finish_ends_transaction(&job.job_store);
    let run_slot = run_slot.filter(|_| ends_transaction);
    job.control.handled.store(true, Ordering::Release);
    // With too many outcomes on their way, the claim slot stays held until
    // one is written: claims slow to the pace of the writes. (The slots
    // are never closed.)
    let outcome_slot = shared.outcome_slots.clone().acquire_owned().await.ok();
    drop(job.claim_slot);
    if !matches!(end, AttemptEnd::Succeeded) {
        // Let anything the handler spawned with the token stop too.
        job.control.token.cancel();
    }
    let outcome = options.outcome_policy.decide_for(
        end,
        job.lease.attempt,
        job.lease.limits,
        options.clock.now(),
        fastrand::f64(),
    );
    let outcome = without_uncounted_retry(outcome, shared.store.counts_failures());
    let outcome =
        record_outcome(shared, job.job_store, &job.lease, outcome, ends_transaction).await;
    drop(run_slot);
    drop(outcome_slot);
    if let Outcome::Retried { retry_at, .. } = &outcome {
        wake_when_due(shared, *retry_at);
    }
    {
        // Only this attempt's entry: once the outcome is written, the job
        // can be claimed again and its next attempt started (in this
        // worker too) before this line runs, and that attempt needs its
        // heartbeats.
        let mut running = shared.running();
        if running
            .get(&job.lease.id)
            .is_some_and(|(l, _)| l.token == job.lease.token)
        {
            running.remove(&job.lease.id);
        }
    }
    metrics.finished(&outcome, duration);
    shared.count(&outcome);
    tracing::debug!(outcome = outcome.label(), ?duration, "job finished");
    if let Err(panic) =
        AssertUnwindSafe(shared.handler.post_handle(&job.ctx, &job.record, &outcome))
            .catch_unwind()
            .await
    {
        tracing::error!(panic = %panic_message(&panic), "PostHandle hook panicked");
    }
    shared.job_finished.notify_one();
}

/// Runs Handle under the timeout, the cancellation grace and panic capture.
pub(super) async fn handle<S: Store, H: Handler<S>>(
    shared: &Shared<S, H>,
    ctx: &JobContext,
    control: &JobControl,
    job_store: &mut S::JobStore,
    record: &S::Record,
) -> AttemptEnd {
    let options = &shared.options;
    let timeout = async {
        match options.job_timeout {
            Some(limit) => tokio::time::sleep(limit).await,
            None => std::future::pending().await,
        }
    };
    let abandon = async {
        control.token.cancelled().await;
        tokio::time::sleep(options.cancel_grace).await;
    };
    tokio::select! {
        result = AssertUnwindSafe(shared.handler.handle(ctx, job_store, record)).catch_unwind() => {
            match (result, control.reason()) {
                (Ok(Ok(())), Some(StopReason::Lost)) => AttemptEnd::Lost,
                (Ok(Ok(())), _) => AttemptEnd::Succeeded,
                // The handler gave up because it was asked to stop.
                (Ok(Err(error)), Some(StopReason::Canceled)) => AttemptEnd::Canceled(error.message()),
                (Ok(Err(error)), reason @ Some(_)) => {
                    tracing::debug!(%error, "handler stopped on request");
                    stopped(reason)
                }
                (Ok(Err(error)), None) => AttemptEnd::Errored(error),
                (Err(panic), _) => AttemptEnd::Panicked(panic_message(&panic)),
            }
        }
        _ = timeout => AttemptEnd::TimedOut(options.job_timeout.unwrap_or_default()),
        _ = abandon => {
            tracing::warn!(grace = ?options.cancel_grace, "handler ignored the stop request; abandoned");
            stopped(control.reason())
        }
    }
}

/// Whether a handler's error came from the queue's store being unreachable
/// (a [`StoreError::Unavailable`] anywhere in its chain: the job's
/// transaction could not be opened, an execution log entry could not be
/// written): then the attempt was cut off by the store, not failed by the
/// handler. Errors of the handler's own connections (to this database or
/// any other) stay the handler's: handing those back uncounted would retry
/// a job whose other database is down without end or backoff.
pub(super) fn store_unavailable(error: &queue_core::JobError) -> Option<String> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(error.source());
    while let Some(cause) = next {
        if let Some(store_error @ StoreError::Unavailable { .. }) =
            cause.downcast_ref::<StoreError>()
        {
            return Some(store_error.chain());
        }
        next = cause.source();
    }
    None
}

/// How a job asked to stop ends.
pub(super) fn stopped(reason: Option<StopReason>) -> AttemptEnd {
    match reason {
        Some(StopReason::Canceled) | None => AttemptEnd::Canceled("canceled while running".into()),
        Some(StopReason::Lost) => AttemptEnd::Lost,
        Some(StopReason::Shutdown) => AttemptEnd::Released,
    }
}

/// Ends an idle claim loop's wait when a retry comes due within the poll
/// interval, so a quick retry does not wait for the backstop poll.
pub(super) fn wake_when_due<S: Store, H>(
    shared: &Shared<S, H>,
    retry_at: chrono::DateTime<chrono::Utc>,
) {
    let options = &shared.options;
    let Ok(delay) = (retry_at - options.clock.now()).to_std() else {
        // Already due.
        shared.retry_due.notify_one();
        return;
    };
    if delay >= options.poll_interval {
        return;
    }
    let retry_due = shared.retry_due.clone();
    tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        retry_due.notify_one();
    });
}

/// A retry the store cannot count is a failure: retries without a failure
/// count would be unbounded, so such a store fails the job, and the
/// metrics, the report and PostHandle say so.
pub(super) fn without_uncounted_retry(outcome: Outcome, store_counts_failures: bool) -> Outcome {
    match outcome {
        Outcome::Retried { message, .. } if !store_counts_failures => Outcome::Failed {
            message: format!(
                "{message} (not retried: the store counts no failures, so it could not bound the retries)"
            ),
        },
        other => other,
    }
}

/// How long a failed outcome write is retried before the job is left to
/// the resetter, and the first and longest waits between tries.
pub(super) const FINISH_RETRIES_FOR: Duration = Duration::from_secs(3);
pub(super) const FINISH_RETRY_FIRST: Duration = Duration::from_millis(50);
pub(super) const FINISH_RETRY_MOST: Duration = Duration::from_secs(1);

/// Writes the outcome's transition; a stale write turns it into `Lost`. A
/// write that fails retryably (the connection was lost) is tried again for
/// a few seconds, outside any job transaction: a completion whose
/// transaction the handler wrote in (`ends_transaction`) is lost with that
/// transaction, so it is retried as a hand-back (`Interrupted`; an
/// at-most-once job fails). Only then is the job left to the resetter.
pub(super) async fn record_outcome<S: Store, H>(
    shared: &Shared<S, H>,
    job_store: S::JobStore,
    lease: &Lease<S::Id>,
    mut outcome: Outcome,
    ends_transaction: bool,
) -> Outcome {
    let Some(mut transition) = outcome.transition() else {
        return outcome;
    };
    let clock = &shared.options.clock;
    let mut written = shared
        .store
        .finish(job_store, lease, transition.clone(), clock.now())
        .await;
    let retrying_until = Instant::now() + FINISH_RETRIES_FOR;
    let mut wait = FINISH_RETRY_FIRST;
    loop {
        let error = match &written {
            Err(error) if error.is_retryable() && Instant::now() + wait <= retrying_until => error,
            _ => break,
        };
        if ends_transaction && transition == Transition::Complete {
            let why = format!(
                "the job's transaction could not commit ({}); its writes were rolled back",
                error.chain()
            );
            // The same judgement as an attempt cut off under its handler.
            outcome = shared.options.outcome_policy.decide_for(
                AttemptEnd::Interrupted(why),
                lease.attempt,
                lease.limits,
                clock.now(),
                0.0,
            );
            transition = outcome.transition().unwrap_or(Transition::Release);
        }
        if wait == FINISH_RETRY_FIRST {
            // Once per job: the tries after it say nothing new.
            tracing::warn!(error = %error.chain(), id = %lease.id, "recording the job's outcome failed; trying again for a few seconds");
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(FINISH_RETRY_MOST);
        written = shared
            .store
            .finish_again(lease, transition.clone(), clock.now())
            .await;
    }
    match written {
        Ok(WriteResult::Applied) => outcome,
        Ok(WriteResult::Stale) => {
            tracing::warn!(id = %lease.id, "job moved on while it ran (reset, reclaimed or deleted); its outcome was not recorded");
            Outcome::Lost
        }
        Ok(_) => {
            // NotKept: no store answers a finish so; were one to, the job
            // would stay processing until the resetter recovers it.
            tracing::error!(id = %lease.id, "the store kept no outcome for the job; the resetter will recover it");
            Outcome::Lost
        }
        Err(error) => {
            // The job stays processing; once its heartbeat goes stale the
            // resetter queues it again, so nothing is lost.
            tracing::error!(error = %error.chain(), id = %lease.id, "could not record the job's outcome; the resetter will recover it");
            Outcome::Lost
        }
    }
}
