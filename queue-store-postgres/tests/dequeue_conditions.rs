//! PreDequeue conditions on Postgres: a literal brace is written doubled,
//! and a condition the store refuses fails that claim, loudly, without
//! stopping the worker.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use queue_core::{
    BoxError, CancellationToken, ClaimParams, Dequeue, DequeueContext, Handler, Job, JobContext,
    JobError, NewJob, Store, StoreError,
};
use queue_store_postgres::{PgCondition, PgConditions, PgJobTransaction, PgStore};
use queue_worker::{Worker, WorkerOptions};
use support::{count_in, fresh_table, pool};

#[tokio::test]
async fn a_condition_with_escaped_braces_claims_and_a_miscounted_one_is_refused() {
    let test = "a_condition_with_escaped_braces_claims_and_a_miscounted_one_is_refused";
    let Some(pool) = pool(test).await else { return };
    let table = fresh_table(&pool).await;
    let store: PgStore<Job> = PgStore::default_table(pool.clone(), table.store_options())
        .await
        .expect("a store");
    table
        .enqueue_many(&pool, &[NewJob::new("k", serde_json::json!({"tier": 1}))])
        .await
        .expect("enqueued");
    let claim = |conditions: PgConditions| {
        let store = store.clone();
        async move {
            store
                .claim(ClaimParams {
                    limit: 1,
                    worker: "w",
                    conditions: Some(&conditions),
                    now: chrono::Utc::now(),
                })
                .await
                .map(|jobs| jobs.len())
        }
    };
    let miscounted = claim(vec![PgCondition::new("jobs.payload <> '{}'::jsonb")]).await;
    assert!(
        matches!(&miscounted, Err(StoreError::Conditions(m)) if m.contains("1 placeholders but 0 bound values") && m.contains("{{")),
        "{miscounted:?}"
    );
    let bad_sql = claim(vec![PgCondition::new("jobs.no_such_column = {}").bind(1i64)]).await;
    assert!(
        matches!(&bad_sql, Err(StoreError::Conditions(m)) if m.contains("no_such_column")),
        "a condition the database refuses names itself: {bad_sql:?}"
    );
    let escaped = claim(vec![PgCondition::new(
        "jobs.payload <> '{{}}'::jsonb AND jobs.kind = {}",
    )
    .bind("k")])
    .await;
    assert_eq!(escaped.expect("the escaped condition claims"), 1);
}

/// Gives a condition the database refuses on its first two claims, then
/// a good one.
struct Hook {
    asked: AtomicUsize,
    ran: Arc<AtomicUsize>,
}

#[async_trait]
impl Handler<PgStore<Job>> for Hook {
    async fn pre_dequeue(&self, _: &DequeueContext<'_>) -> Result<Dequeue<PgConditions>, BoxError> {
        let condition = if self.asked.fetch_add(1, Ordering::SeqCst) < 2 {
            PgCondition::new("jobs.no_such_column = {}").bind(1i64)
        } else {
            PgCondition::new("jobs.payload <> '{{}}'::jsonb")
        };
        Ok(Dequeue::Go {
            conditions: Some(vec![condition]),
            limit: None,
        })
    }

    async fn handle(
        &self,
        _: &JobContext,
        _: &mut PgJobTransaction,
        _: &Job,
    ) -> Result<(), JobError> {
        self.ran.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[tokio::test]
async fn a_refused_condition_does_not_stop_the_worker() {
    let test = "a_refused_condition_does_not_stop_the_worker";
    let Some(pool) = pool(test).await else { return };
    let table = fresh_table(&pool).await;
    let store: PgStore<Job> = PgStore::default_table(pool.clone(), table.store_options())
        .await
        .expect("a store");
    table
        .enqueue_many(&pool, &[NewJob::new("k", serde_json::json!({"n": 1}))])
        .await
        .expect("enqueued");
    let ran = Arc::new(AtomicUsize::new(0));
    let hook = Hook {
        asked: AtomicUsize::new(0),
        ran: ran.clone(),
    };
    let options = WorkerOptions {
        poll_interval: Duration::from_millis(100),
        ..WorkerOptions::default().handlers(1)
    };
    let worker = Worker::new(store, hook, options).expect("a worker");
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while count_in(&pool, &table, "completed").await < 1 {
        assert!(
            !running.is_finished(),
            "the worker stopped on a refused condition"
        );
        assert!(tokio::time::Instant::now() < deadline, "the job never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    running
        .await
        .expect("joined")
        .expect("the worker ended cleanly");
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}
