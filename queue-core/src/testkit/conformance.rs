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

use crate::job::{JobState, Lease, LogEntry, NewJob};
use crate::resetter::{Delivery, ResetParams, AT_MOST_ONCE_MESSAGE, MAX_RESETS_MESSAGE};
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
    /// Last heartbeat.
    pub last_heartbeat_at: Option<DateTime<Utc>>,
    /// Messages of the execution log, in order.
    pub log_messages: Vec<String>,
    /// Worker that claimed it last.
    pub worker_hostname: Option<String>,
}

impl From<crate::job::Job> for Snapshot {
    /// What the suite observes of a default-table [`Job`](crate::Job).
    fn from(job: crate::job::Job) -> Self {
        Snapshot {
            state: job.state,
            num_failures: u32::try_from(job.num_failures).unwrap_or(0),
            num_resets: u32::try_from(job.num_resets).unwrap_or(0),
            failure_message: job.failure_message,
            process_after: job.process_after,
            last_heartbeat_at: job.last_heartbeat_at,
            log_messages: job.execution_logs.into_iter().map(|e| e.message).collect(),
            worker_hostname: job.worker_hostname,
        }
    }
}

/// Adapts a store to the suite: creates isolated stores and performs the
/// operations that are not part of [`Store`] (enqueue, inspect, operator
/// actions).
#[async_trait]
pub trait Harness: Send + Sync + 'static {
    /// The store under test.
    type Store: Store;

    /// A fresh, empty store, isolated from every other case.
    async fn store(&self) -> Self::Store;

    /// Enqueues a job and returns its key.
    async fn enqueue(&self, store: &Self::Store, job: NewJob) -> <Self::Store as Store>::Id;

    /// What the store holds for `id`, or `None` if it is gone.
    async fn inspect(
        &self,
        store: &Self::Store,
        id: &<Self::Store as Store>::Id,
    ) -> Option<Snapshot>;

    /// An operator cancels the job: a queued or errored job becomes canceled,
    /// a processing one gets its cancel flag set.
    async fn cancel(&self, store: &Self::Store, id: &<Self::Store as Store>::Id);

    /// An operator deletes the job.
    async fn delete(&self, store: &Self::Store, id: &<Self::Store as Store>::Id);

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

type IdOf<H> = <<H as Harness>::Store as Store>::Id;

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

async fn snapshot<H: Harness>(h: &H, store: &H::Store, id: &IdOf<H>) -> Snapshot {
    h.inspect(store, id)
        .await
        .unwrap_or_else(|| panic!("job {id} vanished"))
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
        Transition::Error {
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
            Transition::Error {
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
            claim_honours_extra_conditions,
            complete_applies_once,
            errored_job_is_retried_after_its_time,
            failed_and_canceled_jobs_are_final,
            cancelling_a_queued_job_cancels_it,
            heartbeat_reports_cancelled_and_gone_jobs,
            append_log_appends_in_order,
            reset_requeues_stalled_jobs,
            reset_fails_jobs_past_max_resets,
            at_most_once_fails_stalled_jobs,
            stale_lease_cannot_write,
            release_requeues_without_counting,
            deleted_job_writes_are_stale
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
