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
use super::{Param, Statement, Statements, TableShape};
use crate::{Column, CompletedJobs, JobTable};

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
async fn scratch_table(
    pool: &PgPool,
    prefix: &str,
    jobs: u32,
) -> (JobTable, TableShape, Vec<Column>) {
    let schema = format!("{prefix}_{}", std::process::id());
    let table = JobTable::new(&schema, "jobs").expect("valid names");
    table.migrate(pool).await.expect("the default table");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {} (kind) SELECT 'k' FROM generate_series(1, {jobs})",
        table.name().quoted()
    )))
    .execute(pool)
    .await
    .expect("jobs");
    let (shape, absent) = catalog::inspect(
        pool,
        &table.store_options(),
        &["bigint"],
        catalog::User::Worker,
    )
    .await
    .expect("the table's shape");
    (table, shape, absent)
}

/// Drops the schema of a [`scratch_table`] (when its test passed; the
/// cluster under `test-pg` is thrown away anyway).
async fn drop_scratch(pool: &PgPool, table: &JobTable) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA {} CASCADE",
        table.name().schema.quoted()
    )))
    .execute(pool)
    .await
    .expect("dropping the test schema");
}

/// How Postgres plans a prepared statement: the generic plan it caches
/// (made without the parameters' values), or a custom plan for one run's
/// values (the first five runs on a connection, and every run for which
/// Postgres expects a custom plan to be cheaper).
#[derive(Debug, Clone, Copy)]
enum PlanKind {
    Generic,
    /// For a batch of this many rows, keys 1 to n.
    Custom(usize),
}

/// What `statement` runs with for `kind`, as `EXECUTE` arguments.
fn arguments(statement: &Statement, kind: PlanKind) -> String {
    let PlanKind::Custom(n) = kind else {
        return vec!["NULL"; statement.params.len()].join(", ");
    };
    let array = |value: &str| format!("'{{{}}}'", vec![value; n].join(","));
    let keys: Vec<String> = (1..=n).map(|k| k.to_string()).collect();
    let now = "2026-01-01 00:00:00+00";
    statement
        .params
        .iter()
        .map(|p| match p {
            Param::Ids => format!("'{{{}}}'", keys.join(",")),
            Param::Tokens | Param::FailureIncrements => array("0"),
            Param::TargetStates => array("completed"),
            Param::FinishedAts => array(now),
            Param::Messages | Param::ProcessAfters => array("NULL"),
            Param::State(state) => format!("'{}'", state.as_str()),
            Param::Now => format!("'{now}'"),
            other => panic!("no test value for {other:?} in {}", statement.text),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The plan Postgres runs `statement` with, as `EXPLAIN` prints it.
async fn plan(connection: &mut PgConnection, statement: &Statement, kind: PlanKind) -> String {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "PREPARE batch AS {}",
        statement.text
    )))
    .execute(&mut *connection)
    .await
    .unwrap_or_else(|e| panic!("preparing {}: {e}", statement.text));
    let mode = match kind {
        PlanKind::Generic => "force_generic_plan",
        PlanKind::Custom(_) => "force_custom_plan",
    };
    sqlx::query(sqlx::AssertSqlSafe(format!("SET plan_cache_mode = {mode}")))
        .execute(&mut *connection)
        .await
        .expect("choosing the plan");
    let lines: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (COSTS OFF) EXECUTE batch({})",
        arguments(statement, kind)
    )))
    .fetch_all(&mut *connection)
    .await
    .unwrap_or_else(|e| panic!("explaining {}: {e}", statement.text));
    sqlx::query("DEALLOCATE batch")
        .execute(&mut *connection)
        .await
        .expect("deallocating");
    lines.join("\n")
}

/// The generic plan Postgres caches for `statement` (every parameter
/// unknown), as `EXPLAIN` prints it.
async fn generic_plan(connection: &mut PgConnection, statement: &Statement) -> String {
    plan(connection, statement, PlanKind::Generic).await
}

#[tokio::test]
async fn every_plan_of_a_batched_statement_looks_each_row_up_by_key() {
    let test = "every_plan_of_a_batched_statement_looks_each_row_up_by_key";
    let Some(pool) = pool(test).await else { return };
    // The table's shape is the same for every statement and all statistics.
    let (table, shape, absent) = scratch_table(&pool, "queue_plans", 100_000).await;
    let t = table.name().quoted();
    // Statistics are taken where this test says, never by autovacuum.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER TABLE {t} SET (autovacuum_enabled = false)"
    )))
    .execute(&pool)
    .await
    .expect("autovacuum off");
    let mut connection = pool.acquire().await.expect("a connection");
    // A fifth of the jobs in flight, with statistics taken then (where a
    // second condition on the keys made the generic plan quadratic) or
    // before any job was claimed (a worker draining a backlog until
    // autovacuum analyzes the table: the planner believes no row is
    // processing, and with the batch and the processing state in view it
    // hashed the batch against a scan of every processing index entry);
    // and none in flight.
    for (in_flight, analyzed_with) in [(20_000, 20_000), (20_000, 0), (0, 0)] {
        let set_in_flight = |n: u32| {
            format!(
                "UPDATE {t} SET state = CASE WHEN id <= {n} THEN 'processing' ELSE 'queued' END"
            )
        };
        for sql in [
            set_in_flight(analyzed_with),
            format!("ANALYZE {t}"),
            set_in_flight(in_flight),
        ] {
            sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
                .execute(&pool)
                .await
                .expect(&sql);
        }
        for completed_jobs in [CompletedJobs::Keep, CompletedJobs::Delete] {
            let options = table.store_options().completed_jobs(completed_jobs);
            let statements = Statements::new(&options, &shape, &absent);
            for (batch, which) in [
                (&statements.finish, "any outcome"),
                (&statements.finish_succeeded.0, "successes"),
                (&statements.heartbeat, "heartbeat"),
            ] {
                for kind in [
                    PlanKind::Generic,
                    PlanKind::Custom(500),
                    PlanKind::Custom(5),
                ] {
                    let plan = plan(&mut connection, batch, kind).await;
                    let case = format!(
                        "{completed_jobs:?}, {which}, {kind:?}, {in_flight} in flight, \
                         statistics taken with {analyzed_with}"
                    );
                    // One index probe per row of the batch, by key: never
                    // every row compared with every other (a join filter
                    // over a materialized side, quadratic in the batch),
                    // nor a scan of every processing row or of the table to
                    // hash the batch against.
                    assert!(
                        plan.contains("Nested Loop")
                            && (plan.contains("Index Cond: (id = u.id)")
                                || plan.contains("Index Cond: (id = l.id)")),
                        "{case}: {plan}"
                    );
                    for scan in ["Join Filter", "Materialize", "Hash Join", "Seq Scan"] {
                        assert!(!plan.contains(scan), "{case}: {scan} in\n{plan}");
                    }
                    let lines: Vec<&str> = plan.lines().collect();
                    for (n, line) in lines.iter().enumerate() {
                        if line.contains("Index Scan") {
                            assert!(
                                lines
                                    .get(n + 1)
                                    .is_some_and(|next| next.contains("Index Cond: (id = ")),
                                "{case}: an index scan not by key in\n{plan}"
                            );
                        }
                    }
                }
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
    let (table, shape, absent) = scratch_table(&pool, "queue_cursor_plans", 20_000).await;
    let t = table.name().quoted();
    // The first half claimed and completed: their entries in the claim
    // index point at rows that are no longer claimable.
    for sql in [
        format!("UPDATE {t} SET state = 'completed' WHERE id <= 10000"),
        format!("ANALYZE {t}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&pool)
            .await
            .expect(&sql);
    }
    let statements = Statements::new(&table.store_options(), &shape, &absent);
    let from_start = statements.claim(&[], &[], 48);
    let at_cursor = statements.claim_after_cursor(48).expect("a cursor");
    let mut connection = pool.acquire().await.expect("a connection");

    let plan = generic_plan(&mut connection, &at_cursor).await;
    assert!(
        plan.contains("jobs_claimable_idx")
            && plan.contains("Index Cond: ((priority = $4) AND (id >= $5))"),
        "the cached plan starts the scan at the cursor: {plan}"
    );
    // The probe reads the first waiting job from the same index, in claim
    // order, one entry at a time (a cached plan that sorted every waiting
    // job would make each probe cost the backlog).
    let probe = statements.cursor_probe.as_ref().expect("a probe");
    let plan = generic_plan(&mut connection, &probe.probe).await;
    assert!(
        plan.contains("Index Scan using jobs_claimable_idx") && !plan.contains("Sort"),
        "the probe's cached plan reads the claim index in order: {plan}"
    );

    // What each claim's scan reads, the cursor after the last completed job.
    let mut blocks = Vec::new();
    for (statement, cursor) in [(&from_start, ""), (&at_cursor, ", 0, 10000")] {
        let explained = explain_claim(&mut connection, statement, cursor).await;
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

/// The blocks (hit or read) of the plan node named `CTE candidates` in
/// `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)` output: what choosing the jobs
/// to claim read, apart from the update of their rows.
fn candidates_blocks(plan: &serde_json::Value) -> Option<u64> {
    if plan["Subplan Name"].as_str() == Some("CTE candidates") {
        let blocks = |key: &str| plan[key].as_u64().unwrap_or(0);
        return Some(blocks("Shared Hit Blocks") + blocks("Shared Read Blocks"));
    }
    plan["Plans"].as_array()?.iter().find_map(candidates_blocks)
}

/// `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)` of `claim`, prepared and run
/// with the arguments now, 'processing', 'w' and then `more`, in a
/// transaction rolled back after.
async fn explain_claim(
    connection: &mut PgConnection,
    claim: &Statement,
    more: &str,
) -> serde_json::Value {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "PREPARE claim AS {}",
        claim.text
    )))
    .execute(&mut *connection)
    .await
    .expect("preparing the claim");
    sqlx::query("BEGIN")
        .execute(&mut *connection)
        .await
        .expect("begin");
    let explained: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE claim(now(), 'processing', 'w'{more})"
    )))
    .fetch_one(&mut *connection)
    .await
    .expect("explaining the claim");
    for sql in ["ROLLBACK", "DEALLOCATE claim"] {
        sqlx::query(sql).execute(&mut *connection).await.expect(sql);
    }
    explained
}

/// What choosing the jobs of a claim of 48 reads, in blocks, by `EXPLAIN
/// (ANALYZE, BUFFERS)` in a transaction rolled back after.
async fn claim_blocks(connection: &mut PgConnection, claim: &Statement) -> u64 {
    let explained = explain_claim(connection, claim, "").await;
    let plan = &explained[0]["Plan"];
    assert_eq!(plan["Actual Rows"], 48, "{explained}");
    candidates_blocks(plan).unwrap_or_else(|| panic!("no candidates: {explained}"))
}

#[tokio::test]
async fn a_claim_passes_over_jobs_waiting_for_their_time_without_reading_them() {
    let test = "a_claim_passes_over_jobs_waiting_for_their_time_without_reading_them";
    let Some(pool) = pool(test).await else { return };
    let (table, shape, absent) = scratch_table(&pool, "queue_due_plans", 100).await;
    assert!(
        shape.due_apart,
        "the default table reads ready and due jobs apart"
    );
    let claim = Statements::new(&table.store_options().claim_cursor(None), &shape, &absent).claim(
        &[],
        &[],
        48,
    );
    let t = table.name().quoted();
    let mut connection = pool.acquire().await.expect("a connection");
    let mut read = Vec::new();
    // 100 jobs ready now; then the same behind 20,000 jobs scheduled a day
    // ahead and 20,000 failed ones waiting an hour for their retry, a third
    // of each of a higher priority than every ready job.
    for sql in [
        String::new(),
        format!(
            "INSERT INTO {t} (kind, priority, process_after) \
             SELECT 'k', g % 3, now() + interval '1 day' FROM generate_series(1, 20000) AS g"
        ),
        format!(
            "INSERT INTO {t} (kind, state, num_failures, priority, process_after) \
             SELECT 'k', 'errored', 1, g % 3, now() + interval '1 hour' FROM generate_series(1, 20000) AS g"
        ),
    ] {
        if !sql.is_empty() {
            sqlx::query(sqlx::AssertSqlSafe(sql.to_owned())).execute(&pool).await.expect(&sql);
            let analyze = format!("VACUUM ANALYZE {t}");
            sqlx::query(sqlx::AssertSqlSafe(analyze.to_owned())).execute(&pool).await.expect(&analyze);
        }
        read.push(claim_blocks(&mut connection, &claim).await);
    }
    // Choosing them reads the 48 ready jobs' index entries and rows and
    // one probe of the due index, however many jobs wait for their time:
    // in one scan of the claim order it would also read the entry and the
    // row of each of the 26,666 waiting jobs of a higher priority.
    assert!(
        read.iter().all(|r| *r <= read[0] + 8),
        "blocks read by a claim of 48 ready jobs alone, then behind 20,000 and 40,000 waiting ones: {read:?}"
    );
    drop(connection);
    drop_scratch(&pool, &table).await;
}

#[tokio::test]
async fn a_claim_passing_over_paused_kinds_keeps_the_claim_index() {
    let test = "a_claim_passing_over_paused_kinds_keeps_the_claim_index";
    let Some(pool) = pool(test).await else { return };
    let (table, shape, absent) = scratch_table(&pool, "queue_paused_plans", 20_000).await;
    let t = table.name().quoted();
    for sql in [format!("ANALYZE {t}")] {
        sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&pool)
            .await
            .expect(&sql);
    }
    let statements = Statements::new(&table.store_options(), &shape, &absent);
    let unpaused = statements.claim(&[], &[], 48);
    let paused = statements.claim(&[], &["mail".to_owned()], 48);
    assert_eq!(
        paused.params.last(),
        Some(&Param::PausedKinds),
        "the paused kinds are bound: {}",
        paused.text
    );
    assert!(!unpaused.text.contains("ALL("), "{}", unpaused.text);
    let mut connection = pool.acquire().await.expect("a connection");
    let plan = generic_plan(&mut connection, &paused).await;
    assert!(
        plan.contains("jobs_claimable_idx") && !plan.contains("Seq Scan"),
        "the cached plan still reads the claim index in claim order: {plan}"
    );
    drop(connection);
    drop_scratch(&pool, &table).await;
}

/// On a table whose claims are in place, each reader of waiting or running
/// jobs names the times its states have, so that its cached plan reads
/// the layout's indexes: 50,000 finished jobs, 200 waiting (a fifth
/// retrying, a fifth with an expiry and a unique key) and 50 running,
/// analyzed. A reader that names only the state scans the table.
#[tokio::test]
async fn on_a_table_whose_claims_are_in_place_the_readers_of_live_jobs_keep_to_its_indexes() {
    let test = "on_a_table_whose_claims_are_in_place_the_readers_of_live_jobs_keep_to_its_indexes";
    let Some(pool) = pool(test).await else { return };
    let schema = format!("queue_in_place_plans_{}", std::process::id());
    let table = JobTable::new(&schema, "jobs")
        .expect("valid names")
        .in_place_claims();
    table.migrate(&pool).await.expect("the table");
    let t = table.name().quoted();
    for sql in [
        format!(
            "INSERT INTO {t} (kind, state, finished_at) \
             SELECT 'k' || (g % 5), 'completed', now() FROM generate_series(1, 50000) AS g"
        ),
        format!(
            "INSERT INTO {t} (kind, state, num_failures, finished_at, process_after, expires_at, unique_key) \
             SELECT 'k', CASE WHEN g % 5 = 0 THEN 'errored' ELSE 'queued' END, \
             CASE WHEN g % 5 = 0 THEN 1 ELSE 0 END, \
             CASE WHEN g % 5 = 0 THEN now() END, CASE WHEN g % 5 = 0 THEN now() + interval '1 hour' END, \
             CASE WHEN g % 5 = 1 THEN now() + interval '1 day' END, \
             CASE WHEN g % 5 = 1 THEN 'key' || g END FROM generate_series(1, 200) AS g"
        ),
        format!(
            "INSERT INTO {t} (kind, state, started_at, last_heartbeat_at) \
             SELECT 'k', 'processing', now(), now() FROM generate_series(1, 50)"
        ),
        format!("VACUUM ANALYZE {t}"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&pool)
            .await
            .expect(&sql);
    }
    let (shape, absent) = catalog::inspect(
        &pool,
        &table.store_options(),
        &["bigint"],
        catalog::User::Worker,
    )
    .await
    .expect("the table's shape");
    assert!(shape.in_place_claims, "the catalog tells the layout");
    assert!(
        shape.kind_split,
        "by its own index of finished jobs by kind"
    );
    let options = table.store_options();
    let statements = Statements::new(&options.clone().claim_cursor(None), &shape, &absent);
    let admin = super::admin::AdminStatements::new(&options, &shape, &absent);
    let readers = [
        (
            "the claim",
            Some(statements.claim(&[], &[], 48)),
            "jobs_ready_idx",
        ),
        ("the resetter", admin.reset.clone(), "jobs_ready_idx"),
        ("the expiry sweep", admin.expire.clone(), "jobs_expiry_idx"),
        (
            "the live figures",
            Some(admin.stats.live.clone()),
            "jobs_due_at_idx",
        ),
        (
            "the stalled count",
            Some(admin.stats.stalled.clone()),
            "jobs_ready_idx",
        ),
        (
            "the oldest waiting job",
            Some(admin.waiting.clone()),
            "jobs_ready_idx",
        ),
        (
            "the unique enqueue",
            admin.enqueue.unique.clone(),
            "jobs_unique_key_idx",
        ),
    ];
    let mut connection = pool.acquire().await.expect("a connection");
    for (what, statement, index) in readers {
        let statement = statement.unwrap_or_else(|| panic!("{what}: no statement"));
        let plan = generic_plan(&mut connection, &statement).await;
        assert!(
            !plan.contains("Seq Scan on jobs"),
            "{what} scans the table:\n{plan}"
        );
        assert!(plan.contains(index), "{what} reads {index}:\n{plan}");
    }
    drop(connection);
    drop_scratch(&pool, &table).await;
}
