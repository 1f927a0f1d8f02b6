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
        });
        self.jobs.len() - 1
    }

    fn eligible(job: &ModelJob, now: DateTime<Utc>) -> bool {
        matches!(job.state, Some(JobState::Queued) | Some(JobState::Errored))
            && job.process_after.is_none_or(|at| at <= now)
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

    /// Ends claim `claim` of job `index`; returns whether it applied.
    pub fn finish(&mut self, index: usize, claim: u64, transition: &Transition) -> bool {
        if !self.held(index, claim) {
            return false;
        }
        let job = &mut self.jobs[index];
        job.hold = None;
        job.state = Some(transition.target());
        match transition {
            Transition::Complete | Transition::Release => {}
            Transition::Error { message, retry_at } => {
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
                Delivery::AtMostOnce => {
                    job.state = Some(JobState::Failed);
                    job.failure_message = Some(AT_MOST_ONCE_MESSAGE.to_owned());
                    failed.push(index);
                }
                Delivery::AtLeastOnce if job.num_resets >= params.max_resets => {
                    job.state = Some(JobState::Failed);
                    job.failure_message = Some(MAX_RESETS_MESSAGE.to_owned());
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

    /// An operator cancels job `index`.
    pub fn cancel(&mut self, index: usize) {
        let job = &mut self.jobs[index];
        match job.state {
            Some(JobState::Queued) | Some(JobState::Errored) => {
                job.state = Some(JobState::Canceled);
                job.failure_message = Some(CANCELED_BEFORE_RUN_MESSAGE.to_owned());
            }
            Some(JobState::Processing) => job.cancel = true,
            _ => {}
        }
    }

    /// An operator deletes job `index`.
    pub fn delete(&mut self, index: usize) {
        let job = &mut self.jobs[index];
        job.state = None;
        job.hold = None;
    }
}
