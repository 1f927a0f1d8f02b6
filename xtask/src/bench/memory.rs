//! Memory per in-flight job: the peak RSS of a separate worker process
//! holding thousands of jobs.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use queue_core::testkit::UntilCancelled;
use queue_core::CancellationToken;
use queue_store_postgres::{ExecutionMode, JobTable, PgStore};
use queue_worker::{Worker, WorkerOptions};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, BufReader};

use super::cluster::{enqueue_all, fresh_table};
use crate::pg::Postgres;

pub(super) struct Memory {
    pub idle_mb: f64,
    pub peak_mb: f64,
}

pub(super) fn status_kb(pid: u32, field: &str) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}

/// Peak RSS of a separate worker process holding `n` in-flight jobs.
pub(super) async fn memory(pg: &Postgres, pool: &PgPool, n: usize) -> Result<Memory> {
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
    while (sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(processing.to_owned()))
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

/// The process `memory` measures: a lease-mode worker with `n` handlers.
pub async fn memory_worker(n: usize) -> Result<()> {
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
    let worker = Worker::new(store, UntilCancelled, options)?;
    println!("ready");
    worker.run(CancellationToken::new()).await?;
    Ok(())
}
