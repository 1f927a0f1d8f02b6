//! Shapes real teams' tables have, mapped and drained in both modes: a
//! scheduler's `jobs` table with an enum status that the record reads as a
//! `String`, smallint counters and priority, and a jsonb `failure_info`
//! that receives `{"message", "attempt", "at"}` objects.

mod support;

use std::time::{Duration, Instant};

use async_trait::async_trait;
use queue_core::{
    Admin, CancellationToken, Handler, JobContext, JobError, JobRecord, JobState, NewJob,
};
use queue_store_postgres::{Column, ExecutionMode, PgJobTransaction, PgStore, PgStoreOptions};
use queue_worker::{Worker, WorkerOptions};
use sqlx::PgPool;
use support::{awkward_schema, pool};
use uuid::Uuid;

/// The record: the status enum read as a string, the smallint count as
/// `i16`.
#[derive(Debug, sqlx::FromRow)]
struct SchedJob {
    id: Uuid,
    name: String,
    status: String,
    attempts: i16,
    args: serde_json::Value,
}

impl JobRecord for SchedJob {
    type Id = Uuid;
    fn id(&self) -> &Uuid {
        &self.id
    }
    fn kind(&self) -> &str {
        &self.name
    }
}

fn quoted(schema: &str) -> String {
    format!("\"{}\"", schema.replace('"', "\"\""))
}

async fn create(pool: &PgPool, schema: &str) {
    let s = quoted(schema);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA {s};
         CREATE TYPE {s}.job_status AS ENUM ('scheduled', 'running', 'done', 'retrying', 'dead', 'cancelled');
         CREATE TABLE {s}.jobs (
           id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
           name text NOT NULL,
           status {s}.job_status NOT NULL DEFAULT 'scheduled',
           priority smallint NOT NULL DEFAULT 0,
           attempts smallint NOT NULL DEFAULT 0,
           resets smallint NOT NULL DEFAULT 0,
           failure_info jsonb,
           created_at timestamptz NOT NULL DEFAULT now(), started_at timestamptz,
           finished_at timestamptz, run_at timestamptz, heartbeat_at timestamptz,
           args jsonb NOT NULL DEFAULT '{{}}')"
    )))
    .execute(pool)
    .await
    .expect("the scheduler's table");
}

fn options(schema: &str, mode: ExecutionMode) -> PgStoreOptions {
    let mut options = PgStoreOptions::new("jobs")
        .and_then(|o| o.schema(schema))
        .expect("valid names");
    for (column, name) in [
        (Column::Kind, "name"),
        (Column::State, "status"),
        (Column::NumFailures, "attempts"),
        (Column::NumResets, "resets"),
        (Column::FailureMessage, "failure_info"),
        (Column::QueuedAt, "created_at"),
        (Column::ProcessAfter, "run_at"),
        (Column::LastHeartbeatAt, "heartbeat_at"),
        (Column::Payload, "args"),
    ] {
        options = options.column(column, name).expect("valid name");
    }
    for column in [
        Column::ExecutionLogs,
        Column::WorkerHostname,
        Column::Cancel,
        Column::ClaimToken,
    ] {
        options = options.without(column).expect("optional");
    }
    options
        .state_value(JobState::Queued, "scheduled")
        .state_value(JobState::Processing, "running")
        .state_value(JobState::Completed, "done")
        .state_value(JobState::Errored, "retrying")
        .state_value(JobState::Failed, "dead")
        .state_value(JobState::Canceled, "cancelled")
        .mode(mode)
}

/// Does what the job's `do` says; checks the record it was given.
struct ByArgs;

#[async_trait]
impl Handler<PgStore<SchedJob>> for ByArgs {
    async fn handle(
        &self,
        ctx: &JobContext,
        _: &mut PgJobTransaction<Uuid>,
        job: &SchedJob,
    ) -> Result<(), JobError> {
        if job.status != "running" || i64::from(job.attempts) != i64::from(ctx.attempt()) - 1 {
            return Err(JobError::poison(format!(
                "the record is wrong: status {:?}, attempts {}, attempt {}",
                job.status,
                job.attempts,
                ctx.attempt()
            )));
        }
        match job.args["do"].as_str() {
            Some("retry-once") if ctx.attempt() == 1 => {
                Err(JobError::retry_after("upstream busy", Duration::ZERO))
            }
            Some("poison") => Err(JobError::poison("bad args")),
            _ => Ok(()),
        }
    }
}

async fn row(pool: &PgPool, schema: &str, id: Uuid) -> (String, i16, Option<serde_json::Value>) {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT status::text, attempts, failure_info FROM {}.jobs WHERE id = $1",
        quoted(schema)
    )))
    .bind(id)
    .fetch_one(pool)
    .await
    .expect("the row")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_table_with_enum_status_smallint_counters_and_jsonb_failures() {
    let test = "a_scheduler_table_with_enum_status_smallint_counters_and_jsonb_failures";
    let Some(pool) = pool(test).await else { return };
    for mode in [ExecutionMode::Lease, ExecutionMode::Transactional] {
        let schema = awkward_schema();
        create(&pool, &schema).await;
        let store = PgStore::<SchedJob>::new(pool.clone(), options(&schema, mode))
            .await
            .expect("smallint counters and a jsonb failure column are accepted");
        let jobs = [
            NewJob::new("sync", serde_json::json!({"do": "ok"})).priority(5),
            NewJob::new("sync", serde_json::json!({"do": "retry-once"})),
            NewJob::new("sync", serde_json::json!({"do": "poison"})),
        ];
        let ids: Vec<Uuid> = Admin::enqueue(&store, &jobs)
            .await
            .expect("enqueued")
            .into_iter()
            .map(|e| e.id)
            .collect();
        let options = WorkerOptions {
            poll_interval: Duration::from_millis(50),
            ..WorkerOptions::default()
        };
        let worker = Worker::new(store.clone(), ByArgs, options).expect("a worker");
        let shutdown = CancellationToken::new();
        let running = tokio::spawn(worker.run(shutdown.clone()));
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut states = Vec::new();
            for id in &ids {
                states.push(row(&pool, &schema, *id).await.0);
            }
            if states == ["done", "done", "dead"] {
                break;
            }
            assert!(Instant::now() < deadline, "{mode:?}: stuck at {states:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        shutdown.cancel();
        let report = running.await.expect("joined").expect("the worker ran");
        assert_eq!(
            (
                report.count("completed"),
                report.count("retried"),
                report.count("poisoned")
            ),
            (2, 1, 1),
            "{mode:?}: every record decoded (status as a string), one retry, one failure"
        );

        let (_, attempts, failure) = row(&pool, &schema, ids[1]).await;
        assert_eq!(attempts, 1, "{mode:?}: the smallint failure count");
        let failure = failure.expect("the retried job keeps its failure");
        assert_eq!(
            (&failure["message"], &failure["attempt"]),
            (&serde_json::json!("upstream busy"), &serde_json::json!(1)),
            "{mode:?}: {failure}"
        );
        let (_, _, failure) = row(&pool, &schema, ids[2]).await;
        let failure = failure.expect("the failed job's failure");
        assert_eq!(failure["message"], "bad args", "{mode:?}: {failure}");
        assert!(
            failure["at"].as_str().is_some_and(|at| at.contains('T')),
            "{mode:?}: the time of the failure: {failure}"
        );

        let view = Admin::get(&store, &ids[2])
            .await
            .expect("get")
            .expect("the job");
        assert_eq!(
            (
                view.failure_message.as_deref(),
                view.num_failures,
                view.state
            ),
            (Some("bad args"), Some(1), Some(JobState::Failed)),
            "{mode:?}: the admin view reads the message out of the object"
        );
        let matching = Admin::count(
            &store,
            &queue_core::JobFilter::default().failure_contains("BAD ARG"),
        )
        .await
        .expect("count");
        assert_eq!(
            matching, 1,
            "{mode:?}: the failure filter searches the message"
        );
    }
}

/// A rickover-like table: `attempts` counts the tries a job has *left*,
/// down to 0, and failures are stored as `{"error": ...}`. Mapped with
/// `Column::AttemptsLeft` and `failure_message_path(["error"])`, both
/// modes bound retries by the countdown, write failures where the table
/// keeps them, and operators read and filter the table's own failures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_countdown_attempts_column_and_an_error_key_for_failures() {
    let test = "a_countdown_attempts_column_and_an_error_key_for_failures";
    let Some(pool) = pool(test).await else { return };
    for mode in [ExecutionMode::Lease, ExecutionMode::Transactional] {
        let schema = awkward_schema();
        let s = quoted(&schema);
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "CREATE SCHEMA {s};
             CREATE TABLE {s}.queued_jobs (
               id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
               name text NOT NULL,
               status text NOT NULL DEFAULT 'queued',
               attempts smallint NOT NULL DEFAULT 3,
               failure_info jsonb,
               created_at timestamptz NOT NULL DEFAULT now(), started_at timestamptz,
               finished_at timestamptz, run_at timestamptz, heartbeat_at timestamptz,
               args jsonb NOT NULL DEFAULT '{{}}');
             INSERT INTO {s}.queued_jobs (name, status, attempts, failure_info)
               VALUES ('legacy', 'failed', 0, '{{\"error\": \"legacy boom\", \"code\": 7}}')"
        )))
        .execute(&pool)
        .await
        .expect("the table");
        let mut options = PgStoreOptions::new("queued_jobs")
            .and_then(|o| o.schema(&schema))
            .and_then(|o| o.failure_message_path(["error"]))
            .expect("valid options");
        for (column, name) in [
            (Column::Kind, "name"),
            (Column::State, "status"),
            (Column::AttemptsLeft, "attempts"),
            (Column::FailureMessage, "failure_info"),
            (Column::QueuedAt, "created_at"),
            (Column::ProcessAfter, "run_at"),
            (Column::LastHeartbeatAt, "heartbeat_at"),
            (Column::Payload, "args"),
        ] {
            options = options.column(column, name).expect("valid name");
        }
        for column in [
            Column::NumFailures,
            Column::NumResets,
            Column::ExecutionLogs,
            Column::WorkerHostname,
            Column::Cancel,
            Column::ClaimToken,
            Column::Priority,
        ] {
            options = options.without(column).expect("optional");
        }
        let store = PgStore::<QueuedJob>::new(pool.clone(), options.mode(mode))
            .await
            .expect("a countdown column stands in for a failure count");
        let ids: Vec<Uuid> = Admin::enqueue(
            &store,
            &[
                NewJob::new("sync", serde_json::json!({"do": "fail"})),
                NewJob::new("sync", serde_json::json!({"do": "fail"})).max_attempts(1),
                NewJob::new("sync", serde_json::json!({"do": "ok"})),
            ],
        )
        .await
        .expect("enqueued")
        .into_iter()
        .map(|e| e.id)
        .collect();
        let left = |id: Uuid| {
            let (pool, s) = (pool.clone(), s.clone());
            async move {
                sqlx::query_as::<_, (String, i16, Option<serde_json::Value>)>(sqlx::AssertSqlSafe(
                    format!(
                        "SELECT status, attempts, failure_info FROM {s}.queued_jobs WHERE id = $1"
                    ),
                ))
                .bind(id)
                .fetch_one(&pool)
                .await
                .expect("the row")
            }
        };
        assert_eq!(
            left(ids[1]).await.1,
            1,
            "{mode:?}: a job's own limit starts its countdown"
        );
        assert_eq!(
            left(ids[0]).await.1,
            3,
            "{mode:?}: else the column's default"
        );

        let worker = Worker::new(
            store.clone(),
            FailsWhenAsked,
            WorkerOptions {
                poll_interval: Duration::from_millis(50),
                ..WorkerOptions::default()
            },
        )
        .expect("a worker");
        let shutdown = CancellationToken::new();
        let running = tokio::spawn(worker.run(shutdown.clone()));
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut states = Vec::new();
            for id in &ids {
                states.push(left(*id).await.0);
            }
            if states == ["failed", "failed", "completed"] {
                break;
            }
            assert!(Instant::now() < deadline, "{mode:?}: stuck at {states:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        shutdown.cancel();
        let report = running.await.expect("joined").expect("the worker ran");
        assert_eq!(
            (
                report.count("retried"),
                report.count("failed"),
                report.count("completed")
            ),
            (2, 2, 1),
            "{mode:?}: three tries for the default's 3, one for the job limited to 1"
        );
        let (_, attempts, failure) = left(ids[0]).await;
        assert_eq!(attempts, 0, "{mode:?}: counted down to nothing");
        let failure = failure.expect("the failure");
        assert!(
            failure["error"]
                .as_str()
                .is_some_and(|e| e.starts_with("flaky upstream")),
            "{mode:?}: the message under the table's own key: {failure}"
        );
        assert!(failure.get("message").is_none(), "{mode:?}: {failure}");
        assert_eq!(
            left(ids[2]).await.1,
            3,
            "{mode:?}: a success costs no attempt"
        );

        let legacy = Admin::list(
            &store,
            &queue_core::ListParams::first(
                queue_core::JobFilter::default().failure_contains("LEGACY"),
                10,
            ),
        )
        .await
        .expect("list");
        assert_eq!(
            legacy.jobs.len(),
            1,
            "{mode:?}: the table's own failure is found"
        );
        assert_eq!(
            legacy.jobs[0].failure_message.as_deref(),
            Some("legacy boom")
        );
        assert_eq!(legacy.jobs[0].attempts_left, Some(0));

        let report = Admin::retry(
            &store,
            &queue_core::Targets::Ids(vec![ids[0]]),
            queue_core::RetryParams::default(),
        )
        .await
        .expect("retry");
        assert_eq!(report.changed, 1);
        let (status, attempts, _) = left(ids[0]).await;
        assert_eq!(
            (status.as_str(), attempts),
            ("queued", 1),
            "{mode:?}: a retried job whose countdown ran out gets one more try"
        );
    }
}

/// A row of the rickover-like table.
#[derive(Debug, sqlx::FromRow)]
struct QueuedJob {
    id: Uuid,
    name: String,
    args: serde_json::Value,
}

impl JobRecord for QueuedJob {
    type Id = Uuid;
    fn id(&self) -> &Uuid {
        &self.id
    }
    fn kind(&self) -> &str {
        &self.name
    }
}

/// Fails (retryably) the jobs whose arguments say `"do": "fail"`.
struct FailsWhenAsked;

#[async_trait]
impl Handler<PgStore<QueuedJob>> for FailsWhenAsked {
    async fn handle(
        &self,
        _: &JobContext,
        _: &mut PgJobTransaction<Uuid>,
        job: &QueuedJob,
    ) -> Result<(), JobError> {
        match job.args["do"].as_str() {
            Some("fail") => Err(JobError::retry_after("flaky upstream", Duration::ZERO)),
            _ => Ok(()),
        }
    }
}
