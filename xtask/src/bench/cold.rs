//! The drain as a user first meets it: a fresh database, jobs enqueued, and
//! the clock started when the worker is constructed, so that connecting
//! the pool, the store's start-up checks (and its ANALYZE of a table
//! without statistics) and the LISTEN connection count; no vacuum and no
//! settling (16 handlers, a local queue of 64 each), alternating, medians.
//! This queue runs twice a round: on the default table as released, and
//! like for like with graphile_worker, which deletes the jobs it completes
//! ([`Layout::InPlaceDeleting`]: the table laid out for claims in place,
//! completed jobs deleted). graphile_worker runs twice a round too: as a
//! user meets it, and at its best ([`GraphileCold::BEST`]), which the
//! targets are against.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use queue_core::CancellationToken;
use queue_store_postgres::{CompletedJobs, ExecutionMode, JobTable, PgStore};
use queue_worker::Worker;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use super::alternating::rotating;
use super::cluster::enqueue_all;
use super::drain::{drain_options, wait_until_drained, Counted};
use super::peers::{GraphileCold, Peers};
use super::report::{rows, Results};
use super::Sizes;
use crate::pg::Postgres;

const DATABASE: &str = "queue_bench_cold";

/// The URL of `database` on the server `url` names.
fn database_url(url: &str, database: &str) -> Result<String> {
    let (base, rest) = url
        .rsplit_once('/')
        .context("the server's URL has no database name")?;
    let query = rest.split_once('?').map(|(_, q)| format!("?{q}"));
    Ok(format!("{base}/{database}{}", query.unwrap_or_default()))
}

/// How this queue's table and store are set up for a cold drain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Layout {
    /// The default table as released, completed jobs kept.
    Released,
    /// The default table laid out for claims in place
    /// (`JobTable::in_place_claims`), completed jobs deleted
    /// (`CompletedJobs::Delete`): this queue's fastest setup, doing what
    /// graphile_worker does with a completed job.
    InPlaceDeleting,
}

/// One cold drain of `n` jobs: jobs per second from the worker's
/// construction to the last completion.
pub(super) async fn drain(admin: &PgPool, url: &str, n: usize, layout: Layout) -> Result<f64> {
    drop_database(admin).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {DATABASE}")))
        .execute(admin)
        .await?;
    let url = database_url(url, DATABASE)?;
    // The application's side: the table made and the jobs enqueued, on a
    // connection of its own (which also counts what is left at the end).
    let app = PgPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await?;
    let (table, completed) = match layout {
        Layout::Released => (JobTable::default(), CompletedJobs::Keep),
        Layout::InPlaceDeleting => (JobTable::default().in_place_claims(), CompletedJobs::Delete),
    };
    table.migrate(&app).await?;
    let first_id = enqueue_all(&app, &table, n, "noop").await?;

    let runs: Arc<Vec<AtomicU32>> = Arc::new((0..n).map(|_| AtomicU32::new(0)).collect());
    let total = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let handlers = 16;
    let pool = PgPoolOptions::new()
        .test_before_acquire(false)
        .max_connections(handlers as u32 + 10)
        .connect(&url)
        .await?;
    let store = PgStore::default_table(
        pool.clone(),
        table
            .store_options()
            .mode(ExecutionMode::Lease)
            .completed_jobs(completed),
    )
    .await?;
    let worker = Worker::new(
        store,
        Counted {
            first_id,
            runs: runs.clone(),
            total: total.clone(),
            open_transaction: false,
        },
        drain_options(handlers),
    )?;
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    wait_until_drained(&app, &table, first_id, &total, n, &running, started).await?;
    let elapsed = started.elapsed();
    shutdown.cancel();
    running.await??;
    let twice = runs
        .iter()
        .filter(|r| r.load(Ordering::Relaxed) != 1)
        .count();
    ensure!(
        twice == 0,
        "EXACTLY-ONCE VIOLATED: {twice} jobs ran other than once"
    );
    pool.close().await;
    app.close().await;
    // Dropped now, not at the next drain's start, so that no autovacuum
    // of its finished rows can fall into the next system's drain.
    drop_database(admin).await?;
    Ok(n as f64 / elapsed.as_secs_f64())
}

async fn drop_database(admin: &PgPool) -> Result<()> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)"
    )))
    .execute(admin)
    .await?;
    Ok(())
}

/// For each size, this queue's cold drains (as released, and like for
/// like) and graphile_worker's (at its best, and as met), one after the
/// other for `sizes.rounds` rounds ([`rotating`]); medians.
pub(super) async fn head_to_head(
    peers: &Peers,
    pg: &Postgres,
    pool: &PgPool,
    sizes: &Sizes,
    results: &mut Results,
) -> Result<()> {
    for &jobs in sizes.cold_jobs {
        let label = format!("cold, {jobs} jobs");
        let [ours, ours_like_theirs, best, as_met] =
            rotating(&label, sizes.rounds, move |which| async move {
                let treatment = match which {
                    0 => return drain(pool, &pg.url, jobs, Layout::Released).await,
                    1 => return drain(pool, &pg.url, jobs, Layout::InPlaceDeleting).await,
                    2 => GraphileCold::BEST,
                    _ => GraphileCold::AS_MET,
                };
                peers.graphile_drain(pg, jobs, Some(treatment)).await
            })
            .await?;
        results.add_median("cold", &rows::cold_ours(jobs), "jobs/s", &ours);
        results.add_median(
            "cold",
            &rows::cold_ours_in_place_deleting(jobs),
            "jobs/s",
            &ours_like_theirs,
        );
        results.add_median("cold", &rows::cold_peer(jobs), "jobs/s", &best);
        results.add_median("cold", &rows::cold_peer_as_met(jobs), "jobs/s", &as_met);
    }
    Ok(())
}
