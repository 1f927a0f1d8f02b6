//! A table of one's own that Postgres partitions by state (`PARTITION BY
//! LIST`): waiting and running jobs in one partition, finished ones in
//! another, so that every claim moves nothing and every completion moves
//! its row across. Its key is `(id, state)`, as a partitioned table's
//! unique key must hold the partition column. Drained in both modes, with
//! an operator failing running jobs at the same time (a second move of
//! the same row, racing the completion's), nothing is lost: every job ends
//! in exactly one finished state, in the finished partition, counted once.
//! An operator's write that meets a row as it moves is refused whole by
//! Postgres (SQLSTATE 40001); the store runs it again (about one a run
//! here), so the operator sees none.

mod support;

use std::time::{Duration, Instant};

use async_trait::async_trait;
use queue_core::{
    Admin, CancellationToken, Handler, Job, JobContext, JobError, JobFilter, JobState, NewJob,
    Targets,
};
use queue_store_postgres::{ExecutionMode, PgJobTransaction, PgStore};
use queue_worker::{Worker, WorkerOptions};
use sqlx::PgPool;
use support::{partitioned_by_state, pool, quoted_schema as quoted};

const JOBS: i64 = 600;

/// Takes a moment, so that the operator's writes meet running jobs.
struct Slow;

#[async_trait]
impl Handler<PgStore<Job>> for Slow {
    async fn handle(
        &self,
        _: &JobContext,
        _: &mut PgJobTransaction,
        _: &Job,
    ) -> Result<(), JobError> {
        tokio::time::sleep(Duration::from_millis(2)).await;
        Ok(())
    }
}

/// Rows per (partition, state) of `table` (quoted).
async fn placed(pool: &PgPool, table: &str) -> Vec<(String, String, i64)> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT tableoid::regclass::text, state, count(*) FROM {table} GROUP BY 1, 2 ORDER BY 1, 2"
    )))
    .fetch_all(pool)
    .await
    .expect("the rows per partition")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_partitioned_by_state_drains_and_loses_nothing_when_rows_move() {
    let test = "a_table_partitioned_by_state_drains_and_loses_nothing";
    let Some(pool) = pool(test).await else { return };
    for mode in [ExecutionMode::Lease, ExecutionMode::Transactional] {
        let (schema, options) = partitioned_by_state(&pool).await;
        let store = PgStore::<Job>::default_table(pool.clone(), options.mode(mode))
            .await
            .expect("a partitioned table is accepted");
        let table = format!("{}.tasks", quoted(&schema));
        let live = format!("{}.tasks_live", quoted(&schema));
        drain_beside_an_operator(&pool, &store, mode, &table, &live, |partition| {
            partition.ends_with("tasks_done\"") || partition.ends_with("tasks_done")
        })
        .await;
    }
}

/// The same on the default table created partitioned by finish time: its
/// rows move from the live partition to their state's partition of today.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_table_partitioned_by_finish_time_drains_and_loses_nothing() {
    let test = "the_default_table_partitioned_by_finish_time_drains_and_loses_nothing";
    let Some(pool) = pool(test).await else { return };
    for mode in [ExecutionMode::Lease, ExecutionMode::Transactional] {
        let table = support::fresh_partitioned_table(&pool).await;
        let store = support::store(&pool, &table, mode).await;
        let schema = table.name().schema.quoted();
        let today = chrono::Utc::now().format("%Y%m%d").to_string();
        drain_beside_an_operator(
            &pool,
            &store,
            mode,
            &table.name().quoted(),
            &format!("{schema}.jobs_live"),
            |partition| {
                partition.ends_with(&format!("jobs_completed_p{today}"))
                    || partition.ends_with(&format!("jobs_failed_p{today}"))
            },
        )
        .await;
    }
}

/// Drains `JOBS` jobs from `store` (on `table`, whose waiting and running
/// jobs are in `live`) while an operator fails the running ones of kind b;
/// every job ends once, in a partition `finished` accepts.
async fn drain_beside_an_operator(
    pool: &PgPool,
    store: &PgStore<Job>,
    mode: ExecutionMode,
    table: &str,
    live: &str,
    finished: impl Fn(&str) -> bool,
) {
    {
        let pool = pool.clone();
        let store = store.clone();
        let jobs: Vec<NewJob> = (0..JOBS)
            .map(|n| NewJob::new(if n % 2 == 0 { "a" } else { "b" }, serde_json::json!(n)))
            .collect();
        Admin::enqueue(&store, &jobs).await.expect("enqueued");
        let options = WorkerOptions {
            poll_interval: Duration::from_millis(20),
            ..WorkerOptions::default()
        };
        let worker = Worker::new(store.clone(), Slow, options).expect("a worker");
        let shutdown = CancellationToken::new();
        let running = tokio::spawn(worker.run(shutdown.clone()));

        // An operator fails running jobs of kind b while they run: each
        // such job ends failed or completed, whichever move came first.
        let running_b = JobFilter::default()
            .kinds(["b"])
            .states([JobState::Processing]);
        let mut failed_by_hand = 0;
        let mut conflicts = 0;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            // A write that meets a row another transaction has just moved
            // to the other partition is refused whole by Postgres
            // (SQLSTATE 40001); the store runs it again. Should that keep
            // happening, the caller gets a retryable Conflict that changed
            // nothing, and tries again as the operation runner does.
            match Admin::force_fail(
                &store,
                &Targets::matching(running_b.clone(), 20),
                "stopped by hand",
            )
            .await
            {
                Ok(report) => failed_by_hand += report.changed,
                Err(error) if error.is_retryable() => conflicts += 1,
                Err(error) => panic!("{mode:?}: {error}"),
            }
            let live: i64 =
                sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {live}")))
                    .fetch_one(&pool)
                    .await
                    .expect("the live rows");
            if live == 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{mode:?}: {live} jobs never finished"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        shutdown.cancel();
        let report = running.await.expect("joined").expect("the worker ran");
        println!("{mode:?}: {failed_by_hand} failed by hand, {conflicts} writes met a moved row");

        let rows = placed(&pool, table).await;
        let total: i64 = rows.iter().map(|(_, _, n)| n).sum();
        assert_eq!(total, JOBS, "{mode:?}: every job is there once: {rows:?}");
        for (partition, state, _) in &rows {
            assert!(
                finished(partition),
                "{mode:?}: {state} rows in {partition}: {rows:?}"
            );
        }
        let count = |state: &str| {
            rows.iter()
                .filter(|(_, s, _)| s == state)
                .map(|(_, _, n)| n)
                .sum::<i64>()
        };
        assert_eq!(
            count("failed"),
            failed_by_hand as i64,
            "{mode:?}: the jobs failed by hand are the failed ones: {rows:?}"
        );
        assert_eq!(
            count("completed") + count("failed"),
            JOBS,
            "{mode:?}: {rows:?}"
        );
        assert_eq!(
            report.count("completed") as i64,
            count("completed"),
            "{mode:?}: the worker counted each completion it recorded, none it lost to the operator"
        );

        // The operator's reads see the moved rows.
        let stats = Admin::stats(
            &store,
            queue_core::StatsParams::new(chrono::Utc::now(), chrono::Utc::now()),
        )
        .await
        .expect("the figures");
        let counted: u64 = stats.counts.iter().map(|c| c.count).sum();
        assert_eq!(counted as i64, JOBS, "{mode:?}: {stats:?}");
        let page = Admin::list(
            &store,
            &queue_core::ListParams::first(JobFilter::default().kinds(["a"]), 1000),
        )
        .await
        .expect("a page");
        assert_eq!(page.jobs.len() as i64, JOBS / 2, "{mode:?}");
    }
}
