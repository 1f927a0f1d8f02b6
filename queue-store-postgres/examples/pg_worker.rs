//! A Postgres worker process: a worker and a resetter over a default-layout
//! table. Each job records a row in a `runs` table (in the job's transaction
//! in transactional mode), then sleeps for `--sleep-ms`. The concurrency
//! tests start several of these and kill some with SIGKILL.
//!
//! ```text
//! DATABASE_URL=postgres://... cargo run -p queue-store-postgres --example pg_worker -- \
//!     --schema app --table jobs --mode lease --handlers 16 --sleep-ms 0 --until-drained
//! ```
//!
//! The runs table is `<schema>.runs (job_id bigint, pid int, started_at,
//! ended_at)`, each run's start and end by the database's clock; it is
//! created if missing. With `--schedule-every-ms N`, the process also runs a
//! scheduler that enqueues a `tick` job every N ms (schedule `ticks`), as
//! every process does: the scheduler tests start three and kill one.

use std::time::Duration;

use anyhow::{Context, Result};
use async_trait::async_trait;
use queue_core::{CancellationToken, Handler, Job, JobContext, JobError, NewJob};
use queue_store_postgres::{ExecutionMode, JobTable, PgJobTransaction, PgStore};
use queue_worker::{
    Resetter, ResetterOptions, Schedule, Scheduler, SchedulerOptions, Worker, WorkerOptions,
};
use sqlx::postgres::PgPoolOptions;

/// A worker and a resetter over a default-layout table.
#[derive(clap::Parser)]
struct Args {
    /// The table's schema.
    #[arg(long, default_value = "public")]
    schema: String,
    /// The table.
    #[arg(long, default_value = "queue_jobs")]
    table: String,
    /// The execution mode (transactional, the store's default, or lease).
    #[arg(long, value_enum, default_value_t = Mode::Transactional)]
    mode: Mode,
    /// Handlers running at once.
    #[arg(long, default_value_t = 16)]
    handlers: usize,
    /// How long each job sleeps after recording its run, in ms.
    #[arg(long = "sleep-ms", default_value_t = 0)]
    sleep_ms: u64,
    /// Exit once no job waits or runs.
    #[arg(long)]
    until_drained: bool,
    /// The resetter's stalled max age, in ms.
    #[arg(long = "stalled-max-age-ms", default_value_t = 60_000)]
    stalled_max_age_ms: u64,
    /// Also enqueue a `tick` job every this many ms (schedule `ticks`).
    #[arg(long = "schedule-every-ms")]
    schedule_every_ms: Option<u64>,
}

/// [`ExecutionMode`] as a flag value.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Mode {
    Lease,
    Transactional,
}

impl Args {
    fn mode(&self) -> ExecutionMode {
        match self.mode {
            Mode::Lease => ExecutionMode::Lease,
            Mode::Transactional => ExecutionMode::Transactional,
        }
    }
}

/// Records the run, then sleeps.
struct Record {
    runs: String,
    sleep: Duration,
    transactional: bool,
}

#[async_trait]
impl Handler<PgStore<Job>> for Record {
    async fn handle(
        &self,
        ctx: &JobContext,
        store: &mut PgJobTransaction,
        job: &Job,
    ) -> Result<(), JobError> {
        let insert = format!("INSERT INTO {} (job_id, pid) VALUES ($1, $2)", self.runs);
        let pid = std::process::id() as i32;
        if self.transactional {
            // Written in the job's transaction: visible only if the job completes.
            let conn = store.transaction().await.map_err(JobError::retry)?;
            sqlx::query(sqlx::AssertSqlSafe(insert.to_owned()))
                .bind(job.id)
                .bind(pid)
                .execute(conn)
                .await?;
        } else {
            sqlx::query(sqlx::AssertSqlSafe(insert.to_owned()))
                .bind(job.id)
                .bind(pid)
                .execute(store.pool())
                .await?;
        }
        if !self.sleep.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep(self.sleep) => {}
                _ = ctx.cancelled() => return Err(JobError::cancel("stopped while sleeping")),
            }
        }
        let ended = format!(
            "UPDATE {} SET ended_at = clock_timestamp() WHERE job_id = $1 AND pid = $2 AND ended_at IS NULL",
            self.runs
        );
        let ended = sqlx::query(sqlx::AssertSqlSafe(ended))
            .bind(job.id)
            .bind(pid);
        if self.transactional {
            let conn = store.transaction().await.map_err(JobError::retry)?;
            ended.execute(conn).await?;
        } else {
            ended.execute(store.pool()).await?;
        }
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Args = clap::Parser::parse();
    let url = std::env::var("DATABASE_URL").context("DATABASE_URL must point at the database")?;
    let pool = PgPoolOptions::new()
        .test_before_acquire(false)
        .max_connections(args.handlers as u32 + 8)
        .connect(&url)
        .await
        .context("connecting to DATABASE_URL")?;
    let table = JobTable::new(&args.schema, &args.table)?;
    let runs = format!("{}.\"runs\"", table.name().schema.quoted());
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {runs} (job_id bigint NOT NULL, pid integer NOT NULL, \
         started_at timestamptz NOT NULL DEFAULT clock_timestamp(), ended_at timestamptz)"
    )))
    .execute(&pool)
    .await?;
    let store =
        PgStore::default_table(pool.clone(), table.store_options().mode(args.mode())).await?;
    let shutdown = queue_worker::shutdown::on_signals();
    let options = WorkerOptions {
        poll_interval: Duration::from_millis(200),
        heartbeat_interval: Duration::from_millis(200),
        ..WorkerOptions::default().handlers(args.handlers)
    };
    let worker = Worker::new(
        store.clone(),
        Record {
            runs,
            sleep: Duration::from_millis(args.sleep_ms),
            transactional: args.mode == Mode::Transactional,
        },
        options,
    )?;
    let resetter = Resetter::new(
        store.clone(),
        ResetterOptions {
            interval: Duration::from_millis(200),
            stalled_max_age: Duration::from_millis(args.stalled_max_age_ms),
            ..ResetterOptions::default()
        },
    )?;
    let resetting = tokio::spawn(resetter.run(shutdown.clone()));
    let working = tokio::spawn(worker.run(shutdown.clone()));
    let scheduling = match args.schedule_every_ms.map(Duration::from_millis) {
        Some(period) => {
            let ticks = Schedule::every(
                "ticks",
                period,
                NewJob::new("tick", serde_json::json!(null)),
            )?;
            let scheduler =
                Scheduler::new(store.clone(), vec![ticks], SchedulerOptions::default())?;
            Some(tokio::spawn(scheduler.run(shutdown.clone())))
        }
        None => None,
    };
    println!("ready {}", std::process::id());
    if args.until_drained {
        wait_until_drained(&pool, &table, &shutdown).await?;
        shutdown.cancel();
    }
    let report = working.await??;
    resetting.await??;
    if let Some(scheduling) = scheduling {
        scheduling.await??;
    }
    println!(
        "report ok={} total={}",
        report.count("completed"),
        report.total()
    );
    Ok(())
}

/// Returns once no job is queued, errored or processing.
async fn wait_until_drained(
    pool: &sqlx::PgPool,
    table: &JobTable,
    shutdown: &CancellationToken,
) -> Result<()> {
    let sql = format!(
        "SELECT count(*) FROM {} WHERE state IN ('queued', 'errored', 'processing')",
        table.name().quoted()
    );
    while !shutdown.is_cancelled() {
        let left: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_one(pool)
            .await?;
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}
