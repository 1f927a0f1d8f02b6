//! Adding jobs through the admin: what the table can hold, and the
//! enqueue of plain and unique jobs.

use queue_core::{Enqueued, NewJob, StoreError, UniqueScope};

use super::PgAdmin;
use crate::options::Column;
use crate::record::PgKey;

impl<K: PgKey> PgAdmin<K> {
    /// Refuses jobs carrying what the table has no column for (a kind, a
    /// payload, a limit, a unique key or its scope): it would be lost.
    pub(super) fn refuse_unstorable(&self, jobs: &[NewJob]) -> Result<(), StoreError> {
        let table = &self.inner.options.table;
        if !self.has(Column::Kind) {
            if let Some(job) = jobs.iter().find(|j| !j.kind.is_empty()) {
                return Err(StoreError::Refused(format!(
                    "table {table} has no kind column, so the kind {:?} would be lost; enqueue with an empty kind, or map the column (Column::Kind)",
                    job.kind
                )));
            }
        }
        if !self.has(Column::Payload) {
            let empty = |v: &serde_json::Value| {
                v.is_null() || v.as_object().is_some_and(serde_json::Map::is_empty)
            };
            if jobs.iter().any(|j| !empty(&j.payload)) {
                return Err(StoreError::Refused(format!(
                    "table {table} has no payload column, so the payload would be lost; map the column (Column::Payload)"
                )));
            }
        }
        for (column, what, asked) in [
            (
                if self.has(Column::AttemptsLeft) {
                    Column::AttemptsLeft
                } else {
                    Column::MaxAttempts
                },
                "max_attempts",
                jobs.iter().any(|j| j.limits.max_attempts.is_some()),
            ),
            (
                Column::ExpiresAt,
                "expires_at",
                jobs.iter().any(|j| j.expires_at.is_some()),
            ),
            (
                Column::AtMostOnce,
                "at_most_once",
                jobs.iter().any(|j| j.limits.at_most_once),
            ),
        ] {
            if asked && !self.has(column) {
                return Err(StoreError::Refused(format!(
                    "table {table} has no {what} column, so the job's {what} would be ignored; map one (Column::{column:?}), or enqueue without it"
                )));
            }
        }
        if let (Some(problem), true) = (
            &self.inner.unique_unenforced,
            jobs.iter().any(|j| j.unique.is_some()),
        ) {
            return Err(StoreError::Refused(problem.clone()));
        }
        if self.inner.sql.enqueue.unique.is_none() && crate::enqueue::any_unique(jobs) {
            return Err(crate::enqueue::no_unique_column(&table.to_string()));
        }
        let forever = |j: &NewJob| {
            j.unique
                .as_ref()
                .is_some_and(|u| u.scope == UniqueScope::Forever)
        };
        if self.inner.partitioned && jobs.iter().any(forever) {
            return Err(StoreError::Refused(format!(
                "table {table} is partitioned, and Postgres keeps an index unique only within one partition, so a key cannot be held for as long as its job exists; enqueue with UniqueScope::Active (a key held while its job waits or runs)"
            )));
        }
        if !self.has(Column::UniqueForever) && jobs.iter().any(forever) {
            return Err(StoreError::Refused(format!(
                "table {table} has no unique_forever column, so a key cannot be kept for as long as its job exists; map one (Column::UniqueForever), or make the table's unique index cover finished jobs and enqueue with UniqueScope::Active"
            )));
        }
        Ok(())
    }

    /// [`Admin::enqueue`](queue_core::Admin::enqueue) on `conn`, inside
    /// whatever transaction it has open: the jobs exist, and wake workers,
    /// only if that transaction commits. Unique keys are kept as on the
    /// pool (see [`JobTable::enqueue_unique`](crate::JobTable::enqueue_unique)).
    ///
    /// ```no_run
    /// # async fn run(admin: queue_store_postgres::PgAdmin<i64>, pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
    /// use queue_core::NewJob;
    ///
    /// let mut tx = pool.begin().await?;
    /// // ... the application's own writes on `tx` ...
    /// admin.enqueue_in(&mut tx, &[NewJob::new("welcome_email", serde_json::json!({"user": 42}))]).await?;
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn enqueue_in(
        &self,
        conn: &mut sqlx::PgConnection,
        jobs: &[NewJob],
    ) -> Result<Vec<Enqueued<K>>, StoreError> {
        self.refuse_unstorable(jobs)?;
        let options = &self.inner.options;
        crate::enqueue::enqueue_on(
            conn,
            &self.inner.sql.enqueue,
            &options.table,
            &options.notify_channel(),
            jobs,
        )
        .await
    }

    pub(super) async fn insert_jobs(
        &self,
        jobs: &[NewJob],
    ) -> Result<Vec<Enqueued<K>>, StoreError> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = self.connection("enqueueing jobs").await?;
        self.enqueue_in(&mut conn, jobs).await
    }
}
