//! State-machine property tests: random sequences of enqueue, claim,
//! complete, retryable error, poison, panic, crash, stale writes, heartbeat,
//! reset, release, clock advance and the operator's cancel, delete, retry
//! (one job, or a batch of failed ones) and purge, run against the memory
//! store and the pure model of `queue_core::testkit::model`. After every step
//! the store must agree with the model on every job, and these invariants
//! must hold:
//!
//! - no job is held by two live leases at once;
//! - no job is lost: every job not deleted is still there, in one state;
//! - attempts never exceed `max_retries + 1` (one more after each operator
//!   retry that keeps the counts), resets never exceed `max_resets`;
//! - a terminal state never changes, unless an operator retries the job;
//! - the admin contract's counts and pages agree with the model.
//!
//! A failure shrinks to a short list of readable `Op`s.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use proptest::prelude::*;
use queue_core::testkit::model::Model;
use queue_core::{
    Admin, AttemptEnd, ClaimParams, Delivery, JobError, JobFilter, JobState, Lease, ListParams,
    LogEntry, NewJob, OutcomePolicy, PurgeParams, ResetParams, RetryParams, RetryPolicy,
    StatsParams, Store, Targets, Transition, UniqueScope,
};
use queue_store_memory::{ManualClock, MemoryStore};

const WORKERS: usize = 3;
const MAX_RETRIES: u32 = 2;
const MAX_RESETS: u32 = 2;
const STALLED_MAX_AGE: i64 = 30;

#[derive(Debug, Clone)]
enum Op {
    Enqueue {
        priority: i32,
        delay_secs: Option<u8>,
    },
    Claim {
        worker: usize,
        limit: usize,
    },
    Complete {
        worker: usize,
        nth: usize,
    },
    RetryableError {
        worker: usize,
        nth: usize,
    },
    Poison {
        worker: usize,
        nth: usize,
    },
    Panic {
        worker: usize,
        nth: usize,
    },
    Log {
        worker: usize,
        nth: usize,
    },
    Heartbeat {
        worker: usize,
    },
    /// The worker vanishes; its leases live on only as zombies.
    Crash {
        worker: usize,
    },
    /// A zombie (a crashed or paused attempt) writes late.
    StaleComplete {
        nth: usize,
    },
    /// Graceful shutdown: the worker hands all its jobs back.
    Release {
        worker: usize,
    },
    Cancel {
        job: usize,
    },
    Delete {
        job: usize,
    },
    /// An operator retries one job.
    Retry {
        job: usize,
        reset_attempts: bool,
    },
    /// An operator retries a batch of failed jobs.
    RetryFailed {
        limit: usize,
    },
    /// An operator purges a batch of completed and failed jobs that
    /// finished more than `age_secs` ago.
    Purge {
        age_secs: u8,
        limit: usize,
    },
    Reset {
        at_most_once: bool,
    },
    Advance {
        secs: u8,
    },
    /// A job with unique key `key` (one of a few), held forever or while
    /// it waits or runs, expiring `expires_secs` from now.
    EnqueueUnique {
        key: u8,
        forever: bool,
        expires_secs: Option<u8>,
        max_attempts: Option<u8>,
        at_most_once: bool,
    },
    /// The resetter's sweep of expired jobs.
    Expire,
}

fn op() -> impl Strategy<Value = Op> {
    let w = 0..WORKERS;
    prop_oneof![
        4 => (0..3i32, proptest::option::of(0..60u8))
            .prop_map(|(priority, delay_secs)| Op::Enqueue { priority, delay_secs }),
        4 => (w.clone(), 1..4usize).prop_map(|(worker, limit)| Op::Claim { worker, limit }),
        3 => (w.clone(), 0..4usize).prop_map(|(worker, nth)| Op::Complete { worker, nth }),
        2 => (w.clone(), 0..4usize).prop_map(|(worker, nth)| Op::RetryableError { worker, nth }),
        1 => (w.clone(), 0..4usize).prop_map(|(worker, nth)| Op::Poison { worker, nth }),
        1 => (w.clone(), 0..4usize).prop_map(|(worker, nth)| Op::Panic { worker, nth }),
        1 => (w.clone(), 0..4usize).prop_map(|(worker, nth)| Op::Log { worker, nth }),
        2 => w.clone().prop_map(|worker| Op::Heartbeat { worker }),
        1 => w.clone().prop_map(|worker| Op::Crash { worker }),
        1 => (0..4usize).prop_map(|nth| Op::StaleComplete { nth }),
        1 => w.prop_map(|worker| Op::Release { worker }),
        1 => (0..16usize).prop_map(|job| Op::Cancel { job }),
        1 => (0..16usize).prop_map(|job| Op::Delete { job }),
        1 => (0..16usize, any::<bool>())
            .prop_map(|(job, reset_attempts)| Op::Retry { job, reset_attempts }),
        1 => (1..4usize).prop_map(|limit| Op::RetryFailed { limit }),
        1 => (0..90u8, 1..4usize).prop_map(|(age_secs, limit)| Op::Purge { age_secs, limit }),
        2 => any::<bool>().prop_map(|at_most_once| Op::Reset { at_most_once }),
        2 => (1..60u8).prop_map(|secs| Op::Advance { secs }),
        2 => (
            (0..3u8, any::<bool>(), proptest::option::of(0..60u8)),
            (proptest::option::of(1..4u8), any::<bool>()),
        )
            .prop_map(|((key, forever, expires_secs), (max_attempts, at_most_once))| {
                Op::EnqueueUnique { key, forever, expires_secs, max_attempts, at_most_once }
            }),
        1 => Just(Op::Expire),
    ]
}

/// A lease as the test tracks it: model job index, model claim number and
/// the store's lease.
#[derive(Debug, Clone)]
struct Held {
    index: usize,
    claim: u64,
    lease: Lease<i64>,
}

struct Run {
    store: MemoryStore,
    model: Model,
    ids: Vec<i64>,
    workers: Vec<Vec<Held>>,
    zombies: Vec<Held>,
    now: DateTime<Utc>,
    /// The store's own clock, kept at `now`: an operator's retry and
    /// cancel take the store's time.
    clock: ManualClock,
    policy: OutcomePolicy,
    terminal: HashMap<usize, JobState>,
    /// Failed attempts a job may reach: `MAX_RETRIES + 1`, or one more
    /// than it had when an operator retried it without resetting its
    /// counts (a retry grants one more attempt).
    allowed_failures: HashMap<usize, u32>,
}

impl Run {
    fn new() -> Self {
        let now = DateTime::<Utc>::UNIX_EPOCH + TimeDelta::days(20_000);
        let clock = ManualClock::new(now);
        Run {
            store: MemoryStore::with_clock(std::sync::Arc::new(clock.clone())),
            clock,
            model: Model::new(),
            ids: Vec::new(),
            workers: vec![Vec::new(); WORKERS],
            zombies: Vec::new(),
            now,
            policy: OutcomePolicy {
                retry: RetryPolicy::fixed(MAX_RETRIES, Duration::from_secs(10)),
                ..Default::default()
            },
            terminal: HashMap::new(),
            allowed_failures: HashMap::new(),
        }
    }

    /// An operator retry of `job`, which had `failures` failed attempts.
    fn grant_attempt(&mut self, job: usize, failures: u32) {
        let reset = self.model.jobs[job].num_failures == 0;
        let allowed = if reset { 0 } else { failures + 1 };
        let entry = self.allowed_failures.entry(job).or_insert(MAX_RETRIES + 1);
        *entry = (*entry).max(allowed);
    }

    fn allowed(&self, job: usize) -> u32 {
        self.allowed_failures
            .get(&job)
            .copied()
            .unwrap_or(MAX_RETRIES + 1)
    }

    fn take(&mut self, worker: usize, nth: usize) -> Option<Held> {
        let held = &mut self.workers[worker];
        if held.is_empty() {
            return None;
        }
        let i = nth % held.len();
        Some(held.remove(i))
    }

    async fn finish(&mut self, held: Held, transition: Transition) -> Result<(), TestCaseError> {
        let expected = self
            .model
            .finish(held.index, held.claim, &transition, self.now);
        let got = self
            .store
            .finish(
                self.store.clone(),
                &held.lease,
                transition.clone(),
                self.now,
            )
            .await
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(
            got.is_applied(),
            expected,
            "finish {:?} of job {}",
            transition,
            held.index
        );
        Ok(())
    }

    async fn end_attempt(
        &mut self,
        worker: usize,
        nth: usize,
        end: AttemptEnd,
    ) -> Result<(), TestCaseError> {
        if let Some(held) = self.take(worker, nth) {
            let outcome =
                self.policy
                    .decide_for(end, held.lease.attempt, held.lease.limits, self.now, 0.5);
            if let Some(transition) = outcome.transition() {
                self.finish(held, transition).await?;
            }
        }
        Ok(())
    }

    async fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Enqueue {
                priority,
                delay_secs,
            } => {
                let after = delay_secs.map(|s| self.now + TimeDelta::seconds(s.into()));
                let mut job =
                    NewJob::new("k", serde_json::json!(self.ids.len())).priority(priority);
                job.process_after = after;
                self.ids.push(self.store.enqueue(job));
                self.model.enqueue(priority, after);
            }
            Op::Claim { worker, limit } => {
                let expected = self.model.claim(worker, limit, self.now);
                let claimed = self
                    .store
                    .claim(ClaimParams {
                        limit,
                        worker: "w",
                        conditions: None,
                        now: self.now,
                    })
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let got: Vec<i64> = claimed.iter().map(|c| c.lease.id).collect();
                let want: Vec<i64> = expected.iter().map(|&(i, _)| self.ids[i]).collect();
                prop_assert_eq!(&got, &want, "claim order and set");
                for (c, (index, claim)) in claimed.into_iter().zip(expected) {
                    prop_assert_eq!(c.lease.attempt, self.model.attempt(index));
                    prop_assert_eq!(
                        c.lease.limits,
                        self.model.limits(index),
                        "the job's own limits"
                    );
                    self.workers[worker].push(Held {
                        index,
                        claim,
                        lease: c.lease,
                    });
                }
            }
            Op::Complete { worker, nth } => {
                self.end_attempt(worker, nth, AttemptEnd::Succeeded).await?
            }
            Op::RetryableError { worker, nth } => {
                self.end_attempt(worker, nth, AttemptEnd::Errored(JobError::retry("flaky")))
                    .await?
            }
            Op::Poison { worker, nth } => {
                self.end_attempt(
                    worker,
                    nth,
                    AttemptEnd::Errored(JobError::poison("bad input")),
                )
                .await?
            }
            Op::Panic { worker, nth } => {
                self.end_attempt(worker, nth, AttemptEnd::Panicked("boom".into()))
                    .await?
            }
            Op::Log { worker, nth } => {
                let held = &self.workers[worker];
                if !held.is_empty() {
                    let h = held[nth % held.len()].clone();
                    let expected = self.model.append_log(h.index, h.claim);
                    let got = self
                        .store
                        .append_log(&h.lease, LogEntry::new("step", self.now, "working"))
                        .await
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    prop_assert_eq!(got.is_applied(), expected, "append_log to job {}", h.index);
                }
            }
            Op::Heartbeat { worker } => {
                let held = std::mem::take(&mut self.workers[worker]);
                let claims: Vec<(usize, u64)> = held.iter().map(|h| (h.index, h.claim)).collect();
                let leases: Vec<Lease<i64>> = held.iter().map(|h| h.lease.clone()).collect();
                let (cancel, gone) = self.model.heartbeat(&claims, self.now);
                let report = self
                    .store
                    .heartbeat(&leases, self.now)
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let as_ids = |v: &[usize]| v.iter().map(|&i| self.ids[i]).collect::<Vec<_>>();
                prop_assert_eq!(
                    &report.cancel_requested,
                    &as_ids(&cancel),
                    "cancel requested"
                );
                prop_assert_eq!(&report.gone, &as_ids(&gone), "gone");
                // The worker drops gone jobs and ends cancelled ones as canceled.
                for h in held {
                    if gone.contains(&h.index) {
                        continue;
                    }
                    if cancel.contains(&h.index) {
                        self.finish(
                            h,
                            Transition::Cancel {
                                message: "canceled".into(),
                            },
                        )
                        .await?;
                    } else {
                        self.workers[worker].push(h);
                    }
                }
            }
            Op::Crash { worker } => {
                let held = std::mem::take(&mut self.workers[worker]);
                self.zombies.extend(held);
            }
            Op::StaleComplete { nth } => {
                if !self.zombies.is_empty() {
                    let i = nth % self.zombies.len();
                    let zombie = self.zombies.remove(i);
                    self.finish(zombie, Transition::Complete).await?;
                }
            }
            Op::Release { worker } => {
                for h in std::mem::take(&mut self.workers[worker]) {
                    self.finish(h, Transition::Release).await?;
                }
            }
            Op::Cancel { job } => {
                if job < self.ids.len() && self.model.jobs[job].state.is_some() {
                    let expected = self.model.cancel(job, self.now);
                    let report = Admin::cancel(&self.store, &Targets::id(self.ids[job]))
                        .await
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    let got = match (report.changed, report.stop_requested) {
                        (1, 0) => Some(true),
                        (0, 1) => Some(false),
                        _ => None,
                    };
                    prop_assert_eq!(got, expected, "cancel of job {}", job);
                }
            }
            Op::Delete { job } => {
                if job < self.ids.len() && self.model.jobs[job].state.is_some() {
                    self.model.delete(job);
                    Admin::delete(&self.store, &Targets::id(self.ids[job]))
                        .await
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                }
            }
            Op::Retry {
                job,
                reset_attempts,
            } => {
                if job < self.ids.len() && self.model.jobs[job].state.is_some() {
                    let failures = self.model.jobs[job].num_failures;
                    let expected = self.model.retry(job, reset_attempts, self.now);
                    if expected {
                        self.grant_attempt(job, failures);
                    }
                    let report = Admin::retry(
                        &self.store,
                        &Targets::id(self.ids[job]),
                        RetryParams { reset_attempts },
                    )
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                    prop_assert_eq!(report.changed == 1, expected, "retry of job {}", job);
                    prop_assert_eq!(report.skipped.len() == 1, !expected, "a skip is reported");
                    if expected {
                        self.terminal.remove(&job);
                    }
                }
            }
            Op::RetryFailed { limit } => {
                let failures: Vec<u32> = self.model.jobs.iter().map(|j| j.num_failures).collect();
                let expected = self
                    .model
                    .retry_matching(&[JobState::Failed], limit, self.now);
                for &job in &expected {
                    self.grant_attempt(job, failures[job]);
                }
                let report = Admin::retry(
                    &self.store,
                    &Targets::matching(JobFilter::default().states([JobState::Failed]), limit),
                    RetryParams::default(),
                )
                .await
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(report.changed, expected.len() as u64, "bulk retry");
                for job in expected {
                    self.terminal.remove(&job);
                }
            }
            Op::Purge { age_secs, limit } => {
                let states = [JobState::Completed, JobState::Failed];
                let before = self.now - TimeDelta::seconds(age_secs.into());
                let expected = self.model.purge(&states, before, limit);
                let purged = Admin::purge(
                    &self.store,
                    &PurgeParams::new(states.to_vec(), before, limit),
                )
                .await
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(purged.purged, expected.len() as u64, "purge");
                for job in expected {
                    self.terminal.remove(&job);
                }
            }
            Op::Reset { at_most_once } => {
                let params = ResetParams {
                    stalled_before: self.now - TimeDelta::seconds(STALLED_MAX_AGE),
                    max_resets: MAX_RESETS,
                    delivery: if at_most_once {
                        Delivery::AtMostOnce
                    } else {
                        Delivery::AtLeastOnce
                    },
                    now: self.now,
                };
                let (reset, failed) = self.model.reset_stalled(&params);
                let report = self
                    .store
                    .reset_stalled(params)
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                let as_ids = |v: &[usize]| v.iter().map(|&i| self.ids[i]).collect::<Vec<_>>();
                prop_assert_eq!(&report.reset, &as_ids(&reset), "reset");
                prop_assert_eq!(&report.failed, &as_ids(&failed), "failed by reset");
            }
            Op::Advance { secs } => {
                self.now += TimeDelta::seconds(secs.into());
                self.clock.set(self.now);
            }
            Op::EnqueueUnique {
                key,
                forever,
                expires_secs,
                max_attempts,
                at_most_once,
            } => {
                let expires = expires_secs.map(|s| self.now + TimeDelta::seconds(s.into()));
                let scope = if forever {
                    UniqueScope::Forever
                } else {
                    UniqueScope::Active
                };
                let mut job = NewJob::new("k", serde_json::json!(self.ids.len()))
                    .unique(format!("key-{key}"), scope);
                job.expires_at = expires;
                if let Some(n) = max_attempts {
                    job = job.max_attempts(n.into());
                }
                if at_most_once {
                    job = job.at_most_once();
                }
                let limits = job.limits;
                let done = self
                    .store
                    .enqueue_reporting([job])
                    .pop()
                    .expect("one result");
                let (index, inserted) =
                    self.model
                        .enqueue_with(0, None, Some((key, forever)), expires);
                prop_assert_eq!(done.inserted, inserted, "whether key-{} was free", key);
                if inserted {
                    self.ids.push(done.id);
                    self.model.set_limits(index, limits);
                } else {
                    prop_assert_eq!(done.id, self.ids[index], "the holder of key-{}", key);
                }
            }
            Op::Expire => {
                let expected: Vec<i64> = self
                    .model
                    .expire(self.now)
                    .into_iter()
                    .map(|i| self.ids[i])
                    .collect();
                let mut swept = self
                    .store
                    .expire(self.now, 1000)
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                swept.sort();
                prop_assert_eq!(swept, expected, "the expired jobs");
            }
        }
        Ok(())
    }

    /// The admin contract's reads agree with the model: the counts per
    /// state, and every live job once, newest first, over pages of three.
    async fn check_admin_views(&self) -> Result<(), TestCaseError> {
        let fail = |e: queue_core::StoreError| TestCaseError::fail(e.to_string());
        let stats = Admin::stats(
            &self.store,
            StatsParams::new(self.now, self.now - TimeDelta::seconds(STALLED_MAX_AGE)),
        )
        .await
        .map_err(fail)?;
        let counts: Vec<(JobState, u64)> = stats
            .counts
            .iter()
            .map(|c| (c.state.unwrap_or(JobState::Queued), c.count))
            .collect();
        prop_assert_eq!(counts, self.model.counts(), "counts per state");
        let mut listed = Vec::new();
        let mut params = ListParams::first(JobFilter::default(), 3);
        loop {
            let page = Admin::list(&self.store, &params).await.map_err(fail)?;
            listed.extend(page.jobs.iter().map(|j| j.id));
            match page.next {
                Some(next) => params.after = Some(next),
                None => break,
            }
        }
        let live: Vec<i64> = (0..self.ids.len())
            .rev()
            .filter(|&i| self.model.jobs[i].state.is_some())
            .map(|i| self.ids[i])
            .collect();
        prop_assert_eq!(listed, live, "pages list every live job once, newest first");
        Ok(())
    }

    fn check_invariants(&mut self) -> Result<(), TestCaseError> {
        // The store agrees with the model on every job; none is lost.
        let mut live_jobs = 0;
        for (index, expected) in self.model.jobs.iter().enumerate() {
            let got = self.store.get(self.ids[index]);
            let Some(state) = expected.state else {
                prop_assert!(got.is_none(), "deleted job {} is still there", index);
                continue;
            };
            live_jobs += 1;
            let job = got.ok_or_else(|| TestCaseError::fail(format!("job {index} was lost")))?;
            prop_assert_eq!(job.state, state, "state of job {}", index);
            prop_assert_eq!(
                job.num_failures as u32,
                expected.num_failures,
                "failures of job {}",
                index
            );
            prop_assert_eq!(
                job.num_resets as u32,
                expected.num_resets,
                "resets of job {}",
                index
            );
            prop_assert_eq!(job.cancel, expected.cancel, "cancel flag of job {}", index);
            prop_assert_eq!(
                &job.failure_message,
                &expected.failure_message,
                "message of job {}",
                index
            );
            prop_assert_eq!(
                job.process_after,
                expected.process_after,
                "process_after of job {}",
                index
            );
            prop_assert_eq!(
                job.last_heartbeat_at,
                expected.last_heartbeat_at,
                "heartbeat of job {}",
                index
            );
            prop_assert_eq!(
                job.finished_at,
                expected.finished_at,
                "finish time of job {}",
                index
            );
            prop_assert!(
                job.num_failures as u32 <= self.allowed(index),
                "job {} ran too often",
                index
            );
            prop_assert!(
                job.num_resets as u32 <= MAX_RESETS,
                "job {} was reset too often",
                index
            );
            // Terminal states never change.
            if let Some(&before) = self.terminal.get(&index) {
                prop_assert_eq!(job.state, before, "terminal job {} changed state", index);
            } else if state.is_terminal() {
                self.terminal.insert(index, state);
            }
        }
        prop_assert_eq!(
            self.store.jobs().len(),
            live_jobs,
            "the store holds exactly the live jobs"
        );

        // No job is held by two live leases.
        let mut holders: HashMap<i64, usize> = HashMap::new();
        for held in self.workers.iter().flatten().chain(&self.zombies) {
            let live = self.store.get(held.lease.id).is_some_and(|job| {
                job.state == JobState::Processing && job.claim_token == held.lease.token
            });
            if live {
                *holders.entry(held.lease.id).or_default() += 1;
            }
            prop_assert!(
                held.lease.attempt <= self.allowed(held.index),
                "attempt {} exceeds the limit",
                held.lease.attempt
            );
        }
        for (id, n) in holders {
            prop_assert!(n <= 1, "job {} is held by {} live leases", id, n);
        }
        Ok(())
    }
}

fn run(ops: &[Op]) -> Result<Run, TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    rt.block_on(async {
        let mut run = Run::new();
        for op in ops {
            run.step(op).await?;
            run.check_invariants()?;
            run.check_admin_views().await?;
        }
        Ok(run)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn memory_store_matches_the_model(ops in proptest::collection::vec(op(), 1..80)) {
        run(&ops)?;
    }
}

/// A fixed scenario the random runs might take long to find: a job crashes
/// past its reset limit and a zombie's late completion is refused.
#[test]
fn crashed_job_fails_after_max_resets_and_zombie_write_is_refused() {
    let mut ops = vec![Op::Enqueue {
        priority: 0,
        delay_secs: None,
    }];
    for _ in 0..=MAX_RESETS {
        ops.push(Op::Claim {
            worker: 0,
            limit: 1,
        });
        ops.push(Op::Crash { worker: 0 });
        ops.push(Op::Advance { secs: 40 });
        ops.push(Op::Reset {
            at_most_once: false,
        });
    }
    ops.push(Op::StaleComplete { nth: 0 });
    let run = run(&ops).expect("store and model agree");
    let job = run.store.get(run.ids[0]).expect("job kept");
    assert_eq!(job.state, JobState::Failed);
    assert_eq!(job.num_resets as u32, MAX_RESETS);
    assert_eq!(
        job.failure_message.as_deref(),
        Some(queue_core::resetter::MAX_RESETS_MESSAGE)
    );
}
