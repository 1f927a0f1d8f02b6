//! The drain: jobs enqueued in batches, then drained by one worker, every
//! run counted to prove each job ran exactly once; in either mode, beside
//! old finished jobs or jobs scheduled ahead, with a pruner or without.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use async_trait::async_trait;
use queue_core::{CancellationToken, Handler, Job, JobContext, JobError, Retention};
use queue_store_postgres::{CompletedJobs, ExecutionMode, JobTable, PgJobTransaction, PgStore};
use queue_worker::{Pruner, PrunerOptions, Worker, WorkerOptions};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use super::cluster::{created_anew, enqueue_all};
use super::cpu::{CpuPerJob, CpuSample};

/// Counts the runs of each job, to prove exactly-once.
pub(super) struct Counted {
    pub first_id: i64,
    pub runs: Arc<Vec<AtomicU32>>,
    pub total: Arc<AtomicUsize>,
    /// Open the job's transaction (BEGIN and the row lock), as a handler
    /// that writes in transactional mode does.
    pub open_transaction: bool,
}

#[async_trait]
impl Handler<PgStore<Job>> for Counted {
    async fn handle(
        &self,
        _: &JobContext,
        store: &mut PgJobTransaction,
        job: &Job,
    ) -> Result<(), JobError> {
        if self.open_transaction {
            store.transaction().await.map_err(JobError::retry)?;
        }
        let slot = usize::try_from(job.id - self.first_id)
            .map_err(|_| JobError::poison("job id below the first"))?;
        match self.runs.get(slot) {
            Some(runs) => {
                runs.fetch_add(1, Ordering::Relaxed);
                self.total.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            None => Err(JobError::poison("job id beyond the last")),
        }
    }
}

pub(super) struct Drained {
    pub jobs_per_second: f64,
    pub wal_bytes_per_job: f64,
    pub commits_per_job: f64,
    pub cpu: Option<CpuPerJob>,
    /// With readers polling meanwhile: what they read.
    pub read: Option<super::pressure::Read>,
    /// With a pruner running: the rows it removed, and in how many seconds.
    pub pruned: Option<(u64, f64)>,
    /// With `Beside::statements`: what pg_stat_statements counted.
    pub statements: Vec<Statement>,
}

pub(super) async fn wal_and_commits(pool: &PgPool) -> Result<(i64, i64)> {
    let wal: i64 = sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::int8")
        .fetch_one(pool)
        .await?;
    let commits: i64 = sqlx::query_scalar(
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
    )
    .fetch_one(pool)
    .await?;
    Ok((wal, commits))
}

/// The worker settings the drains use: both modes claim ahead of their
/// handlers, a local queue of four times their number (64 for 16 handlers,
/// the size the graphile_worker peer runs with). A prefetched job holds no
/// connection in either mode: a job's transaction opens when its handler
/// asks for it.
pub(super) fn drain_options(handlers: usize) -> WorkerOptions {
    WorkerOptions::default()
        .handlers(handlers)
        .prefetch(4 * handlers)
}

/// How a drain's store is set up.
#[derive(Debug, Clone, Copy)]
pub(super) struct StoreSetup {
    pub mode: ExecutionMode,
    pub completed: CompletedJobs,
    /// Transactional mode: how long job locks may wait to ride on other
    /// jobs' commits (`None`: they never do).
    pub lock_rides: Option<Duration>,
    /// Completed jobs finished 40 days ago, in the table before the drain.
    pub old_finished: u64,
    /// Jobs scheduled a day ahead, in the table before the drain.
    pub scheduled_ahead: u64,
    /// Whether a pruner (30 days for completed jobs) runs during the drain.
    pub pruning: bool,
    /// Whether the table is laid out for claims in place
    /// (`JobTable::in_place_claims`).
    pub in_place: bool,
}

pub(super) const LEASE: StoreSetup = StoreSetup {
    mode: ExecutionMode::Lease,
    completed: CompletedJobs::Keep,
    lock_rides: None,
    old_finished: 0,
    scheduled_ahead: 0,
    pruning: false,
    in_place: false,
};
pub(super) const LEASE_DELETING: StoreSetup = StoreSetup {
    completed: CompletedJobs::Delete,
    ..LEASE
};
pub(super) const TRANSACTIONAL: StoreSetup = StoreSetup {
    mode: ExecutionMode::Transactional,
    ..LEASE
};
pub(super) const TRANSACTIONAL_DELETING: StoreSetup = StoreSetup {
    completed: CompletedJobs::Delete,
    ..TRANSACTIONAL
};
pub(super) const TRANSACTIONAL_IN_PLACE_DELETING: StoreSetup = StoreSetup {
    in_place: true,
    ..TRANSACTIONAL_DELETING
};
pub(super) const TRANSACTIONAL_RIDING: StoreSetup = StoreSetup {
    lock_rides: Some(Duration::from_millis(1)),
    ..TRANSACTIONAL
};

pub(super) async fn drain(
    pool: &PgPool,
    setup: StoreSetup,
    handlers: usize,
    n: usize,
) -> Result<Drained> {
    drain_beside(pool, setup, handlers, n, Beside::default()).await
}

/// What a drain runs or reads beside its jobs.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Beside<'a> {
    /// Readers polling the operator surfaces of `queue serve` meanwhile
    /// (the database's URL, for the server).
    pub readers: Option<&'a str>,
    /// The statements the drain ran, from pg_stat_statements (which the
    /// server must have loaded), reset when the worker starts.
    pub statements: bool,
    /// Another session holds a snapshot taken just before the worker
    /// starts until the drain ends, so that no entry of a claimed job can
    /// be marked dead or vacuumed meanwhile.
    pub old_snapshot: bool,
}

/// A statement as pg_stat_statements counted it over a drain.
pub(super) struct Statement {
    /// The normalised text.
    pub query: String,
    pub calls: i64,
    pub rows: i64,
    /// Executor time, all calls together.
    pub exec_ms: f64,
    /// Planning time, all calls together.
    pub plan_ms: f64,
}

/// The statements run since the last reset, the most costly first, without
/// those of the bench itself (its wait for the last completions).
async fn statements_since_reset(pool: &PgPool) -> Result<Vec<Statement>> {
    let rows: Vec<(String, i64, i64, f64, f64)> = sqlx::query_as(
        "SELECT query, calls, rows, total_exec_time, total_plan_time FROM pg_stat_statements \
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) \
           AND query NOT LIKE '%pg_stat_statements%' \
           AND query NOT LIKE 'SELECT count(*) FROM % AND state <> %' \
         ORDER BY total_exec_time + total_plan_time DESC",
    )
    .fetch_all(pool)
    .await
    .context("reading pg_stat_statements (is it in shared_preload_libraries?)")?;
    Ok(rows
        .into_iter()
        .map(|(query, calls, rows, exec_ms, plan_ms)| Statement {
            query,
            calls,
            rows,
            exec_ms,
            plan_ms,
        })
        .collect())
}

/// A drain, with what `beside` asks for.
pub(super) async fn drain_beside(
    pool: &PgPool,
    setup: StoreSetup,
    handlers: usize,
    n: usize,
    beside: Beside<'_>,
) -> Result<Drained> {
    let StoreSetup {
        mode,
        completed,
        lock_rides,
        old_finished,
        scheduled_ahead,
        pruning,
        in_place,
    } = setup;
    let table = JobTable::new("queue_bench", "drain")?;
    let table = created_anew(
        pool,
        if in_place {
            table.in_place_claims()
        } else {
            table
        },
    )
    .await?;
    if old_finished > 0 {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {} (kind, state, finished_at) SELECT 'old', 'completed', \
             now() - interval '40 days' FROM generate_series(1, {old_finished})",
            table.name().quoted()
        )))
        .execute(pool)
        .await?;
    }
    if scheduled_ahead > 0 {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {} (kind, process_after) SELECT 'later', now() + interval '1 day' \
             FROM generate_series(1, {scheduled_ahead})",
            table.name().quoted()
        )))
        .execute(pool)
        .await?;
    }
    let first_id = enqueue_all(pool, &table, n, "noop").await?;
    // No autovacuum of the new rows and no checkpoint during the timed
    // drain (the peers are prepared the same way).
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "VACUUM ANALYZE {}",
        table.name().quoted()
    )))
    .execute(pool)
    .await?;
    sqlx::query("CHECKPOINT").execute(pool).await?;
    let runs: Arc<Vec<AtomicU32>> = Arc::new((0..n).map(|_| AtomicU32::new(0)).collect());
    let total = Arc::new(AtomicUsize::new(0));
    let store_pool = PgPoolOptions::new()
        .test_before_acquire(false)
        .max_connections(handlers as u32 + 10)
        .connect_with((*pool.connect_options()).clone())
        .await?;
    let store = PgStore::default_table(
        store_pool.clone(),
        table
            .store_options()
            .mode(mode)
            .completed_jobs(completed)
            .lock_rides(lock_rides),
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(1100)).await; // let statistics settle
    let (wal0, commits0) = wal_and_commits(pool).await?;
    let shutdown = CancellationToken::new();
    let worker = Worker::new(
        store.clone(),
        Counted {
            first_id,
            runs: runs.clone(),
            total: total.clone(),
            open_transaction: mode == ExecutionMode::Transactional,
        },
        drain_options(handlers),
    )?;
    let pruner = if pruning {
        let pruner = Pruner::new(
            store.clone(),
            PrunerOptions {
                interval: Duration::from_millis(100),
                retention: Retention {
                    completed: Some(Duration::from_secs(30 * 24 * 3600)),
                    ..Retention::default()
                },
                ..PrunerOptions::default()
            },
        )?;
        Some(tokio::spawn(async move {
            let started = Instant::now();
            let mut removed = 0;
            loop {
                let pass = pruner.prune_once().await?;
                removed += pass.total();
                if pass.total() == 0 {
                    return anyhow::Ok((removed, started.elapsed().as_secs_f64()));
                }
            }
        }))
    } else {
        None
    };
    let polling = match beside.readers {
        Some(url) => Some(super::pressure::Readers::start(url, &table).await?),
        None => None,
    };
    if beside.statements {
        sqlx::query("SELECT pg_stat_statements_reset()")
            .execute(pool)
            .await
            .context("resetting pg_stat_statements (is it in shared_preload_libraries?)")?;
    }
    let snapshot = if beside.old_snapshot {
        let mut session = pool.acquire().await?;
        super::pressure::take_a_snapshot(&mut session).await?;
        Some(session)
    } else {
        None
    };
    let started = Instant::now();
    let cpu0 = CpuSample::now();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    wait_until_drained(pool, &table, first_id, &total, n, &running, started).await?;
    let elapsed = started.elapsed();
    if let Some(mut session) = snapshot {
        sqlx::query("ROLLBACK").execute(&mut *session).await?;
    }
    let read = match polling {
        Some(readers) => Some(readers.stop().await?),
        None => None,
    };
    let cpu = CpuSample::per_job_since(cpu0, n);
    let statements = if beside.statements {
        statements_since_reset(pool).await?
    } else {
        Vec::new()
    };
    shutdown.cancel();
    running.await??;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (wal1, commits1) = wal_and_commits(pool).await?;
    let twice: Vec<usize> = runs
        .iter()
        .enumerate()
        .filter(|(_, r)| r.load(Ordering::Relaxed) != 1)
        .map(|(i, _)| i)
        .take(5)
        .collect();
    ensure!(
        twice.is_empty(),
        "EXACTLY-ONCE VIOLATED: jobs at offsets {twice:?} ran other than once"
    );
    let pruned = match pruner {
        Some(pruning) => Some(pruning.await??),
        None => None,
    };
    store_pool.close().await;
    // Gone before the next scenario, so that no autovacuum of its rows runs
    // during it (a graphile_worker drain right after, say).
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP TABLE {}",
        table.name().quoted()
    )))
    .execute(pool)
    .await?;
    Ok(Drained {
        jobs_per_second: n as f64 / elapsed.as_secs_f64(),
        wal_bytes_per_job: (wal1 - wal0) as f64 / n as f64,
        commits_per_job: (commits1 - commits0) as f64 / n as f64,
        cpu,
        pruned,
        read,
        statements,
    })
}

/// Waits until `n` jobs have run (watched in memory: polling the table would
/// load the server being measured) and then until every drained row, from
/// `first_id` on, is completed (or deleted, if completed jobs are), read by
/// key range (the rows before it, old or scheduled, stay as they are). At
/// most 10 minutes from `started`; fails if the worker stops meanwhile.
pub(super) async fn wait_until_drained<T>(
    pool: &PgPool,
    table: &JobTable,
    first_id: i64,
    total: &AtomicUsize,
    n: usize,
    running: &tokio::task::JoinHandle<T>,
    started: Instant,
) -> Result<()> {
    let limit = Duration::from_secs(600);
    while total.load(Ordering::Relaxed) < n {
        ensure!(
            !running.is_finished(),
            "the worker stopped during the drain"
        );
        ensure!(started.elapsed() < limit, "the drain took over 10 minutes");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let pending_sql = format!(
        "SELECT count(*) FROM {} WHERE id >= {first_id} AND state <> 'completed'",
        table.name().quoted()
    );
    while sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(pending_sql.to_owned()))
        .fetch_one(pool)
        .await?
        > 0
    {
        ensure!(
            started.elapsed() < limit,
            "completions did not land within 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    Ok(())
}
