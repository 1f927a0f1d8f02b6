//! Wake-up latency: from an enqueue's commit to its handler's start on an
//! idle worker, and from a scheduled job's due time to its start.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use async_trait::async_trait;
use queue_core::{CancellationToken, Handler, Job, JobContext, JobError, NewJob};
use queue_store_postgres::{ExecutionMode, JobTable, PgJobTransaction, PgStore};
use queue_worker::{Worker, WorkerOptions};
use sqlx::PgPool;

use super::cluster::fresh_table;
use super::cpu::{CpuPerJob, CpuSample};
use super::quiet;

pub(super) struct Latency {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

pub(super) fn percentiles(mut ms: Vec<f64>) -> Latency {
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() as f64 - 1.0) * q).round() as usize];
    Latency {
        p50: at(0.5),
        p99: at(0.99),
        max: *ms.last().unwrap_or(&0.0),
    }
}

/// Records when each job's handler started.
pub(super) struct Stamp {
    started: Arc<Mutex<BTreeMap<i64, Instant>>>,
}

#[async_trait]
impl Handler<PgStore<Job>> for Stamp {
    async fn handle(
        &self,
        _: &JobContext,
        _: &mut PgJobTransaction,
        job: &Job,
    ) -> Result<(), JobError> {
        let now = Instant::now();
        self.started
            .lock()
            .map_err(|_| JobError::poison("poisoned"))?
            .insert(job.id, now);
        Ok(())
    }
}

/// An idle lease worker (16 handlers, default options) over a fresh table
/// that stamps when each job's handler starts.
pub(super) struct StampingWorker {
    table: JobTable,
    started: Arc<Mutex<BTreeMap<i64, Instant>>>,
    shutdown: CancellationToken,
    running: tokio::task::JoinHandle<Result<queue_worker::WorkerReport, queue_worker::WorkerError>>,
}

impl StampingWorker {
    /// Starts it over a fresh table `name`, and lets it go idle.
    async fn start(pool: &PgPool, name: &str) -> Result<StampingWorker> {
        let table = fresh_table(pool, name).await?;
        quiet::quiesce(pool).await?;
        let store = PgStore::default_table(
            pool.clone(),
            table.store_options().mode(ExecutionMode::Lease),
        )
        .await?;
        let started = Arc::new(Mutex::new(BTreeMap::new()));
        let shutdown = CancellationToken::new();
        let worker = Worker::new(
            store,
            Stamp {
                started: started.clone(),
            },
            WorkerOptions::default().handlers(16),
        )?;
        let running = tokio::spawn(worker.run(shutdown.clone()));
        tokio::time::sleep(Duration::from_millis(500)).await; // idle
        Ok(StampingWorker {
            table,
            started,
            shutdown,
            running,
        })
    }

    /// Waits until `n` jobs started (at most 30 s after this call), stops
    /// the worker and returns when each started.
    async fn finish(self, n: usize) -> Result<BTreeMap<i64, Instant>> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.started.lock().map(|s| s.len()).unwrap_or(0) < n {
            ensure!(
                Instant::now() < deadline,
                "not every job started within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.shutdown.cancel();
        self.running.await??;
        let started = self.started.lock().map(|s| s.clone()).unwrap_or_default();
        Ok(started)
    }
}

/// Milliseconds from each job's `since` to its handler's start.
pub(super) fn waits_ms(
    since: impl Iterator<Item = (i64, Instant)>,
    started: &BTreeMap<i64, Instant>,
) -> Latency {
    let ms = since
        .map(|(id, at)| {
            started
                .get(&id)
                .map(|s| s.saturating_duration_since(at).as_secs_f64() * 1000.0)
                .unwrap_or(f64::INFINITY)
        })
        .collect();
    percentiles(ms)
}

/// The wake scenario's figures: the latencies, and the CPU per job over
/// the scenario, idle polling included.
pub(super) struct Woken {
    pub latency: Latency,
    pub cpu: Option<CpuPerJob>,
}

/// Jobs enqueued one by one every 20 ms (about 50 a second) to an idle
/// worker.
pub(super) async fn wake_latency(pool: &PgPool, n: usize) -> Result<Woken> {
    woken_every(pool, "wake", n, Duration::from_millis(20)).await
}

/// Jobs enqueued one by one [`SPARSE_GAP`] apart: each wakes a worker that
/// has idled for longer than the second its store goes on the paused and
/// limited kinds it read last, as a queue with a job every few seconds
/// does.
pub(super) async fn sparse_wake_latency(pool: &PgPool, n: usize) -> Result<Woken> {
    woken_every(pool, "wake_sparse", n, SPARSE_GAP).await
}

/// The gap between the sparse wake-ups' jobs.
pub(super) const SPARSE_GAP: Duration = Duration::from_millis(1_500);

async fn woken_every(pool: &PgPool, name: &str, n: usize, gap: Duration) -> Result<Woken> {
    let worker = StampingWorker::start(pool, name).await?;
    let cpu0 = CpuSample::now();
    let mut committed = BTreeMap::new();
    let mut ticks = tokio::time::interval(gap);
    for i in 0..n {
        ticks.tick().await;
        let id = worker
            .table
            .enqueue(pool, &NewJob::new("noop", serde_json::json!(i)))
            .await?;
        committed.insert(id, Instant::now());
    }
    let started = worker.finish(n).await?;
    Ok(Woken {
        latency: waits_ms(committed.into_iter(), &started),
        cpu: CpuSample::per_job_since(cpu0, n),
    })
}

/// Jobs scheduled 2 s ahead, 100 ms apart, enqueued together while the
/// worker idles (their inserts notify then, not when they come due): how
/// late each starts after its time. The worker polls every 5 s (the
/// default), so only its wait for the next due job starts them on time.
pub(super) async fn due_latency(pool: &PgPool, n: usize) -> Result<Latency> {
    let worker = StampingWorker::start(pool, "due").await?;
    let (wall, instant) = (chrono::Utc::now(), Instant::now());
    let ahead = |i: usize| Duration::from_millis(2_000 + 100 * i as u64);
    let jobs: Vec<NewJob> = (0..n)
        .map(|i| {
            let due = wall + chrono::TimeDelta::from_std(ahead(i)).unwrap_or_default();
            NewJob::new("noop", serde_json::json!(i)).process_after(due)
        })
        .collect();
    let ids = worker.table.enqueue_many(pool, &jobs).await?;
    let started = worker.finish(n).await?;
    let due = ids
        .into_iter()
        .enumerate()
        .map(|(i, id)| (id, instant + ahead(i)));
    Ok(waits_ms(due, &started))
}
