//! Versioned migrations of the tables the store owns (the default table, a
//! bookkeeping table): each version of a table's schema is applied once, in
//! order, in one transaction under an advisory lock, and recorded in
//! `<table>_migrations` beside the table. A database already at
//! the newest version is only read, so migrating on every start-up takes no
//! lock a worker would wait for.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use queue_core::StoreError;
use sqlx::{PgPool, Row};

use crate::error::store_error;
use crate::ident::QualifiedName;
use crate::options::default_channel;
use crate::sql::default_table::{self, MigrationSql};

/// One version of the schema of a table the store owns.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Migration {
    /// The table it is a version of (the default table, a bookkeeping
    /// table, a kinds table): each numbers its versions from 1.
    pub table: QualifiedName,
    /// Its number: versions apply in ascending order.
    pub version: u32,
    /// What it changes.
    pub name: String,
    /// When it was applied to this database; `None` while pending.
    pub applied_at: Option<DateTime<Utc>>,
    /// The SQL it runs (empty for a version this release does not know,
    /// applied by a newer one).
    pub statements: Vec<String>,
}

/// The default table's versions.
pub(crate) fn default_table(
    table: &QualifiedName,
    layout: default_table::Layout,
) -> Vec<MigrationSql> {
    default_table::migrations(table, &default_channel(&table.name), layout)
}

async fn exists(conn: &mut sqlx::PgConnection, table: &QualifiedName) -> Result<bool, StoreError> {
    sqlx::query_scalar(default_table::RELATION_EXISTS)
        .bind(table.quoted())
        .fetch_one(&mut *conn)
        .await
        .map_err(|e| store_error("reading the migration versions", e))
}

/// The versions recorded for `table`; none if the table itself is gone
/// (dropped since: its versions no longer describe anything).
async fn applied(
    conn: &mut sqlx::PgConnection,
    table: &QualifiedName,
) -> Result<Vec<(u32, String, DateTime<Utc>)>, StoreError> {
    if !exists(conn, &default_table::version_table(table)).await? || !exists(conn, table).await? {
        return Ok(Vec::new());
    }
    let rows = sqlx::query(sqlx::AssertSqlSafe(default_table::applied_versions(table)))
        .fetch_all(&mut *conn)
        .await
        .map_err(|e| store_error("reading the migration versions", e))?;
    rows.iter()
        .map(|row| {
            let version: i32 = row.try_get("version")?;
            Ok((
                u32::try_from(version).unwrap_or(0),
                row.try_get("name")?,
                row.try_get("applied_at")?,
            ))
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(|e| store_error("reading the migration versions", e))
}

/// A connection from `pool`, and the versions recorded for `table` read on
/// it.
async fn connect_and_read(
    pool: &PgPool,
    table: &QualifiedName,
) -> Result<
    (
        sqlx::pool::PoolConnection<sqlx::Postgres>,
        Vec<(u32, String, DateTime<Utc>)>,
    ),
    StoreError,
> {
    let mut conn = pool
        .acquire()
        .await
        .map_err(|e| store_error("reading the migration versions", e))?;
    let applied = applied(&mut conn, table).await?;
    Ok((conn, applied))
}

/// Every version, known to this release or applied to the database, with
/// when it was applied.
pub(crate) async fn status(
    pool: &PgPool,
    table: &QualifiedName,
    known: Vec<MigrationSql>,
) -> Result<Vec<Migration>, StoreError> {
    let (_, applied) = connect_and_read(pool, table).await?;
    let mut all: Vec<Migration> = known
        .into_iter()
        .map(|m| Migration {
            table: table.clone(),
            applied_at: applied
                .iter()
                .find(|(v, _, _)| *v == m.version)
                .map(|(_, _, at)| *at),
            version: m.version,
            name: m.name.to_owned(),
            statements: m.statements,
        })
        .collect();
    for (version, name, at) in applied {
        if !all.iter().any(|m| m.version == version) {
            all.push(Migration {
                table: table.clone(),
                version,
                name,
                applied_at: Some(at),
                statements: Vec::new(),
            });
        }
    }
    all.sort_by_key(|m| m.version);
    Ok(all)
}

/// Applies the pending versions of `known`; returns them as applied.
///
/// A database already up to date is only read. Otherwise one migrator at a
/// time (a session advisory lock) applies the pending versions in order:
/// each ordinary version in a transaction of its own (on a table this run
/// creates, consecutive ones in one), waiting for its locks as
/// `lock_wait` says, and each version that builds indexes concurrently
/// outside any, recorded once its indexes are valid. An interrupted build
/// leaves an invalid index and its version unrecorded; the next run drops
/// that index and builds it again.
pub(crate) async fn apply(
    pool: &PgPool,
    table: &QualifiedName,
    known: Vec<MigrationSql>,
    lock_wait: LockWait,
) -> Result<Vec<Migration>, StoreError> {
    let (mut conn, done) = connect_and_read(pool, table).await?;
    if pending(&known, &done).is_empty() {
        return Ok(Vec::new());
    }
    lock(&mut conn).await?;
    let applied = apply_locked(&mut conn, pool, table, known, lock_wait).await;
    match &applied {
        Ok(_) => {
            sqlx::query(default_table::MIGRATION_UNLOCK)
                .execute(&mut *conn)
                .await
                .map_err(|e| store_error("releasing the migration lock", e))?;
        }
        // The session ends with the connection, and the lock with it,
        // whatever state the failure left it in.
        Err(_) => drop(conn.detach()),
    }
    applied
}

/// The versions of `known` not in `done`.
fn pending(known: &[MigrationSql], done: &[(u32, String, DateTime<Utc>)]) -> Vec<u32> {
    known
        .iter()
        .map(|m| m.version)
        .filter(|v| !done.iter().any(|(d, _, _)| d == v))
        .collect()
}

/// Takes the migration lock for this session, waiting while another
/// migrator holds it.
async fn lock(conn: &mut sqlx::PgConnection) -> Result<(), StoreError> {
    loop {
        let taken: bool = sqlx::query_scalar(default_table::MIGRATION_LOCK)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| store_error("taking the migration lock", e))?;
        if taken {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// [`apply`] under the lock.
async fn apply_locked(
    conn: &mut sqlx::PgConnection,
    pool: &PgPool,
    table: &QualifiedName,
    known: Vec<MigrationSql>,
    lock_wait: LockWait,
) -> Result<Vec<Migration>, StoreError> {
    // Read again: another migrator may have applied them meanwhile.
    let done = applied(conn, table).await?;
    let pending = pending(&known, &done);
    if pending.is_empty() {
        return Ok(Vec::new());
    }
    // A table created by this run is empty: its indexes are built in the
    // transaction that creates it, with nothing to wait for.
    let fresh = !exists(conn, table).await?;
    let mut versions = known
        .into_iter()
        .filter(|m| pending.contains(&m.version))
        .peekable();
    let mut applied_now = Vec::new();
    let mut first = true;
    // Index builds and batched fix-ups run outside a transaction, except
    // on a table this run creates.
    let outside = |m: &MigrationSql| !fresh && (!m.concurrent_indexes.is_empty() || m.batched);
    while versions.peek().is_some() {
        if versions.peek().is_some_and(outside) {
            let Some(m) = versions.next() else { break };
            if m.batched {
                fix_up(conn, table, &m).await?;
            } else {
                build_concurrently(conn, pool, table, &m, lock_wait.give_up_after).await?;
            }
            record(&mut *conn, table, &m)
                .await
                .map_err(|e| store_error(&migrating(table, &m), e))?;
            applied_now.push(migration(table, m));
            continue;
        }
        // A table this run creates gets its ordinary versions up to the
        // next concurrent one in one transaction; a table in use gets each
        // version in a transaction of its own, so that no version holds
        // its lock through the next one's work (a check validated after
        // the version that added it takes a weaker lock than that
        // version's).
        let group: Vec<MigrationSql> = if fresh {
            std::iter::from_fn(|| versions.next_if(|m| !outside(m))).collect()
        } else {
            versions.next().into_iter().collect()
        };
        let setup = first.then_some(done.is_empty());
        first = false;
        let wait = (!fresh).then_some(lock_wait);
        apply_group(conn, table, &group, setup, wait).await?;
        applied_now.extend(group.into_iter().map(|m| migration(table, m)));
    }
    Ok(applied_now)
}

/// How long a version that changes a table in use waits for its locks:
/// at most `per_try` at a time, its transaction then rolled back and tried
/// again after as long a pause, until `give_up_after` in all. Claims,
/// enqueues and completions queue behind a lock that a DDL statement waits
/// for, so each wait is kept short: a transaction left open on the table
/// (a long job's, or a session idle in one) then holds up the migration,
/// not the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LockWait {
    /// The longest one try waits for a lock.
    pub per_try: Duration,
    /// When the tries stop and the migration fails.
    pub give_up_after: Duration,
}

impl Default for LockWait {
    /// A second a try, for up to ten minutes.
    fn default() -> Self {
        LockWait {
            per_try: Duration::from_secs(1),
            give_up_after: Duration::from_secs(600),
        }
    }
}

/// Applies `group` in one transaction, recording each version. `setup`
/// is set for the run's first transaction: whether to forget the versions
/// of a table dropped since. With `wait` (a table in use), each statement
/// waits at most [`LockWait::per_try`] for its locks, and the transaction
/// is tried again while [`LockWait::give_up_after`] allows.
async fn apply_group(
    conn: &mut sqlx::PgConnection,
    table: &QualifiedName,
    group: &[MigrationSql],
    setup: Option<bool>,
    wait: Option<LockWait>,
) -> Result<(), StoreError> {
    let began = Instant::now();
    let mut tries = 0u32;
    loop {
        tries += 1;
        let error = match try_group(conn, table, group, setup, wait.map(|w| w.per_try)).await {
            Ok(()) => return Ok(()),
            Err(error) => error,
        };
        let Some(wait) = wait.filter(|_| error.lock_not_available()) else {
            return Err(error.into_store_error());
        };
        if began.elapsed() + wait.per_try * 2 > wait.give_up_after {
            return Err(out_of_reach(conn, table, error, tries, began.elapsed()).await);
        }
        tracing::warn!(
            table = %table,
            version = error.version,
            tries,
            "a migration's lock stayed out of reach (a transaction open on the table); trying again"
        );
        tokio::time::sleep(wait.per_try).await;
    }
}

/// A failed try of [`try_group`]: what it was doing, and why it failed.
struct GroupError {
    /// The version it was applying (0 while setting up).
    version: u32,
    context: String,
    source: sqlx::Error,
}

impl GroupError {
    fn lock_not_available(&self) -> bool {
        self.source
            .as_database_error()
            .and_then(|e| e.code())
            .is_some_and(|code| code == "55P03")
    }

    fn into_store_error(self) -> StoreError {
        store_error(&self.context, self.source)
    }
}

/// One try of [`apply_group`]: the transaction committed, or rolled back
/// with what failed.
async fn try_group(
    conn: &mut sqlx::PgConnection,
    table: &QualifiedName,
    group: &[MigrationSql],
    setup: Option<bool>,
    per_try: Option<Duration>,
) -> Result<(), GroupError> {
    let failed = |version: u32, context: String| {
        move |source: sqlx::Error| GroupError {
            version,
            context,
            source,
        }
    };
    let mut tx = sqlx::Connection::begin(&mut *conn)
        .await
        .map_err(failed(0, "starting the migration".to_owned()))?;
    let result = async {
        if let Some(per_try) = per_try {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "SET LOCAL lock_timeout = '{}ms'",
                per_try.as_millis().max(1)
            )))
            .execute(&mut *tx)
            .await
            .map_err(failed(0, "starting the migration".to_owned()))?;
        }
        if let Some(forget) = setup {
            let context = format!("creating the version table of {table}");
            for statement in default_table::create_version_table(table) {
                sqlx::query(sqlx::AssertSqlSafe(statement))
                    .execute(&mut *tx)
                    .await
                    .map_err(failed(0, context.clone()))?;
            }
            if forget {
                // Versions recorded for a table dropped since describe
                // nothing.
                sqlx::query(sqlx::AssertSqlSafe(default_table::forget_versions(table)))
                    .execute(&mut *tx)
                    .await
                    .map_err(failed(0, format!("clearing the versions of {table}")))?;
            }
        }
        for m in group {
            let context = migrating(table, m);
            // A new table has no rows to fix up.
            let statements = if m.batched {
                &[][..]
            } else {
                &m.statements[..]
            };
            for statement in statements {
                let statement = if m.concurrent_indexes.is_empty() {
                    statement.clone()
                } else {
                    // In the transaction that created the table.
                    statement.replacen(" CONCURRENTLY", "", 1)
                };
                sqlx::query(sqlx::AssertSqlSafe(statement))
                    .execute(&mut *tx)
                    .await
                    .map_err(failed(m.version, context.clone()))?;
            }
            record(&mut tx, table, m)
                .await
                .map_err(failed(m.version, context))?;
        }
        Ok(())
    }
    .await;
    match result {
        Ok(()) => tx
            .commit()
            .await
            .map_err(failed(0, "committing the migration".to_owned())),
        Err(error) => {
            // A failed rollback leaves the connection broken; the error
            // that matters is the one that failed the try.
            let _ = tx.rollback().await;
            Err(error)
        }
    }
}

/// The sessions holding locks on a table, oldest transaction first:
/// `pid`, `state`, `since` (the transaction's start) and `query` (its
/// latest statement, cut short).
const LOCK_HOLDERS: &str = "SELECT a.pid, coalesce(a.state, 'unknown') AS \"state\", \
     a.xact_start AS \"since\", left(coalesce(a.query, ''), 120) AS \"query\" \
     FROM pg_catalog.pg_locks AS l JOIN pg_catalog.pg_stat_activity AS a ON a.pid = l.pid \
     WHERE l.locktype = 'relation' AND l.granted AND l.relation = to_regclass($1) \
     AND l.pid <> pg_backend_pid() \
     GROUP BY a.pid, a.state, a.xact_start, a.query ORDER BY a.xact_start NULLS LAST LIMIT 5";

/// The error of a version whose lock stayed out of reach: what it waited
/// for, how long, and the sessions that hold locks on the table now.
async fn out_of_reach(
    conn: &mut sqlx::PgConnection,
    table: &QualifiedName,
    error: GroupError,
    tries: u32,
    waited: Duration,
) -> StoreError {
    let holders = describe_sessions(
        sqlx::query(LOCK_HOLDERS)
            .bind(table.quoted())
            .fetch_all(&mut *conn)
            .await,
    );
    StoreError::Conflict {
        context: format!(
            "{}: its lock on {table} stayed out of reach for {:.0?} ({tries} tries); \
             sessions holding locks on the table: {holders}. Migrate again once they are done, \
             or end them (pg_terminate_backend)",
            error.context, waited,
        ),
        source: Box::new(error.source),
    }
}

/// Sessions as [`LOCK_HOLDERS`] and [`BLOCKING_SESSIONS`] read them, in
/// words: each one's pid, state, since when its transaction is open, and
/// its last statement.
fn describe_sessions(rows: Result<Vec<sqlx::postgres::PgRow>, sqlx::Error>) -> String {
    match rows {
        Ok(rows) if rows.is_empty() => "none now".to_owned(),
        Ok(rows) => rows
            .iter()
            .map(|row| {
                let pid: i32 = row.try_get("pid").unwrap_or_default();
                let state: String = row.try_get("state").unwrap_or_default();
                let since: Option<DateTime<Utc>> = row.try_get("since").unwrap_or_default();
                let query: String = row.try_get("query").unwrap_or_default();
                let since = since.map_or(String::new(), |at| {
                    format!(
                        ", its transaction open since {}",
                        at.format("%Y-%m-%d %H:%M:%S UTC")
                    )
                });
                format!("pid {pid} ({state}{since}; last statement: {query:?})")
            })
            .collect::<Vec<_>>()
            .join(", "),
        Err(e) => format!("unknown (reading them failed: {e})"),
    }
}

/// The sessions that backend `$1` waits for, oldest transaction first, as
/// [`LOCK_HOLDERS`] reads them.
const BLOCKING_SESSIONS: &str = "SELECT a.pid, coalesce(a.state, 'unknown') AS \"state\", \
     a.xact_start AS \"since\", left(coalesce(a.query, ''), 120) AS \"query\" \
     FROM pg_catalog.pg_stat_activity AS a WHERE a.pid = ANY(pg_catalog.pg_blocking_pids($1)) \
     ORDER BY a.xact_start NULLS LAST LIMIT 5";

/// Whether Postgres canceled the statement (`pg_cancel_backend`).
fn is_canceled(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code == "57014")
}

/// The sessions idle in a transaction that backend `$1` waits for: `pid`.
const IDLE_BLOCKERS: &str = "SELECT a.pid FROM pg_catalog.pg_stat_activity AS a \
     WHERE a.pid = ANY(pg_catalog.pg_blocking_pids($1)) AND a.state LIKE 'idle in transaction%'";

/// Runs the concurrent build `create` on `conn`, canceled from `pool` if,
/// once it has run for `give_up_after`, it is found waiting for the same
/// session idle in a transaction twice a second apart: a build waits, in
/// its phases, for every transaction open on the table, and then for
/// every one in the database that began before it, and a session left
/// idle in one keeps it waiting for as long. It holds up no claim
/// meanwhile, but the migration would wait without end. A build that is
/// working, or waiting for statements that are running, is left alone.
/// Returns the build's outcome, and on a cancel the sessions it was
/// waiting for, in words.
async fn build_watched(
    conn: &mut sqlx::PgConnection,
    pool: &PgPool,
    create: &str,
    give_up_after: Duration,
) -> Result<Result<(), (sqlx::Error, Option<String>)>, sqlx::Error> {
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *conn)
        .await?;
    let canceling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watchdog = tokio::spawn({
        let pool = pool.clone();
        let canceling = canceling.clone();
        async move {
            tokio::time::sleep(give_up_after).await;
            let mut before: Vec<i32> = Vec::new();
            loop {
                let blocking: Vec<i32> = sqlx::query_scalar(IDLE_BLOCKERS)
                    .bind(pid)
                    .fetch_all(&pool)
                    .await
                    .unwrap_or_default();
                if blocking.iter().any(|p| before.contains(p)) {
                    break;
                }
                before = blocking;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            let waiting_for = describe_sessions(
                sqlx::query(BLOCKING_SESSIONS)
                    .bind(pid)
                    .fetch_all(&pool)
                    .await,
            );
            canceling.store(true, std::sync::atomic::Ordering::SeqCst);
            let _ = sqlx::query("SELECT pg_cancel_backend($1)")
                .bind(pid)
                .execute(&pool)
                .await;
            waiting_for
        }
    });
    let built = sqlx::query(sqlx::AssertSqlSafe(create))
        .execute(&mut *conn)
        .await;
    let canceled = || canceling.load(std::sync::atomic::Ordering::SeqCst);
    let stopped = matches!(&built, Err(e) if is_canceled(e)) && canceled();
    if !stopped {
        watchdog.abort();
    }
    // Stopped by the watchdog, which is about done: its words.
    let waiting_for = watchdog.await.ok();
    if !stopped && canceled() {
        // The watchdog sent its cancel as the build ended: let it land on
        // a statement of no consequence, not on the migration's next one.
        let _ = sqlx::query("SELECT pg_sleep(0.05)")
            .execute(&mut *conn)
            .await;
    }
    Ok(match built {
        Ok(_) => Ok(()),
        Err(e) if stopped => Err((e, waiting_for)),
        Err(e) => Err((e, None)),
    })
}

/// How many times a concurrent build of one index is tried when Postgres
/// fails it as a deadlock.
const BUILD_ATTEMPTS: u32 = 3;

/// Whether Postgres failed the statement as a deadlock. A concurrent build
/// waits, in its last phase, for every transaction older than it; one of
/// them waiting in turn for the lock the build holds (an `ANALYZE` begun
/// meanwhile, say) makes a cycle that Postgres breaks by failing one of
/// the two, often the build, which leaves its index invalid.
fn is_deadlock(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .and_then(|e| e.code())
        .is_some_and(|code| code == "40P01")
}

/// Builds the indexes of `m` concurrently, each after dropping an invalid
/// one of its name, and again (up to [`BUILD_ATTEMPTS`] times) after a
/// build that Postgres failed as a deadlock ([`is_deadlock`]).
async fn build_concurrently(
    conn: &mut sqlx::PgConnection,
    pool: &PgPool,
    table: &QualifiedName,
    m: &MigrationSql,
    give_up_after: Duration,
) -> Result<(), StoreError> {
    let context = migrating(table, m);
    // One core for the build: parallel workers would take every core the
    // server has from the claims that go on meanwhile.
    sqlx::query("SET max_parallel_maintenance_workers = 0")
        .execute(&mut *conn)
        .await
        .map_err(|e| store_error(&context, e))?;
    for (index, create) in m.concurrent_indexes.iter().zip(&m.statements) {
        let mut attempt = 1;
        loop {
            let invalid: bool = sqlx::query_scalar(default_table::INVALID_INDEX)
                .bind(index)
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| store_error(&context, e))?;
            if invalid {
                tracing::warn!(
                    index = %index,
                    "an earlier build of this index was interrupted; dropping it to build it again"
                );
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DROP INDEX CONCURRENTLY IF EXISTS {index}"
                )))
                .execute(&mut *conn)
                .await
                .map_err(|e| store_error(&context, e))?;
            }
            let built = build_watched(conn, pool, create, give_up_after)
                .await
                .map_err(|e| store_error(&context, e))?;
            match built {
                Ok(()) => break,
                Err((e, Some(waiting_for))) => {
                    return Err(StoreError::Conflict {
                        context: format!(
                            "{context}: the concurrent build of {index} was still waiting after {:.0?} \
                             for transactions that began before it: {waiting_for}; it was stopped, and \
                             the next migration builds it again. Migrate again once they are done, \
                             or end them (pg_terminate_backend)",
                            give_up_after
                        ),
                        source: Box::new(e),
                    })
                }
                Err((e, None)) if attempt < BUILD_ATTEMPTS && is_deadlock(&e) => {
                    tracing::warn!(
                        index = %index,
                        attempt,
                        error = %e,
                        "a concurrent index build was failed as a deadlock; building it again"
                    );
                    attempt += 1;
                }
                Err((e, None)) => return Err(store_error(&context, e)),
            }
        }
    }
    sqlx::query("RESET max_parallel_maintenance_workers")
        .execute(&mut *conn)
        .await
        .map_err(|e| store_error(&context, e))?;
    Ok(())
}

/// Runs each statement of the batched version `m` until it is past the
/// last key ([`MigrationSql::batched`]), each batch committed on its own.
async fn fix_up(
    conn: &mut sqlx::PgConnection,
    table: &QualifiedName,
    m: &MigrationSql,
) -> Result<(), StoreError> {
    let context = migrating(table, m);
    for statement in &m.statements {
        let (mut after, mut batches, mut fixed) = (i64::MIN, 0u64, 0i64);
        loop {
            let row = sqlx::query(sqlx::AssertSqlSafe(statement.as_str()))
                .bind(after)
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| store_error(&context, e))?;
            let next: Option<i64> = row.try_get("next").map_err(|e| store_error(&context, e))?;
            let changed: i64 = row.try_get("fixed").map_err(|e| store_error(&context, e))?;
            batches += 1;
            fixed += changed;
            match next {
                Some(key) => after = key,
                None => break,
            }
        }
        tracing::info!(table = %table, version = m.version, batches, rows = fixed, "rows fixed up");
    }
    Ok(())
}

/// What applying `m` to `table` is, for its errors.
fn migrating(table: &QualifiedName, m: &MigrationSql) -> String {
    format!("migrating {table} to version {} ({})", m.version, m.name)
}

/// Records `m` as applied.
async fn record(
    conn: &mut sqlx::PgConnection,
    table: &QualifiedName,
    m: &MigrationSql,
) -> Result<(), sqlx::Error> {
    sqlx::query(sqlx::AssertSqlSafe(default_table::record_version(table)))
        .bind(i32::try_from(m.version).unwrap_or(i32::MAX))
        .bind(m.name)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// `m`, applied now.
fn migration(table: &QualifiedName, m: MigrationSql) -> Migration {
    Migration {
        table: table.clone(),
        version: m.version,
        name: m.name.to_owned(),
        applied_at: Some(Utc::now()),
        statements: m.statements,
    }
}

/// The tables the store keeps beside the table `options` describe, each
/// with its versions: the bookkeeping table (if the options name one), the
/// kinds table (if the table has the kind column they map), the audit
/// table and the workers table.
async fn beside(
    pool: &PgPool,
    options: &crate::PgStoreOptions,
) -> Result<Vec<(QualifiedName, Vec<MigrationSql>)>, StoreError> {
    let mut tables = Vec::new();
    if let Some(side) = options.bookkeeping() {
        let key_type = crate::sql::catalog::key_type(pool, options).await?;
        tables.push((
            side.clone(),
            crate::sql::bookkeeping::migrations(side, &key_type),
        ));
    }
    let kinds = crate::kinds::has_kinds(pool, options).await?;
    tables.extend(operator_tables(&options.table, kinds));
    Ok(tables)
}

/// The tables the store keeps beside `table` for its operators, each with
/// its versions: the kinds table (if `kinds`: the table has a kind column),
/// the audit table and the workers table. The one list, for the default
/// table and for a table of your own.
pub(crate) fn operator_tables(
    table: &QualifiedName,
    kinds: bool,
) -> Vec<(QualifiedName, Vec<MigrationSql>)> {
    let mut tables = Vec::new();
    if kinds {
        let kinds = crate::sql::kinds::kinds_table(table);
        tables.push((kinds.clone(), crate::sql::kinds::migrations(&kinds)));
    }
    let audit = crate::sql::audit::audit_table(table);
    tables.push((audit.clone(), crate::sql::audit::migrations(&audit)));
    let workers = crate::sql::workers::workers_table(table);
    tables.push((workers.clone(), crate::sql::workers::migrations(&workers)));
    let operations = crate::sql::operations::operations_table(table);
    tables.push((
        operations.clone(),
        crate::sql::operations::migrations(&operations),
    ));
    tables
}

/// Creates or upgrades every table the store keeps beside a table of your
/// own (never that table): the bookkeeping table the options name, the
/// kinds table if the table has a kind column, the audit table and the
/// workers table. Returns
/// the versions applied now, table by table; tables already up to date
/// are only read.
pub async fn migrate_beside(
    pool: &PgPool,
    options: &crate::PgStoreOptions,
) -> Result<Vec<Migration>, StoreError> {
    let mut applied = Vec::new();
    for (table, versions) in beside(pool, options).await? {
        applied.extend(apply(pool, &table, versions, LockWait::default()).await?);
    }
    Ok(applied)
}

/// Every version of the tables [`migrate_beside`] keeps, applied or
/// pending.
pub async fn migrations_beside(
    pool: &PgPool,
    options: &crate::PgStoreOptions,
) -> Result<Vec<Migration>, StoreError> {
    let mut all = Vec::new();
    for (table, versions) in beside(pool, options).await? {
        all.extend(status(pool, &table, versions).await?);
    }
    Ok(all)
}
