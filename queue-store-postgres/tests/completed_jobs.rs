//! What an attempt that succeeds does to its job's row, under the same guard
//! as every other finish: `CompletedJobs::Delete` deletes it,
//! `CompletedJobs::Keep` marks it completed with its finish time and leaves
//! the rest of the row alone (successes have a statement of their own, which
//! writes less). Failed, errored and stale attempts are the same in both.
//! Checked in lease mode (batched and single completions) and in
//! transactional mode (with the job's transaction on prepared and on bound
//! statements, and without a transaction).

mod support;

use std::collections::BTreeMap;

use futures_util::future::join_all;
use queue_core::{Claimed, Job, NewJob, Store, Transition, WriteResult};
use queue_store_postgres::{CompletedJobs, ExecutionMode, JobTable, PgStore};
use sqlx::PgPool;
use support::{claim_now, fresh_table, pool};

async fn store(
    pool: &PgPool,
    table: &JobTable,
    mode: ExecutionMode,
    prepared: bool,
    completed: CompletedJobs,
) -> PgStore<Job> {
    PgStore::default_table(
        pool.clone(),
        table
            .store_options()
            .mode(mode)
            .prepared_job_statements(prepared)
            .completed_jobs(completed),
    )
    .await
    .expect("a store")
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

/// The table's rows by kind: state, whether a finish time is set, failure
/// message and failure count.
type Row = (String, bool, Option<String>, i32);

async fn rows(pool: &PgPool, table: &JobTable) -> BTreeMap<String, Row> {
    sqlx::query_as::<_, (String, String, bool, Option<String>, i32)>(sqlx::AssertSqlSafe(format!(
        "SELECT kind, state, finished_at IS NOT NULL, failure_message, num_failures FROM {}",
        table.name().quoted()
    )))
    .fetch_all(pool)
    .await
    .expect("the table's rows")
    .into_iter()
    .map(|(kind, state, finished, message, failures)| (kind, (state, finished, message, failures)))
    .collect()
}

/// Seven jobs: three succeed, one fails, one errors (retry later), two more
/// succeed after another claim took their rows over (stale), one alone and
/// one among the others.
async fn check_mode(test: &str, mode: ExecutionMode, prepared: bool, completed: CompletedJobs) {
    let Some(pool) = pool(test).await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let kinds = [
        "ok-1",
        "ok-2",
        "ok-3",
        "fails",
        "errors",
        "stale",
        "stale-too",
    ];
    let jobs: Vec<NewJob> = kinds
        .iter()
        .map(|k| NewJob::new(*k, serde_json::json!({})))
        .collect();
    table.enqueue_many(&pool, &jobs).await.expect("enqueue");
    let store = store(&pool, &table, mode, prepared, completed).await;
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
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {} SET claim_token = claim_token + 1 WHERE kind LIKE 'stale%'",
        table.name().quoted()
    )))
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
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {} SET payload = '{{\"written\": true}}' WHERE kind = 'fails'",
            table.name().quoted()
        )))
        .execute(conn)
        .await
        .expect("a write in the job's transaction");
    }
    assert_eq!(
        finish(&store, first, Transition::Complete).await,
        WriteResult::Applied
    );

    // The rest at once, so that lease mode's completer writes them in one
    // batch: three successes (one of them stale) and two other ends.
    let retry_at = chrono::Utc::now() + chrono::Duration::hours(1);
    let rest = [
        (take("stale-too"), Transition::Complete),
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
            Transition::Retry {
                message: "later".into(),
                retry_at,
            },
        ),
    ];
    let results = join_all(rest.into_iter().map(|(job, t)| finish(&store, job, t))).await;
    assert_eq!(
        results,
        [
            WriteResult::Stale,
            WriteResult::Applied,
            WriteResult::Applied,
            WriteResult::Applied,
            WriteResult::Applied
        ],
        "only the row taken over is stale"
    );

    let row = |state: &str, finished: bool, message: Option<&str>, failures: i32| {
        (
            state.to_owned(),
            finished,
            message.map(str::to_owned),
            failures,
        )
    };
    let mut expected: BTreeMap<String, Row> = [
        ("errors", row("errored", true, Some("later"), 1)),
        ("fails", row("failed", true, Some("broken"), 1)),
        ("stale", row("processing", false, None, 0)),
        ("stale-too", row("processing", false, None, 0)),
    ]
    .into_iter()
    .map(|(kind, row)| (kind.to_owned(), row))
    .collect();
    if completed == CompletedJobs::Keep {
        for ok in ["ok-1", "ok-2", "ok-3"] {
            expected.insert(ok.to_owned(), row("completed", true, None, 0));
        }
    }
    assert_eq!(
        rows(&pool, &table).await,
        expected,
        "{completed:?}: succeeded rows are completed or gone, the others as their ends say"
    );
    if mode == ExecutionMode::Transactional {
        let written: bool = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT payload ? 'written' FROM {} WHERE kind = 'fails'",
            table.name().quoted()
        )))
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
        CompletedJobs::Delete,
    )
    .await;
}

#[tokio::test]
async fn transactional_mode_deletes_succeeded_jobs_only_with_prepared_statements() {
    check_mode(
        "transactional_mode_deletes_succeeded_jobs_only_with_prepared_statements",
        ExecutionMode::Transactional,
        true,
        CompletedJobs::Delete,
    )
    .await;
}

#[tokio::test]
async fn transactional_mode_deletes_succeeded_jobs_only_with_bound_statements() {
    check_mode(
        "transactional_mode_deletes_succeeded_jobs_only_with_bound_statements",
        ExecutionMode::Transactional,
        false,
        CompletedJobs::Delete,
    )
    .await;
}

#[tokio::test]
async fn lease_mode_marks_succeeded_jobs_completed_and_leaves_the_rest_of_their_rows() {
    check_mode(
        "lease_mode_marks_succeeded_jobs_completed_and_leaves_the_rest_of_their_rows",
        ExecutionMode::Lease,
        true,
        CompletedJobs::Keep,
    )
    .await;
}

#[tokio::test]
async fn transactional_mode_marks_succeeded_jobs_completed_and_leaves_the_rest_of_their_rows() {
    check_mode(
        "transactional_mode_marks_succeeded_jobs_completed_and_leaves_the_rest_of_their_rows",
        ExecutionMode::Transactional,
        false,
        CompletedJobs::Keep,
    )
    .await;
}
