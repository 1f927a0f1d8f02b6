//! [`PgAdmin`]: the admin contract on any Postgres table the options
//! describe. The contract's methods live by idea: reads in `read`,
//! operators' writes in `write`, the enqueue in `enqueue`, pauses in
//! `pauses`, the audit log in `audit`, the worker registry in `workers`,
//! and the store's own sweeps
//! (expiry, stalled jobs) in `sweeps`.

use std::marker::PhantomData;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use queue_core::{
    ActionReport, Admin, AuditEntry, AuditParams, Enqueued, FinishedBucket, JobFilter, JobPage,
    JobState, JobView, ListParams, NewAuditEntry, NewJob, NewOperation, Operation, OperationParams,
    OperationStep, PausedKind, PurgeParams, QueueStats, ResetParams, ResetReport, RetryParams,
    StatsParams, StoreError, TakeOperation, Targets, TimelineParams,
};
use sqlx::PgPool;

use crate::clock_offset::ClockOffset;
use crate::error::store_error;
use crate::options::{Column, PgStoreOptions};
use crate::record::PgKey;
use crate::sql::admin::AdminStatements;
use crate::sql::{catalog, TableShape};
use write::Savepoint;

mod audit;
mod enqueue;
mod limits;

pub(crate) use limits::kind_limits;
mod operations;
mod partitions;
mod pauses;
mod read;
mod stats;
mod sweeps;
mod workers;
mod write;

struct Inner {
    pool: PgPool,
    options: PgStoreOptions,
    sql: AdminStatements,
    absent: Vec<Column>,
    /// Why unique keys are not enforced by the table, if they are not.
    unique_unenforced: Option<String>,
    /// The database's clock minus the callers'.
    offset: ClockOffset,
    /// When a beat last found the workers table missing.
    workers_missing: std::sync::Mutex<Option<std::time::Instant>>,
    /// Whether Postgres partitions the table (see [`crate::partitions`]).
    partitioned: bool,
    /// What an `ANALYZE` after a bulk operation reads: the table, or the
    /// partitions of a partitioned one that hold its waiting and running
    /// jobs (none known: nothing).
    analyzed: Vec<crate::ident::QualifiedName>,
    /// When partitions ahead were last made (a partitioned table).
    partitions_made: std::sync::Mutex<Option<std::time::Instant>>,
}

/// The admin contract ([`Admin`]) on a Postgres table: read, count, retry,
/// cancel, delete, reset, purge and enqueue jobs, in the table's own
/// columns and state values, whatever record type its workers decode.
///
/// It needs only a pool and the table's [`PgStoreOptions`] (the same as
/// the workers', or read from a config file): no listener, no completer,
/// so an operator tool or an HTTP server can hold one cheaply. A
/// [`PgStore`](crate::PgStore) carries one too ([`PgStore::admin`](crate::PgStore::admin))
/// and implements [`Admin`] through it.
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use queue_core::{Admin, JobFilter, JobState, ListParams, RetryParams, Targets};
/// use queue_store_postgres::{JobTable, PgAdmin};
///
/// let admin = PgAdmin::<i64>::new(pool, JobTable::default().store_options()).await?;
/// let failed = admin
///     .list(&ListParams::first(JobFilter::default().states([JobState::Failed]), 20))
///     .await?;
/// for job in &failed.jobs {
///     println!("{} {:?}: {:?}", job.id, job.kind, job.failure_message);
/// }
/// let ids = failed.jobs.iter().map(|job| job.id).collect();
/// let report = admin
///     .retry(&Targets::Ids(ids), RetryParams::default())
///     .await?;
/// println!("{} retried", report.changed);
/// # Ok(()) }
/// ```
pub struct PgAdmin<K> {
    inner: Arc<Inner>,
    key: PhantomData<fn() -> K>,
}

impl<K> Clone for PgAdmin<K> {
    fn clone(&self) -> Self {
        PgAdmin {
            inner: self.inner.clone(),
            key: PhantomData,
        }
    }
}

impl<K> std::fmt::Debug for PgAdmin<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgAdmin")
            .field("table", &self.inner.options.table)
            .finish_non_exhaustive()
    }
}

impl<K: PgKey> PgAdmin<K> {
    /// Checks `options` against the catalog and builds the admin
    /// statements. Only the key and the state must exist: a standard
    /// column the options do not map by name and the table lacks is
    /// absent, and the operations that need it refuse, naming it (a store
    /// that runs jobs wants each one mapped or declared absent). `K` is the key column's type: `i32`, `i64`,
    /// `uuid::Uuid` or `String`.
    pub async fn new(pool: PgPool, options: PgStoreOptions) -> Result<Self, StoreError> {
        options.check()?;
        let (shape, absent) =
            catalog::inspect(&pool, &options, K::PG_TYPES, catalog::User::Reader).await?;
        let admin = PgAdmin::from_parts(pool, options, &shape, absent);
        admin.inner.offset.measure(&admin.inner.pool).await?;
        Ok(admin)
    }

    /// Takes the times it is given as readings of `clock` (by default the
    /// system clock) and translates them onto the database's clock, which
    /// it measures against `clock` now and every minute after. See
    /// [`PgStore::set_clock`](crate::PgStore::set_clock).
    pub async fn set_clock(&self, clock: Arc<dyn queue_core::Clock>) -> Result<(), StoreError> {
        self.inner.offset.set_clock(clock, &self.inner.pool).await
    }

    /// The database's clock minus the callers', as last measured (zero
    /// below a second).
    pub fn clock_offset(&self) -> chrono::TimeDelta {
        self.inner.offset.offset()
    }

    /// Now on the callers' clock: the time of an operator's write, put on
    /// the database's clock as it is bound.
    pub(crate) fn callers_now(&self) -> DateTime<Utc> {
        self.inner.offset.callers_now()
    }

    /// `at`, a time of the callers' clock, on the database's clock.
    pub(crate) fn to_db(&self, at: DateTime<Utc>) -> DateTime<Utc> {
        self.inner.offset.to_db(at)
    }

    /// `at`, a time on the database's clock, on this process's clock.
    pub(crate) fn to_local(&self, at: DateTime<Utc>) -> DateTime<Utc> {
        self.inner.offset.to_local(at)
    }

    /// Measures the clock offset again at store start.
    pub(crate) async fn measure_clock(&self) -> Result<(), StoreError> {
        self.inner.offset.measure(&self.inner.pool).await
    }

    /// From options the catalog has already confirmed.
    pub(crate) fn from_parts(
        pool: PgPool,
        options: PgStoreOptions,
        shape: &TableShape,
        absent: Vec<Column>,
    ) -> Self {
        PgAdmin {
            inner: Arc::new(Inner {
                sql: AdminStatements::new(&options, shape, &absent),
                analyzed: if shape.partitioned {
                    shape.live_partitions.clone()
                } else {
                    vec![options.table.clone()]
                },
                pool,
                options,
                absent,
                unique_unenforced: shape.unique_unenforced.clone(),
                offset: ClockOffset::default(),
                workers_missing: std::sync::Mutex::new(None),
                partitioned: shape.partitioned,
                partitions_made: std::sync::Mutex::new(None),
            }),
            key: PhantomData,
        }
    }

    /// The pool it runs on.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The options it was built with.
    pub fn options(&self) -> &PgStoreOptions {
        &self.inner.options
    }

    /// The standard columns the table lacks, each with what is off because
    /// of it.
    pub fn disabled_features(&self) -> Vec<(Column, &'static str)> {
        self.inner
            .absent
            .iter()
            .filter(|c| c.absence_matters())
            .map(|c| (*c, c.feature_lost()))
            .collect()
    }

    /// Whether the table has `column`.
    pub(crate) fn has(&self, column: Column) -> bool {
        !self.inner.absent.contains(&column)
    }

    /// A connection from the pool, for an operator's statement.
    pub(super) async fn connection(
        &self,
        context: &str,
    ) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>, StoreError> {
        self.inner
            .pool
            .acquire()
            .await
            .map_err(|e| store_error(context, e))
    }

    /// Whether `table`, one the store keeps beside the job table (kinds,
    /// audit, workers), exists: for a read inside a transaction, which a
    /// failed statement would end.
    pub(super) async fn exists(
        &self,
        conn: &mut sqlx::PgConnection,
        table: &crate::QualifiedName,
    ) -> Result<bool, StoreError> {
        sqlx::query_scalar(crate::sql::default_table::RELATION_EXISTS)
            .bind(table.quoted())
            .fetch_one(conn)
            .await
            .map_err(|e| store_error(&format!("looking for {table}"), e))
    }
}

/// The error of a statement on `table`, one the store keeps beside the job
/// table to hold `what`: a table the database says does not exist is
/// refused, saying how to create it; anything else is the store's error.
pub(crate) fn beside_error(
    table: &crate::QualifiedName,
    what: &str,
    context: &str,
    error: sqlx::Error,
) -> StoreError {
    match &error {
        sqlx::Error::Database(db) if db.code().as_deref() == Some(UNDEFINED_TABLE) => {
            missing_table(table, what)
        }
        _ => store_error(context, error),
    }
}

/// Postgres' SQLSTATE for a relation that does not exist.
pub(crate) const UNDEFINED_TABLE: &str = "42P01";

/// `table`, which holds `what`, does not exist.
pub(crate) fn missing_table(table: &crate::QualifiedName, what: &str) -> StoreError {
    StoreError::Refused(format!(
        "the table {table}, where {what} are kept, does not exist: run `queue migrate` \
         (or queue_store_postgres::migrate_beside) to create it"
    ))
}

impl<K: PgKey> PgAdmin<K> {
    /// The standard state a stored value stands for: the first state
    /// mapped to it (errored sharing queued's value reads as queued); the
    /// expired jobs' own value, if the table has one, reads as failed.
    pub fn state_of(&self, stored: &str) -> Option<JobState> {
        JobState::ALL
            .into_iter()
            .find(|s| self.inner.options.stored_values(*s).contains(&stored))
    }
}

#[async_trait]
impl<K: PgKey> Admin for PgAdmin<K> {
    type Id = K;

    fn stored_state(&self, state: JobState) -> String {
        self.inner.options.states.get(state).to_owned()
    }

    fn check_enqueue(&self, jobs: &[NewJob]) -> Result<(), StoreError> {
        self.refuse_unstorable(jobs)
    }

    async fn get(&self, id: &K) -> Result<Option<JobView<K>>, StoreError> {
        self.fetch_job(id).await
    }

    async fn list(&self, params: &ListParams<K>) -> Result<JobPage<K>, StoreError> {
        self.fetch_page(params).await
    }

    async fn count(&self, filter: &JobFilter) -> Result<u64, StoreError> {
        self.count_matching(filter).await
    }

    async fn stats(&self, params: StatsParams) -> Result<QueueStats, StoreError> {
        self.fetch_stats(params).await
    }

    async fn finished_timeline(
        &self,
        params: &TimelineParams,
    ) -> Result<Option<Vec<FinishedBucket>>, StoreError> {
        self.fetch_timeline(params).await
    }

    async fn enqueue(&self, jobs: &[NewJob]) -> Result<Vec<Enqueued<K>>, StoreError> {
        self.insert_jobs(jobs).await
    }

    async fn retry(
        &self,
        targets: &Targets<K>,
        params: RetryParams,
    ) -> Result<ActionReport<K>, StoreError> {
        let mut conn = self.connection("retrying jobs").await?;
        self.retry_on(&mut conn, Savepoint::None, targets, params)
            .await
    }

    async fn cancel(&self, targets: &Targets<K>) -> Result<ActionReport<K>, StoreError> {
        let mut conn = self.connection("cancelling jobs").await?;
        self.cancel_on(&mut conn, Savepoint::None, targets).await
    }

    async fn force_fail(
        &self,
        targets: &Targets<K>,
        reason: &str,
    ) -> Result<ActionReport<K>, StoreError> {
        let mut conn = self.connection("failing jobs").await?;
        self.force_fail_on(&mut conn, Savepoint::None, targets, reason)
            .await
    }

    async fn purge(&self, params: &PurgeParams) -> Result<queue_core::PurgeReport, StoreError> {
        let dropped = self.drop_old_partitions(params).await?;
        let mut conn = self.connection("purging jobs").await?;
        let mut report = self.purge_on(&mut conn, params).await?;
        report.purged += dropped.jobs;
        report.found += dropped.jobs;
        Ok(report)
    }

    async fn delete(&self, targets: &Targets<K>) -> Result<ActionReport<K>, StoreError> {
        let mut conn = self.connection("deleting jobs").await?;
        self.delete_on(&mut conn, Savepoint::None, targets).await
    }

    async fn reset(&self, params: ResetParams) -> Result<ResetReport<K>, StoreError> {
        self.reset_stalled(params).await
    }

    async fn pause(&self, kind: &str, by: &str) -> Result<PausedKind, StoreError> {
        self.pause_kind(kind, by).await
    }

    async fn resume(&self, kind: &str) -> Result<Option<PausedKind>, StoreError> {
        self.resume_kind(kind).await
    }

    async fn paused(&self) -> Result<Vec<PausedKind>, StoreError> {
        self.fetch_pauses().await
    }

    async fn set_limits(
        &self,
        kind: &str,
        limits: &queue_core::KindLimits,
        by: &str,
    ) -> Result<Option<queue_core::KindLimit>, StoreError> {
        self.set_kind_limits(kind, limits, by).await
    }

    async fn limits(&self) -> Result<Vec<queue_core::KindLimit>, StoreError> {
        self.read_limits().await
    }

    async fn append_audit(&self, entries: &[NewAuditEntry]) -> Result<(), StoreError> {
        self.append_entries(entries).await
    }

    async fn audit(&self, params: &AuditParams) -> Result<Vec<AuditEntry>, StoreError> {
        self.read_audit(params).await
    }

    async fn create_operation(&self, new: &NewOperation) -> Result<Operation<K>, StoreError> {
        self.create_op(new).await
    }

    async fn operation(&self, id: i64) -> Result<Option<Operation<K>>, StoreError> {
        self.read_op(id).await
    }

    async fn operations(&self, params: &OperationParams) -> Result<Vec<Operation<K>>, StoreError> {
        self.read_ops(params).await
    }

    async fn take_operation(
        &self,
        take: &TakeOperation,
    ) -> Result<Option<Operation<K>>, StoreError> {
        self.take_op(take).await
    }

    async fn step_operation(
        &self,
        step: &OperationStep<K>,
    ) -> Result<Option<Operation<K>>, StoreError> {
        self.step_op(step).await
    }

    async fn prune_operations(&self, older_than: std::time::Duration) -> Result<u64, StoreError> {
        self.prune_ops(older_than).await
    }

    async fn abort_operation(
        &self,
        id: i64,
        by: &str,
    ) -> Result<Option<queue_core::AbortOutcome<K>>, StoreError> {
        self.abort_op(id, by).await
    }

    async fn workers(
        &self,
        seen_since: DateTime<Utc>,
    ) -> Result<Vec<queue_core::WorkerInfo>, StoreError> {
        self.live_workers(seen_since).await
    }
}
