//! Decoding rows of the default table: `decode_job`, and the records of
//! claims.

mod support;

use queue_core::{ClaimParams, Job, JobState, NewJob, Store};
use queue_store_postgres::{Column, ExecutionMode, PgStore};
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
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {t} SET failure_message = 'once', worker_hostname = 'host-1', \
         execution_logs = ARRAY['{{\"key\": \"fetch\", \"at\": \"2026-11-22T00:00:00Z\", \"message\": \"hi\"}}'::json] WHERE id = $1"
    )))
    .bind(id)
    .execute(&pool)
    .await
    .expect("fill the optional columns");
    let decode = |sql: String| {
        let pool = pool.clone();
        async move {
            let row = sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
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

/// A claim on the default table reads back only the columns it did not
/// write and takes the rest from what it wrote: each claimed `Job` equals
/// the row the claim left, read back whole, for a fresh job and for one
/// retried and reset before; also with a column renamed, where the claim
/// reads it under its standard name; and with a select list of the user's
/// own, which the whole row decodes from as before.
#[tokio::test]
async fn a_claimed_job_is_the_row_the_claim_left() {
    let Some(pool) = pool("a_claimed_job_is_the_row_the_claim_left").await else {
        return;
    };
    for case in ["default", "renamed column", "own select list"] {
        let table = fresh_table(&pool).await;
        let t = table.name().quoted();
        let mut options = table.store_options().mode(ExecutionMode::Lease);
        match case {
            "renamed column" => {
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "ALTER TABLE {t} RENAME COLUMN failure_message TO \"last error\""
                )))
                .execute(&pool)
                .await
                .expect("rename");
                options = options
                    .column(Column::FailureMessage, "last error")
                    .expect("a valid name");
            }
            "own select list" => options = options.select("jobs.*"),
            _ => {}
        }
        let fresh = table
            .enqueue(
                &pool,
                &NewJob::new("mail", serde_json::json!({"to": "a@b"})).priority(5),
            )
            .await
            .expect("enqueue");
        let retried = table
            .enqueue(&pool, &NewJob::new("sms", serde_json::json!([1, 2])))
            .await
            .expect("enqueue");
        let message = if case == "renamed column" {
            "\"last error\""
        } else {
            "failure_message"
        };
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {t} SET state = 'errored', {message} = 'once', num_failures = 1, num_resets = 2, \
             finished_at = now() - interval '1 minute', process_after = now() - interval '1 second', \
             worker_hostname = 'earlier', claim_token = 7, \
             execution_logs = ARRAY['{{\"key\": \"a\", \"at\": \"2026-11-22T00:00:00Z\", \"message\": \"m\"}}'::json] \
             WHERE id = $1"
        )))
        .bind(retried)
        .execute(&pool)
        .await
        .expect("an earlier attempt");
        let store = PgStore::default_table(pool.clone(), options)
            .await
            .expect("a store");
        let claimed = store
            .claim(ClaimParams {
                limit: 2,
                worker: "worker-7",
                conditions: None,
                now: chrono::Utc::now(),
            })
            .await
            .expect("a claim");
        assert_eq!(claimed.len(), 2, "{case}");
        let whole = if case == "renamed column" {
            format!("SELECT *, \"last error\" AS failure_message FROM {t} WHERE id = $1")
        } else {
            format!("SELECT * FROM {t} WHERE id = $1")
        };
        for job in claimed {
            let record = job.record.expect("a decoded record");
            let row = sqlx::query(sqlx::AssertSqlSafe(whole.to_owned()))
                .bind(record.id)
                .fetch_one(&pool)
                .await
                .expect("the claimed row");
            let stored = queue_store_postgres::decode_job(&row).expect("the row decodes");
            assert_eq!(record, stored, "{case}");
            assert_eq!(record.state, JobState::Processing, "{case}");
            assert_eq!(
                record.worker_hostname.as_deref(),
                Some("worker-7"),
                "{case}"
            );
            assert!(record.execution_logs.is_empty(), "{case}");
            assert_eq!(
                record.id == retried,
                record.failure_message.as_deref() == Some("once"),
                "{case}"
            );
            if record.id == fresh {
                assert_eq!((record.priority, record.num_failures), (5, 0), "{case}");
            }
        }
    }
}

/// jsonb keeps numbers exactly and prints the largest f64 as 309 digits:
/// a claimed job's payload reads back as it went in, not as undecodable.
#[tokio::test]
async fn extreme_numbers_in_a_payload_survive_the_claim() {
    let Some(pool) = support::pool("extreme_numbers_in_a_payload_survive_the_claim").await else {
        return;
    };
    let table = support::fresh_table(&pool).await;
    let payload = serde_json::json!([f64::MAX, f64::MIN, 5e-324]);
    table
        .enqueue(&pool, &queue_core::NewJob::new("k", payload.clone()))
        .await
        .expect("enqueue");
    let store = support::store(&pool, &table, queue_store_postgres::ExecutionMode::Lease).await;
    let claimed = support::claim_now(&store, 1).await;
    let record = claimed[0].record.as_ref().expect("the record decodes");
    assert_eq!(record.payload, payload);
}
