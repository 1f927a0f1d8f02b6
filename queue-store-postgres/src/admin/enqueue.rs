//! Adding jobs through the admin: what the table can hold, and the
//! enqueue of plain and unique jobs.

use queue_core::{Enqueued, NewJob, StoreError, UniqueScope};
use sqlx::Row;

use super::PgAdmin;
use crate::bind::{query, Value};
use crate::error::store_error;
use crate::options::Column;
use crate::record::PgKey;
use crate::sql::Param;
use crate::unique::{align, Answer, UNSEEN_HOLDER};

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
        if self.inner.sql.enqueue_unique.is_none() && jobs.iter().any(|j| j.unique.is_some()) {
            return Err(StoreError::Refused(format!(
                "table {table} has no unique_key column, so a unique key would be ignored; map one (Column::UniqueKey) with a unique index on it, or enqueue without a key"
            )));
        }
        let forever = |j: &NewJob| {
            j.unique
                .as_ref()
                .is_some_and(|u| u.scope == UniqueScope::Forever)
        };
        if !self.has(Column::UniqueForever) && jobs.iter().any(forever) {
            return Err(StoreError::Refused(format!(
                "table {table} has no unique_forever column, so a key cannot be kept for as long as its job exists; map one (Column::UniqueForever), or make the table's unique index cover finished jobs and enqueue with UniqueScope::Active"
            )));
        }
        Ok(())
    }

    /// The enqueue of jobs with unique keys. A job whose key's holder the
    /// statement could not see (it committed meanwhile, or finished) is
    /// enqueued again by a new statement, which sees it or finds the key
    /// free; after a few rounds the call gives up with a retryable error.
    pub(super) async fn enqueue_unique(
        &self,
        jobs: &[NewJob],
    ) -> Result<Vec<Enqueued<K>>, StoreError> {
        let Some(statement) = &self.inner.sql.enqueue_unique else {
            return Err(StoreError::Refused(format!(
                "table {} has no unique_key column, so a unique key would be ignored; map one (Column::UniqueKey) with a unique index on it, or enqueue without a key",
                self.inner.options.table
            )));
        };
        let mut results: Vec<Option<Enqueued<K>>> = vec![None; jobs.len()];
        for _round in 0..5 {
            let pending: Vec<usize> = (0..jobs.len()).filter(|i| results[*i].is_none()).collect();
            if pending.is_empty() {
                break;
            }
            let batch: Vec<NewJob> = pending.iter().map(|i| jobs[*i].clone()).collect();
            let rows = query::<K>(statement, |p| match p {
                Param::Kinds => Some(Value::Texts(
                    batch.iter().map(|j| Some(j.kind.clone())).collect(),
                )),
                Param::Payloads => Some(Value::Jsons(
                    batch.iter().map(|j| j.payload.clone()).collect(),
                )),
                Param::Priorities => Some(Value::Ints(
                    batch.iter().map(|j| i64::from(j.priority)).collect(),
                )),
                Param::ProcessAfters => Some(Value::Times(
                    batch.iter().map(|j| j.process_after).collect(),
                )),
                Param::UniqueKeys => Some(Value::Texts(
                    batch
                        .iter()
                        .map(|j| j.unique.as_ref().map(|u| u.key.clone()))
                        .collect(),
                )),
                Param::UniqueForevers => Some(Value::Bools(
                    batch
                        .iter()
                        .map(|j| {
                            j.unique
                                .as_ref()
                                .is_some_and(|u| u.scope == UniqueScope::Forever)
                        })
                        .collect(),
                )),
                Param::Channel => Some(Value::Text(self.inner.options.notify_channel())),
                other => options_value(&batch, other),
            })?
            .fetch_all(&self.inner.pool)
            .await
            .map_err(|e| store_error("enqueueing unique jobs", e))?;
            let mut answers = Vec::with_capacity(rows.len());
            for row in &rows {
                let read = |e| store_error("enqueueing unique jobs", e);
                answers.push(Answer {
                    id: row.try_get("id").map_err(read)?,
                    key: row.try_get("unique_key").map_err(read)?,
                    inserted: row.try_get("inserted").map_err(read)?,
                });
            }
            for (i, result) in pending.into_iter().zip(align(&batch, answers)) {
                results[i] = result;
            }
        }
        results
            .into_iter()
            .map(|r| {
                r.ok_or_else(|| StoreError::Conflict {
                    context: UNSEEN_HOLDER.into(),
                    source: "the job holding the key stayed out of sight for five statements"
                        .into(),
                })
            })
            .collect()
    }

    pub(super) async fn insert_jobs(
        &self,
        jobs: &[NewJob],
    ) -> Result<Vec<Enqueued<K>>, StoreError> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        self.refuse_unstorable(jobs)?;
        if jobs.iter().any(|j| j.unique.is_some()) {
            return self.enqueue_unique(jobs).await;
        }
        let rows = query::<K>(&self.inner.sql.enqueue, |p| match p {
            Param::Kinds => Some(Value::Texts(
                jobs.iter().map(|j| Some(j.kind.clone())).collect(),
            )),
            Param::Payloads => Some(Value::Jsons(
                jobs.iter().map(|j| j.payload.clone()).collect(),
            )),
            Param::Priorities => Some(Value::Ints(
                jobs.iter().map(|j| i64::from(j.priority)).collect(),
            )),
            Param::ProcessAfters => {
                Some(Value::Times(jobs.iter().map(|j| j.process_after).collect()))
            }
            Param::Channel => Some(Value::Text(self.inner.options.notify_channel())),
            other => options_value(jobs, other),
        })?
        .fetch_all(&self.inner.pool)
        .await
        .map_err(|e| store_error("enqueueing jobs", e))?;
        rows.iter()
            .map(|row| {
                row.try_get(0)
                    .map(|id| Enqueued { id, inserted: true })
                    .map_err(|e| store_error("enqueueing jobs", e))
            })
            .collect()
    }
}

/// The arrays of the jobs' limits and expiry, for an enqueue's `param`.
fn options_value<K>(jobs: &[NewJob], param: Param) -> Option<Value<K>> {
    match param {
        Param::MaxAttemptses => Some(Value::OptInts(
            jobs.iter()
                .map(|j| j.limits.max_attempts.map(i64::from))
                .collect(),
        )),
        Param::ExpiresAts => Some(Value::Times(jobs.iter().map(|j| j.expires_at).collect())),
        Param::AtMostOnces => Some(Value::Bools(
            jobs.iter().map(|j| j.limits.at_most_once).collect(),
        )),
        _ => None,
    }
}
