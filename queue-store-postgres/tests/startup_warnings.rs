//! Start-up warnings: a table without an index on `process_after` is
//! told so (idle workers would read every waiting row to learn when the
//! next scheduled job comes due); the default table, which has one, is not.

mod support;

use queue_core::Job;
use queue_store_postgres::PgStore;
use support::logs::Logged;
use support::{execute, fresh_table, partitioned_by_state, pool, quoted_schema};

/// Starts a store over `table` with the warnings captured (this test's
/// thread only: a current-thread runtime).
async fn warnings_of_start(
    pool: &sqlx::PgPool,
    table: &queue_store_postgres::JobTable,
) -> Vec<String> {
    warnings_of(pool, table.store_options()).await
}

/// Starts a store with `options`, the warnings captured as above.
async fn warnings_of(
    pool: &sqlx::PgPool,
    options: queue_store_postgres::PgStoreOptions,
) -> Vec<String> {
    let (warnings, _guard) = Logged::at(tracing::Level::WARN);
    PgStore::<Job>::default_table(pool.clone(), options)
        .await
        .expect("a store");
    warnings.messages()
}

#[tokio::test]
async fn a_table_without_a_due_index_is_warned_about_at_start_up() {
    let Some(pool) = pool("a_table_without_a_due_index_is_warned_about").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let warned = warnings_of_start(&pool, &table).await;
    assert!(
        !warned.iter().any(|w| w.contains("process_after")),
        "the default table has its due index: {warned:?}"
    );
    let schema = table.name().schema.quoted();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP INDEX {schema}.\"{}_due_idx\"",
        table.name().name.as_str()
    )))
    .execute(&pool)
    .await
    .expect("the due index dropped");
    let warned = warnings_of_start(&pool, &table).await;
    assert!(
        warned
            .iter()
            .any(|w| w.contains("no index starts with the process_after column")),
        "{warned:?}"
    );
}

#[tokio::test]
async fn a_table_whose_claim_index_holds_scheduled_jobs_is_warned_about_at_start_up() {
    let Some(pool) = pool("a_table_whose_claim_index_holds_scheduled_jobs").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let (schema, t) = (table.name().schema.quoted(), table.name().quoted());
    let name = table.name().name.as_str();
    // The claim index of versions 1 to 5: every waiting job, scheduled or
    // not.
    for sql in [
        format!("DROP INDEX {schema}.\"{name}_claimable_idx\""),
        format!(
            "CREATE INDEX \"{name}_claimable_idx\" ON {t} (priority DESC, id) \
             WHERE state IN ('queued', 'errored')"
        ),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&pool)
            .await
            .expect(&sql);
    }
    let warned = warnings_of_start(&pool, &table).await;
    assert!(
        warned.iter().any(|w| w.contains(
            "no index leaves out the rows with a process_after (a predicate with `process_after IS NULL`)"
        )),
        "{warned:?}"
    );
}

/// The indexes the operator surfaces read on a big table (finish time,
/// expiry, kind): the default table has them all and nothing is said; a
/// table without them is warned about at start-up, each by the statement
/// that would create it.
#[tokio::test]
async fn a_table_without_the_operator_surfaces_indexes_is_told_how_to_make_them() {
    let Some(pool) = pool("a_table_without_the_operator_surfaces_indexes").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let warned = warnings_of_start(&pool, &table).await;
    assert!(
        !warned.iter().any(|w| w.contains("no index starts with")),
        "the default table has them: {warned:?}"
    );
    let schema = table.name().schema.quoted();
    for suffix in ["finished_idx", "expires_idx", "finished_kind_idx"] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP INDEX {schema}.\"{}_{suffix}\"",
            table.name().name.as_str()
        )))
        .execute(&pool)
        .await
        .expect("an index dropped");
    }
    let warned = warnings_of_start(&pool, &table).await;
    let t = table.name().quoted();
    for statement in [
        format!(
            "CREATE INDEX CONCURRENTLY ON {t} (\"finished_at\", \"id\") WHERE \"finished_at\" IS NOT NULL"
        ),
        format!("CREATE INDEX CONCURRENTLY ON {t} (\"expires_at\") WHERE \"expires_at\" IS NOT NULL"),
        format!("CREATE INDEX CONCURRENTLY ON {t} (\"kind\", \"id\")"),
    ] {
        assert!(
            warned.iter().any(|w| w.contains(&statement)),
            "{statement} in {warned:?}"
        );
    }
}

/// On a partitioned table the statement start-up gives for a missing index
/// is one Postgres runs there: not concurrent (it builds no partitioned
/// table's index concurrently), with how to keep writes going meanwhile.
#[tokio::test]
async fn a_partitioned_table_is_told_an_index_statement_it_can_run() {
    let Some(pool) = pool("a_partitioned_table_is_told_an_index_statement").await else {
        return;
    };
    let (schema, options) = partitioned_by_state(&pool).await;
    let warned = warnings_of(&pool, options).await;
    let t = format!("{}.\"tasks\"", quoted_schema(&schema));
    let create = format!("CREATE INDEX ON {t} (\"kind\", \"id\") (a partitioned table's");
    let suggested = warned
        .iter()
        .find(|w| w.contains(&create))
        .unwrap_or_else(|| panic!("{create} in {warned:?}"));
    assert!(
        suggested.contains("ON ONLY") && !suggested.contains("CONCURRENTLY ON"),
        "{suggested}"
    );
    execute(&pool, format!("CREATE INDEX ON {t} (\"kind\", \"id\")")).await;
    let warned = warnings_of(&pool, partitioned_options(&schema)).await;
    assert!(
        !warned.iter().any(|w| w.contains("(\"kind\", \"id\")")),
        "the index made as told is found: {warned:?}"
    );
}

fn partitioned_options(schema: &str) -> queue_store_postgres::PgStoreOptions {
    queue_store_postgres::PgStoreOptions::new("tasks")
        .and_then(|o| o.schema(schema))
        .expect("valid names")
}

/// A page of failed jobs reads an index of them where there is one; a
/// table without one is told the two statements that make them, and an
/// index made as told is found.
#[tokio::test]
async fn a_table_without_an_index_of_failed_jobs_is_told_how_to_make_one() {
    let Some(pool) = pool("a_table_without_an_index_of_failed_jobs").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let failed_list = "no index serves a list of failed or canceled jobs";
    let warned = warnings_of_start(&pool, &table).await;
    assert!(
        !warned.iter().any(|w| w.contains(failed_list)),
        "the default table has them: {warned:?}"
    );
    let schema = table.name().schema.quoted();
    let name = table.name().name.as_str().to_owned();
    for suffix in ["unsuccessful_idx", "unsuccessful_kind_idx"] {
        execute(&pool, format!("DROP INDEX {schema}.\"{name}_{suffix}\"")).await;
    }
    let warned = warnings_of_start(&pool, &table).await;
    let t = table.name().quoted();
    let unsuccessful = "\"state\" IN (E'failed', E'canceled')";
    let by_key = format!("CREATE INDEX CONCURRENTLY ON {t} (\"id\") WHERE {unsuccessful}");
    let by_kind = format!(
        "CREATE INDEX CONCURRENTLY ON {t} (\"state\", \"kind\", \"id\") WHERE {unsuccessful}"
    );
    let told = warned
        .iter()
        .find(|w| w.contains(failed_list))
        .unwrap_or_else(|| panic!("{failed_list} in {warned:?}"));
    assert!(told.contains(&by_key) && told.contains(&by_kind), "{told}");
    // The completed jobs' index by kind (its predicate holds for completed
    // rows too) is no index of failed jobs; the one made as told is.
    execute(&pool, by_key.replace(" CONCURRENTLY", "")).await;
    let warned = warnings_of_start(&pool, &table).await;
    assert!(
        !warned.iter().any(|w| w.contains(failed_list)),
        "the index made as told is found: {warned:?}"
    );
}
