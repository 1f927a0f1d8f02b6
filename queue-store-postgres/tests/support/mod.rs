//! Shared by the Postgres tests: the database from `DATABASE_URL`, a fresh
//! schema per test (with an awkward name, so isolation also exercises
//! quoting), and the conformance harness.
//!
//! Without `DATABASE_URL` a test announces that it is skipped and passes,
//! unless `QUEUE_TEST_REQUIRE_POSTGRES=1` (set by `cargo xtask test-pg`),
//! which makes a missing database a failure.

#![allow(dead_code)]

pub mod logs;

/// The rows of a default table whose `finished_at` and `process_after`
/// disagree with their state (`JobState::times_agree`), as an SQL
/// condition: spelled out here, apart from the store's own, so that the
/// tests check the store against the rule rather than against itself.
pub const TIMES_DISAGREE: &str = "NOT CASE \
     WHEN state = 'processing' THEN finished_at IS NULL AND process_after IS NULL \
     WHEN state IN ('queued', 'errored') THEN finished_at IS NULL OR process_after IS NOT NULL \
     ELSE finished_at IS NOT NULL AND process_after IS NULL END";

use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use queue_core::testkit::conformance::Harness;
use queue_core::testkit::database_url;
use queue_core::{ClaimParams, Claimed, Job, JobRecord, Store};
use queue_store_postgres::{
    Column, ExecutionMode, JobTable, PgCondition, PgConditions, PgJobTransaction, PgKey, PgStore,
};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

/// Claims up to `limit` jobs as worker `w`, now.
pub async fn claim_now<R>(store: &PgStore<R>, limit: usize) -> Vec<Claimed<PgStore<R>>>
where
    R: JobRecord,
    R::Id: PgKey,
{
    store
        .claim(ClaimParams {
            limit,
            worker: "w",
            conditions: None,
            now: chrono::Utc::now(),
        })
        .await
        .expect("a claim")
}

/// Completes a claimed job now; panics if the store fails to record it.
pub async fn complete<R>(store: &PgStore<R>, job: Claimed<PgStore<R>>) -> queue_core::WriteResult
where
    R: JobRecord,
    R::Id: PgKey,
{
    store
        .finish(
            job.job_store,
            &job.lease,
            queue_core::Transition::Complete,
            chrono::Utc::now(),
        )
        .await
        .expect("the completion")
}

/// `schema` quoted as an identifier.
pub fn quoted_schema(schema: &str) -> String {
    format!("\"{}\"", schema.replace('"', "\"\""))
}

/// A table of one's own with the default table's columns that Postgres
/// partitions by state (`PARTITION BY LIST`): waiting and running jobs in
/// `tasks_live`, finished ones in `tasks_done`, so that a completion moves
/// its row across. Its key is `(id, state)`, as a partitioned table's
/// unique key must hold the partition column. In a fresh schema, with the
/// claim's two indexes; returns the schema and the store's options.
pub async fn partitioned_by_state(pool: &PgPool) -> (String, queue_store_postgres::PgStoreOptions) {
    let schema = awkward_schema();
    let s = quoted_schema(&schema);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA {s};
         CREATE TABLE {s}.tasks (
           id bigserial, kind text NOT NULL, payload jsonb NOT NULL DEFAULT '{{}}',
           state text NOT NULL DEFAULT 'queued', priority int NOT NULL DEFAULT 0,
           failure_message text, queued_at timestamptz NOT NULL DEFAULT now(),
           started_at timestamptz, finished_at timestamptz, process_after timestamptz,
           num_failures int NOT NULL DEFAULT 0, num_resets int NOT NULL DEFAULT 0,
           last_heartbeat_at timestamptz, worker_hostname text, execution_logs json[],
           cancel boolean NOT NULL DEFAULT false, claim_token bigint NOT NULL DEFAULT 0,
           PRIMARY KEY (id, state)
         ) PARTITION BY LIST (state);
         CREATE TABLE {s}.tasks_live PARTITION OF {s}.tasks FOR VALUES IN ('queued', 'processing', 'errored');
         CREATE TABLE {s}.tasks_done PARTITION OF {s}.tasks FOR VALUES IN ('completed', 'failed', 'canceled');
         CREATE INDEX ON {s}.tasks (priority DESC, id) WHERE state IN ('queued', 'errored');
         CREATE INDEX ON {s}.tasks (id) WHERE state = 'processing';"
    )))
    .execute(pool)
    .await
    .expect("the partitioned table");
    let options = queue_store_postgres::PgStoreOptions::new("tasks")
        .and_then(|o| o.schema(&schema))
        .expect("valid names");
    (schema, options)
}

/// Runs `sql`, which must succeed (a test's own setup).
pub async fn execute(pool: &PgPool, sql: String) {
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .execute(pool)
        .await
        .expect("the statement runs");
}

/// The one `int8` value `sql` reads, which must succeed.
pub async fn scalar(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_one(pool)
        .await
        .expect(sql)
}

/// The versions of `table` (its own, not those of the tables beside it)
/// still pending.
pub async fn pending_versions(pool: &PgPool, table: &JobTable) -> Vec<u32> {
    versions(pool, table, false).await
}

/// The versions of `table` (its own) applied.
pub async fn applied_versions(pool: &PgPool, table: &JobTable) -> Vec<u32> {
    versions(pool, table, true).await
}

/// The versions of `table` (its own) applied, or pending.
async fn versions(pool: &PgPool, table: &JobTable, applied: bool) -> Vec<u32> {
    table
        .migrations(pool)
        .await
        .expect("the versions")
        .into_iter()
        .filter(|m| m.table == *table.name() && m.applied_at.is_some() == applied)
        .map(|m| m.version)
        .collect()
}

/// Asserts that `error` says each of `parts`.
pub fn assert_says(error: &str, parts: &[String]) {
    for part in parts {
        assert!(error.contains(part.as_str()), "{part:?} in {error}");
    }
}

/// The version table beside `table` (`<table>_migrations`), quoted.
pub fn versions_table(table: &JobTable) -> String {
    format!(
        "{}.{}",
        table.name().schema.quoted(),
        queue_store_postgres::Ident::new(format!("{}_migrations", table.name().name.as_str()))
            .expect("valid")
            .quoted()
    )
}

/// Takes `table` back to version 7: version 8's two indexes (built
/// concurrently) dropped and the version forgotten, so that the next
/// migration builds them concurrently again.
pub async fn back_to_version_7(pool: &PgPool, table: &JobTable) {
    let versions = versions_table(table);
    execute(pool, format!("DELETE FROM {versions} WHERE version = 8")).await;
    for index in ["finished_idx", "expires_idx"] {
        let name =
            queue_store_postgres::Ident::new(format!("{}_{index}", table.name().name.as_str()))
                .expect("valid");
        execute(
            pool,
            format!(
                "DROP INDEX {}.{}",
                table.name().schema.quoted(),
                name.quoted()
            ),
        )
        .await;
    }
}

/// A migration of `table` (at version 7, [`back_to_version_7`]) started
/// beside a writer's open transaction, which its concurrent build's first
/// phase waits for: returned once the build is seen waiting, with the
/// writer (commit it to let the build go on) and the migration's task.
pub async fn build_held_by_a_writer(
    pool: &PgPool,
    table: &JobTable,
) -> (
    sqlx::Transaction<'static, sqlx::Postgres>,
    tokio::task::JoinHandle<Result<Vec<queue_store_postgres::Migration>, queue_core::StoreError>>,
) {
    let mut writer = pool.begin().await.expect("a transaction");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {} (kind) VALUES ('k')",
        table.name().quoted()
    )))
    .execute(&mut *writer)
    .await
    .expect("a write");
    let migrating = {
        let (table, pool) = (table.clone(), pool.clone());
        tokio::spawn(async move { table.migrate(&pool).await })
    };
    until_waiting_for_a_lock(pool, "CREATE INDEX CONCURRENTLY", table).await;
    (writer, migrating)
}

/// Waits (up to 30 s) until a backend running a statement that starts with
/// `statement` and names `table` waits for a lock, as `pg_stat_activity`
/// shows it.
pub async fn until_waiting_for_a_lock(pool: &PgPool, statement: &str, table: &JobTable) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let waiting: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE state = 'active' \
             AND wait_event_type = 'Lock' AND starts_with(query, $1) \
             AND position($2 IN query) > 0 AND pid <> pg_backend_pid())",
        )
        .bind(statement)
        .bind(table.name().quoted())
        .fetch_one(pool)
        .await
        .expect("reading the activity");
        if waiting {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no `{statement}` waited for a lock within 30 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// How many jobs of `table` are in `state` (its stored value).
pub async fn count_in(pool: &PgPool, table: &JobTable, state: &str) -> i64 {
    let sql = format!(
        "SELECT count(*) FROM {} WHERE state = $1",
        table.name().quoted()
    );
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .bind(state)
        .fetch_one(pool)
        .await
        .expect("count")
}

/// Queues job `id` again behind the worker's back, as the resetter would:
/// its claim no longer holds it.
pub async fn move_on(pool: &PgPool, table: &JobTable, id: i64) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {} SET state = 'queued' WHERE id = $1",
        table.name()
    )))
    .bind(id)
    .execute(pool)
    .await
    .expect("the job moved on");
}

/// Job `id`'s stored state.
pub async fn state_of(pool: &PgPool, table: &JobTable, id: i64) -> String {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT state FROM {} WHERE id = $1",
        table.name()
    )))
    .bind(id)
    .fetch_one(pool)
    .await
    .expect("the job's state")
}

/// Whether another transaction can lock job `id`'s row at once.
pub async fn row_unlocked(pool: &PgPool, table: &JobTable, id: i64) -> bool {
    let mut tx = pool.begin().await.expect("a transaction");
    let locked = sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT 1 FROM {} WHERE id = $1 FOR UPDATE NOWAIT",
        table.name()
    )))
    .bind(id)
    .fetch_optional(&mut *tx)
    .await;
    locked.is_ok()
}

/// The server process behind `conn`.
pub async fn backend_pid(conn: &mut sqlx::PgConnection) -> i32 {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(conn)
        .await
        .expect("the backend's pid")
}

/// A pool on the test database, or `None` (announced) when there is none.
/// Its connections, and those of any store's listener on it (which
/// connects as its pool does), carry the test's name and this process's id
/// as their `application_name`, so that a test can tell its own sessions
/// in `pg_stat_activity` from those of the tests running beside it.
pub async fn pool(test: &str) -> Option<PgPool> {
    let url = database_url(test)?;
    let options: PgConnectOptions = url
        .parse()
        .unwrap_or_else(|e| panic!("{test}: DATABASE_URL is not a Postgres URL: {e}"));
    // Postgres keeps 63 bytes of a name.
    let name: String = format!("{}-{test}", std::process::id())
        .chars()
        .take(63)
        .collect();
    let pool = PgPoolOptions::new()
        .test_before_acquire(false)
        .max_connections(64)
        .connect_with(options.application_name(&name))
        .await
        .unwrap_or_else(|e| panic!("{test}: cannot connect to DATABASE_URL: {e}"));
    Some(pool)
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A schema name no other test uses, with a quote, a space, upper case and
/// a keyword in it.
pub fn awkward_schema() -> String {
    // The process id alone repeats across runs; the start time does not.
    static STARTED: std::sync::OnceLock<u128> = std::sync::OnceLock::new();
    let started = STARTED.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() % 1_000_000_000)
            .unwrap_or(0)
    });
    format!(
        "Queue \"T\" select {}-{started}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    )
}

/// The default table in a fresh awkward schema, migrated.
pub async fn fresh_table(pool: &PgPool) -> JobTable {
    fresh_table_named(pool, "jobs").await
}

/// A default-layout table named `name` in a fresh awkward schema, migrated.
/// A schema of the same name left by an earlier run (whose process had the
/// same id) is dropped first, so its rows cannot leak into this test.
pub async fn fresh_table_named(pool: &PgPool, name: &str) -> JobTable {
    migrated_anew(
        pool,
        JobTable::new(&awkward_schema(), name).expect("valid names"),
    )
    .await
}

/// `table`, its schema dropped first if an earlier run left it, migrated.
async fn migrated_anew(pool: &PgPool, table: JobTable) -> JobTable {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {} CASCADE",
        table.name().schema.quoted()
    )))
    .execute(pool)
    .await
    .expect("dropping a stale schema");
    table.migrate(pool).await.expect("migration");
    table
}

/// The default table partitioned by finish time, a partition a day, in a
/// fresh awkward schema, migrated.
pub async fn fresh_partitioned_table(pool: &PgPool) -> JobTable {
    let table = JobTable::new(&awkward_schema(), "jobs")
        .expect("valid names")
        .partitioned_by_finish_time(queue_store_postgres::FinishPartitions::DAILY);
    table.migrate(pool).await.expect("migration");
    table
}

/// The default table laid out for claims in place
/// (`JobTable::in_place_claims`), in a fresh awkward schema, migrated.
pub async fn fresh_in_place_table(pool: &PgPool) -> JobTable {
    let table = JobTable::new(&awkward_schema(), "jobs").expect("valid names");
    migrated_anew(pool, table.in_place_claims()).await
}

/// A table for a handler's writes, `name (columns)` beside `table` in its
/// schema; returns its quoted, qualified name.
pub async fn side_table(pool: &PgPool, table: &JobTable, name: &str, columns: &str) -> String {
    let side = format!("{}.\"{name}\"", table.name().schema.quoted());
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {side} ({columns})"
    )))
    .execute(pool)
    .await
    .expect("creating the side table");
    side
}

/// A store over `table` (default layout) in `mode`.
pub async fn store(pool: &PgPool, table: &JobTable, mode: ExecutionMode) -> PgStore<Job> {
    PgStore::default_table(pool.clone(), table.store_options().mode(mode))
        .await
        .expect("a store over the test table")
}

/// Runs the conformance suite on the default table in one mode, keeping
/// its bookkeeping in the table or in a bookkeeping table.
pub struct PgHarness {
    pub pool: PgPool,
    pub mode: ExecutionMode,
    pub bookkeeping: bool,
    pub partitioned: bool,
    pub in_place: bool,
}

impl PgHarness {
    pub async fn connect(mode: ExecutionMode, test: &str) -> Option<PgHarness> {
        Some(PgHarness {
            pool: pool(test).await?,
            mode,
            bookkeeping: false,
            partitioned: false,
            in_place: false,
        })
    }

    /// The same on a default table laid out for claims in place.
    pub async fn in_place(mode: ExecutionMode, test: &str) -> Option<PgHarness> {
        Some(PgHarness {
            in_place: true,
            ..PgHarness::connect(mode, test).await?
        })
    }

    /// The same on a default table partitioned by finish time.
    pub async fn partitioned(mode: ExecutionMode, test: &str) -> Option<PgHarness> {
        Some(PgHarness {
            partitioned: true,
            ..PgHarness::connect(mode, test).await?
        })
    }

    /// The same with every bookkeeping column in a bookkeeping table.
    pub async fn with_bookkeeping_table(mode: ExecutionMode, test: &str) -> Option<PgHarness> {
        Some(PgHarness {
            bookkeeping: true,
            ..PgHarness::connect(mode, test).await?
        })
    }
}

#[async_trait]
impl Harness for PgHarness {
    type Store = PgStore<Job>;

    async fn store(&self) -> PgStore<Job> {
        let table = if self.partitioned {
            fresh_partitioned_table(&self.pool).await
        } else if self.in_place {
            fresh_in_place_table(&self.pool).await
        } else {
            fresh_table(&self.pool).await
        };
        let mut options = table.store_options().mode(self.mode);
        if self.bookkeeping {
            // The table's own bookkeeping columns unused: the bookkeeping
            // table carries every one.
            for column in [
                Column::ClaimToken,
                Column::StartedAt,
                Column::LastHeartbeatAt,
                Column::NumResets,
                Column::NumFailures,
                Column::WorkerHostname,
                Column::Cancel,
                Column::ExecutionLogs,
            ] {
                options = options.without(column).expect("optional");
            }
            options = options
                .bookkeeping_table("jobs_bookkeeping")
                .expect("a valid name");
            queue_store_postgres::bookkeeping::migrate(&self.pool, &options)
                .await
                .expect("the bookkeeping table");
        }
        PgStore::default_table(self.pool.clone(), options)
            .await
            .expect("store over a migrated table")
    }

    fn holds_keys_forever(&self) -> bool {
        !self.partitioned
    }

    fn only_kind(&self, kind: &str) -> PgConditions {
        vec![PgCondition::new("\"jobs\".\"kind\" = {}").bind(kind)]
    }

    async fn detached_job_store(&self, store: &PgStore<Job>) -> PgJobTransaction {
        PgJobTransaction::outside_transaction(store.pool().clone())
    }

    async fn crash(&self, job_store: PgJobTransaction) {
        job_store.abandon().await;
    }
}

/// The `pg_worker` example, which `cargo test` builds next to this test
/// binary; built here when only this test target was compiled.
pub fn worker_binary() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let debug = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target directory");
    let path = debug.join("examples").join("pg_worker");
    if !path.exists() {
        let status = std::process::Command::new(env!("CARGO"))
            .args([
                "build",
                "--quiet",
                "-p",
                "queue-store-postgres",
                "--example",
                "pg_worker",
            ])
            .status()
            .expect("run cargo build");
        assert!(status.success(), "building the pg_worker example failed");
    }
    assert!(
        path.exists(),
        "{} is missing after building it",
        path.display()
    );
    path
}

/// Starts a worker process and waits until it is ready.
pub async fn spawn_worker(
    table: &JobTable,
    mode: &str,
    handlers: usize,
    sleep_ms: u64,
    extra: &[&str],
) -> tokio::process::Child {
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let mut child = tokio::process::Command::new(worker_binary())
        .args([
            "--schema",
            table.name().schema.as_str(),
            "--table",
            table.name().name.as_str(),
        ])
        .args([
            "--mode",
            mode,
            "--handlers",
            &handlers.to_string(),
            "--sleep-ms",
            &sleep_ms.to_string(),
        ])
        .args(extra)
        .env("DATABASE_URL", url)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the worker process");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let ready = tokio::time::timeout(std::time::Duration::from_secs(30), lines.next_line()).await;
    let line = ready
        .expect("worker ready within 30 s")
        .expect("read stdout")
        .unwrap_or_default();
    assert!(
        line.starts_with("ready"),
        "unexpected first line from the worker: {line:?}"
    );
    // Keep draining its output so it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    child
}
