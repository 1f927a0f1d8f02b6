//! Helpers shared by the worker tests.

#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use queue_core::{CancellationToken, Handler, JobState};
use queue_store_memory::MemoryStore;
use queue_worker::{Worker, WorkerOptions, WorkerReport};
use tokio::task::JoinHandle;

/// Options with short intervals so tests run fast.
pub fn fast_options() -> WorkerOptions {
    WorkerOptions {
        poll_interval: Duration::from_millis(20),
        heartbeat_interval: Duration::from_millis(20),
        cancel_grace: Duration::from_millis(200),
        shutdown_timeout: Duration::from_secs(5),
        ..WorkerOptions::default()
    }
}

/// A running worker and the token that stops it.
pub struct Running {
    pub shutdown: CancellationToken,
    pub task: JoinHandle<Result<WorkerReport, queue_worker::WorkerError>>,
}

impl Running {
    /// Shuts the worker down and returns its report.
    pub async fn stop(self) -> WorkerReport {
        self.shutdown.cancel();
        self.task
            .await
            .expect("worker task panicked")
            .expect("worker failed")
    }
}

/// Starts a worker over `store` with `handler`.
pub fn start<H: Handler<MemoryStore>>(
    store: &MemoryStore,
    handler: H,
    options: WorkerOptions,
) -> Running {
    let worker = Worker::new(store.clone(), handler, options).expect("valid options");
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(worker.run(shutdown.clone()));
    Running { shutdown, task }
}

/// Waits until `condition` holds, failing the test after 10 s.
pub async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !condition().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until job `id` is in `state`.
pub async fn wait_for_state(store: &MemoryStore, id: i64, state: JobState) {
    eventually(&format!("job {id} is {state}"), || async {
        store.get(id).map(|j| j.state) == Some(state)
    })
    .await;
}
