//! [`PgStore`]: the store contract on a Postgres table.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use queue_core::{
    ActionReport, Admin, ClaimParams, Claimed, DecodeError, Enqueued, FinishedBucket,
    HeartbeatReport, Job, JobFilter, JobLimits, JobPage, JobRecord, JobView, Lease, ListParams,
    LogEntry, NewJob, PurgeParams, QueueStats, ResetParams, ResetReport, RetryParams, StatsParams,
    Store, StoreError, Targets, TimelineParams, Transition, WriteResult,
};
use sqlx::postgres::PgRow;
use sqlx::{FromRow, PgConnection, PgPool, Postgres, Row};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::admin::PgAdmin;
use crate::bind::{bind_arg, lease_value, query, state, Value};
use crate::completer::{complete_batches, Completion, FinishRow};
use crate::conditions::{PgCondition, PgConditions};
use crate::cursor::{ClaimCursor, NothingAtCursor, Position, Probed};
use crate::error::store_error;
use crate::job_transaction::{JobClaim, PgJobTransaction, PreparedStatements};
use crate::kinds::{Cached, ClaimRules};
use crate::listen;
use crate::options::{ClaimCommit, Column, ExecutionMode, PgStoreOptions, StateValues};
use crate::record::{
    claimed_job_select, decode_claimed_job, decode_job, ClaimWrites, Decoder, PgKey, RecordDecoder,
};
use crate::ride::Rides;
use crate::sql::{
    catalog, Param, Statement, Statements, AT_MOST_ONCE_COLUMN, CURSOR_PRIORITY_COLUMN,
    MAX_ATTEMPTS_COLUMN,
};
use crate::stash::{OnLiveConnection, Stash};
use crate::statistics::Statistics;

struct Inner<R: JobRecord> {
    pool: PgPool,
    /// Connections of the claims, completions and job transactions.
    stash: Arc<Stash>,
    /// Whether job transactions use statements prepared in SQL.
    prepared: Arc<PreparedStatements>,
    options: PgStoreOptions,
    sql: Arc<Statements>,
    states: Arc<StateValues>,
    decode: RecordDecoder<R>,
    wake: Arc<listen::Wake>,
    listener: JoinHandle<()>,
    /// The batched completer: outcomes that need no job transaction.
    completer: mpsc::UnboundedSender<Completion<R::Id>>,
    /// Where claims into a backlog start, if the store keeps a cursor.
    cursor: Option<ClaimCursor<R::Id>>,
    /// Where job locks ride on other jobs' commits (transactional mode).
    rides: Option<Arc<Rides>>,
    /// The admin contract on the same table.
    admin: PgAdmin<R::Id>,
    /// Whether claimed rows are read again with enum columns as text (the
    /// record type reads them as strings).
    enums_as_text: AtomicBool,
    /// Keeps the claim's plan on the claim index (see [`Statistics`]).
    statistics: Statistics,
    /// The paused kinds, whose jobs claims pass over, and the limited
    /// ones, claimed apart.
    rules: Arc<ClaimRules>,
    /// When a limited kind held back by its limits may start more jobs
    /// (this process's clock): an idle worker looks again then.
    limited_due: std::sync::Mutex<Option<DateTime<Utc>>>,
}

impl<R: JobRecord> Drop for Inner<R> {
    fn drop(&mut self) {
        self.listener.abort();
    }
}

/// The store contract on a Postgres table, any table: columns, state
/// values, key type, view and order are all configurable
/// ([`PgStoreOptions`]), and checked against the catalog at start-up.
///
/// Build the store's pool with `test_before_acquire(false)`: by default
/// sqlx pings every connection before handing it out, a round trip more for
/// each claim and completion (measured: a claim's wait for its connection
/// went from 0.01 to 0.25-0.5 ms, throughput down by about a tenth). A
/// broken connection still surfaces as a retryable error and is replaced.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use queue_store_postgres::{ExecutionMode, JobTable, PgStore};
/// use sqlx::postgres::PgPoolOptions;
///
/// let pool = PgPoolOptions::new()
///     .test_before_acquire(false)
///     .connect("postgres://localhost/app")
///     .await?;
/// let jobs = JobTable::default();
/// jobs.migrate(&pool).await?;
/// let store = PgStore::default_table(pool.clone(), jobs.store_options().mode(ExecutionMode::Lease)).await?;
/// jobs.enqueue(&pool, &queue_core::NewJob::new("email", serde_json::json!({"to": "a@b.c"}))).await?;
/// # let _ = store; Ok(()) }
/// ```
pub struct PgStore<R: JobRecord> {
    inner: Arc<Inner<R>>,
}

impl<R: JobRecord> Clone for PgStore<R> {
    fn clone(&self) -> Self {
        PgStore {
            inner: self.inner.clone(),
        }
    }
}

impl<R: JobRecord> std::fmt::Debug for PgStore<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("table", &self.inner.options.table)
            .field("mode", &self.inner.options.mode)
            .finish_non_exhaustive()
    }
}

impl PgStore<Job> {
    /// A store over the default table (see [`JobTable`](crate::JobTable)),
    /// handing out [`Job`] records. Unless the options name a select list or
    /// a view, a claim returns only the columns it did not write (by their
    /// standard names, whatever the options rename them to), and each
    /// record takes the state, start and heartbeat time, worker, claim
    /// token and empty execution log from the claim itself.
    pub async fn default_table(
        pool: PgPool,
        mut options: PgStoreOptions,
    ) -> Result<Self, StoreError> {
        // Unless told what to read, a claim reads back only the columns it
        // did not write, and the record takes the rest from the claim.
        let decode = match claimed_job_select(&options) {
            Some(select) if options.select.is_none() && options.view.is_none() => {
                options.select = Some(select);
                RecordDecoder::Claimed(decode_claimed_job)
            }
            _ => RecordDecoder::Row(decode_job),
        };
        // Read by name: checked once the table itself has been (its own
        // errors name the problem more exactly).
        let by_name = matches!(decode, RecordDecoder::Row(_))
            && options.select.is_none()
            && options.view.is_none();
        let checked = by_name.then(|| options.clone());
        let store = PgStore::build(pool.clone(), options, decode).await?;
        if let Some(options) = checked {
            unreadable_as_job(&pool, &options).await?;
        }
        Ok(store)
    }
}

/// Refuses a table whose rows a [`Job`] cannot be read from, before any
/// job is claimed: without a select list or a view, a claimed row is read
/// by the default table's column names, and a running job's state as
/// `processing`. A table without one of those columns, or storing running
/// jobs as another value, would fail every job's decoding, and each would
/// end failed.
async fn unreadable_as_job(pool: &PgPool, options: &PgStoreOptions) -> Result<(), StoreError> {
    let present: Vec<String> = sqlx::query_scalar(
        "SELECT a.attname::text FROM pg_catalog.pg_attribute a \
         WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped",
    )
    .bind(options.table.quoted())
    .fetch_all(pool)
    .await
    .map_err(|e| crate::error::store_error("reading the catalog", e))?;
    // A table that is not there is the store's own start-up error.
    if present.is_empty() {
        return Ok(());
    }
    let lacking: Vec<&str> = crate::record::DEFAULT_COLUMNS
        .into_iter()
        .filter(|name| !present.iter().any(|p| p == name))
        .collect();
    if !lacking.is_empty() {
        return Err(StoreError::Config(format!(
            "a Job record reads the default table's columns by name, and table {} has no {}: give a select list \
             naming them (PgStoreOptions::select), or use PgStore::new with a record of your own",
            options.table,
            lacking.join(", ")
        )));
    }
    let running = options.states.get(queue_core::JobState::Processing);
    if running != queue_core::JobState::Processing.as_str() {
        return Err(StoreError::Config(format!(
            "a Job record reads a running job's state as \"processing\", and table {} stores it as {running:?}: \
             use PgStore::new with a record of your own",
            options.table
        )));
    }
    Ok(())
}

impl<R> PgStore<R>
where
    R: JobRecord + for<'r> FromRow<'r, PgRow>,
    R::Id: PgKey,
{
    /// A store whose records decode with `R`'s `FromRow`.
    pub async fn new(pool: PgPool, options: PgStoreOptions) -> Result<Self, StoreError> {
        PgStore::with_decoder(pool, options, |row| R::from_row(row)).await
    }
}

impl<R> PgStore<R>
where
    R: JobRecord,
    R::Id: PgKey,
{
    /// A store whose records decode with `decode` (the select list is
    /// `options.select`). Validates the options against the catalog, starts
    /// the listener and, in lease mode, the batched completer. Must be
    /// called inside a Tokio runtime.
    pub async fn with_decoder(
        pool: PgPool,
        options: PgStoreOptions,
        decode: Decoder<R>,
    ) -> Result<Self, StoreError> {
        PgStore::build(pool, options, RecordDecoder::Row(decode)).await
    }

    async fn build(
        pool: PgPool,
        options: PgStoreOptions,
        decode: RecordDecoder<R>,
    ) -> Result<Self, StoreError> {
        options.check()?;
        if pool.options().get_test_before_acquire() {
            tracing::info!(
                "the pool pings each connection before handing it out, a round trip more per \
                 claim and completion; build it with PgPoolOptions::test_before_acquire(false)"
            );
        }
        let (shape, absent) =
            catalog::inspect(&pool, &options, R::Id::PG_TYPES, catalog::User::Worker).await?;
        if absent.contains(&Column::ClaimToken) && absent.contains(&Column::StartedAt) {
            // A late completion of a reset attempt would land on the
            // job's next claim.
            return Err(StoreError::Config(format!(
                "table {}: {}",
                options.table,
                crate::OptionsError::NoFencingColumn
            )));
        }
        if absent.contains(&Column::LastHeartbeatAt) {
            // Stalls would be judged by the claim time alone: a healthy job
            // running longer than the stalled age would be reset and run
            // again, over and over.
            return Err(StoreError::Config(format!(
                "table {} has no heartbeat column, so a job running longer than the resetter's \
                 stalled age would be taken for a crashed one and run again, over and over: keep it \
                 in a bookkeeping table, with no change to the table (`bookkeeping_table(..)`; in a \
                 config file, bookkeeping_table), or add a timestamptz column and map it \
                 (`column(Column::LastHeartbeatAt, ..)`; columns.last_heartbeat_at)",
                options.table
            )));
        }
        let statistics =
            Statistics::at_start(&pool, &options, &absent, &shape.live_partitions).await?;
        let sql = Arc::new(Statements::new(&options, &shape, &absent));
        let admin = PgAdmin::from_parts(pool.clone(), options.clone(), &shape, absent);
        admin.measure_clock().await?;
        admin.keep_partitions_ahead().await;
        let options_cursor = options.cursor_rescan_after().map(ClaimCursor::new);
        let rides = match options.mode {
            // Half the pool at most waits, locked, for handlers.
            ExecutionMode::Transactional => Some(Rides::new(
                options.lock_rides,
                (pool.options().get_max_connections() as usize / 2).max(1),
            )),
            ExecutionMode::Lease => None,
        };
        let states = Arc::new(options.states.clone());
        let options_table = options.table.clone();
        let wake = Arc::new(listen::Wake::default());
        let rules = Arc::new(ClaimRules::new(&options_table));
        let listener = listen::spawn(
            &pool,
            options.notify_channel(),
            wake.clone(),
            sql.claims_read_kind().then(|| rules.clone()),
        );
        let stash = Stash::new(pool.clone());
        let (completer, outcomes) = mpsc::unbounded_channel();
        tokio::spawn(complete_batches(
            stash.clone(),
            sql.clone(),
            states.clone(),
            options.completion_delay,
            outcomes,
        ));
        Ok(PgStore {
            inner: Arc::new(Inner {
                pool,
                stash,
                prepared: PreparedStatements::new(options.prepared_job_statements),
                options,
                sql,
                states,
                decode,
                wake,
                listener,
                completer,
                cursor: options_cursor,
                rides,
                admin,
                enums_as_text: AtomicBool::new(false),
                statistics,
                rules,
                limited_due: std::sync::Mutex::new(None),
            }),
        })
    }

    /// The standard columns the table lacks, each with the feature that is
    /// off because of it.
    pub fn disabled_features(&self) -> Vec<(Column, &'static str)> {
        self.inner.admin.disabled_features()
    }

    /// Takes the times callers pass (`now` of claims, heartbeats, finishes
    /// and resets) as readings of `clock`, and translates them onto the
    /// database's clock, measured against `clock` now and every minute
    /// after: heartbeats are written, and stalls judged, on the database's
    /// clock, so a process whose clock is off by a minute neither keeps a
    /// dead worker's jobs looking alive nor resets healthy ones. The
    /// default is the system clock, which workers and resetters use by
    /// default; give the same clock as theirs if they were given another.
    /// Offsets under a second are ignored.
    pub async fn set_clock(&self, clock: Arc<dyn queue_core::Clock>) -> Result<(), StoreError> {
        self.inner.admin.set_clock(clock).await
    }

    /// The pool the store runs on.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The options the store was built with.
    pub fn options(&self) -> &PgStoreOptions {
        &self.inner.options
    }

    /// The admin contract on the store's table (also implemented by the
    /// store itself, through this).
    pub fn admin(&self) -> &PgAdmin<R::Id> {
        &self.inner.admin
    }

    fn states(&self) -> &StateValues {
        &self.inner.options.states
    }

    fn has(&self, column: Column) -> bool {
        self.inner.admin.has(column)
    }

    /// The row that records `transition` for `lease`, its times on the
    /// database's clock.
    fn finish_row(
        &self,
        lease: &Lease<R::Id>,
        transition: Transition,
        now: DateTime<Utc>,
    ) -> Result<FinishRow<R::Id>, StoreError> {
        let transition = match self.adapt(transition) {
            Transition::Retry { message, retry_at } => Transition::Retry {
                message,
                retry_at: self.inner.admin.to_db(retry_at),
            },
            other => other,
        };
        FinishRow::new(
            lease,
            transition,
            self.inner.admin.to_db(now),
            self.states(),
        )
    }

    /// Records `row` through the batched completer.
    async fn record_batched(&self, row: FinishRow<R::Id>) -> Result<WriteResult, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.inner
            .completer
            .send(Completion { row, reply })
            .map_err(|_| StoreError::Unavailable {
                context: "recording a job outcome".into(),
                source: "the store's completer has stopped".into(),
            })?;
        answer.await.map_err(|_| StoreError::Unavailable {
            context: "recording a job outcome".into(),
            source: "the store's completer dropped the request".into(),
        })?
    }

    /// Whether the table bounds retries: it counts failures up, or the
    /// attempts left down.
    fn counts_attempts(&self) -> bool {
        self.has(Column::NumFailures) || self.has(Column::AttemptsLeft)
    }

    /// Without a failure counter retries cannot be bounded, so they are off.
    fn adapt(&self, transition: Transition) -> Transition {
        match transition {
            Transition::Retry { message, .. } if !self.counts_attempts() => {
                Transition::Fail {
                    message: format!(
                        "{message} (not retried: the table counts no failures: it has neither a num_failures nor an attempts_left column)"
                    ),
                }
            }
            other => other,
        }
    }

    /// Reads the claimed records by key with `statement` (through the view,
    /// or with enum columns as text).
    async fn records_by_key(
        conn: &mut PgConnection,
        statement: &Statement,
        ids: Vec<R::Id>,
    ) -> Result<HashMap<R::Id, PgRow>, StoreError> {
        let mut ids = Some(ids);
        let rows = query(statement, |p| match p {
            Param::Ids => ids.take().map(Value::Keys),
            _ => None,
        })?
        .fetch_all(conn)
        .await
        .map_err(|e| store_error("reading claimed jobs by key", e))?;
        let mut by_id = HashMap::with_capacity(rows.len());
        for row in rows {
            let id: R::Id = row
                .try_get(ID.1)
                .map_err(|e| store_error("reading the key of a view row", e))?;
            by_id.insert(id, row);
        }
        Ok(by_id)
    }

    /// Claims up to `params.limit` rows after the cursor (`after`), or from
    /// the start of the claim order; the rows come back in claim order.
    async fn claim_rows(
        &self,
        conn: &mut PgConnection,
        params: &ClaimParams<'_, PgConditions>,
        limit: usize,
        conditions: &[PgCondition],
        paused: &[String],
        after: Option<&Position<R::Id>>,
    ) -> Result<Vec<PgRow>, StoreError> {
        let statement = after
            .and_then(|_| self.inner.sql.claim_after_cursor(limit))
            .unwrap_or_else(|| self.inner.sql.claim(conditions, paused, limit));
        self.run_claim(conn, &statement, params, conditions, paused, after, None)
            .await
    }

    /// Runs a claim `statement` (bound as `params`, `paused`, the cursor
    /// `after` and the kind `only` ask) on `conn`; its rows in claim order.
    #[allow(clippy::too_many_arguments)]
    async fn run_claim(
        &self,
        conn: &mut PgConnection,
        statement: &crate::sql::Statement,
        params: &ClaimParams<'_, PgConditions>,
        conditions: &[PgCondition],
        paused: &[String],
        after: Option<&Position<R::Id>>,
        only: Option<&str>,
    ) -> Result<Vec<PgRow>, StoreError> {
        let mut q = query(statement, |p| match p {
            Param::State(s) => Some(state::<R::Id>(self.states(), s)),
            Param::Now => Some(Value::Time(self.inner.admin.to_db(params.now))),
            Param::Worker => Some(Value::Text(params.worker.to_owned())),
            Param::CursorPriority => after.map(|a| Value::Int(a.priority)),
            Param::CursorKey => after.map(|a| Value::Key(a.key.clone())),
            Param::PausedKinds => Some(Value::Texts(
                paused.iter().map(|k| Some(k.clone())).collect(),
            )),
            Param::OnlyKind => only.map(|k| Value::Text(k.to_owned())),
            _ => None,
        })?;
        for c in conditions {
            for arg in c.args() {
                q = bind_arg(q, arg.clone());
            }
        }
        let mut rows = q
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| store_error("claiming jobs", e))?;
        // Back into claim order (the update returns rows in key order).
        rows.sort_by_cached_key(|row| read_at::<i32>(row, RANK).unwrap_or(i32::MAX));
        Ok(rows)
    }

    /// Up to `want` jobs of limited kind `kind`, as many as its limits
    /// allow now, on `conn` in one transaction: the kind's row in the kinds
    /// table locked first (claims of the kind take turns, in every
    /// process), its running jobs counted, its bucket read, the jobs
    /// claimed and the bucket spent. If the limits held it back, notes
    /// when to look again.
    async fn claim_limited(
        &self,
        conn: &mut PgConnection,
        params: &ClaimParams<'_, PgConditions>,
        conditions: &[PgCondition],
        kind: &str,
        want: usize,
    ) -> Result<Vec<PgRow>, StoreError> {
        use queue_core::limits::{budget, spend, Tokens};
        let context = "claiming jobs of a limited kind";
        let kinds = crate::sql::kinds::kinds_table(&self.inner.options.table);
        let mut tx = sqlx::Connection::begin(&mut *conn)
            .await
            .map_err(|e| store_error(context, e))?;
        let row = sqlx::query(sqlx::AssertSqlSafe(crate::sql::kinds::lock_limits(&kinds)))
            .bind(kind)
            .fetch_optional(&mut *tx)
            .await
            .map_err(|e| store_error(context, e))?;
        // Paused or no longer limited since the rules were read: the next
        // reading puts it where it belongs.
        let Some(row) = row else {
            tx.commit().await.map_err(|e| store_error(context, e))?;
            return Ok(Vec::new());
        };
        let get = |e| store_error(context, e);
        let max_running: Option<i32> = row.try_get("max_running").map_err(get)?;
        let per_second: Option<f64> = row.try_get("per_second").map_err(get)?;
        let burst: Option<i32> = row.try_get("burst").map_err(get)?;
        let tokens: Option<f64> = row.try_get("tokens").map_err(get)?;
        let tokens_at: Option<DateTime<Utc>> = row.try_get("tokens_at").map_err(get)?;
        let limits_set_at: Option<DateTime<Utc>> = row.try_get("limits_set_at").map_err(get)?;
        let limits = crate::admin::kind_limits(max_running, per_second, burst);
        // The ledger of the kind's claims, where the table keeps one and
        // the kind limits its running jobs.
        let ledger = self
            .inner
            .sql
            .limited_ledger
            .as_ref()
            .filter(|_| limits.max_running.is_some());
        let running = match (limits.max_running, ledger) {
            (None, _) => 0,
            (Some(_), Some(ledger)) => {
                count_in_ledger(&mut tx, ledger, kind, limits_set_at).await?
            }
            (Some(_), None) => {
                let filter = JobFilter::default()
                    .states([queue_core::JobState::Processing])
                    .kinds([kind]);
                self.inner.admin.count_on(&mut tx, &filter).await?
            }
        };
        // On the database's clock, as every process's claims are.
        let now = self.inner.admin.to_db(params.now);
        let bucket = match (tokens, tokens_at) {
            (Some(available), Some(at)) => Some(Tokens { available, at }),
            _ => None,
        };
        let (allowed, bucket) = budget(&limits, running, bucket, now);
        let take = usize::try_from(allowed).unwrap_or(usize::MAX).min(want);
        let rows = match (take, self.inner.sql.claim_of_kind(conditions, take)) {
            (0, _) | (_, None) => Vec::new(),
            (_, Some(statement)) => {
                self.run_claim(
                    &mut tx,
                    &statement,
                    params,
                    conditions,
                    &[],
                    None,
                    Some(kind),
                )
                .await?
            }
        };
        if let (Some(ledger), false) = (ledger, rows.is_empty()) {
            enter_in_ledger(&mut tx, ledger, kind, &rows).await?;
        }
        if let Some(left) = spend(bucket, rows.len() as u64) {
            sqlx::query(sqlx::AssertSqlSafe(crate::sql::kinds::spend(&kinds)))
                .bind(kind)
                .bind(left.available)
                .bind(left.at)
                .execute(&mut *tx)
                .await
                .map_err(|e| store_error(context, e))?;
        }
        tx.commit().await.map_err(|e| store_error(context, e))?;
        // Held back while it may have more waiting: look again when a
        // token comes (or a slot may have freed, after a short while).
        if rows.len() == take && take < want {
            let taken = rows.len() as f64;
            let left = bucket.map(|b| b.available - taken);
            let wait = match (limits.bucket(), left) {
                (Some((rate, _)), Some(left)) if left < 1.0 => {
                    std::time::Duration::from_secs_f64(((1.0 - left) / rate).clamp(0.001, 5.0))
                }
                _ => LIMITED_RECHECK,
            };
            let due = params.now + chrono::TimeDelta::from_std(wait).unwrap_or_default();
            let mut noted = self
                .inner
                .limited_due
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            *noted = Some(noted.map_or(due, |d| d.min(due)));
        }
        Ok(rows)
    }

    /// Sends the cursor's probe off the claim path (see [`crate::cursor`]):
    /// it reads where the first waiting job is, and moves the cursor there.
    fn probe_cursor(&self) {
        let store = self.clone();
        tokio::spawn(async move { store.run_probe().await });
    }

    async fn run_probe(&self) {
        let Some(cursor) = &self.inner.cursor else {
            return;
        };
        let (Some(probes), Some(at)) = (&self.inner.sql.cursor_probe, cursor.position()) else {
            // No cursor to probe from: the next claim reads from the start.
            cursor.probe_ended(std::time::Instant::now(), Duration::ZERO, None);
            return;
        };
        let began = std::time::Instant::now();
        let found = aside("the claim cursor's probe", self.probe(&probes.probe, at)).await;
        let took = began.elapsed();
        if cursor.probe_ended(std::time::Instant::now(), took, found) {
            self.inner.wake.all();
        }
    }

    /// Reads the paused and limited kinds again off the claim path, on a
    /// connection of the pool, unless a read is already on its way. A
    /// failed read is logged at debug level: the claim after the rules
    /// expire reads them itself, and says why it could not.
    fn refresh_rules_aside(&self) {
        if !self.inner.rules.begin_refresh() {
            return;
        }
        let store = self.clone();
        tokio::spawn(async move {
            let _refreshing = store.inner.rules.refreshing();
            let read = async {
                let mut conn = store
                    .inner
                    .pool
                    .acquire()
                    .await
                    .map_err(|e| store_error("reading the paused and limited kinds", e))?;
                store.inner.rules.read(&mut conn).await
            };
            aside("reading the paused and limited kinds", read).await;
        });
    }

    /// Measures the walk from the start of the claim order to the first
    /// waiting job, off the claim path: the blocks it reads say whether it
    /// is costly (see [`crate::cursor`]).
    fn measure_walk(&self) {
        let store = self.clone();
        tokio::spawn(async move {
            let Some(cursor) = &store.inner.cursor else {
                return;
            };
            let blocks = aside("measuring the claim's walk", store.walk_blocks()).await;
            if let Some(blocks) = blocks.filter(|b| *b >= crate::cursor::COSTLY_BLOCKS) {
                tracing::info!(
                    table = %store.inner.options.table,
                    blocks,
                    "a claim from the start walks the entries of many jobs no vacuum could remove (a session holding an old snapshot?): claims stay at the cursor, and a probe aside finds jobs before it"
                );
            }
            cursor.measured(blocks);
        });
    }

    /// The blocks `EXPLAIN (ANALYZE, BUFFERS)` counts for the walk.
    async fn walk_blocks(&self) -> Result<u64, StoreError> {
        let context = "measuring the claim's walk";
        let Some(probes) = &self.inner.sql.cursor_probe else {
            return Ok(0);
        };
        let now = self.inner.admin.to_db(Utc::now());
        let explained: serde_json::Value = query(&probes.walk, |p| match p {
            Param::Now => Some(Value::<R::Id>::Time(now)),
            _ => None,
        })?
        .fetch_one(&self.inner.pool)
        .await
        .and_then(|row| row.try_get(0))
        .map_err(|e| store_error(context, e))?;
        let plan = &explained[0]["Plan"];
        let blocks = |key: &str| plan[key].as_u64().unwrap_or(0);
        Ok(blocks("Shared Hit Blocks") + blocks("Shared Read Blocks"))
    }

    async fn probe(
        &self,
        statement: &crate::sql::Statement,
        at: Position<R::Id>,
    ) -> Result<Probed<R::Id>, StoreError> {
        let context = "probing for the first waiting job";
        let now = self.inner.admin.to_db(Utc::now());
        let row = query(statement, |p| match p {
            Param::CursorPriority => Some(Value::Int(at.priority)),
            Param::CursorKey => Some(Value::Key(at.key.clone())),
            Param::Now => Some(Value::Time(now)),
            _ => None,
        })?
        .fetch_one(&self.inner.pool)
        .await
        .map_err(|e| store_error(context, e))?;
        let get = |e| store_error(context, e);
        let priority: Option<i64> = row.try_get("priority").map_err(get)?;
        let key: Option<R::Id> = row.try_get("key").map_err(get)?;
        Ok(Probed {
            first: priority
                .zip(key)
                .map(|(priority, key)| Position { priority, key }),
            before_cursor: row.try_get("before").map_err(get)?,
            due_waiting: row.try_get("due").map_err(get)?,
        })
    }

    /// Where a claimed row is in the claim order, for the cursor; `None` if
    /// the row does not say (the next claim then reads from the start).
    fn position(&self, row: Option<&PgRow>) -> Option<Position<R::Id>> {
        let row = row?;
        let priority = if self.inner.sql.cursor_reads_priority() {
            // The claim's last column.
            let last = row.len().checked_sub(1)?;
            read_at::<i64>(row, (last, CURSOR_PRIORITY_COLUMN)).ok()?
        } else {
            0
        };
        let key = read_at(row, ID).ok()?;
        Some(Position { priority, key })
    }
}

// Where a claimed row carries what the store itself reads: the claim
// statement returns these four columns first, in this order (read by
// position: thousands of rows a second share one column list).
/// How long the claim cursor's probe may take before it is given up (the
/// next one goes out after the rescan interval).
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// A read off the claim path (the cursor's probe, the measurement of its
/// walk), given [`PROBE_TIMEOUT`]; `None` if it failed or timed out, which
/// is logged at debug level: the claims go on as they were.
async fn aside<T>(
    what: &str,
    read: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Option<T> {
    match tokio::time::timeout(PROBE_TIMEOUT, read).await {
        Ok(Ok(value)) => Some(value),
        Ok(Err(error)) => {
            tracing::debug!(%error, "{what} failed");
            None
        }
        Err(_) => {
            tracing::debug!("{what} timed out after {PROBE_TIMEOUT:?}");
            None
        }
    }
}
/// How soon an idle worker looks again at a kind its concurrency limit
/// held back: a slot frees when a job of the kind ends, in any process.
const LIMITED_RECHECK: std::time::Duration = std::time::Duration::from_millis(200);

/// A limited kind's running jobs counted through the ledger of its
/// claims (see [`crate::sql::limited`]), in its claim's transaction
/// `tx`: in the table itself (and entered) until the rule set at
/// `limits_set_at` has settled, then from the ledger's entries.
async fn count_in_ledger(
    tx: &mut PgConnection,
    ledger: &crate::sql::limited::LedgerStatements,
    kind: &str,
    limits_set_at: Option<DateTime<Utc>>,
) -> Result<u64, StoreError> {
    let context = "counting a limited kind's running jobs";
    let current: bool = sqlx::query_scalar(sqlx::AssertSqlSafe(ledger.current.as_str()))
        .bind(kind)
        .bind(limits_set_at)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| store_error(context, e))?;
    let count = if current {
        &ledger.count_ledger
    } else {
        &ledger.count_table
    };
    let running: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(count.as_str()))
        .bind(kind)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| store_error(context, e))?;
    Ok(u64::try_from(running).unwrap_or(0))
}

/// Enters the jobs a limited kind's claim took (`rows`, as the claim
/// returned them) in the ledger, in the claim's transaction `tx`.
async fn enter_in_ledger(
    tx: &mut PgConnection,
    ledger: &crate::sql::limited::LedgerStatements,
    kind: &str,
    rows: &[PgRow],
) -> Result<(), StoreError> {
    let context = "entering a limited kind's claims in its ledger";
    let mut ids = Vec::with_capacity(rows.len());
    let mut tokens = Vec::with_capacity(rows.len());
    for row in rows {
        // The ledger is kept for the default table only, whose key is a
        // bigint.
        ids.push(read_at::<i64>(row, ID)?);
        tokens.push(read_at::<i64>(row, TOKEN)?);
    }
    sqlx::query(sqlx::AssertSqlSafe(ledger.enter.as_str()))
        .bind(kind)
        .bind(ids)
        .bind(tokens)
        .execute(&mut *tx)
        .await
        .map_err(|e| store_error(context, e))?;
    Ok(())
}

const ID: (usize, &str) = (0, "__queue_id");
const TOKEN: (usize, &str) = (1, "__queue_token");
const FAILURES: (usize, &str) = (2, "__queue_failures");
const RANK: (usize, &str) = (3, "__queue_rank");

fn read<T: for<'r> sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>>(
    row: &PgRow,
    column: &str,
) -> Result<T, StoreError> {
    row.try_get(column)
        .map_err(|e| store_error("reading a claimed row", e))
}

/// [`read`] by position; on failure again by name, so that the error names
/// the column.
fn read_at<T: for<'r> sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>>(
    row: &PgRow,
    (index, name): (usize, &str),
) -> Result<T, StoreError> {
    row.try_get(index).or_else(|_| read(row, name))
}

#[async_trait]
impl<R> Store for PgStore<R>
where
    R: JobRecord,
    R::Id: PgKey,
{
    type Id = R::Id;
    type Record = R;
    type Conditions = PgConditions;
    type JobStore = PgJobTransaction<R::Id>;

    async fn claim(
        &self,
        params: ClaimParams<'_, PgConditions>,
    ) -> Result<Vec<Claimed<Self>>, StoreError> {
        let conditions = params.conditions.map(Vec::as_slice).unwrap_or(&[]);
        for c in conditions {
            if c.placeholders() != c.args().len() {
                return Err(StoreError::Conditions(format!(
                    "a condition has {} placeholders but {} bound values (write a literal brace as {{{{ or }}}}): {c:?}",
                    c.placeholders(),
                    c.args().len()
                )));
            }
        }
        self.inner.wake.claim_starts();
        let mut on = self.inner.stash.lend("claiming jobs").await?;
        let rules = if self.inner.sql.claims_read_kind() {
            match self.inner.rules.cached() {
                Cached::Fresh(rules) => rules,
                // Read aside, so that no claim waits for the rules while
                // they are younger than the promise.
                Cached::Aging(rules) => {
                    self.refresh_rules_aside();
                    rules
                }
                Cached::Expired => match self.inner.rules.read(on.conn()).await {
                    Ok(rules) => rules,
                    // A connection that died while stashed: read on a new one.
                    Err(error) => {
                        on = on.replace_after(error).await?;
                        self.inner.rules.read(on.conn()).await?
                    }
                },
            }
        } else {
            Default::default()
        };
        // Limited kinds first, each as far as its limits allow; the claim
        // of everything else passes over them (and over paused kinds).
        let mut limited = Vec::new();
        for kind in rules.limited.iter().filter(|k| !rules.paused.contains(k)) {
            let want = params.limit.saturating_sub(limited.len());
            if want == 0 {
                break;
            }
            let rows = loop {
                match self
                    .claim_limited(on.conn(), &params, conditions, kind, want)
                    .await
                {
                    Ok(rows) => break rows,
                    // A connection that died while stashed: again on a new
                    // one. Otherwise the error stands (jobs claimed for an
                    // earlier kind are left to the resetter, as a crash
                    // leaves them).
                    Err(error) => on = on.replace_after(error).await?,
                }
            };
            limited.extend(rows);
        }
        let paused = &rules.set_apart;
        let main_limit = params.limit - limited.len();
        // Claims with extra conditions, or passing over paused kinds,
        // neither use nor move the cursor: what they pass over may be
        // claimable for the others, or again soon.
        let cursor = self
            .inner
            .cursor
            .as_ref()
            .filter(|_| conditions.is_empty() && paused.is_empty());
        let start = cursor.map(|c| c.start(std::time::Instant::now()));
        if start.as_ref().is_some_and(|s| s.probe) {
            self.probe_cursor();
        }
        let after = start.as_ref().and_then(|s| s.at.clone());
        let started = std::time::Instant::now();
        // How long the claim from the start took, if one ran (the cursor
        // learns from it whether that walk is costly).
        let mut from_start = None;
        let claimed = loop {
            if main_limit == 0 {
                break Ok((on, Vec::new()));
            }
            let began = std::time::Instant::now();
            let mut rows = self
                .claim_rows(
                    on.conn(),
                    &params,
                    main_limit,
                    conditions,
                    paused,
                    after.as_ref(),
                )
                .await;
            if after.is_none() {
                from_start = Some(began.elapsed());
            }
            if after.is_some() && rows.as_ref().is_ok_and(Vec::is_empty) {
                // Nothing at the cursor: the backlog is over, and jobs
                // that became claimable before it must not wait for the
                // worker's next poll. While the walk from the start is
                // costly, a probe looks for them off the claim path.
                let next = cursor.map(|c| c.nothing_at_cursor(std::time::Instant::now()));
                match next {
                    Some(NothingAtCursor::FromStart) => {
                        let began = std::time::Instant::now();
                        rows = self
                            .claim_rows(on.conn(), &params, main_limit, conditions, paused, None)
                            .await;
                        from_start = Some(began.elapsed());
                    }
                    Some(NothingAtCursor::Probe) => self.probe_cursor(),
                    Some(NothingAtCursor::Wait) | None => {}
                }
            }
            match rows {
                Ok(rows) => break Ok((on, rows)),
                // A stashed or pooled connection whose backend died while
                // it waited: claim again on a new one (a claim that
                // committed unseen leaves its jobs to the resetter, as a
                // crash would).
                Err(error) => match on.replace_after(error).await {
                    Ok(live) => on = live,
                    Err(error) => break Err(error),
                },
            }
        };
        if let Ok((_, rows)) = &claimed {
            if !rows.is_empty() {
                self.inner.statistics.claim_took(started.elapsed());
            }
            // Jobs of limited kinds count towards the table's growth too.
            if rows.len() + limited.len() > 0 {
                self.inner.statistics.claimed(rows.len() + limited.len());
            }
        }
        if let (Some(cursor), Some(start)) = (cursor, &start) {
            match &claimed {
                Ok((_, rows)) => {
                    let suspect = cursor.ended(
                        std::time::Instant::now(),
                        start.epoch,
                        self.position(rows.last()),
                        rows.len() >= main_limit,
                        from_start,
                        false,
                    );
                    if suspect {
                        self.measure_walk();
                    }
                }
                Err(_) => {
                    cursor.ended(
                        std::time::Instant::now(),
                        start.epoch,
                        None,
                        false,
                        None,
                        true,
                    );
                }
            }
        }
        let (mut on, rows) = match claimed {
            // With the table checked at start-up, a claim that fails for
            // good with conditions fails for its conditions.
            Err(error) if !conditions.is_empty() && !error.is_retryable() => {
                return Err(StoreError::Conditions(format!(
                    "{}; the conditions: {conditions:?}",
                    error.chain()
                )))
            }
            claimed => claimed?,
        };
        let rows = if limited.is_empty() {
            rows
        } else {
            limited.into_iter().chain(rows).collect()
        };
        if rows.is_empty() {
            on.put_back();
            return Ok(Vec::new());
        }
        let mut leases = Vec::with_capacity(rows.len());
        let reads_max = self.has(Column::MaxAttempts) || self.has(Column::AttemptsLeft);
        let reads_amo = self.has(Column::AtMostOnce);
        for row in &rows {
            let failures: i64 = read_at(row, FAILURES)?;
            let mut limits = JobLimits::default();
            if reads_max {
                let max: Option<i64> = row
                    .try_get(MAX_ATTEMPTS_COLUMN)
                    .map_err(|e| store_error("reading a claimed job's max_attempts", e))?;
                limits.max_attempts = max.map(|m| u32::try_from(m.max(1)).unwrap_or(u32::MAX));
            }
            if reads_amo {
                limits.at_most_once = row
                    .try_get(AT_MOST_ONCE_COLUMN)
                    .map_err(|e| store_error("reading whether a claimed job is at-most-once", e))?;
            }
            leases.push(Lease {
                id: read_at(row, ID)?,
                token: read_at(row, TOKEN)?,
                attempt: u32::try_from(failures.max(0))
                    .unwrap_or(u32::MAX)
                    .saturating_add(1),
                limits,
            });
        }
        // A claim committed without waiting for its WAL flush could be
        // forgotten by a server crash, and its job run again: before an
        // at-most-once job starts, a durable commit flushes the claim.
        if self.inner.options.claim_commit == ClaimCommit::Async
            && leases.iter().any(|l| l.limits.at_most_once)
        {
            sqlx::query("SELECT pg_catalog.txid_current()")
                .execute(on.conn())
                .await
                .map_err(|e| store_error("making an at-most-once claim durable", e))?;
        }
        let writes = ClaimWrites::new(params.now, params.worker);
        let decode = |row: &PgRow, lease| self.inner.decode.decode(row, lease, &writes);
        let decode_error = |id: &R::Id, message: String| DecodeError {
            id: id.to_string(),
            message,
        };
        let keyed = |mut by_id: HashMap<R::Id, PgRow>, missing: &str| {
            leases
                .iter()
                .map(|lease| match by_id.remove(&lease.id) {
                    Some(row) => {
                        decode(&row, lease).map_err(|e| decode_error(&lease.id, e.to_string()))
                    }
                    None => Err(decode_error(&lease.id, missing.to_owned())),
                })
                .collect::<Vec<Result<R, DecodeError>>>()
        };
        let ids = || leases.iter().map(|l| l.id.clone()).collect::<Vec<_>>();
        let sql = &self.inner.sql;
        let as_text = sql
            .select_text
            .as_ref()
            .filter(|_| self.inner.enums_as_text.load(Ordering::Relaxed));
        // A second read, by key, on the claim's connection (no second
        // checkout): through the view, or with enum columns as text.
        let records: Vec<Result<R, DecodeError>> = match (&sql.select_view, as_text) {
            (Some(view), _) => {
                let by_id = Self::records_by_key(on.conn(), view, ids()).await?;
                let missing = format!(
                    "the row is not visible through the view {}",
                    self.inner
                        .options
                        .view
                        .as_ref()
                        .map(|v| v.quoted())
                        .unwrap_or_default()
                );
                keyed(by_id, &missing)
            }
            (None, Some(text)) => keyed(
                Self::records_by_key(on.conn(), text, ids()).await?,
                "the row vanished after its claim",
            ),
            (None, None) => {
                let records: Vec<Result<R, DecodeError>> = rows
                    .iter()
                    .zip(&leases)
                    .map(|(row, lease)| {
                        decode(row, lease).map_err(|e| decode_error(&lease.id, e.to_string()))
                    })
                    .collect();
                let failed = |records: &[Result<R, DecodeError>]| {
                    records.iter().filter(|r| r.is_err()).count()
                };
                let mismatched = records
                    .iter()
                    .any(|r| matches!(r, Err(e) if e.message.contains("mismatched types")));
                match &sql.select_text {
                    // The record reads an enum column as a string, which
                    // sqlx refuses: read the rows again with enum columns
                    // cast to text, and from now on always so.
                    Some(text) if mismatched => {
                        let again = keyed(
                            Self::records_by_key(on.conn(), text, ids()).await?,
                            "the row vanished after its claim",
                        );
                        if failed(&again) < failed(&records) {
                            self.inner.enums_as_text.store(true, Ordering::Relaxed);
                            tracing::info!(
                                table = %self.inner.options.table,
                                "the record type reads enum columns as strings: claimed rows are read again with enum columns cast to text (one more round trip per claim; a select list with the casts saves it)"
                            );
                            again
                        } else {
                            records
                        }
                    }
                    _ => records,
                }
            }
        };
        let transactional = self.inner.options.mode == ExecutionMode::Transactional;
        let claimed = leases
            .into_iter()
            .zip(records)
            .map(|(lease, record)| {
                let claim = transactional.then(|| JobClaim {
                    sql: self.inner.sql.clone(),
                    states: self.inner.states.clone(),
                    lease: lease.clone(),
                    stash: self.inner.stash.clone(),
                    prepared: self.inner.prepared.clone(),
                    rides: self.inner.rides.clone(),
                    kind: record.as_ref().ok().map(|r| r.kind().to_owned()),
                });
                Claimed {
                    lease,
                    record,
                    job_store: PgJobTransaction::claimed(self.inner.pool.clone(), claim),
                }
            })
            .collect();
        on.put_back();
        Ok(claimed)
    }

    async fn finish(
        &self,
        job_store: PgJobTransaction<R::Id>,
        lease: &Lease<R::Id>,
        transition: Transition,
        now: DateTime<Utc>,
    ) -> Result<WriteResult, StoreError> {
        let complete = transition == Transition::Complete;
        let row = self.finish_row(lease, transition, now)?;
        if let Some(recorded) = job_store.end(&row, complete).await {
            return recorded;
        }
        // No job transaction: the batched completer records it.
        self.record_batched(row).await
    }

    async fn finish_again(
        &self,
        lease: &Lease<R::Id>,
        transition: Transition,
        now: DateTime<Utc>,
    ) -> Result<WriteResult, StoreError> {
        let row = self.finish_row(lease, transition, now)?;
        self.record_batched(row).await
    }

    async fn attempt_cut_off(&self, job_store: &mut PgJobTransaction<R::Id>) -> Option<String> {
        job_store.cut_off().await
    }

    async fn expire(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<R::Id>, StoreError> {
        // The resetter's pass, which every worker process runs, also keeps
        // the partitions of a partitioned table ahead of the clock.
        self.inner.admin.keep_partitions_ahead().await;
        self.inner.admin.expire(now, limit).await
    }

    fn counts_resets(&self) -> bool {
        self.has(Column::NumResets)
    }

    fn counts_failures(&self) -> bool {
        self.counts_attempts()
    }

    fn job_waiting(&self, job_store: &mut PgJobTransaction<R::Id>) {
        job_store.board_early();
    }

    fn finish_ends_transaction(&self, job_store: &PgJobTransaction<R::Id>) -> bool {
        job_store.in_transaction()
    }

    async fn heartbeat(
        &self,
        leases: &[Lease<R::Id>],
        now: DateTime<Utc>,
    ) -> Result<HeartbeatReport<R::Id>, StoreError> {
        if leases.is_empty() {
            return Ok(HeartbeatReport::default());
        }
        let ids = leases.iter().map(|l| l.id.clone()).collect::<Vec<_>>();
        let tokens = leases.iter().map(|l| l.token).collect::<Vec<_>>();
        let context = "heartbeating running jobs";
        let mut tries = OnLiveConnection::new(&self.inner.pool, context);
        let rows = loop {
            let mut conn = tries.connection().await?;
            let (mut ids, mut tokens) = (Some(ids.clone()), Some(tokens.clone()));
            let heartbeat = query(&self.inner.sql.heartbeat, |p| match p {
                Param::Ids => ids.take().map(Value::Keys),
                Param::Tokens => tokens.take().map(Value::Ints),
                Param::State(s) => Some(state(self.states(), s)),
                Param::Now => Some(Value::Time(self.inner.admin.to_db(now))),
                _ => None,
            })?;
            let done = heartbeat
                .fetch_all(&mut *conn)
                .await
                .map_err(|e| store_error(context, e));
            if let Some(done) = tries.settle(conn, done) {
                break done?;
            }
        };
        let mut held = HashMap::with_capacity(rows.len());
        for row in &rows {
            let id: R::Id = read(row, "id")?;
            let cancel: bool = read(row, "cancel")?;
            held.insert(id, cancel);
        }
        let mut report = HeartbeatReport::default();
        for lease in leases {
            match held.get(&lease.id) {
                Some(true) => report.cancel_requested.push(lease.id.clone()),
                Some(false) => {}
                None => report.gone.push(lease.id.clone()),
            }
        }
        Ok(report)
    }

    async fn append_log(
        &self,
        lease: &Lease<R::Id>,
        entry: LogEntry,
    ) -> Result<WriteResult, StoreError> {
        let Some(statement) = &self.inner.sql.append_log else {
            tracing::debug!(id = %lease.id, "execution log entry dropped: the table has no execution_logs column");
            return Ok(WriteResult::NotKept);
        };
        // Written outside the job's transaction (whose key-share lock does
        // not block it), so the log of a failed attempt survives.
        let json = serde_json::to_value(&entry).map_err(|e| StoreError::Backend {
            context: "encoding an execution log entry".into(),
            source: Box::new(e),
        })?;
        let context = "appending to an execution log";
        let mut tries = OnLiveConnection::new(&self.inner.pool, context);
        let result = loop {
            let mut conn = tries.connection().await?;
            let mut json = Some(json.clone());
            let append = query(statement, |p| match p {
                Param::Entry => json.take().map(Value::Json),
                other => lease_value(lease, self.states(), other),
            })?;
            let done = append
                .execute(&mut *conn)
                .await
                .map_err(|e| store_error(context, e));
            if let Some(done) = tries.settle(conn, done) {
                break done?;
            }
        };
        Ok(if result.rows_affected() == 1 {
            WriteResult::Applied
        } else {
            WriteResult::Stale
        })
    }

    async fn reset_stalled(&self, params: ResetParams) -> Result<ResetReport<R::Id>, StoreError> {
        self.inner.admin.reset(params).await
    }

    async fn leave(&self, name: &str) -> Result<(), StoreError> {
        if let Some(missing) = self.inner.admin.workers_table_missing() {
            return Err(missing);
        }
        let mut tries =
            OnLiveConnection::new(&self.inner.pool, "removing a worker from the registry");
        loop {
            let mut conn = tries.connection().await?;
            let done = self.inner.admin.remove_worker_on(&mut conn, name).await;
            if let Some(done) = tries.settle(conn, done) {
                return done;
            }
        }
    }

    async fn beat(&self, beat: &queue_core::WorkerBeat) -> Result<(), StoreError> {
        if let Some(missing) = self.inner.admin.workers_table_missing() {
            return Err(missing);
        }
        // As the heartbeat: a connection whose backend died is closed
        // quietly and the beat sent on another, never handed back to a
        // pool that would warn about it.
        let mut tries = OnLiveConnection::new(&self.inner.pool, "recording a worker's beat");
        loop {
            let mut conn = tries.connection().await?;
            let done = self.inner.admin.record_beat_on(&mut conn, beat).await;
            if let Some(done) = tries.settle(conn, done) {
                return done;
            }
        }
    }

    async fn wait_for_jobs(&self, max_wait: Duration) {
        self.inner.wake.wait(max_wait).await;
    }

    async fn next_due(&self, after: DateTime<Utc>) -> Result<Option<DateTime<Utc>>, StoreError> {
        // A limited kind held back: when it may start more.
        let limited = self
            .inner
            .limited_due
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
            .filter(|due| *due > after);
        let Some(statement) = &self.inner.sql.next_due else {
            return Ok(limited);
        };
        let context = "reading when the next scheduled job comes due";
        let after = self.inner.admin.to_db(after);
        // Read whenever the claim loop pauses: on the stash's connections,
        // like claims, not the pool's (one round trip less per pause).
        let mut on = self.inner.stash.lend(context).await?;
        let due: Option<DateTime<Utc>> = loop {
            let next = query::<R::Id>(statement, |p| match p {
                Param::Now => Some(Value::Time(after)),
                _ => None,
            })?;
            match next
                .fetch_one(on.conn())
                .await
                .and_then(|row| row.try_get(0))
            {
                Ok(due) => {
                    on.put_back();
                    break due;
                }
                Err(error) => on = on.replace_after(store_error(context, error)).await?,
            }
        };
        // Back on this process's clock.
        let due = due.map(|at| self.inner.admin.to_local(at));
        Ok(match (due, limited) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        })
    }
}

/// The admin contract, through [`PgStore::admin`].
#[async_trait]
impl<R> Admin for PgStore<R>
where
    R: JobRecord,
    R::Id: PgKey,
{
    type Id = R::Id;

    fn stored_state(&self, state: queue_core::JobState) -> String {
        self.inner.admin.stored_state(state)
    }

    async fn get(&self, id: &R::Id) -> Result<Option<JobView<R::Id>>, StoreError> {
        self.inner.admin.get(id).await
    }

    async fn list(&self, params: &ListParams<R::Id>) -> Result<JobPage<R::Id>, StoreError> {
        self.inner.admin.list(params).await
    }

    async fn count(&self, filter: &JobFilter) -> Result<u64, StoreError> {
        self.inner.admin.count(filter).await
    }

    async fn stats(&self, params: StatsParams) -> Result<QueueStats, StoreError> {
        self.inner.admin.stats(params).await
    }

    async fn finished_timeline(
        &self,
        params: &TimelineParams,
    ) -> Result<Option<Vec<FinishedBucket>>, StoreError> {
        self.inner.admin.finished_timeline(params).await
    }

    async fn enqueue(&self, jobs: &[NewJob]) -> Result<Vec<Enqueued<R::Id>>, StoreError> {
        self.inner.admin.enqueue(jobs).await
    }

    async fn retry(
        &self,
        targets: &Targets<R::Id>,
        params: RetryParams,
    ) -> Result<ActionReport<R::Id>, StoreError> {
        self.inner.admin.retry(targets, params).await
    }

    async fn cancel(&self, targets: &Targets<R::Id>) -> Result<ActionReport<R::Id>, StoreError> {
        self.inner.admin.cancel(targets).await
    }

    async fn force_fail(
        &self,
        targets: &Targets<R::Id>,
        reason: &str,
    ) -> Result<ActionReport<R::Id>, StoreError> {
        self.inner.admin.force_fail(targets, reason).await
    }

    async fn delete(&self, targets: &Targets<R::Id>) -> Result<ActionReport<R::Id>, StoreError> {
        self.inner.admin.delete(targets).await
    }

    async fn reset(&self, params: ResetParams) -> Result<ResetReport<R::Id>, StoreError> {
        self.inner.admin.reset(params).await
    }

    async fn pause(&self, kind: &str, by: &str) -> Result<queue_core::PausedKind, StoreError> {
        let pause = self.inner.admin.pause(kind, by).await?;
        // This process's own claims heed it at once.
        self.inner.rules.forget();
        Ok(pause)
    }

    async fn resume(&self, kind: &str) -> Result<Option<queue_core::PausedKind>, StoreError> {
        let ended = self.inner.admin.resume(kind).await?;
        self.inner.rules.forget();
        Ok(ended)
    }

    async fn paused(&self) -> Result<Vec<queue_core::PausedKind>, StoreError> {
        self.inner.admin.paused().await
    }

    async fn set_limits(
        &self,
        kind: &str,
        limits: &queue_core::KindLimits,
        by: &str,
    ) -> Result<Option<queue_core::KindLimit>, StoreError> {
        let set = self.inner.admin.set_limits(kind, limits, by).await;
        // This store's claims heed it at once.
        self.inner.rules.forget();
        set
    }

    async fn limits(&self) -> Result<Vec<queue_core::KindLimit>, StoreError> {
        self.inner.admin.limits().await
    }

    async fn append_audit(&self, entries: &[queue_core::NewAuditEntry]) -> Result<(), StoreError> {
        self.inner.admin.append_audit(entries).await
    }

    async fn audit(
        &self,
        params: &queue_core::AuditParams,
    ) -> Result<Vec<queue_core::AuditEntry>, StoreError> {
        self.inner.admin.audit(params).await
    }

    async fn create_operation(
        &self,
        new: &queue_core::NewOperation,
    ) -> Result<queue_core::Operation<R::Id>, StoreError> {
        self.inner.admin.create_operation(new).await
    }

    async fn operation(&self, id: i64) -> Result<Option<queue_core::Operation<R::Id>>, StoreError> {
        self.inner.admin.operation(id).await
    }

    async fn operations(
        &self,
        params: &queue_core::OperationParams,
    ) -> Result<Vec<queue_core::Operation<R::Id>>, StoreError> {
        self.inner.admin.operations(params).await
    }

    async fn take_operation(
        &self,
        take: &queue_core::TakeOperation,
    ) -> Result<Option<queue_core::Operation<R::Id>>, StoreError> {
        self.inner.admin.take_operation(take).await
    }

    async fn step_operation(
        &self,
        step: &queue_core::OperationStep<R::Id>,
    ) -> Result<Option<queue_core::Operation<R::Id>>, StoreError> {
        self.inner.admin.step_operation(step).await
    }

    async fn prune_operations(&self, older_than: std::time::Duration) -> Result<u64, StoreError> {
        self.inner.admin.prune_operations(older_than).await
    }

    async fn abort_operation(
        &self,
        id: i64,
        by: &str,
    ) -> Result<Option<queue_core::AbortOutcome<R::Id>>, StoreError> {
        self.inner.admin.abort_operation(id, by).await
    }

    async fn workers(
        &self,
        seen_since: DateTime<Utc>,
    ) -> Result<Vec<queue_core::WorkerInfo>, StoreError> {
        self.inner.admin.workers(seen_since).await
    }

    async fn purge(&self, params: &PurgeParams) -> Result<queue_core::PurgeReport, StoreError> {
        self.inner.admin.purge(params).await
    }
}
