//! The worker on the Postgres store: draining in both modes, the
//! transactional guarantee (a failed attempt leaves no visible change),
//! cancellation of a running job, and wake-ups by LISTEN/NOTIFY, only after
//! commit and again after the listening connection is killed.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use queue_core::testkit::{Succeeds, UntilCancelled};
use queue_core::{
    Admin, CancellationToken, Handler, Job, JobContext, JobError, JobState, NewJob, Targets,
};
use queue_store_postgres::{ExecutionMode, JobTable, PgJobTransaction, PgStore};
use queue_worker::{Worker, WorkerOptions, WorkerReport};
use sqlx::PgPool;
use support::{count_in, fresh_table, fresh_table_named, pool, side_table};
use tokio::task::JoinHandle;

type Running = (
    CancellationToken,
    JoinHandle<Result<WorkerReport, queue_worker::WorkerError>>,
);

fn start<H: Handler<PgStore<Job>>>(
    store: &PgStore<Job>,
    handler: H,
    options: WorkerOptions,
) -> Running {
    let shutdown = CancellationToken::new();
    let worker = Worker::new(store.clone(), handler, options).expect("valid options");
    (shutdown.clone(), tokio::spawn(worker.run(shutdown)))
}

async fn stop(running: Running) -> WorkerReport {
    running.0.cancel();
    running.1.await.expect("worker task").expect("worker ran")
}

async fn state_of(pool: &PgPool, table: &JobTable, id: i64) -> Option<JobState> {
    let sql = format!("SELECT * FROM {} WHERE id = $1", table.name().quoted());
    let row = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
        .bind(id)
        .fetch_optional(pool)
        .await
        .expect("select")?;
    Some(
        queue_store_postgres::decode_job(&row)
            .expect("decode")
            .state,
    )
}

async fn wait_for(
    pool: &PgPool,
    table: &JobTable,
    id: i64,
    state: JobState,
    within: Duration,
) -> Duration {
    let start = Instant::now();
    loop {
        if state_of(pool, table, id).await == Some(state) {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "job {id} did not become {state} within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn options(handlers: usize) -> WorkerOptions {
    WorkerOptions {
        poll_interval: Duration::from_secs(30),
        heartbeat_interval: Duration::from_millis(50),
        cancel_grace: Duration::from_millis(200),
        ..WorkerOptions::default().handlers(handlers)
    }
}

async fn drains_all_jobs(mode: ExecutionMode, test: &str) {
    let Some(pool) = pool(test).await else { return };
    let table = fresh_table(&pool).await;
    let jobs: Vec<NewJob> = (0..500)
        .map(|n| NewJob::new("noop", serde_json::json!(n)))
        .collect();
    table.enqueue_many(&pool, &jobs).await.expect("enqueue");
    let store = support::store(&pool, &table, mode).await;
    let running = start(&store, Succeeds, options(8));
    let deadline = Instant::now() + Duration::from_secs(60);
    while count_in(&pool, &table, "completed").await < 500 {
        assert!(
            Instant::now() < deadline,
            "500 jobs did not drain within a minute"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let report = stop(running).await;
    assert_eq!(report.count("completed"), 500, "each job ran once");
    assert_eq!(count_in(&pool, &table, "completed").await, 500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_mode_drains_all_jobs() {
    drains_all_jobs(ExecutionMode::Lease, "lease_mode_drains_all_jobs").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactional_mode_drains_all_jobs() {
    drains_all_jobs(
        ExecutionMode::Transactional,
        "transactional_mode_drains_all_jobs",
    )
    .await;
}

/// Writes a row to a side table in the job's transaction, then fails when
/// the payload says so.
struct SideEffect {
    side: String,
}

#[async_trait]
impl Handler<PgStore<Job>> for SideEffect {
    async fn handle(
        &self,
        _: &JobContext,
        store: &mut PgJobTransaction,
        job: &Job,
    ) -> Result<(), JobError> {
        let conn = store.transaction().await.map_err(JobError::poison)?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {} (job_id) VALUES ($1)",
            self.side
        )))
        .bind(job.id)
        .execute(conn)
        .await?;
        match job.payload["then"].as_str() {
            Some("fail") => Err(JobError::poison("failing after the write")),
            Some("panic") => panic!("panicking after the write"),
            _ => Ok(()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_attempt_leaves_no_visible_change() {
    let Some(pool) = pool("a_failed_attempt_leaves_no_visible_change").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let side = side_table(&pool, &table, "side_effects", "job_id bigint NOT NULL").await;
    let ok = table
        .enqueue(&pool, &NewJob::new("k", serde_json::json!({"then": "ok"})))
        .await
        .unwrap();
    let fails = table
        .enqueue(
            &pool,
            &NewJob::new("k", serde_json::json!({"then": "fail"})),
        )
        .await
        .unwrap();
    let panics = table
        .enqueue(
            &pool,
            &NewJob::new("k", serde_json::json!({"then": "panic"})),
        )
        .await
        .unwrap();
    let store = support::store(&pool, &table, ExecutionMode::Transactional).await;
    let running = start(&store, SideEffect { side: side.clone() }, options(2));
    wait_for(
        &pool,
        &table,
        ok,
        JobState::Completed,
        Duration::from_secs(20),
    )
    .await;
    wait_for(
        &pool,
        &table,
        fails,
        JobState::Failed,
        Duration::from_secs(20),
    )
    .await;
    wait_for(
        &pool,
        &table,
        panics,
        JobState::Errored,
        Duration::from_secs(20),
    )
    .await;
    stop(running).await;
    let written: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT job_id FROM {side} ORDER BY job_id"
    )))
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        written,
        vec![ok],
        "only the successful attempt's write is visible"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_running_job_stops_it_in_both_modes() {
    let Some(pool) = pool("cancelling_a_running_job_stops_it_in_both_modes").await else {
        return;
    };
    for mode in [ExecutionMode::Lease, ExecutionMode::Transactional] {
        let table = fresh_table(&pool).await;
        let id = table
            .enqueue(&pool, &NewJob::new("k", serde_json::json!(null)))
            .await
            .unwrap();
        let store = support::store(&pool, &table, mode).await;
        let running = start(&store, UntilCancelled, options(1));
        wait_for(
            &pool,
            &table,
            id,
            JobState::Processing,
            Duration::from_secs(20),
        )
        .await;
        // A heartbeat may hold the row just then: the cancel tries the
        // row again after a moment, so one call reaches the job.
        let report = Admin::cancel(&store, &Targets::id(id)).await.unwrap();
        assert_eq!(
            report.stop_requested, 1,
            "{mode:?}: the running job takes the cancel flag: {report:?}"
        );
        wait_for(
            &pool,
            &table,
            id,
            JobState::Canceled,
            Duration::from_secs(20),
        )
        .await;
        let report = stop(running).await;
        assert_eq!(report.count("canceled"), 1, "{mode:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_wakes_idle_workers_only_after_commit() {
    let Some(pool) = pool("notify_wakes_idle_workers_only_after_commit").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let store = support::store(&pool, &table, ExecutionMode::Lease).await;
    // The poll interval is 30 s: only a notification can wake the worker in time.
    let running = start(&store, Succeeds, options(2));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut tx = pool.begin().await.unwrap();
    let id = table
        .enqueue(&mut *tx, &NewJob::new("k", serde_json::json!(null)))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        state_of(&pool, &table, id).await,
        None,
        "an uncommitted job is invisible"
    );
    tx.commit().await.unwrap();
    let latency = wait_for(
        &pool,
        &table,
        id,
        JobState::Completed,
        Duration::from_secs(5),
    )
    .await;
    stop(running).await;
    assert!(
        latency < Duration::from_secs(5),
        "woken by NOTIFY, not the 30 s poll"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listener_reconnects_after_its_connection_is_killed() {
    let Some(pool) = pool("the_listener_reconnects_after_its_connection_is_killed").await else {
        return;
    };
    // A table name, and so a channel, of its own: killing its listener
    // affects no other test.
    let table = fresh_table_named(&pool, &format!("reconnect_{}", std::process::id())).await;
    let channel = table.store_options().notify_channel();
    let store = support::store(&pool, &table, ExecutionMode::Lease).await;
    let running = start(&store, Succeeds, options(2));
    let listeners = || async {
        sqlx::query_scalar::<_, i32>(
            "SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN%' AND position($1 in query) > 0 AND pid <> pg_backend_pid()",
        )
        .bind(format!("\"{channel}\""))
        .fetch_all(&pool)
        .await
        .unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while listeners().await.is_empty() {
        assert!(Instant::now() < deadline, "no LISTEN connection appeared");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for pid in listeners().await {
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .execute(&pool)
            .await
            .unwrap();
    }
    // Give the listener time to notice and reconnect.
    let deadline = Instant::now() + Duration::from_secs(10);
    while listeners().await.is_empty() {
        assert!(Instant::now() < deadline, "the listener did not reconnect");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Let the wake-up of the reconnect itself pass, so that only the new
    // job's notification can wake the worker below.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let id = table
        .enqueue(&pool, &NewJob::new("k", serde_json::json!(null)))
        .await
        .unwrap();
    wait_for(
        &pool,
        &table,
        id,
        JobState::Completed,
        Duration::from_secs(5),
    )
    .await;
    stop(running).await;
}

#[tokio::test]
async fn worker_works_through_arc_store() {
    // A worker may also take an Arc of the store.
    let Some(pool) = pool("worker_works_through_arc_store").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let id = table
        .enqueue(&pool, &NewJob::new("k", serde_json::json!(null)))
        .await
        .unwrap();
    let store = Arc::new(
        PgStore::default_table(pool.clone(), table.store_options())
            .await
            .unwrap(),
    );
    let shutdown = CancellationToken::new();
    let worker = Worker::<PgStore<Job>, _>::new(store, Succeeds, options(1)).unwrap();
    let task = tokio::spawn(worker.run(shutdown.clone()));
    wait_for(
        &pool,
        &table,
        id,
        JobState::Completed,
        Duration::from_secs(20),
    )
    .await;
    shutdown.cancel();
    assert_eq!(task.await.unwrap().unwrap().count("completed"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jobs_transaction_locks_its_row_and_a_stale_attempt_rolls_back() {
    use queue_core::{ClaimParams, ResetParams, Store, Transition};
    let Some(pool) =
        pool("the_jobs_transaction_locks_its_row_and_a_stale_attempt_rolls_back").await
    else {
        return;
    };
    let table = fresh_table(&pool).await;
    let side = side_table(&pool, &table, "side", "job_id bigint").await;
    let id = table
        .enqueue(&pool, &NewJob::new("k", serde_json::json!(null)))
        .await
        .unwrap();
    let store = support::store(&pool, &table, ExecutionMode::Transactional).await;
    let now = chrono::Utc::now();
    let mut claimed = store
        .claim(ClaimParams {
            limit: 1,
            worker: "w",
            conditions: None,
            now,
        })
        .await
        .unwrap();
    let mut job = claimed.pop().expect("claimed");
    let conn = job
        .job_store
        .transaction()
        .await
        .expect("the job's transaction opens");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {side} VALUES ($1)"
    )))
    .bind(id)
    .execute(conn)
    .await
    .unwrap();

    // However old its heartbeat, a row the job's transaction locks is alive.
    let later = ResetParams {
        stalled_before: now + chrono::Duration::hours(1),
        max_resets: 5,
        delivery: Default::default(),
        now,
    };
    assert!(
        store.reset_stalled(later).await.unwrap().reset.is_empty(),
        "a locked row is not stalled"
    );

    // The key-share lock lets cancel flags through; then another claim takes
    // the job over (simulated by moving its claim token on).
    assert_eq!(
        Admin::cancel(&store, &Targets::id(id))
            .await
            .unwrap()
            .stop_requested,
        1,
        "cancel flags go through the key-share lock"
    );
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {} SET claim_token = claim_token + 1 WHERE id = $1",
        table.name().quoted()
    )))
    .bind(id)
    .execute(&pool)
    .await
    .unwrap();
    let result = store
        .finish(job.job_store, &job.lease, Transition::Complete, now)
        .await
        .unwrap();
    assert_eq!(
        result,
        queue_core::WriteResult::Stale,
        "the attempt no longer holds the job"
    );
    let written: i64 =
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {side}")))
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        written, 0,
        "a stale attempt's writes are rolled back, not committed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_scheduled_ahead_starts_when_due_without_a_notification_then() {
    let Some(pool) = pool("a_job_scheduled_ahead_starts_when_due").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let store = support::store(&pool, &table, ExecutionMode::Lease).await;
    // Polls every 30 s: only the due time can wake it in time.
    let running = start(&store, Succeeds, options(2));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let due = chrono::Utc::now() + chrono::TimeDelta::seconds(1);
    let id = table
        .enqueue(
            &pool,
            &NewJob::new("k", serde_json::json!(null)).process_after(due),
        )
        .await
        .unwrap();
    wait_for(
        &pool,
        &table,
        id,
        JobState::Completed,
        Duration::from_secs(10),
    )
    .await;
    let started: chrono::DateTime<chrono::Utc> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT started_at FROM {} WHERE id = $1",
        table.name().quoted()
    )))
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    stop(running).await;
    let late = started - due;
    assert!(
        late >= chrono::TimeDelta::zero() && late < chrono::TimeDelta::seconds(2),
        "started {late} after it came due (the poll interval is 30 s)"
    );
}
