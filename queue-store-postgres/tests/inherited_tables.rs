//! A plain table with inheritance children (Postgres' partitioning before
//! version 10): its rows live in the parent and in each child, and a row's
//! place (`ctid`) repeats from one to the next. A statement that found the
//! rows it chose by their places would also take the row at the same place
//! in another child, so on such a table the store goes by key. A claim, a
//! delete by key and a purge each take exactly the rows they chose, while
//! a row of the other table sits at the same place.

mod support;

use chrono::{TimeDelta, Utc};
use queue_core::{Admin, ClaimParams, JobState, NewJob, PurgeParams, Store, Targets};
use queue_store_postgres::{ExecutionMode, PgAdmin, PgStore};
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
    let child = format!("{}.\"jobs_child\"", table.name().schema.quoted());
    execute(&pool, format!("CREATE TABLE {child} () INHERITS ({t})")).await;
    let into_child = |kind: &str| {
        format!("INSERT INTO {child} (kind, payload) VALUES ('{kind}', '{{}}') RETURNING id")
    };
    let state_of =
        |id: i64| format!("SELECT count(*) FROM {t} WHERE id = {id} AND state = 'queued'");

    // A claim of one job: the parent's, at the place the child's shares.
    let parents = table
        .enqueue(&pool, &NewJob::new("parent", serde_json::json!({})))
        .await
        .expect("enqueue");
    let childs = scalar(&pool, &into_child("child")).await;
    assert_eq!(sharing_a_place(&pool, &t).await, [parents]);
    let store = PgStore::default_table(
        pool.clone(),
        table.store_options().mode(ExecutionMode::Lease),
    )
    .await
    .expect("a store over the inherited table");
    let claimed = store
        .claim(ClaimParams {
            limit: 1,
            worker: "w",
            conditions: None,
            now: Utc::now(),
        })
        .await
        .expect("claim");
    let ids: Vec<i64> = claimed.iter().map(|c| c.lease.id).collect();
    assert_eq!(ids, [parents], "the claim took the first job alone");
    assert_eq!(
        scalar(&pool, &state_of(childs)).await,
        1,
        "the child's job still waits"
    );

    // A delete by key of a job of the child, at the place of the parent's
    // (claimed, so at a new place).
    let doomed = scalar(&pool, &into_child("doomed")).await;
    assert_eq!(sharing_a_place(&pool, &t).await, [parents]);
    let admin = PgAdmin::<i64>::new(pool.clone(), table.store_options())
        .await
        .expect("an admin over the inherited table");
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
    execute(
        &pool,
        format!(
            "UPDATE {t} SET state = 'completed', finished_at = now() - interval '40 days' \
             WHERE id = {parents}"
        ),
    )
    .await;
    let waiting = scalar(&pool, &into_child("waiting")).await;
    assert_eq!(sharing_a_place(&pool, &t).await, [parents]);
    let purged = admin
        .purge(&PurgeParams::new(
            vec![JobState::Completed],
            Utc::now() - TimeDelta::days(30),
            100,
        ))
        .await
        .expect("purge");
    assert_eq!(purged.purged, 1);
    assert_eq!(
        scalar(&pool, &state_of(waiting)).await,
        1,
        "the child's waiting job is still there"
    );
    assert_eq!(
        scalar(&pool, &format!("SELECT count(*) FROM {t}")).await,
        2,
        "the child's two jobs are left"
    );
}
