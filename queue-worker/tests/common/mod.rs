//! Helpers shared by the worker tests.

#![allow(dead_code)]

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use queue_core::{
    CancellationToken, ClaimParams, Claimed, Handler, HeartbeatReport, Job, JobState, Lease,
    LogEntry, ResetParams, ResetReport, Store, StoreError, Transition, WriteResult,
};
use queue_store_memory::{MemoryCondition, MemoryStore};
use queue_worker::{Worker, WorkerOptions, WorkerReport};
use tokio::task::JoinHandle;

/// Options with short intervals so tests run fast.
pub fn fast_options() -> WorkerOptions {
    WorkerOptions {
        poll_interval: Duration::from_millis(20),
        heartbeat_interval: Duration::from_millis(20),
        cancel_grace: Duration::from_millis(200),
        shutdown_timeout: Duration::from_secs(5),
        ..WorkerOptions::default()
    }
}

/// A running worker and the token that stops it.
pub struct Running {
    pub shutdown: CancellationToken,
    pub task: JoinHandle<Result<WorkerReport, queue_worker::WorkerError>>,
}

impl Running {
    /// Shuts the worker down and returns its report.
    pub async fn stop(self) -> WorkerReport {
        self.shutdown.cancel();
        self.task
            .await
            .expect("worker task panicked")
            .expect("worker failed")
    }
}

/// Starts a worker over `store` with `handler`.
pub fn start<H: Handler<MemoryStore>>(
    store: &MemoryStore,
    handler: H,
    options: WorkerOptions,
) -> Running {
    let worker = Worker::new(store.clone(), handler, options).expect("valid options");
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(worker.run(shutdown.clone()));
    Running { shutdown, task }
}

/// Waits until `condition` holds, failing the test after 10 s.
pub async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !condition().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until job `id` is in `state`.
pub async fn wait_for_state(store: &MemoryStore, id: i64, state: JobState) {
    eventually(&format!("job {id} is {state}"), || async {
        store.get(id).map(|j| j.state) == Some(state)
    })
    .await;
}

/// The memory store with claims that take `claim_delay`, counting how many
/// are in flight at once; `deaf`, it never signals new jobs (like a table whose
/// updates notify nobody), so only the poll interval ends a wait. Each
/// finish takes `finish_delay` and then adds `finished {id}` to `events`;
/// `ends_transaction`, the store says its finishes end the handler's
/// transaction, as the transactional Postgres store does.
#[derive(Clone)]
pub struct Slowed {
    pub inner: MemoryStore,
    pub claim_delay: Duration,
    pub in_flight: Arc<AtomicUsize>,
    pub most_in_flight: Arc<AtomicUsize>,
    pub deaf: bool,
    pub finish_delay: Duration,
    pub ends_transaction: bool,
    pub events: Arc<Mutex<Vec<String>>>,
    /// The next this many claims fail as if the connection died.
    pub failing_claims: Arc<AtomicUsize>,
    /// The next this many finishes (first or again) fail as if the
    /// connection died, writing nothing.
    pub failing_finishes: Arc<AtomicUsize>,
    /// The next this many attempts whose handler fails are cut off by the
    /// store (as a connection lost under the handler would).
    pub cut_offs: Arc<AtomicUsize>,
    /// Claims sent so far.
    pub claims: Arc<AtomicUsize>,
    /// How long a heartbeat takes to reach the store (as on a busy
    /// server): the leases it asks about are read when it arrives.
    pub heartbeat_delay: Duration,
    /// Heartbeats add `heartbeat asked about {id} {token}` for each lease
    /// and `heartbeat found {id} gone` to `events`.
    pub heartbeats_recorded: bool,
    /// How long a finish's answer takes to come back after its write
    /// landed.
    pub finish_answer_delay: Duration,
}

/// Takes one from `counter` if it is above zero.
fn take_one(counter: &AtomicUsize) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

fn connection_died(context: &str) -> StoreError {
    StoreError::Unavailable {
        context: context.into(),
        source: "server closed the connection unexpectedly".into(),
    }
}

impl Slowed {
    pub fn new(inner: MemoryStore, claim_delay: Duration) -> Self {
        Slowed {
            inner,
            claim_delay,
            in_flight: Arc::default(),
            most_in_flight: Arc::default(),
            deaf: false,
            finish_delay: Duration::ZERO,
            ends_transaction: false,
            events: Arc::default(),
            failing_claims: Arc::default(),
            failing_finishes: Arc::default(),
            cut_offs: Arc::default(),
            claims: Arc::default(),
            heartbeat_delay: Duration::ZERO,
            heartbeats_recorded: false,
            finish_answer_delay: Duration::ZERO,
        }
    }

    /// Adds `event` to the store's events.
    pub fn record(&self, event: String) {
        self.events.lock().unwrap().push(event);
    }
}

#[async_trait]
impl Store for Slowed {
    type Id = i64;
    type Record = Job;
    type Conditions = MemoryCondition;
    type JobStore = MemoryStore;

    async fn claim(
        &self,
        params: ClaimParams<'_, MemoryCondition>,
    ) -> Result<Vec<Claimed<Self>>, StoreError> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        if take_one(&self.failing_claims) {
            self.record("claim failed".into());
            return Err(connection_died("claiming jobs"));
        }
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_in_flight.fetch_max(now, Ordering::SeqCst);
        // The rows are claimed at once; the answer takes `claim_delay` to
        // arrive, like a round trip.
        let claimed = self.inner.claim(params).await;
        tokio::time::sleep(self.claim_delay).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        Ok(claimed?
            .into_iter()
            .map(|c| Claimed {
                lease: c.lease,
                record: c.record,
                job_store: c.job_store,
            })
            .collect())
    }

    async fn finish(
        &self,
        job_store: MemoryStore,
        lease: &Lease<i64>,
        transition: Transition,
        now: DateTime<Utc>,
    ) -> Result<WriteResult, StoreError> {
        tokio::time::sleep(self.finish_delay).await;
        if take_one(&self.failing_finishes) {
            self.record(format!("finish failed {}", lease.id));
            return Err(connection_died("committing a job's transaction"));
        }
        let written = self.inner.finish(job_store, lease, transition, now).await;
        self.record(format!("finished {}", lease.id));
        if !self.finish_answer_delay.is_zero() {
            tokio::time::sleep(self.finish_answer_delay).await;
            self.record(format!("answered {}", lease.id));
        }
        written
    }

    async fn finish_again(
        &self,
        lease: &Lease<i64>,
        transition: Transition,
        now: DateTime<Utc>,
    ) -> Result<WriteResult, StoreError> {
        if take_one(&self.failing_finishes) {
            self.record(format!("finish failed {}", lease.id));
            return Err(connection_died("recording job outcomes"));
        }
        self.record(format!("finished again {} {transition:?}", lease.id));
        self.inner.finish_again(lease, transition, now).await
    }

    async fn attempt_cut_off(&self, _: &mut MemoryStore) -> Option<String> {
        take_one(&self.cut_offs).then(|| "the job's connection to the database failed".to_owned())
    }

    fn finish_ends_transaction(&self, _: &MemoryStore) -> bool {
        self.ends_transaction
    }

    async fn heartbeat(
        &self,
        leases: &[Lease<i64>],
        now: DateTime<Utc>,
    ) -> Result<HeartbeatReport<i64>, StoreError> {
        tokio::time::sleep(self.heartbeat_delay).await;
        let report = self.inner.heartbeat(leases, now).await?;
        if self.heartbeats_recorded {
            for lease in leases {
                self.record(format!(
                    "heartbeat asked about {} {}",
                    lease.id, lease.token
                ));
            }
            for id in &report.gone {
                self.record(format!("heartbeat found {id} gone"));
            }
        }
        Ok(report)
    }

    async fn append_log(
        &self,
        lease: &Lease<i64>,
        entry: LogEntry,
    ) -> Result<WriteResult, StoreError> {
        self.inner.append_log(lease, entry).await
    }

    async fn reset_stalled(&self, params: ResetParams) -> Result<ResetReport<i64>, StoreError> {
        self.inner.reset_stalled(params).await
    }

    async fn wait_for_jobs(&self, max_wait: Duration) {
        if self.deaf {
            tokio::time::sleep(max_wait).await
        } else {
            self.inner.wait_for_jobs(max_wait).await
        }
    }
}
