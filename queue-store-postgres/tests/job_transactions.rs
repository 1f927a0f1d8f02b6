//! A job's transaction in transactional mode runs on statements the store
//! prepares in SQL, with the job's key, token and time as escaped literals:
//! hostile text keys and state values stay values, a connection that lost
//! the statements prepares them again, a completion that finds the row no
//! longer held rolls the handler's writes back, the next job on a
//! connection locks inside the transaction the last commit chained (which
//! never reaches the pool), with the statements turned off the same jobs
//! run on bound statements, and the worker learns which finishes end a
//! handler's transaction.

mod support;

use queue_core::{Claimed, JobRecord, JobState, Store, WriteResult};
use queue_store_postgres::{ExecutionMode, PgStore, PgStoreOptions};
use sqlx::PgPool;
use support::{awkward_schema, backend_pid, claim_now, complete, pool};

/// A row of the keyed table: a text key and nothing else the handler needs.
#[derive(Debug, sqlx::FromRow)]
struct Keyed {
    id: String,
}

impl JobRecord for Keyed {
    type Id = String;
    fn id(&self) -> &String {
        &self.id
    }
    fn kind(&self) -> &str {
        "keyed"
    }
}

/// Keys and a state value written to break naive SQL text.
const HOSTILE_KEYS: [&str; 5] = [
    "plain",
    "it's",
    "back\\slash\\'",
    "'); DROP TABLE victims; --",
    "ünï $1 cödé",
];
const PROCESSING: &str = "in 'progress' \\";

fn quoted(schema: &str) -> String {
    format!("\"{}\"", schema.replace('"', "\"\""))
}

/// A text-keyed table holding one queued job per key, a side table for the
/// handlers' writes and a table a successful injection would drop.
async fn keyed_table(pool: &PgPool, keys: &[&str]) -> String {
    let schema = awkward_schema();
    let s = quoted(&schema);
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA {s};
         CREATE TABLE {s}.victims (x int);
         CREATE TABLE {s}.side (note text);
         CREATE TABLE {s}.keyed (id text PRIMARY KEY, state text NOT NULL DEFAULT 'queued',
            started_at timestamptz, finished_at timestamptz, last_heartbeat_at timestamptz,
            claim_token bigint NOT NULL DEFAULT 0)"
    )))
    .execute(pool)
    .await
    .expect("keyed tables");
    for key in keys {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {s}.keyed (id) VALUES ($1)"
        )))
        .bind(key)
        .execute(pool)
        .await
        .expect("a keyed job");
    }
    schema
}

async fn keyed_store(pool: &PgPool, schema: &str, prepared: bool) -> PgStore<Keyed> {
    let mut options = PgStoreOptions::new("keyed")
        .unwrap()
        .schema(schema)
        .unwrap()
        .state_value(JobState::Processing, PROCESSING)
        .mode(ExecutionMode::Transactional)
        .prepared_job_statements(prepared);
    for column in queue_store_postgres::Column::ALL {
        if !matches!(
            column.standard_name(),
            "id" | "state" | "started_at" | "finished_at" | "last_heartbeat_at" | "claim_token"
        ) {
            options = options.without(column).unwrap();
        }
    }
    PgStore::new(pool.clone(), options)
        .await
        .expect("a store over the keyed table")
}

/// Writes a note in the job's transaction and completes the job.
async fn note_and_complete(
    store: &PgStore<Keyed>,
    schema: &str,
    mut job: Claimed<PgStore<Keyed>>,
) -> WriteResult {
    let conn = job.job_store.transaction().await.expect("the job's lock");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {}.side VALUES ($1)",
        quoted(schema)
    )))
    .bind(&job.lease.id)
    .execute(&mut *conn)
    .await
    .expect("the handler's write");
    complete(store, job).await
}

async fn column(pool: &PgPool, sql: &str) -> Vec<String> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Runs every hostile key through claim, lock, write and completion.
async fn hostile_keys_complete(test: &str, prepared: bool) {
    let Some(pool) = pool(test).await else {
        return;
    };
    let schema = keyed_table(&pool, &HOSTILE_KEYS).await;
    let store = keyed_store(&pool, &schema, prepared).await;
    let jobs = claim_now(&store, HOSTILE_KEYS.len()).await;
    assert_eq!(jobs.len(), HOSTILE_KEYS.len());
    for job in jobs {
        let id = job.lease.id.clone();
        assert_eq!(
            note_and_complete(&store, &schema, job).await,
            WriteResult::Applied,
            "{id:?}"
        );
    }
    let s = quoted(&schema);
    let mut keys: Vec<String> = HOSTILE_KEYS.iter().map(|k| k.to_string()).collect();
    keys.sort();
    assert_eq!(
        column(
            &pool,
            &format!("SELECT id FROM {s}.keyed WHERE state = 'completed' AND finished_at IS NOT NULL ORDER BY id")
        )
        .await,
        keys,
        "every key completed"
    );
    assert_eq!(
        column(&pool, &format!("SELECT note FROM {s}.side ORDER BY note")).await,
        keys,
        "every handler's write committed with its job"
    );
    assert!(
        column(&pool, &format!("SELECT 'x' FROM {s}.victims"))
            .await
            .is_empty(),
        "the table a key tried to drop is still there"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_text_keys_and_state_values_stay_values_in_prepared_statements() {
    hostile_keys_complete(
        "hostile_text_keys_and_state_values_stay_values_in_prepared_statements",
        true,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_prepared_statements_off_jobs_run_on_bound_statements() {
    hostile_keys_complete(
        "with_prepared_statements_off_jobs_run_on_bound_statements",
        false,
    )
    .await;
}

/// The store's statements prepared on the session `conn` is on.
async fn prepared_here(conn: &mut sqlx::PgConnection) -> Vec<String> {
    sqlx::query_scalar(
        "SELECT name FROM pg_prepared_statements WHERE name LIKE 'queue\\_%' ORDER BY name",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap()
}

/// A keyed table with jobs `first` and `second`, a store with prepared
/// statements, and both jobs claimed.
async fn two_claimed_jobs(
    pool: &PgPool,
) -> (
    String,
    PgStore<Keyed>,
    Claimed<PgStore<Keyed>>,
    Claimed<PgStore<Keyed>>,
) {
    let schema = keyed_table(pool, &["first", "second"]).await;
    let store = keyed_store(pool, &schema, true).await;
    let mut jobs = claim_now(&store, 2).await;
    let second = jobs.pop().expect("two jobs");
    let first = jobs.pop().expect("two jobs");
    (schema, store, first, second)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_lost_the_statements_prepares_them_again() {
    let Some(pool) = pool("a_connection_that_lost_the_statements_prepares_them_again").await else {
        return;
    };
    let (schema, store, mut first, mut second) = two_claimed_jobs(&pool).await;

    let conn = first.job_store.transaction().await.unwrap();
    let names = prepared_here(conn).await;
    assert_eq!(names.len(), 2, "the lock and the completion: {names:?}");
    let pid = backend_pid(conn).await;
    // The lock goes missing (as after a `DEALLOCATE` or a pooler's switch).
    let lock = names
        .iter()
        .find(|n| n.starts_with("queue_lock_"))
        .expect("the lock");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DEALLOCATE {lock}")))
        .execute(&mut *conn)
        .await
        .unwrap();
    assert_eq!(complete(&store, first).await, WriteResult::Applied);

    // The next job's transaction takes the same connection back.
    let conn = second.job_store.transaction().await.unwrap();
    let again = backend_pid(conn).await;
    assert_eq!(again, pid, "the job transaction's connection is reused");
    assert_eq!(prepared_here(conn).await, names, "prepared again");
    assert_eq!(complete(&store, second).await, WriteResult::Applied);
    assert_eq!(completed_keys(&pool, &schema).await, ["first", "second"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_that_finds_the_row_moved_on_rolls_the_handlers_writes_back() {
    let Some(pool) =
        pool("a_completion_that_finds_the_row_moved_on_rolls_the_handlers_writes_back").await
    else {
        return;
    };
    for prepared in [true, false] {
        let schema = keyed_table(&pool, &["moved"]).await;
        let s = quoted(&schema);
        let store = keyed_store(&pool, &schema, prepared).await;
        let mut job = claim_now(&store, 1).await.pop().expect("one job");
        let conn = job.job_store.transaction().await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {s}.side VALUES ('lost')"
        )))
        .execute(&mut *conn)
        .await
        .unwrap();
        // Inside the job's own transaction (the only writer the lock lets
        // through): the claim token moves on.
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE {s}.keyed SET claim_token = claim_token + 1"
        )))
        .execute(&mut *conn)
        .await
        .unwrap();
        assert_eq!(
            complete(&store, job).await,
            WriteResult::Stale,
            "prepared: {prepared}"
        );
        assert!(
            column(&pool, &format!("SELECT note FROM {s}.side"))
                .await
                .is_empty(),
            "prepared: {prepared}: the handler's write was rolled back"
        );
        assert_eq!(
            column(&pool, &format!("SELECT state FROM {s}.keyed")).await,
            [PROCESSING],
            "prepared: {prepared}: the job is untouched (the resetter's to recover)"
        );
    }
}

/// The keys of the keyed table's completed jobs, in order.
async fn completed_keys(pool: &PgPool, schema: &str) -> Vec<String> {
    let s = quoted(schema);
    column(
        pool,
        &format!("SELECT id FROM {s}.keyed WHERE state = 'completed' ORDER BY id"),
    )
    .await
}

/// Whether session `pid` is inside a transaction.
async fn in_transaction(pool: &PgPool, pid: i32) -> bool {
    sqlx::query_scalar(
        "SELECT count(*) > 0 FROM pg_stat_activity WHERE pid = $1 AND xact_start IS NOT NULL",
    )
    .bind(pid)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_job_locks_in_the_chained_transaction_which_never_reaches_the_pool() {
    let Some(pool) =
        pool("the_next_job_locks_in_the_chained_transaction_which_never_reaches_the_pool").await
    else {
        return;
    };
    let (schema, store, mut first, mut second) = two_claimed_jobs(&pool).await;
    let conn = first.job_store.transaction().await.unwrap();
    let pid = backend_pid(conn).await;
    assert_eq!(complete(&store, first).await, WriteResult::Applied);
    assert!(
        in_transaction(&pool, pid).await,
        "the commit chained an empty transaction"
    );

    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let asked = chrono::Utc::now();
    let conn = second.job_store.transaction().await.unwrap();
    let (again, started): (i32, chrono::DateTime<chrono::Utc>) =
        sqlx::query_as("SELECT pg_backend_pid(), now()")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
    assert_eq!(again, pid, "the job transaction's connection is reused");
    assert!(
        started < asked - chrono::Duration::milliseconds(100),
        "the second job's transaction began at the first one's commit ({started}), not when it was asked for ({asked})"
    );
    assert_eq!(complete(&store, second).await, WriteResult::Applied);

    // Unused, the connection goes back to the pool out of its transaction.
    let mut waited = std::time::Duration::ZERO;
    while in_transaction(&pool, pid).await {
        assert!(
            waited < std::time::Duration::from_secs(5),
            "a kept connection went back to the pool inside a transaction"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        waited += std::time::Duration::from_millis(50);
    }
    assert_eq!(completed_keys(&pool, &schema).await, ["first", "second"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finish_ends_the_handlers_transaction_only_once_the_handler_opened_it() {
    let Some(pool) =
        pool("a_finish_ends_the_handlers_transaction_only_once_the_handler_opened_it").await
    else {
        return;
    };
    let (schema, store, mut first, second) = two_claimed_jobs(&pool).await;
    assert!(
        !store.finish_ends_transaction(&first.job_store),
        "no transaction before the handler asks for it"
    );
    first.job_store.transaction().await.unwrap();
    assert!(
        store.finish_ends_transaction(&first.job_store),
        "the worker keeps the handler's slot until this transaction commits"
    );
    assert_eq!(complete(&store, first).await, WriteResult::Applied);
    // A handler that never asked: its outcome goes to the batched completer.
    assert!(!store.finish_ends_transaction(&second.job_store));
    assert_eq!(complete(&store, second).await, WriteResult::Applied);
    assert_eq!(completed_keys(&pool, &schema).await, ["first", "second"]);
}
