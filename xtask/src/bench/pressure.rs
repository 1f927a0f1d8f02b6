//! Pressure: the bad days of a Postgres queue, in both modes.
//!
//! Idle in transaction: jobs are offered at a steady rate to a 16-handler
//! worker; after a clean phase, another session opens a transaction, takes
//! a snapshot and sits idle (so vacuum can remove no dead row the drain
//! leaves), then ends it, and the drain goes on for a while. The figures:
//! completions against the offered rate (worst 10 s of each phase), the
//! pickup latency (an enqueue's commit to its handler's start, which holds
//! the claim that started it) of each phase as a ratio against the clean
//! phase, how soon after the session ended pickups were back to the clean
//! latency, and the dead rows and sizes the idle phase left.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use async_trait::async_trait;
use queue_core::{CancellationToken, Handler, Job, JobContext, JobError, NewJob};
use queue_store_postgres::{ExecutionMode, JobTable, PgJobTransaction, PgStore};
use queue_worker::Worker;
use sqlx::{Connection, PgPool};

use crate::pg::Postgres;

use super::cluster::{fresh_table, thousands};
use super::drain::drain_options;
use super::peers::{peer_row, Peers};
use super::quiet;
use super::report::{median, Results};
use super::wake::percentiles;

/// The two modes every pressure scenario runs in, with the names its
/// figures give them.
const MODES: [(ExecutionMode, &str); 2] = [
    (ExecutionMode::Lease, "lease"),
    (ExecutionMode::Transactional, "transactional"),
];

/// How long each phase of the idle-in-transaction scenario lasts.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IdlePhases<'a> {
    pub clean: Duration,
    pub idle: Duration,
    pub after: Duration,
    /// The offered rates (jobs/s) it runs at, each in both modes.
    pub rates: &'a [u32],
}

/// Stamps when each job's handler started. In transactional mode it opens
/// the job's transaction (`BEGIN` and the row lock), as a handler that
/// writes does: without it, a job completes as in lease mode.
struct Started {
    at: Arc<Mutex<HashMap<i64, Instant>>>,
    open_transaction: bool,
    /// How long each job works (sleeps) after it started.
    work: Duration,
}

#[async_trait]
impl Handler<PgStore<Job>> for Started {
    async fn handle(
        &self,
        _: &JobContext,
        store: &mut PgJobTransaction,
        job: &Job,
    ) -> Result<(), JobError> {
        let now = Instant::now();
        if self.open_transaction {
            store.transaction().await.map_err(JobError::retry)?;
        }
        self.at
            .lock()
            .map_err(|_| JobError::poison("poisoned"))?
            .insert(job.id, now);
        if !self.work.is_zero() {
            tokio::time::sleep(self.work).await;
        }
        Ok(())
    }
}

/// What one run saw: when each job was offered (its enqueue's commit) and
/// when its handler started, against the run's start.
struct Timeline {
    offered: Vec<(i64, Duration)>,
    started: HashMap<i64, Duration>,
}

impl Timeline {
    /// Pickup latencies (ms) of the jobs offered in `[from, to)`.
    fn pickups(&self, from: Duration, to: Duration) -> Vec<f64> {
        self.offered
            .iter()
            .filter(|(_, at)| *at >= from && *at < to)
            .map(|(id, at)| match self.started.get(id) {
                Some(s) => s.saturating_sub(*at).as_secs_f64() * 1000.0,
                None => f64::INFINITY,
            })
            .collect()
    }

    /// The lowest ratio of jobs started to jobs offered over the 10 s
    /// windows of `[from, to)`.
    fn worst_completion(&self, from: Duration, to: Duration) -> f64 {
        let window = Duration::from_secs(10);
        let mut worst = f64::INFINITY;
        let mut at = from;
        while at + window <= to {
            let inside = |t: &Duration| *t >= at && *t < at + window;
            let offered = self.offered.iter().filter(|(_, t)| inside(t)).count();
            let started = self.started.values().filter(|t| inside(t)).count();
            if offered > 0 {
                worst = worst.min(started as f64 / offered as f64);
            }
            at += window;
        }
        if worst.is_finite() {
            worst
        } else {
            // A phase shorter than a window: the phase as one.
            let offered = self
                .offered
                .iter()
                .filter(|(_, t)| *t >= from && *t < to)
                .count();
            let started = self
                .started
                .values()
                .filter(|t| **t >= from && **t < to)
                .count();
            started as f64 / offered.max(1) as f64
        }
    }

    /// The pickup p99 (ms) of each `window` of `[from, to)`, by how far into
    /// it the window starts (`None`: no job was offered in it).
    fn p99s(&self, from: Duration, to: Duration, window: Duration) -> Vec<(Duration, Option<f64>)> {
        let mut out = Vec::new();
        let mut at = from;
        while at < to {
            let ms = self.pickups(at, (at + window).min(to));
            out.push((at - from, (!ms.is_empty()).then(|| percentiles(ms).p99)));
            at += window;
        }
        out
    }

    /// The highest pickup p99 of the 10 s windows of `[from, to)`, and how
    /// far into the phase its window started (s).
    fn worst_p99(&self, from: Duration, to: Duration) -> (f64, f64) {
        self.p99s(from, to, Duration::from_secs(10))
            .into_iter()
            .filter_map(|(at, p99)| Some((p99?, at.as_secs_f64())))
            .fold((0.0, 0.0), |worst, w| if w.0 > worst.0 { w } else { worst })
    }

    /// The pickup p99 (ms) of each 10 s window of `[from, to)`, printed as
    /// the run's timeline.
    fn p99_by_window(&self, from: Duration, to: Duration) -> String {
        self.p99s(from, to, Duration::from_secs(10))
            .into_iter()
            .map(|(_, p99)| p99.map_or_else(|| "-".to_owned(), |p| format!("{p:.1}")))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Seconds from `from` to the start of the first second whose pickup
    /// p99 is within `bound` ms, if any second before `to` is.
    fn back_within(&self, from: Duration, to: Duration, bound: f64) -> Option<f64> {
        self.p99s(from, to, Duration::from_secs(1))
            .into_iter()
            .find(|(_, p99)| p99.is_some_and(|p| p <= bound))
            .map(|(at, _)| at.as_secs_f64())
    }
}

/// Offers jobs at a rate that may change from phase to phase: at each tick,
/// whatever is due by then, so that a slow enqueue is made up at the next
/// tick and the offered rate holds; records when each job was offered (its
/// enqueue's commit, from `t0`).
struct Offerer<'a> {
    pool: &'a PgPool,
    table: &'a JobTable,
    t0: Instant,
    /// Jobs due when the current rate was set, and when that was.
    base: (f64, Duration),
    rate: f64,
    sent: u64,
    offered: Vec<(i64, Duration)>,
}

impl<'a> Offerer<'a> {
    fn new(pool: &'a PgPool, table: &'a JobTable, rate: f64) -> Self {
        Offerer {
            pool,
            table,
            t0: Instant::now(),
            base: (0.0, Duration::ZERO),
            rate,
            sent: 0,
            offered: Vec::new(),
        }
    }

    fn elapsed(&self) -> Duration {
        self.t0.elapsed()
    }

    fn set_rate(&mut self, rate: f64) {
        let now = self.elapsed();
        self.base = (self.due_at(now), now);
        self.rate = rate;
    }

    fn due_at(&self, t: Duration) -> f64 {
        self.base.0 + t.saturating_sub(self.base.1).as_secs_f64() * self.rate
    }

    /// Enqueues what is due by now, in one batch.
    async fn top_up(&mut self) -> Result<()> {
        let due = self.due_at(self.elapsed()) as u64;
        if due > self.sent {
            let jobs: Vec<NewJob> = (self.sent..due)
                .map(|i| NewJob::new("noop", serde_json::json!(i)))
                .collect();
            let ids = self.table.enqueue_many(self.pool, &jobs).await?;
            let at = self.elapsed();
            self.offered.extend(ids.into_iter().map(|id| (id, at)));
            self.sent = due;
        }
        Ok(())
    }
}

/// A 10 ms tick that waits after a late one instead of bursting.
fn ticks() -> tokio::time::Interval {
    let mut ticks = tokio::time::interval(Duration::from_millis(10));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks
}

/// The table's dead rows and sizes, as the idle session ends.
struct Bloat {
    dead_rows: i64,
    table_mb: f64,
    indexes_mb: f64,
}

async fn bloat(pool: &PgPool, table: &JobTable) -> Result<Bloat> {
    let name = table.name().quoted();
    let (dead_rows, table_bytes, index_bytes): (i64, i64, i64) =
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = '{name}'::regclass), 0), \
             pg_table_size('{name}'::regclass), pg_indexes_size('{name}'::regclass)"
        )))
        .fetch_one(pool)
        .await?;
    let mb = |b: i64| b as f64 / (1024.0 * 1024.0);
    Ok(Bloat {
        dead_rows,
        table_mb: mb(table_bytes),
        indexes_mb: mb(index_bytes),
    })
}

/// A 16-handler worker in `mode` over a fresh table, idle, stamping when
/// each job starts; each job works `work`.
struct Stamped {
    table: JobTable,
    started: Arc<Mutex<HashMap<i64, Instant>>>,
    shutdown: CancellationToken,
    running: tokio::task::JoinHandle<Result<queue_worker::WorkerReport, queue_worker::WorkerError>>,
}

impl Stamped {
    async fn start(pool: &PgPool, mode: ExecutionMode, work: Duration) -> Result<Stamped> {
        let table = fresh_table(pool, "pressure").await?;
        quiet::quiesce(pool).await?;
        let store = PgStore::default_table(pool.clone(), table.store_options().mode(mode)).await?;
        let started = Arc::new(Mutex::new(HashMap::new()));
        let shutdown = CancellationToken::new();
        let worker = Worker::new(
            store,
            Started {
                at: started.clone(),
                open_transaction: mode == ExecutionMode::Transactional,
                work,
            },
            drain_options(16),
        )?;
        let running = tokio::spawn(worker.run(shutdown.clone()));
        tokio::time::sleep(Duration::from_millis(500)).await;
        Ok(Stamped {
            table,
            started,
            shutdown,
            running,
        })
    }

    fn count(&self) -> usize {
        self.started.lock().map(|s| s.len()).unwrap_or(0)
    }

    /// Waits until `n` jobs started (at most 120 s), stops the worker and
    /// returns when each started, from `t0`.
    async fn finish(self, n: usize, t0: Instant) -> Result<HashMap<i64, Duration>> {
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.count() < n {
            ensure!(
                Instant::now() < deadline,
                "{} of {n} offered jobs had not started 120 s after the offer ended",
                n - self.count()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.shutdown.cancel();
        self.running.await??;
        let started = self
            .started
            .lock()
            .map(|s| {
                s.iter()
                    .map(|(id, at)| (*id, at.saturating_duration_since(t0)))
                    .collect()
            })
            .unwrap_or_default();
        Ok(started)
    }
}

/// Offers `rate` jobs a second to a 16-handler worker in `mode` through the
/// three phases of `phases`; the idle session holds its snapshot through
/// the middle one.
async fn offer_through(
    pool: &PgPool,
    url: &str,
    mode: ExecutionMode,
    rate: u32,
    phases: IdlePhases<'_>,
) -> Result<(Timeline, Bloat)> {
    let worker = Stamped::start(pool, mode, Duration::ZERO).await?;
    let table = worker.table.clone();
    let idle_from = phases.clean;
    let idle_to = phases.clean + phases.idle;
    let end = idle_to + phases.after;
    let mut idle_session = None;
    let mut bloat_at_end = None;
    let mut offer = Offerer::new(pool, &table, f64::from(rate));
    let mut ticks = ticks();
    loop {
        ticks.tick().await;
        let now = offer.elapsed();
        if now >= end {
            break;
        }
        if now >= idle_from && now < idle_to && idle_session.is_none() {
            // A session that takes a snapshot and keeps it: vacuum can
            // remove no row that died after it.
            let mut conn = sqlx::PgConnection::connect(url).await?;
            take_a_snapshot(&mut conn).await?;
            idle_session = Some(conn);
        }
        if now >= idle_to {
            if let Some(mut conn) = idle_session.take() {
                bloat_at_end = Some(bloat(pool, &table).await?);
                sqlx::raw_sql("COMMIT").execute(&mut conn).await?;
                conn.close().await?;
            }
        }
        offer.top_up().await?;
    }
    let (t0, offered) = (offer.t0, offer.offered);
    let started = worker.finish(offered.len(), t0).await?;
    let bloat = bloat_at_end.context("the idle session never ended")?;
    Ok((Timeline { offered, started }, bloat))
}

/// The idle-in-transaction scenario at each rate, in both modes.
pub(super) async fn idle_in_transaction(
    pool: &PgPool,
    url: &str,
    phases: IdlePhases<'_>,
    results: &mut Results,
) -> Result<()> {
    for &rate in phases.rates {
        for (mode, name) in MODES {
            let (timeline, bloat) = offer_through(pool, url, mode, rate, phases).await?;
            report_idle(results, name, rate, phases, &timeline, &bloat);
        }
    }
    Ok(())
}

/// The idle-in-transaction figures of one run (`name`: the mode, or the
/// peer), against the targets of issue 32.
fn report_idle(
    results: &mut Results,
    name: &str,
    rate: u32,
    phases: IdlePhases<'_>,
    timeline: &Timeline,
    bloat: &Bloat,
) {
    let (idle_from, idle_to) = (phases.clean, phases.clean + phases.idle);
    let end = idle_to + phases.after;
    // The first seconds hold the worker's start: the clean phase is
    // measured from its second half.
    let clean = percentiles(timeline.pickups(phases.clean / 2, idle_from));
    let idle = percentiles(timeline.pickups(idle_from, idle_to));
    let last = Duration::from_secs(10).min(phases.idle);
    let idle_end = percentiles(timeline.pickups(idle_to - last, idle_to));
    let after = percentiles(timeline.pickups(idle_to, end));
    let completion = timeline.worst_completion(idle_from, idle_to);
    let (worst_p99, worst_at) = timeline.worst_p99(idle_from, idle_to);
    println!(
        "  pressure: idle in transaction, {name}, {rate} jobs/s: pickup p99 (ms) by 10 s: {} | held: {} | after: {}",
        timeline.p99_by_window(Duration::ZERO, idle_from),
        timeline.p99_by_window(idle_from, idle_to),
        timeline.p99_by_window(idle_to, end)
    );
    let what = |w: &str| format!("idle in transaction, {name}, {rate} jobs/s: {w}");
    results.add_against(
        "pressure",
        what("completions, worst 10 s of the idle phase ÷ offered"),
        completion,
        "x",
        format!(
            "a snapshot held {} s; clean phase {:.3}",
            phases.idle.as_secs(),
            timeline.worst_completion(phases.clean / 2, idle_from)
        ),
        (Some(0.99), None),
    );
    results.add_against(
        "pressure",
        what("pickup p99, idle phase ÷ clean"),
        idle.p99 / clean.p99,
        "x",
        format!(
            "clean p50 {:.2} ms, p99 {:.2} ms; idle p50 {:.2} ms, p99 {:.2} ms; its last {} s p50 {:.2} ms, p99 {:.2} ms; worst 10 s p99 {worst_p99:.2} ms, {worst_at:.0} s in",
            clean.p50,
            clean.p99,
            idle.p50,
            idle.p99,
            last.as_secs(),
            idle_end.p50,
            idle_end.p99
        ),
        (None, Some(3.0)),
    );
    let back = timeline.back_within(idle_to, end, 1.5 * clean.p99);
    results.add_against(
        "pressure",
        what("back to the clean pickup p99 (within 1.5×) after the session ended"),
        // Never within the phase after it: infinite, and missed.
        back.unwrap_or(f64::INFINITY),
        "s",
        format!(
            "p50 {:.2} ms, p99 {:.2} ms over the {} s after it",
            after.p50,
            after.p99,
            phases.after.as_secs()
        ),
        (None, Some(60.0)),
    );
    results.add(
        "pressure",
        what("dead rows as the session ended"),
        bloat.dead_rows as f64,
        "rows",
        format!(
            "{} jobs offered; table {:.0} MB, indexes {:.0} MB",
            thousands(timeline.offered.len() as u64),
            bloat.table_mb,
            bloat.indexes_mb
        ),
    );
}

/// awa in the idle-in-transaction scenario at each rate of `phases`, its
/// pressure setup (bench/peers: its best drain's 256 handlers). The peers'
/// program offers the jobs and holds the snapshot as [`offer_through`]
/// does, in awa's own database, and writes when each job was offered and
/// started; the figures are computed here, by the code that computes this
/// queue's.
pub(super) async fn awa_idle_in_transaction(
    peers: &Peers,
    pg: &Postgres,
    phases: IdlePhases<'_>,
    results: &mut Results,
) -> Result<()> {
    for &rate in phases.rates {
        let file = tempfile::NamedTempFile::new()?;
        let secs = |d: Duration| d.as_secs().to_string();
        let args = [
            "--awa-idle".to_owned(),
            rate.to_string(),
            "--clean".to_owned(),
            secs(phases.clean),
            "--idle".to_owned(),
            secs(phases.idle),
            "--after".to_owned(),
            secs(phases.after),
            "--timeline".to_owned(),
            file.path().display().to_string(),
        ];
        peers.run_args(pg, &args).await?;
        let text = std::fs::read_to_string(file.path()).context("awa's timeline")?;
        let (timeline, bloat) = read_timeline(&text)?;
        report_idle(results, "awa", rate, phases, &timeline, &bloat);
    }
    Ok(())
}

/// awa in the overload scenario (bench/peers: the adapter's 16 handlers,
/// each job working `sizes.work`, as this queue's run has): its figures,
/// and the two this queue's are judged by.
pub(super) async fn awa_overload(
    peers: &Peers,
    pg: &Postgres,
    sizes: OverloadSizes,
    results: &mut Results,
) -> Result<()> {
    let args = [
        "--awa-overload".to_owned(),
        sizes.work.as_millis().to_string(),
        "--peak-jobs".to_owned(),
        sizes.peak_jobs.to_string(),
        "--over".to_owned(),
        sizes.over.as_secs().to_string(),
        "--settle".to_owned(),
        sizes.settle.as_secs().to_string(),
    ];
    let rows = super::peers::peer_rows(&peers.run_args(pg, &args).await?)?;
    let figure = |scenario: &str| Ok::<_, anyhow::Error>(peer_row(&rows, "awa", scenario)?.value);
    let (peak, draining) = (
        figure("overload: clean peak")?,
        figure("overload: backlog drain")?,
    );
    let p99 = figure("overload: pickup p99 once the backlog is gone")?;
    for row in &rows {
        results.add(
            "peer",
            format!("awa: {}", row.scenario),
            row.value,
            row.unit,
            row.note.clone(),
        );
    }
    results.add_against(
        "pressure",
        "overload, awa: backlog drain ÷ clean peak",
        draining / peak,
        "x",
        format!("{draining:.0} against {peak:.0} jobs/s (its rows under \"peer\")"),
        (Some(0.9), None),
    );
    results.add_against(
        "pressure",
        "overload, awa: pickup p99 once the backlog is gone",
        p99,
        "ms",
        "",
        (None, Some(5.0)),
    );
    Ok(())
}

/// awa's best steady drain (bench/peers) of `jobs` jobs alone and beside 8
/// readers of its admin figures, in alternating rounds: the ratio this
/// queue's readers scenario is judged by.
pub(super) async fn awa_readers(
    peers: &Peers,
    pg: &Postgres,
    jobs: usize,
    rounds: usize,
    results: &mut Results,
) -> Result<()> {
    let args = [
        "--awa-readers".to_owned(),
        rounds.max(1).to_string(),
        "--jobs".to_owned(),
        jobs.to_string(),
    ];
    let rows = super::peers::peer_rows(&peers.run_args(pg, &args).await?)?;
    let row = |scenario: &str| peer_row(&rows, "awa", scenario);
    let (alone, beside) = (
        row("readers: drain alone")?,
        row("readers: drain beside 8 readers")?,
    );
    results.add_against(
        "pressure",
        "readers: awa drain beside 8 readers ÷ alone",
        beside.value / alone.value,
        "x",
        format!(
            "{:.0} against {:.0} jobs/s ({}); {}",
            beside.value, alone.value, alone.note, beside.note
        ),
        (Some(0.9), None),
    );
    Ok(())
}

/// A peer's timeline as the peers' program writes it: `# dead_rows
/// table_bytes index_bytes`, then a line per job, `offered_us<TAB>
/// started_us` (`-`: never started), the job's id its line's number.
fn read_timeline(text: &str) -> Result<(Timeline, Bloat)> {
    let mut lines = text.lines();
    let head = lines.next().context("an empty timeline")?;
    let sizes: Vec<i64> = head
        .strip_prefix("# ")
        .context("the timeline's first line is not its sizes")?
        .split_whitespace()
        .map(|n| n.parse().with_context(|| format!("bad size in {head:?}")))
        .collect::<Result<_>>()?;
    let [dead_rows, table, indexes] = sizes[..] else {
        anyhow::bail!("the timeline's sizes are not three numbers: {head:?}");
    };
    let mb = |b: i64| b as f64 / (1024.0 * 1024.0);
    let mut timeline = Timeline {
        offered: Vec::new(),
        started: HashMap::new(),
    };
    for (id, line) in (0_i64..).zip(lines) {
        let (offered, started) = line
            .split_once('\t')
            .with_context(|| format!("bad timeline line {line:?}"))?;
        let micros = |t: &str| -> Result<Duration> {
            Ok(Duration::from_micros(
                t.parse().with_context(|| format!("bad time in {line:?}"))?,
            ))
        };
        timeline.offered.push((id, micros(offered)?));
        if started != "-" {
            timeline.started.insert(id, micros(started)?);
        }
    }
    Ok((
        timeline,
        Bloat {
            dead_rows,
            table_mb: mb(table),
            indexes_mb: mb(indexes),
        },
    ))
}

/// How the overload scenario runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OverloadSizes {
    /// How long each job works (sleeps): with 16 handlers, this sets the
    /// drain's peak.
    pub work: Duration,
    /// The backlog whose drain measures the clean peak.
    pub peak_jobs: usize,
    /// How long twice the peak is offered.
    pub over: Duration,
    /// How long pickups are measured once the backlog is gone.
    pub settle: Duration,
}

/// What one overload run measured.
struct Overloaded {
    /// The clean peak, jobs/s.
    peak: f64,
    /// Jobs started per second while twice the peak was offered.
    during: f64,
    /// Jobs waiting as the overload ended.
    backlog: usize,
    /// Jobs started per second from the overload's end until the backlog
    /// was gone, and how long that took.
    draining: f64,
    drained_in: Duration,
    /// Pickups of the jobs offered once the backlog was gone.
    settled: Vec<f64>,
}

/// The rate offered once the overload ends, as a share of the peak: the
/// backlog drains at the rest.
const NORMAL_SHARE: f64 = 0.25;

async fn overload_run(
    pool: &PgPool,
    mode: ExecutionMode,
    sizes: OverloadSizes,
) -> Result<Overloaded> {
    let worker = Stamped::start(pool, mode, sizes.work).await?;
    let table = worker.table.clone();
    // The clean peak: a backlog enqueued at once, drained.
    let began = Instant::now();
    let jobs: Vec<NewJob> = (0..sizes.peak_jobs)
        .map(|i| NewJob::new("noop", serde_json::json!(i)))
        .collect();
    for chunk in jobs.chunks(5_000) {
        table.enqueue_many(pool, chunk).await?;
    }
    while worker.count() < sizes.peak_jobs {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let peak = sizes.peak_jobs as f64 / began.elapsed().as_secs_f64();
    tokio::time::sleep(sizes.work * 4).await;

    let before = worker.count();
    let mut offer = Offerer::new(pool, &table, 2.0 * peak);
    let mut ticks = ticks();
    let started_by = |worker: &Stamped| worker.count() - before;
    while offer.elapsed() < sizes.over {
        ticks.tick().await;
        offer.top_up().await?;
    }
    let over_at = offer.elapsed();
    let started_at_over = started_by(&worker);
    let backlog = offer.offered.len().saturating_sub(started_at_over);
    offer.set_rate(NORMAL_SHARE * peak);
    // Gone once no more wait than the handlers hold.
    let deadline = Instant::now() + sizes.over * 20 + Duration::from_secs(60);
    loop {
        ticks.tick().await;
        offer.top_up().await?;
        if offer.offered.len() <= started_by(&worker) + 16 {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the backlog of {backlog} jobs was not gone {:?} after the overload",
            deadline - over_at.min(sizes.over)
        );
    }
    let gone_at = offer.elapsed();
    let started_at_gone = started_by(&worker);
    while offer.elapsed() < gone_at + sizes.settle {
        ticks.tick().await;
        offer.top_up().await?;
    }
    let (t0, offered) = (offer.t0, offer.offered);
    let started = worker.finish(before + offered.len(), t0).await?;
    let timeline = Timeline { offered, started };
    let drained_in = gone_at - over_at;
    Ok(Overloaded {
        peak,
        during: started_at_over as f64 / over_at.as_secs_f64(),
        backlog,
        draining: (started_at_gone - started_at_over) as f64 / drained_in.as_secs_f64(),
        drained_in,
        settled: timeline.pickups(gone_at, gone_at + sizes.settle),
    })
}

/// Overload in both modes: twice the clean peak offered for a while, then
/// a quarter of it until the backlog is gone, then pickups at that rate.
pub(super) async fn overload(
    pool: &PgPool,
    sizes: OverloadSizes,
    results: &mut Results,
) -> Result<()> {
    for (mode, name) in MODES {
        let run = overload_run(pool, mode, sizes).await?;
        let what = |w: &str| format!("overload, {name}: {w}");
        results.add_against(
            "pressure",
            what("backlog drain ÷ clean peak"),
            run.draining / run.peak,
            "x",
            format!(
                "peak {:.0} jobs/s (16 handlers, {} ms of work each); {:.0} jobs/s while twice the peak was offered for {} s ({:.2}x); a backlog of {} drained at {:.0} jobs/s in {:.1} s, with a quarter of the peak offered",
                run.peak,
                sizes.work.as_millis(),
                run.during,
                sizes.over.as_secs(),
                run.during / run.peak,
                thousands(run.backlog as u64),
                run.draining,
                run.drained_in.as_secs_f64()
            ),
            (Some(0.9), None),
        );
        let settled = percentiles(run.settled.clone());
        results.add_against(
            "pressure",
            what("pickup p99 once the backlog is gone"),
            settled.p99,
            "ms",
            format!(
                "p50 {:.2} ms; {} jobs over {} s at a quarter of the peak",
                settled.p50,
                run.settled.len(),
                sizes.settle.as_secs()
            ),
            (None, Some(5.0)),
        );
    }
    Ok(())
}

/// Readers polling `queue serve`'s operator surfaces: each, every second,
/// the stats and a filtered page of jobs, as a dashboard tab and a monitor
/// would.
pub(super) struct Readers {
    _server: crate::served::Served,
    stop: CancellationToken,
    tasks: tokio::task::JoinSet<Result<Vec<f64>>>,
}

/// What the readers read.
pub(super) struct Read {
    /// Each request's time, ms.
    pub requests: Vec<f64>,
}

/// How many readers poll.
pub(super) const READERS: usize = 8;

impl Readers {
    /// `queue serve` (the release binary) on `table`, and [`READERS`]
    /// readers polling it.
    pub(super) async fn start(url: &str, table: &JobTable) -> Result<Readers> {
        let server = crate::served::serve_table(url, table, "bench-readers.toml")?;
        let client = reqwest::Client::builder().build()?;
        let paths = [
            format!("{}/api/stats", server.base),
            format!("{}/api/jobs?state=failed&kind=noop&limit=50", server.base),
        ];
        // One round first: the server's pool opens, its statements prepare.
        for path in &paths {
            client.get(path).send().await?.error_for_status()?;
        }
        let stop = CancellationToken::new();
        let mut tasks = tokio::task::JoinSet::new();
        for reader in 0..READERS {
            let (client, paths, stop) = (client.clone(), paths.clone(), stop.clone());
            tasks.spawn(async move {
                // Spread over the second, as independent tabs would be.
                let offset = Duration::from_millis(1000 * reader as u64 / READERS as u64);
                tokio::time::sleep(offset).await;
                let mut every = tokio::time::interval(Duration::from_secs(1));
                let mut times = Vec::new();
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return Ok(times),
                        _ = every.tick() => {}
                    }
                    for path in &paths {
                        let began = Instant::now();
                        let response = client.get(path).send().await?;
                        ensure!(
                            response.status().is_success(),
                            "GET {path} answered {}",
                            response.status()
                        );
                        response.bytes().await?;
                        times.push(began.elapsed().as_secs_f64() * 1000.0);
                    }
                }
            });
        }
        Ok(Readers {
            _server: server,
            stop,
            tasks,
        })
    }

    /// Stops the readers and the server.
    pub(super) async fn stop(mut self) -> Result<Read> {
        self.stop.cancel();
        let mut requests = Vec::new();
        while let Some(done) = self.tasks.join_next().await {
            requests.extend(done??);
        }
        Ok(Read { requests })
    }
}

/// A 16-handler drain with [`READERS`] readers polling, against the drain
/// alone, in alternating rounds, in each mode. Lease mode drains `jobs`;
/// transactional mode, about a sixth of lease mode's speed, drains a fifth
/// of them, so that the readers poll about as long beside each.
pub(super) async fn readers_beside_a_drain(
    pool: &PgPool,
    url: &str,
    jobs: usize,
    rounds: usize,
    results: &mut Results,
) -> Result<()> {
    for (mode, name) in MODES {
        let setup = super::drain::StoreSetup {
            mode,
            ..super::drain::LEASE
        };
        let jobs = match mode {
            ExecutionMode::Transactional => (jobs / 5).max(1),
            _ => jobs,
        };
        readers_beside(pool, url, setup, name, jobs, rounds, results).await?;
    }
    Ok(())
}

/// [`readers_beside_a_drain`] in one mode (`setup`, called `name`).
async fn readers_beside(
    pool: &PgPool,
    url: &str,
    setup: super::drain::StoreSetup,
    name: &str,
    jobs: usize,
    rounds: usize,
    results: &mut Results,
) -> Result<()> {
    use super::drain::{drain, drain_beside, Beside};
    let (mut alone, mut beside, mut requests) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds.max(1) {
        alone.push(drain(pool, setup, 16, jobs).await?.jobs_per_second);
        let drained = drain_beside(
            pool,
            setup,
            16,
            jobs,
            Beside {
                readers: Some(url),
                ..Beside::default()
            },
        )
        .await?;
        beside.push(drained.jobs_per_second);
        requests.extend(drained.read.map(|r| r.requests).unwrap_or_default());
    }
    let (alone, beside) = (median(&alone), median(&beside));
    let read = percentiles(requests.clone());
    results.add_against(
        "pressure",
        format!("readers: {name} drain beside 8 readers ÷ alone"),
        beside / alone,
        "x",
        format!(
            "{beside:.0} against {alone:.0} jobs/s (medians of {} alternating rounds of {} jobs); each reader GETs /api/stats and a filtered page every second: {} requests, p50 {:.1} ms, p99 {:.1} ms",
            rounds.max(1),
            thousands(jobs as u64),
            requests.len(),
            read.p50,
            read.p99
        ),
        (Some(0.9), None),
    );
    Ok(())
}

/// Opens a transaction on `conn` and takes a snapshot that it keeps until
/// the transaction ends: vacuum can remove no row that dies meanwhile, and
/// no scan can mark an index entry dead.
pub(super) async fn take_a_snapshot(conn: &mut sqlx::PgConnection) -> Result<()> {
    sqlx::raw_sql("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pg_class")
        .execute(conn)
        .await
        .context("a session taking a snapshot to hold")?;
    Ok(())
}

/// A lease drain of a backlog of `jobs` (16 handlers, then 64), clean and
/// beside a session that holds a snapshot from its start to its end: each
/// claim from the start then walks the entry of every job claimed since,
/// and a drain of a million jobs ran at a quarter of its speed before the
/// cursor measured full claims too (2026-11-29). The 64-handler drain of a
/// million is also the size at which finished jobs heaped up ahead of the
/// batched completer before their number was bounded (about 20,000
/// jobs/s, against 55,000 with the bound).
pub(super) async fn backlog_beside_an_old_snapshot(
    pool: &PgPool,
    jobs: usize,
    results: &mut Results,
) -> Result<()> {
    use super::drain::{drain, drain_beside, Beside, LEASE};
    for handlers in [16, 64] {
        let clean = drain(pool, LEASE, handlers, jobs).await?.jobs_per_second;
        let held = drain_beside(
            pool,
            LEASE,
            handlers,
            jobs,
            Beside {
                old_snapshot: true,
                ..Beside::default()
            },
        )
        .await?
        .jobs_per_second;
        let what = format!(
            "backlog: lease drain of {}, {handlers} handlers",
            thousands(jobs as u64)
        );
        results.add("pressure", &what, clean, "jobs/s", "no other session");
        results.add(
            "pressure",
            format!("{what}, a snapshot held ÷ clean"),
            held / clean,
            "x",
            format!(
                "{held:.0} against {clean:.0} jobs/s; another session held a snapshot from the drain's start to its end"
            ),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peers_timeline_reads_as_offers_starts_and_sizes() {
        let text = "# 1200 2097152 1048576\n1000\t1500\n2000\t-\n3000\t2900\n";
        let (timeline, bloat) = read_timeline(text).expect("a well-formed timeline");
        assert_eq!(bloat.dead_rows, 1200);
        assert!((bloat.table_mb - 2.0).abs() < 1e-9);
        assert!((bloat.indexes_mb - 1.0).abs() < 1e-9);
        assert_eq!(
            timeline.offered,
            vec![
                (0, Duration::from_millis(1)),
                (1, Duration::from_millis(2)),
                (2, Duration::from_millis(3)),
            ]
        );
        // The second job never started; the third started before its
        // offer was stamped, which counts as a pickup of 0 ms.
        let pickups = timeline.pickups(Duration::ZERO, Duration::from_secs(1));
        assert_eq!(pickups[0], 0.5);
        assert!(pickups[1].is_infinite());
        assert_eq!(pickups[2], 0.0);
    }

    #[test]
    fn a_timeline_without_its_sizes_is_refused() {
        let error = read_timeline("1000\t1500\n").err().map(|e| e.to_string());
        assert_eq!(
            error.as_deref(),
            Some("the timeline's first line is not its sizes")
        );
        assert!(read_timeline("# 1 2\n").is_err());
        assert!(read_timeline("# 1 2 3\n1000 1500\n").is_err());
    }
}
