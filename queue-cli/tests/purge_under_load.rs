//! `queue purge` of 200,000 finished jobs while a worker drains a steady
//! stream from the same table: the purge completes in batches, and no
//! claim waits on it for long. A prober claims one job at a time beside
//! the worker and times every claim; the test fails if any took a second.
//! Run with `--nocapture` to see the figures.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use queue_core::testkit::Succeeds;
use queue_core::{CancellationToken, NewJob};
use queue_store_postgres::{ExecutionMode, JobTable, PgStore};
use queue_worker::{Worker, WorkerOptions};
use support::Setup;

const FINISHED: i64 = 200_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purging_200k_finished_jobs_never_holds_up_a_claim_for_a_second() {
    let Some(t) =
        Setup::new("purging_200k_finished_jobs_never_holds_up_a_claim_for_a_second").await
    else {
        return;
    };
    let jobs = JobTable::new(&t.schema, "queue_jobs").expect("valid names");
    jobs.migrate(&t.pool).await.expect("migration");
    let table = jobs.name().quoted();
    t.sql(&format!(
        "INSERT INTO {table} (kind, state, finished_at) \
         SELECT 'old', 'completed', now() - interval '40 days' FROM generate_series(1, {FINISHED});
         ANALYZE {table}"
    ))
    .await;

    let store = PgStore::default_table(
        t.pool.clone(),
        jobs.store_options().mode(ExecutionMode::Lease),
    )
    .await
    .expect("a store");
    let stop = CancellationToken::new();
    let worker = Worker::new(
        store.clone(),
        Succeeds,
        WorkerOptions::default().handlers(16),
    )
    .expect("a worker");
    let worker = tokio::spawn(worker.run(stop.clone()));

    // A steady stream of new jobs for the worker while the purge runs.
    let feeding = Arc::new(AtomicBool::new(true));
    let fed = Arc::new(AtomicU64::new(0));
    let feeder = {
        let (jobs, pool, feeding, fed) =
            (jobs.clone(), t.pool.clone(), feeding.clone(), fed.clone());
        tokio::spawn(async move {
            while feeding.load(Ordering::SeqCst) {
                let batch: Vec<NewJob> = (0..200)
                    .map(|n| NewJob::new("new", serde_json::json!(n)))
                    .collect();
                jobs.enqueue_many(&pool, &batch).await.expect("enqueue");
                fed.fetch_add(200, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    // The prober: one claim at a time beside the worker, each timed.
    let prober = tokio::spawn(queue_core::testkit::probe_claims(
        store.clone(),
        feeding.clone(),
        Arc::default(),
    ));

    tokio::time::sleep(Duration::from_millis(300)).await;
    let config = t.config("");
    let mut purge = t.queue(
        &config,
        &[
            "purge",
            "--older-than",
            "30d",
            "--state",
            "completed",
            "--yes",
            "--json",
        ],
    );
    let started = Instant::now();
    let output = tokio::task::spawn_blocking(move || purge.output())
        .await
        .expect("the purge task")
        .expect("the queue binary runs");
    let took = started.elapsed();
    feeding.store(false, Ordering::SeqCst);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("the purge's JSON report");
    feeder.await.expect("the feeder");
    let mut waits = prober.await.expect("the prober");

    // The worker drains what was fed, and only the old jobs were purged.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {table} WHERE state IN ('queued', 'processing')"
        )))
        .fetch_one(&t.pool)
        .await
        .expect("count");
        if waiting == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{waiting} jobs never drained");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    let drained = worker.await.expect("the worker task").expect("the worker");
    let old: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {table} WHERE kind = 'old'"
    )))
    .fetch_one(&t.pool)
    .await
    .expect("count");

    waits.sort();
    let max = waits.last().copied().unwrap_or_default();
    let p99 = waits
        .get(waits.len().saturating_mul(99) / 100)
        .copied()
        .unwrap_or_default();
    println!(
        "purge: {} rows in {} batches in {:.1}s; meanwhile {} jobs fed, the worker completed {}; \
         prober: {} claims, p99 {:.1} ms, max {:.1} ms",
        report["purged"],
        report["batches"],
        took.as_secs_f64(),
        fed.load(Ordering::SeqCst),
        drained.count("completed"),
        waits.len(),
        p99.as_secs_f64() * 1000.0,
        max.as_secs_f64() * 1000.0
    );
    assert_eq!(report["purged"], FINISHED, "every old job purged");
    // Many short transactions, a purge's default batch each.
    let batches = FINISHED as u64 / u64::from(queue_core::DEFAULT_PURGE_BATCH);
    assert!(
        report["batches"].as_u64().is_some_and(|b| b >= batches),
        "{report}"
    );
    assert_eq!(old, 0);
    assert!(waits.len() > 10, "the prober claimed during the purge");
    assert!(
        max < Duration::from_secs(1),
        "a claim waited {max:?} during the purge"
    );
}
