//! The claim cursor: after a claim that came back full, the next claim
//! starts after the last job it took (in the same priority) instead of at
//! the start of the claim order. A job that becomes claimable before the
//! cursor waits for the next claim from the start: after the rescan
//! interval, after a short claim, or at once when the claim at the cursor
//! finds nothing. Claims with extra conditions always read from the start.

mod support;

use std::time::Duration;

use queue_core::{ClaimParams, Claimed, Job, NewJob, Store, Transition, WriteResult};
use queue_store_postgres::{Column, JobTable, PgCondition, PgStore, PgStoreOptions};
use sqlx::PgPool;
use support::{claim_now, fresh_table, pool};

/// A fresh default table holding `n` jobs of priority 0 (their keys in
/// order), and a store over it with the options `configure` makes.
struct Backlog {
    pool: PgPool,
    table: JobTable,
    store: PgStore<Job>,
    jobs: Vec<i64>,
}

impl Backlog {
    async fn new(
        pool: &PgPool,
        n: usize,
        configure: impl FnOnce(PgStoreOptions) -> PgStoreOptions,
    ) -> Backlog {
        let table = fresh_table(pool).await;
        let store = PgStore::default_table(pool.clone(), configure(table.store_options()))
            .await
            .expect("a store over the test table");
        let jobs = table.enqueue_many(pool, &low(n)).await.expect("enqueue");
        Backlog {
            pool: pool.clone(),
            table,
            store,
            jobs,
        }
    }

    /// Enqueues one job of priority 5.
    async fn enqueue_high(&self) -> i64 {
        let job = NewJob::new("k", serde_json::json!("high")).priority(5);
        self.table.enqueue(&self.pool, &job).await.expect("enqueue")
    }

    async fn claim(&self, limit: usize) -> Vec<i64> {
        ids(&claim_now(&self.store, limit).await)
    }

    /// A session that keeps a snapshot from now on (until the connection
    /// is dropped): the entry of every job claimed meanwhile stays in the
    /// claim index, and no scan can mark it dead.
    async fn hold_a_snapshot(&self) -> sqlx::pool::PoolConnection<sqlx::Postgres> {
        let mut idle = self.pool.acquire().await.expect("a connection");
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM {}",
            self.table.name().quoted()
        )))
        .execute(&mut *idle)
        .await
        .expect("a snapshot held");
        idle
    }
}

/// Whether the store logged that the walk from the start is costly.
fn found_costly(logged: &support::logs::Logged) -> bool {
    logged
        .messages()
        .iter()
        .any(|m| m.contains("claims stay at the cursor"))
}

fn low(n: usize) -> Vec<NewJob> {
    (0..n)
        .map(|i| NewJob::new("k", serde_json::json!(i)))
        .collect()
}

fn ids(claimed: &[Claimed<PgStore<Job>>]) -> Vec<i64> {
    claimed.iter().map(|c| c.lease.id).collect()
}

async fn release(store: &PgStore<Job>, job: Claimed<PgStore<Job>>) {
    let written = store
        .finish(
            job.job_store,
            &job.lease,
            Transition::Release,
            chrono::Utc::now(),
        )
        .await
        .expect("release");
    assert_eq!(written, WriteResult::Applied, "handed back");
}

/// An hour: no claim in these tests reads from the start because of time.
const NEVER: Option<Duration> = Some(Duration::from_secs(3600));

#[tokio::test]
async fn a_full_claim_moves_the_cursor_and_a_short_one_sends_the_next_claim_to_the_start() {
    let test = "a_full_claim_moves_the_cursor_and_a_short_one_sends_the_next_claim_to_the_start";
    let Some(pool) = pool(test).await else { return };
    let b = Backlog::new(&pool, 5, |o| o.claim_cursor(NEVER)).await;
    let a = &b.jobs;

    assert_eq!(b.claim(2).await, a[0..2], "from the start");
    let h = b.enqueue_high().await;
    assert_eq!(
        b.claim(2).await,
        a[2..4],
        "the last claim came back full: this one starts after its last job, \
         passing over the high-priority job enqueued since"
    );
    assert_eq!(
        b.claim(2).await,
        a[4..5],
        "short: the backlog after the cursor is over"
    );
    assert_eq!(
        b.claim(2).await,
        [h],
        "so the next claim reads from the start"
    );
}

#[tokio::test]
async fn a_claim_at_the_cursor_that_finds_nothing_reads_from_the_start_at_once() {
    let test = "a_claim_at_the_cursor_that_finds_nothing_reads_from_the_start_at_once";
    let Some(pool) = pool(test).await else { return };
    let b = Backlog::new(&pool, 2, |o| o.claim_cursor(NEVER)).await;
    let a = &b.jobs;

    let first = claim_now(&b.store, 2).await;
    assert_eq!(ids(&first), *a, "full: the cursor is after the second job");
    // The first job is handed back: claimable again, before the cursor.
    release(&b.store, first.into_iter().next().expect("a job")).await;
    assert_eq!(
        b.claim(2).await,
        [a[0]],
        "nothing after the cursor, so the same claim read from the start \
         (an empty claim would idle the worker until its next poll)"
    );
}

#[tokio::test]
async fn claims_read_from_the_start_again_once_the_rescan_interval_has_passed() {
    let test = "claims_read_from_the_start_again_once_the_rescan_interval_has_passed";
    let Some(pool) = pool(test).await else { return };
    let rescan = Duration::from_millis(50);
    let b = Backlog::new(&pool, 6, |o| o.claim_cursor(Some(rescan))).await;
    let a = &b.jobs;

    assert_eq!(b.claim(2).await, a[0..2]);
    let h = b.enqueue_high().await;
    tokio::time::sleep(rescan + Duration::from_millis(10)).await;
    assert_eq!(
        b.claim(2).await,
        [h, a[2]],
        "the last claim from the start is older than the interval"
    );
}

#[tokio::test]
async fn without_a_cursor_or_with_conditions_every_claim_reads_from_the_start() {
    let test = "without_a_cursor_or_with_conditions_every_claim_reads_from_the_start";
    let Some(pool) = pool(test).await else { return };
    for (case, cursor) in [
        ("no cursor", None),
        ("rescan on every claim", Some(Duration::ZERO)),
        ("with conditions", NEVER),
    ] {
        let b = Backlog::new(&pool, 4, |o| o.claim_cursor(cursor)).await;
        let a = &b.jobs;
        assert_eq!(b.claim(2).await, a[0..2], "{case}");
        let h = b.enqueue_high().await;
        let conditions = vec![PgCondition::new("jobs.kind = {}").bind("k")];
        let next = b
            .store
            .claim(ClaimParams {
                limit: 2,
                worker: "w",
                conditions: (case == "with conditions").then_some(&conditions),
                now: chrono::Utc::now(),
            })
            .await
            .expect("a claim");
        assert_eq!(ids(&next), [h, a[2]], "{case}");
    }
}

#[tokio::test]
async fn without_a_priority_column_the_cursor_is_a_key() {
    let test = "without_a_priority_column_the_cursor_is_a_key";
    let Some(pool) = pool(test).await else { return };
    let b = Backlog::new(&pool, 5, |o| {
        o.without(Column::Priority)
            .expect("priority is optional")
            .claim_cursor(NEVER)
    })
    .await;
    let a = &b.jobs;

    let first = claim_now(&b.store, 2).await;
    assert_eq!(ids(&first), a[0..2]);
    release(&b.store, first.into_iter().next().expect("a job")).await;
    assert_eq!(
        b.claim(2).await,
        a[2..4],
        "after the cursor's key, passing over the job handed back"
    );
    assert_eq!(b.claim(2).await, a[4..5], "short");
    assert_eq!(
        b.claim(2).await,
        [a[0]],
        "from the start: the job handed back"
    );
}

/// Claims (up to `limit` each) until `want` is among the jobs taken, for at
/// most `within`; every job taken on the way, and how long it took.
async fn claim_until(
    b: &Backlog,
    want: i64,
    limit: usize,
    within: Duration,
) -> (Vec<i64>, Duration) {
    let began = std::time::Instant::now();
    let mut taken = Vec::new();
    while !taken.contains(&want) {
        assert!(
            began.elapsed() < within,
            "job {want} not claimed within {within:?}; taken meanwhile: {taken:?}"
        );
        taken.extend(b.claim(limit).await);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    (taken, began.elapsed())
}

/// Inside a backlog every claim comes back full, and each rescan from the
/// start walks the entry of every job claimed since an old snapshot (a
/// drain of a million jobs ran at a quarter of its speed that way). A slow
/// full claim from the start is measured too: the walk is found costly
/// while the backlog lasts, and claims go on at the cursor without passing
/// over a job.
#[tokio::test]
async fn inside_a_backlog_an_old_snapshot_makes_the_walk_costly_too() {
    let test = "inside_a_backlog_an_old_snapshot_makes_the_walk_costly_too";
    let Some(pool) = pool(test).await else { return };
    let (logged, _guard) = support::logs::Logged::at(tracing::Level::INFO);
    let n = 200_000;
    let b = Backlog::new(&pool, n, |o| {
        o.claim_cursor(Some(Duration::from_millis(10)))
    })
    .await;
    let idle = b.hold_a_snapshot().await;
    // Claims of 50, a millisecond apart: the measurements go at most every
    // 5 s, so the backlog lasts longer than that.
    let mut taken = Vec::new();
    while !found_costly(&logged) {
        let claimed = b.claim(50).await;
        assert_eq!(
            claimed.len(),
            50,
            "the backlog ran out ({} claimed) before the walk over the entries of the jobs claimed since the snapshot was found costly",
            taken.len()
        );
        taken.extend(claimed);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for _ in 0..20 {
        taken.extend(b.claim(50).await);
    }
    taken.sort_unstable();
    assert_eq!(
        taken,
        b.jobs[..taken.len()],
        "the claims took the backlog in order, passing over no job"
    );
    drop(idle);
}

#[tokio::test]
async fn while_an_old_snapshot_is_held_claims_stay_at_the_cursor_and_a_probe_finds_what_it_passed()
{
    let test =
        "while_an_old_snapshot_is_held_claims_stay_at_the_cursor_and_a_probe_finds_what_it_passed";
    let Some(pool) = pool(test).await else { return };
    let (logged, _guard) = support::logs::Logged::at(tracing::Level::INFO);
    let rescan = Duration::from_millis(10);
    let n = 50_000;
    let b = Backlog::new(&pool, n, |o| o.claim_cursor(Some(rescan))).await;
    // A snapshot from before any claim.
    let mut idle = b.hold_a_snapshot().await;
    let mut claimed = 0;
    while claimed < n {
        claimed += b.claim(1_000).await.len();
    }
    // The next claims come back short; one of them reads from the start
    // and walks 50,000 dead entries (milliseconds): the store measures the
    // walk (hundreds of blocks) and finds it costly.
    let mut at_cursor = Vec::new();
    let mut i = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !found_costly(&logged) || i < 5 {
        assert!(
            std::time::Instant::now() < deadline,
            "the walk over 50,000 dead entries was not found costly; logged: {:?}",
            logged.messages()
        );
        let id = b
            .table
            .enqueue(&b.pool, &NewJob::new("k", serde_json::json!(i)))
            .await
            .expect("enqueue");
        let began = std::time::Instant::now();
        assert_eq!(b.claim(10).await, [id], "each new job, at once");
        at_cursor.push(began.elapsed());
        i += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let began = std::time::Instant::now();
    let fresh = b
        .table
        .enqueue(&b.pool, &NewJob::new("k", serde_json::json!("fresh")))
        .await
        .expect("enqueue");
    assert_eq!(b.claim(10).await, [fresh]);
    let costly_claim = began.elapsed();

    // A key that commits after a later one was claimed: before the cursor.
    let mut late = b.pool.begin().await.expect("a transaction");
    let passed = b
        .table
        .enqueue(&mut *late, &NewJob::new("k", serde_json::json!("late")))
        .await
        .expect("enqueue");
    let after = b
        .table
        .enqueue(&b.pool, &NewJob::new("k", serde_json::json!("after")))
        .await
        .expect("enqueue");
    assert_eq!(
        b.claim(10).await,
        [after],
        "the cursor passes the uncommitted key"
    );
    late.commit().await.expect("commit");
    let (taken, waited) = claim_until(&b, passed, 10, Duration::from_secs(5)).await;
    assert_eq!(taken, [passed], "the probe moved the cursor back to it");

    // A higher priority, enqueued after the cursor's.
    let high = b.enqueue_high().await;
    let (taken, _) = claim_until(&b, high, 10, Duration::from_secs(5)).await;
    assert_eq!(taken, [high]);
    // Back in priority 0, after the high job's priority is done.
    let low = b
        .table
        .enqueue(&b.pool, &NewJob::new("k", serde_json::json!("low")))
        .await
        .expect("enqueue");
    let (taken, _) = claim_until(&b, low, 10, Duration::from_secs(5)).await;
    assert_eq!(taken, [low], "the probe found priority 0 again");

    // A job whose time came, read apart from the ready ones.
    let due = b
        .table
        .enqueue(
            &b.pool,
            &NewJob::new("k", serde_json::json!("due"))
                .process_after(chrono::Utc::now() - chrono::TimeDelta::seconds(1)),
        )
        .await
        .expect("enqueue");
    let (taken, _) = claim_until(&b, due, 10, Duration::from_secs(5)).await;
    assert_eq!(taken, [due]);

    sqlx::raw_sql("COMMIT")
        .execute(&mut *idle)
        .await
        .expect("commit");
    let again = b
        .table
        .enqueue(&b.pool, &NewJob::new("k", serde_json::json!("again")))
        .await
        .expect("enqueue");
    let (taken, _) = claim_until(&b, again, 10, Duration::from_secs(5)).await;
    assert_eq!(taken, [again], "the snapshot gone, claims go on");
    eprintln!(
        "claims of one new job: {at_cursor:?}, then {costly_claim:?}; the passed key waited {waited:?}"
    );
}
