//! A table with only a key and a state runs jobs as it is: what it lacks
//! of a job's bookkeeping lives in the store's bookkeeping table, and every
//! guarantee holds in both modes.

mod support;

use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{TimeDelta, Utc};
use queue_core::{
    Admin, CancellationToken, ClaimParams, Handler, JobContext, JobError, JobRecord, JobState,
    Store, Targets, Transition, WriteResult,
};
use queue_store_postgres::{
    bookkeeping, Column, ExecutionMode, PgJobTransaction, PgStore, PgStoreOptions,
};
use queue_worker::{Worker, WorkerOptions};
use sqlx::PgPool;
use support::{awkward_schema, pool};

/// A row of a table that has a key and a state, nothing else.
#[derive(Debug, sqlx::FromRow)]
struct Bare {
    id: i64,
}

impl JobRecord for Bare {
    type Id = i64;
    fn id(&self) -> &i64 {
        &self.id
    }
    fn kind(&self) -> &str {
        "bare"
    }
}

fn quoted(schema: &str) -> String {
    format!("\"{}\"", schema.replace('"', "\"\""))
}

/// `jobs (id bigint PRIMARY KEY, status text)` with `n` queued rows, and
/// options for it with a bookkeeping table (migrated).
async fn bare_table(pool: &PgPool, n: i64, mode: ExecutionMode) -> (String, PgStoreOptions) {
    let schema = awkward_schema();
    let s = quoted(&schema);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA {s};
         CREATE TABLE {s}.jobs (id bigint PRIMARY KEY, status text NOT NULL);
         CREATE INDEX ON {s}.jobs (id) WHERE status IN ('queued', 'errored');
         INSERT INTO {s}.jobs SELECT g, 'queued' FROM generate_series(1, {n}) g"
    )))
    .execute(pool)
    .await
    .expect("the bare table");
    let options = PgStoreOptions::new("jobs")
        .and_then(|o| o.schema(&schema))
        .and_then(|o| o.column(Column::State, "status"))
        .and_then(|o| o.bookkeeping_table("jobs_bookkeeping"))
        .expect("valid options")
        .mode(mode);
    let applied = bookkeeping::migrate(pool, &options)
        .await
        .expect("the bookkeeping table");
    assert_eq!(applied.len(), 1);
    (s, options)
}

async fn count(pool: &PgPool, sql: String) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .fetch_one(pool)
        .await
        .expect("a count")
}

/// Every tenth job fails once and retries; every seventh fails for good.
struct Mixed;

#[async_trait]
impl Handler<PgStore<Bare>> for Mixed {
    async fn handle(
        &self,
        ctx: &JobContext,
        _: &mut PgJobTransaction<i64>,
        job: &Bare,
    ) -> Result<(), JobError> {
        if job.id % 7 == 0 {
            return Err(JobError::poison("bad job"));
        }
        if job.id % 10 == 0 && ctx.attempt() == 1 {
            return Err(JobError::retry_after("once more", Duration::ZERO));
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_and_a_state_drain_in_both_modes_with_no_change_to_the_table() {
    let test = "a_key_and_a_state_drain_in_both_modes_with_no_change_to_the_table";
    let Some(pool) = pool(test).await else { return };
    for mode in [ExecutionMode::Lease, ExecutionMode::Transactional] {
        let (s, options) = bare_table(&pool, 300, mode).await;
        let store = PgStore::<Bare>::new(pool.clone(), options)
            .await
            .expect("a store on a key and a state");
        let worker = Worker::new(
            store.clone(),
            Mixed,
            WorkerOptions {
                poll_interval: Duration::from_millis(50),
                ..WorkerOptions::default()
            },
        )
        .expect("a worker");
        let shutdown = CancellationToken::new();
        let running = tokio::spawn(worker.run(shutdown.clone()));
        let deadline = Instant::now() + Duration::from_secs(30);
        while count(
            &pool,
            format!(
                "SELECT count(*) FROM {s}.jobs WHERE status IN ('queued', 'errored', 'processing')"
            ),
        )
        .await
            > 0
        {
            if Instant::now() >= deadline {
                let stuck: Vec<(i64, String, Option<i64>, Option<String>)> =
                    sqlx::query_as(sqlx::AssertSqlSafe(format!(
                        "SELECT j.id, j.status, b.claim_token, b.last_heartbeat_at::text \
                         FROM {s}.jobs j LEFT JOIN {s}.jobs_bookkeeping b ON b.job_key = j.id \
                         WHERE j.status IN ('queued', 'errored', 'processing') ORDER BY j.id LIMIT 20"
                    )))
                    .fetch_all(&pool)
                    .await
                    .expect("the stuck rows");
                shutdown.cancel();
                let report = running.await.expect("joined");
                panic!("{mode:?}: the drain is stuck; unfinished rows (key, state, token, heartbeat): {stuck:?}; the worker's report: {report:?}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        shutdown.cancel();
        let report = running.await.expect("joined").expect("the worker ran");
        let failed = (1..=300).filter(|i| i % 7 == 0).count() as u64;
        let retried = (1..=300).filter(|i| i % 10 == 0 && i % 7 != 0).count() as u64;
        assert_eq!(
            (
                report.count("completed"),
                report.count("poisoned"),
                report.count("retried")
            ),
            (300 - failed, failed, retried),
            "{mode:?}"
        );
        assert_eq!(
            count(
                &pool,
                format!("SELECT count(*) FROM {s}.jobs WHERE status = 'completed'")
            )
            .await,
            (300 - failed) as i64,
            "{mode:?}"
        );
        // Completed jobs leave nothing behind; failed ones keep their counts.
        assert_eq!(
            count(&pool, format!("SELECT count(*) FROM {s}.jobs_bookkeeping")).await,
            failed as i64,
            "{mode:?}: only the failed jobs' rows remain"
        );
        let view = Admin::get(&store, &7).await.expect("get").expect("job 7");
        assert_eq!(
            (
                view.state,
                view.num_failures,
                view.worker_hostname.is_some()
            ),
            (Some(JobState::Failed), Some(1), true),
            "{mode:?}: the bookkeeping columns read through the admin view: {view:?}"
        );
    }
}

/// A due time the table may not leave empty (rickover's `run_after
/// timestamptz NOT NULL DEFAULT now()`) keeps its value: a claim, an
/// attempt's end and an operator's cancel or force-fail leave it alone
/// (only a retry sets it), where on a nullable column they empty it for a
/// job that no longer waits for a time (`JobState::times_agree`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_due_time_that_may_not_be_empty_keeps_its_value() {
    let test = "a_due_time_that_may_not_be_empty_keeps_its_value";
    let Some(pool) = pool(test).await else { return };
    let schema = awkward_schema();
    let s = quoted(&schema);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA {s};
         CREATE TABLE {s}.jobs (id bigint PRIMARY KEY, status text NOT NULL,
           run_after timestamptz NOT NULL DEFAULT now(), finished_at timestamptz);
         INSERT INTO {s}.jobs (id, status, run_after)
           SELECT g, 'queued', now() - interval '1 hour' FROM generate_series(1, 4) g"
    )))
    .execute(&pool)
    .await
    .expect("the table");
    let options = PgStoreOptions::new("jobs")
        .and_then(|o| o.schema(&schema))
        .and_then(|o| o.column(Column::State, "status"))
        .and_then(|o| o.column(Column::ProcessAfter, "run_after"))
        .and_then(|o| o.bookkeeping_table("jobs_bookkeeping"))
        .expect("valid options")
        .mode(ExecutionMode::Lease);
    bookkeeping::migrate(&pool, &options)
        .await
        .expect("the bookkeeping table");
    let store = PgStore::<Bare>::new(pool.clone(), options)
        .await
        .expect("a store");
    let now = Utc::now();
    let mut claimed = store
        .claim(ClaimParams {
            limit: 2,
            worker: "w",
            conditions: None,
            now,
        })
        .await
        .expect("a claim on a table whose due time may not be empty");
    assert_eq!(claimed.len(), 2, "jobs 1 and 2 are claimed");
    let retried = claimed.pop().expect("job 2");
    let completed = claimed.pop().expect("job 1");
    let written = store
        .finish(
            completed.job_store,
            &completed.lease,
            Transition::Complete,
            now,
        )
        .await
        .expect("a completion");
    assert_eq!(written, WriteResult::Applied);
    let retry = Transition::Retry {
        message: "later".into(),
        retry_at: now + TimeDelta::hours(1),
    };
    let written = store
        .finish(retried.job_store, &retried.lease, retry, now)
        .await
        .expect("a retry");
    assert_eq!(written, WriteResult::Applied);
    Admin::cancel(&store, &Targets::id(3))
        .await
        .expect("a cancel");
    Admin::force_fail(&store, &Targets::id(4), "stuck")
        .await
        .expect("a force-fail");
    let rows: Vec<(i64, String, bool, bool)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT id, status, run_after < now() - interval '30 minutes', finished_at IS NOT NULL \
         FROM {s}.jobs ORDER BY id"
    )))
    .fetch_all(&pool)
    .await
    .expect("the rows");
    let row = |id, status: &str, old_time, finished| (id, status.to_owned(), old_time, finished);
    assert_eq!(
        rows,
        vec![
            row(1, "completed", true, true),
            row(2, "errored", false, true),
            row(3, "canceled", true, true),
            row(4, "failed", true, true),
        ],
        "(key, state, due time still the enqueued one, finish time written)"
    );
}
