//! [`MemoryStore`]: the whole store contract over a map behind a mutex.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use queue_core::limits::Tokens;
use queue_core::resetter::{AT_MOST_ONCE_MESSAGE, MAX_RESETS_MESSAGE};
use queue_core::{
    ClaimParams, Claimed, Clock, DecodeError, Delivery, Enqueued, HeartbeatReport, Job, JobLimits,
    JobState, Lease, LogEntry, NewJob, PausedKind, ResetParams, ResetReport, Store, StoreError,
    SystemClock, Transition, UniqueKey, UniqueScope, WriteResult, EXPIRED_MESSAGE,
};
use tokio::sync::Notify;

/// Extra dequeue conditions for the memory store: a predicate on the job.
///
/// ```
/// use queue_store_memory::MemoryCondition;
/// let small = MemoryCondition::new(|job| job.payload["cost"].as_u64().unwrap_or(0) <= 4);
/// let mut job = queue_core::Job::example(1, "k", serde_json::json!({"cost": 3}));
/// assert!(small.matches(&job));
/// job.payload["cost"] = 9.into();
/// assert!(!small.matches(&job));
/// ```
#[derive(Clone)]
pub struct MemoryCondition(Arc<dyn Fn(&Job) -> bool + Send + Sync>);

impl MemoryCondition {
    /// A filter admitting the jobs for which `predicate` is true.
    pub fn new(predicate: impl Fn(&Job) -> bool + Send + Sync + 'static) -> Self {
        MemoryCondition(Arc::new(predicate))
    }

    /// A filter admitting only jobs of `kind`.
    pub fn kind(kind: impl Into<String>) -> Self {
        let kind = kind.into();
        MemoryCondition::new(move |job| job.kind == kind)
    }

    /// Whether `job` passes.
    pub fn matches(&self, job: &Job) -> bool {
        (self.0)(job)
    }
}

impl fmt::Debug for MemoryCondition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MemoryCondition(..)")
    }
}

type DecodeCheck = Arc<dyn Fn(&Job) -> Result<(), String> + Send + Sync>;

#[derive(Default)]
pub(crate) struct State {
    pub(crate) jobs: BTreeMap<i64, Job>,
    /// Queued and errored jobs in claim order: priority descending, then id.
    pub(crate) claimable: BTreeSet<(Reverse<i32>, i64)>,
    /// What jobs were enqueued with beyond a [`Job`]'s columns, for the
    /// jobs that set any of it.
    pub(crate) extras: HashMap<i64, Extras>,
    /// The paused kinds: their jobs are not claimed.
    pub(crate) paused: BTreeMap<String, PausedKind>,
    /// The audit log, oldest first.
    pub(crate) audit: Vec<queue_core::AuditEntry>,
    /// The worker registry: each worker's last beat, by name.
    pub(crate) workers: BTreeMap<String, queue_core::WorkerInfo>,
    /// Bulk operations, by id.
    pub(crate) operations: BTreeMap<i64, queue_core::Operation<i64>>,
    /// The kinds with limits, and each one's token bucket.
    pub(crate) limits:
        BTreeMap<String, (queue_core::KindLimit, Option<queue_core::limits::Tokens>)>,
    next_id: i64,
    next_token: i64,
}

/// A job's enqueue options that a [`Job`] has no column for.
#[derive(Debug, Clone, Default)]
pub(crate) struct Extras {
    pub(crate) unique: Option<UniqueKey>,
    pub(crate) limits: JobLimits,
    pub(crate) expires_at: Option<DateTime<Utc>>,
}

impl State {
    /// The job's limits (none set: the default).
    fn limits(&self, id: i64) -> JobLimits {
        self.extras.get(&id).map(|e| e.limits).unwrap_or_default()
    }

    /// Whether the job expired before `now` without being started.
    fn expired(&self, id: i64, now: DateTime<Utc>) -> bool {
        self.extras
            .get(&id)
            .and_then(|e| e.expires_at)
            .is_some_and(|at| at <= now)
    }

    fn held_mut(&mut self, lease: &Lease<i64>) -> Option<&mut Job> {
        self.jobs
            .get_mut(&lease.id)
            .filter(|job| job.state == JobState::Processing && job.claim_token == lease.token)
    }

    /// Each job's unique key, by job.
    pub(crate) fn unique_keys(&self) -> HashMap<i64, String> {
        self.extras
            .iter()
            .filter_map(|(id, e)| Some((*id, e.unique.as_ref()?.key.clone())))
            .collect()
    }

    /// The holder of each unique key held (by a job in its key's scope).
    pub(crate) fn key_holders(&self) -> HashMap<String, i64> {
        self.extras
            .iter()
            .filter_map(|(id, e)| {
                let unique = e.unique.as_ref()?;
                let job = self.jobs.get(id)?;
                let holds = unique.scope == UniqueScope::Forever || !job.state.is_terminal();
                holds.then(|| (unique.key.clone(), *id))
            })
            .collect()
    }

    /// The job that holds the unique key `key` in its scope, if any.
    fn holder_of(&self, key: &str) -> Option<i64> {
        self.extras.iter().find_map(|(id, extras)| {
            let unique = extras.unique.as_ref()?;
            let job = self.jobs.get(id)?;
            let holds = unique.key == key
                && (unique.scope == UniqueScope::Forever || !job.state.is_terminal());
            holds.then_some(*id)
        })
    }

    pub(crate) fn make_claimable(&mut self, id: i64) {
        if let Some(job) = self.jobs.get(&id) {
            self.claimable.insert((Reverse(job.priority), id));
        }
    }
}

struct Shared {
    state: Mutex<State>,
    jobs_available: Notify,
    clock: Arc<dyn Clock>,
    decode_check: Option<DecodeCheck>,
}

/// An in-memory [`Store`] of [`Job`] records.
///
/// Deterministic (claims follow priority, then id), with an injectable clock
/// for the timestamps it sets itself (enqueue, operator actions); all
/// contract operations take their `now` explicitly. Clones share the same
/// jobs. The store a handler receives is a clone of the store itself.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use queue_core::{ClaimParams, NewJob, Store, Transition};
/// use queue_store_memory::MemoryStore;
///
/// let store = MemoryStore::new();
/// let id = store.enqueue(NewJob::new("email", serde_json::json!({"to": "a@b.c"})));
/// let now = chrono::Utc::now();
/// let mut claimed = store
///     .claim(ClaimParams { limit: 10, worker: "w1", conditions: None, now })
///     .await
///     .unwrap();
/// let job = claimed.pop().unwrap();
/// assert_eq!(job.lease.id, id);
/// let applied = store.finish(job.job_store, &job.lease, Transition::Complete, now).await.unwrap();
/// assert!(applied.is_applied());
/// # }
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    shared: Arc<Shared>,
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("jobs", &self.lock().jobs.len())
            .finish_non_exhaustive()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl MemoryStore {
    /// An empty store on the system clock.
    pub fn new() -> Self {
        MemoryStore::with_clock(Arc::new(SystemClock))
    }

    /// An empty store whose own timestamps come from `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        MemoryStore::build(clock, None)
    }

    /// An empty store on `clock` whose claims report a job as undecodable
    /// when `check` returns an error, the way a database store reports a row
    /// it cannot decode.
    pub fn with_decode_check(
        clock: Arc<dyn Clock>,
        check: impl Fn(&Job) -> Result<(), String> + Send + Sync + 'static,
    ) -> Self {
        MemoryStore::build(clock, Some(Arc::new(check)))
    }

    fn build(clock: Arc<dyn Clock>, decode_check: Option<DecodeCheck>) -> Self {
        MemoryStore {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                jobs_available: Notify::new(),
                clock,
                decode_check,
            }),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // The state is consistent after every statement that mutates it, so
        // a panic elsewhere while holding the lock leaves nothing half done.
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn wake_workers(&self) {
        // Wake the waiting workers, and leave a permit for one that is about
        // to wait, so an enqueue racing a worker's empty claim is not missed.
        self.shared.jobs_available.notify_waiters();
        self.shared.jobs_available.notify_one();
    }

    /// The clock the store stamps its own timestamps with.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.shared.clock
    }

    /// Enqueues a job; returns its id (for a job whose unique key is
    /// taken, the id of the job that holds it).
    pub fn enqueue(&self, job: NewJob) -> i64 {
        self.enqueue_many([job])[0]
    }

    /// Enqueues jobs in one step; returns their ids in order (see
    /// [`MemoryStore::enqueue`]).
    pub fn enqueue_many(&self, jobs: impl IntoIterator<Item = NewJob>) -> Vec<i64> {
        self.enqueue_reporting(jobs)
            .into_iter()
            .map(|e| e.id)
            .collect()
    }

    /// Enqueues jobs in one step; says for each whether it was added.
    pub fn enqueue_reporting(&self, jobs: impl IntoIterator<Item = NewJob>) -> Vec<Enqueued<i64>> {
        let now = self.shared.clock.now();
        let mut state = self.lock();
        let results: Vec<Enqueued<i64>> = jobs
            .into_iter()
            .map(|new| {
                if let Some(holder) = new.unique.as_ref().and_then(|u| state.holder_of(&u.key)) {
                    return Enqueued {
                        id: holder,
                        inserted: false,
                    };
                }
                state.next_id += 1;
                let id = state.next_id;
                let mut job = Job::example(id, &new.kind, new.payload);
                job.priority = new.priority;
                job.process_after = new.process_after;
                job.queued_at = now;
                state.jobs.insert(id, job);
                if new.unique.is_some()
                    || new.limits != JobLimits::default()
                    || new.expires_at.is_some()
                {
                    state.extras.insert(
                        id,
                        Extras {
                            unique: new.unique,
                            limits: new.limits,
                            expires_at: new.expires_at,
                        },
                    );
                }
                state.make_claimable(id);
                Enqueued { id, inserted: true }
            })
            .collect();
        drop(state);
        if results.iter().any(|e| e.inserted) {
            self.wake_workers();
        }
        results
    }

    /// The job with `id`, if it exists.
    pub fn get(&self, id: i64) -> Option<Job> {
        self.lock().jobs.get(&id).cloned()
    }

    /// All jobs, by id.
    pub fn jobs(&self) -> Vec<Job> {
        self.lock().jobs.values().cloned().collect()
    }

    /// How many jobs are in each state.
    pub fn count_by_state(&self) -> HashMap<JobState, usize> {
        let mut counts = HashMap::new();
        for job in self.lock().jobs.values() {
            *counts.entry(job.state).or_insert(0) += 1;
        }
        counts
    }
}

pub(crate) fn eligible(job: &Job, now: DateTime<Utc>) -> bool {
    matches!(job.state, JobState::Queued | JobState::Errored)
        && job.process_after.is_none_or(|at| at <= now)
}

#[async_trait]
impl Store for MemoryStore {
    type Id = i64;
    type Record = Job;
    type Conditions = MemoryCondition;
    type JobStore = MemoryStore;

    async fn claim(
        &self,
        params: ClaimParams<'_, MemoryCondition>,
    ) -> Result<Vec<Claimed<Self>>, StoreError> {
        let mut state = self.lock();
        // What each limited kind may still start in this claim, and its
        // bucket after (read once per claim, as the Postgres store does).
        let mut budgets: BTreeMap<String, (u64, Option<Tokens>)> = BTreeMap::new();
        for (kind, (limit, tokens)) in &state.limits {
            let running = state
                .jobs
                .values()
                .filter(|j| j.state == JobState::Processing && &j.kind == kind)
                .count() as u64;
            budgets.insert(
                kind.clone(),
                queue_core::limits::budget(&limit.limits, running, *tokens, params.now),
            );
        }
        let mut taken: BTreeMap<String, u64> = BTreeMap::new();
        let chosen: Vec<(Reverse<i32>, i64)> = state
            .claimable
            .iter()
            .filter(|(_, id)| {
                !state.expired(*id, params.now)
                    && state.jobs.get(id).is_some_and(|job| {
                        eligible(job, params.now)
                            && !state.paused.contains_key(&job.kind)
                            && params.conditions.is_none_or(|c| c.matches(job))
                            && match budgets.get(&job.kind) {
                                None => true,
                                Some((room, _)) => {
                                    let n = taken.entry(job.kind.clone()).or_default();
                                    let fits = *n < *room;
                                    *n += u64::from(fits);
                                    fits
                                }
                            }
                    })
            })
            .take(params.limit)
            .copied()
            .collect();
        for (kind, (_, tokens)) in budgets {
            let spent = taken.get(&kind).copied().unwrap_or(0);
            if let Some(entry) = state.limits.get_mut(&kind) {
                entry.1 = queue_core::limits::spend(tokens, spent);
            }
        }
        let mut claimed = Vec::with_capacity(chosen.len());
        for key in chosen {
            state.claimable.remove(&key);
            state.next_token += 1;
            let token = state.next_token;
            let limits = state.limits(key.1);
            let Some(job) = state.jobs.get_mut(&key.1) else {
                continue;
            };
            job.state = JobState::Processing;
            // A claim clears both times (`JobState::times_agree`).
            job.finished_at = None;
            job.process_after = None;
            job.claim_token = token;
            job.started_at = Some(params.now);
            job.last_heartbeat_at = Some(params.now);
            job.worker_hostname = Some(params.worker.to_owned());
            job.execution_logs.clear();
            let lease = Lease {
                id: job.id,
                token,
                attempt: u32::try_from(job.num_failures).unwrap_or(0) + 1,
                limits,
            };
            let record = match &self.shared.decode_check {
                Some(check) => check(job)
                    .map(|()| job.clone())
                    .map_err(|message| DecodeError {
                        id: job.id.to_string(),
                        message,
                    }),
                None => Ok(job.clone()),
            };
            claimed.push(Claimed {
                lease,
                record,
                job_store: self.clone(),
            });
        }
        Ok(claimed)
    }

    async fn finish_again(
        &self,
        lease: &Lease<i64>,
        transition: Transition,
        now: DateTime<Utc>,
    ) -> Result<WriteResult, StoreError> {
        // No job transaction to lose: the same write.
        self.finish(self.clone(), lease, transition, now).await
    }

    async fn finish(
        &self,
        _job_store: MemoryStore,
        lease: &Lease<i64>,
        transition: Transition,
        now: DateTime<Utc>,
    ) -> Result<WriteResult, StoreError> {
        let mut state = self.lock();
        let Some(job) = state.held_mut(lease) else {
            return Ok(WriteResult::Stale);
        };
        let target = transition.target();
        match transition {
            Transition::Complete => job.finished_at = Some(now),
            Transition::Retry { message, retry_at } => {
                job.num_failures += 1;
                job.failure_message = Some(message);
                job.process_after = Some(retry_at);
                job.finished_at = Some(now);
            }
            Transition::Fail { message } => {
                job.num_failures += 1;
                job.failure_message = Some(message);
                job.finished_at = Some(now);
            }
            Transition::Cancel { message } => {
                job.failure_message = Some(message);
                job.finished_at = Some(now);
            }
            Transition::Release => {}
            other => {
                return Err(StoreError::Config(format!(
                    "the memory store does not know the transition {other:?}"
                )))
            }
        }
        job.state = target;
        let requeued = matches!(job.state, JobState::Queued | JobState::Errored);
        if requeued {
            state.make_claimable(lease.id);
            drop(state);
            self.wake_workers();
        }
        Ok(WriteResult::Applied)
    }

    async fn heartbeat(
        &self,
        leases: &[Lease<i64>],
        now: DateTime<Utc>,
    ) -> Result<HeartbeatReport<i64>, StoreError> {
        let mut state = self.lock();
        let mut report = HeartbeatReport::default();
        for lease in leases {
            match state.held_mut(lease) {
                Some(job) => {
                    job.last_heartbeat_at = Some(now);
                    if job.cancel {
                        report.cancel_requested.push(lease.id);
                    }
                }
                None => report.gone.push(lease.id),
            }
        }
        Ok(report)
    }

    async fn expire(&self, now: DateTime<Utc>, limit: usize) -> Result<Vec<i64>, StoreError> {
        let mut state = self.lock();
        let expired: Vec<i64> = state
            .extras
            .iter()
            .filter(|(_, e)| e.expires_at.is_some_and(|at| at <= now))
            .map(|(id, _)| *id)
            .filter(|id| {
                state
                    .jobs
                    .get(id)
                    .is_some_and(|j| matches!(j.state, JobState::Queued | JobState::Errored))
            })
            .take(limit)
            .collect();
        for id in &expired {
            if let Some(job) = state.jobs.get_mut(id) {
                let key = (Reverse(job.priority), job.id);
                job.state = JobState::Failed;
                job.failure_message = Some(EXPIRED_MESSAGE.to_owned());
                job.finished_at = Some(now);
                job.process_after = None;
                state.claimable.remove(&key);
            }
        }
        Ok(expired)
    }

    async fn append_log(
        &self,
        lease: &Lease<i64>,
        entry: LogEntry,
    ) -> Result<WriteResult, StoreError> {
        Ok(match self.lock().held_mut(lease) {
            Some(job) => {
                job.execution_logs.push(entry);
                WriteResult::Applied
            }
            None => WriteResult::Stale,
        })
    }

    async fn reset_stalled(&self, params: ResetParams) -> Result<ResetReport<i64>, StoreError> {
        let mut state = self.lock();
        let mut report = ResetReport::default();
        let max_resets = i32::try_from(params.max_resets).unwrap_or(i32::MAX);
        let at_most_once: std::collections::HashSet<i64> = state
            .extras
            .iter()
            .filter(|(_, e)| e.limits.at_most_once)
            .map(|(id, _)| *id)
            .collect();
        for job in state.jobs.values_mut() {
            let stalled = job.state == JobState::Processing
                && job
                    .last_heartbeat_at
                    .is_none_or(|at| at < params.stalled_before);
            if !stalled {
                continue;
            }
            let fail_with = match params.delivery {
                _ if at_most_once.contains(&job.id) => Some(AT_MOST_ONCE_MESSAGE),
                Delivery::AtMostOnce => Some(AT_MOST_ONCE_MESSAGE),
                Delivery::AtLeastOnce if job.num_resets >= max_resets => Some(MAX_RESETS_MESSAGE),
                Delivery::AtLeastOnce => None,
                // A delivery this store does not know: never run twice.
                _ => Some(AT_MOST_ONCE_MESSAGE),
            };
            match fail_with {
                Some(message) => {
                    job.state = JobState::Failed;
                    job.failure_message = Some(message.to_owned());
                    job.finished_at = Some(params.now);
                    report.failed.push(job.id);
                }
                None => {
                    job.state = JobState::Queued;
                    job.num_resets += 1;
                    report.reset.push(job.id);
                }
            }
        }
        for &id in &report.reset {
            state.make_claimable(id);
        }
        drop(state);
        if !report.reset.is_empty() {
            self.wake_workers();
        }
        Ok(report)
    }

    async fn leave(&self, name: &str) -> Result<(), StoreError> {
        self.lock().workers.remove(name);
        Ok(())
    }

    async fn beat(&self, beat: &queue_core::WorkerBeat) -> Result<(), StoreError> {
        let now = self.shared.clock.now();
        let mut state = self.lock();
        // Workers silent for an hour are gone for good.
        state
            .workers
            .retain(|_, w| now - w.last_seen_at < chrono::TimeDelta::hours(1));
        state.workers.insert(
            beat.name.clone(),
            queue_core::WorkerInfo::new(beat.clone(), now),
        );
        Ok(())
    }

    async fn wait_for_jobs(&self, max_wait: Duration) {
        let _ = tokio::time::timeout(max_wait, self.shared.jobs_available.notified()).await;
    }

    async fn next_due(&self, after: DateTime<Utc>) -> Result<Option<DateTime<Utc>>, StoreError> {
        let state = self.lock();
        Ok(state
            .jobs
            .values()
            .filter(|job| matches!(job.state, JobState::Queued | JobState::Errored))
            .filter_map(|job| job.process_after)
            .filter(|at| *at > after)
            .min())
    }
}
