//! The claim's plan depends on the table's statistics: without them the
//! planner takes the jobs ready now for a handful and sorts all of them for
//! each claim. A store analyzes a table of jobs that has none when it
//! starts, and a table whose claim was slow or that grew, in the background.

mod support;

use std::time::{Duration, Instant};

use queue_core::{ClaimParams, Job, Store};
use queue_store_postgres::{ExecutionMode, JobTable, PgCondition, PgStore};
use sqlx::PgPool;
use support::{claim_now, execute, fresh_table, pool};

/// Whether the state column of `table` has statistics, and when the table
/// was last analyzed by a command (not by autovacuum).
async fn statistics(
    pool: &PgPool,
    table: &JobTable,
) -> (bool, Option<chrono::DateTime<chrono::Utc>>) {
    let name = table.name();
    sqlx::query_as(
        "SELECT EXISTS (SELECT 1 FROM pg_stats WHERE schemaname = $1 AND tablename = $2 AND attname = 'state'), \
         (SELECT last_analyze FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2)",
    )
    .bind(name.schema.as_str())
    .bind(name.name.as_str())
    .fetch_one(pool)
    .await
    .expect("reading the statistics")
}

/// Waits up to 10 s for `table` to be analyzed after `since` (its last
/// analysis then, if any); fails naming `after` otherwise.
async fn analyzed_again(
    pool: &PgPool,
    table: &JobTable,
    since: Option<chrono::DateTime<chrono::Utc>>,
    after: &str,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while statistics(pool, table).await.1 == since {
        assert!(
            Instant::now() < deadline,
            "the table was not analyzed within 10 s of {after}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A default table that autovacuum leaves alone, so that only the store
/// analyzes it.
async fn table_without_autovacuum(pool: &PgPool) -> JobTable {
    let table = fresh_table(pool).await;
    execute(
        pool,
        format!(
            "ALTER TABLE {} SET (autovacuum_enabled = false)",
            table.name().quoted()
        ),
    )
    .await;
    table
}

/// A lease-mode store over `table`.
async fn lease_store(pool: &PgPool, table: &JobTable) -> PgStore<Job> {
    PgStore::default_table(
        pool.clone(),
        table.store_options().mode(ExecutionMode::Lease),
    )
    .await
    .expect("a store")
}

async fn insert_jobs(pool: &PgPool, table: &JobTable, n: i64) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {} (kind) SELECT 'k' FROM generate_series(1, $1::int8)",
        table.name().quoted()
    )))
    .bind(n)
    .execute(pool)
    .await
    .expect("jobs");
}

#[tokio::test]
async fn a_table_of_jobs_without_statistics_is_analyzed_when_a_store_starts() {
    let Some(pool) = pool("a_table_of_jobs_without_statistics_is_analyzed").await else {
        return;
    };
    let table = table_without_autovacuum(&pool).await;
    let store = |pool: &PgPool| {
        PgStore::<Job>::default_table(
            pool.clone(),
            table.store_options().mode(ExecutionMode::Lease),
        )
    };
    drop(store(&pool).await.expect("a store"));
    assert_eq!(
        statistics(&pool, &table).await,
        (false, None),
        "an empty table is left alone"
    );
    insert_jobs(&pool, &table, 5_000).await;
    drop(store(&pool).await.expect("a store"));
    let (has_statistics, analyzed) = statistics(&pool, &table).await;
    assert!(
        has_statistics && analyzed.is_some(),
        "a table of jobs without statistics is analyzed at start-up"
    );
}

/// The start-up analysis samples for the claim's plan only (a statistics
/// target of 10, not the default 100), so that it delays the first claim
/// by a few milliseconds, not tens: its histogram of 5,000 distinct
/// priorities has at most 11 bounds, where the default target gives 101.
#[tokio::test]
async fn the_start_up_analysis_takes_a_small_sample() {
    let Some(pool) = pool("the_start_up_analysis_takes_a_small_sample").await else {
        return;
    };
    let table = table_without_autovacuum(&pool).await;
    execute(
        &pool,
        format!(
            "INSERT INTO {} (kind, priority) SELECT 'k', g FROM generate_series(1, 5000) AS g",
            table.name().quoted()
        ),
    )
    .await;
    drop(lease_store(&pool, &table).await);
    let bounds = |pool: PgPool| {
        let name = table.name().clone();
        async move {
            sqlx::query_scalar::<_, Option<i32>>(
                "SELECT cardinality(histogram_bounds::text::int4[]) FROM pg_stats \
                 WHERE schemaname = $1 AND tablename = $2 AND attname = 'priority'",
            )
            .bind(name.schema.as_str())
            .bind(name.name.as_str())
            .fetch_one(&pool)
            .await
            .expect("the priority's histogram")
        }
    };
    let at_start = bounds(pool.clone()).await;
    assert!(
        at_start.is_some_and(|n| (2..=11).contains(&n)),
        "start-up histogram bounds: {at_start:?}"
    );
    // A later analysis (autovacuum's, or one asked for) takes the full one.
    execute(&pool, format!("ANALYZE {}", table.name().quoted())).await;
    let full = bounds(pool.clone()).await;
    assert_eq!(full, Some(101), "the default target's histogram");
}

/// Claims one job of `store`'s, under `conditions`.
async fn claim_one(store: &PgStore<Job>, conditions: Option<&Vec<PgCondition>>) {
    let claimed = store
        .claim(ClaimParams {
            limit: 1,
            worker: "w",
            conditions,
            now: chrono::Utc::now(),
        })
        .await
        .expect("a claim");
    assert_eq!(claimed.len(), 1);
}

/// Claims slow one after another (as they are when planned from
/// statistics that do not describe the table) have it analyzed; one slow
/// claim among fast ones (a busy machine) does not.
#[tokio::test]
async fn slow_claims_have_the_table_analyzed() {
    let Some(pool) = pool("slow_claims_have_the_table_analyzed").await else {
        return;
    };
    let table = table_without_autovacuum(&pool).await;
    let store = lease_store(&pool, &table).await;
    insert_jobs(&pool, &table, 100).await;
    // A claim made slow by its condition (a 30 ms sleep in each of the
    // claim's scans).
    let slow = vec![PgCondition::new("(SELECT pg_sleep(0.03)) IS NOT NULL")];
    for _ in 0..10 {
        claim_one(&store, Some(&slow)).await;
        for _ in 0..4 {
            claim_one(&store, None).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        statistics(&pool, &table).await.1,
        None,
        "one slow claim in five: not analyzed"
    );
    // Half of the last sixteen claims slow.
    for _ in 0..8 {
        claim_one(&store, Some(&slow)).await;
    }
    analyzed_again(&pool, &table, None, "eight slow claims in a row").await;
}

#[tokio::test]
async fn a_table_that_grows_from_empty_is_analyzed_as_its_jobs_are_claimed() {
    let Some(pool) = pool("a_table_that_grows_from_empty_is_analyzed").await else {
        return;
    };
    let table = table_without_autovacuum(&pool).await;
    // Empty at start-up: nothing to analyze, and growth counts towards its
    // floor of 200 claimed jobs.
    let store = lease_store(&pool, &table).await;
    assert_eq!(statistics(&pool, &table).await, (false, None));
    insert_jobs(&pool, &table, 200).await;
    assert_eq!(claim_now(&store, 199).await.len(), 199);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        statistics(&pool, &table).await.1,
        None,
        "fewer than 200 jobs claimed: not analyzed"
    );
    assert_eq!(claim_now(&store, 1).await.len(), 1);
    // Plans cached while the table held a few pages read it whole; the
    // analysis has Postgres plan them again for its size now.
    analyzed_again(&pool, &table, None, "its 200th claim").await;
}

/// The growth that has a table analyzed again counts from the rows the
/// start-up analysis found, not from the estimate of a table never
/// analyzed (none): a table of 3,000 jobs drained by the store that
/// analyzed it is not analyzed again after the first 1,000 claims (every
/// cold drain had been, a second `ANALYZE` in the middle of it).
#[tokio::test]
async fn the_jobs_a_store_found_at_start_up_do_not_count_as_growth() {
    let Some(pool) = pool("the_jobs_found_at_start_up_are_not_growth").await else {
        return;
    };
    let table = table_without_autovacuum(&pool).await;
    insert_jobs(&pool, &table, 3_000).await;
    let store = lease_store(&pool, &table).await;
    let at_start = statistics(&pool, &table).await.1;
    assert!(at_start.is_some(), "analyzed at start-up");
    assert_eq!(claim_now(&store, 1_000).await.len(), 1_000);
    assert_eq!(claim_now(&store, 1_000).await.len(), 1_000);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        statistics(&pool, &table).await.1,
        at_start,
        "2,000 of the 3,000 jobs it found claimed: not analyzed again"
    );
    assert_eq!(claim_now(&store, 1_000).await.len(), 1_000);
    analyzed_again(&pool, &table, at_start, "its 3,000th claim").await;
}

/// A store that starts while another session holds the table's lock for a
/// moment (as an autovacuum does until Postgres cancels it for a waiter)
/// waits for it, and analyzes a table of jobs without statistics all the
/// same.
#[tokio::test]
async fn a_store_starting_while_the_lock_is_held_a_moment_analyzes_the_table_after() {
    let Some(pool) = pool("a_store_starting_while_the_lock_is_held").await else {
        return;
    };
    let table = table_without_autovacuum(&pool).await;
    insert_jobs(&pool, &table, 5_000).await;
    let mut holder = pool.begin().await.expect("a transaction");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "LOCK TABLE {} IN SHARE UPDATE EXCLUSIVE MODE",
        table.name().quoted()
    )))
    .execute(&mut *holder)
    .await
    .expect("the lock");
    let starting = {
        let (pool, table) = (pool.clone(), table.clone());
        tokio::spawn(async move { lease_store(&pool, &table).await })
    };
    support::until_waiting_for_a_lock(&pool, "ANALYZE", &table).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder.commit().await.expect("the lock let go");
    drop(starting.await.expect("the store starts"));
    let (has_statistics, analyzed) = statistics(&pool, &table).await;
    assert!(
        has_statistics && analyzed.is_some(),
        "analyzed once the lock was let go"
    );
}

/// A store that starts while `queue migrate` builds an index concurrently
/// is held up by the build two seconds at most: its start-up `ANALYZE`
/// waits that long for the build's lock (the build, in its last phase,
/// waits for that `ANALYZE` in turn, and a longer wait could have Postgres
/// fail the build as a deadlock), then leaves the table to the analysis
/// after slow claims. The build goes on to succeed.
#[tokio::test]
async fn a_store_starting_beside_an_index_build_does_not_wait_for_it() {
    let Some(pool) = pool("a_store_starting_beside_an_index_build").await else {
        return;
    };
    let table = table_without_autovacuum(&pool).await;
    insert_jobs(&pool, &table, 5_000).await;
    support::back_to_version_7(&pool, &table).await;
    let (writer, migrating) = support::build_held_by_a_writer(&pool, &table).await;

    let store = tokio::time::timeout(Duration::from_secs(10), lease_store(&pool, &table))
        .await
        .expect("the store starts without waiting for the build");
    assert_eq!(
        statistics(&pool, &table).await,
        (false, None),
        "the table, locked by the build, was skipped"
    );
    assert_eq!(claim_now(&store, 10).await.len(), 10, "the store claims");
    writer.commit().await.expect("the writer commits");
    let applied = tokio::time::timeout(Duration::from_secs(60), migrating)
        .await
        .expect("the migration ends")
        .expect("joined")
        .expect("the build succeeds");
    assert_eq!(applied.iter().map(|m| m.version).collect::<Vec<_>>(), [8]);
}
