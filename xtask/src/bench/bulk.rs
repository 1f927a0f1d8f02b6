//! Bulk work beside a drain: does an operator's "retry all matching" over
//! a million failed jobs, or a purge of a million old ones, hold up the
//! workers' claims?
//!
//! Phases on the same table shape: queued jobs to drain (lowest keys, so
//! the drain claims them first) and a million finished jobs behind them.
//! In each, a 16-handler lease worker drains while a prober claims one job
//! at a time beside it and times each claim. Beside the drain: a bulk
//! operation retries every failed job; one purges every old completed job
//! (rounds, each followed by the drain alone as long); a worker's pruner
//! removes them (rounds likewise); one purge drops the old days'
//! partitions of a table partitioned by finish time. For comparison, a
//! load of the purge's shape that only computes (no rows, no WAL) runs
//! beside the drain in rounds likewise: its ratio is what the purge's share
//! of the cores alone costs the claims on this machine. The operations run as
//! `queue serve` runs them (the one runner, [`queue_core::run_operation`],
//! with its background pace), the pruner as a worker's does
//! ([`queue_core::prune`], its default batches and pace); the claims are
//! timed while both the removal and the drain of the queued jobs go on.
//! The last phase is the drain alone, timed as long as the retry (or until
//! its queued jobs are drained). The figures are the claim p99 of each,
//! and their ratios.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use chrono::DurationRound;
use queue_core::testkit::probe_claims;
use queue_core::{
    prune, run_operation, Admin, CancellationToken, Handler, Job, JobContext, JobError, JobFilter,
    JobState, NewOperation, OperationAction, OperationState, Retention, RunOptions, StopAs,
    TakeOperation, BACKGROUND_PACE, BACKGROUND_YIELD, DEFAULT_PURGE_BATCH,
};
use queue_store_postgres::{ExecutionMode, JobTable, PgAdmin, PgJobTransaction, PgStore};
use queue_worker::Worker;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use super::cluster::{fresh_table, thousands};
use super::drain::drain_options;
use super::report::{median, Results};
use super::wake::percentiles;
use super::Sizes;

/// Rounds of a purge beside the drain and the drain alone as long. Five
/// since 2026-11-28 (three before): one round's phase has 250-400 claims,
/// and with three pooled the claims' p99 was the eighth slowest of about
/// 800, so the pruner's ratio to the drain alone read 0.99-1.48 in runs
/// of one build on one machine; five pool about 1,300.
const PURGE_ROUNDS: usize = 5;

/// Completes every job, counting those of the drain (kind `noop`).
struct Counting(Arc<AtomicUsize>);

#[async_trait::async_trait]
impl Handler<PgStore<Job>> for Counting {
    async fn handle(
        &self,
        _: &JobContext,
        _: &mut PgJobTransaction,
        job: &Job,
    ) -> Result<(), JobError> {
        if job.kind == "noop" {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

/// What one phase measured.
struct Phase {
    /// The prober's claims, in ms.
    claims: Vec<f64>,
    /// How long the phase measured.
    window: Duration,
    /// The jobs the operation changed, and in how long.
    changed: u64,
    work_time: Duration,
}

/// The bulk operation of a phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Work {
    /// Retries every failed job (a day old).
    Retry,
    /// Purges every completed job finished over 30 days ago.
    Purge,
    /// The same on the default table partitioned by finish time, a
    /// partition a day: the purge drops the old days' partitions.
    PurgePartitions,
    /// The same jobs removed by a worker's pruner (`queue_core::prune`,
    /// its default batches and pace), completed jobs kept 30 days.
    Prune,
    /// No removal: a load of the purge's shape on one connection, for
    /// comparison. Statements that only compute, each busy for `busy` of
    /// wall time (as long as a batch of the purge took beside the drain),
    /// paced as a background operation, for `length` (as long as the purge
    /// ran). It reads and writes no row and no WAL, so what it costs the
    /// claims is what any work of the purge's shape costs them on this
    /// machine: a core's share.
    CpuLoad { busy: Duration, length: Duration },
}

/// Both phases, into `results`.
pub(super) async fn beside_a_drain(
    pool: &PgPool,
    sizes: &Sizes,
    results: &mut Results,
) -> Result<()> {
    let failed = sizes.bulk_rows;
    let retrying = phase(pool, sizes, Some(Work::Retry), None).await?;
    ensure!(
        retrying.changed == failed,
        "the bulk retry changed {} of {failed} failed jobs",
        retrying.changed
    );
    let purged = rounds_beside(pool, sizes, Work::Purge).await?;
    let pruned = rounds_beside(pool, sizes, Work::Prune).await?;
    // The purge's shape: its batches of DEFAULT_PURGE_BATCH rows each took
    // `busy`, then paused BACKGROUND_PACE and as long again, at its median
    // rate; for as long as it took at that rate.
    let rate = median(&purged.rates).max(1.0);
    let cycle = Duration::from_secs_f64(DEFAULT_PURGE_BATCH as f64 / rate);
    let busy = cycle
        .saturating_sub(BACKGROUND_PACE)
        .div_f64(1.0 + BACKGROUND_YIELD);
    let length = Duration::from_secs_f64(failed as f64 / rate);
    let loaded = rounds_beside(pool, sizes, Work::CpuLoad { busy, length }).await?;
    // Dropping the partitions takes under a second, a handful of claims:
    // they are timed for as long as a round of the purge of rows was.
    let purge_round = purged.window / purged.rates.len().max(1) as u32;
    let dropping = phase(pool, sizes, Some(Work::PurgePartitions), Some(purge_round)).await?;
    ensure!(
        dropping.changed == failed,
        "the purge of the partitioned table removed {} of {failed} old jobs",
        dropping.changed
    );
    // The purges are compared with the drain alone over the purge's own
    // window: a drain's claims are slower later in it than in its first
    // seconds, so the retry's longer window would flatter a short purge.
    let alone = phase(pool, sizes, None, Some(retrying.window)).await?;
    let during = percentiles(retrying.claims.clone());
    let without = percentiles(alone.claims.clone());
    let without_purging = percentiles(purged.alone_claims.clone());
    let rate = failed as f64 / retrying.work_time.as_secs_f64();
    let note = format!(
        "{} failed jobs behind {} queued ones; lease, 16 handlers, a prober claiming one at a time",
        thousands(failed),
        thousands(sizes.bulk_drain_jobs as u64)
    );
    results.add(
        "bulk",
        "bulk retry by filter beside a drain",
        rate,
        "jobs/s",
        format!(
            "{} jobs in {:.1} s, batches of 1,000, each followed by a pause of {} ms and as long again as it took",
            thousands(failed),
            retrying.work_time.as_secs_f64(),
            BACKGROUND_PACE.as_millis()
        ),
    );
    purged.report(results, "the purge", failed);
    pruned.report(results, "the pruner", failed);
    loaded.report_load(results, busy, length);
    let beside_drops = percentiles(dropping.claims.clone());
    results.add_against(
        "bulk",
        "purge of old jobs beside a drain, the table partitioned by finish time",
        failed as f64 / dropping.work_time.as_secs_f64(),
        "rows/s",
        format!(
            "the same jobs, their days' partitions dropped, in {:.2} s; claim p99 {:.2} ms ({} claims over {:.1} s from its start)",
            dropping.work_time.as_secs_f64(),
            beside_drops.p99,
            dropping.claims.len(),
            dropping.window.as_secs_f64()
        ),
        (Some(100_000.0), None),
    );
    results.add_against(
        "bulk",
        "claim p99 beside the partitions' purge / alone as long as the purge of rows",
        beside_drops.p99 / without_purging.p99,
        "x",
        "",
        (None, Some(1.2)),
    );
    results.add("bulk", "claim p99, drain alone", without.p99, "ms", note);
    results.add(
        "bulk",
        "claim p99, drain beside the bulk retry",
        during.p99,
        "ms",
        format!(
            "{} claims over {:.1} s; alone {} claims over {:.1} s",
            retrying.claims.len(),
            retrying.window.as_secs_f64(),
            alone.claims.len(),
            alone.window.as_secs_f64()
        ),
    );
    results.add_against(
        "bulk",
        "claim p99 beside the bulk retry / alone",
        during.p99 / without.p99,
        "x",
        "",
        (None, Some(1.2)),
    );
    results.add("bulk", "claim p50, drain alone", without.p50, "ms", "");
    results.add(
        "bulk",
        "claim p50, drain beside the bulk retry",
        during.p50,
        "ms",
        "",
    );
    Ok(())
}

/// Rounds of a removal of old jobs beside a drain, each followed by the
/// drain alone as long; the rounds pooled.
struct Rounds {
    claims: Vec<f64>,
    alone_claims: Vec<f64>,
    rates: Vec<f64>,
    window: Duration,
    alone_window: Duration,
}

/// [`PURGE_ROUNDS`] rounds (one in a quick run) of `work` beside a drain
/// and the drain alone as long: a removal of a million rows takes
/// seconds, so one phase has a few hundred claims and its p99 is one of
/// the slowest few.
async fn rounds_beside(pool: &PgPool, sizes: &Sizes, work: Work) -> Result<Rounds> {
    let mut rounds = Rounds {
        claims: Vec::new(),
        alone_claims: Vec::new(),
        rates: Vec::new(),
        window: Duration::ZERO,
        alone_window: Duration::ZERO,
    };
    for _ in 0..sizes.rounds.clamp(1, PURGE_ROUNDS) {
        let removing = phase(pool, sizes, Some(work), None).await?;
        let expected = match work {
            Work::CpuLoad { .. } => 0,
            _ => sizes.bulk_rows,
        };
        ensure!(
            removing.changed == expected,
            "{work:?} removed {} of {expected} old jobs",
            removing.changed,
        );
        let alone = phase(pool, sizes, None, Some(removing.window)).await?;
        rounds
            .rates
            .push(sizes.bulk_rows as f64 / removing.work_time.as_secs_f64());
        rounds.window += removing.window;
        rounds.alone_window += alone.window;
        rounds.claims.extend(removing.claims);
        rounds.alone_claims.extend(alone.claims);
    }
    Ok(rounds)
}

impl Rounds {
    /// The claims beside [`Work::CpuLoad`], against the drain alone as
    /// long: what the purge's ratio would be if the purge cost the claims
    /// nothing but its share of the cores.
    fn report_load(&self, results: &mut Results, busy: Duration, length: Duration) {
        let (beside, alone) = (
            percentiles(self.claims.clone()),
            percentiles(self.alone_claims.clone()),
        );
        results.add(
            "bulk",
            "claim p99, drain beside a CPU load shaped as the purge",
            beside.p99,
            "ms",
            format!(
                "statements busy {:.1} ms each, paced as the purge, for {:.1} s; {} claims over {:.1} s, the rounds pooled; alone {:.2} ms ({} claims)",
                busy.as_secs_f64() * 1000.0,
                length.as_secs_f64(),
                self.claims.len(),
                self.window.as_secs_f64(),
                alone.p99,
                self.alone_claims.len()
            ),
        );
        results.add(
            "bulk",
            "claim p99 beside a CPU load shaped as the purge / alone",
            beside.p99 / alone.p99,
            "x",
            "no rows, no WAL: what the purge's share of the cores alone costs the claims",
        );
    }

    /// Its rate, claim p99 beside and alone, and their ratio, against issue
    /// 30's targets; `what` names the removal ("the purge").
    fn report(&self, results: &mut Results, what: &str, rows: u64) {
        let (beside, alone) = (
            percentiles(self.claims.clone()),
            percentiles(self.alone_claims.clone()),
        );
        results.add_against(
            "bulk",
            format!("{what} of old jobs beside a drain"),
            median(&self.rates),
            "rows/s",
            format!(
                "{} completed jobs finished 40 days ago, oldest first from each batch's position, paced as a background operation; median of {} rounds: {} rows/s",
                thousands(rows),
                self.rates.len(),
                self.rates
                    .iter()
                    .map(|r| format!("{r:.0}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            (Some(100_000.0), None),
        );
        results.add(
            "bulk",
            format!("claim p99, drain beside {what}"),
            beside.p99,
            "ms",
            format!(
                "{} claims over {:.1} s, the rounds pooled",
                self.claims.len(),
                self.window.as_secs_f64()
            ),
        );
        results.add(
            "bulk",
            format!("claim p99, drain alone as long as {what}"),
            alone.p99,
            "ms",
            format!(
                "{} claims over {:.1} s, each round's drain alone after it",
                self.alone_claims.len(),
                self.alone_window.as_secs_f64()
            ),
        );
        results.add_against(
            "bulk",
            format!("claim p99 beside {what} / alone"),
            beside.p99 / alone.p99,
            "x",
            "",
            (None, Some(1.2)),
        );
    }
}

/// One phase: with `work`, the drain beside that bulk operation, measured
/// until it ends (and for at least `window`, if one is given); without,
/// the drain alone for `window`.
async fn phase(
    pool: &PgPool,
    sizes: &Sizes,
    work: Option<Work>,
    window: Option<Duration>,
) -> Result<Phase> {
    let table = match work {
        Some(Work::PurgePartitions) => {
            let table = super::partitioned::partitioned_table(pool, "bulk_partitioned").await?;
            let start = (chrono::Utc::now() - chrono::TimeDelta::days(41))
                .duration_trunc(chrono::TimeDelta::days(1))?;
            for day in 0..3 {
                super::partitioned::make_day(
                    pool,
                    &table,
                    "completed",
                    start + chrono::TimeDelta::days(day),
                )
                .await?;
            }
            table
        }
        _ => fresh_table(pool, "bulk").await?,
    };
    let t = table.name().quoted();
    // The drain's jobs first (lowest keys, claimed first), the failed
    // ones behind them.
    for statement in [
        format!(
            "INSERT INTO {t} (kind) SELECT 'noop' FROM generate_series(1, {})",
            sizes.bulk_drain_jobs
        ),
        match work {
            Some(Work::Purge | Work::PurgePartitions | Work::Prune | Work::CpuLoad { .. }) => format!(
                "INSERT INTO {t} (kind, state, finished_at) \
                 SELECT 'import', 'completed', now() - interval '40 days' + n * interval '1 millisecond' \
                 FROM generate_series(1, {}) AS n",
                sizes.bulk_rows
            ),
            _ => format!(
                "INSERT INTO {t} (kind, state, finished_at, failure_message, num_failures) \
                 SELECT 'import', 'failed', now() - interval '1 day', 'upstream down', 1 \
                 FROM generate_series(1, {})",
                sizes.bulk_rows
            ),
        },
        format!("VACUUM ANALYZE {t}"),
        "CHECKPOINT".to_owned(),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(statement))
            .execute(pool)
            .await?;
    }
    let store_pool = PgPoolOptions::new()
        .test_before_acquire(false)
        .max_connections(16 + 12)
        .connect_with((*pool.connect_options()).clone())
        .await?;
    let store = PgStore::default_table(
        store_pool.clone(),
        table.store_options().mode(ExecutionMode::Lease),
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(1100)).await; // let statistics settle
    let shutdown = CancellationToken::new();
    let drained = Arc::new(AtomicUsize::new(0));
    let worker = Worker::new(store.clone(), Counting(drained.clone()), drain_options(16))?;
    let probing = Arc::new(AtomicBool::new(true));
    let started = Instant::now();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    // The prober takes some of the drain's jobs: the drain is over when
    // the two together have taken them all (counting the worker's alone, a
    // phase went on past the drain's end, timing claims that found nothing
    // and walked the entries of two million claimed jobs: 160 ms each).
    let probed = Arc::new(AtomicUsize::new(0));
    let prober = tokio::spawn(probe_claims(store.clone(), probing.clone(), probed.clone()));
    let working = work.map(|work| {
        let (pool, table) = (store_pool.clone(), table.clone());
        // How long it ran, from the phase's start: the claims may be timed
        // on after it ended.
        tokio::spawn(async move {
            let changed = run_all(&pool, &table, work).await?;
            anyhow::Ok((changed, started.elapsed()))
        })
    });
    // Timed while the drain's queued jobs last and the operation runs, for
    // at least `window` if one is given (or, without an operation, for
    // `window`).
    let limit = Duration::from_secs(600);
    loop {
        let drain_over = drained.load(Ordering::Relaxed) + probed.load(Ordering::Relaxed)
            >= sizes.bulk_drain_jobs;
        let over = match (&working, window) {
            (Some(work), window) => {
                work.is_finished() && window.is_none_or(|w| started.elapsed() >= w)
            }
            (None, Some(window)) => started.elapsed() >= window,
            (None, None) => true,
        };
        if drain_over || over {
            break;
        }
        ensure!(started.elapsed() < limit, "the phase took over 10 minutes");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let window = started.elapsed();
    probing.store(false, Ordering::SeqCst);
    let claims = prober.await.context("the prober")?;
    let (changed, work_time) = match working {
        Some(work) => work.await.context("the bulk operation")??,
        None => (0, Duration::ZERO),
    };
    ensure!(
        !running.is_finished(),
        "the worker stopped during the phase"
    );
    shutdown.cancel();
    running.await??;
    store_pool.close().await;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {t} CASCADE")))
        .execute(pool)
        .await?;
    Ok(Phase {
        claims: claims.iter().map(|d| d.as_secs_f64() * 1000.0).collect(),
        window,
        changed,
        work_time,
    })
}

/// Retries every failed job of `table`, or purges every completed one
/// finished over 30 days ago, as one operation, run as `queue serve` runs
/// one, or as a worker's pruner prunes; returns how many jobs it changed.
async fn run_all(pool: &PgPool, table: &JobTable, work: Work) -> Result<u64> {
    if let Work::CpuLoad { busy, length } = work {
        cpu_load(pool, busy, length).await?;
        return Ok(0);
    }
    let admin = PgAdmin::<i64>::new(pool.clone(), table.store_options()).await?;
    if work == Work::Prune {
        let retention = Retention {
            completed: Some(Duration::from_secs(30 * 24 * 3600)),
            ..Retention::default()
        };
        let pass = prune(&admin, &retention, chrono::Utc::now(), |_, _| {}).await?;
        return Ok(pass.total());
    }
    let (filter, action) = match work {
        Work::Retry => (
            JobFilter::default().states([JobState::Failed]),
            OperationAction::Retry {
                reset_attempts: false,
            },
        ),
        Work::Purge | Work::PurgePartitions | Work::Prune | Work::CpuLoad { .. } => (
            JobFilter::default()
                .states([JobState::Completed])
                .finished_before(chrono::Utc::now() - chrono::TimeDelta::days(30)),
            OperationAction::Purge,
        ),
    };
    let total = admin.count(&filter).await?;
    let op = admin
        .create_operation(&NewOperation::new(action, filter, "bench", total))
        .await?;
    let taken = admin
        .take_operation(&TakeOperation::id("bench", op.id))
        .await?
        .context("the operation is taken")?;
    let options = RunOptions::new(BACKGROUND_PACE, StopAs::HandedBack).yielding(BACKGROUND_YIELD);
    let done = run_operation(
        &admin,
        taken,
        "bench",
        &CancellationToken::new(),
        options,
        |_| {},
    )
    .await?;
    ensure!(
        done.state == OperationState::Done,
        "the bulk {work:?} ended {}: {:?}",
        done.state,
        done.message
    );
    Ok(done.done)
}

/// [`Work::CpuLoad`]: statements busy for `busy` each, paced as a
/// background operation, until `length` has passed.
async fn cpu_load(pool: &PgPool, busy: Duration, length: Duration) -> Result<()> {
    let statement = format!(
        "DO $$ DECLARE t timestamptz := clock_timestamp() + interval '{} microseconds'; \
         BEGIN WHILE clock_timestamp() < t LOOP END LOOP; END $$",
        busy.as_micros()
    );
    let mut conn = pool.acquire().await?;
    let started = Instant::now();
    while started.elapsed() < length {
        let at = Instant::now();
        sqlx::query(sqlx::AssertSqlSafe(statement.clone()))
            .execute(&mut *conn)
            .await?;
        tokio::time::sleep(BACKGROUND_PACE + at.elapsed().mul_f64(BACKGROUND_YIELD)).await;
    }
    Ok(())
}
