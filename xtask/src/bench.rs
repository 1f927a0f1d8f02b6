//! `cargo xtask bench [--quick] [--peers] [--only S,..]`: measures the queue, a physical
//! ceiling (pgbench) and, with `--peers`, other Rust job queues, in one run
//! on the same Postgres, and prints one table of figures and ratios. The
//! full run also writes it to `docs/benchmarks.md`. Figures are printed,
//! never asserted, except correctness: every drain verifies that each job
//! ran exactly once and fails loudly otherwise.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use async_trait::async_trait;
use queue_core::{
    CancellationToken, ClaimParams, Handler, Job, JobContext, JobError, NewJob, Retention, Store,
    UniqueScope,
};
use queue_store_postgres::{CompletedJobs, ExecutionMode, JobTable, PgJobStore, PgStore};
use queue_worker::{Pruner, PrunerOptions, Worker, WorkerOptions};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::pg::{ClusterOptions, Postgres};

#[path = "../../bench/cpu.rs"]
mod cpu;
mod http_enqueue;
#[path = "../../bench/quiet.rs"]
mod quiet;
use cpu::{CpuPerJob, CpuSample};

/// How big each scenario is.
struct Sizes {
    drain_jobs: usize,
    pgbench_seconds: u32,
    wake_jobs: usize,
    memory_jobs: usize,
    growth_rows: [u64; 3],
    /// Jobs scheduled a day ahead in the scheduled scenario.
    scheduled_rows: u64,
    /// Old finished jobs in the table of the retention scenario's drains.
    retention_rows: u64,
    /// Jobs scheduled ahead in the wake scenario's due-time measurement.
    due_jobs: usize,
    single_enqueues: usize,
    /// Jobs per round of the HTTP enqueue scenario, each way.
    http_enqueues: usize,
    /// Rounds of the alternating scenarios (ceiling with drains, and the
    /// head-to-head with graphile_worker).
    rounds: usize,
}

const FULL: Sizes = Sizes {
    drain_jobs: 100_000,
    pgbench_seconds: 10,
    wake_jobs: 500,
    memory_jobs: 10_000,
    growth_rows: [0, 1_000_000, 10_000_000],
    scheduled_rows: 200_000,
    retention_rows: 1_000_000,
    due_jobs: 20,
    single_enqueues: 5_000,
    http_enqueues: 16_000,
    rounds: 5,
};

const QUICK: Sizes = Sizes {
    drain_jobs: 2_000,
    pgbench_seconds: 2,
    wake_jobs: 40,
    memory_jobs: 200,
    growth_rows: [0, 10_000, 50_000],
    scheduled_rows: 5_000,
    retention_rows: 20_000,
    due_jobs: 3,
    single_enqueues: 500,
    http_enqueues: 800,
    rounds: 1,
};

/// One line of the results table.
struct Row {
    section: &'static str,
    what: String,
    value: f64,
    unit: &'static str,
    note: String,
}

#[derive(Default)]
struct Results {
    rows: Vec<Row>,
}

impl Results {
    fn add(
        &mut self,
        section: &'static str,
        what: impl Into<String>,
        value: f64,
        unit: &'static str,
        note: impl Into<String>,
    ) {
        let row = Row {
            section,
            what: what.into(),
            value,
            unit,
            note: note.into(),
        };
        println!(
            "  {:<11} {:<48} {:>12.1} {:<6} {}",
            row.section, row.what, row.value, row.unit, row.note
        );
        self.rows.push(row);
    }

    fn get(&self, what: &str) -> Option<f64> {
        self.rows.iter().find(|r| r.what == what).map(|r| r.value)
    }
}

/// The scenarios `--only` can pick, in the order they run.
const SCENARIOS: [&str; 11] = [
    "ceiling",
    "drain-lease",
    "drain-transactional",
    "retention",
    "alternating",
    "enqueue",
    "wake",
    "memory",
    "growth",
    "scheduled",
    "peers",
];

const USAGE: &str = "usage: cargo xtask bench [--quick] [--peers] [--only SCENARIO,...]\n\
                     scenarios (a prefix picks all that start with it): ceiling, drain-lease, \
                     drain-transactional, retention, alternating, enqueue, wake, memory, growth, scheduled, peers";

/// Which scenarios run: all of them (peers only with `--peers`), or those
/// `--only` names.
struct Selection {
    only: Option<Vec<String>>,
    peers: bool,
}

impl Selection {
    fn runs(&self, scenario: &str) -> bool {
        match &self.only {
            Some(only) => only.iter().any(|o| scenario.starts_with(o.as_str())),
            None => scenario != "peers" || self.peers,
        }
    }
}

/// The run the arguments ask for; `None` for `--help`.
fn parse_args(args: &[String]) -> Result<Option<(bool, Selection)>> {
    let mut quick = false;
    let mut selection = Selection {
        only: None,
        peers: false,
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--peers" => selection.peers = true,
            "--only" => {
                let list = args
                    .next()
                    .with_context(|| format!("--only needs a list\n{USAGE}"))?;
                let names: Vec<String> = list.split(',').map(|s| s.trim().to_owned()).collect();
                for name in &names {
                    ensure!(
                        !name.is_empty() && SCENARIOS.iter().any(|s| s.starts_with(name.as_str())),
                        "--only: no scenario starts with {name:?}\n{USAGE}"
                    );
                }
                selection.only = Some(names);
            }
            "--help" | "-h" => return Ok(None),
            other => bail!("unknown flag {other}\n{USAGE}"),
        }
    }
    Ok(Some((quick, selection)))
}

pub async fn run(args: &[String]) -> Result<()> {
    let Some((quick, selection)) = parse_args(args)? else {
        println!("{USAGE}");
        return Ok(());
    };
    let sizes = if quick { &QUICK } else { &FULL };
    let pg = Postgres::start(ClusterOptions { durable: true }).await?;
    let pool = PgPoolOptions::new()
        .test_before_acquire(false)
        .max_connections(100)
        .connect(&pg.url)
        .await
        .context("connecting to Postgres")?;
    let machine = machine(&pool, &pg).await?;
    println!("{machine}");
    warm_up(&pool, sizes).await?;
    let mut results = Results::default();

    if selection.runs("ceiling") {
        let ceiling = pgbench(&pg, sizes.pgbench_seconds).await?;
        results.add(
            "ceiling",
            "pgbench single-row UPDATE, 8 clients",
            ceiling,
            "tps",
            format!("{} s", sizes.pgbench_seconds),
        );
    }

    for (setup, handlers, scenario, what) in [
        (LEASE, 16, "drain-lease", "lease, 16 handlers"),
        (LEASE, 64, "drain-lease", "lease, 64 handlers"),
        (LEASE_DELETING, 16, "drain-lease", DELETING_LEASE),
        (
            TRANSACTIONAL,
            16,
            "drain-transactional",
            "transactional, 16 handlers",
        ),
        (
            TRANSACTIONAL,
            64,
            "drain-transactional",
            "transactional, 64 handlers",
        ),
        (
            TRANSACTIONAL_RIDING,
            64,
            "drain-transactional",
            "transactional, 64 handlers, lock rides (1 ms)",
        ),
    ] {
        if !selection.runs(scenario) {
            continue;
        }
        let drained = drain(&pool, setup, handlers, sizes.drain_jobs).await?;
        let cpu = drained.cpu.map(|c| format!("; {c}")).unwrap_or_default();
        results.add(
            "drain",
            what,
            drained.jobs_per_second,
            "jobs/s",
            format!(
                "{} jobs, exactly once; {:.0} WAL bytes/job, {:.2} commits/job{cpu}",
                sizes.drain_jobs, drained.wal_bytes_per_job, drained.commits_per_job
            ),
        );
    }

    if selection.runs("retention") {
        let old = sizes.retention_rows;
        let mut rates = Vec::new();
        for (pruning, what) in [
            (false, "lease, 16 handlers, old finished jobs kept"),
            (
                true,
                "lease, 16 handlers, old finished jobs pruned meanwhile",
            ),
        ] {
            let setup = StoreSetup {
                old_finished: old,
                pruning,
                ..LEASE
            };
            let drained = drain(&pool, setup, 16, sizes.drain_jobs).await?;
            rates.push(drained.jobs_per_second);
            let pruned = drained
                .pruned
                .map(|(n, secs)| format!("; the pruner removed {} in {secs:.1} s", thousands(n)))
                .unwrap_or_default();
            results.add(
                "retention",
                what,
                drained.jobs_per_second,
                "jobs/s",
                format!(
                    "{} jobs beside {} completed 40 days ago{pruned}",
                    sizes.drain_jobs,
                    thousands(old)
                ),
            );
        }
        results.add(
            "retention",
            "drain while pruning / drain without",
            rates[1] / rates[0],
            "x",
            "same table shape, same run",
        );
    }

    if selection.runs("alternating") {
        alternating(&pg, &pool, sizes, &mut results).await?;
    }

    if selection.runs("enqueue") {
        let rates = enqueue(&pool, sizes.single_enqueues, sizes.drain_jobs).await?;
        results.add(
            "enqueue",
            "single inserts (one transaction each)",
            rates.single,
            "jobs/s",
            format!("{} jobs", sizes.single_enqueues),
        );
        results.add(
            "enqueue",
            "batch inserts (5,000 per statement)",
            rates.batch,
            "jobs/s",
            format!("{} jobs", sizes.drain_jobs),
        );
        results.add(
            "enqueue",
            "unique jobs, single inserts",
            rates.unique_single,
            "jobs/s",
            format!(
                "{} jobs, each key new; {:.2}x plain single inserts",
                sizes.single_enqueues,
                rates.unique_single / rates.single
            ),
        );
        results.add(
            "enqueue",
            "unique jobs, batches of 5,000",
            rates.unique_batch,
            "jobs/s",
            format!(
                "{} jobs, each key new; {:.2}x plain batches",
                sizes.drain_jobs,
                rates.unique_batch / rates.batch
            ),
        );
        let table = fresh_table(&pool, "http_enqueue").await?;
        let rounds = sizes.rounds.min(3);
        let over_http =
            http_enqueue::measure(&pg.url, &pool, &table, sizes.http_enqueues, rounds).await?;
        results.add(
            "enqueue",
            "single inserts, 16 connections",
            over_http.direct,
            "jobs/s",
            format!("{} jobs a round, median of {rounds}", sizes.http_enqueues),
        );
        results.add(
            "enqueue",
            "over HTTP (queue serve), 16 keep-alive clients",
            over_http.http,
            "jobs/s",
            format!(
                "{:.2}x the 16 connections' rate; single-job POSTs",
                over_http.http / over_http.direct
            ),
        );
    }

    if selection.runs("wake") {
        let wake = wake_latency(&pool, sizes.wake_jobs).await?;
        results.add(
            "wake",
            "enqueue commit to handler start, p50",
            wake.p50,
            "ms",
            format!("{} jobs at ~50/s, idle workers", sizes.wake_jobs),
        );
        results.add(
            "wake",
            "enqueue commit to handler start, p99",
            wake.p99,
            "ms",
            "",
        );
        results.add(
            "wake",
            "enqueue commit to handler start, max",
            wake.max,
            "ms",
            "",
        );
        let due = due_latency(&pool, sizes.due_jobs).await?;
        results.add(
            "wake",
            "scheduled 2 s ahead: due time to handler start, p50",
            due.p50,
            "ms",
            format!(
                "{} jobs due 100 ms apart, idle workers, no NOTIFY when due",
                sizes.due_jobs
            ),
        );
        results.add(
            "wake",
            "scheduled 2 s ahead: due time to handler start, max",
            due.max,
            "ms",
            "",
        );
    }

    if selection.runs("memory") {
        let memory = memory(&pg, &pool, sizes.memory_jobs).await?;
        results.add(
            "memory",
            format!("peak RSS, {} in-flight jobs (lease)", sizes.memory_jobs),
            memory.peak_mb,
            "MB",
            format!("idle worker {:.1} MB", memory.idle_mb),
        );
        results.add(
            "memory",
            "RSS per in-flight job",
            (memory.peak_mb - memory.idle_mb) * 1024.0 / sizes.memory_jobs as f64,
            "KB",
            "",
        );
    }

    if selection.runs("growth") {
        for rows in sizes.growth_rows {
            let p50 = claim_latency(&pool, Ahead::Finished(rows)).await?;
            results.add(
                "growth",
                format!("claim p50 with {} finished rows", thousands(rows)),
                p50,
                "ms",
                "",
            );
        }
    }

    if selection.runs("scheduled") {
        let rows = sizes.scheduled_rows;
        let p50 = claim_latency(&pool, Ahead::Scheduled(rows)).await?;
        results.add(
            "scheduled",
            format!(
                "claim p50 with {} jobs scheduled a day ahead",
                thousands(rows)
            ),
            p50,
            "ms",
            "before the due jobs in claim order (priority, then key)",
        );
    }

    if selection.runs("peers") {
        run_peers(&pg, &pool, sizes, &mut results).await?;
    }

    let report = report(&machine, &results, quick, selection.runs("peers"));
    println!("\n{report}");
    if !quick && selection.only.is_none() {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/benchmarks.md");
        std::fs::write(&path, benchmarks_doc(&report))
            .with_context(|| format!("writing {}", path.display()))?;
        println!("written to docs/benchmarks.md");
    }
    pool.close().await;
    drop(pg);
    Ok(())
}

/// One lease drain, not reported, then a checkpoint, so that no measured
/// scenario pays for a fresh cluster's cold caches and its first WAL segment
/// files (a new cluster creates a new file for every 16 MB of WAL until a
/// checkpoint recycles old ones).
async fn warm_up(pool: &PgPool, sizes: &Sizes) -> Result<()> {
    println!("warming up: one lease drain, then a checkpoint");
    drain(pool, LEASE, 16, sizes.drain_jobs).await?;
    sqlx::query("CHECKPOINT").execute(pool).await?;
    Ok(())
}

fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

async fn machine(pool: &PgPool, pg: &Postgres) -> Result<String> {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal"))
                .map(|l| l.to_owned())
        })
        .and_then(|l| {
            l.split_whitespace()
                .nth(1)
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| format!("{:.1} GiB", kb as f64 / 1024.0 / 1024.0))
        .unwrap_or_else(|| "?".into());
    let version: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(pool)
        .await?;
    let mut settings = Vec::new();
    for name in [
        "fsync",
        "synchronous_commit",
        "shared_buffers",
        "max_connections",
        "wal_level",
    ] {
        let value: String = sqlx::query_scalar(&format!("SHOW {name}"))
            .fetch_one(pool)
            .await?;
        settings.push(format!("{name}={value}"));
    }
    Ok(format!(
        "machine: {cores} cores, {memory}; PostgreSQL {version} ({}); {}",
        pg.origin,
        settings.join(", ")
    ))
}

/// pgbench's single-row UPDATE by key at 8 clients: what a design that
/// spends one transaction per job can reach at best.
async fn pgbench(pg: &Postgres, seconds: u32) -> Result<f64> {
    let pgbench = crate::pg::find_tool("pgbench")?;
    let init = tokio::process::Command::new(&pgbench)
        .args(["-i", "-q", "-s", "1", &pg.url])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .await
        .context("running pgbench -i")?;
    ensure!(
        init.status.success(),
        "pgbench -i failed: {}",
        String::from_utf8_lossy(&init.stderr)
    );
    let script = std::env::temp_dir().join(format!("queue-bench-{}.sql", std::process::id()));
    std::fs::write(
        &script,
        "\\set aid random(1, 100000)\nUPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;\n",
    )?;
    let out = tokio::process::Command::new(&pgbench)
        .args(["-n", "-c", "8", "-j", "2", "-T", &seconds.to_string(), "-f"])
        .arg(&script)
        .arg(&pg.url)
        .output()
        .await
        .context("running pgbench")?;
    let _ = std::fs::remove_file(&script);
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "pgbench failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tps = stdout
        .lines()
        .find(|l| l.starts_with("tps = "))
        .and_then(|l| l.trim_start_matches("tps = ").split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .with_context(|| format!("no tps in pgbench's output: {stdout}"))?;
    Ok(tps)
}

async fn fresh_table(pool: &PgPool, name: &str) -> Result<JobTable> {
    let table = JobTable::new("queue_bench", name)?;
    sqlx::query(&format!(
        "DROP TABLE IF EXISTS {} CASCADE",
        table.name().quoted()
    ))
    .execute(pool)
    .await?;
    table.migrate(pool).await?;
    Ok(table)
}

async fn enqueue_all(pool: &PgPool, table: &JobTable, n: usize, kind: &str) -> Result<i64> {
    let mut first = None;
    let jobs: Vec<NewJob> = (0..n)
        .map(|i| NewJob::new(kind, serde_json::json!(i)))
        .collect();
    for chunk in jobs.chunks(5000) {
        let ids = table.enqueue_many(pool, chunk).await?;
        first = first.or(ids.first().copied());
    }
    first.context("no jobs enqueued")
}

/// Counts the runs of each job, to prove exactly-once.
struct Counted {
    first_id: i64,
    runs: Arc<Vec<AtomicU32>>,
    total: Arc<AtomicUsize>,
    /// Open the job's transaction (BEGIN and the row lock), as a handler
    /// that writes in transactional mode does.
    open_transaction: bool,
}

#[async_trait]
impl Handler<PgStore<Job>> for Counted {
    async fn handle(
        &self,
        _: &JobContext,
        store: &mut PgJobStore,
        job: &Job,
    ) -> Result<(), JobError> {
        if self.open_transaction {
            store.transaction().await.map_err(JobError::retry)?;
        }
        let slot = usize::try_from(job.id - self.first_id)
            .map_err(|_| JobError::poison("job id below the first"))?;
        match self.runs.get(slot) {
            Some(runs) => {
                runs.fetch_add(1, Ordering::Relaxed);
                self.total.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            None => Err(JobError::poison("job id beyond the last")),
        }
    }
}

struct Drained {
    jobs_per_second: f64,
    wal_bytes_per_job: f64,
    commits_per_job: f64,
    cpu: Option<CpuPerJob>,
    /// With a pruner running: the rows it removed, and in how many seconds.
    pruned: Option<(u64, f64)>,
}

async fn wal_and_commits(pool: &PgPool) -> Result<(i64, i64)> {
    let wal: i64 = sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::int8")
        .fetch_one(pool)
        .await?;
    let commits: i64 = sqlx::query_scalar(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(pool)
    .await?;
    Ok((wal, commits))
}

/// The worker settings the drains use: both modes claim ahead of their
/// handlers, a local queue of four times their number (64 for 16 handlers,
/// the size the graphile_worker peer runs with). A prefetched job holds no
/// connection in either mode: a job's transaction opens when its handler
/// asks for it.
fn drain_options(handlers: usize) -> WorkerOptions {
    WorkerOptions::default()
        .handlers(handlers)
        .prefetch(4 * handlers)
}

/// How a drain's store is set up.
#[derive(Debug, Clone, Copy)]
struct StoreSetup {
    mode: ExecutionMode,
    completed: CompletedJobs,
    /// Transactional mode: how long job locks may wait to ride on other
    /// jobs' commits (`None`: they never do).
    lock_rides: Option<Duration>,
    /// Completed jobs finished 40 days ago, in the table before the drain.
    old_finished: u64,
    /// Whether a pruner (30 days for completed jobs) runs during the drain.
    pruning: bool,
}

const LEASE: StoreSetup = StoreSetup {
    mode: ExecutionMode::Lease,
    completed: CompletedJobs::Keep,
    lock_rides: None,
    old_finished: 0,
    pruning: false,
};
const LEASE_DELETING: StoreSetup = StoreSetup {
    completed: CompletedJobs::Delete,
    ..LEASE
};
const TRANSACTIONAL: StoreSetup = StoreSetup {
    mode: ExecutionMode::Transactional,
    ..LEASE
};
const TRANSACTIONAL_RIDING: StoreSetup = StoreSetup {
    lock_rides: Some(Duration::from_millis(1)),
    ..TRANSACTIONAL
};

async fn drain(pool: &PgPool, setup: StoreSetup, handlers: usize, n: usize) -> Result<Drained> {
    let StoreSetup {
        mode,
        completed,
        lock_rides,
        old_finished,
        pruning,
    } = setup;
    let table = fresh_table(pool, "drain").await?;
    if old_finished > 0 {
        sqlx::query(&format!(
            "INSERT INTO {} (kind, state, finished_at) SELECT 'old', 'completed', \
             now() - interval '40 days' FROM generate_series(1, {old_finished})",
            table.name().quoted()
        ))
        .execute(pool)
        .await?;
    }
    let first_id = enqueue_all(pool, &table, n, "noop").await?;
    sqlx::query(&format!("VACUUM ANALYZE {}", table.name().quoted()))
        .execute(pool)
        .await?;
    let runs: Arc<Vec<AtomicU32>> = Arc::new((0..n).map(|_| AtomicU32::new(0)).collect());
    let total = Arc::new(AtomicUsize::new(0));
    let store_pool = PgPoolOptions::new()
        .test_before_acquire(false)
        .max_connections(handlers as u32 + 10)
        .connect_with((*pool.connect_options()).clone())
        .await?;
    let store = PgStore::default_table(
        store_pool.clone(),
        table
            .store_options()
            .mode(mode)
            .completed_jobs(completed)
            .lock_rides(lock_rides),
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(1100)).await; // let statistics settle
    let (wal0, commits0) = wal_and_commits(pool).await?;
    let shutdown = CancellationToken::new();
    let worker = Worker::new(
        store.clone(),
        Counted {
            first_id,
            runs: runs.clone(),
            total: total.clone(),
            open_transaction: mode == ExecutionMode::Transactional,
        },
        drain_options(handlers),
    )?;
    let pruner = if pruning {
        let pruner = Pruner::new(
            store.clone(),
            PrunerOptions {
                interval: Duration::from_millis(100),
                retention: Retention {
                    completed: Some(Duration::from_secs(30 * 24 * 3600)),
                    batch: 5_000,
                    ..Retention::default()
                },
                ..PrunerOptions::default()
            },
        )?;
        Some(tokio::spawn(async move {
            let started = Instant::now();
            let mut removed = 0;
            loop {
                let pass = pruner.prune_once().await?;
                removed += pass.total();
                if pass.total() == 0 {
                    return anyhow::Ok((removed, started.elapsed().as_secs_f64()));
                }
            }
        }))
    } else {
        None
    };
    let started = Instant::now();
    let cpu0 = CpuSample::now();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    // Watch the handlers in memory (polling the table would load the server
    // being measured), then wait for the last completions to land.
    while total.load(Ordering::Relaxed) < n {
        ensure!(
            !running.is_finished(),
            "the worker stopped during the drain"
        );
        ensure!(
            started.elapsed() < Duration::from_secs(600),
            "the drain took over 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Every row completed (or deleted, if completed jobs are).
    let pending_sql = format!(
        "SELECT count(*) FROM {} WHERE state <> 'completed'",
        table.name().quoted()
    );
    loop {
        let pending: i64 = sqlx::query_scalar(&pending_sql).fetch_one(pool).await?;
        if pending == 0 {
            break;
        }
        ensure!(
            started.elapsed() < Duration::from_secs(600),
            "completions did not land within 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = started.elapsed();
    let cpu = CpuSample::per_job_since(cpu0, n);
    shutdown.cancel();
    running.await??;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (wal1, commits1) = wal_and_commits(pool).await?;
    let twice: Vec<usize> = runs
        .iter()
        .enumerate()
        .filter(|(_, r)| r.load(Ordering::Relaxed) != 1)
        .map(|(i, _)| i)
        .take(5)
        .collect();
    ensure!(
        twice.is_empty(),
        "EXACTLY-ONCE VIOLATED: jobs at offsets {twice:?} ran other than once"
    );
    let pruned = match pruner {
        Some(pruning) => Some(pruning.await??),
        None => None,
    };
    store_pool.close().await;
    Ok(Drained {
        jobs_per_second: n as f64 / elapsed.as_secs_f64(),
        wal_bytes_per_job: (wal1 - wal0) as f64 / n as f64,
        commits_per_job: (commits1 - commits0) as f64 / n as f64,
        cpu,
        pruned,
    })
}

/// Enqueue rates, jobs/s: plain and with unique keys, one job per
/// statement and in batches of 5,000.
struct EnqueueRates {
    single: f64,
    batch: f64,
    unique_single: f64,
    unique_batch: f64,
}

async fn enqueue(pool: &PgPool, singles: usize, batched: usize) -> Result<EnqueueRates> {
    let table = fresh_table(pool, "enqueue").await?;
    let started = Instant::now();
    for i in 0..singles {
        table
            .enqueue(pool, &NewJob::new("noop", serde_json::json!(i)))
            .await?;
    }
    let single = singles as f64 / started.elapsed().as_secs_f64();
    let started = Instant::now();
    enqueue_all(pool, &table, batched, "noop").await?;
    let batch = batched as f64 / started.elapsed().as_secs_f64();
    // Unique keys, each new (the common case: a key is taken only by a
    // retried enqueue).
    let unique = |i: usize| {
        NewJob::new("noop", serde_json::json!(i)).unique(format!("key:{i}"), UniqueScope::Active)
    };
    let table = fresh_table(pool, "enqueue_unique").await?;
    let started = Instant::now();
    for i in 0..singles {
        table.enqueue_unique(pool, &[unique(i)]).await?;
    }
    let unique_single = singles as f64 / started.elapsed().as_secs_f64();
    let jobs: Vec<NewJob> = (singles..singles + batched).map(unique).collect();
    let started = Instant::now();
    for chunk in jobs.chunks(5000) {
        table.enqueue_unique(pool, chunk).await?;
    }
    let unique_batch = batched as f64 / started.elapsed().as_secs_f64();
    Ok(EnqueueRates {
        single,
        batch,
        unique_single,
        unique_batch,
    })
}

struct Latency {
    p50: f64,
    p99: f64,
    max: f64,
}

fn percentiles(mut ms: Vec<f64>) -> Latency {
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() as f64 - 1.0) * q).round() as usize];
    Latency {
        p50: at(0.5),
        p99: at(0.99),
        max: *ms.last().unwrap_or(&0.0),
    }
}

/// Records when each job's handler started.
struct Stamp {
    started: Arc<Mutex<BTreeMap<i64, Instant>>>,
}

#[async_trait]
impl Handler<PgStore<Job>> for Stamp {
    async fn handle(&self, _: &JobContext, _: &mut PgJobStore, job: &Job) -> Result<(), JobError> {
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
struct StampingWorker {
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

    /// Waits until `n` jobs started (at most 30 s), stops the worker and
    /// returns when each started.
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
fn waits_ms(
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

async fn wake_latency(pool: &PgPool, n: usize) -> Result<Latency> {
    let worker = StampingWorker::start(pool, "wake").await?;
    let mut committed = BTreeMap::new();
    let mut ticks = tokio::time::interval(Duration::from_millis(20));
    for i in 0..n {
        ticks.tick().await;
        let id = worker
            .table
            .enqueue(pool, &NewJob::new("noop", serde_json::json!(i)))
            .await?;
        committed.insert(id, Instant::now());
    }
    let started = worker.finish(n).await?;
    Ok(waits_ms(committed.into_iter(), &started))
}

/// Jobs scheduled 2 s ahead, 100 ms apart, enqueued together while the
/// worker idles (their inserts notify then, not when they come due): how
/// late each starts after its time. The worker polls every 5 s (the
/// default), so only its wait for the next due job starts them on time.
async fn due_latency(pool: &PgPool, n: usize) -> Result<Latency> {
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

struct Memory {
    idle_mb: f64,
    peak_mb: f64,
}

fn status_kb(pid: u32, field: &str) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}

/// Peak RSS of a separate worker process holding `n` in-flight jobs.
async fn memory(pg: &Postgres, pool: &PgPool, n: usize) -> Result<Memory> {
    let table = fresh_table(pool, "memory").await?;
    let exe = std::env::current_exe()?;
    let mut child = tokio::process::Command::new(exe)
        .args(["bench-memory-worker", &n.to_string()])
        .env("DATABASE_URL", &pg.url)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting the memory worker")?;
    let pid = child.id().context("memory worker pid")?;
    let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
    let ready = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await??;
    ensure!(
        ready.as_deref() == Some("ready"),
        "memory worker said {ready:?}"
    );
    let idle_mb = status_kb(pid, "VmRSS:")? / 1024.0;
    enqueue_all(pool, &table, n, "sleep").await?;
    let processing = format!(
        "SELECT count(*) FROM {} WHERE state = 'processing'",
        table.name().quoted()
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while (sqlx::query_scalar::<_, i64>(&processing)
        .fetch_one(pool)
        .await? as usize)
        < n
    {
        ensure!(
            Instant::now() < deadline,
            "the memory worker did not take all jobs"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let peak_mb = status_kb(pid, "VmHWM:")? / 1024.0;
    child.start_kill()?;
    let _ = child.wait().await;
    Ok(Memory { idle_mb, peak_mb })
}

/// Sleeps until cancelled.
struct SleepForever;

#[async_trait]
impl Handler<PgStore<Job>> for SleepForever {
    async fn handle(&self, ctx: &JobContext, _: &mut PgJobStore, _: &Job) -> Result<(), JobError> {
        ctx.cancelled().await;
        Err(JobError::cancel("stopped"))
    }
}

/// The process `memory` measures: a lease-mode worker with `n` handlers.
pub async fn memory_worker(args: &[String]) -> Result<()> {
    let n: usize = args.first().context("bench-memory-worker N")?.parse()?;
    let url = std::env::var("DATABASE_URL").context("DATABASE_URL")?;
    let pool = PgPoolOptions::new()
        .test_before_acquire(false)
        .max_connections(8)
        .connect(&url)
        .await?;
    let table = JobTable::new("queue_bench", "memory")?;
    let store =
        PgStore::default_table(pool, table.store_options().mode(ExecutionMode::Lease)).await?;
    let options = WorkerOptions {
        poll_interval: Duration::from_millis(100),
        claim_batch: Some(500),
        ..WorkerOptions::default().handlers(n)
    };
    let worker = Worker::new(store, SleepForever, options)?;
    println!("ready");
    worker.run(CancellationToken::new()).await?;
    Ok(())
}

/// Rows the claims of [`claim_latency`] find in the table besides the due
/// jobs, inserted before them.
#[derive(Clone, Copy)]
enum Ahead {
    /// Completed jobs.
    Finished(u64),
    /// Queued jobs not due for a day.
    Scheduled(u64),
}

/// Median latency of a one-job claim with the rows of `ahead` in the table.
async fn claim_latency(pool: &PgPool, ahead: Ahead) -> Result<f64> {
    let table = fresh_table(pool, "growth").await?;
    let t = table.name().quoted();
    let (rows, insert) = match ahead {
        Ahead::Finished(rows) => (
            rows,
            format!(
                "INSERT INTO {t} (kind, payload, state, finished_at) \
                 SELECT 'done', '{{}}', 'completed', now() FROM generate_series(1, $1::int8)"
            ),
        ),
        Ahead::Scheduled(rows) => (
            rows,
            format!(
                "INSERT INTO {t} (kind, payload, process_after) \
                 SELECT 'later', '{{}}', now() + interval '1 day' FROM generate_series(1, $1::int8)"
            ),
        ),
    };
    if rows > 0 {
        sqlx::query(&insert).bind(rows as i64).execute(pool).await?;
    }
    enqueue_all(pool, &table, 500, "noop").await?;
    sqlx::query(&format!("VACUUM ANALYZE {}", table.name().quoted()))
        .execute(pool)
        .await?;
    // Every claim from the start of the claim order: with the cursor, the
    // claims of this loop would start after the previous one's job and step
    // over nothing, which is what claims into a backlog do, but not the ones
    // that read from the start (one every 10 ms, and any claim outside a
    // backlog).
    let store = PgStore::default_table(
        pool.clone(),
        table
            .store_options()
            .mode(ExecutionMode::Lease)
            .claim_cursor(None),
    )
    .await?;
    let mut ms = Vec::with_capacity(300);
    for _ in 0..300 {
        let started = Instant::now();
        let claimed = store
            .claim(ClaimParams {
                limit: 1,
                worker: "bench",
                conditions: None,
                now: chrono::Utc::now(),
            })
            .await?;
        ms.push(started.elapsed().as_secs_f64() * 1000.0);
        ensure!(claimed.len() == 1, "the growth table ran out of jobs");
    }
    Ok(percentiles(ms).p50)
}

/// The peer benchmarks' package, built (their own target directory inside
/// the workspace's, reused across runs).
struct Peers {
    cargo: String,
    manifest: PathBuf,
    target: PathBuf,
}

/// One figure a peer run printed.
struct PeerRow {
    peer: String,
    scenario: String,
    value: f64,
    unit: &'static str,
    note: String,
}

impl Peers {
    async fn build() -> Result<Peers> {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let peers = Peers {
            cargo: std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()),
            manifest: root.join("../bench/peers/Cargo.toml"),
            target: root.join("../target/peers"),
        };
        println!("peers: building {}", peers.manifest.display());
        // Offline: with DATABASE_URL set, sqlx's macros in the peers would
        // check their queries against our database instead of the data
        // they ship.
        let build = tokio::process::Command::new(&peers.cargo)
            .args(["build", "--release", "--quiet", "--manifest-path"])
            .arg(&peers.manifest)
            .env("CARGO_TARGET_DIR", &peers.target)
            .env_remove("DATABASE_URL")
            .env("SQLX_OFFLINE", "true")
            .status()
            .await?;
        ensure!(build.success(), "building the peer benchmarks failed");
        Ok(peers)
    }

    /// Runs the peers (`only`: one of them) on `pg`; `wake_jobs` 0 skips
    /// the wake scenario.
    async fn run(
        &self,
        pg: &Postgres,
        jobs: usize,
        wake_jobs: usize,
        only: Option<&str>,
    ) -> Result<Vec<PeerRow>> {
        let mut args = vec![
            "--jobs".to_owned(),
            jobs.to_string(),
            "--wake-jobs".to_owned(),
            wake_jobs.to_string(),
        ];
        if let Some(peer) = only {
            args.extend(["--only".to_owned(), peer.to_owned()]);
        }
        let out = tokio::process::Command::new(self.target.join("release/queue-bench-peers"))
            .args(&args)
            .env("DATABASE_URL", &pg.url)
            .stderr(Stdio::inherit())
            .output()
            .await?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        ensure!(
            out.status.success(),
            "the peer benchmarks failed:\n{stdout}"
        );
        // Lines: `peer<TAB>scenario<TAB>value<TAB>unit<TAB>note`.
        let mut rows = Vec::new();
        for line in stdout.lines() {
            let fields: Vec<&str> = line.split('\t').collect();
            if let [peer, scenario, value, unit, note] = fields[..] {
                rows.push(PeerRow {
                    peer: peer.to_owned(),
                    scenario: scenario.to_owned(),
                    value: value
                        .parse()
                        .with_context(|| format!("bad figure in {line:?}"))?,
                    unit: match unit {
                        "jobs/s" => "jobs/s",
                        "ms" => "ms",
                        _ => "",
                    },
                    note: note.to_owned(),
                });
            }
        }
        Ok(rows)
    }
}

/// Runs the peer benchmarks (a separate cargo package) and adds their rows,
/// then the head-to-head with the fastest of them.
async fn run_peers(
    pg: &Postgres,
    pool: &PgPool,
    sizes: &Sizes,
    results: &mut Results,
) -> Result<()> {
    let peers = Peers::build().await?;
    for row in peers
        .run(pg, sizes.drain_jobs, sizes.wake_jobs, None)
        .await?
    {
        results.add(
            "peer",
            format!("{}: {}", row.peer, row.scenario),
            row.value,
            row.unit,
            row.note,
        );
    }
    head_to_head(&peers, pg, pool, sizes, results).await
}

/// The lease drain (16 handlers) and graphile_worker's, alternating for a
/// few rounds (one in a quick run): the machine's speed drifts by a fifth within minutes, and
/// alternating makes the drift hit both alike. Medians.
async fn head_to_head(
    peers: &Peers,
    pg: &Postgres,
    pool: &PgPool,
    sizes: &Sizes,
    results: &mut Results,
) -> Result<()> {
    let (mut ours, mut ours_deleting, mut theirs) = (Vec::new(), Vec::new(), Vec::new());
    let rounds = sizes.rounds;
    for round in 1..=rounds {
        println!("head-to-head: round {round} of {rounds}");
        let rows = peers
            .run(pg, sizes.drain_jobs, 0, Some("graphile_worker"))
            .await?;
        let peer = rows
            .iter()
            .find(|r| r.scenario == "drain, 16 handlers")
            .context("graphile_worker printed no drain figure")?;
        theirs.push(peer.value);
        for (setup, figures) in [(LEASE, &mut ours), (LEASE_DELETING, &mut ours_deleting)] {
            let drained = drain(pool, setup, 16, sizes.drain_jobs).await?;
            figures.push(drained.jobs_per_second);
        }
    }
    for (what, values) in [
        (HEAD_TO_HEAD_OURS, &ours),
        (HEAD_TO_HEAD_DELETING, &ours_deleting),
        (HEAD_TO_HEAD_PEER, &theirs),
    ] {
        add_median(results, "versus", what, "jobs/s", values);
    }
    Ok(())
}

const HEAD_TO_HEAD_OURS: &str = "lease drain, 16 handlers, alternating with graphile_worker";
const HEAD_TO_HEAD_DELETING: &str =
    "lease drain, 16 handlers, completed jobs deleted, alternating with graphile_worker";
const HEAD_TO_HEAD_PEER: &str = "graphile_worker drain, 16 handlers, alternating";
/// The lease drain with `CompletedJobs::Delete`: what graphile_worker does
/// with a completed job.
const DELETING_LEASE: &str = "lease, 16 handlers, completed jobs deleted";

const ALTERNATING_CEILING: &str = "pgbench ceiling, alternating with the drains";
const ALTERNATING_LEASE: &str = "lease drain, 16 handlers, alternating with the ceiling";
const ALTERNATING_TRANSACTIONAL: &str =
    "transactional drain, 16 handlers, alternating with the ceiling";

/// The ceiling and both drains at 16 handlers, one after the other for a
/// few rounds (one in a quick run), medians: the targets' ratios are taken
/// from these, so that the machine's drift hits the ceiling and the drains
/// alike.
async fn alternating(
    pg: &Postgres,
    pool: &PgPool,
    sizes: &Sizes,
    results: &mut Results,
) -> Result<()> {
    let rounds = sizes.rounds;
    let (mut ceiling, mut lease, mut transactional) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds {
        println!("alternating: round {round} of {rounds}");
        ceiling.push(pgbench(pg, sizes.pgbench_seconds).await?);
        lease.push(
            drain(pool, LEASE, 16, sizes.drain_jobs)
                .await?
                .jobs_per_second,
        );
        transactional.push(
            drain(pool, TRANSACTIONAL, 16, sizes.drain_jobs)
                .await?
                .jobs_per_second,
        );
    }
    for (what, unit, values) in [
        (ALTERNATING_CEILING, "tps", &ceiling),
        (ALTERNATING_LEASE, "jobs/s", &lease),
        (ALTERNATING_TRANSACTIONAL, "jobs/s", &transactional),
    ] {
        add_median(results, "alternate", what, unit, values);
    }
    Ok(())
}

/// A row with the median of rounds' figures, listing them all.
fn add_median(
    results: &mut Results,
    section: &'static str,
    what: &str,
    unit: &'static str,
    values: &[f64],
) {
    results.add(
        section,
        what,
        median(values),
        unit,
        format!("median of {}: {}", values.len(), list(values)),
    );
}

/// Figures as a comma-separated list.
fn list(values: &[f64]) -> String {
    values
        .iter()
        .map(|x| format!("{x:.0}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

fn ratio(results: &Results, a: &str, b: &str) -> Option<f64> {
    Some(results.get(a)? / results.get(b)?)
}

fn report(machine: &str, results: &Results, quick: bool, peers: bool) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{machine}");
    if quick {
        let _ = writeln!(out, "(quick run: tiny sizes, figures are not comparable)");
    }
    let _ = writeln!(
        out,
        "\n| section | measurement | value | unit | notes |\n|---|---|---:|---|---|"
    );
    for r in &results.rows {
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} | {} | {} |",
            r.section, r.what, r.value, r.unit, r.note
        );
    }
    let ceiling = "pgbench single-row UPDATE, 8 clients";
    let _ = writeln!(out, "\n| ratio | value | target |\n|---|---:|---|");
    let mut ratio_row = |name: &str, value: Option<f64>, target: &str| {
        if let Some(v) = value {
            let _ = writeln!(out, "| {name} | {v:.2}× | {target} |");
        }
    };
    ratio_row(
        "lease drain (16) ÷ pgbench ceiling, alternating runs (medians)",
        ratio(results, ALTERNATING_LEASE, ALTERNATING_CEILING),
        "≥ 2×",
    );
    ratio_row(
        "transactional drain (16) ÷ pgbench ceiling, alternating runs (medians)",
        ratio(results, ALTERNATING_TRANSACTIONAL, ALTERNATING_CEILING),
        "≥ 0.5×",
    );
    ratio_row(
        "lease drain (16) ÷ pgbench ceiling, single runs",
        ratio(results, "lease, 16 handlers", ceiling),
        "",
    );
    ratio_row(
        "transactional drain (16) ÷ pgbench ceiling, single runs",
        ratio(results, "transactional, 16 handlers", ceiling),
        "",
    );
    ratio_row(
        "claim p50, largest table ÷ empty table",
        results
            .rows
            .iter()
            .rfind(|r| r.section == "growth")
            .zip(results.rows.iter().find(|r| r.section == "growth"))
            .map(|(last, first)| last.value / first.value),
        "≤ 1.2×",
    );
    if peers {
        ratio_row(
            "lease drain (16) ÷ graphile_worker drain (16), alternating runs (medians)",
            ratio(results, HEAD_TO_HEAD_OURS, HEAD_TO_HEAD_PEER),
            "≥ 2×",
        );
        ratio_row(
            "lease drain (16), completed jobs deleted ÷ graphile_worker drain (16), alternating runs (medians)",
            ratio(results, HEAD_TO_HEAD_DELETING, HEAD_TO_HEAD_PEER),
            "",
        );
        for peer in ["graphile_worker", "sqlxmq", "apalis"] {
            ratio_row(
                &format!("lease drain (16) ÷ {peer} drain (16), single runs"),
                ratio(
                    results,
                    "lease, 16 handlers",
                    &format!("{peer}: drain, 16 handlers"),
                ),
                "",
            );
        }
    }
    out
}

fn benchmarks_doc(report: &str) -> String {
    format!(
        "# Benchmarks\n\n\
         Produced by `cargo xtask bench --peers` (the figures below) on the machine it names; \
         `cargo xtask bench` measures everything but the peers, and `cargo xtask bench --quick` \
         (tiny sizes, run by CI so the program never rots) checks that it still works. \
         All scenarios run against the same throwaway PostgreSQL cluster with default \
         durability (fsync and synchronous_commit on), one after the other.\n\n\
         A fresh cluster is warmed up first: one lease drain, not reported, then a \
         checkpoint.\n\n\
         - **ceiling**: pgbench, single-row `UPDATE` by key, 8 clients: the best a design that \
         spends one transaction per job can do.\n\
         - **drain**: 100,000 no-op jobs enqueued in batches, then drained by one worker process; \
         every job is checked to have run exactly once. Both modes run with `prefetch` = 4 × \
         handlers (a local queue of 64 at 16 handlers, the size the graphile_worker peer runs \
         with), two claims in flight (the default), the default 2 ms completion delay and a \
         pool of handlers + 10 connections; in transactional mode each handler opens its job's transaction (`BEGIN` and the \
         `FOR KEY SHARE` row lock, then the completion and `COMMIT`: what a handler that writes \
         pays). WAL bytes and commits per job come from `pg_current_wal_lsn()` and \
         `pg_stat_database`; CPU per job from `/proc` (the worker process, and the rest of the \
         machine, which is Postgres). The lease drain also runs once more at 16 handlers with \
         `CompletedJobs::Delete` (a job that succeeds is deleted, as graphile_worker does, \
         instead of kept as completed), and the transactional drain once more at 64 handlers \
         with lock rides on (`PgStoreOptions::lock_rides`, 1 ms: a job's lock rides on another \
         job's commit).\n\
         - **wake**: idle workers; 500 jobs enqueued one by one at ~50/s; time from the enqueue's \
         commit to the handler's start. It starts on a quiet server: `VACUUM ANALYZE` and a \
         `CHECKPOINT` first, so that no autovacuum of an earlier scenario's rows and no \
         checkpoint runs during it (right after the enqueue scenario without them, its p99 was \
         2.4-4.8 ms against 1.3-1.7 ms alone).\n\
         - **memory**: peak RSS of a separate worker process holding 10,000 in-flight jobs.\n\
         - **growth**: median latency of a one-job claim with 0, 1M and 10M finished rows in the \
         table, every claim reading from the start of the claim order (without the claim cursor, \
         which would start each claim after the previous one's job).\n\
         - **scheduled**: the same claim with 200,000 jobs scheduled a day ahead, inserted \
         before the due ones: the default claim order (priority, then key) steps over each of \
         them and reads its row (`docs/existing-tables.md`, \"What makes claims slower\", \
         has the order and index that avoid it).\n\
         - **alternate**: the ceiling and both drains at 16 handlers once more, one after the \
         other for five rounds, medians; the targets' ratios to the ceiling are taken from \
         these, so that the machine's drift hits the ceiling and the drains alike.\n\
         - **peers** (`--peers`): the same drain and wake scenarios for graphile_worker, sqlxmq \
         and apalis, each in a database of its own on the same server. Each peer's drain is \
         prepared like the project's: its jobs are enqueued in batches, its database is \
         vacuumed and analyzed, and it gets 1.1 s to settle before the timed drain; its CPU per \
         job is sampled the same way; its wake scenario starts on a quiet server like the \
         project's. Then the **versus** rows: \
         the lease drain at 16 handlers (keeping completed jobs, the default, and deleting \
         them) and graphile_worker's, alternating for five rounds, medians (the ratio to \
         graphile_worker's target is taken from these, so that the machine's drift hits both \
         alike).\n\n\
         {report}\n\
         ## Table design for growth\n\n\
         The default table keeps claiming independent of finished rows: the claim reads the \
         partial index `(priority DESC, id) WHERE state IN ('queued', 'errored')`, which holds only \
         claimable rows however many finished ones pile up. The resetter reads the partial \
         index `(id) WHERE state = 'processing'`, which holds only running jobs (an index on \
         the heartbeat column instead would make every heartbeat a non-HOT update). \
         Completions and heartbeats find each of their rows by key, through the primary key: \
         their arrays and the processing state reach the planner only through initplans, so \
         that no plan, custom or cached, hashes a batch against a scan of the processing \
         index, which keeps an entry for every job claimed since the last vacuum (with \
         statistics taken before a drain, every sampled completion did: 33 ms for a 950-row \
         completion past 51,000 such entries, against 9.7 ms probing by key). The table has \
         `fillfactor = 80`, leaving room on each page so that new row versions stay on the \
         page.\n\n\
         ## What limits the figures\n\n\
         Measured with `pg_stat_statements`, `auto_explain`, `perf`, `vmstat` and pgbench scripts \
         on the 2-core machine:\n\n\
         - **Lease mode** costs the CPU per job the drain rows show, with claims of about 45 rows \
         and completions of several hundred per statement (16 handlers). On an idle server a claim costs about 8 µs \
         of executor time per row (index scan, row lock, the new row version, its primary-key and \
         processing-index entries; no update can be HOT, since the state is in the partial \
         indexes' predicates). Four things took a claim's round trip down: it commits without \
         waiting for its WAL flush (`ClaimCommit::Async`; completions still wait), it spells out \
         its state values and its size so each size is planned a few times per connection and \
         then runs a cached plan (planning every claim cost 0.1-0.15 ms), its connection \
         stays with the store between statements (sqlx pings every connection it takes back), \
         and on the default table it returns only the columns it did not write (the record \
         takes the state, the start and heartbeat time, the worker and the token from the \
         claim): the whole row cost 5-8 % more executor time per row and 2-3 µs more worker \
         CPU per job. \
         At 16 handlers the cores are still a tenth to a third idle: a job's slot is held \
         while its claim is on the way, so throughput is about slots ÷ claim round trip (1.0-1.5 \
         ms for 42-45 rows under load, of which 0.5-0.8 ms does not depend on the size: wake-ups \
         of the backend and the worker on two busy cores). Two claims may be in flight, 1.4 on \
         average (the second waits for half a claim's worth of free slots); claiming as soon as \
         any slot frees, waiting for four fifths of a claim, or three claims in flight measured \
         no faster in alternating runs. A bigger local queue helps both queues alike: with 256 \
         (16 × handlers) this drain measured 53,000-58,000 jobs/s against 41,000-45,000 with 64, \
         and graphile_worker 24,600-24,800 against 18,900-20,100 with 64, so the head-to-head \
         keeps both at 64. Per job the server writes two new row versions and three index \
         entries (the claim's and the completion's, never HOT), where graphile_worker writes \
         one version and deletes the job when it completes (no new row version, no index \
         entry); this store keeps it, in the spec's `completed` state, unless told to delete \
         it (`CompletedJobs::Delete`: a sixth to a third less WAL per job, and a 300-job \
         completion cost 1.0-1.1 ms of executor time instead of 2.0-2.2 on an idle server, \
         before successes had a statement of their own). \
         A claim from the start of the \
         claimable index walks the entries of the jobs already claimed, which stay (marked \
         dead) until a vacuum removes their pages: with 46,000 jobs drained a 46-row claim \
         reads about 180 buffers, 136 of them emptied index pages (graphile_worker's claim \
         does the same). The store's claim cursor spares most claims of a backlog that walk: \
         after a claim that came back full, the next starts after the last job it took (one \
         index condition more), and only one claim every 10 ms reads from the start. Over a \
         100,000-job drain the claims at the cursor took 0.78 ms of executor time against \
         1.3 ms from the start and 1.16 ms per claim before the cursor; the drain itself \
         gained less (about 4 % in six alternating rounds at 16 handlers), since a claim's \
         round trip is mostly not its executor time.\n\
         - **Transactional mode** pays, per job, a transaction of its own and its WAL flush, in \
         two round trips: `BEGIN; EXECUTE lock(..)` and `EXECUTE complete(..); COMMIT AND \
         CHAIN`, simple-protocol queries on two statements each connection prepares in SQL \
         (sqlx cannot pipeline bound statements; the four bound statements this replaced were \
         5-13 % slower in alternating runs, and cost 15 µs more worker CPU per job); the next \
         job on a connection locks inside the transaction the chain opened, without a `BEGIN`. pgbench \
         sending that transaction's four statements as two pipelined round trips reaches about \
         0.7× its own one-statement ceiling here, and as four round trips about 0.5×; the claim, \
         16 job connections sharing two cores with the worker (a quarter of all CPU is the \
         kernel waking processes across the loopback) take the mode to about half the ceiling. \
         A handler's slot stays taken until its job commits: when it took the next job while \
         the last one committed, commits piled up beyond the pool, and 18 % of jobs paid a \
         `ROLLBACK` and a `BEGIN` for a connection that had gone back to the pool (the \
         transactional drain was 14-19 % slower in alternating runs). A handler that does not \
         ask for the job's transaction pays none of this and drains like lease mode. At 64 \
         handlers the server's CPU is the limit (64 connections on two cores), and the drain is \
         slower than at 16; there lock rides save a round trip per job: a handler asking for \
         its transaction hands its lock to the next job's commit (`EXECUTE complete(..); COMMIT \
         AND CHAIN; EXECUTE lock(..)`), which hands its connection on. In alternating runs rides \
         took 64 handlers from 5,000-5,900 to 6,000-8,800 jobs/s, and 16 handlers from 6,700-7,200 \
         down to 6,200-7,100: a rider's lock arrives only after the carrying commit's WAL \
         flush, later than its own round trip would bring it, which costs where the handlers' \
         waits, not the CPU, limit the drain. Hence rides are off by default.\n\
         - **Versus graphile_worker** (16 handlers, a local queue of 64 each). In the run \
         above graphile_worker used 64 µs of CPU per job in all (19 µs in its worker), and \
         this drain 41 µs (12 µs in the worker); the machine ran slower than on the days of \
         earlier runs (pgbench 7,700-10,900 tps against 14,500-16,300). graphile_worker keeps \
         the cores only about half busy: it fetches its next 64 jobs only once its local \
         queue is empty, one fetch at a time. This drain keeps them about four fifths busy, \
         with two claims in flight, and cannot get busier while at most 80 jobs are in hand: \
         a slot is held from the moment its claim is sent until its handler is done, so \
         throughput is about 2 × 40 jobs per claim round trip. On the same machine the same \
         day a 42-row claim took 1.7-1.9 ms from the worker's side, of which 0.8-0.9 ms was \
         the executor's (timed in the store, and with `pg_stat_statements`); on an earlier \
         day claims of 24-35 rows, three or four in flight, took as long as claims of 46 rows \
         and drained 10-20 % slower. With more jobs in hand the CPU is the limit: at 64 \
         handlers (320 jobs in hand) the run above drained 48,100 jobs/s at 35 µs per job. \
         Two changes took the head-to-head from 2.08×, 2.03×, 1.95× and 1.97× (four \
         alternating rounds on a development cluster the same day, before them) to \
         2.16-2.43× in each of the five rounds above (2.30× their medians): completions whose \
         plans probe each row by key (see the table design above; 10.1-12.5 µs of executor \
         time per completed row under load against 12.4-13.5), and a claim on the default \
         table that returns only the columns it did not write (5-8 % less executor time per \
         claimed row, 2-3 µs less worker CPU per job). Before them, the worker had come to \
         spawn a claim's jobs in tasks of up to eight instead of one task each (the spawns \
         and the wake-ups between threads that came with them were about a fifth of the \
         worker's CPU per job), and successes to be completed by a statement of their own \
         that writes only the state and the finish time. The peers are prepared like the \
         project's drain (vacuumed, analyzed and settled); preparing graphile_worker made it \
         a few percent faster (3.6 % on average over three A/B pairs). Measured and dropped: \
         boxing each job's future, leaving out its metrics, and answering a batched \
         completion with one row (how many it applied to) instead of a row per job changed \
         neither figure measurably; without the processing index a pgbench loop of claims \
         and completions ran 10-20 % faster, but the drain measured slower in three rounds \
         of three, and the resetter would have to read the whole table.\n\
         - **Wake latency** is LISTEN/NOTIFY from a statement-level trigger: the notification is \
         sent at commit and the worker claims at once.\n\
         - **Variance**: on this virtual machine the same scenario measured minutes apart differs \
         by up to ±20 % (pgbench alone moved between 7,000 and 14,500 tps over two days), so a \
         ratio of two figures measured minutes apart moves between runs by more than either \
         figure's own noise: the alternate and versus rows interleave what they compare for \
         that reason; the single-run ratios are shown beside them.\n"
    )
}
