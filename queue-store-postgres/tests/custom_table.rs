//! A table that shares no name with the default one: every column renamed,
//! a uuid key, and a `status` enum of pending / running / completed / failed
//! (so errored is stored as pending and canceled as failed). The worker and
//! the resetter run on it unchanged, in both modes.

mod support;

use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::Utc;
use queue_core::{
    Admin, CancellationToken, ClaimParams, Handler, JobContext, JobError, JobRecord, JobState,
    ResetParams, Store, Targets,
};
use queue_store_postgres::{Column, ExecutionMode, PgJobTransaction, PgStore, PgStoreOptions};
use queue_worker::{Worker, WorkerOptions};
use sqlx::PgPool;
use support::{awkward_schema, pool};
use uuid::Uuid;

#[derive(Debug, sqlx::FromRow)]
struct Task {
    task_id: Uuid,
    body: serde_json::Value,
}

impl JobRecord for Task {
    type Id = Uuid;
    fn id(&self) -> &Uuid {
        &self.task_id
    }
    fn kind(&self) -> &str {
        "task"
    }
}

async fn create(pool: &PgPool, schema: &str) {
    let s = format!("\"{}\"", schema.replace('"', "\"\""));
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA {s};
         CREATE TYPE {s}.task_status AS ENUM ('pending', 'running', 'completed', 'failed');
         CREATE TABLE {s}.tasks (
           task_id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
           status {s}.task_status NOT NULL DEFAULT 'pending',
           error text, enqueued timestamptz DEFAULT now(), began timestamptz, ended timestamptz,
           run_after timestamptz, resets integer NOT NULL DEFAULT 0, failures integer NOT NULL DEFAULT 0,
           alive_at timestamptz, log jsonb[], host text, stop boolean NOT NULL DEFAULT false,
           lease bigint NOT NULL DEFAULT 0, body jsonb NOT NULL)"
    )))
    .execute(pool)
    .await
    .expect("custom table");
}

fn options(schema: &str, mode: ExecutionMode) -> PgStoreOptions {
    let renames = [
        (Column::Id, "task_id"),
        (Column::State, "status"),
        (Column::FailureMessage, "error"),
        (Column::QueuedAt, "enqueued"),
        (Column::StartedAt, "began"),
        (Column::FinishedAt, "ended"),
        (Column::ProcessAfter, "run_after"),
        (Column::NumResets, "resets"),
        (Column::NumFailures, "failures"),
        (Column::LastHeartbeatAt, "alive_at"),
        (Column::ExecutionLogs, "log"),
        (Column::WorkerHostname, "host"),
        (Column::Cancel, "stop"),
        (Column::ClaimToken, "lease"),
        (Column::Payload, "body"),
    ];
    let mut options = PgStoreOptions::new("tasks")
        .and_then(|o| o.schema(schema))
        .unwrap();
    for (column, name) in renames {
        options = options.column(column, name).unwrap();
    }
    options
        .without(Column::Priority)
        .unwrap()
        .state_value(JobState::Queued, "pending")
        .state_value(JobState::Processing, "running")
        .state_value(JobState::Errored, "pending")
        .state_value(JobState::Canceled, "failed")
        .order_by("tasks.enqueued, tasks.task_id")
        .mode(mode)
}

struct ByBody;

#[async_trait]
impl Handler<PgStore<Task>> for ByBody {
    async fn handle(
        &self,
        ctx: &JobContext,
        _: &mut PgJobTransaction<Uuid>,
        task: &Task,
    ) -> Result<(), JobError> {
        match task.body["do"].as_str() {
            Some("retry-once") if ctx.attempt() == 1 => {
                Err(JobError::retry_after("try again", Duration::ZERO))
            }
            Some("poison") => Err(JobError::poison("bad body")),
            Some("wait") => {
                ctx.cancelled().await;
                Err(JobError::cancel("stopped"))
            }
            _ => Ok(()),
        }
    }
}

async fn status(pool: &PgPool, schema: &str, id: Uuid) -> (String, i32, Option<String>) {
    let s = format!("\"{}\"", schema.replace('"', "\"\""));
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT status::text, failures, error FROM {s}.tasks WHERE task_id = $1"
    )))
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn insert(pool: &PgPool, schema: &str, body: serde_json::Value) -> Uuid {
    let s = format!("\"{}\"", schema.replace('"', "\"\""));
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {s}.tasks (body) VALUES ($1) RETURNING task_id"
    )))
    .bind(body)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn until(pool: &PgPool, schema: &str, id: Uuid, want: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while status(pool, schema, id).await.0 != want {
        assert!(Instant::now() < deadline, "task {id} never became {want}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renamed_columns_enum_states_and_uuid_keys() {
    let Some(pool) = pool("renamed_columns_enum_states_and_uuid_keys").await else {
        return;
    };
    for mode in [ExecutionMode::Lease, ExecutionMode::Transactional] {
        let schema = awkward_schema();
        create(&pool, &schema).await;
        let store = PgStore::<Task>::new(pool.clone(), options(&schema, mode))
            .await
            .expect("valid custom table");
        assert_eq!(
            store
                .disabled_features()
                .into_iter()
                .map(|(c, _)| c)
                .collect::<Vec<_>>(),
            [
                Column::Priority,
                Column::Kind,
                Column::UniqueKey,
                Column::UniqueForever,
                Column::MaxAttempts,
                Column::ExpiresAt,
                Column::AtMostOnce,
            ],
            "no priority column, and no kind or unique key columns under their standard names"
        );
        let ok = insert(&pool, &schema, serde_json::json!({"do": "ok"})).await;
        let retry = insert(&pool, &schema, serde_json::json!({"do": "retry-once"})).await;
        let poison = insert(&pool, &schema, serde_json::json!({"do": "poison"})).await;
        let wait = insert(&pool, &schema, serde_json::json!({"do": "wait"})).await;

        let shutdown = CancellationToken::new();
        let options = WorkerOptions {
            poll_interval: Duration::from_millis(50),
            heartbeat_interval: Duration::from_millis(50),
            ..WorkerOptions::default()
        };
        let worker = Worker::new(store.clone(), ByBody, options).unwrap();
        let running = tokio::spawn(worker.run(shutdown.clone()));
        until(&pool, &schema, ok, "completed").await;
        until(&pool, &schema, retry, "completed").await;
        until(&pool, &schema, poison, "failed").await;
        until(&pool, &schema, wait, "running").await;
        let asked = Admin::cancel(&store, &Targets::id(wait)).await.unwrap();
        assert_eq!(asked.stop_requested, 1, "the running job is asked to stop");
        until(&pool, &schema, wait, "failed").await;
        shutdown.cancel();
        let report = running.await.unwrap().unwrap();
        assert_eq!(
            (
                report.count("completed"),
                report.count("retried"),
                report.count("poisoned"),
                report.count("canceled")
            ),
            (2, 1, 1, 1),
            "{mode:?}"
        );
        assert_eq!(
            status(&pool, &schema, retry).await.1,
            1,
            "{mode:?}: the failed first attempt is counted"
        );
        assert_eq!(
            status(&pool, &schema, wait).await.2.as_deref(),
            Some("stopped"),
            "{mode:?}: canceled is stored as failed, with the reason"
        );

        // A crashed claim is reset to pending.
        let crashed = insert(&pool, &schema, serde_json::json!({"do": "ok"})).await;
        let now = Utc::now();
        let claimed = store
            .claim(ClaimParams {
                limit: 1,
                worker: "doomed",
                conditions: None,
                now,
            })
            .await
            .unwrap();
        assert_eq!(claimed.len(), 1);
        for c in claimed {
            c.job_store.abandon().await;
        }
        let report = store
            .reset_stalled(ResetParams {
                stalled_before: now + chrono::Duration::seconds(1),
                max_resets: 3,
                delivery: Default::default(),
                now,
            })
            .await
            .unwrap();
        assert_eq!(report.reset, vec![crashed], "{mode:?}");
        assert_eq!(
            status(&pool, &schema, crashed).await.0,
            "pending",
            "{mode:?}"
        );
    }
}
