//! The worker-budget pattern: the summed cost of running jobs never exceeds
//! the capacity, every job that fits eventually runs, and one that can never
//! fit is left queued.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::{eventually, fast_options, start};
use queue_core::{Handler, Job, JobContext, JobError, JobState, NewJob};
use queue_store_memory::{MemoryCondition, MemoryStore};
use queue_worker::Budget;

fn cost(job: &Job) -> u64 {
    job.payload["cost"].as_u64().unwrap_or(1)
}

#[derive(Default)]
struct Load {
    now: AtomicU64,
    peak: AtomicU64,
}

#[async_trait]
impl Handler<MemoryStore> for Load {
    async fn handle(&self, _: &JobContext, _: &mut MemoryStore, job: &Job) -> Result<(), JobError> {
        let now = self.now.fetch_add(cost(job), Ordering::SeqCst) + cost(job);
        self.peak.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(2 + cost(job))).await;
        self.now.fetch_sub(cost(job), Ordering::SeqCst);
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_cost_stays_within_the_budget() {
    const CAPACITY: u64 = 10;
    let store = MemoryStore::new();
    let mut rng = fastrand::Rng::with_seed(7);
    let fitting: Vec<i64> = (0..80)
        .map(|_| {
            store.enqueue(NewJob::new(
                "work",
                serde_json::json!({ "cost": rng.u64(1..=CAPACITY) }),
            ))
        })
        .collect();
    let too_big = store.enqueue(NewJob::new(
        "work",
        serde_json::json!({ "cost": CAPACITY + 1 }),
    ));

    let load = Arc::new(Load::default());
    let budget = Budget::new(load.clone(), CAPACITY, cost, |headroom| {
        MemoryCondition::new(move |job| cost(job) <= headroom)
    });
    let running = start(&store, budget, fast_options().handlers(8));
    eventually("every job that fits completed", || async {
        fitting
            .iter()
            .all(|&id| store.get(id).map(|j| j.state) == Some(JobState::Completed))
    })
    .await;
    running.stop().await;

    let peak = load.peak.load(Ordering::SeqCst);
    assert!(
        peak <= CAPACITY,
        "peak running cost {peak} exceeded the capacity {CAPACITY}"
    );
    assert!(peak > 1, "jobs ran concurrently (peak {peak})");
    assert_eq!(
        store.get(too_big).unwrap().state,
        JobState::Queued,
        "a job costing more than the capacity is never claimed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headroom_is_returned_after_each_job() {
    let store = MemoryStore::new();
    let ids =
        store.enqueue_many((0..5).map(|_| NewJob::new("work", serde_json::json!({ "cost": 4 }))));
    let budget = Arc::new(Budget::new(
        Arc::new(Load::default()),
        4,
        cost,
        |headroom| MemoryCondition::new(move |job| cost(job) <= headroom),
    ));
    let running = start(&store, budget.clone(), fast_options());
    eventually("all jobs completed", || async {
        ids.iter()
            .all(|&id| store.get(id).map(|j| j.state) == Some(JobState::Completed))
    })
    .await;
    running.stop().await;
    assert_eq!(budget.headroom(), 4, "PostHandle gave back all headroom");
}
