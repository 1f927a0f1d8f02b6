//! Operators' reads on Postgres beyond the conformance suite: each runs
//! under the admin read timeout, and says so when the server stops it.

mod support;

use std::time::Duration;

use queue_core::{Admin, JobFilter, StatsParams, StoreError};
use queue_store_postgres::PgAdmin;
use support::{fresh_table, pool};

/// A read that waits longer than the admin read timeout (here on a lock
/// another session holds on the table) is stopped by the server and
/// reported as timed out, naming what it read and the limit; without a
/// limit the same read waits as long as it must.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_past_the_admin_read_timeout_is_stopped_and_says_so() {
    let Some(pool) = pool("a_read_past_the_admin_read_timeout_is_stopped").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let limit = Duration::from_millis(300);
    let admin = PgAdmin::<i64>::new(
        pool.clone(),
        table.store_options().admin_read_timeout(Some(limit)),
    )
    .await
    .expect("an admin");
    let patient = PgAdmin::<i64>::new(pool.clone(), table.store_options().admin_read_timeout(None))
        .await
        .expect("an admin");
    let mut holder = pool.begin().await.expect("a transaction");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "LOCK TABLE {} IN ACCESS EXCLUSIVE MODE",
        table.name().quoted()
    )))
    .execute(&mut *holder)
    .await
    .expect("the table locked");
    let started = std::time::Instant::now();
    let counted = admin.count(&JobFilter::default()).await;
    match counted {
        Err(StoreError::TimedOut { context, after }) => {
            assert_eq!((context.as_str(), after), ("counting jobs", limit));
        }
        other => panic!("expected a timed-out read, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "stopped near its limit"
    );
    let now = chrono::Utc::now();
    let stats = admin
        .stats(StatsParams {
            now,
            stalled_before: now,
        })
        .await;
    assert!(
        matches!(&stats, Err(StoreError::TimedOut { .. })),
        "stats too: {stats:?}"
    );
    let message = stats.unwrap_err().to_string();
    assert!(message.contains("its limit for one read"), "{message}");

    // No limit: the read waits for the lock, and goes through once it is
    // released.
    let waiting = tokio::spawn(async move { patient.count(&JobFilter::default()).await });
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!waiting.is_finished(), "it waits past the other's limit");
    holder.rollback().await.expect("released");
    let counted = waiting.await.expect("joined").expect("counted");
    assert_eq!(counted, 0);
}
