//! `cargo xtask demo`: enqueues a few thousand jobs of three kinds, runs a
//! worker with a resetter over them, shows progress and prints a summary.
//!
//! It runs on the in-memory store until the Postgres store lands.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use async_trait::async_trait;
use queue_core::{
    CancellationToken, Handler, Job, JobContext, JobError, JobState, NewJob, OutcomePolicy,
    RetryPolicy,
};
use queue_store_memory::MemoryStore;
use queue_worker::{Resetter, ResetterOptions, Router, Worker, WorkerOptions};

/// Succeeds after a little simulated work.
struct Thumbnail;

#[async_trait]
impl Handler<MemoryStore> for Thumbnail {
    async fn handle(&self, _: &JobContext, _: &mut MemoryStore, job: &Job) -> Result<(), JobError> {
        let size: u64 = job.payload_as()?;
        tokio::time::sleep(Duration::from_micros(size)).await;
        Ok(())
    }
}

/// Fails its first attempt with a retryable error.
struct FlakyUpload;

#[async_trait]
impl Handler<MemoryStore> for FlakyUpload {
    async fn handle(&self, ctx: &JobContext, _: &mut MemoryStore, _: &Job) -> Result<(), JobError> {
        if ctx.attempt() == 1 {
            return Err(JobError::retry("upload endpoint busy"));
        }
        Ok(())
    }
}

/// Rejects its payload: a poison error.
struct Validate;

#[async_trait]
impl Handler<MemoryStore> for Validate {
    async fn handle(&self, _: &JobContext, _: &mut MemoryStore, job: &Job) -> Result<(), JobError> {
        Err(JobError::poison(format!("invalid address {}", job.payload)))
    }
}

fn parse_jobs(args: &[String]) -> Result<usize> {
    match args {
        [] => Ok(5000),
        [flag, n] if flag == "--jobs" => n
            .parse()
            .with_context(|| format!("--jobs takes a number, got {n:?}")),
        _ => bail!("usage: cargo xtask demo [--jobs N]"),
    }
}

pub async fn run(args: &[String]) -> Result<()> {
    let total = parse_jobs(args)?;
    let store = MemoryStore::new();
    let started = Instant::now();
    store.enqueue_many((0..total).map(|i| match i % 20 {
        0 => NewJob::new("upload", serde_json::json!({ "file": i })),
        7 => NewJob::new("validate", serde_json::json!(format!("user{i}@"))),
        _ => NewJob::new("thumbnail", serde_json::json!(50 + i % 100)),
    }));
    println!(
        "demo: enqueued {total} jobs on the in-memory store in {:?}",
        started.elapsed()
    );

    let router = Router::new()
        .route("thumbnail", Thumbnail)
        .route("upload", FlakyUpload)
        .route("validate", Validate);
    let options = WorkerOptions {
        poll_interval: Duration::from_millis(50),
        outcome_policy: OutcomePolicy {
            retry: RetryPolicy::fixed(3, Duration::from_millis(20)),
            ..OutcomePolicy::default()
        },
        ..WorkerOptions::default().handlers(16)
    };
    let shutdown = CancellationToken::new();
    let worker = Worker::new(store.clone(), router, options)?;
    let resetter = Resetter::new(store.clone(), ResetterOptions::default())?;
    let resetting = tokio::spawn(resetter.run(shutdown.clone()));
    let started = Instant::now();
    let working = tokio::spawn(worker.run(shutdown.clone()));

    let tty = std::io::stdout().is_terminal();
    let done = |s: &MemoryStore| {
        let counts = s.count_by_state();
        [JobState::Completed, JobState::Failed, JobState::Canceled]
            .iter()
            .map(|st| counts.get(st).copied().unwrap_or(0))
            .sum::<usize>()
    };
    let mut last_print = Instant::now();
    loop {
        let finished = done(&store);
        if tty {
            let width = 40;
            let filled = finished * width / total.max(1);
            print!(
                "\r[{}{}] {finished}/{total}",
                "#".repeat(filled),
                ".".repeat(width - filled)
            );
            std::io::stdout().flush()?;
        } else if last_print.elapsed() >= Duration::from_secs(1) || finished == total {
            println!("progress: {finished}/{total} jobs finished");
            last_print = Instant::now();
        }
        if finished == total {
            break;
        }
        if working.is_finished() {
            bail!("the worker stopped before all jobs finished");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let elapsed = started.elapsed();
    if tty {
        println!();
    }
    shutdown.cancel();
    let report = working.await??;
    resetting.await??;

    let counts = store.count_by_state();
    let count = |s: JobState| counts.get(&s).copied().unwrap_or(0);
    println!("summary:");
    println!(
        "  jobs:        {total}, drained in {elapsed:.2?} ({:.0} jobs/s)",
        total as f64 / elapsed.as_secs_f64()
    );
    println!(
        "  states:      completed {}, failed {}",
        count(JobState::Completed),
        count(JobState::Failed)
    );
    println!(
        "  attempts:    ok {}, retry {}, failed {}, poison {}",
        report.count("ok"),
        report.count("retry"),
        report.count("failed"),
        report.count("poison")
    );
    let expected_failed = (0..total).filter(|i| i % 20 == 7).count();
    if count(JobState::Failed) != expected_failed
        || count(JobState::Completed) != total - expected_failed
    {
        bail!("unexpected final states: {counts:?}");
    }
    Ok(())
}
