//! Connection faults are the store's, not the job's: a job whose
//! connection is killed while its handler runs is handed back without a
//! failure counted (an at-most-once job fails instead), a stashed
//! connection whose backend died while it waited is replaced before a job's
//! transaction or a claim uses it, and a new connection gets the job
//! transaction's prepared statements with its first lock.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use queue_core::{
    Admin, CancellationToken, Handler, Job, JobContext, JobError, JobState, NewJob, Store,
    Transition, WriteResult,
};
use queue_store_postgres::{ExecutionMode, PgJobTransaction, PgStore};
use queue_worker::{Worker, WorkerOptions};
use sqlx::PgPool;
use support::{backend_pid, claim_now, complete, fresh_table, pool};

async fn kill(pool: &PgPool, pid: i32) {
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(pool)
        .await
        .expect("pg_terminate_backend");
    assert!(killed, "backend {pid} was not there to kill");
    // The backend is gone once pg_stat_activity no longer lists it.
    for _ in 0..200 {
        let alive: bool =
            sqlx::query_scalar("SELECT count(*) > 0 FROM pg_stat_activity WHERE pid = $1")
                .bind(pid)
                .fetch_one(pool)
                .await
                .expect("pg_stat_activity");
        if !alive {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("backend {pid} outlived pg_terminate_backend");
}

/// A transactional store over a fresh table with one job, claimed.
async fn one_claimed_job(pool: &PgPool) -> (PgStore<Job>, queue_core::Claimed<PgStore<Job>>) {
    let table = fresh_table(pool).await;
    let store = support::store(pool, &table, ExecutionMode::Transactional).await;
    table
        .enqueue(pool, &NewJob::new("k", serde_json::json!(null)))
        .await
        .unwrap();
    let job = claim_now(&store, 1).await.pop().expect("a job");
    (store, job)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_connection_is_killed_under_its_handler_is_cut_off_not_failed() {
    let Some(pool) = pool("a_job_whose_connection_is_killed_under_its_handler").await else {
        return;
    };
    let (store, mut job) = one_claimed_job(&pool).await;
    let conn = job
        .job_store
        .transaction()
        .await
        .expect("the job's transaction");
    let pid = backend_pid(conn).await;
    kill(&pool, pid).await;
    let conn = job
        .job_store
        .transaction()
        .await
        .expect("still open to sqlx");
    let error = sqlx::query("SELECT 1")
        .execute(conn)
        .await
        .expect_err("the connection is dead");
    let why = store
        .attempt_cut_off(&mut job.job_store)
        .await
        .unwrap_or_else(|| panic!("the store saw no cut-off after {error}"));
    assert!(why.contains("connection"), "{why}");
    // What the worker then writes: the job queued again, nothing counted.
    let written = store
        .finish(
            job.job_store,
            &job.lease,
            Transition::Release,
            chrono::Utc::now(),
        )
        .await
        .expect("the hand-back");
    assert_eq!(written, WriteResult::Applied);
    let view = store.get(&job.lease.id).await.unwrap().expect("the job");
    assert_eq!(
        (view.state, view.num_failures),
        (Some(JobState::Queued), Some(0))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handlers_own_failure_on_a_live_transaction_stays_the_handlers() {
    let Some(pool) = pool("a_handlers_own_failure_on_a_live_transaction").await else {
        return;
    };
    let (store, mut job) = one_claimed_job(&pool).await;
    let conn = job
        .job_store
        .transaction()
        .await
        .expect("the job's transaction");
    sqlx::query("SELECT 1/0")
        .execute(conn)
        .await
        .expect_err("division by zero");
    assert_eq!(store.attempt_cut_off(&mut job.job_store).await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stashed_connection_that_died_is_replaced_before_a_job_uses_it() {
    let Some(pool) = pool("a_stashed_connection_that_died_is_replaced").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let store = support::store(&pool, &table, ExecutionMode::Transactional).await;
    for n in 0..3 {
        table
            .enqueue(&pool, &NewJob::new("k", serde_json::json!(n)))
            .await
            .unwrap();
    }
    let mut jobs = claim_now(&store, 2).await;
    let mut second = jobs.pop().expect("two jobs");
    let mut first = jobs.pop().expect("two jobs");
    // The first job commits with `COMMIT AND CHAIN`: its connection waits in
    // the stash for the next job's transaction. Its backend is killed there.
    let pid = backend_pid(first.job_store.transaction().await.unwrap()).await;
    assert_eq!(complete(&store, first).await, WriteResult::Applied);
    kill(&pool, pid).await;
    let conn = second
        .job_store
        .transaction()
        .await
        .expect("the second job's transaction opens on a live connection");
    assert_ne!(backend_pid(conn).await, pid);
    assert_eq!(complete(&store, second).await, WriteResult::Applied);

    // A claim on a dead stashed connection claims on a new one too: a
    // store on a pool of its own (named, so that only its backends die)
    // claims and completes a job, then every backend of that pool is killed.
    let options = (*pool.connect_options())
        .clone()
        .application_name("queue-test-dead-stash");
    let own = sqlx::postgres::PgPoolOptions::new()
        .test_before_acquire(false)
        .max_connections(4)
        .connect_with(options)
        .await
        .unwrap();
    let store = support::store(&own, &table, ExecutionMode::Transactional).await;
    let mut third = claim_now(&store, 1).await;
    third[0].job_store.transaction().await.unwrap();
    assert_eq!(
        complete(&store, third.remove(0)).await,
        WriteResult::Applied
    );
    let pids: Vec<i32> = sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'queue-test-dead-stash'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert!(!pids.is_empty());
    for pid in pids {
        kill(&pool, pid).await;
    }
    table
        .enqueue(&pool, &NewJob::new("k", serde_json::json!(3)))
        .await
        .unwrap();
    assert_eq!(claim_now(&store, 1).await.len(), 1);
}

/// Kills its own job's connection on the first attempt, as a killed
/// backend would, then runs normally.
struct KilledOnce {
    pool: PgPool,
    attempts: Arc<AtomicUsize>,
}

#[async_trait]
impl Handler<PgStore<Job>> for KilledOnce {
    async fn handle(
        &self,
        _: &JobContext,
        store: &mut PgJobTransaction,
        _: &Job,
    ) -> Result<(), JobError> {
        let conn = store.transaction().await.map_err(JobError::retry)?;
        if self.attempts.fetch_add(1, Ordering::SeqCst) == 0 {
            let pid = backend_pid(conn).await;
            kill(&self.pool, pid).await;
        }
        let conn = store.transaction().await.map_err(JobError::retry)?;
        sqlx::query("SELECT 1").execute(conn).await?;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_hands_back_a_cut_off_job_and_fails_an_at_most_once_one() {
    let Some(pool) = pool("the_worker_hands_back_a_cut_off_job").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let store = support::store(&pool, &table, ExecutionMode::Transactional).await;
    let run = |attempts: Arc<AtomicUsize>| {
        let worker = Worker::new(
            store.clone(),
            KilledOnce {
                pool: pool.clone(),
                attempts,
            },
            WorkerOptions {
                poll_interval: Duration::from_millis(50),
                ..WorkerOptions::default()
            },
        )
        .expect("valid options");
        let shutdown = CancellationToken::new();
        (shutdown.clone(), tokio::spawn(worker.run(shutdown)))
    };
    let wait_until_final = |id: i64| {
        let store = store.clone();
        async move {
            for _ in 0..500 {
                let view = store.get(&id).await.unwrap().expect("the job");
                if matches!(view.state, Some(JobState::Completed | JobState::Failed)) {
                    return view;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            panic!("job {id} never finished");
        }
    };

    let id = table
        .enqueue(&pool, &NewJob::new("k", serde_json::json!(null)))
        .await
        .unwrap();
    let attempts = Arc::new(AtomicUsize::new(0));
    let (shutdown, running) = run(attempts.clone());
    let view = wait_until_final(id).await;
    shutdown.cancel();
    let report = running.await.unwrap().expect("the worker");
    assert_eq!(view.state, Some(JobState::Completed), "{view:?}");
    assert_eq!(
        view.num_failures,
        Some(0),
        "the killed attempt is not the job's failure"
    );
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
    assert_eq!(
        (report.count("interrupted"), report.count("completed")),
        (1, 1)
    );

    let id = table
        .enqueue(
            &pool,
            &NewJob::new("k", serde_json::json!(null)).at_most_once(),
        )
        .await
        .unwrap();
    let (shutdown, running) = run(Arc::new(AtomicUsize::new(0)));
    let view = wait_until_final(id).await;
    shutdown.cancel();
    running.await.unwrap().expect("the worker");
    assert_eq!(
        view.state,
        Some(JobState::Failed),
        "an at-most-once job is never started twice"
    );
    assert!(
        view.failure_message
            .as_deref()
            .is_some_and(|m| m.contains("never started twice")),
        "{view:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_connection_gets_the_prepared_statements_without_an_error() {
    let Some(pool) = pool("a_new_connection_gets_the_prepared_statements").await else {
        return;
    };
    let (store, mut job) = one_claimed_job(&pool).await;
    let conn = job
        .job_store
        .transaction()
        .await
        .expect("the job's transaction");
    // The DO block ahead of the first lock prepared both statements on this
    // new connection. (That it did so without an error on the server is
    // measured by `cargo xtask faults`, which reads the server's log.)
    let prepared: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM pg_prepared_statements WHERE name LIKE 'queue\\_%' ORDER BY name",
    )
    .fetch_all(&mut *conn)
    .await
    .expect("the job's transaction is usable");
    assert_eq!(prepared.len(), 2, "{prepared:?}");
    assert!(prepared[0].starts_with("queue_complete_") && prepared[1].starts_with("queue_lock_"));
    assert_eq!(complete(&store, job).await, WriteResult::Applied);
}
