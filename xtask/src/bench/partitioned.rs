//! Claims on a table Postgres partitions by state against the default
//! table: the same waiting jobs ([`Sizes::waiting_rows`]) in each, one-job
//! claims from the start of the claim order, their p50 and p99, and the
//! ratio (issue 30's target: within 1.2×); the same on the default table
//! created partitioned by finish time. And [`retention`]: a month of
//! finished jobs dropped by the pruner on that table, a partition a day.
//!
//! The partitioned table has the default table's columns, `PARTITION BY
//! LIST (state)` into a live partition (queued, processing, errored) and a
//! finished one, keyed `(id, state)` as Postgres requires, with the
//! claim's two partial indexes (docs/existing-tables.md, "A partitioned
//! table").

use std::time::Instant;

use anyhow::{Context, Result};
use chrono::{DurationRound, TimeDelta, Utc};
use queue_core::{Admin, Job, JobState, PurgeParams, StatsParams};
use queue_store_postgres::{
    ExecutionMode, FinishPartitions, JobTable, PgAdmin, PgStore, PgStoreOptions,
};
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
    let by_time = partitioned_table(pool, "by_finish_time").await?;
    let by_time = measure(
        pool,
        by_time.store_options(),
        &by_time.name().quoted(),
        waiting,
    )
    .await?;
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
    results.add_against(
        "partitioned",
        "claim p50, partitioned / the default table",
        partitioned.0 / plain.0,
        "x",
        format!("p99 {:.2}x", partitioned.1 / plain.1),
        (None, Some(1.2)),
    );
    results.add_against(
        "partitioned",
        "claim p50, the default table partitioned by finish time / the default table",
        by_time.0 / plain.0,
        "x",
        format!(
            "{:.2} ms against {:.2}; p99 {:.2}x",
            by_time.0,
            plain.0,
            by_time.1 / plain.1
        ),
        (None, Some(1.2)),
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

/// The default table `queue_bench.<name>`, created anew partitioned by
/// finish time, a partition a day.
pub(super) async fn partitioned_table(pool: &PgPool, name: &str) -> Result<JobTable> {
    let table =
        JobTable::new("queue_bench", name)?.partitioned_by_finish_time(FinishPartitions::DAILY);
    super::cluster::created_anew(pool, table).await
}

/// `rows` jobs that finished over the 30 days before yesterday, a day's
/// partition each, in the default table partitioned by finish time
/// (vacuumed and analyzed, as autovacuum leaves each partition); then a
/// purge of every job finished before yesterday, timed, which drops every
/// partition;
/// and the figures of the table before, the median of 15 reads.
pub(super) async fn retention(pool: &PgPool, rows: u64, results: &mut Results) -> Result<()> {
    let table = partitioned_table(pool, "by_finish_time").await?;
    let t = table.name().quoted();
    let today = Utc::now().duration_trunc(TimeDelta::days(1))?;
    let first = today - TimeDelta::days(31);
    for back in 2..=31 {
        for state in ["completed", "failed", "canceled"] {
            make_day(pool, &table, state, today - TimeDelta::days(back)).await?;
        }
    }
    let step_ms = 30.0 * 86_400_000.0 / rows as f64;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {t} (kind, payload, state, queued_at, started_at, finished_at, failure_message) \
         SELECT 'kind_' || (g % 20), jsonb_build_object('n', g), \
         CASE WHEN g % 50 = 7 THEN 'failed' WHEN g % 200 = 3 THEN 'canceled' ELSE 'completed' END, \
         $2 + g * {step_ms} * interval '1 millisecond', \
         $2 + g * {step_ms} * interval '1 millisecond', \
         $2 + g * {step_ms} * interval '1 millisecond', \
         CASE WHEN g % 50 = 7 THEN 'boom ' || g END \
         FROM generate_series(0, $1::int8 - 1) AS g"
    )))
    .bind(i64::try_from(rows)?)
    .bind(first)
    .execute(pool)
    .await
    .context("the finished jobs")?;
    sqlx::query(sqlx::AssertSqlSafe(format!("VACUUM ANALYZE {t}")))
        .execute(pool)
        .await?;
    let admin = PgAdmin::<i64>::new(pool.clone(), table.store_options()).await?;
    let params = || StatsParams::new(Utc::now(), Utc::now() - TimeDelta::seconds(60));
    admin.stats(params()).await?;
    let mut reads = Vec::new();
    for _ in 0..15 {
        let started = Instant::now();
        admin.stats(params()).await?;
        reads.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    let figures = super::report::median(&reads);
    // The partitions of finished jobs, read from the catalog alone (a read
    // of the table would wait for the detaches' locks, and hold them up).
    let attached = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_catalog.pg_inherits AS i \
             JOIN pg_catalog.pg_class AS p ON p.oid = i.inhparent \
             WHERE p.relnamespace = 'queue_bench'::regnamespace \
             AND p.relname IN ('by_finish_time_completed', 'by_finish_time_failed', 'by_finish_time_canceled')",
        )
        .fetch_one(pool)
        .await
    };
    let kept = attached().await? - 90;
    let started = Instant::now();
    // Every job finished before yesterday, as `queue purge --older-than`
    // purges (the pruner takes one state at a time, each as this).
    let pruning = {
        let admin = admin.clone();
        tokio::spawn(async move {
            let mut params = PurgeParams::new(
                vec![JobState::Completed, JobState::Failed, JobState::Canceled],
                today - TimeDelta::days(1),
                5_000,
            );
            let mut purged = 0;
            loop {
                let batch = admin.purge(&params).await?;
                purged += batch.purged;
                if batch.found < params.limit as u64 {
                    return Ok::<u64, queue_core::StoreError>(purged);
                }
                params.finished_from = batch.last_finished.or(params.finished_from);
            }
        })
    };
    let mut gone = None;
    while !pruning.is_finished() {
        if gone.is_none() && attached().await? <= kept {
            gone = Some(started.elapsed().as_secs_f64());
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    let purged = pruning.await??;
    let took = started.elapsed().as_secs_f64();
    let gone = gone.unwrap_or(took);
    let left: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {t}")))
        .fetch_one(pool)
        .await?;
    anyhow::ensure!(left == 0, "{left} jobs were left after the retention pass");
    results.add_against(
        "partitioned",
        format!(
            "retention of {} finished jobs, a partition a day",
            thousands(rows)
        ),
        gone * 1000.0,
        "ms",
        format!(
            "until the 90 partitions were detached (the jobs gone from the table); {:.0} ms until \
             their files were dropped too; {} jobs counted by the planner's statistics; \
             figures (stats) on the table before: {figures:.1} ms",
            took * 1000.0,
            thousands(purged)
        ),
        (None, Some(1000.0)),
    );
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {t} CASCADE")))
        .execute(pool)
        .await?;
    Ok(())
}

/// Makes `table`'s partition of jobs finished in `state` on the day that
/// starts at `start`, as the store would have made it at the time (its
/// name is the store's: `<table>_<state>_p<YYYYMMDD>`).
pub(super) async fn make_day(
    pool: &PgPool,
    table: &JobTable,
    state: &str,
    start: chrono::DateTime<Utc>,
) -> Result<()> {
    let schema = table.name().schema.quoted();
    let name = table.name().name.as_str();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {schema}.\"{name}_{state}_p{}\" \
         PARTITION OF {schema}.\"{name}_{state}\" FOR VALUES FROM ('{}') TO ('{}')",
        start.format("%Y%m%d"),
        start.to_rfc3339(),
        (start + TimeDelta::days(1)).to_rfc3339()
    )))
    .execute(pool)
    .await
    .context("a day's partition")?;
    Ok(())
}
