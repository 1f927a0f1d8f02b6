//! [`PgStoreOptions`]: which table, which columns, which state values, which
//! mode.

use std::collections::BTreeMap;
use std::fmt;

use queue_core::JobState;

use crate::error::OptionsError;
use crate::ident::{Ident, QualifiedName};

/// A standard column of the jobs table (the dbworker spec's columns plus the
/// fencing token, the priority, and the kind and payload an operator reads).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Column {
    /// The key: integer, bigint, uuid or text. Required.
    Id,
    /// The state. Required; text or a Postgres enum.
    State,
    /// Text of the last failure.
    FailureMessage,
    /// When the job was enqueued (only read by the default record).
    QueuedAt,
    /// Set when a job is claimed.
    StartedAt,
    /// Set when a job errors or reaches a terminal state.
    FinishedAt,
    /// Not claimable before this time: needed for retry delays and schedules.
    ProcessAfter,
    /// Resets by the resetter: needed for the reset limit.
    NumResets,
    /// Failed attempts: needed for retries.
    NumFailures,
    /// Last heartbeat: needed by heartbeats and the resetter.
    LastHeartbeatAt,
    /// `json[]` or `jsonb[]` execution log.
    ExecutionLogs,
    /// The claiming worker's name.
    WorkerHostname,
    /// Set by an operator to cancel a running job.
    Cancel,
    /// A number every claim increases, the fencing token of leases.
    /// Without it, `started_at` (set to the claim time) is the token.
    ClaimToken,
    /// Used only by the default order (`priority DESC, id`).
    Priority,
    /// The job's kind (text), which operators list and filter by. Only the
    /// admin contract reads it (a worker's record reads what its select
    /// list names). Optional by default: a table without a column of the
    /// standard name simply has none.
    Kind,
    /// The job's arguments (json, jsonb or text), which operators read and
    /// enqueue. Optional by default, like [`Column::Kind`].
    Payload,
    /// A job's unique key (text), kept unique by a unique index of the
    /// table's (the default table's holds while the job waits or runs, or
    /// forever with [`Column::UniqueForever`]). Optional by default.
    UniqueKey,
    /// Whether a job's unique key holds for as long as the job exists
    /// (boolean). Optional by default; without it a table's unique index
    /// alone decides how long a key holds.
    UniqueForever,
    /// A job's own limit on its attempts (integer), in place of the
    /// worker's retry policy. Optional by default.
    MaxAttempts,
    /// When a job that has not started expires (timestamptz): claims skip
    /// it, and the resetter's sweep fails it. Optional by default.
    ExpiresAt,
    /// Whether a job is at-most-once (boolean): never started twice.
    /// Optional by default.
    AtMostOnce,
    /// The attempts a job has left, counted *down* (integer), as
    /// rickover's `attempts`: a failed attempt takes one off, and a job
    /// with none left after a failure fails instead of retrying. It is the
    /// job's own limit (a job enqueued with
    /// [`NewJob::max_attempts`](queue_core::NewJob::max_attempts) starts
    /// with that many; otherwise with the column's default), in place of
    /// [`Column::MaxAttempts`], which a table cannot have as well.
    /// Optional by default.
    AttemptsLeft,
}

impl Column {
    /// Every standard column.
    pub const ALL: [Column; 23] = [
        Column::Id,
        Column::State,
        Column::FailureMessage,
        Column::QueuedAt,
        Column::StartedAt,
        Column::FinishedAt,
        Column::ProcessAfter,
        Column::NumResets,
        Column::NumFailures,
        Column::LastHeartbeatAt,
        Column::ExecutionLogs,
        Column::WorkerHostname,
        Column::Cancel,
        Column::ClaimToken,
        Column::Priority,
        Column::Kind,
        Column::Payload,
        Column::UniqueKey,
        Column::UniqueForever,
        Column::MaxAttempts,
        Column::ExpiresAt,
        Column::AtMostOnce,
        Column::AttemptsLeft,
    ];

    /// The standard name, as in the default table.
    pub fn standard_name(self) -> &'static str {
        match self {
            Column::Id => "id",
            Column::State => "state",
            Column::FailureMessage => "failure_message",
            Column::QueuedAt => "queued_at",
            Column::StartedAt => "started_at",
            Column::FinishedAt => "finished_at",
            Column::ProcessAfter => "process_after",
            Column::NumResets => "num_resets",
            Column::NumFailures => "num_failures",
            Column::LastHeartbeatAt => "last_heartbeat_at",
            Column::ExecutionLogs => "execution_logs",
            Column::WorkerHostname => "worker_hostname",
            Column::Cancel => "cancel",
            Column::ClaimToken => "claim_token",
            Column::Priority => "priority",
            Column::Kind => "kind",
            Column::Payload => "payload",
            Column::UniqueKey => "unique_key",
            Column::UniqueForever => "unique_forever",
            Column::MaxAttempts => "max_attempts",
            Column::ExpiresAt => "expires_at",
            Column::AtMostOnce => "at_most_once",
            Column::AttemptsLeft => "attempts_left",
        }
    }

    /// Whether a table may lack the column without saying so: the worker
    /// never needs it, and the default name is only a guess. A column
    /// mapped by name must exist all the same.
    pub(crate) fn optional_by_default(self) -> bool {
        matches!(
            self,
            Column::Kind
                | Column::Payload
                | Column::UniqueKey
                | Column::UniqueForever
                | Column::MaxAttempts
                | Column::ExpiresAt
                | Column::AtMostOnce
                | Column::AttemptsLeft
        )
    }

    /// Whether a table without the column lacks a feature: not so for a
    /// column that is one way among others of keeping something (the
    /// attempts-left countdown, where failures and limits are counted up).
    pub(crate) fn absence_matters(self) -> bool {
        !matches!(self, Column::AttemptsLeft)
    }

    /// What is lost when the column is absent.
    pub(crate) fn feature_lost(self) -> &'static str {
        match self {
            Column::Id | Column::State => "everything",
            Column::FailureMessage => "failure messages are not stored",
            Column::QueuedAt => "nothing the store needs",
            Column::StartedAt => "start times are not stored",
            Column::FinishedAt => "finish times are not stored",
            Column::ProcessAfter => {
                "retry delays and scheduled jobs are off: errored jobs are claimable at once"
            }
            Column::NumResets => {
                "the reset limit is off: a resetter runs only at most once (failing stalled jobs)"
            }
            Column::NumFailures => "retries are off: every retryable error fails the job",
            Column::LastHeartbeatAt => {
                "heartbeats are not stored: a store for workers refuses to start (a long job would be reset and run again)"
            }
            Column::ExecutionLogs => "execution logs are off: entries are dropped",
            Column::WorkerHostname => "the claiming worker is not recorded",
            Column::Cancel => "cancel flags are off: delete a job to stop it",
            Column::ClaimToken => "claims are fenced by started_at instead of a counter",
            Column::Priority => "the default order is by key only",
            Column::Kind => "operators see no kinds and cannot filter by kind",
            Column::Payload => "operators see no payloads and cannot enqueue arguments",
            Column::UniqueKey => "unique jobs are off: enqueueing a job with a unique key is refused",
            Column::UniqueForever => {
                "the table's unique index alone decides how long a unique key holds"
            }
            Column::MaxAttempts => "jobs cannot set their own attempt limit (such a job is refused)",
            Column::ExpiresAt => "jobs cannot expire (such a job is refused)",
            Column::AtMostOnce => "jobs cannot be at-most-once one by one (such a job is refused)",
            Column::AttemptsLeft => "no attempts are counted down (num_failures and max_attempts bound retries)",
        }
    }
}

impl fmt::Display for Column {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.standard_name())
    }
}

/// How claimed jobs are held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "config", derive(serde::Deserialize))]
#[cfg_attr(feature = "config", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum ExecutionMode {
    /// The spec's mode: the claim is visible at once (processing), and the
    /// handler gets the job's transaction ([`PgJobTransaction::transaction`](crate::PgJobTransaction::transaction)),
    /// which holds a `FOR KEY SHARE` lock on the job's row (proving the
    /// worker alive to the resetter) and commits the handler's writes
    /// together with the completion, or rolls them back if the attempt
    /// fails. It is opened when the handler first asks for it, so a handler
    /// that writes nothing costs no transaction.
    #[default]
    Transactional,
    /// No job transaction: the handler writes through the pool, heartbeats
    /// keep the job, and completions are batched. For long jobs and
    /// throughput.
    Lease,
}

/// Whether a claim's commit waits for its WAL to reach disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "config", derive(serde::Deserialize))]
#[cfg_attr(feature = "config", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum ClaimCommit {
    /// The claim's own transaction commits with `synchronous_commit = off`
    /// (set for that transaction only): it does not wait for the WAL
    /// flush, which takes a claim's round trip down by the flush's wait.
    /// A crash of the database server can forget the claims of its last
    /// moments (at most about three `wal_writer_delay`s); those jobs are
    /// queued again and run again, as after any crash of a worker, so
    /// delivery stays at least once. Nothing else is relaxed: completions,
    /// heartbeats, resets and job transactions commit durably, and a
    /// durable commit flushes every claim before it, so a job whose
    /// transaction committed never loses its claim. Fencing tokens grow by
    /// a random step, so a claim made again after a forgotten one never
    /// hands out the same token.
    #[default]
    Async,
    /// Every claim waits for its WAL flush, like every other write.
    Durable,
}

/// What a job that succeeds leaves in the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "config", derive(serde::Deserialize))]
#[cfg_attr(feature = "config", serde(rename_all = "snake_case"))]
#[non_exhaustive]
pub enum CompletedJobs {
    /// The row stays, in the completed state (the spec's behaviour, and
    /// what `queue` and any report over the table can show later).
    #[default]
    Keep,
    /// The row is deleted by the statement that would have marked it
    /// completed, under the same guard (graphile-worker's and Sidekiq's
    /// behaviour). A delete writes no new row version and no index entry,
    /// so a completion costs the server about half as much; the price is
    /// that successful jobs leave no trace in the table. Failed, canceled,
    /// errored and released jobs stay as they are.
    Delete,
}

/// The value each state is stored as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateValues(BTreeMap<StateKey, String>);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct StateKey(u8);

fn key(state: JobState) -> StateKey {
    StateKey(JobState::ALL.iter().position(|s| *s == state).unwrap_or(0) as u8)
}

impl Default for StateValues {
    /// The canonical names: `queued`, `processing`, `completed`, `errored`,
    /// `failed`, `canceled`.
    fn default() -> Self {
        StateValues(
            JobState::ALL
                .iter()
                .map(|s| (key(*s), s.as_str().to_owned()))
                .collect(),
        )
    }
}

impl StateValues {
    /// The stored value of `state`.
    pub fn get(&self, state: JobState) -> &str {
        self.0
            .get(&key(state))
            .map(String::as_str)
            .unwrap_or(state.as_str())
    }

    fn set(&mut self, state: JobState, value: String) {
        self.0.insert(key(state), value);
    }
}

/// The default of [`PgStoreOptions::exact_counts_below`].
pub const DEFAULT_EXACT_COUNTS_BELOW: u64 = 50_000;

/// The default of [`PgStoreOptions::admin_read_timeout`].
pub const DEFAULT_ADMIN_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Everything the Postgres store needs to know about the table it runs on.
/// Checked against the live catalog when the store is created.
///
/// ```
/// use queue_core::JobState;
/// use queue_store_postgres::{Column, ExecutionMode, PgStoreOptions};
///
/// // A table `tasks` with a `status` enum of pending / running / done / failed,
/// // a uuid key named `task_id`, and no execution log or cancel flag.
/// let options = PgStoreOptions::new("tasks")?
///     .schema("app")?
///     .column(Column::Id, "task_id")?
///     .column(Column::State, "status")?
///     .state_value(JobState::Queued, "pending")
///     .state_value(JobState::Processing, "running")
///     .state_value(JobState::Completed, "done")
///     .without(Column::ExecutionLogs)?
///     .without(Column::Cancel)?
///     .mode(ExecutionMode::Lease);
/// assert_eq!(options.table_name().quoted(), "\"app\".\"tasks\"");
/// # Ok::<(), queue_store_postgres::OptionsError>(())
/// ```
#[derive(Debug, Clone)]
pub struct PgStoreOptions {
    pub(crate) table: QualifiedName,
    pub(crate) alias: Ident,
    pub(crate) view: Option<QualifiedName>,
    /// Where purged jobs go instead of being deleted.
    pub(crate) archive: Option<QualifiedName>,
    pub(crate) select: Option<String>,
    pub(crate) order_by: Option<String>,
    pub(crate) columns: BTreeMap<Column, Option<Ident>>,
    /// The columns mapped by name ([`PgStoreOptions::column`]): these must
    /// exist even where the column is [optional by default](Column::optional_by_default).
    pub(crate) named: std::collections::BTreeSet<Column>,
    pub(crate) states: StateValues,
    /// The value expired jobs end in, if not failed's.
    pub(crate) expired_value: Option<String>,
    pub(crate) mode: ExecutionMode,
    pub(crate) channel: Option<String>,
    pub(crate) completion_delay: std::time::Duration,
    pub(crate) claim_commit: ClaimCommit,
    pub(crate) prepared_job_statements: bool,
    pub(crate) completed_jobs: CompletedJobs,
    pub(crate) claim_cursor: Option<std::time::Duration>,
    pub(crate) lock_rides: Option<std::time::Duration>,
    pub(crate) admin_read_timeout: Option<std::time::Duration>,
    pub(crate) exact_counts_below: u64,
    /// Where the message is in a JSON failure column.
    pub(crate) failure_message_path: Vec<String>,
    /// The bookkeeping table, if the store keeps one.
    pub(crate) bookkeeping: Option<QualifiedName>,
}

impl PgStoreOptions {
    /// Options for `table` in schema `public`, with the standard column
    /// names and state values, in transactional mode.
    pub fn new(table: &str) -> Result<Self, OptionsError> {
        let table = Ident::new(table)?;
        let columns = Column::ALL
            .iter()
            .map(|c| Ok((*c, Some(Ident::new(c.standard_name())?))))
            .collect::<Result<_, OptionsError>>()?;
        Ok(PgStoreOptions {
            table: QualifiedName::new(Ident::new("public")?, table.clone()),
            alias: table,
            view: None,
            archive: None,
            select: None,
            order_by: None,
            columns,
            named: Default::default(),
            states: StateValues::default(),
            expired_value: None,
            mode: ExecutionMode::default(),
            channel: None,
            completion_delay: std::time::Duration::from_millis(5),
            claim_commit: ClaimCommit::default(),
            prepared_job_statements: true,
            completed_jobs: CompletedJobs::Keep,
            claim_cursor: Some(std::time::Duration::from_millis(10)),
            lock_rides: None,
            admin_read_timeout: Some(DEFAULT_ADMIN_READ_TIMEOUT),
            exact_counts_below: DEFAULT_EXACT_COUNTS_BELOW,
            failure_message_path: vec!["message".to_owned()],
            bookkeeping: None,
        })
    }

    /// Sets the schema of the table (and of the view and the bookkeeping
    /// table, unless they name their own).
    pub fn schema(mut self, schema: &str) -> Result<Self, OptionsError> {
        let schema = Ident::new(schema)?;
        for beside in [&mut self.view, &mut self.bookkeeping]
            .into_iter()
            .flatten()
        {
            if beside.schema == self.table.schema {
                beside.schema = schema.clone();
            }
        }
        self.table.schema = schema;
        Ok(self)
    }

    /// Reads claimed records through `view` (in the table's schema), whose
    /// rows are matched to the table's by the key column. In SQL the view is
    /// aliased to the table's alias (by default the table name), so select
    /// and order-by expressions can say `jobs.column` whichever they read.
    pub fn view(mut self, view: &str) -> Result<Self, OptionsError> {
        self.view = Some(QualifiedName::new(
            self.table.schema.clone(),
            Ident::new(view)?,
        ));
        Ok(self)
    }

    /// Moves purged jobs (the pruner's, `queue purge`'s: [`Admin::purge`](queue_core::Admin::purge))
    /// into `archive` (in the table's schema) instead of deleting them, as
    /// rickover's `archived_jobs` does. The archive needs every column of
    /// the table, with the same types (`CREATE TABLE archive (LIKE jobs)`;
    /// checked at start-up); an operator's `delete` still deletes.
    pub fn archive_table(mut self, archive: &str) -> Result<Self, OptionsError> {
        self.archive = Some(QualifiedName::new(
            self.table.schema.clone(),
            Ident::new(archive)?,
        ));
        Ok(self)
    }

    /// [`PgStoreOptions::archive_table`] in `schema`.
    pub fn archive_table_in(mut self, schema: &str, archive: &str) -> Result<Self, OptionsError> {
        self.archive = Some(QualifiedName::new(
            Ident::new(schema)?,
            Ident::new(archive)?,
        ));
        Ok(self)
    }

    /// Reads claimed records through `view` in `schema`.
    pub fn view_in(mut self, schema: &str, view: &str) -> Result<Self, OptionsError> {
        self.view = Some(QualifiedName::new(Ident::new(schema)?, Ident::new(view)?));
        Ok(self)
    }

    /// The alias the table (and view) carry in SQL; default: the table name.
    pub fn alias(mut self, alias: &str) -> Result<Self, OptionsError> {
        self.alias = Ident::new(alias)?;
        Ok(self)
    }

    /// The select list the record is decoded from: SQL expressions over the
    /// alias, written by the developer (never user input). Default:
    /// `alias.*`; for [`PgStore::default_table`](crate::PgStore::default_table)
    /// without a view, the columns a claim does not write (the record takes
    /// the others from the claim).
    pub fn select(mut self, expressions: impl Into<String>) -> Self {
        self.select = Some(expressions.into());
        self
    }

    /// The claim order: an SQL expression over the table alias, written by
    /// the developer (never user input). Default: `priority DESC, id` when
    /// there is a priority column, else `id`.
    pub fn order_by(mut self, expression: impl Into<String>) -> Self {
        self.order_by = Some(expression.into());
        self
    }

    /// Keeps what the table lacks of a job's bookkeeping in `name`, a
    /// table the store owns (in the table's schema; see
    /// [`PgStoreOptions::bookkeeping_table_in`]): the claim token that
    /// fences claims, the claim time, the heartbeat, the reset and failure
    /// counts, the worker, the cancel flag and the execution log. So a
    /// table with only a key and a state runs jobs as it is, with every
    /// guarantee: nothing is added to it.
    ///
    /// Each of those columns the table has (mapped, or under its standard
    /// name) stays in the table; each it lacks (or is declared without)
    /// lives in the bookkeeping table, under its standard name. A row
    /// there exists only while its job runs, or waits to retry with counts
    /// to keep; finishing a job removes it in the same statement. Create
    /// it with [`bookkeeping::migrate`](crate::bookkeeping::migrate) or
    /// `queue migrate`; start-up checks it and logs which columns it
    /// carries.
    pub fn bookkeeping_table(mut self, name: &str) -> Result<Self, OptionsError> {
        self.bookkeeping = Some(QualifiedName::new(
            self.table.schema.clone(),
            Ident::new(name)?,
        ));
        Ok(self)
    }

    /// [`PgStoreOptions::bookkeeping_table`] in `schema` (for a team that
    /// may create tables only in a schema of its own).
    pub fn bookkeeping_table_in(mut self, schema: &str, name: &str) -> Result<Self, OptionsError> {
        self.bookkeeping = Some(QualifiedName::new(Ident::new(schema)?, Ident::new(name)?));
        Ok(self)
    }

    /// The bookkeeping table, if the store keeps one.
    pub fn bookkeeping(&self) -> Option<&QualifiedName> {
        self.bookkeeping.as_ref()
    }

    /// Where a `json` or `jsonb` failure column keeps the message: a path
    /// of keys, by default `["message"]`. Tables that store
    /// `{"error": "..."}` say `["error"]`; `{"error": {"message": ..}}`,
    /// `["error", "message"]`. Operators read and filter the message
    /// there, and a failure writes it there, beside the `attempt` and `at`
    /// keys the store adds (so the path cannot start with either).
    pub fn failure_message_path<I, S>(mut self, path: I) -> Result<Self, OptionsError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let path: Vec<String> = path.into_iter().map(Into::into).collect();
        let problem = if path.is_empty() {
            Some("the path needs at least one key".to_owned())
        } else if path.iter().any(String::is_empty) {
            Some("a key of the path is empty".to_owned())
        } else if matches!(path[0].as_str(), "attempt" | "at") {
            Some(format!(
                "{:?} is where the store writes the failed attempt's {}; put the message under another key",
                path[0],
                if path[0] == "at" { "time" } else { "number" }
            ))
        } else {
            None
        };
        if let Some(problem) = problem {
            return Err(OptionsError::Invalid {
                option: "failure_message_path",
                problem,
            });
        }
        self.failure_message_path = path;
        Ok(self)
    }

    /// Maps a standard column onto the table's own name for it.
    pub fn column(mut self, column: Column, name: &str) -> Result<Self, OptionsError> {
        self.columns.insert(column, Some(Ident::new(name)?));
        self.named.insert(column);
        Ok(self)
    }

    /// Declares that the table lacks `column`; the features that need it are
    /// off, and the store logs which at start-up.
    pub fn without(mut self, column: Column) -> Result<Self, OptionsError> {
        let why = match column {
            Column::Id => Some("identify jobs"),
            Column::State => Some("track where each job is"),
            _ => None,
        };
        if let Some(why) = why {
            return Err(OptionsError::RequiredColumn {
                column: column.standard_name(),
                why,
            });
        }
        self.columns.insert(column, None);
        self.named.remove(&column);
        Ok(self)
    }

    /// Stores `state` as `value` (for example `pending` for queued). For an
    /// enum column the value must be one of the enum's labels. Errored may
    /// share queued's value and canceled failed's, for state types with
    /// fewer values; all other states need values of their own.
    pub fn state_value(mut self, state: JobState, value: impl Into<String>) -> Self {
        self.states.set(state, value.into());
        self
    }

    /// The value a job that expired before it started
    /// ([`NewJob::expires_at`](queue_core::NewJob::expires_at)) ends in,
    /// instead of failed's (as rickover's `expired` state): the table's own
    /// value, which the admin surfaces show as stored (it is no standard
    /// state, so it is never claimed, retried or purged as one). On an enum
    /// column it must be one of the enum's labels; it must differ from every
    /// state's value.
    pub fn expired_state_value(mut self, value: impl Into<String>) -> Self {
        self.expired_value = Some(value.into());
        self
    }

    /// Every value a job in `state` may be stored as: the state's own, and
    /// for failed also the expired jobs' value of their own, if any (an
    /// expired job is a failed one; operators list, count, retry and purge
    /// it with them).
    pub(crate) fn stored_values(&self, state: JobState) -> Vec<&str> {
        let mut values = vec![self.states.get(state)];
        if let (JobState::Failed, Some(expired)) = (state, &self.expired_value) {
            values.push(expired);
        }
        values
    }

    /// The value expired jobs end in: [`PgStoreOptions::expired_state_value`],
    /// else failed's.
    pub fn expired_value(&self) -> &str {
        self.expired_value
            .as_deref()
            .unwrap_or(self.states.get(JobState::Failed))
    }

    /// Transactional (default) or lease mode.
    pub fn mode(mut self, mode: ExecutionMode) -> Self {
        self.mode = mode;
        self
    }

    /// The LISTEN/NOTIFY channel; default `queue_<table>`. Must match the one
    /// the insert trigger notifies (the migrations install it).
    pub fn channel(mut self, channel: impl Into<String>) -> Self {
        self.channel = Some(channel.into());
        self
    }

    /// Lease mode: how long the completer gathers outcomes before writing
    /// them in one statement (it also writes at once when 500 are waiting).
    /// Handlers do not wait for it; only the row's final state lands this
    /// much later. Default 5 ms (a 100,000-job drain measured 4 % faster
    /// than with 2 ms: fewer, larger statements, each with its WAL flush);
    /// zero writes whatever has queued up while the previous statement ran.
    pub fn completion_delay(mut self, delay: std::time::Duration) -> Self {
        self.completion_delay = delay;
        self
    }

    /// Whether claims wait for their WAL flush; default
    /// [`ClaimCommit::Async`] (see there for what a server crash does).
    pub fn claim_commit(mut self, commit: ClaimCommit) -> Self {
        self.claim_commit = commit;
        self
    }

    /// Transactional mode: whether a job's transaction runs on statements
    /// the store prepares in SQL on each connection (`PREPARE`), which
    /// takes it from four round trips to two; default on. Turn it off
    /// behind a pooler in transaction mode (PgBouncer), where a statement
    /// prepared in SQL does not follow the client to its next server
    /// connection. (The store also turns it off by itself, with a warning,
    /// the first time a statement it just prepared is missing.)
    pub fn prepared_job_statements(mut self, on: bool) -> Self {
        self.prepared_job_statements = on;
        self
    }

    /// Whether a job that succeeds stays in the table (completed) or is
    /// deleted; default [`CompletedJobs::Keep`].
    pub fn completed_jobs(mut self, completed: CompletedJobs) -> Self {
        self.completed_jobs = completed;
        self
    }

    /// Whether a claim into a backlog continues where the previous claim
    /// ended instead of reading the claim order from its start, and how long
    /// it may do so before a claim reads from the start again. Default
    /// 10 ms; `None` reads from the start on every claim.
    ///
    /// The start of the claim index holds an entry for every job claimed
    /// since the table was last vacuumed, each pointing at a row that is no
    /// longer claimable; a claim from the start walks all of them before it
    /// finds a claimable job: in the middle of a 100,000-job drain, 0.75 ms
    /// of a 48-job claim's 1.3 ms. With the cursor,
    /// a claim that follows one that came back full (as many jobs as it
    /// asked for) starts at the last job that claim took, in the same
    /// priority: its index scan starts there. A claim that comes back short
    /// ends the backlog, and the next claim reads from the start.
    ///
    /// What that gives up: a job that becomes claimable before the cursor
    /// while the backlog lasts (a higher priority, a retry coming due, a job
    /// handed back, a key whose insert commits after later keys were
    /// claimed) waits for the next claim from the start, at most this long.
    /// Claims with extra conditions (from PreDequeue) and stores with a
    /// custom [`order_by`](Self::order_by) always read from the start.
    ///
    /// While another session holds an old snapshot (idle in transaction, a
    /// long report or backup), vacuum removes nothing and the walk from the
    /// start grows with every job claimed: at 600 jobs/s, 22 ms after three
    /// minutes. When a claim from the start (short, or full inside a
    /// backlog) took over a millisecond and a measurement of that walk off the claim path (`EXPLAIN (ANALYZE,
    /// BUFFERS)`, at most every 5 s) counts 100 blocks or more (about
    /// 10,000 dead entries; a count, so a busy machine does not pass for
    /// one), claims stay at the cursor (eight claims back, for keys that commit a
    /// little late), backlog or not, and a read of the first waiting job's
    /// position (a *probe*, off the claim path, at most one every this long
    /// and never more than a hundredth of the time) moves the cursor there
    /// and wakes the workers if it moved back. Then a job that becomes
    /// claimable before that (a higher priority, a retry coming due, a job
    /// handed back, a key that commits long after later ones) waits for the
    /// next probe: about a hundred times as long as the walk takes. A
    /// probe that walks in
    /// under half a millisecond (the snapshot gone, the entries marked
    /// dead) ends it.
    pub fn claim_cursor(mut self, rescan_after: Option<std::time::Duration>) -> Self {
        self.claim_cursor = rescan_after;
        self
    }

    /// Transactional mode: how long a job's lock, asked for by its handler,
    /// may wait to ride on another job's commit; default `None` (never).
    /// (Jobs waiting for a handler have their locks carried by the commits
    /// before them regardless, when their kind's last job asked for its
    /// transaction: that costs them no wait.) With prepared job statements,
    /// a handler asking for its job's transaction while other jobs' commits
    /// are flowing hands the lock to the next commit, which sends it along
    /// (`EXECUTE complete(..); COMMIT AND CHAIN; EXECUTE lock(..)`) and
    /// passes its connection on, inside the locked transaction: one round
    /// trip per job instead of two. A lock rides only when another job's
    /// transaction is open and the last commit started within this wait;
    /// one that no commit takes within it opens the transaction itself.
    ///
    /// The rider's lock arrives after the carrying commit's WAL flush, later
    /// than its own round trip would bring it: turn rides on when the
    /// database server's CPU limits the jobs, not the handlers' waits. On the
    /// 2-core benchmark machine (`docs/benchmarks.md`) 64 handlers drained
    /// 25-70 % faster with rides (1 ms), 16 handlers about 10 % slower.
    pub fn lock_rides(mut self, wait: Option<std::time::Duration>) -> Self {
        self.lock_rides = wait;
        self
    }

    /// How long one operator read ([`Admin`](queue_core::Admin)'s get,
    /// list, count, stats and timeline) may run before the server stops it
    /// (its `statement_timeout`, set for the read alone); the read then
    /// fails with [`StoreError::TimedOut`](queue_core::StoreError::TimedOut).
    /// Default 10 s; `None` for no limit. A dashboard or `/metrics` left
    /// open on a big table then never holds a backend for minutes.
    pub fn admin_read_timeout(mut self, timeout: Option<std::time::Duration>) -> Self {
        self.admin_read_timeout = timeout;
        self
    }

    /// Where the figures of [`Admin::stats`](queue_core::Admin::stats)
    /// stop counting (default 50,000), so that they cost the same on a
    /// table of ten million rows as on a small one:
    ///
    /// - a table the planner's statistics put below this many rows is
    ///   counted whole, exactly;
    /// - on a bigger one, waiting and running jobs are counted exactly up
    ///   to this many in each of the three sets the claim reads (ready,
    ///   scheduled or retrying, running), through the claim's indexes; a
    ///   set past it has its states' counts estimated (at least what was
    ///   counted);
    /// - finished jobs, and values the state mapping does not know, are
    ///   estimated from the planner's statistics: the share of each state
    ///   and kind at the last `ANALYZE` (autovacuum's), times the table's
    ///   rows now. Per kind where extended statistics on the state and
    ///   kind columns exist (the default table has them), else per state.
    ///
    /// Estimated counts are marked
    /// [`StateCount::estimated`](queue_core::StateCount::estimated).
    /// [`StatsParams::exact`](queue_core::StatsParams::exact) counts every
    /// job instead, and `0` always does.
    pub fn exact_counts_below(mut self, rows: u64) -> Self {
        self.exact_counts_below = rows;
        self
    }

    /// How long claims may start at the cursor: `None` without one, which
    /// is also the case with a custom order (the cursor needs to start the
    /// scan in the middle of the order with one index condition).
    pub(crate) fn cursor_rescan_after(&self) -> Option<std::time::Duration> {
        self.claim_cursor.filter(|_| self.order_by.is_none())
    }

    /// The schema-qualified table.
    pub fn table_name(&self) -> &QualifiedName {
        &self.table
    }

    /// The alias the table and view carry in SQL (the one `select` and
    /// `order_by` expressions name).
    pub fn table_alias(&self) -> &Ident {
        &self.alias
    }

    /// The name a standard column has in the table, or `None` if absent.
    pub fn column_name(&self, column: Column) -> Option<&Ident> {
        self.columns.get(&column).and_then(Option::as_ref)
    }

    /// The stored value of `state`.
    pub fn state_values(&self) -> &StateValues {
        &self.states
    }

    /// The execution mode.
    pub fn execution_mode(&self) -> ExecutionMode {
        self.mode
    }

    /// The LISTEN/NOTIFY channel.
    pub fn notify_channel(&self) -> String {
        self.channel
            .clone()
            .unwrap_or_else(|| default_channel(&self.table.name))
    }

    pub(crate) fn check(&self) -> Result<(), OptionsError> {
        // Errored may share queued's value (a retry is then a delayed
        // requeue) and canceled may share failed's (for tables whose state
        // type has fewer values); every other pair must differ.
        let may_share = |a: JobState, b: JobState| {
            matches!(
                (a, b),
                (JobState::Queued, JobState::Errored) | (JobState::Failed, JobState::Canceled)
            )
        };
        for (i, a) in JobState::ALL.iter().enumerate() {
            for b in &JobState::ALL[i + 1..] {
                if self.states.get(*a) == self.states.get(*b) && !may_share(*a, *b) {
                    return Err(OptionsError::DuplicateStateValue {
                        first: a.as_str(),
                        second: b.as_str(),
                        value: self.states.get(*a).to_owned(),
                    });
                }
            }
        }
        if let Some(expired) = &self.expired_value {
            if let Some(state) = JobState::ALL
                .iter()
                .find(|s| self.states.get(**s) == expired)
            {
                return Err(OptionsError::Invalid {
                    option: "expired_state_value",
                    problem: format!(
                        "{expired:?} is {state}'s value; expired jobs need a value of their own (or none, to end failed)"
                    ),
                });
            }
        }
        for (i, a) in Column::ALL.iter().enumerate() {
            for b in &Column::ALL[i + 1..] {
                if let (Some(x), Some(y)) = (self.column_name(*a), self.column_name(*b)) {
                    if x == y {
                        return Err(OptionsError::SharedColumn {
                            first: a.standard_name(),
                            second: b.standard_name(),
                            name: x.quoted(),
                        });
                    }
                }
            }
        }
        if self.notify_channel().is_empty() || self.notify_channel().len() > 63 {
            return Err(OptionsError::Invalid {
                option: "channel",
                problem: "a channel name must have 1 to 63 bytes".into(),
            });
        }
        Ok(())
    }
}

/// `queue_<table>`, cut to Postgres' 63-byte identifier limit.
pub(crate) fn default_channel(table: &Ident) -> String {
    let mut channel = format!("queue_{}", table.as_str());
    while channel.len() > 63 {
        channel.pop();
    }
    channel
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_use_the_standard_names() {
        let o = PgStoreOptions::new("jobs").unwrap();
        assert_eq!(o.table_name().quoted(), "\"public\".\"jobs\"");
        for c in Column::ALL {
            assert_eq!(o.column_name(c).unwrap().as_str(), c.standard_name());
        }
        assert_eq!(o.state_values().get(JobState::Errored), "errored");
        assert_eq!(o.notify_channel(), "queue_jobs");
    }

    #[test]
    fn id_and_state_cannot_be_absent() {
        let err = PgStoreOptions::new("jobs")
            .unwrap()
            .without(Column::State)
            .unwrap_err();
        assert!(
            err.to_string().contains("state column cannot be absent"),
            "{err}"
        );
    }

    #[test]
    fn options_without_a_fencing_column_still_describe_a_readable_table() {
        // Only a store that runs jobs needs to tell claims apart (it
        // refuses at start-up); the admin contract reads such a table.
        let o = PgStoreOptions::new("jobs")
            .unwrap()
            .without(Column::ClaimToken)
            .and_then(|o| o.without(Column::StartedAt))
            .unwrap();
        assert_eq!(o.check(), Ok(()));
    }

    #[test]
    fn two_standard_columns_cannot_share_a_table_column() {
        let o = PgStoreOptions::new("jobs")
            .unwrap()
            .column(Column::StartedAt, "updated_at")
            .unwrap()
            .column(Column::LastHeartbeatAt, "updated_at")
            .unwrap();
        let err = o.check().unwrap_err().to_string();
        assert!(
            err.starts_with(
                "columns started_at and last_heartbeat_at are both mapped to \"updated_at\""
            ) && err.contains("declare one absent"),
            "{err}"
        );
        let fixed = o.without(Column::LastHeartbeatAt).unwrap();
        assert_eq!(fixed.check(), Ok(()));
    }

    #[test]
    fn two_states_cannot_share_a_value_unless_the_merge_is_safe() {
        let o = PgStoreOptions::new("jobs")
            .unwrap()
            .state_value(JobState::Errored, "failed");
        let err = o.check().unwrap_err().to_string();
        assert!(err.contains("errored and failed"), "{err}");
        let merged = PgStoreOptions::new("jobs")
            .unwrap()
            .state_value(JobState::Errored, "queued")
            .state_value(JobState::Canceled, "failed");
        assert_eq!(merged.check(), Ok(()));
    }
}
