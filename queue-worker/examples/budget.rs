//! The worker-budget pattern: a worker with a capacity of 10 units runs jobs
//! whose cost is in their payload, never more than 10 units at once.
//!
//! Run with `cargo run -p queue-worker --example budget`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use queue_core::{CancellationToken, Handler, Job, JobContext, JobError, JobState, NewJob};
use queue_store_memory::{MemoryCondition, MemoryStore};
use queue_worker::{Budget, Worker, WorkerOptions};

/// The cost of a job: its payload's `cost` field.
fn cost(job: &Job) -> u64 {
    job.payload["cost"].as_u64().unwrap_or(1)
}

/// Simulates work proportional to the cost and tracks the load.
#[derive(Default)]
struct Render {
    load: AtomicU64,
    peak: AtomicU64,
}

#[async_trait]
impl Handler<MemoryStore> for Render {
    async fn handle(&self, _: &JobContext, _: &mut MemoryStore, job: &Job) -> Result<(), JobError> {
        let now = self.load.fetch_add(cost(job), Ordering::SeqCst) + cost(job);
        self.peak.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(5 * cost(job))).await;
        self.load.fetch_sub(cost(job), Ordering::SeqCst);
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let store = MemoryStore::new();
    for i in 0..60u64 {
        store.enqueue(NewJob::new(
            "render",
            serde_json::json!({ "cost": 1 + i % 7 }),
        ));
    }
    let render = Arc::new(Render::default());
    let budget = Budget::new(render.clone(), 10, cost, |headroom| {
        MemoryCondition::new(move |job| cost(job) <= headroom)
    });
    let options = WorkerOptions {
        poll_interval: Duration::from_millis(5),
        ..WorkerOptions::default().handlers(8)
    };
    let shutdown = CancellationToken::new();
    let worker = tokio::spawn(Worker::new(store.clone(), budget, options)?.run(shutdown.clone()));
    while store.count_by_state().get(&JobState::Completed) != Some(&60) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shutdown.cancel();
    let report = worker.await??;
    println!(
        "completed {} jobs; peak load {} of a budget of 10",
        report.count("completed"),
        render.peak.load(Ordering::SeqCst)
    );
    Ok(())
}
