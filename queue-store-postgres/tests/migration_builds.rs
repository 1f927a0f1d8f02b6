//! A concurrent index build kept waiting by a session idle in a
//! transaction gives up, naming it. Apart from `tests/migrations.rs`:
//! the session it holds open would keep the builds of those tests (which
//! run in parallel with each other, never with another test binary)
//! waiting too.

mod support;

use std::time::Duration;

use queue_store_postgres::JobTable;
use support::{awkward_schema, pool};

fn table() -> JobTable {
    JobTable::new(&awkward_schema(), "jobs").expect("valid names")
}

/// A concurrent index build waits for every transaction that began before
/// it; one left idle (here with a snapshot held, as a long report's would
/// be) keeps it waiting. Past the migration's patience the build is
/// stopped and the migration fails naming that session; the versions stay
/// pending, and once the session ends the next run drops the invalid
/// index and applies them all.
#[tokio::test]
async fn a_concurrent_build_kept_waiting_by_an_old_transaction_gives_up_naming_it() {
    let Some(pool) =
        pool("a_concurrent_build_kept_waiting_by_an_old_transaction_gives_up_naming_it").await
    else {
        return;
    };
    let jobs = table();
    jobs.migrate(&pool).await.expect("the plain table");
    let mut report = pool.begin().await.expect("a transaction");
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *report)
        .await
        .expect("repeatable read");
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *report)
        .await
        .expect("the snapshot and the pid");

    let converting = jobs
        .clone()
        .in_place_claims()
        .migration_lock_wait(Duration::from_millis(100), Duration::from_secs(2));
    let error = tokio::time::timeout(Duration::from_secs(60), converting.migrate(&pool))
        .await
        .expect("the migration gives up instead of waiting without end")
        .expect_err("the build cannot finish while the transaction is open")
        .to_string();
    support::assert_says(
        &error,
        &[
            "version 13".to_owned(),
            "still waiting".to_owned(),
            format!("pid {pid} (idle in transaction"),
        ],
    );
    let pending = support::pending_versions(&pool, &converting).await;
    assert_eq!(pending, [13, 14, 15, 16]);

    report.rollback().await.expect("the transaction ends");
    let applied = converting.migrate(&pool).await.expect("the next run");
    assert_eq!(
        applied.iter().map(|m| m.version).collect::<Vec<_>>(),
        [13, 14, 15, 16]
    );
}
