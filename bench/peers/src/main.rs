//! The peers of `cargo xtask bench --peers`: the same drain and wake-latency
//! scenarios as the project's own, for graphile_worker 0.14 (local queue of
//! 64, 5 ms batched completion), sqlxmq 0.6, apalis-postgres 1.0 and awa 0.6
//! (its queue-storage engine, as its own benchmark adapter runs it), each in
//! a database of its own on the server `DATABASE_URL` names. Every drain
//! verifies that each job ran exactly once.
//!
//! Output, one line per figure: `peer<TAB>scenario<TAB>value<TAB>unit<TAB>note`.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

#[path = "../../cpu.rs"]
mod cpu;
#[path = "../../quiet.rs"]
mod quiet;
use cpu::CpuSample;

const HANDLERS: usize = 16;

/// What the handlers record, for the running scenario.
struct Scenario {
    runs: Vec<AtomicU32>,
    started: Mutex<Vec<Option<Instant>>>,
    total: AtomicUsize,
}

static CURRENT: Mutex<Option<Arc<Scenario>>> = Mutex::new(None);

fn begin_scenario(n: usize) -> Arc<Scenario> {
    let scenario = Arc::new(Scenario {
        runs: (0..n).map(|_| AtomicU32::new(0)).collect(),
        started: Mutex::new(vec![None; n]),
        total: AtomicUsize::new(0),
    });
    *CURRENT.lock().unwrap_or_else(|e| e.into_inner()) = Some(scenario.clone());
    scenario
}

/// Called by every peer's handler with the job's index.
fn record(i: usize) {
    let current = CURRENT.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if let Some(s) = current {
        if let Some(runs) = s.runs.get(i) {
            runs.fetch_add(1, Ordering::Relaxed);
            if let Some(slot) = s
                .started
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_mut(i)
            {
                slot.get_or_insert_with(Instant::now);
            }
            s.total.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn check_exactly_once(peer: &str, s: &Scenario) -> Result<()> {
    check_first_exactly_once(peer, s, s.runs.len())
}

/// [`check_exactly_once`] over jobs `0..n` (a scenario that offers jobs
/// for a while makes room for more than it offers).
fn check_first_exactly_once(peer: &str, s: &Scenario, n: usize) -> Result<()> {
    let wrong: Vec<(usize, u32)> = s
        .runs
        .iter()
        .take(n)
        .enumerate()
        .map(|(i, r)| (i, r.load(Ordering::Relaxed)))
        .filter(|(_, r)| *r != 1)
        .take(5)
        .collect();
    ensure!(
        wrong.is_empty(),
        "{peer}: EXACTLY-ONCE VIOLATED: (job, runs) {wrong:?}"
    );
    Ok(())
}

async fn wait_for_handlers(s: &Scenario, n: usize, limit: Duration) -> Result<()> {
    let started = Instant::now();
    while s.total.load(Ordering::Relaxed) < n {
        ensure!(
            started.elapsed() < limit,
            "only {} of {n} jobs ran within {limit:?}",
            s.total.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Ok(())
}

/// Waits until `pending_sql` counts no unfinished job.
async fn wait_for_completions(pool: &sqlx::PgPool, pending_sql: &str) -> Result<()> {
    let started = Instant::now();
    loop {
        let pending: i64 = sqlx::query_scalar(pending_sql).fetch_one(pool).await?;
        if pending == 0 {
            return Ok(());
        }
        ensure!(
            started.elapsed() < Duration::from_secs(300),
            "{pending} jobs never finished"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn latencies(committed: &[Instant], s: &Scenario) -> (f64, f64, f64) {
    let started = s.started.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut ms: Vec<f64> = committed
        .iter()
        .zip(started)
        .map(|(c, s)| {
            s.map(|s| s.saturating_duration_since(*c).as_secs_f64() * 1000.0)
                .unwrap_or(f64::INFINITY)
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    (
        quantile(&ms, 0.5),
        quantile(&ms, 0.99),
        ms.last().copied().unwrap_or(0.0),
    )
}

/// The `q` quantile of `sorted` (ascending), nearest rank; NaN if empty.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let rank = (sorted.len().max(1) - 1) as f64 * q;
    sorted
        .get(rank.round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}

/// The median of `values`.
fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    quantile(values, 0.5)
}

/// What the wake scenario's load left: when each enqueue committed, and
/// the CPU per job meanwhile (a `cpu_note`), idle polling included.
struct Trickled {
    committed: Vec<Instant>,
    cpu: String,
}

/// The wake scenario's load: `n` jobs enqueued one by one at ~50/s (each
/// committed by `enqueue`), then waits for all handlers.
async fn trickle<F, Fut>(s: &Scenario, n: usize, mut enqueue: F) -> Result<Trickled>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let cpu0 = CpuSample::now();
    let mut committed = Vec::with_capacity(n);
    let mut ticks = tokio::time::interval(Duration::from_millis(20));
    for i in 0..n {
        ticks.tick().await;
        enqueue(i).await?;
        committed.push(Instant::now());
    }
    wait_for_handlers(s, n, Duration::from_secs(60)).await?;
    Ok(Trickled {
        committed,
        cpu: cpu_note(cpu0, n),
    })
}

/// `; CPU/job: ...` since `before`, for a drain's note (empty where `/proc`
/// is not Linux's).
fn cpu_note(before: Option<CpuSample>, jobs: usize) -> String {
    CpuSample::per_job_since(before, jobs)
        .map(|cpu| format!("; {cpu}"))
        .unwrap_or_default()
}

/// One figure, to three decimals (a wake-up's milliseconds need them).
fn report(peer: &str, scenario: &str, value: f64, unit: &str, note: &str) {
    println!("{peer}\t{scenario}\t{value:.3}\t{unit}\t{note}");
}

fn report_wake(peer: &str, trickled: &Trickled, s: &Scenario) {
    let (p50, p99, max) = latencies(&trickled.committed, s);
    let n = trickled.committed.len();
    let note = format!("{n} jobs at ~50/s, idle workers{}", trickled.cpu);
    report(peer, "wake p50", p50, "ms", &note);
    report(peer, "wake p99", p99, "ms", "");
    report(peer, "wake max", max, "ms", "");
}

/// What the project's own drain does between enqueueing and timing, done
/// for every peer alike: `VACUUM ANALYZE` the peer's (fresh) database, so
/// that no autovacuum of the just-inserted jobs runs during the timed drain
/// and the planner knows the table, `CHECKPOINT` so that none falls in it,
/// then let the statistics settle.
async fn settle(pool: &sqlx::PgPool) -> Result<()> {
    sqlx::query("VACUUM ANALYZE").execute(pool).await?;
    sqlx::query("CHECKPOINT").execute(pool).await?;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    Ok(())
}

/// Drops a peer's database once its run is over, so that no autovacuum of
/// its rows runs during the next queue's drain.
async fn drop_database(admin: &sqlx::PgPool, name: &str) -> Result<()> {
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(admin)
        .await?;
    Ok(())
}

/// A fresh database for one peer; returns its URL.
async fn fresh_database(admin: &sqlx::PgPool, url: &str, name: &str) -> Result<String> {
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(admin)
        .await?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(admin)
        .await?;
    // The URL's parameters (its sslmode above all) stay.
    let (base, rest) = url
        .rsplit_once('/')
        .context("DATABASE_URL has no database name")?;
    let query = rest.split_once('?').map(|(_, q)| format!("?{q}"));
    Ok(format!("{base}/{name}{}", query.unwrap_or_default()))
}

mod graphile {
    use super::*;
    use graphile_worker::{
        IntoTaskHandlerResult, JobSpec, LocalQueueConfig, TaskHandler, WorkerContext, WorkerOptions,
    };
    use serde::{Deserialize, Serialize};

    #[derive(Clone, Deserialize, Serialize)]
    pub struct Noop {
        i: usize,
    }

    impl TaskHandler for Noop {
        const IDENTIFIER: &'static str = "noop";

        async fn run(self, _ctx: WorkerContext) -> impl IntoTaskHandlerResult {
            record(self.i);
            Ok::<(), String>(())
        }
    }

    async fn worker(url: &str) -> Result<Arc<graphile_worker::Worker>> {
        worker_with(url, 40).await
    }

    async fn worker_with(url: &str, max_pg_conn: u32) -> Result<Arc<graphile_worker::Worker>> {
        let worker = WorkerOptions::default()
            .concurrency(HANDLERS)
            .schema("graphile_worker")
            .local_queue(LocalQueueConfig::default().with_size(64))
            .complete_job_batch_delay(Duration::from_millis(5))
            .define_job::<Noop>()
            .database_url(url)
            .max_pg_conn(max_pg_conn)
            .init()
            .await?;
        Ok(Arc::new(worker))
    }

    /// Enqueues `jobs` no-op jobs in batches of 5,000.
    async fn enqueue(w: &graphile_worker::Worker, jobs: usize) -> Result<()> {
        let utils = w.create_utils();
        let spec = JobSpec::default();
        let all: Vec<(Noop, &JobSpec)> = (0..jobs).map(|i| (Noop { i }, &spec)).collect();
        for chunk in all.chunks(5000) {
            utils.add_jobs::<Noop>(chunk).await?;
        }
        Ok(())
    }

    /// Runs `w` until the `jobs` of scenario `s` ran and completed, then
    /// stops it; returns how long since `started` the last completion
    /// landed (the shutdown not counted).
    async fn drain(
        w: Arc<graphile_worker::Worker>,
        s: &Scenario,
        pool: &sqlx::PgPool,
        jobs: usize,
        started: Instant,
    ) -> Result<Duration> {
        let running = tokio::spawn({
            let w = w.clone();
            async move { w.run().await }
        });
        wait_for_handlers(s, jobs, Duration::from_secs(600)).await?;
        wait_for_completions(pool, "SELECT count(*) FROM graphile_worker._private_jobs").await?;
        let elapsed = started.elapsed();
        w.request_shutdown();
        let _ = running.await?;
        check_exactly_once("graphile_worker", s)?;
        Ok(elapsed)
    }

    /// How a cold drain treats graphile_worker: what `--cold` measures by
    /// default is the drain as a user first meets it; each field gives it
    /// one thing that can make it faster.
    #[derive(Clone, Copy, Debug, Default)]
    pub struct ColdTreatment {
        /// The draining worker's `init()` (its pool, its schema check) runs
        /// before the clock starts.
        pub init_before_clock: bool,
        /// Its pool's size (`max_pg_conn`); 40 unless given.
        pub max_pg_conn: Option<u32>,
        /// `ANALYZE` of its jobs table before the clock starts, so that the
        /// planner knows the enqueued jobs (this queue's store analyzes a
        /// table without statistics at start-up, inside its clock).
        pub analyze: bool,
    }

    impl ColdTreatment {
        fn describe(&self) -> String {
            format!(
                "init() {} the clock, max_pg_conn {}, {}",
                if self.init_before_clock {
                    "before"
                } else {
                    "inside"
                },
                self.max_pg_conn.unwrap_or(40),
                if self.analyze {
                    "analyzed"
                } else {
                    "no statistics"
                }
            )
        }
    }

    /// The drain in a fresh database: the jobs enqueued by a worker of
    /// their own, then the clock started (by default before the worker
    /// that drains them is built), with no vacuum and no settling.
    pub async fn cold(url: &str, jobs: usize, treatment: ColdTreatment) -> Result<()> {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .connect(url)
            .await?;
        enqueue(&*worker(url).await?, jobs).await?;
        let max_pg_conn = treatment.max_pg_conn.unwrap_or(40);
        if treatment.analyze {
            sqlx::query("ANALYZE graphile_worker._private_jobs")
                .execute(&pool)
                .await?;
        }
        let early = if treatment.init_before_clock {
            Some(worker_with(url, max_pg_conn).await?)
        } else {
            None
        };
        let s = begin_scenario(jobs);
        let started = Instant::now();
        let w = match early {
            Some(w) => w,
            None => worker_with(url, max_pg_conn).await?,
        };
        let elapsed = drain(w, &s, &pool, jobs, started).await?;
        report(
            "graphile_worker",
            "cold drain, 16 handlers",
            jobs as f64 / elapsed.as_secs_f64(),
            "jobs/s",
            &format!("{jobs} jobs, exactly once; local queue 64, 5 ms batched completion; fresh database, no vacuum; {}", treatment.describe()),
        );
        Ok(())
    }

    pub async fn run(url: &str, jobs: usize, wake_jobs: usize) -> Result<()> {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(40)
            .connect(url)
            .await?;
        // Drain.
        let w = worker(url).await?;
        enqueue(&w, jobs).await?;
        settle(&pool).await?;
        let s = begin_scenario(jobs);
        let started = Instant::now();
        let cpu0 = CpuSample::now();
        let elapsed = drain(w, &s, &pool, jobs, started).await?;
        let cpu = cpu_note(cpu0, jobs);
        report(
            "graphile_worker",
            "drain, 16 handlers",
            jobs as f64 / elapsed.as_secs_f64(),
            "jobs/s",
            &format!("{jobs} jobs, exactly once; local queue 64, 5 ms batched completion{cpu}"),
        );
        // Wake latency.
        if wake_jobs == 0 {
            return Ok(());
        }
        quiet::quiesce(&pool).await?;
        let w = worker(url).await?;
        let utils = w.create_utils();
        let s = begin_scenario(wake_jobs);
        let running = tokio::spawn({
            let w = w.clone();
            async move { w.run().await }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        let trickled = trickle(&s, wake_jobs, |i| {
            let utils = &utils;
            async move {
                utils.add_job(Noop { i }, JobSpec::default()).await?;
                Ok(())
            }
        })
        .await?;
        w.request_shutdown();
        let _ = running.await?;
        report_wake("graphile_worker", &trickled, &s);
        Ok(())
    }
}

mod mq {
    use super::*;
    use sqlxmq::{job, CurrentJob, JobRegistry};

    #[job(name = "noop")]
    pub async fn noop(
        mut current: CurrentJob,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync + 'static>> {
        let i: usize = current.json()?.unwrap_or(usize::MAX);
        record(i);
        current.complete().await?;
        Ok(())
    }

    /// sqlxmq ships its schema as migration files in its package; apply them.
    async fn migrate(pool: &sqlx::PgPool) -> Result<()> {
        let dir = sqlxmq_migrations()?;
        let mut files: Vec<_> = std::fs::read_dir(&dir)?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.to_string_lossy().ends_with(".up.sql"))
            .collect();
        files.sort();
        for file in files {
            let sql = std::fs::read_to_string(&file)?;
            sqlx::raw_sql(&sql)
                .execute(pool)
                .await
                .with_context(|| format!("applying {}", file.display()))?;
        }
        Ok(())
    }

    /// The `migrations` folder of the sqlxmq package, found through cargo.
    fn sqlxmq_migrations() -> Result<std::path::PathBuf> {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = std::process::Command::new(cargo)
            .args(["metadata", "--format-version", "1", "--manifest-path"])
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
            .output()?;
        ensure!(out.status.success(), "cargo metadata failed");
        let metadata: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        let manifest = metadata["packages"]
            .as_array()
            .and_then(|ps| ps.iter().find(|p| p["name"] == "sqlxmq"))
            .and_then(|p| p["manifest_path"].as_str())
            .context("sqlxmq is not among the dependencies")?;
        let dir = std::path::Path::new(manifest).with_file_name("migrations");
        ensure!(dir.is_dir(), "{} is missing", dir.display());
        Ok(dir)
    }

    const PENDING: &str =
        "SELECT count(*) FROM mq_msgs WHERE id <> '00000000-0000-0000-0000-000000000000'";

    async fn start(pool: &sqlx::PgPool) -> Result<sqlxmq::JobRunnerHandle> {
        let mut runner = JobRegistry::new(&[noop]).runner(pool);
        runner.set_concurrency(HANDLERS / 2, HANDLERS);
        Ok(runner.run().await?)
    }

    async fn spawn_all(pool: &sqlx::PgPool, from: usize, to: usize) -> Result<()> {
        // sqlxmq enqueues one job per statement; 16 at a time.
        let mut next = from;
        while next < to {
            let end = (next + 16).min(to);
            let batch = (next..end).map(|i| {
                let pool = pool.clone();
                async move {
                    noop.builder().set_json(&i)?.spawn(&pool).await?;
                    Ok::<(), anyhow::Error>(())
                }
            });
            for r in futures::future::join_all(batch).await {
                r?;
            }
            next = end;
        }
        Ok(())
    }

    pub async fn run(url: &str, jobs: usize, wake_jobs: usize) -> Result<()> {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(40)
            .connect(url)
            .await?;
        migrate(&pool).await?;
        spawn_all(&pool, 0, jobs).await?;
        settle(&pool).await?;
        let s = begin_scenario(jobs);
        let started = Instant::now();
        let cpu0 = CpuSample::now();
        let handle = start(&pool).await?;
        wait_for_handlers(&s, jobs, Duration::from_secs(600)).await?;
        wait_for_completions(&pool, PENDING).await?;
        let elapsed = started.elapsed();
        let cpu = cpu_note(cpu0, jobs);
        let mut handle = handle;
        handle.stop().await;
        check_exactly_once("sqlxmq", &s)?;
        report(
            "sqlxmq",
            "drain, 16 handlers",
            jobs as f64 / elapsed.as_secs_f64(),
            "jobs/s",
            &format!("{jobs} jobs, exactly once{cpu}"),
        );
        if wake_jobs == 0 {
            return Ok(());
        }
        quiet::quiesce(&pool).await?;

        let s = begin_scenario(wake_jobs);
        let handle = start(&pool).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let trickled = trickle(&s, wake_jobs, |i| {
            let pool = &pool;
            async move {
                noop.builder().set_json(&i)?.spawn(pool).await?;
                Ok(())
            }
        })
        .await?;
        let mut handle = handle;
        handle.stop().await;
        report_wake("sqlxmq", &trickled, &s);
        Ok(())
    }
}

mod apalis_pg {
    use super::*;
    use apalis::prelude::*;
    use apalis_postgres::{Config, PostgresStorage};
    use futures::stream;

    async fn handler(i: usize) -> Result<(), BoxDynError> {
        record(i);
        Ok(())
    }

    const PENDING: &str = "SELECT count(*) FROM apalis.jobs WHERE done_at IS NULL";

    async fn run_worker(
        pool: &apalis_postgres::PgPool,
        stop: tokio::sync::oneshot::Receiver<()>,
    ) -> Result<()> {
        let backend = PostgresStorage::new(pool)
            .with_config(Config::default().queue("bench"))
            .with_pubsub();
        let worker = WorkerBuilder::new("bench")
            .backend(backend)
            .concurrency(HANDLERS)
            .build(handler);
        worker
            .run_until(async move {
                let _ = stop.await;
                Ok::<(), std::io::Error>(())
            })
            .await
            .map_err(|e| anyhow::anyhow!("apalis worker: {e}"))
    }

    pub async fn run(url: &str, jobs: usize, wake_jobs: usize) -> Result<()> {
        let pool = apalis_postgres::PgPool::connect(url).await?;
        PostgresStorage::setup(&pool).await?;
        let checker = sqlx::PgPool::connect(url).await?;
        let mut backend = PostgresStorage::new(&pool).with_config(Config::default().queue("bench"));
        for start in (0..jobs).step_by(5000) {
            let end = (start + 5000).min(jobs);
            let mut items = stream::iter((start..end).map(|i| TaskBuilder::new(i).build()));
            backend.push_all(&mut items).await?;
        }
        settle(&checker).await?;
        let s = begin_scenario(jobs);
        let started = Instant::now();
        let cpu0 = CpuSample::now();
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let running = tokio::spawn({
            let pool = pool.clone();
            async move { run_worker(&pool, stopped).await }
        });
        wait_for_handlers(&s, jobs, Duration::from_secs(900)).await?;
        wait_for_completions(&checker, PENDING).await?;
        let elapsed = started.elapsed();
        let cpu = cpu_note(cpu0, jobs);
        let _ = stop.send(());
        let _ = running.await?;
        check_exactly_once("apalis", &s)?;
        report(
            "apalis",
            "drain, 16 handlers",
            jobs as f64 / elapsed.as_secs_f64(),
            "jobs/s",
            &format!("{jobs} jobs, exactly once; pubsub{cpu}"),
        );
        if wake_jobs == 0 {
            return Ok(());
        }
        quiet::quiesce(&checker).await?;

        let s = begin_scenario(wake_jobs);
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let running = tokio::spawn({
            let pool = pool.clone();
            async move { run_worker(&pool, stopped).await }
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        let trickled = trickle(&s, wake_jobs, |i| {
            let mut backend = backend.clone();
            async move {
                let mut one = stream::iter([TaskBuilder::new(i).build()]);
                backend.push_all(&mut one).await?;
                Ok(())
            }
        })
        .await?;
        let _ = stop.send(());
        let _ = running.await?;
        report_wake("apalis", &trickled, &s);
        Ok(())
    }
}

mod awa {
    use super::*;
    use awa_model::{insert, migrations, InsertOpts, JobArgs, QueueStorage, QueueStorageConfig};
    use awa_worker::{Client, JobContext, JobError, JobResult, QueueConfig, TransitionWorkerRole};
    use serde::{Deserialize, Serialize};

    const QUEUE: &str = "bench";

    /// How long each job works (sleeps) after it started: none but in the
    /// overload scenario.
    static WORK_MICROS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

    #[derive(Serialize, Deserialize)]
    pub struct Noop {
        i: usize,
    }

    impl JobArgs for Noop {
        fn kind() -> &'static str {
            "noop"
        }
    }

    /// One way of running awa's worker; the drain tries each and keeps the
    /// fastest (`--awa-sweep` tries more). Everything else is awa's
    /// default: one claimer, claims of up to 512 jobs, claim receipts on.
    /// A first sweep also tried 4 claimers (slower at every size), claim
    /// batches of 128 (no faster) and no receipts (no faster, and only in a
    /// schema of its own); docs/benchmarks.md, "awa", has its figures.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Setup {
        /// Handlers (`QueueConfig::max_workers`).
        pub workers: u32,
        /// Connections in the client's pool.
        pub connections: u32,
        /// How often the lease ring rotates: 50 ms in the cross-queue
        /// adapter, 1 s by awa's default.
        pub lease_rotate_ms: u64,
    }

    impl Setup {
        const fn new(workers: u32, connections: u32, lease_rotate_ms: u64) -> Setup {
            Setup {
                workers,
                connections,
                lease_rotate_ms,
            }
        }

        fn describe(&self) -> String {
            format!(
                "{} handlers, pool {}, lease rotation {} ms",
                self.workers, self.connections, self.lease_rotate_ms
            )
        }
    }

    /// Like the cross-queue harness's adapter: 16 handlers (as every queue
    /// here gets), a pool of 20, leases rotated every 50 ms.
    pub const ADAPTER: Setup = Setup::new(16, 20, 50);

    /// The setups the drain tries: the adapter's, and the fastest three
    /// `--awa-sweep` found on a 2-core machine (docs/benchmarks.md, "awa").
    pub const TRIED: [Setup; 4] = [
        ADAPTER,
        Setup::new(256, 40, 1000),
        Setup::new(256, 40, 50),
        Setup::new(1024, 80, 50),
    ];

    /// Every setup `--awa-sweep` measures. awa's drain grows with its
    /// handlers (the cross-queue harness found its peak at 1,024), so the
    /// sweep goes that far.
    pub fn sweep() -> Vec<Setup> {
        let mut all = Vec::new();
        for workers in [16, 64, 256, 512, 1024] {
            for connections in [40, 80] {
                for lease_rotate_ms in [50, 1000] {
                    all.push(Setup::new(workers, connections, lease_rotate_ms));
                }
            }
        }
        all
    }

    /// awa's schema and its queue-storage engine, installed fresh.
    async fn prepare(pool: &sqlx::PgPool) -> Result<QueueStorage> {
        migrations::run(pool).await?;
        let store = QueueStorage::new(QueueStorageConfig::default())?;
        store.install(pool).await?;
        store.reset(pool).await?;
        Ok(store)
    }

    fn client(pool: sqlx::PgPool, setup: &Setup) -> Result<Client> {
        Ok(Client::builder(pool)
            .queue(
                QUEUE,
                QueueConfig {
                    max_workers: setup.workers,
                    poll_interval: Duration::from_millis(50),
                    ..QueueConfig::default()
                },
            )
            // Queue segments rotate every second (the adapter's and awa's
            // default).
            .queue_storage(
                QueueStorageConfig::default(),
                Duration::from_millis(1000),
                Duration::from_millis(setup.lease_rotate_ms),
            )
            .transition_role(TransitionWorkerRole::QueueStorageTarget)
            .register::<Noop, _, _>(|job: Noop, _ctx: &JobContext| {
                record(job.i);
                let work = Duration::from_micros(WORK_MICROS.load(Ordering::Relaxed));
                async move {
                    if !work.is_zero() {
                        tokio::time::sleep(work).await;
                    }
                    Ok::<JobResult, JobError>(JobResult::Completed)
                }
            })
            .build()?)
    }

    fn params(i: usize) -> Result<awa_model::InsertParams> {
        Ok(insert::params_with(
            &Noop { i },
            InsertOpts {
                queue: QUEUE.into(),
                ..Default::default()
            },
        )?)
    }

    /// A fresh database for awa with its schema and queue storage
    /// installed, and a pool of `setup`'s size: the pool, the database's
    /// URL, the storage.
    async fn fresh(
        admin: &sqlx::PgPool,
        url: &str,
        setup: &Setup,
    ) -> Result<(sqlx::PgPool, String, QueueStorage)> {
        let db = fresh_database(admin, url, "peer_awa").await?;
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(setup.connections)
            .connect(&db)
            .await?;
        let store = prepare(&pool).await?;
        Ok((pool, db, store))
    }

    /// awa in a fresh database, quiesced, its client with `setup` started
    /// and idle for half a second: the pool (and the database's URL), the
    /// storage, the client. For the scenarios that offer jobs to a running
    /// worker (wake-up, overload, idle in transaction).
    async fn running(
        admin: &sqlx::PgPool,
        url: &str,
        setup: &Setup,
    ) -> Result<(sqlx::PgPool, String, QueueStorage, Client)> {
        let (pool, db, store) = fresh(admin, url, setup).await?;
        quiet::quiesce(&pool).await?;
        let client = client(pool.clone(), setup)?;
        client.start().await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        Ok((pool, db, store, client))
    }

    /// Enqueues `jobs` jobs in batches of 1,000 (awa binds each job's
    /// columns, and a statement takes at most 65,535 values).
    async fn enqueue(store: &QueueStorage, pool: &sqlx::PgPool, jobs: usize) -> Result<()> {
        for start in (0..jobs).step_by(1000) {
            let batch = (start..(start + 1000).min(jobs))
                .map(params)
                .collect::<Result<Vec<_>>>()?;
            store.enqueue_params_batch(pool, &batch).await?;
        }
        Ok(())
    }

    /// Waits until awa counts `jobs` jobs finished.
    async fn wait_for_terminal(
        store: &QueueStorage,
        pool: &sqlx::PgPool,
        jobs: usize,
    ) -> Result<()> {
        let started = Instant::now();
        loop {
            let counts = store.queue_counts(pool, QUEUE).await?;
            if counts.terminal >= jobs as i64 {
                return Ok(());
            }
            ensure!(
                started.elapsed() < Duration::from_secs(300),
                "awa: only {} of {jobs} jobs finished",
                counts.terminal
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// One prepared drain of `jobs` jobs in a fresh database: enqueued,
    /// settled like every drain here, then timed from the client's start
    /// to the last job counted finished; jobs per second and the CPU note.
    async fn drain(
        admin: &sqlx::PgPool,
        url: &str,
        jobs: usize,
        setup: &Setup,
    ) -> Result<(f64, String)> {
        let (rate, cpu, _) = drain_read(admin, url, jobs, setup, false).await?;
        Ok((rate, cpu))
    }

    /// [`drain`], with `readers`: [`READERS`] readers polling awa's admin
    /// figures beside it (see [`Readers`]); also each read's time, ms.
    async fn drain_read(
        admin: &sqlx::PgPool,
        url: &str,
        jobs: usize,
        setup: &Setup,
        readers: bool,
    ) -> Result<(f64, String, Vec<f64>)> {
        let (pool, db, store) = fresh(admin, url, setup).await?;
        enqueue(&store, &pool, jobs).await?;
        settle(&pool).await?;
        let readers = match readers {
            true => Some(Readers::start(&db).await?),
            false => None,
        };
        let client = client(pool.clone(), setup)?;
        let s = begin_scenario(jobs);
        let started = Instant::now();
        let cpu0 = CpuSample::now();
        client.start().await?;
        wait_for_handlers(&s, jobs, Duration::from_secs(600)).await?;
        wait_for_terminal(&store, &pool, jobs).await?;
        let elapsed = started.elapsed();
        let cpu = cpu_note(cpu0, jobs);
        let reads = match readers {
            Some(readers) => readers.stop().await?,
            None => Vec::new(),
        };
        client.shutdown(Duration::from_secs(5)).await;
        check_exactly_once("awa", &s)?;
        pool.close().await;
        drop_database(admin, "peer_awa").await?;
        Ok((jobs as f64 / elapsed.as_secs_f64(), cpu, reads))
    }

    /// How many readers poll, as in the project's readers scenario.
    const READERS: usize = 8;

    /// Readers of awa's operator figures, as its dashboard reads them
    /// (awa_model::admin, which its web UI's API calls; no HTTP here):
    /// each, every second, the count of jobs by state and a page of 50
    /// failed jobs of the drain's kind, on a pool of its own.
    struct Readers {
        pool: sqlx::PgPool,
        stop: Arc<std::sync::atomic::AtomicBool>,
        tasks: tokio::task::JoinSet<Result<Vec<f64>>>,
    }

    impl Readers {
        async fn start(db: &str) -> Result<Readers> {
            let pool = sqlx::postgres::PgPoolOptions::new()
                .max_connections(READERS as u32)
                .connect(db)
                .await?;
            let filter = awa_model::admin::ListJobsFilter {
                state: Some(awa_model::JobState::Failed),
                kind: Some("noop".into()),
                limit: Some(50),
                ..Default::default()
            };
            // One round first, as the project's readers do.
            awa_model::admin::state_counts(&pool).await?;
            awa_model::admin::list_jobs(&pool, &filter).await?;
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let mut tasks = tokio::task::JoinSet::new();
            for reader in 0..READERS {
                let (pool, filter, stop) = (pool.clone(), filter.clone(), stop.clone());
                tasks.spawn(async move {
                    // Spread over the second, as independent tabs would be.
                    let offset = Duration::from_millis(1000 * reader as u64 / READERS as u64);
                    tokio::time::sleep(offset).await;
                    let mut every = tokio::time::interval(Duration::from_secs(1));
                    let mut times = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        every.tick().await;
                        let began = Instant::now();
                        awa_model::admin::state_counts(&pool).await?;
                        times.push(began.elapsed().as_secs_f64() * 1000.0);
                        let began = Instant::now();
                        awa_model::admin::list_jobs(&pool, &filter).await?;
                        times.push(began.elapsed().as_secs_f64() * 1000.0);
                    }
                    Ok(times)
                });
            }
            Ok(Readers { pool, stop, tasks })
        }

        async fn stop(mut self) -> Result<Vec<f64>> {
            self.stop.store(true, Ordering::Relaxed);
            let mut times = Vec::new();
            while let Some(done) = self.tasks.join_next().await {
                times.extend(done??);
            }
            self.pool.close().await;
            Ok(times)
        }
    }

    /// `--awa-readers`: awa's [`PRESSURE`] drain of `jobs` jobs alone and
    /// beside [`READERS`] readers, alternating for `rounds` rounds; the
    /// medians, and the reads' p50 and p99.
    pub async fn readers(
        admin: &sqlx::PgPool,
        url: &str,
        jobs: usize,
        rounds: usize,
    ) -> Result<()> {
        let (mut alone, mut beside, mut reads) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds.max(1) {
            alone.push(drain(admin, url, jobs, &PRESSURE).await?.0);
            let (rate, _, times) = drain_read(admin, url, jobs, &PRESSURE, true).await?;
            beside.push(rate);
            reads.extend(times);
        }
        reads.sort_by(f64::total_cmp);
        let note = format!(
            "medians of {} alternating rounds of {jobs} jobs, {}",
            rounds.max(1),
            PRESSURE.describe()
        );
        report(
            "awa",
            "readers: drain alone",
            median(&mut alone),
            "jobs/s",
            &note,
        );
        report(
            "awa",
            "readers: drain beside 8 readers",
            median(&mut beside),
            "jobs/s",
            &format!(
                "each reader reads the counts by state and a page of failed jobs every second: {} reads, p50 {:.1} ms, p99 {:.1} ms",
                reads.len(),
                quantile(&reads, 0.5),
                quantile(&reads, 0.99)
            ),
        );
        Ok(())
    }

    /// `--awa-sweep`: every setup of [`sweep`], one drain each.
    pub async fn run_sweep(admin: &sqlx::PgPool, url: &str, jobs: usize) -> Result<()> {
        for setup in sweep() {
            let (rate, cpu) = drain(admin, url, jobs, &setup).await?;
            report(
                "awa",
                "sweep drain",
                rate,
                "jobs/s",
                &format!("{}{cpu}", setup.describe()),
            );
        }
        Ok(())
    }

    /// How awa meets the pressure scenarios: the setup of its best steady
    /// drain (the adapter's 16 handlers drain about 1,500 jobs/s, below the
    /// 2,000 the faster idle-in-transaction run offers).
    pub const PRESSURE: Setup = Setup::new(256, 40, 1000);

    /// The phases of the idle-in-transaction scenario: clean, the snapshot
    /// held, after it.
    pub struct IdlePhases {
        pub rate: u32,
        pub clean: Duration,
        pub idle: Duration,
        pub after: Duration,
    }

    /// `--awa-idle`: the project's idle-in-transaction scenario
    /// (xtask/src/bench/pressure.rs) on awa. Jobs are offered at a steady
    /// rate (at each 10 ms tick, whatever is due, in one batch) to awa's
    /// [`PRESSURE`] setup; through the middle phase another session of the
    /// same database holds a snapshot (`REPEATABLE READ`, idle), so vacuum
    /// removes no row that died after it. Writes `out`: a first line `#
    /// dead_rows table_bytes index_bytes` (awa's schema, as the session
    /// ended), then a line per job, `offered_us<TAB>started_us` (`-` if it
    /// never started) from the run's start; the offer is stamped when its
    /// batch committed, the start when the handler ran.
    pub async fn idle_in_transaction(
        admin: &sqlx::PgPool,
        url: &str,
        phases: &IdlePhases,
        out: &std::path::Path,
    ) -> Result<()> {
        let (idle_from, idle_to) = (phases.clean, phases.clean + phases.idle);
        let end = idle_to + phases.after;
        let rate = f64::from(phases.rate);
        let most = (rate * end.as_secs_f64()).ceil() as usize + 1;
        let s = begin_scenario(most);
        let (pool, db, store, client) = running(admin, url, &PRESSURE).await?;
        let mut offer = Offer::new(rate, most);
        let mut idle_session: Option<sqlx::PgConnection> = None;
        let mut bloat = None;
        let mut ticks = ticks();
        loop {
            ticks.tick().await;
            let now = offer.elapsed();
            if now >= end {
                break;
            }
            if now >= idle_from && now < idle_to && idle_session.is_none() {
                use sqlx::Connection;
                let mut conn = sqlx::PgConnection::connect(&db).await?;
                sqlx::raw_sql(
                    "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pg_class",
                )
                .execute(&mut conn)
                .await?;
                idle_session = Some(conn);
            }
            if now >= idle_to {
                if let Some(mut conn) = idle_session.take() {
                    use sqlx::Connection;
                    bloat = Some(schema_bloat(&pool).await?);
                    sqlx::raw_sql("COMMIT").execute(&mut conn).await?;
                    conn.close().await?;
                }
            }
            offer.top_up(&store, &pool).await?;
        }
        let (t0, offered) = (offer.t0, offer.offered);
        let n = offered.len();
        let waited = wait_for_handlers(&s, n, Duration::from_secs(120)).await;
        client.shutdown(Duration::from_secs(5)).await;
        waited?;
        check_first_exactly_once("awa", &s, n)?;
        let (dead, table, indexes) = bloat.context("the idle session never ended")?;
        let started = s.started.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut text = format!("# {dead} {table} {indexes}\n");
        for (i, at) in offered.iter().enumerate() {
            let start = started.get(i).copied().flatten().map_or_else(
                || "-".to_owned(),
                |t| t.saturating_duration_since(t0).as_micros().to_string(),
            );
            text.push_str(&format!("{}\t{start}\n", at.as_micros()));
        }
        std::fs::write(out, text).with_context(|| format!("writing {}", out.display()))?;
        pool.close().await;
        drop_database(admin, "peer_awa").await
    }

    /// Offers jobs at a rate that may change: at each tick, whatever is due
    /// by then, in batches of 1,000 (so a slow enqueue is made up at the
    /// next tick), each job's offer stamped when its batch committed; at
    /// most `most` jobs. The project's pressure scenarios offer the same
    /// way (xtask/src/bench/pressure.rs).
    struct Offer {
        t0: Instant,
        /// Jobs due when the current rate was set, and when that was.
        base: (f64, Duration),
        rate: f64,
        most: usize,
        offered: Vec<Duration>,
    }

    impl Offer {
        fn new(rate: f64, most: usize) -> Offer {
            Offer {
                t0: Instant::now(),
                base: (0.0, Duration::ZERO),
                rate,
                most,
                offered: Vec::with_capacity(most),
            }
        }

        fn elapsed(&self) -> Duration {
            self.t0.elapsed()
        }

        fn due_at(&self, t: Duration) -> f64 {
            self.base.0 + t.saturating_sub(self.base.1).as_secs_f64() * self.rate
        }

        fn set_rate(&mut self, rate: f64) {
            let now = self.elapsed();
            self.base = (self.due_at(now), now);
            self.rate = rate;
        }

        async fn top_up(&mut self, store: &QueueStorage, pool: &sqlx::PgPool) -> Result<()> {
            let due = (self.due_at(self.elapsed()) as usize).min(self.most);
            let sent = self.offered.len();
            if due > sent {
                for start in (sent..due).step_by(1000) {
                    let batch = (start..(start + 1000).min(due))
                        .map(params)
                        .collect::<Result<Vec<_>>>()?;
                    store.enqueue_params_batch(pool, &batch).await?;
                }
                let at = self.elapsed();
                self.offered.resize(due, at);
            }
            Ok(())
        }
    }

    /// A 10 ms tick that waits after a late one instead of bursting.
    fn ticks() -> tokio::time::Interval {
        let mut ticks = tokio::time::interval(Duration::from_millis(10));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks
    }

    /// The overload scenario's sizes (xtask/src/bench/pressure.rs).
    pub struct OverloadSizes {
        pub work: Duration,
        pub peak_jobs: usize,
        pub over: Duration,
        pub settle: Duration,
    }

    /// The rate offered once the overload ends, as a share of the peak.
    const NORMAL_SHARE: f64 = 0.25;

    /// `--awa-overload`: the project's overload scenario on awa, with the
    /// adapter's 16 handlers, as the scenario has (each job works `work`,
    /// so the handlers set the peak). The clean peak: `peak_jobs` enqueued
    /// at once and drained. Then twice the peak is offered for `over`, then
    /// a quarter of it until the backlog is gone (no more jobs waiting than
    /// the handlers hold), then pickups at that rate for `settle`.
    pub async fn overload(admin: &sqlx::PgPool, url: &str, sizes: &OverloadSizes) -> Result<()> {
        WORK_MICROS.store(
            u64::try_from(sizes.work.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        let (pool, _, store, client) = running(admin, url, &ADAPTER).await?;
        let s = begin_scenario(sizes.peak_jobs);
        let began = Instant::now();
        enqueue(&store, &pool, sizes.peak_jobs).await?;
        wait_for_handlers(&s, sizes.peak_jobs, Duration::from_secs(600)).await?;
        let peak = sizes.peak_jobs as f64 / began.elapsed().as_secs_f64();
        tokio::time::sleep(sizes.work * 4).await;
        check_exactly_once("awa", &s)?;

        let limit = sizes.over * 20 + Duration::from_secs(60);
        let most = (peak
            * (2.0 * sizes.over.as_secs_f64()
                + NORMAL_SHARE * (limit + sizes.settle).as_secs_f64()))
        .ceil() as usize
            + 1;
        let s = begin_scenario(most);
        let started = || s.total.load(Ordering::Relaxed);
        let mut offer = Offer::new(2.0 * peak, most);
        let mut ticks = ticks();
        while offer.elapsed() < sizes.over {
            ticks.tick().await;
            offer.top_up(&store, &pool).await?;
        }
        let over_at = offer.elapsed();
        let started_at_over = started();
        let backlog = offer.offered.len().saturating_sub(started_at_over);
        offer.set_rate(NORMAL_SHARE * peak);
        let deadline = Instant::now() + limit;
        loop {
            ticks.tick().await;
            offer.top_up(&store, &pool).await?;
            if offer.offered.len() <= started() + ADAPTER.workers as usize {
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "awa: the backlog of {backlog} jobs was not gone {limit:?} after the overload"
            );
        }
        let gone_at = offer.elapsed();
        let started_at_gone = started();
        while offer.elapsed() < gone_at + sizes.settle {
            ticks.tick().await;
            offer.top_up(&store, &pool).await?;
        }
        let (t0, offered) = (offer.t0, offer.offered);
        let waited = wait_for_handlers(&s, offered.len(), Duration::from_secs(120)).await;
        client.shutdown(Duration::from_secs(5)).await;
        waited?;
        check_first_exactly_once("awa", &s, offered.len())?;
        let starts = s.started.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut settled: Vec<f64> = offered
            .iter()
            .zip(&starts)
            .filter(|(at, _)| **at >= gone_at && **at < gone_at + sizes.settle)
            .map(|(at, start)| {
                start.map_or(f64::INFINITY, |t| {
                    t.saturating_duration_since(t0)
                        .saturating_sub(*at)
                        .as_secs_f64()
                        * 1000.0
                })
            })
            .collect();
        settled.sort_by(f64::total_cmp);
        let drained_in = gone_at.saturating_sub(over_at);
        let during = started_at_over as f64 / over_at.as_secs_f64();
        let draining = (started_at_gone - started_at_over) as f64 / drained_in.as_secs_f64();
        report(
            "awa",
            "overload: clean peak",
            peak,
            "jobs/s",
            &format!(
                "{} handlers, {} ms of work each, {} jobs drained",
                ADAPTER.workers,
                sizes.work.as_millis(),
                sizes.peak_jobs
            ),
        );
        report(
            "awa",
            "overload: started while twice the peak was offered",
            during,
            "jobs/s",
            &format!("for {} s", sizes.over.as_secs()),
        );
        report(
            "awa",
            "overload: backlog drain",
            draining,
            "jobs/s",
            &format!(
                "a backlog of {backlog} drained in {:.1} s, with a quarter of the peak offered",
                drained_in.as_secs_f64()
            ),
        );
        report(
            "awa",
            "overload: pickup p50 once the backlog is gone",
            quantile(&settled, 0.5),
            "ms",
            "",
        );
        report(
            "awa",
            "overload: pickup p99 once the backlog is gone",
            quantile(&settled, 0.99),
            "ms",
            &format!(
                "{} jobs over {} s at a quarter of the peak",
                settled.len(),
                sizes.settle.as_secs()
            ),
        );
        WORK_MICROS.store(0, Ordering::Relaxed);
        pool.close().await;
        drop_database(admin, "peer_awa").await
    }

    /// Dead rows, table bytes and index bytes of awa's schema.
    async fn schema_bloat(pool: &sqlx::PgPool) -> Result<(i64, i64, i64)> {
        Ok(sqlx::query_as(
            "SELECT coalesce(sum(n_dead_tup), 0)::int8, \
             coalesce(sum(pg_table_size(relid)), 0)::int8, \
             coalesce(sum(pg_indexes_size(relid)), 0)::int8 \
             FROM pg_stat_user_tables WHERE schemaname = 'awa'",
        )
        .fetch_one(pool)
        .await?)
    }

    pub async fn run(admin: &sqlx::PgPool, url: &str, jobs: usize, wake_jobs: usize) -> Result<()> {
        // The drain: each tried setup once; the adapter's figure is the one
        // with 16 handlers like every peer, the best is awa's best.
        let mut best: Option<(f64, Setup)> = None;
        for setup in TRIED {
            let (rate, cpu) = drain(admin, url, jobs, &setup).await?;
            report(
                "awa",
                &format!("drain: {}", setup.describe()),
                rate,
                "jobs/s",
                &format!("{jobs} jobs, exactly once; queue storage{cpu}"),
            );
            if setup == ADAPTER {
                report(
                    "awa",
                    "drain, 16 handlers",
                    rate,
                    "jobs/s",
                    &format!("{jobs} jobs, exactly once; the cross-queue adapter's setup{cpu}"),
                );
            }
            if best.is_none_or(|(b, _)| rate > b) {
                best = Some((rate, setup));
            }
        }
        if let Some((rate, setup)) = best {
            report(
                "awa",
                "best drain",
                rate,
                "jobs/s",
                &format!("{jobs} jobs; {}", setup.describe()),
            );
        }
        if wake_jobs == 0 {
            return Ok(());
        }
        // Wake latency, with the adapter's setup.
        let s = begin_scenario(wake_jobs);
        let (pool, _, store, client) = running(admin, url, &ADAPTER).await?;
        let trickled = trickle(&s, wake_jobs, |i| {
            let (store, pool) = (&store, &pool);
            async move {
                store.enqueue_params_batch(pool, &[params(i)?]).await?;
                Ok(())
            }
        })
        .await?;
        client.shutdown(Duration::from_secs(5)).await;
        report_wake("awa", &trickled, &s);
        pool.close().await;
        drop_database(admin, "peer_awa").await
    }
}

/// The peer job queues' drains and wake-ups, on the server DATABASE_URL names.
#[derive(clap::Parser)]
struct Args {
    /// Jobs per drain.
    #[arg(long, default_value_t = 20_000)]
    jobs: usize,
    /// Jobs of the wake scenario (0: drains only).
    #[arg(long, default_value_t = 500)]
    wake_jobs: usize,
    /// One peer only: graphile_worker, sqlxmq, apalis or awa.
    #[arg(long)]
    only: Option<String>,
    /// awa's drain under every setup of its sweep, to find its best.
    #[arg(long)]
    awa_sweep: bool,
    /// graphile_worker's cold drain alone.
    #[arg(long)]
    cold: bool,
    /// With `--cold`: graphile_worker's `init()` before the clock starts.
    #[arg(long)]
    init_before_clock: bool,
    /// With `--cold`: graphile_worker's pool size (40 by default).
    #[arg(long)]
    max_pg_conn: Option<u32>,
    /// With `--cold`: `ANALYZE` graphile_worker's jobs before the clock.
    #[arg(long)]
    analyze: bool,
    /// awa in the idle-in-transaction scenario, this many jobs a second
    /// offered; with `--clean`, `--idle`, `--after` (seconds) and
    /// `--timeline` (the file it writes).
    #[arg(long, requires = "timeline")]
    awa_idle: Option<u32>,
    /// The clean phase of `--awa-idle`, in seconds.
    #[arg(long, default_value_t = 60)]
    clean: u64,
    /// How long `--awa-idle`'s session holds its snapshot, in seconds.
    #[arg(long, default_value_t = 600)]
    idle: u64,
    /// The phase after the session ended, in seconds.
    #[arg(long, default_value_t = 60)]
    after: u64,
    /// Where `--awa-idle` writes each job's offer and start.
    #[arg(long)]
    timeline: Option<std::path::PathBuf>,
    /// awa in the overload scenario: each job works this many ms; with
    /// `--peak-jobs`, `--over` and `--settle`.
    #[arg(long)]
    awa_overload: Option<u64>,
    /// The backlog whose drain measures `--awa-overload`'s clean peak.
    #[arg(long, default_value_t = 30_000)]
    peak_jobs: usize,
    /// How long `--awa-overload` offers twice the peak, in seconds.
    #[arg(long, default_value_t = 300)]
    over: u64,
    /// How long pickups are measured once the backlog is gone, in seconds.
    #[arg(long, default_value_t = 30)]
    settle: u64,
    /// awa's drain of `--jobs` jobs alone and beside 8 readers, this many
    /// alternating rounds.
    #[arg(long)]
    awa_readers: Option<usize>,
}

#[tokio::main]
async fn main() -> Result<()> {
    let Args {
        jobs,
        wake_jobs,
        only,
        cold,
        init_before_clock,
        max_pg_conn,
        analyze,
        awa_sweep,
        awa_idle,
        clean,
        idle,
        after,
        timeline,
        awa_overload,
        peak_jobs,
        over,
        settle,
        awa_readers,
    } = clap::Parser::parse();
    let url = std::env::var("DATABASE_URL").context("DATABASE_URL must name the server")?;
    let admin = sqlx::PgPool::connect(&url).await?;
    if let (Some(rate), Some(out)) = (awa_idle, timeline) {
        eprintln!("peers: awa, idle in transaction, {rate} jobs/s");
        let phases = awa::IdlePhases {
            rate,
            clean: Duration::from_secs(clean),
            idle: Duration::from_secs(idle),
            after: Duration::from_secs(after),
        };
        return awa::idle_in_transaction(&admin, &url, &phases, &out).await;
    }
    if let Some(work_ms) = awa_overload {
        eprintln!("peers: awa, overload");
        let sizes = awa::OverloadSizes {
            work: Duration::from_millis(work_ms),
            peak_jobs,
            over: Duration::from_secs(over),
            settle: Duration::from_secs(settle),
        };
        return awa::overload(&admin, &url, &sizes).await;
    }
    if let Some(rounds) = awa_readers {
        eprintln!("peers: awa, readers");
        return awa::readers(&admin, &url, jobs, rounds).await;
    }
    if cold {
        let db = fresh_database(&admin, &url, "peer_graphile_cold").await?;
        eprintln!("peers: graphile_worker, cold");
        let treatment = graphile::ColdTreatment {
            init_before_clock,
            max_pg_conn,
            analyze,
        };
        graphile::cold(&db, jobs, treatment).await?;
        return drop_database(&admin, "peer_graphile_cold").await;
    }
    if awa_sweep {
        eprintln!("peers: awa, sweep");
        return awa::run_sweep(&admin, &url, jobs).await;
    }
    let wanted = |peer: &str| only.as_deref().is_none_or(|o| o == peer);
    if wanted("graphile_worker") {
        let db = fresh_database(&admin, &url, "peer_graphile").await?;
        eprintln!("peers: graphile_worker");
        graphile::run(&db, jobs, wake_jobs).await?;
        drop_database(&admin, "peer_graphile").await?;
    }
    if wanted("sqlxmq") {
        let db = fresh_database(&admin, &url, "peer_sqlxmq").await?;
        eprintln!("peers: sqlxmq");
        mq::run(&db, jobs, wake_jobs).await?;
        drop_database(&admin, "peer_sqlxmq").await?;
    }
    if wanted("apalis") {
        let db = fresh_database(&admin, &url, "peer_apalis").await?;
        eprintln!("peers: apalis");
        apalis_pg::run(&db, jobs, wake_jobs).await?;
        drop_database(&admin, "peer_apalis").await?;
    }
    if wanted("awa") {
        eprintln!("peers: awa");
        awa::run(&admin, &url, jobs, wake_jobs).await?;
    }
    Ok(())
}
