//! Faults injected into a running queue (`cargo xtask faults`, and the end
//! of `cargo xtask test-pg`): PostgreSQL is stopped for ten seconds in the
//! middle of a steady drain, in both modes, on a throwaway cluster of this
//! process (the only kind it may stop). A producer enqueues 200 jobs a
//! second throughout (retrying while the server is down); a worker and a
//! resetter drain them; every handler run is written to a ledger (in the
//! job's transaction in transactional mode).
//!
//! Each run must end with every enqueued job completed (0 lost), the worker
//! and the resetter still running (no restart needed), no job run twice in
//! transactional mode (lease mode: reported), and the completion rate back
//! to 90 % of its rate before the fault within 5 s of the server's return.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use async_trait::async_trait;
use queue_core::{CancellationToken, Handler, Job, JobContext, JobError, NewJob};
use queue_store_postgres::{ExecutionMode, JobTable, PgJobStore, PgStore};
use queue_worker::{Resetter, ResetterOptions, Worker, WorkerOptions};
use sqlx::postgres::PgPoolOptions;

use crate::pg::{ClusterOptions, Postgres};

/// Jobs a second the producer offers.
const RATE: u64 = 200;
/// How long the producer runs, the fault and when it starts.
const PRODUCE: Duration = Duration::from_secs(30);
const FAULT_AT: Duration = Duration::from_secs(8);
const DOWN_FOR: Duration = Duration::from_secs(10);
/// The recovery target after the server is back.
const RECOVERY_TARGET: Duration = Duration::from_secs(5);

/// Records each run in the ledger.
struct Ledger {
    table: String,
    transactional: bool,
}

#[async_trait]
impl Handler<PgStore<Job>> for Ledger {
    async fn handle(
        &self,
        _: &JobContext,
        store: &mut PgJobStore,
        job: &Job,
    ) -> Result<(), JobError> {
        let insert = format!("INSERT INTO {} (job_id) VALUES ($1)", self.table);
        if self.transactional {
            let conn = store.transaction().await.map_err(JobError::retry)?;
            sqlx::query(&insert).bind(job.id).execute(conn).await?;
        } else {
            sqlx::query(&insert)
                .bind(job.id)
                .execute(store.pool())
                .await?;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        Ok(())
    }
}

/// What one run measured.
struct Figures {
    enqueued: usize,
    completed: i64,
    duplicates: i64,
    rate_before: f64,
    recovery: Option<Duration>,
}

/// `cargo xtask faults`.
pub async fn run() -> Result<()> {
    let mut failures = Vec::new();
    for mode in [ExecutionMode::Lease, ExecutionMode::Transactional] {
        let pg = Postgres::start_local(ClusterOptions { durable: false }).context(
            "the fault tests stop and start PostgreSQL, so they need its local binaries",
        )?;
        let figures = restart_mid_drain(&pg, mode).await?;
        let lost = figures.enqueued as i64 - figures.completed;
        let recovery = figures
            .recovery
            .map_or("never".to_owned(), |d| format!("{:.1} s", d.as_secs_f64()));
        println!(
            "faults: {mode:?}, PostgreSQL stopped {} s mid-drain: {} jobs enqueued, {lost} lost, {} run twice, \
             recovery to 90 % of {:.0} jobs/s: {recovery} after the server was back",
            DOWN_FOR.as_secs(),
            figures.enqueued,
            figures.duplicates,
            figures.rate_before,
        );
        if lost != 0 {
            failures.push(format!("{mode:?}: {lost} jobs lost"));
        }
        if mode == ExecutionMode::Transactional && figures.duplicates != 0 {
            failures.push(format!("{mode:?}: {} jobs ran twice", figures.duplicates));
        }
        if figures.recovery.is_none_or(|d| d > RECOVERY_TARGET) {
            failures.push(format!("{mode:?}: recovery {recovery}, target ≤ 5 s"));
        }
    }
    if !failures.is_empty() {
        bail!("fault tests failed: {}", failures.join("; "));
    }
    Ok(())
}

async fn restart_mid_drain(pg: &Postgres, mode: ExecutionMode) -> Result<Figures> {
    let pool = PgPoolOptions::new()
        .test_before_acquire(false)
        .max_connections(40)
        .acquire_timeout(Duration::from_secs(2))
        .connect(&pg.url)
        .await
        .context("connecting to Postgres")?;
    let table = JobTable::new("faults", "jobs")?;
    table.migrate(&pool).await?;
    let ledger = "\"faults\".\"ledger\"".to_owned();
    sqlx::query(&format!("CREATE TABLE {ledger} (job_id bigint NOT NULL)"))
        .execute(&pool)
        .await?;
    let store: PgStore<Job> =
        PgStore::default_table(pool.clone(), table.store_options().mode(mode)).await?;
    let shutdown = CancellationToken::new();
    let worker = Worker::new(
        store.clone(),
        Ledger {
            table: ledger.clone(),
            transactional: mode == ExecutionMode::Transactional,
        },
        WorkerOptions {
            heartbeat_interval: Duration::from_millis(500),
            ..WorkerOptions::default().handlers(16)
        },
    )?;
    let resetter = Resetter::new(
        store.clone(),
        ResetterOptions {
            interval: Duration::from_millis(500),
            stalled_max_age: Duration::from_secs(5),
            ..ResetterOptions::default()
        },
    )?;
    let working = tokio::spawn(worker.run(shutdown.clone()));
    let resetting = tokio::spawn(resetter.run(shutdown.clone()));

    // The producer: RATE jobs a second, each enqueue retried until it lands.
    let enqueued = Arc::new(AtomicUsize::new(0));
    let producing = Arc::new(AtomicBool::new(true));
    let producer = {
        let (pool, table, enqueued, producing) = (
            pool.clone(),
            table.clone(),
            enqueued.clone(),
            producing.clone(),
        );
        tokio::spawn(async move {
            let started = Instant::now();
            let mut ticks = tokio::time::interval(Duration::from_millis(1000 / RATE));
            let mut n = 0u64;
            while started.elapsed() < PRODUCE {
                ticks.tick().await;
                n += 1;
                let job = NewJob::new("fault", serde_json::json!(n));
                while table.enqueue(&pool, &job).await.is_err() {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                enqueued.fetch_add(1, Ordering::SeqCst);
            }
            producing.store(false, Ordering::SeqCst);
        })
    };

    // Completions sampled every 250 ms (a failed read, while the server is
    // down, counts as no change).
    let completed_sql = format!(
        "SELECT count(*) FROM {} WHERE state = 'completed'",
        table.name().quoted()
    );
    let started = Instant::now();
    let mut samples: Vec<(Duration, i64)> = Vec::new();
    let mut last = 0i64;
    let mut stopped_at = None;
    let mut back_at: Option<Instant> = None;
    loop {
        let now = started.elapsed();
        if stopped_at.is_none() && now >= FAULT_AT {
            pg.stop_server()?;
            stopped_at = Some(Instant::now());
        }
        if let (Some(at), None) = (stopped_at, back_at) {
            if at.elapsed() >= DOWN_FOR {
                pg.start_server()?;
                back_at = Some(Instant::now());
            }
        }
        if let Ok(count) = sqlx::query_scalar::<_, i64>(&completed_sql)
            .fetch_one(&pool)
            .await
        {
            last = count;
        }
        samples.push((started.elapsed(), last));
        let done = !producing.load(Ordering::SeqCst)
            && back_at.is_some()
            && last as usize >= enqueued.load(Ordering::SeqCst);
        if done {
            break;
        }
        ensure!(
            started.elapsed() < PRODUCE + Duration::from_secs(90),
            "{mode:?}: the drain did not finish within 90 s of the producer's end ({last} of {} completed)",
            enqueued.load(Ordering::SeqCst)
        );
        ensure!(
            !working.is_finished(),
            "{mode:?}: the worker stopped during the fault"
        );
        ensure!(
            !resetting.is_finished(),
            "{mode:?}: the resetter stopped during the fault"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    producer.await?;
    shutdown.cancel();
    working.await?.context("the worker")?;
    resetting.await?.context("the resetter")?;

    // The rate before the fault: seconds 2 to FAULT_AT.
    let at = |t: Duration| {
        samples
            .iter()
            .rev()
            .find(|(when, _)| *when <= t)
            .map_or(0, |(_, n)| *n)
    };
    let before = Duration::from_secs(2);
    let rate_before = (at(FAULT_AT) - at(before)) as f64 / (FAULT_AT - before).as_secs_f64();
    // Recovery: the first second after the server is back in which the
    // completions reach 90 % of that rate.
    let back = back_at
        .map(|b| b.duration_since(started))
        .unwrap_or_default();
    let recovery = samples
        .iter()
        .filter(|(when, _)| *when >= back)
        .find(|(when, n)| {
            let earlier = at(when.saturating_sub(Duration::from_secs(1)));
            *when >= back + Duration::from_secs(1) && (*n - earlier) as f64 >= 0.9 * rate_before
        })
        .map(|(when, _)| {
            when.saturating_sub(back)
                .saturating_sub(Duration::from_secs(1))
        });
    let completed: i64 = sqlx::query_scalar(&completed_sql).fetch_one(&pool).await?;
    let duplicates: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM (SELECT job_id FROM {ledger} GROUP BY job_id HAVING count(*) > 1) AS twice"
    ))
    .fetch_one(&pool)
    .await?;
    Ok(Figures {
        enqueued: enqueued.load(Ordering::SeqCst),
        completed,
        duplicates,
        rate_before,
        recovery,
    })
}
