//! A pure model of the store contract: a vector of jobs and explicit times,
//! no concurrency, no I/O. State-machine property tests run the same
//! operations against a real store and this model and compare every result
//! and every job after each step.
//!
//! Jobs are named by their enqueue index; claims by a claim number the model
//! hands out (`Hold::claim`), which the test maps to the store's leases.

use chrono::{DateTime, Utc};

use crate::job::{JobState, CANCELED_BEFORE_RUN_MESSAGE};
use crate::resetter::{Delivery, ResetParams, AT_MOST_ONCE_MESSAGE, MAX_RESETS_MESSAGE};
use crate::store::Transition;

/// Who holds a processing job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hold {
    /// The claim number (unique across the model).
    pub claim: u64,
    /// The worker that claimed it.
    pub worker: usize,
}

/// One job of the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelJob {
    /// Current state; `None` once deleted.
    pub state: Option<JobState>,
    /// Higher first.
    pub priority: i32,
    /// Not claimable before this.
    pub process_after: Option<DateTime<Utc>>,
    /// Failed attempts.
    pub num_failures: u32,
    /// Resets.
    pub num_resets: u32,
    /// Cancel flag.
    pub cancel: bool,
    /// The live claim, while processing.
    pub hold: Option<Hold>,
    /// Last heartbeat.
    pub last_heartbeat_at: Option<DateTime<Utc>>,
    /// Last failure message.
    pub failure_message: Option<String>,
    /// Execution-log entries of all attempts.
    pub log_len: usize,
    /// When it errored or ended.
    pub finished_at: Option<DateTime<Utc>>,
    /// Its unique key, and whether the key holds forever.
    pub unique: Option<(u8, bool)>,
    /// Not started after this.
    pub expires_at: Option<DateTime<Utc>>,
    /// Its own attempt limit and at-most-once flag.
    pub limits: crate::job::JobLimits,
}

/// The model store.
#[derive(Debug, Clone, Default)]
pub struct Model {
    /// Jobs by enqueue index.
    pub jobs: Vec<ModelJob>,
    next_claim: u64,
}

impl Model {
    /// An empty model.
    pub fn new() -> Self {
        Model::default()
    }

    /// Enqueues a job; returns its index.
    pub fn enqueue(&mut self, priority: i32, process_after: Option<DateTime<Utc>>) -> usize {
        self.enqueue_with(priority, process_after, None, None).0
    }

    /// Sets the limits of job `index` (enqueued with them).
    pub fn set_limits(&mut self, index: usize, limits: crate::job::JobLimits) {
        self.jobs[index].limits = limits;
    }

    /// The limits job `index` was enqueued with.
    pub fn limits(&self, index: usize) -> crate::job::JobLimits {
        self.jobs[index].limits
    }

    /// Enqueues a job with a unique key (`key`, held forever or while the
    /// job waits or runs) and an expiry. Returns its index and `true`, or,
    /// when the key is held, the holder's index and `false` (nothing added).
    pub fn enqueue_with(
        &mut self,
        priority: i32,
        process_after: Option<DateTime<Utc>>,
        unique: Option<(u8, bool)>,
        expires_at: Option<DateTime<Utc>>,
    ) -> (usize, bool) {
        if let Some((key, _)) = unique {
            let holder = self.jobs.iter().position(|j| match (j.unique, j.state) {
                (Some((k, forever)), Some(state)) => k == key && (forever || !state.is_terminal()),
                _ => false,
            });
            if let Some(holder) = holder {
                return (holder, false);
            }
        }
        self.jobs.push(ModelJob {
            state: Some(JobState::Queued),
            priority,
            process_after,
            num_failures: 0,
            num_resets: 0,
            cancel: false,
            hold: None,
            last_heartbeat_at: None,
            failure_message: None,
            log_len: 0,
            finished_at: None,
            unique,
            expires_at,
            limits: crate::job::JobLimits::default(),
        });
        (self.jobs.len() - 1, true)
    }

    fn waiting(job: &ModelJob) -> bool {
        matches!(job.state, Some(JobState::Queued) | Some(JobState::Errored))
    }

    fn eligible(job: &ModelJob, now: DateTime<Utc>) -> bool {
        Self::waiting(job)
            && job.process_after.is_none_or(|at| at <= now)
            && job.expires_at.is_none_or(|at| at > now)
    }

    /// Fails the waiting jobs expired at `now`; returns their indexes.
    pub fn expire(&mut self, now: DateTime<Utc>) -> Vec<usize> {
        let mut expired = Vec::new();
        for (i, job) in self.jobs.iter_mut().enumerate() {
            if Self::waiting(job) && job.expires_at.is_some_and(|at| at <= now) {
                job.state = Some(JobState::Failed);
                job.failure_message = Some(crate::job::EXPIRED_MESSAGE.to_owned());
                job.finished_at = Some(now);
                job.process_after = None;
                expired.push(i);
            }
        }
        expired
    }

    /// Claims up to `limit` jobs for `worker`: the eligible ones, higher
    /// priority first, then by index. Returns `(index, claim number)` pairs.
    pub fn claim(&mut self, worker: usize, limit: usize, now: DateTime<Utc>) -> Vec<(usize, u64)> {
        let mut candidates: Vec<usize> = (0..self.jobs.len())
            .filter(|&i| Self::eligible(&self.jobs[i], now))
            .collect();
        candidates.sort_by_key(|&i| (std::cmp::Reverse(self.jobs[i].priority), i));
        candidates.truncate(limit);
        candidates
            .into_iter()
            .map(|i| {
                self.next_claim += 1;
                let job = &mut self.jobs[i];
                job.state = Some(JobState::Processing);
                // A claim clears both times (`JobState::times_agree`).
                job.finished_at = None;
                job.process_after = None;
                job.hold = Some(Hold {
                    claim: self.next_claim,
                    worker,
                });
                job.last_heartbeat_at = Some(now);
                (i, self.next_claim)
            })
            .collect()
    }

    fn held(&self, index: usize, claim: u64) -> bool {
        let job = &self.jobs[index];
        job.state == Some(JobState::Processing) && job.hold.is_some_and(|h| h.claim == claim)
    }

    /// The attempt number a claim of job `index` is.
    pub fn attempt(&self, index: usize) -> u32 {
        self.jobs[index].num_failures + 1
    }

    /// Ends claim `claim` of job `index` at `now`; returns whether it
    /// applied.
    pub fn finish(
        &mut self,
        index: usize,
        claim: u64,
        transition: &Transition,
        now: DateTime<Utc>,
    ) -> bool {
        if !self.held(index, claim) {
            return false;
        }
        let job = &mut self.jobs[index];
        job.hold = None;
        job.state = Some(transition.target());
        if *transition != Transition::Release {
            job.finished_at = Some(now);
        }
        match transition {
            Transition::Complete | Transition::Release => {}
            Transition::Retry { message, retry_at } => {
                job.num_failures += 1;
                job.failure_message = Some(message.clone());
                job.process_after = Some(*retry_at);
            }
            Transition::Fail { message } => {
                job.num_failures += 1;
                job.failure_message = Some(message.clone());
            }
            Transition::Cancel { message } => job.failure_message = Some(message.clone()),
        }
        true
    }

    /// Heartbeats the given claims; returns `(cancel requested, gone)` as
    /// job indexes, in the order given.
    pub fn heartbeat(
        &mut self,
        claims: &[(usize, u64)],
        now: DateTime<Utc>,
    ) -> (Vec<usize>, Vec<usize>) {
        let mut cancel = Vec::new();
        let mut gone = Vec::new();
        for &(index, claim) in claims {
            if self.held(index, claim) {
                let job = &mut self.jobs[index];
                job.last_heartbeat_at = Some(now);
                if job.cancel {
                    cancel.push(index);
                }
            } else {
                gone.push(index);
            }
        }
        (cancel, gone)
    }

    /// Appends a log entry under claim `claim`; returns whether it applied.
    pub fn append_log(&mut self, index: usize, claim: u64) -> bool {
        if !self.held(index, claim) {
            return false;
        }
        self.jobs[index].log_len += 1;
        true
    }

    /// Resets stalled jobs; returns `(reset, failed)` as job indexes.
    pub fn reset_stalled(&mut self, params: &ResetParams) -> (Vec<usize>, Vec<usize>) {
        let mut reset = Vec::new();
        let mut failed = Vec::new();
        for (index, job) in self.jobs.iter_mut().enumerate() {
            let stalled = job.state == Some(JobState::Processing)
                && job
                    .last_heartbeat_at
                    .is_none_or(|at| at < params.stalled_before);
            if !stalled {
                continue;
            }
            job.hold = None;
            match params.delivery {
                _ if job.limits.at_most_once => {
                    job.state = Some(JobState::Failed);
                    job.failure_message = Some(AT_MOST_ONCE_MESSAGE.to_owned());
                    job.finished_at = Some(params.now);
                    failed.push(index);
                }
                Delivery::AtMostOnce => {
                    job.state = Some(JobState::Failed);
                    job.failure_message = Some(AT_MOST_ONCE_MESSAGE.to_owned());
                    job.finished_at = Some(params.now);
                    failed.push(index);
                }
                Delivery::AtLeastOnce if job.num_resets >= params.max_resets => {
                    job.state = Some(JobState::Failed);
                    job.failure_message = Some(MAX_RESETS_MESSAGE.to_owned());
                    job.finished_at = Some(params.now);
                    failed.push(index);
                }
                Delivery::AtLeastOnce => {
                    job.state = Some(JobState::Queued);
                    job.num_resets += 1;
                    reset.push(index);
                }
            }
        }
        (reset, failed)
    }

    /// An operator cancels job `index` at `now`; returns whether it
    /// changed state (`Some(true)`), was asked to stop (`Some(false)`), or
    /// was left alone (`None`).
    pub fn cancel(&mut self, index: usize, now: DateTime<Utc>) -> Option<bool> {
        let job = &mut self.jobs[index];
        match job.state {
            Some(JobState::Queued) | Some(JobState::Errored) => {
                job.state = Some(JobState::Canceled);
                job.failure_message = Some(CANCELED_BEFORE_RUN_MESSAGE.to_owned());
                job.finished_at = Some(now);
                job.process_after = None;
                Some(true)
            }
            Some(JobState::Processing) => {
                job.cancel = true;
                Some(false)
            }
            _ => None,
        }
    }

    /// An operator retries job `index` at `now`: failed, errored and
    /// canceled jobs are queued and due from `now`, an expiry that has
    /// passed cleared; returns whether it applied.
    pub fn retry(&mut self, index: usize, reset_attempts: bool, now: DateTime<Utc>) -> bool {
        if self.key_held_by_another(index) {
            return false;
        }
        let job = &mut self.jobs[index];
        if !job.state.is_some_and(JobState::is_retryable) {
            return false;
        }
        job.state = Some(JobState::Queued);
        job.process_after = Some(now);
        job.finished_at = None;
        job.cancel = false;
        if job.expires_at.is_some_and(|at| at <= now) {
            job.expires_at = None;
        }
        if reset_attempts {
            job.num_failures = 0;
            job.num_resets = 0;
        }
        true
    }

    /// An operator retries up to `limit` jobs in `states` (lowest index
    /// first) at `now`; returns their indexes.
    pub fn retry_matching(
        &mut self,
        states: &[JobState],
        limit: usize,
        now: DateTime<Utc>,
    ) -> Vec<usize> {
        let mut picked = Vec::new();
        for i in 0..self.jobs.len() {
            if picked.len() == limit {
                break;
            }
            let eligible = self.jobs[i]
                .state
                .is_some_and(|s| states.contains(&s) && s.is_retryable());
            // A job whose key another job holds (one retried just before
            // included) is passed over.
            if eligible && self.retry(i, false, now) {
                picked.push(i);
            }
        }
        picked
    }

    /// Whether another job holds job `index`'s unique key.
    fn key_held_by_another(&self, index: usize) -> bool {
        let Some((key, _)) = self.jobs[index].unique else {
            return false;
        };
        self.jobs.iter().enumerate().any(|(i, j)| {
            i != index
                && match (j.unique, j.state) {
                    (Some((k, forever)), Some(state)) => {
                        k == key && (forever || !state.is_terminal())
                    }
                    _ => false,
                }
        })
    }

    /// An operator purges up to `limit` jobs in `states` that finished
    /// before `before` (lowest index first); returns their indexes.
    pub fn purge(
        &mut self,
        states: &[JobState],
        before: DateTime<Utc>,
        limit: usize,
    ) -> Vec<usize> {
        let picked: Vec<usize> = (0..self.jobs.len())
            .filter(|&i| {
                let job = &self.jobs[i];
                job.state.is_some_and(|s| states.contains(&s))
                    && job.finished_at.is_some_and(|at| at < before)
            })
            .take(limit)
            .collect();
        for &i in &picked {
            self.delete(i);
        }
        picked
    }

    /// How many live jobs are in each state, in lifecycle order, leaving
    /// out states no job is in.
    pub fn counts(&self) -> Vec<(JobState, u64)> {
        JobState::ALL
            .iter()
            .map(|&state| {
                let n = self.jobs.iter().filter(|j| j.state == Some(state)).count();
                (state, n as u64)
            })
            .filter(|&(_, n)| n > 0)
            .collect()
    }

    /// An operator deletes job `index`.
    pub fn delete(&mut self, index: usize) {
        let job = &mut self.jobs[index];
        job.state = None;
        job.hold = None;
    }
}
