//! The store conformance suite: every case of the [`Store`] contract, run
//! against any store through a [`Harness`].
//!
//! A store crate runs the whole suite with one macro call in a test file:
//!
//! ```text
//! queue_core::conformance_tests!(MyHarness::new());
//! ```
//!
//! which expands to one `#[tokio::test]` per case (the calling crate needs
//! `tokio` with the `macros` and `rt` features as a dev-dependency). Each case
//! starts from a fresh, empty store from [`Harness::store`] and panics with a
//! message naming the broken rule.
//!
//! Times are explicit: cases pass `now` values built from [`t0`] plus whole
//! seconds, so a store that keeps microseconds (Postgres) compares them
//! exactly.

use async_trait::async_trait;
use chrono::{DateTime, DurationRound, TimeDelta, Utc};

use crate::admin::{
    Admin, JobFilter, JobView, ListOrder, ListParams, PurgeParams, RetryParams, StatsParams,
    Targets,
};
use crate::audit::{AuditParams, NewAuditEntry};
use crate::error::StoreError;
use crate::job::{JobState, Lease, LogEntry, NewJob};
use crate::resetter::{Delivery, ResetParams, AT_MOST_ONCE_MESSAGE, MAX_RESETS_MESSAGE};
use crate::retention::{prune, Retention};
use crate::store::{ClaimParams, Claimed, Store, Transition, WriteResult};

/// The name under which the suite claims.
pub const WORKER: &str = "conformance-worker";

/// What the suite can observe of a job, whatever the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Current state.
    pub state: JobState,
    /// Failed attempts.
    pub num_failures: u32,
    /// Resets by the resetter.
    pub num_resets: u32,
    /// Message of the last failure.
    pub failure_message: Option<String>,
    /// Not claimable before this.
    pub process_after: Option<DateTime<Utc>>,
    /// When its last attempt ended, or when it was ended.
    pub finished_at: Option<DateTime<Utc>>,
    /// Last heartbeat.
    pub last_heartbeat_at: Option<DateTime<Utc>>,
    /// Messages of the execution log, in order.
    pub log_messages: Vec<String>,
    /// Worker that claimed it last.
    pub worker_hostname: Option<String>,
}

impl<Id> From<JobView<Id>> for Snapshot {
    /// What the suite observes of a job through [`Admin::get`].
    fn from(job: JobView<Id>) -> Self {
        let count = |n: Option<i64>| n.and_then(|n| u32::try_from(n).ok()).unwrap_or(0);
        Snapshot {
            state: job
                .state
                .unwrap_or_else(|| panic!("unknown stored state {:?}", job.stored_state)),
            num_failures: count(job.num_failures),
            num_resets: count(job.num_resets),
            failure_message: job.failure_message,
            process_after: job.process_after,
            finished_at: job.finished_at,
            last_heartbeat_at: job.last_heartbeat_at,
            log_messages: job
                .execution_logs
                .iter()
                .filter_map(|entry| entry.get("message")?.as_str().map(str::to_owned))
                .collect(),
            worker_hostname: job.worker_hostname,
        }
    }
}

/// Adapts a store to the suite: creates isolated stores and performs the
/// operations that are not part of [`Store`] or [`Admin`].
#[async_trait]
pub trait Harness: Send + Sync + 'static {
    /// The store under test; its admin contract speaks of the same keys.
    type Store: Store + Admin<Id = <Self::Store as Store>::Id>;

    /// A fresh, empty store, isolated from every other case.
    async fn store(&self) -> Self::Store;

    /// Extra dequeue conditions that admit only jobs of `kind`.
    fn only_kind(&self, kind: &str) -> <Self::Store as Store>::Conditions;

    /// A job store bound to no claim, as a crashed attempt's late write
    /// would use.
    async fn detached_job_store(&self, store: &Self::Store) -> <Self::Store as Store>::JobStore;

    /// The worker holding `job_store` dies: release whatever the store
    /// holds for it (a transactional store rolls its transaction back, as
    /// the server would for a dead connection). By default, drops it.
    async fn crash(&self, job_store: <Self::Store as Store>::JobStore) {
        drop(job_store);
    }

    /// Enqueues a job and returns its key ([`Admin::enqueue`]).
    async fn enqueue(&self, store: &Self::Store, job: NewJob) -> IdOf<Self> {
        Admin::enqueue(store, std::slice::from_ref(&job))
            .await
            .expect("enqueue failed")
            .pop()
            .expect("enqueue returns the new key")
            .id
    }

    /// What the store holds for `id`, or `None` if it is gone
    /// ([`Admin::get`]).
    async fn inspect(&self, store: &Self::Store, id: &IdOf<Self>) -> Option<Snapshot> {
        Admin::get(store, id)
            .await
            .expect("get failed")
            .map(Snapshot::from)
    }

    /// An operator cancels the job ([`Admin::cancel`]).
    async fn cancel(&self, store: &Self::Store, id: &IdOf<Self>) {
        Admin::cancel(store, &Targets::id(id.clone()))
            .await
            .expect("cancel failed");
    }

    /// Whether the store holds a unique key for as long as its job exists
    /// ([`UniqueScope::Forever`](crate::UniqueScope::Forever)); a store
    /// that cannot refuses such an enqueue instead. By default, it can.
    fn holds_keys_forever(&self) -> bool {
        true
    }

    /// An operator deletes the job ([`Admin::delete`]).
    async fn delete(&self, store: &Self::Store, id: &IdOf<Self>) {
        Admin::delete(store, &Targets::id(id.clone()))
            .await
            .expect("delete failed");
    }
}

/// The worker holding `claimed` dies; returns the leases it held.
async fn crash<H: Harness>(h: &H, claimed: Vec<Claimed<H::Store>>) -> Vec<Lease<IdOf<H>>> {
    let mut leases = Vec::with_capacity(claimed.len());
    for c in claimed {
        leases.push(c.lease);
        h.crash(c.job_store).await;
    }
    leases
}

/// The suite's base time: now, truncated to whole seconds.
pub fn t0() -> DateTime<Utc> {
    Utc::now()
        .duration_trunc(TimeDelta::seconds(1))
        .unwrap_or_else(|_| Utc::now())
}

fn at(base: DateTime<Utc>, seconds: i64) -> DateTime<Utc> {
    base + TimeDelta::seconds(seconds)
}

/// The "now" of a test that ends jobs two hours before it and purges those
/// older than one hour: `t`, or two hours earlier when midnight UTC falls
/// between those two times. A store partitioned by finish time a day to a
/// partition (the Postgres store on such a table) drops a day's partition
/// whole once all of it is older than the cut-off, so between 01:00 and
/// 02:00 UTC the old jobs went in one batch where the test counts two.
fn purge_now(t: DateTime<Utc>) -> DateTime<Utc> {
    let two_hours_back = at(t, -7200);
    let midnight = t.duration_trunc(TimeDelta::days(1)).unwrap_or(t);
    if two_hours_back < midnight {
        two_hours_back
    } else {
        t
    }
}

/// Whether `at` was taken on the store's own clock during a call that ran
/// from `before` to `after` on the system clock (a millisecond either
/// side, for a store that keeps microseconds).
fn taken_during(at: Option<DateTime<Utc>>, before: DateTime<Utc>, after: DateTime<Utc>) -> bool {
    let slack = TimeDelta::milliseconds(1);
    at.is_some_and(|at| at >= before - slack && at <= after + slack)
}

/// The key type of a harness's store.
pub type IdOf<H> = <<H as Harness>::Store as Store>::Id;

async fn claim<H: Harness>(
    store: &H::Store,
    limit: usize,
    now: DateTime<Utc>,
) -> Vec<Claimed<H::Store>> {
    claim_where::<H>(store, limit, None, now).await
}

async fn claim_where<H: Harness>(
    store: &H::Store,
    limit: usize,
    conditions: Option<&<H::Store as Store>::Conditions>,
    now: DateTime<Utc>,
) -> Vec<Claimed<H::Store>> {
    store
        .claim(ClaimParams {
            limit,
            worker: WORKER,
            conditions,
            now,
        })
        .await
        .expect("claim failed")
}

/// What the store holds for `id`, which must exist and whose times must
/// agree with its state ([`JobState::times_agree`]): every case checks
/// that rule on every job it looks at.
async fn snapshot<H: Harness>(h: &H, store: &H::Store, id: &IdOf<H>) -> Snapshot {
    let job = h
        .inspect(store, id)
        .await
        .unwrap_or_else(|| panic!("job {id} vanished"));
    assert!(
        job.state.times_agree(job.finished_at, job.process_after),
        "job {id} is {:?} with finished_at {:?} and process_after {:?}: a job ready or running \
         has neither time, one waiting for a time has process_after, a finished one only finished_at",
        job.state,
        job.finished_at,
        job.process_after
    );
    job
}

async fn finish<H: Harness>(
    store: &H::Store,
    claimed: Claimed<H::Store>,
    transition: Transition,
    now: DateTime<Utc>,
) -> (Lease<IdOf<H>>, WriteResult) {
    let lease = claimed.lease;
    let result = store
        .finish(claimed.job_store, &lease, transition, now)
        .await
        .expect("finish failed");
    (lease, result)
}

async fn reset<H: Harness>(
    store: &H::Store,
    stalled_before: DateTime<Utc>,
    max_resets: u32,
    delivery: Delivery,
) -> crate::resetter::ResetReport<IdOf<H>> {
    store
        .reset_stalled(ResetParams {
            stalled_before,
            max_resets,
            delivery,
            now: stalled_before,
        })
        .await
        .expect("reset_stalled failed")
}

fn ids<H: Harness>(claimed: &[Claimed<H::Store>]) -> Vec<IdOf<H>> {
    claimed.iter().map(|c| c.lease.id.clone()).collect()
}

/// Claiming moves queued jobs to processing, records the worker and the
/// heartbeat, and hands out first attempts with distinct fencing tokens.
pub async fn claim_marks_jobs_processing<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    let a = h
        .enqueue(&store, NewJob::new("k", serde_json::json!({"n": 1})))
        .await;
    let b = h
        .enqueue(&store, NewJob::new("k", serde_json::json!({"n": 2})))
        .await;
    let claimed = claim::<H>(&store, 10, t).await;
    assert_eq!(
        ids::<H>(&claimed),
        vec![a.clone(), b.clone()],
        "claim returns both queued jobs in order"
    );
    for c in &claimed {
        assert_eq!(c.lease.attempt, 1, "a job's first claim is attempt 1");
        assert!(c.record.is_ok(), "a well-formed record decodes");
        let s = snapshot(h, &store, &c.lease.id).await;
        assert_eq!(s.state, JobState::Processing, "a claimed job is processing");
        assert_eq!(
            s.last_heartbeat_at,
            Some(t),
            "claiming sets the heartbeat to now"
        );
        assert_eq!(
            s.worker_hostname.as_deref(),
            Some(WORKER),
            "claiming records the worker"
        );
    }
}

/// A claim returns at most `limit` jobs, higher priority first, then in
/// enqueue order.
pub async fn claim_respects_limit_and_priority<H: Harness>(h: &H) {
    let store = h.store().await;
    let low = h
        .enqueue(&store, NewJob::new("k", serde_json::json!(1)))
        .await;
    let high = h
        .enqueue(&store, NewJob::new("k", serde_json::json!(2)).priority(5))
        .await;
    let low2 = h
        .enqueue(&store, NewJob::new("k", serde_json::json!(3)))
        .await;
    let first = claim::<H>(&store, 2, t0()).await;
    assert_eq!(
        ids::<H>(&first),
        vec![high, low],
        "limit 2 takes the high-priority job, then the oldest"
    );
    let rest = claim::<H>(&store, 2, t0()).await;
    assert_eq!(ids::<H>(&rest), vec![low2], "the remaining job comes next");
}

/// A claimed job is never claimed again while held, also by concurrent
/// claims.
pub async fn concurrent_claims_never_share_a_job<H: Harness>(h: &H) {
    let store = h.store().await;
    let mut all = Vec::new();
    for n in 0..40 {
        all.push(
            h.enqueue(&store, NewJob::new("k", serde_json::json!(n)))
                .await,
        );
    }
    let t = t0();
    let (a, b, c, d) = tokio::join!(
        claim::<H>(&store, 15, t),
        claim::<H>(&store, 15, t),
        claim::<H>(&store, 15, t),
        claim::<H>(&store, 15, t),
    );
    let mut got: Vec<String> = [a, b, c, d]
        .iter()
        .flat_map(|batch| ids::<H>(batch))
        .map(|id| id.to_string())
        .collect();
    assert_eq!(got.len(), 40, "four claims of 15 take all 40 jobs, no more");
    got.sort();
    got.dedup();
    assert_eq!(got.len(), 40, "no job was handed to two claims");
    assert!(
        claim::<H>(&store, 10, t).await.is_empty(),
        "held jobs are not claimed again"
    );
}

/// Jobs scheduled for later are skipped until their time comes.
pub async fn claim_skips_jobs_scheduled_later<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    let id = h
        .enqueue(
            &store,
            NewJob::new("k", serde_json::json!(null)).process_after(at(t, 3600)),
        )
        .await;
    assert!(
        claim::<H>(&store, 10, t).await.is_empty(),
        "a job scheduled in an hour is not claimed now"
    );
    let later = claim::<H>(&store, 10, at(t, 3601)).await;
    assert_eq!(
        ids::<H>(&later),
        vec![id],
        "it is claimed once its time has passed"
    );
}

/// Jobs whose time has come (scheduled ones, and failed ones waiting to
/// retry) join the claim order of the jobs ready now: by priority, then in
/// enqueue order. Jobs still waiting for their time are passed over
/// wherever they stand in that order.
pub async fn due_jobs_join_the_claim_order<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    let job = |n: i64, priority: i32| NewJob::new("k", serde_json::json!(n)).priority(priority);
    let ready_low = h.enqueue(&store, job(1, 0)).await;
    let _waiting_high = h
        .enqueue(&store, job(2, 9).process_after(at(t, 3600)))
        .await;
    let due_high = h.enqueue(&store, job(3, 5).process_after(at(t, 10))).await;
    let ready_mid = h.enqueue(&store, job(4, 3)).await;
    let due_low = h.enqueue(&store, job(5, 0).process_after(at(t, 20))).await;
    let first = claim::<H>(&store, 3, at(t, 30)).await;
    assert_eq!(
        ids::<H>(&first),
        vec![due_high, ready_mid, ready_low],
        "the best three of ready and due jobs, by priority; the one due in an hour passed over"
    );
    let rest = claim::<H>(&store, 3, at(t, 30)).await;
    assert_eq!(
        ids::<H>(&rest),
        vec![due_low],
        "the due job of the lowest priority, enqueued last, comes last"
    );
}

/// Extra dequeue conditions restrict which jobs are claimed.
pub async fn claim_honours_extra_conditions<H: Harness>(h: &H) {
    let store = h.store().await;
    let _a = h
        .enqueue(&store, NewJob::new("small", serde_json::json!(1)))
        .await;
    let b = h
        .enqueue(&store, NewJob::new("large", serde_json::json!(2)))
        .await;
    let only_large = h.only_kind("large");
    let claimed = claim_where::<H>(&store, 10, Some(&only_large), t0()).await;
    assert_eq!(
        ids::<H>(&claimed),
        vec![b],
        "only the job matching the extra conditions is claimed"
    );
}

/// Completing applies once; a second write with the same lease is stale.
pub async fn complete_applies_once<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    let id = h
        .enqueue(&store, NewJob::new("k", serde_json::json!(null)))
        .await;
    let claimed = claim::<H>(&store, 1, t).await.pop().expect("one job");
    let (lease, result) = finish::<H>(&store, claimed, Transition::Complete, at(t, 1)).await;
    assert_eq!(
        result,
        WriteResult::Applied,
        "completing a held job applies"
    );
    assert_eq!(snapshot(h, &store, &id).await.state, JobState::Completed);
    let again = store
        .finish(
            h.detached_job_store(&store).await,
            &lease,
            Transition::Fail {
                message: "late".into(),
            },
            at(t, 2),
        )
        .await
        .expect("finish failed");
    assert_eq!(
        again,
        WriteResult::Stale,
        "a second write for a finished attempt is stale"
    );
    let s = snapshot(h, &store, &id).await;
    assert_eq!(
        s.state,
        JobState::Completed,
        "a completed job never becomes failed"
    );
    assert_eq!(s.failure_message, None);
}

/// A retryable failure leaves the job errored until `retry_at`, then it is
/// claimed again as the next attempt.
pub async fn errored_job_is_retried_after_its_time<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    let id = h
        .enqueue(&store, NewJob::new("k", serde_json::json!(null)))
        .await;
    let claimed = claim::<H>(&store, 1, t).await.pop().expect("one job");
    let first_token = claimed.lease.token;
    let retry_at = at(t, 60);
    let (_, result) = finish::<H>(
        &store,
        claimed,
        Transition::Retry {
            message: "flaky upstream".into(),
            retry_at,
        },
        at(t, 1),
    )
    .await;
    assert_eq!(result, WriteResult::Applied);
    let s = snapshot(h, &store, &id).await;
    assert_eq!(
        s.state,
        JobState::Errored,
        "a retryable failure leaves the job errored"
    );
    assert_eq!(s.num_failures, 1, "the failure is counted");
    assert_eq!(s.failure_message.as_deref(), Some("flaky upstream"));
    assert_eq!(s.process_after, Some(retry_at), "the retry time is stored");
    assert!(
        claim::<H>(&store, 1, at(t, 30)).await.is_empty(),
        "not claimable before its retry time"
    );
    let again = claim::<H>(&store, 1, at(t, 61))
        .await
        .pop()
        .expect("claimable after its retry time");
    assert_eq!(again.lease.attempt, 2, "the retry is attempt 2");
    assert_ne!(
        again.lease.token, first_token,
        "the retry has a new fencing token"
    );
}

/// A job's finish and due times follow its state
/// ([`JobState::times_agree`]): a claim clears what a scheduled or retried
/// job carried, an attempt's end sets them as its outcome says, and an
/// operator's cancel or force-fail and the expiry sweep clear a waiting
/// job's due time.
pub async fn a_jobs_times_follow_its_state<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    let times = |s: &Snapshot| (s.state, s.finished_at, s.process_after);
    let id = h
        .enqueue(
            &store,
            NewJob::new("k", serde_json::json!("scheduled")).process_after(at(t, 10)),
        )
        .await;
    let running = claim::<H>(&store, 1, at(t, 11)).await.pop().expect("due");
    assert_eq!(
        times(&snapshot(h, &store, &id).await),
        (JobState::Processing, None, None),
        "a claim clears a scheduled job's due time"
    );
    let retry = Transition::Retry {
        message: "again".into(),
        retry_at: at(t, 20),
    };
    end::<H>(&store, running, retry, at(t, 12)).await;
    assert_eq!(
        times(&snapshot(h, &store, &id).await),
        (JobState::Errored, Some(at(t, 12)), Some(at(t, 20))),
        "a retry keeps the attempt's end and the retry's time"
    );
    let again = claim::<H>(&store, 1, at(t, 21)).await.pop().expect("due");
    assert_eq!(
        times(&snapshot(h, &store, &id).await),
        (JobState::Processing, None, None),
        "a claim clears a retried job's last finish and due time"
    );
    end::<H>(&store, again, Transition::Complete, at(t, 22)).await;
    assert_eq!(
        times(&snapshot(h, &store, &id).await),
        (JobState::Completed, Some(at(t, 22)), None)
    );

    let waiting = |payload: &str| {
        NewJob::new("k", serde_json::json!(payload))
            .process_after(at(t, 100))
            .expires_at(at(t, 50))
    };
    let canceled = h.enqueue(&store, waiting("canceled")).await;
    let failed = h.enqueue(&store, waiting("failed")).await;
    let expired = h.enqueue(&store, waiting("expired")).await;
    h.cancel(&store, &canceled).await;
    Admin::force_fail(&store, &Targets::id(failed.clone()), "stuck")
        .await
        .expect("force_fail failed");
    let swept = store.expire(at(t, 60), 10).await.expect("expire failed");
    assert_eq!(swept, vec![expired.clone()], "the expiry sweep ends it");
    for (id, state) in [
        (&canceled, JobState::Canceled),
        (&failed, JobState::Failed),
        (&expired, JobState::Failed),
    ] {
        let s = snapshot(h, &store, id).await;
        assert_eq!(
            (s.state, s.process_after),
            (state, None),
            "a waiting job that is ended has no due time"
        );
        assert!(s.finished_at.is_some(), "an ended job has its finish time");
    }
}

/// Failed and canceled are terminal: nothing claims, resets or rewrites them.
pub async fn failed_and_canceled_jobs_are_final<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    let f = h
        .enqueue(&store, NewJob::new("k", serde_json::json!(1)))
        .await;
    let c = h
        .enqueue(&store, NewJob::new("k", serde_json::json!(2)))
        .await;
    let mut claimed = claim::<H>(&store, 2, t).await;
    let second = claimed.pop().expect("two jobs");
    let first = claimed.pop().expect("two jobs");
    let (f_lease, r) = finish::<H>(
        &store,
        first,
        Transition::Fail {
            message: "poison".into(),
        },
        at(t, 1),
    )
    .await;
    assert_eq!(r, WriteResult::Applied);
    let (_, r) = finish::<H>(
        &store,
        second,
        Transition::Cancel {
            message: "by operator".into(),
        },
        at(t, 1),
    )
    .await;
    assert_eq!(r, WriteResult::Applied);
    let s = snapshot(h, &store, &f).await;
    assert_eq!(
        (s.state, s.num_failures),
        (JobState::Failed, 1),
        "fail moves to failed and counts"
    );
    assert_eq!(snapshot(h, &store, &c).await.state, JobState::Canceled);
    assert!(
        claim::<H>(&store, 10, at(t, 10_000)).await.is_empty(),
        "terminal jobs are never claimed"
    );
    let report = reset::<H>(&store, at(t, 10_000), 5, Delivery::AtLeastOnce).await;
    assert!(
        report.reset.is_empty() && report.failed.is_empty(),
        "terminal jobs are never reset"
    );
    let late = store
        .finish(
            h.detached_job_store(&store).await,
            &f_lease,
            Transition::Release,
            at(t, 2),
        )
        .await
        .expect("finish failed");
    assert_eq!(late, WriteResult::Stale, "a failed job is not released");
    assert_eq!(snapshot(h, &store, &f).await.state, JobState::Failed);
}

/// An operator cancels a queued job: it becomes canceled and is never
/// claimed.
pub async fn cancelling_a_queued_job_cancels_it<H: Harness>(h: &H) {
    let store = h.store().await;
    let id = h
        .enqueue(&store, NewJob::new("k", serde_json::json!(null)))
        .await;
    h.cancel(&store, &id).await;
    assert_eq!(snapshot(h, &store, &id).await.state, JobState::Canceled);
    assert!(
        claim::<H>(&store, 10, t0()).await.is_empty(),
        "a canceled job is not claimed"
    );
}

/// Heartbeats keep held jobs alive and report cancelled and deleted ones.
pub async fn heartbeat_reports_cancelled_and_gone_jobs<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    let keep = h
        .enqueue(&store, NewJob::new("k", serde_json::json!(1)))
        .await;
    let cancel = h
        .enqueue(&store, NewJob::new("k", serde_json::json!(2)))
        .await;
    let delete = h
        .enqueue(&store, NewJob::new("k", serde_json::json!(3)))
        .await;
    let claimed = claim::<H>(&store, 3, t).await;
    let leases = crash(h, claimed).await;
    h.cancel(&store, &cancel).await;
    h.delete(&store, &delete).await;
    let report = store
        .heartbeat(&leases, at(t, 20))
        .await
        .expect("heartbeat failed");
    assert_eq!(
        report.cancel_requested,
        vec![cancel.clone()],
        "the cancelled job is reported"
    );
    assert_eq!(
        report.gone,
        vec![delete.clone()],
        "the deleted job is reported gone"
    );
    assert_eq!(
        snapshot(h, &store, &keep).await.last_heartbeat_at,
        Some(at(t, 20)),
        "the heartbeat is recorded"
    );
    let report = reset::<H>(&store, at(t, 10), 5, Delivery::AtLeastOnce).await;
    assert!(
        report.reset.is_empty(),
        "jobs with a fresh heartbeat are not stalled"
    );
    assert_eq!(
        snapshot(h, &store, &cancel).await.state,
        JobState::Processing,
        "cancelling a running job only flags it"
    );
}

/// Execution-log entries are appended in order, only under a live lease.
pub async fn append_log_appends_in_order<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    let id = h
        .enqueue(&store, NewJob::new("k", serde_json::json!(null)))
        .await;
    let claimed = claim::<H>(&store, 1, t).await.pop().expect("one job");
    for message in ["fetching", "converting"] {
        let r = store
            .append_log(&claimed.lease, LogEntry::new("step", at(t, 1), message))
            .await
            .expect("append_log failed");
        assert_eq!(r, WriteResult::Applied);
    }
    let (lease, _) = finish::<H>(&store, claimed, Transition::Complete, at(t, 2)).await;
    let late = store
        .append_log(&lease, LogEntry::new("step", at(t, 3), "too late"))
        .await
        .expect("append_log failed");
    assert_eq!(
        late,
        WriteResult::Stale,
        "no log is appended after the attempt ended"
    );
    assert_eq!(
        snapshot(h, &store, &id).await.log_messages,
        vec!["fetching", "converting"]
    );
}

/// The resetter moves stalled jobs back to queued and counts the reset; the
/// next claim is the same attempt with a new token.
pub async fn reset_requeues_stalled_jobs<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    let id = h
        .enqueue(&store, NewJob::new("k", serde_json::json!(null)))
        .await;
    let claimed = claim::<H>(&store, 1, t).await;
    let token = crash(h, claimed).await.pop().expect("one job").token;
    let report = reset::<H>(&store, at(t, 10), 3, Delivery::AtLeastOnce).await;
    assert_eq!(report.reset, vec![id.clone()], "the stalled job is reset");
    let s = snapshot(h, &store, &id).await;
    assert_eq!(
        (s.state, s.num_resets),
        (JobState::Queued, 1),
        "reset jobs are queued with the reset counted"
    );
    let again = claim::<H>(&store, 1, at(t, 11))
        .await
        .pop()
        .expect("a reset job is claimable");
    assert_eq!(again.lease.attempt, 1, "a reset is not a failed attempt");
    assert_ne!(again.lease.token, token, "the new claim has a new token");
}

/// Past the reset limit a stalled job fails with the fixed message.
pub async fn reset_fails_jobs_past_max_resets<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    let id = h
        .enqueue(&store, NewJob::new("k", serde_json::json!(null)))
        .await;
    crash(h, claim::<H>(&store, 1, t).await).await;
    assert_eq!(
        reset::<H>(&store, at(t, 10), 1, Delivery::AtLeastOnce)
            .await
            .reset,
        vec![id.clone()]
    );
    crash(h, claim::<H>(&store, 1, at(t, 11)).await).await;
    let report = reset::<H>(&store, at(t, 30), 1, Delivery::AtLeastOnce).await;
    assert_eq!(
        report.failed,
        vec![id.clone()],
        "the second stall exceeds max_resets = 1"
    );
    let s = snapshot(h, &store, &id).await;
    assert_eq!(s.state, JobState::Failed);
    assert_eq!(s.num_resets, 1, "failing does not count another reset");
    assert_eq!(s.failure_message.as_deref(), Some(MAX_RESETS_MESSAGE));
}

/// Under at-most-once delivery a stalled job fails instead of running again.
pub async fn at_most_once_fails_stalled_jobs<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    let id = h
        .enqueue(&store, NewJob::new("k", serde_json::json!(null)))
        .await;
    crash(h, claim::<H>(&store, 1, t).await).await;
    let report = reset::<H>(&store, at(t, 10), 5, Delivery::AtMostOnce).await;
    assert_eq!(report.failed, vec![id.clone()]);
    let s = snapshot(h, &store, &id).await;
    assert_eq!(s.state, JobState::Failed);
    assert_eq!(s.failure_message.as_deref(), Some(AT_MOST_ONCE_MESSAGE));
}

/// A job's own limits come back with its claim: its attempt limit and
/// whether it is at-most-once.
pub async fn a_jobs_limits_come_with_its_lease<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    let limited = h
        .enqueue(
            &store,
            NewJob::new("k", serde_json::json!(1))
                .priority(2)
                .max_attempts(2)
                .at_most_once()
                .unique("lim", crate::UniqueScope::Active)
                .expires_at(at(t, 3600)),
        )
        .await;
    let view = Admin::get(&store, &limited)
        .await
        .expect("get failed")
        .expect("the job");
    assert_eq!(
        (
            view.unique_key.as_deref(),
            view.max_attempts,
            view.expires_at,
            view.at_most_once
        ),
        (Some("lim"), Some(2), Some(at(t, 3600)), true),
        "operators see the job's own options"
    );
    h.enqueue(&store, NewJob::new("k", serde_json::json!(2)).priority(1))
        .await;
    let claimed = claim::<H>(&store, 2, t).await;
    let limits: Vec<(bool, crate::JobLimits)> = claimed
        .iter()
        .map(|c| (c.lease.id == limited, c.lease.limits))
        .collect();
    assert_eq!(
        limits,
        vec![
            (
                true,
                crate::JobLimits {
                    max_attempts: Some(2),
                    at_most_once: true
                }
            ),
            (false, crate::JobLimits::default())
        ]
    );
}

/// A job not started before it expires is never claimed, and the sweep
/// fails it, whether it was waiting its first attempt or a retry; jobs
/// not yet expired, and running ones, are left alone.
pub async fn expired_jobs_are_skipped_then_failed<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    let retried = h
        .enqueue(
            &store,
            NewJob::new("k", serde_json::json!("retried")).expires_at(at(t, 30)),
        )
        .await;
    let first = claim::<H>(&store, 1, t).await.pop().expect("the job");
    let retry = Transition::Retry {
        message: "busy".into(),
        retry_at: at(t, 20),
    };
    end::<H>(&store, first, retry, t).await;
    let expired = h
        .enqueue(
            &store,
            NewJob::new("k", serde_json::json!("expired")).expires_at(at(t, -1)),
        )
        .await;
    let later = h
        .enqueue(
            &store,
            NewJob::new("k", serde_json::json!("later")).expires_at(at(t, 3600)),
        )
        .await;
    let ids_claimed = ids::<H>(&claim::<H>(&store, 10, t).await);
    assert_eq!(
        ids_claimed,
        vec![later.clone()],
        "the expired job is skipped"
    );
    let swept = store.expire(t, 10).await.expect("expire failed");
    assert_eq!(swept, vec![expired.clone()], "only the expired waiting job");
    let s = snapshot(h, &store, &expired).await;
    assert_eq!(
        (s.state, s.failure_message.as_deref()),
        (JobState::Failed, Some(crate::EXPIRED_MESSAGE))
    );
    let swept = store.expire(at(t, 40), 10).await.expect("expire failed");
    assert_eq!(
        swept,
        vec![retried.clone()],
        "the job waiting for its retry expires; the running one does not"
    );
    assert_eq!(snapshot(h, &store, &retried).await.state, JobState::Failed);
    assert_eq!(
        snapshot(h, &store, &later).await.state,
        JobState::Processing
    );
}

/// An at-most-once job is failed when it stalls, even by an at-least-once
/// resetter; its neighbours are queued again.
pub async fn an_at_most_once_job_fails_when_stalled<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    let once = h
        .enqueue(
            &store,
            NewJob::new("k", serde_json::json!(1)).at_most_once(),
        )
        .await;
    let plain = h
        .enqueue(&store, NewJob::new("k", serde_json::json!(2)))
        .await;
    crash(h, claim::<H>(&store, 2, t).await).await;
    let report = reset::<H>(&store, at(t, 10), 5, Delivery::AtLeastOnce).await;
    assert_eq!(report.failed, vec![once.clone()]);
    assert_eq!(report.reset, vec![plain.clone()]);
    let s = snapshot(h, &store, &once).await;
    assert_eq!(
        (s.state, s.failure_message.as_deref()),
        (JobState::Failed, Some(AT_MOST_ONCE_MESSAGE))
    );
}

/// A stale attempt (reset and reclaimed since) can neither finish, heartbeat
/// nor log for the new attempt.
pub async fn stale_lease_cannot_write<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    let id = h
        .enqueue(&store, NewJob::new("k", serde_json::json!(null)))
        .await;
    let old = crash(h, claim::<H>(&store, 1, t).await)
        .await
        .pop()
        .expect("one job");
    reset::<H>(&store, at(t, 10), 3, Delivery::AtLeastOnce).await;
    let new = claim::<H>(&store, 1, at(t, 11))
        .await
        .pop()
        .expect("reclaimed");
    let report = store
        .heartbeat(std::slice::from_ref(&old), at(t, 12))
        .await
        .expect("heartbeat failed");
    assert_eq!(
        report.gone,
        vec![id.clone()],
        "the old attempt learns its job is gone"
    );
    let log = store
        .append_log(&old, LogEntry::new("step", at(t, 12), "stale"))
        .await
        .expect("append_log failed");
    assert_eq!(log, WriteResult::Stale, "the old attempt cannot log");
    let (_, r) = finish::<H>(&store, new, Transition::Complete, at(t, 13)).await;
    assert_eq!(r, WriteResult::Applied, "the new attempt completes");
    let late = store
        .finish(
            h.detached_job_store(&store).await,
            &old,
            Transition::Retry {
                message: "stale".into(),
                retry_at: at(t, 100),
            },
            at(t, 14),
        )
        .await
        .expect("finish failed");
    assert_eq!(
        late,
        WriteResult::Stale,
        "the old attempt cannot overwrite the result"
    );
    let s = snapshot(h, &store, &id).await;
    assert_eq!((s.state, s.num_failures), (JobState::Completed, 0));
    assert!(s.log_messages.is_empty());
}

/// Releasing hands a job back to the queue without counting a failure or a
/// reset.
pub async fn release_requeues_without_counting<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    let id = h
        .enqueue(&store, NewJob::new("k", serde_json::json!(null)))
        .await;
    let claimed = claim::<H>(&store, 1, t).await.pop().expect("one job");
    let (_, r) = finish::<H>(&store, claimed, Transition::Release, at(t, 1)).await;
    assert_eq!(r, WriteResult::Applied);
    let s = snapshot(h, &store, &id).await;
    assert_eq!(
        (s.state, s.num_failures, s.num_resets),
        (JobState::Queued, 0, 0)
    );
    let again = claim::<H>(&store, 1, at(t, 2))
        .await
        .pop()
        .expect("released jobs are claimable");
    assert_eq!(again.lease.attempt, 1);
}

/// `next_due` reports the earliest time ahead at which a waiting job
/// comes due: scheduled or retrying, never one due already, running or
/// finished. A store that keeps no such time may say none.
pub async fn next_due_is_the_earliest_waiting_time_ahead<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    assert_eq!(
        store.next_due(t).await.expect("next_due"),
        None,
        "with no job, nothing comes due"
    );
    h.enqueue(&store, NewJob::new("k", serde_json::json!("now")))
        .await;
    h.enqueue(
        &store,
        NewJob::new("k", serde_json::json!("later")).process_after(at(t, 600)),
    )
    .await;
    h.enqueue(
        &store,
        NewJob::new("k", serde_json::json!("sooner")).process_after(at(t, 60)),
    )
    .await;
    h.enqueue(
        &store,
        NewJob::new("k", serde_json::json!("past")).process_after(at(t, -60)),
    )
    .await;
    let due = store.next_due(t).await.expect("next_due");
    if due.is_none() {
        return; // the store keeps no due times (the default answer)
    }
    assert_eq!(due, Some(at(t, 60)));
    assert_eq!(
        store.next_due(at(t, 60)).await.unwrap(),
        Some(at(t, 600)),
        "strictly ahead"
    );
    assert_eq!(store.next_due(at(t, 600)).await.unwrap(), None);
}

/// `finish_again` (a failed finish written once more, outside the job
/// store) records its transition under the lease like `finish`, and is
/// stale once the job has moved on.
pub async fn finish_again_is_guarded_like_finish<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    let id = h
        .enqueue(&store, NewJob::new("k", serde_json::json!(null)))
        .await;
    let claimed = claim::<H>(&store, 1, t).await.pop().expect("one job");
    let lease = claimed.lease.clone();
    // The first finish's job store is gone with it (a crashed transaction).
    h.crash(claimed.job_store).await;
    let again = |transition| store.finish_again(&lease, transition, at(t, 1));
    assert_eq!(
        again(Transition::Release).await.expect("finish_again"),
        WriteResult::Applied
    );
    let s = snapshot(h, &store, &id).await;
    assert_eq!(
        (s.state, s.num_failures, s.num_resets),
        (JobState::Queued, 0, 0)
    );
    assert_eq!(
        again(Transition::Complete).await.expect("finish_again"),
        WriteResult::Stale,
        "the lease is spent"
    );
    let claimed = claim::<H>(&store, 1, at(t, 2))
        .await
        .pop()
        .expect("queued again");
    let lease = claimed.lease.clone();
    h.crash(claimed.job_store).await;
    let error = Transition::Retry {
        message: "written again".into(),
        retry_at: at(t, 60),
    };
    assert_eq!(
        store
            .finish_again(&lease, error, at(t, 3))
            .await
            .expect("finish_again"),
        WriteResult::Applied
    );
    let s = snapshot(h, &store, &id).await;
    assert_eq!((s.state, s.num_failures), (JobState::Errored, 1));
}

/// Writes for a deleted job are stale and do not resurrect it.
pub async fn deleted_job_writes_are_stale<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    let id = h
        .enqueue(&store, NewJob::new("k", serde_json::json!(null)))
        .await;
    let lease = crash(h, claim::<H>(&store, 1, t).await)
        .await
        .pop()
        .expect("one job");
    h.delete(&store, &id).await;
    let r = store
        .finish(
            h.detached_job_store(&store).await,
            &lease,
            Transition::Complete,
            at(t, 1),
        )
        .await
        .expect("finish failed");
    assert_eq!(r, WriteResult::Stale);
    assert!(
        h.inspect(&store, &id).await.is_none(),
        "a deleted job stays deleted"
    );
}

/// Ends a held attempt with `transition`, which must apply.
async fn end<H: Harness>(
    store: &H::Store,
    claimed: Claimed<H::Store>,
    transition: Transition,
    now: DateTime<Utc>,
) {
    let (lease, r) = finish::<H>(store, claimed, transition, now).await;
    assert_eq!(r, WriteResult::Applied, "ending job {} applies", lease.id);
}

fn fail(message: &str) -> Transition {
    Transition::Fail {
        message: message.into(),
    }
}

/// A key no job has (any more).
async fn missing_id<H: Harness>(h: &H, store: &H::Store) -> IdOf<H> {
    let id = h
        .enqueue(store, NewJob::new("gone", serde_json::json!(null)))
        .await;
    h.delete(store, &id).await;
    id
}

async fn list_all<H: Harness>(store: &H::Store, filter: JobFilter) -> Vec<IdOf<H>> {
    Admin::list(store, &ListParams::first(filter, 1000))
        .await
        .expect("list failed")
        .jobs
        .into_iter()
        .map(|j| j.id)
        .collect()
}

/// `get` shows a job's kind, payload, state (standard and stored) and the
/// columns the worker writes; a missing key is `None`.
pub async fn admin_get_shows_a_job_as_stored<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    let id = h
        .enqueue(
            &store,
            NewJob::new("email", serde_json::json!({"to": "a@b.c"})).priority(3),
        )
        .await;
    let view = Admin::get(&store, &id)
        .await
        .expect("get failed")
        .expect("the job exists");
    assert_eq!(view.id, id);
    assert_eq!(view.kind.as_deref(), Some("email"));
    assert_eq!(view.payload, Some(serde_json::json!({"to": "a@b.c"})));
    assert_eq!(
        (view.state, view.stored_state.as_str()),
        (Some(JobState::Queued), "queued")
    );
    assert_eq!((view.priority, view.num_failures), (Some(3), Some(0)));
    assert!(view.queued_at.is_some(), "the enqueue time is shown");
    let _held = claim::<H>(&store, 1, t).await;
    let view = Admin::get(&store, &id)
        .await
        .expect("get failed")
        .expect("still there");
    assert_eq!(view.state, Some(JobState::Processing));
    assert_eq!(
        (view.started_at, view.last_heartbeat_at),
        (Some(t), Some(t)),
        "the claim's times are shown"
    );
    assert_eq!(view.worker_hostname.as_deref(), Some(WORKER));
    let gone = missing_id(h, &store).await;
    assert_eq!(
        Admin::get(&store, &gone).await.expect("get failed"),
        None,
        "a missing key reads as None"
    );
}

/// `list` applies every filter field and pages by key: walking the pages
/// returns every match once, in order, even when a job is enqueued between
/// two pages.
pub async fn admin_list_filters_and_pages_by_key<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    let mut ids = Vec::new();
    for kind in ["a", "b", "a", "b", "a"] {
        ids.push(
            h.enqueue(&store, NewJob::new(kind, serde_json::json!(null)))
                .await,
        );
    }
    let first = claim::<H>(&store, 1, t).await.pop().expect("one job");
    end::<H>(&store, first, fail("Upstream TIMEOUT after 30s"), at(t, 1)).await;
    let failed = ids[0].clone();

    let only = |filter: JobFilter| list_all::<H>(&store, filter);
    for (filter, n) in [
        (JobFilter::default(), 5),
        (JobFilter::default().kinds(["a"]), 3),
        (
            JobFilter::default()
                .states([JobState::Failed])
                .failure_contains("TIMEOUT"),
            1,
        ),
        (JobFilter::default().kinds(["c"]), 0),
    ] {
        assert_eq!(
            Admin::count(&store, &filter).await.expect("count failed"),
            n,
            "count of {filter:?}"
        );
    }
    assert_eq!(
        only(JobFilter::default().states([JobState::Failed])).await,
        vec![failed.clone()],
        "by state"
    );
    assert_eq!(
        only(JobFilter::default().kinds(["a"])).await,
        vec![ids[4].clone(), ids[2].clone(), ids[0].clone()],
        "by kind, newest first"
    );
    assert_eq!(
        only(JobFilter::default().failure_contains("timeout")).await,
        vec![failed.clone()],
        "by failure text, ignoring case"
    );
    assert!(
        only(JobFilter::default().failure_contains("refused"))
            .await
            .is_empty(),
        "a text no message holds matches nothing"
    );
    let hour = TimeDelta::hours(1);
    let queued = |from, before| JobFilter {
        queued_from: from,
        queued_before: before,
        ..JobFilter::default()
    };
    assert_eq!(
        only(queued(Some(t - hour), Some(t + hour))).await.len(),
        5,
        "enqueued within the hour"
    );
    assert!(
        only(queued(Some(t + hour), None)).await.is_empty(),
        "none enqueued later"
    );
    let finished = JobFilter {
        finished_from: Some(at(t, 1)),
        finished_before: Some(at(t, 2)),
        ..JobFilter::default()
    };
    assert_eq!(only(finished).await, vec![failed.clone()], "by finish time");

    // Pages of two, newest first; a job enqueued meanwhile does not shift
    // them.
    let mut seen = Vec::new();
    let mut params = ListParams::first(JobFilter::default(), 2);
    let mut pages = 0;
    loop {
        let page = Admin::list(&store, &params).await.expect("list failed");
        pages += 1;
        assert!(page.jobs.len() <= 2, "a page holds at most the limit");
        seen.extend(page.jobs.into_iter().map(|j| j.id));
        if pages == 1 {
            h.enqueue(&store, NewJob::new("late", serde_json::json!(null)))
                .await;
        }
        match page.next {
            Some(next) => params.after = Some(next),
            None => break,
        }
    }
    let mut expected = ids.clone();
    expected.reverse();
    assert_eq!(
        seen, expected,
        "every job once, newest first, none repeated"
    );
    assert_eq!(pages, 3);

    let mut oldest = ListParams::first(JobFilter::default().kinds(["a", "b"]), 10);
    oldest.order = ListOrder::OldestFirst;
    let page = Admin::list(&store, &oldest).await.expect("list failed");
    assert_eq!(
        page.jobs.into_iter().map(|j| j.id).collect::<Vec<_>>(),
        ids,
        "oldest first"
    );
    assert_eq!(page.next, None);
}

/// A list of some kinds finds their jobs in every state (ready, scheduled,
/// running, retrying, completed, failed and canceled), in key order both
/// ways and across pages, with or without a state filter: a store may
/// read each state apart (the Postgres default table does), and the page
/// must still be the one a single scan would give.
pub async fn admin_list_of_a_kind_spans_every_state<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    let mut a = Vec::new();
    for n in 0..7 {
        a.push(
            h.enqueue(&store, NewJob::new("a", serde_json::json!(n)))
                .await,
        );
        h.enqueue(&store, NewJob::new("b", serde_json::json!(n)))
            .await;
    }
    let later = h
        .enqueue(
            &store,
            NewJob::new("a", serde_json::json!("later")).process_after(at(t, 3600)),
        )
        .await;
    a.push(later);
    // Claim all fourteen ready jobs, then end a's first five each its own
    // way and b's all completed; a's sixth stays running, its seventh is
    // handed back (queued again).
    let claimed = claim::<H>(&store, 14, t).await;
    assert_eq!(claimed.len(), 14, "every ready job claimed");
    let mut running = Vec::new();
    for c in claimed {
        let transition = match a.iter().position(|id| *id == c.lease.id) {
            Some(0) => Transition::Complete,
            Some(1) => fail("boom"),
            Some(2) => Transition::Cancel {
                message: "stop".into(),
            },
            Some(3) => Transition::Retry {
                message: "again".into(),
                retry_at: at(t, 60),
            },
            Some(4) => Transition::Complete,
            Some(5) => {
                running.push(c);
                continue;
            }
            Some(_) => Transition::Release,
            None => Transition::Complete,
        };
        end::<H>(&store, c, transition, at(t, 1)).await;
    }
    // Enqueue order is list order (by key, or queued time then key).
    let mut newest = a.clone();
    newest.reverse();
    let only_a = JobFilter::default().kinds(["a"]);
    assert_eq!(
        list_all::<H>(&store, only_a.clone()).await,
        newest,
        "every state of kind a, newest first"
    );
    for order in [ListOrder::NewestFirst, ListOrder::OldestFirst] {
        let mut expected = newest.clone();
        if order == ListOrder::OldestFirst {
            expected.reverse();
        }
        let mut params = ListParams::first(only_a.clone(), 3).order(order);
        let mut seen = Vec::new();
        loop {
            let page = Admin::list(&store, &params).await.expect("list failed");
            assert!(page.jobs.len() <= 3, "a page holds at most the limit");
            seen.extend(page.jobs.into_iter().map(|j| j.id));
            match page.next {
                Some(next) => params.after = Some(next),
                None => break,
            }
        }
        assert_eq!(seen, expected, "pages of three, {order:?}");
    }
    let finished = vec![a[4].clone(), a[2].clone(), a[1].clone(), a[0].clone()];
    assert_eq!(
        list_all::<H>(
            &store,
            only_a
                .clone()
                .states([JobState::Completed, JobState::Failed, JobState::Canceled])
        )
        .await,
        finished,
        "kind a's finished jobs"
    );
    let waiting = vec![a[7].clone(), a[6].clone(), a[3].clone()];
    assert_eq!(
        list_all::<H>(
            &store,
            only_a.clone().states([JobState::Queued, JobState::Errored])
        )
        .await,
        waiting,
        "kind a's waiting jobs: handed back, retrying and scheduled"
    );
    assert_eq!(
        list_all::<H>(&store, only_a.clone().states([JobState::Processing])).await,
        vec![a[5].clone()],
        "kind a's running job"
    );
    assert_eq!(
        list_all::<H>(&store, JobFilter::default().kinds(["a", "b"]))
            .await
            .len(),
        15,
        "two kinds, every job"
    );
    drop(running);
}

/// `stats` counts jobs per state and kind, finds the longest-waiting
/// claimable job and counts the stalled ones.
pub async fn admin_stats_count_states_and_kinds<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    let mut ids = Vec::new();
    for kind in ["a", "a", "a", "b"] {
        ids.push(
            h.enqueue(&store, NewJob::new(kind, serde_json::json!(null)))
                .await,
        );
    }
    // Claimed long ago and silent since: stalled.
    let stalled = crash(h, claim::<H>(&store, 1, at(t, -100)).await).await;
    assert_eq!(stalled.len(), 1);
    let stats = Admin::stats(&store, StatsParams::new(t, at(t, -10)))
        .await
        .expect("stats failed");
    let counts: Vec<(Option<JobState>, Option<String>, u64)> = stats
        .counts
        .iter()
        .map(|c| (c.state, c.kind.clone(), c.count))
        .collect();
    assert_eq!(
        counts,
        vec![
            (Some(JobState::Queued), Some("a".into()), 2),
            (Some(JobState::Queued), Some("b".into()), 1),
            (Some(JobState::Processing), Some("a".into()), 1),
        ],
        "per state in lifecycle order, then kind"
    );
    assert!(stats
        .counts
        .iter()
        .all(|c| c.stored_state == c.state.map(|s| s.as_str()).unwrap_or_default()));
    assert_eq!(stats.total(JobState::Queued), 3);
    assert_eq!(stats.stalled, Some(1), "the silent job is stalled");
    let second = Admin::get(&store, &ids[1])
        .await
        .expect("get failed")
        .expect("there");
    assert_eq!(
        stats.oldest_claimable_since, second.queued_at,
        "the oldest waiting job is the first one not claimed"
    );
    let none_stalled = Admin::stats(&store, StatsParams::new(t, at(t, -200)))
        .await
        .expect("stats failed");
    assert_eq!(
        none_stalled.stalled,
        Some(0),
        "a heartbeat newer than the limit is not stalled"
    );
}

/// `retry` makes failed, errored and canceled jobs claimable at once and
/// leaves every other job alone, saying why; with `reset_attempts` the
/// counts start over.
pub async fn admin_retry_requeues_failed_errored_and_canceled_jobs<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    let mut keys = Vec::new();
    for n in 0..5 {
        keys.push(
            h.enqueue(&store, NewJob::new("k", serde_json::json!(n)))
                .await,
        );
    }
    let (f, e, c, p, d) = (
        keys[0].clone(),
        keys[1].clone(),
        keys[2].clone(),
        keys[3].clone(),
        keys[4].clone(),
    );
    h.cancel(&store, &c).await;
    let mut claimed = claim::<H>(&store, 4, t).await;
    assert_eq!(
        ids::<H>(&claimed),
        vec![f.clone(), e.clone(), p.clone(), d.clone()]
    );
    let done = claimed.pop().expect("d");
    let running = claimed.pop().expect("p");
    let errored = claimed.pop().expect("e");
    let failing = claimed.pop().expect("f");
    end::<H>(&store, done, Transition::Complete, at(t, 1)).await;
    end::<H>(&store, failing, fail("poison"), at(t, 1)).await;
    end::<H>(
        &store,
        errored,
        Transition::Retry {
            message: "flaky".into(),
            retry_at: at(t, 3600),
        },
        at(t, 1),
    )
    .await;
    let gone = missing_id(h, &store).await;

    let before = Utc::now();
    let report = Admin::retry(
        &store,
        &Targets::Ids(vec![
            f.clone(),
            e.clone(),
            c.clone(),
            p.clone(),
            d.clone(),
            gone.clone(),
        ]),
        RetryParams::default(),
    )
    .await
    .expect("retry failed");
    let after = Utc::now();
    assert_eq!(
        report.changed, 3,
        "failed, errored and canceled are retried"
    );
    let skipped: Vec<(IdOf<H>, Option<JobState>, bool)> = report
        .skipped
        .iter()
        .map(|s| (s.id.clone(), s.state, s.stored_state.is_some()))
        .collect();
    assert_eq!(
        skipped,
        vec![
            (p.clone(), Some(JobState::Processing), true),
            (d.clone(), Some(JobState::Completed), true),
            (gone, None, false),
        ],
        "processing, completed and missing jobs are left alone and reported"
    );
    let s = snapshot(h, &store, &e).await;
    assert_eq!(s.state, JobState::Queued);
    assert!(
        taken_during(s.process_after, before, after),
        "due from the retry on (the store's time, between {before} and {after}), not at its old retry time: {:?}",
        s.process_after
    );
    assert_eq!(s.num_failures, 1, "the failure count is kept by default");
    let again = claim::<H>(&store, 10, Utc::now()).await;
    assert_eq!(
        ids::<H>(&again),
        vec![f.clone(), e.clone(), c.clone()],
        "claimable at once"
    );
    let attempts: Vec<u32> = again.iter().map(|c| c.lease.attempt).collect();
    assert_eq!(attempts, vec![2, 2, 1], "a retry is the next attempt");
    let mut again = again;
    let _c = again.pop();
    let _e = again.pop();
    let f_again = again.pop().expect("f");
    end::<H>(&store, f_again, fail("poison again"), at(t, 3)).await;
    let report = Admin::retry(
        &store,
        &Targets::id(f.clone()),
        RetryParams {
            reset_attempts: true,
        },
    )
    .await
    .expect("retry failed");
    assert_eq!(report.changed, 1);
    let s = snapshot(h, &store, &f).await;
    assert_eq!(
        (s.state, s.num_failures, s.num_resets),
        (JobState::Queued, 0, 0),
        "the counts start over"
    );
    let _ = running;
}

/// A bulk retry takes matching jobs in batches of its limit, and only
/// matching ones.
pub async fn admin_bulk_retry_works_in_batches<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    for n in 0..5 {
        h.enqueue(&store, NewJob::new("x", serde_json::json!(n)))
            .await;
    }
    let other = h
        .enqueue(&store, NewJob::new("y", serde_json::json!(0)))
        .await;
    for c in claim::<H>(&store, 10, t).await {
        end::<H>(&store, c, fail("down"), at(t, 1)).await;
    }
    let targets = Targets::matching(JobFilter::default().kinds(["x"]), 2);
    let mut batches = Vec::new();
    loop {
        let report = Admin::retry(&store, &targets, RetryParams::default())
            .await
            .expect("retry failed");
        assert!(report.skipped.is_empty(), "a filter reports no skips");
        batches.push(report.changed);
        if report.changed < 2 {
            break;
        }
    }
    assert_eq!(
        batches,
        vec![2, 2, 1],
        "at most the limit per call, until done"
    );
    assert_eq!(
        snapshot(h, &store, &other).await.state,
        JobState::Failed,
        "other kinds stay failed"
    );
    assert_eq!(
        list_all::<H>(&store, JobFilter::default().states([JobState::Queued]))
            .await
            .len(),
        5
    );
}

/// A bulk operation is recorded pending, taken by one runner at a time,
/// carried out in batches that each add to its count, and ends done; an
/// abort stops its runner after the batch under way; a runner gone silent
/// loses it to another, whose batches carry it on; a stopped runner leaves
/// it interrupted, resumable by id alone; a batch after the last position
/// passes over the jobs before it.
pub async fn admin_operations_run_in_batches_abort_and_resume<H: Harness>(h: &H) {
    use crate::operations::{
        run_operation, NewOperation, OperationAction, OperationParams, OperationState,
        OperationStep, RunOptions, StopAs, TakeOperation,
    };
    use std::time::Duration;
    use tokio_util::sync::CancellationToken;

    let store = h.store().await;
    let t = t0();
    for n in 0..7 {
        h.enqueue(&store, NewJob::new("x", serde_json::json!(n)))
            .await;
    }
    let other = h
        .enqueue(&store, NewJob::new("y", serde_json::json!(0)))
        .await;
    for c in claim::<H>(&store, 10, t).await {
        end::<H>(&store, c, fail("down"), at(t, 1)).await;
    }
    let xs = JobFilter::default().kinds(["x"]);
    // Jobs of kind x in `states` (in any, for none).
    let count = |states: &[JobState]| {
        let mut filter = xs.clone();
        if !states.is_empty() {
            filter = filter.states(states.iter().copied());
        }
        let store = &store;
        async move { Admin::count(store, &filter).await.expect("count failed") }
    };
    let go = CancellationToken::new();
    let options = RunOptions::new(Duration::ZERO, StopAs::Interrupted);
    let new = |action, total| NewOperation::new(action, xs.clone(), "alice", total).batch(2);
    let retry = OperationAction::Retry {
        reset_attempts: false,
    };

    // Carried out in batches of 2, each one counted, until done.
    let first = Admin::create_operation(&store, &new(retry.clone(), 7))
        .await
        .expect("create failed");
    assert_eq!(
        (first.state, first.done, first.total),
        (OperationState::Pending, 0, 7)
    );
    let taken = Admin::take_operation(&store, &TakeOperation::next("r1"))
        .await
        .expect("take failed")
        .expect("the pending operation is taken");
    assert_eq!((taken.id, taken.state), (first.id, OperationState::Running));
    assert_eq!(taken.runner.as_deref(), Some("r1"));
    assert!(
        Admin::take_operation(&store, &TakeOperation::next("r2"))
            .await
            .expect("take failed")
            .is_none(),
        "a running operation with a live runner is not taken twice"
    );
    let mut seen = Vec::new();
    let ran = run_operation(&store, taken, "r1", &go, options, |op| seen.push(op.done))
        .await
        .expect("run failed");
    assert_eq!((ran.state, ran.done), (OperationState::Done, 7));
    assert_eq!(seen, vec![2, 4, 6, 7], "each batch is recorded as it ends");
    assert!(
        ran.cursor.is_some(),
        "the position after the last batch is kept"
    );
    assert!(ran.finished_at.is_some());
    assert_eq!(count(&[JobState::Queued]).await, 7, "every x job retried");
    assert_eq!(snapshot(h, &store, &other).await.state, JobState::Failed);

    // A batch after a position passes over the jobs up to it.
    let report = Admin::force_fail(
        &store,
        &Targets::Matching {
            filter: xs.clone(),
            limit: 3,
            after: None,
        },
        "by hand",
    )
    .await
    .expect("force-fail failed");
    assert_eq!(report.changed, 3);
    let after = report
        .last
        .clone()
        .expect("a filtered write says where it ended");
    let rest = Admin::retry(
        &store,
        &Targets::Matching {
            filter: JobFilter::default(),
            limit: 10,
            after: Some(after),
        },
        RetryParams::default(),
    )
    .await
    .expect("retry failed");
    assert_eq!(
        rest.changed, 1,
        "only the failed y job lies after the position; the failed x jobs lie before it"
    );
    assert_eq!(count(&[JobState::Failed]).await, 3);

    // An abort stands: the runner stops after the batch under way.
    let doomed = Admin::create_operation(&store, &new(OperationAction::Delete, 8))
        .await
        .expect("create failed");
    let taken = Admin::take_operation(&store, &TakeOperation::id("r1", doomed.id))
        .await
        .expect("take failed")
        .expect("taken by id");
    let Some(crate::operations::AbortOutcome::Aborted(aborted)) =
        Admin::abort_operation(&store, doomed.id, "bob")
            .await
            .expect("abort failed")
    else {
        panic!("a running operation is aborted");
    };
    assert_eq!(aborted.state, OperationState::Aborted);
    assert_eq!(aborted.message.as_deref(), Some("aborted by bob"));
    let ran = run_operation(&store, taken, "r1", &go, options, |_| {})
        .await
        .expect("run failed");
    assert_eq!((ran.state, ran.done), (OperationState::Aborted, 2));
    assert_eq!(count(&[]).await, 5, "only the batch under way deleted jobs");
    let Some(crate::operations::AbortOutcome::Ended(again)) =
        Admin::abort_operation(&store, doomed.id, "carol")
            .await
            .expect("abort failed")
    else {
        panic!("an ended operation is not aborted again");
    };
    assert_eq!(
        again.message.as_deref(),
        Some("aborted by bob"),
        "ended stays ended"
    );

    // A silent runner loses the operation; the next carries it on.
    let cancel = Admin::create_operation(&store, &new(OperationAction::Cancel, 5))
        .await
        .expect("create failed");
    let held = Admin::take_operation(&store, &TakeOperation::next("r1"))
        .await
        .expect("take failed")
        .expect("taken");
    assert_eq!(held.id, cancel.id);
    let taken_over = Admin::take_operation(
        &store,
        &TakeOperation::next("r2").silent_for(Duration::ZERO),
    )
    .await
    .expect("take failed")
    .expect("a silent runner's operation is taken over");
    assert_eq!(taken_over.runner.as_deref(), Some("r2"));
    assert!(
        Admin::step_operation(&store, &OperationStep::batch(cancel.id, "r1", 1, None))
            .await
            .expect("step failed")
            .is_none(),
        "the silent runner's late batch is not counted"
    );
    let ran = run_operation(&store, taken_over, "r2", &go, options, |_| {})
        .await
        .expect("run failed");
    assert_eq!(
        (ran.state, ran.done),
        (OperationState::Done, 4),
        "the four queued x jobs; the one failed before is final"
    );
    assert_eq!(count(&[JobState::Canceled]).await, 4);

    // A stopped runner leaves it interrupted, taken again by id alone.
    let resumable = Admin::create_operation(&store, &new(retry, 5))
        .await
        .expect("create failed");
    let taken = Admin::take_operation(&store, &TakeOperation::next("r1"))
        .await
        .expect("take failed")
        .expect("taken");
    let stopped = CancellationToken::new();
    stopped.cancel();
    let ran = run_operation(&store, taken, "r1", &stopped, options, |_| {})
        .await
        .expect("run failed");
    assert_eq!((ran.state, ran.done), (OperationState::Interrupted, 0));
    assert!(ran
        .message
        .as_deref()
        .is_some_and(|m| m.contains("interrupted")));
    assert!(Admin::take_operation(&store, &TakeOperation::next("r2"))
        .await
        .expect("take failed")
        .is_none());
    let resumed = Admin::take_operation(&store, &TakeOperation::id("r2", resumable.id))
        .await
        .expect("take failed")
        .expect("resumed by id");
    let ran = run_operation(&store, resumed, "r2", &go, options, |_| {})
        .await
        .expect("run failed");
    assert_eq!((ran.state, ran.done), (OperationState::Done, 5));

    // Read back newest first, by state, and refused when bad.
    let all = Admin::operations(&store, &OperationParams::newest(10))
        .await
        .expect("read failed");
    let ids: Vec<i64> = all.iter().map(|op| op.id).collect();
    assert_eq!(ids, vec![resumable.id, cancel.id, doomed.id, first.id]);
    let aborted = Admin::operations(
        &store,
        &OperationParams::newest(10).states([OperationState::Aborted]),
    )
    .await
    .expect("read failed");
    assert_eq!(aborted.len(), 1);
    assert_eq!(aborted[0].id, doomed.id);
    assert!(Admin::operation(&store, i64::MAX)
        .await
        .expect("read failed")
        .is_none());
    let refused = Admin::create_operation(&store, &new(OperationAction::Delete, 1).batch(0)).await;
    assert!(
        matches!(refused, Err(StoreError::Refused(_))),
        "{refused:?}"
    );

    // Ended operations are removed once old enough; open ones stay.
    let open = Admin::create_operation(&store, &new(OperationAction::Delete, 1))
        .await
        .expect("create failed");
    let kept = Admin::prune_operations(&store, Duration::from_secs(3600))
        .await
        .expect("prune failed");
    assert_eq!(kept, 0, "none ended an hour ago");
    tokio::time::sleep(Duration::from_millis(5)).await;
    let removed = Admin::prune_operations(&store, Duration::ZERO)
        .await
        .expect("prune failed");
    assert_eq!(removed, 4, "the four that ended");
    let left: Vec<i64> = Admin::operations(&store, &OperationParams::newest(10))
        .await
        .expect("read failed")
        .iter()
        .map(|op| op.id)
        .collect();
    assert_eq!(left, vec![open.id], "the pending one stays");
    let far = Admin::prune_operations(&store, Duration::MAX)
        .await
        .expect("a very long age is no error");
    assert_eq!(far, 0);
}

/// A kind's limits hold in claims: no more of its jobs running at once
/// than its concurrency limit (a slot frees when one ends), no more
/// started than its rate allows (a burst at first, then as tokens come, by
/// the claims' time), other kinds claimed as usual; cleared, they no
/// longer hold. Limits no store could hold are refused.
pub async fn claims_hold_a_kinds_limits<H: Harness>(h: &H) {
    use crate::limits::KindLimits;
    let store = h.store().await;
    let t = t0();
    let kinds_of = |claimed: &[Claimed<H::Store>]| {
        let mut kinds: Vec<String> = claimed
            .iter()
            .map(|c| match &c.record {
                Ok(record) => crate::job::JobRecord::kind(record).to_owned(),
                Err(e) => panic!("undecodable: {e}"),
            })
            .collect();
        kinds.sort();
        kinds
    };
    let set = |kind: &'static str, limits: KindLimits| {
        let store = &store;
        async move {
            Admin::set_limits(store, kind, &limits, "alice")
                .await
                .expect("set_limits failed")
        }
    };
    let set_slow = set("slow", KindLimits::default().max_running(2)).await;
    assert!(set_slow.is_some_and(|l| l.limits.max_running == Some(2) && l.set_by == "alice"));
    for n in 0..5 {
        h.enqueue(&store, NewJob::new("slow", serde_json::json!(n)))
            .await;
    }
    for n in 0..2 {
        h.enqueue(&store, NewJob::new("fast", serde_json::json!(n)))
            .await;
    }
    let first = claim::<H>(&store, 10, t).await;
    assert_eq!(
        kinds_of(&first),
        vec!["fast", "fast", "slow", "slow"],
        "two slow jobs at most, the others as usual"
    );
    assert!(
        claim::<H>(&store, 10, at(t, 1)).await.is_empty(),
        "no slot left"
    );
    let mut first = first.into_iter();
    let one_slow = first
        .find(|c| {
            c.record
                .as_ref()
                .is_ok_and(|r| crate::job::JobRecord::kind(r) == "slow")
        })
        .expect("a slow job");
    end::<H>(&store, one_slow, Transition::Complete, at(t, 2)).await;
    assert_eq!(
        kinds_of(&claim::<H>(&store, 10, at(t, 3)).await),
        vec!["slow"],
        "a finished job frees its slot"
    );
    assert!(
        set("slow", KindLimits::default()).await.is_none(),
        "cleared"
    );
    assert_eq!(
        kinds_of(&claim::<H>(&store, 10, at(t, 4)).await),
        vec!["slow", "slow"],
        "cleared, the limit no longer holds"
    );

    set("paced", KindLimits::default().per_second(2.0, Some(3))).await;
    for n in 0..12 {
        h.enqueue(&store, NewJob::new("paced", serde_json::json!(n)))
            .await;
    }
    let mut counts = Vec::new();
    for ms in [10_000, 10_000, 11_000, 11_500, 30_000] {
        let now = t + TimeDelta::milliseconds(ms);
        counts.push(claim::<H>(&store, 10, now).await.len());
    }
    assert_eq!(
        counts,
        vec![3, 0, 2, 1, 3],
        "a burst of 3, then 2 a second, never more than the burst"
    );
    let limits = Admin::limits(&store).await.expect("limits failed");
    let kinds: Vec<&str> = limits.iter().map(|l| l.kind.as_str()).collect();
    assert_eq!(kinds, vec!["paced"]);
    for bad in [
        KindLimits::default().max_running(0),
        KindLimits::default().per_second(0.0, None),
        KindLimits::default().per_second(f64::NAN, None),
        KindLimits::default().per_second(5.0, Some(0)),
    ] {
        let refused = Admin::set_limits(&store, "paced", &bad, "alice").await;
        assert!(
            matches!(refused, Err(StoreError::Refused(_))),
            "{bad:?}: {refused:?}"
        );
    }
}

/// Force-fail ends a running job and a waiting one at once with the
/// operator's reason; the running attempt is fenced out: its completion,
/// heartbeat and log entry are stale, and the job stays failed. A finished
/// job is left alone.
pub async fn admin_force_fail_fences_the_running_attempt_out<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    let running = h
        .enqueue(&store, NewJob::new("k", serde_json::json!(1)))
        .await;
    let claimed = claim::<H>(&store, 1, t).await.pop().expect("one job");
    let waiting = h
        .enqueue(&store, NewJob::new("k", serde_json::json!(2)))
        .await;
    let done = h
        .enqueue(&store, NewJob::new("k", serde_json::json!(3)))
        .await;
    let finished = claim::<H>(&store, 2, at(t, 1)).await;
    let mut finished_id = None;
    for c in finished {
        if c.lease.id == done {
            finished_id = Some(c.lease.id.clone());
            end::<H>(&store, c, Transition::Complete, at(t, 2)).await;
        } else {
            // The waiting job was claimed too: give it back.
            end::<H>(&store, c, Transition::Release, at(t, 2)).await;
        }
    }
    assert_eq!(finished_id.as_ref(), Some(&done));
    let report = Admin::force_fail(
        &store,
        &Targets::Ids(vec![running.clone(), waiting.clone(), done.clone()]),
        "stuck on a dead socket",
    )
    .await
    .expect("force_fail failed");
    assert_eq!((report.changed, report.stop_requested), (2, 0));
    assert_eq!(
        report
            .skipped
            .iter()
            .map(|s| (s.id.clone(), s.state))
            .collect::<Vec<_>>(),
        vec![(done.clone(), Some(JobState::Completed))],
        "a finished job is not failed"
    );
    for id in [&running, &waiting] {
        let view = Admin::get(&store, id)
            .await
            .expect("get failed")
            .expect("there");
        assert_eq!(view.state, Some(JobState::Failed), "{id}");
        assert!(
            view.failure_message
                .as_deref()
                .is_some_and(|m| m.contains("stuck on a dead socket")),
            "the operator's reason: {view:?}"
        );
        assert!(view.finished_at.is_some(), "a finish time: {view:?}");
    }
    let lease = claimed.lease.clone();
    let heartbeat = store
        .heartbeat(std::slice::from_ref(&lease), at(t, 3))
        .await
        .expect("heartbeat failed");
    assert_eq!(heartbeat.gone, vec![running.clone()], "the worker is told");
    let late_log = store
        .append_log(&lease, LogEntry::new("step", at(t, 3), "still here"))
        .await
        .expect("append_log failed");
    assert!(
        matches!(late_log, WriteResult::Stale | WriteResult::NotKept),
        "{late_log:?}"
    );
    let (_, late) = finish::<H>(&store, claimed, Transition::Complete, at(t, 4)).await;
    assert_eq!(late, WriteResult::Stale, "the fenced attempt's completion");
    let view = Admin::get(&store, &running)
        .await
        .expect("get failed")
        .expect("there");
    assert_eq!(view.state, Some(JobState::Failed), "not resurrected");
}

/// A paused kind's jobs are not claimed while other kinds' are; they keep
/// their state and lose no attempt. `stats` and `paused` say who paused it
/// and since when; pausing it again keeps the first pause; an empty kind
/// is refused. Resumed, its jobs are claimed again, in their old order.
pub async fn admin_pause_holds_a_kind_until_resumed<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    let first_mail = h
        .enqueue(&store, NewJob::new("mail", serde_json::json!(1)))
        .await;
    let report = h
        .enqueue(&store, NewJob::new("report", serde_json::json!(2)))
        .await;
    let second_mail = h
        .enqueue(&store, NewJob::new("mail", serde_json::json!(3)))
        .await;
    let pause = Admin::pause(&store, "mail", "alice")
        .await
        .expect("pause failed");
    assert_eq!((pause.kind.as_str(), pause.by.as_str()), ("mail", "alice"));
    let again = Admin::pause(&store, "mail", "bob")
        .await
        .expect("a second pause failed");
    assert_eq!(again, pause, "a second pause keeps the first");
    let refused = Admin::pause(&store, "", "alice").await;
    assert!(
        matches!(refused, Err(StoreError::Refused(_))),
        "an empty kind: {refused:?}"
    );

    let claimed = claim::<H>(&store, 10, t).await;
    assert_eq!(
        claimed
            .iter()
            .map(|c| c.lease.id.clone())
            .collect::<Vec<_>>(),
        vec![report.clone()],
        "only the kind that is not paused"
    );
    for c in claimed {
        end::<H>(&store, c, Transition::Complete, at(t, 1)).await;
    }
    for id in [&first_mail, &second_mail] {
        let view = Admin::get(&store, id)
            .await
            .expect("get failed")
            .expect("there");
        assert_eq!(view.state, Some(JobState::Queued), "{view:?}");
        assert!(view.started_at.is_none(), "never started: {view:?}");
        assert_eq!(view.num_failures.unwrap_or(0), 0, "{view:?}");
    }
    let stats = Admin::stats(&store, StatsParams::new(at(t, 2), at(t, -60)))
        .await
        .expect("stats failed");
    assert_eq!(stats.paused, vec![pause.clone()], "stats show the pause");
    assert_eq!(stats.total(JobState::Queued), 2, "{stats:?}");
    assert_eq!(
        Admin::paused(&store).await.expect("paused failed"),
        vec![pause.clone()]
    );

    let ended = Admin::resume(&store, "mail").await.expect("resume failed");
    assert_eq!(ended, Some(pause), "the pause that ended");
    let again = Admin::resume(&store, "mail").await.expect("resume failed");
    assert_eq!(again, None, "not paused any more");
    assert!(Admin::paused(&store)
        .await
        .expect("paused failed")
        .is_empty());
    let claimed = claim::<H>(&store, 10, at(t, 3)).await;
    assert_eq!(
        claimed
            .iter()
            .map(|c| c.lease.id.clone())
            .collect::<Vec<_>>(),
        vec![first_mail, second_mail],
        "claimed again, in their order"
    );
}

/// The audit log keeps each entry as appended, alone or several at once
/// (in their order; none is a no-op), at the store's time, and reads
/// newest first: a page, the page before an id, one actor's.
pub async fn admin_audit_log_reads_newest_first<H: Harness>(h: &H) {
    let store = h.store().await;
    let entries = [
        ("alice", "pause", serde_json::json!({"kind": "mail"}), true),
        (
            "bob",
            "retry",
            serde_json::json!({"filter": {"kinds": ["mail"]}}),
            true,
        ),
        ("alice", "delete", serde_json::json!({"ids": ["7"]}), false),
    ];
    let entries: Vec<NewAuditEntry> = entries
        .iter()
        .map(|(actor, action, target, ok)| {
            let outcome = if *ok {
                "done"
            } else {
                "job 7 was not deleted: it is gone"
            };
            NewAuditEntry::new(*actor, *action, target.clone(), *ok, outcome)
        })
        .collect();
    // One entry alone, then two in one append: a batch keeps its order.
    for batch in [&entries[..1], &entries[1..], &[]] {
        Admin::append_audit(&store, batch)
            .await
            .expect("append_audit failed");
    }
    let all = Admin::audit(&store, &AuditParams::newest(10))
        .await
        .expect("audit failed");
    assert_eq!(
        all.iter()
            .map(|e| (e.entry.actor.as_str(), e.entry.action.as_str(), e.entry.ok))
            .collect::<Vec<_>>(),
        vec![
            ("alice", "delete", false),
            ("bob", "retry", true),
            ("alice", "pause", true)
        ],
        "newest first"
    );
    assert_eq!(
        all[1].entry.target, entries[1].target,
        "the target as given"
    );
    assert_eq!(all[0].entry.outcome, "job 7 was not deleted: it is gone");
    assert!(all[0].id > all[1].id && all[1].id > all[2].id, "{all:?}");
    assert!(all[0].at >= all[2].at, "the store's time, in order");
    let page = Admin::audit(&store, &AuditParams::newest(1).before(Some(all[0].id)))
        .await
        .expect("audit failed");
    assert_eq!(page, vec![all[1].clone()], "the page before the newest");
    let alice = Admin::audit(&store, &AuditParams::newest(10).actor(Some("alice".into())))
        .await
        .expect("audit failed");
    assert_eq!(alice, vec![all[0].clone(), all[2].clone()], "one actor's");
}

/// The worker registry keeps each worker's last beat by name, at the
/// store's time, and lists those seen since a time: a worker that stopped
/// beating ages out, and one that left is gone at once.
pub async fn workers_beat_into_the_registry_and_age_out<H: Harness>(h: &H) {
    let store = h.store().await;
    let beat = |name: &str, in_flight| {
        crate::WorkerBeat::new(name, "host-a", 41)
            .kinds(vec!["mail".into()])
            .load(4, in_flight)
    };
    store.beat(&beat("w1", 1)).await.expect("a beat");
    store.beat(&beat("w2", 0)).await.expect("a beat");
    store.beat(&beat("w1", 3)).await.expect("a second beat");
    let long_ago = Utc::now() - TimeDelta::hours(1);
    let live = Admin::workers(&store, long_ago).await.expect("workers");
    assert_eq!(
        live.iter()
            .map(|w| (w.beat.name.as_str(), w.beat.in_flight))
            .collect::<Vec<_>>(),
        vec![("w1", 3), ("w2", 0)],
        "by name, each with its last beat"
    );
    assert_eq!(live[0].beat.kinds, vec!["mail".to_owned()]);
    assert_eq!(
        (live[0].beat.host.as_str(), live[0].beat.pid),
        ("host-a", 41)
    );
    let cutoff = live.iter().map(|w| w.last_seen_at).max().expect("two") + TimeDelta::seconds(1);
    assert!(
        Admin::workers(&store, cutoff)
            .await
            .expect("workers")
            .is_empty(),
        "none beat after the cutoff: aged out"
    );
    store.leave("w1").await.expect("w1 leaves");
    let left = Admin::workers(&store, long_ago).await.expect("workers");
    assert_eq!(
        left.iter()
            .map(|w| w.beat.name.as_str())
            .collect::<Vec<_>>(),
        vec!["w2"],
        "a worker that left is gone at once"
    );
}

/// `cancel` ends waiting jobs at once, asks running ones to stop, and
/// leaves finished ones alone; a bulk cancel picks a running job only once.
pub async fn admin_cancel_ends_waiting_jobs_and_flags_running_ones<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    let p = h
        .enqueue(&store, NewJob::new("k", serde_json::json!(1)))
        .await;
    let d = h
        .enqueue(&store, NewJob::new("k", serde_json::json!(2)))
        .await;
    let mut claimed = claim::<H>(&store, 2, t).await;
    let done = claimed.pop().expect("d");
    end::<H>(&store, done, Transition::Complete, at(t, 1)).await;
    let leases = crash(h, claimed).await;
    let q = h
        .enqueue(&store, NewJob::new("k", serde_json::json!(3)))
        .await;
    let before = Utc::now();
    let report = Admin::cancel(&store, &Targets::Ids(vec![q.clone(), p.clone(), d.clone()]))
        .await
        .expect("cancel failed");
    let after = Utc::now();
    assert_eq!((report.changed, report.stop_requested), (1, 1));
    assert_eq!(
        report
            .skipped
            .iter()
            .map(|s| (s.id.clone(), s.state))
            .collect::<Vec<_>>(),
        vec![(d.clone(), Some(JobState::Completed))],
        "a finished job is not canceled"
    );
    let s = snapshot(h, &store, &q).await;
    assert_eq!(s.state, JobState::Canceled);
    assert_eq!(
        s.failure_message.as_deref(),
        Some(crate::CANCELED_BEFORE_RUN_MESSAGE)
    );
    let view = Admin::get(&store, &q)
        .await
        .expect("get failed")
        .expect("there");
    assert!(
        taken_during(view.finished_at, before, after),
        "the cancel time (the store's, between {before} and {after}) is the finish time: {:?}",
        view.finished_at
    );
    let heartbeat = store
        .heartbeat(&leases, at(t, 3))
        .await
        .expect("heartbeat failed");
    assert_eq!(
        heartbeat.cancel_requested,
        vec![p.clone()],
        "the running job's worker is told"
    );
    let again = Admin::cancel(&store, &Targets::matching(JobFilter::default(), 10))
        .await
        .expect("cancel failed");
    assert_eq!(
        (again.changed, again.stop_requested),
        (0, 0),
        "a running job already asked to stop is not picked again"
    );
}

/// `delete` removes jobs by key (reporting missing ones) and in batches by
/// filter.
pub async fn admin_delete_removes_jobs_by_key_and_in_batches<H: Harness>(h: &H) {
    let store = h.store().await;
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(
            h.enqueue(&store, NewJob::new("k", serde_json::json!(n)))
                .await,
        );
    }
    let keep = h
        .enqueue(&store, NewJob::new("other", serde_json::json!(0)))
        .await;
    let gone = missing_id(h, &store).await;
    let report = Admin::delete(&store, &Targets::Ids(vec![ids[0].clone(), gone.clone()]))
        .await
        .expect("delete failed");
    assert_eq!(report.changed, 1);
    assert_eq!(report.skipped.len(), 1);
    assert_eq!(
        (
            report.skipped[0].id.clone(),
            report.skipped[0].stored_state.clone()
        ),
        (gone, None)
    );
    assert!(h.inspect(&store, &ids[0]).await.is_none());
    let targets = Targets::matching(JobFilter::default().kinds(["k"]), 3);
    let mut batches = Vec::new();
    for _ in 0..3 {
        batches.push(
            Admin::delete(&store, &targets)
                .await
                .expect("delete failed")
                .changed,
        );
    }
    assert_eq!(batches, vec![3, 1, 0]);
    assert!(
        h.inspect(&store, &keep).await.is_some(),
        "jobs outside the filter stay"
    );
}

/// `purge` deletes finished jobs of the given states that finished before
/// the cut-off, in batches, and refuses unfinished states.
pub async fn admin_purge_deletes_old_finished_jobs_in_batches<H: Harness>(h: &H) {
    let store = h.store().await;
    let claimed_at = t0();
    let t = purge_now(claimed_at);
    let mut ids = Vec::new();
    for n in 0..6 {
        ids.push(
            h.enqueue(&store, NewJob::new("k", serde_json::json!(n)))
                .await,
        );
    }
    let queued = h
        .enqueue(&store, NewJob::new("k", serde_json::json!("waits")))
        .await;
    let mut claimed = claim::<H>(&store, 6, claimed_at).await;
    let old_failed = claimed.pop().expect("6th");
    end::<H>(&store, old_failed, fail("x"), at(t, -7200)).await;
    let recent = claimed.pop().expect("5th");
    end::<H>(&store, recent, Transition::Complete, t).await;
    for c in claimed {
        end::<H>(&store, c, Transition::Complete, at(t, -7200)).await;
    }
    let params = |states: Vec<JobState>| PurgeParams::new(states, at(t, -3600), 2);
    let refused = Admin::purge(&store, &params(vec![JobState::Completed, JobState::Queued])).await;
    assert!(
        matches!(&refused, Err(crate::StoreError::Refused(m)) if m.contains("queued")),
        "unfinished states cannot be purged: {refused:?}"
    );
    // Each call from where the last stopped, where the store says.
    let mut batches = Vec::new();
    let mut from = None;
    for _ in 0..3 {
        let report = Admin::purge(&store, &params(vec![JobState::Completed]).from(from))
            .await
            .expect("purge failed");
        if let Some(last) = report.last_finished {
            assert_eq!(last, at(t, -7200), "the latest finish time purged");
        }
        from = report.last_finished.or(from);
        batches.push(report.purged);
    }
    assert_eq!(
        batches,
        vec![2, 2, 0],
        "four old completed jobs, two per call"
    );
    assert_eq!(
        snapshot(h, &store, &ids[4]).await.state,
        JobState::Completed,
        "a recent one stays"
    );
    assert_eq!(
        snapshot(h, &store, &ids[5]).await.state,
        JobState::Failed,
        "other states stay"
    );
    assert_eq!(snapshot(h, &store, &queued).await.state, JobState::Queued);
    assert_eq!(
        Admin::purge(&store, &params(vec![JobState::Failed]))
            .await
            .expect("purge failed")
            .purged,
        1
    );
}

/// `prune` removes, state by state and in batches, the finished jobs older
/// than their state's age, and keeps states without one, recent jobs and
/// unfinished ones.
pub async fn prune_removes_finished_jobs_past_their_states_age<H: Harness>(h: &H) {
    let store = h.store().await;
    let claimed_at = t0();
    let t = purge_now(claimed_at);
    for n in 0..7 {
        h.enqueue(&store, NewJob::new("k", serde_json::json!(n)))
            .await;
    }
    let queued = h
        .enqueue(&store, NewJob::new("k", serde_json::json!("waits")))
        .await;
    let mut claimed = claim::<H>(&store, 7, claimed_at).await;
    let mut ended = |n: usize| claimed.drain(..n).collect::<Vec<_>>();
    let (old_completed, recent, old_failed, old_canceled) =
        (ended(3), ended(1), ended(2), ended(1));
    let recent_id = recent[0].lease.id.clone();
    let failed_id = old_failed[0].lease.id.clone();
    for c in old_completed {
        end::<H>(&store, c, Transition::Complete, at(t, -7200)).await;
    }
    for c in recent {
        end::<H>(&store, c, Transition::Complete, at(t, -60)).await;
    }
    for c in old_failed {
        end::<H>(&store, c, fail("x"), at(t, -7200)).await;
    }
    let cancel = Transition::Cancel {
        message: "stop".into(),
    };
    for c in old_canceled {
        end::<H>(&store, c, cancel.clone(), at(t, -7200)).await;
    }
    let hour = std::time::Duration::from_secs(3600);
    let retention = Retention {
        completed: Some(hour),
        failed: None,
        canceled: Some(hour),
        batch: 2,
        pause: std::time::Duration::ZERO,
    };
    let mut batches = Vec::new();
    let report = prune(&store, &retention, t, |state, n| batches.push((state, n)))
        .await
        .expect("prune failed");
    assert_eq!(
        batches,
        vec![
            (JobState::Completed, 2),
            (JobState::Completed, 1),
            (JobState::Canceled, 1)
        ],
        "two per batch, until a batch comes back short"
    );
    assert_eq!(
        report.removed,
        vec![(JobState::Completed, 3), (JobState::Canceled, 1)]
    );
    assert_eq!((report.total(), report.batches), (4, 3));
    assert_eq!(
        snapshot(h, &store, &recent_id).await.state,
        JobState::Completed
    );
    assert_eq!(
        snapshot(h, &store, &failed_id).await.state,
        JobState::Failed
    );
    assert_eq!(snapshot(h, &store, &queued).await.state, JobState::Queued);
    let again = prune(&store, &retention, t, |_, _| {})
        .await
        .expect("prune");
    assert_eq!(again.total(), 0, "nothing left to remove");
    let refused = prune(
        &store,
        &Retention {
            batch: 0,
            ..retention
        },
        t,
        |_, _| {},
    )
    .await;
    assert!(
        matches!(refused, Err(crate::StoreError::Config(_))),
        "{refused:?}"
    );
}

/// `finished_timeline` counts the jobs that finished in each interval by
/// end state, leaves out those that finished outside the intervals and
/// those still running, and returns every interval, empty ones too.
pub async fn admin_timeline_counts_finished_jobs_per_interval<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    for n in 0..6 {
        h.enqueue(&store, NewJob::new("k", serde_json::json!(n)))
            .await;
    }
    let mut claimed = claim::<H>(&store, 6, at(t, -600)).await;
    assert_eq!(claimed.len(), 6);
    let running = claimed.pop().expect("6th");
    let long_ago = claimed.pop().expect("5th");
    end::<H>(&store, long_ago, Transition::Complete, at(t, -3600)).await;
    let failed = claimed.pop().expect("4th");
    end::<H>(&store, failed, fail("x"), at(t, -90)).await;
    for (c, seconds) in claimed.into_iter().zip([-150, -130, -10]) {
        end::<H>(&store, c, Transition::Complete, at(t, seconds)).await;
    }
    let params = crate::TimelineParams::ending(t, chrono::TimeDelta::minutes(1), 3);
    let Some(buckets) = Admin::finished_timeline(&store, &params)
        .await
        .expect("timeline failed")
    else {
        panic!("a store with finish times has a timeline");
    };
    let counts: Vec<(i64, u64, u64, u64)> = buckets
        .iter()
        .map(|b| {
            (
                (b.start - t).num_seconds(),
                b.completed,
                b.failed,
                b.canceled,
            )
        })
        .collect();
    assert_eq!(
        counts,
        vec![(-180, 2, 0, 0), (-120, 0, 1, 0), (-60, 1, 0, 0)],
        "per minute: two completions, then a failure, then a completion; the \
         hour-old completion and the running job are not counted"
    );
    let by_kind: Vec<Option<u64>> = buckets
        .iter()
        .map(|b| b.completed_by_kind.get("k").copied())
        .collect();
    assert_eq!(
        by_kind,
        vec![Some(2), None, Some(1)],
        "completions are counted per kind too"
    );
    drop(running);
}

/// `enqueue` through the admin contract returns the keys of claimable jobs.
pub async fn admin_enqueue_adds_claimable_jobs<H: Harness>(h: &H) {
    let store = h.store().await;
    let keys = Admin::enqueue(
        &store,
        &[
            NewJob::new("k", serde_json::json!(1)),
            NewJob::new("k", serde_json::json!(2)).priority(9),
            NewJob::new("k", serde_json::json!(3)).process_after(at(t0(), 3600)),
        ],
    )
    .await
    .expect("enqueue failed");
    assert_eq!(keys.len(), 3);
    assert!(
        keys.iter().all(|k| k.inserted),
        "jobs without keys are all added"
    );
    let keys: Vec<IdOf<H>> = keys.into_iter().map(|k| k.id).collect();
    let claimed = claim::<H>(&store, 10, t0()).await;
    assert_eq!(
        ids::<H>(&claimed),
        vec![keys[1].clone(), keys[0].clone()],
        "by priority; the scheduled job waits"
    );
}

/// A unique key keeps a second job out while the first is in scope:
/// active jobs hold their key until they finish, `Forever` ones until they
/// are deleted; a batch reports each job, later duplicates included.
pub async fn admin_unique_keys_hold_while_in_scope<H: Harness>(h: &H) {
    use crate::UniqueScope::{Active, Forever};
    let store = h.store().await;
    let t = t0();
    let job = |n: i32| NewJob::new("k", serde_json::json!(n));
    let enqueue = |jobs: Vec<NewJob>| {
        let store = &store;
        async move {
            Admin::enqueue(store, &jobs)
                .await
                .expect("enqueue failed")
                .into_iter()
                .map(|e| (e.id, e.inserted))
                .collect::<Vec<_>>()
        }
    };
    let first = enqueue(vec![job(1).unique("a", Active)]).await;
    assert!(first[0].1, "the first job with key a is added");
    let a = first[0].0.clone();
    assert_eq!(
        enqueue(vec![job(2).unique("a", Active)]).await,
        vec![(a.clone(), false)],
        "a second job with key a is not added; the holder is reported"
    );
    let batch = enqueue(vec![
        job(3).unique("b", Active),
        job(4).unique("a", Active),
        job(5),
        job(6).unique("b", Active),
    ])
    .await;
    let b = batch[0].0.clone();
    assert_eq!(
        batch
            .iter()
            .map(|(_, inserted)| *inserted)
            .collect::<Vec<_>>(),
        [true, false, true, false],
        "each job of a batch is reported"
    );
    assert_eq!(
        (&batch[1].0, &batch[3].0),
        (&a, &b),
        "held by a, then by the batch's own b"
    );
    if !h.holds_keys_forever() {
        let refused = Admin::enqueue(&store, &[job(7).unique("f", Forever)]).await;
        assert!(
            matches!(refused, Err(StoreError::Refused(_))),
            "a store that cannot hold a key for ever refuses to, naming why: {refused:?}"
        );
        for c in claim::<H>(&store, 10, t).await {
            end::<H>(&store, c, Transition::Complete, t).await;
        }
        let again = enqueue(vec![job(8).unique("a", Active)]).await;
        assert!(again[0].1, "a finished job no longer holds an active key");
        assert_ne!(again[0].0, a);
        return;
    }
    let forever = enqueue(vec![job(7).unique("f", Forever)]).await[0].clone();
    assert!(forever.1);
    // Finish every job: active keys come free, a forever key does not.
    for c in claim::<H>(&store, 10, t).await {
        end::<H>(&store, c, Transition::Complete, t).await;
    }
    let again = enqueue(vec![job(8).unique("a", Active), job(9).unique("f", Active)]).await;
    assert!(again[0].1, "a finished job no longer holds an active key");
    assert_ne!(again[0].0, a);
    assert_eq!(
        again[1],
        (forever.0.clone(), false),
        "a forever key outlives its job's run"
    );
    h.delete(&store, &forever.0).await;
    assert!(
        enqueue(vec![job(10).unique("f", Forever)]).await[0].1,
        "a deleted job holds nothing"
    );
}

/// A retry passes over a job whose unique key another job holds, by key
/// and in bulk, and of two failed jobs sharing a key retries one.
pub async fn admin_retry_passes_over_jobs_whose_key_is_held<H: Harness>(h: &H) {
    use crate::UniqueScope::Active;
    let store = h.store().await;
    let t = t0();
    let keyed = |key: &str| NewJob::new("k", serde_json::json!(key)).unique(key, Active);
    // Two jobs with key m fail one after the other; one with key k fails and
    // a new job takes k.
    let mut failed = Vec::new();
    for key in ["k", "m", "m"] {
        let id = h.enqueue(&store, keyed(key)).await;
        let c = claim::<H>(&store, 1, t).await.pop().expect("the job");
        end::<H>(&store, c, fail("x"), t).await;
        failed.push(id);
    }
    let holder = h.enqueue(&store, keyed("k")).await;
    let by_key = Admin::retry(
        &store,
        &Targets::id(failed[0].clone()),
        RetryParams::default(),
    )
    .await
    .expect("retry failed");
    assert_eq!(by_key.changed, 0, "job k's key is held by a newer job");
    assert_eq!(by_key.skipped.len(), 1);
    assert_eq!(
        by_key.skipped[0].reason,
        crate::SkipReason::KeyHeld,
        "the skip says the key is held, not that the job is failed"
    );
    let bulk = Admin::retry(
        &store,
        &Targets::matching(JobFilter::default().states([JobState::Failed]), 10),
        RetryParams::default(),
    )
    .await
    .expect("bulk retry failed");
    assert_eq!(bulk.changed, 1, "one of the two m jobs; not the k job");
    let mut states = Vec::new();
    for id in [&failed[1], &failed[2]] {
        states.push(snapshot(h, &store, id).await.state);
    }
    assert_eq!(
        states.iter().filter(|s| **s == JobState::Queued).count(),
        1,
        "exactly one m job queued again: {states:?}"
    );
    assert_eq!(
        snapshot(h, &store, &failed[0]).await.state,
        JobState::Failed
    );
    assert_eq!(snapshot(h, &store, &holder).await.state, JobState::Queued);

    // Two failed jobs with one key, retried by key in one call: the first
    // takes the key, the second is skipped because the first holds it.
    let store = h.store().await;
    let mut twins = Vec::new();
    for _ in 0..2 {
        let id = h.enqueue(&store, keyed("n")).await;
        let c = claim::<H>(&store, 1, t).await.pop().expect("the job");
        end::<H>(&store, c, fail("x"), t).await;
        twins.push(id);
    }
    let both = Admin::retry(&store, &Targets::Ids(twins.clone()), RetryParams::default())
        .await
        .expect("retry failed");
    assert_eq!(both.changed, 1, "one job per key");
    assert_eq!(
        both.skipped
            .iter()
            .map(|s| (s.id.clone(), s.reason))
            .collect::<Vec<_>>(),
        vec![(twins[1].clone(), crate::SkipReason::KeyHeld)],
        "the second twin, because the first holds the key"
    );
    assert_eq!(snapshot(h, &store, &twins[0]).await.state, JobState::Queued);
}

/// A retried job that had expired runs: the retry clears the expiry that
/// had passed (the next sweep would fail it again), and keeps one still
/// ahead.
pub async fn admin_retry_makes_an_expired_job_runnable<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    let expired = h
        .enqueue(
            &store,
            NewJob::new("k", serde_json::json!("late")).expires_at(at(t, -1)),
        )
        .await;
    assert_eq!(
        store.expire(t, 10).await.expect("the sweep"),
        vec![expired.clone()]
    );
    assert_eq!(snapshot(h, &store, &expired).await.state, JobState::Failed);
    let retried = Admin::retry(
        &store,
        &Targets::id(expired.clone()),
        RetryParams::default(),
    )
    .await
    .expect("retry failed");
    assert_eq!(retried.changed, 1);
    let view = Admin::get(&store, &expired)
        .await
        .expect("get failed")
        .expect("the job");
    assert_eq!(view.expires_at, None, "the passed expiry is cleared");
    assert!(
        store
            .expire(at(t, 1), 10)
            .await
            .expect("the sweep")
            .is_empty(),
        "the next sweep leaves the retried job alone"
    );
    let claimed = ids::<H>(&claim::<H>(&store, 10, Utc::now()).await);
    assert_eq!(claimed, vec![expired], "the retried job runs");

    // A job canceled before its expiry keeps it when retried.
    let ahead = h
        .enqueue(
            &store,
            NewJob::new("k", serde_json::json!("ahead")).expires_at(at(t, 3600)),
        )
        .await;
    Admin::cancel(&store, &Targets::id(ahead.clone()))
        .await
        .expect("cancel failed");
    Admin::retry(&store, &Targets::id(ahead.clone()), RetryParams::default())
        .await
        .expect("retry failed");
    let view = Admin::get(&store, &ahead)
        .await
        .expect("get failed")
        .expect("the job");
    assert_eq!(
        view.expires_at,
        Some(at(t, 3600)),
        "an expiry still ahead stays"
    );
}

/// Lists find the job meant by what its payload contains, by its unique
/// key, and by the worker that claimed it.
pub async fn admin_list_finds_jobs_by_payload_key_and_worker<H: Harness>(h: &H) {
    use serde_json::json;
    let store = h.store().await;
    let t = t0();
    let pro = h
        .enqueue(
            &store,
            NewJob::new(
                "bill",
                json!({"customer": 42, "plan": "pro", "tags": ["eu", "vip"]}),
            ),
        )
        .await;
    let other = h
        .enqueue(
            &store,
            NewJob::new("bill", json!({"customer": 7, "plan": "pro"})),
        )
        .await;
    let keyed = h
        .enqueue(
            &store,
            NewJob::new("bill", json!({"customer": 9}))
                .unique("invoice:9", crate::UniqueScope::Active),
        )
        .await;
    let ids_of = |filter: JobFilter| {
        let store = &store;
        async move {
            let mut ids: Vec<IdOf<H>> = Admin::list(store, &ListParams::first(filter, 10))
                .await
                .expect("list failed")
                .jobs
                .into_iter()
                .map(|j| j.id)
                .collect();
            ids.sort_by_key(|id| id.to_string());
            ids
        }
    };
    let sorted = |mut ids: Vec<IdOf<H>>| {
        ids.sort_by_key(|id| id.to_string());
        ids
    };
    assert_eq!(
        ids_of(JobFilter::default().payload_contains(json!({"customer": 42}))).await,
        vec![pro.clone()]
    );
    assert_eq!(
        ids_of(JobFilter::default().payload_contains(json!({"plan": "pro"}))).await,
        sorted(vec![pro.clone(), other.clone()])
    );
    assert_eq!(
        ids_of(JobFilter::default().payload_contains(json!({"tags": ["vip"]}))).await,
        vec![pro.clone()]
    );
    assert!(
        ids_of(JobFilter::default().payload_contains(json!({"customer": "42"})))
            .await
            .is_empty()
    );
    assert_eq!(
        ids_of(JobFilter::default().unique_key("invoice:9")).await,
        vec![keyed.clone()]
    );
    let claimed = ids::<H>(&claim::<H>(&store, 1, t).await);
    assert_eq!(ids_of(JobFilter::default().worker(WORKER)).await, claimed);
    assert!(ids_of(JobFilter::default().worker("elsewhere"))
        .await
        .is_empty());
    // Running since before a time after its claim; not since before one
    // before it.
    assert_eq!(
        ids_of(JobFilter::default().running_since_before(at(t, 60))).await,
        claimed
    );
    assert!(
        ids_of(JobFilter::default().running_since_before(at(t, -60)))
            .await
            .is_empty()
    );
    assert_eq!(
        Admin::count(
            &store,
            &JobFilter::default().payload_contains(json!({"plan": "pro"}))
        )
        .await
        .expect("count failed"),
        2
    );
}

/// `reset` resets stalled jobs once, as the resetter does.
pub async fn admin_reset_resets_stalled_jobs_once<H: Harness>(h: &H) {
    let store = h.store().await;
    let t = t0();
    let id = h
        .enqueue(&store, NewJob::new("k", serde_json::json!(null)))
        .await;
    crash(h, claim::<H>(&store, 1, t).await).await;
    let report = Admin::reset(
        &store,
        ResetParams {
            stalled_before: at(t, 10),
            max_resets: 3,
            delivery: Delivery::AtLeastOnce,
            now: at(t, 10),
        },
    )
    .await
    .expect("reset failed");
    assert_eq!(report.reset, vec![id.clone()]);
    assert_eq!(snapshot(h, &store, &id).await.state, JobState::Queued);
}

/// Expands to one `#[tokio::test]` per conformance case, each calling the
/// case with a harness built by the given expression.
#[macro_export]
macro_rules! conformance_tests {
    ($harness:expr) => {
        $crate::conformance_tests!(@cases $harness;
            claim_marks_jobs_processing,
            claim_respects_limit_and_priority,
            concurrent_claims_never_share_a_job,
            claim_skips_jobs_scheduled_later,
            due_jobs_join_the_claim_order,
            claim_honours_extra_conditions,
            complete_applies_once,
            errored_job_is_retried_after_its_time,
            a_jobs_times_follow_its_state,
            failed_and_canceled_jobs_are_final,
            cancelling_a_queued_job_cancels_it,
            heartbeat_reports_cancelled_and_gone_jobs,
            append_log_appends_in_order,
            reset_requeues_stalled_jobs,
            reset_fails_jobs_past_max_resets,
            at_most_once_fails_stalled_jobs,
            a_jobs_limits_come_with_its_lease,
            expired_jobs_are_skipped_then_failed,
            an_at_most_once_job_fails_when_stalled,
            stale_lease_cannot_write,
            release_requeues_without_counting,
            finish_again_is_guarded_like_finish,
            next_due_is_the_earliest_waiting_time_ahead,
            deleted_job_writes_are_stale,
            admin_get_shows_a_job_as_stored,
            admin_list_filters_and_pages_by_key,
            admin_list_of_a_kind_spans_every_state,
            admin_stats_count_states_and_kinds,
            admin_retry_requeues_failed_errored_and_canceled_jobs,
            admin_bulk_retry_works_in_batches,
            admin_operations_run_in_batches_abort_and_resume,
            admin_cancel_ends_waiting_jobs_and_flags_running_ones,
            admin_force_fail_fences_the_running_attempt_out,
            admin_pause_holds_a_kind_until_resumed,
            claims_hold_a_kinds_limits,
            admin_audit_log_reads_newest_first,
            workers_beat_into_the_registry_and_age_out,
            admin_delete_removes_jobs_by_key_and_in_batches,
            admin_purge_deletes_old_finished_jobs_in_batches,
            prune_removes_finished_jobs_past_their_states_age,
            admin_enqueue_adds_claimable_jobs,
            admin_unique_keys_hold_while_in_scope,
            admin_retry_passes_over_jobs_whose_key_is_held,
            admin_retry_makes_an_expired_job_runnable,
            admin_timeline_counts_finished_jobs_per_interval,
            admin_list_finds_jobs_by_payload_key_and_worker,
            admin_reset_resets_stalled_jobs_once
        );
    };
    (@cases $harness:expr; $($case:ident),* $(,)?) => {
        $(
            #[::tokio::test]
            async fn $case() {
                let harness = $harness;
                $crate::testkit::conformance::$case(&harness).await;
            }
        )*
    };
}
