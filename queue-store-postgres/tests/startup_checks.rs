//! Configurations that would misbehave later are refused when the store or
//! the resetter starts, each with an error naming what would fix it.

mod support;

use queue_core::{Delivery, Job};
use queue_store_postgres::{Column, ExecutionMode, PgStore};
use queue_worker::{Resetter, ResetterOptions, WorkerError};
use support::{fresh_table, pool};

#[tokio::test]
async fn two_standard_columns_on_one_table_column_are_refused() {
    let Some(pool) = pool("two_standard_columns_on_one_table_column_are_refused").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let options = table
        .store_options()
        .column(Column::LastHeartbeatAt, "started_at")
        .expect("valid names");
    let err = PgStore::default_table(pool.clone(), options)
        .await
        .expect_err("started_at and last_heartbeat_at on one column");
    let message = err.to_string();
    assert!(
        message
            .contains("columns started_at and last_heartbeat_at are both mapped to \"started_at\""),
        "{message}"
    );
}

#[tokio::test]
async fn a_table_without_a_heartbeat_column_is_refused_in_both_modes() {
    let Some(pool) = pool("a_table_without_a_heartbeat_column_is_refused_in_both_modes").await
    else {
        return;
    };
    let table = fresh_table(&pool).await;
    for mode in [ExecutionMode::Lease, ExecutionMode::Transactional] {
        let options = table
            .store_options()
            .without(Column::LastHeartbeatAt)
            .expect("valid options")
            .mode(mode);
        let err = PgStore::default_table(pool.clone(), options)
            .await
            .expect_err("no heartbeat column");
        let message = err.to_string();
        assert!(
            message.contains("has no heartbeat column")
                && message.contains("columns.last_heartbeat_at"),
            "{mode:?}: {message}"
        );
    }
}

#[tokio::test]
async fn a_resetter_that_cannot_count_resets_runs_only_at_most_once() {
    let Some(pool) = pool("a_resetter_that_cannot_count_resets_runs_only_at_most_once").await
    else {
        return;
    };
    let table = fresh_table(&pool).await;
    let store: PgStore<Job> = PgStore::default_table(
        pool.clone(),
        table
            .store_options()
            .without(Column::NumResets)
            .expect("valid options"),
    )
    .await
    .expect("a store without a reset counter starts");
    let refused = Resetter::new(store.clone(), ResetterOptions::default());
    match refused {
        Err(WorkerError::InvalidOptions(message)) => assert!(
            message.contains("no num_resets column") && message.contains("Delivery::AtMostOnce"),
            "{message}"
        ),
        other => panic!(
            "an at-least-once resetter must be refused: {:?}",
            other.err()
        ),
    }
    let at_most_once = ResetterOptions {
        delivery: Delivery::AtMostOnce,
        ..ResetterOptions::default()
    };
    assert!(
        Resetter::new(store, at_most_once).is_ok(),
        "failing stalled jobs needs no count"
    );
}

/// A job's limit is kept one way: a table with both an own-limit column
/// and a countdown column is refused, naming both.
#[tokio::test]
async fn a_table_with_both_max_attempts_and_attempts_left_is_refused() {
    let Some(pool) = pool("a_table_with_both_max_attempts_and_attempts_left_is_refused").await
    else {
        return;
    };
    let table = fresh_table(&pool).await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER TABLE {} ADD COLUMN attempts_left integer NOT NULL DEFAULT 3",
        table.name().quoted()
    )))
    .execute(&pool)
    .await
    .expect("a countdown column");
    let err = PgStore::<Job>::default_table(pool.clone(), table.store_options())
        .await
        .expect_err("both columns");
    let message = err.to_string();
    assert!(
        message.contains("both a max_attempts column and an attempts_left column"),
        "{message}"
    );
    let one_way = table
        .store_options()
        .without(Column::MaxAttempts)
        .expect("valid options");
    PgStore::<Job>::default_table(pool.clone(), one_way)
        .await
        .expect("the countdown alone is accepted");
}
