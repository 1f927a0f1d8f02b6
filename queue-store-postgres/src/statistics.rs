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
//! the background) after a claim that took longer than [`SLOW_CLAIM`]:
//! such a claim has almost always been planned from statistics that do not
//! describe the table. `ANALYZE` samples at most 30,000 rows and takes no
//! lock that claims, completions or enqueues wait for.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use queue_core::StoreError;
use sqlx::PgPool;

use crate::error::store_error;
use crate::ident::QualifiedName;
use crate::options::{Column, PgStoreOptions};
use crate::sql::catalog;
use crate::stash::OnLiveConnection;

/// A claim slower than this asks for fresh statistics.
pub(crate) const SLOW_CLAIM: Duration = Duration::from_millis(20);
/// At most one `ANALYZE` a store asks for in this long.
const AT_MOST_EVERY: Duration = Duration::from_secs(60);

/// When the store last asked for the table to be analyzed.
#[derive(Debug)]
pub(crate) struct Statistics {
    pool: PgPool,
    analyze: Arc<str>,
    last: Mutex<Option<Instant>>,
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
        let (mut has_statistics, mut has_rows) = (true, false);
        for table in tables {
            let (statistics, rows): (bool, bool) =
                sqlx::query_as(sqlx::AssertSqlSafe(catalog::statistics_present(table)))
                    .bind(table.schema.as_str())
                    .bind(table.name.as_str())
                    .bind(&state)
                    .fetch_one(pool)
                    .await
                    .map_err(|e| store_error("reading the table's statistics", e))?;
            has_statistics &= statistics;
            has_rows |= rows;
        }
        let table = &options.table;
        // The columns a claim's plan reads (the default order's, and the
        // conditions every claim has: paused and limited kinds too); a
        // custom order's columns are the user's to keep analyzed. State and
        // kind together also refresh their extended statistics, which the
        // figures of a big table are estimated from (an ANALYZE that left
        // one of them out could not, and says so in a warning).
        let columns: Vec<String> = [
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
        .collect();
        let statistics = Statistics {
            pool: pool.clone(),
            analyze: format!(
                "ANALYZE {}",
                tables
                    .iter()
                    .map(|table| catalog::analyze_target(table, &columns))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
            .into(),
            last: Mutex::new(None),
        };
        if !has_statistics && has_rows {
            tracing::info!(
                %table,
                "the table has jobs but no statistics yet: analyzing it, so that claims read the claim index in order"
            );
            statistics.mark();
            analyze(pool, &statistics.analyze).await?;
        }
        Ok(statistics)
    }

    /// Notes that a claim took `elapsed`: after a slow one, analyzes the
    /// table in the background (at most once a minute).
    pub(crate) fn claim_took(&self, elapsed: Duration) {
        if elapsed < SLOW_CLAIM || !self.mark() {
            return;
        }
        let (pool, analyze_table) = (self.pool.clone(), Arc::clone(&self.analyze));
        tokio::spawn(async move {
            tracing::debug!(?elapsed, "a slow claim: analyzing the table");
            if let Err(error) = analyze(&pool, &analyze_table).await {
                tracing::debug!(%error, "analyzing the table after a slow claim failed");
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
