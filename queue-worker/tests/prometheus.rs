//! `metrics::serve_prometheus`: one line gives a worker process a
//! Prometheus endpoint with the worker's counters.

#![cfg(feature = "prometheus")]

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use async_trait::async_trait;
use common::{eventually, fast_options, start};
use queue_core::{Handler, Job, JobContext, JobError, JobState, NewJob};
use queue_store_memory::MemoryStore;

struct Succeeds;

#[async_trait]
impl Handler<MemoryStore> for Succeeds {
    async fn handle(&self, _: &JobContext, _: &mut MemoryStore, _: &Job) -> Result<(), JobError> {
        Ok(())
    }
}

fn scrape(port: u16) -> String {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("the endpoint");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("a request");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("an answer");
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_line_serves_the_workers_metrics() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    queue_worker::metrics::serve_prometheus(([127, 0, 0, 1], port).into())
        .expect("the endpoint starts");
    let store = MemoryStore::new();
    store.enqueue_many((0..5).map(|n| NewJob::new("k", serde_json::json!(n))));
    let running = start(&store, Succeeds, fast_options());
    eventually("the jobs completed", || async {
        store.count_by_state().get(&JobState::Completed) == Some(&5)
    })
    .await;
    running.stop().await;
    let mut answer = String::new();
    for _ in 0..50 {
        answer = tokio::task::spawn_blocking(move || scrape(port))
            .await
            .expect("the scrape");
        if answer.contains("queue_jobs_processed_total") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.contains("queue_jobs_processed_total{kind=\"k\",outcome=\"completed\"} 5"),
        "{answer}"
    );
    assert!(answer.contains("queue_job_duration_seconds"), "{answer}");
}
