//! How the store uses its pool's connections: a job store dropped with its
//! transaction open rolls back and leaves no connection idle in a
//! transaction, a handler's own `begin()` inside the job's transaction is a
//! savepoint, and connections the store keeps between its statements go
//! back to the pool once unused for a second, but the newest, kept warm
//! while the pool has room.

mod support;

use std::time::Duration;

use queue_core::{ClaimParams, Job, NewJob, Store, WriteResult};
use queue_store_postgres::{ExecutionMode, PgStore};
use sqlx::{Acquire, PgPool};
use support::{complete, fresh_table, pool};

async fn claim_one(store: &PgStore<Job>) -> queue_core::Claimed<PgStore<Job>> {
    store
        .claim(ClaimParams {
            limit: 1,
            worker: "w",
            conditions: None,
            now: chrono::Utc::now(),
        })
        .await
        .unwrap()
        .pop()
        .expect("a job to claim")
}

/// A transactional store over a fresh table holding one job, a side table
/// for the handler's writes, and the job claimed.
async fn transactional_job(
    pool: &PgPool,
) -> (PgStore<Job>, String, queue_core::Claimed<PgStore<Job>>) {
    let table = fresh_table(pool).await;
    let side = support::side_table(pool, &table, "side", "note text").await;
    table
        .enqueue(pool, &NewJob::new("k", serde_json::json!(null)))
        .await
        .unwrap();
    let store = support::store(pool, &table, ExecutionMode::Transactional).await;
    let job = claim_one(&store).await;
    (store, side, job)
}

async fn notes(pool: &PgPool, side: &str) -> Vec<String> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT note FROM {side} ORDER BY note"
    )))
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Whether session `pid` is idle inside a transaction.
async fn idle_in_transaction(pool: &PgPool, pid: i32) -> bool {
    sqlx::query_scalar(
        "SELECT count(*) > 0 FROM pg_stat_activity WHERE pid = $1 \
         AND state LIKE 'idle in transaction%'",
    )
    .bind(pid)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_store_dropped_mid_transaction_rolls_back_and_frees_its_connection() {
    let Some(pool) =
        pool("a_job_store_dropped_mid_transaction_rolls_back_and_frees_its_connection").await
    else {
        return;
    };
    let (_store, side, mut job) = transactional_job(&pool).await;
    let conn = job.job_store.transaction().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {side} VALUES ('dropped')"
    )))
    .execute(&mut *conn)
    .await
    .unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert!(idle_in_transaction(&pool, pid).await);
    drop(job);
    // The rollback goes out as the connection returns to the pool. Watched
    // from a pool of its own, which cannot be handed the leaked connection.
    let observer = support::pool("observer").await.expect("the same database");
    let mut waited = Duration::ZERO;
    while idle_in_transaction(&observer, pid).await {
        assert!(
            waited < Duration::from_secs(5),
            "a connection stayed idle in a transaction"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        waited += Duration::from_millis(20);
    }
    assert!(
        notes(&observer, &side).await.is_empty(),
        "the dropped attempt's write was rolled back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handlers_begin_inside_the_jobs_transaction_is_a_savepoint() {
    let Some(pool) = pool("a_handlers_begin_inside_the_jobs_transaction_is_a_savepoint").await
    else {
        return;
    };
    let (store, side, mut job) = transactional_job(&pool).await;
    let conn = job.job_store.transaction().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {side} VALUES ('kept')"
    )))
    .execute(&mut *conn)
    .await
    .unwrap();
    {
        let mut nested = conn.begin().await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {side} VALUES ('undone')"
        )))
        .execute(&mut *nested)
        .await
        .unwrap();
        nested.rollback().await.unwrap();
    }
    {
        let mut nested = conn.begin().await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {side} VALUES ('nested')"
        )))
        .execute(&mut *nested)
        .await
        .unwrap();
        nested.commit().await.unwrap();
    }
    assert!(
        notes(&pool, &side).await.is_empty(),
        "nothing is visible before the job commits: the nested commit released a savepoint"
    );
    assert_eq!(complete(&store, job).await, WriteResult::Applied);
    assert_eq!(notes(&pool, &side).await, ["kept", "nested"]);
}

/// A fresh table holding three jobs, and a lease store over it on a pool
/// of its own of at most `connections`.
async fn three_jobs_on_a_pool_of(pool: &PgPool, connections: u32) -> (PgPool, PgStore<Job>) {
    let table = fresh_table(pool).await;
    table
        .enqueue_many(
            pool,
            &(0..3)
                .map(|i| NewJob::new("k", serde_json::json!(i)))
                .collect::<Vec<_>>(),
        )
        .await
        .unwrap();
    let own = sqlx::postgres::PgPoolOptions::new()
        .max_connections(connections)
        .test_before_acquire(false)
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap();
    let store = support::store(&own, &table, ExecutionMode::Lease).await;
    (own, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_kept_between_statements_go_back_to_the_pool_when_unused() {
    let Some(pool) =
        pool("connections_kept_between_statements_go_back_to_the_pool_when_unused").await
    else {
        return;
    };
    // A pool of one connection: the store has no connection to keep warm
    // while others may need it.
    let (single, store) = three_jobs_on_a_pool_of(&pool, 1).await;
    let job = claim_one(&store).await;
    assert_eq!(complete(&store, job).await, WriteResult::Applied);
    // The claim's and the completion's connection is kept for the next
    // statement: the pool has one connection fewer idle than open.
    assert!(
        single.num_idle() < single.size() as usize,
        "the store keeps its connection between statements"
    );
    let mut waited = Duration::ZERO;
    while single.num_idle() < single.size() as usize {
        assert!(
            waited < Duration::from_secs(5),
            "a connection unused for over a second stayed out of a pool with no other"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        waited += Duration::from_millis(50);
    }
}

/// With room in the pool, the store keeps the newest connection warm past
/// the second, so that the claim of a worker woken after a quiet spell
/// runs on it (no ping, its statements prepared), and returns the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_room_in_the_pool_the_newest_connection_stays_warm() {
    let Some(pool) = pool("with_room_in_the_pool_the_newest_connection_stays_warm").await else {
        return;
    };
    let (roomy, store) = three_jobs_on_a_pool_of(&pool, 8).await;
    let job = claim_one(&store).await;
    assert_eq!(complete(&store, job).await, WriteResult::Applied);
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(
        roomy.num_idle() + 1,
        roomy.size() as usize,
        "one connection stays with the store past the second"
    );
    // With every idle connection of the pool taken, a claim that went to
    // the pool would open one more: it runs on the warm one instead.
    let open = roomy.size();
    let mut taken = Vec::new();
    for _ in 0..roomy.num_idle() {
        taken.push(roomy.acquire().await.unwrap());
    }
    let job = claim_one(&store).await;
    assert_eq!(
        roomy.size(),
        open,
        "the claim ran on the warm connection, opening none"
    );
    drop(taken);
    assert_eq!(complete(&store, job).await, WriteResult::Applied);
    // A pool closed while the store lives gets the warm connection back
    // within a second or so: `close()` waits for every connection.
    let closing = std::time::Instant::now();
    roomy.close().await;
    assert!(
        closing.elapsed() < Duration::from_secs(3),
        "closing the pool waited {:?} for the store's connections",
        closing.elapsed()
    );
    drop(store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_async_claim_leaves_its_connection_committing_durably() {
    let Some(shared) = pool("an_async_claim_leaves_its_connection_committing_durably").await else {
        return;
    };
    let table = fresh_table(&shared).await;
    table
        .enqueue(&shared, &NewJob::new("k", serde_json::json!(null)))
        .await
        .unwrap();
    // One connection: whatever the claim ran on is what SHOW runs on. Its
    // session commits durably whatever the server's default (test clusters
    // run without).
    let single = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .test_before_acquire(false)
        .connect_with(
            (*shared.connect_options())
                .clone()
                .options([("synchronous_commit", "on")]),
        )
        .await
        .unwrap();
    let store = support::store(&single, &table, ExecutionMode::Lease).await;
    let claimed = claim_one(&store).await;
    // The store keeps the connection for up to a second, then returns it.
    let setting: String = sqlx::query_scalar("SHOW synchronous_commit")
        .fetch_one(&single)
        .await
        .unwrap();
    assert_eq!(
        setting, "on",
        "synchronous_commit = off lasted only for the claim's transaction"
    );
    drop(claimed);
}
