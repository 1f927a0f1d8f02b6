//! [`PgAdmin`]: the admin contract on any Postgres table the options
//! describe.

use std::collections::HashSet;
use std::marker::PhantomData;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use queue_core::resetter::{AT_MOST_ONCE_MESSAGE, MAX_RESETS_MESSAGE};
use queue_core::{
    ActionReport, Admin, Delivery, Enqueued, FinishedBucket, JobFilter, JobPage, JobState, JobView,
    ListOrder, ListParams, NewJob, PurgeParams, QueueStats, ResetParams, ResetReport, RetryParams,
    SkipReason, Skipped, StateCount, StatsParams, StoreError, Targets, TimelineParams, UniqueScope,
    CANCELED_BEFORE_RUN_MESSAGE, EXPIRED_MESSAGE,
};
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};

use crate::bind::{query, state, Value};
use crate::clock_offset::ClockOffset;
use crate::error::store_error;
use crate::options::{Column, PgStoreOptions};
use crate::record::PgKey;
use crate::sql::admin::{AdminStatements, AdminWrite, Pick};
use crate::sql::{catalog, Param, Statement, TableShape};
use crate::stash::OnLiveConnection;
use crate::unique::{align, Answer, UNSEEN_HOLDER};

struct Inner {
    pool: PgPool,
    options: PgStoreOptions,
    sql: AdminStatements,
    absent: Vec<Column>,
    /// The database's clock minus the callers'.
    offset: ClockOffset,
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
///     .retry(&Targets::Ids(ids), RetryParams::default(), chrono::Utc::now())
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
    /// Checks `options` against the catalog (as a store does) and builds
    /// the admin statements. `K` is the key column's type: `i32`, `i64`,
    /// `uuid::Uuid` or `String`.
    pub async fn new(pool: PgPool, options: PgStoreOptions) -> Result<Self, StoreError> {
        options.check()?;
        let (shape, absent) = catalog::inspect(&pool, &options, K::PG_TYPES).await?;
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
                pool,
                options,
                absent,
                offset: ClockOffset::default(),
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
            .map(|c| (*c, c.feature_lost()))
            .collect()
    }

    /// Whether the table has `column`.
    pub(crate) fn has(&self, column: Column) -> bool {
        !self.inner.absent.contains(&column)
    }

    /// The standard state a stored value stands for: the first state
    /// mapped to it (errored sharing queued's value reads as queued); the
    /// expired jobs' own value, if the table has one, reads as failed.
    pub fn state_of(&self, stored: &str) -> Option<JobState> {
        JobState::ALL
            .into_iter()
            .find(|s| self.inner.options.stored_values(*s).contains(&stored))
    }

    fn view(&self, row: &PgRow) -> Result<JobView<K>, StoreError> {
        let get = |e| store_error("reading a job", e);
        let stored_state: String = row.try_get("state").map_err(get)?;
        let logs: Option<serde_json::Value> = row.try_get("execution_logs").map_err(get)?;
        let execution_logs = match logs {
            None | Some(serde_json::Value::Null) => Vec::new(),
            Some(serde_json::Value::Array(entries)) => entries,
            Some(other) => vec![other],
        };
        let state = self.state_of(&stored_state);
        let mut view = JobView::new(row.try_get("id").map_err(get)?, stored_state, state);
        view.kind = row.try_get("kind").map_err(get)?;
        view.payload = row.try_get("payload").map_err(get)?;
        view.priority = row.try_get("priority").map_err(get)?;
        view.failure_message = row.try_get("failure_message").map_err(get)?;
        view.queued_at = row.try_get("queued_at").map_err(get)?;
        view.started_at = row.try_get("started_at").map_err(get)?;
        view.finished_at = row.try_get("finished_at").map_err(get)?;
        view.process_after = row.try_get("process_after").map_err(get)?;
        view.num_resets = row.try_get("num_resets").map_err(get)?;
        view.num_failures = row.try_get("num_failures").map_err(get)?;
        view.last_heartbeat_at = row.try_get("last_heartbeat_at").map_err(get)?;
        view.execution_logs = execution_logs;
        view.worker_hostname = row.try_get("worker_hostname").map_err(get)?;
        view.cancel = row.try_get("cancel").map_err(get)?;
        view.unique_key = row.try_get("unique_key").map_err(get)?;
        view.max_attempts = row.try_get("max_attempts").map_err(get)?;
        view.expires_at = row.try_get("expires_at").map_err(get)?;
        view.at_most_once = row.try_get("at_most_once").map_err(get)?;
        Ok(view)
    }

    /// The value of a filter's input.
    fn filter_value(&self, filter: &JobFilter, p: Param) -> Option<Value<K>> {
        let texts = |v: &[String]| Value::Texts(v.iter().cloned().map(Some).collect());
        match p {
            Param::FilterStates => filter.states.as_ref().map(|states| {
                Value::Texts(
                    states
                        .iter()
                        .flat_map(|s| self.inner.options.stored_values(*s))
                        .map(|v| Some(v.to_owned()))
                        .collect(),
                )
            }),
            Param::FilterKinds => filter.kinds.as_deref().map(texts),
            // Times of the callers' clock, on the database's.
            Param::QueuedFrom => filter.queued_from.map(|at| Value::Time(self.to_db(at))),
            Param::QueuedBefore => filter.queued_before.map(|at| Value::Time(self.to_db(at))),
            Param::FinishedFrom => filter.finished_from.map(|at| Value::Time(self.to_db(at))),
            Param::FinishedBefore => filter.finished_before.map(|at| Value::Time(self.to_db(at))),
            Param::FailureText => filter.failure_contains.clone().map(Value::Text),
            _ => None,
        }
    }

    /// Runs `write` over `targets`; returns the keys it changed. `limit`
    /// caps a [`Targets::Matching`] call.
    async fn write(
        &self,
        write: AdminWrite,
        targets: &Targets<K>,
        limit: usize,
        now: DateTime<Utc>,
    ) -> Result<Vec<K>, StoreError> {
        let mut conn = self
            .inner
            .pool
            .acquire()
            .await
            .map_err(|e| store_error(write_context(write), e))?;
        self.write_on(&mut conn, write, targets, limit, now).await
    }

    /// [`PgAdmin::write`] on `conn`.
    async fn write_on(
        &self,
        conn: &mut sqlx::PgConnection,
        write: AdminWrite,
        targets: &Targets<K>,
        limit: usize,
        now: DateTime<Utc>,
    ) -> Result<Vec<K>, StoreError> {
        let (pick, filter) = match targets {
            Targets::Ids(ids) if ids.is_empty() => return Ok(Vec::new()),
            Targets::Ids(_) => (Pick::Ids, None),
            Targets::Matching { .. } if limit == 0 => return Ok(Vec::new()),
            Targets::Matching { filter, .. } => (Pick::Matching(filter), Some(filter)),
            other => {
                return Err(StoreError::Refused(format!(
                    "the Postgres store does not know the targets {other:?}"
                )))
            }
        };
        let Some(statement) = self.inner.sql.write(write, pick)? else {
            return Ok(Vec::new());
        };
        let mut ids = match targets {
            Targets::Ids(ids) => Some(ids.clone()),
            _ => None,
        };
        let context = write_context(write);
        let rows = query(&statement, |p| match p {
            Param::Ids => ids.take().map(Value::Keys),
            Param::Limit => Some(Value::Int(i64::try_from(limit).unwrap_or(i64::MAX))),
            Param::Message => Some(Value::Text(CANCELED_BEFORE_RUN_MESSAGE.to_owned())),
            Param::Now => Some(Value::Time(self.to_db(now))),
            Param::Channel => Some(Value::Text(self.inner.options.notify_channel())),
            other => filter.and_then(|f| self.filter_value(f, other)),
        })?
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| store_error(context, e))?;
        rows.iter()
            .map(|row| row.try_get(0).map_err(|e| store_error(context, e)))
            .collect()
    }

    /// The keys of `targets` none of `changed` holds, each with why: no
    /// such job, a state none of `writes` moves a job out of, a row
    /// another transaction held, or a unique key another job holds.
    async fn skipped(
        &self,
        targets: &Targets<K>,
        changed: &[K],
        writes: &[AdminWrite],
    ) -> Result<Vec<Skipped<K>>, StoreError> {
        let Targets::Ids(ids) = targets else {
            return Ok(Vec::new());
        };
        let changed: HashSet<&K> = changed.iter().collect();
        let left: Vec<K> = ids
            .iter()
            .filter(|id| !changed.contains(id))
            .cloned()
            .collect();
        if left.is_empty() {
            return Ok(Vec::new());
        }
        let context = "reading why jobs were left alone";
        let mut keys = Some(left.clone());
        let rows = query(&self.inner.sql.states_of, |p| match p {
            Param::Ids => keys.take().map(Value::Keys),
            _ => None,
        })?
        .fetch_all(&self.inner.pool)
        .await
        .map_err(|e| store_error(context, e))?;
        let mut found = std::collections::HashMap::with_capacity(rows.len());
        for row in &rows {
            let read = |e| store_error(context, e);
            let id: K = row.try_get("id").map_err(read)?;
            let stored: String = row.try_get("state").map_err(read)?;
            let free: bool = row.try_get("free").map_err(read)?;
            let key_held: bool = row.try_get("key_held").map_err(read)?;
            found.insert(id, (stored, free, key_held));
        }
        // The states the writes move jobs out of; none named: any.
        let mut movable = Vec::new();
        for write in writes {
            let states = self.inner.sql.states_moved_by(*write);
            if states.is_empty() {
                movable = JobState::ALL.to_vec();
                break;
            }
            movable.extend(states);
        }
        let retry = writes.iter().any(|w| matches!(w, AdminWrite::Retry(_)));
        Ok(left
            .into_iter()
            .map(|id| {
                let Some((stored, free, key_held)) = found.remove(&id) else {
                    return Skipped::missing(id);
                };
                let state = self.state_of(&stored);
                let reason = if !state.is_some_and(|s| movable.contains(&s)) {
                    SkipReason::State
                } else if !free {
                    SkipReason::Locked
                } else if retry && key_held {
                    SkipReason::KeyHeld
                } else {
                    // Moved on between the write and this read.
                    SkipReason::State
                };
                Skipped::new(id, stored, state, reason)
            })
            .collect())
    }

    /// Refuses jobs carrying what the table has no column for (a kind, a
    /// payload, a limit, a unique key or its scope): it would be lost.
    fn refuse_unstorable(&self, jobs: &[NewJob]) -> Result<(), StoreError> {
        let table = &self.inner.options.table;
        if !self.has(Column::Kind) {
            if let Some(job) = jobs.iter().find(|j| !j.kind.is_empty()) {
                return Err(StoreError::Refused(format!(
                    "table {table} has no kind column, so the kind {:?} would be lost; enqueue with an empty kind, or map the column (Column::Kind)",
                    job.kind
                )));
            }
        }
        if !self.has(Column::Payload) {
            let empty = |v: &serde_json::Value| {
                v.is_null() || v.as_object().is_some_and(serde_json::Map::is_empty)
            };
            if jobs.iter().any(|j| !empty(&j.payload)) {
                return Err(StoreError::Refused(format!(
                    "table {table} has no payload column, so the payload would be lost; map the column (Column::Payload)"
                )));
            }
        }
        for (column, what, asked) in [
            (
                Column::MaxAttempts,
                "max_attempts",
                jobs.iter().any(|j| j.limits.max_attempts.is_some()),
            ),
            (
                Column::ExpiresAt,
                "expires_at",
                jobs.iter().any(|j| j.expires_at.is_some()),
            ),
            (
                Column::AtMostOnce,
                "at_most_once",
                jobs.iter().any(|j| j.limits.at_most_once),
            ),
        ] {
            if asked && !self.has(column) {
                return Err(StoreError::Refused(format!(
                    "table {table} has no {what} column, so the job's {what} would be ignored; map one (Column::{column:?}), or enqueue without it"
                )));
            }
        }
        if self.inner.sql.enqueue_unique.is_none() && jobs.iter().any(|j| j.unique.is_some()) {
            return Err(StoreError::Refused(format!(
                "table {table} has no unique_key column, so a unique key would be ignored; map one (Column::UniqueKey) with a unique index on it, or enqueue without a key"
            )));
        }
        let forever = |j: &NewJob| {
            j.unique
                .as_ref()
                .is_some_and(|u| u.scope == UniqueScope::Forever)
        };
        if !self.has(Column::UniqueForever) && jobs.iter().any(forever) {
            return Err(StoreError::Refused(format!(
                "table {table} has no unique_forever column, so a key cannot be kept for as long as its job exists; map one (Column::UniqueForever), or make the table's unique index cover finished jobs and enqueue with UniqueScope::Active"
            )));
        }
        Ok(())
    }

    /// The enqueue of jobs with unique keys. A job whose key's holder the
    /// statement could not see (it committed meanwhile, or finished) is
    /// enqueued again by a new statement, which sees it or finds the key
    /// free; after a few rounds the call gives up with a retryable error.
    async fn enqueue_unique(&self, jobs: &[NewJob]) -> Result<Vec<Enqueued<K>>, StoreError> {
        let Some(statement) = &self.inner.sql.enqueue_unique else {
            return Err(StoreError::Refused(format!(
                "table {} has no unique_key column, so a unique key would be ignored; map one (Column::UniqueKey) with a unique index on it, or enqueue without a key",
                self.inner.options.table
            )));
        };
        let mut results: Vec<Option<Enqueued<K>>> = vec![None; jobs.len()];
        for _round in 0..5 {
            let pending: Vec<usize> = (0..jobs.len()).filter(|i| results[*i].is_none()).collect();
            if pending.is_empty() {
                break;
            }
            let batch: Vec<NewJob> = pending.iter().map(|i| jobs[*i].clone()).collect();
            let rows = query::<K>(statement, |p| match p {
                Param::Kinds => Some(Value::Texts(
                    batch.iter().map(|j| Some(j.kind.clone())).collect(),
                )),
                Param::Payloads => Some(Value::Jsons(
                    batch.iter().map(|j| j.payload.clone()).collect(),
                )),
                Param::Priorities => Some(Value::Ints(
                    batch.iter().map(|j| i64::from(j.priority)).collect(),
                )),
                Param::ProcessAfters => Some(Value::Times(
                    batch.iter().map(|j| j.process_after).collect(),
                )),
                Param::UniqueKeys => Some(Value::Texts(
                    batch
                        .iter()
                        .map(|j| j.unique.as_ref().map(|u| u.key.clone()))
                        .collect(),
                )),
                Param::UniqueForevers => Some(Value::Bools(
                    batch
                        .iter()
                        .map(|j| {
                            j.unique
                                .as_ref()
                                .is_some_and(|u| u.scope == UniqueScope::Forever)
                        })
                        .collect(),
                )),
                Param::Channel => Some(Value::Text(self.inner.options.notify_channel())),
                other => options_value(&batch, other),
            })?
            .fetch_all(&self.inner.pool)
            .await
            .map_err(|e| store_error("enqueueing unique jobs", e))?;
            let mut answers = Vec::with_capacity(rows.len());
            for row in &rows {
                let read = |e| store_error("enqueueing unique jobs", e);
                answers.push(Answer {
                    id: row.try_get("id").map_err(read)?,
                    key: row.try_get("unique_key").map_err(read)?,
                    inserted: row.try_get("inserted").map_err(read)?,
                });
            }
            for (i, result) in pending.into_iter().zip(align(&batch, answers)) {
                results[i] = result;
            }
        }
        results
            .into_iter()
            .map(|r| {
                r.ok_or_else(|| StoreError::Conflict {
                    context: UNSEEN_HOLDER.into(),
                    source: "the job holding the key stayed out of sight for five statements"
                        .into(),
                })
            })
            .collect()
    }

    /// Fails up to `limit` waiting jobs that expired at `now`
    /// ([`Store::expire`](queue_core::Store::expire)); none without an
    /// expiry column.
    pub(crate) async fn expire(
        &self,
        now: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<K>, StoreError> {
        let Some(statement) = &self.inner.sql.expire else {
            return Ok(Vec::new());
        };
        let context = "failing expired jobs";
        let mut tries = OnLiveConnection::new(&self.inner.pool, context);
        let rows = loop {
            let mut conn = tries.connection().await?;
            let expire = query::<K>(statement, |p| match p {
                Param::Now => Some(Value::Time(self.to_db(now))),
                Param::Limit => Some(Value::Int(i64::try_from(limit).unwrap_or(i64::MAX))),
                Param::Message => Some(Value::Text(EXPIRED_MESSAGE.to_owned())),
                Param::State(s) => Some(state::<K>(&self.inner.options.states, s)),
                _ => None,
            })?;
            let done = expire
                .fetch_all(&mut *conn)
                .await
                .map_err(|e| store_error(context, e));
            if let Some(done) = tries.settle(conn, done) {
                break done?;
            }
        };
        rows.iter()
            .map(|row| {
                row.try_get(0)
                    .map_err(|e| store_error("failing expired jobs", e))
            })
            .collect()
    }

    fn reset_statement(&self) -> Result<&Statement, StoreError> {
        self.inner.sql.reset.as_ref().ok_or_else(|| {
            StoreError::Config(format!(
                "table {} has neither last_heartbeat_at nor started_at, so stalled jobs cannot be recognised",
                self.inner.options.table
            ))
        })
    }
}

/// Statements a retry runs before it gives up on enqueues that keep
/// taking the keys of the jobs it retries.
const RETRY_ROUNDS: u32 = 5;

/// What `write` is doing, for its errors.
fn write_context(write: AdminWrite) -> &'static str {
    match write {
        AdminWrite::Retry(_) => "retrying jobs",
        AdminWrite::CancelWaiting | AdminWrite::RequestStop => "cancelling jobs",
        AdminWrite::Delete => "deleting jobs",
        AdminWrite::Archive => "moving purged jobs to the archive",
    }
}

fn limit_of<K>(targets: &Targets<K>) -> usize {
    match targets {
        Targets::Ids(ids) => ids.len(),
        Targets::Matching { limit, .. } => *limit,
        _ => 0,
    }
}

/// Whether `error` is a unique violation (a second holder of a unique key).
fn is_unique_violation(error: &StoreError) -> bool {
    let StoreError::Backend { source, .. } = error else {
        return false;
    };
    source
        .downcast_ref::<sqlx::Error>()
        .and_then(|e| e.as_database_error())
        .is_some_and(|db| db.code().as_deref() == Some("23505"))
}

/// The arrays of the jobs' limits and expiry, for an enqueue's `param`.
fn options_value<K>(jobs: &[NewJob], param: Param) -> Option<Value<K>> {
    match param {
        Param::MaxAttemptses => Some(Value::OptInts(
            jobs.iter()
                .map(|j| j.limits.max_attempts.map(i64::from))
                .collect(),
        )),
        Param::ExpiresAts => Some(Value::Times(jobs.iter().map(|j| j.expires_at).collect())),
        Param::AtMostOnces => Some(Value::Bools(
            jobs.iter().map(|j| j.limits.at_most_once).collect(),
        )),
        _ => None,
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
        let row = query(&self.inner.sql.get, |p| match p {
            Param::Id => Some(Value::Key(id.clone())),
            _ => None,
        })?
        .fetch_optional(&self.inner.pool)
        .await
        .map_err(|e| store_error("reading a job", e))?;
        row.map(|row| self.view(&row)).transpose()
    }

    async fn list(&self, params: &ListParams<K>) -> Result<JobPage<K>, StoreError> {
        let newest_first = params.order == ListOrder::NewestFirst;
        let statement =
            self.inner
                .sql
                .list(&params.filter, newest_first, params.after.is_some())?;
        let fetch = i64::try_from(params.limit)
            .unwrap_or(i64::MAX)
            .saturating_add(1);
        let rows = query(&statement, |p| match p {
            Param::Limit => Some(Value::Int(fetch)),
            Param::After => params.after.clone().map(Value::Key),
            other => self.filter_value(&params.filter, other),
        })?
        .fetch_all(&self.inner.pool)
        .await
        .map_err(|e| store_error("listing jobs", e))?;
        let mut jobs = rows
            .iter()
            .map(|row| self.view(row))
            .collect::<Result<Vec<_>, _>>()?;
        let next = if jobs.len() > params.limit {
            jobs.truncate(params.limit);
            jobs.last().map(|job| job.id.clone())
        } else {
            None
        };
        Ok(JobPage { jobs, next })
    }

    async fn count(&self, filter: &JobFilter) -> Result<u64, StoreError> {
        let statement = self.inner.sql.count(filter)?;
        let count: i64 = query(&statement, |p| self.filter_value(filter, p))?
            .fetch_one(&self.inner.pool)
            .await
            .map_err(|e| store_error("counting jobs", e))?
            .try_get(0)
            .map_err(|e| store_error("counting jobs", e))?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    async fn stats(&self, params: StatsParams) -> Result<QueueStats, StoreError> {
        let rows = sqlx::query(sqlx::AssertSqlSafe(Arc::clone(&self.inner.sql.counts.text)))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(|e| store_error("counting jobs", e))?;
        let mut counts = Vec::with_capacity(rows.len());
        for row in &rows {
            let stored_state: String = row
                .try_get("state")
                .map_err(|e| store_error("counting jobs", e))?;
            let count: i64 = row
                .try_get("count")
                .map_err(|e| store_error("counting jobs", e))?;
            counts.push(StateCount {
                state: self.state_of(&stored_state),
                stored_state,
                kind: row
                    .try_get("kind")
                    .map_err(|e| store_error("counting jobs", e))?,
                count: u64::try_from(count).unwrap_or(0),
            });
        }
        // Lifecycle order; values the mapping does not know last, by value.
        counts.sort_by(|a, b| {
            let order = |c: &StateCount| {
                c.state
                    .and_then(|s| JobState::ALL.iter().position(|x| *x == s))
                    .unwrap_or(JobState::ALL.len())
            };
            (order(a), &a.stored_state, &a.kind).cmp(&(order(b), &b.stored_state, &b.kind))
        });
        self.inner.offset.refresh(&self.inner.pool).await?;
        let now = self.to_db(params.now);
        let row = query::<K>(&self.inner.sql.waiting, |p| match p {
            Param::Now => Some(Value::Time(now)),
            Param::StalledBefore => Some(Value::Time(self.to_db(params.stalled_before))),
            _ => None,
        })?
        .fetch_one(&self.inner.pool)
        .await
        .map_err(|e| store_error("reading the oldest waiting job", e))?;
        let stalled: i64 = row
            .try_get("stalled")
            .map_err(|e| store_error("counting stalled jobs", e))?;
        Ok(QueueStats::new(
            counts,
            row.try_get("oldest")
                .map_err(|e| store_error("reading the oldest waiting job", e))?,
            u64::try_from(stalled).unwrap_or(0),
            // The database's time, which the oldest job's is measured on.
            now,
        ))
    }

    async fn finished_timeline(
        &self,
        params: &TimelineParams,
    ) -> Result<Option<Vec<FinishedBucket>>, StoreError> {
        let Some(statement) = &self.inner.sql.timeline else {
            return Ok(None);
        };
        let seconds = params.bucket.num_seconds();
        if seconds < 1 {
            return Err(StoreError::Refused(format!(
                "a timeline's interval must be at least a second, not {} ms",
                params.bucket.num_milliseconds()
            )));
        }
        // Finish times are written on the database's clock: the window is
        // translated onto it, as every other admin read's times are.
        self.inner.offset.refresh(&self.inner.pool).await?;
        let rows = query::<K>(statement, |p| match p {
            Param::FinishedFrom => Some(Value::Time(self.to_db(params.since))),
            Param::FinishedBefore => Some(Value::Time(self.to_db(params.until()))),
            Param::BucketSeconds => Some(Value::Int(seconds)),
            _ => None,
        })?
        .fetch_all(&self.inner.pool)
        .await
        .map_err(|e| store_error("counting finished jobs", e))?;
        let mut buckets = params.empty();
        for row in &rows {
            let read = |e| store_error("counting finished jobs", e);
            let bucket: i64 = row.try_get("bucket").map_err(read)?;
            let stored: String = row.try_get("state").map_err(read)?;
            let count: i64 = row.try_get("count").map_err(read)?;
            let slot = usize::try_from(bucket)
                .ok()
                .and_then(|i| buckets.get_mut(i));
            if let (Some(slot), Some(state)) = (slot, self.state_of(&stored)) {
                slot.add(state, u64::try_from(count).unwrap_or(0));
            }
        }
        Ok(Some(buckets))
    }

    async fn enqueue(&self, jobs: &[NewJob]) -> Result<Vec<Enqueued<K>>, StoreError> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        self.refuse_unstorable(jobs)?;
        if jobs.iter().any(|j| j.unique.is_some()) {
            return self.enqueue_unique(jobs).await;
        }
        let rows = query::<K>(&self.inner.sql.enqueue, |p| match p {
            Param::Kinds => Some(Value::Texts(
                jobs.iter().map(|j| Some(j.kind.clone())).collect(),
            )),
            Param::Payloads => Some(Value::Jsons(
                jobs.iter().map(|j| j.payload.clone()).collect(),
            )),
            Param::Priorities => Some(Value::Ints(
                jobs.iter().map(|j| i64::from(j.priority)).collect(),
            )),
            Param::ProcessAfters => {
                Some(Value::Times(jobs.iter().map(|j| j.process_after).collect()))
            }
            Param::Channel => Some(Value::Text(self.inner.options.notify_channel())),
            other => options_value(jobs, other),
        })?
        .fetch_all(&self.inner.pool)
        .await
        .map_err(|e| store_error("enqueueing jobs", e))?;
        rows.iter()
            .map(|row| {
                row.try_get(0)
                    .map(|id| Enqueued { id, inserted: true })
                    .map_err(|e| store_error("enqueueing jobs", e))
            })
            .collect()
    }

    async fn retry(
        &self,
        targets: &Targets<K>,
        params: RetryParams,
        now: DateTime<Utc>,
    ) -> Result<ActionReport<K>, StoreError> {
        let write = AdminWrite::Retry(params.reset_attempts);
        let context = write_context(write);
        // The statement queues at most one job per unique key and none
        // whose key another job holds, so it meets a unique violation only
        // when a concurrent enqueue took a key after its snapshot. Then it
        // runs again on the same connection: the failed statement's locks
        // are gone by the time the connection answers, and the new
        // snapshot sees the key's new holder and leaves that job alone.
        // Each statement is all or nothing: nothing is retried twice, and
        // a failure reports no partial work.
        let mut conn = self
            .inner
            .pool
            .acquire()
            .await
            .map_err(|e| store_error(context, e))?;
        let mut tries = 0;
        let changed = loop {
            tries += 1;
            match self
                .write_on(&mut conn, write, targets, limit_of(targets), now)
                .await
            {
                Err(error) if is_unique_violation(&error) && tries < RETRY_ROUNDS => continue,
                Err(error) if is_unique_violation(&error) => {
                    return Err(StoreError::Conflict {
                        context: format!(
                            "{context}: {RETRY_ROUNDS} statements in a row met enqueues taking the same unique keys; nothing was retried, try again"
                        ),
                        source: Box::new(error),
                    })
                }
                other => break other?,
            }
        };
        drop(conn);
        Ok(ActionReport::new(
            changed.len() as u64,
            0,
            self.skipped(targets, &changed, &[write]).await?,
        ))
    }

    async fn cancel(
        &self,
        targets: &Targets<K>,
        now: DateTime<Utc>,
    ) -> Result<ActionReport<K>, StoreError> {
        let limit = limit_of(targets);
        let canceled = self
            .write(AdminWrite::CancelWaiting, targets, limit, now)
            .await?;
        let flagged = self
            .write(
                AdminWrite::RequestStop,
                targets,
                limit.saturating_sub(canceled.len()),
                now,
            )
            .await?;
        let mut changed = canceled.clone();
        changed.extend(flagged.iter().cloned());
        Ok(ActionReport::new(
            canceled.len() as u64,
            flagged.len() as u64,
            self.skipped(
                targets,
                &changed,
                &[AdminWrite::CancelWaiting, AdminWrite::RequestStop],
            )
            .await?,
        ))
    }

    async fn purge(&self, params: &PurgeParams) -> Result<u64, StoreError> {
        let Some(filter) = params.filter()? else {
            return Ok(0);
        };
        // With an archive, purged jobs move there; else they are deleted.
        let write = if self.inner.options.archive.is_some() {
            AdminWrite::Archive
        } else {
            AdminWrite::Delete
        };
        let targets = Targets::Matching {
            filter,
            limit: params.limit,
        };
        let moved = self
            .write(write, &targets, params.limit, Utc::now())
            .await?;
        Ok(moved.len() as u64)
    }

    async fn delete(&self, targets: &Targets<K>) -> Result<ActionReport<K>, StoreError> {
        let deleted = self
            .write(AdminWrite::Delete, targets, limit_of(targets), Utc::now())
            .await?;
        Ok(ActionReport::new(
            deleted.len() as u64,
            0,
            self.skipped(targets, &deleted, &[AdminWrite::Delete])
                .await?,
        ))
    }

    async fn reset(&self, params: ResetParams) -> Result<ResetReport<K>, StoreError> {
        let statement = self.reset_statement()?;
        let states = &self.inner.options.states;
        // Stalls are judged on the database's clock, which heartbeats are
        // written on: a resetter whose clock runs ahead resets no healthy
        // job early.
        self.inner.offset.refresh(&self.inner.pool).await?;
        let context = "resetting stalled jobs";
        let mut tries = OnLiveConnection::new(&self.inner.pool, context);
        let rows = loop {
            let mut conn = tries.connection().await?;
            let reset = query(statement, |p| match p {
                Param::State(s) => Some(state::<K>(states, s)),
                Param::StalledBefore => Some(Value::Time(self.to_db(params.stalled_before))),
                Param::MaxResets => Some(Value::Int4(
                    i32::try_from(params.max_resets).unwrap_or(i32::MAX),
                )),
                Param::AtMostOnce => Some(Value::Bool(params.delivery == Delivery::AtMostOnce)),
                Param::MaxResetsMessage => Some(Value::Text(MAX_RESETS_MESSAGE.to_owned())),
                Param::AtMostOnceMessage => Some(Value::Text(AT_MOST_ONCE_MESSAGE.to_owned())),
                Param::Now => Some(Value::Time(self.to_db(params.now))),
                _ => None,
            })?;
            let done = reset
                .fetch_all(&mut *conn)
                .await
                .map_err(|e| store_error(context, e));
            if let Some(done) = tries.settle(conn, done) {
                break done?;
            }
        };
        let mut report = ResetReport::default();
        for row in &rows {
            let id: K = row
                .try_get("id")
                .map_err(|e| store_error("resetting stalled jobs", e))?;
            let failed: bool = row
                .try_get("failed")
                .map_err(|e| store_error("resetting stalled jobs", e))?;
            if failed {
                report.failed.push(id);
            } else {
                report.reset.push(id);
            }
        }
        Ok(report)
    }
}
