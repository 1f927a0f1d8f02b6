//! The plans Postgres picks for the store's batched statements, checked on
//! the test database (`DATABASE_URL`; required under `cargo xtask test-pg`).
//!
//! sqlx prepares each statement once per connection, and after five runs
//! Postgres keeps one generic plan for it, made without the parameters'
//! values. That plan has to stay linear in the batch, whatever the batch.

use queue_core::testkit::database_url;
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgConnection, PgPool};

use super::catalog;
use super::{Statement, Statements, TableShape};
use crate::{CompletedJobs, JobTable};

async fn pool(test: &str) -> Option<PgPool> {
    let url = database_url(test)?;
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&url)
        .await
        .unwrap_or_else(|e| panic!("{test}: cannot connect to DATABASE_URL: {e}"));
    Some(pool)
}

/// A default table of `jobs` jobs in a schema of its own (`prefix` and the
/// process id), with the shape the store reads from the catalog.
async fn scratch_table(pool: &PgPool, prefix: &str, jobs: u32) -> (JobTable, TableShape) {
    let schema = format!("{prefix}_{}", std::process::id());
    let table = JobTable::new(&schema, "jobs").expect("valid names");
    table.migrate(pool).await.expect("the default table");
    sqlx::query(&format!(
        "INSERT INTO {} (kind) SELECT 'k' FROM generate_series(1, {jobs})",
        table.name().quoted()
    ))
    .execute(pool)
    .await
    .expect("jobs");
    let (shape, _) = catalog::inspect(pool, &table.store_options(), &["bigint"])
        .await
        .expect("the table's shape");
    (table, shape)
}

/// Drops the schema of a [`scratch_table`] (when its test passed; the
/// cluster under `test-pg` is thrown away anyway).
async fn drop_scratch(pool: &PgPool, table: &JobTable) {
    sqlx::query(&format!(
        "DROP SCHEMA {} CASCADE",
        table.name().schema.quoted()
    ))
    .execute(pool)
    .await
    .expect("dropping the test schema");
}

/// The generic plan Postgres caches for `statement` (every parameter
/// unknown), as `EXPLAIN` prints it.
async fn generic_plan(connection: &mut PgConnection, statement: &Statement) -> String {
    sqlx::query(&format!("PREPARE batch AS {}", statement.text))
        .execute(&mut *connection)
        .await
        .unwrap_or_else(|e| panic!("preparing {}: {e}", statement.text));
    sqlx::query("SET plan_cache_mode = force_generic_plan")
        .execute(&mut *connection)
        .await
        .expect("forcing the generic plan");
    let nulls = vec!["NULL"; statement.params.len()].join(", ");
    let lines: Vec<String> =
        sqlx::query_scalar(&format!("EXPLAIN (COSTS OFF) EXECUTE batch({nulls})"))
            .fetch_all(&mut *connection)
            .await
            .expect("explaining the generic plan");
    sqlx::query("DEALLOCATE batch")
        .execute(&mut *connection)
        .await
        .expect("deallocating");
    lines.join("\n")
}

#[tokio::test]
async fn the_cached_plan_of_a_batched_finish_looks_each_outcome_up_by_key() {
    let test = "the_cached_plan_of_a_batched_finish_looks_each_outcome_up_by_key";
    let Some(pool) = pool(test).await else { return };
    // The table's shape is the same for both statements and all statistics.
    let (table, shape) = scratch_table(&pool, "queue_plans", 100_000).await;
    let t = table.name().quoted();
    let mut connection = pool.acquire().await.expect("a connection");
    // Statistics taken while a fifth of the jobs were in flight (where a
    // second condition on the keys made the plan quadratic) and while none
    // were.
    for in_flight in [20000, 0] {
        sqlx::query(&format!(
            "UPDATE {t} SET state = CASE WHEN id <= {in_flight} THEN 'processing' ELSE 'queued' END"
        ))
        .execute(&pool)
        .await
        .expect("jobs in flight");
        sqlx::query(&format!("ANALYZE {t}"))
            .execute(&pool)
            .await
            .expect("statistics");
        for completed_jobs in [CompletedJobs::Keep, CompletedJobs::Delete] {
            let options = table.store_options().completed_jobs(completed_jobs);
            let statements = Statements::new(&options, &shape);
            for (batch, which) in [
                (&statements.finish, "any outcome"),
                (&statements.finish_succeeded.0, "successes"),
            ] {
                let plan = generic_plan(&mut connection, batch).await;
                let case = format!("{completed_jobs:?}, {which}, {in_flight} in flight");
                // One index probe per outcome, on the key: never every outcome
                // compared with every row (a join filter over a materialized
                // side, quadratic in the batch).
                assert!(
                    plan.contains("Nested Loop") && plan.contains("Index Cond: (id = u.id)"),
                    "{case}: {plan}"
                );
                assert!(
                    !plan.contains("Join Filter") && !plan.contains("Materialize"),
                    "{case}: {plan}"
                );
            }
        }
    }
    drop(connection);
    drop_scratch(&pool, &table).await;
}

/// The blocks the claim index's scan touched in `EXPLAIN (ANALYZE, BUFFERS,
/// FORMAT JSON)` output.
fn claim_index_blocks(plan: &serde_json::Value) -> Option<u64> {
    if plan["Index Name"]
        .as_str()
        .is_some_and(|name| name.ends_with("claimable_idx"))
    {
        let blocks = |key: &str| plan[key].as_u64().unwrap_or(0);
        return Some(blocks("Shared Hit Blocks") + blocks("Shared Read Blocks"));
    }
    plan["Plans"]
        .as_array()?
        .iter()
        .find_map(claim_index_blocks)
}

#[tokio::test]
async fn a_claim_at_the_cursor_starts_its_index_scan_there() {
    let test = "a_claim_at_the_cursor_starts_its_index_scan_there";
    let Some(pool) = pool(test).await else { return };
    let (table, shape) = scratch_table(&pool, "queue_cursor_plans", 20_000).await;
    let t = table.name().quoted();
    // The first half claimed and completed: their entries in the claim
    // index point at rows that are no longer claimable.
    for sql in [
        format!("UPDATE {t} SET state = 'completed' WHERE id <= 10000"),
        format!("ANALYZE {t}"),
    ] {
        sqlx::query(&sql).execute(&pool).await.expect(&sql);
    }
    let statements = Statements::new(&table.store_options(), &shape);
    let from_start = statements.claim(&[], 48);
    let at_cursor = statements.claim_after_cursor(48).expect("a cursor");
    let mut connection = pool.acquire().await.expect("a connection");

    let plan = generic_plan(&mut connection, &at_cursor).await;
    assert!(
        plan.contains("jobs_claimable_idx")
            && plan.contains("Index Cond: ((priority = $4) AND (id > $5))"),
        "the cached plan starts the scan at the cursor: {plan}"
    );

    // What each claim's scan reads, the cursor after the last completed job.
    let mut blocks = Vec::new();
    for (statement, cursor) in [(&from_start, ""), (&at_cursor, ", 0, 10000")] {
        sqlx::query(&format!("PREPARE claim AS {}", statement.text))
            .execute(&mut *connection)
            .await
            .expect("preparing the claim");
        sqlx::query("BEGIN")
            .execute(&mut *connection)
            .await
            .expect("begin");
        let explained: serde_json::Value = sqlx::query_scalar(&format!(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE claim(now(), 'processing', 'w'{cursor})"
        ))
        .fetch_one(&mut *connection)
        .await
        .expect("explaining the claim");
        for sql in ["ROLLBACK", "DEALLOCATE claim"] {
            sqlx::query(sql).execute(&mut *connection).await.expect(sql);
        }
        let plan = &explained[0]["Plan"];
        assert_eq!(plan["Actual Rows"], 48, "{explained}");
        blocks.push(
            claim_index_blocks(plan).unwrap_or_else(|| panic!("no claim index scan: {explained}")),
        );
    }
    // From the start the scan reads every leaf page of the 10,000 dead
    // entries (and the rows they point at); at the cursor, the path down to
    // the first live entry and the rows it takes.
    assert!(
        blocks[0] >= 40 && blocks[1] <= 10,
        "blocks read by the claim index scan, from the start and at the cursor: {blocks:?}"
    );
    drop(connection);
    drop_scratch(&pool, &table).await;
}
