//! The resetter loop: a job whose worker died is found stalled, queued again
//! and then completed by a live worker; past the reset limit it fails.

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::{fast_options, start, wait_for_state};
use queue_core::resetter::MAX_RESETS_MESSAGE;
use queue_core::{
    CancellationToken, ClaimParams, Clock, Handler, Job, JobContext, JobError, JobState, NewJob,
    Store,
};
use queue_store_memory::{ManualClock, MemoryStore};
use queue_worker::{Resetter, ResetterOptions};

struct Ok_;

#[async_trait]
impl Handler<MemoryStore> for Ok_ {
    async fn handle(&self, _: &JobContext, _: &mut MemoryStore, _: &Job) -> Result<(), JobError> {
        Ok(())
    }
}

/// A worker that claims and then dies without a trace.
async fn claim_and_die(store: &MemoryStore, clock: &ManualClock) {
    let claimed = store
        .claim(ClaimParams {
            limit: 10,
            worker: "doomed",
            conditions: None,
            now: clock.now(),
        })
        .await
        .unwrap();
    assert!(!claimed.is_empty());
}

fn options(clock: &ManualClock, max_resets: u32) -> ResetterOptions {
    ResetterOptions {
        interval: Duration::from_millis(10),
        stalled_max_age: Duration::from_secs(60),
        max_resets,
        clock: Arc::new(clock.clone()),
        ..ResetterOptions::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_workers_job_is_recovered_and_completed() {
    let clock = ManualClock::new(chrono::Utc::now());
    let store = MemoryStore::with_clock(Arc::new(clock.clone()));
    let id = store.enqueue(NewJob::new("k", serde_json::json!(null)));
    claim_and_die(&store, &clock).await;

    let resetter = Resetter::new(store.clone(), options(&clock, 3)).unwrap();
    let report = resetter.reset_once().await.unwrap();
    assert!(report.reset.is_empty(), "a fresh heartbeat is not stalled");

    clock.advance(Duration::from_secs(61));
    let shutdown = CancellationToken::new();
    let resetting = tokio::spawn(resetter.run(shutdown.clone()));
    let worker_options = queue_worker::WorkerOptions {
        clock: Arc::new(clock.clone()),
        ..fast_options()
    };
    let working = start(&store, Ok_, worker_options);
    wait_for_state(&store, id, JobState::Completed).await;
    working.stop().await;
    shutdown.cancel();
    resetting.await.unwrap().unwrap();
    assert_eq!(
        store.get(id).unwrap().num_resets,
        1,
        "the job was reset once, then completed"
    );
}

#[tokio::test]
async fn a_job_that_keeps_stalling_fails_past_the_reset_limit() {
    let clock = ManualClock::new(chrono::Utc::now());
    let store = MemoryStore::with_clock(Arc::new(clock.clone()));
    let id = store.enqueue(NewJob::new("k", serde_json::json!(null)));
    let resetter = Resetter::new(store.clone(), options(&clock, 2)).unwrap();
    for round in 0..3 {
        claim_and_die(&store, &clock).await;
        clock.advance(Duration::from_secs(61));
        let report = resetter.reset_once().await.unwrap();
        if round < 2 {
            assert_eq!(report.reset, vec![id], "round {round} resets the job");
        } else {
            assert_eq!(report.failed, vec![id], "the third stall fails it");
        }
    }
    let job = store.get(id).unwrap();
    assert_eq!((job.state, job.num_resets), (JobState::Failed, 2));
    assert_eq!(job.failure_message.as_deref(), Some(MAX_RESETS_MESSAGE));
}
