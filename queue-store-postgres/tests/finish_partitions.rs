//! The default table partitioned by finish time
//! (`JobTable::partitioned_by_finish_time`): finished jobs land in the
//! partition of their state and day, retention drops whole partitions and
//! deletes only the rows of the rest, a partition whose lock is out of
//! reach is emptied row by row instead (nothing is kept past its
//! retention), and a job that finished where no partition was made yet
//! moves into the one made later. The conformance suite runs on this
//! layout too (`tests/conformance.rs`).

mod support;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use queue_core::retention::{prune, Retention};
use queue_core::{Admin, ClaimParams, JobState, NewJob, Store, Targets, Transition};
use queue_store_postgres::{ExecutionMode, FinishPartitions, JobTable, PgAdmin};
use sqlx::PgPool;
use support::{execute, fresh_partitioned_table, fresh_table, pool, store};

/// Each leaf partition of `table` with its parent, ordered.
async fn leaves(pool: &PgPool, table: &JobTable) -> Vec<(String, String)> {
    sqlx::query_as(
        "SELECT c.relname::text, p.relname::text FROM pg_partition_tree(to_regclass($1)) AS t \
         JOIN pg_class AS c ON c.oid = t.relid JOIN pg_class AS p ON p.oid = t.parentrelid \
         WHERE t.isleaf ORDER BY 2, 1",
    )
    .bind(table.name().quoted())
    .fetch_all(pool)
    .await
    .expect("the partition tree")
}

/// The partition holding job `id`.
async fn partition_of(pool: &PgPool, table: &JobTable, id: i64) -> String {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT c.relname::text FROM {} AS j JOIN pg_class AS c ON c.oid = j.tableoid WHERE j.id = $1",
        table.name().quoted()
    )))
    .bind(id)
    .fetch_one(pool)
    .await
    .expect("the job's partition")
}

fn day(at: DateTime<Utc>) -> String {
    at.format("%Y%m%d").to_string()
}

fn midnight(at: DateTime<Utc>) -> DateTime<Utc> {
    at.duration_trunc(TimeDelta::days(1)).expect("a day")
}

/// Makes `table`'s partition of jobs finished in `state` on the day
/// starting at `start`, as an earlier run of the store would have.
async fn make_day(pool: &PgPool, table: &JobTable, state: &str, start: DateTime<Utc>) {
    let schema = table.name().schema.quoted();
    execute(
        pool,
        format!(
            "CREATE TABLE {schema}.\"jobs_{state}_p{}\" PARTITION OF {schema}.\"jobs_{state}\" \
             FOR VALUES FROM ('{}') TO ('{}')",
            day(start),
            start.to_rfc3339(),
            (start + TimeDelta::days(1)).to_rfc3339()
        ),
    )
    .await;
}

/// Inserts `n` jobs finished in `state` at `at` (a second apart).
async fn finished(pool: &PgPool, table: &JobTable, state: &str, at: DateTime<Utc>, n: i64) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {} (kind, state, finished_at) \
         SELECT 'k', $1, $2 + make_interval(secs => g) FROM generate_series(1, $3) AS g",
        table.name().quoted()
    )))
    .bind(state)
    .bind(at)
    .bind(n)
    .execute(pool)
    .await
    .expect("finished jobs");
}

async fn count(pool: &PgPool, table: &JobTable, condition: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {} WHERE {condition}",
        table.name().quoted()
    )))
    .fetch_one(pool)
    .await
    .expect("a count")
}

#[tokio::test]
async fn finished_jobs_land_in_the_partition_of_their_state_and_day() {
    let test = "finished_jobs_land_in_the_partition_of_their_state_and_day";
    let Some(pool) = pool(test).await else { return };
    let table = fresh_partitioned_table(&pool).await;
    let now = Utc::now();
    let parts = leaves(&pool, &table).await;
    for state in ["completed", "failed", "canceled"] {
        let parent = format!("jobs_{state}");
        let days: Vec<&str> = parts
            .iter()
            .filter(|(_, p)| *p == parent)
            .map(|(leaf, _)| leaf.as_str())
            .collect();
        // Yesterday's, today's and three days ahead, and the default.
        for offset in -1..=3 {
            let name = format!("jobs_{state}_p{}", day(now + TimeDelta::days(offset)));
            assert!(days.contains(&name.as_str()), "{name} in {days:?}");
        }
        assert!(days.contains(&format!("jobs_{state}_default").as_str()));
    }
    assert!(
        parts.iter().any(|(leaf, _)| leaf == "jobs_live"),
        "{parts:?}"
    );

    let store = store(&pool, &table, ExecutionMode::Lease).await;
    let mut ids = Vec::new();
    for n in 0..3 {
        let job = NewJob::new("k", serde_json::json!(n));
        ids.push(Admin::enqueue(&store, &[job]).await.expect("enqueue")[0].id);
    }
    for id in &ids {
        assert_eq!(partition_of(&pool, &table, *id).await, "jobs_live");
    }
    let claimed = store
        .claim(ClaimParams {
            limit: 2,
            worker: "w",
            conditions: None,
            now: Utc::now(),
        })
        .await
        .expect("a claim");
    assert_eq!(claimed.len(), 2);
    let mut ends = vec![
        Transition::Complete,
        Transition::Fail {
            message: "no".into(),
        },
    ]
    .into_iter();
    for job in claimed {
        let end = ends.next().expect("an end");
        let written = store
            .finish(job.job_store, &job.lease, end, Utc::now())
            .await
            .expect("the job ends");
        assert_eq!(written, queue_core::WriteResult::Applied);
    }
    Admin::cancel(&store, &Targets::id(ids[2]))
        .await
        .expect("cancel");
    let today = day(Utc::now());
    let mut found = Vec::new();
    for id in &ids {
        found.push(partition_of(&pool, &table, *id).await);
    }
    found.sort();
    assert_eq!(
        found,
        [
            format!("jobs_canceled_p{today}"),
            format!("jobs_completed_p{today}"),
            format!("jobs_failed_p{today}")
        ],
        "each finished job moved to its state's partition of today"
    );
    // A key held for ever would need an index over every partition.
    let forever =
        NewJob::new("k", serde_json::json!(9)).unique("f", queue_core::UniqueScope::Forever);
    let error = table
        .enqueue_unique(&pool, std::slice::from_ref(&forever))
        .await
        .expect_err("the table refuses a key held for ever")
        .to_string();
    assert!(error.contains("UniqueScope::Active"), "{error}");
}

#[tokio::test]
async fn retention_drops_whole_partitions_and_deletes_only_the_rows_of_the_rest() {
    let test = "retention_drops_whole_partitions_and_deletes_only_the_rows_of_the_rest";
    let Some(pool) = pool(test).await else { return };
    let table = fresh_partitioned_table(&pool).await;
    let today = midnight(Utc::now());
    for back in 2..=10 {
        make_day(&pool, &table, "completed", today - TimeDelta::days(back)).await;
        make_day(&pool, &table, "failed", today - TimeDelta::days(back)).await;
    }
    for back in 1..=10 {
        let at = today - TimeDelta::days(back) + TimeDelta::hours(12);
        finished(&pool, &table, "completed", at, 100).await;
        finished(&pool, &table, "failed", at, 10).await;
    }
    // Early on the day the cutoff falls in: deleted row by row.
    finished(
        &pool,
        &table,
        "completed",
        today - TimeDelta::days(6) + TimeDelta::hours(6),
        20,
    )
    .await;
    // Forty days back no partition holds: the default one does.
    finished(&pool, &table, "completed", today - TimeDelta::days(40), 7).await;
    execute(
        &pool,
        format!(
            "INSERT INTO {} (kind) SELECT 'k' FROM generate_series(1, 5)",
            table.name().quoted()
        ),
    )
    .await;
    // The planner's counts, which a dropped partition's jobs are counted by.
    execute(&pool, format!("ANALYZE {}", table.name().quoted())).await;

    // Kept five and a half days: the days ending before the cutoff go
    // whole, the day it falls in keeps its later half.
    let cutoff = today - TimeDelta::days(5) - TimeDelta::hours(12);
    let admin = PgAdmin::<i64>::new(pool.clone(), table.store_options())
        .await
        .expect("an admin");
    let retention = Retention {
        completed: Some(std::time::Duration::from_secs(5 * 86_400 + 12 * 3600)),
        ..Retention::default()
    };
    let expected = count(
        &pool,
        &table,
        &format!(
            "state = 'completed' AND finished_at < '{}'",
            cutoff.to_rfc3339()
        ),
    )
    .await;
    let started = std::time::Instant::now();
    let report = prune(&admin, &retention, today, |_, _| {})
        .await
        .expect("pruning");
    assert_eq!(expected, 4 * 100 + 20 + 7);
    assert_eq!(
        report.removed,
        vec![(JobState::Completed, expected as u64)],
        "every completed job past its retention is counted once"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    assert_eq!(
        count(
            &pool,
            &table,
            &format!(
                "state = 'completed' AND finished_at < '{}'",
                cutoff.to_rfc3339()
            )
        )
        .await,
        0,
        "nothing past its retention is left"
    );
    assert_eq!(
        count(&pool, &table, "state = 'completed'").await,
        6 * 100,
        "the later jobs are kept"
    );
    assert_eq!(
        count(&pool, &table, "state = 'failed'").await,
        100,
        "other states are kept"
    );
    assert_eq!(
        count(&pool, &table, "state = 'queued'").await,
        5,
        "waiting jobs are kept"
    );
    let names: Vec<String> = leaves(&pool, &table)
        .await
        .into_iter()
        .map(|(leaf, _)| leaf)
        .collect();
    for back in 2..=10 {
        let name = format!("jobs_completed_p{}", day(today - TimeDelta::days(back)));
        // Days 7 to 10 back ended before the cutoff; day 6 holds it.
        assert_eq!(names.contains(&name), back <= 6, "{name} in {names:?}");
        let failed = format!("jobs_failed_p{}", day(today - TimeDelta::days(back)));
        assert!(names.contains(&failed), "{failed} is another state's");
    }
}

#[tokio::test]
async fn a_partition_whose_lock_is_out_of_reach_is_emptied_row_by_row() {
    let test = "a_partition_whose_lock_is_out_of_reach_is_emptied_row_by_row";
    let Some(pool) = pool(test).await else { return };
    let table = fresh_partitioned_table(&pool).await;
    let today = midnight(Utc::now());
    for back in 2..=4 {
        make_day(&pool, &table, "completed", today - TimeDelta::days(back)).await;
        finished(
            &pool,
            &table,
            "completed",
            today - TimeDelta::days(back) + TimeDelta::hours(1),
            50,
        )
        .await;
    }
    execute(&pool, format!("ANALYZE {}", table.name().quoted())).await;
    // A long read of the finished jobs: its lock keeps every detach out.
    let mut reader = pool.begin().await.expect("a transaction");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {}.\"jobs_completed\"",
        table.name().schema.quoted()
    )))
    .fetch_one(&mut *reader)
    .await
    .expect("the read");
    let admin = PgAdmin::<i64>::new(pool.clone(), table.store_options())
        .await
        .expect("an admin");
    let retention = Retention {
        completed: Some(std::time::Duration::from_secs(86_400)),
        ..Retention::default()
    };
    let report = prune(&admin, &retention, Utc::now(), |_, _| {})
        .await
        .expect("pruning");
    assert_eq!(report.removed, vec![(JobState::Completed, 150)]);
    assert_eq!(
        count(&pool, &table, "state = 'completed'").await,
        0,
        "every job went, one by one"
    );
    let names: Vec<String> = leaves(&pool, &table)
        .await
        .into_iter()
        .map(|(leaf, _)| leaf)
        .collect();
    let kept = format!("jobs_completed_p{}", day(today - TimeDelta::days(3)));
    assert!(
        names.contains(&kept),
        "the partition itself stays: {names:?}"
    );
    reader.rollback().await.expect("the read ends");
}

#[tokio::test]
async fn a_job_finished_where_no_partition_was_made_moves_into_the_one_made_later() {
    let test = "a_job_finished_where_no_partition_was_made_moves_into_the_one_made_later";
    let Some(pool) = pool(test).await else { return };
    let table = fresh_partitioned_table(&pool).await;
    let tomorrow = midnight(Utc::now()) + TimeDelta::days(1);
    let schema = table.name().schema.quoted();
    let name = format!("jobs_completed_p{}", day(tomorrow));
    execute(
        &pool,
        format!("ALTER TABLE {schema}.\"jobs_completed\" DETACH PARTITION {schema}.\"{name}\""),
    )
    .await;
    execute(&pool, format!("DROP TABLE {schema}.\"{name}\"")).await;
    finished(
        &pool,
        &table,
        "completed",
        tomorrow + TimeDelta::hours(2),
        1,
    )
    .await;
    let id: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT max(id) FROM {}",
        table.name().quoted()
    )))
    .fetch_one(&pool)
    .await
    .expect("the job");
    assert_eq!(
        partition_of(&pool, &table, id).await,
        "jobs_completed_default"
    );
    // A store's start-up makes the partitions ahead.
    let _store = store(&pool, &table, ExecutionMode::Lease).await;
    assert_eq!(
        partition_of(&pool, &table, id).await,
        name,
        "the job moved into its day"
    );
    assert_eq!(count(&pool, &table, "true").await, 1, "and only moved");
}

#[tokio::test]
async fn a_table_that_exists_unpartitioned_is_refused_not_converted() {
    let test = "a_table_that_exists_unpartitioned_is_refused_not_converted";
    let Some(pool) = pool(test).await else { return };
    let plain = fresh_table(&pool).await;
    let error = JobTable::new(plain.name().schema.as_str(), "jobs")
        .expect("names")
        .partitioned_by_finish_time(FinishPartitions::DAILY)
        .migrate(&pool)
        .await
        .expect_err("refused")
        .to_string();
    assert!(error.contains("exists and is not partitioned"), "{error}");
    // Without the option, a partitioned table migrates as what it is.
    let partitioned = fresh_partitioned_table(&pool).await;
    let again = JobTable::new(partitioned.name().schema.as_str(), "jobs")
        .expect("names")
        .migrate(&pool)
        .await
        .expect("up to date");
    assert!(again.is_empty(), "nothing to apply: {again:?}");
}

#[tokio::test]
async fn the_figures_of_a_partitioned_table_are_estimated_from_its_partitions() {
    let test = "the_figures_of_a_partitioned_table_are_estimated_from_its_partitions";
    let Some(pool) = pool(test).await else { return };
    let table = fresh_partitioned_table(&pool).await;
    let today = midnight(Utc::now());
    for back in 2..=3 {
        make_day(&pool, &table, "completed", today - TimeDelta::days(back)).await;
    }
    let t = table.name().quoted();
    execute(
        &pool,
        format!(
            "INSERT INTO {t} (kind, state, finished_at) \
             SELECT CASE WHEN g % 4 = 0 THEN 'mail' ELSE 'resize' END, \
             CASE WHEN g % 10 = 0 THEN 'failed' ELSE 'completed' END, \
             now() - interval '2 days' - g * interval '1 second' FROM generate_series(1, 4000) AS g"
        ),
    )
    .await;
    execute(
        &pool,
        format!("INSERT INTO {t} (kind) SELECT 'mail' FROM generate_series(1, 30)"),
    )
    .await;
    // As autovacuum leaves each partition (it never analyzes the
    // partitioned table itself).
    for (leaf, _) in leaves(&pool, &table).await {
        execute(
            &pool,
            format!("ANALYZE {}.\"{leaf}\"", table.name().schema.quoted()),
        )
        .await;
    }
    let admin = PgAdmin::<i64>::new(pool.clone(), table.store_options().exact_counts_below(1000))
        .await
        .expect("an admin");
    let params = || queue_core::StatsParams::new(Utc::now(), Utc::now() - TimeDelta::seconds(60));
    let estimated = admin.stats(params()).await.expect("figures");
    let exact = admin.stats(params().exact()).await.expect("exact figures");
    assert!(
        estimated.estimated(),
        "a table past the cap is estimated: {estimated:?}"
    );
    assert!(!exact.estimated());
    let of = |stats: &queue_core::QueueStats, state: JobState, kind: &str| {
        stats
            .counts
            .iter()
            .filter(|c| c.state == Some(state) && c.kind.as_deref() == Some(kind))
            .map(|c| c.count)
            .sum::<u64>()
    };
    for (state, kind) in [
        (JobState::Completed, "resize"),
        (JobState::Completed, "mail"),
        (JobState::Failed, "resize"),
        (JobState::Failed, "mail"),
        (JobState::Queued, "mail"),
    ] {
        let (e, x) = (of(&estimated, state, kind), of(&exact, state, kind));
        assert!(
            e.abs_diff(x) <= x / 20 + 2,
            "{state} {kind}: estimated {e}, counted {x}"
        );
    }
}

#[tokio::test]
async fn a_partition_detached_but_not_dropped_is_dropped_by_the_next_purge() {
    let test = "a_partition_detached_but_not_dropped_is_dropped_by_the_next_purge";
    let Some(pool) = pool(test).await else { return };
    let table = fresh_partitioned_table(&pool).await;
    let schema = table.name().schema.quoted();
    let today = midnight(Utc::now());
    make_day(&pool, &table, "completed", today - TimeDelta::days(5)).await;
    let name = format!("jobs_completed_p{}", day(today - TimeDelta::days(5)));
    // What a process that died between the detach and the drop leaves.
    execute(
        &pool,
        format!("ALTER TABLE {schema}.\"jobs_completed\" DETACH PARTITION {schema}.\"{name}\""),
    )
    .await;
    execute(&pool, format!("COMMENT ON TABLE {schema}.\"{name}\" IS 'queue: a partition of finished jobs detached for retention; dropped next'")).await;
    // A table of the user's beside it, without the comment, stays.
    execute(
        &pool,
        format!("CREATE TABLE {schema}.\"jobs_completed_p19990101\" (n int)"),
    )
    .await;
    let admin = PgAdmin::<i64>::new(pool.clone(), table.store_options())
        .await
        .expect("an admin");
    let params = queue_core::PurgeParams::new(vec![JobState::Completed], Utc::now(), 100);
    Admin::purge(&admin, &params).await.expect("a purge");
    let left = |name: String| {
        let pool = pool.clone();
        let schema = table.name().schema.as_str().to_owned();
        async move {
            sqlx::query_scalar::<_, bool>(
                "SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = $1 AND c.relname = $2)",
            )
            .bind(schema)
            .bind(name)
            .fetch_one(&pool)
            .await
            .expect("the catalog")
        }
    };
    assert!(!left(name).await, "the detached partition is dropped");
    assert!(
        left("jobs_completed_p19990101".into()).await,
        "the user's table stays"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_that_create_the_partitioned_table_at_once_all_succeed() {
    let test = "processes_that_create_the_partitioned_table_at_once_all_succeed";
    let Some(pool) = pool(test).await else { return };
    let table = JobTable::new(&support::awkward_schema(), "jobs")
        .expect("names")
        .partitioned_by_finish_time(FinishPartitions::DAILY);
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let (pool, table) = (pool.clone(), table.clone());
            tokio::spawn(async move { table.migrate(&pool).await })
        })
        .collect();
    for run in runs {
        run.await.expect("joined").expect("every migrate succeeds");
    }
    let today = format!("jobs_completed_p{}", day(Utc::now()));
    let names: Vec<String> = leaves(&pool, &table)
        .await
        .into_iter()
        .map(|(leaf, _)| leaf)
        .collect();
    assert_eq!(
        names.iter().filter(|n| **n == today).count(),
        1,
        "{names:?}"
    );
}
