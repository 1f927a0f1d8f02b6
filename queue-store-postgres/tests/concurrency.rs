//! Concurrency and crashes on a real server: two worker processes draining
//! 20,000 jobs (each completed exactly once), a worker process killed with
//! SIGKILL mid-job (its jobs recovered by the resetter, nothing lost, and in
//! transactional mode no trace of the killed attempts), several resetters at
//! once, and completion racing the resetter.

mod support;

use std::time::{Duration, Instant};

use chrono::Utc;
use queue_core::{ClaimParams, Delivery, Job, NewJob, ResetParams, Store, Transition};
use queue_store_postgres::{ExecutionMode, JobTable, PgJobTransaction, PgStore};
use sqlx::PgPool;
use support::{fresh_table, pool, scalar, spawn_worker};

fn runs_of(table: &JobTable) -> String {
    format!("{}.\"runs\"", table.name().schema.quoted())
}

async fn enqueue(pool: &PgPool, table: &JobTable, n: usize) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(5000) {
        let jobs: Vec<NewJob> = chunk
            .iter()
            .map(|i| NewJob::new("noop", serde_json::json!(i)))
            .collect();
        table.enqueue_many(pool, &jobs).await.expect("enqueue");
    }
}

async fn two_processes_drain_each_job_exactly_once(mode: &str, test: &str) {
    let Some(pool) = pool(test).await else { return };
    let table = fresh_table(&pool).await;
    const JOBS: usize = 20_000;
    enqueue(&pool, &table, JOBS).await;
    let started = Instant::now();
    let mut a = spawn_worker(&table, mode, 16, 0, &["--until-drained"]).await;
    let mut b = spawn_worker(&table, mode, 16, 0, &["--until-drained"]).await;
    let (sa, sb) = tokio::join!(
        tokio::time::timeout(Duration::from_secs(300), a.wait()),
        tokio::time::timeout(Duration::from_secs(300), b.wait())
    );
    assert!(sa
        .expect("worker a finished in time")
        .expect("wait")
        .success());
    assert!(sb
        .expect("worker b finished in time")
        .expect("wait")
        .success());
    eprintln!(
        "{test}: {JOBS} jobs drained by two processes in {:?}",
        started.elapsed()
    );

    let t = table.name().quoted();
    let runs = runs_of(&table);
    assert_eq!(
        scalar(
            &pool,
            &format!("SELECT count(*) FROM {t} WHERE state = 'completed'")
        )
        .await,
        JOBS as i64
    );
    assert_eq!(
        scalar(&pool, &format!("SELECT count(*) FROM {runs}")).await,
        JOBS as i64,
        "one run per job"
    );
    assert_eq!(
        scalar(&pool, &format!("SELECT count(DISTINCT job_id) FROM {runs}")).await,
        JOBS as i64,
        "no job ran twice"
    );
    let processes = scalar(&pool, &format!("SELECT count(DISTINCT pid) FROM {runs}")).await;
    assert_eq!(processes, 2, "both processes took part");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_lease_mode_processes_drain_20000_jobs_exactly_once() {
    two_processes_drain_each_job_exactly_once(
        "lease",
        "two_lease_mode_processes_drain_20000_jobs_exactly_once",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_transactional_processes_drain_20000_jobs_exactly_once() {
    two_processes_drain_each_job_exactly_once(
        "transactional",
        "two_transactional_processes_drain_20000_jobs_exactly_once",
    )
    .await;
}

async fn sigkill_mid_job_loses_nothing(mode: &str, test: &str) {
    let Some(pool) = pool(test).await else { return };
    let table = fresh_table(&pool).await;
    const JOBS: i64 = 40;
    enqueue(&pool, &table, JOBS as usize).await;
    let t = table.name().quoted();
    let runs = runs_of(&table);

    // A slow worker takes 8 jobs, then dies without a chance to clean up;
    // a healthy one with a short stalled age recovers and finishes all.
    kill_a_busy_worker_then_drain(
        &pool,
        &table,
        mode,
        &format!("SELECT count(*) FROM {t} WHERE state = 'processing'"),
    )
    .await;

    assert_eq!(
        scalar(
            &pool,
            &format!("SELECT count(*) FROM {t} WHERE state = 'completed'")
        )
        .await,
        JOBS,
        "nothing was lost"
    );
    assert_eq!(
        scalar(
            &pool,
            &format!("SELECT count(*) FROM {t} WHERE num_resets = 1")
        )
        .await,
        8,
        "the killed worker's jobs were reset once"
    );
    let run_rows = scalar(&pool, &format!("SELECT count(*) FROM {runs}")).await;
    if mode == "transactional" {
        assert_eq!(
            run_rows, JOBS,
            "no side effect of a killed attempt is visible"
        );
    } else {
        assert_eq!(
            run_rows,
            JOBS + 8,
            "lease mode is at least once: the killed attempts' writes remain"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_job_in_lease_mode_loses_nothing() {
    sigkill_mid_job_loses_nothing("lease", "sigkill_mid_job_in_lease_mode_loses_nothing").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_job_in_transactional_mode_leaves_no_trace() {
    sigkill_mid_job_loses_nothing(
        "transactional",
        "sigkill_mid_job_in_transactional_mode_leaves_no_trace",
    )
    .await;
}

async fn stalled_jobs(
    pool: &PgPool,
    mode: ExecutionMode,
    n: usize,
) -> (PgStore<Job>, chrono::DateTime<Utc>) {
    let table = fresh_table(pool).await;
    enqueue(pool, &table, n).await;
    let store = support::store(pool, &table, mode).await;
    let now = Utc::now();
    let claimed = store
        .claim(ClaimParams {
            limit: n,
            worker: "dead",
            conditions: None,
            now,
        })
        .await
        .unwrap();
    assert_eq!(claimed.len(), n);
    for c in claimed {
        c.job_store.abandon().await;
    }
    (store, now)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_resetters_reset_each_stalled_job_once() {
    let Some(pool) = pool("several_resetters_reset_each_stalled_job_once").await else {
        return;
    };
    let (store, now) = stalled_jobs(&pool, ExecutionMode::Lease, 200).await;
    let params = ResetParams {
        stalled_before: now + chrono::Duration::seconds(1),
        max_resets: 5,
        delivery: Delivery::AtLeastOnce,
        now,
    };
    let (a, b, c, d) = tokio::join!(
        store.reset_stalled(params),
        store.reset_stalled(params),
        store.reset_stalled(params),
        store.reset_stalled(params)
    );
    let mut all: Vec<i64> = [a, b, c, d]
        .into_iter()
        .flat_map(|r| r.unwrap().reset)
        .collect();
    assert_eq!(
        all.len(),
        200,
        "every stalled job was reset by exactly one resetter"
    );
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 200);
    let t = store.options().table_name().quoted();
    assert_eq!(
        scalar(
            &pool,
            &format!("SELECT count(*) FROM {t} WHERE num_resets = 1 AND state = 'queued'")
        )
        .await,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_racing_the_resetter_never_ends_both_ways() {
    let Some(pool) = pool("completion_racing_the_resetter_never_ends_both_ways").await else {
        return;
    };
    let (store, now) = stalled_jobs(&pool, ExecutionMode::Lease, 1).await;
    let t = store.options().table_name().quoted();
    for round in 0..100 {
        let claimed = store
            .claim(ClaimParams {
                limit: 1,
                worker: "racer",
                conditions: None,
                now: now + chrono::Duration::seconds(round),
            })
            .await
            .unwrap();
        let lease = match claimed.into_iter().next() {
            Some(c) => c.lease,
            None => {
                // Still processing from an earlier round: let the resetter free it.
                store
                    .reset_stalled(ResetParams {
                        stalled_before: Utc::now() + chrono::Duration::days(1),
                        max_resets: 1000,
                        delivery: Delivery::AtLeastOnce,
                        now,
                    })
                    .await
                    .unwrap();
                continue;
            }
        };
        let params = ResetParams {
            stalled_before: Utc::now() + chrono::Duration::days(1),
            max_resets: 1000,
            delivery: Delivery::AtLeastOnce,
            now,
        };
        let job_store = PgJobTransaction::outside_transaction(pool.clone());
        let (finished, reset) = tokio::join!(
            store.finish(job_store, &lease, Transition::Complete, now),
            store.reset_stalled(params)
        );
        let completed = finished.unwrap().is_applied();
        let was_reset = !reset.unwrap().reset.is_empty();
        assert!(completed != was_reset, "round {round}: exactly one of completion and reset wins (completed {completed}, reset {was_reset})");
        let state: String =
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT state FROM {t}")))
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(
            state,
            if completed { "completed" } else { "queued" },
            "round {round}"
        );
        if completed {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "UPDATE {t} SET state = 'queued'"
            )))
            .execute(&pool)
            .await
            .unwrap();
        }
    }
}

/// A worker process killed while it runs at-most-once jobs: those jobs end
/// failed and are never started again (the process-level side of
/// `NewJob::at_most_once`); the ordinary jobs beside them still complete.
async fn sigkill_of_at_most_once_jobs_fails_them(mode: &str, test: &str) {
    let Some(pool) = pool(test).await else { return };
    let table = fresh_table(&pool).await;
    // Eight at-most-once jobs first (higher priority), then twelve ordinary ones.
    let mut jobs: Vec<NewJob> = (0..8)
        .map(|i| {
            NewJob::new("noop", serde_json::json!(i))
                .priority(1)
                .at_most_once()
        })
        .collect();
    jobs.extend((8..20).map(|i| NewJob::new("noop", serde_json::json!(i))));
    table.enqueue_many(&pool, &jobs).await.expect("enqueued");
    let t = table.name().quoted();
    let runs = runs_of(&table);

    kill_a_busy_worker_then_drain(
        &pool,
        &table,
        mode,
        &format!("SELECT count(*) FROM {t} WHERE state = 'processing' AND at_most_once"),
    )
    .await;

    let failed = format!(
        "SELECT count(*) FROM {t} WHERE at_most_once AND state = 'failed' AND failure_message = $1"
    );
    let failed: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(failed.to_owned()))
        .bind(queue_core::resetter::AT_MOST_ONCE_MESSAGE)
        .fetch_one(&pool)
        .await
        .expect("counted");
    assert_eq!(
        failed, 8,
        "{mode}: the killed at-most-once jobs ended failed"
    );
    assert_eq!(
        scalar(
            &pool,
            &format!("SELECT count(*) FROM {t} WHERE NOT at_most_once AND state = 'completed'")
        )
        .await,
        12,
        "{mode}: the ordinary jobs all completed"
    );
    let most_runs = scalar(
        &pool,
        &format!(
            "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM {runs} r JOIN {t} j ON j.id = r.job_id \
             WHERE j.at_most_once GROUP BY r.job_id) AS per_job"
        ),
    )
    .await;
    assert!(
        most_runs <= 1,
        "{mode}: an at-most-once job was started {most_runs} times"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_at_most_once_jobs_in_lease_mode_fails_them() {
    sigkill_of_at_most_once_jobs_fails_them(
        "lease",
        "sigkill_of_at_most_once_jobs_in_lease_mode_fails_them",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_at_most_once_jobs_in_transactional_mode_fails_them() {
    sigkill_of_at_most_once_jobs_fails_them(
        "transactional",
        "sigkill_of_at_most_once_jobs_in_transactional_mode_fails_them",
    )
    .await;
}

/// Starts a worker process of 8 slow handlers, SIGKILLs it once `busy`
/// (a count) reaches 8 and a moment has passed, then runs a healthy
/// worker with a 1 s stalled age until the table is drained.
async fn kill_a_busy_worker_then_drain(pool: &PgPool, table: &JobTable, mode: &str, busy: &str) {
    let mut doomed = spawn_worker(table, mode, 8, 60_000, &[]).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while scalar(pool, busy).await < 8 {
        assert!(
            Instant::now() < deadline,
            "the doomed worker never got busy"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    doomed.start_kill().expect("SIGKILL");
    doomed.wait().await.expect("reaped");
    let mut healthy = spawn_worker(
        table,
        mode,
        8,
        0,
        &["--until-drained", "--stalled-max-age-ms", "1000"],
    )
    .await;
    let status = tokio::time::timeout(Duration::from_secs(120), healthy.wait()).await;
    assert!(status.expect("drained in time").expect("wait").success());
}

/// Claims find their rows by place (`ctid`): racing updates that move
/// waiting rows (a new version at a new place each), four claimers still
/// take each job exactly once, and each claim returns the values its row
/// had when it was claimed (the newest version, not the one the claim's
/// snapshot saw).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_racing_updates_that_move_rows_take_each_job_once_with_its_newest_values() {
    let Some(pool) =
        pool("claims_racing_updates_that_move_rows_take_each_job_once_with_its_newest_values")
            .await
    else {
        return;
    };
    let table = fresh_table(&pool).await;
    const JOBS: usize = 3_000;
    enqueue(&pool, &table, JOBS).await;
    let store = PgStore::default_table(
        pool.clone(),
        table.store_options().mode(ExecutionMode::Lease),
    )
    .await
    .unwrap();
    let t = table.name().quoted();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mover = {
        let (pool, done, t) = (pool.clone(), done.clone(), t.clone());
        tokio::spawn(async move {
            let mut moves = 0u64;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                // Bumps the count of waiting jobs near the head of the
                // claim order, where the claims are reading (the outer
                // guard, which a wait on a claim rechecks, leaves claimed
                // jobs alone).
                let moved = sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE {t} SET payload = jsonb_build_object('moves', coalesce((payload->>'moves')::int, 0) + 1) \
                     WHERE id IN (SELECT id FROM {t} WHERE state = 'queued' ORDER BY id LIMIT 20) \
                     AND state = 'queued'"
                )))
                .execute(&pool)
                .await
                .expect("move waiting rows");
                moves += moved.rows_affected();
            }
            moves
        })
    };
    // A claim skips the rows the mover holds locked, and near the end the
    // mover holds most of what is left most of the time: an empty claim
    // says nothing about the jobs left. A claimer stops once none waits.
    let deadline = Instant::now() + Duration::from_secs(120);
    let claimers: Vec<_> = (0..4)
        .map(|c| {
            let (store, pool, t) = (store.clone(), pool.clone(), t.clone());
            tokio::spawn(async move {
                let mut claimed = Vec::new();
                loop {
                    let jobs = store
                        .claim(ClaimParams {
                            limit: 4,
                            worker: "claimer",
                            conditions: None,
                            now: Utc::now(),
                        })
                        .await
                        .unwrap_or_else(|e| panic!("claimer {c}: {e}"));
                    if jobs.is_empty() {
                        let waiting = scalar(
                            &pool,
                            &format!("SELECT count(*) FROM {t} WHERE state = 'queued'"),
                        )
                        .await;
                        if waiting == 0 {
                            break;
                        }
                        assert!(
                            Instant::now() < deadline,
                            "claimer {c}: {waiting} jobs still waiting after 120 s of claims"
                        );
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    for job in jobs {
                        let record = job.record.expect("a decodable record");
                        claimed.push((record.id, record.payload));
                    }
                }
                claimed
            })
        })
        .collect();
    let mut claimed = Vec::new();
    for claimer in claimers {
        claimed.extend(claimer.await.expect("claimer"));
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let moves = mover.await.expect("mover");
    assert!(moves > 0, "the mover moved rows while the claims ran");

    let mut ids: Vec<i64> = claimed.iter().map(|(id, _)| *id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), claimed.len(), "no job was claimed twice");
    assert_eq!(ids.len(), JOBS, "every job was claimed");
    let processing = scalar(
        &pool,
        &format!("SELECT count(*) FROM {t} WHERE state = 'processing'"),
    )
    .await;
    assert_eq!(processing, JOBS as i64);
    // A claimed row is no longer moved: what the claim returned is the row
    // as it is now.
    let rows: Vec<(i64, serde_json::Value)> =
        sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT id, payload FROM {t}")))
            .fetch_all(&pool)
            .await
            .unwrap();
    let now: std::collections::HashMap<i64, serde_json::Value> = rows.into_iter().collect();
    let moved_ones = claimed
        .iter()
        .filter(|(_, payload)| payload.get("moves").is_some())
        .count();
    for (id, payload) in &claimed {
        assert_eq!(
            Some(payload),
            now.get(id),
            "job {id}: the claim returned its newest values"
        );
    }
    eprintln!("{moves} moves; {moved_ones} of {JOBS} jobs claimed after a move");
}
