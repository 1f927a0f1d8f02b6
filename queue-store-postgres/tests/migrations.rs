//! Versioned migrations of the default table: each version applied once,
//! concurrent migrations safe, an up-to-date table migrated beside running
//! job transactions without waiting for them, and a table created before
//! versions existed recorded at version 1 with its rows intact.

mod support;

use std::time::Duration;

use queue_core::NewJob;
use queue_store_postgres::JobTable;
use support::{awkward_schema, execute, pool};

fn table() -> JobTable {
    JobTable::new(&awkward_schema(), "jobs").expect("valid names")
}

#[tokio::test]
async fn each_version_is_applied_once_and_recorded() {
    let Some(pool) = pool("each_version_is_applied_once_and_recorded").await else {
        return;
    };
    let jobs = table();
    let before = jobs.migrations(&pool).await.expect("status");
    assert!(
        before.iter().all(|m| m.applied_at.is_none()),
        "nothing applied yet: {before:?}"
    );
    assert_eq!(before.first().map(|m| m.version), Some(1));
    let applied = jobs.migrate(&pool).await.expect("first migration");
    assert_eq!(
        applied.iter().map(|m| m.version).collect::<Vec<_>>(),
        before.iter().map(|m| m.version).collect::<Vec<_>>(),
        "every version applies on a new database"
    );
    assert!(
        jobs.migrate(&pool)
            .await
            .expect("second migration")
            .is_empty(),
        "an up-to-date table has nothing to apply"
    );
    let after = jobs.migrations(&pool).await.expect("status");
    assert!(after.iter().all(|m| m.applied_at.is_some()), "{after:?}");
    assert!(after.iter().all(|m| !m.statements.is_empty()));
    jobs.enqueue(&pool, &NewJob::new("k", serde_json::json!(null)))
        .await
        .expect("the migrated table takes jobs");
}

#[tokio::test]
async fn concurrent_migrations_apply_each_version_once() {
    let Some(pool) = pool("concurrent_migrations_apply_each_version_once").await else {
        return;
    };
    let jobs = table();
    let runs = (0..4).map(|_| {
        let (jobs, pool) = (jobs.clone(), pool.clone());
        tokio::spawn(async move { jobs.migrate(&pool).await })
    });
    let mut applied = 0;
    for run in runs {
        applied += run
            .await
            .expect("the task")
            .expect("every concurrent migration succeeds")
            .len();
    }
    let versions = jobs.migrations(&pool).await.expect("status").len();
    assert_eq!(
        applied, versions,
        "each version applied by exactly one of four"
    );
}

#[tokio::test]
async fn an_up_to_date_table_migrates_without_waiting_for_job_transactions() {
    let Some(pool) =
        pool("an_up_to_date_table_migrates_without_waiting_for_job_transactions").await
    else {
        return;
    };
    let jobs = table();
    jobs.migrate(&pool).await.expect("migration");
    let id = jobs
        .enqueue(&pool, &NewJob::new("k", serde_json::json!(null)))
        .await
        .expect("enqueue");
    let oid = |pool: sqlx::PgPool, name: String| async move {
        sqlx::query_scalar::<_, i64>(
            "SELECT oid::int8 FROM pg_catalog.pg_trigger WHERE tgrelid = $1::regclass AND NOT tgisinternal",
        )
        .bind(name)
        .fetch_one(&pool)
        .await
        .expect("the notify trigger")
    };
    let name = jobs.name().quoted();
    let before = oid(pool.clone(), name.clone()).await;
    // A job's transaction holds its row (and so the table) while a worker
    // process restarts and migrates.
    let job_tx = hold_row(&pool, &jobs, id).await;
    let again = tokio::time::timeout(Duration::from_secs(5), jobs.migrate(&pool))
        .await
        .expect("migrating an up-to-date table does not wait for the job's transaction")
        .expect("migration");
    assert!(again.is_empty());
    job_tx.rollback().await.expect("rollback");
    assert_eq!(
        oid(pool.clone(), name).await,
        before,
        "the notify trigger is left as it was, not dropped and created again"
    );
}

#[tokio::test]
async fn a_dropped_table_is_created_again() {
    let Some(pool) = pool("a_dropped_table_is_created_again").await else {
        return;
    };
    let jobs = table();
    jobs.migrate(&pool).await.expect("migration");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP TABLE {}",
        jobs.name().quoted()
    )))
    .execute(&pool)
    .await
    .expect("drop the jobs table, not its versions");
    let status = jobs.migrations(&pool).await.expect("status");
    assert!(
        status
            .iter()
            .filter(|m| &m.table == jobs.name())
            .all(|m| m.applied_at.is_none()),
        "the versions of a dropped table count as pending"
    );
    assert!(
        status
            .iter()
            .filter(|m| &m.table != jobs.name())
            .all(|m| m.applied_at.is_some()),
        "the kinds table beside it is still there: {status:?}"
    );
    let applied = jobs.migrate(&pool).await.expect("migration");
    assert_eq!(applied.first().map(|m| m.version), Some(1));
    jobs.enqueue(&pool, &NewJob::new("k", serde_json::json!(null)))
        .await
        .expect("the table is back");
    assert!(jobs.migrate(&pool).await.expect("migration").is_empty());
}

#[tokio::test]
async fn a_table_from_before_versions_is_recorded_at_version_1() {
    let Some(pool) = pool("a_table_from_before_versions_is_recorded_at_version_1").await else {
        return;
    };
    let jobs = table();
    jobs.migrate(&pool).await.expect("migration");
    let id = jobs
        .enqueue(&pool, &NewJob::new("k", serde_json::json!({"kept": true})))
        .await
        .expect("enqueue");
    // What an earlier release left: the table, no version table.
    let versions = support::versions_table(&jobs);
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {versions}")))
        .execute(&pool)
        .await
        .expect("drop the version table");
    let applied = jobs
        .migrate(&pool)
        .await
        .expect("migration of an older table");
    assert_eq!(applied.first().map(|m| m.version), Some(1));
    let payload: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT payload FROM {} WHERE id = $1",
        jobs.name().quoted()
    )))
    .bind(id)
    .fetch_one(&pool)
    .await
    .expect("the job is still there");
    assert_eq!(payload, serde_json::json!({"kept": true}));
}

/// Version 8 builds its indexes concurrently, outside a transaction. A
/// build killed half-way leaves an invalid index and the version
/// unrecorded; the next run drops that index, builds it again and records
/// the version, and every index is valid.
#[tokio::test]
async fn an_interrupted_index_build_is_repaired_by_the_next_run() {
    let Some(pool) = pool("an_interrupted_index_build_is_repaired").await else {
        return;
    };
    let jobs = table();
    jobs.migrate(&pool).await.expect("migration");
    let t = jobs.name().quoted();
    let schema = jobs.name().schema.quoted();
    execute(&pool, format!(
        "INSERT INTO {t} (kind, state, finished_at) SELECT 'k', 'completed', now() FROM generate_series(1, 600000)"
    ))
    .await;
    // Version 8 not applied yet, on a table with rows.
    support::back_to_version_7(&pool, &jobs).await;

    let migrating = {
        let (jobs, pool) = (jobs.clone(), pool.clone());
        tokio::spawn(async move { jobs.migrate(&pool).await })
    };
    // The build, seen in the server's activity once its index is in the
    // catalog (invalid until the build ends), is killed.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let killed: Option<bool> = sqlx::query_scalar(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE state = 'active' AND query LIKE '%CREATE INDEX CONCURRENTLY%' \
             AND position($1 IN query) > 0 AND pid <> pg_backend_pid() \
             AND EXISTS (SELECT 1 FROM pg_index WHERE indrelid = to_regclass($2) AND NOT indisvalid) LIMIT 1",
        )
        .bind(&schema)
        .bind(&t)
        .fetch_optional(&pool)
        .await
        .expect("reading the activity");
        if killed == Some(true) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline && !migrating.is_finished(),
            "the build was never seen"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let failed = migrating.await.expect("joined");
    assert!(
        failed.is_err(),
        "the killed build fails the run: {failed:?}"
    );
    let status = jobs.migrations(&pool).await.expect("status");
    assert!(
        status
            .iter()
            .any(|m| m.version == 8 && m.applied_at.is_none()),
        "version 8 is not recorded: {status:?}"
    );
    let invalid: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_index WHERE indrelid = to_regclass($1) AND NOT indisvalid",
    )
    .bind(&t)
    .fetch_one(&pool)
    .await
    .expect("the indexes");
    assert_eq!(invalid, 1, "the interrupted build left its index invalid");

    let applied = jobs.migrate(&pool).await.expect("the next run");
    assert_eq!(applied.iter().map(|m| m.version).collect::<Vec<_>>(), [8]);
    let (indexes, invalid): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE NOT indisvalid) FROM pg_index WHERE indrelid = to_regclass($1)",
    )
    .bind(&t)
    .fetch_one(&pool)
    .await
    .expect("the indexes");
    assert_eq!(invalid, 0, "every index is valid");
    assert!(indexes >= 7, "the two of version 8 among them: {indexes}");
    assert!(jobs.migrate(&pool).await.expect("up to date").is_empty());
}

/// A concurrent build waits, in its last phase, for every transaction
/// older than it. An `ANALYZE` begun while the build waited for a writer
/// waits in turn for the build's lock, and once it has waited past
/// `deadlock_timeout` (so that it found no cycle when it looked), Postgres
/// fails the build as the deadlock. The migration builds the index again,
/// records the version, and leaves every index valid.
#[tokio::test]
async fn a_build_failed_as_a_deadlock_is_built_again() {
    let Some(pool) = pool("a_build_failed_as_a_deadlock_is_built_again").await else {
        return;
    };
    let jobs = table();
    jobs.migrate(&pool).await.expect("migration");
    let t = jobs.name().quoted();
    execute(
        &pool,
        format!("INSERT INTO {t} (kind) SELECT 'k' FROM generate_series(1, 1000)"),
    )
    .await;
    support::back_to_version_7(&pool, &jobs).await;
    let deadlocks = || async {
        support::scalar(
            &pool,
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()",
        )
        .await
    };
    let deadlocks_before = deadlocks().await;

    let (writer, migrating) = support::build_held_by_a_writer(&pool, &jobs).await;
    let analyzing = {
        let (pool, analyze) = (pool.clone(), format!("ANALYZE {t}"));
        tokio::spawn(async move {
            sqlx::query(sqlx::AssertSqlSafe(analyze))
                .execute(&pool)
                .await
        })
    };
    support::until_waiting_for_a_lock(&pool, "ANALYZE", &jobs).await;
    // Well past the ANALYZE's own look for a cycle (deadlock_timeout after
    // it began to wait), which finds none yet: the build is the one failed.
    let deadlock_timeout_ms = support::scalar(
        &pool,
        "SELECT setting::int8 FROM pg_settings WHERE name = 'deadlock_timeout'",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(
        u64::try_from(deadlock_timeout_ms).expect("a positive timeout") + 1500,
    ))
    .await;
    writer.commit().await.expect("the writer commits");

    let applied = tokio::time::timeout(Duration::from_secs(60), migrating)
        .await
        .expect("the migration ends")
        .expect("joined")
        .expect("the migration builds the index again and succeeds");
    assert_eq!(applied.iter().map(|m| m.version).collect::<Vec<_>>(), [8]);
    analyzing
        .await
        .expect("joined")
        .expect("the ANALYZE was not the one failed");
    let invalid: i64 = sqlx::query_scalar(
        "SELECT count(*) FILTER (WHERE NOT indisvalid) FROM pg_index WHERE indrelid = to_regclass($1)",
    )
    .bind(&t)
    .fetch_one(&pool)
    .await
    .expect("the indexes");
    assert_eq!(invalid, 0, "every index is valid");
    // The server counted the deadlock (its statistics reach the view within
    // a few seconds of the failed build).
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while deadlocks().await == deadlocks_before {
        assert!(
            std::time::Instant::now() < deadline,
            "Postgres counted no deadlock: the build was never failed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Version 12 sets right, in batches of keys, the times of rows written
/// before they followed the state (`JobState::times_agree`): a finished
/// job loses its due time (and gets a finish time where it had none), a
/// running one both times, a waiting one without a due time its finish.
/// Rows that agree already are not written; a run of the version again
/// (its record removed, as after an interrupted run) changes nothing.
/// On a plain table and on one partitioned by state and finish time.
#[tokio::test]
async fn version_12_sets_the_times_of_older_rows_right_in_batches() {
    let Some(pool) = pool("version_12_sets_the_times_of_older_rows_right").await else {
        return;
    };
    times_set_right(&pool, table()).await;
    let partitioned =
        table().partitioned_by_finish_time(queue_store_postgres::FinishPartitions::DAILY);
    times_set_right(&pool, partitioned).await;
}

async fn times_set_right(pool: &sqlx::PgPool, jobs: JobTable) {
    let pool = pool.clone();
    jobs.migrate(&pool).await.expect("migration");
    let t = jobs.name().quoted();
    // 25,000 agreeing rows (three batches), then one of each kind that
    // disagrees, as earlier releases wrote them.
    execute(
        &pool,
        format!(
            "INSERT INTO {t} (kind, state, finished_at, process_after) \
             SELECT 'ok', CASE g % 3 WHEN 0 THEN 'completed' WHEN 1 THEN 'errored' ELSE 'queued' END, \
             CASE WHEN g % 3 < 2 THEN now() END, CASE WHEN g % 3 = 1 THEN now() END \
             FROM generate_series(1, 25000) g"
        ),
    )
    .await;
    execute(
        &pool,
        format!(
            "INSERT INTO {t} (kind, state, started_at, finished_at, process_after) VALUES \
             ('scheduled then completed', 'completed', now() - interval '1 minute', now(), now() - interval '1 hour'), \
             ('failed without a finish', 'failed', now() - interval '1 minute', NULL, NULL), \
             ('retried then claimed', 'processing', now(), now() - interval '1 minute', now() - interval '1 minute'), \
             ('reset with its last finish', 'queued', now(), now() - interval '1 minute', NULL)"
        ),
    )
    .await;
    let versions = support::versions_table(&jobs);
    execute(&pool, format!("DELETE FROM {versions} WHERE version = 12")).await;
    let written_before: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {t} WHERE xmin::text::bigint = (SELECT max(xmin::text::bigint) FROM {t})"
    )))
    .fetch_one(&pool)
    .await
    .expect("the rows of the last insert");
    assert_eq!(written_before, 4);

    let applied = jobs.migrate(&pool).await.expect("version 12");
    assert_eq!(applied.iter().map(|m| m.version).collect::<Vec<_>>(), [12]);
    let rows: Vec<(String, String, bool, bool)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT kind, state, finished_at IS NOT NULL, process_after IS NOT NULL FROM {t} \
         WHERE kind <> 'ok' ORDER BY id"
    )))
    .fetch_all(&pool)
    .await
    .expect("the fixed rows");
    let row =
        |kind: &str, state: &str, finished, due| (kind.to_owned(), state.to_owned(), finished, due);
    assert_eq!(
        rows,
        vec![
            row("scheduled then completed", "completed", true, false),
            row("failed without a finish", "failed", true, false),
            row("retried then claimed", "processing", false, false),
            row("reset with its last finish", "queued", false, false),
        ],
        "(kind, state, has a finish time, has a due time)"
    );
    let (disagreeing, errored_with_both): (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FILTER (WHERE {}), \
         count(*) FILTER (WHERE state = 'errored' AND finished_at IS NOT NULL AND process_after IS NOT NULL) \
         FROM {t}",
        support::TIMES_DISAGREE
    )))
    .fetch_one(&pool)
    .await
    .expect("the times");
    assert_eq!(disagreeing, 0, "every row's times agree with its state");
    assert_eq!(
        errored_with_both, 8334,
        "an errored job keeps its last finish and its retry time"
    );
    // Only the four were written: no other row has a newer version than
    // the agreeing rows' insert.
    let rewritten: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {t} WHERE kind = 'ok' AND xmin::text::bigint <> \
         (SELECT min(xmin::text::bigint) FROM {t} WHERE kind = 'ok')"
    )))
    .fetch_one(&pool)
    .await
    .expect("the versions of the agreeing rows");
    assert_eq!(rewritten, 0, "rows that agree are not written");

    execute(&pool, format!("DELETE FROM {versions} WHERE version = 12")).await;
    let again = jobs.migrate(&pool).await.expect("version 12 again");
    assert_eq!(again.iter().map(|m| m.version).collect::<Vec<_>>(), [12]);
    let moved: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {t} WHERE xmin::text::bigint > \
         (SELECT min(xmin::text::bigint) FROM {t} WHERE kind <> 'ok')"
    )))
    .fetch_one(&pool)
    .await
    .expect("the rows' versions");
    assert_eq!(moved, 0, "the second run writes no row the first set right");
}

/// A transaction open on the table (here a job's, holding its row) while
/// versions that drop indexes and add a check wait for their lock: each
/// try waits a short while and gives way, so enqueues go on throughout
/// (none waits longer than about one try), and the conversion completes
/// once the transaction ends. Each version runs in a transaction of its
/// own: version 15's validation does not hold version 14's lock.
#[tokio::test]
async fn a_version_waiting_for_an_open_transaction_leaves_the_queue_running() {
    let Some(pool) =
        pool("a_version_waiting_for_an_open_transaction_leaves_the_queue_running").await
    else {
        return;
    };
    let (jobs, job_tx) = plain_table_with_a_held_job(&pool).await;

    let converting = jobs
        .clone()
        .in_place_claims()
        .migration_lock_wait(Duration::from_millis(200), Duration::from_secs(120));
    let migration = tokio::spawn({
        let pool = pool.clone();
        async move { converting.migrate(&pool).await }
    });
    // Enqueue every 20 ms for three seconds beside the migration's tries.
    let mut slowest = Duration::ZERO;
    let until = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < until {
        let began = std::time::Instant::now();
        tokio::time::timeout(
            Duration::from_secs(2),
            jobs.enqueue(&pool, &NewJob::new("k", serde_json::json!(null))),
        )
        .await
        .expect("an enqueue does not wait behind the migration's lock until the transaction ends")
        .expect("an enqueue beside the migration");
        slowest = slowest.max(began.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !migration.is_finished(),
        "version 14 cannot take its lock while the job's transaction is open"
    );
    assert!(
        slowest < Duration::from_millis(1500),
        "no enqueue waits behind the migration for longer than about one try: {slowest:?}"
    );
    job_tx.rollback().await.expect("the job's transaction ends");
    let applied = tokio::time::timeout(Duration::from_secs(30), migration)
        .await
        .expect("the migration completes once the transaction ends")
        .expect("the task")
        .expect("the migration");
    assert_eq!(
        applied.iter().map(|m| m.version).collect::<Vec<_>>(),
        [13, 14, 15, 16],
        "the conversion's versions, once each"
    );
}

/// A transaction that stays open past the migration's patience: the
/// migration fails with an error naming the session (its pid, idle in
/// its transaction) and leaves the versions it could not apply pending;
/// the table takes jobs meanwhile, and the next run applies them.
#[tokio::test]
async fn a_version_whose_lock_stays_out_of_reach_fails_naming_who_holds_it() {
    let Some(pool) =
        pool("a_version_whose_lock_stays_out_of_reach_fails_naming_who_holds_it").await
    else {
        return;
    };
    let (jobs, mut job_tx) = plain_table_with_a_held_job(&pool).await;
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *job_tx)
        .await
        .expect("the pid");

    let converting = jobs
        .clone()
        .in_place_claims()
        .migration_lock_wait(Duration::from_millis(100), Duration::from_secs(2));
    let error = converting
        .migrate(&pool)
        .await
        .expect_err("the lock stays out of reach")
        .to_string();
    support::assert_says(
        &error,
        &[
            "version 14".to_owned(),
            "stayed out of reach".to_owned(),
            format!("pid {pid} (idle in transaction"),
        ],
    );
    let pending = support::pending_versions(&pool, &converting).await;
    assert_eq!(pending, [14, 15, 16], "version 13 (concurrent) was applied");
    jobs.enqueue(&pool, &NewJob::new("k", serde_json::json!(null)))
        .await
        .expect("the table takes jobs after the failed migration");

    job_tx.rollback().await.expect("the job's transaction ends");
    let applied = converting.migrate(&pool).await.expect("the next run");
    assert_eq!(
        applied.iter().map(|m| m.version).collect::<Vec<_>>(),
        [14, 15, 16]
    );
}

/// A plain table migrated anew with one job, and a transaction that
/// holds the job's row ([`hold_row`]).
async fn plain_table_with_a_held_job(
    pool: &sqlx::PgPool,
) -> (JobTable, sqlx::Transaction<'static, sqlx::Postgres>) {
    let jobs = table();
    jobs.migrate(pool).await.expect("the plain table");
    let id = jobs
        .enqueue(pool, &NewJob::new("k", serde_json::json!(null)))
        .await
        .expect("enqueue");
    let job_tx = hold_row(pool, &jobs, id).await;
    (jobs, job_tx)
}

/// A transaction that holds job `id`'s row (a job's transaction in
/// transactional mode), left idle.
async fn hold_row(
    pool: &sqlx::PgPool,
    jobs: &JobTable,
    id: i64,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = pool.begin().await.expect("a job transaction");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT 1 FROM {} WHERE id = $1 FOR KEY SHARE",
        jobs.name().quoted()
    )))
    .bind(id)
    .execute(&mut *tx)
    .await
    .expect("the job's lock");
    tx
}
