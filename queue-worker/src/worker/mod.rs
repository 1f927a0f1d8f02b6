//! [`Worker`]: claims jobs from a store and runs them through a handler,
//! N at a time, with heartbeats, cancellation, timeouts, panic isolation and
//! graceful shutdown.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use queue_core::{CancellationToken, Handler, Outcome, Store};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::error::WorkerError;

mod claiming;
mod heartbeat;
mod job;
mod options;
mod report;

use claiming::claim_loop;
use heartbeat::heartbeat_loop;
use job::{start_job, JobControl, JobFuture, RunningJobs, StopReason};

pub use self::options::{default_worker_name, WorkerOptions, AT_MOST_ONCE_SHUTDOWN_MESSAGE};
pub use self::report::WorkerReport;

/// What the worker loop and its job tasks share.
struct Shared<S: Store, H> {
    store: Arc<S>,
    handler: H,
    options: WorkerOptions,
    /// One permit per handler: held while a handler runs.
    run_slots: Arc<Semaphore>,
    /// One permit per job whose handler is done and whose outcome is on
    /// its way to the store ([`WorkerOptions::max_outcomes_in_flight`]).
    outcome_slots: Arc<Semaphore>,
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
    /// The metric handles of each kind it ran.
    metrics: crate::metrics::Metrics,
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
                outcome_slots: Arc::new(Semaphore::new(options.max_outcomes_in_flight)),
                waiting: std::sync::atomic::AtomicUsize::new(0),
                job_finished: tokio::sync::Notify::new(),
                retry_due: Arc::new(tokio::sync::Notify::new()),
                name: Arc::from(options.name.as_str()),
                handler,
                options,
                running: Mutex::new(HashMap::new()),
                report: Mutex::new(WorkerReport::default()),
                metrics: crate::metrics::Metrics::default(),
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
