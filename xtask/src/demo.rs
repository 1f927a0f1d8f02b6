//! `cargo xtask demo`: starts a throwaway Postgres (or uses `DATABASE_URL`),
//! migrates the default table, enqueues jobs of three kinds (or no-op jobs
//! with `--noop`), runs a worker and a resetter over them with a progress
//! bar, prints a summary, and cleans up.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use async_trait::async_trait;
use queue_core::testkit::Succeeds;
use queue_core::{
    CancellationToken, Handler, Job, JobContext, JobError, NewJob, OutcomePolicy, RetryPolicy,
};
use queue_store_postgres::{ExecutionMode, JobTable, PgJobTransaction, PgStore};
use queue_worker::{Resetter, ResetterOptions, Router, Worker, WorkerOptions};
use sqlx::postgres::PgPoolOptions;

use crate::pg::{ClusterOptions, Postgres};

type Store = PgStore<Job>;

/// Succeeds after a little simulated work.
struct Thumbnail;

#[async_trait]
impl Handler<Store> for Thumbnail {
    async fn handle(
        &self,
        _: &JobContext,
        _: &mut PgJobTransaction,
        job: &Job,
    ) -> Result<(), JobError> {
        let micros: u64 = job.payload_as()?;
        tokio::time::sleep(Duration::from_micros(micros)).await;
        Ok(())
    }
}

/// Fails its first attempt with a retryable error.
struct FlakyUpload;

#[async_trait]
impl Handler<Store> for FlakyUpload {
    async fn handle(
        &self,
        ctx: &JobContext,
        _: &mut PgJobTransaction,
        _: &Job,
    ) -> Result<(), JobError> {
        if ctx.attempt() == 1 {
            return Err(JobError::retry_after(
                "upload endpoint busy",
                Duration::ZERO,
            ));
        }
        Ok(())
    }
}

/// Rejects its payload: a poison error.
struct Validate;

#[async_trait]
impl Handler<Store> for Validate {
    async fn handle(
        &self,
        _: &JobContext,
        _: &mut PgJobTransaction,
        job: &Job,
    ) -> Result<(), JobError> {
        Err(JobError::poison(format!("invalid address {}", job.payload)))
    }
}

/// `cargo xtask demo`'s flags.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// How many jobs to enqueue and drain.
    #[arg(long, default_value_t = 10_000)]
    jobs: usize,
    /// Handlers running at once.
    #[arg(long, default_value_t = 16)]
    handlers: usize,
    /// The execution mode (transactional, the store's default, or lease).
    #[arg(long, value_enum, default_value_t = Mode::Transactional)]
    mode: Mode,
    /// Jobs that do nothing (measures the queue itself) instead of the
    /// demo's mix of kinds.
    #[arg(long)]
    noop: bool,
    /// Jobs claimed ahead of the handlers.
    #[arg(long, default_value_t = 0)]
    prefetch: usize,
}

/// [`ExecutionMode`] as a flag value.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Mode {
    Lease,
    Transactional,
}

impl From<Mode> for ExecutionMode {
    fn from(mode: Mode) -> Self {
        match mode {
            Mode::Lease => ExecutionMode::Lease,
            Mode::Transactional => ExecutionMode::Transactional,
        }
    }
}

fn new_job(i: usize, noop: bool) -> NewJob {
    if noop {
        return NewJob::new("noop", serde_json::json!(i));
    }
    match i % 20 {
        0 => NewJob::new("upload", serde_json::json!({ "file": i })),
        7 => NewJob::new("validate", serde_json::json!(format!("user{i}@"))),
        _ => NewJob::new("thumbnail", serde_json::json!(50 + i % 100)),
    }
}

pub async fn run(args: Args) -> Result<()> {
    // The store's and the worker's warnings (start-up advice, faults) on
    // standard error, as an application would show them; RUST_LOG widens it.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    let pg = Postgres::start(ClusterOptions {
        durable: true,
        statements: false,
    })
    .await?;
    println!("demo: Postgres from {}", pg.origin);
    let pool = PgPoolOptions::new()
        .test_before_acquire(false)
        .max_connections(2 * (args.handlers + args.prefetch) as u32 + 8)
        .connect(&pg.url)
        .await
        .context("connecting to Postgres")?;
    let table = JobTable::new("queue_demo", "jobs")?;
    sqlx::query("DROP SCHEMA IF EXISTS queue_demo CASCADE")
        .execute(&pool)
        .await?;
    table.migrate(&pool).await?;

    let started = Instant::now();
    let jobs: Vec<NewJob> = (0..args.jobs).map(|i| new_job(i, args.noop)).collect();
    for chunk in jobs.chunks(5000) {
        table.enqueue_many(&pool, chunk).await?;
    }
    let enqueue_time = started.elapsed();
    println!(
        "demo: enqueued {} jobs in {enqueue_time:.2?} ({:.0} jobs/s, batches of 5000)",
        args.jobs,
        args.jobs as f64 / enqueue_time.as_secs_f64()
    );

    let store =
        PgStore::default_table(pool.clone(), table.store_options().mode(args.mode.into())).await?;
    let router = Router::new()
        .route("thumbnail", Thumbnail)
        .route("upload", FlakyUpload)
        .route("validate", Validate)
        .route("noop", Succeeds);
    let options = WorkerOptions {
        outcome_policy: OutcomePolicy {
            retry: RetryPolicy::fixed(3, Duration::ZERO),
            ..OutcomePolicy::default()
        },
        ..WorkerOptions::default()
            .handlers(args.handlers)
            .prefetch(args.prefetch)
    };
    let shutdown = CancellationToken::new();
    let worker = Worker::new(store.clone(), router, options)?;
    let resetter = Resetter::new(store.clone(), ResetterOptions::default())?;
    let resetting = tokio::spawn(resetter.run(shutdown.clone()));
    let started = Instant::now();
    let working = tokio::spawn(worker.run(shutdown.clone()));

    let finished_sql = format!(
        "SELECT count(*) FROM {} WHERE state IN ('completed', 'failed', 'canceled')",
        table.name().quoted()
    );
    // On a terminal, a progress bar (on stderr); otherwise a line a second
    // (CI logs).
    let tty = std::io::stderr().is_terminal();
    let bar = if tty {
        let bar = indicatif::ProgressBar::new(args.jobs as u64);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "[{bar:40}] {human_pos}/{human_len} jobs, {elapsed_precise}",
        ) {
            bar.set_style(style.progress_chars("#>."));
        }
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut last_line = Instant::now();
    loop {
        let finished = sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(finished_sql.to_owned()))
            .fetch_one(&pool)
            .await? as usize;
        if tty {
            bar.set_position(finished as u64);
        } else if last_line.elapsed() >= Duration::from_secs(1) || finished == args.jobs {
            println!("progress: {finished}/{} jobs finished", args.jobs);
            last_line = Instant::now();
        }
        if finished >= args.jobs {
            break;
        }
        if working.is_finished() {
            bail!("the worker stopped before all jobs finished");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let elapsed = started.elapsed();
    bar.finish();
    shutdown.cancel();
    let report = working.await??;
    resetting.await??;

    let states: Vec<(String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT state, count(*) FROM {} GROUP BY state ORDER BY state",
        table.name().quoted()
    )))
    .fetch_all(&pool)
    .await?;
    println!(
        "summary ({:?} mode, {} handlers):",
        args.mode, args.handlers
    );
    println!(
        "  drained:  {} jobs in {elapsed:.2?}: {:.0} jobs/s",
        args.jobs,
        args.jobs as f64 / elapsed.as_secs_f64()
    );
    println!(
        "  states:   {}",
        states
            .iter()
            .map(|(s, n)| format!("{s} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "  attempts: completed {}, retried {}, failed {}, poisoned {}",
        report.count("completed"),
        report.count("retried"),
        report.count("failed"),
        report.count("poisoned")
    );
    let expected_failed = if args.noop {
        0
    } else {
        (0..args.jobs).filter(|i| i % 20 == 7).count()
    };
    let count = |state: &str| {
        states
            .iter()
            .find(|(s, _)| s == state)
            .map(|(_, n)| *n as usize)
            .unwrap_or(0)
    };
    if count("failed") != expected_failed || count("completed") != args.jobs - expected_failed {
        bail!("unexpected final states: {states:?}");
    }
    // The store's listener stops once the store is gone; let it, before
    // the cluster stops under it (which it would report as a lost LISTEN).
    drop(store);
    tokio::task::yield_now().await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    pool.close().await;
    drop(pg);
    Ok(())
}
