//! A worker process over any table a config file describes (the `queue`
//! CLI's config): a worker and a resetter, whose records are the job's key
//! alone. Each job records a row in a runs table (in the job's transaction
//! in transactional mode), then sleeps for `--sleep-ms`, or for
//! `--long-sleep-ms` if its key is `--long-key`. The tests of tables used
//! as they are start it and kill it with SIGKILL.
//!
//! ```text
//! DATABASE_URL=postgres://... cargo run -p queue-cli --example table_worker -- \
//!     --config jobs.toml --runs 'app.runs' --handlers 4 --sleep-ms 0
//! ```
//!
//! The runs table (`job_key text, pid integer`) must exist.

use std::time::Duration;

use anyhow::{Context, Result};
use async_trait::async_trait;
use queue_core::{Handler, JobContext, JobError, JobRecord};
use queue_store_postgres::{
    Column, ExecutionMode, PgConfig, PgJobTransaction, PgKey, PgKeyType, PgStore,
};
use queue_worker::{Resetter, ResetterOptions, Worker, WorkerOptions};
use sqlx::postgres::{PgPoolOptions, PgRow};
use sqlx::Row;

/// A worker and a resetter over the table of a config file.
#[derive(clap::Parser)]
struct Args {
    /// The config file describing the table.
    #[arg(long)]
    config: std::path::PathBuf,
    /// The runs table, schema-qualified and quoted.
    #[arg(long)]
    runs: String,
    /// Handlers running at once.
    #[arg(long, default_value_t = 4)]
    handlers: usize,
    /// How long each job sleeps after recording its run, in ms.
    #[arg(long = "sleep-ms", default_value_t = 0)]
    sleep_ms: u64,
    /// The key of a job that sleeps `--long-sleep-ms` instead.
    #[arg(long = "long-key")]
    long_key: Option<String>,
    /// How long that job sleeps, in ms.
    #[arg(long = "long-sleep-ms", default_value_t = 0)]
    long_sleep_ms: u64,
    /// The resetter's stalled max age, in ms.
    #[arg(long = "stalled-max-age-ms", default_value_t = 60_000)]
    stalled_max_age_ms: u64,
    /// The resetter's limit on resets per job.
    #[arg(long = "max-resets", default_value_t = 3)]
    max_resets: u32,
}

/// A claimed job: its key, read as `__queue_key` (see [`main`]'s select
/// list).
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

fn decode<K: PgKey + for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>>(
    row: &PgRow,
) -> Result<Key<K>, sqlx::Error> {
    Ok(Key(row.try_get("__queue_key")?))
}

/// Records the run, then sleeps.
struct Record {
    runs: String,
    sleep: Duration,
    long: Option<(String, Duration)>,
    transactional: bool,
}

#[async_trait]
impl<K: PgKey> Handler<PgStore<Key<K>>> for Record {
    async fn handle(
        &self,
        ctx: &JobContext,
        store: &mut PgJobTransaction<K>,
        job: &Key<K>,
    ) -> Result<(), JobError> {
        let insert = format!("INSERT INTO {} (job_key, pid) VALUES ($1, $2)", self.runs);
        let key = job.0.to_string();
        let pid = std::process::id() as i32;
        if self.transactional {
            // Written in the job's transaction: visible only if it completes.
            let conn = store.transaction().await.map_err(JobError::retry)?;
            sqlx::query(sqlx::AssertSqlSafe(insert))
                .bind(&key)
                .bind(pid)
                .execute(conn)
                .await?;
        } else {
            sqlx::query(sqlx::AssertSqlSafe(insert))
                .bind(&key)
                .bind(pid)
                .execute(store.pool())
                .await?;
        }
        let sleep = match &self.long {
            Some((long_key, long)) if *long_key == key => *long,
            _ => self.sleep,
        };
        if !sleep.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep(sleep) => {}
                _ = ctx.cancelled() => return Err(JobError::cancel("stopped while sleeping")),
            }
        }
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Args = clap::Parser::parse();
    let config = PgConfig::load(&args.config)?;
    let url = std::env::var("DATABASE_URL").context("DATABASE_URL must point at the database")?;
    let pool = PgPoolOptions::new()
        .test_before_acquire(false)
        .max_connections(args.handlers as u32 + 8)
        .connect(&url)
        .await
        .context("connecting to DATABASE_URL")?;
    let options = config.store_options()?;
    let key = match config.key_type {
        Some(key) => key,
        None => PgKeyType::detect(&pool, &options).await?,
    };
    match key {
        PgKeyType::Int4 => run::<i32>(args, pool, options).await,
        PgKeyType::Int8 => run::<i64>(args, pool, options).await,
        PgKeyType::Uuid => run::<uuid::Uuid>(args, pool, options).await,
        PgKeyType::Text => run::<String>(args, pool, options).await,
    }
}

async fn run<K>(
    args: Args,
    pool: sqlx::PgPool,
    options: queue_store_postgres::PgStoreOptions,
) -> Result<()>
where
    K: PgKey + for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    let transactional = options.execution_mode() == ExecutionMode::Transactional;
    // The record reads the key alone, under a name of its own.
    let key = options
        .column_name(Column::Id)
        .map_or_else(|| "\"id\"".to_owned(), |k| k.quoted());
    let select = format!(
        "{}.{key} AS \"__queue_key\"",
        options.table_alias().quoted()
    );
    let options = options.select(select);
    let store = PgStore::with_decoder(pool.clone(), options, decode::<K>).await?;
    let shutdown = queue_worker::shutdown::on_signals();
    let worker = Worker::new(
        store.clone(),
        Record {
            runs: args.runs.clone(),
            sleep: Duration::from_millis(args.sleep_ms),
            long: args
                .long_key
                .clone()
                .map(|k| (k, Duration::from_millis(args.long_sleep_ms))),
            transactional,
        },
        WorkerOptions {
            poll_interval: Duration::from_millis(200),
            heartbeat_interval: Duration::from_millis(200),
            ..WorkerOptions::default().handlers(args.handlers)
        },
    )?;
    let resetter = Resetter::new(
        store.clone(),
        ResetterOptions {
            interval: Duration::from_millis(200),
            stalled_max_age: Duration::from_millis(args.stalled_max_age_ms),
            max_resets: args.max_resets,
            ..ResetterOptions::default()
        },
    )?;
    let resetting = tokio::spawn(resetter.run(shutdown.clone()));
    let working = tokio::spawn(worker.run(shutdown.clone()));
    println!("ready {}", std::process::id());
    let report = working.await??;
    resetting.await??;
    println!(
        "report ok={} total={}",
        report.count("completed"),
        report.total()
    );
    Ok(())
}
