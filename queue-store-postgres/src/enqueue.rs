//! [`JobTable`]: the default jobs table — migrate it, enqueue into it.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use queue_core::{Enqueued, JobLimits, NewJob, StoreError, UniqueScope};
use sqlx::{PgPool, Row};

use crate::error::{store_error, OptionsError};
use crate::ident::{Ident, QualifiedName};
use crate::migrate::Migration;
use crate::options::PgStoreOptions;
use crate::sql::default_table;

/// The arrays the default table's enqueue function takes, one element per
/// job, in its parameters' order (`default_table::insert_with_options`):
/// built once here for sqlx and for diesel.
pub(crate) struct FunctionArgs {
    pub kinds: Vec<String>,
    pub payloads: Vec<serde_json::Value>,
    pub priorities: Vec<i32>,
    pub afters: Vec<Option<DateTime<Utc>>>,
    pub keys: Vec<Option<String>>,
    pub forever: Vec<bool>,
    pub max_attempts: Vec<Option<i32>>,
    pub expires: Vec<Option<DateTime<Utc>>>,
    pub at_most_once: Vec<bool>,
}

impl FunctionArgs {
    pub(crate) fn new(jobs: &[NewJob]) -> Self {
        FunctionArgs {
            kinds: jobs.iter().map(|j| j.kind.clone()).collect(),
            payloads: jobs.iter().map(|j| j.payload.clone()).collect(),
            priorities: jobs.iter().map(|j| j.priority).collect(),
            afters: jobs.iter().map(|j| j.process_after).collect(),
            keys: jobs
                .iter()
                .map(|j| j.unique.as_ref().map(|u| u.key.clone()))
                .collect(),
            forever: jobs
                .iter()
                .map(|j| {
                    j.unique
                        .as_ref()
                        .is_some_and(|u| u.scope == UniqueScope::Forever)
                })
                .collect(),
            max_attempts: jobs
                .iter()
                .map(|j| {
                    j.limits
                        .max_attempts
                        .map(|m| i32::try_from(m).unwrap_or(i32::MAX))
                })
                .collect(),
            expires: jobs.iter().map(|j| j.expires_at).collect(),
            at_most_once: jobs.iter().map(|j| j.limits.at_most_once).collect(),
        }
    }
}

/// Whether the job sets an option the plain insert does not write.
fn has_options(job: &NewJob) -> bool {
    job.unique.is_some() || job.limits != JobLimits::default() || job.expires_at.is_some()
}

/// The default jobs table: the spec's columns plus `kind`, `payload`
/// (jsonb), `priority` and `claim_token`.
///
/// Enqueue works on any sqlx executor, so a job can be enqueued inside the
/// caller's own transaction and becomes visible (and wakes workers) only
/// when that commits.
///
/// ```no_run
/// # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// use queue_core::NewJob;
/// use queue_store_postgres::JobTable;
///
/// let jobs = JobTable::default();
/// let mut tx = pool.begin().await?;
/// // ... the application's own writes on `tx` ...
/// jobs.enqueue(&mut *tx, &NewJob::new("welcome_email", serde_json::json!({"user": 42}))).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct JobTable {
    table: QualifiedName,
    insert_one: Arc<str>,
    insert_many: Arc<str>,
    insert_with_options: Arc<str>,
}

impl Default for JobTable {
    /// `public.queue_jobs`.
    fn default() -> Self {
        JobTable::from_name(QualifiedName::new(
            Ident::new("public").unwrap_or_else(|_| unreachable_ident()),
            Ident::new("queue_jobs").unwrap_or_else(|_| unreachable_ident()),
        ))
    }
}

/// Only reached if a constant name were invalid; it is not.
fn unreachable_ident() -> Ident {
    Ident::new("queue_jobs").unwrap_or_else(|e| panic!("constant identifier rejected: {e}"))
}

impl JobTable {
    /// The default table layout at `schema.table`.
    pub fn new(schema: &str, table: &str) -> Result<Self, OptionsError> {
        Ok(JobTable::from_name(QualifiedName::new(
            Ident::new(schema)?,
            Ident::new(table)?,
        )))
    }

    fn from_name(table: QualifiedName) -> Self {
        JobTable {
            insert_one: default_table::insert_one(&table).into(),
            insert_many: default_table::insert_many(&table).into(),
            insert_with_options: default_table::insert_with_options(&table).into(),
            table,
        }
    }

    /// The table's qualified name.
    pub fn name(&self) -> &QualifiedName {
        &self.table
    }

    /// Store options for this table (standard names and states).
    pub fn store_options(&self) -> PgStoreOptions {
        let options = PgStoreOptions::new(self.table.name.as_str())
            .and_then(|o| o.schema(self.table.schema.as_str()));
        // Both names were validated when this table was built.
        options.unwrap_or_else(|e| panic!("validated names rejected: {e}"))
    }

    /// The name of this table's archive: `<table>_archive` in its schema
    /// (see [`JobTable::create_archive`]).
    pub fn archive_name(&self) -> String {
        crate::sql::default_table::derived_name(&self.table.name, "archive")
    }

    /// Creates the archive purged jobs move to, if it is missing: a table
    /// like this one (same columns and defaults, no indexes or triggers)
    /// named [`JobTable::archive_name`]. Point the store at it with
    /// `store_options().archive_table(&jobs.archive_name())`; the pruner and
    /// `queue purge` then move old finished jobs there instead of deleting
    /// them. Run it after [`JobTable::migrate`] (and again after a
    /// migration that adds a column: the store checks at start-up that the
    /// archive has every column).
    pub async fn create_archive(&self, pool: &PgPool) -> Result<(), StoreError> {
        let archive = crate::ident::QualifiedName::new(
            self.table.schema.clone(),
            crate::ident::Ident::new(self.archive_name())?,
        );
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "CREATE TABLE IF NOT EXISTS {} (LIKE {} INCLUDING DEFAULTS)",
            archive.quoted(),
            self.table.quoted()
        )))
        .execute(pool)
        .await
        .map_err(|e| crate::error::store_error("creating the archive table", e))?;
        Ok(())
    }

    /// The tables migrations keep, each with its versions: the table, then
    /// the kinds, audit and workers tables beside it.
    fn owned_tables(&self) -> Vec<(QualifiedName, Vec<crate::sql::default_table::MigrationSql>)> {
        let mut tables = vec![(
            self.table.clone(),
            crate::migrate::default_table(&self.table),
        )];
        // The default table has a kind column.
        tables.extend(crate::migrate::operator_tables(&self.table, true));
        tables
    }

    /// Brings the table to the newest version of its schema: creates the
    /// schema, table, indexes and notify trigger where missing, then each
    /// later version in order (see [`Migration`]); then the same for the
    /// tables beside it: the kinds table ([`kinds`](crate::kinds): the
    /// paused kinds), the audit table and the workers table (see
    /// [`migrate_beside`](crate::migrate_beside)). Returns the versions it
    /// applied, the table's first; none when all are up to date, in which case it only reads, so it is safe to call
    /// on every start-up, from several processes at once, beside running
    /// workers.
    pub async fn migrate(&self, pool: &PgPool) -> Result<Vec<Migration>, StoreError> {
        let mut applied = Vec::new();
        for (table, versions) in self.owned_tables() {
            applied.extend(crate::migrate::apply(pool, &table, versions).await?);
        }
        Ok(applied)
    }

    /// Every version of the table's schema and of its kinds and audit
    /// tables',
    /// applied or pending, with when each was applied and the SQL it runs.
    pub async fn migrations(&self, pool: &PgPool) -> Result<Vec<Migration>, StoreError> {
        let mut all = Vec::new();
        for (table, versions) in self.owned_tables() {
            all.extend(crate::migrate::status(pool, &table, versions).await?);
        }
        Ok(all)
    }

    /// Enqueues one job; returns its id (for a job whose [unique
    /// key](NewJob::unique) is taken, the id of the job that holds it; see
    /// [`JobTable::enqueue_unique`] to tell the two apart).
    pub async fn enqueue<'e>(
        &self,
        executor: impl sqlx::PgExecutor<'e>,
        job: &NewJob,
    ) -> Result<i64, StoreError> {
        if has_options(job) {
            let mut done = self
                .enqueue_unique(executor, std::slice::from_ref(job))
                .await?;
            return done.pop().map(|e| e.id).ok_or_else(|| StoreError::Backend {
                context: "enqueueing a unique job".into(),
                source: "the insert returned no row".into(),
            });
        }
        sqlx::query_scalar(sqlx::AssertSqlSafe(Arc::clone(&self.insert_one)))
            .bind(&job.kind)
            .bind(&job.payload)
            .bind(job.priority)
            .bind(job.process_after)
            .fetch_one(executor)
            .await
            .map_err(|e| store_error("enqueueing a job", e))
    }

    /// Enqueues many jobs in one statement; returns their ids in order (as
    /// [`JobTable::enqueue`] does).
    pub async fn enqueue_many<'e>(
        &self,
        executor: impl sqlx::PgExecutor<'e>,
        jobs: &[NewJob],
    ) -> Result<Vec<i64>, StoreError> {
        if jobs.iter().any(has_options) {
            let done = self.enqueue_unique(executor, jobs).await?;
            return Ok(done.into_iter().map(|e| e.id).collect());
        }
        let kinds: Vec<&str> = jobs.iter().map(|j| j.kind.as_str()).collect();
        let payloads: Vec<&serde_json::Value> = jobs.iter().map(|j| &j.payload).collect();
        let priorities: Vec<i32> = jobs.iter().map(|j| j.priority).collect();
        let afters: Vec<Option<DateTime<Utc>>> = jobs.iter().map(|j| j.process_after).collect();
        sqlx::query_scalar(sqlx::AssertSqlSafe(Arc::clone(&self.insert_many)))
            .bind(kinds)
            .bind(payloads)
            .bind(priorities)
            .bind(afters)
            .fetch_all(executor)
            .await
            .map_err(|e| store_error("enqueueing jobs", e))
    }

    /// Enqueues jobs, some or all with [unique keys](NewJob::unique), in
    /// one statement; says for each, in order, whether it was added or
    /// which job holds its key. Safe from any number of enqueuers at once:
    /// the table's unique index admits one job per key, and the others
    /// come back `inserted: false` with its id.
    ///
    /// One statement (the table's enqueue function, which tries again
    /// itself when a key's holder committed or finished while it ran), so
    /// it works inside the caller's transaction: the jobs appear, and wake
    /// workers, when it commits. In a `REPEATABLE READ` or `SERIALIZABLE`
    /// transaction a holder committed after the transaction began cannot
    /// be seen: the call then fails with a retryable
    /// [`StoreError::Conflict`], like any serialization failure.
    pub async fn enqueue_unique<'e>(
        &self,
        executor: impl sqlx::PgExecutor<'e>,
        jobs: &[NewJob],
    ) -> Result<Vec<Enqueued<i64>>, StoreError> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let args = FunctionArgs::new(jobs);
        let rows = sqlx::query(sqlx::AssertSqlSafe(Arc::clone(&self.insert_with_options)))
            .bind(args.kinds)
            .bind(args.payloads)
            .bind(args.priorities)
            .bind(args.afters)
            .bind(args.keys)
            .bind(args.forever)
            .bind(args.max_attempts)
            .bind(args.expires)
            .bind(args.at_most_once)
            .fetch_all(executor)
            .await
            .map_err(|e| store_error("enqueueing unique jobs", e))?;
        if rows.len() != jobs.len() {
            return Err(StoreError::Backend {
                context: "enqueueing unique jobs".into(),
                source: format!("{} rows came back for {} jobs", rows.len(), jobs.len()).into(),
            });
        }
        rows.iter()
            .map(|row| {
                let read = |e| store_error("enqueueing unique jobs", e);
                Ok(Enqueued {
                    id: row.try_get("id").map_err(read)?,
                    inserted: row.try_get("inserted").map_err(read)?,
                })
            })
            .collect()
    }
}
