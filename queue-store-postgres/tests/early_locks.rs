//! Early locks (transactional mode, always on with prepared job
//! statements): a claimed job about to wait for a handler boards its row
//! lock, if its kind's last job asked for its transaction, and the next
//! job's commit carries it (`EXECUTE complete(..); COMMIT AND CHAIN;
//! EXECUTE lock(..)`), handing its connection on. The job then finds its
//! transaction open and its row locked. A carried lock whose job moved on
//! tells the handler so; one whose handler never asks, or whose handle is
//! dropped, is rolled back; a kind whose last job did not ask boards no
//! lock.

mod support;

use std::time::{Duration, Instant};

use queue_core::{Claimed, Job, NewJob, Store, StoreError, WriteResult};
use queue_store_postgres::{ExecutionMode, JobTable, PgStore};
use sqlx::PgPool;
use support::{backend_pid, claim_now, complete, fresh_table, pool, row_unlocked, state_of};

/// Claimed jobs on a transactional store (no late rides), after one job of
/// the kind asked for its transaction, so that the kind's jobs board early.
struct Early {
    pool: PgPool,
    table: JobTable,
    store: PgStore<Job>,
    /// The job whose commit carries the lock, its transaction open.
    carrier: Option<Claimed<PgStore<Job>>>,
    carrier_pid: i32,
    /// The jobs waiting for a handler.
    waiting: Vec<Claimed<PgStore<Job>>>,
}

impl Early {
    async fn new(pool: &PgPool, waiting: usize) -> Early {
        Early::on(pool, pool, waiting).await
    }

    /// The same with the store on `store_pool`.
    async fn on(pool: &PgPool, store_pool: &PgPool, waiting: usize) -> Early {
        let table = fresh_table(pool).await;
        let options = table.store_options().mode(ExecutionMode::Transactional);
        let store = PgStore::default_table(store_pool.clone(), options)
            .await
            .expect("a store over the test table");
        let jobs: Vec<_> = (0..waiting + 2)
            .map(|i| NewJob::new("k", serde_json::json!(i)))
            .collect();
        table.enqueue_many(pool, &jobs).await.expect("enqueue");
        let mut claimed = claim_now(&store, waiting + 2).await.into_iter();
        let (Some(mut first), Some(mut carrier)) = (claimed.next(), claimed.next()) else {
            panic!("the jobs claimed");
        };
        // The kind's first job asks for its transaction: from now on its
        // jobs board early.
        first.job_store.transaction().await.expect("the first lock");
        assert_eq!(complete(&store, first).await, WriteResult::Applied);
        let carrier_pid = backend_pid(
            carrier
                .job_store
                .transaction()
                .await
                .expect("the carrier's lock"),
        )
        .await;
        Early {
            pool: pool.clone(),
            table,
            store,
            carrier: Some(carrier),
            carrier_pid,
            waiting: claimed.collect(),
        }
    }

    /// The `n`th waiting job's key.
    fn id(&self, n: usize) -> i64 {
        self.waiting[n].lease.id
    }

    /// The `n`th waiting job is about to wait for a handler.
    fn wait(&mut self, n: usize) {
        self.store.job_waiting(&mut self.waiting[n].job_store);
    }

    async fn commit_carrier(&mut self) -> WriteResult {
        let carrier = self.carrier.take().expect("the carrier has not committed");
        complete(&self.store, carrier).await
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

    /// Waits up to 5 s for the job's row to be unlocked and the carrier's
    /// backend to leave its transaction: a rollback queued on a
    /// connection goes out as the pool takes it back.
    async fn assert_released(&self, id: i64) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let state: Option<String> =
                sqlx::query_scalar("SELECT state FROM pg_stat_activity WHERE pid = $1")
                    .bind(self.carrier_pid)
                    .fetch_optional(&self.pool)
                    .await
                    .expect("the backend's state");
            let in_transaction = state.is_some_and(|s| s.starts_with("idle in transaction"));
            if !in_transaction && self.unlocked(id).await {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the carried lock of job {id} was not rolled back within 5 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test]
async fn a_waiting_jobs_lock_goes_with_the_commit_before_it() {
    let Some(pool) = pool("a_waiting_jobs_lock_goes_with_the_commit_before_it").await else {
        return;
    };
    let mut early = Early::new(&pool, 1).await;
    early.wait(0);
    let rider = early.id(0);
    assert!(early.unlocked(rider).await, "boarded, not yet locked");
    assert_eq!(early.commit_carrier().await, WriteResult::Applied);
    assert!(
        !early.unlocked(rider).await,
        "the carrier's commit locked the waiting job's row"
    );
    let mut job = early.waiting.pop().expect("the waiting job");
    let asked = Instant::now();
    let conn = job.job_store.transaction().await.expect("the carried lock");
    assert!(
        asked.elapsed() < Duration::from_millis(50),
        "the transaction was open already"
    );
    assert_eq!(
        backend_pid(conn).await,
        early.carrier_pid,
        "on the carrier's connection"
    );
    assert_eq!(complete(&early.store, job).await, WriteResult::Applied);
    assert_eq!(early.state(rider).await, "completed");
    assert!(early.unlocked(rider).await);
}

#[tokio::test]
async fn a_carried_lock_whose_handler_never_asks_is_rolled_back_and_its_kind_stops_boarding() {
    let Some(pool) =
        pool("a_carried_lock_whose_handler_never_asks_is_rolled_back_and_its_kind_stops_boarding")
            .await
    else {
        return;
    };
    let mut early = Early::new(&pool, 3).await;
    early.wait(0);
    let rider = early.id(0);
    assert_eq!(early.commit_carrier().await, WriteResult::Applied);
    assert!(!early.unlocked(rider).await, "carried");
    // The handler completes without asking for its transaction.
    let job = early.waiting.remove(0);
    assert_eq!(complete(&early.store, job).await, WriteResult::Applied);
    assert_eq!(early.state(rider).await, "completed");
    early.assert_released(rider).await;

    // The kind's last job did not ask: the next one boards nothing, so the
    // next commit carries no lock.
    early.wait(0);
    let next = early.id(0);
    let mut carrier = early.waiting.remove(1);
    carrier
        .job_store
        .transaction()
        .await
        .expect("a lock of its own");
    assert_eq!(complete(&early.store, carrier).await, WriteResult::Applied);
    assert!(early.unlocked(next).await, "no lock was carried");
}

#[tokio::test]
async fn no_more_locks_wait_for_handlers_than_half_the_pool() {
    let Some(pool) = pool("no_more_locks_wait_for_handlers_than_half_the_pool").await else {
        return;
    };
    let url =
        queue_core::testkit::database_url("no_more_locks_wait_for_handlers_than_half_the_pool")
            .expect("the test database");
    // Three connections: one lock may wait for its handler.
    let small = sqlx::postgres::PgPoolOptions::new()
        .max_connections(3)
        .connect(&url)
        .await
        .expect("a pool of three");
    let mut early = Early::on(&pool, &small, 3).await;
    early.wait(0);
    early.wait(1);
    let (parked, refused) = (early.id(0), early.id(1));
    assert_eq!(early.commit_carrier().await, WriteResult::Applied);
    assert!(!early.unlocked(parked).await, "the first lock was carried");
    // Another job's commit: the second waiting lock stays behind.
    let mut carrier = early.waiting.remove(2);
    carrier
        .job_store
        .transaction()
        .await
        .expect("a lock of its own");
    assert_eq!(complete(&early.store, carrier).await, WriteResult::Applied);
    assert!(
        early.unlocked(refused).await,
        "one lock waits for its handler already: no second one is carried"
    );
    for mut job in early.waiting.drain(..) {
        job.job_store.transaction().await.expect("its lock");
        assert_eq!(complete(&early.store, job).await, WriteResult::Applied);
    }
    assert_eq!(early.state(parked).await, "completed");
    assert_eq!(early.state(refused).await, "completed");
}

#[tokio::test]
async fn a_carried_lock_whose_job_moved_on_tells_its_handler() {
    let Some(pool) = pool("a_carried_lock_whose_job_moved_on_tells_its_handler").await else {
        return;
    };
    let mut early = Early::new(&pool, 1).await;
    early.wait(0);
    let rider = early.id(0);
    early.move_on(rider).await;
    assert_eq!(
        early.commit_carrier().await,
        WriteResult::Applied,
        "the carrier commits whatever became of the lock"
    );
    let mut job = early.waiting.pop().expect("the waiting job");
    let answer = job.job_store.transaction().await.map(|_| ());
    assert!(
        matches!(answer, Err(StoreError::Conflict { .. })),
        "the handler learns its job is not held: {answer:?}"
    );
    assert_eq!(early.state(rider).await, "queued");
    early.assert_released(rider).await;
}

#[tokio::test]
async fn a_carried_lock_whose_handle_is_dropped_is_rolled_back() {
    let Some(pool) = pool("a_carried_lock_whose_handle_is_dropped_is_rolled_back").await else {
        return;
    };
    let mut early = Early::new(&pool, 1).await;
    early.wait(0);
    let rider = early.id(0);
    assert_eq!(early.commit_carrier().await, WriteResult::Applied);
    assert!(!early.unlocked(rider).await, "carried");
    drop(early.waiting.pop());
    early.assert_released(rider).await;
    assert_eq!(early.state(rider).await, "processing");
}

#[tokio::test]
async fn a_lock_parked_over_a_second_is_taken_afresh_if_the_server_ended_it() {
    let Some(pool) =
        pool("a_lock_parked_over_a_second_is_taken_afresh_if_the_server_ended_it").await
    else {
        return;
    };
    let mut early = Early::new(&pool, 1).await;
    early.wait(0);
    let rider = early.id(0);
    assert_eq!(early.commit_carrier().await, WriteResult::Applied);
    assert!(!early.unlocked(rider).await, "carried");
    // The server ends the parked connection, as an
    // idle_in_transaction_session_timeout would.
    let ended: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(early.carrier_pid)
        .fetch_one(&pool)
        .await
        .expect("terminate the parked backend");
    assert!(ended);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut job = early.waiting.pop().expect("the waiting job");
    let conn = job
        .job_store
        .transaction()
        .await
        .expect("a lock taken afresh");
    assert_ne!(
        backend_pid(conn).await,
        early.carrier_pid,
        "a live connection"
    );
    assert_eq!(complete(&early.store, job).await, WriteResult::Applied);
    assert_eq!(early.state(rider).await, "completed");
}

#[tokio::test]
async fn a_job_that_starts_before_any_commit_locks_by_itself() {
    let Some(pool) = pool("a_job_that_starts_before_any_commit_locks_by_itself").await else {
        return;
    };
    let mut early = Early::new(&pool, 1).await;
    early.wait(0);
    let rider = early.id(0);
    let mut job = early.waiting.pop().expect("the waiting job");
    let conn = job.job_store.transaction().await.expect("its own lock");
    assert_ne!(
        backend_pid(conn).await,
        early.carrier_pid,
        "not the carrier's connection, which is still in its transaction"
    );
    // The withdrawn lock does not ride on the carrier's commit.
    assert_eq!(early.commit_carrier().await, WriteResult::Applied);
    assert_eq!(complete(&early.store, job).await, WriteResult::Applied);
    assert_eq!(early.state(rider).await, "completed");
    assert!(early.unlocked(rider).await);
}
