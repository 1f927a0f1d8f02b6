//! The cluster every scenario runs on: what it is (the machine line),
//! its ceiling (pgbench), the warm-up, and fresh tables filled with jobs.

use std::process::Stdio;

use anyhow::{ensure, Context, Result};
use queue_core::NewJob;
use queue_store_postgres::JobTable;
use sqlx::PgPool;

use super::cpu::{CpuPerJob, CpuSample};
use super::drain::{drain, LEASE};
use super::Sizes;
use crate::pg::Postgres;

/// One lease drain, not reported, then a checkpoint, so that no measured
/// scenario pays for a fresh cluster's cold caches and its first WAL segment
/// files (a new cluster creates a new file for every 16 MB of WAL until a
/// checkpoint recycles old ones).
pub(super) async fn warm_up(pool: &PgPool, sizes: &Sizes) -> Result<()> {
    println!("warming up: one lease drain, then a checkpoint");
    drain(pool, LEASE, 16, sizes.drain_jobs).await?;
    sqlx::query("CHECKPOINT").execute(pool).await?;
    Ok(())
}

pub(super) fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub(super) async fn machine(pool: &PgPool, pg: &Postgres) -> Result<String> {
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
        let value: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SHOW {name}")))
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
pub(super) async fn pgbench(pg: &Postgres, seconds: u32) -> Result<f64> {
    Ok(pgbench_costed(pg, seconds).await?.tps)
}

/// The ceiling and what a transaction of it costs.
pub(super) struct Ceiling {
    pub tps: f64,
    /// CPU per transaction (`None` without Linux's `/proc`); pgbench is in
    /// the rest of the machine, this process idles.
    pub cpu: Option<CpuPerJob>,
}

impl Ceiling {
    /// The CPU per transaction, for a row's note.
    pub fn cpu_note(&self) -> String {
        match &self.cpu {
            Some(cpu) => format!(
                "CPU/transaction: Postgres {:.0} µs ({:.0} in the kernel), pgbench and the rest \
                 of the machine {:.0} µs",
                cpu.postgres_us,
                cpu.postgres_kernel_us,
                cpu.rest_us + cpu.worker_us
            ),
            None => String::new(),
        }
    }
}

/// [`pgbench`], with the CPU its transactions cost.
pub(super) async fn pgbench_costed(pg: &Postgres, seconds: u32) -> Result<Ceiling> {
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
    let cpu0 = CpuSample::now();
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
    let transactions = stdout
        .lines()
        .find_map(|l| l.strip_prefix("number of transactions actually processed: "))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<usize>().ok())
        .with_context(|| format!("no count of transactions in pgbench's output: {stdout}"))?;
    Ok(Ceiling {
        tps,
        cpu: CpuSample::per_job_since(cpu0, transactions.max(1)),
    })
}

pub(super) async fn fresh_table(pool: &PgPool, name: &str) -> Result<JobTable> {
    created_anew(pool, JobTable::new("queue_bench", name)?).await
}

/// `table`, dropped if it exists and migrated anew.
pub(super) async fn created_anew(pool: &PgPool, table: JobTable) -> Result<JobTable> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS {} CASCADE",
        table.name().quoted()
    )))
    .execute(pool)
    .await?;
    table.migrate(pool).await?;
    Ok(table)
}

pub(super) async fn enqueue_all(
    pool: &PgPool,
    table: &JobTable,
    n: usize,
    kind: &str,
) -> Result<i64> {
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
