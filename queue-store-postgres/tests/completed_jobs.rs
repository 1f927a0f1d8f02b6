//! `CompletedJobs::Delete`: an attempt that succeeds deletes its job's row
//! under the same guard that would have marked it completed; failed,
//! errored and stale attempts leave their rows as they were. Checked in
//! lease mode (batched and single completions) and in transactional mode
//! (with the job's transaction on prepared and on bound statements, and
//! without a transaction).

mod support;

use std::collections::BTreeMap;

use futures_util::future::join_all;
use queue_core::{Claimed, Job, NewJob, Store, Transition, WriteResult};
use queue_store_postgres::{CompletedJobs, ExecutionMode, JobTable, PgStore};
use sqlx::PgPool;
use support::{claim_now, fresh_table, pool};

async fn deleting_store(
    pool: &PgPool,
    table: &JobTable,
    mode: ExecutionMode,
    prepared: bool,
) -> PgStore<Job> {
    PgStore::default_table(
        pool.clone(),
        table
            .store_options()
            .mode(mode)
            .prepared_job_statements(prepared)
            .completed_jobs(CompletedJobs::Delete),
    )
    .await
    .expect("a store that deletes completed jobs")
}

async fn finish(
    store: &PgStore<Job>,
    job: Claimed<PgStore<Job>>,
    transition: Transition,
) -> WriteResult {
    store
        .finish(job.job_store, &job.lease, transition, chrono::Utc::now())
        .await
        .expect("the finish")
}

/// The table's rows: state by kind.
async fn states(pool: &PgPool, table: &JobTable) -> BTreeMap<String, String> {
    sqlx::query_as(&format!(
        "SELECT kind, state FROM {}",
        table.name().quoted()
    ))
    .fetch_all(pool)
    .await
    .expect("the table's rows")
    .into_iter()
    .collect()
}

/// Five jobs: three succeed, one fails, one errors (retry later), one more
/// succeeds after another claim took its row over (stale).
async fn check_mode(test: &str, mode: ExecutionMode, prepared: bool) {
    let Some(pool) = pool(test).await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let kinds = ["ok-1", "ok-2", "ok-3", "fails", "errors", "stale"];
    let jobs: Vec<NewJob> = kinds
        .iter()
        .map(|k| NewJob::new(*k, serde_json::json!({})))
        .collect();
    table.enqueue_many(&pool, &jobs).await.expect("enqueue");
    let store = deleting_store(&pool, &table, mode, prepared).await;
    let claimed = claim_now(&store, kinds.len()).await;
    assert_eq!(claimed.len(), kinds.len(), "every job is claimed");
    let mut claimed: BTreeMap<String, Claimed<PgStore<Job>>> = claimed
        .into_iter()
        .map(|c| {
            let kind = c.record.as_ref().expect("decodable").kind.clone();
            (kind, c)
        })
        .collect();
    let mut take = |kind: &str| claimed.remove(kind).expect("claimed");

    // The stale one: another claim has taken the row over since.
    let stale = take("stale");
    sqlx::query(&format!(
        "UPDATE {} SET claim_token = claim_token + 1 WHERE kind = 'stale'",
        table.name().quoted()
    ))
    .execute(&pool)
    .await
    .expect("take the row over");
    assert_eq!(
        finish(&store, stale, Transition::Complete).await,
        WriteResult::Stale
    );

    // One success through the job's transaction, when the mode has one:
    // its write commits with the delete.
    let mut first = take("ok-1");
    if mode == ExecutionMode::Transactional {
        let conn = first
            .job_store
            .transaction()
            .await
            .expect("the job's transaction");
        sqlx::query(&format!(
            "UPDATE {} SET payload = '{{\"written\": true}}' WHERE kind = 'fails'",
            table.name().quoted()
        ))
        .execute(conn)
        .await
        .expect("a write in the job's transaction");
    }
    assert_eq!(
        finish(&store, first, Transition::Complete).await,
        WriteResult::Applied
    );

    // The rest at once, so that lease mode's completer writes them in one
    // batch: two deletes and two updates.
    let retry_at = chrono::Utc::now() + chrono::Duration::hours(1);
    let rest = [
        (take("ok-2"), Transition::Complete),
        (take("ok-3"), Transition::Complete),
        (
            take("fails"),
            Transition::Fail {
                message: "broken".into(),
            },
        ),
        (
            take("errors"),
            Transition::Error {
                message: "later".into(),
                retry_at,
            },
        ),
    ];
    let results = join_all(rest.into_iter().map(|(job, t)| finish(&store, job, t))).await;
    assert!(
        results.iter().all(|r| *r == WriteResult::Applied),
        "{results:?}"
    );

    let left = states(&pool, &table).await;
    let expected: BTreeMap<String, String> = [
        ("errors", "errored"),
        ("fails", "failed"),
        ("stale", "processing"),
    ]
    .into_iter()
    .map(|(k, s)| (k.to_owned(), s.to_owned()))
    .collect();
    assert_eq!(left, expected, "succeeded rows are gone, the others stay");
    if mode == ExecutionMode::Transactional {
        let written: bool = sqlx::query_scalar(&format!(
            "SELECT payload ? 'written' FROM {} WHERE kind = 'fails'",
            table.name().quoted()
        ))
        .fetch_one(&pool)
        .await
        .expect("the side write");
        assert!(written, "the job's write committed with its delete");
    }
}

#[tokio::test]
async fn lease_mode_deletes_succeeded_jobs_only() {
    check_mode(
        "lease_mode_deletes_succeeded_jobs_only",
        ExecutionMode::Lease,
        true,
    )
    .await;
}

#[tokio::test]
async fn transactional_mode_deletes_succeeded_jobs_only_with_prepared_statements() {
    check_mode(
        "transactional_mode_deletes_succeeded_jobs_only_with_prepared_statements",
        ExecutionMode::Transactional,
        true,
    )
    .await;
}

#[tokio::test]
async fn transactional_mode_deletes_succeeded_jobs_only_with_bound_statements() {
    check_mode(
        "transactional_mode_deletes_succeeded_jobs_only_with_bound_statements",
        ExecutionMode::Transactional,
        false,
    )
    .await;
}
