//! [`Worker`]: claims jobs from a store and runs them through a handler,
//! N at a time, with heartbeats, cancellation, timeouts, panic isolation and
//! graceful shutdown.

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
    AttemptEnd, CancellationToken, Claimed, Clock, Handler, JobContext, JobRecord, Lease, LogEntry,
    LogSink, Outcome, OutcomePolicy, Store, StoreError, SystemClock, Transition, WriteResult,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::error::WorkerError;
use crate::metrics;

mod claiming;

use claiming::claim_loop;

/// The failure of an at-most-once job a shutting-down worker stopped: it
/// had started, so it is not handed back to run again.
pub const AT_MOST_ONCE_SHUTDOWN_MESSAGE: &str =
    "stopped by its worker's shutdown; an at-most-once job that has started is not run again";

/// How a [`Worker`] runs.
#[derive(Clone)]
pub struct WorkerOptions {
    /// The worker's identity, recorded on claimed jobs. Default: host name
    /// and process id.
    pub name: String,
    /// How many jobs run at once. Default 4. A job whose outcome commits
    /// the handler's transaction (see [`Store::finish_ends_transaction`])
    /// runs until that commit, so this also bounds the job transactions
    /// open at once.
    pub num_handlers: usize,
    /// How long to wait between claims when no job is available: the
    /// backstop poll. A store notification (Postgres LISTEN/NOTIFY, the
    /// memory store's enqueue) ends the wait early, so this only bounds how
    /// late a dropped notification or a scheduled job is noticed.
    /// Default 5 s.
    pub poll_interval: Duration,
    /// The most jobs one claim takes. `None` (the default): `num_handlers +
    /// prefetch`, whatever those are set to. A claim asks for one of a few
    /// sizes (1 to 7, then 8, 10, 12, 14, 16, 20, 24, ...), the largest not
    /// above its free slots, so that a store can keep one prepared
    /// statement per size.
    pub claim_batch: Option<usize>,
    /// How many claims may be on their way at once. With 2 (the default)
    /// the next claim goes out while the previous one's round trip and
    /// commit are still under way, so handlers do not sit idle waiting for
    /// it. PreDequeue then may run while a claim is in flight
    /// ([`queue_core::DequeueContext::claims_in_flight`] says so). 1 claims strictly one
    /// batch at a time.
    pub concurrent_claims: usize,
    /// Jobs claimed beyond the free handler slots and held until a slot
    /// frees, so that claims come in larger batches (graphile-worker's
    /// local queue). They count as running: they are heartbeated, and at
    /// shutdown the ones not started are handed back at once. A store may
    /// tie resources to a claimed job (a transaction opened at claim time);
    /// the Postgres store opens a job's transaction only when its handler
    /// asks, so prefetched jobs hold no connection. Default 0.
    pub prefetch: usize,
    /// How often running jobs are heartbeated (and cancellations noticed).
    /// Default 5 s; keep it well below the resetter's stalled max age.
    pub heartbeat_interval: Duration,
    /// How long one attempt may run before it is abandoned as timed out
    /// (retryable). Default 5 min; `None` for no limit.
    pub job_timeout: Option<Duration>,
    /// How long a handler asked to stop (cancelled, deleted, shutdown) may
    /// keep running before it is abandoned. Default 5 s.
    pub cancel_grace: Duration,
    /// At shutdown, how long in-flight jobs may run before they are asked to
    /// stop and handed back. Default 30 s.
    pub shutdown_timeout: Duration,
    /// Retries, backoff, and the treatment of unclassified errors and panics.
    pub outcome_policy: OutcomePolicy,
    /// The clock for `now` values given to the store.
    pub clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for WorkerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerOptions")
            .field("name", &self.name)
            .field("num_handlers", &self.num_handlers)
            .field("poll_interval", &self.poll_interval)
            .field("claim_batch", &self.claim_batch)
            .field("concurrent_claims", &self.concurrent_claims)
            .field("prefetch", &self.prefetch)
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("job_timeout", &self.job_timeout)
            .field("cancel_grace", &self.cancel_grace)
            .field("shutdown_timeout", &self.shutdown_timeout)
            .field("outcome_policy", &self.outcome_policy)
            .finish_non_exhaustive()
    }
}

impl Default for WorkerOptions {
    fn default() -> Self {
        WorkerOptions {
            name: default_worker_name(),
            num_handlers: 4,
            poll_interval: Duration::from_secs(5),
            claim_batch: None,
            concurrent_claims: 2,
            prefetch: 0,
            heartbeat_interval: Duration::from_secs(5),
            job_timeout: Some(Duration::from_secs(300)),
            cancel_grace: Duration::from_secs(5),
            shutdown_timeout: Duration::from_secs(30),
            outcome_policy: OutcomePolicy::default(),
            clock: Arc::new(SystemClock),
        }
    }
}

impl WorkerOptions {
    /// Sets `num_handlers`.
    pub fn handlers(mut self, n: usize) -> Self {
        self.num_handlers = n;
        self
    }

    /// Sets `prefetch`.
    pub fn prefetch(mut self, n: usize) -> Self {
        self.prefetch = n;
        self
    }

    /// The most jobs one claim takes: `claim_batch`, or by default
    /// `num_handlers + prefetch`, however the options were built.
    ///
    /// ```
    /// use queue_worker::WorkerOptions;
    /// let literal = WorkerOptions { num_handlers: 32, ..Default::default() };
    /// assert_eq!(literal.claim_batch_size(), 32);
    /// let built = WorkerOptions::default().prefetch(8).handlers(16);
    /// assert_eq!(built.claim_batch_size(), 24);
    /// let fixed = WorkerOptions { claim_batch: Some(10), ..built };
    /// assert_eq!(fixed.claim_batch_size(), 10);
    /// ```
    pub fn claim_batch_size(&self) -> usize {
        self.claim_batch
            .unwrap_or(self.num_handlers + self.prefetch)
    }

    fn validate(&self) -> Result<(), WorkerError> {
        let fail = |m: &str| Err(WorkerError::InvalidOptions(m.to_owned()));
        if self.name.is_empty() {
            return fail("name must not be empty");
        }
        if self.num_handlers == 0 {
            return fail("num_handlers must be at least 1");
        }
        if self.claim_batch == Some(0) {
            return fail("claim_batch must be at least 1");
        }
        if self.concurrent_claims == 0 {
            return fail("concurrent_claims must be at least 1");
        }
        if self.poll_interval.is_zero() {
            return fail("poll_interval must be longer than zero");
        }
        if self.heartbeat_interval.is_zero() {
            return fail("heartbeat_interval must be longer than zero");
        }
        if self.job_timeout.is_some_and(|t| t.is_zero()) {
            return fail("job_timeout must be longer than zero (or None for no limit)");
        }
        Ok(())
    }
}

/// `host-pid`, from the system's host name (or `$HOSTNAME`).
pub fn default_worker_name() -> String {
    let host = Some(
        gethostname::gethostname()
            .to_string_lossy()
            .trim()
            .to_owned(),
    )
    .filter(|h| !h.is_empty())
    .or_else(|| std::env::var("HOSTNAME").ok())
    .unwrap_or_else(|| "localhost".to_owned());
    format!("{host}-{}", std::process::id())
}

/// What a worker did before it stopped: attempts by outcome label.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerReport {
    /// Attempts by outcome label (`ok`, `retry`, `failed`, `poison`,
    /// `canceled`, `released`, `lost`).
    pub outcomes: std::collections::BTreeMap<&'static str, u64>,
}

impl WorkerReport {
    /// How many attempts ended with `label`.
    pub fn count(&self, label: &str) -> u64 {
        self.outcomes.get(label).copied().unwrap_or(0)
    }

    /// All attempts.
    pub fn total(&self) -> u64 {
        self.outcomes.values().sum()
    }
}

/// Why a running job is asked to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopReason {
    /// An operator cancelled it.
    Canceled,
    /// It was deleted or reclaimed.
    Lost,
    /// The worker is shutting down.
    Shutdown,
}

/// The worker's handle on one running job.
struct JobControl {
    token: CancellationToken,
    reason: Mutex<Option<StopReason>>,
    /// Whether the handler has a slot (a prefetched job waits for one).
    started: std::sync::atomic::AtomicBool,
}

impl JobControl {
    fn stop(&self, reason: StopReason) {
        let mut current = self.reason.lock().unwrap_or_else(PoisonError::into_inner);
        if current.is_none() {
            *current = Some(reason);
        }
        drop(current);
        self.token.cancel();
    }

    fn reason(&self) -> Option<StopReason> {
        *self.reason.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Running jobs by key: the lease to heartbeat and the handle to stop them.
type RunningJobs<Id> = HashMap<Id, (Lease<Id>, Arc<JobControl>)>;

/// What the worker loop and its job tasks share.
struct Shared<S: Store, H> {
    store: Arc<S>,
    handler: H,
    options: WorkerOptions,
    /// One permit per handler: held while a handler runs.
    run_slots: Arc<Semaphore>,
    /// Claimed jobs waiting for a handler (prefetched).
    waiting: std::sync::atomic::AtomicUsize,
    /// Signalled when a job is through PostHandle: a PreDequeue that said
    /// not now may say otherwise.
    job_finished: tokio::sync::Notify,
    /// Signalled when a retry this worker recorded comes due before the
    /// next poll (retries update a row, which notifies nobody).
    retry_due: Arc<tokio::sync::Notify>,
    /// The worker's name, shared by every job's context.
    name: Arc<str>,
    running: Mutex<RunningJobs<S::Id>>,
    report: Mutex<WorkerReport>,
}

impl<S: Store, H> Shared<S, H> {
    fn running(&self) -> std::sync::MutexGuard<'_, RunningJobs<S::Id>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn count(&self, outcome: &Outcome) {
        let mut report = self.report.lock().unwrap_or_else(PoisonError::into_inner);
        *report.outcomes.entry(outcome.label()).or_insert(0) += 1;
    }
}

/// Writes a job's execution log through the store under its lease.
struct StoreLogSink<S: Store> {
    store: Arc<S>,
    lease: Lease<S::Id>,
}

#[async_trait]
impl<S: Store> LogSink for StoreLogSink<S> {
    async fn append(&self, entry: LogEntry) -> Result<WriteResult, StoreError> {
        self.store.append_log(&self.lease, entry).await
    }
}

/// Runs jobs from a store through a handler.
///
/// Each round the worker waits for a free handler slot, asks the
/// PreDequeue hook, claims up to that many jobs, runs PreHandle for each,
/// then runs Handle and PostHandle concurrently, recording each outcome in
/// the store. A heartbeat loop keeps running jobs alive and delivers
/// cancellations. See [`Worker::run`] for shutdown.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use async_trait::async_trait;
/// use queue_core::{CancellationToken, Handler, Job, JobContext, JobError, NewJob};
/// use queue_store_memory::MemoryStore;
/// use queue_worker::{Worker, WorkerOptions};
///
/// struct Print;
///
/// #[async_trait]
/// impl Handler<MemoryStore> for Print {
///     async fn handle(&self, _: &JobContext, _: &mut MemoryStore, job: &Job) -> Result<(), JobError> {
///         println!("job {} says {}", job.id, job.payload);
///         Ok(())
///     }
/// }
///
/// let store = MemoryStore::new();
/// store.enqueue(NewJob::new("print", serde_json::json!("hello")));
/// let shutdown = CancellationToken::new();
/// let worker = Worker::new(store.clone(), Print, WorkerOptions::default()).unwrap();
/// let running = tokio::spawn(worker.run(shutdown.clone()));
/// while store.get(1).unwrap().state != queue_core::JobState::Completed {
///     tokio::time::sleep(std::time::Duration::from_millis(5)).await;
/// }
/// shutdown.cancel();
/// let report = running.await.unwrap().unwrap();
/// assert_eq!(report.count("completed"), 1);
/// # }
/// ```
pub struct Worker<S: Store, H> {
    shared: Arc<Shared<S, H>>,
}

impl<S: Store, H: Handler<S>> Worker<S, H> {
    /// A worker over `store` running `handler`; fails if an option is out of
    /// range.
    pub fn new(
        store: impl Into<Arc<S>>,
        handler: H,
        options: WorkerOptions,
    ) -> Result<Self, WorkerError> {
        options.validate()?;
        Ok(Worker {
            shared: Arc::new(Shared {
                store: store.into(),
                run_slots: Arc::new(Semaphore::new(options.num_handlers)),
                waiting: std::sync::atomic::AtomicUsize::new(0),
                job_finished: tokio::sync::Notify::new(),
                retry_due: Arc::new(tokio::sync::Notify::new()),
                name: Arc::from(options.name.as_str()),
                handler,
                options,
                running: Mutex::new(HashMap::new()),
                report: Mutex::new(WorkerReport::default()),
            }),
        })
    }

    /// Runs until `shutdown` is cancelled, then shuts down gracefully: stops
    /// claiming, lets in-flight jobs run for up to `shutdown_timeout`, then
    /// asks the rest to stop, abandons them after `cancel_grace` and hands
    /// them back to the queue, so nothing is lost.
    ///
    /// Transient store errors are logged and retried after `poll_interval`;
    /// a permanent one (such as a misconfigured store) stops the worker with
    /// an error.
    pub async fn run(self, shutdown: CancellationToken) -> Result<WorkerReport, WorkerError> {
        let shared = self.shared;
        let heartbeat_stop = CancellationToken::new();
        let heartbeats = tokio::spawn(heartbeat_loop(shared.clone(), heartbeat_stop.clone()));
        let mut tasks = JoinSet::new();
        let result = claim_loop(&shared, &mut tasks, &shutdown).await;
        drain(&shared, &mut tasks).await;
        heartbeat_stop.cancel();
        let _ = heartbeats.await;
        result?;
        let report = shared
            .report
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        Ok(report)
    }
}

/// The rest of a started job, from the wait for a handler on: run in a task
/// with other jobs of its claim.
pub(super) type JobFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Runs PreHandle (before the next claim, so a budget sees the headroom it
/// took) and returns the rest of the job, or `None` if it ended already (an
/// undecodable record).
async fn start_job<S: Store, H: Handler<S>>(
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
    let shared = shared.clone();
    shared.waiting.fetch_add(1, Ordering::AcqRel);
    Some(Box::pin(
        async move {
            let job = JobRun {
                ctx,
                control,
                lease,
                record,
                job_store,
                pre_handle_panic: pre_handle,
                claim_slot: permit,
            };
            run_job(&shared, job).await;
        }
        .instrument(span),
    ))
}

/// A claimed job on its way through the worker.
struct JobRun<S: Store> {
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
async fn run_job<S: Store, H: Handler<S>>(shared: &Shared<S, H>, job: JobRun<S>) {
    let JobRun {
        ctx,
        control,
        lease,
        record,
        mut job_store,
        pre_handle_panic,
        claim_slot,
    } = job;
    let options = &shared.options;
    let kind = record.kind().to_owned();
    // A prefetched job waits here for a handler; a stop request (shutdown,
    // cancel, deletion) ends the wait.
    let run_slot = tokio::select! {
        biased;
        slot = shared.run_slots.clone().acquire_owned() => slot.ok(),
        _ = control.token.cancelled() => None,
    };
    shared.waiting.fetch_sub(1, Ordering::AcqRel);
    metrics::job_started(&kind);
    let started = Instant::now();
    let end = match (run_slot.is_some(), pre_handle_panic) {
        (false, _) => stopped(control.reason()),
        (true, Some(panic)) => AttemptEnd::Panicked(format!("in PreHandle: {panic}")),
        (true, None) => {
            control.started.store(true, Ordering::Release);
            match handle(shared, &ctx, &control, &mut job_store, &record).await {
                // Started: handing it back would start it again.
                AttemptEnd::Released if lease.limits.at_most_once => {
                    AttemptEnd::Errored(queue_core::JobError::poison(AT_MOST_ONCE_SHUTDOWN_MESSAGE))
                }
                // The store's fault, not the handler's: not charged.
                AttemptEnd::Errored(error) => {
                    let cut_off = match shared.store.attempt_cut_off(&mut job_store).await {
                        Some(why) => Some(why),
                        None => store_unavailable(&error),
                    };
                    match cut_off {
                        Some(why) => {
                            tracing::warn!(id = %lease.id, handler_error = %error, "{why}; the job is handed back without counting a failure");
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
    let ends_transaction = shared.store.finish_ends_transaction(&job_store);
    let run_slot = run_slot.filter(|_| ends_transaction);
    drop(claim_slot);
    if !matches!(end, AttemptEnd::Succeeded) {
        // Let anything the handler spawned with the token stop too.
        control.token.cancel();
    }
    let outcome = options.outcome_policy.decide_for(
        end,
        lease.attempt,
        lease.limits,
        options.clock.now(),
        fastrand::f64(),
    );
    let outcome = without_uncounted_retry(outcome, shared.store.counts_failures());
    let outcome = record_outcome(shared, job_store, &lease, outcome, ends_transaction).await;
    drop(run_slot);
    if let Outcome::Retried { retry_at, .. } = &outcome {
        wake_when_due(shared, *retry_at);
    }
    shared.running().remove(&lease.id);
    metrics::job_finished(&kind, &outcome, duration);
    shared.count(&outcome);
    tracing::debug!(outcome = outcome.label(), ?duration, "job finished");
    if let Err(panic) = AssertUnwindSafe(shared.handler.post_handle(&ctx, &record, &outcome))
        .catch_unwind()
        .await
    {
        tracing::error!(panic = %panic_message(&panic), "PostHandle hook panicked");
    }
    shared.job_finished.notify_one();
}

/// Runs Handle under the timeout, the cancellation grace and panic capture.
async fn handle<S: Store, H: Handler<S>>(
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
fn store_unavailable(error: &queue_core::JobError) -> Option<String> {
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
fn stopped(reason: Option<StopReason>) -> AttemptEnd {
    match reason {
        Some(StopReason::Canceled) | None => AttemptEnd::Canceled("canceled while running".into()),
        Some(StopReason::Lost) => AttemptEnd::Lost,
        Some(StopReason::Shutdown) => AttemptEnd::Released,
    }
}

/// Ends an idle claim loop's wait when a retry comes due within the poll
/// interval, so a quick retry does not wait for the backstop poll.
fn wake_when_due<S: Store, H>(shared: &Shared<S, H>, retry_at: chrono::DateTime<chrono::Utc>) {
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
fn without_uncounted_retry(outcome: Outcome, store_counts_failures: bool) -> Outcome {
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
const FINISH_RETRIES_FOR: Duration = Duration::from_secs(3);
const FINISH_RETRY_FIRST: Duration = Duration::from_millis(50);
const FINISH_RETRY_MOST: Duration = Duration::from_secs(1);

/// Writes the outcome's transition; a stale write turns it into `Lost`. A
/// write that fails retryably (the connection was lost) is tried again for
/// a few seconds, outside any job transaction: a completion whose
/// transaction the handler wrote in (`ends_transaction`) is lost with that
/// transaction, so it is retried as a hand-back (`Interrupted`; an
/// at-most-once job fails). Only then is the job left to the resetter.
async fn record_outcome<S: Store, H>(
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

/// Heartbeats running jobs and stops those cancelled or gone.
async fn heartbeat_loop<S: Store, H>(shared: Arc<Shared<S, H>>, stop: CancellationToken) {
    let mut ticks = tokio::time::interval(shared.options.heartbeat_interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.cancelled() => return,
        }
        let leases: Vec<Lease<S::Id>> = shared
            .running()
            .values()
            .map(|(lease, _)| lease.clone())
            .collect();
        if leases.is_empty() {
            continue;
        }
        let now = shared.options.clock.now();
        match shared.store.heartbeat(&leases, now).await {
            Ok(report) => {
                let running = shared.running();
                for (ids, reason) in [
                    (&report.cancel_requested, StopReason::Canceled),
                    (&report.gone, StopReason::Lost),
                ] {
                    for id in ids {
                        if let Some((_, control)) = running.get(id) {
                            tracing::info!(%id, ?reason, "stopping job");
                            control.stop(reason);
                        }
                    }
                }
            }
            Err(error) => {
                tracing::warn!(error = %error.chain(), jobs = leases.len(), "heartbeat failed; retrying next interval")
            }
        }
    }
}

/// Graceful shutdown of the jobs still running.
async fn drain<S: Store, H>(shared: &Shared<S, H>, tasks: &mut JoinSet<()>) {
    // Prefetched jobs that never started go back at once.
    for (_, control) in shared.running().values() {
        if !control.started.load(Ordering::Acquire) {
            control.stop(StopReason::Shutdown);
        }
    }
    let timeout = shared.options.shutdown_timeout;
    let jobs = shared.running().len();
    if jobs > 0 {
        tracing::info!(jobs, ?timeout, "waiting for in-flight jobs");
    }
    let finished = tokio::time::timeout(timeout, join_all(tasks)).await;
    if finished.is_err() {
        let running: Vec<Arc<JobControl>> = shared
            .running()
            .values()
            .map(|(_, control)| control.clone())
            .collect();
        tracing::warn!(
            jobs = running.len(),
            "jobs still running at the shutdown timeout; asking them to stop and handing them back"
        );
        for control in running {
            control.stop(StopReason::Shutdown);
        }
        join_all(tasks).await;
    }
}

async fn join_all(tasks: &mut JoinSet<()>) {
    while let Some(result) = tasks.join_next().await {
        log_task_failure(result);
    }
}

fn reap(tasks: &mut JoinSet<()>) {
    while let Some(result) = tasks.try_join_next() {
        log_task_failure(result);
    }
}

fn log_task_failure(result: Result<(), tokio::task::JoinError>) {
    if let Err(error) = result {
        tracing::error!(%error, "a task of jobs failed outside the handler");
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "a non-string panic payload".to_owned()
    }
}
