//! Enqueue over HTTP against enqueue straight into the database: single-job
//! requests to `queue serve` (the release binary, its own process) from 16
//! keep-alive clients, against single inserts from 16 connections, in
//! alternating rounds on the same table.

use std::time::Instant;

use anyhow::{bail, Result};
use queue_core::NewJob;
use queue_store_postgres::JobTable;
use sqlx::PgPool;

use crate::served::{self, Served};

/// Concurrent clients, and connections, on each side.
const CLIENTS: usize = 16;

/// The medians of the rounds, in jobs per second.
pub struct HttpEnqueue {
    pub direct: f64,
    pub http: f64,
}

/// Starts `queue serve` (this profile's binary) on `table`.
fn serve(url: &str, table: &JobTable) -> Result<Served> {
    served::serve_table(url, table, "bench-http-enqueue.toml")
}

/// `n` single inserts from [`CLIENTS`] connections; jobs per second.
async fn direct(pool: &PgPool, table: &JobTable, n: usize) -> Result<f64> {
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for client in 0..CLIENTS {
        let (pool, table) = (pool.clone(), table.clone());
        tasks.spawn(async move {
            for i in 0..n / CLIENTS {
                table
                    .enqueue(&pool, &NewJob::new("noop", serde_json::json!([client, i])))
                    .await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok((n / CLIENTS * CLIENTS) as f64 / started.elapsed().as_secs_f64())
}

/// `n` single-job POSTs from [`CLIENTS`] keep-alive clients; jobs per
/// second.
async fn http(base: &str, n: usize) -> Result<f64> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(CLIENTS)
        .build()?;
    let url = format!("{base}/api/jobs");
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..CLIENTS {
        let (client, url) = (client.clone(), url.clone());
        tasks.spawn(async move {
            for i in 0..n / CLIENTS {
                let response = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(format!(r#"{{"kind": "noop", "payload": [{c}, {i}]}}"#))
                    .send()
                    .await?;
                if response.status() != reqwest::StatusCode::CREATED {
                    bail!("POST /api/jobs answered {}", response.status());
                }
                response.bytes().await?;
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok((n / CLIENTS * CLIENTS) as f64 / started.elapsed().as_secs_f64())
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    }
}

/// `rounds` alternating rounds of `n` jobs each way.
pub async fn measure(
    url: &str,
    pool: &PgPool,
    table: &JobTable,
    n: usize,
    rounds: usize,
) -> Result<HttpEnqueue> {
    let server = serve(url, table)?;
    let base = server.base.clone();
    // One request first: the server's pool opens, its statements prepare.
    http(&base, CLIENTS).await?;
    let (mut directs, mut https) = (Vec::new(), Vec::new());
    for _ in 0..rounds.max(1) {
        directs.push(direct(pool, table, n).await?);
        https.push(http(&base, n).await?);
    }
    Ok(HttpEnqueue {
        direct: median(directs),
        http: median(https),
    })
}
