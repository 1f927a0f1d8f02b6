//! Finished jobs partitioned by finish time, so that retention drops
//! whole partitions instead of deleting rows one by one.
//!
//! The layout: the table is partitioned by state, the waiting and running
//! jobs in one partition and each finished state in its own, and those
//! by ranges of finish time. The default table can be created so
//! ([`JobTable::partitioned_by_finish_time`](crate::JobTable::partitioned_by_finish_time));
//! a user's own table laid out the same way (any names) is read the same.
//!
//! - **Retention and purges** ([`drop_finished`]): a partition of time
//!   whose rows all fall inside a purge (its states among the purge's,
//!   its range before the purge's bound) is detached and dropped: a
//!   catalog change, whatever it holds. The rows left (the partition the
//!   bound falls in, the partitions that catch what no range holds) are
//!   deleted row by row as on any table.
//! - **Partitions ahead** ([`keep_ahead`]): for the default table's own
//!   partitions, the next few ranges are made before jobs finish in them.
//!   A job that finishes where no range was made waits in its state's
//!   default partition; the partition made for its range later takes it.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use queue_core::StoreError;
use sqlx::{PgPool, Row};

use crate::error::{store_error, OptionsError};
use crate::ident::{Ident, QualifiedName};
use crate::sql::default_table::{derived_name, finished_partition_name, FINISHED_STATES};
use crate::sql::literal;

/// How wide each partition of finished jobs is, in finish time. Ranges
/// are aligned to the Unix epoch: a day's partition runs from midnight
/// UTC to the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FinishPartitions {
    hours: u32,
}

impl FinishPartitions {
    /// A partition per day (UTC).
    pub const DAILY: FinishPartitions = FinishPartitions { hours: 24 };

    /// The most hours a partition may span: 31 days.
    pub const MAX_HOURS: u32 = 744;

    /// A partition per `hours` hours, from 1 to [`Self::MAX_HOURS`].
    /// Retention drops a partition once its newest possible job is past
    /// the retention age, so narrower partitions keep less beyond it (and
    /// make more tables).
    pub fn hours(hours: u32) -> Result<Self, OptionsError> {
        if hours == 0 || hours > Self::MAX_HOURS {
            return Err(OptionsError::Invalid {
                option: "partitions of finished jobs",
                problem: format!(
                    "a partition spans 1 to {} hours, not {hours}",
                    Self::MAX_HOURS
                ),
            });
        }
        Ok(FinishPartitions { hours })
    }

    /// The span of finish time each partition holds.
    pub fn width(&self) -> Duration {
        Duration::from_secs(u64::from(self.hours) * 3600)
    }

    fn delta(&self) -> TimeDelta {
        TimeDelta::hours(i64::from(self.hours))
    }
}

/// How long a detach or a drop waits for its lock before it gives up for
/// now: finishing jobs of its state wait behind it meanwhile.
const LOCK_TIMEOUT: &str = "50ms";
/// The most partitions one transaction detaches and drops: the parent's
/// finishing jobs wait for it to commit.
const DROP_TOGETHER: usize = 16;
/// How often a partition's detach is tried, one lock timeout each, before
/// its rows are left to be deleted row by row.
const LOCK_TRIES: u32 = 3;
/// The most partitions one [`keep_ahead`] makes per state (a store that
/// was stopped for long catches up over several calls).
const MAKE_AT_MOST: usize = 64;

/// One partition of finished jobs by finish time.
#[derive(Debug, Clone)]
pub(crate) struct TimePartition {
    /// Its name as the catalog prints it (qualified and quoted as needed).
    name: String,
    /// The partition it belongs to (one or more finished states).
    parent: String,
    /// The parent's unqualified name and schema.
    parent_name: String,
    schema: String,
    /// The stored state values its parent holds.
    states: Vec<String>,
    /// Its range; `None` for a default partition (or a range that is open
    /// at either end).
    range: Option<(DateTime<Utc>, DateTime<Utc>)>,
    /// The planner's count of its rows; negative when never analyzed.
    rows: f64,
}

/// The partitions of finished jobs by finish time under `table`: the
/// leaves two levels down whose parent is partitioned by a range of
/// `finished_column` alone. Bounds are printed and read back in the same
/// session, so the time zone and date style do not matter.
const TIME_PARTITIONS: &str = "\
SELECT c.oid::regclass::text AS \"name\", p.oid::regclass::text AS \"parent\", \
       p.relname::text AS \"parent_name\", n.nspname::text AS \"schema\", \
       ARRAY(SELECT replace(m[1], '''''', '''') \
             FROM regexp_matches(pg_get_expr(p.relpartbound, p.oid), '''((?:[^'']|'''')*)''', 'g') AS m) AS \"states\", \
       CAST(b.bounds[1] AS timestamptz) AS \"from\", CAST(b.bounds[2] AS timestamptz) AS \"to\", \
       CAST(c.reltuples AS float8) AS \"rows\" \
FROM pg_catalog.pg_partition_tree(to_regclass($1)) AS t \
JOIN pg_catalog.pg_class AS c ON c.oid = t.relid \
JOIN pg_catalog.pg_class AS p ON p.oid = t.parentrelid \
JOIN pg_catalog.pg_namespace AS n ON n.oid = p.relnamespace \
JOIN pg_catalog.pg_partitioned_table AS pt ON pt.partrelid = p.oid \
CROSS JOIN LATERAL (SELECT regexp_match(pg_get_expr(c.relpartbound, c.oid), \
       '^FOR VALUES FROM \\(''([^'']+)''\\) TO \\(''([^'']+)''\\)$') AS bounds) AS b \
WHERE t.isleaf AND t.level = 2 AND pt.partstrat = 'r' AND pt.partnatts = 1 \
  AND pt.partattrs[0] = (SELECT a.attnum FROM pg_catalog.pg_attribute AS a \
                         WHERE a.attrelid = p.oid AND a.attname = $2) \
ORDER BY p.oid, 6 NULLS FIRST";

/// The partitions of finished jobs by finish time under `table`, oldest
/// first per parent; none for a table not laid out so.
pub(crate) async fn time_partitions(
    conn: &mut sqlx::PgConnection,
    table: &QualifiedName,
    finished_column: &str,
) -> Result<Vec<TimePartition>, StoreError> {
    let context = "reading the partitions of finished jobs";
    let rows = sqlx::query(TIME_PARTITIONS)
        .bind(table.quoted())
        .bind(finished_column)
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| store_error(context, e))?;
    rows.iter()
        .map(|row| {
            let from: Option<DateTime<Utc>> = row.try_get("from")?;
            let to: Option<DateTime<Utc>> = row.try_get("to")?;
            Ok(TimePartition {
                name: row.try_get("name")?,
                parent: row.try_get("parent")?,
                parent_name: row.try_get("parent_name")?,
                schema: row.try_get("schema")?,
                states: row.try_get("states")?,
                range: from.zip(to),
                rows: row.try_get("rows")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(|e| store_error(context, e))
}

/// What [`drop_finished`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Dropped {
    /// Partitions detached and dropped.
    pub partitions: u64,
    /// The jobs they held, by the planner's count of each (kept by
    /// autovacuum); counted exactly for a partition never analyzed.
    pub jobs: u64,
}

/// Detaches and drops every partition of finished jobs under `table`
/// whose jobs all finished in one of `states` (stored values) before
/// `before` and, with `from`, at or after it. A partition whose detach
/// keeps waiting for its lock (a long read of the table holds it) is left
/// for its rows to be deleted one by one.
pub(crate) async fn drop_finished(
    pool: &PgPool,
    table: &QualifiedName,
    finished_column: &str,
    states: &[String],
    from: Option<DateTime<Utc>>,
    before: DateTime<Utc>,
) -> Result<Dropped, StoreError> {
    let mut conn = pool
        .acquire()
        .await
        .map_err(|e| store_error("dropping old partitions", e))?;
    drop_left_detached(&mut conn, table).await?;
    let partitions = time_partitions(&mut conn, table, finished_column).await?;
    let covered: Vec<&TimePartition> = partitions
        .iter()
        .filter(|p| {
            p.range
                .is_some_and(|(start, end)| end <= before && from.is_none_or(|from| start >= from))
                && !p.states.is_empty()
                && p.states.iter().all(|s| states.contains(s))
        })
        .collect();
    let mut dropped = Dropped::default();
    let mut detached = Vec::new();
    // A parent's partitions in few transactions: one commit (a flush of
    // the log) for many detaches, each holding the parent's lock briefly.
    // Every detach first (the jobs are gone with it), then the drops,
    // which free the files and take no lock a finishing job waits for.
    for parent in covered.chunk_by(|a, b| a.parent == b.parent) {
        for batch in parent.chunks(DROP_TOGETHER) {
            if let Some(jobs) = detach_partitions(&mut conn, batch).await? {
                dropped.partitions += batch.len() as u64;
                dropped.jobs += jobs;
                detached.extend(batch.iter().map(|p| p.name.as_str()));
            }
        }
    }
    for batch in detached.chunks(DROP_TOGETHER) {
        if let Err(error) = drop_tables(&mut conn, batch).await {
            tracing::warn!(error = %error.chain(), "dropping detached partitions failed; the next purge drops them");
        }
    }
    Ok(dropped)
}

/// Detaches `batch` (partitions of one parent) in one transaction, marked
/// for the drop that follows; the jobs they held, or `None` when the
/// parent's lock stayed out of reach.
async fn detach_partitions(
    conn: &mut sqlx::PgConnection,
    batch: &[&TimePartition],
) -> Result<Option<u64>, StoreError> {
    let context = "detaching an old partition";
    for attempt in 1..=LOCK_TRIES {
        let mut tx = sqlx::Connection::begin(&mut *conn)
            .await
            .map_err(|e| store_error(context, e))?;
        let detached = async {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"
            )))
            .execute(&mut *tx)
            .await?;
            let mut jobs = 0;
            for partition in batch {
                jobs += if partition.rows >= 0.0 {
                    partition.rows as u64
                } else {
                    let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                        "SELECT count(*) FROM {}",
                        partition.name
                    )))
                    .fetch_one(&mut *tx)
                    .await?;
                    u64::try_from(n).unwrap_or(0)
                };
                // Catalog names: the catalog quotes them as identifiers.
                for statement in [
                    format!(
                        "ALTER TABLE {} DETACH PARTITION {}",
                        partition.parent, partition.name
                    ),
                    format!("COMMENT ON TABLE {} IS '{DETACHED}'", partition.name),
                ] {
                    sqlx::query(sqlx::AssertSqlSafe(statement))
                        .execute(&mut *tx)
                        .await?;
                }
            }
            Ok::<u64, sqlx::Error>(jobs)
        }
        .await;
        match detached {
            Ok(jobs) => {
                tx.commit().await.map_err(|e| store_error(context, e))?;
                for partition in batch {
                    tracing::info!(partition = %partition.name, "old partition of finished jobs detached, to be dropped");
                }
                return Ok(Some(jobs));
            }
            Err(error) if lock_not_available(&error) => {
                tx.rollback().await.map_err(|e| store_error(context, e))?;
                if attempt < LOCK_TRIES {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            Err(error) => return Err(store_error(context, error)),
        }
    }
    tracing::warn!(
        parent = %batch.first().map_or("", |p| p.parent.as_str()),
        partitions = batch.len(),
        "an old partition's lock stayed out of reach; its jobs are deleted one by one instead"
    );
    Ok(None)
}

/// The comment on a partition detached for retention and not dropped yet:
/// a process that died between the two leaves it, and the next
/// [`drop_finished`] drops it.
const DETACHED: &str = "queue: a partition of finished jobs detached for retention; dropped next";

/// Tables detached for retention in `table`'s schema and not dropped (a
/// process died in between).
const LEFT_DETACHED: &str = "SELECT c.oid::regclass::text FROM pg_catalog.pg_class AS c \
     JOIN pg_catalog.pg_description AS d ON d.objoid = c.oid \
     AND d.classoid = 'pg_catalog.pg_class'::regclass AND d.objsubid = 0 \
     WHERE c.relnamespace = (SELECT relnamespace FROM pg_catalog.pg_class WHERE oid = to_regclass($1)) \
     AND c.relkind = 'r' AND NOT c.relispartition AND d.description = $2";

async fn drop_tables(conn: &mut sqlx::PgConnection, names: &[&str]) -> Result<(), StoreError> {
    if names.is_empty() {
        return Ok(());
    }
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP TABLE IF EXISTS {}",
        names.join(", ")
    )))
    .execute(&mut *conn)
    .await
    .map_err(|e| store_error("dropping detached partitions", e))?;
    Ok(())
}

/// Drops what [`drop_finished`] detached and could not drop.
async fn drop_left_detached(
    conn: &mut sqlx::PgConnection,
    table: &QualifiedName,
) -> Result<(), StoreError> {
    let left: Vec<String> = sqlx::query_scalar(LEFT_DETACHED)
        .bind(table.quoted())
        .bind(DETACHED)
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| store_error("reading detached partitions", e))?;
    if !left.is_empty() {
        tracing::info!(tables = ?left, "dropping partitions detached for retention earlier");
    }
    drop_tables(conn, &left.iter().map(String::as_str).collect::<Vec<_>>()).await
}

fn lock_not_available(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db) if db.code().as_deref() == Some("55P03"))
}

/// How far ahead of `now` partitions are made: three widths, and at least
/// six hours, so that a store that checks once an hour never falls behind.
fn ahead(width: TimeDelta) -> TimeDelta {
    (width * 3).max(TimeDelta::hours(6))
}

/// The start of the range of `width` that holds `at`.
fn range_start(at: DateTime<Utc>, width: TimeDelta) -> DateTime<Utc> {
    let width_s = width.num_seconds().max(1);
    let start = at.timestamp().div_euclid(width_s) * width_s;
    DateTime::from_timestamp(start, 0).unwrap_or(at)
}

/// Makes the partitions of the default table `table` (laid out by
/// [`JobTable::partitioned_by_finish_time`](crate::JobTable::partitioned_by_finish_time))
/// that the jobs finishing from the range before `now`'s to a few ranges
/// ahead will land in, for each finished state; `width` is the width of a
/// table without any yet (else the newest one's is kept). Jobs waiting in
/// a state's default partition for a range made now move into it.
/// Returns how many it made.
pub(crate) async fn keep_ahead(
    pool: &PgPool,
    table: &QualifiedName,
    width: Option<FinishPartitions>,
    now: DateTime<Utc>,
) -> Result<usize, StoreError> {
    let context = "making partitions for finished jobs";
    let mut conn = pool.acquire().await.map_err(|e| store_error(context, e))?;
    let partitions = time_partitions(&mut conn, table, "finished_at").await?;
    let mut made = 0;
    for state in FINISHED_STATES {
        let parent_name = finished_partition_name(table, state);
        let own: Vec<&TimePartition> = partitions
            .iter()
            .filter(|p| p.parent_name == parent_name && p.schema == table.schema.as_str())
            .collect();
        // The newest partition's width is kept.
        let newest = own
            .iter()
            .filter_map(|p| p.range)
            .max_by_key(|(_, end)| *end);
        let width = match (newest, width) {
            (Some((start, end)), _) => end - start,
            (None, Some(width)) => width.delta(),
            // Not laid out by this store: nothing to keep.
            (None, None) => continue,
        };
        if width <= TimeDelta::zero() {
            continue;
        }
        // From the range before now's (a job finishing now, on a clock a
        // little behind, finds its partition), every range missing.
        let mut next = range_start(now, width) - width;
        let default = own
            .iter()
            .find(|p| p.range.is_none())
            .map(|p| p.name.clone());
        let mut made_here = 0;
        while next < now + ahead(width) && made_here < MAKE_AT_MOST {
            if !own.iter().any(|p| p.range.is_some_and(|(s, _)| s == next)) {
                make_partition(&mut conn, table, state, default.as_deref(), next, width).await?;
                made_here += 1;
            }
            next += width;
        }
        made += made_here;
    }
    Ok(made)
}

/// The name of `table`'s partition of jobs finished in `state` in the
/// range starting at `start`: `<table>_<state>_p<YYYYMMDD>`, with the hour
/// for ranges narrower than a day.
fn partition_name(
    table: &QualifiedName,
    state: &str,
    start: DateTime<Utc>,
    width: TimeDelta,
) -> String {
    let stamp = if width.num_seconds() % 86_400 == 0 {
        start.format("%Y%m%d")
    } else {
        start.format("%Y%m%d%H")
    };
    derived_name(&table.name, &format!("{state}_p{stamp}"))
}

/// Makes the partition of `parent` for `[start, end)`, moving into it the
/// jobs `default` holds in that range, in one transaction: made apart and
/// attached, so that the state's finishing jobs wait only for the attach
/// (which Postgres runs beside inserts) and the scan of the default
/// partition.
async fn make_partition(
    conn: &mut sqlx::PgConnection,
    table: &QualifiedName,
    state: &str,
    default: Option<&str>,
    start: DateTime<Utc>,
    width: TimeDelta,
) -> Result<(), StoreError> {
    let context = "making a partition for finished jobs";
    let end = start + width;
    let parent = QualifiedName::new(
        table.schema.clone(),
        Ident::new(finished_partition_name(table, state))?,
    );
    let name = QualifiedName::new(
        table.schema.clone(),
        Ident::new(partition_name(table, state, start, width))?,
    )
    .quoted();
    let (from, to) = (literal(&start.to_rfc3339()), literal(&end.to_rfc3339()));
    let parent = parent.quoted();
    let mut statements = vec![
        format!("SET LOCAL lock_timeout = '2s'"),
        format!(
            "CREATE TABLE {name} (LIKE {parent} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING STORAGE)"
        ),
    ];
    if let Some(default) = default {
        statements.push(format!(
            "WITH moved AS (DELETE FROM {default} WHERE \"finished_at\" >= {from} AND \"finished_at\" < {to} RETURNING *) \
             INSERT INTO {name} SELECT * FROM moved"
        ));
    }
    statements.push(format!(
        "ALTER TABLE {parent} ATTACH PARTITION {name} FOR VALUES FROM ({from}) TO ({to})"
    ));
    let mut tx = sqlx::Connection::begin(&mut *conn)
        .await
        .map_err(|e| store_error(context, e))?;
    let made = async {
        for statement in statements {
            sqlx::query(sqlx::AssertSqlSafe(statement))
                .execute(&mut *tx)
                .await?;
        }
        Ok::<(), sqlx::Error>(())
    }
    .await;
    match made {
        Ok(()) => {
            tx.commit().await.map_err(|e| store_error(context, e))?;
            tracing::debug!(partition = %name, "partition for finished jobs made");
            Ok(())
        }
        // Another process made it first (several start and migrate at
        // once): the name taken, or the range.
        Err(error) if made_elsewhere(&error) => {
            tx.rollback().await.map_err(|e| store_error(context, e))?;
            Ok(())
        }
        Err(error) => Err(store_error(context, error)),
    }
}

/// Whether making a partition failed because another process made it:
/// the name exists (42P07; when both created it at once, 23505 or 42710,
/// the row type of the same name, whichever catalog entry collided
/// first), or the range is another partition's (42P17).
fn made_elsewhere(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(db)
        if matches!(db.code().as_deref(), Some("42P07" | "23505" | "42710" | "42P17")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_width_is_whole_hours_up_to_a_month() {
        assert_eq!(FinishPartitions::DAILY.width(), Duration::from_secs(86_400));
        assert_eq!(
            FinishPartitions::hours(6).map(|p| p.width()).ok(),
            Some(Duration::from_secs(6 * 3600))
        );
        for bad in [0, FinishPartitions::MAX_HOURS + 1] {
            let error = FinishPartitions::hours(bad)
                .expect_err("refused")
                .to_string();
            assert!(error.contains("1 to 744 hours"), "{error}");
        }
    }

    #[test]
    fn ranges_start_on_the_epochs_grid() {
        let at = DateTime::parse_from_rfc3339("2026-11-27T13:45:00Z")
            .map(|t| t.with_timezone(&Utc))
            .expect("a time");
        let day = FinishPartitions::DAILY.delta();
        assert_eq!(
            range_start(at, day).to_rfc3339(),
            "2026-11-27T00:00:00+00:00"
        );
        assert_eq!(
            range_start(at, TimeDelta::hours(6)).to_rfc3339(),
            "2026-11-27T12:00:00+00:00"
        );
        let table = QualifiedName::new(
            Ident::new("public").expect("ident"),
            Ident::new("queue_jobs").expect("ident"),
        );
        assert_eq!(
            partition_name(&table, "completed", range_start(at, day), day),
            "queue_jobs_completed_p20261127"
        );
        assert_eq!(
            partition_name(
                &table,
                "failed",
                range_start(at, TimeDelta::hours(6)),
                TimeDelta::hours(6)
            ),
            "queue_jobs_failed_p2026112712"
        );
    }
}
