//! Worker behaviour against the memory store: hook order, outcomes, panics,
//! timeouts, cancellation, deletion, undecodable records, concurrency (on
//! every runtime thread) and graceful shutdown.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use common::{eventually, fast_options, start, wait_for_state, Slowed};
use queue_core::{
    Admin, CancellationToken, Dequeue, DequeueContext, Handler, Job, JobContext, JobError,
    JobState, NewJob, Outcome, OutcomePolicy, RetryPolicy, SystemClock, Targets,
};
use queue_store_memory::MemoryStore;
use queue_worker::{Worker, WorkerError, WorkerOptions, WorkerReport};

fn job(kind: &str, payload: serde_json::Value) -> NewJob {
    NewJob::new(kind, payload)
}

/// Behaves according to the job's kind.
struct Scripted;

#[async_trait]
impl Handler<MemoryStore> for Scripted {
    async fn handle(
        &self,
        ctx: &JobContext,
        _: &mut MemoryStore,
        job: &Job,
    ) -> Result<(), JobError> {
        match job.kind.as_str() {
            "ok" => Ok(()),
            "retry" => Err(JobError::retry("upstream unavailable")),
            "poison" => Err(JobError::poison("malformed input")),
            "unclassified" => Err(JobError::from(std::io::Error::other("disk hiccup"))),
            "panic" => panic!("handler bug"),
            "sleep" => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(())
            }
            "wait-for-cancel" => {
                ctx.cancelled().await;
                Err(JobError::cancel("stopped on request"))
            }
            "ignore-cancel" => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                Ok(())
            }
            "log" => {
                assert!(ctx.log("step", "one").await?.is_applied());
                assert!(ctx.log("step", "two").await?.is_applied());
                Ok(())
            }
            other => Err(JobError::poison(format!("unexpected kind {other}"))),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_run_in_the_specified_order() {
    #[derive(Default)]
    struct Recorder {
        events: Mutex<Vec<String>>,
        store: Mutex<Option<MemoryStore>>,
    }
    #[async_trait]
    impl Handler<MemoryStore> for Recorder {
        async fn pre_dequeue(
            &self,
            _: &DequeueContext<'_>,
        ) -> Result<Dequeue<queue_store_memory::MemoryCondition>, queue_core::BoxError> {
            let mut events = self.events.lock().unwrap();
            if events.last().map(String::as_str) != Some("pre_dequeue") {
                events.push("pre_dequeue".into());
            }
            Ok(Dequeue::go())
        }
        async fn pre_handle(&self, _: &JobContext, job: &Job) {
            self.events
                .lock()
                .unwrap()
                .push(format!("pre_handle {}", job.id));
        }
        async fn handle(
            &self,
            _: &JobContext,
            _: &mut MemoryStore,
            job: &Job,
        ) -> Result<(), JobError> {
            self.events
                .lock()
                .unwrap()
                .push(format!("handle {}", job.id));
            Ok(())
        }
        async fn post_handle(&self, _: &JobContext, job: &Job, outcome: &Outcome) {
            // PostHandle runs after the outcome was recorded.
            let state = self
                .store
                .lock()
                .unwrap()
                .as_ref()
                .and_then(|s| s.get(job.id))
                .map(|j| j.state);
            self.events.lock().unwrap().push(format!(
                "post_handle {} {} {:?}",
                job.id,
                outcome.label(),
                state
            ));
        }
    }

    let store = MemoryStore::new();
    let recorder = Arc::new(Recorder::default());
    *recorder.store.lock().unwrap() = Some(store.clone());
    let id = store.enqueue(job("ok", serde_json::json!(null)));
    let running = start(&store, recorder.clone(), fast_options().handlers(1));
    wait_for_state(&store, id, JobState::Completed).await;
    eventually("post_handle ran", || async {
        recorder
            .events
            .lock()
            .unwrap()
            .iter()
            .any(|e| e.starts_with("post_handle"))
    })
    .await;
    running.stop().await;
    let events = recorder.events.lock().unwrap().clone();
    assert_eq!(
        &events[..4],
        [
            "pre_dequeue",
            "pre_handle 1",
            "handle 1",
            "post_handle 1 completed Some(Completed)"
        ],
        "hooks run PreDequeue, PreHandle, Handle, PostHandle"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_map_to_states() {
    let store = MemoryStore::new();
    let ok = store.enqueue(job("ok", serde_json::json!(null)));
    let retry = store.enqueue(job("retry", serde_json::json!(null)));
    let poison = store.enqueue(job("poison", serde_json::json!(null)));
    let unclassified = store.enqueue(job("unclassified", serde_json::json!(null)));
    let log = store.enqueue(job("log", serde_json::json!(null)));
    let running = start(&store, Scripted, fast_options());
    wait_for_state(&store, ok, JobState::Completed).await;
    wait_for_state(&store, retry, JobState::Errored).await;
    wait_for_state(&store, poison, JobState::Failed).await;
    wait_for_state(&store, unclassified, JobState::Errored).await;
    wait_for_state(&store, log, JobState::Completed).await;
    let report = running.stop().await;

    let r = store.get(retry).unwrap();
    assert_eq!(r.failure_message.as_deref(), Some("upstream unavailable"));
    assert_eq!(r.num_failures, 1);
    let wait = r.process_after.unwrap() - r.finished_at.unwrap();
    assert!(
        wait >= chrono::Duration::seconds(23) && wait <= chrono::Duration::seconds(37),
        "default backoff is 30 s ± 20 %, got {wait}"
    );
    assert_eq!(
        store.get(poison).unwrap().failure_message.as_deref(),
        Some("malformed input")
    );
    assert_eq!(
        store.get(unclassified).unwrap().failure_message.as_deref(),
        Some("disk hiccup")
    );
    let logs: Vec<_> = store
        .get(log)
        .unwrap()
        .execution_logs
        .into_iter()
        .map(|e| e.message)
        .collect();
    assert_eq!(logs, ["one", "two"], "ctx.log appends to the execution log");
    assert_eq!(
        (
            report.count("completed"),
            report.count("retried"),
            report.count("poisoned")
        ),
        (2, 2, 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_run_until_exhausted_then_fail() {
    let store = MemoryStore::new();
    let id = store.enqueue(job("retry", serde_json::json!(null)));
    let options = WorkerOptions {
        outcome_policy: OutcomePolicy {
            retry: RetryPolicy::fixed(2, Duration::ZERO),
            ..Default::default()
        },
        ..fast_options()
    };
    let running = start(&store, Scripted, options);
    wait_for_state(&store, id, JobState::Failed).await;
    let report = running.stop().await;
    let j = store.get(id).unwrap();
    assert_eq!(j.num_failures, 3, "one attempt plus two retries");
    assert!(j.failure_message.unwrap().contains("no retries left"));
    assert_eq!((report.count("retried"), report.count("failed")), (2, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_never_kills_the_pool() {
    let store = MemoryStore::new();
    let panics = store.enqueue(job("panic", serde_json::json!(null)));
    let running = start(&store, Scripted, fast_options().handlers(1));
    wait_for_state(&store, panics, JobState::Errored).await;
    // The single handler slot keeps working after the panic.
    let after = store.enqueue(job("ok", serde_json::json!(null)));
    wait_for_state(&store, after, JobState::Completed).await;
    running.stop().await;
    let j = store.get(panics).unwrap();
    assert_eq!(
        j.failure_message.as_deref(),
        Some("handler panicked: handler bug")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_past_its_timeout_is_retryable() {
    let store = MemoryStore::new();
    let id = store.enqueue(job("sleep", serde_json::json!(null)));
    let options = WorkerOptions {
        job_timeout: Some(Duration::from_millis(50)),
        ..fast_options()
    };
    let running = start(&store, Scripted, options);
    wait_for_state(&store, id, JobState::Errored).await;
    running.stop().await;
    assert_eq!(
        store.get(id).unwrap().failure_message.as_deref(),
        Some("handler timed out after 50ms")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_reaches_the_running_handler() {
    let store = MemoryStore::new();
    let polite = store.enqueue(job("wait-for-cancel", serde_json::json!(null)));
    let stubborn = store.enqueue(job("ignore-cancel", serde_json::json!(null)));
    let running = start(&store, Scripted, fast_options());
    wait_for_state(&store, polite, JobState::Processing).await;
    wait_for_state(&store, stubborn, JobState::Processing).await;
    let asked = Admin::cancel(&store, &Targets::Ids(vec![polite, stubborn]))
        .await
        .unwrap();
    assert_eq!(
        asked.stop_requested, 2,
        "both running jobs are asked to stop"
    );
    // The polite handler returns on the signal; the stubborn one is
    // abandoned after the grace period. Both end canceled.
    wait_for_state(&store, polite, JobState::Canceled).await;
    wait_for_state(&store, stubborn, JobState::Canceled).await;
    let report = running.stop().await;
    assert_eq!(report.count("canceled"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_job_is_dropped_without_a_write() {
    struct Watcher {
        stopped: std::sync::atomic::AtomicBool,
    }
    #[async_trait]
    impl Handler<MemoryStore> for Watcher {
        async fn handle(
            &self,
            ctx: &JobContext,
            _: &mut MemoryStore,
            _: &Job,
        ) -> Result<(), JobError> {
            ctx.cancelled().await;
            self.stopped.store(true, Ordering::SeqCst);
            Err(JobError::cancel("stopped"))
        }
    }
    let store = MemoryStore::new();
    let id = store.enqueue(job("k", serde_json::json!(null)));
    let watcher = Arc::new(Watcher {
        stopped: Default::default(),
    });
    let running = start(&store, watcher.clone(), fast_options());
    wait_for_state(&store, id, JobState::Processing).await;
    assert_eq!(
        Admin::delete(&store, &Targets::id(id))
            .await
            .unwrap()
            .changed,
        1
    );
    eventually("the handler of the deleted job was stopped", || async {
        watcher.stopped.load(Ordering::SeqCst)
    })
    .await;
    let report = running.stop().await;
    assert_eq!(
        report.count("lost"),
        1,
        "the attempt of a deleted job ends as lost"
    );
    assert_eq!(report.total(), 1, "and nothing else was recorded");
    assert!(store.get(id).is_none(), "nothing recreated the job");
}

/// A handler whose first attempt runs `first`, then asks to be retried at
/// once; the second runs 600 ms and succeeds.
struct RetryOnce {
    first: Duration,
}

#[async_trait]
impl Handler<Slowed> for RetryOnce {
    async fn handle(&self, ctx: &JobContext, _: &mut MemoryStore, _: &Job) -> Result<(), JobError> {
        if ctx.attempt() == 1 {
            tokio::time::sleep(self.first).await;
            return Err(JobError::retry_after("once more", Duration::ZERO));
        }
        tokio::time::sleep(Duration::from_millis(600)).await;
        Ok(())
    }
}

/// Runs one job on `store` with [`RetryOnce`] until it completes: its key
/// and the worker's report.
async fn retried_once_to_completion(store: &Slowed, first: Duration) -> (i64, WorkerReport) {
    let id = store.inner.enqueue(job("k", serde_json::json!(null)));
    let worker =
        Worker::new(store.clone(), RetryOnce { first }, fast_options()).expect("valid options");
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(worker.run(shutdown.clone()));
    wait_for_state(&store.inner, id, JobState::Completed).await;
    shutdown.cancel();
    let report = task.await.expect("joined").expect("the worker ran");
    (id, report)
}

/// A heartbeat that was on its way while its job's attempt ended and the
/// job was claimed again reports the old attempt gone: that says nothing of
/// the new attempt, which runs on and records its outcome (it was stopped
/// as lost once, and the job stayed running until the resetter came).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_heartbeat_about_an_ended_attempt_leaves_the_next_attempt_running() {
    let mut store = Slowed::new(MemoryStore::new(), Duration::ZERO);
    store.heartbeat_delay = Duration::from_millis(250);
    store.heartbeats_recorded = true;
    let (id, report) = retried_once_to_completion(&store, Duration::from_millis(60)).await;
    assert!(
        store
            .events
            .lock()
            .unwrap()
            .contains(&format!("heartbeat found {id} gone")),
        "a heartbeat asked about the first attempt after it ended"
    );
    assert_eq!(
        (
            report.count("retried"),
            report.count("completed"),
            report.count("lost")
        ),
        (1, 1, 0),
        "the second attempt ran to its end"
    );
}

/// A job retried at once can be claimed again, and its next attempt
/// started in the same worker, before the first attempt's finish has come
/// back: the first attempt's end leaves the next attempt among the running
/// jobs, so that its heartbeats go on (without them the resetter would take
/// it for stalled and run it twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_that_ends_late_leaves_the_next_attempt_heartbeating() {
    let mut store = Slowed::new(MemoryStore::new(), Duration::ZERO);
    store.finish_answer_delay = Duration::from_millis(150);
    store.heartbeats_recorded = true;
    let (id, report) = retried_once_to_completion(&store, Duration::ZERO).await;
    assert_eq!((report.count("retried"), report.count("completed")), (1, 1));
    let events = store.events.lock().unwrap().clone();
    let answered = events
        .iter()
        .position(|e| e == &format!("answered {id}"))
        .expect("the first attempt's finish came back");
    assert!(
        events[..answered]
            .iter()
            .any(|e| e.starts_with(&format!("heartbeat asked about {id} "))),
        "the second attempt had started before the first one's finish came back: {events:?}"
    );
    // It runs 450 ms more, heartbeated every 20 ms (one heartbeat may
    // have read the running jobs just before the first attempt's end).
    let later = events[answered..]
        .iter()
        .filter(|e| e.starts_with(&format!("heartbeat asked about {id} ")))
        .count();
    assert!(
        later >= 3,
        "the second attempt was heartbeated after the first one ended: {events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_record_fails_with_a_clear_message() {
    let store = MemoryStore::with_decode_check(Arc::new(SystemClock), |job| {
        if job.payload.is_object() {
            Ok(())
        } else {
            Err(format!(
                "column \"payload\": expected a JSON object, found {}",
                job.payload
            ))
        }
    });
    let bad = store.enqueue(job("ok", serde_json::json!(42)));
    let good = store.enqueue(job("ok", serde_json::json!({})));
    let running = start(&store, Scripted, fast_options());
    wait_for_state(&store, bad, JobState::Failed).await;
    wait_for_state(&store, good, JobState::Completed).await;
    running.stop().await;
    assert_eq!(
        store.get(bad).unwrap().failure_message.as_deref(),
        Some("job 1 could not be decoded: column \"payload\": expected a JSON object, found 42")
    );
}

/// Enqueues `n` "ok" jobs, runs `handler` until all of them completed, and
/// stops the worker.
async fn complete_ok_jobs<H: Handler<MemoryStore>>(
    n: usize,
    handler: H,
    options: WorkerOptions,
) -> queue_worker::WorkerReport {
    let store = MemoryStore::new();
    store.enqueue_many((0..n).map(|i| job("ok", serde_json::json!(i))));
    let running = start(&store, handler, options);
    eventually("all jobs completed", || async {
        store.count_by_state().get(&JobState::Completed) == Some(&n)
    })
    .await;
    running.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_more_than_num_handlers_jobs_run_at_once() {
    struct Counting {
        now: AtomicUsize,
        max: AtomicUsize,
    }
    #[async_trait]
    impl Handler<MemoryStore> for Counting {
        async fn handle(
            &self,
            _: &JobContext,
            _: &mut MemoryStore,
            _: &Job,
        ) -> Result<(), JobError> {
            let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.max.fetch_max(n, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(10)).await;
            self.now.fetch_sub(1, Ordering::SeqCst);
            Ok(())
        }
    }
    let counting = Arc::new(Counting {
        now: AtomicUsize::new(0),
        max: AtomicUsize::new(0),
    });
    let report = complete_ok_jobs(30, counting.clone(), fast_options().handlers(3)).await;
    assert_eq!(report.count("completed"), 30);
    assert_eq!(
        counting.max.load(Ordering::SeqCst),
        3,
        "three handlers run at once, never more"
    );
}

/// The jobs of one claim run in a few tasks, not one each; they can still
/// compute on every runtime thread at once. Each handler here blocks its
/// thread until the other has started too (or 5 s pass): both see the other
/// only if they run on two threads at the same time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jobs_of_one_claim_compute_on_every_runtime_thread_at_once() {
    struct Rendezvous {
        arrived: AtomicUsize,
        met: AtomicUsize,
    }
    #[async_trait]
    impl Handler<MemoryStore> for Rendezvous {
        async fn handle(
            &self,
            _: &JobContext,
            _: &mut MemoryStore,
            _: &Job,
        ) -> Result<(), JobError> {
            self.arrived.fetch_add(1, Ordering::SeqCst);
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            // Blocks the thread on purpose, as a computation would.
            while self.arrived.load(Ordering::SeqCst) < 2 && std::time::Instant::now() < deadline {
                std::hint::spin_loop();
            }
            if self.arrived.load(Ordering::SeqCst) >= 2 {
                self.met.fetch_add(1, Ordering::SeqCst);
            }
            Ok(())
        }
    }
    let rendezvous = Arc::new(Rendezvous {
        arrived: AtomicUsize::new(0),
        met: AtomicUsize::new(0),
    });
    // Two handlers: both jobs come in one claim of two.
    complete_ok_jobs(2, rendezvous.clone(), fast_options().handlers(2)).await;
    assert_eq!(
        rendezvous.met.load(Ordering::SeqCst),
        2,
        "each job saw the other start while it blocked its thread"
    );
}

/// Records each start among the store's events.
struct RecordsStarts(Slowed);

#[async_trait]
impl Handler<Slowed> for RecordsStarts {
    async fn handle(&self, _: &JobContext, _: &mut MemoryStore, job: &Job) -> Result<(), JobError> {
        self.0.record(format!("started {}", job.id));
        Ok(())
    }
}

/// A job's claim slot frees when its handler is done, before its outcome
/// is written; with `max_outcomes_in_flight` outcomes on their way, the
/// next job to finish keeps its slot until one is written. Over a store
/// whose finishes take 400 ms, one handler and a bound of 2 hold three
/// jobs (two being written, one waiting to be) and claim no fourth, where
/// without the bound every job would be claimed at once; all complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_jobs_whose_outcomes_wait_hold_the_claims_back() {
    let memory = MemoryStore::new();
    memory.enqueue_many((0..20).map(|n| job("ok", serde_json::json!(n))));
    let store = Slowed {
        finish_delay: Duration::from_millis(400),
        ..Slowed::new(memory.clone(), Duration::ZERO)
    };
    let options = WorkerOptions {
        max_outcomes_in_flight: 2,
        ..fast_options().handlers(1)
    };
    let worker =
        Worker::new(store.clone(), RecordsStarts(store.clone()), options).expect("valid options");
    let shutdown = queue_core::CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let counts = memory.count_by_state();
    assert_eq!(
        (
            counts.get(&JobState::Processing).copied().unwrap_or(0),
            counts.get(&JobState::Queued).copied().unwrap_or(0)
        ),
        (3, 17),
        "two outcomes on their way, one job waiting to send its own, no fourth claimed"
    );
    eventually("every job completed", || async {
        memory.count_by_state().get(&JobState::Completed) == Some(&20)
    })
    .await;
    shutdown.cancel();
    running.await.expect("worker task").expect("worker");
}

/// Heartbeats ask about running jobs only: a job whose handler is done and
/// whose outcome is on its way is left out (on the Postgres store a
/// heartbeat locks the rows it bumps, and held up the writes of those very
/// outcomes). Its finish takes 300 ms, heartbeats go every 20 ms: at most
/// one (which read the running jobs just before the handler ended) asks
/// about it after its handler ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_leave_out_jobs_whose_outcome_is_on_its_way() {
    let memory = MemoryStore::new();
    let id = memory.enqueue(job("ok", serde_json::json!(null)));
    let store = Slowed {
        finish_delay: Duration::from_millis(300),
        heartbeats_recorded: true,
        ..Slowed::new(memory.clone(), Duration::ZERO)
    };
    let worker = Worker::new(store.clone(), RecordsStarts(store.clone()), fast_options())
        .expect("valid options");
    let shutdown = queue_core::CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    wait_for_state(&memory, id, JobState::Completed).await;
    shutdown.cancel();
    running.await.expect("worker task").expect("worker");
    let events = store.events.lock().unwrap().clone();
    let handled = events
        .iter()
        .position(|e| e == &format!("started {id}"))
        .expect("the handler ran");
    let finished = events
        .iter()
        .position(|e| e == &format!("finished {id}"))
        .expect("the outcome was written");
    let asked = events[handled..finished]
        .iter()
        .filter(|e| e.starts_with(&format!("heartbeat asked about {id} ")))
        .count();
    assert!(
        asked <= 1,
        "{asked} heartbeats asked about a job whose outcome was on its way: {events:?}"
    );
}

/// The events of two jobs run one handler at a time, with a prefetched job
/// waiting, over a store whose finishes take 300 ms.
async fn one_handler_two_jobs(ends_transaction: bool) -> Vec<String> {
    let memory = MemoryStore::new();
    memory.enqueue_many((0..2).map(|n| job("ok", serde_json::json!(n))));
    let store = Slowed {
        finish_delay: Duration::from_millis(300),
        ends_transaction,
        ..Slowed::new(memory.clone(), Duration::ZERO)
    };
    let worker = Worker::new(
        store.clone(),
        RecordsStarts(store.clone()),
        fast_options().handlers(1).prefetch(1),
    )
    .expect("valid options");
    let shutdown = queue_core::CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    eventually("both jobs completed", || async {
        memory.count_by_state().get(&JobState::Completed) == Some(&2)
    })
    .await;
    shutdown.cancel();
    running.await.expect("worker task").expect("worker");
    let events = store.events.lock().unwrap();
    events.clone()
}

/// The events without job keys (which of the two jobs goes first is the
/// runtime's choice).
fn steps(events: &[String]) -> Vec<&str> {
    events
        .iter()
        .map(|e| e.split(' ').next().unwrap_or_default())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finish_that_ends_the_handlers_transaction_keeps_the_handler_slot() {
    let events = one_handler_two_jobs(true).await;
    assert_eq!(
        steps(&events),
        ["started", "finished", "started", "finished"],
        "the second job waits until the first one's transaction has ended: {events:?}"
    );
    assert_eq!(
        events[1],
        events[0].replace("started", "finished"),
        "{events:?}"
    );
    let events = one_handler_two_jobs(false).await;
    assert_eq!(
        steps(&events),
        ["started", "started", "finished", "finished"],
        "otherwise the slot takes the second job while the first one's outcome is recorded: \
         {events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_finishes_quick_jobs_and_hands_back_slow_ones() {
    struct Mixed;
    #[async_trait]
    impl Handler<MemoryStore> for Mixed {
        async fn handle(
            &self,
            _: &JobContext,
            _: &mut MemoryStore,
            job: &Job,
        ) -> Result<(), JobError> {
            let millis = job.payload.as_u64().unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(millis)).await;
            Ok(())
        }
    }
    let store = MemoryStore::new();
    let quick = store.enqueue(job("ok", serde_json::json!(100)));
    let slow = store.enqueue(job("ok", serde_json::json!(3_600_000)));
    let options = WorkerOptions {
        shutdown_timeout: Duration::from_millis(400),
        cancel_grace: Duration::from_millis(50),
        ..fast_options()
    };
    let running = start(&store, Mixed, options);
    wait_for_state(&store, quick, JobState::Processing).await;
    wait_for_state(&store, slow, JobState::Processing).await;
    let report = running.stop().await;
    assert_eq!(
        store.get(quick).unwrap().state,
        JobState::Completed,
        "an in-flight job finishes within the bound"
    );
    let s = store.get(slow).unwrap();
    assert_eq!(
        s.state,
        JobState::Queued,
        "an unfinished job is handed back"
    );
    assert_eq!(
        (s.num_failures, s.num_resets),
        (0, 0),
        "handing back counts nothing against the job"
    );
    assert_eq!(
        (report.count("completed"), report.count("released")),
        (1, 1)
    );
}

#[tokio::test]
async fn invalid_options_are_rejected_with_the_option_named() {
    let err = Worker::new(
        MemoryStore::new(),
        Scripted,
        WorkerOptions {
            num_handlers: 0,
            ..WorkerOptions::default()
        },
    )
    .err()
    .expect("zero handlers is invalid");
    assert!(
        matches!(err, WorkerError::InvalidOptions(ref m) if m.contains("num_handlers")),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetched_jobs_wait_for_a_handler_and_go_back_at_shutdown() {
    struct Slow;
    #[async_trait]
    impl Handler<MemoryStore> for Slow {
        async fn handle(
            &self,
            _: &JobContext,
            _: &mut MemoryStore,
            _: &Job,
        ) -> Result<(), JobError> {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok(())
        }
    }
    let store = MemoryStore::new();
    let ids = store.enqueue_many((0..4).map(|n| job("slow", serde_json::json!(n))));
    let options = WorkerOptions {
        shutdown_timeout: Duration::from_secs(5),
        ..fast_options().handlers(1).prefetch(3)
    };
    let running = start(&store, Slow, options);
    // One claim takes all four: one runs, three wait in memory.
    eventually("all four are claimed", || async {
        ids.iter()
            .all(|&id| store.get(id).map(|j| j.state) == Some(JobState::Processing))
    })
    .await;
    let report = running.stop().await;
    let states: Vec<JobState> = ids.iter().map(|&id| store.get(id).unwrap().state).collect();
    assert_eq!(
        states.iter().filter(|s| **s == JobState::Completed).count(),
        1,
        "the started job finished: {states:?}"
    );
    assert_eq!(
        states.iter().filter(|s| **s == JobState::Queued).count(),
        3,
        "the waiting ones went back: {states:?}"
    );
    assert_eq!(
        (report.count("completed"), report.count("released")),
        (1, 3)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_own_attempt_limit_and_at_most_once_override_the_policy() {
    let store = MemoryStore::new();
    let two = store.enqueue(job("retry", serde_json::json!(1)).max_attempts(2));
    let once = store.enqueue(job("retry", serde_json::json!(2)).at_most_once());
    let options = WorkerOptions {
        outcome_policy: OutcomePolicy {
            retry: RetryPolicy::fixed(5, Duration::ZERO),
            ..Default::default()
        },
        ..fast_options()
    };
    let running = start(&store, Scripted, options);
    wait_for_state(&store, two, JobState::Failed).await;
    wait_for_state(&store, once, JobState::Failed).await;
    running.stop().await;
    let two = store.get(two).expect("the job");
    assert_eq!(two.num_failures, 2, "two attempts, not the policy's six");
    assert!(
        two.failure_message
            .as_deref()
            .is_some_and(|m| m.contains("attempt 2 of at most 2")),
        "{:?}",
        two.failure_message
    );
    let once = store.get(once).expect("the job");
    assert_eq!(once.num_failures, 1, "an at-most-once job is never retried");
    assert!(once
        .failure_message
        .as_deref()
        .is_some_and(|m| m.contains("never retried")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_fails_a_started_at_most_once_job_instead_of_handing_it_back() {
    let store = MemoryStore::new();
    let plain = store.enqueue(job("wait-for-cancel", serde_json::json!(1)));
    let once = store.enqueue(job("wait-for-cancel", serde_json::json!(2)).at_most_once());
    let options = WorkerOptions {
        shutdown_timeout: Duration::from_millis(100),
        ..fast_options().handlers(2)
    };
    let running = start(&store, Scripted, options);
    wait_for_state(&store, plain, JobState::Processing).await;
    wait_for_state(&store, once, JobState::Processing).await;
    let report = running.stop().await;
    assert_eq!(
        store.get(plain).map(|j| j.state),
        Some(JobState::Queued),
        "an ordinary job is handed back to run again"
    );
    let once = store.get(once).expect("the job");
    assert_eq!(once.state, JobState::Failed, "an at-most-once job is not");
    assert_eq!(
        once.failure_message.as_deref(),
        Some(queue_worker::AT_MOST_ONCE_SHUTDOWN_MESSAGE)
    );
    assert_eq!((report.count("released"), report.count("poisoned")), (1, 1));
}

/// Fails every attempt, as a handler whose database calls broke would.
struct FailsAlways;

#[async_trait]
impl Handler<Slowed> for FailsAlways {
    async fn handle(&self, _: &JobContext, _: &mut MemoryStore, _: &Job) -> Result<(), JobError> {
        Err(JobError::retry("connection reset by peer"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_the_store_cut_off_is_handed_back_without_charging_the_job() {
    let memory = MemoryStore::new();
    let plain = memory.enqueue(job("any", serde_json::json!(1)));
    let store = Slowed::new(memory.clone(), Duration::ZERO);
    store.cut_offs.store(1, Ordering::SeqCst);
    let options = WorkerOptions {
        outcome_policy: OutcomePolicy {
            retry: RetryPolicy::fixed(0, Duration::ZERO),
            ..Default::default()
        },
        ..fast_options().handlers(1)
    };
    let worker = Worker::new(store.clone(), FailsAlways, options).expect("valid options");
    let shutdown = queue_core::CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    // First attempt cut off: handed back, uncounted. Second attempt fails
    // for real, and with no retries allowed the job fails.
    wait_for_state(&memory, plain, JobState::Failed).await;
    shutdown.cancel();
    let report = running.await.expect("worker task").expect("worker");
    let record = memory.get(plain).expect("the job");
    assert_eq!(
        record.num_failures, 1,
        "only the handler's own failure counts, though no retries were allowed"
    );
    assert_eq!(
        (report.count("interrupted"), report.count("failed")),
        (1, 1)
    );

    // An at-most-once job cut off is not started again.
    let once = memory.enqueue(job("any", serde_json::json!(2)).at_most_once());
    store.cut_offs.store(1, Ordering::SeqCst);
    let worker = Worker::new(store.clone(), FailsAlways, fast_options()).expect("valid options");
    let shutdown = queue_core::CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    wait_for_state(&memory, once, JobState::Failed).await;
    shutdown.cancel();
    running.await.expect("worker task").expect("worker");
    let once = memory.get(once).expect("the job");
    assert!(
        once.failure_message
            .as_deref()
            .is_some_and(|m| m.contains("never started twice")),
        "{:?}",
        once.failure_message
    );
}

/// Runs job `id` over `store` with one handler until `done` holds, and
/// returns the worker's report.
async fn run_until(
    store: &Slowed,
    what: &str,
    done: impl Fn() -> bool,
) -> queue_worker::WorkerReport {
    let worker = Worker::new(
        store.clone(),
        RecordsStarts(store.clone()),
        fast_options().handlers(1),
    )
    .expect("valid options");
    let shutdown = queue_core::CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    eventually(what, || async { done() }).await;
    shutdown.cancel();
    running.await.expect("worker task").expect("worker")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_the_store_failed_to_record_is_written_again_at_once() {
    let memory = MemoryStore::new();
    let id = memory.enqueue(job("ok", serde_json::json!(1)));
    let store = Slowed::new(memory.clone(), Duration::ZERO);
    store.failing_finishes.store(2, Ordering::SeqCst);
    let report = run_until(&store, "the job completed", || {
        memory.get(id).map(|j| j.state) == Some(JobState::Completed)
    })
    .await;
    let events = store.events.lock().unwrap().clone();
    assert_eq!(
        events,
        [
            format!("started {id}"),
            format!("finish failed {id}"),
            format!("finish failed {id}"),
            format!("finished again {id} Complete"),
        ],
        "written again after each failure, not left to the resetter"
    );
    assert_eq!(report.count("completed"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_whose_transaction_was_lost_hands_the_job_back_to_run_again() {
    let memory = MemoryStore::new();
    let id = memory.enqueue(job("ok", serde_json::json!(1)));
    let store = Slowed {
        ends_transaction: true,
        ..Slowed::new(memory.clone(), Duration::ZERO)
    };
    store.failing_finishes.store(1, Ordering::SeqCst);
    let report = run_until(&store, "the job completed", || {
        memory.get(id).map(|j| j.state) == Some(JobState::Completed)
    })
    .await;
    let events = store.events.lock().unwrap().clone();
    assert_eq!(
        events,
        [
            format!("started {id}"),
            format!("finish failed {id}"),
            format!("finished again {id} Release"),
            format!("started {id}"),
            format!("finished {id}"),
        ],
        "the handler's writes went with the lost transaction, so the job runs again"
    );
    let record = memory.get(id).expect("the job");
    assert_eq!(record.num_failures, 0, "the store's fault is not the job's");
    assert_eq!(
        (report.count("interrupted"), report.count("completed")),
        (1, 1)
    );
}

/// Fails its first attempt with the store's own "unavailable" error (as a
/// handler whose job transaction could not be opened does), then succeeds.
struct StoreFailsOnce(AtomicUsize);

#[async_trait]
impl Handler<MemoryStore> for StoreFailsOnce {
    async fn handle(&self, _: &JobContext, _: &mut MemoryStore, _: &Job) -> Result<(), JobError> {
        if self.0.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(JobError::retry(queue_core::StoreError::Unavailable {
                context: "opening a job's transaction".into(),
                source: "connection reset by peer".into(),
            }));
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_error_from_an_unreachable_store_is_not_charged_to_the_job() {
    let store = MemoryStore::new();
    let id = store.enqueue(job("any", serde_json::json!(1)));
    let running = start(&store, StoreFailsOnce(AtomicUsize::new(0)), fast_options());
    wait_for_state(&store, id, JobState::Completed).await;
    let report = running.stop().await;
    assert_eq!(store.get(id).expect("the job").num_failures, 0);
    assert_eq!(
        (report.count("interrupted"), report.count("completed")),
        (1, 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_worker_wakes_when_a_scheduled_job_comes_due_not_at_its_next_poll() {
    let store = MemoryStore::new();
    let options = WorkerOptions {
        poll_interval: Duration::from_secs(30),
        ..fast_options()
    };
    let running = start(&store, Scripted, options);
    // Let the worker go idle first: its wait then covers the due time.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let due = Utc::now() + chrono::TimeDelta::milliseconds(300);
    let id = store.enqueue(job("ok", serde_json::json!(1)).process_after(due));
    wait_for_state(&store, id, JobState::Completed).await;
    let late = Utc::now() - due;
    running.stop().await;
    assert!(
        late < chrono::TimeDelta::seconds(2),
        "started {late} after it came due; the poll interval is 30 s"
    );
}
