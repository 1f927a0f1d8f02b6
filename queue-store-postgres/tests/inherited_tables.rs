//! A plain table with inheritance children (Postgres' partitioning before
//! version 10): its rows live in the parent and in each child, and a row's
//! place (`ctid`) repeats from one to the next. A statement that found the
//! rows it chose by their places would also take the row at the same place
//! in another child, so on such a table the store goes by key. A claim, a
//! delete by key and a purge each take exactly the rows they chose, while
//! a row of the other table sits at the same place.

mod support;

use chrono::{TimeDelta, Utc};
use queue_core::{Admin, ClaimParams, Job, JobState, NewJob, PurgeParams, Store, Targets};
use queue_store_postgres::{ExecutionMode, JobTable, PgAdmin, PgStore};
use sqlx::PgPool;
use support::{execute, fresh_table, pool, scalar};

/// Rows of the parent and the child that share a place (the hazard the
/// store must not fall into), as the parent's key.
async fn sharing_a_place(pool: &PgPool, parent: &str) -> Vec<i64> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT p.id FROM ONLY {parent} AS p JOIN {parent} AS c \
         ON c.ctid = p.ctid AND c.tableoid <> p.tableoid ORDER BY p.id"
    )))
    .fetch_all(pool)
    .await
    .expect("rows sharing a place")
}

/// A lease store and an admin over `table`, as it is now.
async fn store_and_admin(pool: &PgPool, table: &JobTable) -> (PgStore<Job>, PgAdmin<i64>) {
    let store = PgStore::default_table(
        pool.clone(),
        table.store_options().mode(ExecutionMode::Lease),
    )
    .await
    .expect("a store over the table");
    let admin = PgAdmin::<i64>::new(pool.clone(), table.store_options())
        .await
        .expect("an admin over the table");
    (store, admin)
}

/// The keys of up to `limit` jobs `store` claims now.
async fn claim(store: &PgStore<Job>, limit: usize) -> Vec<i64> {
    store
        .claim(ClaimParams {
            limit,
            worker: "w",
            conditions: None,
            now: Utc::now(),
        })
        .await
        .expect("claim")
        .iter()
        .map(|c| c.lease.id)
        .collect()
}

/// A new inheritance child of `table`, named `name`; its quoted name.
async fn add_child(pool: &PgPool, table: &JobTable, name: &str) -> String {
    let child = format!("{}.\"{name}\"", table.name().schema.quoted());
    execute(
        pool,
        format!(
            "CREATE TABLE {child} () INHERITS ({})",
            table.name().quoted()
        ),
    )
    .await;
    child
}

/// A job inserted straight into the child table `child`; its key.
async fn into_child(pool: &PgPool, child: &str, kind: &str) -> i64 {
    scalar(
        pool,
        &format!("INSERT INTO {child} (kind, payload) VALUES ('{kind}', '{{}}') RETURNING id"),
    )
    .await
}

/// Whether job `id` of `table` (or one of its children) still waits.
async fn waits(pool: &PgPool, table: &str, id: i64) -> bool {
    scalar(
        pool,
        &format!("SELECT count(*) FROM {table} WHERE id = {id} AND state = 'queued'"),
    )
    .await
        == 1
}

/// Job `id` of `table` completed 40 days ago (at a new place).
async fn finish_long_ago(pool: &PgPool, table: &str, id: i64) {
    execute(
        pool,
        format!(
            "UPDATE {table} SET state = 'completed', finished_at = now() - interval '40 days' \
             WHERE id = {id}"
        ),
    )
    .await;
}

/// A purge of the jobs completed over 30 days ago; how many it purged.
async fn purge_old(admin: &PgAdmin<i64>) -> u64 {
    admin
        .purge(&PurgeParams::new(
            vec![JobState::Completed],
            Utc::now() - TimeDelta::days(30),
            100,
        ))
        .await
        .expect("purge")
        .purged
}

/// A job of `table` and one of its `child`, both the first row of their
/// table, so at the same place: their keys.
async fn parent_and_child_at_one_place(pool: &PgPool, table: &JobTable, child: &str) -> (i64, i64) {
    let parents = table
        .enqueue(pool, &NewJob::new("parent", serde_json::json!({})))
        .await
        .expect("enqueue");
    let childs = into_child(pool, child, "child").await;
    assert_eq!(
        sharing_a_place(pool, &table.name().quoted()).await,
        [parents]
    );
    (parents, childs)
}

/// Waiting jobs inserted into `child` until one sits at the place of the
/// parent `table`'s job `id`: that job's key, and how many were inserted.
async fn child_job_at_place_of(pool: &PgPool, table: &str, child: &str, id: i64) -> (i64, i64) {
    for inserted in 1..=20 {
        let job = into_child(pool, child, "filler").await;
        if sharing_a_place(pool, table).await.contains(&id) {
            return (job, inserted);
        }
    }
    panic!("no job of the child reached the place of job {id}");
}

#[tokio::test]
async fn on_a_table_with_inheritance_children_each_statement_takes_only_the_rows_it_chose() {
    let Some(pool) =
        pool("on_a_table_with_inheritance_children_each_statement_takes_only_the_rows_it_chose")
            .await
    else {
        return;
    };
    let table = fresh_table(&pool).await;
    let t = table.name().quoted();
    let child = add_child(&pool, &table, "jobs_child").await;

    // A claim of one job: the parent's, at the place the child's shares.
    let (parents, childs) = parent_and_child_at_one_place(&pool, &table, &child).await;
    let (store, admin) = store_and_admin(&pool, &table).await;
    let ids = claim(&store, 1).await;
    assert_eq!(ids, [parents], "the claim took the first job alone");
    assert!(
        waits(&pool, &t, childs).await,
        "the child's job still waits"
    );

    // A delete by key of a job of the child, at the place of the parent's
    // (claimed, so at a new place).
    let doomed = into_child(&pool, &child, "doomed").await;
    assert_eq!(sharing_a_place(&pool, &t).await, [parents]);
    admin.delete(&Targets::id(doomed)).await.expect("delete");
    assert_eq!(
        scalar(
            &pool,
            &format!("SELECT count(*) FROM {t} WHERE id IN ({parents}, {doomed})")
        )
        .await,
        1,
        "the delete removed its job and left the parent's"
    );

    // A purge of old completed jobs: the parent's, finished long ago, at the
    // place of a waiting job of the child.
    finish_long_ago(&pool, &t, parents).await;
    let waiting = into_child(&pool, &child, "waiting").await;
    assert_eq!(sharing_a_place(&pool, &t).await, [parents]);
    assert_eq!(purge_old(&admin).await, 1);
    assert!(
        waits(&pool, &t, waiting).await,
        "the child's waiting job is still there"
    );
    assert_eq!(
        scalar(&pool, &format!("SELECT count(*) FROM {t}")).await,
        2,
        "the child's two jobs are left"
    );
}

/// A table that gains its first inheritance child while a store runs: the
/// store read at start-up that its places name its rows, and goes on by
/// place. Its statements by place read the table alone (`ONLY`), so the
/// child's jobs, at the same places as the table's, are neither claimed
/// nor removed in their stead; they wait for a restart, which goes by key
/// (the test above).
#[tokio::test]
async fn a_child_gained_after_start_up_is_left_alone_by_the_statements_by_place() {
    let Some(pool) =
        pool("a_child_gained_after_start_up_is_left_alone_by_the_statements_by_place").await
    else {
        return;
    };
    let table = fresh_table(&pool).await;
    let t = table.name().quoted();
    let (store, admin) = store_and_admin(&pool, &table).await;
    let child = add_child(&pool, &table, "jobs_late_child").await;

    // A claim takes the table's job and leaves the child's, at its place.
    let (parents, childs) = parent_and_child_at_one_place(&pool, &table, &child).await;
    let ids = claim(&store, 10).await;
    assert_eq!(ids, [parents], "the claim took the table's job alone");
    assert!(waits(&pool, &t, childs).await, "the child's job waits");

    // A delete of the table's job by key leaves the child's job at the
    // place the table's had.
    let second = table
        .enqueue(&pool, &NewJob::new("second", serde_json::json!({})))
        .await
        .expect("enqueue");
    let (at_seconds_place, mut in_child) = child_job_at_place_of(&pool, &t, &child, second).await;
    in_child += 1;
    let report = admin.delete(&Targets::id(second)).await.expect("delete");
    assert_eq!(report.changed, 1);
    assert!(
        waits(&pool, &t, at_seconds_place).await,
        "the child's job at the deleted job's place is still there"
    );

    // A purge of the table's old completed job leaves the child's waiting
    // job at its place.
    finish_long_ago(&pool, &t, parents).await;
    let (waiting, more) = child_job_at_place_of(&pool, &t, &child, parents).await;
    in_child += more;
    assert_eq!(purge_old(&admin).await, 1);
    assert!(
        waits(&pool, &t, waiting).await,
        "the child's waiting job is still there"
    );
    assert_eq!(
        scalar(&pool, &format!("SELECT count(*) FROM ONLY {child}")).await,
        in_child,
        "every job of the child is left"
    );
}
