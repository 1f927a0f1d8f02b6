//! A table used as it is, against the same table changed for the store:
//! drains of a table whose bookkeeping (claim token, claim time, heartbeat,
//! counts, worker, cancel flag, log) lives in the store's bookkeeping
//! table, alternating with drains of the same table with those columns
//! added, in both modes, medians; and the bookkeeping rows a drain leaves.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use async_trait::async_trait;
use queue_core::{CancellationToken, Handler, JobContext, JobError, JobRecord};
use queue_store_postgres::{
    bookkeeping, Column, ExecutionMode, PgJobTransaction, PgStore, PgStoreOptions,
};
use queue_worker::Worker;
use sqlx::postgres::{PgPoolOptions, PgRow};
use sqlx::{PgPool, Row};

use super::drain::drain_options;
use super::report::{rows, Results};
use super::Sizes;

/// A claimed job: its key alone.
#[derive(Debug)]
struct Key(i64);

impl JobRecord for Key {
    type Id = i64;
    fn id(&self) -> &i64 {
        &self.0
    }
    fn kind(&self) -> &str {
        "noop"
    }
}

fn decode(row: &PgRow) -> Result<Key, sqlx::Error> {
    Ok(Key(row.try_get("__queue_key")?))
}

/// Counts each job's runs, to prove exactly-once; opens the job's
/// transaction in transactional mode, as the other drains do.
struct Counted {
    first_id: i64,
    runs: Arc<Vec<AtomicU32>>,
    total: Arc<AtomicUsize>,
    open_transaction: bool,
}

#[async_trait]
impl Handler<PgStore<Key>> for Counted {
    async fn handle(
        &self,
        _: &JobContext,
        store: &mut PgJobTransaction,
        job: &Key,
    ) -> Result<(), JobError> {
        if self.open_transaction {
            store.transaction().await.map_err(JobError::retry)?;
        }
        let slot = usize::try_from(job.0 - self.first_id)
            .map_err(|_| JobError::poison("job id below the first"))?;
        let runs = self
            .runs
            .get(slot)
            .ok_or_else(|| JobError::poison("job id beyond the last"))?;
        runs.fetch_add(1, Ordering::Relaxed);
        self.total.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// The bookkeeping columns, as the store's default table has them.
const ADDED: &str = "claim_token bigint NOT NULL DEFAULT 0, started_at timestamptz, \
     last_heartbeat_at timestamptz, num_resets integer NOT NULL DEFAULT 0, \
     num_failures integer NOT NULL DEFAULT 0, worker_hostname text, \
     cancel boolean NOT NULL DEFAULT false, execution_logs jsonb[]";

/// One drain of `n` jobs in `mode` from a fresh table: with its
/// bookkeeping in a bookkeeping table (`as_it_is`), or with the columns
/// added. Returns the rate and the bookkeeping rows left.
async fn drain(pool: &PgPool, mode: ExecutionMode, as_it_is: bool, n: usize) -> Result<(f64, i64)> {
    let name = if as_it_is { "as_it_is" } else { "changed" };
    let table = format!("queue_bench.{name}");
    let side = format!("queue_bench.{name}_bookkeeping");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA IF NOT EXISTS queue_bench; DROP TABLE IF EXISTS {table}, {side} CASCADE; \
         DROP TABLE IF EXISTS {side}_migrations"
    )))
    .execute(pool)
    .await?;
    let added = if as_it_is {
        String::new()
    } else {
        format!(", {ADDED}")
    };
    // The common part: what a scheduler's table has; the claim index on
    // the key over the waiting rows, the resetter's on processing ones.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {table} (id bigserial PRIMARY KEY, kind text NOT NULL, payload jsonb NOT NULL, \
         state text NOT NULL DEFAULT 'queued', queued_at timestamptz NOT NULL DEFAULT now(), \
         finished_at timestamptz, failure_message text{added}); \
         CREATE INDEX ON {table} (id) WHERE state IN ('queued', 'errored'); \
         CREATE INDEX ON {table} (id) WHERE state = 'processing'; \
         INSERT INTO {table} (kind, payload) SELECT 'noop', to_jsonb(g) FROM generate_series(1, {n}) g"
    )))
    .execute(pool)
    .await?;
    // As the other drains: no autovacuum of the new rows during the drain.
    sqlx::query(sqlx::AssertSqlSafe(format!("VACUUM ANALYZE {table}")))
        .execute(pool)
        .await?;
    let first_id: i64 =
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT min(id) FROM {table}")))
            .fetch_one(pool)
            .await?;
    let mut options = PgStoreOptions::new(name)?
        .schema("queue_bench")?
        .select(format!("\"{name}\".\"id\" AS \"__queue_key\""))
        .mode(mode);
    if as_it_is {
        options = options.bookkeeping_table(&format!("{name}_bookkeeping"))?;
        bookkeeping::migrate(pool, &options).await?;
    }
    // Columns of the default table's that neither version has.
    options = options
        .without(Column::ProcessAfter)?
        .without(Column::Priority)?;
    sqlx::query("CHECKPOINT").execute(pool).await?;
    let handlers = 16;
    let store_pool = PgPoolOptions::new()
        .test_before_acquire(false)
        .max_connections(handlers as u32 + 10)
        .connect_with((*pool.connect_options()).clone())
        .await?;
    let store = PgStore::with_decoder(store_pool.clone(), options, decode).await?;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let runs: Arc<Vec<AtomicU32>> = Arc::new((0..n).map(|_| AtomicU32::new(0)).collect());
    let total = Arc::new(AtomicUsize::new(0));
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
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let done = format!("SELECT count(*) FROM {table} WHERE state = 'completed'");
    loop {
        if total.load(Ordering::Relaxed) >= n {
            let completed: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(done.clone()))
                .fetch_one(pool)
                .await?;
            if completed == n as i64 {
                break;
            }
        }
        ensure!(
            !running.is_finished(),
            "the worker stopped during the drain"
        );
        ensure!(
            started.elapsed() < Duration::from_secs(600),
            "the drain of {name} took over 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = started.elapsed();
    shutdown.cancel();
    running.await??;
    ensure!(
        runs.iter().all(|r| r.load(Ordering::Relaxed) == 1),
        "EXACTLY-ONCE VIOLATED in the {name} drain"
    );
    let left: i64 = if as_it_is {
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {side}")))
            .fetch_one(pool)
            .await
            .context("counting the bookkeeping rows")?
    } else {
        0
    };
    store_pool.close().await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP TABLE {table}; DROP TABLE IF EXISTS {side}, {side}_migrations"
    )))
    .execute(pool)
    .await?;
    Ok((n as f64 / elapsed.as_secs_f64(), left))
}

/// Each mode: drains of the table as it is and of the table changed,
/// alternating for `sizes.rounds` rounds, medians; and the bookkeeping rows
/// the largest drain left.
pub(super) async fn as_it_is_against_changed(
    pool: &PgPool,
    sizes: &Sizes,
    results: &mut Results,
) -> Result<()> {
    for (mode, as_it_is_row, changed_row) in [
        (
            ExecutionMode::Lease,
            rows::BOOKKEEPING_LEASE,
            rows::CHANGED_LEASE,
        ),
        (
            ExecutionMode::Transactional,
            rows::BOOKKEEPING_TRANSACTIONAL,
            rows::CHANGED_TRANSACTIONAL,
        ),
    ] {
        let (mut as_it_is, mut changed, mut left) = (Vec::new(), Vec::new(), 0);
        for round in 1..=sizes.rounds {
            println!("bookkeeping ({mode:?}): round {round} of {}", sizes.rounds);
            let (rate, rows_left) = drain(pool, mode, true, sizes.drain_jobs).await?;
            as_it_is.push(rate);
            left = left.max(rows_left);
            changed.push(drain(pool, mode, false, sizes.drain_jobs).await?.0);
        }
        results.add_median("bookkeeping", as_it_is_row, "jobs/s", &as_it_is);
        results.add_median("bookkeeping", changed_row, "jobs/s", &changed);
        results.add(
            "bookkeeping",
            format!("{mode:?}: bookkeeping rows left after a drain").to_lowercase(),
            left as f64,
            "rows",
            format!("{} jobs drained, all completed", sizes.drain_jobs),
        );
    }
    Ok(())
}
