//! [`JobTable`]: the default jobs table — migrate it, enqueue into it.

use chrono::{DateTime, Utc};
use queue_core::{NewJob, StoreError};
use sqlx::PgPool;

use crate::error::{store_error, OptionsError};
use crate::ident::{Ident, QualifiedName};
use crate::migrate::Migration;
use crate::options::PgStoreOptions;
use crate::sql::default_table;

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
    insert_one: String,
    insert_many: String,
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
            insert_one: default_table::insert_one(&table),
            insert_many: default_table::insert_many(&table),
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

    /// Brings the table to the newest version of its schema: creates the
    /// schema, table, indexes and notify trigger where missing, then each
    /// later version in order (see [`Migration`]). Returns the versions it
    /// applied; none when the table is up to date, in which case it only
    /// reads, so it is safe to call on every start-up, from several
    /// processes at once, beside running workers.
    pub async fn migrate(&self, pool: &PgPool) -> Result<Vec<Migration>, StoreError> {
        crate::migrate::apply(pool, &self.table).await
    }

    /// Every version of the table's schema, applied or pending, with when
    /// each was applied and the SQL it runs.
    pub async fn migrations(&self, pool: &PgPool) -> Result<Vec<Migration>, StoreError> {
        crate::migrate::status(pool, &self.table).await
    }

    /// Enqueues one job; returns its id.
    pub async fn enqueue<'e>(
        &self,
        executor: impl sqlx::PgExecutor<'e>,
        job: &NewJob,
    ) -> Result<i64, StoreError> {
        sqlx::query_scalar(&self.insert_one)
            .bind(&job.kind)
            .bind(&job.payload)
            .bind(job.priority)
            .bind(job.process_after)
            .fetch_one(executor)
            .await
            .map_err(|e| store_error("enqueueing a job", e))
    }

    /// Enqueues many jobs in one statement; returns their ids in order.
    pub async fn enqueue_many<'e>(
        &self,
        executor: impl sqlx::PgExecutor<'e>,
        jobs: &[NewJob],
    ) -> Result<Vec<i64>, StoreError> {
        let kinds: Vec<&str> = jobs.iter().map(|j| j.kind.as_str()).collect();
        let payloads: Vec<&serde_json::Value> = jobs.iter().map(|j| &j.payload).collect();
        let priorities: Vec<i32> = jobs.iter().map(|j| j.priority).collect();
        let afters: Vec<Option<DateTime<Utc>>> = jobs.iter().map(|j| j.process_after).collect();
        sqlx::query_scalar(&self.insert_many)
            .bind(kinds)
            .bind(payloads)
            .bind(priorities)
            .bind(afters)
            .fetch_all(executor)
            .await
            .map_err(|e| store_error("enqueueing jobs", e))
    }
}
