//! The dashboard in headless Chromium (`xtask/browser/dashboard.mjs`,
//! driven by playwright-core from npm): a real worker finishes a batch of
//! jobs (some fail, one with HTML in its payload and failure message),
//! `queue serve` serves the table with a read and an admin token, and the
//! script loads the overview, filters to failed jobs, opens the hostile
//! one, retries it and sees it move; retries 10,000 jobs by filter as a
//! tracked operation and watches its progress bar, aborts a second one part
//! way; then a second server over a foreign table shows that table's own
//! state values.
//!
//! `cargo xtask dashboard --screenshots docs` refreshes the README's
//! screenshots; under `test-pg` they go to `target/dashboard-shots`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use async_trait::async_trait;
use chrono::{TimeDelta, Utc};
use queue_core::{CancellationToken, Handler, Job, JobContext, JobError, NewJob};
use queue_store_postgres::{JobTable, PgJobTransaction, PgStore};
use queue_worker::{Router, Worker, WorkerOptions};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use crate::served;

const READ_TOKEN: &str = "dashboard-read-token";
const ADMIN_TOKEN: &str = "dashboard-admin-token";
const OPERATE_TOKEN: &str = "dashboard-operate-token";
const CHROMIUM: &str = "/usr/bin/chromium";
/// The canceled jobs retried by filter from the jobs page, then canceled
/// again by an operation that is aborted part way.
const BULK_COUNT: u32 = 10_000;

type Store = PgStore<Job>;

/// Completes every job but those of kind `charge` and `render`, which
/// fail for good with the message their payload names.
struct Shop;

#[async_trait]
impl Handler<Store> for Shop {
    async fn handle(
        &self,
        ctx: &JobContext,
        _: &mut PgJobTransaction,
        job: &Job,
    ) -> Result<(), JobError> {
        let _logged = ctx
            .log("start", format!("handling {}", job.kind))
            .await
            .map_err(|e| JobError::retry(e.to_string()))?;
        match job.payload.get("fails_with").and_then(|m| m.as_str()) {
            Some(message) => Err(JobError::poison(message.to_owned())),
            None => Ok(()),
        }
    }
}

/// Runs the `heartbeat` schedule's jobs, and claims no other kind: the
/// live worker of the workers page.
struct Beats;

#[async_trait]
impl Handler<Store> for Beats {
    fn kinds(&self) -> Vec<String> {
        vec!["heartbeat".to_owned()]
    }

    async fn pre_dequeue(
        &self,
        _: &queue_core::DequeueContext<'_>,
    ) -> Result<queue_core::Dequeue<queue_store_postgres::PgConditions>, queue_core::BoxError> {
        Ok(queue_core::Dequeue::with_conditions(vec![
            queue_store_postgres::PgCondition::new("kind = {}").bind("heartbeat"),
        ]))
    }

    async fn handle(
        &self,
        _: &JobContext,
        _: &mut PgJobTransaction,
        _: &Job,
    ) -> Result<(), JobError> {
        Ok(())
    }
}

/// The jobs: mostly ones that complete, some that fail, one whose payload
/// and failure are HTML meant to run, and a few scheduled an hour ahead.
fn jobs() -> (Vec<NewJob>, NewJob, Vec<NewJob>) {
    let mut finishing = Vec::new();
    for i in 0..40 {
        finishing.push(NewJob::new(
            "send_email",
            serde_json::json!({ "to": format!("user{i}@example.com"), "template": "welcome" }),
        ));
    }
    for i in 0..5 {
        finishing.push(NewJob::new(
            "charge_card",
            serde_json::json!({ "order": 1000 + i, "cents": 1999, "fails_with": "card declined: insufficient funds" }),
        ));
    }
    let hostile = NewJob::new(
        "render_page",
        serde_json::json!({
            "html": "<script>window.__pwned = 1</script><img src=x onerror=\"window.__pwned = 2\">",
            "title": "<b>bold</b>",
            "fails_with": "template error near <img src=x onerror=\"window.__pwned = 3\"><script>window.__pwned = 4</script>",
        }),
    );
    let later = (0..3)
        .map(|i| {
            NewJob::new("nightly_report", serde_json::json!({ "day": i }))
                .process_after(Utc::now() + TimeDelta::hours(1))
        })
        .collect();
    (finishing, hostile, later)
}

/// `cargo xtask dashboard [--screenshots DIR]`, on a throwaway Postgres
/// (or `DATABASE_URL`).
pub async fn command(screenshots: Option<PathBuf>) -> Result<()> {
    let shots = screenshots.unwrap_or_else(default_shots);
    let pg = crate::pg::Postgres::start(crate::pg::ClusterOptions {
        durable: false,
        statements: false,
    })
    .await?;
    let result = run(&pg.url, &shots).await;
    drop(pg);
    result
}

/// Where the screenshots of a test run go.
pub fn default_shots() -> PathBuf {
    served::target_dir().join("dashboard-shots")
}

/// Runs the browser test on the database at `url`; screenshots go to
/// `shots`.
pub async fn run(url: &str, shots: &Path) -> Result<()> {
    let chromium = Path::new(CHROMIUM);
    ensure!(
        chromium.is_file(),
        "{CHROMIUM} is missing: the dashboard test needs Debian's chromium (apt-get install -y chromium)"
    );
    let node_dir = npm_install()?;
    let pool = PgPoolOptions::new()
        .max_connections(12)
        .connect(url)
        .await
        .context("connecting to Postgres")?;
    let schema = format!("dashboard_test_{}", std::process::id());
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
    )))
    .execute(&pool)
    .await?;
    let table = JobTable::new(&schema, "queue_jobs")?;
    table.migrate(&pool).await?;
    let (finishing, hostile, later) = jobs();
    let failed_count = finishing
        .iter()
        .filter(|j| j.payload.get("fails_with").is_some())
        .count()
        + 1;
    let mut ids = table.enqueue_many(&pool, &finishing).await?;
    let hostile_id = table
        .enqueue_many(&pool, std::slice::from_ref(&hostile))
        .await?;
    ids.extend(&hostile_id);
    table.enqueue_many(&pool, &later).await?;
    drain(&pool, &table, ids.len()).await?;
    past_hour(&pool, &table).await?;
    // Canceled two hours ago, out of the chart's hour: the jobs a bulk
    // retry from the jobs page brings back.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {t} (kind, state, finished_at, failure_message) \
         SELECT 'bulk_import', 'canceled', now() - interval '2 hours', 'canceled before it ran' \
         FROM generate_series(1, {BULK_COUNT})",
        t = table.name().quoted()
    )))
    .execute(&pool)
    .await?;

    let foreign = foreign_table(&pool, &schema).await?;
    let target = served::target_dir();
    let config = target.join("dashboard-test.toml");
    // A named token with the operate role, beside the two of the
    // environment; a schedule every 2 s and a nightly one.
    std::fs::write(
        &config,
        format!(
            "schema = \"{schema}\"\n\n[[serve.tokens]]\nname = \"on-call\"\nrole = \"operate\"\ntoken = \"{OPERATE_TOKEN}\"\n\n\
             [[schedules]]\nname = \"heartbeat\"\nkind = \"heartbeat\"\nevery = \"2s\"\n\n\
             [[schedules]]\nname = \"nightly\"\nkind = \"nightly_report\"\ncron = \"0 3 * * *\"\n"
        ),
    )?;
    let queue = served::queue_binary(false)?;
    let server = served::start(
        &queue,
        url,
        &config,
        &[
            ("QUEUE_ADMIN_TOKENS", ADMIN_TOKEN),
            ("QUEUE_READ_TOKENS", READ_TOKEN),
        ],
    )?;
    let foreign_server = served::start(&queue, url, &foreign, &[])?;
    // A worker alive through the walk, beating into the registry.
    let mut options = WorkerOptions::default().handlers(2);
    options.name = "dashboard-beats".into();
    options.heartbeat_interval = Duration::from_secs(1);
    let beats = Worker::new(
        PgStore::default_table(pool.clone(), table.store_options()).await?,
        Beats,
        options,
    )?;
    let stop_beats = CancellationToken::new();
    let beating = tokio::spawn(beats.run(stop_beats.clone()));
    let hostile_id = hostile_id
        .first()
        .context("the hostile job's key")?
        .to_string();
    let mut node = Command::new("node");
    node.arg(node_dir.join("dashboard.mjs"))
        .current_dir(&node_dir)
        .env("BASE", &server.base)
        .env("FOREIGN_BASE", &foreign_server.base)
        .env("READ_TOKEN", READ_TOKEN)
        .env("ADMIN_TOKEN", ADMIN_TOKEN)
        .env("OPERATE_TOKEN", OPERATE_TOKEN)
        .env("HOSTILE_ID", &hostile_id)
        .env("FAILED_COUNT", failed_count.to_string())
        .env("BULK_COUNT", BULK_COUNT.to_string())
        .env("SHOTS", absolute(shots)?)
        .env("CHROMIUM", chromium);
    // Off the runtime's threads: the worker runs beside it.
    let status = tokio::task::spawn_blocking(move || node.status())
        .await?
        .context("running node (install Node.js 20 or later)")?;
    stop_beats.cancel();
    beating.await??;
    drop(server);
    drop(foreign_server);
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA \"{schema}\" CASCADE"
    )))
    .execute(&pool)
    .await?;
    if !status.success() {
        bail!("the dashboard failed in the browser (see above)");
    }
    Ok(())
}

/// An hour of completed jobs before this run, written straight into the
/// table as a worker would have left them, so that the chart has a past.
async fn past_hour(pool: &PgPool, table: &JobTable) -> Result<()> {
    let mut seconds_ago = Vec::new();
    for minute in 1..60_i64 {
        let per_minute = 10.0 + 7.0 * (minute as f64 / 7.0).sin() + (minute % 5) as f64;
        for n in 0..per_minute.round() as i64 {
            seconds_ago.push(minute * 60 + n * 60 / per_minute.round() as i64);
        }
    }
    let jobs: Vec<NewJob> = seconds_ago
        .iter()
        .map(|_| {
            NewJob::new(
                "send_email",
                serde_json::json!({ "to": "earlier@example.com" }),
            )
        })
        .collect();
    let ids = table.enqueue_many(pool, &jobs).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {t} AS j SET state = 'completed', finished_at = now() - make_interval(secs => p.ago), \
         started_at = now() - make_interval(secs => p.ago + 0.2), queued_at = now() - make_interval(secs => p.ago + 1) \
         FROM unnest($1::int8[], $2::int8[]) AS p(id, ago) WHERE j.id = p.id AND j.state = 'queued'",
        t = table.name().quoted()
    )))
    .bind(&ids)
    .bind(&seconds_ago)
    .execute(pool)
    .await?;
    Ok(())
}

/// Runs a worker until `count` jobs have finished.
async fn drain(pool: &PgPool, table: &JobTable, count: usize) -> Result<()> {
    let store = PgStore::default_table(pool.clone(), table.store_options()).await?;
    let router = Router::new()
        .route("send_email", Shop)
        .route("charge_card", Shop)
        .route("render_page", Shop);
    let worker = Worker::new(store, router, WorkerOptions::default().handlers(4))?;
    let shutdown = CancellationToken::new();
    let working = tokio::spawn(worker.run(shutdown.clone()));
    let finished_sql = format!(
        "SELECT count(*) FROM {} WHERE state IN ('completed', 'failed')",
        table.name().quoted()
    );
    let started = Instant::now();
    loop {
        let finished: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(finished_sql.to_owned()))
            .fetch_one(pool)
            .await?;
        if finished as usize >= count {
            break;
        }
        ensure!(
            started.elapsed() < Duration::from_secs(60),
            "the worker finished {finished} of {count} jobs in a minute"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    working.await??;
    Ok(())
}

/// A foreign table with its own state words, a few rows in it, and the
/// config file that maps it.
async fn foreign_table(pool: &PgPool, schema: &str) -> Result<PathBuf> {
    for statement in [
        format!(
            "CREATE TABLE \"{schema}\".tasks (task_no serial PRIMARY KEY, job_type text NOT NULL, \
             status text NOT NULL DEFAULT 'new', error text, enqueued timestamptz NOT NULL DEFAULT now(), \
             began timestamptz, ended timestamptz, args jsonb NOT NULL DEFAULT '{{}}')"
        ),
        format!(
            "INSERT INTO \"{schema}\".tasks (job_type, status, error, ended, args) VALUES \
             ('import', 'new', NULL, NULL, '{{\"file\": \"a.csv\"}}'), \
             ('import', 'done', NULL, now(), '{{\"file\": \"b.csv\"}}'), \
             ('import', 'broken', 'bad header in c.csv', now(), '{{\"file\": \"c.csv\"}}'), \
             ('export', 'broken', 'disk full', now(), '{{}}')"
        ),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(statement.to_owned())).execute(pool).await?;
    }
    let config = served::target_dir().join("dashboard-test-foreign.toml");
    std::fs::write(
        &config,
        format!(
            "schema = \"{schema}\"\ntable = \"tasks\"\n[columns]\nid = \"task_no\"\nkind = \"job_type\"\n\
             payload = \"args\"\nstate = \"status\"\nfailure_message = \"error\"\nqueued_at = \"enqueued\"\n\
             finished_at = \"ended\"\nstarted_at = \"began\"\nprocess_after = false\nnum_resets = false\n\
             num_failures = false\nlast_heartbeat_at = false\nexecution_logs = false\n\
             worker_hostname = false\ncancel = false\nclaim_token = false\npriority = false\n\
             [states]\nqueued = \"new\"\nprocessing = \"working\"\ncompleted = \"done\"\nerrored = \"retry\"\n\
             failed = \"broken\"\ncanceled = \"dropped\"\n"
        ),
    )?;
    Ok(config)
}

/// `xtask/browser` with playwright-core installed from its lock file.
fn npm_install() -> Result<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("browser");
    if dir
        .join("node_modules/playwright-core/package.json")
        .is_file()
    {
        return Ok(dir);
    }
    eprintln!("dashboard: npm ci in {}", dir.display());
    let status = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
        .current_dir(&dir)
        .status()
        .context("running npm (install Node.js 20 and npm)")?;
    ensure!(status.success(), "npm ci in {} failed", dir.display());
    Ok(dir)
}

fn absolute(path: &Path) -> Result<PathBuf> {
    if path.is_absolute() {
        return Ok(path.to_owned());
    }
    Ok(std::env::current_dir()?.join(path))
}
