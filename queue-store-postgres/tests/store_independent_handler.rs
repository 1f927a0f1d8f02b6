//! A handler that needs nothing of the store (`JobHandler`) is one type
//! for every store: the same `Mailer` drains the memory store, as a test
//! would, and Postgres in both modes, as production does.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use queue_core::{
    CancellationToken, Job, JobArgs, JobContext, JobError, JobHandler, NewJob, Store,
};
use queue_store_memory::MemoryStore;
use queue_store_postgres::{ExecutionMode, PgStore};
use queue_worker::{Router, Worker, WorkerOptions};
use support::{count_in, fresh_table, pool};

#[derive(serde::Serialize, serde::Deserialize)]
struct SendEmail {
    to: String,
}

impl JobArgs for SendEmail {
    const KIND: &'static str = "send_email";
}

/// Counts the emails it was given; refuses one without a recipient.
struct Mailer(Arc<AtomicUsize>);

#[async_trait]
impl JobHandler<SendEmail> for Mailer {
    async fn handle(&self, _: &JobContext, email: SendEmail) -> Result<(), JobError> {
        if !email.to.contains('@') {
            return Err(JobError::poison("no recipient"));
        }
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// The one router both stores run: it names no store.
fn router<S: Store<Record = Job>>(sent: &Arc<AtomicUsize>) -> Router<S> {
    Router::new().work::<SendEmail>(Mailer(sent.clone()))
}

fn emails(n: usize) -> Vec<NewJob> {
    (0..n)
        .map(|i| {
            NewJob::from_args(&SendEmail {
                to: format!("user{i}@example.com"),
            })
            .expect("encodes")
        })
        .collect()
}

/// Runs `store` with the router until `done` says so (or 20 s pass).
async fn drain<S, F, Fut>(store: S, sent: &Arc<AtomicUsize>, done: F)
where
    S: Store<Record = Job> + Clone,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let options = WorkerOptions {
        poll_interval: Duration::from_millis(20),
        ..WorkerOptions::default()
    };
    let worker = Worker::new(store, router::<S>(sent), options).expect("a worker");
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(worker.run(shutdown.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !done().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the drain never ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    running.await.expect("joined").expect("the worker ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_handler_type_drains_the_memory_store_and_postgres() {
    // The memory store, as a service's tests run it.
    let sent = Arc::new(AtomicUsize::new(0));
    let memory = MemoryStore::new();
    for job in emails(20) {
        memory.enqueue(job);
    }
    let count = sent.clone();
    drain(memory, &sent, || {
        let count = count.clone();
        async move { count.load(Ordering::SeqCst) == 20 }
    })
    .await;

    // Postgres, in both modes.
    let Some(pool) = pool("one_handler_type_drains_the_memory_store_and_postgres").await else {
        return;
    };
    for mode in [ExecutionMode::Transactional, ExecutionMode::Lease] {
        let table = fresh_table(&pool).await;
        table
            .enqueue_many(&pool, &emails(20))
            .await
            .expect("enqueued");
        let store: PgStore<Job> =
            PgStore::default_table(pool.clone(), table.store_options().mode(mode))
                .await
                .expect("a store");
        let sent = Arc::new(AtomicUsize::new(0));
        let (pool, table) = (pool.clone(), table.clone());
        drain(store, &sent, move || {
            let (pool, table) = (pool.clone(), table.clone());
            async move { count_in(&pool, &table, "completed").await == 20 }
        })
        .await;
        assert_eq!(sent.load(Ordering::SeqCst), 20, "{mode:?}");
    }
}
