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

/// A `Job` record reads the default table's columns by name: a store of
/// `Job`s over a table without one of them, or storing running jobs as
/// another value, is refused at start-up, naming what it lacks, instead
/// of failing every job it claims as undecodable.
#[tokio::test]
async fn a_job_store_over_columns_a_job_cannot_be_read_from_is_refused() {
    let Some(pool) = pool("a_job_store_over_columns_a_job_cannot_be_read_from").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let (schema, _) = support::partitioned_by_state(&pool).await;
    let options = || {
        queue_store_postgres::PgStoreOptions::new("tasks")
            .and_then(|o| o.schema(&schema))
            .expect("valid names")
    };
    support::execute(
        &pool,
        format!(
            "ALTER TABLE {}.tasks DROP COLUMN execution_logs, DROP COLUMN cancel",
            support::quoted_schema(&schema)
        ),
    )
    .await;
    let without_logs = options()
        .without(Column::ExecutionLogs)
        .and_then(|o| o.without(Column::Cancel))
        .expect("optional columns");
    let message = PgStore::<Job>::default_table(pool.clone(), without_logs)
        .await
        .expect_err("no execution_logs to read")
        .to_string();
    assert!(
        message.contains("has no execution_logs, cancel") && message.contains("PgStore::new"),
        "{message}"
    );
    support::execute(
        &pool,
        format!(
            "ALTER TABLE {}.tasks ADD COLUMN execution_logs json[], ADD COLUMN cancel boolean NOT NULL DEFAULT false",
            support::quoted_schema(&schema)
        ),
    )
    .await;
    // Read by name (the reset count left out of the claim's own list),
    // with running jobs stored as another value.
    let other_states = options()
        .without(Column::NumResets)
        .expect("optional")
        .state_value(queue_core::JobState::Processing, "running");
    let message = PgStore::<Job>::default_table(pool.clone(), other_states)
        .await
        .expect_err("states stored as other values")
        .to_string();
    assert!(message.contains("stores it as \"running\""), "{message}");
    PgStore::<Job>::default_table(pool.clone(), options())
        .await
        .expect("every column under its standard name is read");
    // The claim's own list reads the state from the claim: any value.
    PgStore::<Job>::default_table(
        pool.clone(),
        options().state_value(queue_core::JobState::Processing, "running"),
    )
    .await
    .expect("states of its own, every column there");
    PgStore::<Job>::default_table(pool.clone(), table.store_options())
        .await
        .expect("the default table");
}
