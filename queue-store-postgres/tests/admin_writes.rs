//! What operators' writes and reads do on Postgres beyond the conformance
//! suite: why a retry left a job alone (a row another transaction held, a
//! key a concurrent enqueue took), and the timeline on the database's
//! clock.

mod support;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use queue_core::{
    Admin, Clock, JobState, NewJob, PurgeParams, RetryParams, SkipReason, Targets, TimelineParams,
    UniqueScope,
};
use queue_store_postgres::{JobTable, PgAdmin};
use sqlx::PgPool;
use support::{fresh_table, pool};

/// A failed job (with `key`, if given) in `table`; its key.
async fn failed_job(pool: &PgPool, table: &JobTable, key: Option<&str>) -> i64 {
    let mut job = NewJob::new("k", serde_json::json!(null));
    if let Some(key) = key {
        job = job.unique(key, UniqueScope::Active);
    }
    let id = table.enqueue(pool, &job).await.expect("enqueued");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {} SET state = 'failed', finished_at = now() WHERE id = $1",
        table.name().quoted()
    )))
    .bind(id)
    .execute(pool)
    .await
    .expect("failed");
    id
}

/// A transaction holding job `id`'s row, as a heartbeat or a completion
/// holds it.
async fn hold(
    pool: &PgPool,
    table: &JobTable,
    id: i64,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut holder = pool.begin().await.expect("a transaction");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT 1 FROM {} WHERE id = $1 FOR NO KEY UPDATE",
        table.name().quoted()
    )))
    .bind(id)
    .execute(&mut *holder)
    .await
    .expect("the row held");
    holder
}

async fn admin(pool: &PgPool, table: &JobTable) -> PgAdmin<i64> {
    PgAdmin::new(pool.clone(), table.store_options())
        .await
        .expect("an admin")
}

/// A job whose row another transaction holds (a heartbeat, a completion)
/// is reported as held, not by its state; once the row is free the same
/// retry goes through.
#[tokio::test]
async fn a_retry_of_a_row_held_elsewhere_says_it_was_held() {
    let Some(pool) = pool("a_retry_of_a_row_held_elsewhere_says_it_was_held").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let admin = admin(&pool, &table).await;
    let id = failed_job(&pool, &table, None).await;
    let holder = hold(&pool, &table, id).await;
    let report = admin
        .retry(&Targets::id(id), RetryParams::default())
        .await
        .expect("a retry");
    assert_eq!(report.changed, 0);
    assert_eq!(report.skipped.len(), 1);
    let skipped = &report.skipped[0];
    assert_eq!(
        (skipped.reason, skipped.state),
        (SkipReason::Locked, Some(JobState::Failed))
    );
    assert!(
        skipped.explain("retried").contains("held it for a moment"),
        "{}",
        skipped.explain("retried")
    );
    holder.rollback().await.expect("released");
    let report = admin
        .retry(&Targets::id(id), RetryParams::default())
        .await
        .expect("a retry");
    assert_eq!((report.changed, report.skipped.len()), (1, 0));
}

/// A row held only for a moment (as a heartbeat or a completion holds
/// it) does not turn a write by key away: the write tries the job again
/// after short pauses, and it goes through without the operator trying
/// again. Only a row held for longer is reported as held (above).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_by_key_goes_through_once_a_row_held_for_a_moment_is_free() {
    let Some(pool) = pool("a_write_by_key_goes_through_once_a_row_held_for_a_moment_is_free").await
    else {
        return;
    };
    let table = fresh_table(&pool).await;
    let admin = admin(&pool, &table).await;
    let id = failed_job(&pool, &table, None).await;
    let holder = hold(&pool, &table, id).await;
    let released = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(40)).await;
        holder.rollback().await.expect("released");
    });
    let report = admin
        .retry(&Targets::id(id), RetryParams::default())
        .await
        .expect("a retry");
    released.await.expect("joined");
    assert_eq!(
        (report.changed, report.skipped.len()),
        (1, 0),
        "the retry waited out the held row: {report:?}"
    );
    let state: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT state::text FROM {} WHERE id = $1",
        table.name().quoted()
    )))
    .bind(id)
    .fetch_one(&pool)
    .await
    .expect("the job");
    assert_eq!(state, "queued");
}

/// A retry of a keyed job and a keyless one while an enqueue of the key,
/// not yet committed, holds it: the retry's snapshot cannot see that
/// job, and its update waits on the unique index for it. Once the enqueue
/// commits, the retry's statement meets the unique index, runs again on
/// its connection (under a savepoint `in_callers_transaction`, which then
/// goes on and commits), sees the new holder and skips the job for it,
/// with no error and nothing changed twice.
async fn a_retry_meets_a_key_taken_meanwhile(test: &str, in_callers_transaction: bool) {
    let Some(pool) = pool(test).await else { return };
    let table = fresh_table(&pool).await;
    let admin = admin(&pool, &table).await;
    let failed = failed_job(&pool, &table, Some("invoice:7")).await;
    let other = failed_job(&pool, &table, None).await;
    let mut enqueue = pool.begin().await.expect("a transaction");
    table
        .enqueue(
            &mut *enqueue,
            &NewJob::new("k", serde_json::json!(null)).unique("invoice:7", UniqueScope::Active),
        )
        .await
        .expect("the concurrent enqueue");
    let retrying = {
        let (admin, pool) = (admin.clone(), pool.clone());
        let targets = Targets::Ids(vec![failed, other]);
        tokio::spawn(async move {
            if !in_callers_transaction {
                return admin.retry(&targets, RetryParams::default()).await;
            }
            let mut tx = pool.begin().await.expect("a transaction");
            let report = admin
                .retry_in(&mut tx, &targets, RetryParams::default())
                .await;
            // The caller's transaction goes on after the retry.
            let alive: i32 = sqlx::query_scalar("SELECT 1")
                .fetch_one(&mut *tx)
                .await
                .expect("the transaction is still usable");
            assert_eq!(alive, 1);
            tx.commit().await.expect("committed");
            report
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!retrying.is_finished(), "the retry waits on the key");
    enqueue.commit().await.expect("committed");
    let report = tokio::time::timeout(Duration::from_secs(10), retrying)
        .await
        .expect("the retry ends")
        .expect("joined")
        .expect("no error: the key's new holder is seen on the next run");
    assert_eq!(report.changed, 1, "the job without a key");
    assert_eq!(
        report
            .skipped
            .iter()
            .map(|s| (s.id, s.reason))
            .collect::<Vec<_>>(),
        vec![(failed, SkipReason::KeyHeld)]
    );
    assert_eq!(state_of(&pool, &table, other).await, "queued");
    assert_eq!(state_of(&pool, &table, failed).await, "failed");
}

/// On the store's pool (see [`a_retry_meets_a_key_taken_meanwhile`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_taken_by_a_concurrent_enqueue_is_reported_as_held() {
    a_retry_meets_a_key_taken_meanwhile(
        "a_key_taken_by_a_concurrent_enqueue_is_reported_as_held",
        false,
    )
    .await;
}

/// In a caller's transaction, which stays usable (see
/// [`a_retry_meets_a_key_taken_meanwhile`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_in_a_callers_transaction_that_meets_a_taken_key_leaves_it_usable() {
    a_retry_meets_a_key_taken_meanwhile(
        "a_retry_in_a_callers_transaction_that_meets_a_taken_key_leaves_it_usable",
        true,
    )
    .await;
}

/// The system clock, off by a fixed amount.
struct Skewed(TimeDelta);

impl Clock for Skewed {
    fn now(&self) -> DateTime<Utc> {
        Utc::now() + self.0
    }
}

/// An admin whose clock runs an hour behind the database's still counts
/// the job that finished a moment ago in the last minute of its timeline.
#[tokio::test]
async fn the_timeline_is_read_on_the_databases_clock() {
    let Some(pool) = pool("the_timeline_is_read_on_the_databases_clock").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let admin = admin(&pool, &table).await;
    let behind: Arc<dyn Clock> = Arc::new(Skewed(TimeDelta::hours(-1)));
    admin.set_clock(behind.clone()).await.expect("measured");
    failed_job(&pool, &table, None).await;
    let now = behind.now();
    let buckets = admin
        .finished_timeline(&TimelineParams::ending(now, TimeDelta::minutes(1), 60))
        .await
        .expect("the timeline")
        .expect("the table has a finish column");
    let failed: u64 = buckets.iter().map(|b| b.failed).sum();
    assert_eq!(failed, 1, "the job finished now, on either clock");
    assert_eq!(
        buckets.last().map(|b| b.failed),
        Some(1),
        "in the last minute"
    );
}

/// A stuck job whose attempt holds its row in the job's transaction
/// (transactional mode) is failed at once, without waiting for that
/// transaction: the operator's write and the job's key-share lock do not
/// conflict. The attempt's completion then finds its token gone: nothing
/// it wrote commits, and the job stays failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_fail_ends_a_job_whose_attempt_holds_its_transaction_open() {
    let test = "force_fail_ends_a_job_whose_attempt_holds_its_transaction_open";
    let Some(pool) = pool(test).await else { return };
    let table = fresh_table(&pool).await;
    let effects = support::side_table(&pool, &table, "effects", "job_id bigint").await;
    let store = support::store(
        &pool,
        &table,
        queue_store_postgres::ExecutionMode::Transactional,
    )
    .await;
    let id = table
        .enqueue(&pool, &NewJob::new("k", serde_json::json!(null)))
        .await
        .expect("enqueued");
    let mut job = support::claim_now(&store, 1).await.pop().expect("claimed");
    let conn = job
        .job_store
        .transaction()
        .await
        .expect("the job's transaction");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {effects} VALUES ($1)"
    )))
    .bind(id)
    .execute(conn)
    .await
    .expect("the handler's write");
    let report = tokio::time::timeout(
        Duration::from_secs(5),
        Admin::force_fail(&store, &Targets::Ids(vec![id]), "hung on a lock"),
    )
    .await
    .expect("the write does not wait for the job's transaction")
    .expect("force_fail");
    assert_eq!(report.changed, 1, "{report:?}");
    let done = support::complete(&store, job).await;
    assert_eq!(done, queue_core::WriteResult::Stale);
    let view = Admin::get(&store, &id).await.expect("get").expect("there");
    assert_eq!(
        (view.state, view.failure_message.as_deref()),
        (Some(JobState::Failed), Some("hung on a lock"))
    );
    let effects: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {effects}"
    )))
    .fetch_one(&pool)
    .await
    .expect("count");
    assert_eq!(effects, 0, "the fenced attempt's writes did not commit");
}

/// The state and failure text of job `id`, read straight from the table.
async fn state_of(pool: &PgPool, table: &JobTable, id: i64) -> String {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT state FROM {} WHERE id = $1",
        table.name().quoted()
    )))
    .bind(id)
    .fetch_optional(pool)
    .await
    .expect("read")
    .unwrap_or_else(|| "gone".into())
}

/// Retry, cancel, force-fail and delete on a caller's transaction change
/// nothing others can see until it commits, and nothing at all when it
/// rolls back; committed, they land with the application's own writes.
#[tokio::test]
async fn writes_on_a_callers_transaction_land_only_when_it_commits() {
    let Some(pool) = pool("writes_on_a_callers_transaction_land_only_when_it_commits").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let admin = admin(&pool, &table).await;
    let failed = failed_job(&pool, &table, None).await;
    let waiting = table
        .enqueue(&pool, &NewJob::new("k", serde_json::json!(null)))
        .await
        .expect("enqueued");
    let doomed = table
        .enqueue(&pool, &NewJob::new("k", serde_json::json!(null)))
        .await
        .expect("enqueued");
    let stuck = table
        .enqueue(&pool, &NewJob::new("k", serde_json::json!(null)))
        .await
        .expect("enqueued");

    let mut tx = pool.begin().await.expect("a transaction");
    let retried = admin
        .retry_in(&mut tx, &Targets::id(failed), RetryParams::default())
        .await
        .expect("a retry");
    let canceled = admin
        .cancel_in(&mut tx, &Targets::id(waiting))
        .await
        .expect("a cancel");
    let deleted = admin
        .delete_in(&mut tx, &Targets::id(doomed))
        .await
        .expect("a delete");
    let fails = admin
        .force_fail_in(&mut tx, &Targets::id(stuck), "by hand")
        .await
        .expect("a force-fail");
    assert_eq!(
        [
            retried.changed,
            canceled.changed,
            deleted.changed,
            fails.changed
        ],
        [1, 1, 1, 1]
    );
    let inside: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT state FROM {} WHERE id = ANY($1) ORDER BY id",
        table.name().quoted()
    )))
    .bind(vec![failed, waiting, doomed, stuck])
    .fetch_all(&mut *tx)
    .await
    .expect("read inside");
    assert_eq!(
        inside,
        ["queued", "canceled", "failed"],
        "the transaction sees its own writes"
    );
    let outside = [
        state_of(&pool, &table, failed).await,
        state_of(&pool, &table, waiting).await,
        state_of(&pool, &table, doomed).await,
        state_of(&pool, &table, stuck).await,
    ];
    assert_eq!(
        outside,
        ["failed", "queued", "queued", "queued"],
        "nobody else sees them before the commit"
    );
    tx.rollback().await.expect("rolled back");
    let after_rollback = [
        state_of(&pool, &table, failed).await,
        state_of(&pool, &table, waiting).await,
        state_of(&pool, &table, doomed).await,
        state_of(&pool, &table, stuck).await,
    ];
    assert_eq!(after_rollback, outside, "a rollback undoes all four");

    let mut tx = pool.begin().await.expect("a transaction");
    admin
        .retry_in(&mut tx, &Targets::id(failed), RetryParams::default())
        .await
        .expect("a retry");
    admin
        .delete_in(&mut tx, &Targets::id(doomed))
        .await
        .expect("a delete");
    tx.commit().await.expect("committed");
    assert_eq!(state_of(&pool, &table, failed).await, "queued");
    assert_eq!(state_of(&pool, &table, doomed).await, "gone");

    // A purge too: rolled back, the finished job stays.
    let old = failed_job(&pool, &table, None).await;
    let mut tx = pool.begin().await.expect("a transaction");
    let purged = admin
        .purge_in(
            &mut tx,
            &PurgeParams::new(
                vec![JobState::Failed],
                Utc::now() + TimeDelta::minutes(1),
                10,
            ),
        )
        .await
        .expect("a purge");
    assert_eq!(purged.purged, 1);
    tx.rollback().await.expect("rolled back");
    assert_eq!(state_of(&pool, &table, old).await, "failed");
}

/// An operator's retry and cancel take the store's time, on the
/// database's clock, whatever the caller's clock says: an admin whose
/// clock runs an hour ahead does not push the retried job an hour into
/// the future, nor date the cancel an hour late.
#[tokio::test]
async fn retry_and_cancel_take_the_time_on_the_databases_clock() {
    let Some(pool) = pool("retry_and_cancel_take_the_time_on_the_databases_clock").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let admin = admin(&pool, &table).await;
    let ahead: Arc<dyn Clock> = Arc::new(Skewed(TimeDelta::hours(1)));
    admin.set_clock(ahead).await.expect("measured");
    let failed = failed_job(&pool, &table, None).await;
    let waiting = table
        .enqueue(&pool, &NewJob::new("k", serde_json::json!(null)))
        .await
        .expect("enqueued");
    admin
        .retry(&Targets::id(failed), RetryParams::default())
        .await
        .expect("a retry");
    admin.cancel(&Targets::id(waiting)).await.expect("a cancel");
    let (due, finished): (f64, f64) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT (SELECT extract(epoch FROM process_after - now())::float8 FROM {t} WHERE id = $1), \
                (SELECT extract(epoch FROM finished_at - now())::float8 FROM {t} WHERE id = $2)",
        t = table.name().quoted()
    )))
    .bind(failed)
    .bind(waiting)
    .fetch_one(&pool)
    .await
    .expect("read");
    assert!(
        due.abs() < 5.0,
        "the retried job is due now on the database's clock, not {due} s away"
    );
    assert!(
        finished.abs() < 5.0,
        "the cancel is dated now on the database's clock, not {finished} s away"
    );
}
