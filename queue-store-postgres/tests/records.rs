//! Decoding rows of the default table with `decode_job`.

mod support;

use queue_core::{Job, NewJob};
use support::{fresh_table, pool};

/// `decode_job` reads the default table's columns where the table puts them
/// when it can and by name otherwise: the same row decodes to the same job
/// with its columns in table order, behind other columns (as a claim
/// returns them) and reversed; with a column missing or of the wrong type
/// the error names that column.
#[tokio::test]
async fn decode_job_finds_each_column_wherever_the_select_puts_it() {
    let Some(pool) = pool("decode_job_finds_each_column_wherever_the_select_puts_it").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let id = table
        .enqueue(
            &pool,
            &NewJob::new("mail", serde_json::json!({"to": "a@b"})),
        )
        .await
        .expect("enqueue");
    let t = table.name().quoted();
    sqlx::query(&format!(
        "UPDATE {t} SET failure_message = 'once', worker_hostname = 'host-1', \
         execution_logs = ARRAY['{{\"key\": \"fetch\", \"at\": \"2026-11-22T00:00:00Z\", \"message\": \"hi\"}}'::json] WHERE id = $1"
    ))
    .bind(id)
    .execute(&pool)
    .await
    .expect("fill the optional columns");
    let decode = |sql: String| {
        let pool = pool.clone();
        async move {
            let row = sqlx::query(&sql)
                .bind(id)
                .fetch_one(&pool)
                .await
                .expect("select");
            queue_store_postgres::decode_job(&row)
        }
    };

    let in_order: Job = decode(format!("SELECT * FROM {t} WHERE id = $1"))
        .await
        .expect("table order decodes");
    assert_eq!(in_order.kind, "mail");
    assert_eq!(in_order.failure_message.as_deref(), Some("once"));
    assert_eq!(in_order.worker_hostname.as_deref(), Some("host-1"));
    assert_eq!(in_order.execution_logs.len(), 1);

    let behind_others = decode(format!(
        "SELECT 1 AS a, 'x' AS b, now() AS c, * FROM {t} WHERE id = $1"
    ))
    .await
    .expect("decodes behind other columns");
    assert_eq!(behind_others, in_order);

    let reversed = decode(format!(
        "SELECT claim_token, cancel, worker_hostname, execution_logs, last_heartbeat_at, \
         num_failures, num_resets, process_after, finished_at, started_at, queued_at, \
         failure_message, state, priority, payload, kind, id FROM {t} WHERE id = $1"
    ))
    .await
    .expect("reversed columns decode");
    assert_eq!(reversed, in_order);

    let missing = decode(format!(
        "SELECT id, kind, payload, priority, state, failure_message, queued_at, finished_at, \
         process_after, num_resets, num_failures, last_heartbeat_at, execution_logs, \
         worker_hostname, cancel, claim_token FROM {t} WHERE id = $1"
    ))
    .await
    .expect_err("a row without started_at cannot decode");
    assert!(
        missing.to_string().contains("started_at"),
        "the error names the missing column: {missing}"
    );

    // A column of the wrong type where the table puts it: named too.
    let retyped = decode(format!(
        "SELECT id, kind, payload::text AS payload, priority, state, failure_message, queued_at, \
         started_at, finished_at, process_after, num_resets, num_failures, last_heartbeat_at, \
         execution_logs, worker_hostname, cancel, claim_token FROM {t} WHERE id = $1"
    ))
    .await
    .expect_err("a text payload cannot decode as jsonb");
    assert!(
        retyped.to_string().contains("payload"),
        "the error names the column: {retyped}"
    );
}
