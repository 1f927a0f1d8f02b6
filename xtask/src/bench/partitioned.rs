//! Claims on a table Postgres partitions by state against the default
//! table: the same waiting jobs ([`Sizes::waiting_rows`]) in each, one-job
//! claims from the start of the claim order, their p50 and p99, and the
//! ratio (issue 30's target: within 1.2×).
//!
//! The partitioned table has the default table's columns, `PARTITION BY
//! LIST (state)` into a live partition (queued, processing, errored) and a
//! finished one, keyed `(id, state)` as Postgres requires, with the
//! claim's two partial indexes (docs/existing-tables.md, "A partitioned
//! table").

use anyhow::Result;
use queue_core::Job;
use queue_store_postgres::{ExecutionMode, PgStore, PgStoreOptions};
use sqlx::PgPool;

use super::claims::one_job_claims;
use super::cluster::{fresh_table, thousands};
use super::quiet;
use super::report::Results;
use super::wake::percentiles;
use super::Sizes;

/// One-job claims timed on each table.
const CLAIMS: usize = 300;

/// Both tables, into `results`.
pub(super) async fn claims(pool: &PgPool, sizes: &Sizes, results: &mut Results) -> Result<()> {
    let waiting = sizes.waiting_rows;
    let table = fresh_table(pool, "unpartitioned").await?;
    let plain = measure(pool, table.store_options(), &table.name().quoted(), waiting).await?;
    let schema = "queue_bench_partitioned";
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE;
         CREATE SCHEMA {schema};
         CREATE TABLE {schema}.tasks (
           id bigserial, kind text NOT NULL, payload jsonb NOT NULL DEFAULT '{{}}',
           state text NOT NULL DEFAULT 'queued', priority int NOT NULL DEFAULT 0,
           failure_message text, queued_at timestamptz NOT NULL DEFAULT now(),
           started_at timestamptz, finished_at timestamptz, process_after timestamptz,
           num_failures int NOT NULL DEFAULT 0, num_resets int NOT NULL DEFAULT 0,
           last_heartbeat_at timestamptz, worker_hostname text, execution_logs json[],
           cancel boolean NOT NULL DEFAULT false, claim_token bigint NOT NULL DEFAULT 0,
           PRIMARY KEY (id, state)
         ) PARTITION BY LIST (state);
         CREATE TABLE {schema}.tasks_live PARTITION OF {schema}.tasks FOR VALUES IN ('queued', 'processing', 'errored');
         CREATE TABLE {schema}.tasks_done PARTITION OF {schema}.tasks FOR VALUES IN ('completed', 'failed', 'canceled');
         CREATE INDEX ON {schema}.tasks (priority DESC, id) WHERE state IN ('queued', 'errored') AND process_after IS NULL;
         CREATE INDEX ON {schema}.tasks (process_after) WHERE state IN ('queued', 'errored') AND process_after IS NOT NULL;
         CREATE INDEX ON {schema}.tasks (id) WHERE state = 'processing';"
    )))
    .execute(pool)
    .await?;
    let options = PgStoreOptions::new("tasks")?.schema(schema)?;
    let partitioned = measure(pool, options, &format!("{schema}.tasks"), waiting).await?;
    let note = |p99: f64| {
        format!(
            "{} waiting jobs, {CLAIMS} one-job claims from the start of the claim order; p99 {p99:.2} ms",
            thousands(waiting)
        )
    };
    results.add(
        "partitioned",
        "claim p50, the default table",
        plain.0,
        "ms",
        note(plain.1),
    );
    results.add(
        "partitioned",
        "claim p50, partitioned by state (live, finished)",
        partitioned.0,
        "ms",
        note(partitioned.1),
    );
    results.add(
        "partitioned",
        "claim p50, partitioned / the default table",
        partitioned.0 / plain.0,
        "x",
        format!("target ≤ 1.2; p99 {:.2}x", partitioned.1 / plain.1),
    );
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(pool)
        .await?;
    Ok(())
}

/// `waiting` jobs in the table `quoted` (the store's `options`), vacuumed
/// and analyzed; then the p50 and p99 of one-job claims, in ms.
async fn measure(
    pool: &PgPool,
    options: PgStoreOptions,
    quoted: &str,
    waiting: u64,
) -> Result<(f64, f64)> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {quoted} (kind, payload) SELECT 'noop', '{{}}' FROM generate_series(1, $1::int8)"
    )))
    .bind(i64::try_from(waiting)?)
    .execute(pool)
    .await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("VACUUM ANALYZE {quoted}")))
        .execute(pool)
        .await?;
    quiet::quiesce(pool).await?;
    // Every claim from the start of the claim order, as in the growth
    // scenario: the cursor would let each start after the last.
    let store = PgStore::<Job>::default_table(
        pool.clone(),
        options.mode(ExecutionMode::Lease).claim_cursor(None),
    )
    .await?;
    let p = percentiles(one_job_claims(&store, CLAIMS).await?);
    Ok((p.p50, p.p99))
}
