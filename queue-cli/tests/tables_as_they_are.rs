//! Tables used as they are: five shapes of table (a scheduler's jobs table
//! with a key, an enum status, a jsonb failure column and two timestamps;
//! a key and a text state only; a key, an enum state and one timestamp; a
//! uuid key with a countdown of attempts; a text key read through a view),
//! none altered,
//! each given a bookkeeping table by `queue migrate`. In both modes each
//! one drains; rows in a state the store does not know stay untouched; a
//! worker killed mid-job (SIGKILL) is recovered by the resetter (the
//! job's transaction's effects exactly once in transactional mode; at
//! least once and at most 1 + max_resets times in lease mode), while a job
//! running three times the stalled age is never reset; a stale attempt
//! writes nothing; and the CLI and the HTTP API read the table and retry
//! a job.

mod support;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use queue_cli::serve::{router, Api, Erased, Tokens};
use queue_core::{ClaimParams, JobRecord, Lease, ResetParams, Store, Transition, WriteResult};
use queue_store_postgres::{PgAdmin, PgConfig, PgKey, PgKeyType, PgStore};
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};
use support::{json, ok, Setup};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tower::ServiceExt;

/// A shape of table: how to create it with `n` waiting jobs (and one row
/// in a state the store does not know, where the state is text), and the
/// config that describes it as it is.
struct Shape {
    name: &'static str,
    /// SQL creating the table in `{s}` (the schema, quoted) with `{n}`
    /// waiting jobs.
    create: &'static str,
    /// The config after the schema line, without the mode.
    config: &'static str,
    /// The table, for the tests' own SQL.
    table: &'static str,
    /// Its key column and state column.
    key: &'static str,
    state: &'static str,
    /// The stored values of queued, processing, completed and failed.
    values: [&'static str; 4],
    /// Whether the table holds a row in an unknown state (`lost`).
    stray: bool,
}

const SHAPES: [Shape; 5] = [
    Shape {
        name: "a scheduler's jobs table: a key without a default, an enum status, jsonb failure_info and two timestamps",
        create: "CREATE TYPE {s}.job_status AS ENUM ('scheduled', 'running', 'succeeded', 'retrying', 'dead', 'cancelled');
                 CREATE TABLE {s}.sched_jobs (id bigint PRIMARY KEY, status {s}.job_status NOT NULL,
                   failure_info jsonb, created_at timestamptz NOT NULL DEFAULT now(),
                   updated_at timestamptz NOT NULL DEFAULT now());
                 INSERT INTO {s}.sched_jobs (id, status) SELECT g * 10, 'scheduled' FROM generate_series(1, {n}) g",
        config: "table = \"sched_jobs\"\nbookkeeping_table = \"sched_jobs_bookkeeping\"\n\
                 failure_message_path = \"error\"\n\
                 [columns]\nstate = \"status\"\nfailure_message = \"failure_info\"\nqueued_at = \"created_at\"\n\
                 [states]\nqueued = \"scheduled\"\nprocessing = \"running\"\ncompleted = \"succeeded\"\n\
                 errored = \"retrying\"\nfailed = \"dead\"\ncanceled = \"cancelled\"\n",
        table: "sched_jobs",
        key: "id",
        state: "status",
        values: ["scheduled", "running", "succeeded", "dead"],
        stray: false,
    },
    Shape {
        name: "a key and a text state",
        create: "CREATE TABLE {s}.jobs (id bigint PRIMARY KEY, status text NOT NULL);
                 INSERT INTO {s}.jobs SELECT g, 'pending' FROM generate_series(1, {n}) g;
                 INSERT INTO {s}.jobs VALUES (100000, 'lost')",
        config: "table = \"jobs\"\nbookkeeping_table = \"jobs_bookkeeping\"\n\
                 [columns]\nstate = \"status\"\n\
                 [states]\nqueued = \"pending\"\nprocessing = \"running\"\ncompleted = \"done\"\n\
                 errored = \"pending\"\nfailed = \"dead\"\ncanceled = \"dead\"\n",
        table: "jobs",
        key: "id",
        state: "status",
        values: ["pending", "running", "done", "dead"],
        stray: true,
    },
    Shape {
        name: "a key, an enum state and one timestamp",
        create: "CREATE TYPE {s}.task_status AS ENUM ('new', 'busy', 'ok', 'again', 'broken', 'dropped');
                 CREATE TABLE {s}.tasks (task_id bigint PRIMARY KEY,
                   status {s}.task_status NOT NULL DEFAULT 'new',
                   created_at timestamptz NOT NULL DEFAULT now());
                 INSERT INTO {s}.tasks (task_id) SELECT g FROM generate_series(1, {n}) g",
        config: "table = \"tasks\"\nbookkeeping_table = \"tasks_bookkeeping\"\n\
                 [columns]\nid = \"task_id\"\nstate = \"status\"\nqueued_at = \"created_at\"\n\
                 [states]\nqueued = \"new\"\nprocessing = \"busy\"\ncompleted = \"ok\"\n\
                 errored = \"again\"\nfailed = \"broken\"\ncanceled = \"dropped\"\n",
        table: "tasks",
        key: "task_id",
        state: "status",
        values: ["new", "busy", "ok", "broken"],
        stray: false,
    },
    Shape {
        name: "a uuid key with a countdown of attempts",
        create: "CREATE TABLE {s}.queued_jobs (id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
                   status text NOT NULL DEFAULT 'queued', attempts smallint NOT NULL DEFAULT 3);
                 INSERT INTO {s}.queued_jobs (status) SELECT 'queued' FROM generate_series(1, {n});
                 INSERT INTO {s}.queued_jobs (status) VALUES ('lost')",
        config: "table = \"queued_jobs\"\nbookkeeping_table = \"queued_jobs_bookkeeping\"\n\
                 [columns]\nstate = \"status\"\nattempts_left = \"attempts\"\n",
        table: "queued_jobs",
        key: "id",
        state: "status",
        values: ["queued", "processing", "completed", "failed"],
        stray: true,
    },
    Shape {
        name: "a text key behind a view",
        create: "CREATE TABLE {s}.items (key text PRIMARY KEY, state text NOT NULL);
                 CREATE VIEW {s}.items_view AS SELECT key, state, length(key) AS key_length FROM {s}.items;
                 INSERT INTO {s}.items SELECT 'item-' || g, 'queued' FROM generate_series(1, {n}) g",
        config: "table = \"items\"\nview = \"items_view\"\nbookkeeping_table = \"items_bookkeeping\"\n\
                 [columns]\nid = \"key\"\n",
        table: "items",
        key: "key",
        state: "state",
        values: ["queued", "processing", "completed", "failed"],
        stray: false,
    },
];

/// How many jobs each run drains.
const JOBS: i64 = 24;

/// The `table_worker` example, built here when only this test target was.
fn worker_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let debug = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target directory");
    let path = debug.join("examples").join("table_worker");
    if !path.exists() {
        let status = std::process::Command::new(env!("CARGO"))
            .args([
                "build",
                "--quiet",
                "-p",
                "queue-cli",
                "--example",
                "table_worker",
            ])
            .status()
            .expect("run cargo build");
        assert!(status.success(), "building the table_worker example failed");
    }
    path
}

/// Starts a worker process over `config` and waits until it is ready.
async fn spawn_worker(t: &Setup, config: &std::path::Path, runs: &str, args: &[&str]) -> Child {
    let mut child = Command::new(worker_binary())
        .arg("--config")
        .arg(config)
        .args(["--runs", runs])
        .args(args)
        .env("DATABASE_URL", &t.url)
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the worker process");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the worker is ready within 30 s")
        .expect("its output")
        .unwrap_or_default();
    assert!(line.starts_with("ready"), "the worker said {line:?}");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    child
}

async fn scalar(pool: &PgPool, sql: String) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.clone()))
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Waits until `sql` counts `want`.
async fn until(pool: &PgPool, sql: String, want: i64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = scalar(pool, sql.clone()).await;
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {got}, not {want}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A claimed job: its key alone, read as `__queue_key`.
#[derive(Debug)]
struct Key<K>(K);

impl<K: PgKey> JobRecord for Key<K> {
    type Id = K;
    fn id(&self) -> &K {
        &self.0
    }
    fn kind(&self) -> &str {
        "job"
    }
}

fn decode<K>(row: &PgRow) -> Result<Key<K>, sqlx::Error>
where
    K: PgKey + for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    Ok(Key(row.try_get("__queue_key")?))
}

/// A claim, a reset behind its back and a claim again: the first
/// attempt's completion, heartbeat and failure are no-ops; the second's
/// completion lands. Returns the key it used.
async fn a_stale_attempt_writes_nothing<K>(pool: &PgPool, config: &PgConfig, what: &str) -> String
where
    K: PgKey + for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    let options = config.store_options().expect("options");
    let select = format!(
        "{}.{} AS \"__queue_key\"",
        options.table_alias().quoted(),
        options
            .column_name(queue_store_postgres::Column::Id)
            .expect("a key")
            .quoted()
    );
    let store = PgStore::with_decoder(pool.clone(), options.select(select), decode::<K>)
        .await
        .unwrap_or_else(|e| panic!("{what}: a store: {e}"));
    let claim = |worker: &'static str| {
        let store = store.clone();
        async move {
            let mut claimed = store
                .claim(ClaimParams {
                    limit: 1,
                    worker,
                    conditions: None,
                    now: chrono::Utc::now(),
                })
                .await
                .expect("a claim");
            assert_eq!(claimed.len(), 1, "one job is claimed");
            claimed.remove(0)
        }
    };
    let first = claim("first").await;
    let key = first.record.as_ref().expect("decoded").0.clone();
    let first_lease: Lease<K> = first.lease.clone();
    first.job_store.abandon().await;
    // The resetter finds the attempt stalled (an hour ahead) and queues
    // the job again; the next claim takes it.
    let now = chrono::Utc::now();
    let reset = store
        .reset_stalled(ResetParams {
            stalled_before: now + chrono::TimeDelta::hours(1),
            max_resets: 5,
            delivery: queue_core::Delivery::AtLeastOnce,
            now,
        })
        .await
        .expect("a reset");
    assert_eq!(
        reset.reset,
        std::slice::from_ref(&key),
        "{what}: the one claimed job is reset"
    );
    let second = loop {
        let c = claim("second").await;
        if c.record.as_ref().is_ok_and(|r| r.0 == key) {
            break c;
        }
        c.job_store.abandon().await;
    };
    assert_ne!(second.lease.token, first_lease.token, "{what}: a new token");
    let beat = store
        .heartbeat(std::slice::from_ref(&first_lease), chrono::Utc::now())
        .await
        .expect("a heartbeat");
    assert_eq!(
        beat.gone,
        std::slice::from_ref(&key),
        "{what}: the stale lease is not held: {beat:?}"
    );
    let stale = store
        .finish_again(&first_lease, Transition::Complete, chrono::Utc::now())
        .await
        .expect("the stale completion");
    assert_eq!(
        stale,
        WriteResult::Stale,
        "{what}: the stale attempt writes nothing"
    );
    let failed = store
        .finish_again(
            &first_lease,
            Transition::Fail {
                message: "late".into(),
            },
            chrono::Utc::now(),
        )
        .await
        .expect("the stale failure");
    assert_eq!(failed, WriteResult::Stale, "{what}: nor does its failure");
    let done = store
        .finish(
            second.job_store,
            &second.lease,
            Transition::Complete,
            chrono::Utc::now(),
        )
        .await
        .expect("completion");
    assert_eq!(
        done,
        WriteResult::Applied,
        "{what}: the live attempt completes"
    );
    key.to_string()
}

async fn call(app: &axum::Router, method: Method, uri: &str) -> (StatusCode, Value) {
    let request = Request::builder()
        .method(method)
        .uri(uri)
        .body(Body::empty())
        .expect("a request");
    let response = app.clone().oneshot(request).await.expect("a response");
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .expect("the body");
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

async fn shape_in_mode(shape: &Shape, mode: &str) {
    let test = format!("tables_as_they_are: {} ({mode})", shape.name);
    let Some(t) = Setup::new(&test).await else {
        return;
    };
    let s = &t.s;
    let what = &test;
    t.sql(&format!("CREATE SCHEMA {s};")).await;
    t.sql(
        &shape
            .create
            .replace("{s}", s)
            .replace("{n}", &JOBS.to_string()),
    )
    .await;
    let runs = format!("{s}.runs");
    t.sql(&format!(
        "CREATE TABLE {runs} (job_key text NOT NULL, pid integer NOT NULL)"
    ))
    .await;
    let config = t.config(&format!("mode = \"{mode}\"\n{}", shape.config));
    let table = format!("{s}.{}", shape.table);
    let columns_before = scalar(
        &t.pool,
        format!(
            "SELECT count(*) FROM pg_attribute WHERE attrelid = '{}'::regclass AND attnum > 0",
            table.replace('\'', "''")
        ),
    )
    .await;
    let q = |args: &[&str]| t.queue(&config, args);
    let migrated = ok(&mut q(&["migrate"]));
    assert!(migrated.contains("applied version 1"), "{what}: {migrated}");
    let [queued, processing, completed, failed] = shape.values;
    let (key, state) = (shape.key, shape.state);
    let in_state =
        |value: &str| format!("SELECT count(*) FROM {table} WHERE {state}::text = '{value}'");

    // A worker takes four jobs and dies mid-job.
    let dying = spawn_worker(
        &t,
        &config,
        &runs,
        &["--handlers", "4", "--sleep-ms", "600000"],
    )
    .await;
    until(
        &t.pool,
        in_state(processing),
        4,
        &format!("{what}: the dying worker's jobs"),
    )
    .await;
    let mut dying = dying;
    dying.start_kill().expect("SIGKILL");
    dying.wait().await.expect("the killed worker is gone");
    // A healthy worker with a short stalled age recovers them; one job
    // runs three times the stalled age and is not taken for a stalled one.
    let long: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT {key}::text FROM {table} WHERE {state}::text = '{queued}' ORDER BY {key} LIMIT 1"
    )))
    .fetch_one(&t.pool)
    .await
    .expect("a waiting job");
    let mut healthy = spawn_worker(
        &t,
        &config,
        &runs,
        &[
            "--handlers",
            "4",
            "--stalled-max-age-ms",
            "1000",
            "--long-key",
            &long,
            "--long-sleep-ms",
            "3000",
        ],
    )
    .await;
    let waiting =
        format!("SELECT count(*) FROM {table} WHERE {state}::text IN ('{queued}', '{processing}')");
    until(&t.pool, waiting, 0, &format!("{what}: the drain")).await;
    healthy.start_kill().expect("stopping the healthy worker");
    healthy.wait().await.expect("stopped");

    assert_eq!(
        scalar(&t.pool, in_state(completed)).await,
        JOBS,
        "{what}: every job completed"
    );
    if shape.stray {
        assert_eq!(
            scalar(&t.pool, in_state("lost")).await,
            1,
            "{what}: the unknown state is left alone"
        );
    }
    let per_job = format!(
        "SELECT count(*) FROM (SELECT job_key FROM {runs} GROUP BY job_key HAVING count(*) {{}}) AS r"
    );
    if mode == "transactional" {
        assert_eq!(
            scalar(&t.pool, format!("SELECT count(*) FROM {runs}")).await,
            JOBS,
            "{what}: each job's effects exactly once"
        );
    } else {
        assert_eq!(
            scalar(
                &t.pool,
                format!("SELECT count(DISTINCT job_key) FROM {runs}")
            )
            .await,
            JOBS,
            "{what}: every job ran"
        );
        assert_eq!(
            scalar(&t.pool, per_job.replace("{}", "> 4")).await,
            0,
            "{what}: no job ran more than 1 + max_resets (3) times"
        );
        assert!(
            scalar(&t.pool, per_job.replace("{}", "> 1")).await <= 4,
            "{what}: only the killed worker's four jobs ran twice"
        );
    }
    assert_eq!(
        scalar(
            &t.pool,
            format!("SELECT count(*) FROM {runs} WHERE job_key = '{long}'")
        )
        .await,
        1,
        "{what}: the job three times longer than the stalled age ran once"
    );
    let side = format!("{s}.{}_bookkeeping", shape.table);
    assert_eq!(
        scalar(&t.pool, format!("SELECT count(*) FROM {side}")).await,
        0,
        "{what}: completed jobs leave no bookkeeping row"
    );

    // A stale attempt writes nothing.
    t.sql(&format!("UPDATE {table} SET {state} = '{queued}' WHERE {key}::text <> '{long}' AND {state}::text = '{completed}'"))
        .await;
    let parsed = PgConfig::load(&config).expect("the config");
    let key_type = PgKeyType::detect(&t.pool, &parsed.store_options().expect("options"))
        .await
        .expect("the key type");
    let stale_key = match key_type {
        PgKeyType::Int4 => a_stale_attempt_writes_nothing::<i32>(&t.pool, &parsed, what).await,
        PgKeyType::Int8 => a_stale_attempt_writes_nothing::<i64>(&t.pool, &parsed, what).await,
        PgKeyType::Uuid => {
            a_stale_attempt_writes_nothing::<uuid::Uuid>(&t.pool, &parsed, what).await
        }
        PgKeyType::Text => a_stale_attempt_writes_nothing::<String>(&t.pool, &parsed, what).await,
    };

    // The CLI reads the table as it is.
    let stats = json(&mut q(&["stats", "--json"]));
    let total: i64 = stats["counts"]
        .as_array()
        .expect("counts")
        .iter()
        .filter_map(|c| c["count"].as_i64())
        .sum();
    assert_eq!(total, JOBS + i64::from(shape.stray), "{what}: {stats}");
    assert_eq!(
        stats["stalled"], 0,
        "{what}: the bookkeeping table's heartbeats judge stalls: {stats}"
    );
    let shown = ok(&mut q(&["show", &stale_key]));
    assert!(
        shown
            .lines()
            .any(|l| l.starts_with("state:") && l.contains(completed)),
        "{what}: {shown}"
    );

    // The HTTP API reads it and retries a job.
    t.sql(&format!(
        "UPDATE {table} SET {state} = '{failed}' WHERE {key}::text = '{long}'"
    ))
    .await;
    let options = parsed.store_options().expect("options");
    let admin: std::sync::Arc<queue_cli::serve::TextAdmin> = match key_type {
        PgKeyType::Int4 => Erased::shared(
            PgAdmin::<i32>::new(t.pool.clone(), options)
                .await
                .expect("admin"),
        ),
        PgKeyType::Int8 => Erased::shared(
            PgAdmin::<i64>::new(t.pool.clone(), options)
                .await
                .expect("admin"),
        ),
        PgKeyType::Uuid => Erased::shared(
            PgAdmin::<uuid::Uuid>::new(t.pool.clone(), options)
                .await
                .expect("admin"),
        ),
        PgKeyType::Text => Erased::shared(
            PgAdmin::<String>::new(t.pool.clone(), options)
                .await
                .expect("admin"),
        ),
    };
    let app = router(
        Api::new(admin, key_type, Duration::from_secs(60)),
        Tokens::default(),
        4096,
    );
    let (status, stats) = call(&app, Method::GET, "/api/stats").await;
    assert_eq!(status, StatusCode::OK, "{what}: {stats}");
    let (status, page) = call(&app, Method::GET, &format!("/api/jobs?state={failed}")).await;
    assert_eq!(
        (status, page["jobs"][0]["id"].as_str()),
        (StatusCode::OK, Some(long.as_str())),
        "{what}: {page}"
    );
    let (status, job) = call(&app, Method::GET, &format!("/api/jobs/{long}")).await;
    assert_eq!(
        (status, job["state"].as_str()),
        (StatusCode::OK, Some("failed")),
        "{what}: {job}"
    );
    let (status, body) = call(&app, Method::POST, &format!("/api/jobs/{long}/retry")).await;
    assert_eq!(status, StatusCode::OK, "{what}: {body}");
    assert_eq!(
        scalar(&t.pool, format!("SELECT count(*) FROM {table} WHERE {key}::text = '{long}' AND {state}::text = '{queued}'")).await,
        1,
        "{what}: the retried job waits again"
    );

    assert_eq!(
        scalar(
            &t.pool,
            format!(
                "SELECT count(*) FROM pg_attribute WHERE attrelid = '{}'::regclass AND attnum > 0",
                table.replace('\'', "''")
            ),
        )
        .await,
        columns_before,
        "{what}: the table was not altered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_shape_in_lease_mode() {
    for shape in &SHAPES {
        shape_in_mode(shape, "lease").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_shape_in_transactional_mode() {
    for shape in &SHAPES {
        shape_in_mode(shape, "transactional").await;
    }
}
