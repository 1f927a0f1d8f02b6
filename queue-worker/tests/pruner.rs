//! The pruner loop: finished jobs past their state's retention are removed
//! on its interval while recent ones, states without an age and unfinished
//! jobs stay; options that could never prune are refused.

mod common;

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use common::eventually;
use queue_core::{
    CancellationToken, ClaimParams, Clock, JobState, NewJob, Retention, Store, Transition,
};
use queue_store_memory::{ManualClock, MemoryStore};
use queue_worker::{Pruner, PrunerOptions};

/// Claims `id` and ends it with `transition` at the clock's time.
async fn finish(store: &MemoryStore, clock: &ManualClock, transition: Transition) -> i64 {
    let mut claimed = store
        .claim(ClaimParams {
            limit: 1,
            worker: "w",
            conditions: None,
            now: clock.now(),
        })
        .await
        .unwrap();
    let job = claimed.pop().expect("a job to claim");
    let id = job.lease.id;
    let written = store
        .finish(job.job_store, &job.lease, transition, clock.now())
        .await
        .unwrap();
    assert!(written.is_applied());
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pruner_removes_finished_jobs_once_past_their_retention() {
    let clock = ManualClock::new(Utc::now());
    let store = MemoryStore::with_clock(Arc::new(clock.clone()));
    for n in 0..4 {
        store.enqueue(NewJob::new("k", serde_json::json!(n)));
    }
    let old_completed = finish(&store, &clock, Transition::Complete).await;
    let old_failed = finish(
        &store,
        &clock,
        Transition::Fail {
            message: "x".into(),
        },
    )
    .await;
    clock.advance(Duration::from_secs(2 * 3600));
    let recent = finish(&store, &clock, Transition::Complete).await;
    let waiting = store.enqueue(NewJob::new("k", serde_json::json!("waits")));

    let pruner = Pruner::new(
        store.clone(),
        PrunerOptions {
            interval: Duration::from_millis(20),
            retention: Retention {
                completed: Some(Duration::from_secs(3600)),
                ..Retention::default()
            },
            clock: Arc::new(clock.clone()),
        },
    )
    .expect("valid options");
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(pruner.run(shutdown.clone()));
    eventually("the old completed job is removed", || async {
        store.get(old_completed).is_none()
    })
    .await;
    assert!(store.get(recent).is_some(), "a recent one stays");
    assert_eq!(
        store.get(old_failed).map(|j| j.state),
        Some(JobState::Failed),
        "a state without an age is kept"
    );
    assert!(
        store.get(waiting).is_some(),
        "unfinished jobs are never pruned"
    );
    // Once it is older than an hour, the next pass takes the recent one too.
    clock.advance(Duration::from_secs(3601));
    eventually("the formerly recent job is removed", || async {
        store.get(recent).is_none()
    })
    .await;
    shutdown.cancel();
    running.await.unwrap().expect("the pruner stops cleanly");
}

#[test]
fn a_pruner_that_could_never_prune_is_refused() {
    let store = MemoryStore::new();
    let keeps_all = Pruner::new(store.clone(), PrunerOptions::default());
    assert!(
        matches!(&keeps_all, Err(e) if e.to_string().contains("set an age")),
        "{:?}",
        keeps_all.err()
    );
    let no_batch = Pruner::new(
        store,
        PrunerOptions {
            retention: Retention {
                batch: 0,
                ..Retention::all(Duration::from_secs(60))
            },
            ..PrunerOptions::default()
        },
    );
    assert!(
        matches!(&no_batch, Err(e) if e.to_string().contains("batch")),
        "{:?}",
        no_batch.err()
    );
}
