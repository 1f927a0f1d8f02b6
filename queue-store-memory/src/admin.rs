//! The admin contract on the memory store.

use std::cmp::Reverse;
use std::collections::BTreeMap;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use queue_core::{
    AbortOutcome, ActionReport, Admin, AuditEntry, AuditParams, Enqueued, FinishedBucket, Job,
    JobFilter, JobPage, JobState, JobView, KindLimit, KindLimits, ListOrder, ListParams,
    NewAuditEntry, NewJob, NewOperation, Operation, OperationParams, OperationStep, PausedKind,
    QueueStats, ResetParams, ResetReport, RetryParams, SkipReason, Skipped, StateCount,
    StatsParams, Store, StoreError, TakeOperation, Targets, TimelineParams,
    CANCELED_BEFORE_RUN_MESSAGE,
};

use crate::store::{eligible, Extras, MemoryStore, State};

/// How a write treats one job (and its enqueue options, if it has any):
/// whether it applies, and what it does.
type Write<'a> = &'a dyn Fn(&mut Job, Option<&mut Extras>) -> Applied;

/// What a write did to one job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Applied {
    /// The job is not in a state the write moves it out of.
    No,
    /// Another job holds the job's unique key.
    KeyHeld,
    /// Its state changed.
    Changed,
    /// A running job was asked to stop.
    StopRequested,
}

impl MemoryStore {
    /// Applies `write` to the targeted jobs; `eligible` says which jobs a
    /// [`Targets::Matching`] call may pick. Keeps the claim index in step
    /// and wakes workers if a job became claimable.
    fn write_jobs(
        &self,
        targets: &Targets<i64>,
        eligible_for: impl Fn(&Job) -> bool,
        write: Write<'_>,
    ) -> Result<ActionReport<i64>, StoreError> {
        let mut state = self.lock();
        let mut report = ActionReport::default();
        let ids = picked(&state, targets, eligible_for)?;
        // Every matching job up to the last one picked is dealt with.
        if let Targets::Matching { .. } = targets {
            report.last = ids.last().copied();
        }
        let mut woke = false;
        for id in ids {
            let State { jobs, extras, .. } = &mut *state;
            let Some(job) = jobs.get_mut(&id) else {
                report.skipped.push(Skipped::missing(id));
                continue;
            };
            let claim_key = (Reverse(job.priority), id);
            let skipped = |job: &Job, reason| {
                Skipped::new(id, job.state.as_str().to_owned(), Some(job.state), reason)
            };
            match write(job, extras.get_mut(&id)) {
                Applied::No => report.skipped.push(skipped(job, SkipReason::State)),
                Applied::KeyHeld => report.skipped.push(skipped(job, SkipReason::KeyHeld)),
                Applied::StopRequested => report.stop_requested += 1,
                Applied::Changed => {
                    report.changed += 1;
                    let claimable = matches!(job.state, JobState::Queued | JobState::Errored);
                    state.claimable.remove(&claim_key);
                    if claimable {
                        state.make_claimable(id);
                        woke = true;
                    }
                }
            }
        }
        drop(state);
        if woke {
            self.wake_workers();
        }
        Ok(report)
    }
}

/// The keys `targets` name: those given, or up to the limit of the jobs
/// matching the filter that `eligible` admits, lowest key first.
fn picked(
    state: &State,
    targets: &Targets<i64>,
    eligible: impl Fn(&Job) -> bool,
) -> Result<Vec<i64>, StoreError> {
    Ok(match targets {
        Targets::Ids(ids) => ids.clone(),
        Targets::Matching {
            filter,
            limit,
            after,
        } => matching(state, filter)
            .filter(|job| after.is_none_or(|after| job.id > after))
            .filter(|job| eligible(job))
            .take(*limit)
            .map(|job| job.id)
            .collect(),
        other => {
            return Err(StoreError::Refused(format!(
                "the memory store does not know the targets {other:?}"
            )))
        }
    })
}

/// The jobs matching `filter`, lowest key first.
fn matching<'s>(state: &'s State, filter: &'s JobFilter) -> impl Iterator<Item = &'s Job> + 's {
    state
        .jobs
        .values()
        .filter(move |job| filter.matches(&view(state, job)))
}

fn retry(
    job: &mut Job,
    extras: Option<&mut Extras>,
    params: RetryParams,
    now: DateTime<Utc>,
) -> Applied {
    if !job.state.is_retryable() {
        return Applied::No;
    }
    // An expiry that has passed would fail the job again at the next
    // sweep: a retry clears it. One still ahead stays.
    if let Some(extras) = extras {
        if extras.expires_at.is_some_and(|at| at <= now) {
            extras.expires_at = None;
        }
    }
    job.state = JobState::Queued;
    job.process_after = Some(now);
    job.finished_at = None;
    job.cancel = false;
    if params.reset_attempts {
        job.num_failures = 0;
        job.num_resets = 0;
    }
    Applied::Changed
}

fn cancel(job: &mut Job, now: DateTime<Utc>) -> Applied {
    match job.state {
        JobState::Queued | JobState::Errored => {
            job.state = JobState::Canceled;
            job.finished_at = Some(now);
            job.process_after = None;
            job.failure_message = Some(CANCELED_BEFORE_RUN_MESSAGE.to_owned());
            Applied::Changed
        }
        JobState::Processing => {
            job.cancel = true;
            Applied::StopRequested
        }
        _ => Applied::No,
    }
}

/// The operator's view of `job`, with the enqueue options kept beside it.
fn view(state: &State, job: &Job) -> JobView<i64> {
    let mut view = JobView::from(job.clone());
    if let Some(extras) = state.extras.get(&job.id) {
        view.unique_key = extras.unique.as_ref().map(|u| u.key.clone());
        view.max_attempts = extras.limits.max_attempts.map(i64::from);
        view.expires_at = extras.expires_at;
        view.at_most_once = extras.limits.at_most_once;
    }
    view
}

#[async_trait]
impl Admin for MemoryStore {
    type Id = i64;

    async fn get(&self, id: &i64) -> Result<Option<JobView<i64>>, StoreError> {
        let state = self.lock();
        Ok(state.jobs.get(id).map(|job| view(&state, job)))
    }

    async fn list(&self, params: &ListParams<i64>) -> Result<JobPage<i64>, StoreError> {
        let state = self.lock();
        let after = params.after;
        let admitted = |job: &&Job| match (params.order, after) {
            (_, None) => true,
            (ListOrder::NewestFirst, Some(after)) => job.id < after,
            (ListOrder::OldestFirst, Some(after)) => job.id > after,
        };
        let all = matching(&state, &params.filter);
        let mut jobs: Vec<JobView<i64>> = match params.order {
            ListOrder::OldestFirst => all
                .filter(admitted)
                .take(params.limit.saturating_add(1))
                .map(|job| view(&state, job))
                .collect(),
            ListOrder::NewestFirst => {
                let all: Vec<&Job> = all.collect();
                all.into_iter()
                    .rev()
                    .filter(admitted)
                    .take(params.limit.saturating_add(1))
                    .map(|job| view(&state, job))
                    .collect()
            }
        };
        let next = if jobs.len() > params.limit {
            jobs.truncate(params.limit);
            jobs.last().map(|job| job.id)
        } else {
            None
        };
        Ok(JobPage::new(jobs, next))
    }

    async fn count(&self, filter: &JobFilter) -> Result<u64, StoreError> {
        Ok(matching(&self.lock(), filter).count() as u64)
    }

    async fn finished_timeline(
        &self,
        params: &TimelineParams,
    ) -> Result<Option<Vec<FinishedBucket>>, StoreError> {
        let mut buckets = params.empty();
        for job in self.lock().jobs.values() {
            let at = job.finished_at.and_then(|at| params.bucket_of(at));
            if let Some(bucket) = at.and_then(|i| buckets.get_mut(i)) {
                bucket.add_of_kind(Some(&job.kind), job.state, 1);
            }
        }
        Ok(Some(buckets))
    }

    async fn stats(&self, params: StatsParams) -> Result<QueueStats, StoreError> {
        let state = self.lock();
        let mut counts: BTreeMap<(usize, String), u64> = BTreeMap::new();
        let mut oldest: Option<DateTime<Utc>> = None;
        let mut stalled = 0;
        for job in state.jobs.values() {
            let order = JobState::ALL
                .iter()
                .position(|s| *s == job.state)
                .unwrap_or(JobState::ALL.len());
            *counts.entry((order, job.kind.clone())).or_default() += 1;
            if eligible(job, params.now) {
                let since = job
                    .process_after
                    .map_or(job.queued_at, |at| at.max(job.queued_at));
                oldest = Some(oldest.map_or(since, |o| o.min(since)));
            }
            if job.state == JobState::Processing
                && job
                    .last_heartbeat_at
                    .is_none_or(|at| at < params.stalled_before)
            {
                stalled += 1;
            }
        }
        Ok(QueueStats::new(
            counts
                .into_iter()
                .map(|((order, kind), count)| {
                    let state = JobState::ALL[order];
                    StateCount::new(Some(state), state.as_str(), Some(kind), count)
                })
                .collect(),
            oldest,
            Some(stalled),
            params.now,
        )
        .with_paused(state.paused.values().cloned().collect()))
    }

    async fn enqueue(&self, jobs: &[NewJob]) -> Result<Vec<Enqueued<i64>>, StoreError> {
        Ok(self.enqueue_reporting(jobs.iter().cloned()))
    }

    async fn retry(
        &self,
        targets: &Targets<i64>,
        params: RetryParams,
    ) -> Result<ActionReport<i64>, StoreError> {
        let now = self.clock().now();
        // A job whose unique key another job holds is passed over: queued
        // again, it would be a second job with the key. Keys taken by
        // earlier jobs of the same call count too.
        let (keys, holders) = {
            let state = self.lock();
            (
                state.unique_keys(),
                std::cell::RefCell::new(state.key_holders()),
            )
        };
        let takes_key = |job: &Job| match keys.get(&job.id) {
            None => true,
            Some(key) => {
                let mut holders = holders.borrow_mut();
                match holders.get(key) {
                    Some(holder) if *holder != job.id => false,
                    _ => {
                        holders.insert(key.clone(), job.id);
                        true
                    }
                }
            }
        };
        self.write_jobs(
            targets,
            |job| job.state.is_retryable() && takes_key(job),
            &|job, extras| {
                if job.state.is_retryable() && !takes_key(job) {
                    return Applied::KeyHeld;
                }
                retry(job, extras, params, now)
            },
        )
    }

    async fn cancel(&self, targets: &Targets<i64>) -> Result<ActionReport<i64>, StoreError> {
        let now = self.clock().now();
        // A bulk cancel picks each running job once: after its flag is set
        // it no longer matches, so calls until a short one terminate.
        let waiting_or_unflagged = |job: &Job| match job.state {
            JobState::Queued | JobState::Errored => true,
            JobState::Processing => !job.cancel,
            _ => false,
        };
        self.write_jobs(targets, waiting_or_unflagged, &|job, _| cancel(job, now))
    }

    async fn force_fail(
        &self,
        targets: &Targets<i64>,
        reason: &str,
    ) -> Result<ActionReport<i64>, StoreError> {
        let unfinished = |job: &Job| {
            matches!(
                job.state,
                JobState::Queued | JobState::Errored | JobState::Processing
            )
        };
        // The store's own clock: the operator's time is the store's.
        let now = self.clock().now();
        self.write_jobs(targets, unfinished, &|job, _| {
            if !unfinished(job) {
                return Applied::No;
            }
            job.state = JobState::Failed;
            job.finished_at = Some(now);
            job.process_after = None;
            job.failure_message = Some(reason.to_owned());
            // Token 0 is never a claim's (they count from 1): the running
            // attempt's lease holds nothing any more.
            job.claim_token = 0;
            Applied::Changed
        })
    }

    async fn delete(&self, targets: &Targets<i64>) -> Result<ActionReport<i64>, StoreError> {
        let mut state = self.lock();
        let ids = picked(&state, targets, |_| true)?;
        let mut report = ActionReport::default();
        if let Targets::Matching { .. } = targets {
            report.last = ids.last().copied();
        }
        for id in ids {
            match state.jobs.remove(&id) {
                Some(job) => {
                    state.claimable.remove(&(Reverse(job.priority), id));
                    state.extras.remove(&id);
                    report.changed += 1;
                }
                None => report.skipped.push(Skipped::missing(id)),
            }
        }
        Ok(report)
    }

    async fn reset(&self, params: ResetParams) -> Result<ResetReport<i64>, StoreError> {
        self.reset_stalled(params).await
    }

    async fn pause(&self, kind: &str, by: &str) -> Result<PausedKind, StoreError> {
        queue_core::check_pause(kind, by)?;
        let now = self.clock().now();
        let mut state = self.lock();
        Ok(state
            .paused
            .entry(kind.to_owned())
            .or_insert_with(|| PausedKind::new(kind, now, by))
            .clone())
    }

    async fn resume(&self, kind: &str) -> Result<Option<PausedKind>, StoreError> {
        queue_core::check_kind(kind)?;
        let ended = self.lock().paused.remove(kind);
        if ended.is_some() {
            self.wake_workers();
        }
        Ok(ended)
    }

    async fn paused(&self) -> Result<Vec<PausedKind>, StoreError> {
        Ok(self.lock().paused.values().cloned().collect())
    }

    async fn set_limits(
        &self,
        kind: &str,
        limits: &KindLimits,
        by: &str,
    ) -> Result<Option<KindLimit>, StoreError> {
        limits.check_for(kind, by)?;
        let now = self.clock().now();
        let mut state = self.lock();
        if !limits.any() {
            state.limits.remove(kind);
            drop(state);
            self.wake_workers();
            return Ok(None);
        }
        let limit = KindLimit::new(kind, *limits, now, by);
        // A new limit starts with a full bucket.
        state.limits.insert(kind.to_owned(), (limit.clone(), None));
        drop(state);
        self.wake_workers();
        Ok(Some(limit))
    }

    async fn limits(&self) -> Result<Vec<KindLimit>, StoreError> {
        Ok(self
            .lock()
            .limits
            .values()
            .map(|(limit, _)| limit.clone())
            .collect())
    }

    async fn append_audit(&self, entries: &[NewAuditEntry]) -> Result<(), StoreError> {
        let now = self.clock().now();
        let mut state = self.lock();
        for entry in entries {
            let id = state.audit.last().map_or(1, |last| last.id + 1);
            state.audit.push(AuditEntry::new(id, now, entry.clone()));
        }
        Ok(())
    }

    async fn workers(
        &self,
        seen_since: DateTime<Utc>,
    ) -> Result<Vec<queue_core::WorkerInfo>, StoreError> {
        Ok(self
            .lock()
            .workers
            .values()
            .filter(|w| w.last_seen_at >= seen_since)
            .cloned()
            .collect())
    }

    async fn create_operation(&self, new: &NewOperation) -> Result<Operation<i64>, StoreError> {
        self.create_op(new)
    }

    async fn operation(&self, id: i64) -> Result<Option<Operation<i64>>, StoreError> {
        Ok(self.read_op(id))
    }

    async fn operations(
        &self,
        params: &OperationParams,
    ) -> Result<Vec<Operation<i64>>, StoreError> {
        Ok(self.read_ops(params))
    }

    async fn take_operation(
        &self,
        take: &TakeOperation,
    ) -> Result<Option<Operation<i64>>, StoreError> {
        Ok(self.take_op(take))
    }

    async fn step_operation(
        &self,
        step: &OperationStep<i64>,
    ) -> Result<Option<Operation<i64>>, StoreError> {
        Ok(self.step_op(step))
    }

    async fn prune_operations(&self, older_than: std::time::Duration) -> Result<u64, StoreError> {
        Ok(self.prune_ops(older_than))
    }

    async fn abort_operation(
        &self,
        id: i64,
        by: &str,
    ) -> Result<Option<AbortOutcome<i64>>, StoreError> {
        Ok(self.abort_op(id, by))
    }

    async fn audit(&self, params: &AuditParams) -> Result<Vec<AuditEntry>, StoreError> {
        let state = self.lock();
        Ok(state
            .audit
            .iter()
            .rev()
            .filter(|e| params.before.is_none_or(|before| e.id < before))
            .filter(|e| params.actor.as_ref().is_none_or(|a| &e.entry.actor == a))
            .take(params.limit.min(queue_core::MAX_AUDIT_PAGE))
            .cloned()
            .collect())
    }
}
