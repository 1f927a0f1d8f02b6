//! The default table laid out for claims in place
//! (`JobTable::in_place_claims`): no index names the state, so a claim is
//! a heap-only update; a plain table with jobs in every state converts and
//! goes on; a write against the rule of the times is refused by name; and
//! the layout is refused on a table partitioned by finish time; a limited
//! kind counts its running jobs through the ledger of its claims. The
//! conformance suite runs on this layout too (`tests/conformance.rs`).

mod support;

use std::time::Duration;

use chrono::Utc;
use queue_core::{Admin, ClaimParams, JobFilter, JobState, NewJob, Store, Transition, UniqueScope};
use queue_store_postgres::{ExecutionMode, FinishPartitions, JobTable, PgConditions};
use sqlx::PgPool;
use support::{applied_versions, awkward_schema, fresh_in_place_table, fresh_table, pool, store};

/// The indexes of `table` whose key or predicate names the state column.
async fn indexes_naming_the_state(pool: &PgPool, table: &JobTable) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid \
         JOIN pg_attribute AS a ON a.attrelid = i.indrelid AND a.attname = 'state' \
         WHERE i.indrelid = to_regclass($1) \
         AND (a.attnum = ANY(i.indkey) OR pg_get_expr(i.indpred, i.indrelid) LIKE '%state%') \
         ORDER BY 1",
    )
    .bind(table.name().quoted())
    .fetch_all(pool)
    .await
    .expect("the indexes")
}

/// The heap-only updates Postgres counted on `table`, once its count
/// reaches `at_least` (the store's connections report their counts when
/// they go idle, up to a second later), or after ten seconds.
async fn hot_updates(pool: &PgPool, table: &JobTable, at_least: i64) -> i64 {
    let mut seen = 0;
    for _ in 0..100 {
        seen = sqlx::query_scalar(
            "SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = to_regclass($1)",
        )
        .bind(table.name().quoted())
        .fetch_one(pool)
        .await
        .expect("the table's counts");
        if seen >= at_least {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    seen
}

fn claim_params(limit: usize) -> ClaimParams<'static, PgConditions> {
    ClaimParams {
        limit,
        worker: "w",
        conditions: None,
        now: Utc::now(),
    }
}

#[tokio::test]
async fn a_new_table_names_the_state_in_no_index_and_its_claims_are_heap_only_updates() {
    let test = "a_new_table_names_the_state_in_no_index_and_its_claims_are_heap_only_updates";
    let Some(pool) = pool(test).await else { return };
    let table = fresh_in_place_table(&pool).await;
    let versions = applied_versions(&pool, &table).await;
    assert_eq!(versions, (1..=16).collect::<Vec<u32>>());
    assert_eq!(
        indexes_naming_the_state(&pool, &table).await,
        Vec::<String>::new(),
        "a claim changes the state: an index naming it makes every claim write index entries"
    );
    let store = store(&pool, &table, ExecutionMode::Lease).await;
    let jobs: Vec<NewJob> = (0..200)
        .map(|n| NewJob::new("k", serde_json::json!(n)))
        .collect();
    table.enqueue_many(&pool, &jobs).await.expect("enqueue");
    let mut claimed = 0;
    while claimed < 200 {
        let got = store.claim(claim_params(50)).await.expect("a claim");
        assert!(!got.is_empty(), "the claims found {claimed} of 200 jobs");
        claimed += got.len();
    }
    let hot = hot_updates(&pool, &table, 100).await;
    assert!(
        hot >= 100,
        "{hot} of 200 claims were heap-only updates (on the plain layout none is; here most find room on their page)"
    );
}

#[tokio::test]
async fn a_plain_table_with_jobs_in_every_state_converts_and_goes_on() {
    let test = "a_plain_table_with_jobs_in_every_state_converts_and_goes_on";
    let Some(pool) = pool(test).await else { return };
    let plain = fresh_table(&pool).await;
    let before = store(&pool, &plain, ExecutionMode::Lease).await;
    let jobs: Vec<NewJob> = (0..6)
        .map(|n| NewJob::new("k", serde_json::json!(n)))
        .collect();
    plain.enqueue_many(&pool, &jobs).await.expect("enqueue");
    let held = NewJob::new("k", serde_json::json!("held")).unique("key", UniqueScope::Active);
    plain
        .enqueue_unique(&pool, std::slice::from_ref(&held))
        .await
        .expect("a job holding a key");
    // Two finished (one completed, one failed for a retry later), two
    // running across the conversion, three waiting (the keyed one too).
    let claimed = before.claim(claim_params(4)).await.expect("a claim");
    assert_eq!(claimed.len(), 4);
    let mut claimed = claimed.into_iter();
    for end in [
        Transition::Complete,
        Transition::Retry {
            message: "again".into(),
            retry_at: Utc::now(),
        },
    ] {
        let job = claimed.next().expect("a claimed job");
        let written = before
            .finish(job.job_store, &job.lease, end, Utc::now())
            .await
            .expect("the job ends");
        assert_eq!(written, queue_core::WriteResult::Applied);
    }
    let running: Vec<_> = claimed.collect();
    assert!(indexes_naming_the_state(&pool, &plain).await.len() > 3);

    let converted = JobTable::new(plain.name().schema.as_str(), "jobs")
        .expect("valid names")
        .in_place_claims();
    let applied: Vec<u32> = converted
        .migrate(&pool)
        .await
        .expect("the conversion")
        .into_iter()
        .map(|m| m.version)
        .collect();
    assert_eq!(applied, [13, 14, 15, 16]);
    assert_eq!(
        indexes_naming_the_state(&pool, &converted).await,
        Vec::<String>::new()
    );

    // The running jobs' leases still end them.
    for job in running {
        let written = before
            .finish(job.job_store, &job.lease, Transition::Complete, Utc::now())
            .await
            .expect("a running job ends after the conversion");
        assert_eq!(written, queue_core::WriteResult::Applied);
    }
    // A key held before is held still.
    let again = converted
        .enqueue_unique(&pool, std::slice::from_ref(&held))
        .await
        .expect("enqueue");
    assert!(!again[0].inserted, "the key is held by the waiting job");
    // A store started after finds every waiting job: the three that
    // waited and the retried one.
    let after = store(&pool, &converted, ExecutionMode::Lease).await;
    let mut found = 0;
    loop {
        let got = after.claim(claim_params(10)).await.expect("a claim");
        if got.is_empty() {
            break;
        }
        for job in got {
            found += 1;
            let written = after
                .finish(job.job_store, &job.lease, Transition::Complete, Utc::now())
                .await
                .expect("the job ends");
            assert_eq!(written, queue_core::WriteResult::Applied);
        }
    }
    assert_eq!(found, 4);
    let completed = Admin::count(&after, &JobFilter::default().states([JobState::Completed]))
        .await
        .expect("the count");
    assert_eq!(completed, 7);
}

#[tokio::test]
async fn a_write_against_the_rule_of_the_times_is_refused_by_the_checks_name() {
    let test = "a_write_against_the_rule_of_the_times_is_refused_by_the_checks_name";
    let Some(pool) = pool(test).await else { return };
    let table = fresh_in_place_table(&pool).await;
    // Waiting, with a finish time and no due time: in no index a claim
    // reads, so it would wait for ever.
    let error = sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {} (kind, state, finished_at) VALUES ('k', 'queued', now())",
        table.name().quoted()
    )))
    .execute(&pool)
    .await
    .expect_err("the check refuses it")
    .to_string();
    assert!(error.contains("jobs_times_follow_state"), "{error}");
}

#[tokio::test]
async fn a_table_partitioned_by_finish_time_refuses_claims_in_place() {
    let test = "a_table_partitioned_by_finish_time_refuses_claims_in_place";
    let Some(pool) = pool(test).await else { return };
    let table = JobTable::new(&awkward_schema(), "jobs")
        .expect("valid names")
        .partitioned_by_finish_time(FinishPartitions::DAILY)
        .in_place_claims();
    let error = table.migrate(&pool).await.expect_err("refused").to_string();
    assert!(
        error.contains("partitioned") && error.contains("in_place_claims"),
        "{error}"
    );
}

/// A limited kind's running jobs, counted through the ledger of its
/// claims: while its rule settles the count reads the table (a job of the
/// kind claimed before the limit counts, and is entered); after, it reads
/// the ledger, whose entries of ended jobs the next count deletes; a job
/// set running by hand after the rule settled is in no entry (the count
/// reads the ledger, not the table), until the rule is set again.
#[tokio::test]
async fn a_limited_kinds_running_jobs_are_counted_through_the_ledger_of_its_claims() {
    let test = "a_limited_kinds_running_jobs_are_counted_through_the_ledger_of_its_claims";
    let Some(pool) = pool(test).await else { return };
    let table = fresh_in_place_table(&pool).await;
    let store = store(&pool, &table, ExecutionMode::Lease).await;
    let t = table.name().quoted();
    let schema = table.name().schema.quoted();
    let ledger = format!("{schema}.\"jobs_limited_claims\"");
    let kinds = format!("{schema}.\"jobs_kinds\"");
    let slow = |n: u32| NewJob::new("slow", serde_json::json!(n));

    table.enqueue(&pool, &slow(0)).await.expect("enqueue");
    let early = store.claim(claim_params(10)).await.expect("a claim");
    assert_eq!(early.len(), 1, "no limit yet");
    let jobs: Vec<NewJob> = (1..=10).map(slow).collect();
    table.enqueue_many(&pool, &jobs).await.expect("enqueue");
    Admin::set_limits(
        &store,
        "slow",
        &queue_core::KindLimits::default().max_running(2),
        "test",
    )
    .await
    .expect("the limit");
    // Rules are re-read twice a second.
    tokio::time::sleep(Duration::from_millis(600)).await;

    let claimed = store.claim(claim_params(10)).await.expect("a claim");
    assert_eq!(
        claimed.len(),
        1,
        "the job claimed before the limit counts while the rule settles"
    );
    let entries = |pool: PgPool, ledger: String| async move {
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {ledger} WHERE kind = 'slow'"
        )))
        .fetch_one(&pool)
        .await
        .expect("the ledger")
    };
    assert_eq!(
        entries(pool.clone(), ledger.clone()).await,
        2,
        "both running jobs entered"
    );

    // The rule settled long ago: the count reads the ledger.
    support::execute(
        &pool,
        format!(
            "UPDATE {kinds} SET limits_set_at = now() - interval '1 minute' WHERE kind = 'slow'"
        ),
    )
    .await;
    assert!(store
        .claim(claim_params(10))
        .await
        .expect("a claim")
        .is_empty());
    let first = early.into_iter().next().expect("the early job");
    let written = store
        .finish(
            first.job_store,
            &first.lease,
            Transition::Complete,
            Utc::now(),
        )
        .await
        .expect("the early job ends");
    assert_eq!(written, queue_core::WriteResult::Applied);
    let next = store.claim(claim_params(10)).await.expect("a claim");
    assert_eq!(next.len(), 1, "the ended job's slot is free again");
    assert_eq!(
        entries(pool.clone(), ledger.clone()).await,
        2,
        "the ended job's entry was deleted by the count, the new one entered"
    );

    // A job set running by hand is in no entry: the count reads the ledger.
    support::execute(
        &pool,
        format!(
            "UPDATE {t} SET state = 'processing', started_at = now(), last_heartbeat_at = now() \
             WHERE id = (SELECT min(id) FROM {t} WHERE kind = 'slow' AND state = 'queued')"
        ),
    )
    .await;
    let done = claimed.into_iter().next().expect("a running job");
    let written = store
        .finish(
            done.job_store,
            &done.lease,
            Transition::Complete,
            Utc::now(),
        )
        .await
        .expect("a job ends");
    assert_eq!(written, queue_core::WriteResult::Applied);
    assert_eq!(
        store.claim(claim_params(10)).await.expect("a claim").len(),
        1,
        "the ledger holds one running job; the one set by hand is not in it"
    );
    // Set again, the rule counts the table while it settles: three run
    // (the one by hand too), over the limit of two, so none is claimed.
    Admin::set_limits(
        &store,
        "slow",
        &queue_core::KindLimits::default().max_running(3),
        "test",
    )
    .await
    .expect("the limit");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(store
        .claim(claim_params(10))
        .await
        .expect("a claim")
        .is_empty());
    assert_eq!(
        entries(pool.clone(), ledger.clone()).await,
        3,
        "the job set by hand entered by the table's count"
    );
}
