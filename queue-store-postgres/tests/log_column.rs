//! An execution log entry on a table without a log column is reported as
//! not kept, never as written.

mod support;

use chrono::Utc;
use queue_core::{ClaimParams, Job, LogEntry, NewJob, Store, WriteResult};
use queue_store_postgres::{Column, PgStore};
use support::{fresh_table, pool};

#[tokio::test]
async fn a_log_entry_without_a_log_column_is_not_kept() {
    let Some(pool) = pool("a_log_entry_without_a_log_column_is_not_kept").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    table
        .enqueue_many(
            &pool,
            &[
                NewJob::new("k", serde_json::json!(1)),
                NewJob::new("k", serde_json::json!(2)),
            ],
        )
        .await
        .expect("enqueued");
    for (options, expected) in [
        (table.store_options(), WriteResult::Applied),
        (
            table
                .store_options()
                .without(Column::ExecutionLogs)
                .expect("valid options"),
            WriteResult::NotKept,
        ),
    ] {
        let store: PgStore<Job> = PgStore::default_table(pool.clone(), options)
            .await
            .expect("a store");
        let mut claimed = store
            .claim(ClaimParams {
                limit: 1,
                worker: "w",
                conditions: None,
                now: Utc::now(),
            })
            .await
            .expect("claimed");
        let job = claimed.pop().expect("a job");
        let written = store
            .append_log(&job.lease, LogEntry::new("step", Utc::now(), "hello"))
            .await
            .expect("no error");
        assert_eq!(written, expected);
    }
}
