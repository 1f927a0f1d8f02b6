//! The claim loop: waits for free slots, asks PreDequeue, sends claims off
//! (up to `concurrent_claims` at once) and starts the jobs they bring back;
//! pauses when the queue is empty, PreDequeue says not now, or a claim
//! failed.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use queue_core::{ClaimParams, Claimed, Dequeue, DequeueContext, Handler, Store, StoreError};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{panic_message, reap, start_job, JobFuture, Shared};
use crate::error::WorkerError;

/// A claim on its way: what the store answered, and the slots reserved for
/// its jobs (one permit each, held as one).
type ClaimInFlight<S> = Pin<
    Box<dyn Future<Output = (Result<Vec<Claimed<S>>, StoreError>, OwnedSemaphorePermit)> + Send>,
>;

/// Why the claim loop is not claiming for now.
enum Pause {
    /// The last claim found nothing: until the store signals new jobs, a
    /// retry this worker recorded comes due, or the poll interval passes.
    Idle(Pin<Box<dyn Future<Output = ()> + Send>>),
    /// PreDequeue said not now: until a job finishes, a claim comes back or
    /// the poll interval passes.
    NotNow(Pin<Box<tokio::time::Sleep>>),
    /// A claim failed: until a short backoff passes ([`claim_backoff`]).
    Backoff(Pin<Box<tokio::time::Sleep>>),
}

impl Pause {
    async fn over<S: Store, H>(&mut self, shared: &Shared<S, H>) {
        match self {
            Pause::Idle(wait) => {
                tokio::select! {
                    _ = wait => {}
                    _ = shared.retry_due.notified() => {}
                }
            }
            Pause::NotNow(sleep) => {
                tokio::select! {
                    _ = sleep => {}
                    _ = shared.job_finished.notified() => {}
                }
            }
            Pause::Backoff(sleep) => sleep.await,
        }
    }
}

/// Claims jobs and starts them until `shutdown`, with up to
/// `concurrent_claims` claims in flight; then settles the claims still on
/// their way, handing their jobs back.
pub(super) async fn claim_loop<S: Store, H: Handler<S>>(
    shared: &Arc<Shared<S, H>>,
    tasks: &mut JoinSet<()>,
    shutdown: &CancellationToken,
) -> Result<(), WorkerError> {
    let options = &shared.options;
    // One permit per job held: running, or prefetched and waiting.
    let slots = Arc::new(Semaphore::new(options.num_handlers + options.prefetch));
    let mut claims: FuturesUnordered<ClaimInFlight<S>> = FuturesUnordered::new();
    let mut pause: Option<Pause> = None;
    let mut result = Ok(());
    // Claims failed in a row, for the backoff.
    let mut failures: u32 = 0;

    loop {
        reap(tasks);
        let may_claim = pause.is_none() && claims.len() < options.concurrent_claims;
        // While prefetched jobs still wait for a handler there is no hurry:
        // wait for half a batch of free slots, so that claims come in
        // batches (a claim's cost is mostly per statement, not per row).
        let want = if shared.waiting.load(Ordering::Acquire) > 0 {
            (options.claim_batch_size() / 2)
                .min(options.prefetch)
                .max(1)
        } else {
            1
        };
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            Some((claimed, permits)) = claims.next(), if !claims.is_empty() => {
                match claimed {
                    Ok(jobs) => {
                        failures = 0;
                        // A claim that came back short took every job it
                        // could find: wait for news, as after an empty one,
                        // instead of asking again at once. The store's wait
                        // ends at once for a notification the claim may not
                        // have seen (`Store::wait_for_jobs`).
                        let short = jobs.len() < permits.num_permits();
                        if short {
                            if pause.is_none() {
                                let store = shared.store.clone();
                                let (poll, clock) = (options.poll_interval, options.clock.clone());
                                pause = Some(Pause::Idle(Box::pin(async move {
                                    let wait = idle_wait(&*store, &*clock, poll).await;
                                    store.wait_for_jobs(wait).await
                                })));
                            }
                        } else if matches!(pause, Some(Pause::Idle(_))) {
                            // Another claim found jobs: there may be more.
                            pause = None;
                        }
                        let started = !jobs.is_empty();
                        start_jobs(shared, jobs, permits, tasks).await;
                        if short && started {
                            // The jobs' tasks start before this loop sends
                            // the idle wait's probe of the next due time,
                            // which a woken job would otherwise wait for.
                            tokio::task::yield_now().await;
                        }
                    }
                    Err(error) if error.is_retryable() => {
                        let wait = claim_backoff(failures, options.poll_interval);
                        failures = failures.saturating_add(1);
                        tracing::warn!(
                            error = %error.chain(),
                            retry_in = ?wait,
                            failures_in_a_row = failures,
                            "claim failed; retrying on a fresh connection"
                        );
                        pause = Some(Pause::Backoff(Box::pin(tokio::time::sleep(wait))));
                    }
                    Err(StoreError::Conditions(message)) => {
                        // The hook may give other conditions next round.
                        tracing::error!(%message, "the PreDequeue hook's conditions were refused; claiming again after the poll interval");
                        pause = Some(Pause::Backoff(Box::pin(tokio::time::sleep(options.poll_interval))));
                    }
                    Err(error) => {
                        tracing::error!(error = %error.chain(), "claim failed permanently; the worker stops");
                        result = Err(WorkerError::Store(error));
                        break;
                    }
                }
                // A claim came back: PreDequeue may answer differently now.
                if matches!(pause, Some(Pause::NotNow(_))) {
                    pause = None;
                }
            }
            _ = async { pause.as_mut().expect("guarded").over(shared).await }, if pause.is_some() => {
                pause = None;
            }
            permit = slots.clone().acquire_many_owned(want as u32), if may_claim => {
                let Ok(mut permits) = permit else { break };
                top_up(&mut permits, &slots, options.claim_batch_size());
                match dequeue(shared, permits, claims.len()).await {
                    Some(claim) => claims.push(claim),
                    None => pause = Some(Pause::NotNow(Box::pin(tokio::time::sleep(options.poll_interval)))),
                }
            }
        }
    }

    // Jobs claimed by claims still on their way go back unstarted.
    while let Some((claimed, _permits)) = claims.next().await {
        for job in claimed.unwrap_or_default() {
            release(shared, job).await;
        }
    }
    result
}

/// How long an idle claim loop waits for a notification: the poll
/// interval, or less if a scheduled or retrying job comes due sooner (so it
/// starts on time though nothing notifies at that moment). A store that
/// cannot tell leaves the poll interval.
async fn idle_wait<S: Store>(store: &S, clock: &dyn queue_core::Clock, poll: Duration) -> Duration {
    let now = clock.now();
    match store.next_due(now).await {
        Ok(Some(due)) => (due - now).to_std().unwrap_or_default().min(poll),
        Ok(None) => poll,
        Err(error) => {
            tracing::debug!(error = %error.chain(), "could not read when the next job comes due; waiting the poll interval");
            poll
        }
    }
}

/// How long to wait after `failures` claims in a row failed (0 for the
/// first): 25 ms, doubling, at most a second (or the poll interval if
/// shorter). A claim that failed because a connection died succeeds on the
/// next one at once, so the first retries come fast; a database that is
/// down is asked about once a second, never left alone for a whole poll
/// interval.
pub(super) fn claim_backoff(failures: u32, poll_interval: Duration) -> Duration {
    let cap = Duration::from_secs(1).min(poll_interval);
    Duration::from_millis(25)
        .saturating_mul(1 << failures.min(16))
        .min(cap)
}

/// Adds the free slots to `permits`, up to `batch` in all.
fn top_up(permits: &mut OwnedSemaphorePermit, slots: &Arc<Semaphore>, batch: usize) {
    let more = batch
        .saturating_sub(permits.num_permits())
        .min(slots.available_permits());
    if let Ok(more) = slots.clone().try_acquire_many_owned(more as u32) {
        permits.merge(more);
    }
}

/// Asks PreDequeue and, unless it says not now, sends the claim off with the
/// slots it may fill (the others are freed at once).
async fn dequeue<S: Store, H: Handler<S>>(
    shared: &Arc<Shared<S, H>>,
    mut permits: OwnedSemaphorePermit,
    claims_in_flight: usize,
) -> Option<ClaimInFlight<S>> {
    let ctx = DequeueContext {
        worker: &shared.options.name,
        free_slots: permits.num_permits(),
        claims_in_flight,
    };
    let dequeue = AssertUnwindSafe(shared.handler.pre_dequeue(&ctx))
        .catch_unwind()
        .await;
    let (conditions, limit) = match dequeue {
        Ok(Ok(Dequeue::Go { conditions, limit })) => (conditions, limit),
        Ok(Ok(Dequeue::NotNow)) => return None,
        Ok(Ok(_)) => {
            tracing::warn!(
                "PreDequeue gave an answer this worker does not know; not claiming this round"
            );
            return None;
        }
        Ok(Err(error)) => {
            tracing::warn!(%error, "PreDequeue hook failed; not claiming this round");
            return None;
        }
        Err(panic) => {
            tracing::error!(panic = %panic_message(&panic), "PreDequeue hook panicked; not claiming this round");
            return None;
        }
    };
    let limit = claim_size(limit.unwrap_or(usize::MAX).min(permits.num_permits()));
    if limit == 0 {
        return None;
    }
    // The slots this claim cannot fill are free at once.
    drop(permits.split(permits.num_permits() - limit));
    let shared = shared.clone();
    Some(Box::pin(async move {
        let claimed = shared
            .store
            .claim(ClaimParams {
                limit,
                worker: &shared.options.name,
                conditions: conditions.as_ref(),
                now: shared.options.clock.now(),
            })
            .await;
        (claimed, permits)
    }))
}

/// Starts the jobs a claim returned, one slot each, and spawns them in a
/// few tasks ([`spawn_jobs`]).
async fn start_jobs<S: Store, H: Handler<S>>(
    shared: &Arc<Shared<S, H>>,
    jobs: Vec<Claimed<S>>,
    mut permits: OwnedSemaphorePermit,
    tasks: &mut JoinSet<()>,
) {
    let mut started = Vec::with_capacity(jobs.len());
    for job in jobs {
        match permits.split(1) {
            Some(permit) => started.extend(start_job(shared, job, permit).await),
            None => {
                // A store returned more than the limit: hand the extra back.
                tracing::error!(id = %job.lease.id, "store returned more jobs than asked for; releasing the extra");
                release(shared, job).await;
            }
        }
    }
    spawn_jobs(started, tasks);
}

/// The most jobs of a claim that share a task.
const JOBS_PER_TASK: usize = 8;

/// Spawns a claim's jobs in tasks of up to [`JOBS_PER_TASK`], and at least
/// one task per runtime thread, each running its share concurrently,
/// instead of one task per job. In lease drains of no-op jobs the spawns,
/// and the wake-ups between threads that came with them, were about a
/// fifth of the worker's CPU per job (8-9 µs a job against 6-8, in three
/// alternating rounds on two cores). Larger shares made transactional
/// drains, whose jobs do several round trips each, a few percent slower. A
/// claim's jobs can still use every thread. A handler that computes for
/// long without awaiting holds up the jobs that share its task, as it holds
/// up every task on its thread: such work belongs in `spawn_blocking`.
fn spawn_jobs(jobs: Vec<JobFuture>, tasks: &mut JoinSet<()>) {
    let threads = tokio::runtime::Handle::current().metrics().num_workers();
    let groups = threads
        .max(jobs.len().div_ceil(JOBS_PER_TASK))
        .clamp(1, jobs.len().max(1));
    let shares: Vec<FuturesUnordered<_>> = (0..groups).map(|_| FuturesUnordered::new()).collect();
    // Dealt out in claim order, so that every task starts with the first
    // jobs of the claim.
    for (i, job) in jobs.into_iter().enumerate() {
        shares[i % groups].push(AssertUnwindSafe(job).catch_unwind());
    }
    for mut share in shares.into_iter().filter(|s| !s.is_empty()) {
        tasks.spawn(async move {
            while let Some(ended) = share.next().await {
                if let Err(panic) = ended {
                    // A failure of the worker's own code around one job (the
                    // handler's panics are caught closer): the others in
                    // the task go on.
                    tracing::error!(panic = %panic_message(&panic), "a job failed outside the handler");
                }
            }
        });
    }
}

/// Hands a claimed job back unstarted.
async fn release<S: Store, H>(shared: &Shared<S, H>, job: Claimed<S>) {
    let now = shared.options.clock.now();
    if let Err(error) = shared
        .store
        .finish(
            job.job_store,
            &job.lease,
            queue_core::Transition::Release,
            now,
        )
        .await
    {
        tracing::warn!(error = %error.chain(), id = %job.lease.id, "could not hand back a claimed job; the resetter will");
    }
}

/// The size of a claim for up to `wanted` jobs: `wanted` itself below 8,
/// above it the largest of four steps per doubling (8, 10, 12, 14, 16, 20,
/// 24, 28, 32, 40, ...) not above it. Claims come in these few sizes (at
/// most a fifth below what was free) so that a store can keep one prepared,
/// planned statement per size: the Postgres store spells the limit out in
/// its claim, where a cached plan can use it.
fn claim_size(wanted: usize) -> usize {
    if wanted < 8 {
        return wanted;
    }
    let power = 1usize << (usize::BITS - 1 - wanted.leading_zeros());
    let step = power / 4;
    wanted / step * step
}

#[cfg(test)]
mod tests {
    use super::{claim_backoff, claim_size};
    use std::time::Duration;

    #[test]
    fn a_failed_claim_is_retried_soon_and_never_later_than_a_second() {
        let waits: Vec<u128> = (0..9)
            .map(|n| claim_backoff(n, Duration::from_secs(5)).as_millis())
            .collect();
        assert_eq!(waits, [25, 50, 100, 200, 400, 800, 1000, 1000, 1000]);
        assert_eq!(
            claim_backoff(u32::MAX, Duration::from_secs(5)),
            Duration::from_secs(1)
        );
        assert_eq!(
            claim_backoff(5, Duration::from_millis(300)),
            Duration::from_millis(300),
            "never longer than the poll interval"
        );
    }

    #[test]
    fn claims_come_in_few_sizes_at_most_a_fifth_below_the_free_slots() {
        let sizes: Vec<usize> = [0, 1, 7, 8, 9, 11, 15, 16, 39, 40, 47, 48, 64, 80, 1000]
            .into_iter()
            .map(claim_size)
            .collect();
        assert_eq!(
            sizes,
            [0, 1, 7, 8, 8, 10, 14, 16, 32, 40, 40, 48, 64, 80, 896]
        );
        let distinct: std::collections::BTreeSet<usize> = (1..=1024).map(claim_size).collect();
        assert_eq!(distinct.len(), 36, "{distinct:?}");
        assert!((1..=1024).all(|n| claim_size(n) <= n && claim_size(n) * 5 >= n * 4));
    }
}
