//! The dbworker tutorial as a test (and the code of
//! `docs/existing-tables.md`): an existing `example_jobs` table with the
//! spec's columns (no claim token, an integer key), a view joining the `repo`
//! table for the repository name, a select list and order over the alias,
//! and a handler writing in the job's transaction.

mod support;

use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use queue_core::{CancellationToken, Handler, JobContext, JobError, JobRecord};
use queue_store_postgres::{Column, ExecutionMode, PgJobTransaction, PgStore, PgStoreOptions};
use queue_worker::{Resetter, ResetterOptions, Worker, WorkerOptions};
use support::{awkward_schema, pool};

/// The tutorial's model: the interesting fields of the view.
#[derive(Debug, sqlx::FromRow)]
struct ExampleJob {
    id: i32,
    state: String,
    failure_message: Option<String>,
    started_at: Option<DateTime<Utc>>,
    num_failures: i32,
    worker_hostname: String,
    repository_id: i32,
    repository_name: String,
}

impl JobRecord for ExampleJob {
    type Id = i32;
    fn id(&self) -> &i32 {
        &self.id
    }
    fn kind(&self) -> &str {
        "example"
    }
}

/// The tutorial's columns, over the alias `example_jobs` that the view
/// carries.
const EXAMPLE_JOB_COLUMNS: &str =
    "example_jobs.id, example_jobs.state, example_jobs.failure_message, \
     example_jobs.started_at, example_jobs.num_failures, example_jobs.worker_hostname, \
     example_jobs.repository_id, example_jobs.name AS repository_name";

fn store_options(schema: &str) -> PgStoreOptions {
    PgStoreOptions::new("example_jobs")
        .and_then(|o| o.schema(schema))
        .and_then(|o| o.view("example_jobs_with_repository_name"))
        // The tutorial's table has neither a claim counter (claims are
        // fenced by started_at) nor a priority (the order is explicit).
        .and_then(|o| o.without(Column::ClaimToken))
        .and_then(|o| o.without(Column::Priority))
        .expect("valid options")
        .select(EXAMPLE_JOB_COLUMNS)
        .order_by("example_jobs.repository_id, example_jobs.id")
        .mode(ExecutionMode::Transactional)
}

/// Records what it processed, in the job's transaction.
struct Indexer {
    processed: String,
}

#[async_trait]
impl Handler<PgStore<ExampleJob>> for Indexer {
    async fn handle(
        &self,
        ctx: &JobContext,
        store: &mut PgJobTransaction<i32>,
        job: &ExampleJob,
    ) -> Result<(), JobError> {
        // The view shows the row as claimed.
        assert_eq!(
            (job.state.as_str(), job.num_failures, &job.failure_message),
            ("processing", 0, &None)
        );
        assert_eq!(job.worker_hostname, ctx.worker());
        assert!(job.started_at.is_some());
        let expected_repo = if job.repository_id == 1 {
            "github.com/a/one"
        } else {
            "github.com/b/two"
        };
        assert_eq!(job.repository_name, expected_repo);
        let logged = ctx
            .log("index", format!("indexing {}", job.repository_name))
            .await?;
        assert!(logged.is_applied());
        let conn = store.transaction().await.map_err(JobError::poison)?;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {} (job_id, repository) VALUES ($1, $2)",
            self.processed
        )))
        .bind(job.id)
        .bind(&job.repository_name)
        .execute(conn)
        .await?;
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dbworker_tutorial_runs_on_its_own_table() {
    let Some(pool) = pool("the_dbworker_tutorial_runs_on_its_own_table").await else {
        return;
    };
    let schema = awkward_schema();
    let s = format!("\"{}\"", schema.replace('"', "\"\""));
    // Step 1 of the tutorial: the jobs table, a repo table and the view.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA {s};
         SET search_path TO {s};
         CREATE TABLE repo (id integer PRIMARY KEY, name text NOT NULL);
         CREATE TABLE example_jobs (
           id                SERIAL PRIMARY KEY,
           state             text DEFAULT 'queued',
           failure_message   text,
           queued_at         timestamp with time zone DEFAULT NOW(),
           started_at        timestamp with time zone,
           finished_at       timestamp with time zone,
           process_after     timestamp with time zone,
           num_resets        integer not null default 0,
           num_failures      integer not null default 0,
           last_heartbeat_at timestamp with time zone,
           execution_logs    json[],
           worker_hostname   text not null default '',
           cancel            boolean not null default false,
           repository_id     integer not null
         );
         CREATE VIEW example_jobs_with_repository_name AS
           SELECT ej.*, r.name FROM example_jobs ej JOIN repo r ON r.id = ej.repository_id;
         CREATE TABLE processed (job_id integer, repository text);
         INSERT INTO repo VALUES (1, 'github.com/a/one'), (2, 'github.com/b/two');
         INSERT INTO example_jobs (repository_id) VALUES (2), (1), (2), (1);
         RESET search_path;"
    )))
    .execute(&pool)
    .await
    .expect("tutorial schema");

    // Steps 2-5: model, store, handler, worker and resetter.
    let store = PgStore::<ExampleJob>::new(pool.clone(), store_options(&schema))
        .await
        .expect("the tutorial's table passes validation");
    let disabled: Vec<Column> = store
        .disabled_features()
        .into_iter()
        .map(|(c, _)| c)
        .collect();
    assert_eq!(
        disabled,
        [
            Column::ClaimToken,
            Column::Priority,
            Column::Kind,
            Column::Payload,
            Column::UniqueKey,
            Column::UniqueForever,
            Column::MaxAttempts,
            Column::ExpiresAt,
            Column::AtMostOnce,
        ],
        "the store says which features are off (the tutorial's table has no kind or payload)"
    );
    let processed = format!("{s}.processed");
    let shutdown = CancellationToken::new();
    let worker = Worker::new(
        store.clone(),
        Indexer {
            processed: processed.clone(),
        },
        WorkerOptions {
            poll_interval: Duration::from_millis(100),
            ..WorkerOptions::default().handlers(1)
        },
    )
    .expect("worker");
    let resetter = Resetter::new(store.clone(), ResetterOptions::default()).expect("resetter");
    let resetting = tokio::spawn(resetter.run(shutdown.clone()));
    let working = tokio::spawn(worker.run(shutdown.clone()));

    let deadline = Instant::now() + Duration::from_secs(30);
    let completed_sql = format!("SELECT count(*) FROM {s}.example_jobs WHERE state = 'completed'");
    while sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(completed_sql.to_owned()))
        .fetch_one(&pool)
        .await
        .unwrap()
        < 4
    {
        assert!(
            Instant::now() < deadline,
            "the tutorial's jobs did not complete"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    assert_eq!(working.await.unwrap().unwrap().count("completed"), 4);
    resetting.await.unwrap().unwrap();

    // One handler ran them in (repository_id, id) order, with the names from the view.
    let rows: Vec<(i32, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT job_id, repository FROM {processed} ORDER BY ctid"
    )))
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(
        rows,
        [
            (2, "github.com/a/one".to_owned()),
            (4, "github.com/a/one".to_owned()),
            (1, "github.com/b/two".to_owned()),
            (3, "github.com/b/two".to_owned()),
        ]
    );
    let logs: Vec<Option<i32>> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT array_length(execution_logs, 1) FROM {s}.example_jobs ORDER BY id"
    )))
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(logs, [Some(1); 4], "each job kept its execution log entry");
}
