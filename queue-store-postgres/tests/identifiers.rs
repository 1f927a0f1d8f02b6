//! Names and start-up validation: awkward and hostile table and column
//! names work and never become SQL, and a misconfigured table is refused
//! with an error that names the object and what was expected.

mod support;

use chrono::Utc;
use queue_core::{ClaimParams, Job, JobState, NewJob, Store, StoreError, Transition};
use queue_store_postgres::{Column, PgStore, PgStoreOptions};
use sqlx::PgPool;
use support::{awkward_schema, fresh_table, pool};

fn q(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Creates the default layout under hostile names: a table and every
/// remapped column named to break naive SQL.
async fn hostile_table(pool: &PgPool, schema: &str) -> (String, PgStoreOptions) {
    let table = "jobs\"; DROP TABLE victims; --";
    let state = "Select";
    let id = "the id";
    let sql = format!(
        "CREATE SCHEMA {s};
         CREATE TABLE {s}.victims (x int);
         CREATE TABLE {s}.{t} (
            {id} bigserial PRIMARY KEY, kind text NOT NULL, payload jsonb NOT NULL DEFAULT '{{}}',
            priority int NOT NULL DEFAULT 0, {state} text NOT NULL DEFAULT 'queued', failure_message text,
            queued_at timestamptz NOT NULL DEFAULT now(), started_at timestamptz, finished_at timestamptz,
            process_after timestamptz, num_resets int NOT NULL DEFAULT 0, num_failures int NOT NULL DEFAULT 0,
            last_heartbeat_at timestamptz, execution_logs json[], worker_hostname text,
            \"cancel'--\" boolean NOT NULL DEFAULT false, claim_token bigint NOT NULL DEFAULT 0)",
        s = q(schema),
        t = q(table),
        id = q(id),
        state = q(state),
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
        .execute(pool)
        .await
        .expect("create hostile table");
    let options = PgStoreOptions::new(table)
        .unwrap()
        .schema(schema)
        .unwrap()
        .alias("j")
        .unwrap()
        .column(Column::Id, id)
        .unwrap()
        .column(Column::State, state)
        .unwrap()
        .column(Column::Cancel, "cancel'--")
        .unwrap()
        .select(format!("j.{} AS id, j.*", q(id)));
    (table.to_owned(), options)
}

/// Decodes the hostile table's rows (its key and state columns are renamed).
fn decode(row: &sqlx::postgres::PgRow) -> Result<Job, sqlx::Error> {
    use sqlx::Row;
    let mut job = Job::example(
        row.try_get("id")?,
        &row.try_get::<String, _>("kind")?,
        row.try_get("payload")?,
    );
    job.state = match row.try_get::<String, _>("Select")?.as_str() {
        "processing" => JobState::Processing,
        _ => JobState::Queued,
    };
    Ok(job)
}

#[tokio::test]
async fn hostile_names_stay_names() {
    let Some(pool) = pool("hostile_names_stay_names").await else {
        return;
    };
    let schema = awkward_schema();
    let (table, options) = hostile_table(&pool, &schema).await;
    let store = PgStore::with_decoder(pool.clone(), options, decode)
        .await
        .expect("a valid, if hostile, table");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {}.{} (kind) VALUES ('k')",
        q(&schema),
        q(&table)
    )))
    .execute(&pool)
    .await
    .unwrap();
    let now = Utc::now();
    let mut claimed = store
        .claim(ClaimParams {
            limit: 5,
            worker: "w'; --",
            conditions: None,
            now,
        })
        .await
        .expect("claim on hostile names");
    let job = claimed.pop().expect("one job");
    assert_eq!(job.record.as_ref().unwrap().kind, "k");
    assert_eq!(job.record.as_ref().unwrap().state, JobState::Processing);
    let done = store
        .finish(job.job_store, &job.lease, Transition::Complete, now)
        .await
        .unwrap();
    assert!(done.is_applied());
    assert!(store
        .reset_stalled(queue_core::ResetParams {
            stalled_before: now,
            max_resets: 1,
            delivery: Default::default(),
            now,
        })
        .await
        .is_ok());
    let victims: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {}.victims",
        q(&schema)
    )))
    .fetch_one(&pool)
    .await
    .expect("the victims table still exists");
    assert_eq!(victims, 0);
}

async fn refused(pool: &PgPool, options: PgStoreOptions) -> String {
    match PgStore::default_table(pool.clone(), options).await {
        Ok(_) => panic!("a misconfigured table was accepted"),
        Err(StoreError::Config(message)) => message,
        Err(other) => panic!("expected a configuration error, got {other}"),
    }
}

#[tokio::test]
async fn misconfigurations_are_refused_with_the_object_named() {
    let Some(pool) = pool("misconfigurations_are_refused_with_the_object_named").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let schema = table.name().schema.as_str().to_owned();

    let missing_table = refused(
        &pool,
        PgStoreOptions::new("nope")
            .unwrap()
            .schema(&schema)
            .unwrap(),
    )
    .await;
    assert!(
        missing_table.contains(&format!("table {}.\"nope\" does not exist", q(&schema))),
        "{missing_table}"
    );

    let missing_column = refused(
        &pool,
        table
            .store_options()
            .column(Column::State, "status")
            .unwrap(),
    )
    .await;
    assert!(
        missing_column.contains("has no column \"status\" (configured for state)"),
        "{missing_column}"
    );

    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER TABLE {} ADD COLUMN wrong_type integer",
        table.name().quoted()
    )))
    .execute(&pool)
    .await
    .unwrap();
    let mistyped = refused(
        &pool,
        table
            .store_options()
            .column(Column::FailureMessage, "wrong_type")
            .unwrap(),
    )
    .await;
    assert!(
        mistyped.contains("column \"wrong_type\"")
            && mistyped.contains("has type integer; expected text or character varying"),
        "{mistyped}"
    );

    let wrong_key =
        match PgStore::<UuidJob>::with_decoder(pool.clone(), table.store_options(), decode_uuid)
            .await
        {
            Err(StoreError::Config(message)) => message,
            other => panic!("expected a key type error, got {other:?}"),
        };
    assert!(
        wrong_key.contains("key column \"id\"") && wrong_key.contains("has type bigint"),
        "{wrong_key}"
    );

    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE VIEW {}.\"no key\" AS SELECT kind FROM {}",
        q(&schema),
        table.name().quoted()
    )))
    .execute(&pool)
    .await
    .unwrap();
    let keyless_view = refused(&pool, table.store_options().view("no key").unwrap()).await;
    assert!(
        keyless_view.contains("view") && keyless_view.contains("has no key column \"id\""),
        "{keyless_view}"
    );

    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TYPE {s}.status AS ENUM ('pending', 'running', 'done', 'failed');
         CREATE TABLE {s}.enum_jobs (id bigserial PRIMARY KEY, status {s}.status NOT NULL DEFAULT 'pending',
            started_at timestamptz, last_heartbeat_at timestamptz)",
        s = q(&schema)
    )))
    .execute(&pool)
    .await
    .unwrap();
    let mut enum_options = PgStoreOptions::new("enum_jobs")
        .unwrap()
        .schema(&schema)
        .unwrap();
    for column in [
        Column::FailureMessage,
        Column::QueuedAt,
        Column::FinishedAt,
        Column::ProcessAfter,
        Column::NumResets,
        Column::NumFailures,
        Column::ExecutionLogs,
        Column::WorkerHostname,
        Column::Cancel,
        Column::ClaimToken,
        Column::Priority,
    ] {
        enum_options = enum_options.without(column).unwrap();
    }
    let enum_options = enum_options
        .column(Column::State, "status")
        .unwrap()
        .state_value(JobState::Queued, "pending")
        .state_value(JobState::Processing, "running")
        .state_value(JobState::Errored, "pending")
        .state_value(JobState::Completed, "completed")
        .state_value(JobState::Canceled, "failed");
    let missing_label = refused(&pool, enum_options).await;
    assert!(
        missing_label.contains("has no value \"completed\" (configured for completed)")
            && missing_label.contains("\"pending\", \"running\", \"done\", \"failed\""),
        "{missing_label}"
    );
}

/// A record keyed by uuid, to show that a key type mismatch is refused.
#[derive(Debug)]
struct UuidJob {
    id: uuid::Uuid,
}

impl queue_core::JobRecord for UuidJob {
    type Id = uuid::Uuid;
    fn id(&self) -> &uuid::Uuid {
        &self.id
    }
    fn kind(&self) -> &str {
        "uuid"
    }
}

fn decode_uuid(row: &sqlx::postgres::PgRow) -> Result<UuidJob, sqlx::Error> {
    use sqlx::Row;
    Ok(UuidJob {
        id: row.try_get("id")?,
    })
}

#[tokio::test]
async fn enqueue_accepts_any_executor_including_a_transaction() {
    let Some(pool) = pool("enqueue_accepts_any_executor_including_a_transaction").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let mut tx = pool.begin().await.unwrap();
    let ids = table
        .enqueue_many(
            &mut *tx,
            &[
                NewJob::new("a", serde_json::json!(1)),
                NewJob::new("b", serde_json::json!(2)),
            ],
        )
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let count: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {}",
        table.name().quoted()
    )))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        (ids.len(), count),
        (2, 0),
        "a rolled-back enqueue leaves nothing"
    );
}
