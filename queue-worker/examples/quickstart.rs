//! The README's example: a worker with a router and a resetter, stopped by SIGINT or SIGTERM.
//!
//! Run with `cargo run -p queue-worker --example quickstart`; stop it with Ctrl-C.

use async_trait::async_trait;
use queue_core::{Handler, Job, JobContext, JobError, NewJob};
use queue_store_memory::MemoryStore;
use queue_worker::{shutdown, Resetter, ResetterOptions, Router, Worker, WorkerOptions};

struct SendEmail;

#[async_trait]
impl Handler<MemoryStore> for SendEmail {
    async fn handle(
        &self,
        ctx: &JobContext,
        _: &mut MemoryStore,
        job: &Job,
    ) -> Result<(), JobError> {
        #[derive(serde::Deserialize)]
        struct Email {
            to: String,
        }
        let email: Email = job.payload_as()?; // a bad payload fails the job at once
        if email.to.is_empty() {
            return Err(JobError::poison("no recipient")); // never retried
        }
        let _ = ctx.attempt(); // retryable errors come back with backoff
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let store = MemoryStore::new();
    store.enqueue(NewJob::new(
        "email",
        serde_json::json!({ "to": "ops@example.com" }),
    ));
    let stop = shutdown::on_signals();
    let router = Router::new().route("email", SendEmail);
    let worker = Worker::new(store.clone(), router, WorkerOptions::default().handlers(8))?;
    let resetter = Resetter::new(store.clone(), ResetterOptions::default())?;
    tokio::spawn(resetter.run(stop.clone()));
    worker.run(stop).await?; // until SIGINT/SIGTERM, then a graceful shutdown
    Ok(())
}
