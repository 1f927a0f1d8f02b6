//! The admin contract on a foreign table: a uuid key, renamed columns, an
//! enum state type with a label the mapping does not know (`archived`),
//! errored sharing queued's value and canceled sharing failed's, a kind
//! column called `job_type` and the payload in `body`. Every read and write
//! speaks the table's own vocabulary; filter values stay values.

mod support;

use chrono::{TimeDelta, Utc};
use queue_core::{
    Admin, JobFilter, JobState, ListOrder, ListParams, NewJob, PurgeParams, RetryParams,
    StatsParams, StoreError, Targets,
};
use queue_store_postgres::{Column, PgAdmin, PgStoreOptions};
use sqlx::PgPool;
use support::{awkward_schema, pool};
use uuid::Uuid;

async fn create(pool: &PgPool, schema: &str) -> String {
    let s = format!("\"{}\"", schema.replace('"', "\"\""));
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA {s};
         CREATE TYPE {s}.\"Task Status\" AS ENUM ('pending', 'running', 'done', 'failed', 'archived');
         CREATE TABLE {s}.tasks (
           task_id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
           job_type text NOT NULL,
           status {s}.\"Task Status\" NOT NULL DEFAULT 'pending',
           error text, enqueued timestamptz NOT NULL DEFAULT now(), began timestamptz,
           ended timestamptz, run_after timestamptz, failures integer NOT NULL DEFAULT 0,
           alive_at timestamptz, host text, stop boolean NOT NULL DEFAULT false,
           body jsonb NOT NULL DEFAULT '{{}}')"
    )))
    .execute(pool)
    .await
    .expect("the foreign table");
    s
}

fn options(schema: &str) -> PgStoreOptions {
    let renames = [
        (Column::Id, "task_id"),
        (Column::Kind, "job_type"),
        (Column::Payload, "body"),
        (Column::State, "status"),
        (Column::FailureMessage, "error"),
        (Column::QueuedAt, "enqueued"),
        (Column::StartedAt, "began"),
        (Column::FinishedAt, "ended"),
        (Column::ProcessAfter, "run_after"),
        (Column::NumFailures, "failures"),
        (Column::LastHeartbeatAt, "alive_at"),
        (Column::WorkerHostname, "host"),
        (Column::Cancel, "stop"),
    ];
    let mut options = PgStoreOptions::new("tasks")
        .and_then(|o| o.schema(schema))
        .unwrap();
    for (column, name) in renames {
        options = options.column(column, name).unwrap();
    }
    for absent in [
        Column::NumResets,
        Column::ExecutionLogs,
        Column::ClaimToken,
        Column::Priority,
    ] {
        options = options.without(absent).unwrap();
    }
    options
        .state_value(JobState::Queued, "pending")
        .state_value(JobState::Processing, "running")
        .state_value(JobState::Completed, "done")
        .state_value(JobState::Errored, "pending")
        .state_value(JobState::Failed, "failed")
        .state_value(JobState::Canceled, "failed")
}

async fn set_status(pool: &PgPool, s: &str, id: Uuid, status: &str, error: Option<&str>) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {s}.tasks SET status = $2::text::{s}.\"Task Status\", error = $3, ended = now() - interval '2 hours' WHERE task_id = $1"
    )))
    .bind(id)
    .bind(status)
    .bind(error)
    .execute(pool)
    .await
    .expect("status set");
}

#[tokio::test]
async fn the_admin_contract_speaks_a_foreign_tables_vocabulary() {
    let Some(pool) = pool("the_admin_contract_speaks_a_foreign_tables_vocabulary").await else {
        return;
    };
    let schema = awkward_schema();
    let s = create(&pool, &schema).await;
    let admin = PgAdmin::<Uuid>::new(pool.clone(), options(&schema))
        .await
        .expect("the foreign table passes validation");
    // The table has no notify trigger: the enqueue itself notifies.
    let mut listener = sqlx::postgres::PgListener::connect_with(&pool)
        .await
        .expect("a listener");
    listener
        .listen(&admin.options().notify_channel())
        .await
        .expect("LISTEN");

    let ids = admin
        .enqueue(&[
            NewJob::new("resize", serde_json::json!({"w": 10})),
            NewJob::new("resize", serde_json::json!({"w": 20})),
            NewJob::new("email", serde_json::json!({"to": "a@b.c"})),
            NewJob::new("email", serde_json::json!({"to": "d@e.f"})),
        ])
        .await
        .expect("enqueue into mapped columns")
        .into_iter()
        .map(|e| e.id)
        .collect::<Vec<_>>();
    let woken = tokio::time::timeout(std::time::Duration::from_secs(5), listener.recv())
        .await
        .expect("a notification within 5 s")
        .expect("a notification");
    assert_eq!(woken.channel(), admin.options().notify_channel());
    let job = admin.get(&ids[0]).await.unwrap().expect("enqueued");
    assert_eq!(
        (
            job.kind.as_deref(),
            job.payload.clone(),
            job.stored_state.as_str(),
            job.state
        ),
        (
            Some("resize"),
            Some(serde_json::json!({"w": 10})),
            "pending",
            Some(JobState::Queued)
        ),
        "kind, payload and state come from job_type, body and the enum"
    );
    assert_eq!(
        (job.priority, job.num_resets),
        (None, None),
        "absent columns read as None"
    );

    set_status(&pool, &s, ids[1], "failed", Some("Disk FULL on /tmp")).await;
    set_status(&pool, &s, ids[2], "archived", None).await;

    let stats = admin
        .stats(StatsParams::new(Utc::now(), Utc::now()))
        .await
        .unwrap();
    let counts: Vec<(Option<JobState>, &str, Option<&str>, u64)> = stats
        .counts
        .iter()
        .map(|c| (c.state, c.stored_state.as_str(), c.kind.as_deref(), c.count))
        .collect();
    assert_eq!(
        counts,
        vec![
            (Some(JobState::Queued), "pending", Some("email"), 1),
            (Some(JobState::Queued), "pending", Some("resize"), 1),
            (Some(JobState::Failed), "failed", Some("resize"), 1),
            (None, "archived", Some("email"), 1),
        ],
        "stored values, with the one the mapping does not know last"
    );

    let failed = admin
        .list(&ListParams::first(
            JobFilter::default()
                .states([JobState::Failed])
                .failure_contains("disk full"),
            10,
        ))
        .await
        .unwrap();
    assert_eq!(failed.jobs.len(), 1);
    assert_eq!(failed.jobs[0].id, ids[1]);
    let archived = admin.get(&ids[2]).await.unwrap().expect("there");
    assert_eq!(
        (archived.state, archived.stored_state.as_str()),
        (None, "archived")
    );

    // Values that look like SQL are bound, never spliced in.
    let hostile = "x') OR true; DROP TABLE tasks; --";
    let none = admin
        .list(&ListParams::first(
            JobFilter::default()
                .kinds([hostile])
                .failure_contains(hostile),
            10,
        ))
        .await
        .unwrap();
    assert!(none.jobs.is_empty(), "a hostile kind matches nothing");
    assert_eq!(
        admin
            .list(&ListParams::first(JobFilter::default(), 10))
            .await
            .unwrap()
            .jobs
            .len(),
        4,
        "and the table is intact"
    );

    // Retry writes the table's queued value; the archived job is left alone.
    let report = admin
        .retry(&Targets::Ids(vec![ids[1], ids[2]]), RetryParams::default())
        .await
        .unwrap();
    assert_eq!(report.changed, 1);
    let woken = tokio::time::timeout(std::time::Duration::from_secs(5), listener.recv())
        .await
        .expect("a retry wakes the workers: a notification within 5 s")
        .expect("a notification");
    assert_eq!(woken.channel(), admin.options().notify_channel());
    assert_eq!(report.skipped.len(), 1);
    assert_eq!(
        (
            report.skipped[0].stored_state.as_deref(),
            report.skipped[0].state
        ),
        (Some("archived"), None),
        "a skip names the table's own state"
    );
    let retried = admin.get(&ids[1]).await.unwrap().expect("there");
    assert_eq!(
        (retried.stored_state.as_str(), retried.finished_at),
        ("pending", None)
    );

    // Errored shares queued's value here, so a retry cannot tell an errored
    // job from a waiting one: it takes failed (and canceled) jobs only, and
    // a scheduled job keeps its time.
    assert_eq!(
        admin.retryable_states(),
        [JobState::Failed, JobState::Canceled]
    );
    let later = Utc::now() + TimeDelta::hours(1);
    let scheduled = admin
        .enqueue(&[NewJob::new("resize", serde_json::json!({})).process_after(later)])
        .await
        .unwrap()[0]
        .id;
    let everything = Targets::matching(JobFilter::default(), 100);
    let report = admin
        .retry(&everything, RetryParams::default())
        .await
        .unwrap();
    assert_eq!(report.changed, 0, "nothing failed is left to retry");
    let kept = admin.get(&scheduled).await.unwrap().expect("there");
    assert_eq!(
        kept.process_after.map(|at| at.timestamp_micros()),
        Some(later.timestamp_micros()),
        "a bulk retry does not pull a scheduled job forward"
    );
    admin.delete(&Targets::id(scheduled)).await.unwrap();

    // Cancel writes canceled's value, here the same as failed's.
    let report = admin.cancel(&Targets::id(ids[3])).await.unwrap();
    assert_eq!(report.changed, 1);
    let canceled = admin.get(&ids[3]).await.unwrap().expect("there");
    assert_eq!(
        (
            canceled.stored_state.as_str(),
            canceled.failure_message.as_deref()
        ),
        ("failed", Some(queue_core::CANCELED_BEFORE_RUN_MESSAGE))
    );

    // Purge on the finish-time column `ended`.
    set_status(&pool, &s, ids[3], "done", None).await;
    let purged = admin
        .purge(&PurgeParams::new(
            vec![JobState::Completed],
            Utc::now() - TimeDelta::hours(1),
            10,
        ))
        .await
        .unwrap();
    assert_eq!(purged.purged, 1);
    assert!(admin.get(&ids[3]).await.unwrap().is_none());
}

#[tokio::test]
async fn what_a_table_lacks_is_a_clear_error_not_a_silent_loss() {
    let Some(pool) = pool("what_a_table_lacks_is_a_clear_error_not_a_silent_loss").await else {
        return;
    };
    let schema = awkward_schema();
    let s = create(&pool, &schema).await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER TABLE {s}.tasks DROP COLUMN job_type"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let named = PgAdmin::<Uuid>::new(pool.clone(), options(&schema)).await;
    let err = named.expect_err("a kind column mapped by name must exist");
    assert!(
        matches!(&err, StoreError::Config(m) if m.contains("job_type")),
        "{err}"
    );

    let without_kind = options(&schema).without(Column::Kind).unwrap();
    let admin = PgAdmin::<Uuid>::new(pool.clone(), without_kind)
        .await
        .expect("valid without a kind");
    let err = admin
        .list(&ListParams::first(
            JobFilter::default().kinds(["email"]),
            10,
        ))
        .await
        .expect_err("no kind to filter by");
    assert!(err.to_string().contains("cannot filter by kind"), "{err}");
    let err = admin
        .enqueue(&[NewJob::new("email", serde_json::json!({}))])
        .await
        .expect_err("the kind would be lost");
    assert!(err.to_string().contains("no kind column"), "{err}");
    let id = admin
        .enqueue(&[NewJob::new("", serde_json::json!({"to": "x"}))])
        .await
        .expect("no kind, nothing lost")
        .pop()
        .unwrap()
        .id;
    let job = admin.get(&id).await.unwrap().expect("there");
    assert_eq!(
        (job.kind, job.payload),
        (None, Some(serde_json::json!({"to": "x"})))
    );
}

/// A uuid key says nothing of when a job came: lists run by queued time
/// (then key), newest or oldest first, and page by it; a page after a job
/// that has gone says so instead of reading as the end.
#[tokio::test]
async fn a_uuid_table_lists_by_queued_time() {
    let Some(pool) = pool("a_uuid_table_lists_by_queued_time").await else {
        return;
    };
    let schema = awkward_schema();
    let s = create(&pool, &schema).await;
    let admin = PgAdmin::<Uuid>::new(pool.clone(), options(&schema))
        .await
        .expect("an admin");
    // Five jobs queued a minute apart (the third and fourth at the same
    // time), inserted in another order.
    let mut queued: Vec<(i32, Uuid)> = Vec::new();
    for minutes in [3, 1, 5, 2, 2] {
        let id: Uuid = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {s}.tasks (job_type, enqueued) VALUES ('k', timestamptz '2026-01-01 12:00:00+00' - make_interval(mins => $1)) RETURNING task_id"
        )))
        .bind(minutes)
        .fetch_one(&pool)
        .await
        .expect("a job");
        queued.push((minutes, id));
    }
    // Newest first: fewest minutes ago first, the key breaking the tie
    // (descending too).
    let mut newest = queued.clone();
    newest.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    let expected: Vec<Uuid> = newest.iter().map(|(_, id)| *id).collect();
    let pages = |order| {
        let admin = admin.clone();
        async move {
            let mut seen = Vec::new();
            let mut after = None;
            loop {
                let page = admin
                    .list(
                        &ListParams::first(JobFilter::default(), 2)
                            .order(order)
                            .after(after),
                    )
                    .await
                    .expect("a page");
                seen.extend(page.jobs.iter().map(|j| j.id));
                match page.next {
                    Some(next) => after = Some(next),
                    None => return seen,
                }
            }
        }
    };
    assert_eq!(
        pages(ListOrder::NewestFirst).await,
        expected,
        "newest first, in pages of 2"
    );
    let mut oldest = expected.clone();
    oldest.reverse();
    assert_eq!(
        pages(ListOrder::OldestFirst).await,
        oldest,
        "oldest first, in pages of 2"
    );

    let first = admin
        .list(&ListParams::first(JobFilter::default(), 2))
        .await
        .expect("a page");
    let anchor = first.next.expect("more pages");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DELETE FROM {s}.tasks WHERE task_id = $1"
    )))
    .bind(anchor)
    .execute(&pool)
    .await
    .expect("deleted");
    match admin
        .list(&ListParams::first(JobFilter::default(), 2).after(Some(anchor)))
        .await
    {
        Err(StoreError::Refused(message)) => {
            assert!(
                message.contains("start again from the first page"),
                "{message}"
            )
        }
        other => panic!("a page after a job that is gone: {other:?}"),
    }
}
