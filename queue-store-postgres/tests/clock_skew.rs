//! Clocks that disagree with the database's by a minute: a worker whose
//! clock runs behind (its heartbeats would look a minute old) and a
//! resetter whose clock runs ahead (its cut-off would be a minute late)
//! leave a healthy job alone, because heartbeats are written and stalls
//! judged on the database's clock.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, TimeDelta, Utc};
use queue_core::{CancellationToken, Clock, Handler, Job, JobContext, JobError, NewJob};
use queue_store_postgres::{PgJobTransaction, PgStore};
use queue_worker::{Resetter, ResetterOptions, Worker, WorkerOptions};
use support::{count_in, fresh_table, pool};

/// The system clock, off by a fixed amount.
struct Skewed(TimeDelta);

impl Clock for Skewed {
    fn now(&self) -> DateTime<Utc> {
        Utc::now() + self.0
    }
}

/// Takes three seconds, ten times the stalled age's margin below.
struct Slow(Arc<AtomicUsize>);

#[async_trait]
impl Handler<PgStore<Job>> for Slow {
    async fn handle(
        &self,
        _: &JobContext,
        _: &mut PgJobTransaction,
        _: &Job,
    ) -> Result<(), JobError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(3)).await;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clocks_a_minute_off_reset_no_healthy_job() {
    let Some(pool) = pool("clocks_a_minute_off_reset_no_healthy_job").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    table
        .enqueue(&pool, &NewJob::new("slow", serde_json::json!(null)))
        .await
        .expect("enqueued");
    let behind: Arc<dyn Clock> = Arc::new(Skewed(TimeDelta::seconds(-60)));
    let ahead: Arc<dyn Clock> = Arc::new(Skewed(TimeDelta::seconds(60)));

    // The worker's process: its clock a minute behind.
    let worker_store: PgStore<Job> = PgStore::default_table(pool.clone(), table.store_options())
        .await
        .expect("a store");
    worker_store
        .set_clock(behind.clone())
        .await
        .expect("measured");
    assert!(
        (worker_store.admin().clock_offset() - TimeDelta::seconds(60)).abs()
            < TimeDelta::seconds(2),
        "the store sees the worker's clock a minute behind the database's: {:?}",
        worker_store.admin().clock_offset()
    );
    let ran = Arc::new(AtomicUsize::new(0));
    let options = WorkerOptions {
        heartbeat_interval: Duration::from_millis(200),
        poll_interval: Duration::from_millis(100),
        clock: behind,
        ..WorkerOptions::default()
    };
    let worker = Worker::new(worker_store, Slow(ran.clone()), options).expect("a worker");
    let shutdown = CancellationToken::new();
    let working = tokio::spawn(worker.run(shutdown.clone()));

    // The resetter's process: its clock a minute ahead, a 5 s stalled age.
    let resetter_store: PgStore<Job> = PgStore::default_table(pool.clone(), table.store_options())
        .await
        .expect("a store");
    resetter_store
        .set_clock(ahead.clone())
        .await
        .expect("measured");
    let resetter = Resetter::new(
        resetter_store,
        ResetterOptions {
            interval: Duration::from_millis(100),
            stalled_max_age: Duration::from_secs(5),
            clock: ahead,
            ..ResetterOptions::default()
        },
    )
    .expect("a resetter");
    let resetting = tokio::spawn(resetter.run(shutdown.clone()));

    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while count_in(&pool, &table, "completed").await < 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the job never completed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    working.await.expect("joined").expect("the worker ran");
    resetting.await.expect("joined").expect("the resetter ran");
    assert_eq!(ran.load(Ordering::SeqCst), 1, "the healthy job ran once");
    let resets: i32 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT num_resets FROM {}",
        table.name().quoted()
    )))
    .fetch_one(&pool)
    .await
    .expect("read");
    assert_eq!(resets, 0, "no reset of a healthy job");
    let heartbeat_lag: f64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT extract(epoch FROM finished_at - started_at)::float8 FROM {}",
        table.name().quoted()
    )))
    .fetch_one(&pool)
    .await
    .expect("read");
    assert!(
        (2.5..10.0).contains(&heartbeat_lag),
        "start and finish are on one clock: {heartbeat_lag} s apart"
    );
}
