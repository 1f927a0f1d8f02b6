//! Lock rides (transactional mode, `PgStoreOptions::lock_rides`): while
//! other jobs' commits flow and another job's transaction is open, a job's
//! lock rides on the next commit, which hands its connection on inside the
//! rider's locked transaction. A rider whose job moved on learns it while
//! the carrier still commits; a rider on a commit that fails locks by
//! itself; a rider that is gone leaves no lock behind. A worker of 32
//! handlers whose locks ride commits each job's writes once, with its
//! completion, and none of a failed job's.

mod support;

use std::time::Duration;

use queue_core::{Claimed, Job, NewJob, StoreError, WriteResult};
use queue_store_postgres::{ExecutionMode, JobTable, PgStore};
use sqlx::PgPool;
use support::{
    backend_pid, claim_now, complete, count_in, fresh_table, pool, row_unlocked, side_table,
    state_of,
};

/// Three claimed jobs on a store whose locks ride (waiting up to a minute,
/// so no ride in these tests ends for lack of time), after one commit so
/// that commits count as flowing.
struct Riding {
    pool: PgPool,
    table: JobTable,
    store: PgStore<Job>,
    /// The job whose commit carries the ride, until it commits.
    carrier: Option<Claimed<PgStore<Job>>>,
    carrier_id: i64,
    /// The job whose lock rides, until it completes.
    rider: Option<Claimed<PgStore<Job>>>,
    rider_id: i64,
}

impl Riding {
    async fn new(pool: &PgPool) -> Riding {
        let table = fresh_table(pool).await;
        let options = table
            .store_options()
            .mode(ExecutionMode::Transactional)
            .lock_rides(Some(Duration::from_secs(60)));
        let store = PgStore::default_table(pool.clone(), options)
            .await
            .expect("a store over the test table");
        let jobs: Vec<_> = (0..3)
            .map(|i| NewJob::new("k", serde_json::json!(i)))
            .collect();
        table.enqueue_many(pool, &jobs).await.expect("enqueue");
        let mut claimed = claim_now(&store, 3).await.into_iter();
        let (Some(mut first), Some(mut carrier), Some(rider)) =
            (claimed.next(), claimed.next(), claimed.next())
        else {
            panic!("three jobs claimed");
        };
        // No transaction open yet: the first two lock by themselves.
        first.job_store.transaction().await.expect("the first lock");
        assert_eq!(complete(&store, first).await, WriteResult::Applied);
        carrier
            .job_store
            .transaction()
            .await
            .expect("the carrier's lock");
        Riding {
            pool: pool.clone(),
            table,
            store,
            carrier_id: carrier.lease.id,
            carrier: Some(carrier),
            rider_id: rider.lease.id,
            rider: Some(rider),
        }
    }

    /// The rider asks for its transaction while the carrier, 100 ms later,
    /// completes: the rider's answer (its connection's backend), and the
    /// carrier's. Asserts that the rider waited for the carrier's commit
    /// (a lock of its own would have answered at once).
    async fn ride(&mut self) -> (Result<i32, StoreError>, WriteResult) {
        let carrier = self.carrier.take().expect("the carrier has not committed");
        let store = &self.store;
        let rider = self.rider.as_mut().expect("the rider has not completed");
        let asked = std::time::Instant::now();
        let rider_lock = async {
            let answer = rider.job_store.transaction().await;
            assert!(
                asked.elapsed() >= Duration::from_millis(90),
                "the rider waited for the carrier's commit"
            );
            Ok(backend_pid(answer?).await)
        };
        let carrier_commit = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            complete(store, carrier).await
        };
        tokio::join!(rider_lock, carrier_commit)
    }

    /// Completes the rider's job.
    async fn complete_rider(&mut self) -> WriteResult {
        let rider = self.rider.take().expect("the rider has not completed");
        complete(&self.store, rider).await
    }

    async fn move_on(&self, id: i64) {
        support::move_on(&self.pool, &self.table, id).await
    }

    async fn state(&self, id: i64) -> String {
        state_of(&self.pool, &self.table, id).await
    }

    async fn unlocked(&self, id: i64) -> bool {
        row_unlocked(&self.pool, &self.table, id).await
    }
}

#[tokio::test]
async fn a_lock_rides_on_the_next_commit_and_gets_its_connection() {
    let Some(pool) = pool("a_lock_rides_on_the_next_commit_and_gets_its_connection").await else {
        return;
    };
    let mut riding = Riding::new(&pool).await;
    let carrier = riding.carrier.as_mut().expect("the carrier");
    let carrier_pid = backend_pid(carrier.job_store.transaction().await.unwrap()).await;
    let (rider_pid, carried) = riding.ride().await;
    assert_eq!(carried, WriteResult::Applied, "the carrier committed");
    assert_eq!(
        rider_pid.expect("the rider's lock"),
        carrier_pid,
        "the rider got the carrier's connection"
    );
    assert!(
        !riding.unlocked(riding.rider_id).await,
        "the rider's row is locked by its transaction"
    );
    assert_eq!(riding.complete_rider().await, WriteResult::Applied);
    assert_eq!(riding.state(riding.carrier_id).await, "completed");
    assert_eq!(riding.state(riding.rider_id).await, "completed");
}

#[tokio::test]
async fn a_rider_whose_job_moved_on_learns_it_and_the_carrier_still_commits() {
    let Some(pool) =
        pool("a_rider_whose_job_moved_on_learns_it_and_the_carrier_still_commits").await
    else {
        return;
    };
    let mut riding = Riding::new(&pool).await;
    // Reset behind the worker's back, as the resetter would.
    riding.move_on(riding.rider_id).await;
    let (rider, carried) = riding.ride().await;
    assert!(
        matches!(rider, Err(StoreError::Conflict { .. })),
        "the rider learns its job is not held: {rider:?}"
    );
    assert_eq!(carried, WriteResult::Applied, "the carrier committed");
    assert_eq!(riding.state(riding.carrier_id).await, "completed");
    assert!(riding.unlocked(riding.rider_id).await, "no lock left");
}

#[tokio::test]
async fn a_rider_on_a_commit_that_fails_locks_by_itself() {
    let Some(pool) = pool("a_rider_on_a_commit_that_fails_locks_by_itself").await else {
        return;
    };
    let mut riding = Riding::new(&pool).await;
    // The carrier's job moves on: its completion finds it no longer held.
    riding.move_on(riding.carrier_id).await;
    let (rider, carried) = riding.ride().await;
    assert_eq!(carried, WriteResult::Stale, "the carrier's commit failed");
    rider.expect("the rider locked by itself");
    assert_eq!(riding.complete_rider().await, WriteResult::Applied);
    assert_eq!(riding.state(riding.rider_id).await, "completed");
    assert_eq!(riding.state(riding.carrier_id).await, "queued");
}

#[tokio::test]
async fn a_rider_that_gave_up_leaves_no_lock_behind() {
    let Some(pool) = pool("a_rider_that_gave_up_leaves_no_lock_behind").await else {
        return;
    };
    let mut riding = Riding::new(&pool).await;
    // The rider boards, then its handler is dropped before a commit comes.
    let gave_up = tokio::time::timeout(
        Duration::from_millis(50),
        riding.rider.as_mut().unwrap().job_store.transaction(),
    )
    .await;
    assert!(gave_up.is_err(), "no commit came within 50 ms");
    let carrier = riding.carrier.take().expect("the carrier");
    assert_eq!(complete(&riding.store, carrier).await, WriteResult::Applied);
    assert!(
        riding.unlocked(riding.rider_id).await,
        "the abandoned ride's lock was rolled back"
    );
    assert_eq!(riding.state(riding.carrier_id).await, "completed");
}

/// Writes the job's key to a side table in the job's transaction; fails
/// every tenth job after the write.
struct WriteThenMaybeFail {
    side: String,
}

#[async_trait::async_trait]
impl queue_core::Handler<PgStore<Job>> for WriteThenMaybeFail {
    async fn handle(
        &self,
        _: &queue_core::JobContext,
        store: &mut queue_store_postgres::PgJobTransaction,
        job: &Job,
    ) -> Result<(), queue_core::JobError> {
        let conn = store
            .transaction()
            .await
            .map_err(queue_core::JobError::poison)?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {} (job_id) VALUES ($1)",
            self.side
        )))
        .bind(job.id)
        .execute(conn)
        .await?;
        if job.payload.as_i64().is_some_and(|n| n % 10 == 0) {
            return Err(queue_core::JobError::poison("failing after the write"));
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_locks_ride_commits_each_jobs_writes_once_with_its_completion() {
    let Some(pool) =
        pool("a_worker_whose_locks_ride_commits_each_jobs_writes_once_with_its_completion").await
    else {
        return;
    };
    writes_once_with_completions(&pool, Some(Duration::from_millis(5))).await;
}

/// The same with early locks alone (the default): the waiting jobs' locks
/// ride on the commits before them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_early_locks_ride_commits_each_jobs_writes_once_with_its_completion() {
    let Some(pool) =
        pool("a_worker_whose_early_locks_ride_commits_each_jobs_writes_once_with_its_completion")
            .await
    else {
        return;
    };
    writes_once_with_completions(&pool, None).await;
}

/// 1,000 jobs through a worker of 32 handlers whose handlers write in the
/// job's transaction and fail every tenth job after the write, with late
/// rides as given: each successful job's write is there once, no failed
/// job's.
async fn writes_once_with_completions(pool: &PgPool, late_rides: Option<Duration>) {
    let pool = pool.clone();
    let table = fresh_table(&pool).await;
    let side = side_table(&pool, &table, "side_effects", "job_id bigint NOT NULL").await;
    let jobs: Vec<NewJob> = (1..=1000)
        .map(|n| NewJob::new("k", serde_json::json!(n)))
        .collect();
    let ids = table.enqueue_many(&pool, &jobs).await.expect("enqueue");
    let options = table
        .store_options()
        .mode(ExecutionMode::Transactional)
        .lock_rides(late_rides);
    let store = PgStore::default_table(pool.clone(), options)
        .await
        .expect("a store over the test table");
    let shutdown = queue_core::CancellationToken::new();
    let worker = queue_worker::Worker::new(
        store,
        WriteThenMaybeFail { side: side.clone() },
        queue_worker::WorkerOptions::default().handlers(32),
    )
    .expect("valid options");
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let count = |state| count_in(&pool, &table, state);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while count("completed").await + count("failed").await < 1000 {
        assert!(
            std::time::Instant::now() < deadline,
            "1,000 jobs did not finish within a minute"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    running.await.expect("worker task").expect("worker ran");
    assert_eq!(count("completed").await, 900);
    assert_eq!(count("failed").await, 100);
    let written: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT job_id FROM {side} ORDER BY job_id"
    )))
    .fetch_all(&pool)
    .await
    .expect("the writes");
    // Job n's payload is n, its key ids[n - 1].
    let succeeded: Vec<i64> = (1..=1000)
        .filter(|n| n % 10 != 0)
        .map(|n| ids[n - 1])
        .collect();
    assert_eq!(
        written, succeeded,
        "each successful job's write, once; no failed job's"
    );
}
