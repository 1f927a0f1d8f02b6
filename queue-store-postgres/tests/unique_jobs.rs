//! Unique jobs on Postgres under concurrency: sixteen enqueuers of one key
//! make exactly one job, and enqueuers of other keys lose nothing.

mod support;

use std::sync::Arc;

use queue_core::{Admin, Enqueued, Job, NewJob, UniqueScope};
use queue_store_postgres::PgStore;
use support::{fresh_table, pool};
use tokio::sync::Barrier;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_concurrent_enqueuers_of_one_key_make_one_job() {
    let test = "sixteen_concurrent_enqueuers_of_one_key_make_one_job";
    let Some(pool) = pool(test).await else { return };
    let table = Arc::new(fresh_table(&pool).await);
    let store: PgStore<Job> = PgStore::default_table(pool.clone(), table.store_options())
        .await
        .expect("a store");
    for round in 0..20 {
        let key = format!("report:{round}");
        let barrier = Arc::new(Barrier::new(16));
        let mut tasks = Vec::new();
        for n in 0..16 {
            let (store, table, pool, barrier, key) = (
                store.clone(),
                table.clone(),
                pool.clone(),
                barrier.clone(),
                key.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let same =
                    NewJob::new("report", serde_json::json!(n)).unique(key, UniqueScope::Active);
                let own = NewJob::new("report", serde_json::json!(n))
                    .unique(format!("own:{round}:{n}"), UniqueScope::Active);
                barrier.wait().await;
                if n % 2 == 0 {
                    // Through the admin contract.
                    Admin::enqueue(&store, &[same, own])
                        .await
                        .expect("enqueued")
                } else {
                    // Straight into the table: the same statements.
                    table
                        .enqueue_unique(&pool, &[same, own])
                        .await
                        .expect("enqueued")
                }
            }));
        }
        let mut results: Vec<Vec<Enqueued<i64>>> = Vec::new();
        for task in tasks {
            results.push(task.await.expect("joined"));
        }
        let same: Vec<&Enqueued<i64>> = results.iter().map(|r| &r[0]).collect();
        assert_eq!(
            same.iter().filter(|e| e.inserted).count(),
            1,
            "round {round}: exactly one enqueuer added the job"
        );
        assert!(
            same.iter().all(|e| e.id == same[0].id),
            "round {round}: every enqueuer got the one job's key"
        );
        assert!(
            results.iter().all(|r| r[1].inserted),
            "round {round}: every job with a key of its own was added"
        );
        let rows: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {} WHERE unique_key = $1",
            table.name().quoted()
        )))
        .bind(&key)
        .fetch_one(&pool)
        .await
        .expect("counted");
        assert_eq!(rows, 1, "round {round}: one row holds the key");
    }
    let total: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {}",
        table.name().quoted()
    )))
    .fetch_one(&pool)
    .await
    .expect("counted");
    assert_eq!(
        total,
        20 * 17,
        "one shared job and sixteen own jobs per round"
    );
}

#[tokio::test]
async fn a_unique_enqueue_in_a_rolled_back_transaction_holds_nothing() {
    let test = "a_unique_enqueue_in_a_rolled_back_transaction_holds_nothing";
    let Some(pool) = pool(test).await else { return };
    let table = fresh_table(&pool).await;
    let job =
        || NewJob::new("invoice", serde_json::json!({})).unique("invoice:9", UniqueScope::Active);
    let mut tx = pool.begin().await.expect("a transaction");
    let first = table.enqueue(&mut *tx, &job()).await.expect("enqueued");
    let again = table
        .enqueue_unique(&mut *tx, &[job()])
        .await
        .expect("enqueued");
    assert_eq!(
        (again[0].id, again[0].inserted),
        (first, false),
        "the transaction sees its own job holding the key"
    );
    tx.rollback().await.expect("rolled back");
    let after = table
        .enqueue_unique(&pool, &[job()])
        .await
        .expect("enqueued");
    assert!(after[0].inserted, "the rolled-back job held nothing");
    assert_ne!(after[0].id, first);
}

#[tokio::test]
async fn a_mixed_batch_reports_each_job_in_order() {
    let Some(pool) = pool("a_mixed_batch_reports_each_job_in_order").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let keyed =
        |key: &str| NewJob::new("k", serde_json::json!(key)).unique(key, UniqueScope::Active);
    let plain = |n: i32| NewJob::new("k", serde_json::json!(n)).max_attempts(3);
    let held = table
        .enqueue(&pool, &keyed("held"))
        .await
        .expect("enqueued");
    let done = table
        .enqueue_unique(
            &pool,
            &[
                plain(1),
                keyed("a"),
                plain(2),
                keyed("a"),
                keyed("held"),
                plain(3),
            ],
        )
        .await
        .expect("enqueued");
    let inserted: Vec<bool> = done.iter().map(|e| e.inserted).collect();
    assert_eq!(inserted, [true, true, true, false, false, true]);
    assert_eq!(
        done[3].id, done[1].id,
        "the batch's second a reports the first"
    );
    assert_eq!(done[4].id, held, "a key held before reports its holder");
    let ids = [done[0].id, done[2].id, done[5].id];
    assert!(
        ids[0] < ids[1] && ids[1] < ids[2],
        "jobs without keys in order: {ids:?}"
    );
    let payloads: Vec<serde_json::Value> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT payload FROM {} WHERE id = ANY($1) ORDER BY id",
        table.name().quoted()
    )))
    .bind(ids.to_vec())
    .fetch_all(&pool)
    .await
    .expect("read");
    assert_eq!(
        payloads,
        [
            serde_json::json!(1),
            serde_json::json!(2),
            serde_json::json!(3)
        ]
    );
}

/// The unique index of the table's unique-key column, dropped, so the
/// table looks like a foreign one whose key column nothing keeps unique.
async fn drop_unique_index(pool: &sqlx::PgPool, table: &queue_store_postgres::JobTable) {
    let schema = table.name().schema.as_str().to_owned();
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT indexname::text FROM pg_indexes WHERE schemaname = $1 AND indexdef LIKE 'CREATE UNIQUE INDEX%unique_key%'",
    )
    .bind(&schema)
    .fetch_all(pool)
    .await
    .expect("the unique index");
    assert_eq!(indexes.len(), 1, "the default table has one: {indexes:?}");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP INDEX {}.\"{}\"",
        table.name().schema.quoted(),
        indexes[0]
    )))
    .execute(pool)
    .await
    .expect("dropping it");
}

/// A unique-key column with no unique index would let duplicates in
/// silently (`ON CONFLICT` never fires): a store refuses to start, naming
/// the statement that fixes it; that statement makes it start. An index
/// whose predicate leaves out running jobs is refused too. An admin (the
/// CLI, the API) still reads the table, and refuses only keyed enqueues.
#[tokio::test]
async fn a_unique_key_column_without_a_unique_index_is_refused_with_the_fix() {
    let test = "a_unique_key_column_without_a_unique_index_is_refused_with_the_fix";
    let Some(pool) = pool(test).await else { return };
    let table = fresh_table(&pool).await;
    drop_unique_index(&pool, &table).await;

    let refusal = PgStore::<Job>::default_table(pool.clone(), table.store_options())
        .await
        .expect_err("refused")
        .to_string();
    assert!(
        refusal.contains("\"unique_key\"") && refusal.contains("no unique index on it"),
        "{refusal}"
    );
    let fix = refusal
        .split("create the index: ")
        .nth(1)
        .expect("the statement that fixes it")
        .to_owned();
    assert!(
        fix.starts_with("CREATE UNIQUE INDEX CONCURRENTLY ON "),
        "{fix}"
    );

    let admin = queue_store_postgres::PgAdmin::<i64>::new(pool.clone(), table.store_options())
        .await
        .expect("an admin reads the table all the same");
    let keyed = NewJob::new("report", serde_json::json!(1)).unique("r:1", UniqueScope::Active);
    let refused = admin
        .enqueue(std::slice::from_ref(&keyed))
        .await
        .expect_err("refused");
    assert!(
        matches!(refused, queue_core::StoreError::Refused(_))
            && refused.to_string().contains("CREATE UNIQUE INDEX"),
        "{refused}"
    );
    let plain = admin
        .enqueue(&[NewJob::new("report", serde_json::json!(2))])
        .await
        .expect("a job without a key is enqueued");
    assert!(plain[0].inserted);

    // An index that only covers queued jobs lets a running job's key be
    // taken again.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE UNIQUE INDEX ON {} (unique_key) WHERE state = 'queued'",
        table.name().quoted()
    )))
    .execute(&pool)
    .await
    .expect("a narrow index");
    let refusal = PgStore::<Job>::default_table(pool.clone(), table.store_options())
        .await
        .expect_err("refused")
        .to_string();
    assert!(
        refusal.contains("its unique indexes leave out waiting or running jobs"),
        "{refusal}"
    );

    sqlx::query(sqlx::AssertSqlSafe(fix))
        .execute(&pool)
        .await
        .expect("the printed statement runs");
    let store = PgStore::<Job>::default_table(pool.clone(), table.store_options())
        .await
        .expect("the store starts with the index");
    let first = Admin::enqueue(&store, std::slice::from_ref(&keyed))
        .await
        .expect("enqueued");
    let second = Admin::enqueue(&store, &[keyed]).await.expect("enqueued");
    assert!(first[0].inserted && !second[0].inserted);
    assert_eq!(first[0].id, second[0].id, "one job holds the key");
}

/// A key's holder that commits while an enqueue of the key waits for it
/// is out of the waiting statement's sight: the insert skips the job, and
/// the lookup of holders finds none. The enqueue then runs a second
/// statement on its connection, inside the caller's transaction, which
/// sees the holder and reports it, instead of failing or adding a second
/// job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_committed_while_the_enqueue_waited_is_found_by_the_next_statement() {
    let test = "a_holder_committed_while_the_enqueue_waited_is_found_by_the_next_statement";
    let Some(pool) = pool(test).await else { return };
    let table = Arc::new(fresh_table(&pool).await);
    let keyed = || NewJob::new("k", serde_json::json!(null)).unique("order:9", UniqueScope::Active);
    let mut holder = pool.begin().await.expect("a transaction");
    let holder_id = table
        .enqueue(&mut *holder, &keyed())
        .await
        .expect("the holder, not committed yet");
    let waiting = {
        let (table, pool) = (table.clone(), pool.clone());
        tokio::spawn(async move {
            let mut tx = pool.begin().await.expect("a transaction");
            let done = table.enqueue_unique(&mut tx, &[keyed()]).await;
            tx.commit().await.expect("committed");
            done
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "the enqueue waits on the key");
    holder.commit().await.expect("committed");
    let done = tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
        .await
        .expect("the enqueue ends")
        .expect("joined")
        .expect("no error: the next statement sees the holder");
    assert_eq!(
        done.iter().map(|e| (e.id, e.inserted)).collect::<Vec<_>>(),
        [(holder_id, false)]
    );
    let jobs: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {}",
        table.name().quoted()
    )))
    .fetch_one(&pool)
    .await
    .expect("count");
    assert_eq!(jobs, 1, "one job for the key");
}
