//! On a table without a failure counter retries cannot be bounded, so a
//! retryable error fails the job, and the worker says so: its report,
//! metrics and PostHandle count a failure, not a retry.

mod support;

use std::time::Duration;

use async_trait::async_trait;
use queue_core::{CancellationToken, Handler, Job, JobContext, JobError, NewJob, Store};
use queue_store_postgres::{Column, ExecutionMode, PgJobTransaction, PgStore};
use queue_worker::{Worker, WorkerOptions};
use support::{count_in, fresh_table, pool};

struct Flaky;

#[async_trait]
impl Handler<PgStore<Job>> for Flaky {
    async fn handle(
        &self,
        _: &JobContext,
        _: &mut PgJobTransaction,
        _: &Job,
    ) -> Result<(), JobError> {
        Err(JobError::retry("upstream 503"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_the_store_cannot_count_is_reported_as_the_failure_it_is() {
    let Some(pool) = pool("a_retry_the_store_cannot_count_is_reported_as_the_failure_it_is").await
    else {
        return;
    };
    let table = fresh_table(&pool).await;
    let store = PgStore::default_table(
        pool.clone(),
        table
            .store_options()
            .without(Column::NumFailures)
            .expect("valid options")
            .mode(ExecutionMode::Lease),
    )
    .await
    .expect("a store without a failure counter");
    assert!(!store.counts_failures());
    table
        .enqueue(&pool, &NewJob::new("k", serde_json::json!(null)))
        .await
        .expect("enqueue");
    let stop = CancellationToken::new();
    let options = WorkerOptions {
        poll_interval: Duration::from_millis(50),
        ..WorkerOptions::default()
    };
    let worker = Worker::new(store, Flaky, options).expect("a worker");
    let running = tokio::spawn(worker.run(stop.clone()));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while count_in(&pool, &table, "failed").await == 0 {
        assert!(std::time::Instant::now() < deadline, "the job never failed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    let report = running.await.expect("the worker task").expect("the worker");
    assert_eq!(
        (report.count("retried"), report.count("failed")),
        (0, 1),
        "the report counts what happened: a failure"
    );
    let message: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT failure_message FROM {}",
        table.name().quoted()
    )))
    .fetch_one(&pool)
    .await
    .expect("the message");
    assert!(
        message.starts_with("upstream 503 (not retried: the store counts no failures"),
        "{message}"
    );
}
