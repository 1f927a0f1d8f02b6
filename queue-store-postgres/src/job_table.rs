//! [`JobTable`]: the default jobs table — migrate it, enqueue into it.

use std::sync::Arc;
use std::time::Duration;

use queue_core::{Enqueued, NewJob, StoreError};
use sqlx::PgPool;

use crate::enqueue::enqueue_on;
use crate::error::{store_error, OptionsError};
use crate::ident::{Ident, QualifiedName};
use crate::migrate::{LockWait, Migration};
use crate::options::PgStoreOptions;
use crate::partitions::FinishPartitions;
use crate::sql::default_table::Layout;
use crate::sql::enqueue::EnqueueStatements;

/// Where an enqueue of [`JobTable`] runs: on a connection of the pool, or
/// on the caller's connection, inside whatever transaction it has open.
/// Made from `&PgPool`, `&mut PgConnection` (`&mut *tx` for a
/// transaction), `&mut Transaction` and `&mut PoolConnection`.
#[derive(Debug)]
pub enum ConnectionOrPool<'a> {
    /// A connection taken from the pool for the call.
    Pool(&'a PgPool),
    /// The caller's connection.
    Connection(&'a mut sqlx::PgConnection),
}

impl<'a> From<&'a PgPool> for ConnectionOrPool<'a> {
    fn from(pool: &'a PgPool) -> Self {
        ConnectionOrPool::Pool(pool)
    }
}

impl<'a> From<&'a mut sqlx::PgConnection> for ConnectionOrPool<'a> {
    fn from(conn: &'a mut sqlx::PgConnection) -> Self {
        ConnectionOrPool::Connection(conn)
    }
}

impl<'a, 't> From<&'a mut sqlx::Transaction<'t, sqlx::Postgres>> for ConnectionOrPool<'a> {
    fn from(tx: &'a mut sqlx::Transaction<'t, sqlx::Postgres>) -> Self {
        ConnectionOrPool::Connection(tx)
    }
}

impl<'a> From<&'a mut sqlx::pool::PoolConnection<sqlx::Postgres>> for ConnectionOrPool<'a> {
    fn from(conn: &'a mut sqlx::pool::PoolConnection<sqlx::Postgres>) -> Self {
        ConnectionOrPool::Connection(conn)
    }
}

/// The default jobs table: the spec's columns plus `kind`, `payload`
/// (jsonb), `priority` and `claim_token`.
///
/// Enqueue works on the pool or on any sqlx connection, so a job can be
/// enqueued inside the caller's own transaction and becomes visible (and
/// wakes workers) only when that commits. It runs the same statements,
/// and keeps unique keys by the same rule, as
/// [`PgAdmin::enqueue`](queue_core::Admin::enqueue) on the same table.
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use queue_core::NewJob;
/// use queue_store_postgres::JobTable;
///
/// let jobs = JobTable::default();
/// let mut tx = pool.begin().await?;
/// // ... the application's own writes on `tx` ...
/// jobs.enqueue(&mut *tx, &NewJob::new("welcome_email", serde_json::json!({"user": 42}))).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct JobTable {
    table: QualifiedName,
    /// The enqueue statements, built once.
    enqueue: Arc<EnqueueStatements>,
    /// The channel the table's trigger notifies.
    channel: Arc<str>,
    /// Whether a table created by [`JobTable::migrate`] is partitioned.
    partitions: Option<FinishPartitions>,
    /// Whether [`JobTable::migrate`] makes the table's claims in place.
    in_place_claims: bool,
    /// How [`JobTable::migrate`] waits for its locks on a table in use.
    lock_wait: LockWait,
}

impl Default for JobTable {
    /// `public.queue_jobs`.
    fn default() -> Self {
        JobTable::from_name(QualifiedName::new(
            Ident::new("public").unwrap_or_else(|_| unreachable_ident()),
            Ident::new("queue_jobs").unwrap_or_else(|_| unreachable_ident()),
        ))
    }
}

/// Only reached if a constant name were invalid; it is not.
fn unreachable_ident() -> Ident {
    Ident::new("queue_jobs").unwrap_or_else(|e| panic!("constant identifier rejected: {e}"))
}

impl JobTable {
    /// The default table layout at `schema.table`.
    pub fn new(schema: &str, table: &str) -> Result<Self, OptionsError> {
        Ok(JobTable::from_name(QualifiedName::new(
            Ident::new(schema)?,
            Ident::new(table)?,
        )))
    }

    fn from_name(table: QualifiedName) -> Self {
        JobTable {
            enqueue: Arc::new(EnqueueStatements::default_table(&table, false)),
            channel: crate::options::default_channel(&table.name).into(),
            table,
            partitions: None,
            in_place_claims: false,
            lock_wait: LockWait::default(),
        }
    }

    /// Creates the table partitioned: by state, the waiting and running
    /// jobs apart from the finished ones, and those by finish time in
    /// partitions `partitions` wide. Retention and purges then drop whole
    /// partitions (ten million finished jobs go in well under a second,
    /// where deleting them takes minutes), and claims read only the live
    /// partition however much history the table keeps.
    ///
    /// It matters when [`JobTable::migrate`] creates the table; a table
    /// that exists unpartitioned is refused, not converted. What differs
    /// from the plain table:
    ///
    /// - A unique key is held while its job waits or runs, never for ever
    ///   (`UniqueScope::Forever` is refused): Postgres keeps an index
    ///   unique only within a partition.
    /// - Keys are unique because they come from one sequence, not by a
    ///   primary key (a partitioned table's would have to hold the state
    ///   and the finish time).
    /// - A completion moves the job's row to another partition (a delete
    ///   and an insert where the plain table updates it in place).
    /// - The store makes the next partitions as time goes on (at start-up
    ///   and from the resetter's pass, at most once an hour); a job that
    ///   finishes where none was made waits in its state's default
    ///   partition until one is.
    ///
    /// ```no_run
    /// # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
    /// use queue_store_postgres::{FinishPartitions, JobTable};
    ///
    /// let jobs = JobTable::new("public", "queue_jobs")?
    ///     .partitioned_by_finish_time(FinishPartitions::DAILY);
    /// jobs.migrate(&pool).await?;
    /// # Ok(()) }
    /// ```
    pub fn partitioned_by_finish_time(mut self, partitions: FinishPartitions) -> Self {
        self.partitions = Some(partitions);
        self
    }

    /// How long [`JobTable::migrate`] waits for its locks on a table in
    /// use: at most `per_try` at a time (its transaction then rolled back
    /// and, after as long a pause, tried again), and `give_up_after` in
    /// all, after which it fails with an error naming the sessions that
    /// hold locks on the table. By default a second a try, for up to ten
    /// minutes.
    ///
    /// A version that changes the table (dropping an index, adding a
    /// column or a check) needs a lock that conflicts with every
    /// transaction open on it, and while it waits for that lock, claims,
    /// enqueues and completions queue behind it. A short `per_try` keeps
    /// a transaction left open (a long job's in transactional mode, a
    /// session idle in one) from stopping the queue: it holds up the
    /// migration instead. A longer one gives a version more chance to get
    /// in between long transactions, at the price of queue stalls that
    /// long. Versions that only build indexes (concurrently) or fix rows
    /// in batches take no such lock. A concurrent build does wait for every
    /// transaction that began before it, holding up nothing but the
    /// migration: found still waiting for the same session idle in a
    /// transaction after `give_up_after`, it is stopped (the next
    /// migration builds it again) and the migration fails naming that
    /// session. A build that is working, or waiting for statements that
    /// are running, is left alone.
    ///
    /// ```no_run
    /// # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use queue_store_postgres::JobTable;
    ///
    /// let jobs = JobTable::new("public", "queue_jobs")?
    ///     .migration_lock_wait(Duration::from_millis(200), Duration::from_secs(3600));
    /// jobs.migrate(&pool).await?;
    /// # Ok(()) }
    /// ```
    pub fn migration_lock_wait(mut self, per_try: Duration, give_up_after: Duration) -> Self {
        self.lock_wait = LockWait {
            per_try: per_try.max(Duration::from_millis(1)),
            give_up_after,
        };
        self
    }

    /// Lays the table out so that a claim updates its jobs in place: no
    /// index names the state, so the claim's write (state, start,
    /// heartbeat, token) is a heap-only update that adds no index entry
    /// and leaves none behind for vacuum. In a lease drain on the
    /// benchmark machine that took 10-28 % more jobs a second
    /// (docs/benchmarks.md, "The same layout in the drains").
    ///
    /// **Experimental, off by default.** [`JobTable::migrate`] applies
    /// four versions more to a plain table, new or existing (versions 13
    /// to 16: indexes on the times built concurrently, the old ones
    /// dropped, pages half empty, a check that the finish and due times
    /// follow the state, validated without stopping claims, and a ledger
    /// of limited kinds' claims, which their counts of running jobs read
    /// instead of the backlog). What the table gives up for now:
    ///
    /// - no index holds the running jobs alone: the figures' running and
    ///   stalled counts, a list of running jobs and the resetter read them
    ///   among the waiting ones, at a cost that grows with the backlog
    ///   rather than with the jobs in flight;
    /// - no index holds failed or canceled jobs alone: a list of them
    ///   reads the finished jobs (of its kinds) until its page is full;
    /// - the table takes about twice the pages for its live rows;
    /// - a converted table's existing pages stay as full as they were:
    ///   only the jobs enqueued after it get room for in-place claims.
    ///
    /// A table once converted stays so; a store finds the layout in the
    /// catalog whatever its options say. Refused with
    /// [`JobTable::partitioned_by_finish_time`], whose completions move
    /// rows between partitions anyway.
    ///
    /// ```no_run
    /// # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
    /// use queue_store_postgres::JobTable;
    ///
    /// let jobs = JobTable::new("public", "queue_jobs")?.in_place_claims();
    /// jobs.migrate(&pool).await?;
    /// # Ok(()) }
    /// ```
    pub fn in_place_claims(mut self) -> Self {
        self.in_place_claims = true;
        self.enqueue = Arc::new(EnqueueStatements::default_table(&self.table, true));
        self
    }

    /// How the table is laid out: as it exists, or as it will be created.
    async fn layout(&self, pool: &PgPool) -> Result<Layout, StoreError> {
        let kind: Option<String> = sqlx::query_scalar(
            "SELECT CAST(c.relkind AS text) FROM pg_catalog.pg_class AS c WHERE c.oid = to_regclass($1)",
        )
        .bind(self.table.quoted())
        .fetch_optional(pool)
        .await
        .map_err(|e| store_error("reading the table's layout", e))?;
        match (kind.as_deref(), self.partitions) {
            (Some("p"), _) | (None, Some(_)) => Ok(Layout::Partitioned),
            (Some(_), Some(_)) => Err(StoreError::Config(format!(
                "table {} exists and is not partitioned; a table partitioned by finish time is created new: \
                 create one under another name and move the jobs over, or migrate this one without partitions",
                self.table
            ))),
            (_, None) => Ok(Layout::Plain),
        }
        .and_then(|layout| match (layout, self.in_place_claims) {
            (Layout::Partitioned, true) => Err(StoreError::Config(format!(
                "table {} is partitioned by finish time, whose claims cannot be made in place \
                 (a completion moves its row to another partition); migrate it without `in_place_claims`",
                self.table
            ))),
            _ => Ok(layout),
        })
    }

    /// The store options of the default table at `table`.
    pub(crate) fn options_for(table: &QualifiedName) -> PgStoreOptions {
        let options =
            PgStoreOptions::new(table.name.as_str()).and_then(|o| o.schema(table.schema.as_str()));
        // Both names were validated when `table` was built.
        options.unwrap_or_else(|e| panic!("validated names rejected: {e}"))
    }

    /// The table's qualified name.
    pub fn name(&self) -> &QualifiedName {
        &self.table
    }

    /// Store options for this table (standard names and states).
    pub fn store_options(&self) -> PgStoreOptions {
        JobTable::options_for(&self.table)
    }

    /// The name of this table's archive: `<table>_archive` in its schema
    /// (see [`JobTable::create_archive`]).
    pub fn archive_name(&self) -> String {
        crate::sql::default_table::derived_name(&self.table.name, "archive")
    }

    /// Creates the archive purged jobs move to, if it is missing: a table
    /// like this one (same columns and defaults, no indexes or triggers)
    /// named [`JobTable::archive_name`]. Point the store at it with
    /// `store_options().archive_table(&jobs.archive_name())`; the pruner and
    /// `queue purge` then move old finished jobs there instead of deleting
    /// them. Run it after [`JobTable::migrate`] (and again after a
    /// migration that adds a column: the store checks at start-up that the
    /// archive has every column).
    pub async fn create_archive(&self, pool: &PgPool) -> Result<(), StoreError> {
        let archive = crate::ident::QualifiedName::new(
            self.table.schema.clone(),
            crate::ident::Ident::new(self.archive_name())?,
        );
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE TABLE IF NOT EXISTS {} (LIKE {} INCLUDING DEFAULTS)",
            archive.quoted(),
            self.table.quoted()
        )))
        .execute(pool)
        .await
        .map_err(|e| crate::error::store_error("creating the archive table", e))?;
        Ok(())
    }

    /// The tables migrations keep, each with its versions: the table, then
    /// the kinds, audit and workers tables beside it.
    fn owned_tables(
        &self,
        layout: Layout,
    ) -> Vec<(QualifiedName, Vec<crate::sql::default_table::MigrationSql>)> {
        let mut versions = crate::migrate::default_table(&self.table, layout);
        if self.in_place_claims {
            versions.extend(crate::sql::default_table::in_place_versions(&self.table));
        }
        let mut tables = vec![(self.table.clone(), versions)];
        // The default table has a kind column.
        tables.extend(crate::migrate::operator_tables(&self.table, true));
        tables
    }

    /// Brings the table to the newest version of its schema: creates the
    /// schema, table, indexes and notify trigger where missing, then each
    /// later version in order (see [`Migration`]); then the same for the
    /// tables beside it: the kinds table ([`kinds`](crate::kinds): the
    /// paused kinds), the audit table and the workers table (see
    /// [`migrate_beside`](crate::migrate_beside)). Returns the versions it
    /// applied, the table's first; none when all are up to date, in which case it only reads, so it is safe to call
    /// on every start-up, from several processes at once, beside running
    /// workers.
    ///
    /// A partitioned table ([`JobTable::partitioned_by_finish_time`]) also
    /// gets the partitions its finishing jobs need next.
    pub async fn migrate(&self, pool: &PgPool) -> Result<Vec<Migration>, StoreError> {
        let layout = self.layout(pool).await?;
        let mut applied = Vec::new();
        for (table, versions) in self.owned_tables(layout) {
            applied.extend(crate::migrate::apply(pool, &table, versions, self.lock_wait).await?);
        }
        if layout == Layout::Partitioned {
            crate::partitions::keep_ahead(pool, &self.table, self.partitions, chrono::Utc::now())
                .await?;
        }
        Ok(applied)
    }

    /// Every version of the table's schema and of its kinds and audit
    /// tables',
    /// applied or pending, with when each was applied and the SQL it runs.
    pub async fn migrations(&self, pool: &PgPool) -> Result<Vec<Migration>, StoreError> {
        let layout = self.layout(pool).await?;
        let mut all = Vec::new();
        for (table, versions) in self.owned_tables(layout) {
            all.extend(crate::migrate::status(pool, &table, versions).await?);
        }
        Ok(all)
    }

    /// Enqueues one job on `conn` (the pool, a connection, or a
    /// transaction: `&mut *tx`); returns its id (for a job whose [unique
    /// key](NewJob::unique) is taken, the id of the job that holds it; see
    /// [`JobTable::enqueue_unique`] to tell the two apart).
    pub async fn enqueue<'c>(
        &self,
        conn: impl Into<ConnectionOrPool<'c>>,
        job: &NewJob,
    ) -> Result<i64, StoreError> {
        let mut done = self.enqueue_unique(conn, std::slice::from_ref(job)).await?;
        done.pop().map(|e| e.id).ok_or_else(|| StoreError::Backend {
            context: "enqueueing a job".into(),
            source: "the insert returned no row".into(),
        })
    }

    /// Enqueues many jobs in one statement; returns their ids in order (as
    /// [`JobTable::enqueue`] does).
    pub async fn enqueue_many<'c>(
        &self,
        conn: impl Into<ConnectionOrPool<'c>>,
        jobs: &[NewJob],
    ) -> Result<Vec<i64>, StoreError> {
        let done = self.enqueue_unique(conn, jobs).await?;
        Ok(done.into_iter().map(|e| e.id).collect())
    }

    /// Enqueues jobs, some or all with [unique keys](NewJob::unique), in
    /// one statement; says for each, in order, whether it was added or
    /// which job holds its key. Safe from any number of enqueuers at once:
    /// the table's unique index admits one job per key, and the others
    /// come back `inserted: false` with its id.
    ///
    /// A job whose key's holder committed, or finished, while the
    /// statement ran is enqueued again by a second statement on the same
    /// connection, which sees the holder or finds the key free (see
    /// [`crate::unique`]'s rule, which every enqueue keeps). Inside the
    /// caller's transaction that works in `READ COMMITTED`, the default:
    /// each statement sees what committed before it. In `REPEATABLE READ`
    /// or `SERIALIZABLE` a holder committed after the transaction began
    /// stays out of sight, and the call fails with a retryable
    /// [`StoreError::Conflict`], like any serialization failure.
    pub async fn enqueue_unique<'c>(
        &self,
        conn: impl Into<ConnectionOrPool<'c>>,
        jobs: &[NewJob],
    ) -> Result<Vec<Enqueued<i64>>, StoreError> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let (statements, channel) = (&*self.enqueue, &*self.channel);
        match conn.into() {
            ConnectionOrPool::Connection(conn) => {
                enqueue_on(conn, statements, &self.table, channel, jobs).await
            }
            ConnectionOrPool::Pool(pool) => {
                let mut conn = pool
                    .acquire()
                    .await
                    .map_err(|e| store_error("enqueueing jobs", e))?;
                enqueue_on(&mut conn, statements, &self.table, channel, jobs).await
            }
        }
    }

    /// The enqueue statements, for the diesel entry points.
    #[cfg(any(feature = "diesel", feature = "diesel-async"))]
    pub(crate) fn enqueue_statements(&self) -> &EnqueueStatements {
        &self.enqueue
    }
}
