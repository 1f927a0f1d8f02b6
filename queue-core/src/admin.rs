//! The admin contract: looking at a queue and repairing it.
//!
//! [`Admin`] is what an operator surface (the `queue` CLI, an HTTP API, a
//! dashboard) needs of a store, written once for every store: read one job
//! or a page of them, count them, and move them on by hand (retry, cancel,
//! delete, reset, purge) or add new ones. It speaks in the standard columns
//! of a job ([`JobView`]) whatever record type the workers decode, so it
//! works on a foreign table as well as on the default one.
//!
//! Every write is guarded like the worker's: it names the states it may
//! move a job out of, and a job in any other state is left alone and
//! reported ([`Skipped`]), never an error. Bulk writes over a
//! [`JobFilter`] change at most a given number of jobs per call, so that
//! no single statement holds many rows: call again until fewer come back
//! (see [`Targets::Matching`]).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::audit::{AuditEntry, AuditParams, NewAuditEntry};
use crate::error::StoreError;
use crate::job::{Enqueued, Job, JobId, JobState, NewJob};
use crate::limits::{KindLimit, KindLimits};
use crate::operations::{
    AbortOutcome, NewOperation, Operation, OperationParams, OperationStep, TakeOperation,
};
use crate::pause::PausedKind;
use crate::resetter::{ResetParams, ResetReport};

/// A job as an operator sees it: its key, kind, payload and every standard
/// column the store has. A column the store lacks reads as `None` (or
/// empty, or false).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub struct JobView<Id> {
    /// The key (as text in the HTTP API, whatever the key column's type).
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub id: Id,
    /// The kind, if the store keeps one.
    pub kind: Option<String>,
    /// The arguments, if the store keeps them, as JSON.
    pub payload: Option<serde_json::Value>,
    /// The standard state the stored value stands for, or `None` for a
    /// value the store's state mapping does not know (a foreign table's
    /// own state, such as `archived`).
    pub state: Option<JobState>,
    /// The state as stored: the table's own vocabulary (enum labels
    /// included).
    pub stored_state: String,
    /// Higher runs first.
    pub priority: Option<i64>,
    /// The last failure's message.
    pub failure_message: Option<String>,
    /// When the job was enqueued.
    pub queued_at: Option<DateTime<Utc>>,
    /// When the current or last attempt was claimed.
    pub started_at: Option<DateTime<Utc>>,
    /// When the job errored or reached a terminal state.
    pub finished_at: Option<DateTime<Utc>>,
    /// Not claimable before this time.
    pub process_after: Option<DateTime<Utc>>,
    /// How often the resetter moved it back to queued.
    pub num_resets: Option<i64>,
    /// How many attempts failed.
    pub num_failures: Option<i64>,
    /// The last sign of life of the worker handling it.
    pub last_heartbeat_at: Option<DateTime<Utc>>,
    /// The execution log of the last attempt, each entry as stored (a
    /// [`LogEntry`](crate::LogEntry) as JSON, or a foreign table's own
    /// shape).
    pub execution_logs: Vec<serde_json::Value>,
    /// The worker that claimed it last.
    pub worker_hostname: Option<String>,
    /// Whether an operator asked a running attempt to stop.
    pub cancel: bool,
    /// Its unique key, if it has one ([`NewJob::unique`]).
    #[serde(default)]
    pub unique_key: Option<String>,
    /// Its own attempt limit ([`NewJob::max_attempts`]).
    #[serde(default)]
    pub max_attempts: Option<i64>,
    /// The attempts it has left, where the store counts them down instead
    /// (a table's countdown column, as rickover's `attempts`).
    #[serde(default)]
    pub attempts_left: Option<i64>,
    /// When it expires unstarted ([`NewJob::expires_at`]).
    #[serde(default)]
    pub expires_at: Option<DateTime<Utc>>,
    /// Whether it is at-most-once ([`NewJob::at_most_once`]).
    #[serde(default)]
    pub at_most_once: bool,
}

impl<Id> JobView<Id> {
    /// The job `id`, stored in `stored_state` (the standard `state`), with
    /// every other field empty: a store fills in those it keeps.
    pub fn new(id: Id, stored_state: String, state: Option<JobState>) -> Self {
        JobView {
            id,
            kind: None,
            payload: None,
            state,
            stored_state,
            priority: None,
            failure_message: None,
            queued_at: None,
            started_at: None,
            finished_at: None,
            process_after: None,
            num_resets: None,
            num_failures: None,
            last_heartbeat_at: None,
            execution_logs: Vec::new(),
            worker_hostname: None,
            cancel: false,
            unique_key: None,
            max_attempts: None,
            attempts_left: None,
            expires_at: None,
            at_most_once: false,
        }
    }

    /// The same job with its key turned by `f` (into text, for example).
    pub fn map_id<T>(self, f: impl FnOnce(Id) -> T) -> JobView<T> {
        JobView {
            id: f(self.id),
            kind: self.kind,
            payload: self.payload,
            state: self.state,
            stored_state: self.stored_state,
            priority: self.priority,
            failure_message: self.failure_message,
            queued_at: self.queued_at,
            started_at: self.started_at,
            finished_at: self.finished_at,
            process_after: self.process_after,
            num_resets: self.num_resets,
            num_failures: self.num_failures,
            last_heartbeat_at: self.last_heartbeat_at,
            execution_logs: self.execution_logs,
            worker_hostname: self.worker_hostname,
            cancel: self.cancel,
            unique_key: self.unique_key,
            max_attempts: self.max_attempts,
            attempts_left: self.attempts_left,
            expires_at: self.expires_at,
            at_most_once: self.at_most_once,
        }
    }
}

impl From<Job> for JobView<i64> {
    /// The view of a default-table [`Job`]: every column present.
    fn from(job: Job) -> Self {
        JobView {
            id: job.id,
            kind: Some(job.kind),
            payload: Some(job.payload),
            state: Some(job.state),
            stored_state: job.state.as_str().to_owned(),
            priority: Some(job.priority.into()),
            failure_message: job.failure_message,
            queued_at: Some(job.queued_at),
            started_at: job.started_at,
            finished_at: job.finished_at,
            process_after: job.process_after,
            num_resets: Some(job.num_resets.into()),
            num_failures: Some(job.num_failures.into()),
            last_heartbeat_at: job.last_heartbeat_at,
            execution_logs: job
                .execution_logs
                .iter()
                .filter_map(|entry| serde_json::to_value(entry).ok())
                .collect(),
            worker_hostname: job.worker_hostname,
            cancel: job.cancel,
            // A Job has no columns for these; a store that keeps them
            // fills them in.
            unique_key: None,
            max_attempts: None,
            attempts_left: None,
            expires_at: None,
            at_most_once: false,
        }
    }
}

/// Builder methods that each set one of [`JobFilter`]'s fields: the
/// method is named after the field it sets.
macro_rules! filter_setters {
    ($($(#[$doc:meta])* $field:ident($arg:ident: $ty:ty) = $value:expr;)*) => {
        $(
            $(#[$doc])*
            pub fn $field(mut self, $arg: $ty) -> Self {
                self.$field = Some($value);
                self
            }
        )*
    };
}

/// Which jobs an operation looks at. Every field left `None` admits every
/// job; the fields that are set must all hold. Times are half-open: `from`
/// is inclusive, `before` exclusive.
///
/// ```
/// use queue_core::{JobFilter, JobState};
/// let failed_emails = JobFilter::default()
///     .states([JobState::Failed])
///     .kinds(["email"])
///     .failure_contains("timeout");
/// assert_eq!(failed_emails.states, Some(vec![JobState::Failed]));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct JobFilter {
    /// Jobs in one of these states.
    pub states: Option<Vec<JobState>>,
    /// Jobs of one of these kinds.
    pub kinds: Option<Vec<String>>,
    /// Jobs enqueued at or after this time.
    pub queued_from: Option<DateTime<Utc>>,
    /// Jobs enqueued before this time.
    pub queued_before: Option<DateTime<Utc>>,
    /// Jobs that finished (errored or ended) at or after this time.
    pub finished_from: Option<DateTime<Utc>>,
    /// Jobs that finished before this time.
    pub finished_before: Option<DateTime<Utc>>,
    /// Jobs whose failure message contains this text, ignoring case.
    pub failure_contains: Option<String>,
    /// Jobs whose payload contains this JSON, as Postgres' `jsonb @>` reads
    /// it: every key of an object with a value it contains, every element
    /// of an array in some element, a scalar equal.
    pub payload_contains: Option<serde_json::Value>,
    /// Jobs holding this unique key.
    pub unique_key: Option<String>,
    /// Jobs last claimed by this worker (its host name, as the worker
    /// wrote it).
    pub worker: Option<String>,
    /// Jobs whose current or last attempt started before this time; with
    /// the processing state, the jobs running longer than a while.
    pub started_before: Option<DateTime<Utc>>,
}

impl JobFilter {
    /// Only jobs in one of `states`.
    pub fn states(mut self, states: impl IntoIterator<Item = JobState>) -> Self {
        self.states = Some(states.into_iter().collect());
        self
    }

    /// Only jobs of one of `kinds`.
    pub fn kinds(mut self, kinds: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.kinds = Some(kinds.into_iter().map(Into::into).collect());
        self
    }

    filter_setters! {
        /// Only jobs whose failure message contains `text`, ignoring case.
        failure_contains(text: impl Into<String>) = text.into();
        /// Only jobs whose payload contains `json` (see
        /// [`JobFilter::payload_contains`]).
        payload_contains(json: serde_json::Value) = json;
        /// Only jobs holding the unique key `key`.
        unique_key(key: impl Into<String>) = key.into();
        /// Only jobs last claimed by `worker`.
        worker(worker: impl Into<String>) = worker.into();
        /// Only jobs whose current or last attempt started before `at`, in
        /// any state (see [`JobFilter::running_since_before`] for the running
        /// ones).
        started_before(at: DateTime<Utc>) = at;
        /// Only jobs enqueued at or after `at`.
        queued_from(at: DateTime<Utc>) = at;
        /// Only jobs enqueued before `at`.
        queued_before(at: DateTime<Utc>) = at;
        /// Only jobs that finished at or after `at`.
        finished_from(at: DateTime<Utc>) = at;
        /// Only jobs that finished before `at`.
        finished_before(at: DateTime<Utc>) = at;
    }

    /// Only jobs running since before `at`: processing, their attempt
    /// started before it.
    pub fn running_since_before(mut self, at: DateTime<Utc>) -> Self {
        self.states = Some(vec![JobState::Processing]);
        self.started_before = Some(at);
        self
    }

    /// Whether `job` passes the filter. Stores that cannot push the filter
    /// into a query (the memory store) apply it with this.
    pub fn matches<Id>(&self, job: &JobView<Id>) -> bool {
        let within = |at: Option<DateTime<Utc>>,
                      from: Option<DateTime<Utc>>,
                      before: Option<DateTime<Utc>>| {
            (from.is_none() && before.is_none())
                || at
                    .is_some_and(|at| from.is_none_or(|f| at >= f) && before.is_none_or(|b| at < b))
        };
        self.states
            .as_ref()
            .is_none_or(|states| job.state.is_some_and(|s| states.contains(&s)))
            && self
                .kinds
                .as_ref()
                .is_none_or(|kinds| job.kind.as_ref().is_some_and(|k| kinds.contains(k)))
            && within(job.queued_at, self.queued_from, self.queued_before)
            && within(job.finished_at, self.finished_from, self.finished_before)
            && self.failure_contains.as_ref().is_none_or(|text| {
                job.failure_message
                    .as_ref()
                    .is_some_and(|m| m.to_lowercase().contains(&text.to_lowercase()))
            })
            && self
                .payload_contains
                .as_ref()
                .is_none_or(|part| job.payload.as_ref().is_some_and(|p| json_contains(p, part)))
            && self
                .unique_key
                .as_ref()
                .is_none_or(|key| job.unique_key.as_ref() == Some(key))
            && self
                .worker
                .as_ref()
                .is_none_or(|w| job.worker_hostname.as_ref() == Some(w))
            && self
                .started_before
                .is_none_or(|before| job.started_at.is_some_and(|at| at < before))
    }
}

/// Whether `whole` contains `part` as Postgres' `jsonb @>` says: an object
/// every key of `part`'s with a value that contains its value, an array an
/// element containing each of `part`'s elements, a scalar an equal one.
pub fn json_contains(whole: &serde_json::Value, part: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (whole, part) {
        (Value::Object(w), Value::Object(p)) => p
            .iter()
            .all(|(key, value)| w.get(key).is_some_and(|v| json_contains(v, value))),
        (Value::Array(w), Value::Array(p)) => p
            .iter()
            .all(|value| w.iter().any(|v| json_contains(v, value))),
        (Value::Number(w), Value::Number(p)) => w.as_f64() == p.as_f64(),
        (w, p) => w == p,
    }
}

/// In which order [`Admin::list`] returns jobs: by when they were queued.
/// A store whose keys come from a sequence orders by key, which is the
/// same order; one whose keys say nothing of order (uuid, text) orders by
/// its queued time, then key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ListOrder {
    /// Most recently queued first.
    #[default]
    NewestFirst,
    /// Longest queued first.
    OldestFirst,
}

/// What [`Admin::list`] needs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ListParams<Id> {
    /// Which jobs.
    pub filter: JobFilter,
    /// In which order.
    pub order: ListOrder,
    /// At most this many jobs.
    pub limit: usize,
    /// The page after this key: [`JobPage::next`] of the page before.
    /// Keyset pagination: a job enqueued while an operator pages through
    /// neither shifts the pages nor repeats a job.
    pub after: Option<Id>,
}

impl<Id> ListParams<Id> {
    /// The first page of `limit` jobs matching `filter`, newest first.
    pub fn first(filter: JobFilter, limit: usize) -> Self {
        ListParams {
            filter,
            order: ListOrder::default(),
            limit,
            after: None,
        }
    }

    /// In `order`.
    pub fn order(mut self, order: ListOrder) -> Self {
        self.order = order;
        self
    }

    /// The page after key `after` (the previous page's [`JobPage::next`]).
    pub fn after(mut self, after: Option<Id>) -> Self {
        self.after = after;
        self
    }

    /// The same filter, order and limit, after `after`: a key of another
    /// type (the same key read another way).
    pub fn rekeyed<T>(self, after: Option<T>) -> ListParams<T> {
        ListParams {
            filter: self.filter,
            order: self.order,
            limit: self.limit,
            after,
        }
    }
}

/// One page of [`Admin::list`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct JobPage<Id> {
    /// The jobs, in the requested order.
    pub jobs: Vec<JobView<Id>>,
    /// Where the next page starts ([`ListParams::after`]), or `None` when
    /// this page is the last.
    pub next: Option<Id>,
    /// Set when the store stopped searching before the page was full: it
    /// read this many jobs in list order, up to and including `next`, and
    /// the page holds the matches among them. The list may go on past
    /// `next`; the page after it searches on from there. A store does this
    /// for a filter no index serves on a big table (the Postgres store's
    /// failure text without a trigram index), so that a page costs a
    /// bounded read, never the whole table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub searched: Option<u64>,
}

impl<Id> JobPage<Id> {
    /// A page of `jobs`, the next one starting after `next` (`None`: the
    /// last page).
    pub fn new(jobs: Vec<JobView<Id>>, next: Option<Id>) -> Self {
        JobPage {
            jobs,
            next,
            searched: None,
        }
    }

    /// A page whose search stopped after reading `rows` jobs
    /// ([`JobPage::searched`]).
    pub fn searched(mut self, rows: Option<u64>) -> Self {
        self.searched = rows;
        self
    }
}

/// What [`Admin::stats`] needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct StatsParams {
    /// The current time: which waiting jobs are due.
    pub now: DateTime<Utc>,
    /// Processing jobs whose last heartbeat is older than this count as
    /// stalled (`now - stalled max age`, as the resetter judges).
    pub stalled_before: DateTime<Utc>,
    /// Count every job, however big the table. Otherwise a store may give
    /// estimates where an exact count would read too much (a count is
    /// then [`StateCount::estimated`]); see the store's documentation.
    pub exact: bool,
}

impl StatsParams {
    /// The figures at `now`, with processing jobs silent since before
    /// `stalled_before` counted stalled; estimates allowed.
    pub fn new(now: DateTime<Utc>, stalled_before: DateTime<Utc>) -> Self {
        StatsParams {
            now,
            stalled_before,
            exact: false,
        }
    }

    /// The same, every count exact.
    pub fn exact(mut self) -> Self {
        self.exact = true;
        self
    }
}

/// How many jobs of one kind are in one state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[non_exhaustive]
pub struct StateCount {
    /// The standard state, or `None` for a stored value the state mapping
    /// does not know.
    pub state: Option<JobState>,
    /// The state as stored.
    pub stored_state: String,
    /// The kind, if the store keeps one (`None` also for an estimate the
    /// store could not tell apart by kind).
    pub kind: Option<String>,
    /// How many jobs.
    pub count: u64,
    /// Whether `count` is an estimate rather than a count.
    #[serde(default)]
    pub estimated: bool,
}

impl StateCount {
    /// `count` jobs of `kind` counted in the state stored as
    /// `stored_state` (`state` in the standard names).
    pub fn new(
        state: Option<JobState>,
        stored_state: impl Into<String>,
        kind: Option<String>,
        count: u64,
    ) -> Self {
        StateCount {
            state,
            stored_state: stored_state.into(),
            kind,
            count,
            estimated: false,
        }
    }

    /// The same figure, marked an estimate.
    pub fn estimated(mut self) -> Self {
        self.estimated = true;
        self
    }
}

/// What [`Admin::stats`] found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct QueueStats {
    /// Jobs per state and kind, in lifecycle order of the states (unknown
    /// stored values last), then by kind.
    pub counts: Vec<StateCount>,
    /// Since when the longest-waiting claimable job (queued, or errored
    /// with its retry time passed) has been claimable: the later of its
    /// enqueue time and its `process_after`. `None` when no job waits.
    pub oldest_claimable_since: Option<DateTime<Utc>>,
    /// Processing jobs whose heartbeat is older than
    /// [`StatsParams::stalled_before`]: what the resetter would reset.
    /// `None` when the store keeps no heartbeat or start time for its
    /// running jobs, so it cannot tell a stalled job from a busy one.
    pub stalled: Option<u64>,
    /// The kinds paused ([`Admin::pause`]), by kind.
    #[serde(default)]
    pub paused: Vec<PausedKind>,
    /// The time the figures are for ([`StatsParams::now`]).
    pub now: DateTime<Utc>,
}

impl QueueStats {
    /// The figures a store found at `now`.
    pub fn new(
        counts: Vec<StateCount>,
        oldest_claimable_since: Option<DateTime<Utc>>,
        stalled: Option<u64>,
        now: DateTime<Utc>,
    ) -> Self {
        QueueStats {
            counts,
            oldest_claimable_since,
            stalled,
            paused: Vec::new(),
            now,
        }
    }

    /// The same figures, with the kinds paused at the time.
    pub fn with_paused(mut self, paused: Vec<PausedKind>) -> Self {
        self.paused = paused;
        self
    }

    /// How many jobs are in `state`, over all kinds.
    pub fn total(&self, state: JobState) -> u64 {
        self.counts
            .iter()
            .filter(|c| c.state == Some(state))
            .map(|c| c.count)
            .sum()
    }

    /// Whether any count is an estimate.
    pub fn estimated(&self) -> bool {
        self.counts.iter().any(|c| c.estimated)
    }

    /// How long the longest-waiting claimable job has waited.
    pub fn oldest_claimable_age(&self) -> Option<chrono::TimeDelta> {
        self.oldest_claimable_since.map(|since| self.now - since)
    }
}

/// What [`Admin::finished_timeline`] needs: `buckets` intervals of
/// `bucket` each, the first starting at `since`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimelineParams {
    /// Where the first interval starts.
    pub since: DateTime<Utc>,
    /// How long each interval is; at least a second.
    pub bucket: chrono::TimeDelta,
    /// How many intervals.
    pub buckets: u32,
}

impl TimelineParams {
    /// The `buckets` intervals of `bucket` that end at `until`.
    pub fn ending(until: DateTime<Utc>, bucket: chrono::TimeDelta, buckets: u32) -> Self {
        TimelineParams {
            since: until - bucket * buckets as i32,
            bucket,
            buckets,
        }
    }

    /// Where the intervals end.
    pub fn until(&self) -> DateTime<Utc> {
        self.since + self.bucket * self.buckets as i32
    }

    /// The interval `at` falls in, if any.
    pub fn bucket_of(&self, at: DateTime<Utc>) -> Option<usize> {
        let millis = self.bucket.num_milliseconds();
        if at < self.since || at >= self.until() || millis <= 0 {
            return None;
        }
        usize::try_from((at - self.since).num_milliseconds() / millis).ok()
    }

    /// Empty intervals, to be counted into.
    pub fn empty(&self) -> Vec<FinishedBucket> {
        (0..self.buckets)
            .map(|i| FinishedBucket::new(self.since + self.bucket * i as i32))
            .collect()
    }
}

/// How many jobs finished, per end state, in one interval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct FinishedBucket {
    /// Where the interval starts.
    pub start: DateTime<Utc>,
    /// Jobs that completed in it.
    pub completed: u64,
    /// Jobs that failed for good in it.
    pub failed: u64,
    /// Jobs canceled in it.
    pub canceled: u64,
    /// Jobs that completed in it, per kind (empty where the store keeps
    /// no kind): each kind's throughput.
    pub completed_by_kind: std::collections::BTreeMap<String, u64>,
}

impl FinishedBucket {
    /// An interval from `start` with nothing counted yet.
    pub fn new(start: DateTime<Utc>) -> Self {
        FinishedBucket {
            start,
            completed: 0,
            failed: 0,
            canceled: 0,
            completed_by_kind: Default::default(),
        }
    }

    /// Counts `count` jobs that ended in `state` (a state that is not an end
    /// state is not counted).
    pub fn add(&mut self, state: JobState, count: u64) {
        match state {
            JobState::Completed => self.completed += count,
            JobState::Failed => self.failed += count,
            JobState::Canceled => self.canceled += count,
            _ => {}
        }
    }

    /// Counts `count` jobs of `kind` (if the store keeps one) that ended in
    /// `state`.
    pub fn add_of_kind(&mut self, kind: Option<&str>, state: JobState, count: u64) {
        self.add(state, count);
        if let (Some(kind), JobState::Completed) = (kind, state) {
            *self.completed_by_kind.entry(kind.to_owned()).or_default() += count;
        }
    }
}

/// Which jobs a write applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Targets<Id> {
    /// These jobs, in one step. Each one the write does not apply to is
    /// reported in [`ActionReport::skipped`] with its state.
    Ids(Vec<Id>),
    /// Up to `limit` jobs matching `filter` (and the write's own states),
    /// in one step. Call again while a call changes `limit` jobs: each
    /// call is one short transaction, so a large clean-up never holds many
    /// rows at once.
    Matching {
        /// Which jobs.
        filter: JobFilter,
        /// At most this many per call.
        limit: usize,
        /// Only jobs whose key comes after this one, in the store's key
        /// order: the [`ActionReport::last`] of the call before, so that a
        /// long run of calls walks the table once instead of from its start
        /// each time.
        after: Option<Id>,
    },
}

impl<Id> Targets<Id> {
    /// The one job `id`.
    pub fn id(id: Id) -> Self {
        Targets::Ids(vec![id])
    }

    /// Up to `limit` jobs matching `filter`, from the lowest key.
    pub fn matching(filter: JobFilter, limit: usize) -> Self {
        Targets::Matching {
            filter,
            limit,
            after: None,
        }
    }
}

/// Why a write left a job alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SkipReason {
    /// There is no job with the key.
    Missing,
    /// The job is in a state the write does not move it out of.
    State,
    /// Another transaction held the job's row when the write came (its
    /// attempt's own transaction, a heartbeat, a completion), and still
    /// held it when the write tried again moments later: the write never
    /// waits on a lock. Trying again later may succeed.
    Locked,
    /// Another job holds the job's unique key: retried, this one would be
    /// a second job with the key.
    KeyHeld,
}

/// A job a write left alone, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped<Id> {
    /// The key.
    pub id: Id,
    /// `None`: there is no such job. Otherwise the state it is in, as
    /// stored.
    pub stored_state: Option<String>,
    /// The standard state of `stored_state`, if it is one.
    pub state: Option<JobState>,
    /// Why it was left alone.
    pub reason: SkipReason,
}

impl<Id> Skipped<Id> {
    /// A key no job has.
    pub fn missing(id: Id) -> Self {
        Skipped {
            id,
            stored_state: None,
            state: None,
            reason: SkipReason::Missing,
        }
    }

    /// A job stored as `stored_state` (standard `state`), left alone for
    /// `reason`.
    pub fn new(id: Id, stored_state: String, state: Option<JobState>, reason: SkipReason) -> Self {
        Skipped {
            id,
            stored_state: Some(stored_state),
            state,
            reason,
        }
    }

    /// The same skip of the job under another form of its key.
    pub fn map_id<T>(self, f: impl FnOnce(Id) -> T) -> Skipped<T> {
        Skipped {
            id: f(self.id),
            stored_state: self.stored_state,
            state: self.state,
            reason: self.reason,
        }
    }
}

impl<Id: std::fmt::Display> Skipped<Id> {
    /// Why the job was left alone, in a sentence that names it; `action`
    /// is the write's past participle (`retried`).
    pub fn explain(&self, action: &str) -> String {
        let stored = self.stored_state.as_deref().unwrap_or("gone");
        let why = match self.reason {
            SkipReason::Missing => "there is no such job".to_owned(),
            SkipReason::State => format!("it is {stored}"),
            SkipReason::Locked if self.state == Some(JobState::Processing) => format!(
                "it is {stored}, held by its worker's transaction; try again once the attempt ends"
            ),
            SkipReason::Locked => format!(
                "it is {stored}, and another transaction held it for a moment (a heartbeat or a completion); try again"
            ),
            SkipReason::KeyHeld => {
                format!("it is {stored}, and another job holds its unique key")
            }
        };
        format!("job {} was not {action}: {why}", self.id)
    }
}

/// What a write did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ActionReport<Id> {
    /// How many jobs changed state (or were deleted).
    pub changed: u64,
    /// Cancel only: how many running jobs had their cancel flag set; their
    /// workers stop them at the next heartbeat.
    pub stop_requested: u64,
    /// The jobs named by [`Targets::Ids`] that were left alone.
    pub skipped: Vec<Skipped<Id>>,
    /// A [`Targets::Matching`] call: the key up to which every matching
    /// job has been dealt with, where the next call may start
    /// ([`Targets::Matching::after`]). `None` where the store cannot say
    /// (the next call then starts where this one did).
    pub last: Option<Id>,
}

impl<Id> ActionReport<Id> {
    /// `changed` jobs changed, `stop_requested` running ones asked to stop,
    /// `skipped` left alone.
    pub fn new(changed: u64, stop_requested: u64, skipped: Vec<Skipped<Id>>) -> Self {
        ActionReport {
            changed,
            stop_requested,
            skipped,
            last: None,
        }
    }

    /// The same report, saying the next call may start after `last`.
    pub fn last(mut self, last: Option<Id>) -> Self {
        self.last = last;
        self
    }
}

impl<Id> Default for ActionReport<Id> {
    fn default() -> Self {
        ActionReport {
            changed: 0,
            stop_requested: 0,
            skipped: Vec::new(),
            last: None,
        }
    }
}

/// What [`Admin::retry`] needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetryParams {
    /// Also set the failure and reset counts back to zero, so the job gets
    /// its whole retry and reset budget again. Otherwise it gets one more
    /// attempt, and the retry policy decides from its failure count
    /// whether a failure of that attempt is retried.
    pub reset_attempts: bool,
}

/// What [`Admin::purge`] needs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PurgeParams {
    /// Jobs that finished before this time.
    pub finished_before: DateTime<Utc>,
    /// In these states; only terminal states (completed, failed,
    /// canceled) may be purged.
    pub states: Vec<JobState>,
    /// At most this many per call (see [`Targets::Matching`]).
    pub limit: usize,
    /// Only jobs that finished at or after this time: where the last
    /// batch stopped ([`PurgeReport::last_finished`]), so that the next
    /// one reads on from there instead of from the oldest job again.
    pub finished_from: Option<DateTime<Utc>>,
}

/// What one [`Admin::purge`] call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PurgeReport {
    /// Jobs removed.
    pub purged: u64,
    /// Jobs the batch found to remove, at most the limit: more than
    /// `purged` when another transaction took or changed some of them
    /// first. Only a batch that found fewer than its limit has reached the
    /// end of the jobs to purge.
    pub found: u64,
    /// The latest finish time among them, where a store purges oldest
    /// first: the next call's [`PurgeParams::finished_from`]. `None` when
    /// it removed none, or takes jobs in another order.
    pub last_finished: Option<DateTime<Utc>>,
}

impl PurgeReport {
    /// `purged` jobs removed, the latest of them finished at
    /// `last_finished`; as many found (see [`PurgeReport::found`]).
    pub fn new(purged: u64, last_finished: Option<DateTime<Utc>>) -> Self {
        PurgeReport {
            purged,
            found: purged,
            last_finished,
        }
    }

    /// The same, with `found` jobs found (no fewer than it removed).
    pub fn found(self, found: u64) -> Self {
        PurgeReport {
            found: found.max(self.purged),
            ..self
        }
    }
}

impl PurgeParams {
    /// Up to `limit` jobs in `states` that finished before
    /// `finished_before`.
    pub fn new(states: Vec<JobState>, finished_before: DateTime<Utc>, limit: usize) -> Self {
        PurgeParams {
            finished_before,
            states,
            limit,
            finished_from: None,
        }
    }

    /// The same, from where the last batch stopped.
    pub fn from(mut self, finished_from: Option<DateTime<Utc>>) -> Self {
        self.finished_from = finished_from;
        self
    }

    /// The jobs these parameters purge, `None` if no state is named;
    /// refused if a state is not a final one.
    pub fn filter(&self) -> Result<Option<JobFilter>, StoreError> {
        if let Some(state) = self.states.iter().find(|s| !s.is_terminal()) {
            return Err(StoreError::Refused(format!(
                "only finished jobs can be purged, not {state} ones; choose among completed, failed and canceled"
            )));
        }
        if self.states.is_empty() {
            return Ok(None);
        }
        let filter = JobFilter::default()
            .states(self.states.iter().copied())
            .finished_before(self.finished_before);
        Ok(Some(match self.finished_from {
            Some(from) => filter.finished_from(from),
            None => filter,
        }))
    }
}

/// Reading and repairing a queue: what every operator surface needs of a
/// store. See the [module docs](self).
#[async_trait]
pub trait Admin: Send + Sync + 'static {
    /// The key type of the jobs.
    type Id: JobId;

    /// How the store writes `state` (a foreign table's own vocabulary, enum
    /// labels included); by default the standard name.
    fn stored_state(&self, state: JobState) -> String {
        state.as_str().to_owned()
    }

    /// The states [`Admin::retry`] moves jobs out of: failed, errored and
    /// canceled, less any the store cannot tell apart from a state that is
    /// not retryable (errored stored as queued's value: retrying it would
    /// pull waiting and scheduled jobs forward).
    fn retryable_states(&self) -> Vec<JobState> {
        distinct_retryable_states(|s| self.stored_state(s))
    }

    /// Whether [`Admin::enqueue`] would take `jobs`, judged without
    /// writing anything: refused ([`StoreError::Refused`]) if the store
    /// has nowhere to keep something they carry (a kind, a payload, a
    /// unique key or its scope, a limit). A scheduler checks its
    /// schedules' jobs with it at start-up, instead of failing at the
    /// first occurrence. By default every job is taken.
    fn check_enqueue(&self, jobs: &[NewJob]) -> Result<(), StoreError> {
        let _ = jobs;
        Ok(())
    }

    /// The job with key `id`, or `None` if there is none.
    async fn get(&self, id: &Self::Id) -> Result<Option<JobView<Self::Id>>, StoreError>;

    /// One page of the jobs matching `params.filter`, in
    /// [`ListParams::order`]. A page after a job that no longer exists is
    /// refused ([`StoreError::Refused`]) where the store cannot tell where
    /// it would start.
    async fn list(&self, params: &ListParams<Self::Id>) -> Result<JobPage<Self::Id>, StoreError>;

    /// How many jobs match `filter`.
    async fn count(&self, filter: &JobFilter) -> Result<u64, StoreError>;

    /// Jobs per state and kind, the age of the oldest claimable job and
    /// the number of stalled ones.
    async fn stats(&self, params: StatsParams) -> Result<QueueStats, StoreError>;

    /// Adds jobs; returns, in order, each one's key and whether it was
    /// added: a job whose [unique key](NewJob::unique) another job in scope
    /// holds is not, and its entry carries that job's key (as does a later
    /// job of the same call with a key an earlier one took). Workers
    /// waiting for jobs are woken.
    async fn enqueue(&self, jobs: &[NewJob]) -> Result<Vec<Enqueued<Self::Id>>, StoreError>;

    /// How many jobs finished in each interval of `params`, by the time
    /// the store recorded as their finish time: the completions and
    /// failures per minute of a dashboard. Jobs deleted since are not
    /// counted. `None` when the store keeps no finish time.
    async fn finished_timeline(
        &self,
        params: &TimelineParams,
    ) -> Result<Option<Vec<FinishedBucket>>, StoreError>;

    /// Makes jobs in the [retryable states](Admin::retryable_states)
    /// (failed, errored, canceled) queued and claimable now, on the
    /// store's own clock (their `process_after`; their cancel flag and
    /// finish time cleared, an expiry that has passed too). Jobs in other
    /// states are left alone.
    async fn retry(
        &self,
        targets: &Targets<Self::Id>,
        params: RetryParams,
    ) -> Result<ActionReport<Self::Id>, StoreError>;

    /// Cancels jobs: a queued or errored job becomes canceled at once (with
    /// [`CANCELED_BEFORE_RUN_MESSAGE`](crate::CANCELED_BEFORE_RUN_MESSAGE),
    /// finished now on the store's own clock); a processing one gets its
    /// cancel flag set, and its worker stops it at the next heartbeat.
    /// Finished jobs are left alone.
    async fn cancel(
        &self,
        targets: &Targets<Self::Id>,
    ) -> Result<ActionReport<Self::Id>, StoreError>;

    /// Fails jobs at once with an operator's `reason`, on the store's own
    /// clock: a stuck running job as well as a waiting one. A running
    /// attempt is fenced out (its claim token no longer holds the job), so
    /// its late finish, heartbeat or log entry changes nothing
    /// ([`WriteResult::Stale`](crate::WriteResult::Stale)) and its worker
    /// stops it at the next heartbeat: the job stays failed, never
    /// resurrected. Finished jobs are left alone (reported).
    async fn force_fail(
        &self,
        targets: &Targets<Self::Id>,
        reason: &str,
    ) -> Result<ActionReport<Self::Id>, StoreError>;

    /// Deletes jobs, in any state. A worker running one learns at its next
    /// heartbeat that it is gone. A processing job whose attempt holds it
    /// in a transaction is left alone (reported), never waited for.
    async fn delete(
        &self,
        targets: &Targets<Self::Id>,
    ) -> Result<ActionReport<Self::Id>, StoreError>;

    /// Pauses `kind`: from now on no worker claims its jobs (within a
    /// second for a store that workers read it from), until it is
    /// [resumed](Admin::resume). Its waiting jobs keep their place and lose
    /// no attempt; its running jobs finish. `by` says who paused it. A kind
    /// with no jobs yet can be paused. Returns the pause in force: for a
    /// kind already paused, the earlier pause, unchanged. Refused
    /// ([`StoreError::Refused`]) for an empty kind or `by`
    /// ([`check_pause`](crate::check_pause)), or where the store keeps no
    /// kind.
    async fn pause(&self, kind: &str, by: &str) -> Result<PausedKind, StoreError>;

    /// Resumes `kind`: workers claim its jobs again, and waiting workers
    /// are woken. Returns the pause it ended, or `None` if the kind was not
    /// paused.
    async fn resume(&self, kind: &str) -> Result<Option<PausedKind>, StoreError>;

    /// The kinds paused now, by kind.
    async fn paused(&self) -> Result<Vec<PausedKind>, StoreError>;

    /// Sets `kind`'s limits, for every process claiming from the store
    /// (within a second for a store that workers read them from), saying
    /// `by` whom; limits with none set clear them. Returns the limits in
    /// force, `None` once cleared. Refused ([`StoreError::Refused`]) for
    /// limits [`KindLimits::check`] refuses, an empty kind or `by`, or
    /// where the store keeps no kind. See [`limits`](crate::limits).
    async fn set_limits(
        &self,
        kind: &str,
        limits: &KindLimits,
        by: &str,
    ) -> Result<Option<KindLimit>, StoreError>;

    /// The kinds with limits, by kind; none where the store keeps no
    /// kind.
    async fn limits(&self) -> Result<Vec<KindLimit>, StoreError>;

    /// Appends `entries` to the audit log in the order given, at the
    /// store's time, all or none: a server that records many writes at
    /// once appends them in one write (one commit) instead of one each.
    /// A store may commit them without waiting for the disk (the Postgres
    /// store does; a crash of its server within `wal_writer_delay` loses
    /// them): an entry is written after the write it records, which is
    /// durable on its own. Refused ([`StoreError::Refused`]) where the
    /// store keeps no audit log (its table not created): the surface then
    /// says so.
    async fn append_audit(&self, entries: &[NewAuditEntry]) -> Result<(), StoreError>;

    /// Entries of the audit log, newest first.
    async fn audit(&self, params: &AuditParams) -> Result<Vec<AuditEntry>, StoreError>;

    /// The workers whose last beat ([`Store::beat`](crate::Store::beat))
    /// came at or after `seen_since`, by name. A worker that stopped
    /// beating before then is taken for dead and left out.
    async fn workers(
        &self,
        seen_since: DateTime<Utc>,
    ) -> Result<Vec<crate::WorkerInfo>, StoreError>;

    /// Records a bulk operation, pending: a runner
    /// ([`run_operation`](crate::run_operation)) carries it out. Refused
    /// ([`StoreError::Refused`]) if [`NewOperation::check`] refuses it, or
    /// where the store keeps no operations (its table not created). See
    /// [`operations`](crate::operations).
    async fn create_operation(&self, new: &NewOperation)
        -> Result<Operation<Self::Id>, StoreError>;

    /// Operation `id`, or `None` if there is none.
    async fn operation(&self, id: i64) -> Result<Option<Operation<Self::Id>>, StoreError>;

    /// Operations, newest first.
    async fn operations(
        &self,
        params: &OperationParams,
    ) -> Result<Vec<Operation<Self::Id>>, StoreError>;

    /// Gives `take.runner` an operation to carry out, now running and its
    /// own: the one `take.id` names (pending, interrupted, or running with
    /// a runner silent for `take.silent_for`), or else the oldest pending
    /// one or the oldest whose runner went silent. `None` if there is none.
    /// Two runners never get the same operation.
    async fn take_operation(
        &self,
        take: &TakeOperation,
    ) -> Result<Option<Operation<Self::Id>>, StoreError>;

    /// Records a batch of an operation and, with `step.end`, its end, at
    /// the store's time ([`OperationStep::apply`]). Returns the operation
    /// as recorded; `None` (nothing recorded) if it is not `step.runner`'s
    /// any more.
    async fn step_operation(
        &self,
        step: &OperationStep<Self::Id>,
    ) -> Result<Option<Operation<Self::Id>>, StoreError>;

    /// Aborts operation `id` at once if it has not ended (its runner stops
    /// after the batch under way; the jobs changed stay changed), with the
    /// message `aborted by <by>`. Says whether this call aborted it or it
    /// had ended before; `None` if there is no such operation.
    async fn abort_operation(
        &self,
        id: i64,
        by: &str,
    ) -> Result<Option<AbortOutcome<Self::Id>>, StoreError>;

    /// Removes the operations that ended (done, aborted, failed) longer
    /// than `older_than` ago, by the store's clock; returns how many.
    /// Running, pending and interrupted ones stay, however old.
    async fn prune_operations(&self, older_than: std::time::Duration) -> Result<u64, StoreError>;

    /// Resets stalled jobs once, as the resetter does on each tick (see
    /// [`resetter`](crate::resetter)).
    async fn reset(&self, params: ResetParams) -> Result<ResetReport<Self::Id>, StoreError>;

    /// Deletes up to `params.limit` jobs in `params.states` that finished
    /// before `params.finished_before` (and at or after
    /// `params.finished_from`); returns how many, and where the next batch
    /// starts. Call again, from there, while it finds `params.limit`
    /// ([`PurgeReport::found`]).
    async fn purge(&self, params: &PurgeParams) -> Result<PurgeReport, StoreError> {
        let Some(filter) = params.filter()? else {
            return Ok(PurgeReport::new(0, None));
        };
        let report = self
            .delete(&Targets::matching(filter, params.limit))
            .await?;
        Ok(PurgeReport::new(report.changed, None))
    }
}

/// The [retryable](JobState::is_retryable) states a store writing each
/// state as `stored` can tell apart from every state that is not.
pub fn distinct_retryable_states(stored: impl Fn(JobState) -> String) -> Vec<JobState> {
    let others: Vec<String> = JobState::ALL
        .into_iter()
        .filter(|s| !s.is_retryable())
        .map(&stored)
        .collect();
    JobState::ALL
        .into_iter()
        .filter(|s| s.is_retryable() && !others.contains(&stored(*s)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A filter is `#[non_exhaustive]`, so users build it only through
    /// its methods: every field has one. (The literal below stops
    /// compiling when a field is added, until it gets its method.)
    #[test]
    fn every_filter_field_has_a_builder() {
        let at = |s: i64| DateTime::<Utc>::UNIX_EPOCH + chrono::TimeDelta::seconds(s);
        let built = JobFilter::default()
            .states([JobState::Failed])
            .kinds(["email"])
            .queued_from(at(1))
            .queued_before(at(2))
            .finished_from(at(3))
            .finished_before(at(4))
            .failure_contains("timeout")
            .payload_contains(serde_json::json!({"user": 7}))
            .unique_key("invoice:7")
            .worker("host-1")
            .started_before(at(5));
        let literal = JobFilter {
            states: Some(vec![JobState::Failed]),
            kinds: Some(vec!["email".into()]),
            queued_from: Some(at(1)),
            queued_before: Some(at(2)),
            finished_from: Some(at(3)),
            finished_before: Some(at(4)),
            failure_contains: Some("timeout".into()),
            payload_contains: Some(serde_json::json!({"user": 7})),
            unique_key: Some("invoice:7".into()),
            worker: Some("host-1".into()),
            started_before: Some(at(5)),
        };
        assert_eq!(built, literal);
    }

    fn view(state: JobState) -> JobView<i64> {
        let mut view = JobView::new(1, state.as_str().into(), Some(state));
        view.kind = Some("email".into());
        view.priority = Some(0);
        view.failure_message = Some("Upstream TIMEOUT after 30s".into());
        view.queued_at = Some(DateTime::<Utc>::UNIX_EPOCH + chrono::TimeDelta::seconds(100));
        view.num_resets = Some(0);
        view.num_failures = Some(1);
        view
    }

    #[test]
    fn an_empty_filter_admits_every_job() {
        assert!(JobFilter::default().matches(&view(JobState::Queued)));
    }

    #[test]
    fn every_set_field_must_hold() {
        let job = view(JobState::Failed);
        let at = |s| DateTime::<Utc>::UNIX_EPOCH + chrono::TimeDelta::seconds(s);
        assert!(JobFilter::default()
            .failure_contains("timeout")
            .matches(&job));
        assert!(!JobFilter::default()
            .failure_contains("refused")
            .matches(&job));
        assert!(!JobFilter::default()
            .states([JobState::Failed])
            .kinds(["sms"])
            .matches(&job));
        let window = |from, before| JobFilter {
            queued_from: from,
            queued_before: before,
            ..JobFilter::default()
        };
        assert!(
            window(Some(at(100)), Some(at(101))).matches(&job),
            "from is inclusive"
        );
        assert!(
            !window(None, Some(at(100))).matches(&job),
            "before is exclusive"
        );
        assert!(
            !JobFilter::default()
                .finished_before(at(1_000))
                .matches(&job),
            "a job that never finished is not 'finished before' anything"
        );
    }

    #[test]
    fn errored_stored_as_queued_is_not_retryable() {
        let standard = distinct_retryable_states(|s| s.as_str().to_owned());
        assert_eq!(
            standard,
            [JobState::Errored, JobState::Failed, JobState::Canceled]
        );
        let merged = distinct_retryable_states(|s| match s {
            JobState::Errored => "queued".to_owned(),
            JobState::Canceled => "failed".to_owned(),
            other => other.as_str().to_owned(),
        });
        assert_eq!(merged, [JobState::Failed, JobState::Canceled]);
    }

    #[test]
    fn payload_containment_reads_as_jsonb_does() {
        use serde_json::json;
        let payload =
            json!({"customer": 42, "tags": ["a", "b"], "address": {"city": "Oslo", "zip": "0150"}});
        assert!(json_contains(&payload, &json!({"customer": 42})));
        assert!(json_contains(&payload, &json!({"customer": 42.0})));
        assert!(json_contains(
            &payload,
            &json!({"address": {"city": "Oslo"}})
        ));
        assert!(json_contains(&payload, &json!({"tags": ["b"]})));
        assert!(json_contains(&payload, &json!({})));
        assert!(!json_contains(&payload, &json!({"customer": 43})));
        assert!(!json_contains(&payload, &json!({"tags": ["c"]})));
        assert!(!json_contains(&payload, &json!({"missing": null})));
        assert!(!json_contains(&payload, &json!({"customer": "42"})));
    }

    #[test]
    fn a_skip_says_what_the_job_is_and_why() {
        let missing = Skipped::<i64>::missing(7);
        assert_eq!(
            missing.explain("retried"),
            "job 7 was not retried: there is no such job"
        );
        let running = Skipped::new(
            8,
            "running".into(),
            Some(JobState::Processing),
            SkipReason::State,
        );
        assert_eq!(
            running.explain("retried"),
            "job 8 was not retried: it is running"
        );
        let held = Skipped {
            reason: SkipReason::Locked,
            ..running
        };
        assert!(held
            .explain("deleted")
            .contains("held by its worker's transaction"));
        let failed = |reason| Skipped::new(9, "failed".into(), Some(JobState::Failed), reason);
        assert_eq!(
            failed(SkipReason::KeyHeld).explain("retried"),
            "job 9 was not retried: it is failed, and another job holds its unique key"
        );
        assert!(failed(SkipReason::Locked)
            .explain("retried")
            .contains("another transaction held it for a moment"));
    }
}
