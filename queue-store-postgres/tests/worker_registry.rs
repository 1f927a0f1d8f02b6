//! The worker registry on Postgres beyond the conformance suite: without
//! its table a beat is refused, naming what to run, and the store stops
//! sending beats for a while instead of one failing statement per beat.

mod support;

use queue_core::{Job, Store, StoreError, WorkerBeat};
use queue_store_postgres::PgStore;
use support::{fresh_table, pool};

#[tokio::test]
async fn without_its_table_a_beat_is_refused_and_not_sent_again_at_once() {
    let Some(pool) = pool("without_its_table_a_beat_is_refused_and_not_sent_again_at_once").await
    else {
        return;
    };
    let table = fresh_table(&pool).await;
    let store: PgStore<Job> = PgStore::default_table(pool.clone(), table.store_options())
        .await
        .expect("a store");
    let beat = WorkerBeat::new("w", "host", 1);
    store
        .beat(&beat)
        .await
        .expect("a beat into the migrated table");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP TABLE {}.{}",
        table.name().schema.quoted(),
        queue_store_postgres::Ident::new(format!("{}_workers", table.name().name.as_str()))
            .expect("a name")
            .quoted()
    )))
    .execute(&pool)
    .await
    .expect("dropped");
    match store.beat(&beat).await {
        Err(StoreError::Refused(message)) => assert!(
            message.contains("_workers") && message.contains("queue migrate"),
            "{message}"
        ),
        other => panic!("a beat without the table: {other:?}"),
    }
    // The table back at once: a beat within the minute is still refused,
    // from memory, so it sent no statement.
    queue_store_postgres::migrate_beside(&pool, &table.store_options())
        .await
        .expect("the workers table again");
    assert!(
        matches!(store.beat(&beat).await, Err(StoreError::Refused(_))),
        "refused from memory for a minute"
    );
}
