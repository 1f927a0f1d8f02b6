//! Limits per kind hold across worker processes: three `pg_worker`
//! processes under a limit of 50 jobs a second (a burst of 5) and 4 at
//! once never exceed either, read from a ledger (each run's start and end
//! in the database, each job's claim time); another kind runs as usual
//! meanwhile. A process killed with its jobs running holds their slots
//! only until the resetter moves them back (the stalled age), no longer.

mod support;

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use queue_core::{Admin, KindLimits, NewJob};
use queue_store_postgres::{JobTable, PgAdmin};
use sqlx::PgPool;
use support::{fresh_table, pool, spawn_worker};

const RATE: f64 = 50.0;
const BURST: u32 = 5;
const AT_ONCE: u32 = 4;

async fn enqueue(pool: &PgPool, table: &JobTable, kind: &str, n: usize) {
    let jobs: Vec<NewJob> = (0..n)
        .map(|i| NewJob::new(kind, serde_json::json!(i)))
        .collect();
    table.enqueue_many(pool, &jobs).await.expect("enqueued");
}

async fn completed(pool: &PgPool, table: &JobTable, kind: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {} WHERE kind = $1 AND state = 'completed'",
        table.name().quoted()
    )))
    .bind(kind)
    .fetch_one(pool)
    .await
    .expect("a count")
}

/// Waits until `n` jobs of `kind` completed, at most `limit`.
async fn until_completed(pool: &PgPool, table: &JobTable, kind: &str, n: i64, limit: Duration) {
    let started = Instant::now();
    while completed(pool, table, kind).await < n {
        assert!(
            started.elapsed() < limit,
            "{} of {n} {kind} jobs completed in {limit:?}",
            completed(pool, table, kind).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The runs table the worker processes write: created once here, before
/// three processes would race to create it.
async fn runs_table(pool: &PgPool, table: &JobTable) -> String {
    let runs = format!("{}.\"runs\"", table.name().schema.quoted());
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE IF NOT EXISTS {runs} (job_id bigint NOT NULL, pid integer NOT NULL, \
         started_at timestamptz NOT NULL DEFAULT clock_timestamp(), ended_at timestamptz)"
    )))
    .execute(pool)
    .await
    .expect("the runs table");
    runs
}

/// The most runs of `kind` under way at one moment, from the ledger.
async fn most_at_once(pool: &PgPool, table: &JobTable, runs: &str, kind: &str) -> usize {
    let spans: Vec<(DateTime<Utc>, DateTime<Utc>)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT r.started_at, r.ended_at FROM {runs} AS r JOIN {} AS j ON j.id = r.job_id \
         WHERE j.kind = $1 AND r.ended_at IS NOT NULL",
        table.name().quoted()
    )))
    .bind(kind)
    .fetch_all(pool)
    .await
    .expect("the ledger");
    // Ends before starts at the same instant: a slot handed on is not two.
    let mut events: Vec<(DateTime<Utc>, i32)> = spans
        .iter()
        .flat_map(|(start, end)| [(*start, 1), (*end, -1)])
        .collect();
    events.sort();
    let (mut now, mut most) = (0, 0);
    for (_, step) in events {
        now += step;
        most = most.max(now);
    }
    most as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_stay_within_a_kinds_rate_and_concurrency() {
    let Some(pool) = pool("three_processes_stay_within_a_kinds_rate_and_concurrency").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let runs = runs_table(&pool, &table).await;
    let admin = PgAdmin::<i64>::new(pool.clone(), table.store_options())
        .await
        .expect("an admin");
    let limits = KindLimits::default()
        .max_running(AT_ONCE)
        .per_second(RATE, Some(BURST));
    admin
        .set_limits("api", &limits, "test")
        .await
        .expect("limits set");
    let mut processes = Vec::new();
    for _ in 0..3 {
        processes
            .push(spawn_worker(&table, "lease", 8, 40, &["--stalled-max-age-ms", "5000"]).await);
    }
    // Once all three are ready (a process that started late, on a busy
    // machine, found the limited kind's three seconds of jobs taken).
    enqueue(&pool, &table, "api", 150).await;
    enqueue(&pool, &table, "other", 60).await;
    let started = Instant::now();
    until_completed(&pool, &table, "other", 60, Duration::from_secs(30)).await;
    let others_done = started.elapsed();
    until_completed(&pool, &table, "api", 150, Duration::from_secs(60)).await;
    let api_done = started.elapsed();
    for mut process in processes {
        let _ = process.kill().await;
    }

    assert!(
        others_done < api_done,
        "the unlimited kind is not held back by the limited one ({others_done:?}, {api_done:?})"
    );
    let most = most_at_once(&pool, &table, &runs, "api").await;
    assert!(most <= AT_ONCE as usize, "{most} api jobs ran at once");
    assert!(
        most >= 2,
        "the processes did run api jobs side by side ({most})"
    );
    let others = most_at_once(&pool, &table, &runs, "other").await;
    assert!(
        others > AT_ONCE as usize,
        "other jobs ran {others} at once: unlimited"
    );

    // Claim times, from every process: in any window, at most the burst
    // and the rate's worth.
    let claims: Vec<DateTime<Utc>> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT started_at FROM {} WHERE kind = 'api' ORDER BY started_at",
        table.name().quoted()
    )))
    .fetch_all(&pool)
    .await
    .expect("claim times");
    let pids: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(DISTINCT pid) FROM {runs} AS r JOIN {} AS j ON j.id = r.job_id WHERE j.kind = 'api'",
        table.name().quoted()
    )))
    .fetch_one(&pool)
    .await
    .expect("processes");
    assert_eq!(pids, 3, "all three processes ran api jobs");
    for (i, first) in claims.iter().enumerate() {
        for window in [1.0, 2.0] {
            let until = *first + chrono::TimeDelta::milliseconds((window * 1000.0) as i64);
            let within = claims[i..].iter().take_while(|at| **at < until).count();
            let allowed = f64::from(BURST) + RATE * window;
            assert!(
                within as f64 <= allowed,
                "{within} api jobs claimed in {window} s from {first}: more than {allowed}"
            );
        }
    }
    let span = (*claims.last().expect("claims") - claims[0]).num_milliseconds() as f64 / 1000.0;
    assert!(
        claims.len() as f64 <= f64::from(BURST) + RATE * span + 1.0,
        "{} claims over {span} s",
        claims.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_process_holds_its_slots_only_until_the_stalled_age() {
    let Some(pool) = pool("a_killed_process_holds_its_slots_only_until_the_stalled_age").await
    else {
        return;
    };
    let table = fresh_table(&pool).await;
    runs_table(&pool, &table).await;
    let admin = PgAdmin::<i64>::new(pool.clone(), table.store_options())
        .await
        .expect("an admin");
    admin
        .set_limits("slow", &KindLimits::default().max_running(2), "test")
        .await
        .expect("limits set");
    enqueue(&pool, &table, "slow", 4).await;
    // It takes the two slots and holds them (each job sleeps a minute).
    let mut doomed = spawn_worker(&table, "lease", 4, 60_000, &[]).await;
    let processing = format!(
        "SELECT count(*) FROM {} WHERE kind = 'slow' AND state = 'processing'",
        table.name().quoted()
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let n: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(processing.clone()))
            .fetch_one(&pool)
            .await
            .expect("a count");
        if n == 2 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the first process never took its two slots"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    doomed.kill().await.expect("killed");
    let killed = Instant::now();
    // A second process, with a resetter whose stalled age is a second.
    let _heir = spawn_worker(&table, "lease", 4, 0, &["--stalled-max-age-ms", "1000"]).await;
    until_completed(&pool, &table, "slow", 4, Duration::from_secs(30)).await;
    let freed = killed.elapsed();
    assert!(
        freed < Duration::from_secs(5),
        "the dead process's slots were held {freed:?}, beyond the 1 s stalled age and the resetter's rounds"
    );
    let (resets,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT coalesce(sum(num_resets), 0)::int8 FROM {} WHERE kind = 'slow'",
        table.name().quoted()
    )))
    .fetch_one(&pool)
    .await
    .expect("resets");
    assert_eq!(resets, 2, "the two jobs the dead process held were reset");
}
