//! The figures per state and kind, the oldest waiting job and the stalled
//! count: counted whole on a small table, and on a big one counted where
//! it is cheap and estimated where it is not
//! ([`PgStoreOptions::exact_counts_below`](crate::PgStoreOptions::exact_counts_below)).

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use queue_core::{JobState, QueueStats, StateCount, StatsParams, StoreError};
use sqlx::Row;

use super::read::Read;
use super::PgAdmin;
use crate::bind::{query, Value};
use crate::error::store_error;
use crate::record::PgKey;
use crate::sql::stats::{live_sets, LIVE_STATES};
use crate::sql::Param;

/// Counts by stored state and kind, each marked estimated or not.
type Counts = BTreeMap<(String, Option<String>), (u64, bool)>;

/// What one stats read found before the pauses.
struct Figures {
    counts: Counts,
    oldest: Option<DateTime<Utc>>,
    stalled: Option<i64>,
}

impl<K: PgKey> PgAdmin<K> {
    pub(super) async fn fetch_stats(&self, params: StatsParams) -> Result<QueueStats, StoreError> {
        // The clock first: the read's transaction holds a connection.
        self.inner.offset.refresh(&self.inner.pool).await?;
        let context = "counting jobs";
        let mut read = self.begin_read(context).await?;
        let cap = self.inner.options.exact_counts_below;
        let big = if params.exact || cap == 0 {
            None
        } else {
            self.table_rows(&mut read)
                .await?
                .filter(|rows| *rows >= cap)
        };
        let figures = match big {
            None => self.counted(&mut read, params).await?,
            Some(rows) => self.estimated(&mut read, params, rows, cap).await?,
        };
        let paused = self.read_pauses(&mut read).await?;
        self.end_read(read, context).await?;
        let mut counts: Vec<StateCount> = figures
            .counts
            .into_iter()
            .filter(|(_, (count, _))| *count > 0)
            .map(|((stored, kind), (count, estimated))| {
                let counted = StateCount::new(self.state_of(&stored), stored, kind, count);
                if estimated {
                    counted.estimated()
                } else {
                    counted
                }
            })
            .collect();
        // Lifecycle order; values the mapping does not know last, by value.
        counts.sort_by(|a, b| {
            let order = |c: &StateCount| {
                c.state
                    .and_then(|s| JobState::ALL.iter().position(|x| *x == s))
                    .unwrap_or(JobState::ALL.len())
            };
            (order(a), &a.stored_state, &a.kind).cmp(&(order(b), &b.stored_state, &b.kind))
        });
        Ok(QueueStats::new(
            counts,
            figures.oldest,
            figures.stalled.map(|n| u64::try_from(n).unwrap_or(0)),
            // The database's time, which the oldest job's is measured on.
            self.to_db(params.now),
        )
        .with_paused(paused))
    }

    /// The table's rows now (`sql::stats`'s `size`); `None` when the
    /// planner has none (never analyzed, or partitioned).
    async fn table_rows(&self, read: &mut Read) -> Result<Option<u64>, StoreError> {
        let context = "reading the table's size";
        let rows: Option<i64> = sqlx::query(sqlx::AssertSqlSafe(Arc::clone(
            &self.inner.sql.stats.size.text,
        )))
        .fetch_optional(&mut **read)
        .await
        .map_err(|e| self.read_error(context, e))?
        .map(|row| row.try_get("rows"))
        .transpose()
        .map_err(|e| store_error(context, e))?
        .flatten();
        Ok(rows.map(|n| u64::try_from(n).unwrap_or(0)))
    }

    /// Every job counted.
    async fn counted(&self, read: &mut Read, params: StatsParams) -> Result<Figures, StoreError> {
        let context = "counting jobs";
        let rows = sqlx::query(sqlx::AssertSqlSafe(Arc::clone(&self.inner.sql.counts.text)))
            .fetch_all(&mut **read)
            .await
            .map_err(|e| self.read_error(context, e))?;
        let mut counts = Counts::new();
        for row in &rows {
            let key = state_and_kind(row, context)?;
            let count: i64 = row.try_get("count").map_err(|e| store_error(context, e))?;
            counts.insert(key, (u64::try_from(count).unwrap_or(0), false));
        }
        let context = "reading the oldest waiting job";
        let row = query::<K>(&self.inner.sql.waiting, |p| match p {
            Param::Now => Some(Value::Time(self.to_db(params.now))),
            Param::StalledBefore => Some(Value::Time(self.to_db(params.stalled_before))),
            _ => None,
        })?
        .fetch_one(&mut **read)
        .await
        .map_err(|e| self.read_error(context, e))?;
        Ok(Figures {
            counts,
            oldest: row.try_get("oldest").map_err(|e| store_error(context, e))?,
            stalled: row
                .try_get("stalled")
                .map_err(|e| store_error(context, e))?,
        })
    }

    /// Waiting and running jobs counted up to `cap` per set, the rest
    /// estimated from the planner's statistics of a table of `rows`.
    async fn estimated(
        &self,
        read: &mut Read,
        params: StatsParams,
        rows: u64,
        cap: u64,
    ) -> Result<Figures, StoreError> {
        let statements = &self.inner.sql.stats;
        let context = "counting waiting and running jobs";
        let live = query::<K>(&statements.live, |p| match p {
            Param::Now => Some(Value::Time(self.to_db(params.now))),
            Param::Limit => Some(Value::Int(i64::try_from(cap).unwrap_or(i64::MAX - 1) + 1)),
            _ => None,
        })?
        .fetch_all(&mut **read)
        .await
        .map_err(|e| self.read_error(context, e))?;
        let mut counts = Counts::new();
        let mut per_set: BTreeMap<i32, u64> = BTreeMap::new();
        let mut oldest: Option<DateTime<Utc>> = None;
        for row in &live {
            let get = |e| store_error(context, e);
            let set: i32 = row.try_get("set").map_err(get)?;
            let key = state_and_kind(row, context)?;
            let count = u64::try_from(row.try_get::<i64, _>("count").map_err(get)?).unwrap_or(0);
            let since: Option<DateTime<Utc>> = row.try_get("oldest").map_err(get)?;
            *per_set.entry(set).or_default() += count;
            counts.entry(key).or_insert((0, false)).0 += count;
            oldest = match (oldest, since) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        // A set past the cap was not read to its end: its states' counts
        // are lower bounds, raised to the estimate below.
        let full: Vec<i32> = per_set
            .into_iter()
            .filter(|(_, n)| *n > cap)
            .map(|(set, _)| set)
            .collect();
        let capped: Vec<JobState> = LIVE_STATES
            .into_iter()
            .filter(|s| live_sets(*s).iter().any(|set| full.contains(set)))
            .collect();
        let context = "reading the planner's statistics";
        let shares = sqlx::query(sqlx::AssertSqlSafe(Arc::clone(&statements.shares.text)))
            .fetch_all(&mut **read)
            .await
            .map_err(|e| self.read_error(context, e))?;
        let mut estimated_shares: Vec<((String, Option<String>), f64)> = Vec::new();
        for row in &shares {
            let (stored, kind) = state_and_kind(row, context)?;
            let share: f64 = row.try_get("share").map_err(|e| store_error(context, e))?;
            let live_state = self.state_of(&stored).filter(|s| LIVE_STATES.contains(s));
            if live_state.is_some_and(|s| !capped.contains(&s)) {
                // Counted, exactly.
                continue;
            }
            estimated_shares.push(((stored, kind), share));
        }
        // With every waiting and running job counted, the rest of the
        // table's rows are the finished ones: the shares of the last
        // ANALYZE only split them. Shares alone would keep a bulk retry's
        // failed jobs failed until the next ANALYZE.
        let counted: u64 = counts.values().map(|(n, _)| *n).sum();
        let rest = rows.saturating_sub(counted) as f64;
        let estimated_total: f64 = estimated_shares.iter().map(|(_, share)| share).sum();
        let mut estimates = Counts::new();
        for (key, share) in estimated_shares {
            let estimate = if capped.is_empty() && estimated_total > 0.0 {
                share / estimated_total * rest
            } else {
                share * rows as f64
            };
            estimates.insert(key, (estimate.round() as u64, true));
        }
        for (stored, kind) in estimates.keys().filter(|(_, kind)| kind.is_none()) {
            // Per state only: the counts by kind of a capped state become
            // one figure, the larger of what was counted and the estimate.
            let counted: u64 = counts
                .iter()
                .filter(|((s, _), _)| s == stored)
                .map(|(_, (n, _))| *n)
                .sum();
            counts.retain(|(s, _), _| s != stored);
            counts.insert((stored.clone(), kind.clone()), (counted, true));
        }
        for (key, (estimate, _)) in estimates {
            let entry = counts.entry(key).or_insert((0, true));
            entry.0 = entry.0.max(estimate);
            entry.1 = true;
        }
        for ((stored, _), entry) in counts.iter_mut() {
            if self.state_of(stored).is_some_and(|s| capped.contains(&s)) {
                entry.1 = true;
            }
        }
        let context = "counting stalled jobs";
        let stalled: Option<i64> = query::<K>(&statements.stalled, |p| match p {
            Param::StalledBefore => Some(Value::Time(self.to_db(params.stalled_before))),
            _ => None,
        })?
        .fetch_one(&mut **read)
        .await
        .map_err(|e| self.read_error(context, e))?
        .try_get("stalled")
        .map_err(|e| store_error(context, e))?;
        Ok(Figures {
            counts,
            oldest,
            stalled,
        })
    }
}

/// A figures row's stored state and kind.
fn state_and_kind(
    row: &sqlx::postgres::PgRow,
    context: &str,
) -> Result<(String, Option<String>), StoreError> {
    let get = |e| store_error(context, e);
    Ok((
        row.try_get("state").map_err(get)?,
        row.try_get("kind").map_err(get)?,
    ))
}
