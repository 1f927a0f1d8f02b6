//! How the worker claims: claims overlap up to `concurrent_claims`, a
//! PreDequeue that said not now is asked again as soon as a job finishes, a
//! retry due before the next poll wakes an idle worker, and jobs whose claim
//! comes back after shutdown go back to the queue.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use common::{eventually, fast_options, Slowed};
use queue_core::{
    BoxError, CancellationToken, Dequeue, DequeueContext, Handler, Job, JobContext, JobError,
    JobState, NewJob,
};
use queue_store_memory::{MemoryCondition, MemoryStore};
use queue_worker::{Worker, WorkerOptions};

struct Quick;

#[async_trait]
impl Handler<Slowed> for Quick {
    async fn handle(&self, _: &JobContext, _: &mut MemoryStore, _: &Job) -> Result<(), JobError> {
        Ok(())
    }
}

fn jobs(n: usize) -> impl Iterator<Item = NewJob> {
    (0..n).map(|i| NewJob::new("quick", serde_json::json!(i)))
}

async fn drain_and_count_overlap(concurrent_claims: usize) -> usize {
    let memory = MemoryStore::new();
    memory.enqueue_many(jobs(200));
    let store = Slowed::new(memory.clone(), Duration::from_millis(20));
    let options = WorkerOptions {
        concurrent_claims,
        ..fast_options().handlers(2).prefetch(6)
    };
    let worker = Worker::new(store.clone(), Quick, options).unwrap();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    eventually("all jobs complete", || async {
        memory.count_by_state().get(&JobState::Completed) == Some(&200)
    })
    .await;
    shutdown.cancel();
    running.await.unwrap().unwrap();
    store.most_in_flight.load(Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_overlap_up_to_the_configured_number() {
    assert_eq!(
        drain_and_count_overlap(1).await,
        1,
        "one claim at a time when concurrent_claims is 1"
    );
    assert_eq!(
        drain_and_count_overlap(2).await,
        2,
        "the next claim goes out while one is on its way"
    );
}

/// Says not now while its gate is closed.
struct Gated {
    open: AtomicBool,
    closed_once: AtomicBool,
}

struct GatedHandler(Arc<Gated>);

#[async_trait]
impl Handler<MemoryStore> for GatedHandler {
    async fn pre_dequeue(
        &self,
        _: &DequeueContext<'_>,
    ) -> Result<Dequeue<MemoryCondition>, BoxError> {
        Ok(if self.0.open.load(Ordering::SeqCst) {
            Dequeue::go()
        } else {
            Dequeue::NotNow
        })
    }

    async fn handle(&self, _: &JobContext, _: &mut MemoryStore, job: &Job) -> Result<(), JobError> {
        if job.kind == "closes" {
            self.0.open.store(false, Ordering::SeqCst);
            self.0.closed_once.store(true, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(200)).await;
            // Opening the gate again is only noticed when asked again.
            self.0.open.store(true, Ordering::SeqCst);
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_now_is_asked_again_when_a_job_finishes_not_after_the_poll_interval() {
    let store = MemoryStore::new();
    store.enqueue(NewJob::new("closes", serde_json::json!(null)));
    let gated = Arc::new(Gated {
        open: AtomicBool::new(true),
        closed_once: AtomicBool::new(false),
    });
    let options = WorkerOptions {
        // Far longer than the test: only a finished job can end the pause.
        poll_interval: Duration::from_secs(60),
        ..fast_options().handlers(2)
    };
    let worker = Worker::new(store.clone(), GatedHandler(gated.clone()), options).unwrap();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    eventually("the first job closed the gate", || async {
        gated.closed_once.load(Ordering::SeqCst)
    })
    .await;
    // Enqueued while the gate is closed: the worker's PreDequeue says not
    // now until the first job finishes and reopens it.
    let second = store.enqueue(NewJob::new("quick", serde_json::json!(null)));
    let started = Instant::now();
    common::wait_for_state(&store, second, JobState::Completed).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the second job waited {:?}: the pause lasted the poll interval",
        started.elapsed()
    );
    shutdown.cancel();
    running.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_claims_are_retried_within_a_second_not_after_the_poll_interval() {
    let memory = MemoryStore::new();
    let store = Slowed::new(memory.clone(), Duration::ZERO);
    // Five failures in a row: 25 + 50 + 100 + 200 + 400 ms of backoff.
    store.failing_claims.store(5, Ordering::SeqCst);
    let id = memory.enqueue(NewJob::new("quick", serde_json::json!(null)));
    let options = WorkerOptions {
        // Far longer than the test: waiting it out would fail the test.
        poll_interval: Duration::from_secs(60),
        ..fast_options().handlers(2)
    };
    struct Completes;
    #[async_trait]
    impl Handler<Slowed> for Completes {
        async fn handle(
            &self,
            _: &JobContext,
            _: &mut MemoryStore,
            _: &Job,
        ) -> Result<(), JobError> {
            Ok(())
        }
    }
    let worker = Worker::new(store.clone(), Completes, options).unwrap();
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    common::wait_for_state(&memory, id, JobState::Completed).await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "the job waited {took:?} after five failed claims"
    );
    let failed = store
        .events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| *e == "claim failed")
        .count();
    assert_eq!(failed, 5, "every failure was retried");
    shutdown.cancel();
    running.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_of_a_claim_that_returns_after_shutdown_go_back_unstarted() {
    let memory = MemoryStore::new();
    let ids = memory.enqueue_many(jobs(3));
    let store = Slowed::new(memory.clone(), Duration::from_millis(300));
    let ran = Arc::new(AtomicUsize::new(0));
    struct Counting(Arc<AtomicUsize>);
    #[async_trait]
    impl Handler<Slowed> for Counting {
        async fn handle(
            &self,
            _: &JobContext,
            _: &mut MemoryStore,
            _: &Job,
        ) -> Result<(), JobError> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }
    let worker = Worker::new(store.clone(), Counting(ran.clone()), fast_options()).unwrap();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    // The claim has taken the rows and is still on its way back.
    eventually("the claim is in flight", || async {
        store.in_flight.load(Ordering::SeqCst) == 1
    })
    .await;
    shutdown.cancel();
    running.await.unwrap().unwrap();
    assert_eq!(
        ran.load(Ordering::SeqCst),
        0,
        "no job started after shutdown"
    );
    for id in ids {
        assert_eq!(
            memory.get(id).unwrap().state,
            JobState::Queued,
            "job {id} went back to the queue"
        );
    }
}

/// Fails its first attempt with a retry due shortly.
struct RetriesOnce;

#[async_trait]
impl Handler<Slowed> for RetriesOnce {
    async fn handle(&self, ctx: &JobContext, _: &mut MemoryStore, _: &Job) -> Result<(), JobError> {
        if ctx.attempt() == 1 {
            return Err(JobError::retry_after("busy", Duration::from_millis(100)));
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_due_before_the_next_poll_wakes_the_worker() {
    let memory = MemoryStore::new();
    let id = memory.enqueue(NewJob::new("flaky", serde_json::json!(null)));
    let store = Slowed {
        deaf: true,
        ..Slowed::new(memory.clone(), Duration::ZERO)
    };
    let options = WorkerOptions {
        // Far longer than the test: only the retry's own wake-up can help.
        poll_interval: Duration::from_secs(60),
        ..fast_options()
    };
    let worker = Worker::new(store, RetriesOnce, options).unwrap();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let started = Instant::now();
    eventually("the retried job completes", || async {
        memory.get(id).map(|j| j.state) == Some(JobState::Completed)
    })
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the retry waited {:?}: for the poll interval",
        started.elapsed()
    );
    shutdown.cancel();
    running.await.unwrap().unwrap();
}

/// A claim that found fewer jobs than it asked for took all there were, so
/// the worker waits for news instead of sending claims that find nothing
/// before the job it found has even started (each woken job used to cost
/// the claim that took it and two more that came back empty).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_comes_back_short_is_not_followed_by_claims_that_find_nothing() {
    let memory = MemoryStore::new();
    let store = Slowed::new(memory.clone(), Duration::ZERO);
    let options = WorkerOptions {
        // Far longer than the test: only notifications wake the worker.
        poll_interval: Duration::from_secs(60),
        ..fast_options().handlers(2).prefetch(6)
    };
    let worker = Worker::new(store.clone(), Quick, options).unwrap();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    eventually("the worker's first claims", || async {
        store.claims.load(Ordering::SeqCst) > 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let idle = store.claims.load(Ordering::SeqCst);
    for i in 0..5 {
        let id = memory.enqueue(NewJob::new("quick", serde_json::json!(i)));
        common::wait_for_state(&memory, id, JobState::Completed).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let claims = store.claims.load(Ordering::SeqCst) - idle;
    // Per job: the claim that took it, and one that the notification's
    // permit sends after it (the notification woke the worker while it
    // waited, and also leaves a permit for a worker about to wait).
    assert!(
        claims <= 2 * 5,
        "{claims} claims for 5 jobs enqueued one at a time"
    );
    shutdown.cancel();
    running.await.unwrap().unwrap();
}
