//! `cargo xtask bench [--quick] [--peers] [--only S,..]`: measures the queue,
//! a physical ceiling (pgbench) and, with `--peers`, other Rust job queues,
//! in one run on the same Postgres, and prints the figures and their ratios.
//! The full run also writes them into `docs/benchmarks.md` (beside it, in
//! `docs/benchmarks-<day>.md`, when the machine is slower than the
//! recorded run's, and then only with `--slow-day`), and resumes where it
//! stopped when it was cut short ([`progress`]). Figures are
//! printed, never asserted, except correctness: every drain verifies that
//! each job ran exactly once and fails loudly otherwise.
//!
//! One module per idea: the cluster and its ceiling ([`cluster`]), each
//! scenario ([`drain`], [`profile`], [`bookkeeping`], [`bulk`], [`alternating`], [`enqueue`], [`wake`], [`memory`],
//! [`claims`], [`big`], [`peers`], [`cold`]), and the report ([`report`]).

mod alternating;
mod big;
mod bookkeeping;
mod bulk;
mod claims;
mod cluster;
mod cold;
#[path = "../../../bench/cpu.rs"]
mod cpu;
mod drain;
mod enqueue;
mod http_enqueue;
mod memory;
mod partitioned;
mod peers;
mod pressure;
mod profile;
mod progress;
#[path = "../../../bench/quiet.rs"]
mod quiet;
mod report;
mod tls;
mod wake;

use std::time::Duration;

use anyhow::{Context, Result};
use sqlx::postgres::PgPoolOptions;

use crate::pg::{ClusterOptions, Postgres};
use claims::{claim_latency, Ahead};
use cluster::{fresh_table, machine, pgbench_costed, thousands, warm_up};
use drain::{
    drain, StoreSetup, LEASE, LEASE_DELETING, TRANSACTIONAL, TRANSACTIONAL_DELETING,
    TRANSACTIONAL_IN_PLACE_DELETING, TRANSACTIONAL_RIDING,
};
pub use memory::memory_worker;
use progress::Progress;
use report::{rows, Results};

/// How big each scenario is.
pub(crate) struct Sizes {
    drain_jobs: usize,
    pgbench_seconds: u32,
    wake_jobs: usize,
    memory_jobs: usize,
    growth_rows: [u64; 3],
    /// Jobs waiting for their time (scheduled ahead, or failed and waiting
    /// to retry) beside the claims and drains of the scheduled scenario.
    waiting_rows: u64,
    /// Old finished jobs in the table of the retention scenario's drains.
    retention_rows: u64,
    /// Jobs scheduled ahead in the wake scenario's due-time measurement.
    due_jobs: usize,
    /// Jobs of the wake scenario's sparse wake-ups, 1.5 s apart.
    sparse_wake_jobs: usize,
    single_enqueues: usize,
    /// Jobs per round of the HTTP enqueue scenario, each way.
    http_enqueues: usize,
    /// The sizes of the cold head-to-head.
    cold_jobs: &'static [usize],
    /// Rounds of the alternating scenarios (ceiling with drains, the
    /// head-to-heads with graphile_worker).
    rounds: usize,
    /// Failed jobs a bulk operation retries beside a drain, and the queued
    /// jobs of that drain.
    bulk_rows: u64,
    bulk_drain_jobs: usize,
    /// Finished jobs in the big-table scenario's table, and in the table
    /// its figures are compared with.
    big_rows: u64,
    big_base_rows: u64,
    /// The phases and rates of the idle-in-transaction scenario.
    idle: pressure::IdlePhases<'static>,
    /// The overload scenario's work per job and phases.
    overload: pressure::OverloadSizes,
    /// The jobs of each lease drain of the readers scenario (its transactional
    /// drains take a fifth).
    readers_jobs: usize,
    /// The backlog drained beside an old snapshot.
    backlog_jobs: usize,
}

const FULL: Sizes = Sizes {
    drain_jobs: 100_000,
    pgbench_seconds: 10,
    wake_jobs: 500,
    memory_jobs: 10_000,
    growth_rows: [0, 1_000_000, 10_000_000],
    waiting_rows: 1_000_000,
    retention_rows: 1_000_000,
    due_jobs: 20,
    sparse_wake_jobs: 40,
    single_enqueues: 5_000,
    http_enqueues: 16_000,
    cold_jobs: &[20_000, 100_000],
    rounds: 5,
    bulk_rows: 1_000_000,
    bulk_drain_jobs: 2_000_000,
    big_rows: 10_000_000,
    big_base_rows: 100_000,
    idle: pressure::IdlePhases {
        clean: Duration::from_secs(60),
        idle: Duration::from_secs(600),
        after: Duration::from_secs(60),
        rates: &[600, 2_000],
    },
    overload: pressure::OverloadSizes {
        work: Duration::from_millis(5),
        peak_jobs: 30_000,
        over: Duration::from_secs(300),
        settle: Duration::from_secs(30),
    },
    readers_jobs: 1_000_000,
    backlog_jobs: 1_000_000,
};

const QUICK: Sizes = Sizes {
    drain_jobs: 2_000,
    pgbench_seconds: 2,
    wake_jobs: 40,
    memory_jobs: 200,
    growth_rows: [0, 10_000, 50_000],
    waiting_rows: 20_000,
    retention_rows: 20_000,
    due_jobs: 3,
    sparse_wake_jobs: 3,
    single_enqueues: 500,
    http_enqueues: 800,
    cold_jobs: &[2_000],
    rounds: 1,
    bulk_rows: 20_000,
    bulk_drain_jobs: 40_000,
    big_rows: 20_000,
    big_base_rows: 2_000,
    idle: pressure::IdlePhases {
        clean: Duration::from_secs(4),
        idle: Duration::from_secs(6),
        after: Duration::from_secs(4),
        rates: &[600],
    },
    overload: pressure::OverloadSizes {
        work: Duration::from_millis(5),
        peak_jobs: 1_000,
        over: Duration::from_secs(2),
        settle: Duration::from_secs(2),
    },
    readers_jobs: 20_000,
    backlog_jobs: 20_000,
};

/// The scenarios `--only` can pick, in the order they run. `peers`,
/// `versus`, `cold` and the `awa-pressure` ones need the peer queues, so a
/// run without `--only` has them only with `--peers`; `big` and `big-retention` fill tables of ten
/// million rows, so a full run has them only with `--big` (`--quick` has
/// them, small).
const SCENARIOS: [&str; 31] = [
    "ceiling",
    "drain-lease",
    "drain-transactional",
    "drain-tls",
    "profile",
    "bookkeeping",
    "retention",
    "bulk",
    "alternating",
    "enqueue",
    "wake",
    "memory",
    "growth",
    "scheduled",
    "drain-scheduled",
    "partitioned",
    "in-place",
    "big",
    "big-retention",
    "pressure-idle-600",
    "pressure-idle-2000",
    "pressure-overload",
    "pressure-readers",
    "pressure-backlog",
    "peers",
    "versus",
    "cold",
    "awa-pressure-idle-600",
    "awa-pressure-idle-2000",
    "awa-pressure-overload",
    "awa-pressure-readers",
];

/// `cargo xtask bench`'s flags.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Tiny sizes, so that CI checks the program still works (the figures
    /// are not comparable, and the document is not written).
    #[arg(long)]
    quick: bool,
    /// Also measure graphile_worker, sqlxmq, apalis and awa (built from
    /// bench/peers), with the head-to-heads against graphile_worker.
    #[arg(long)]
    peers: bool,
    /// Also run the big-table scenario at 10,000,000 rows (stats, timeline,
    /// list pages and a purge, against the same at 100,000): minutes, and
    /// about 3 GB of disk.
    #[arg(long)]
    big: bool,
    /// Only these scenarios (a prefix picks every one that starts with it),
    /// without writing the document: ceiling, drain-lease,
    /// drain-transactional, drain-tls (the lease drain over TLS and plain,
    /// alternating), profile (where a job's CPU goes, on a cluster
    /// of its own with pg_stat_statements), bookkeeping, retention, bulk, alternating, enqueue, wake, memory,
    /// growth, scheduled, drain-scheduled, partitioned, in-place, big, big-retention,
    /// pressure-idle-600, pressure-idle-2000 (jobs/s offered; quick sizes
    /// run 600 only), pressure-overload, pressure-readers, pressure-backlog
    /// (a backlog drained beside an old snapshot), peers, versus,
    /// cold, awa-pressure-idle-600, awa-pressure-idle-2000 (awa in the
    /// idle-in-transaction scenario), awa-pressure-overload, awa-pressure-readers (its drain
    /// of the drain scenarios' size beside 8 readers of its admin figures).
    #[arg(long, value_delimiter = ',', value_parser = scenario_prefix)]
    only: Option<Vec<String>>,
    /// Run a full run even when this machine's pgbench ceiling is below
    /// 90 % of the recorded run's (without it the run stops after the
    /// ceiling): its figures then go to docs/benchmarks-<day>.md, and
    /// docs/benchmarks.md keeps the record.
    #[arg(long)]
    slow_day: bool,
}

fn scenario_prefix(name: &str) -> Result<String, String> {
    let name = name.trim();
    if !name.is_empty() && SCENARIOS.iter().any(|s| s.starts_with(name)) {
        Ok(name.to_owned())
    } else {
        Err(format!(
            "no scenario starts with {name:?}; the scenarios: {}",
            SCENARIOS.join(", ")
        ))
    }
}

impl Args {
    fn runs(&self, scenario: &str) -> bool {
        match &self.only {
            Some(only) => only.iter().any(|o| scenario.starts_with(o.as_str())),
            None => match scenario {
                "peers" | "versus" | "cold" => self.peers,
                awa if awa.starts_with("awa-pressure") => self.peers,
                "big" | "big-retention" => self.big || self.quick,
                _ => true,
            },
        }
    }
}

pub async fn run(args: Args) -> Result<()> {
    let sizes = if args.quick { &QUICK } else { &FULL };
    let provenance = report::provenance();
    let mut pg = Postgres::start(ClusterOptions {
        durable: true,
        statements: false,
    })
    .await?;
    pg.url = tls::without_tls(&pg.url);
    let pool = PgPoolOptions::new()
        .test_before_acquire(false)
        .max_connections(100)
        .connect(&pg.url)
        .await
        .with_context(|| format!("connecting to Postgres ({})", pg.origin))?;
    let machine = machine(&pool, &pg).await?;
    println!("{machine}");
    warm_up(&pool, sizes).await?;
    // A full run keeps its progress, and resumes a run cut short.
    let mut progress = if args.quick || args.only.is_some() {
        None
    } else {
        Some(Progress::resume_or_start(args.peers, args.big, &machine)?)
    };
    let mut results = progress.as_ref().map(Progress::results).unwrap_or_default();
    // Whether a scenario is still to measure; noting one measured.
    let due = |progress: &Option<Progress>, scenario: &str| {
        args.runs(scenario) && !progress.as_ref().is_some_and(|p| p.measured(scenario))
    };
    let measured = |progress: &mut Option<Progress>, scenarios: &[&str], results: &Results| {
        progress
            .as_mut()
            .map_or(Ok(()), |p| p.finished(scenarios, results))
    };

    // A resumed run may be on another machine, or the same one on a slower
    // day: its figures are marked with their part, and the part starts
    // with the ceiling again, so that the report can say how fast each
    // part's machine was (and mark the ratios that divide figures of
    // different parts).
    if let Some(part) = progress.as_ref().map(Progress::this_part) {
        results.begin_part(part);
        let left = SCENARIOS.iter().any(|s| due(&progress, s));
        if part > 0 && left {
            ceiling(&pg, sizes, "calibration", rows::PART_CEILING, &mut results).await?;
            report::refuse_a_slow_day(&results, args.slow_day)?;
        }
    }

    if due(&progress, "ceiling") {
        ceiling(&pg, sizes, "ceiling", rows::CEILING, &mut results).await?;
        if progress.is_some() {
            report::refuse_a_slow_day(&results, args.slow_day)?;
        }
        measured(&mut progress, &["ceiling"], &results)?;
    }

    let drains: Vec<&str> = (["drain-lease", "drain-transactional"].into_iter())
        .filter(|scenario| due(&progress, scenario))
        .collect();
    for (setup, handlers, scenario, what) in [
        (LEASE, 16, "drain-lease", rows::LEASE_16),
        (LEASE, 64, "drain-lease", "lease, 64 handlers"),
        (LEASE_DELETING, 16, "drain-lease", rows::LEASE_DELETING_16),
        (
            TRANSACTIONAL,
            16,
            "drain-transactional",
            rows::TRANSACTIONAL_16,
        ),
        (
            TRANSACTIONAL_DELETING,
            16,
            "drain-transactional",
            "transactional, 16 handlers, completed jobs deleted",
        ),
        (
            TRANSACTIONAL_IN_PLACE_DELETING,
            16,
            "drain-transactional",
            "transactional, 16 handlers, in place, completed jobs deleted",
        ),
        (
            TRANSACTIONAL,
            64,
            "drain-transactional",
            "transactional, 64 handlers",
        ),
        (
            TRANSACTIONAL_RIDING,
            64,
            "drain-transactional",
            "transactional, 64 handlers, lock rides (1 ms)",
        ),
    ] {
        if !drains.contains(&scenario) {
            continue;
        }
        let drained = drain(&pool, setup, handlers, sizes.drain_jobs).await?;
        let cpu = drained.cpu.map(|c| format!("; {c}")).unwrap_or_default();
        results.add(
            "drain",
            what,
            drained.jobs_per_second,
            "jobs/s",
            format!(
                "{} jobs, exactly once; {:.0} WAL bytes/job, {:.2} commits/job{cpu}",
                sizes.drain_jobs, drained.wal_bytes_per_job, drained.commits_per_job
            ),
        );
    }
    measured(&mut progress, &drains, &results)?;

    if due(&progress, "drain-tls") {
        tls::lease_drain_over_tls(&pg.url, &pool, sizes, &mut results).await?;
        measured(&mut progress, &["drain-tls"], &results)?;
    }

    if due(&progress, "profile") {
        profile::where_the_time_goes(sizes, &mut results).await?;
        measured(&mut progress, &["profile"], &results)?;
    }

    if due(&progress, "bookkeeping") {
        bookkeeping::as_it_is_against_changed(&pool, sizes, &mut results).await?;
        measured(&mut progress, &["bookkeeping"], &results)?;
    }

    if due(&progress, "retention") {
        retention(&pool, sizes, &mut results).await?;
        measured(&mut progress, &["retention"], &results)?;
    }

    if due(&progress, "bulk") {
        bulk::beside_a_drain(&pool, sizes, &mut results).await?;
        measured(&mut progress, &["bulk"], &results)?;
    }

    if due(&progress, "alternating") {
        alternating::ceiling_and_drains(&pg, &pool, sizes, &mut results).await?;
        measured(&mut progress, &["alternating"], &results)?;
    }

    if due(&progress, "enqueue") {
        enqueue(&pg, &pool, sizes, &mut results).await?;
        measured(&mut progress, &["enqueue"], &results)?;
    }

    if due(&progress, "wake") {
        let woken = wake::wake_latency(&pool, sizes.wake_jobs).await?;
        let cpu = woken.cpu.map(|c| format!("; {c}")).unwrap_or_default();
        let note = format!("{} jobs at ~50/s, idle workers{cpu}", sizes.wake_jobs);
        let wake = woken.latency;
        results.add("wake", rows::WAKE_P50, wake.p50, "ms", note);
        results.add("wake", rows::WAKE_P99, wake.p99, "ms", "");
        results.add(
            "wake",
            "enqueue commit to handler start, max",
            wake.max,
            "ms",
            "",
        );
        let sparse = wake::sparse_wake_latency(&pool, sizes.sparse_wake_jobs)
            .await?
            .latency;
        let note = format!(
            "{} jobs {:.1} s apart, each to a worker idle for longer than the second it goes on the paused kinds it read",
            sizes.sparse_wake_jobs,
            wake::SPARSE_GAP.as_secs_f64()
        );
        results.add("wake", rows::SPARSE_WAKE_P50, sparse.p50, "ms", note);
        results.add("wake", rows::SPARSE_WAKE_MAX, sparse.max, "ms", "");
        let due = wake::due_latency(&pool, sizes.due_jobs).await?;
        let note = format!(
            "{} jobs due 100 ms apart, idle workers, no NOTIFY when due",
            sizes.due_jobs
        );
        results.add("wake", rows::DUE_P50, due.p50, "ms", note);
        results.add("wake", rows::DUE_MAX, due.max, "ms", "");
        measured(&mut progress, &["wake"], &results)?;
    }

    if due(&progress, "memory") {
        let memory = memory::memory(&pg, &pool, sizes.memory_jobs).await?;
        results.add(
            "memory",
            format!("peak RSS, {} in-flight jobs (lease)", sizes.memory_jobs),
            memory.peak_mb,
            "MB",
            format!("idle worker {:.1} MB", memory.idle_mb),
        );
        results.add(
            "memory",
            rows::MEMORY_PER_JOB,
            (memory.peak_mb - memory.idle_mb) * 1024.0 / sizes.memory_jobs as f64,
            "KB",
            "",
        );
        measured(&mut progress, &["memory"], &results)?;
    }

    if due(&progress, "growth") {
        for rows in sizes.growth_rows {
            let p50 = claim_latency(&pool, Ahead::Finished(rows)).await?;
            let what = format!("claim p50 with {} finished rows", thousands(rows));
            results.add("growth", what, p50, "ms", "");
        }
        measured(&mut progress, &["growth"], &results)?;
    }

    if due(&progress, "scheduled") {
        let waiting = thousands(sizes.waiting_rows);
        for (ahead, what, note) in [
            (Ahead::Scheduled(0), rows::CLAIM_NONE_WAITING, String::new()),
            (
                Ahead::Scheduled(sizes.waiting_rows),
                rows::CLAIM_SCHEDULED,
                format!("{waiting} jobs, before the due ones in key order"),
            ),
            (
                Ahead::Retrying(sizes.waiting_rows),
                rows::CLAIM_RETRYING,
                format!("{waiting} jobs, before the due ones in key order"),
            ),
        ] {
            let p50 = claim_latency(&pool, ahead).await?;
            results.add("scheduled", what, p50, "ms", note);
        }
        measured(&mut progress, &["scheduled"], &results)?;
    }

    if due(&progress, "drain-scheduled") {
        alternating::beside_scheduled(&pool, sizes, &mut results).await?;
        measured(&mut progress, &["drain-scheduled"], &results)?;
    }

    if due(&progress, "partitioned") {
        partitioned::claims(&pool, sizes, &mut results).await?;
        measured(&mut progress, &["partitioned"], &results)?;
    }
    if due(&progress, "in-place") {
        alternating::in_place(&pool, sizes, &mut results).await?;
        measured(&mut progress, &["in-place"], &results)?;
    }
    if due(&progress, "big") {
        big::operator_surfaces(&pool, sizes, &mut results).await?;
        measured(&mut progress, &["big"], &results)?;
    }
    if due(&progress, "big-retention") {
        partitioned::retention(&pool, sizes.big_rows, &mut results).await?;
        measured(&mut progress, &["big-retention"], &results)?;
    }
    for rate in sizes.idle.rates {
        let scenario = format!("pressure-idle-{rate}");
        if due(&progress, &scenario) {
            let phases = pressure::IdlePhases {
                rates: &[*rate],
                ..sizes.idle
            };
            pressure::idle_in_transaction(&pool, &pg.url, phases, &mut results).await?;
            measured(&mut progress, &[&scenario], &results)?;
        }
    }
    if due(&progress, "pressure-overload") {
        pressure::overload(&pool, sizes.overload, &mut results).await?;
        measured(&mut progress, &["pressure-overload"], &results)?;
    }
    if due(&progress, "pressure-readers") {
        pressure::readers_beside_a_drain(
            &pool,
            &pg.url,
            sizes.readers_jobs,
            sizes.rounds,
            &mut results,
        )
        .await?;
        measured(&mut progress, &["pressure-readers"], &results)?;
    }
    if due(&progress, "pressure-backlog") {
        pressure::backlog_beside_an_old_snapshot(&pool, sizes.backlog_jobs, &mut results).await?;
        measured(&mut progress, &["pressure-backlog"], &results)?;
    }

    let mut built = None;
    if due(&progress, "peers") {
        built = Some(peers::run_peers(&pg, sizes, &mut results).await?);
        measured(&mut progress, &["peers"], &results)?;
    }
    let awa_idle: Vec<(u32, String)> = (sizes.idle.rates.iter())
        .map(|rate| (*rate, format!("awa-pressure-idle-{rate}")))
        .collect();
    let awa_scenarios = (["versus", "cold"].into_iter())
        .chain(awa_idle.iter().map(|(_, scenario)| scenario.as_str()))
        .chain(["awa-pressure-overload", "awa-pressure-readers"]);
    for scenario in awa_scenarios {
        if !due(&progress, scenario) {
            continue;
        }
        let peers = match &built {
            Some(peers) => peers,
            None => built.insert(peers::Peers::build().await?),
        };
        match scenario {
            "versus" => peers::head_to_head(peers, &pg, &pool, sizes, &mut results).await?,
            "cold" => cold::head_to_head(peers, &pg, &pool, sizes, &mut results).await?,
            "awa-pressure-overload" => {
                pressure::awa_overload(peers, &pg, sizes.overload, &mut results).await?
            }
            "awa-pressure-readers" => {
                let jobs = sizes.drain_jobs;
                pressure::awa_readers(peers, &pg, jobs, sizes.rounds, &mut results).await?
            }
            idle => {
                let rate = (awa_idle.iter())
                    .find(|(_, scenario)| scenario == idle)
                    .map(|(rate, _)| *rate)
                    .context("an awa idle-in-transaction scenario names its rate")?;
                let phases = pressure::IdlePhases {
                    rates: &[rate],
                    ..sizes.idle
                };
                pressure::awa_idle_in_transaction(peers, &pg, phases, &mut results).await?
            }
        }
        measured(&mut progress, &[scenario], &results)?;
    }

    let cold_sizes = if args.runs("cold") {
        sizes.cold_jobs
    } else {
        &[]
    };
    let (provenance, machine) = match &progress {
        Some(progress) => (progress.provenance(), progress.machine.clone()),
        None => (provenance, machine),
    };
    let report = report::report(&provenance, &machine, &results, args.quick, cold_sizes);
    println!("\n{report}");
    if let Some(progress) = progress {
        let day = chrono::Utc::now().format("%Y-%m-%d").to_string();
        report::write_doc(&report, &results, &day)?;
        progress.remove()?;
    }
    pool.close().await;
    drop(pg);
    Ok(())
}

/// A 16-handler lease drain beside old finished jobs, without and with a
/// pruner removing them meanwhile.
/// The pgbench ceiling, added to `results` as `what` in `section`.
async fn ceiling(
    pg: &Postgres,
    sizes: &Sizes,
    section: &'static str,
    what: &'static str,
    results: &mut Results,
) -> Result<()> {
    let ceiling = pgbench_costed(pg, sizes.pgbench_seconds).await?;
    let note = format!("{} s; {}", sizes.pgbench_seconds, ceiling.cpu_note());
    results.add(section, what, ceiling.tps, "tps", note);
    Ok(())
}

async fn retention(pool: &sqlx::PgPool, sizes: &Sizes, results: &mut Results) -> Result<()> {
    let old = sizes.retention_rows;
    let mut rates = Vec::new();
    for (pruning, what) in [
        (false, "lease, 16 handlers, old finished jobs kept"),
        (
            true,
            "lease, 16 handlers, old finished jobs pruned meanwhile",
        ),
    ] {
        let setup = StoreSetup {
            old_finished: old,
            pruning,
            ..LEASE
        };
        let drained = drain(pool, setup, 16, sizes.drain_jobs).await?;
        rates.push(drained.jobs_per_second);
        let pruned = drained
            .pruned
            .map(|(n, secs)| format!("; the pruner removed {} in {secs:.1} s", thousands(n)))
            .unwrap_or_default();
        results.add(
            "retention",
            what,
            drained.jobs_per_second,
            "jobs/s",
            format!(
                "{} jobs beside {} completed 40 days ago{pruned}",
                sizes.drain_jobs,
                thousands(old)
            ),
        );
    }
    results.add(
        "retention",
        "drain while pruning / drain without",
        rates[1] / rates[0],
        "x",
        "same table shape, same run",
    );
    Ok(())
}

/// Plain and unique enqueues, single and batched, and single enqueues over
/// HTTP against the same on 16 connections.
async fn enqueue(
    pg: &Postgres,
    pool: &sqlx::PgPool,
    sizes: &Sizes,
    results: &mut Results,
) -> Result<()> {
    let rates = enqueue::enqueue(pool, sizes.single_enqueues, sizes.drain_jobs).await?;
    results.add(
        "enqueue",
        "single inserts (one transaction each)",
        rates.single,
        "jobs/s",
        format!("{} jobs", sizes.single_enqueues),
    );
    results.add(
        "enqueue",
        rows::ENQUEUE_BATCH,
        rates.batch,
        "jobs/s",
        format!("{} jobs", sizes.drain_jobs),
    );
    results.add(
        "enqueue",
        "unique jobs, single inserts",
        rates.unique_single,
        "jobs/s",
        format!(
            "{} jobs, each key new; {:.2}x plain single inserts",
            sizes.single_enqueues,
            rates.unique_single / rates.single
        ),
    );
    results.add(
        "enqueue",
        rows::ENQUEUE_UNIQUE_BATCH,
        rates.unique_batch,
        "jobs/s",
        format!(
            "{} jobs, each key new; {:.2}x plain batches",
            sizes.drain_jobs,
            rates.unique_batch / rates.batch
        ),
    );
    let table = fresh_table(pool, "http_enqueue").await?;
    let rounds = sizes.rounds.min(3);
    let over_http =
        http_enqueue::measure(&pg.url, pool, &table, sizes.http_enqueues, rounds).await?;
    results.add(
        "enqueue",
        rows::ENQUEUE_DIRECT_16,
        over_http.direct,
        "jobs/s",
        format!("{} jobs a round, median of {rounds}", sizes.http_enqueues),
    );
    results.add(
        "enqueue",
        rows::ENQUEUE_HTTP,
        over_http.http,
        "jobs/s",
        format!(
            "{:.2}x the 16 connections' rate; single-job POSTs",
            over_http.http / over_http.direct
        ),
    );
    Ok(())
}
