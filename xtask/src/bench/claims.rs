//! Claim latency: a one-job claim's median with rows of other kinds in the
//! table (finished ones, jobs scheduled ahead, failed ones waiting to
//! retry), which a claim must not pay for.

use std::time::Instant;

use anyhow::{ensure, Result};
use queue_core::{ClaimParams, Job, Store};
use queue_store_postgres::{ExecutionMode, PgStore};
use sqlx::PgPool;

use super::cluster::{enqueue_all, fresh_table};
use super::quiet;
use super::wake::percentiles;

/// Rows the claims of [`claim_latency`] find in the table besides the due
/// jobs, inserted before them.
#[derive(Clone, Copy)]
pub(super) enum Ahead {
    /// Completed jobs.
    Finished(u64),
    /// Queued jobs not due for a day.
    Scheduled(u64),
    /// Failed jobs waiting an hour for their retry (errored, one failure
    /// counted): a downstream outage's backlog.
    Retrying(u64),
}

/// Median latency of a one-job claim with the rows of `ahead` in the table.
pub(super) async fn claim_latency(pool: &PgPool, ahead: Ahead) -> Result<f64> {
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
        Ahead::Retrying(rows) => (
            rows,
            format!(
                "INSERT INTO {t} (kind, payload, state, num_failures, failure_message, process_after) \
                 SELECT 'flaky', '{{}}', 'errored', 1, 'downstream unavailable', now() + interval '1 hour' \
                 FROM generate_series(1, $1::int8)"
            ),
        ),
    };
    if rows > 0 {
        sqlx::query(sqlx::AssertSqlSafe(insert.to_owned()))
            .bind(rows as i64)
            .execute(pool)
            .await?;
    }
    enqueue_all(pool, &table, 500, "noop").await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "VACUUM ANALYZE {}",
        table.name().quoted()
    )))
    .execute(pool)
    .await?;
    // No autovacuum or checkpoint of the rows just written during the
    // claims (the first measurement of a run came out twice the later ones
    // without this).
    quiet::quiesce(pool).await?;
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
    Ok(percentiles(one_job_claims(&store, 300).await?).p50)
}

/// `n` one-job claims of `store`, each timed (ms); each must find a job.
pub(super) async fn one_job_claims(store: &PgStore<Job>, n: usize) -> Result<Vec<f64>> {
    let mut ms = Vec::with_capacity(n);
    for _ in 0..n {
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
        ensure!(claimed.len() == 1, "the table ran out of jobs");
    }
    Ok(ms)
}
