//! Operators' reads on Postgres beyond the conformance suite: each runs
//! under the admin read timeout, and says so when the server stops it.

mod support;

use std::time::Duration;

use queue_core::{Admin, JobFilter, JobState, ListParams, StatsParams, StoreError};
use queue_store_postgres::PgAdmin;
use support::{execute, fresh_table, pool};

/// A read that waits longer than the admin read timeout (here on a lock
/// another session holds on the table) is stopped by the server and
/// reported as timed out, naming what it read and the limit; without a
/// limit the same read waits as long as it must.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_past_the_admin_read_timeout_is_stopped_and_says_so() {
    let Some(pool) = pool("a_read_past_the_admin_read_timeout_is_stopped").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let limit = Duration::from_millis(300);
    let admin = PgAdmin::<i64>::new(
        pool.clone(),
        table.store_options().admin_read_timeout(Some(limit)),
    )
    .await
    .expect("an admin");
    let patient = PgAdmin::<i64>::new(pool.clone(), table.store_options().admin_read_timeout(None))
        .await
        .expect("an admin");
    let mut holder = pool.begin().await.expect("a transaction");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "LOCK TABLE {} IN ACCESS EXCLUSIVE MODE",
        table.name().quoted()
    )))
    .execute(&mut *holder)
    .await
    .expect("the table locked");
    let started = std::time::Instant::now();
    let counted = admin.count(&JobFilter::default()).await;
    match counted {
        Err(StoreError::TimedOut { context, after }) => {
            assert_eq!((context.as_str(), after), ("counting jobs", limit));
        }
        other => panic!("expected a timed-out read, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "stopped near its limit"
    );
    let now = chrono::Utc::now();
    let stats = admin.stats(StatsParams::new(now, now)).await;
    assert!(
        matches!(&stats, Err(StoreError::TimedOut { .. })),
        "stats too: {stats:?}"
    );
    let message = stats.unwrap_err().to_string();
    assert!(message.contains("its limit for one read"), "{message}");

    // No limit: the read waits for the lock, and goes through once it is
    // released.
    let waiting = tokio::spawn(async move { patient.count(&JobFilter::default()).await });
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!waiting.is_finished(), "it waits past the other's limit");
    holder.rollback().await.expect("released");
    let counted = waiting.await.expect("joined").expect("counted");
    assert_eq!(counted, 0);
}

/// On a table past `exact_counts_below`, the figures count the waiting and
/// running jobs (through the claim's indexes) and estimate the finished
/// ones from the planner's statistics of the state and kind columns, each
/// estimate marked; `StatsParams::exact` counts every job. A backlog past
/// the cap is estimated too, never below what was counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_tables_figures_count_what_waits_and_estimate_what_finished() {
    let Some(pool) = pool("a_big_tables_figures_count_what_waits").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let t = table.name().quoted();
    execute(
        &pool,
        format!(
            "INSERT INTO {t} (kind, state, queued_at, started_at, finished_at, failure_message) \
         SELECT CASE WHEN g <= 3000 THEN 'a' ELSE 'b' END, \
         CASE WHEN g <= 4000 THEN 'completed' ELSE 'failed' END, \
         now() - interval '2 days', now() - interval '2 days', now() - interval '1 day', \
         CASE WHEN g > 4000 THEN 'boom' END FROM generate_series(1, 4200) AS g"
        ),
    )
    .await;
    // Ready: 30 of a, 10 of b, the first of them queued an hour ago.
    execute(
        &pool,
        format!(
            "INSERT INTO {t} (kind, queued_at) SELECT CASE WHEN g <= 30 THEN 'a' ELSE 'b' END, \
         now() - interval '1 hour' + g * interval '1 second' FROM generate_series(1, 40) AS g"
        ),
    )
    .await;
    // Scheduled for tomorrow: waiting, not claimable.
    execute(&pool, format!(
        "INSERT INTO {t} (kind, process_after) SELECT 'b', now() + interval '1 day' FROM generate_series(1, 5)"
    ))
    .await;
    // Running: one beating, one silent for ten minutes.
    execute(&pool, format!(
        "INSERT INTO {t} (kind, state, started_at, last_heartbeat_at) VALUES \
         ('a', 'processing', now(), now()), ('a', 'processing', now() - interval '10 minutes', now() - interval '10 minutes')"
    ))
    .await;
    execute(&pool, format!("ANALYZE {t}")).await;

    let admin = PgAdmin::<i64>::new(
        pool.clone(),
        table.store_options().exact_counts_below(1_000),
    )
    .await
    .expect("an admin");
    let now = chrono::Utc::now();
    let params = StatsParams::new(now, now - chrono::TimeDelta::seconds(60));
    let stats = admin.stats(params).await.expect("the figures");
    let find = |stats: &queue_core::QueueStats, state: JobState, kind: &str| {
        stats
            .counts
            .iter()
            .find(|c| c.state == Some(state) && c.kind.as_deref() == Some(kind))
            .map(|c| (c.count, c.estimated))
    };
    assert_eq!(
        find(&stats, JobState::Queued, "a"),
        Some((30, false)),
        "{stats:?}"
    );
    assert_eq!(
        find(&stats, JobState::Queued, "b"),
        Some((15, false)),
        "{stats:?}"
    );
    assert_eq!(
        find(&stats, JobState::Processing, "a"),
        Some((2, false)),
        "{stats:?}"
    );
    // ANALYZE read every row of a table this small: the shares are the
    // table's own, times its size now.
    let near = |found: Option<(u64, bool)>, truth: u64| {
        let (count, estimated) = found.expect("a figure");
        assert!(estimated, "finished jobs are estimated");
        assert!(
            count.abs_diff(truth) * 20 <= truth,
            "{count} is within 5 % of {truth}"
        );
    };
    near(find(&stats, JobState::Completed, "a"), 3000);
    near(find(&stats, JobState::Completed, "b"), 1000);
    near(find(&stats, JobState::Failed, "b"), 200);
    assert!(stats.estimated());
    assert_eq!(stats.stalled, Some(1), "the silent one");
    let first: chrono::DateTime<chrono::Utc> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT min(queued_at) FROM {t} WHERE state = 'queued' AND process_after IS NULL"
    )))
    .fetch_one(&pool)
    .await
    .expect("the first ready job");
    assert_eq!(stats.oldest_claimable_since, Some(first));

    let exact = admin.stats(params.exact()).await.expect("the figures");
    assert!(!exact.estimated(), "{exact:?}");
    assert_eq!(find(&exact, JobState::Completed, "a"), Some((3000, false)));
    assert_eq!(find(&exact, JobState::Failed, "b"), Some((200, false)));
    assert_eq!(exact.oldest_claimable_since, Some(first));
    assert_eq!(exact.stalled, Some(1));

    // A backlog past the cap: counted up to it, so estimated, and never
    // below what was counted; after the next ANALYZE, near the truth.
    execute(
        &pool,
        format!("INSERT INTO {t} (kind) SELECT 'c' FROM generate_series(1, 1500)"),
    )
    .await;
    let stats = admin.stats(params).await.expect("the figures");
    let (backlog, estimated) = find(&stats, JobState::Queued, "c").expect("kind c's backlog");
    assert!(estimated, "{stats:?}");
    assert!(
        backlog >= 1_000 - 40,
        "at least what was counted: {backlog}"
    );
    execute(&pool, format!("ANALYZE {t}")).await;
    let stats = admin.stats(params).await.expect("the figures");
    near(find(&stats, JobState::Queued, "c"), 1500);

    // Without statistics of the state and kind columns together (a table
    // of your own without them), finished jobs are estimated per state.
    execute(
        &pool,
        format!(
            "DO $$ DECLARE s text; BEGIN \
         SELECT stxnamespace::regnamespace::text || '.' || quote_ident(stxname) INTO s \
         FROM pg_statistic_ext WHERE stxrelid = '{t}'::regclass; \
         EXECUTE 'DROP STATISTICS ' || s; END $$"
        ),
    )
    .await;
    execute(&pool, format!("ANALYZE {t}")).await;
    let stats = admin.stats(params).await.expect("the figures");
    let completed: Vec<_> = stats
        .counts
        .iter()
        .filter(|c| c.state == Some(JobState::Completed))
        .collect();
    assert_eq!(completed.len(), 1, "{stats:?}");
    assert_eq!(completed[0].kind, None);
    assert!(completed[0].estimated);
    assert!(
        completed[0].count.abs_diff(4000) * 20 <= 4000,
        "{completed:?}"
    );
    assert_eq!(
        find(&stats, JobState::Processing, "a"),
        Some((2, false)),
        "running jobs are still counted"
    );
    let queued: Vec<_> = stats
        .counts
        .iter()
        .filter(|c| c.state == Some(JobState::Queued))
        .collect();
    assert_eq!(
        queued.len(),
        1,
        "a backlog past the cap is one estimate: {queued:?}"
    );
    assert!(
        queued[0].estimated && queued[0].count >= 1_000,
        "{queued:?}"
    );

    // Below the cap, every job is counted.
    let small = PgAdmin::<i64>::new(
        pool.clone(),
        table.store_options().exact_counts_below(100_000),
    )
    .await
    .expect("an admin");
    let stats = small.stats(params).await.expect("the figures");
    assert!(!stats.estimated());
    assert_eq!(find(&stats, JobState::Queued, "c"), Some((1500, false)));
}

/// Finished jobs of kind `kind` with failure `message`, ids ascending, in
/// one statement; `n` of them.
async fn failed_jobs(
    pool: &sqlx::PgPool,
    table: &queue_store_postgres::JobTable,
    n: i64,
    message: &str,
) {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {} (kind, state, finished_at, failure_message) \
         SELECT 'k', 'failed', now(), $1 FROM generate_series(1, $2::int8)",
        table.name().quoted()
    )))
    .bind(message)
    .bind(n)
    .execute(pool)
    .await
    .expect("failed jobs inserted");
}

/// Without a trigram index, a failure text search reads a bounded stretch
/// of the list (50,000 jobs) per page: a page that does not fill says how
/// far it searched and where the next one goes on, and walking on finds
/// the match past the stretch. `%`, `_` and `\` in the text match
/// themselves, not as patterns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_text_search_without_an_index_reads_a_bounded_stretch_per_page() {
    let Some(pool) = pool("a_failure_text_search_reads_a_bounded_stretch").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    failed_jobs(&pool, &table, 1, r"disk 100% full_now \ again").await;
    failed_jobs(&pool, &table, 60_000, "disk 1000 fullXnow").await;
    let admin = PgAdmin::<i64>::new(pool.clone(), table.store_options())
        .await
        .expect("an admin");
    let filter = JobFilter::default().failure_contains(r"100% FULL_now \");
    let first = admin
        .list(&ListParams::first(filter.clone(), 10))
        .await
        .expect("the first page");
    assert!(first.jobs.is_empty(), "no match in the newest 50,000");
    assert_eq!(
        first.searched,
        Some(50_000),
        "the page says how far it read"
    );
    let next = first.next.expect("where the search goes on");
    let second = admin
        .list(&ListParams::first(filter.clone(), 10).after(Some(next)))
        .await
        .expect("the second page");
    assert_eq!(second.jobs.len(), 1, "the oldest job matches: {second:?}");
    assert_eq!(second.jobs[0].id, 1);
    assert_eq!(
        (second.next, second.searched),
        (None, None),
        "the end of the list: the search read it all"
    );
    assert_eq!(
        admin.count(&filter).await.expect("a count"),
        1,
        "the count applies the same text"
    );

    // A common text fills its page long before the stretch ends.
    let common = admin
        .list(&ListParams::first(
            JobFilter::default().failure_contains("DISK"),
            10,
        ))
        .await
        .expect("a page");
    assert_eq!(common.jobs.len(), 10);
    assert_eq!(
        common.searched, None,
        "a full page searched no further than it needed"
    );
    assert_eq!(common.next, Some(common.jobs[9].id));
}

/// Where pg_trgm is installed and the failure column has a trigram index
/// (docs/cli.md's, of failed jobs only), the search reads the index: one page finds a match however deep it is,
/// and says nothing of a stretch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_text_search_reads_a_trigram_index_where_there_is_one() {
    let Some(pool) = pool("a_failure_text_search_reads_a_trigram_index").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    // The extension ships with PostgreSQL (contrib); a server without it
    // cannot run this test, which says so instead of passing.
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        .execute(&pool)
        .await
        .expect("pg_trgm installed (PostgreSQL's contrib extensions)");
    execute(
        &pool,
        format!(
            "CREATE INDEX ON {} USING gin (failure_message gin_trgm_ops) \
             WHERE failure_message IS NOT NULL",
            table.name().quoted()
        ),
    )
    .await;
    failed_jobs(&pool, &table, 1, "the needle").await;
    failed_jobs(&pool, &table, 60_000, "hay").await;
    execute(&pool, format!("ANALYZE {}", table.name().quoted())).await;
    let admin = PgAdmin::<i64>::new(pool.clone(), table.store_options())
        .await
        .expect("an admin");
    let page = admin
        .list(&ListParams::first(
            JobFilter::default().failure_contains("NEEDLE"),
            10,
        ))
        .await
        .expect("a page");
    assert_eq!(
        (page.jobs.len(), page.next, page.searched),
        (1, None, None),
        "found through the index, in one page"
    );
}

/// A queued-time range on a big default table is read in windows of keys
/// through version 10's block range index (a wide window looked into
/// first, halved where it holds a match): the pages are those of a plain
/// ordered scan, newest and oldest first, across pages, with another
/// filter beside the range, for a range far down the list and one at its
/// head.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_time_range_reads_through_the_index_past_the_head_of_the_list() {
    let Some(pool) = pool("a_queued_time_range_reads_through_the_index").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let t = table.name().quoted();
    // 400,000 jobs, ten a minute, the oldest first; every third of kind b.
    execute(
        &pool,
        format!(
            "INSERT INTO {t} (kind, state, queued_at, finished_at) \
             SELECT CASE WHEN g % 3 = 0 THEN 'b' ELSE 'a' END, 'completed', \
             now() - interval '40000 minutes' + g * interval '6 seconds', now() \
             FROM generate_series(1, 400000) AS g"
        ),
    )
    .await;
    execute(&pool, format!("VACUUM ANALYZE {t}")).await;
    let admin = PgAdmin::<i64>::new(pool.clone(), table.store_options())
        .await
        .expect("an admin");
    let now = chrono::Utc::now();
    let ranges = [
        // Far down the list: windows looked into, then read.
        (
            now - chrono::TimeDelta::minutes(25_000),
            now - chrono::TimeDelta::minutes(24_990),
        ),
        // The newest ten minutes: at the head of the list.
        (now - chrono::TimeDelta::minutes(10), now),
    ];
    for (from, before) in ranges {
        for kinds in [None, Some("b")] {
            let mut filter = JobFilter::default().queued_from(from).queued_before(before);
            let mut kind_condition = String::new();
            if let Some(kind) = kinds {
                filter = filter.kinds([kind]);
                kind_condition = format!(" AND kind = '{kind}'");
            }
            for order in [
                queue_core::ListOrder::NewestFirst,
                queue_core::ListOrder::OldestFirst,
            ] {
                let direction = match order {
                    queue_core::ListOrder::NewestFirst => "DESC",
                    _ => "ASC",
                };
                let expected: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "SELECT id FROM {t} WHERE queued_at >= $1 AND queued_at < $2{kind_condition} \
                     ORDER BY id {direction}"
                )))
                .bind(from)
                .bind(before)
                .fetch_all(&pool)
                .await
                .expect("the expected ids");
                assert!(!expected.is_empty(), "the range holds jobs");
                let mut params = ListParams::first(filter.clone(), 40).order(order);
                let mut seen = Vec::new();
                loop {
                    let page = admin.list(&params).await.expect("a page");
                    assert_eq!(
                        page.searched, None,
                        "a queued range is read to the page's end"
                    );
                    seen.extend(page.jobs.iter().map(|j| j.id));
                    match page.next {
                        Some(next) => params.after = Some(next),
                        None => break,
                    }
                }
                assert_eq!(seen, expected, "{from}..{before}, {kinds:?}, {order:?}");
            }
        }
    }
}

/// Right after a bulk retry of a big table's failed jobs, the figures do
/// not keep them failed: the retried jobs are counted as waiting, and the
/// finished ones are what the table's live rows leave of them (not the
/// last ANALYZE's shares times a table that the update's dead rows made
/// look twice as big). The operation's end has the table analyzed, after
/// which the finished figures are split right too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_bulk_retry_the_figures_do_not_keep_the_jobs_failed() {
    let Some(pool) = pool("after_a_bulk_retry_the_figures_do_not_keep").await else {
        return;
    };
    let table = fresh_table(&pool).await;
    let t = table.name().quoted();
    execute(
        &pool,
        format!(
            "INSERT INTO {t} (kind, state, finished_at, failure_message, num_failures) \
             SELECT 'a', 'failed', now(), 'deploy 7f3a', 1 FROM generate_series(1, 4000)"
        ),
    )
    .await;
    execute(
        &pool,
        format!(
            "INSERT INTO {t} (kind, state, finished_at) \
             SELECT 'b', 'completed', now() FROM generate_series(1, 1000)"
        ),
    )
    .await;
    // Only the operation's own analysis may read the table from here on,
    // and it reads the columns of the figures and the claims, never the
    // payload (checked at the end).
    execute(
        &pool,
        format!("ALTER TABLE {t} SET (autovacuum_enabled = false)"),
    )
    .await;
    execute(&pool, format!("ANALYZE {t} (state, kind)")).await;
    // Past the threshold, with the 4,000 retried jobs under the cap of a
    // waiting set, so that they are counted.
    let admin = PgAdmin::<i64>::new(
        pool.clone(),
        table.store_options().exact_counts_below(5_000),
    )
    .await
    .expect("an admin");
    let failed = JobFilter::default().states([JobState::Failed]);
    let op = admin
        .create_operation(&queue_core::NewOperation::new(
            queue_core::OperationAction::Retry {
                reset_attempts: false,
            },
            failed,
            "alice",
            4000,
        ))
        .await
        .expect("an operation");
    let op = admin
        .take_operation(&queue_core::TakeOperation::id("test", op.id))
        .await
        .expect("taken")
        .expect("the operation");
    let done = queue_core::run_operation(
        &admin,
        op,
        "test",
        &queue_core::CancellationToken::new(),
        queue_core::RunOptions::new(std::time::Duration::ZERO, queue_core::StopAs::HandedBack),
        |_| {},
    )
    .await
    .expect("the retry ran");
    assert_eq!(done.done, 4000);
    let figure = |stats: &queue_core::QueueStats, state: JobState| -> u64 {
        stats
            .counts
            .iter()
            .filter(|c| c.state == Some(state))
            .map(|c| c.count)
            .sum()
    };
    let now = chrono::Utc::now;
    let stats = admin
        .stats(StatsParams::new(now(), now()))
        .await
        .expect("the figures");
    assert_eq!(figure(&stats, JobState::Queued), 4000, "counted: {stats:?}");
    let finished = figure(&stats, JobState::Failed) + figure(&stats, JobState::Completed);
    assert!(
        (900..=1100).contains(&finished),
        "the finished figures are what is left of the table's 5,000 rows, not 4,800 again: {stats:?}"
    );
    // The operation's end had the table analyzed.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let stats = admin
            .stats(StatsParams::new(now(), now()))
            .await
            .expect("the figures");
        if figure(&stats, JobState::Failed) == 0 {
            assert!(
                (900..=1100).contains(&figure(&stats, JobState::Completed)),
                "{stats:?}"
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still failed jobs after the operation's ANALYZE: {stats:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let analyzed: Vec<String> = sqlx::query_scalar(
        "SELECT attname::text FROM pg_stats WHERE schemaname = $1 AND tablename = $2 ORDER BY 1",
    )
    .bind(table.name().schema.as_str())
    .bind(table.name().name.as_str())
    .fetch_all(&pool)
    .await
    .expect("the table's statistics");
    assert!(
        analyzed.iter().any(|c| c == "process_after"),
        "the operation's ANALYZE read the claims' columns: {analyzed:?}"
    );
    assert!(
        !analyzed.iter().any(|c| c == "payload"),
        "the operation's ANALYZE left the payload alone: {analyzed:?}"
    );
}
