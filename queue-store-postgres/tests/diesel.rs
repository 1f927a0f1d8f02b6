//! Enqueue inside diesel transactions, sync (`diesel::PgConnection`) and
//! async (`diesel_async::AsyncPgConnection`): a rolled-back transaction
//! leaves no job; a committed one wakes an idle worker through NOTIFY.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use queue_core::{CancellationToken, Handler, Job, JobContext, JobError, NewJob};
use queue_store_postgres::{JobTable, PgJobTransaction, PgStore};
use queue_worker::{Worker, WorkerOptions};
use sqlx::PgPool;
use support::{count_in, fresh_table, pool};

struct Counts(Arc<AtomicUsize>);

#[async_trait]
impl Handler<PgStore<Job>> for Counts {
    async fn handle(
        &self,
        _: &JobContext,
        _: &mut PgJobTransaction,
        _: &Job,
    ) -> Result<(), JobError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// A worker that polls only every minute: a job it runs within seconds was
/// announced by NOTIFY.
async fn idle_worker(pool: &PgPool, table: &JobTable) -> (CancellationToken, Arc<AtomicUsize>) {
    let store: PgStore<Job> = PgStore::default_table(pool.clone(), table.store_options())
        .await
        .expect("a store");
    let ran = Arc::new(AtomicUsize::new(0));
    let options = WorkerOptions {
        poll_interval: Duration::from_secs(60),
        ..WorkerOptions::default()
    };
    let worker = Worker::new(store, Counts(ran.clone()), options).expect("a worker");
    let shutdown = CancellationToken::new();
    tokio::spawn(worker.run(shutdown.clone()));
    // Let it make its first (empty) claim and start waiting.
    tokio::time::sleep(Duration::from_millis(300)).await;
    (shutdown, ran)
}

async fn ran_within(ran: &AtomicUsize, n: usize, limit: Duration) -> bool {
    let started = Instant::now();
    while started.elapsed() < limit {
        if ran.load(Ordering::SeqCst) >= n {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

fn job(n: i32) -> NewJob {
    NewJob::new("welcome", serde_json::json!({ "user": n }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_diesel_transaction_enqueues_on_commit_only() {
    use diesel::Connection;
    let Some(pool) = pool("a_sync_diesel_transaction_enqueues_on_commit_only").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let (shutdown, ran) = idle_worker(&pool, &table).await;
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let (rolled_back, committed) = {
        let table = table.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = diesel::PgConnection::establish(&url).expect("a diesel connection");
            let rolled_back = conn.transaction::<(), diesel::result::Error, _>(|conn| {
                let done = table.enqueue_diesel(conn, &[job(1)]).expect("enqueued");
                assert!(done[0].inserted);
                Err(diesel::result::Error::RollbackTransaction)
            });
            let committed = conn
                .transaction::<_, diesel::result::Error, _>(|conn| {
                    Ok(table.enqueue_diesel(conn, &[job(2)]).expect("enqueued"))
                })
                .expect("committed");
            (rolled_back.is_err(), committed)
        })
        .await
        .expect("joined")
    };
    assert!(rolled_back);
    assert!(committed[0].inserted);
    assert!(
        ran_within(&ran, 1, Duration::from_secs(5)).await,
        "the committed job woke the idle worker"
    );
    // The completion lands a few milliseconds after the handler returns
    // (completions are batched).
    let started = Instant::now();
    while count_in(&pool, &table, "completed").await < 1 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the job that ran was not completed within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shutdown.cancel();
    let total: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {}",
        table.name().quoted()
    )))
    .fetch_one(&pool)
    .await
    .expect("counted");
    assert_eq!(total, 1, "the rolled-back job left nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_diesel_transaction_enqueues_on_commit_only() {
    use diesel_async::scoped_futures::ScopedFutureExt;
    use diesel_async::{AsyncConnection, AsyncPgConnection};
    let Some(pool) = pool("an_async_diesel_transaction_enqueues_on_commit_only").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let (shutdown, ran) = idle_worker(&pool, &table).await;
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let mut conn = AsyncPgConnection::establish(&url)
        .await
        .expect("a diesel-async connection");
    let rolled_back = conn
        .transaction::<(), diesel::result::Error, _>(|conn| {
            let table = table.clone();
            async move {
                let done = table
                    .enqueue_diesel_async(conn, &[job(1)])
                    .await
                    .expect("enqueued");
                assert!(done[0].inserted);
                Err(diesel::result::Error::RollbackTransaction)
            }
            .scope_boxed()
        })
        .await;
    assert!(rolled_back.is_err());
    let committed = conn
        .transaction::<_, diesel::result::Error, _>(|conn| {
            let table = table.clone();
            async move {
                Ok(table
                    .enqueue_diesel_async(conn, &[job(2)])
                    .await
                    .expect("enqueued"))
            }
            .scope_boxed()
        })
        .await
        .expect("committed");
    assert!(committed[0].inserted);
    assert!(
        ran_within(&ran, 1, Duration::from_secs(5)).await,
        "the committed job woke the idle worker"
    );
    shutdown.cancel();
    let total: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {}",
        table.name().quoted()
    )))
    .fetch_one(&pool)
    .await
    .expect("counted");
    assert_eq!(total, 1, "the rolled-back job left nothing");
}
