//! The pruner on Postgres: 1,000,000 finished jobs past their retention
//! are removed in batches while a worker drains a steady stream from the
//! same table; every old job goes, nothing else does, and no claim beside
//! them waits a second. Run with `--nocapture` to see the figures.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use queue_core::testkit::Succeeds;
use queue_core::{Admin, CancellationToken, Job, JobState, NewJob, PurgeParams, Retention};
use queue_store_postgres::{ExecutionMode, PgStore};
use queue_worker::{Pruner, PrunerOptions, Worker, WorkerOptions};
use support::{fresh_table, pool};

const FINISHED: i64 = 1_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pruner_removes_a_million_old_jobs_while_a_worker_drains() {
    let Some(pool) = pool("the_pruner_removes_a_million_old_jobs_while_a_worker_drains").await
    else {
        return;
    };
    let jobs = fresh_table(&pool).await;
    let table = jobs.name().quoted();
    // Old jobs in each final state; failed ones are kept (no age), and the
    // completed ones of yesterday are too young.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {table} (kind, state, finished_at) \
         SELECT 'old', CASE WHEN n % 10 = 0 THEN 'canceled' ELSE 'completed' END, \
                now() - interval '40 days' FROM generate_series(1, {FINISHED}) AS n; \
         INSERT INTO {table} (kind, state, finished_at) \
         SELECT 'kept', 'failed', now() - interval '40 days' FROM generate_series(1, 100); \
         INSERT INTO {table} (kind, state, finished_at) \
         SELECT 'kept', 'completed', now() - interval '1 day' FROM generate_series(1, 100); \
         ANALYZE {table}"
    )))
    .execute(&pool)
    .await
    .expect("the finished jobs");

    let store = PgStore::default_table(
        pool.clone(),
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

    // A steady stream of new jobs for the worker while the pruner runs.
    let feeding = Arc::new(AtomicBool::new(true));
    let fed = Arc::new(AtomicU64::new(0));
    let feeder = {
        let (jobs, pool, feeding, fed) = (jobs.clone(), pool.clone(), feeding.clone(), fed.clone());
        tokio::spawn(async move {
            while feeding.load(Ordering::SeqCst) {
                let batch: Vec<NewJob> = (0..100)
                    .map(|n| NewJob::new("new", serde_json::json!(n)))
                    .collect();
                jobs.enqueue_many(&pool, &batch).await.expect("enqueue");
                fed.fetch_add(100, Ordering::SeqCst);
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

    let thirty_days = Duration::from_secs(30 * 24 * 3600);
    let pruner = Pruner::new(
        store.clone(),
        PrunerOptions {
            interval: Duration::from_millis(100),
            retention: Retention {
                completed: Some(thirty_days),
                canceled: Some(thirty_days),
                batch: 5_000,
                ..Retention::default()
            },
            ..PrunerOptions::default()
        },
    )
    .expect("a pruner");
    let pruning = tokio::spawn(pruner.run(stop.clone()));
    let count = |sql: String| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(sql.to_owned()))
                .fetch_one(&pool)
                .await
                .expect("count")
        }
    };
    let started = Instant::now();
    loop {
        let old = count(format!("SELECT count(*) FROM {table} WHERE kind = 'old'")).await;
        if old == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "{old} old jobs left after five minutes"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let took = started.elapsed();
    feeding.store(false, Ordering::SeqCst);
    feeder.await.expect("the feeder");
    let mut waits = prober.await.expect("the prober");

    // The worker drains what was fed; nothing but the old jobs went.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let waiting = count(format!(
            "SELECT count(*) FROM {table} WHERE state IN ('queued', 'processing')"
        ))
        .await;
        if waiting == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{waiting} jobs never drained");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    let drained = worker.await.expect("the worker task").expect("the worker");
    pruning.await.expect("the pruner task").expect("the pruner");
    let kept = count(format!("SELECT count(*) FROM {table} WHERE kind = 'kept'")).await;
    let new = count(format!("SELECT count(*) FROM {table} WHERE kind = 'new'")).await;

    waits.sort();
    let max = waits.last().copied().unwrap_or_default();
    let p99 = waits
        .get(waits.len().saturating_mul(99) / 100)
        .copied()
        .unwrap_or_default();
    println!(
        "pruner: {FINISHED} rows in {:.1}s; meanwhile {} jobs fed, the worker completed {}; \
         prober: {} claims, p99 {:.1} ms, max {:.1} ms",
        took.as_secs_f64(),
        fed.load(Ordering::SeqCst),
        drained.count("completed"),
        waits.len(),
        p99.as_secs_f64() * 1000.0,
        max.as_secs_f64() * 1000.0
    );
    assert_eq!(kept, 200, "failed jobs (no age) and young ones stay");
    assert_eq!(
        new as u64,
        fed.load(Ordering::SeqCst),
        "the new jobs (completed today) stay"
    );
    assert!(waits.len() > 10, "the prober claimed while the pruner ran");
    assert!(
        max < Duration::from_secs(1),
        "a claim waited {max:?} while the pruner ran"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_archive_purged_jobs_move_there_whole_instead_of_being_deleted() {
    let Some(pool) = pool("with_an_archive_purged_jobs_move_there").await else {
        return;
    };
    let jobs = fresh_table(&pool).await;
    let table = jobs.name().quoted();
    jobs.create_archive(&pool).await.expect("the archive");
    let archive = format!(
        "{}.\"{}\"",
        jobs.name().schema.quoted(),
        jobs.archive_name()
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {table} (kind, payload, state, failure_message, finished_at) \
         SELECT 'old', jsonb_build_object('n', n), 'failed', 'boom ' || n, now() - interval '40 days' \
         FROM generate_series(1, 5) AS n; \
         INSERT INTO {table} (kind, state, finished_at) VALUES ('young', 'failed', now())"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let store = PgStore::default_table(
        pool.clone(),
        jobs.store_options()
            .archive_table(&jobs.archive_name())
            .expect("a valid name"),
    )
    .await
    .expect("a store with an archive");
    let retention = Retention {
        failed: Some(Duration::from_secs(30 * 24 * 3600)),
        batch: 2,
        ..Retention::default()
    };
    let report = queue_core::prune(&store, &retention, chrono::Utc::now(), |_, _| {})
        .await
        .expect("a pass");
    assert_eq!(report.total(), 5);
    let left: Vec<String> =
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT kind FROM {table}")))
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(left, ["young"]);
    let moved: Vec<(String, serde_json::Value, String)> = sqlx::query_as(sqlx::AssertSqlSafe(
        format!("SELECT kind, payload, failure_message FROM {archive} ORDER BY id"),
    ))
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(moved.len(), 5, "{moved:?}");
    assert_eq!(
        moved[0],
        (
            "old".to_owned(),
            serde_json::json!({"n": 1}),
            "boom 1".to_owned()
        ),
        "whole rows move"
    );

    // An operator's delete still deletes.
    let young: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT id FROM {table}")))
        .fetch_one(&pool)
        .await
        .unwrap();
    queue_core::Admin::delete(&store, &queue_core::Targets::Ids(vec![young]))
        .await
        .unwrap();
    let archived: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {archive}"
    )))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(archived, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_narrower_archive_is_refused_at_start_up_with_the_fix() {
    let Some(pool) = pool("a_missing_or_narrower_archive_is_refused").await else {
        return;
    };
    let jobs = fresh_table(&pool).await;
    let options = || {
        jobs.store_options()
            .archive_table(&jobs.archive_name())
            .expect("a valid name")
    };
    let missing = PgStore::<Job>::default_table(pool.clone(), options())
        .await
        .expect_err("no archive yet")
        .to_string();
    assert!(
        missing.contains("does not exist") && missing.contains("(LIKE"),
        "{missing}"
    );
    jobs.create_archive(&pool).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER TABLE {}.\"{}\" DROP COLUMN payload",
        jobs.name().schema.quoted(),
        jobs.archive_name()
    )))
    .execute(&pool)
    .await
    .unwrap();
    let narrower = PgStore::<Job>::default_table(pool.clone(), options())
        .await
        .expect_err("the archive lacks a column")
        .to_string();
    assert!(
        narrower.contains("no column \"payload\"")
            && narrower.contains("ADD COLUMN \"payload\" jsonb"),
        "{narrower}"
    );
}

/// A purge takes the oldest finished jobs first and each batch reads on
/// from the latest finish time of the one before (`PurgeReport::
/// last_finished`), so old jobs interleaved with younger ones are all
/// removed and the younger ones kept. A purge stopped part way loses
/// nothing, and the pruner, started again from nothing, finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_reads_on_from_its_last_batch_and_a_stopped_one_finishes_when_run_again() {
    let Some(pool) = pool("a_purge_reads_on_from_its_last_batch").await else {
        return;
    };
    let jobs = fresh_table(&pool).await;
    let table = jobs.name().quoted();
    // Odd keys: old, each a millisecond after the one before; even keys:
    // an hour old.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {table} (kind, state, finished_at) \
         SELECT CASE WHEN n % 2 = 1 THEN 'old' ELSE 'young' END, 'completed', \
                CASE WHEN n % 2 = 1 THEN now() - interval '40 days' + n * interval '1 millisecond' \
                ELSE now() - interval '1 hour' END \
         FROM generate_series(1, 60000) AS n; ANALYZE {table}"
    )))
    .execute(&pool)
    .await
    .expect("the finished jobs");
    let admin = queue_store_postgres::PgAdmin::<i64>::new(pool.clone(), jobs.store_options())
        .await
        .expect("an admin");
    let count = |kind: &'static str| {
        let pool = pool.clone();
        let table = table.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(format!(
                "SELECT count(*) FROM {table} WHERE kind = $1"
            )))
            .bind(kind)
            .fetch_one(&pool)
            .await
            .expect("a count")
        }
    };
    let cutoff = chrono::Utc::now() - chrono::TimeDelta::days(1);
    let mut params = PurgeParams::new(vec![JobState::Completed], cutoff, 1_000);
    let mut last = None;
    for _ in 0..10 {
        let report = Admin::purge(&admin, &params).await.expect("a batch");
        assert_eq!(report.purged, 1_000);
        let latest = report
            .last_finished
            .expect("the batch's latest finish time");
        assert!(
            last.is_none_or(|l| l < latest),
            "oldest first, on from the last"
        );
        last = Some(latest);
        params.finished_from = Some(latest);
    }
    assert_eq!(count("old").await, 20_000, "ten batches of the oldest");
    // Stopped here. The pruner starts again from nothing and finishes.
    let retention = Retention {
        completed: Some(Duration::from_secs(86_400)),
        batch: 1_000,
        pause: Duration::ZERO,
        ..Retention::default()
    };
    let pruned = queue_core::prune(&admin, &retention, chrono::Utc::now(), |_, _| {})
        .await
        .expect("the pruner");
    assert_eq!(pruned.total(), 20_000);
    assert_eq!(count("old").await, 0, "every old job is gone");
    assert_eq!(count("young").await, 30_000, "every younger one stays");
}

/// A purge's batch takes no row locks (a lock on each row before its
/// delete doubled the batch's cost), so it guards each row by its place: a
/// finished job that another transaction changes while the batch waits on
/// it (here retried: queued again) is left as it now is, and the batch
/// reports it found but did not remove it. A row only held, never
/// changed, is removed once its holder lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_purge_leaves_a_job_changed_while_it_waited_and_says_it_found_it() {
    let Some(pool) = pool("a_purge_leaves_a_job_changed_while_it_waited").await else {
        return;
    };
    let jobs = fresh_table(&pool).await;
    let table = jobs.name().quoted();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {table} (kind, state, finished_at) \
         SELECT 'old', 'completed', now() - interval '40 days' FROM generate_series(1, 10); \
         ANALYZE {table}"
    )))
    .execute(&pool)
    .await
    .expect("the finished jobs");
    let ids: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT id FROM {table} ORDER BY id"
    )))
    .fetch_all(&pool)
    .await
    .expect("the keys");
    let (retried, held) = (ids[0], ids[1]);
    let admin = queue_store_postgres::PgAdmin::<i64>::new(pool.clone(), jobs.store_options())
        .await
        .expect("an admin");

    // One transaction queues the first job again, another only holds the
    // second's row; neither has ended when the purge starts.
    let mut retrying = pool.begin().await.expect("a transaction");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {table} SET state = 'queued', finished_at = NULL WHERE id = $1"
    )))
    .bind(retried)
    .execute(&mut *retrying)
    .await
    .expect("the retry");
    let mut holding = pool.begin().await.expect("a transaction");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT 1 FROM {table} WHERE id = $1 FOR KEY SHARE"
    )))
    .bind(held)
    .execute(&mut *holding)
    .await
    .expect("the hold");

    let purge = {
        let params = PurgeParams::new(
            vec![JobState::Completed],
            chrono::Utc::now() - chrono::TimeDelta::days(30),
            100,
        );
        tokio::spawn(async move { Admin::purge(&admin, &params).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !purge.is_finished(),
        "the purge waits for the rows others hold"
    );
    retrying.commit().await.expect("the retry commits");
    holding.rollback().await.expect("the hold ends");
    let report = purge.await.expect("the purge's task").expect("the purge");
    assert_eq!(report.found, 10, "it found every old job");
    assert_eq!(report.purged, 9, "it removed all but the retried one");
    let left: Vec<(i64, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT id, state FROM {table} ORDER BY id"
    )))
    .fetch_all(&pool)
    .await
    .expect("what is left");
    assert_eq!(left, vec![(retried, "queued".to_owned())]);
}

/// Two purges at once over the same old jobs, a pruner and an operator's
/// purge operation: each job is removed once and counted once, neither
/// stops while old jobs are left (a batch whose jobs the other took first
/// removes none, yet found some), and every old job is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pruner_and_a_purge_operation_at_once_remove_every_old_job_once() {
    let Some(pool) = pool("a_pruner_and_a_purge_operation_at_once").await else {
        return;
    };
    let jobs = fresh_table(&pool).await;
    let table = jobs.name().quoted();
    const OLD: u64 = 40_000;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {table} (kind, state, finished_at) \
         SELECT 'old', 'completed', now() - interval '40 days' + n * interval '1 millisecond' \
         FROM generate_series(1, {OLD}) AS n; \
         INSERT INTO {table} (kind, state, finished_at) \
         SELECT 'young', 'completed', now() - interval '1 hour' FROM generate_series(1, 100); \
         ANALYZE {table}"
    )))
    .execute(&pool)
    .await
    .expect("the finished jobs");
    let admin = Arc::new(
        queue_store_postgres::PgAdmin::<i64>::new(pool.clone(), jobs.store_options())
            .await
            .expect("an admin"),
    );
    let filter = queue_core::JobFilter::default()
        .states([JobState::Completed])
        .finished_before(chrono::Utc::now() - chrono::TimeDelta::days(30));
    let op = admin
        .create_operation(
            &queue_core::NewOperation::new(queue_core::OperationAction::Purge, filter, "test", OLD)
                .batch(500),
        )
        .await
        .expect("the operation");
    let taken = admin
        .take_operation(&queue_core::TakeOperation::id("test", op.id))
        .await
        .expect("taking it")
        .expect("it is free");
    let operating = {
        let admin = admin.clone();
        tokio::spawn(async move {
            queue_core::run_operation(
                &*admin,
                taken,
                "test",
                &CancellationToken::new(),
                queue_core::RunOptions::new(Duration::ZERO, queue_core::StopAs::HandedBack),
                |_| {},
            )
            .await
        })
    };
    let retention = Retention {
        completed: Some(Duration::from_secs(30 * 86_400)),
        batch: 500,
        pause: Duration::ZERO,
        ..Retention::default()
    };
    let pruned = queue_core::prune(&*admin, &retention, chrono::Utc::now(), |_, _| {})
        .await
        .expect("the pruner");
    let done = operating
        .await
        .expect("the operation's task")
        .expect("the operation");
    assert_eq!(done.state, queue_core::OperationState::Done);
    assert_eq!(
        pruned.total() + done.done,
        OLD,
        "each old job removed once, and counted once (pruner {}, operation {})",
        pruned.total(),
        done.done
    );
    let left: Vec<(String, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT kind, count(*) FROM {table} GROUP BY kind ORDER BY kind"
    )))
    .fetch_all(&pool)
    .await
    .expect("what is left");
    assert_eq!(left, vec![("young".to_owned(), 100)]);
}
