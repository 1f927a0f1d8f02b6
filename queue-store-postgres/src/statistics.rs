//! Keeping the claim's plan honest. Postgres plans a claim from the table's
//! statistics. Without them (jobs enqueued into a fresh table before
//! autovacuum first analyzed it), or with statistics taken when the table
//! looked nothing like it does now (every job then waiting for its time),
//! it estimates the jobs ready now at a handful, and sorts every one of them
//! for each claim instead of reading the claim index in order: measured 50-70
//! ms a claim with 100,000 jobs ready, against about 1 ms.
//!
//! So the store analyzes the table at start-up when the state column has no
//! statistics and the table has rows, and again (at most once a minute, in
//! the background) once claims take longer than [`SLOW_CLAIM`]: at least
//! [`SLOW_OF_RECENT`] of the last [`RECENT_CLAIMS`] that took jobs. Claims
//! planned from statistics that do not describe the table are slow one
//! after another; a lone slow claim is a busy machine, which an `ANALYZE`
//! (a second of a core on a table of millions) would only make busier.
//! `ANALYZE` samples at most 30,000 rows (3,000 at start-up, enough for the
//! plan: [`START_STATISTICS_TARGET`]) and takes no lock that claims,
//! completions or enqueues wait for. In the background it skips the table
//! rather than wait for the lock that a vacuum or a concurrent index build
//! holds ([`catalog::analyze_skipping_locked`]: waiting could fail the
//! build as a deadlock); at start-up it waits for it up to two seconds
//! ([`START_LOCK_TIMEOUT`]), long enough for Postgres to cancel an
//! autovacuum that holds it.
//!
//! A table that grows from (nearly) empty is analyzed as it grows, too:
//! once this store has claimed as many jobs as the table held at start-up
//! (at least [`GROWTH_FLOOR`]), and again each time it has claimed twice as
//! many as at the last such analysis. Each connection caches its plans; one
//! made while the table held a few pages reads the whole table (a job
//! transaction's lock and completion by key, measured at 14-36 ms each at
//! 20,000 rows; claims at 5-12 ms), and stays cached until an analysis
//! changes the table's size in the catalog, which autovacuum does only at
//! its next round (a minute apart by default). An idle worker's claim
//! planned on a table analyzed empty reads every row version: its wake-up
//! grew by about 0.1 ms a hundred jobs; the floor is low enough that the
//! first analysis comes about when the claim's plan would turn to the claim
//! index, and each analysis costs the claims that come next a fresh plan on
//! each connection.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use queue_core::StoreError;
use sqlx::PgPool;

use crate::error::store_error;
use crate::ident::QualifiedName;
use crate::options::{Column, PgStoreOptions};
use crate::sql::catalog;
use crate::stash::OnLiveConnection;

/// A claim slower than this counts towards fresh statistics.
pub(crate) const SLOW_CLAIM: Duration = Duration::from_millis(20);
/// The claims that took jobs whose times are remembered (one bit each).
const RECENT_CLAIMS: u32 = 16;
/// Of the last [`RECENT_CLAIMS`], this many slow ones ask for fresh
/// statistics. Beside a purge, a dev server's 16-handler drain of a table
/// of three million rows had a claim over 20 ms now and then, and each new
/// store then analyzed the table (an `ANALYZE` ran in 8 % of the samples of
/// the server's activity); with a plan that sorts every ready job, every
/// claim is slow.
const SLOW_OF_RECENT: u32 = 8;
/// At most one `ANALYZE` a store asks for in this long.
const AT_MOST_EVERY: Duration = Duration::from_secs(60);
/// The fewest claims after which a growing table is analyzed again. Past
/// about 200 rows (row versions of claimed and finished jobs included),
/// Postgres plans the claim of the default table on the claim index rather
/// than reading the table and sorting it.
pub(crate) const GROWTH_FLOOR: u64 = 200;
/// At most one analysis for growth in this long.
const GROWTH_AT_MOST_EVERY: Duration = Duration::from_secs(2);
/// How long the start-up analysis's small sample stands before a full one
/// replaces it, unless growth or slow claims had one made sooner.
const FULL_SAMPLE_AFTER: Duration = Duration::from_secs(60);

/// When the store last asked for the table to be analyzed.
#[derive(Debug)]
pub(crate) struct Statistics {
    pool: PgPool,
    analyze: Arc<str>,
    /// The last [`RECENT_CLAIMS`] claims, newest in the lowest bit: 1 for a
    /// slow one.
    recent: AtomicU32,
    last: Mutex<Option<Instant>>,
    growth: Mutex<Growth>,
    /// Whether the table's statistics are still the start-up analysis's
    /// small sample ([`START_STATISTICS_TARGET`]).
    small_sample: Arc<AtomicBool>,
}

/// The claims since the last analysis for growth, and how many call for the
/// next.
#[derive(Debug)]
struct Growth {
    claimed: u64,
    next_at: u64,
    last: Option<Instant>,
}

impl Growth {
    fn new(rows: u64) -> Self {
        Growth {
            claimed: 0,
            next_at: rows.max(GROWTH_FLOOR),
            last: None,
        }
    }

    /// Counts `n` claimed jobs; whether the table is due an analysis now
    /// (if so, the count starts again, towards twice as many).
    fn claimed(&mut self, n: u64, now: Instant) -> bool {
        self.claimed += n;
        let rested = self
            .last
            .is_none_or(|at| now.duration_since(at) >= GROWTH_AT_MOST_EVERY);
        if self.claimed < self.next_at || !rested {
            return false;
        }
        self.claimed = 0;
        self.next_at = self.next_at.saturating_mul(2);
        self.last = Some(now);
        true
    }
}

/// The columns the store's and the admin's analyses refresh (quoted
/// names): those a claim's plan reads (the default order's, and the
/// conditions every claim has: paused and limited kinds too), the rest of
/// the table being autovacuum's. A custom order's columns are the user's to
/// keep analyzed. State and kind together also refresh their extended
/// statistics, which the figures of a big table are estimated from (an
/// `ANALYZE` that left one of them out could not, and says so in a
/// warning). Leaving out the payload and the other wide columns takes a
/// third off an `ANALYZE` of 3,000,000 rows (260 against 410 ms), most of
/// the rest being the reading of its sample.
pub(crate) fn analyzed_columns(options: &PgStoreOptions, absent: &[Column]) -> Vec<String> {
    [
        Column::State,
        Column::Kind,
        Column::ProcessAfter,
        Column::Priority,
        Column::ExpiresAt,
    ]
    .into_iter()
    .filter(|c| !absent.contains(c))
    .filter_map(|c| options.column_name(c))
    .map(|name| name.quoted())
    .collect()
}

impl Statistics {
    /// Analyzes the table now if its state column has no statistics and it
    /// has rows. On a partitioned table, its `live` partitions (those
    /// holding the waiting and running jobs, which claims read) stand for
    /// it: an `ANALYZE` of a partitioned table samples every partition,
    /// however much history they hold, and Postgres plans a claim with the
    /// statistics of the partitions it reads.
    pub(crate) async fn at_start(
        pool: &PgPool,
        options: &PgStoreOptions,
        absent: &[Column],
        live: &[QualifiedName],
    ) -> Result<Statistics, StoreError> {
        let state = options
            .column_name(Column::State)
            .map(|c| c.as_str().to_owned())
            .unwrap_or_else(|| "state".into());
        let tables = if live.is_empty() {
            std::slice::from_ref(&options.table)
        } else {
            live
        };
        let (has_statistics, has_rows, estimate) = read_statistics(pool, tables, &state).await?;
        let table = &options.table;
        let columns = analyzed_columns(options, absent);
        let targets: Vec<String> = tables
            .iter()
            .map(|table| catalog::analyze_target(table, &columns))
            .collect();
        let statistics = Statistics {
            pool: pool.clone(),
            analyze: catalog::analyze_skipping_locked(&targets).into(),
            recent: AtomicU32::new(0),
            last: Mutex::new(None),
            growth: Mutex::new(Growth::new(estimate)),
            small_sample: Arc::new(AtomicBool::new(false)),
        };
        if !has_statistics && has_rows {
            tracing::info!(
                %table,
                "the table has jobs but no statistics yet: analyzing it, so that claims read the claim index in order"
            );
            statistics.mark();
            match analyze_at_start(pool, &format!("ANALYZE {}", targets.join(", "))).await {
                // The growth counts from the rows just analyzed: the table
                // held them before the store started, so the claims that
                // take them do not grow it. (Counted from the estimate
                // without statistics, nothing, every cold drain analyzed
                // the table again after 1,000 claims, and a drain of
                // 100,000 jobs twice: 50-200 ms of a core each.)
                Ok(()) => {
                    let (_, _, analyzed) = read_statistics(pool, tables, &state).await?;
                    *statistics.growth.lock().unwrap_or_else(|e| e.into_inner()) =
                        Growth::new(analyzed);
                    statistics.replace_the_small_sample_later();
                }
                Err(StoreError::Conflict { .. }) => {
                    tracing::info!(
                        %table,
                        "the table's lock is held (an index build or a long vacuum): it is analyzed once claims are slow"
                    );
                    *statistics.last.lock().unwrap_or_else(|e| e.into_inner()) = None;
                }
                Err(error) => return Err(error),
            }
        }
        Ok(statistics)
    }

    /// Notes that a claim that took jobs took `elapsed`: once
    /// [`SLOW_OF_RECENT`] of the last [`RECENT_CLAIMS`] were slow, analyzes
    /// the table in the background (at most once a minute), and starts
    /// counting afresh.
    pub(crate) fn claim_took(&self, elapsed: Duration) {
        let slow = elapsed >= SLOW_CLAIM;
        let recent = |bits: u32| ((bits << 1) | u32::from(slow)) & ((1 << RECENT_CLAIMS) - 1);
        let before = self
            .recent
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some(recent(bits))
            })
            .unwrap_or_else(|bits| bits);
        if !slow || recent(before).count_ones() < SLOW_OF_RECENT || !self.mark() {
            return;
        }
        self.recent.store(0, Ordering::Relaxed);
        tracing::debug!(?elapsed, "claims are slow: analyzing the table");
        self.analyze_in_background("after slow claims");
    }

    /// Counts `n` jobs claimed: once the table has grown by as many as it
    /// held (see the module's text), analyzes it in the background.
    pub(crate) fn claimed(&self, n: usize) {
        let due = self
            .growth
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .claimed(n as u64, Instant::now());
        if !due {
            return;
        }
        tracing::debug!("the table grew: analyzing it");
        self.analyze_in_background("as it grew");
    }

    /// Analyzes the table in the background, with the full sample.
    fn analyze_in_background(&self, why: &'static str) {
        self.small_sample.store(false, Ordering::Relaxed);
        let (pool, analyze_table) = (self.pool.clone(), Arc::clone(&self.analyze));
        tokio::spawn(async move {
            if let Err(error) = analyze(&pool, &analyze_table).await {
                tracing::debug!(%error, "analyzing the table {why} failed");
            }
        });
    }

    /// After the start-up analysis: a full one in [`FULL_SAMPLE_AFTER`],
    /// unless another was made by then or the store is gone. The figures
    /// estimate finished jobs per kind and state from the statistics, which
    /// a sample of 3,000 rows keeps ten pairs of; the wait keeps the full
    /// sample's CPU out of the drain that usually follows a start.
    fn replace_the_small_sample_later(&self) {
        self.small_sample.store(true, Ordering::Relaxed);
        let small_sample = Arc::downgrade(&self.small_sample);
        let (pool, analyze_table) = (self.pool.clone(), Arc::clone(&self.analyze));
        tokio::spawn(async move {
            tokio::time::sleep(FULL_SAMPLE_AFTER).await;
            if !small_sample_stands(&small_sample) || pool.is_closed() {
                return;
            }
            if let Err(error) = analyze(&pool, &analyze_table).await {
                tracing::debug!(%error, "analyzing the table with the full sample failed");
            }
        });
    }

    /// Records an analysis now, unless one was made within a minute;
    /// whether it was recorded.
    fn mark(&self) -> bool {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if last.is_some_and(|at| now.duration_since(at) < AT_MOST_EVERY) {
            return false;
        }
        *last = Some(now);
        true
    }
}

/// Whether the `state` column of `tables` has statistics, whether any of
/// them has rows, and the rows the catalog estimates they hold in all (0
/// for a table never analyzed).
async fn read_statistics(
    pool: &PgPool,
    tables: &[QualifiedName],
    state: &str,
) -> Result<(bool, bool, u64), StoreError> {
    let (mut has_statistics, mut has_rows, mut estimate) = (true, false, 0u64);
    for table in tables {
        let (statistics, rows, estimated): (bool, bool, Option<i64>) =
            sqlx::query_as(sqlx::AssertSqlSafe(catalog::statistics_present(table)))
                .bind(table.schema.as_str())
                .bind(table.name.as_str())
                .bind(state)
                .fetch_one(pool)
                .await
                .map_err(|e| store_error("reading the table's statistics", e))?;
        has_statistics &= statistics;
        has_rows |= rows;
        estimate += estimated.and_then(|e| u64::try_from(e).ok()).unwrap_or(0);
    }
    Ok((has_statistics, has_rows, estimate))
}

/// Whether the start-up analysis's small sample still stands and its store
/// is still there, taking it (true once): what the full analysis that
/// replaces it checks when its time comes.
fn small_sample_stands(flag: &std::sync::Weak<AtomicBool>) -> bool {
    flag.upgrade()
        .is_some_and(|flag| flag.swap(false, Ordering::Relaxed))
}

/// How long the start-up `ANALYZE` waits for the table's lock. Postgres
/// cancels an autovacuum that holds it once a waiter has waited
/// `deadlock_timeout` (1 s by default), so the analysis goes ahead; a
/// concurrent index build holds it for as long as it builds, and in its
/// last phase waits for this transaction in turn: at twice the default
/// `deadlock_timeout`, this wait ends first (or Postgres, finding the
/// cycle when it looks at 1 s, fails this one), so the build never fails.
const START_LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '2s'";

/// The start-up `ANALYZE` samples a tenth of the rows the default target
/// would (3,000): it is there to give claims their plan, for which knowing
/// that most rows wait is enough, and it sits between the store's
/// construction and its first claim. On the dev server it took 4.6 against
/// 25 ms at 20,000 rows and 7 against 48 ms at 100,000, with the same
/// claim plan. Columns with a target of their own keep it; the next
/// analysis (autovacuum's, or the store's for growth or slow claims) takes
/// the full sample.
const START_STATISTICS_TARGET: &str = "SET LOCAL default_statistics_target = 10";

/// The start-up `statement` (a plain `ANALYZE`, of a small sample:
/// [`START_STATISTICS_TARGET`]): on a table without statistics every claim
/// may be planned badly, so it waits, a little, for the table's lock
/// ([`START_LOCK_TIMEOUT`]); one that did not come is a
/// [`StoreError::Conflict`].
async fn analyze_at_start(pool: &PgPool, statement: &str) -> Result<(), StoreError> {
    let context = "analyzing the table at start-up";
    let mut tries = OnLiveConnection::new(pool, context);
    loop {
        let mut conn = tries.connection().await?;
        let done = async {
            let mut tx = sqlx::Connection::begin(&mut *conn).await?;
            sqlx::query(START_LOCK_TIMEOUT).execute(&mut *tx).await?;
            sqlx::query(START_STATISTICS_TARGET)
                .execute(&mut *tx)
                .await?;
            sqlx::query(sqlx::AssertSqlSafe(statement.to_owned()))
                .execute(&mut *tx)
                .await?;
            tx.commit().await
        }
        .await
        .map_err(|e| store_error(context, e));
        if let Some(done) = tries.settle(conn, done) {
            return done;
        }
    }
}

/// Runs `ANALYZE` on a live connection: under faults that kill backends,
/// a dead idle connection is closed quietly and the statement runs on
/// another, rather than failing and going back to the pool dead (where
/// sqlx's own ping warns about it).
async fn analyze(pool: &PgPool, statement: &Arc<str>) -> Result<(), StoreError> {
    let context = "analyzing the table";
    let mut tries = OnLiveConnection::new(pool, context);
    loop {
        let mut conn = tries.connection().await?;
        let done = sqlx::query(sqlx::AssertSqlSafe(Arc::clone(statement)))
            .execute(&mut *conn)
            .await
            .map(drop)
            .map_err(|e| store_error(context, e));
        if let Some(done) = tries.settle(conn, done) {
            return done;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Statistics that analyze nothing (a pool that never connects): what
    /// `claim_took` decides shows in when it marks an analysis.
    fn statistics() -> Statistics {
        Statistics {
            pool: sqlx::postgres::PgPoolOptions::new()
                .connect_lazy("postgres://nowhere.invalid/none")
                .expect("a lazy pool"),
            analyze: "ANALYZE nothing".into(),
            recent: AtomicU32::new(0),
            last: Mutex::new(None),
            growth: Mutex::new(Growth::new(0)),
            small_sample: Arc::new(AtomicBool::new(false)),
        }
    }

    fn marked(statistics: &Statistics) -> bool {
        statistics
            .last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    #[tokio::test]
    async fn slow_claims_one_after_another_ask_for_an_analysis_and_a_lone_one_does_not() {
        let (fast, slow) = (Duration::from_millis(1), SLOW_CLAIM);
        let busy = statistics();
        for _ in 0..100 {
            for _ in 0..(RECENT_CLAIMS / SLOW_OF_RECENT * 2) {
                busy.claim_took(fast);
            }
            busy.claim_took(slow);
        }
        assert!(
            !marked(&busy),
            "a slow claim among fast ones (a busy machine) is no reason"
        );

        let stale = statistics();
        for n in 1..SLOW_OF_RECENT {
            stale.claim_took(slow);
            assert!(!marked(&stale), "{n} slow claims");
        }
        stale.claim_took(slow);
        assert!(marked(&stale), "{SLOW_OF_RECENT} slow claims in a row");
        assert_eq!(
            stale.recent.load(Ordering::Relaxed),
            0,
            "the count starts afresh"
        );

        let mixed = statistics();
        for _ in 0..SLOW_OF_RECENT {
            mixed.claim_took(slow);
            mixed.claim_took(fast);
        }
        assert!(
            marked(&mixed),
            "half of the last {RECENT_CLAIMS} claims slow"
        );
    }

    #[test]
    fn the_small_sample_is_replaced_once_and_only_while_its_store_lives() {
        let flag = Arc::new(AtomicBool::new(true));
        let weak = Arc::downgrade(&flag);
        assert!(small_sample_stands(&weak), "set, and the store lives");
        assert!(!small_sample_stands(&weak), "replaced once, not twice");
        flag.store(true, Ordering::Relaxed);
        drop(flag);
        assert!(!small_sample_stands(&weak), "the store is gone");
    }

    #[tokio::test(start_paused = true)]
    async fn the_full_analysis_comes_a_minute_after_start_unless_another_came_first() {
        let waiting = statistics();
        waiting.replace_the_small_sample_later();
        tokio::time::sleep(FULL_SAMPLE_AFTER - Duration::from_secs(1)).await;
        assert!(
            waiting.small_sample.load(Ordering::Relaxed),
            "within the minute the small sample stands"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            !waiting.small_sample.load(Ordering::Relaxed),
            "after it, the full analysis took it"
        );

        // An analysis for growth (or slow claims) replaces the sample first.
        let grown = statistics();
        grown.replace_the_small_sample_later();
        grown.analyze_in_background("as it grew");
        assert!(!grown.small_sample.load(Ordering::Relaxed));
    }

    #[test]
    fn a_growing_table_is_analyzed_each_time_the_claims_double() {
        let t = Instant::now();
        let mut growth = Growth::new(0);
        assert!(!growth.claimed(199, t), "fewer than the floor");
        assert!(growth.claimed(1, t), "200 claimed into an empty table");
        assert!(!growth.claimed(399, t + Duration::from_secs(10)));
        assert!(
            !growth.claimed(1, t + Duration::from_secs(1)),
            "400 more, but within {GROWTH_AT_MOST_EVERY:?} of the last"
        );
        assert!(growth.claimed(0, t + Duration::from_secs(3)), "then");
        assert!(!growth.claimed(799, t + Duration::from_secs(60)));
        assert!(growth.claimed(1, t + Duration::from_secs(60)), "800");

        let mut big = Growth::new(5_000_000);
        assert!(
            !big.claimed(4_999_999, t),
            "a table of 5 M rows: analyzed after 5 M claims"
        );
        assert!(big.claimed(1, t));
    }
}
