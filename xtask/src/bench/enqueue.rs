//! Enqueue rates: plain and unique jobs, one per statement and in batches.

use std::time::Instant;

use anyhow::Result;
use queue_core::{NewJob, UniqueScope};
use sqlx::PgPool;

use super::cluster::{enqueue_all, fresh_table};

/// Enqueue rates, jobs/s: plain and with unique keys, one job per
/// statement and in batches of 5,000.
pub(super) struct EnqueueRates {
    pub single: f64,
    pub batch: f64,
    pub unique_single: f64,
    pub unique_batch: f64,
}

pub(super) async fn enqueue(pool: &PgPool, singles: usize, batched: usize) -> Result<EnqueueRates> {
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
