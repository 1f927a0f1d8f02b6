//! [`PgStore`]: the store contract on a Postgres table.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use queue_core::resetter::{AT_MOST_ONCE_MESSAGE, MAX_RESETS_MESSAGE};
use queue_core::{
    ClaimParams, Claimed, DecodeError, Delivery, HeartbeatReport, Job, JobRecord, JobState, Lease,
    LogEntry, ResetParams, ResetReport, Store, StoreError, Transition, WriteResult,
};
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgArguments, PgRow, PgTransactionManager};
use sqlx::query::Query;
use sqlx::{FromRow, PgConnection, PgPool, Postgres, Row, TransactionManager};
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::task::JoinHandle;

use crate::conditions::{PgArg, PgConditions};
use crate::error::store_error;
use crate::listen;
use crate::options::{Column, ExecutionMode, PgStoreOptions, StateValues};
use crate::record::{decode_job, Decoder, PgKey};
use crate::sql::{catalog, Param, Statement, Statements};
use crate::stash::Stash;

/// The most attempts one batched completion statement finishes.
const MAX_COMPLETION_BATCH: usize = 1000;
/// With this many outcomes waiting, the completer writes without waiting
/// out its delay.
const EAGER_COMPLETION_BATCH: usize = 500;

/// The store as a handler sees it for one job.
///
/// In transactional mode, [`PgJobStore::transaction`] opens the job's
/// transaction on first use: `BEGIN`, then a `FOR KEY SHARE` lock on the
/// job's row (checked to still be this claim's). The handler's writes on it
/// commit together with the job's completion, or roll back if the attempt
/// fails or the job moved on. A handler that never asks for it costs no
/// transaction at all. In lease mode there is no job transaction; write
/// through [`PgJobStore::pool`].
#[derive(Debug)]
pub struct PgJobStore<K = i64> {
    pool: PgPool,
    /// The connection holding the job's transaction, once opened (sqlx
    /// tracks the transaction on the connection, so a handler's own
    /// `begin()` on it makes a savepoint).
    tx: Option<PoolConnection<Postgres>>,
    /// What opening the transaction needs; `None` in lease mode and for
    /// job stores outside any claim.
    claim: Option<JobClaim<K>>,
}

/// The claim a job store's transaction locks.
#[derive(Debug)]
struct JobClaim<K> {
    sql: Arc<Statements>,
    states: Arc<StateValues>,
    lease: Lease<K>,
    stash: Arc<Stash>,
}

impl<K> Drop for PgJobStore<K> {
    fn drop(&mut self) {
        // A job store dropped with its transaction open (an abandoned
        // attempt): the rollback goes out when the pool next pings the
        // connection, which is at once.
        if let Some(mut conn) = self.tx.take() {
            PgTransactionManager::start_rollback(&mut conn);
        }
    }
}

/// How a job's transaction ends.
#[derive(Debug, Clone, Copy)]
enum Ending {
    Commit,
    RollBack,
}

/// Ends the job's transaction on `conn` and hands the connection back; a
/// connection that fails to end it is closed (the server then rolls back).
async fn end_transaction(
    mut conn: PoolConnection<Postgres>,
    stash: &Stash,
    ending: Ending,
) -> Result<(), sqlx::Error> {
    let ended = match ending {
        Ending::Commit => PgTransactionManager::commit(&mut conn).await,
        Ending::RollBack => PgTransactionManager::rollback(&mut conn).await,
    };
    match ended {
        Ok(()) => stash.put(conn),
        Err(_) => conn.close_on_drop(),
    }
    ended
}

/// Gives up a connection whose transaction failed midway: closed, so the
/// server rolls back and the pool never sees it again.
fn discard(mut conn: PoolConnection<Postgres>) {
    PgTransactionManager::start_rollback(&mut conn);
    conn.close_on_drop();
}

impl<K: PgKey> PgJobStore<K> {
    /// The job's transaction (transactional mode), opened and row-locked on
    /// first use. Fails if the job was reset, reclaimed or deleted before
    /// the lock, or in lease mode (which has none: use [`PgJobStore::pool`]).
    pub async fn transaction(&mut self) -> Result<&mut PgConnection, StoreError> {
        if self.tx.is_none() {
            let Some(claim) = &self.claim else {
                return Err(StoreError::Config(
                    "this job has no transaction: the store runs in lease mode (write through pool())".into(),
                ));
            };
            let mut conn = claim
                .stash
                .take()
                .await
                .map_err(|e| store_error("opening a job's transaction", e))?;
            if let Err(error) = PgTransactionManager::begin(&mut conn, None).await {
                conn.close_on_drop();
                return Err(store_error("opening a job's transaction", error));
            }
            let lease = &claim.lease;
            let lock = query(&claim.sql.lock, |p| lease_value(lease, &claim.states, p))?;
            match lock.fetch_optional(&mut *conn).await {
                Ok(Some(_)) => self.tx = Some(conn),
                Ok(None) => {
                    if let Err(error) = end_transaction(conn, &claim.stash, Ending::RollBack).await
                    {
                        tracing::warn!(%error, "rolling back a stale job's transaction failed; the connection is closed");
                    }
                    return Err(StoreError::Conflict {
                        context: format!("locking job {}", lease.id),
                        source: "the job was reset, reclaimed or deleted before its transaction could lock it".into(),
                    });
                }
                Err(error) => {
                    discard(conn);
                    return Err(store_error("locking a claimed job", error));
                }
            }
        }
        match self.tx.as_deref_mut() {
            Some(conn) => Ok(conn),
            None => Err(StoreError::Backend {
                context: "opening a job's transaction".into(),
                source: "the transaction vanished".into(),
            }),
        }
    }
}

impl<K> PgJobStore<K> {
    /// The store's pool (outside the job's transaction).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Gives up the job now: rolls its transaction back at once, as the
    /// server would for a worker that died. (Dropping a job store also rolls
    /// back, but only once its connection is next used.)
    pub async fn abandon(mut self) {
        let (Some(conn), Some(claim)) = (self.tx.take(), &self.claim) else {
            return;
        };
        if let Err(error) = end_transaction(conn, &claim.stash, Ending::RollBack).await {
            tracing::warn!(%error, "rolling back an abandoned job failed; its connection is closed");
        }
    }

    /// A job store bound to no claim, writing through `pool`: what a late
    /// writer outside any claim would use (tests of stale writes).
    pub fn outside_transaction(pool: PgPool) -> Self {
        PgJobStore {
            pool,
            tx: None,
            claim: None,
        }
    }
}

/// A value bound to a statement parameter.
enum Value<K> {
    Text(String),
    OptText(Option<String>),
    Time(DateTime<Utc>),
    OptTime(Option<DateTime<Utc>>),
    Int(i64),
    Int4(i32),
    Bool(bool),
    Key(K),
    Keys(Vec<K>),
    Ints(Vec<i64>),
    Texts(Vec<Option<String>>),
    Times(Vec<Option<DateTime<Utc>>>),
    Int4s(Vec<i32>),
    Json(serde_json::Value),
}

impl<K: PgKey> Value<K> {
    fn bind<'q>(self, q: Query<'q, Postgres, PgArguments>) -> Query<'q, Postgres, PgArguments> {
        match self {
            Value::Text(v) => q.bind(v),
            Value::OptText(v) => q.bind(v),
            Value::Time(v) => q.bind(v),
            Value::OptTime(v) => q.bind(v),
            Value::Int(v) => q.bind(v),
            Value::Int4(v) => q.bind(v),
            Value::Bool(v) => q.bind(v),
            Value::Key(v) => q.bind(v),
            Value::Keys(v) => q.bind(v),
            Value::Ints(v) => q.bind(v),
            Value::Texts(v) => q.bind(v),
            Value::Times(v) => q.bind(v),
            Value::Int4s(v) => q.bind(v),
            Value::Json(v) => q.bind(v),
        }
    }
}

fn bind_arg<'q>(
    q: Query<'q, Postgres, PgArguments>,
    arg: PgArg,
) -> Query<'q, Postgres, PgArguments> {
    match arg {
        PgArg::Int(v) => q.bind(v),
        PgArg::Float(v) => q.bind(v),
        PgArg::Bool(v) => q.bind(v),
        PgArg::Text(v) => q.bind(v),
        PgArg::Uuid(v) => q.bind(v),
        PgArg::Json(v) => q.bind(v),
        PgArg::Timestamp(v) => q.bind(v),
        PgArg::TextArray(v) => q.bind(v),
        PgArg::IntArray(v) => q.bind(v),
    }
}

/// Binds every parameter of `statement` from `value`; a parameter without a
/// value is a bug in this crate, reported rather than panicking.
fn query<'q, K: PgKey>(
    statement: &'q Statement,
    mut value: impl FnMut(Param) -> Option<Value<K>>,
) -> Result<Query<'q, Postgres, PgArguments>, StoreError> {
    let mut q = sqlx::query(&statement.text);
    for param in &statement.params {
        let v = value(*param).ok_or_else(|| StoreError::Backend {
            context: format!("internal error: no value for statement parameter {param:?}"),
            source: "statement and binder disagree".into(),
        })?;
        q = v.bind(q);
    }
    Ok(q)
}

fn state<K>(states: &StateValues, s: JobState) -> Value<K> {
    Value::Text(states.get(s).to_owned())
}

/// The values a statement guarded by a lease binds: key, token and states.
fn lease_value<K: PgKey>(lease: &Lease<K>, states: &StateValues, p: Param) -> Option<Value<K>> {
    match p {
        Param::Id => Some(Value::Key(lease.id.clone())),
        Param::Token => Some(Value::Int(lease.token)),
        Param::State(s) => Some(state(states, s)),
        _ => None,
    }
}

/// One attempt's end, as a row of the batched finish statement.
struct FinishRow<K> {
    id: K,
    token: i64,
    target: String,
    finished_at: Option<DateTime<Utc>>,
    message: Option<String>,
    process_after: Option<DateTime<Utc>>,
    failed: i32,
}

impl<K: PgKey> FinishRow<K> {
    fn new(
        lease: &Lease<K>,
        transition: Transition,
        now: DateTime<Utc>,
        states: &StateValues,
    ) -> Self {
        let target = states.get(transition.target()).to_owned();
        let (finished_at, message, process_after, failed) = match transition {
            Transition::Complete => (Some(now), None, None, 0),
            Transition::Error { message, retry_at } => {
                (Some(now), Some(message), Some(retry_at), 1)
            }
            Transition::Fail { message } => (Some(now), Some(message), None, 1),
            Transition::Cancel { message } => (Some(now), Some(message), None, 0),
            Transition::Release => (None, None, None, 0),
        };
        FinishRow {
            id: lease.id.clone(),
            token: lease.token,
            target,
            finished_at,
            message,
            process_after,
            failed,
        }
    }
}

/// Runs the finish statement (the single-row one for one attempt); returns
/// the keys it applied to.
async fn run_finish<'c, K: PgKey>(
    sql: &Statements,
    states: &StateValues,
    executor: impl sqlx::PgExecutor<'c>,
    rows: &[FinishRow<K>],
) -> Result<HashSet<K>, StoreError> {
    if let [row] = rows {
        let q = query(&sql.finish_one, |p| match p {
            Param::TargetState => Some(Value::Text(row.target.clone())),
            Param::FinishedAt => Some(Value::OptTime(row.finished_at)),
            Param::Message => Some(Value::OptText(row.message.clone())),
            Param::ProcessAfter => Some(Value::OptTime(row.process_after)),
            Param::FailureIncrement => Some(Value::Int4(row.failed)),
            Param::Id => Some(Value::Key(row.id.clone())),
            Param::Token => Some(Value::Int(row.token)),
            Param::State(s) => Some(state(states, s)),
            _ => None,
        })?;
        let applied = q
            .fetch_optional(executor)
            .await
            .map_err(|e| store_error("recording a job outcome", e))?;
        return Ok(applied.map(|_| row.id.clone()).into_iter().collect());
    }
    let q = query(&sql.finish, |p| {
        Some(match p {
            Param::Ids => Value::Keys(rows.iter().map(|r| r.id.clone()).collect()),
            Param::Tokens => Value::Ints(rows.iter().map(|r| r.token).collect()),
            Param::TargetStates => {
                Value::Texts(rows.iter().map(|r| Some(r.target.clone())).collect())
            }
            Param::FinishedAts => Value::Times(rows.iter().map(|r| r.finished_at).collect()),
            Param::Messages => Value::Texts(rows.iter().map(|r| r.message.clone()).collect()),
            Param::ProcessAfters => Value::Times(rows.iter().map(|r| r.process_after).collect()),
            Param::FailureIncrements => Value::Int4s(rows.iter().map(|r| r.failed).collect()),
            Param::State(s) => state(states, s),
            _ => return None,
        })
    })?;
    let rows = q
        .fetch_all(executor)
        .await
        .map_err(|e| store_error("recording job outcomes", e))?;
    rows.iter()
        .map(|r| {
            r.try_get::<K, _>(0)
                .map_err(|e| store_error("reading finished job keys", e))
        })
        .collect()
}

/// A finish waiting for the completer.
struct Completion<K> {
    row: FinishRow<K>,
    reply: oneshot::Sender<Result<WriteResult, StoreError>>,
}

/// Lease mode's completer: finishes everything queued while the previous
/// statement ran in one statement, so batches grow with load and add no
/// delay when idle.
async fn complete_batches<K: PgKey>(
    stash: Arc<Stash>,
    sql: Arc<Statements>,
    states: Arc<StateValues>,
    delay: Duration,
    mut rx: mpsc::UnboundedReceiver<Completion<K>>,
) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        if !delay.is_zero() {
            // Gather for up to `delay`, or until a batch is big enough.
            let deadline = tokio::time::Instant::now() + delay;
            while batch.len() < EAGER_COMPLETION_BATCH {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(next)) => batch.push(next),
                    Ok(None) | Err(_) => break,
                }
            }
        }
        while batch.len() < MAX_COMPLETION_BATCH {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let (rows, replies): (Vec<_>, Vec<_>) = batch.into_iter().map(|c| (c.row, c.reply)).unzip();
        let written = match stash.take().await {
            Ok(mut conn) => {
                let written = run_finish(&sql, &states, &mut *conn, &rows).await;
                if written.is_ok() {
                    stash.put(conn);
                }
                written
            }
            Err(error) => Err(store_error("recording job outcomes", error)),
        };
        match written {
            Ok(applied) => {
                for (row, reply) in rows.iter().zip(replies) {
                    let result = if applied.contains(&row.id) {
                        WriteResult::Applied
                    } else {
                        WriteResult::Stale
                    };
                    let _ = reply.send(Ok(result));
                }
            }
            Err(error) => {
                for reply in replies {
                    let _ = reply.send(Err(copy_error(&error)));
                }
            }
        }
    }
}

/// The same failure for each waiter of a failed batch (errors do not clone).
fn copy_error(error: &StoreError) -> StoreError {
    let source = std::io::Error::other(error.to_string()).into();
    let context = "recording job outcomes (batched)".to_owned();
    match error {
        StoreError::Unavailable { .. } => StoreError::Unavailable { context, source },
        StoreError::Conflict { .. } => StoreError::Conflict { context, source },
        StoreError::Config(message) => StoreError::Config(message.clone()),
        _ => StoreError::Backend { context, source },
    }
}

struct Inner<R: JobRecord> {
    pool: PgPool,
    /// Connections of the claims, completions and job transactions.
    stash: Arc<Stash>,
    sweeper: JoinHandle<()>,
    options: PgStoreOptions,
    sql: Arc<Statements>,
    states: Arc<StateValues>,
    decode: Decoder<R>,
    wake: Arc<Notify>,
    listener: JoinHandle<()>,
    /// The batched completer: outcomes that need no job transaction.
    completer: mpsc::UnboundedSender<Completion<R::Id>>,
    absent: Vec<Column>,
}

impl<R: JobRecord> Drop for Inner<R> {
    fn drop(&mut self) {
        self.listener.abort();
        self.sweeper.abort();
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
    /// handing out [`Job`] records.
    pub async fn default_table(pool: PgPool, options: PgStoreOptions) -> Result<Self, StoreError> {
        PgStore::with_decoder(pool, options, decode_job).await
    }
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
        options.check()?;
        if pool.options().get_test_before_acquire() {
            tracing::info!(
                "the pool pings each connection before handing it out, a round trip more per \
                 claim and completion; build it with PgPoolOptions::test_before_acquire(false)"
            );
        }
        let (shape, absent) = catalog::inspect(&pool, &options, R::Id::PG_TYPES).await?;
        for column in &absent {
            tracing::info!(table = %options.table, column = column.standard_name(), "column absent: {}", column.feature_lost());
        }
        let sql = Arc::new(Statements::new(&options, &shape));
        let states = Arc::new(options.states.clone());
        let wake = Arc::new(Notify::new());
        let listener = listen::spawn(&pool, options.notify_channel(), wake.clone());
        let (stash, sweeper) = Stash::new(pool.clone());
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
                sweeper,
                options,
                sql,
                states,
                decode,
                wake,
                listener,
                completer,
                absent,
            }),
        })
    }

    /// The standard columns the table lacks, each with the feature that is
    /// off because of it.
    pub fn disabled_features(&self) -> Vec<(Column, &'static str)> {
        self.inner
            .absent
            .iter()
            .map(|c| (*c, c.feature_lost()))
            .collect()
    }

    /// The pool the store runs on.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The options the store was built with.
    pub fn options(&self) -> &PgStoreOptions {
        &self.inner.options
    }

    /// Cancels job `id` as an operator: a queued or errored job becomes
    /// canceled at once; a processing one gets its cancel flag set, and its
    /// worker stops it at the next heartbeat. Returns whether anything
    /// changed.
    pub async fn cancel(&self, id: &R::Id) -> Result<bool, StoreError> {
        let now = Utc::now();
        let waiting = query(&self.inner.sql.cancel_waiting, |p| match p {
            Param::Id => Some(Value::Key(id.clone())),
            Param::State(s) => Some(state(self.states(), s)),
            Param::Message => Some(Value::Text(
                queue_core::CANCELED_BEFORE_RUN_MESSAGE.to_owned(),
            )),
            Param::Now => Some(Value::Time(now)),
            _ => None,
        })?
        .execute(&self.inner.pool)
        .await
        .map_err(|e| store_error("cancelling a job", e))?;
        if waiting.rows_affected() > 0 {
            return Ok(true);
        }
        let Some(statement) = &self.inner.sql.cancel_running else {
            return Ok(false);
        };
        let running = query(statement, |p| match p {
            Param::Id => Some(Value::Key(id.clone())),
            Param::State(s) => Some(state(self.states(), s)),
            _ => None,
        })?
        .execute(&self.inner.pool)
        .await
        .map_err(|e| store_error("cancelling a running job", e))?;
        Ok(running.rows_affected() > 0)
    }

    /// Deletes job `id`; a worker running it learns at the next heartbeat
    /// that it is gone. Returns whether it existed.
    pub async fn delete(&self, id: &R::Id) -> Result<bool, StoreError> {
        let done = query(&self.inner.sql.delete, |p| match p {
            Param::Id => Some(Value::Key(id.clone())),
            _ => None,
        })?
        .execute(&self.inner.pool)
        .await
        .map_err(|e| store_error("deleting a job", e))?;
        Ok(done.rows_affected() > 0)
    }

    fn states(&self) -> &StateValues {
        &self.inner.options.states
    }

    fn has(&self, column: Column) -> bool {
        !self.inner.absent.contains(&column)
    }

    /// Without a failure counter retries cannot be bounded, so they are off.
    fn adapt(&self, transition: Transition) -> Transition {
        match transition {
            Transition::Error { message, .. } if !self.has(Column::NumFailures) => {
                Transition::Fail {
                    message: format!(
                        "{message} (not retried: the table has no num_failures column)"
                    ),
                }
            }
            other => other,
        }
    }

    /// Reads the claimed records through the view, by key.
    async fn records_from_view(
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
        .map_err(|e| store_error("reading claimed jobs through the view", e))?;
        let mut by_id = HashMap::with_capacity(rows.len());
        for row in rows {
            let id: R::Id = row
                .try_get("__queue_id")
                .map_err(|e| store_error("reading the key of a view row", e))?;
            by_id.insert(id, row);
        }
        Ok(by_id)
    }
}

fn read<T: for<'r> sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>>(
    row: &PgRow,
    column: &str,
) -> Result<T, StoreError> {
    row.try_get(column)
        .map_err(|e| store_error("reading a claimed row", e))
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
    type JobStore = PgJobStore<R::Id>;

    async fn claim(
        &self,
        params: ClaimParams<'_, PgConditions>,
    ) -> Result<Vec<Claimed<Self>>, StoreError> {
        let conditions = params.conditions.map(Vec::as_slice).unwrap_or(&[]);
        for c in conditions {
            if c.placeholders() != c.args().len() {
                return Err(StoreError::Config(format!(
                    "a dequeue condition has {} placeholders but {} bound values: {c:?}",
                    c.placeholders(),
                    c.args().len()
                )));
            }
        }
        let statement = self.inner.sql.claim(conditions, params.limit);
        let mut q = query(&statement, |p| match p {
            Param::State(s) => Some(state::<R::Id>(self.states(), s)),
            Param::Now => Some(Value::Time(params.now)),
            Param::Worker => Some(Value::Text(params.worker.to_owned())),
            _ => None,
        })?;
        for c in conditions {
            for arg in c.args() {
                q = bind_arg(q, arg.clone());
            }
        }
        let mut conn = self
            .inner
            .stash
            .take()
            .await
            .map_err(|e| store_error("claiming jobs", e))?;
        let mut rows = q
            .fetch_all(&mut *conn)
            .await
            .map_err(|e| store_error("claiming jobs", e))?;
        // Back into claim order (the update returns rows in key order).
        rows.sort_by_cached_key(|row| row.try_get::<i32, _>("__queue_rank").unwrap_or(i32::MAX));
        if rows.is_empty() {
            self.inner.stash.put(conn);
            return Ok(Vec::new());
        }
        let mut leases = Vec::with_capacity(rows.len());
        for row in &rows {
            let failures: i64 = read(row, "__queue_failures")?;
            leases.push(Lease {
                id: read(row, "__queue_id")?,
                token: read(row, "__queue_token")?,
                attempt: u32::try_from(failures.max(0))
                    .unwrap_or(u32::MAX)
                    .saturating_add(1),
            });
        }
        let decode = self.inner.decode;
        let decode_error = |id: &R::Id, message: String| DecodeError {
            id: id.to_string(),
            message,
        };
        let records: Vec<Result<R, DecodeError>> = match &self.inner.sql.select_view {
            None => rows
                .iter()
                .zip(&leases)
                .map(|(row, lease)| decode(row).map_err(|e| decode_error(&lease.id, e.to_string())))
                .collect(),
            Some(statement) => {
                let ids = leases.iter().map(|l| l.id.clone()).collect();
                // On the claim's connection: no second checkout.
                let mut by_id = Self::records_from_view(&mut conn, statement, ids).await?;
                leases
                    .iter()
                    .map(|lease| match by_id.remove(&lease.id) {
                        Some(row) => {
                            decode(&row).map_err(|e| decode_error(&lease.id, e.to_string()))
                        }
                        None => Err(decode_error(
                            &lease.id,
                            format!(
                                "the row is not visible through the view {}",
                                self.inner
                                    .options
                                    .view
                                    .as_ref()
                                    .map(|v| v.quoted())
                                    .unwrap_or_default()
                            ),
                        )),
                    })
                    .collect()
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
                });
                Claimed {
                    lease,
                    record,
                    job_store: PgJobStore {
                        pool: self.inner.pool.clone(),
                        tx: None,
                        claim,
                    },
                }
            })
            .collect();
        self.inner.stash.put(conn);
        Ok(claimed)
    }

    async fn finish(
        &self,
        job_store: PgJobStore<R::Id>,
        lease: &Lease<R::Id>,
        transition: Transition,
        now: DateTime<Utc>,
    ) -> Result<WriteResult, StoreError> {
        let transition = self.adapt(transition);
        let complete = transition == Transition::Complete;
        let row = FinishRow::new(lease, transition, now, self.states());
        let mut job_store = job_store;
        if let Some(mut conn) = job_store.tx.take() {
            let stash = &self.inner.stash;
            if complete {
                // The handler's writes and the completion commit together;
                // if the job moved on, the writes are rolled back.
                let applied = match run_finish(
                    &self.inner.sql,
                    self.states(),
                    &mut *conn,
                    std::slice::from_ref(&row),
                )
                .await
                {
                    Ok(applied) => applied,
                    Err(error) => {
                        discard(conn);
                        return Err(error);
                    }
                };
                if !applied.contains(&lease.id) {
                    if let Err(error) = end_transaction(conn, stash, Ending::RollBack).await {
                        tracing::warn!(%error, id = %lease.id, "rolling back a stale attempt failed; the connection is closed");
                    }
                    return Ok(WriteResult::Stale);
                }
                end_transaction(conn, stash, Ending::Commit)
                    .await
                    .map_err(|e| store_error("committing a job's transaction", e))?;
                return Ok(WriteResult::Applied);
            }
            // A failed attempt leaves no trace of the handler's writes.
            if let Err(error) = end_transaction(conn, stash, Ending::RollBack).await {
                tracing::warn!(%error, id = %lease.id, "rolling back a failed attempt failed; the connection is closed");
            }
        }
        // No job transaction: the batched completer records it.
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

    async fn heartbeat(
        &self,
        leases: &[Lease<R::Id>],
        now: DateTime<Utc>,
    ) -> Result<HeartbeatReport<R::Id>, StoreError> {
        if leases.is_empty() {
            return Ok(HeartbeatReport::default());
        }
        let mut ids = Some(leases.iter().map(|l| l.id.clone()).collect::<Vec<_>>());
        let mut tokens = Some(leases.iter().map(|l| l.token).collect::<Vec<_>>());
        let rows = query(&self.inner.sql.heartbeat, |p| match p {
            Param::Ids => ids.take().map(Value::Keys),
            Param::Tokens => tokens.take().map(Value::Ints),
            Param::State(s) => Some(state(self.states(), s)),
            Param::Now => Some(Value::Time(now)),
            _ => None,
        })?
        .fetch_all(&self.inner.pool)
        .await
        .map_err(|e| store_error("heartbeating running jobs", e))?;
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
            return Ok(WriteResult::Applied);
        };
        // Written outside the job's transaction (whose key-share lock does
        // not block it), so the log of a failed attempt survives.
        let json = serde_json::to_value(&entry).map_err(|e| StoreError::Backend {
            context: "encoding an execution log entry".into(),
            source: Box::new(e),
        })?;
        let mut json = Some(json);
        let result = query(statement, |p| match p {
            Param::Entry => json.take().map(Value::Json),
            other => lease_value(lease, self.states(), other),
        })?
        .execute(&self.inner.pool)
        .await
        .map_err(|e| store_error("appending to an execution log", e))?;
        Ok(if result.rows_affected() == 1 {
            WriteResult::Applied
        } else {
            WriteResult::Stale
        })
    }

    async fn reset_stalled(&self, params: ResetParams) -> Result<ResetReport<R::Id>, StoreError> {
        let Some(statement) = &self.inner.sql.reset else {
            return Err(StoreError::Config(format!(
                "table {} has neither last_heartbeat_at nor started_at, so stalled jobs cannot be recognised",
                self.inner.options.table
            )));
        };
        let rows = query(statement, |p| match p {
            Param::State(s) => Some(state::<R::Id>(self.states(), s)),
            Param::StalledBefore => Some(Value::Time(params.stalled_before)),
            Param::MaxResets => Some(Value::Int4(
                i32::try_from(params.max_resets).unwrap_or(i32::MAX),
            )),
            Param::AtMostOnce => Some(Value::Bool(params.delivery == Delivery::AtMostOnce)),
            Param::MaxResetsMessage => Some(Value::Text(MAX_RESETS_MESSAGE.to_owned())),
            Param::AtMostOnceMessage => Some(Value::Text(AT_MOST_ONCE_MESSAGE.to_owned())),
            Param::Now => Some(Value::Time(params.now)),
            _ => None,
        })?
        .fetch_all(&self.inner.pool)
        .await
        .map_err(|e| store_error("resetting stalled jobs", e))?;
        let mut report = ResetReport::default();
        for row in &rows {
            let id: R::Id = read(row, "id")?;
            if read::<bool>(row, "failed")? {
                report.failed.push(id);
            } else {
                report.reset.push(id);
            }
        }
        Ok(report)
    }

    async fn wait_for_jobs(&self, max_wait: Duration) {
        let _ = tokio::time::timeout(max_wait, self.inner.wake.notified()).await;
    }
}
