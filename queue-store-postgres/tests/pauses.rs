//! Pauses and limits on Postgres beyond the conformance suite: a pause or a
//! limit made by another process (an operator's `queue pause` or `queue
//! limit`) holds for a running store within a second, and is lifted as
//! fast; one written by hand is heard at once, and a worker woken by a
//! notification claims without reading them again; a missing kinds table
//! or kind column refuses a pause, naming what to do, and never stops
//! claims.

mod support;

use std::time::{Duration, Instant};

use queue_core::{Admin, Job, NewJob, StoreError};
use queue_store_postgres::{kinds, Column, JobTable, PgAdmin, PgStore};
use sqlx::PgPool;
use support::{claim_now, complete, fresh_table, pool};

async fn store(pool: &PgPool, table: &JobTable) -> PgStore<Job> {
    PgStore::default_table(pool.clone(), table.store_options())
        .await
        .expect("a store")
}

async fn operator(pool: &PgPool, table: &JobTable) -> PgAdmin<i64> {
    PgAdmin::new(pool.clone(), table.store_options())
        .await
        .expect("an admin")
}

/// Claims until a job of `kind` comes, for at most `within`; how long it
/// took, or `None`. Jobs of other kinds claimed meanwhile are completed.
async fn first_claim_of(store: &PgStore<Job>, kind: &str, within: Duration) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < within {
        for job in claim_now(store, 10).await {
            let is_kind = job.record.as_ref().is_ok_and(|r| r.kind == kind);
            let _ = complete(store, job).await;
            if is_kind {
                return Some(started.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

#[tokio::test]
async fn a_pause_by_another_process_holds_and_lifts_within_a_second() {
    let Some(pool) = pool("a_pause_by_another_process_holds_and_lifts_within_a_second").await
    else {
        return;
    };
    let table = fresh_table(&pool).await;
    let store = store(&pool, &table).await;
    // The store has read the pauses (none) before the operator pauses.
    assert!(claim_now(&store, 10).await.is_empty());
    let pause = operator(&pool, &table)
        .await
        .pause("mail", "on-call")
        .await
        .expect("the pause");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mail = table
        .enqueue(&pool, &NewJob::new("mail", serde_json::json!(1)))
        .await
        .expect("enqueued");
    table
        .enqueue(&pool, &NewJob::new("report", serde_json::json!(2)))
        .await
        .expect("enqueued");
    assert_eq!(
        first_claim_of(&store, "mail", Duration::from_millis(1500)).await,
        None,
        "a second after the pause, the store claims no mail"
    );
    let stats = store
        .stats(queue_core::StatsParams::new(
            chrono::Utc::now(),
            chrono::Utc::now(),
        ))
        .await
        .expect("stats");
    assert_eq!(stats.paused, vec![pause.clone()], "the store's stats");
    assert_eq!(
        stats.total(queue_core::JobState::Queued),
        1,
        "the mail waits"
    );

    let ended = operator(&pool, &table)
        .await
        .resume("mail")
        .await
        .expect("the resume");
    assert_eq!(ended, Some(pause));
    let took = first_claim_of(&store, "mail", Duration::from_secs(5))
        .await
        .expect("claimed once resumed");
    assert!(took <= Duration::from_secs(1), "resumed within {took:?}");
    let view = store.get(&mail).await.expect("get").expect("there");
    assert_eq!(view.num_failures, Some(0), "no attempt lost: {view:?}");
}

#[tokio::test]
async fn without_its_kinds_table_a_pause_is_refused_and_claims_go_on() {
    let Some(pool) = pool("without_its_kinds_table_a_pause_is_refused_and_claims_go_on").await
    else {
        return;
    };
    let table = fresh_table(&pool).await;
    let store = store(&pool, &table).await;
    store.pause("mail", "on-call").await.expect("paused");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP TABLE {}",
        kinds_table(&table)
    )))
    .execute(&pool)
    .await
    .expect("dropped");
    tokio::time::sleep(Duration::from_millis(600)).await;
    table
        .enqueue(&pool, &NewJob::new("mail", serde_json::json!(1)))
        .await
        .expect("enqueued");
    assert!(
        first_claim_of(&store, "mail", Duration::from_secs(2))
            .await
            .is_some(),
        "with the kinds table gone, nothing is paused and claims go on"
    );
    let refused = store.pause("mail", "on-call").await;
    match refused {
        Err(StoreError::Refused(message)) => assert!(
            message.contains("queue migrate") && message.contains("_kinds"),
            "{message}"
        ),
        other => panic!("a pause without a kinds table: {other:?}"),
    }
    assert!(store.paused().await.expect("no pauses").is_empty());

    let applied = kinds::migrate(&pool, &table.store_options())
        .await
        .expect("the kinds table again");
    assert_eq!(
        applied.iter().map(|m| m.version).collect::<Vec<_>>(),
        vec![1, 2, 3],
        "created again at its newest version (limits and the trigger included): {applied:?}"
    );
    assert!(applied[0].table.name.as_str().ends_with("_kinds"));
    store.pause("mail", "on-call").await.expect("paused again");
}

#[tokio::test]
async fn a_table_without_a_kind_column_has_nothing_to_pause() {
    let Some(pool) = pool("a_table_without_a_kind_column_has_nothing_to_pause").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let options = table
        .store_options()
        .without(Column::Kind)
        .expect("kind is optional");
    let admin = PgAdmin::<i64>::new(pool.clone(), options.clone())
        .await
        .expect("an admin");
    match admin.pause("mail", "on-call").await {
        Err(StoreError::Refused(message)) => {
            assert!(message.contains("no kind column"), "{message}")
        }
        other => panic!("a pause without kinds: {other:?}"),
    }
    match kinds::migrate(&pool, &options).await {
        Err(StoreError::Config(message)) => {
            assert!(message.contains("has no kind column"), "{message}")
        }
        other => panic!("a kinds table without kinds: {other:?}"),
    }
}

/// A limit set by another process (an operator's `queue limit`) holds for
/// a running store within a second, and its clearing as fast.
#[tokio::test]
async fn a_limit_by_another_process_holds_and_lifts_within_a_second() {
    let Some(pool) = pool("a_limit_by_another_process_holds_and_lifts_within_a_second").await
    else {
        return;
    };
    let table = fresh_table(&pool).await;
    let store = store(&pool, &table).await;
    // The store has read the rules (none) before the operator limits.
    assert!(claim_now(&store, 10).await.is_empty());
    operator(&pool, &table)
        .await
        .set_limits(
            "mail",
            &queue_core::KindLimits::default().max_running(1),
            "on-call",
        )
        .await
        .expect("the limit");
    tokio::time::sleep(Duration::from_secs(1)).await;
    for n in 0..3 {
        table
            .enqueue(&pool, &NewJob::new("mail", serde_json::json!(n)))
            .await
            .expect("enqueued");
    }
    let held = claim_now(&store, 10).await;
    assert_eq!(
        held.len(),
        1,
        "a second after the limit, one mail at a time"
    );
    assert!(
        claim_now(&store, 10).await.is_empty(),
        "its one slot is taken"
    );
    operator(&pool, &table)
        .await
        .set_limits("mail", &queue_core::KindLimits::default(), "on-call")
        .await
        .expect("cleared");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        claim_now(&store, 10).await.len(),
        2,
        "a second after the clearing, the rest at once"
    );
    drop(held);
}

/// The kinds table of `table`, quoted and qualified.
fn kinds_table(table: &JobTable) -> String {
    format!(
        "{}.{}",
        table.name().schema.quoted(),
        queue_store_postgres::Ident::new(format!("{}_kinds", table.name().name.as_str()))
            .expect("a name")
            .quoted()
    )
}

/// Waits until the listener of a store on `pool` listens for the changes
/// of `table`'s kinds table: it does before it listens for jobs, the
/// statement it ends its start with. The listener is found by the
/// application name it shares with `pool` (see [`support::pool`]): the
/// other tests' default tables use the same channel, and a rule read
/// before this store's listener watches is not kept current by what it
/// hears.
async fn until_changes_are_heard(pool: &PgPool, table: &JobTable) {
    let started = Instant::now();
    loop {
        let listening: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE state = 'idle' \
             AND query = format('LISTEN \"%s\"', $1::text) \
             AND application_name = current_setting('application_name'))",
        )
        .bind(table.store_options().notify_channel())
        .fetch_one(pool)
        .await
        .expect("pg_stat_activity");
        if listening {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no listener for the kinds table's changes within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A transaction holding `table`'s kinds table locked against every
/// reader until it ends.
async fn locked_against_readers(
    pool: &PgPool,
    table: &JobTable,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut locker = pool.begin().await.expect("a transaction");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "LOCK TABLE {} IN ACCESS EXCLUSIVE MODE",
        kinds_table(table)
    )))
    .execute(&mut *locker)
    .await
    .expect("locked");
    locker
}

/// A pause written into the kinds table by hand, without the store's
/// `Admin` (which tells its own store at once), holds from the next claim
/// of a store that read the rules a moment before: the table's trigger
/// notifies the store's listener, which forgets what it read.
#[tokio::test]
async fn a_pause_written_by_hand_holds_at_the_next_claim() {
    let Some(pool) = pool("a_pause_written_by_hand_holds_at_the_next_claim").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let store = store(&pool, &table).await;
    until_changes_are_heard(&pool, &table).await;
    assert!(claim_now(&store, 10).await.is_empty(), "the rules read");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {} (kind, paused_at, paused_by) VALUES ('mail', now(), 'by hand')",
        kinds_table(&table)
    )))
    .execute(&pool)
    .await
    .expect("paused by hand");
    table
        .enqueue(&pool, &NewJob::new("mail", serde_json::json!(1)))
        .await
        .expect("enqueued");
    // Well within the half second a reading is fresh without the trigger.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        claim_now(&store, 10).await.is_empty(),
        "the mail is paused for the claim after the change was heard"
    );
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {} SET paused_at = NULL, paused_by = NULL WHERE kind = 'mail'",
        kinds_table(&table)
    )))
    .execute(&pool)
    .await
    .expect("resumed by hand");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        claim_now(&store, 10).await.len(),
        1,
        "resumed for the claim after the change was heard"
    );
}

/// A worker idle for longer than the second a reading holds, woken by an
/// enqueue's notification, claims on the rules it read before: every
/// change committed before that notification was heard first. Shown with
/// the kinds table locked against readers: a claim that read the rules
/// would wait for the lock.
#[tokio::test]
async fn a_worker_woken_after_a_quiet_second_claims_without_reading_the_rules() {
    let Some(pool) =
        pool("a_worker_woken_after_a_quiet_second_claims_without_reading_the_rules").await
    else {
        return;
    };
    let table = fresh_table(&pool).await;
    let store = store(&pool, &table).await;
    until_changes_are_heard(&pool, &table).await;
    assert!(claim_now(&store, 10).await.is_empty(), "the rules read");
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let locker = locked_against_readers(&pool, &table).await;
    table
        .enqueue(&pool, &NewJob::new("mail", serde_json::json!(1)))
        .await
        .expect("enqueued");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let claimed = tokio::time::timeout(Duration::from_secs(3), claim_now(&store, 10)).await;
    locker.rollback().await.expect("unlocked");
    assert_eq!(
        claimed.map(|jobs| jobs.len()).ok(),
        Some(1),
        "claimed at once, without waiting for the kinds table"
    );

    // Without a notification since, past the second, the claim reads them.
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let locker = locked_against_readers(&pool, &table).await;
    let claimed = tokio::time::timeout(Duration::from_millis(500), claim_now(&store, 10)).await;
    locker.rollback().await.expect("unlocked");
    assert!(
        claimed.is_err(),
        "a claim nothing woke goes on no reading older than a second"
    );
}
