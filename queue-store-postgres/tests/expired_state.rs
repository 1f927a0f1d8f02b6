//! A table with a state value of its own for expired jobs (rickover's
//! `expired`): a job not started by its `expires_at` ends in that value,
//! with the expiry message, instead of failed's; the admin shows it as
//! stored, and as a failed job (counted, listed, retried and purged with
//! them). A value that collides with a state's, or that the state enum
//! lacks, is refused.

mod support;

use chrono::{TimeDelta, Utc};
use queue_core::{
    Admin, Job, JobFilter, JobState, NewJob, PurgeParams, RetryParams, StatsParams, Store, Targets,
    EXPIRED_MESSAGE,
};
use queue_store_postgres::{JobTable, PgStore, PgStoreOptions};
use sqlx::PgPool;
use support::{fresh_table, pool};

/// The default table in a fresh schema, allowing the value `expired` as
/// well, and a store whose expired jobs end in it.
async fn table_with_expired_value(pool: &PgPool) -> (JobTable, PgStore<Job>) {
    let table = fresh_table(pool).await;
    let t = table.name().quoted();
    // The default table allows only the standard values; this one also
    // has `expired`.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "ALTER TABLE {t} DROP CONSTRAINT \"{}_state_check\"; \
         ALTER TABLE {t} ADD CHECK (state IN ('queued', 'processing', 'completed', 'errored', 'failed', 'canceled', 'expired'))",
        table.name().name.as_str()
    )))
    .execute(pool)
    .await
    .expect("the table's own states");
    let store = PgStore::<Job>::default_table(
        pool.clone(),
        table.store_options().expired_state_value("expired"),
    )
    .await
    .expect("a store");
    (table, store)
}

#[tokio::test]
async fn an_expired_job_ends_in_the_tables_own_expired_value() {
    let Some(pool) = pool("an_expired_job_ends_in_the_tables_own_expired_value").await else {
        return;
    };
    let (table, store) = table_with_expired_value(&pool).await;
    let t = table.name().quoted();
    let now = chrono::Utc::now();
    let late = table
        .enqueue(
            &pool,
            &NewJob::new("k", serde_json::json!(null))
                .expires_at(now - chrono::TimeDelta::seconds(5)),
        )
        .await
        .unwrap();
    let expired = store.expire(now, 10).await.expect("the sweep");
    assert_eq!(expired, [late]);
    let (state, message): (String, Option<String>) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT state, failure_message FROM {t} WHERE id = $1"
    )))
    .bind(late)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        (state.as_str(), message.as_deref()),
        ("expired", Some(EXPIRED_MESSAGE))
    );
    let view = store.get(&late).await.unwrap().expect("the job");
    assert_eq!(
        (view.state, view.stored_state.as_str()),
        (Some(queue_core::JobState::Failed), "expired"),
        "shown as stored, and read as a failed job"
    );
    let stats = store.stats(StatsParams::new(now, now)).await.unwrap();
    assert!(
        stats
            .counts
            .iter()
            .any(|c| c.stored_state == "expired" && c.count == 1),
        "{stats:?}"
    );
}

#[tokio::test]
async fn an_expired_value_that_cannot_be_told_apart_or_stored_is_refused() {
    let Some(pool) = pool("an_expired_value_that_cannot_be_told_apart").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let taken = PgStore::<Job>::default_table(
        pool.clone(),
        table.store_options().expired_state_value("failed"),
    )
    .await
    .expect_err("failed's value");
    assert!(taken.to_string().contains("is failed's value"), "{taken}");

    // A table like the default one whose state is an enum without the label.
    let t = table.name().quoted();
    let schema = table.name().schema.quoted();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TYPE {schema}.status AS ENUM ('queued', 'processing', 'completed', 'errored', 'failed', 'canceled'); \
         CREATE TABLE {schema}.enum_jobs (LIKE {t} INCLUDING DEFAULTS); \
         ALTER TABLE {schema}.enum_jobs ALTER COLUMN state DROP DEFAULT; \
         ALTER TABLE {schema}.enum_jobs ALTER COLUMN state TYPE {schema}.status USING state::{schema}.status"
    )))
    .execute(&pool)
    .await
    .expect("an enum state column");
    let options = PgStoreOptions::new("enum_jobs")
        .and_then(|o| o.schema(table.name().schema.as_str()))
        .expect("valid names")
        .expired_state_value("expired");
    let missing = PgStore::<Job>::default_table(pool.clone(), options)
        .await
        .expect_err("the enum lacks expired");
    assert!(
        missing
            .to_string()
            .contains("has no value \"expired\" (configured for expired jobs)"),
        "{missing}"
    );
}

/// A table whose expired jobs end in a value of their own: they are failed
/// jobs to operators, so stats count them as failed, lists and purges by
/// failed state find them, and a retry runs them again.
#[tokio::test]
async fn expired_jobs_stored_apart_are_listed_retried_and_purged_as_failed() {
    let Some(pool) = pool("expired_jobs_stored_apart_are_listed_retried_and_purged").await else {
        return;
    };
    let (table, store) = table_with_expired_value(&pool).await;
    let now = Utc::now();
    let late =
        |n: i64| NewJob::new("k", serde_json::json!(n)).expires_at(now - TimeDelta::seconds(5));
    let first = table.enqueue(&pool, &late(1)).await.expect("enqueued");
    let second = table.enqueue(&pool, &late(2)).await.expect("enqueued");
    assert_eq!(store.expire(now, 10).await.expect("the sweep").len(), 2);
    let view = store.get(&first).await.unwrap().expect("the job");
    assert_eq!(
        (view.state, view.stored_state.as_str()),
        (Some(JobState::Failed), "expired")
    );
    let stats = store
        .stats(StatsParams::new(now, now))
        .await
        .expect("stats");
    assert_eq!(stats.total(JobState::Failed), 2, "{stats:?}");
    let failed = JobFilter::default().states([JobState::Failed]);
    assert_eq!(store.count(&failed).await.expect("a count"), 2);

    let retried = store
        .retry(&Targets::id(first), RetryParams::default())
        .await
        .expect("a retry");
    assert_eq!(retried.changed, 1);
    assert!(store.expire(now, 10).await.expect("the sweep").is_empty());

    let purged = store
        .purge(&PurgeParams::new(
            vec![JobState::Failed],
            Utc::now() + TimeDelta::seconds(5),
            10,
        ))
        .await
        .expect("a purge");
    assert_eq!(
        purged.purged, 1,
        "the expired job is purged with the failed ones"
    );
    assert!(store.get(&second).await.unwrap().is_none());
    assert!(
        store.get(&first).await.unwrap().is_some(),
        "the retried one stays"
    );
}
